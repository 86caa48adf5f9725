"""The gated DeltaNet hybrids (`turbine delta` beside attention), each read closed-world (closed.py): Qwen3-Next
(qwen3_next), Qwen3.5's text decoders (qwen3_5_text, qwen3_5_moe_text), OLMo Hybrid (olmo_hybrid) and Lara Mini
(lara_mini); the last two in `_olmo_hybrid` and `_lara_mini` (their differences said there).

What makes them (transformers 5.24's modeling files):
- layer_types says each layer's mixer, linear_attention (a gated DeltaNet: linear_num_value_heads value heads of
  linear_value_head_dim, linear_num_key_heads query/key heads of linear_key_head_dim, a short causal conv of
  linear_conv_kernel_dim with silu on [q | k | v], L2-normalised q and k, the gated delta rule, a gated RMSNorm
  per head with rms_norm_eps, out_proj; no biases) or full_attention (num_attention_heads of head_dim, q_proj
  emitting an output gate per channel beside each head's query, sigmoid(gate) * o before o_proj; per-head qk
  RMSNorms with a (1 + w) gain; rotary on partial_rotary_factor of each head, 0.25 by default; attention_bias on
  q, k, v and o). Without layer_types: full attention every full_attention_interval-th layer (4).
- every RMSNorm outside the DeltaNet is (1 + w), its weight starting at 0: `norm rmsnorm offset=1`.
- the MLP: a swiglu MLP (qwen3_5_text), or Qwen2-MoE's routed experts (softmax top-k, renormalised when
  norm_topk_prob) beside a shared expert scaled by sigmoid(w . x) (qwen3_next; qwen3_5_moe_text in every layer);
  Qwen3-Next's dense layers (mlp_only_layers, decoder_sparse_step) a swiglu MLP of intermediate_size.
- the weights: Qwen3.5's DeltaNet names are ours (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a); Qwen3-Next fuses
  them head group by head group (in_proj_qkvz: per key head [q | k | v | z of its value heads]; in_proj_ba: per
  key head [b | a]), and every q_proj interleaves each head's query with its gate: the load plan regroups them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import ir
from . import core as _f
from ..closed import FAMILY_ROPE_KEYS, PARTIAL_DEFAULT, Config, Keys, Unsupported, _show
from .ssm import _jamba_body

PARTIAL_DEFAULT.update({"qwen3_next": 0.25, "qwen3_5_text": 0.25, "qwen3_5_moe_text": 0.25})  # their __post_init__'s setdefault
# Qwen3.5's multimodal rotary (mrope): per-section positions for image and video tokens; a text model's positions
# are the same in every section, so the sections turn every pair by the same angle plain rotary does
_MROPE = frozenset({"mrope_section", "mrope_interleaved"})
FAMILY_ROPE_KEYS.update({"qwen3_5_text": _MROPE, "qwen3_5_moe_text": _MROPE})

_COMMON = frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_act",
                     "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters", "attention_bias", "head_dim",
                     "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                     "linear_num_value_heads", "layer_types", "pad_token_id"})
_MOE = frozenset({"moe_intermediate_size", "shared_expert_intermediate_size", "num_experts_per_tok", "num_experts"})

_INIT = "the spread of a freshly initialised {} (its uniform or log-uniform range); an import loads every weight"
_OLMO = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "hidden_act", "max_position_embeddings", "rms_norm_eps", "pad_token_id", "tie_word_embeddings", "rope_parameters",
                   "attention_bias", "layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                   "linear_value_head_dim", "linear_conv_kernel_dim", "linear_allow_neg_eigval"})

_LARA = (_COMMON | _MOE | {"norm_topk_prob", "sliding_window"})

KEYS: dict[str, Keys] = {
    "qwen3_next": Keys(_COMMON | _MOE | {"intermediate_size", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers"}),
    "qwen3_5_text": Keys(_COMMON | {"intermediate_size"}),
    "qwen3_5_moe_text": Keys(_COMMON | _MOE),
    "olmo_hybrid": Keys(_OLMO, {"linear_a_log_min": _INIT.format("A_log"), "linear_a_log_max": _INIT.format("A_log"),
                                "linear_dt_min": _INIT.format("dt_bias"), "linear_dt_max": _INIT.format("dt_bias"),
                                "linear_dt_init_floor": _INIT.format("dt_bias")}),
    "lara_mini": Keys(_LARA),
}
CAUSAL_LM = {"qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
             "olmo_hybrid": "OlmoHybridForCausalLM", "lara_mini": "LaraMiniForCausalLM"}


@dataclass(frozen=True)
class DeltaHybrid:
    """A gated DeltaNet hybrid checkpoint: per layer (mixer, reactor), mixer "delta" or "attention", reactor "mlp" or "moe"."""

    family: str
    vocab: int
    context: int
    width: int
    pattern: tuple
    heads: int
    kv_heads: int
    head_dim: int
    rotary: float
    rotary_base: float
    attn_bias: bool
    delta: str  # the `turbine delta` options
    hidden: int  # the dense MLP's
    eps: float
    tied: bool
    padding: int | None
    experts: int = 0
    top: int = 0
    moe_hidden: int = 0
    shared: int = 0
    normalize: bool = True
    sources: dict = field(default_factory=dict, compare=False)
    olmo: bool = False  # OLMo Hybrid: plain gains; its attention layers OLMo-3's (post-norms, qk-norms across heads, no gate)
    lara: bool = False  # Lara Mini: plain gains, no output gate; sliding layers (window, rotary) and full ones (no rotary)
    window: int | None = None
    shared_gate: bool = True


def _whole(c: Config, key: str) -> int:
    return _f._count(c, key)


def _layer_types(c: Config, layers: int) -> list[str]:
    types = c["layer_types"]
    types = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)] if types is None else types
    if not isinstance(types, list) or len(types) != layers or any(t not in ("linear_attention", "full_attention") for t in types):
        raise Unsupported("layer_types", f"{_show(types)}: linear_attention or full_attention, one per layer ({layers})")
    return types


def _delta_options(c: Config, eps: float) -> str:
    nv, nk = _whole(c, "linear_num_value_heads"), _whole(c, "linear_num_key_heads")
    if nv % nk:
        raise Unsupported("linear_num_key_heads", f"{nk} key heads do not divide {nv} value heads")
    dk, dv, conv = _whole(c, "linear_key_head_dim"), _whole(c, "linear_value_head_dim"), _whole(c, "linear_conv_kernel_dim")
    return f"heads={nv} k_heads={nk} head_dim={dk} v_dim={dv} conv={conv} eps={_f._num(eps)}"


def _read(family: str):
    def read(c: Config) -> DeltaHybrid:
        width, heads, layers = _whole(c, "hidden_size"), _whole(c, "num_attention_heads"), _whole(c, "num_hidden_layers")
        if c["hidden_act"] not in ("silu", "swish"):
            raise Unsupported("hidden_act", f"{_show(c['hidden_act'])}: the DeltaNet's conv and the MLPs are silu (swiglu) here; "
                              "another activation has no counterpart")
        kv = _f._kv(c, heads)
        head_dim = _whole(c, "head_dim")
        rope, where, kind = _f._rope_kind(c)
        if kind != "default":
            raise Unsupported(f"{where}.rope_type", "rotary scaling in these hybrids' attention layers is not mapped")
        eps = _f._eps(c, "rms_norm_eps")
        types = _layer_types(c, layers)
        moe = family != "qwen3_5_text"
        dense = [False] * layers
        if family == "qwen3_next":
            step, only = _whole(c, "decoder_sparse_step"), c["mlp_only_layers"]
            if only is not None and (not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only)):
                raise Unsupported("mlp_only_layers", f"{_show(only)} is not a list of layer numbers")
            experts = c["num_experts"]
            if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
                raise Unsupported("num_experts", f"{_show(experts)} is not a number of experts")
            dense = [i in set(only or ()) or experts == 0 or (i + 1) % step != 0 for i in range(layers)]
            moe = not all(dense)
        mixers = ["delta" if t == "linear_attention" else "attention" for t in types]
        pattern = tuple((m, "mlp" if d or not moe else "moe") for m, d in zip(mixers, dense))
        extra: dict = {}
        if moe:
            experts, top = _whole(c, "num_experts"), _whole(c, "num_experts_per_tok")
            if top > experts:
                raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
            extra = {"experts": experts, "top": top, "moe_hidden": _whole(c, "moe_intermediate_size"),
                     "shared": _whole(c, "shared_expert_intermediate_size"),
                     "normalize": bool(c["norm_topk_prob"]) if family == "qwen3_next" else True}
        hidden = _whole(c, "intermediate_size") if any(r == "mlp" for _, r in pattern) else 0
        src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "pattern": "layer_types",
               "attn": "num_attention_heads, num_key_value_heads, head_dim, rope_parameters (partial_rotary_factor 0.25 unless given), "
                       "attention_bias; the output gate from q_proj",
               "delta": "linear_num_value_heads, linear_num_key_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim",
               "hidden": "intermediate_size", "moe": "num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size"
               + (", norm_topk_prob" if family == "qwen3_next" else ""), "eps": "rms_norm_eps; (1 + w) gains", "tied": "tie_word_embeddings",
               "padding": "pad_token_id"}
        return DeltaHybrid(family, c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, kv, head_dim,
                           _f._rotary(_f._partial(c), head_dim), _f._rope(c), bool(c["attention_bias"]), _delta_options(c, eps), hidden, eps,
                           bool(c["tie_word_embeddings"]), _f._padding(c), sources=src, **extra)
    return read


def _olmo_hybrid(c: Config) -> DeltaHybrid:
    """OLMo Hybrid: OLMo-3's attention layers (each branch's RMSNorm after it, a qk RMSNorm across the heads, rotary unless
    rope_theta is null: the released checkpoints' NoPE) among Llama-style pre-norm gated DeltaNet layers (separate q, k, v,
    g, a, b projections, beta x 2 when linear_allow_neg_eigval, its gated norm's eps 1e-5 always); a swiglu MLP in every layer."""
    width, heads, layers = _whole(c, "hidden_size"), _whole(c, "num_attention_heads"), _whole(c, "num_hidden_layers")
    _f._divides(width, heads, "num_attention_heads", "hidden_size")
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"{_show(c['hidden_act'])}: the DeltaNet's conv and the MLP are silu (swiglu) here")
    kv = _f._kv(c, heads)
    rope = c["rope_parameters"]
    if isinstance(rope, dict) and "rope_theta" in rope and rope["rope_theta"] is None:  # no rotary at all (transformers skips it)
        if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type", "rope_theta"}:
            raise Unsupported("rope_parameters", f"{_show(rope)}: a null rope_theta turns rotary off; its other parameters would do nothing")
        rotary, base = 0.0, 10000.0
    else:
        _, where, kind = _f._rope_kind(c)
        if kind != "default":
            raise Unsupported(f"{where}.rope_type", "rotary scaling in OLMo Hybrid's attention layers is not mapped")
        rotary, base = _f._rotary(_f._partial(c), width // heads), _f._rope(c)
    types = c["layer_types"]
    if types is None:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
    if not isinstance(types, list) or len(types) != layers or any(t not in ("linear_attention", "full_attention") for t in types):
        raise Unsupported("layer_types", f"{_show(types)}: linear_attention or full_attention, one per layer ({layers})")
    nk = heads if c["linear_num_key_heads"] is None else _whole(c, "linear_num_key_heads")
    nv = heads if c["linear_num_value_heads"] is None else _whole(c, "linear_num_value_heads")
    if nv % nk:
        raise Unsupported("linear_num_key_heads", f"{nk} key heads do not divide {nv} value heads")
    dk = int(0.75 * width / nk) if c["linear_key_head_dim"] is None else _whole(c, "linear_key_head_dim")
    dv = 2 * dk if c["linear_value_head_dim"] is None else _whole(c, "linear_value_head_dim")
    if dk < 1:
        raise Unsupported("linear_key_head_dim", f"null: 0.75 x hidden_size / linear_num_key_heads is {dk}, no width")
    delta = f"heads={nv} k_heads={nk} head_dim={dk} v_dim={dv} conv={_whole(c, 'linear_conv_kernel_dim')} eps=1e-05"
    delta += " negative_eigenvalues" if c["linear_allow_neg_eigval"] else ""
    eps = _f._eps(c, "rms_norm_eps")
    pattern = tuple(("delta" if t == "linear_attention" else "attention", "mlp") for t in types)
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "pattern": "layer_types",
           "attn": "num_attention_heads, num_key_value_heads, rope_parameters (null rope_theta: no rotary), attention_bias",
           "delta": "linear_num_value_heads, linear_num_key_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim, "
                    "linear_allow_neg_eigval; the gated norm's eps is 1e-5",
           "hidden": "intermediate_size", "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "padding": "pad_token_id"}
    return DeltaHybrid("olmo_hybrid", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, kv, width // heads, rotary, base,
                       bool(c["attention_bias"]), delta, _whole(c, "intermediate_size"), eps, bool(c["tie_word_embeddings"]), _f._padding(c),
                       sources=src, olmo=True)


def _lara_mini(c: Config) -> DeltaHybrid:
    """Lara Mini: Qwen3.5's gated DeltaNet among Qwen3 attention layers (per-head qk RMSNorms, no output gate), sliding ones
    (sliding_window, rotary) and full ones (no rotary: transformers gives them no position embeddings); plain RMSNorm gains; routed
    experts in every layer beside an ungated shared expert."""
    width, heads, layers = _whole(c, "hidden_size"), _whole(c, "num_attention_heads"), _whole(c, "num_hidden_layers")
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"{_show(c['hidden_act'])}: the DeltaNet's conv and the experts are silu (swiglu) here")
    kv = _f._kv(c, heads)
    head_dim = _whole(c, "head_dim")
    _, where, kind = _f._rope_kind(c)
    if kind != "default":
        raise Unsupported(f"{where}.rope_type", "rotary scaling in Lara Mini's sliding layers is not mapped")
    eps = _f._eps(c, "rms_norm_eps")
    types = c["layer_types"]
    if types is None:
        period = ["linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"]
        types = [period[i % 5] for i in range(layers)]
    names = {"linear_attention": "delta", "sliding_attention": "sliding", "full_attention": "full"}
    if not isinstance(types, list) or len(types) != layers or any(t not in names for t in types):
        raise Unsupported("layer_types", f"{_show(types)}: linear_attention, sliding_attention or full_attention, one per layer ({layers})")
    window = _f._sliding(c) if "sliding_attention" in types else None
    experts, top = _whole(c, "num_experts"), _whole(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "pattern": "layer_types",
           "attn": "num_attention_heads, num_key_value_heads, head_dim, rope_parameters, attention_bias; sliding_window on the sliding layers",
           "delta": "linear_num_value_heads, linear_num_key_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim",
           "moe": "num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size (ungated), norm_topk_prob",
           "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "padding": "pad_token_id"}
    return DeltaHybrid("lara_mini", c["vocab_size"], c["max_position_embeddings"], width, tuple((names[t], "moe") for t in types), heads, kv,
                       head_dim, _f._rotary(_f._partial(c), head_dim), _f._rope(c), bool(c["attention_bias"]), _delta_options(c, eps), 0, eps,
                       bool(c["tie_word_embeddings"]), _f._padding(c), experts=experts, top=top, moe_hidden=_whole(c, "moe_intermediate_size"),
                       shared=_whole(c, "shared_expert_intermediate_size"), normalize=bool(c["norm_topk_prob"]), sources=src, lara=True,
                       window=window, shared_gate=False)


READERS = {f: _read(f) for f in KEYS if f not in ("olmo_hybrid", "lara_mini")}
READERS["olmo_hybrid"] = _olmo_hybrid
READERS["lara_mini"] = _lara_mini


def spec_text(a: DeltaHybrid, source: str) -> str:
    if a.olmo:
        return _olmo_text(a, source)
    src, num, comment = a.sources, _f._num, _f._comment
    offset = "" if a.lara else " offset=1"
    norm = f"norm rmsnorm{offset} eps={num(a.eps)}"
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    rot = "" if not a.rotary else " rotary" if a.rotary == 1.0 else f" rotary={num(a.rotary)}"
    rot += f" rotary_base={num(a.rotary_base)}" if a.rotary and a.rotary_base != 10000.0 else ""
    attn = f"turbine attention heads={a.heads}{kv} head_dim={a.head_dim}"
    qk = f"qk_norm{offset.replace('offset', 'qk_norm_offset')} qk_norm_eps={num(a.eps)}"
    mixers = {"attention": f"{attn}{rot} {qk} gate=channel bias={num(a.attn_bias)}{comment(src, 'attn')}",
              "sliding": f"{attn}{rot}{f' window={a.window}' if a.window is not None else ''} {qk} bias={num(a.attn_bias)}{comment(src, 'attn')}",
              "full": f"{attn} {qk} bias={num(a.attn_bias)}  # no rotary: transformers gives the full layers no positions",
              "delta": f"turbine delta {a.delta}{comment(src, 'delta')}"}
    reactors = {"mlp": f"turbine mlp hidden={a.hidden} act=swiglu bias=false{comment(src, 'hidden')}",
                "moe": f"turbine moe experts={a.experts} top={a.top} hidden={a.moe_hidden} act=swiglu bias=false shared={a.shared}"
                       f"{' shared_gate' if a.shared_gate else ''} normalize={num(a.normalize)}{comment(src, 'moe')}"}
    templates: list[str] = []
    for m, r in dict.fromkeys(a.pattern):
        templates += [f"stage {m}_{r} {{", "  prechamber mix {", f"    {norm}", f"    {mixers[m]}", "  }",
                      "  prechamber burn {", f"    {norm}", f"    {reactors[r]}", "  }", "}", ""]
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *_f._header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: each a mixer (a gated DeltaNet, or",
        ("# sliding or full attention), then routed experts beside an ungated shared one," if a.lara else
         f"# attention with an output gate), then a swiglu MLP{' or routed experts beside a gated shared one' if a.experts else ''},"),
        f"# each with its {'' if a.lara else '(1 + w) '}RMSNorm in front ({src['eps']})",
        *templates,
        *_f._engine_lines(a, src, f"{feed}{comment(src, 'vocab', 'padding')}",
                          [ln.replace("stage jamba_block", "stage hybrid_block", 1) for ln in _jamba_body(a)], norm)])


