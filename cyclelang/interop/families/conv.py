"""The short-convolution families (turbine short_conv), each read closed-world (closed.py): LFM2 (lfm2),
LFM2-MoE (lfm2_moe) and LFM3 (lfm3).

What makes each one (transformers 5.24's modeling files):
- lfm2: layer i mixes with grouped-query attention where layer_types[i] is full_attention and with a short gated
  convolution (Lfm2ShortConv: in_proj to B, C and x, a depthwise causal conv of conv_L_cache taps over B*x, C times
  it, out_proj; conv_bias on all three) where it is conv; layer_types defaults to full_attn_idxs' attention layers,
  and with neither every layer is attention. Attention: q, k, v, o unbiased, a per-head qk RMSNorm (q_layernorm,
  k_layernorm, eps norm_eps) before a whole rotary (theta 1,000,000 by default). Then a SwiGLU MLP (w1 gate, w3 up, w2
  down) whose width is intermediate_size, or with block_auto_adjust_ff_dim int(2/3 of it), then with
  block_ffn_dim_multiplier rounded up to block_multiple_of. RMSNorms in front of each branch (operator_norm, ffn_norm),
  the final one named embedding_norm; the embedding's padding row is pad_token_id (0 by default); the head tied.
- lfm2_moe: the same layers; the first num_dense_layers a SwiGLU MLP of intermediate_size (no adjusting), the rest
  routed experts: sigmoid scores, top-k chosen on the scores plus a selection-only bias per expert (expert_bias, a
  buffer; use_expert_bias), the weights the unbiased scores, with norm_topk_prob renormalised over their sum + 1e-6
  (`normalize_eps=1e-6`; DeepSeek-V3's router adds 1e-20), times routed_scaling_factor. layer_types must be given (the
  class has no default pattern).
- lfm3: the short conv beside Qwen3's attention (q, k, v, o biased by attention_bias; q_norm, k_norm per head; head_dim) in
  full_attention and sliding_attention layers, each type with its own rope_parameters; a SwiGLU MLP of
  intermediate_size; use_sandwich_norm adds an RMSNorm after each turbine (post_operator_norm, post_ffn_norm).

Refused by name: rotary scaling (rope_type other than default);
lfm3's use_attention_gate=true (a sigmoid gate per head on the attention output) and its proportional rotary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import ir
from . import core as F  # the readers' helpers
from ..closed import Config, Keys, Unsupported, _show
from .ssm import _jamba_body

_COMMON = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "max_position_embeddings", "norm_eps", "pad_token_id", "tie_word_embeddings", "rope_parameters", "conv_bias",
                     "conv_L_cache", "layer_types"})

KEYS: dict[str, Keys] = {
    "lfm2": Keys(_COMMON | {"block_multiple_of", "block_ffn_dim_multiplier", "block_auto_adjust_ff_dim", "full_attn_idxs"},
                 legacy={"block_ff_dim": "intermediate_size", "tie_embedding": "tie_word_embeddings"}),
    "lfm2_moe": Keys(_COMMON | {"moe_intermediate_size", "num_dense_layers", "num_experts_per_tok", "num_experts", "use_expert_bias",
                                "routed_scaling_factor", "norm_topk_prob"},
                     legacy={"tie_embedding": "tie_word_embeddings"}),
    "lfm3": Keys(_COMMON | {"head_dim", "sliding_window", "use_sandwich_norm", "use_attention_gate", "attention_bias"}),
}

CAUSAL_LM = {"lfm2": "Lfm2ForCausalLM", "lfm2_moe": "Lfm2MoeForCausalLM", "lfm3": "Lfm3ForCausalLM"}
NORM_EPS = 1e-6  # Lfm2MoeTopKRouter's norm_topk_prob: the chosen weights / (their sum + 1e-6), a constant of its code


@dataclass(frozen=True)
class ConvFamily:
    """An LFM2 checkpoint: per layer a mixer (attention or a short gated conv), then a SwiGLU MLP or routed experts."""

    family: str
    vocab: int
    context: int
    width: int
    pattern: tuple  # per layer (mixer, reactor): ("attention" | "conv", "mlp" | "moe")
    heads: int
    kv_heads: int
    head_dim: int
    rotary_base: float
    conv: int  # conv_L_cache: the short conv's taps
    conv_bias: bool
    hidden: int  # the dense MLP's width
    eps: float
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)
    experts: int = 0
    top: int = 0
    moe_hidden: int = 0
    normalize: bool = False
    route_scale: float = 1.0
    correction: bool = False
    # LFM3: a norm after each turbine too (use_sandwich_norm), attention_bias on q, k, v and o, sliding layers (mixer
    # "sliding") with their window and rotary base
    sandwich: bool = False
    attn_bias: bool = False
    window: int | None = None
    local_base: float = 10000.0


def _legacy(c: Config, key: str, old: str):
    """A key __post_init__ takes from an older name when that is given (LFM2's block_ff_dim, tie_embedding)."""
    return c[old] if c.given(old) else c[key]


def _bool(c: Config, key: str) -> bool:
    v = c[key]
    if not isinstance(v, bool):
        raise Unsupported(key, f"{_show(v)} is not true or false")
    return v


def _legacy_bool(c: Config, key: str, old: str) -> bool:
    return _bool(c, old) if c.given(old) else _bool(c, key)


def _layer_types(c: Config, layers: int) -> list:
    types = c["layer_types"]
    if types is None and c.family == "lfm2":  # __post_init__: attention at full_attn_idxs (every layer without them)
        at = c["full_attn_idxs"]
        if at is not None and (not isinstance(at, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in at)):
            raise Unsupported("full_attn_idxs", f"{_show(at)} is not a list of layer numbers")
        at = set(range(layers) if at is None else at)
        types = ["full_attention" if i in at else "conv" for i in range(layers)]
    if types is None:
        raise Unsupported("layer_types", "null: transformers' Lfm2MoeConfig has no default pattern, and its layers read layer_types")
    if not isinstance(types, list) or len(types) != layers or any(t not in ("full_attention", "conv") for t in types):
        raise Unsupported("layer_types", f"{_show(types)}: full_attention or conv, one per layer ({layers}); transformers' mask has no other kind")
    return types


def _mlp_width(c: Config) -> int:
    """Lfm2MLP's width: intermediate_size (block_ff_dim), or with block_auto_adjust_ff_dim int(2/3 of it), then with a
    block_ffn_dim_multiplier int(multiplier x that) rounded up to a multiple of block_multiple_of."""
    size = _legacy(c, "intermediate_size", "block_ff_dim")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise Unsupported("intermediate_size", f"{_show(size)} is not a whole number from 1")
    if not _bool(c, "block_auto_adjust_ff_dim"):
        return size
    size = int(2 * size / 3)
    mult = c["block_ffn_dim_multiplier"]
    if mult is not None:
        if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 < mult < float("inf"):
            raise Unsupported("block_ffn_dim_multiplier", f"{_show(mult)} is not a positive number")
        of = F._count(c, "block_multiple_of")
        size = int(mult * size)
        size = of * ((size + of - 1) // of)
    if size < 1:
        raise Unsupported("intermediate_size", f"{_show(c['intermediate_size'])}: the adjusted MLP width int(2/3 of it) is 0")
    return size


def _moe(c: Config, layers: int) -> dict:
    experts, top = F._count(c, "num_experts"), F._count(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    scale = c["routed_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise Unsupported("routed_scaling_factor", f"{_show(scale)} is not a positive number")
    dense = c["num_dense_layers"]
    if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
        raise Unsupported("num_dense_layers", f"{_show(dense)} is not a number of layers")
    if dense >= layers:
        raise Unsupported("num_dense_layers", f"{dense}: every one of the {layers} layers is dense, no experts to route")
    return {"experts": experts, "top": top, "moe_hidden": F._count(c, "moe_intermediate_size"), "normalize": _bool(c, "norm_topk_prob"),
            "route_scale": float(scale), "correction": _bool(c, "use_expert_bias"), "dense": dense}


def _read(c: Config) -> ConvFamily:
    family = c.family
    width, heads, layers = F._count(c, "hidden_size"), F._count(c, "num_attention_heads"), F._count(c, "num_hidden_layers")
    head_dim = width // heads  # Lfm2Attention: hidden_size // num_attention_heads, rounded down
    if head_dim < 1:
        raise Unsupported("num_attention_heads", f"{heads} heads in hidden_size {width}: heads of no width")
    if head_dim % 2:
        raise Unsupported("num_attention_heads", f"heads of {head_dim} dims (hidden_size // num_attention_heads): rotary pairs an even number")
    if F._rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling is not mapped for LFM2")
    if F._rope_kind(c)[0].get("partial_rotary_factor", 1.0) != 1.0:
        raise Unsupported("rope_parameters.partial_rotary_factor", "LFM2's rotary computes its frequencies over the whole head")
    conv = F._count(c, "conv_L_cache")
    types = _layer_types(c, layers)
    extra, sources = {}, {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                          "pattern": "layer_types" if c.given("layer_types") or family != "lfm2" else "full_attn_idxs",
                          "attn": "num_attention_heads, num_key_value_heads, rope_parameters; q_layernorm, k_layernorm: norm_eps",
                          "conv": "conv_L_cache, conv_bias", "eps": "norm_eps", "tied": "tie_word_embeddings", "padding": "pad_token_id"}
    if family == "lfm2":
        hidden = _mlp_width(c)
        reactors = ["mlp"] * layers
        sources["hidden"] = "intermediate_size, block_auto_adjust_ff_dim, block_ffn_dim_multiplier, block_multiple_of"
    else:
        hidden = F._count(c, "intermediate_size")
        moe = _moe(c, layers)
        dense = moe.pop("dense")
        extra.update(moe)
        reactors = ["mlp" if i < dense else "moe" for i in range(layers)]
        sources.update(hidden="intermediate_size, num_dense_layers", moe="num_experts, num_experts_per_tok, moe_intermediate_size, "
                       "routed_scaling_factor, use_expert_bias (expert_bias), norm_topk_prob (over the sum + 1e-6)")
    pattern = tuple(("attention" if t == "full_attention" else "conv", r) for t, r in zip(types, reactors))
    return ConvFamily(family, c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, F._kv(c, heads), head_dim, F._rope(c),
                      conv, _bool(c, "conv_bias"), hidden, F._eps(c, "norm_eps"), _legacy_bool(c, "tie_word_embeddings", "tie_embedding"),
                      F._padding(c), sources, **extra)


_LFM3_TYPES = ("full_attention", "sliding_attention", "conv")
_LFM3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},  # Lfm3Config.__post_init__'s
              "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5}}


def _lfm3_rope(c: Config, types: list) -> dict:
    """Each attention layer type's rotary base. Lfm3Config keeps rope parameters per layer type; each must be the plain
    rotary (transformers' default for a layer type turns every dim of the head_dim, whatever partial_rotary_factor says)."""
    for old in ("rope_scaling", "rope_theta", "partial_rotary_factor"):
        if c.given(old):
            raise Unsupported(old, "LFM3 keeps its rotary parameters per layer type in rope_parameters; a top-level key is not mapped")
    rope = c["rope_parameters"]
    rope = _LFM3_ROPE if rope is None else rope
    if not isinstance(rope, dict):
        raise Unsupported("rope_parameters", f"{_show(rope)} is not an object of rotary parameters per layer type")
    out = {}
    for t in dict.fromkeys(x for x in types if x != "conv"):
        p = rope.get(t)
        where = f"rope_parameters.{t}"
        if not isinstance(p, dict):
            raise Unsupported(where, f"{_show(p)}: transformers' LFM3 reads the rotary of each attention layer type from here")
        extra = set(p) - {"rope_type", "rope_theta", "partial_rotary_factor"}
        if extra:
            raise Unsupported(f"{where}.{sorted(extra)[0]}", "not a rotary parameter the importer maps")
        if p.get("rope_type") == "proportional":
            raise Unsupported(f"{where}.rope_type", "proportional rotary (the first partial_rotary_factor of each head's frequency pairs "
                              "at base^(-2i/head_dim), the rest unturned) is not in the language: its partial rotary spaces the "
                              "frequencies over the turned dims")
        if p.get("rope_type") != "default":
            raise Unsupported(f"{where}.rope_type", f"{_show(p.get('rope_type'))}: only the plain rotary is mapped for LFM3")
        theta = p.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
            raise Unsupported(f"{where}.rope_theta", f"{_show(theta)} is not a positive number")
        out[t] = float(theta)
    return out


def _read_lfm3(c: Config) -> ConvFamily:
    """LFM3: LFM2's short convs beside Qwen3's attention (per-head qk RMSNorm, attention_bias on q, k, v and o, head_dim)
    in full and sliding layers, each layer type with its own rotary; a SwiGLU MLP of intermediate_size; with
    use_sandwich_norm an RMSNorm after each turbine too (post_operator_norm, post_ffn_norm)."""
    width, heads, layers = F._count(c, "hidden_size"), F._count(c, "num_attention_heads"), F._count(c, "num_hidden_layers")
    if _bool(c, "use_attention_gate"):
        raise Unsupported("use_attention_gate", "a sigmoid gate per head on the attention output (g_proj, from the layer's input) is "
                          "not in the language here")
    head_dim = F._count(c, "head_dim")
    if head_dim % 2:
        raise Unsupported("head_dim", f"{head_dim}: rotary pairs an even number of dims")
    types = c["layer_types"]
    if types is None:  # __post_init__
        types = ["full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in _LFM3_TYPES for t in types):
        raise Unsupported("layer_types", f"{_show(types)}: full_attention, sliding_attention or conv, one per layer ({layers})")
    window = F._sliding(c)
    if "sliding_attention" in types and window is None:
        raise Unsupported("sliding_window", "null beside sliding_attention layers: transformers' sliding mask needs a window")
    bases = _lfm3_rope(c, types)
    names = {"full_attention": "attention", "sliding_attention": "sliding", "conv": "conv"}
    pattern = tuple((names[t], "mlp") for t in types)
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "pattern": "layer_types",
               "attn": "num_attention_heads, num_key_value_heads, head_dim, attention_bias, rope_parameters.full_attention",
               "sliding": "sliding_window, rope_parameters.sliding_attention",
               "conv": "conv_L_cache, conv_bias", "hidden": "intermediate_size", "eps": "norm_eps",
               "tied": "tie_word_embeddings", "padding": "pad_token_id"}
    return ConvFamily("lfm3", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, F._kv(c, heads), head_dim,
                      bases.get("full_attention", 1000000.0), F._count(c, "conv_L_cache"), _bool(c, "conv_bias"),
                      F._count(c, "intermediate_size"), F._eps(c, "norm_eps"), _bool(c, "tie_word_embeddings"), F._padding(c), sources,
                      sandwich=_bool(c, "use_sandwich_norm"), attn_bias=_bool(c, "attention_bias"),
                      window=window if "sliding_attention" in types else None, local_base=bases.get("sliding_attention", 10000.0))


READERS = {"lfm2": _read, "lfm2_moe": _read, "lfm3": _read_lfm3}


# --- the spec ------------------------------------------------------------------------------------


def spec_text(a: ConvFamily, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={F._num(a.eps)}" if a.eps != 1e-6 else "")
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    hd = f" head_dim={a.head_dim}" if a.head_dim * a.heads != a.width else ""
    base = f" rotary_base={F._num(a.rotary_base)}" if a.rotary_base != 10000.0 else ""
    qk = " qk_norm" + (f" qk_norm_eps={F._num(a.eps)}" if a.eps != 1e-6 else "")
    bias = f" bias={F._num(a.attn_bias)}"
    local = f" rotary_base={F._num(a.local_base)}" if a.local_base != 10000.0 else ""
    mixers = {"attention": f"turbine attention heads={a.heads}{kv}{hd} rotary{base}{qk}{bias}{F._comment(src, 'attn')}",
              "sliding": f"turbine attention heads={a.heads}{kv}{hd} rotary{local} window={a.window}{qk}{bias}{F._comment(src, 'sliding')}",
              "conv": f"turbine short_conv size={a.conv} bias={F._num(a.conv_bias)}{F._comment(src, 'conv')}"}
    reactors = {"mlp": f"turbine mlp hidden={a.hidden} act=swiglu bias=false{F._comment(src, 'hidden')}",
                "moe": f"turbine moe experts={a.experts} top={a.top} hidden={a.moe_hidden} act=swiglu bias=false normalize={F._num(a.normalize)} "
                       f"router=sigmoid" + (f" normalize_eps={F._num(NORM_EPS)}" if a.normalize else "")
                       + (f" scale={F._num(a.route_scale)}" if a.route_scale != 1.0 else "")
                       + (" correction=true" if a.correction else "") + F._comment(src, "moe")}
    templates: list[str] = []
    for m, r in dict.fromkeys(a.pattern):
        post = [f"    {norm}"] if a.sandwich else []  # LFM3's use_sandwich_norm: post_operator_norm, post_ffn_norm
        templates += [f"stage {m}_{r} {{", "  prechamber mix {", f"    {norm}", f"    {mixers[m]}", *post, "  }",
                      "  prechamber burn {", f"    {norm}", f"    {reactors[r]}", *post, "  }", "}", ""]
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *F._header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: each a mixer (attention or",
        f"# a short gated conv), then a SwiGLU MLP{' or routed experts' if a.experts else ''}, each with its RMSNorm in front"
        f"{' and behind' if a.sandwich else ''} ({src['eps']})",
        *templates,
        *F._engine_lines(a, src, f"{feed}{F._comment(src, 'vocab', 'padding')}", _jamba_body(a), norm)])


# --- export: the config of an engine of short convs and attention -----------------------------------


def engine_config(engine: ir.Engine, layers: list, base: dict, common: dict) -> dict:
    """The lfm2 (or, with routed experts, lfm2_moe) config of an engine whose layers are a short conv or attention,
    then a SwiGLU MLP or routed experts; export then checks, field by field, that importing it gives back the engine."""
    if not all(len(layer) == 2 for layer in layers):
        raise Unsupported("stages", "an LFM2 layer is a mixer branch (attention or a short conv), then an MLP branch")
    mixers, reactors = [ly[0][1] for ly in layers], [ly[1][1] for ly in layers]
    if not all(isinstance(m, (ir.ShortConv, ir.Attention)) for m in mixers) or not all(isinstance(r, (ir.Mlp, ir.Moe)) for r in reactors):
        raise Unsupported("stages", "an LFM2 layer is attention or a short conv, then a SwiGLU MLP or routed experts")
    conv = next(m for m in mixers if isinstance(m, ir.ShortConv))
    attn = next((m for m in mixers if isinstance(m, ir.Attention)), None)
    moe = next((r for r in reactors if isinstance(r, ir.Moe)), None)
    mlp = next((r for r in reactors if isinstance(r, ir.Mlp)), None)
    types = ["full_attention" if isinstance(m, ir.Attention) else "conv" for m in mixers]
    sandwich = any(len(b.ops) == 3 for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list())
    attns = [m for m in mixers if isinstance(m, ir.Attention)]
    if moe is None and (engine.name == "lfm3" or sandwich or any(m.window is not None or m.bias or m.head_dim * m.heads != engine.width
                                                                   for m in attns)):
        return _lfm3_config(engine, mixers, mlp, conv, attns, sandwich, base, common)
    cfg = {**base, "num_attention_heads": attn.heads if attn else 1, "num_key_value_heads": attn.kv_heads if attn else 1,
           "norm_eps": common["rms_norm_eps"], "max_position_embeddings": common["max_position_embeddings"],
           "rope_parameters": {"rope_type": "default", "rope_theta": attn.rotary_base if attn else 1000000.0},
           "conv_bias": conv.bias, "conv_L_cache": conv.size, "layer_types": types}
    if moe is None:
        return {"model_type": "lfm2", "architectures": [CAUSAL_LM["lfm2"]], **cfg, "intermediate_size": mlp.hidden,
                "block_auto_adjust_ff_dim": False, "full_attn_idxs": [i for i, t in enumerate(types) if t == "full_attention"]}
    dense = next((i for i, r in enumerate(reactors) if isinstance(r, ir.Moe)), len(reactors))
    if any(isinstance(r, ir.Mlp) for r in reactors[dense:]):
        raise Unsupported("stages", "LFM2-MoE's dense layers come first (num_dense_layers), then only routed ones")
    if moe.router != "sigmoid" or moe.shared or moe.groups > 1:
        raise Unsupported("turbine moe", "LFM2-MoE routes by sigmoid scores, one group, no shared expert")
    if moe.normalize and moe.normalize_eps != NORM_EPS:
        raise Unsupported("normalize_eps", f"LFM2-MoE's norm_topk_prob renormalises over the chosen scores' sum + {F._num(NORM_EPS)}; "
                          f"the spec adds {F._num(moe.normalize_eps)}, which its config cannot say")
    return {"model_type": "lfm2_moe", "architectures": [CAUSAL_LM["lfm2_moe"]], **cfg, "intermediate_size": mlp.hidden if mlp else moe.hidden,
            "moe_intermediate_size": moe.hidden, "num_dense_layers": dense, "num_experts": moe.experts, "num_experts_per_tok": moe.top,
            "use_expert_bias": moe.correction, "routed_scaling_factor": moe.scale, "norm_topk_prob": moe.normalize}


def _lfm3_config(engine: ir.Engine, mixers: list, mlp, conv, attns: list, sandwich: bool, base: dict, common: dict) -> dict:
    windows = {m.window for m in attns if m.window is not None}
    if len(windows) > 1:
        raise Unsupported("window", f"LFM3 has one sliding_window; the spec's layers have {sorted(windows)}")
    types = ["conv" if isinstance(m, ir.ShortConv) else "sliding_attention" if m.window is not None else "full_attention" for m in mixers]
    rope = {}
    for m, t in zip(mixers, types):
        if t != "conv":
            rope.setdefault(t, {"rope_type": "default", "rope_theta": m.rotary_base})
    attn = attns[0] if attns else None
    return {"model_type": "lfm3", "architectures": [CAUSAL_LM["lfm3"]], **base, "num_attention_heads": attn.heads if attn else 1,
            "num_key_value_heads": attn.kv_heads if attn else 1, "head_dim": attn.head_dim if attn else engine.width,
            "attention_bias": attn.bias if attn else False, "norm_eps": common["rms_norm_eps"],
            "max_position_embeddings": common["max_position_embeddings"], "conv_bias": conv.bias, "conv_L_cache": conv.size,
            "layer_types": types, "intermediate_size": mlp.hidden, "use_sandwich_norm": sandwich, "use_attention_gate": False,
            "sliding_window": windows.pop() if windows else None, "rope_parameters": rope}


# --- weights: transformers' names, layer by layer ----------------------------------------------------


def plan(plan, put, layout: dict, final: str, state, fused, lfm3: bool = False):
    """LFM2, LFM2-MoE and LFM3: layer i is stage i: attention (q, k, v, out_proj, the qk layernorms; LFM3's Qwen3 names
    o_proj, q_norm, k_norm) or the short conv (its names are transformers' own), then a SwiGLU MLP (w1, w3, w2) or routed
    experts, each with its valve (and LFM3's norms behind them)."""
    from ..mapping import _Cat, _Index, _parent

    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        mixer, reactor = st.attn or st.short_conv, st.moe or st.mlp
        if mixer is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or short_conv mixer, or an mlp or moe; the checkpoint's layer {i} has both"
            continue
        put(f"{st.valves.get(mixer, _parent(mixer) + 'norm')}.weight", h + "operator_norm.weight")
        put(f"{st.valves.get(reactor, _parent(reactor) + 'norm')}.weight", h + "ffn_norm.weight")
        for turbine, name in ((mixer, "post_operator_norm"), (reactor, "post_ffn_norm")):  # LFM3's sandwich
            if turbine in st.posts:
                put(f"{st.posts[turbine]}.weight", h + f"{name}.weight")
        if st.attn is not None:
            a = st.attn_node
            o, qn, kn = ("o_proj", "q_norm", "k_norm") if lfm3 else ("out_proj", "q_layernorm", "k_layernorm")
            for p in ("weight", "bias"):  # LFM3's attention_bias on all four
                put(f"{st.attn}.qkv.{p}", [h + f"self_attn.{n}_proj.{p}" for n in "qkv"],
                    _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
                put(f"{st.attn}.proj.{p}", h + f"self_attn.{o}.{p}")
            put(f"{st.attn}.q_norm.weight", h + f"self_attn.{qn}.weight")
            put(f"{st.attn}.k_norm.weight", h + f"self_attn.{kn}.weight")
        else:
            for name in ("in_proj", "conv", "out_proj"):
                for p in ("weight", "bias"):
                    put(f"{st.short_conv}.{name}.{p}", h + f"conv.{name}.{p}")
        b = h + "feed_forward."
        if st.moe is None:
            n = st.work_node.hidden
            put(f"{st.mlp}.fc.weight", [b + "w1.weight", b + "w3.weight"], _Cat((n, n)))
            put(f"{st.mlp}.proj.weight", b + "w2.weight")
            continue
        node = st.work_node
        put(f"{st.moe}.router.weight", b + "gate.weight")
        if node.correction:
            put(f"{st.moe}.correction", b + "expert_bias")
        mem = (b + "experts.gate_up_proj" in state) if fused is None else fused  # a model's own state dict; save_pretrained writes w1, w3, w2
        for x in range(node.experts):
            if mem:
                put(f"{st.moe}.experts.{x}.fc.weight", b + "experts.gate_up_proj", _Index(x, node.experts))
                put(f"{st.moe}.experts.{x}.proj.weight", b + "experts.down_proj", _Index(x, node.experts))
            else:
                e = b + f"experts.{x}."
                put(f"{st.moe}.experts.{x}.fc.weight", [e + "w1.weight", e + "w3.weight"], _Cat((node.hidden, node.hidden)))
                put(f"{st.moe}.experts.{x}.proj.weight", e + "w2.weight")
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "embedding_norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


PLANS = {"lfm2": plan, "lfm2_moe": plan, "lfm3": lambda *a: plan(*a, lfm3=True)}
