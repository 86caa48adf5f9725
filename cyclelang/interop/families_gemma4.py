"""Gemma 4's text decoder (gemma4_text) and Gemma 4 unified's (gemma4_unified_text: the same layers without
per-layer inputs or experts), read closed-world (closed.py) into a `Gemma4` record and written as the spec it
implies; its weight plan (import and export) and the config an engine implies (export).

What makes it (transformers 5.24's modeling_gemma4.py, Gemma4TextModel):
- Gemma 3's layer: the token embedding times sqrt(hidden_size), a norm before and after each turbine
  (RMSNorms whose gain is w itself, not 1 + w), per-head q and k RMSNorms, a gelu-tanh gated MLP; the
  attention logits unscaled (scaling 1.0); sliding layers and global ones (layer_types, one in six global).
- the two layer types may differ in head size and KV heads: per_layer_config (written by __post_init__
  from global_head_dim and, with attention_k_eq_v, num_global_key_value_heads) -> each stage's own
  `head_dim=` and `kv_heads=`;
- each layer type's rope: `default` (every dim, base rope_theta) or `proportional` (the first
  partial_rotary_factor of the pairs (i, i + head_dim/2) at base^(-2i/head_dim)) -> `rotary=p rotary_spread`;
- a weightless RMSNorm on the values -> `v_norm`; attention_k_eq_v: the global layers' values are their
  keys' projection -> `k_eq_v`;
- per-layer inputs (hidden_size_per_layer_input): a second token table, hidden_size_per_layer_input wide
  per layer, times its square root, plus the embedding projected (times hidden_size^-0.5) and normed per
  layer, the sum times 2^-0.5 -> the feed's `per_layer=`; in each layer after the MLP, the stream plus
  norm(W_up(gelu_tanh(W_gate x) * that layer's input)) -> a prechamber with `turbine mlp per_layer`;
- KV sharing (num_kv_shared_layers): the last layers compute no keys or values; each reads those of the last
  earlier layer of its type (its cache included) -> `kv_store=N` there, `kv_reuse=N` here; their MLPs twice
  as wide with use_double_wide_mlp;
- layer_scalar: a buffer each layer multiplies the stream by at its end (ones as initialised, the checkpoint's
  own once loaded) -> `norm scalar` ending each stage.

Refused by name: enable_moe_block (routed experts beside the MLP, each with its own norms),
use_bidirectional_attention="all", rope types other than default and proportional, a proportional rope's factor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from .closed import Config, Keys, Unsupported, _show

FAMILY = "gemma4_text"
UNIFIED = "gemma4_unified_text"  # Gemma 4 unified's text decoder: the same layers without per-layer inputs or experts
_TYPES = {"sliding_attention": "local", "full_attention": "global"}
_ACTS = {"gelu_pytorch_tanh": ("geglu_tanh", "gelu_tanh"), "gelu_new": ("geglu_tanh", "gelu_tanh"), "gelu": ("geglu", "gelu"),
         "silu": ("swiglu", "silu"), "swish": ("swiglu", "silu")}
_HF_ACT = {"geglu_tanh": "gelu_pytorch_tanh", "geglu": "gelu", "swiglu": "silu"}
_MOE_UNREAD = "read only with enable_moe_block, which is refused by name: without it no layer has experts"

_COMMON = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "hidden_activation", "max_position_embeddings", "rms_norm_eps", "pad_token_id", "tie_word_embeddings",
                     "rope_parameters", "attention_bias", "sliding_window", "layer_types", "final_logit_softcapping",
                     "use_bidirectional_attention", "attention_k_eq_v", "num_kv_shared_layers", "use_double_wide_mlp", "per_layer_config",
                     "global_head_dim", "num_global_key_value_heads"})
_HIDDEN_ACT = {"hidden_act": "Gemma 4's forward reads hidden_activation; a hidden_act its configs may also write is ignored"}
KEYS = {FAMILY: Keys(_COMMON | {"vocab_size_per_layer_input", "hidden_size_per_layer_input", "enable_moe_block"},
                     {"num_experts": _MOE_UNREAD, "top_k_experts": _MOE_UNREAD, "moe_intermediate_size": _MOE_UNREAD, **_HIDDEN_ACT}),
        UNIFIED: Keys(_COMMON, dict(_HIDDEN_ACT))}
CAUSAL_LM = {FAMILY: "Gemma4ForCausalLM", UNIFIED: "Gemma4UnifiedForCausalLM"}


@dataclass(frozen=True)
class Attn4:
    """One layer type's attention."""

    heads: int
    kv_heads: int
    head_dim: int
    rotary: float  # the fraction of each head rotated
    spread: bool  # proportional rope: the pairs (i, i + head_dim/2)
    rotary_base: float
    k_eq_v: bool