def _olmo_text(a: DeltaHybrid, source: str) -> str:
    src, num, comment = a.sources, _f._num, _f._comment
    norm = f"norm rmsnorm eps={num(a.eps)}"
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    rot = "" if not a.rotary else " rotary" if a.rotary == 1.0 else f" rotary={num(a.rotary)}"
    rot += f" rotary_base={num(a.rotary_base)}" if a.rotary and a.rotary_base != 10000.0 else ""
    mlp = f"turbine mlp hidden={a.hidden} act=swiglu bias=false{comment(src, 'hidden')}"
    templates: list[str] = []
    for m, _ in dict.fromkeys(a.pattern):
        if m == "attention":  # OLMo-3's layer: each branch's norm after its turbine
            templates += ["stage attention_mlp {", "  prechamber mix {",
                          f"    turbine attention heads={a.heads}{kv}{rot} qk_norm qk_norm_across qk_norm_eps={num(a.eps)} bias={num(a.attn_bias)}"
                          f"{comment(src, 'attn')}", f"    {norm}", "  }", "  prechamber burn {", f"    {mlp}", f"    {norm}", "  }", "}", ""]
        else:
            templates += ["stage delta_mlp {", "  prechamber mix {", f"    {norm}", f"    turbine delta {a.delta}{comment(src, 'delta')}", "  }",
                          "  prechamber burn {", f"    {norm}", f"    {mlp}", "  }", "}", ""]
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *_f._header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: a gated DeltaNet with its RMSNorm in front, or",
        f"# OLMo-3's attention with its RMSNorm after it; then a swiglu MLP, its norm on the same side ({src['eps']})",
        *templates,
        *_f._engine_lines(a, src, f"{feed}{comment(src, 'vocab', 'padding')}",
                          [ln.replace("stage jamba_block", "stage hybrid_block", 1) for ln in _jamba_body(a)], norm)])


