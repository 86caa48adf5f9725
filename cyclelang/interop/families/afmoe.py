"""Arcee's AFMoE (afmoe), read closed-world (closed.py) into an `Afmoe` record and written as the spec it implies;
its weight plan (import and export) and the config an engine implies (export).

What makes it (transformers 5.24's modeling_afmoe.py, AfmoeModel):
- the token embedding, times sqrt(hidden_size) when mup_enabled -> the feed's `scale=sqrt(width)`;
- a norm before and after each turbine (input_layernorm / post_attention_layernorm around attention,
  pre_mlp_layernorm / post_mlp_layernorm around the MLP or the experts), RMSNorms whose gain is w;
- attention with per-head q and k RMSNorms (eps rms_norm_eps), then an output gate from the attention's input,
  y * sigmoid(gate_proj(x)) per channel of every head, before o_proj -> `gate=channel`;
- layer_types (from global_attn_every_n_layers when absent): sliding layers (sliding_window) with rotary on every
  dim at rope_theta (scaled as rope_utils scales it: linear, dynamic, llama3, yarn); full layers without positions (NoPE);
- the first num_dense_layers layers a swiglu MLP of intermediate_size; the rest routed experts: sigmoid scores,
  the top num_experts_per_tok chosen by score + expert_bias (a selection-only bias: no weight reads it), the chosen
  unbiased scores divided by their sum + 1e-20 and times route_scale (DeepSeek-V3's router, exactly: the language's
  `router=sigmoid correction=true scale=`), beside a swiglu shared expert of moe_intermediate_size x num_shared_experts.

Refused by name: attention_bias (q, k, v, o biased but the gate never: the language's gate takes the attention's
bias), rope types the language lacks (longrope, ...), a partial_rotary_factor (which AFMoE's rope ignores),
num_shared_experts 0 (empty matrices), a null head_dim or num_dense_layers (transformers cannot build them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ... import ir
from ..closed import Config, Keys, Unsupported, _show
from .gemma4 import _int, _num

FAMILY = "afmoe"
_MAPS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers", "num_dense_layers",
                   "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                   "tie_word_embeddings", "rope_parameters", "num_experts", "num_experts_per_tok", "num_shared_experts", "route_scale",
                   "global_attn_every_n_layers", "sliding_window", "layer_types", "mup_enabled", "pad_token_id", "attention_bias"})
KEYS = {FAMILY: Keys(_MAPS)}
CAUSAL_LM = {FAMILY: "AfmoeForCausalLM"}
_TYPES = {"sliding_attention": "local", "full_attention": "global"}


@dataclass(frozen=True)
class Afmoe:
    """An afmoe checkpoint (AfmoeForCausalLM), in the language's terms."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int  # the dense layers' MLP
    act: str
    moe_hidden: int
    experts: int
    top: int
    shared: int  # num_shared_experts
    route_scale: float
    eps: float
    window: int | None
    rotary_base: float
    kinds: tuple  # each layer's "local" | "global", "_dense" | "_moe"
    mup: bool
    padding: int | None
    tied: bool
    scaling: ir.RotaryScaling | None  # the sliding layers' rotary scaling (rope_parameters.rope_type)
    sources: dict = field(default_factory=dict, compare=False)

    def spec_text(self, source: str) -> str:
        return _text(self, source)


def read(c: Config) -> Afmoe:
    from .core import _GATED_ACTS, _dynamic_context, _eps, _kv, _padding, _rope_kind, _rope_scaling

    layers, width, heads = _int(c, "num_hidden_layers"), _int(c, "hidden_size"), _int(c, "num_attention_heads")
    kv = _kv(c, heads)
    head_dim = _int(c, "head_dim")  # AfmoeAttention reads it as it is: null builds no projections
    act = _GATED_ACTS.get(c["hidden_act"])
    if act is None:
        raise Unsupported("hidden_act", f"{_show(c['hidden_act'])}: a gated MLP with it has no counterpart (swiglu = silu, geglu = gelu)")
    if c["attention_bias"] is not False:
        raise Unsupported("attention_bias", f"{_show(c['attention_bias'])}: AFMoE biases q, k, v and o but never its output gate; the "
                          "language's gate takes the attention's bias")
    dense = _int(c, "num_dense_layers", 0)
    experts, top = _int(c, "num_experts"), _int(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    shared = _int(c, "num_shared_experts")  # 0: transformers builds empty matrices, refused rather than read as none
    scale = c["route_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise Unsupported("route_scale", f"{_show(scale)} is not a positive number")
    mup = c["mup_enabled"]
    if mup not in (True, False, None):
        raise Unsupported("mup_enabled", f"{_show(mup)} is not true or false")
    types = c["layer_types"]
    if types is None:  # __post_init__: every n-th layer global
        every = _int(c, "global_attn_every_n_layers")
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in _TYPES for t in types):
        raise Unsupported("layer_types", f"{_show(types)}: one of sliding_attention, full_attention per layer ({layers})")
    window = None
    if "sliding_attention" in types:
        window = _int(c, "sliding_window")
    rope, where, kind = _rope_kind(c)  # rotary scaling as rope_utils computes it (the language's linear, dynamic, llama3, yarn)
    context = _int(c, "max_position_embeddings")
    scaling = _rope_scaling(c, context)
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise Unsupported(f"{where}.partial_rotary_factor", "AFMoE's default rope turns every dim of a head whatever this says")
    base = rope.get("rope_theta")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise Unsupported(f"{where}.rope_theta", f"{_show(base)}: a rotary base above 1")
    kinds = tuple(_TYPES[t] + ("_dense" if i < dense else "_moe") for i, t in enumerate(types))
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "attn": "num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps",
               "moe": "num_experts, num_experts_per_tok, moe_intermediate_size x num_shared_experts, route_scale, expert_bias",
               "mlp": "intermediate_size, hidden_act (num_dense_layers)"}
    return Afmoe(FAMILY, _int(c, "vocab_size"), _dynamic_context(context, scaling), width, layers, heads, kv, head_dim,
                 _int(c, "intermediate_size"), act, _int(c, "moe_intermediate_size"), experts, top, shared, float(scale),
                 _eps(c, "rms_norm_eps"), window, float(base), kinds, bool(mup), _padding(c), bool(c["tie_word_embeddings"]), scaling, sources)