@dataclass(frozen=True)
class Gemma4:
    """A gemma4_text checkpoint (Gemma4ForCausalLM), in the language's terms."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    hidden: int
    act: str  # the MLP's gated activation
    ple_act: str  # the per-layer gate's plain one
    eps: float
    padding: int | None
    tied: bool
    softcap: float | None
    bias: bool
    window: int
    kinds: tuple  # each layer's "local" | "global"
    local: Attn4
    glob: Attn4
    per_layer: int  # 0: no per-layer inputs
    per_layer_vocab: int
    double_wide: bool  # the KV-shared layers' MLPs twice intermediate_size wide
    sources: dict = field(default_factory=dict, compare=False)

    def spec_text(self, source: str) -> str:
        return _text(self, source)


def _int(c: Config, key: str, least: int = 1) -> int:
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise Unsupported(key, f"{_show(v)}: a whole number from {least}")
    return v


def _positive(c: Config, key: str) -> float:
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise Unsupported(key, f"{_show(v)} is not a positive number")
    return float(v)


def _layer_types(c: Config, layers: int) -> list:
    types = c["layer_types"]
    if types is None:  # __post_init__: one full layer in six
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in _TYPES for t in types):
        raise Unsupported("layer_types", f"{_show(types)}: one of sliding_attention, full_attention per layer ({layers})")
    return types[:-1] + ["full_attention"]  # __post_init__ forces the last layer global


def _overrides(c: Config, types: list, head_dim: int, kv: int) -> dict:
    """Each layer type's (head_dim, num_key_value_heads), as per_layer_config (given, or __post_init__'s) sets them."""
    per = c["per_layer_config"]
    if per is None:  # __post_init__: the global layers' head_dim is global_head_dim; with attention_k_eq_v their KV heads global ones
        g = c["global_head_dim"]
        g = 512 if g is None and not c.given("global_head_dim") else g
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise Unsupported("global_head_dim", f"{_show(g)}: a whole number from 1")
        over = {"head_dim": g}
        gkv = c["num_global_key_value_heads"]
        if gkv is not None and c["attention_k_eq_v"]:
            if isinstance(gkv, bool) or not isinstance(gkv, int) or gkv < 1:
                raise Unsupported("num_global_key_value_heads", f"{_show(gkv)}: a whole number from 1")
            over["num_key_value_heads"] = gkv
        per = {i: over for i, t in enumerate(types) if t == "full_attention"}
    if not isinstance(per, dict):
        raise Unsupported("per_layer_config", f"{_show(per)} is not an object of layer index -> overrides")
    out: dict = {}
    for k, o in per.items():
        try:
            i = int(k)
        except (TypeError, ValueError):
            raise Unsupported(f"per_layer_config.{k}", "not a layer index") from None
        if not 0 <= i < len(types) or not isinstance(o, dict) or set(o) - {"head_dim", "num_key_value_heads"}:
            raise Unsupported(f"per_layer_config.{k}", f"{_show(o)}: a layer's head_dim and num_key_value_heads are mapped, nothing else")
        for key, v in o.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise Unsupported(f"per_layer_config.{k}.{key}", f"{_show(v)}: a whole number from 1")
        out[i] = (o.get("head_dim", head_dim), o.get("num_key_value_heads", kv))
    shapes: dict = {}
    for i, t in enumerate(types):
        shapes.setdefault(t, set()).add(out.get(i, (head_dim, kv)))
    for t, s in shapes.items():
        if len(s) > 1:
            raise Unsupported("per_layer_config", f"the {t} layers differ in head size or KV heads ({sorted(s)}): one shape per layer type is mapped")
    return {t: s.pop() for t, s in shapes.items()}


def _rope(c: Config, kind: str, head_dim: int) -> tuple[float, bool, float]:
    """(rotary fraction, spread, base) of one layer type's rope parameters."""
    ropes = c["rope_parameters"]
    if ropes is None:  # __post_init__'s defaults
        ropes = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    where = f"rope_parameters.{kind}"
    if not isinstance(ropes, dict) or set(ropes) - set(_TYPES) or not isinstance(ropes.get(kind), dict):
        raise Unsupported("rope_parameters" if not isinstance(ropes, dict) or set(ropes) - set(_TYPES) else where,
                          "Gemma 4's rope parameters are one object per layer type (sliding_attention, full_attention)")
    p = ropes[kind]
    typ = p.get("rope_type", p.get("type", "default"))
    for k in p:
        if k not in ("rope_type", "type", "rope_theta", "partial_rotary_factor", "factor"):
            raise Unsupported(f"{where}.{k}", "not a rope parameter Gemma 4's default or proportional rope reads")
    base = p.get("rope_theta")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise Unsupported(f"{where}.rope_theta", f"{_show(base)}: a rotary base above 1")
    partial = p.get("partial_rotary_factor", 1.0)
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise Unsupported(f"{where}.partial_rotary_factor", f"{_show(partial)}: a fraction in (0, 1]")
    if typ == "default":
        if partial != 1.0 or p.get("factor", 1.0) != 1.0:
            raise Unsupported(f"{where}.partial_rotary_factor" if partial != 1.0 else f"{where}.factor",
                              "Gemma 4's default rope turns every dim at the plain frequencies: a partial factor or a factor here is not mapped")
        return 1.0, False, float(base)
    if typ != "proportional":
        raise Unsupported(f"{where}.rope_type", f"{_show(typ)}: Gemma 4's default and proportional ropes are mapped, no other")
    if p.get("factor", 1.0) != 1.0:
        raise Unsupported(f"{where}.factor", f"{_show(p['factor'])}: a proportional rope's frequencies divided by a factor are not mapped")
    dims = int(partial * head_dim // 2) * 2
    if dims == 0:
        raise Unsupported(f"{where}.partial_rotary_factor", f"{_show(partial)} of head_dim {head_dim} rotates no pair")
    if dims == head_dim:
        return 1.0, False, float(base)  # every pair: the plain rotary
    return dims / head_dim, True, float(base)


def read(c: Config) -> Gemma4:
    unified = c.family == UNIFIED  # no per-layer inputs, no experts
    layers = _int(c, "num_hidden_layers")
    width, heads = _int(c, "hidden_size"), _int(c, "num_attention_heads")
    shared = _int(c, "num_kv_shared_layers", 0)
    if not unified and c["enable_moe_block"] is not False:
        raise Unsupported("enable_moe_block", f"{_show(c['enable_moe_block'])}: routed experts beside each layer's MLP (Gemma 4's router: a "
                          "weightless RMSNorm, a learned scale, per-expert scales; its own norms around each) are not mapped")
    if c["use_double_wide_mlp"] not in (True, False):
        raise Unsupported("use_double_wide_mlp", f"{_show(c['use_double_wide_mlp'])} is not true or false")  # it widens the KV-shared layers' MLPs
    bidi = c["use_bidirectional_attention"]
    if bidi not in (None, "vision"):
        raise Unsupported("use_bidirectional_attention", f"{_show(bidi)}: a text decoder's attention is causal ('vision' changes only image tokens)")
    if c["attention_k_eq_v"] not in (True, False):
        raise Unsupported("attention_k_eq_v", f"{_show(c['attention_k_eq_v'])} is not true or false")
    act = c["hidden_activation"]
    if act not in _ACTS:
        raise Unsupported("hidden_activation", f"{_show(act)}: {', '.join(_ACTS)} are mapped")
    eps = _positive(c, "rms_norm_eps")
    types = _layer_types(c, layers)
    if shared > layers - 1 or shared and set(types[: layers - shared]) != set(types):
        raise Unsupported("num_kv_shared_layers", f"{shared} of {layers} layers reuse an earlier layer's keys and values, but a layer type among "
                          "them has no earlier layer storing its own (transformers refuses it too)")
    kinds = [_TYPES[t] for t in types]
    for t in set(kinds) if shared else ():  # the last layer of each type before the shared ones stores its keys and values
        last = max(i for i in range(layers - shared) if kinds[i] == t)
        kinds[last] += "_store"
    kinds[layers - shared :] = [k + "_shared" for k in kinds[layers - shared :]]
    head_dim, kv = _int(c, "head_dim"), _int(c, "num_key_value_heads")
    shapes = _overrides(c, types, head_dim, kv)
    attn = {}
    for t, kind in _TYPES.items():
        hd, k = shapes.get(t, (head_dim, kv))
        if heads % k:
            raise Unsupported("num_key_value_heads" if t == "sliding_attention" else "per_layer_config", f"{k} KV heads do not divide {heads} heads")
        rotary, spread, base = _rope(c, t, hd) if t in shapes else (1.0, False, 10_000.0)
        attn[kind] = Attn4(heads, k, hd, rotary, spread, base, bool(c["attention_k_eq_v"]) and kind == "global")
    vocab = _int(c, "vocab_size")
    pad = c["pad_token_id"]
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < vocab):
        raise Unsupported("pad_token_id", f"{_show(pad)}: a token id below vocab_size {vocab}")
    per_layer = 0 if unified else c["hidden_size_per_layer_input"]
    if per_layer is None:
        per_layer = 0
    if isinstance(per_layer, bool) or not isinstance(per_layer, int) or per_layer < 0:
        raise Unsupported("hidden_size_per_layer_input", f"{_show(per_layer)}: a width (0: no per-layer inputs)")
    ple_vocab = _int(c, "vocab_size_per_layer_input") if per_layer else 0
    if per_layer and pad is not None and pad >= ple_vocab:
        raise Unsupported("vocab_size_per_layer_input", f"{ple_vocab}: the per-layer table's padding row {pad} is outside it")
    cap = c["final_logit_softcapping"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
        raise Unsupported("final_logit_softcapping", f"{_show(cap)}: a positive number, or null")
    window = _int(c, "sliding_window")
    if c["attention_bias"] not in (True, False):
        raise Unsupported("attention_bias", f"{_show(c['attention_bias'])} is not true or false")
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "hidden": "intermediate_size", "act": "hidden_activation", "eps": "rms_norm_eps", "padding": "pad_token_id",
               "tied": "tie_word_embeddings", "softcap": "final_logit_softcapping", "window": "sliding_window",
               "local": "num_attention_heads, num_key_value_heads, head_dim, rope_parameters.sliding_attention",
               "glob": "per_layer_config (global_head_dim, num_global_key_value_heads), rope_parameters.full_attention, attention_k_eq_v",
               "per_layer": "hidden_size_per_layer_input, vocab_size_per_layer_input"}
    return Gemma4(c.family, vocab, _int(c, "max_position_embeddings"), width, layers, _int(c, "intermediate_size"), _ACTS[act][0],
                  _ACTS[act][1], eps, pad, bool(c["tie_word_embeddings"]), None if cap is None else float(cap), bool(c["attention_bias"]),
                  window, tuple(kinds), attn["local"], attn["global"], per_layer, ple_vocab, bool(c["use_double_wide_mlp"]), sources)