# --- export: the config of an engine of these families ----------------------------------------------------


def engine_config(engine: ir.Engine) -> dict:
    """The transformers config of an engine with gated DeltaNet layers; export then checks, field by field, that
    importing it gives back the engine. Unsupported says why not."""
    layers = _layers(engine)
    if engine.nozzle.bias or engine.nozzle.scale != 1.0 or engine.feed.scale != 1.0 or engine.feed.position != "none":
        raise Unsupported("feed / nozzle", "these families have no positions table, no embedding or logit multiplier and no head bias")
    if not all(len(layer) == 2 for layer in layers):
        raise Unsupported("stages", "a Qwen3-Next or Qwen3.5 layer is a mixer branch, then an MLP branch")
    mixers, reactors = [ly[0][1] for ly in layers], [ly[1][1] for ly in layers]
    if engine.name == "olmo_hybrid" or any(post for ly in layers for _, _, post in ly):
        return _olmo_config(engine, layers, mixers, reactors)
    if engine.name == "lara_mini" or any(isinstance(m, ir.Attention) and m.gate == "none" for m in mixers):
        return _lara_config(engine, layers, mixers, reactors)
    if not all(isinstance(m, (ir.GatedDelta, ir.Attention)) for m in mixers) or not all(isinstance(r, (ir.Mlp, ir.Moe)) for r in reactors):
        raise Unsupported("stages", "a Qwen3-Next or Qwen3.5 layer is a gated DeltaNet or attention, then an MLP or routed experts")
    d = next(m for m in mixers if isinstance(m, ir.GatedDelta))
    attn = next((m for m in mixers if isinstance(m, ir.Attention)), None)
    moe = next((r for r in reactors if isinstance(r, ir.Moe)), None)
    mlp = next((r for r in reactors if isinstance(r, ir.Mlp)), None)
    family = engine.name if engine.name in KEYS else "qwen3_next" if moe is not None else "qwen3_5_text"
    cfg = {"model_type": family, "architectures": [CAUSAL_LM[family]], "vocab_size": engine.feed.vocab, "hidden_size": engine.width,
           "num_hidden_layers": len(layers), "tie_word_embeddings": engine.nozzle.tied, "pad_token_id": engine.feed.padding,
           "max_position_embeddings": engine.feed.context, "rms_norm_eps": engine.body[-1].eps, "hidden_act": "silu",
           "layer_types": ["linear_attention" if isinstance(m, ir.GatedDelta) else "full_attention" for m in mixers],
           "linear_num_value_heads": d.heads, "linear_num_key_heads": d.k_heads, "linear_key_head_dim": d.head_dim,
           "linear_value_head_dim": d.v_dim, "linear_conv_kernel_dim": d.conv,
           "num_attention_heads": attn.heads if attn else 1, "num_key_value_heads": attn.kv_heads if attn else 1,
           "head_dim": attn.head_dim if attn else d.head_dim, "attention_bias": attn.bias if attn else False,
           "rope_parameters": {"rope_type": "default", "rope_theta": attn.rotary_base if attn else 10000.0,
                               "partial_rotary_factor": attn.rotary_dims / attn.head_dim if attn else 0.25}}
    if mlp is not None:
        cfg["intermediate_size"] = mlp.hidden
    if moe is not None:
        cfg.update({"num_experts": moe.experts, "num_experts_per_tok": moe.top, "moe_intermediate_size": moe.hidden,
                    "shared_expert_intermediate_size": moe.shared})
        if family == "qwen3_next":
            cfg.update({"norm_topk_prob": moe.normalize, "decoder_sparse_step": 1,
                        "mlp_only_layers": [i for i, r in enumerate(reactors) if isinstance(r, ir.Mlp)]})
    return cfg