# --- the spec -------------------------------------------------------------------------------------


def _scaling(sc) -> str:
    from .core import _scaling_text

    return _scaling_text(sc)


def _template(a: Afmoe, kind: str) -> list[str]:
    base, _, work = kind.partition("_")
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    att = f"turbine attention heads={a.heads} kv_heads={a.kv_heads} head_dim={a.head_dim}"
    if base == "local":
        att += f" window={a.window} rotary" + (f" rotary_base={_num(a.rotary_base)}" if a.rotary_base != 10000.0 else "") + _scaling(a.scaling)
    att += f" qk_norm qk_norm_eps={_num(a.eps)} gate=channel bias=false"
    if work == "moe":
        turb = (f"turbine moe experts={a.experts} top={a.top} hidden={a.moe_hidden} act={a.act} bias=false shared={a.moe_hidden * a.shared} "
                f"router=sigmoid" + (f" scale={_num(a.route_scale)}" if a.route_scale != 1.0 else "") + " correction=true")
    else:
        turb = f"turbine mlp hidden={a.hidden} act={a.act} bias=false"
    what = (f"sliding-window attention ({a.window} tokens, rotary)" if base == "local" else "global attention without positions (NoPE)")
    what += ", then routed experts" if work == "moe" else ", then a dense MLP"
    return [f"# an {a.family} layer with {what}; its attention output gated per channel; each turbine with its norm before and after",
            f"stage {a.family}_{kind} {{",
            "  prechamber mix {", f"    {norm}  # rms_norm_eps", f"    {att}  # {a.sources['attn']}", f"    {norm}", "  }",
            "  prechamber burn {", f"    {norm}", f"    {turb}  # {a.sources['moe' if work == 'moe' else 'mlp']}", f"    {norm}", "  }",
            "}", ""]


def _text(a: Afmoe, source: str) -> str:
    from .core import _header, _layer_runs

    lines = [*_header(a.family, source), f"let d_model = {a.width}  # hidden_size", ""]
    for kind in ("local_dense", "global_dense", "local_moe", "global_moe"):
        if kind in a.kinds:
            lines += _template(a, kind)
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (" scale=sqrt(width)" if a.mup else "")
    if a.padding is not None:
        feed += f" padding={a.padding}"
    feed += "  # vocab_size, max_position_embeddings" + (", mup_enabled: sqrt(hidden_size)" if a.mup else "") + (", pad_token_id" if a.padding is not None else "")
    lines += [f"engine {a.family} {{", "  chamber width=d_model", "  throat causal", f"  {feed}", "",
              *_layer_runs(a.family, list(a.kinds)), "", f"  norm rmsnorm eps={_num(a.eps)}  # the final norm",
              "  nozzle head" + (" tied" if a.tied else "") + "  # tie_word_embeddings", "}", ""]
    return "\n".join(lines)


# --- the weights ----------------------------------------------------------------------------------