# --- the spec -------------------------------------------------------------------------------------


def _num(x) -> str:
    from .families import _num as num

    return num(x)


_SLOTS = {"local": 1, "global": 2}  # the KV-sharing slot of each layer type


def _attention(a: Gemma4, t: Attn4, window: int | None, kind: str) -> str:
    base, _, role = kind.partition("_")
    out = f"turbine attention heads={t.heads} kv_heads={t.kv_heads} head_dim={t.head_dim}"
    if window is not None:
        out += f" window={window}"
    out += " rotary" + (f"={_num(t.rotary)} rotary_spread" if t.spread else "")
    if t.rotary_base != 10_000.0:
        out += f" rotary_base={_num(t.rotary_base)}"
    out += f" qk_norm qk_norm_eps={_num(a.eps)}"
    if role == "shared":
        out += f" kv_reuse={_SLOTS[base]}"
    else:
        out += " v_norm" + (" k_eq_v" if t.k_eq_v else "") + (f" kv_store={_SLOTS[base]}" if role == "store" else "")
    return out + f" scale=1 bias={_num(a.bias)}"


def _template(a: Gemma4, kind: str) -> list[str]:
    base, _, role = kind.partition("_")
    t = a.local if base == "local" else a.glob
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    what = f"sliding-window attention ({a.window} tokens)" if base == "local" else "global attention"
    what += {"store": ", whose keys and values the last layers reuse", "shared": " on an earlier layer's keys and values (KV sharing)"}.get(role, "")
    hidden = 2 * a.hidden if role == "shared" and a.double_wide else a.hidden
    lines = [f"# a {a.family} layer with {what}" + (", its keys its values" if t.k_eq_v and role != "shared" else "")
             + "; each turbine with its norm before and after" + ("; then its per-layer input's gate" if a.per_layer else ""),
             f"stage {a.family}_{kind} {{",
             "  prechamber mix {", f"    {norm}  # rms_norm_eps",
             f"    {_attention(a, t, a.window if base == 'local' else None, kind)}  # {a.sources['local' if base == 'local' else 'glob']}"
             + (", num_kv_shared_layers" if role else ""),
             f"    {norm}", "  }",
             "  prechamber burn {", f"    {norm}", f"    turbine mlp hidden={hidden} act={a.act} bias=false  # intermediate_size, hidden_activation"
             + (", use_double_wide_mlp" if hidden != a.hidden else ""),
             f"    {norm}", "  }"]
    if a.per_layer:
        lines += ["  prechamber ple {", f"    turbine mlp hidden={a.per_layer} act={a.ple_act} per_layer bias=false  # hidden_size_per_layer_input",
                  f"    {norm}", "  }"]
    return lines + ["  norm scalar  # layer_scalar: the stream times a fixed number the weights bring", "}", ""]