def _layers(engine: ir.Engine) -> list:
    """Every layer (stage instance) as its branches' (norm, turbine, norm after the turbine) triples; Unsupported where a
    layer is not plain residual branches of an rmsnorm and a turbine."""
    main = [op for op in engine.body if not isinstance(op, ir.Stage)]
    if len(main) != 1 or not isinstance(engine.body[-1], ir.Norm) or engine.body[-1].type != "rmsnorm":
        raise Unsupported("main line", "these families' decoders end with one rmsnorm on the main line, before the head")
    layers: list = []

    def branches_of(st: ir.Stage) -> list:
        branches = []
        for b in st.ops:
            ok = isinstance(b, ir.Prechamber) and not b.detach and not b.overboard and isinstance(b.merge, (ir.PlainMerge, ir.CoolingMerge))
            ops = b.ops if ok else []
            post = len(ops) == 2 and not isinstance(ops[0], ir.Norm)
            norm, turbine = (ops[1], ops[0]) if post else (ops[0], ops[1]) if len(ops) == 2 else (None, None)
            if not isinstance(norm, ir.Norm) or norm.type != "rmsnorm" or isinstance(turbine, ir.Norm):
                raise Unsupported(f"stage {st.name}", "a layer of these families is plain residual branches (an rmsnorm and a turbine), nothing else")
            branches.append((norm, turbine, post))
        return branches

    for v in ir.walk(engine.body, unroll=True):  # the layers in the order they run: a nested stage's, group by group
        if not v.stage.is_group:
            layers.append(branches_of(v.stage))
    if not layers:
        raise Unsupported("stages", "the engine has no layers")
    return layers