def plan(plan, put, layout: dict, final: str, state, fused):
    """AFMoE's weights onto the module (load._plan's contract: module key -> (checkpoint keys, transform))."""
    from ..mapping import _put_experts, _put_gated

    for i, st in sorted(layout.items()):
        reactor = st.moe or st.mlp
        if st.attn is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or an mlp/moe turbine; transformers' afmoe layer {i} has both"
            continue
        h = f"layers.{i}."
        put_attention(put, st, h, "gate_proj")
        put(f"{st.valves[st.attn]}.weight", h + "input_layernorm.weight")
        put(f"{st.posts[st.attn]}.weight", h + "post_attention_layernorm.weight")
        put(f"{st.valves[reactor]}.weight", h + "pre_mlp_layernorm.weight")
        put(f"{st.posts[reactor]}.weight", h + "post_mlp_layernorm.weight")
        m = st.work_node
        if st.moe is not None:
            put(f"{st.moe}.router.weight", h + "mlp.router.gate.weight")
            put(f"{st.moe}.correction", h + "mlp.expert_bias")
            _put_experts(put, st.moe, h + "mlp.", m, state, fused)
            _put_gated(put, f"{st.moe}.shared", h + "mlp.shared_experts.", m.shared)
        else:
            _put_gated(put, st.mlp, h + "mlp.", m.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def put_attention(put, st, h: str, gate: str) -> None:
    """An output-gated attention with per-head qk-norms from q, k, v, o and the gate's projection (named `gate`) under `h`
    (AFMoE's and Laguna's names)."""
    from ..mapping import _Cat

    a = st.attn_node
    put(f"{st.attn}.qkv.weight", [h + f"self_attn.{n}_proj.weight" for n in "qkv"],
        _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
    put(f"{st.attn}.proj.weight", h + "self_attn.o_proj.weight")
    put(f"{st.attn}.gate.weight", h + f"self_attn.{gate}.weight")
    put(f"{st.attn}.q_norm.weight", h + "self_attn.q_norm.weight")
    put(f"{st.attn}.k_norm.weight", h + "self_attn.k_norm.weight")


# --- the config an engine implies (export) ---------------------------------------------------------


def owns(engine: ir.Engine) -> bool:
    """Whether an engine has attention gated per channel by a sigmoid, and no gated DeltaNet: export reads it as afmoe."""
    ops = [o for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list() for o in b.ops]
    return not any(isinstance(o, ir.GatedDelta) for o in ops) and any(
        isinstance(o, ir.Attention) and o.gate == "channel" and o.gate_act == "sigmoid" for o in ops)


def layers_of(engine: ir.Engine, what: str) -> tuple[list, list]:
    """(each layer's attention, its MLP or experts) in the order the layers run; Unsupported unless each layer has one of each."""
    from .core import _run_order

    stages = _run_order([op for op in engine.body if isinstance(op, ir.Stage)])
    if not stages:
        raise Unsupported("stages", "the engine has no stages")
    attns, works = [], []
    for st in stages:
        ops = [o for b in st.branch_list() for o in b.ops]
        at = [o for o in ops if isinstance(o, ir.Attention)]
        wk = [o for o in ops if isinstance(o, (ir.Mlp, ir.Moe))]
        if len(at) != 1 or len(wk) != 1:
            raise Unsupported(f"stage {st.name}", f"{what} has one attention and one MLP or routed experts")
        attns.append(at[0])
        works.append(wk[0])
    return attns, works


def engine_config(engine: ir.Engine) -> dict:
    """The afmoe config of an engine shaped like AFMoE's decoder; export then checks, field by field, that importing it
    gives back the engine. Unsupported says why not."""
    from types import SimpleNamespace

    from .core import _HF_GATED, _max_positions, _rope_config

    attns, works = layers_of(engine, "an AFMoE layer")
    dense = next((i for i, w in enumerate(works) if isinstance(w, ir.Moe)), len(works))
    if any(isinstance(w, ir.Mlp) for w in works[dense:]):
        raise Unsupported("stages", "AFMoE's dense layers are its first num_dense_layers; a dense layer after routed ones is not one of them")
    moe = works[dense] if dense < len(works) else None
    mlp = works[0] if dense else None
    local = next((t for t in attns if t.window is not None), None)
    first = attns[0]
    act = (mlp or moe).act
    if act not in _HF_GATED:
        raise Unsupported("act", f"{act}: AFMoE's MLP and experts are gated (swiglu or geglu)")
    final = engine.body[-1]
    if moe is not None and (not moe.shared or moe.shared % moe.hidden):
        raise Unsupported("shared", f"AFMoE's shared expert is a whole multiple of the experts' width {moe.hidden}")
    mup = engine.feed.scale != 1.0
    scaled = SimpleNamespace(rotary_scaling=local.rotary_scaling if local is not None else None, context=engine.feed.context)
    rope = _rope_config(scaled, {"rope_type": "default", "rope_theta": local.rotary_base if local is not None else 10000.0})
    return {"model_type": FAMILY, "architectures": [CAUSAL_LM[FAMILY]], "vocab_size": engine.feed.vocab, "hidden_size": engine.width,
            "intermediate_size": mlp.hidden if mlp else 6144, "moe_intermediate_size": moe.hidden if moe else 1408,
            "num_hidden_layers": len(attns), "num_dense_layers": dense, "num_attention_heads": first.heads,
            "num_key_value_heads": first.kv_heads, "head_dim": first.head_dim, "hidden_act": _HF_GATED[act],
            "max_position_embeddings": _max_positions(scaled), "rms_norm_eps": getattr(final, "eps", 1e-5), "tie_word_embeddings": engine.nozzle.tied,
            "rope_parameters": rope,
            "num_experts": moe.experts if moe else 64, "num_experts_per_tok": moe.top if moe else 6,
            "num_shared_experts": moe.shared // moe.hidden if moe else 2, "route_scale": moe.scale if moe else 1.0,
            "sliding_window": local.window if local is not None else 1024,
            "layer_types": ["sliding_attention" if t.window is not None else "full_attention" for t in attns],
            "mup_enabled": mup, "pad_token_id": engine.feed.padding, "attention_bias": False}