def _text(a: Gemma4, source: str) -> str:
    from .families import _header, _layer_runs

    lines = [*_header(a.family, source), f"let d_model = {a.width}  # hidden_size", ""]
    for kind in ("local", "global", "local_store", "global_store", "local_shared", "global_shared"):
        if kind in a.kinds:
            lines += _template(a, kind)
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none scale=sqrt(width)"
    if a.padding is not None:
        feed += f" padding={a.padding}"
    if a.per_layer:
        feed += f" per_layer={a.per_layer} per_layer_vocab={a.per_layer_vocab} per_layer_eps={_num(a.eps)}"
    feed += "  # vocab_size, max_position_embeddings, sqrt(hidden_size), pad_token_id" + (", the per-layer inputs" if a.per_layer else "")
    nozzle = "nozzle head" + (" tied" if a.tied else "") + (f" softcap={_num(a.softcap)}" if a.softcap is not None else "")
    lines += [f"engine {a.family} {{", "  chamber width=d_model", "  throat causal", f"  {feed}", "",
              *_layer_runs(a.family, list(a.kinds)), "", f"  norm rmsnorm eps={_num(a.eps)}  # the final norm",
              f"  {nozzle}  # tie_word_embeddings, final_logit_softcapping", "}", ""]
    return "\n".join(lines)