def _lara_config(engine: ir.Engine, layers: list, mixers: list, reactors: list) -> dict:
    d = next(m for m in mixers if isinstance(m, ir.GatedDelta))
    attn = [m for m in mixers if isinstance(m, ir.Attention)]
    moe = next((r for r in reactors if isinstance(r, ir.Moe)), None)
    if not attn or moe is None:
        raise Unsupported("stages", "Lara Mini has attention layers beside its gated DeltaNet ones, and routed experts in every layer")
    rotated = next((a for a in attn if a.rotary_dims), attn[0])
    windows = {a.window for a in attn if a.window is not None}
    return {"model_type": "lara_mini", "architectures": [CAUSAL_LM["lara_mini"]], "vocab_size": engine.feed.vocab, "hidden_size": engine.width,
            "num_hidden_layers": len(layers), "tie_word_embeddings": engine.nozzle.tied, "pad_token_id": engine.feed.padding,
            "max_position_embeddings": engine.feed.context, "rms_norm_eps": engine.body[-1].eps, "hidden_act": "silu",
            "layer_types": ["linear_attention" if isinstance(m, ir.GatedDelta) else "sliding_attention" if m.window is not None or m.rotary_dims
                            else "full_attention" for m in mixers],
            "sliding_window": windows.pop() if len(windows) == 1 else 512,
            "linear_num_value_heads": d.heads, "linear_num_key_heads": d.k_heads, "linear_key_head_dim": d.head_dim,
            "linear_value_head_dim": d.v_dim, "linear_conv_kernel_dim": d.conv, "num_attention_heads": attn[0].heads,
            "num_key_value_heads": attn[0].kv_heads, "head_dim": attn[0].head_dim, "attention_bias": attn[0].bias,
            "rope_parameters": {"rope_type": "default", "rope_theta": rotated.rotary_base,
                                "partial_rotary_factor": rotated.rotary_dims / rotated.head_dim if rotated.rotary_dims else 1.0},
            "num_experts": moe.experts, "num_experts_per_tok": moe.top, "moe_intermediate_size": moe.hidden,
            "shared_expert_intermediate_size": moe.shared, "norm_topk_prob": moe.normalize}


def _olmo_config(engine: ir.Engine, layers: list, mixers: list, reactors: list) -> dict:
    d = next(m for m in mixers if isinstance(m, ir.GatedDelta))
    attn = next((m for m in mixers if isinstance(m, ir.Attention)), None)
    if attn is None or not all(isinstance(r, ir.Mlp) for r in reactors):
        raise Unsupported("stages", "OLMo Hybrid has at least one attention layer, and a swiglu MLP in every layer")
    rope = {"rope_type": "default", "rope_theta": attn.rotary_base if attn.rotary_dims else None}
    return {"model_type": "olmo_hybrid", "architectures": [CAUSAL_LM["olmo_hybrid"]], "vocab_size": engine.feed.vocab,
            "hidden_size": engine.width, "intermediate_size": reactors[0].hidden, "num_hidden_layers": len(layers),
            "num_attention_heads": attn.heads, "num_key_value_heads": attn.kv_heads, "hidden_act": "silu",
            "max_position_embeddings": engine.feed.context, "rms_norm_eps": engine.body[-1].eps, "pad_token_id": engine.feed.padding,
            "tie_word_embeddings": engine.nozzle.tied, "rope_parameters": rope, "attention_bias": attn.bias,
            "layer_types": ["linear_attention" if isinstance(m, ir.GatedDelta) else "full_attention" for m in mixers],
            "linear_num_key_heads": d.k_heads, "linear_num_value_heads": d.heads, "linear_key_head_dim": d.head_dim,
            "linear_value_head_dim": d.v_dim, "linear_conv_kernel_dim": d.conv, "linear_allow_neg_eigval": d.negative_eigenvalues}


# --- the weights: transformers' names and groupings -> ours (and back, for export) ---------------------------