# --- the weights ----------------------------------------------------------------------------------


def plan(plan, put, layout: dict, final: str, state, fused):
    """Gemma 4's weights onto the module (load._plan's contract: module key -> (checkpoint keys, transform))."""
    from .load import _Cat

    for i, st in sorted(layout.items()):
        if st.attn is None or st.mlp is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or an mlp turbine; transformers' gemma4_text layer {i} has both"
            continue
        h, a = f"layers.{i}.", st.attn_node
        put(st.attn[: -len("mix.attn")] + "norm.gain", h + "layer_scalar")  # `norm scalar`: the stream times layer_scalar
        rows = (a.heads * a.head_dim, a.kv_heads * a.head_dim) + (() if a.k_eq_v else (a.kv_heads * a.head_dim,))
        names = ("q",) if a.kv_reuse is not None else ("q", "k") if a.k_eq_v else ("q", "k", "v")  # a KV-shared layer: q alone
        for p in ("weight", "bias"):
            put(f"{st.attn}.qkv.{p}", [h + f"self_attn.{n}_proj.{p}" for n in names], _Cat(rows[: len(names)]))
            put(f"{st.attn}.proj.{p}", h + f"self_attn.o_proj.{p}")
        put(f"{st.attn}.q_norm.weight", h + "self_attn.q_norm.weight")
        if a.kv_reuse is None:
            put(f"{st.attn}.k_norm.weight", h + "self_attn.k_norm.weight")
        put(f"{st.valves[st.attn]}.weight", h + "input_layernorm.weight")
        put(f"{st.posts[st.attn]}.weight", h + "post_attention_layernorm.weight")
        hidden = st.work_node.hidden
        put(f"{st.mlp}.fc.weight", [h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"], _Cat((hidden, hidden)))
        put(f"{st.mlp}.proj.weight", h + "mlp.down_proj.weight")
        put(f"{st.valves[st.mlp]}.weight", h + "pre_feedforward_layernorm.weight")
        put(f"{st.posts[st.mlp]}.weight", h + "post_feedforward_layernorm.weight")
        ple = st.attn[: -len("mix.attn")] + "ple.mlp"
        if ple in st.posts:
            put(f"{ple}.fc.weight", h + "per_layer_input_gate.weight")
            put(f"{ple}.proj.weight", h + "per_layer_projection.weight")
            put(f"{st.posts[ple]}.weight", h + "post_per_layer_input_norm.weight")
    put("feed.tok.weight", "embed_tokens.weight")
    put("feed.per_layer_tok.weight", "embed_tokens_per_layer.weight")
    put("feed.per_layer_proj.weight", "per_layer_model_projection.weight")
    put("feed.per_layer_norm.weight", "per_layer_projection_norm.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


# --- the config an engine implies (export) ---------------------------------------------------------


def owns(engine: ir.Engine) -> bool:
    """Whether an engine uses Gemma 4's own options (values normalised, per-layer inputs): export reads it as gemma4_text."""
    ops = [o for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list() for o in b.ops]
    return bool(engine.feed.per_layer) or any(isinstance(o, ir.Attention) and o.v_norm for o in ops)


def _rope_of(t: ir.Attention) -> dict:
    if t.rotary_dims == t.head_dim and not t.rotary_spread:
        return {"rope_type": "default", "rope_theta": t.rotary_base}
    return {"rope_type": "proportional", "partial_rotary_factor": t.rotary_dims / t.head_dim, "rope_theta": t.rotary_base}


def engine_config(engine: ir.Engine) -> dict | None:
    """Gemma 4's config, or Gemma 4 unified's for an engine of that name (without per-layer inputs)."""
    cfg = _engine_config(engine)
    if cfg is not None and engine.name == UNIFIED and not engine.feed.per_layer:
        for k in ("vocab_size_per_layer_input", "hidden_size_per_layer_input", "enable_moe_block"):
            del cfg[k]
        cfg.update(model_type=UNIFIED, architectures=[CAUSAL_LM[UNIFIED]])
    return cfg


def _engine_config(engine: ir.Engine) -> dict | None:
    """The gemma4_text config of an engine shaped like Gemma 4's decoder (None: not one); export then checks, field by field,
    that importing it gives back the engine."""
    from .families import _run_order

    if not owns(engine):
        return None
    stages = _run_order([op for op in engine.body if isinstance(op, ir.Stage)])
    if not stages:
        raise Unsupported("stages", "the engine has no stages")
    attns, mlps = [], []
    for st in stages:
        ops = [o for b in st.branch_list() for o in b.ops]
        at = [o for o in ops if isinstance(o, ir.Attention)]
        ml = [o for o in ops if isinstance(o, ir.Mlp) and not o.per_layer]
        if len(at) != 1 or len(ml) != 1:
            raise Unsupported(f"stage {st.name}", "a Gemma 4 layer has one attention and one MLP")
        attns.append(at[0])
        mlps.append(ml[0])
    shared = sum(1 for t in attns if t.kv_reuse is not None)
    own = [t for t in attns if t.kv_reuse is None] or attns
    local = next((t for t in own if t.window is not None), None)
    glob = next((t for t in own if t.window is None), own[-1])
    first = local or glob
    m = mlps[0]
    wide = shared and mlps[-1].hidden == 2 * m.hidden
    if m.act not in _HF_ACT:
        raise Unsupported("act", f"{m.act}: Gemma 4's MLP is gated (geglu_tanh, geglu or swiglu)")
    final = engine.body[-1]
    cfg = {"model_type": FAMILY, "architectures": [CAUSAL_LM[FAMILY]], "vocab_size": engine.feed.vocab, "hidden_size": engine.width,
           "intermediate_size": m.hidden, "num_hidden_layers": len(stages), "num_attention_heads": first.heads,
           "num_key_value_heads": first.kv_heads, "head_dim": first.head_dim, "hidden_activation": _HF_ACT[m.act],
           "max_position_embeddings": engine.feed.context, "rms_norm_eps": getattr(final, "eps", 1e-6), "pad_token_id": engine.feed.padding,
           "tie_word_embeddings": engine.nozzle.tied, "attention_bias": first.bias,
           "sliding_window": local.window if local is not None else 512,
           "layer_types": ["sliding_attention" if t.window is not None else "full_attention" for t in attns],
           "final_logit_softcapping": engine.nozzle.softcap, "vocab_size_per_layer_input": engine.feed.per_layer_vocab or engine.feed.vocab,
           "hidden_size_per_layer_input": engine.feed.per_layer, "attention_k_eq_v": glob.k_eq_v, "num_kv_shared_layers": shared,
           "use_double_wide_mlp": bool(wide),
           "enable_moe_block": False,
           "rope_parameters": {"sliding_attention": _rope_of(local) if local is not None else {"rope_type": "default", "rope_theta": 10_000.0},
                               "full_attention": _rope_of(glob)},
           "per_layer_config": {str(i): {"head_dim": glob.head_dim, "num_key_value_heads": glob.kv_heads}
                                for i, t in enumerate(attns) if t.window is None}}
    return cfg