@dataclass(frozen=True)
class Rows:
    """Segments `take` of a checkpoint tensor whose rows come in `groups` equal groups, each the segments `sizes` in
    turn (Qwen3-Next's in_proj_qkvz: per key head [q | k | v | z]); ours: each segment taken, of every group, segment
    after segment. Export gives back a Piece, joined with the other tensors' pieces of the same checkpoint tensor."""

    groups: int
    sizes: tuple
    take: tuple

    def __call__(self, t):
        import torch

        g = t.reshape(self.groups, sum(self.sizes), *t.shape[1:])
        parts = g.split(list(self.sizes), dim=1)
        return torch.cat([parts[j].reshape(-1, *t.shape[1:]) for j in self.take])

    def inverse(self, t):
        return [Piece(self, t)]


@dataclass(frozen=True, eq=False)
class Piece:
    """One module tensor's share of a checkpoint tensor (`Rows`); `join` puts a tensor's shares back together."""

    rows: Rows
    value: object

    @staticmethod
    def join(pieces: list) -> object:
        import torch

        r, seg = pieces[0].rows, {}
        for p in pieces:
            for j, part in zip(p.rows.take, p.value.split([r.groups * r.sizes[j] for j in p.rows.take])):
                seg[j] = part.reshape(r.groups, r.sizes[j], *part.shape[1:])
        if sorted(seg) != list(range(len(r.sizes))):
            raise ValueError(f"segments {sorted(seg)} of {len(r.sizes)}: a share of the checkpoint tensor has no module tensor")
        return torch.cat([seg[j] for j in range(len(r.sizes))], dim=1).reshape(-1, *pieces[0].value.shape[1:]).contiguous()


@dataclass(frozen=True)
class QkvGate:
    """Ours [q | k | v] from q_proj (each head's query, then its gate: the query half), k_proj and v_proj."""

    heads: int
    head_dim: int
    kv: int  # k's (and v's) rows

    def __call__(self, q, k, v):
        import torch

        return torch.cat((Rows(self.heads, (self.head_dim, self.head_dim), (0,))(q), k, v))

    def inverse(self, t):
        q, k, v = t.split([self.heads * self.head_dim, self.kv, self.kv])
        return [Piece(Rows(self.heads, (self.head_dim, self.head_dim), (0,)), q), k.contiguous(), v.contiguous()]


_DELTA_PARAMS = ("conv1d.weight", "dt_bias", "A_log", "out_proj.weight")


def plan(arch: str, plan_, put, spec, state, fused):
    """Layer i is stage i: a gated DeltaNet (`linear_attn.`) or output-gated attention (`self_attn.`), then a swiglu MLP or
    routed experts beside a gated shared expert (`mlp.`), each with its (1 + w) RMSNorm in front."""
    from .. import mapping as L

    nodes = {path: part.node for part in ir.layout.layout(spec).parts() for path in part.instances()}
    if arch == "olmo_hybrid":
        return _plan_olmo(plan_, put, spec, nodes, state)
    for i, st in sorted(L._layout(spec).items()):
        h = f"layers.{i}."
        delta = next((p for p, v in st.valves.items() if isinstance(nodes.get(p), ir.GatedDelta)), None)
        mixer, reactor = st.attn or delta, st.moe or st.mlp
        if mixer is None or reactor is None or mixer not in st.valves or reactor not in st.valves:
            plan_.reasons[f"stages.{i}"] = (f"stage {i} lacks a delta or attention mixer, or an mlp or moe, each with its rmsnorm in front; "
                                            f"transformers' {arch} layer {i} has both")
            continue
        put(f"{st.valves[mixer]}.weight", h + "input_layernorm.weight")
        put(f"{st.valves[reactor]}.weight", h + "post_attention_layernorm.weight")
        if st.attn is not None and arch == "lara_mini":  # Qwen3's attention: no gate in q_proj
            a, s = st.attn_node, h + "self_attn."
            for p in ("weight", "bias"):
                put(f"{st.attn}.qkv.{p}", [s + f"{n}_proj.{p}" for n in "qkv"],
                    L._Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
                put(f"{st.attn}.proj.{p}", s + f"o_proj.{p}")
            put(f"{st.attn}.q_norm.weight", s + "q_norm.weight")
            put(f"{st.attn}.k_norm.weight", s + "k_norm.weight")
        elif st.attn is not None:
            a, s = st.attn_node, h + "self_attn."
            for p in ("weight", "bias"):
                put(f"{st.attn}.qkv.{p}", [s + f"{n}_proj.{p}" for n in "qkv"], QkvGate(a.heads, a.head_dim, a.kv_heads * a.head_dim))
                put(f"{st.attn}.gate.{p}", s + f"q_proj.{p}", Rows(a.heads, (a.head_dim, a.head_dim), (1,)))
                put(f"{st.attn}.proj.{p}", s + f"o_proj.{p}")
            put(f"{st.attn}.q_norm.weight", s + "q_norm.weight")
            put(f"{st.attn}.k_norm.weight", s + "k_norm.weight")
        else:
            d, s = nodes[delta], h + "linear_attn."
            if arch == "qwen3_next":  # fused head group by head group
                r = d.heads // d.k_heads
                qkvz = Rows(d.k_heads, (d.head_dim, d.head_dim, r * d.v_dim, r * d.v_dim), (0, 1, 2))
                put(f"{delta}.in_proj_qkv.weight", s + "in_proj_qkvz.weight", qkvz)
                put(f"{delta}.in_proj_z.weight", s + "in_proj_qkvz.weight", Rows(qkvz.groups, qkvz.sizes, (3,)))
                put(f"{delta}.in_proj_b.weight", s + "in_proj_ba.weight", Rows(d.k_heads, (r, r), (0,)))
                put(f"{delta}.in_proj_a.weight", s + "in_proj_ba.weight", Rows(d.k_heads, (r, r), (1,)))
            elif arch == "lara_mini" and (s + "in_proj.weight" in state or s + "in_proj_qkv.weight" not in state):
                # as saved (and exported): one in_proj, rows [q | k | v | z | b | a]; its gated norm's gain out_norm
                fused = (d.conv_dim, d.value_dim, d.heads, d.heads)
                for j, n in enumerate(("qkv", "z", "b", "a")):
                    put(f"{delta}.in_proj_{n}.weight", s + "in_proj.weight", Rows(1, fused, (j,)))
            else:
                for n in ("qkv", "z", "b", "a"):
                    put(f"{delta}.in_proj_{n}.weight", s + f"in_proj_{n}.weight")
            for n in _DELTA_PARAMS:
                put(f"{delta}.{n}", s + n)
            saved_norm = arch == "lara_mini" and (s + "out_norm.weight" in state or s + "norm.weight" not in state)
            put(f"{delta}.norm", s + ("out_norm.weight" if saved_norm else "norm.weight"))
        if st.moe is not None:
            m, b = st.work_node, h + "mlp."
            put(f"{st.moe}.router.weight", b + "gate.weight")
            L._put_experts(put, st.moe, b, m, state, fused)
            L._put_gated(put, f"{st.moe}.shared", b + "shared_expert.", m.shared)
            if m.shared_gate:
                put(f"{st.moe}.shared_gate.weight", b + "shared_expert_gate.weight")
        else:
            L._put_gated(put, st.mlp, h + "mlp.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{L._final_valve(spec)}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan_


def _plan_olmo(plan_, put, spec, nodes, state):
    """OLMo Hybrid: a DeltaNet layer's norms in front (input_layernorm, post_attention_layernorm) and its separate projections
    (q, k, v fused into ours in_proj_qkv; g_proj is the gate z; o_norm the gated norm); an attention layer's norms after its
    branches (post_attention_layernorm, post_feedforward_layernorm), its qk-norms across the heads."""
    from .. import mapping as L

    for i, st in sorted(L._layout(spec).items()):
        h = f"layers.{i}."
        delta = next((p for p in st.valves if isinstance(nodes.get(p), ir.GatedDelta)), None)
        if delta is not None and st.mlp is not None and st.mlp in st.valves:
            d, s = nodes[delta], h + "linear_attn."
            put(f"{st.valves[delta]}.weight", h + "input_layernorm.weight")
            put(f"{st.valves[st.mlp]}.weight", h + "post_attention_layernorm.weight")
            put(f"{delta}.in_proj_qkv.weight", [s + f"{n}_proj.weight" for n in "qkv"], L._Cat((d.key_dim, d.key_dim, d.value_dim)))
            for ours, theirs in (("in_proj_z.weight", "g_proj.weight"), ("in_proj_b.weight", "b_proj.weight"), ("in_proj_a.weight", "a_proj.weight"),
                                 ("out_proj.weight", "o_proj.weight"), ("norm", "o_norm.weight"), ("dt_bias", "dt_bias"), ("A_log", "A_log")):
                put(f"{delta}.{ours}", s + theirs)
            if s + "q_conv1d.weight" in state:  # as saved: one conv each for q, k, v
                put(f"{delta}.conv1d.weight", [s + f"{n}_conv1d.weight" for n in "qkv"], L._Cat((d.key_dim, d.key_dim, d.value_dim)))
            else:
                put(f"{delta}.conv1d.weight", s + "conv1d.weight")
        elif st.attn is not None and st.mlp is not None and st.attn in st.posts and st.mlp in st.posts:
            a, s = st.attn_node, h + "self_attn."
            put(f"{st.posts[st.attn]}.weight", h + "post_attention_layernorm.weight")
            put(f"{st.posts[st.mlp]}.weight", h + "post_feedforward_layernorm.weight")
            for p in ("weight", "bias"):
                put(f"{st.attn}.qkv.{p}", [s + f"{n}_proj.{p}" for n in "qkv"],
                    L._Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
                put(f"{st.attn}.proj.{p}", s + f"o_proj.{p}")
            put(f"{st.attn}.q_norm.weight", s + "q_norm.weight")
            put(f"{st.attn}.k_norm.weight", s + "k_norm.weight")
        else:
            plan_.reasons[f"stages.{i}"] = (f"stage {i} is neither a delta layer (rmsnorms in front of the delta and the mlp) nor an "
                                            f"attention layer (rmsnorms after the attention and the mlp); transformers' olmo_hybrid layer {i} is one")
            continue
        L._put_gated(put, st.mlp, h + "mlp.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{L._final_valve(spec)}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan_
