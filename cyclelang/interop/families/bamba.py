"""Bamba and GraniteMoeHybrid: Mamba-2 mixers and attention layers, a gated MLP (or experts) in each:
their records, readers, spec text, configs and weight plans."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ... import ir
from ..closed import Config, Keys, Unsupported
from ..mapping import _Cat, _Index, _Plan, _Stage, _parent, _put_gated
from .core import CAUSAL_LM, KEYS, _HF_GATED, _comment, _divides, _engine_lines, _eps, _header, _kv, _num, _padding, _partial, _rope, _rope_kind, _rotary
from .ssm import MAMBA2_MIXER, _jamba_body

# --- Bamba: Mamba-2 mixers and attention layers, a gated MLP in each ---------------------------------


@dataclass(frozen=True)
class HybridFamily:
    """A Bamba checkpoint (BambaForCausalLM): layer i mixes with attention where i is in attn_layer_indices
    (rotary on a part of each head, 0.5 unless rope_parameters say otherwise) and with a Mamba-2 mixer
    elsewhere; then a gated MLP; each branch with its RMSNorm in front."""

    family: str
    vocab: int
    context: int
    width: int
    pattern: tuple  # per layer (mixer, reactor): ("attention" | "mamba", "mlp")
    heads: int
    kv_heads: int
    rotary: float
    rotary_base: float
    attn_bias: bool
    hidden: int
    act: str
    mlp_bias: bool
    ssm: str  # the `turbine ssm ...` options
    eps: float
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)
    # GraniteMoeHybrid: Granite's multipliers, routed experts beside the shared MLP (reactor "moe")
    attn_scale: float | None = None
    embed_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    experts: int = 0
    top: int = 0
    shared: int = 0


def _hybrid_text(a: HybridFamily, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    rot = "" if not a.rotary else " rotary" if a.rotary == 1.0 else f" rotary={_num(a.rotary)}"
    rot += f" rotary_base={_num(a.rotary_base)}" if a.rotary and a.rotary_base != 10000.0 else ""
    rot += f" scale={_num(a.attn_scale)}" if a.attn_scale is not None else ""
    mixers = {"attention": f"turbine attention heads={a.heads}{kv}{rot} bias={_num(a.attn_bias)}{_comment(src, 'attn')}",
              "mamba": f"turbine ssm {a.ssm}{_comment(src, 'ssm')}"}
    reactors = {"mlp": f"turbine mlp hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}{_comment(src, 'hidden')}",
                "moe": f"turbine moe experts={a.experts} top={a.top} hidden={a.hidden} act={a.act} bias=false shared={a.shared}"
                       f"{_comment(src, 'moe')}"}
    merge = [f"    merge scale={_num(a.residual_scale)}{_comment(src, 'residual_scale')}"] if a.residual_scale != 1.0 else []
    templates: list[str] = []
    for m, r in dict.fromkeys(a.pattern):
        templates += [f"stage {m}_{r} {{", "  prechamber mix {", f"    {norm}", f"    {mixers[m]}", *merge, "  }",
                      "  prechamber burn {", f"    {norm}", f"    {reactors[r]}", *merge, "  }", "}", ""]
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    feed += f" scale={_num(a.embed_scale)}" if a.embed_scale != 1.0 else ""
    lines = _engine_lines(a, src, f"{feed}{_comment(src, 'vocab', 'padding', 'embed_scale')}", _jamba_body(a), norm)
    if a.logit_scale != 1.0:  # Granite's logits_scaling
        at = next(i for i, ln in enumerate(lines) if ln.startswith("  nozzle head"))
        lines[at] = "  nozzle head" + (" tied" if a.tied else "") + f" scale={_num(a.logit_scale)}{_comment(src, 'tied', 'logit_scale')}"
    return "\n".join([
        *_header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: each a mixer (attention or",
        f"# a Mamba-2 ssm), then a gated MLP{' or routed experts beside one' if a.experts else ''}, each with its RMSNorm in front ({src['eps']})",
        *templates,
        *lines])


KEYS["bamba"] = Keys(frozenset({"vocab_size", "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps", "pad_token_id",
                                "max_position_embeddings", "attn_layer_indices", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                                "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias",
                                "time_step_limit", "z_loss_coefficient", "rope_parameters", "attention_bias", "mlp_bias"}),
                     {"num_logits_to_keep": "how many positions' logits generation computes (logits_to_keep); the forward's logits "
                                            "of those positions are the same"})


def _mamba2_options(c: Config, width: int, eps: float) -> str:
    """The `turbine ssm` options of a Bamba-style Mamba-2 mixer (mamba_* keys; its gated norm's eps is rms_norm_eps)."""
    heads, groups, expand = c["mamba_n_heads"], c["mamba_n_groups"], c["mamba_expand"]
    if isinstance(expand, bool) or not isinstance(expand, (int, float)) or not expand > 0:
        raise Unsupported("mamba_expand", f"{expand!r} is not a positive number")
    inner = int(expand * width)
    head_dim = c["mamba_d_head"]
    head_dim = inner // heads if head_dim == "auto" else head_dim
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1 or head_dim * heads != inner:
        raise Unsupported("mamba_d_head", f"{head_dim!r} x mamba_n_heads {heads} is not the mixer's inner width int(mamba_expand x hidden_size) = {inner}")
    if heads % groups:
        raise Unsupported("mamba_n_groups", f"{groups} groups do not divide {heads} heads")
    if inner % groups:
        raise Unsupported("mamba_n_groups", f"{groups} groups do not divide the inner width {inner} (the gated norm's groups)")
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the ssm's conv and gate use silu and the MLP is silu-gated; {c['hidden_act']!r} has no counterpart")
    limit = c["time_step_limit"]
    if limit is None:
        raise Unsupported("time_step_limit", "null: transformers' mixer clamps the step to this range and cannot run without one "
                          "(no clamp is [0.0, Infinity])")
    if not isinstance(limit, list) or len(limit) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in limit) \
            or not 0 <= limit[0] < limit[1]:
        raise Unsupported("time_step_limit", f"{limit!r} is not a range [low, high] of step sizes (high may be Infinity)")
    lo, hi = float(limit[0]), float(limit[1])
    t = (f"heads={heads} head_dim={head_dim} state={c['mamba_d_state']} groups={groups} conv={c['mamba_d_conv']} "
         f"chunk={c['mamba_chunk_size']} bias={_num(bool(c['mamba_proj_bias']))} conv_bias={_num(bool(c['mamba_conv_bias']))} eps={_num(eps)}")
    t += f" dt_lo={_num(lo)}" if lo else ""
    t += f" dt_hi={_num(hi)}" if not math.isinf(hi) else ""
    return t


def _bamba(c: Config) -> HybridFamily:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    if c["z_loss_coefficient"]:
        raise Unsupported("z_loss_coefficient", "a z-loss (the squared log-partition) added to the training loss is not in the language")
    if c.given("partial_rotary_factor"):
        raise Unsupported("partial_rotary_factor", "BambaConfig.__post_init__ replaces a top-level partial_rotary_factor with 0.5; "
                          "write it in rope_parameters")
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling in Bamba's attention layers is not mapped")
    eps = _eps(c, "rms_norm_eps")
    ssm = _mamba2_options(c, width, eps)
    at = c["attn_layer_indices"]
    if at is not None and (not isinstance(at, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in at)):
        raise Unsupported("attn_layer_indices", f"{at!r} is not a list of layer numbers")
    at = set(at or ())
    if any(not 0 <= i < layers for i in at):
        raise Unsupported("attn_layer_indices", f"{sorted(at)}: layers are numbered 0 to {layers - 1}")
    pattern = tuple(("attention" if i in at else "mamba", "mlp") for i in range(layers))
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "pattern": "attn_layer_indices",
           "attn": "num_attention_heads, num_key_value_heads, rope_parameters (partial_rotary_factor 0.5 unless given), attention_bias",
           "ssm": "mamba_n_heads, mamba_d_head, mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, time_step_limit",
           "hidden": "intermediate_size, mlp_bias", "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "padding": "pad_token_id"}
    return HybridFamily("bamba", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, _kv(c, heads),
                        _rotary(_partial(c), width // heads), _rope(c), bool(c["attention_bias"]), c["intermediate_size"], "swiglu",
                        bool(c["mlp_bias"]), ssm, eps, bool(c["tie_word_embeddings"]), _padding(c), src)


KEYS["granitemoehybrid"] = Keys(frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "pad_token_id",
                                           "tie_word_embeddings", "rope_parameters", "attention_bias", "embedding_multiplier", "logits_scaling",
                                           "residual_multiplier", "attention_multiplier", "num_local_experts", "num_experts_per_tok",
                                           "shared_intermediate_size", "position_embedding_type", "layer_types", "mamba_n_heads",
                                           "mamba_n_groups", "mamba_d_state", "mamba_d_head", "mamba_d_conv", "mamba_expand", "mamba_chunk_size",
                                           "mamba_conv_bias", "mamba_proj_bias", "time_step_limit"}))

_GRANITE_LAYERS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def _granitemoehybrid(c: Config) -> HybridFamily:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the ssm's conv and gate use silu and the MLPs are silu-gated; {c['hidden_act']!r} has no counterpart")
    for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v == 0:
            raise Unsupported(k, f"{v!r}: Granite's multipliers are finite non-zero numbers")
    pos = c["position_embedding_type"]
    if pos not in (None, "rope"):
        raise Unsupported("position_embedding_type", f"{pos!r}: transformers' GraniteMoeHybrid has rotary (\"rope\") or no positions (null)")
    if pos == "rope" and _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling in GraniteMoeHybrid's attention layers is not mapped")
    types = c["layer_types"]
    types = ["linear_attention"] * layers if types is None else types
    if not isinstance(types, list) or len(types) != layers or any(t not in _GRANITE_LAYERS for t in types):
        raise Unsupported("layer_types", f"layer_types are mamba (linear_attention) or attention (full_attention), one per layer ({layers})")
    experts, top = c["num_local_experts"], c["num_experts_per_tok"]
    if isinstance(c["shared_intermediate_size"], bool) or not isinstance(c["shared_intermediate_size"], int) or c["shared_intermediate_size"] < 1:
        raise Unsupported("shared_intermediate_size", f"{c['shared_intermediate_size']!r}: the shared MLP's width is a whole number from 1")
    if experts and not 1 <= top <= experts:  # no experts (0): every layer is the shared MLP alone
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    eps = _eps(c, "rms_norm_eps")
    ssm = _mamba2_options(c, width, eps)
    pattern = tuple((_GRANITE_LAYERS[t], "moe" if experts else "mlp") for t in types)
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "pattern": "layer_types",
           "attn": "num_attention_heads, num_key_value_heads, position_embedding_type, rope_parameters, attention_multiplier, attention_bias",
           "ssm": "mamba_n_heads, mamba_d_head, mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, time_step_limit",
           "moe": "num_local_experts, num_experts_per_tok, intermediate_size; shared_intermediate_size: the shared MLP beside them",
           "hidden": "num_local_experts 0: the shared MLP alone, shared_intermediate_size wide",
           "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "padding": "pad_token_id", "embed_scale": "embedding_multiplier",
           "residual_scale": "residual_multiplier", "logit_scale": "1 / logits_scaling"}
    return HybridFamily("granitemoehybrid", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, _kv(c, heads),
                        1.0 if pos == "rope" else 0.0, _rope(c), bool(c["attention_bias"]),
                        c["intermediate_size"] if experts else c["shared_intermediate_size"], "swiglu", False, ssm, eps,
                        bool(c["tie_word_embeddings"]), _padding(c), src, attn_scale=float(c["attention_multiplier"]),
                        embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                        logit_scale=1.0 / float(c["logits_scaling"]), experts=experts, top=top, shared=c["shared_intermediate_size"])


def _hybrid_config(engine: ir.Engine, layers: list, base: dict, common: dict) -> dict:
    """The bamba config of an engine whose layers are a Mamba-2 ssm or attention, then a gated MLP."""
    mixers, reactors = [ly[0][1] for ly in layers], [ly[1][1] for ly in layers]
    if not all(isinstance(r, (ir.Mlp, ir.Moe)) for r in reactors) or not all(isinstance(m, (ir.Ssm, ir.Attention)) for m in mixers):
        raise Unsupported("stages", "a Bamba or GraniteMoeHybrid layer is a Mamba-2 ssm or attention, then an MLP or routed experts")
    s = next(m for m in mixers if isinstance(m, ir.Ssm))
    attn = next((m for m in mixers if isinstance(m, ir.Attention)), None)
    moe = next((r for r in reactors if isinstance(r, ir.Moe)), None)
    merges = {b.merge.value if isinstance(b.merge, ir.ScaleMerge) else 1.0 for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list()}
    if (engine.name == "granitemoehybrid" or moe is not None or engine.feed.scale != 1.0 or engine.nozzle.scale != 1.0 or merges != {1.0}
            or attn is not None and (attn.scale is not None or not attn.rotary_dims)):
        return _granite_hybrid_config(engine, layers, base, common, s, attn, moe, merges)
    mlp = reactors[0]
    if s.inner % engine.width:
        raise Unsupported("expand", f"Bamba's config says mamba_expand as a whole number; the inner width {s.inner} is not a multiple of {engine.width}")
    rope = {"rope_type": "default", "rope_theta": attn.rotary_base if attn else 10000.0,
            "partial_rotary_factor": attn.rotary_dims / attn.head_dim if attn else 0.5}
    return {"model_type": "bamba", "architectures": [CAUSAL_LM["bamba"]], **base, **common, "hidden_act": _HF_GATED.get(mlp.act, mlp.act),
            "num_attention_heads": attn.heads if attn else 1, "num_key_value_heads": attn.kv_heads if attn else 1,
            "attention_bias": attn.bias if attn else False, "rope_parameters": rope, "intermediate_size": mlp.hidden, "mlp_bias": mlp.bias,
            "attn_layer_indices": [i for i, m in enumerate(mixers) if isinstance(m, ir.Attention)], "mamba_n_heads": s.heads,
            "mamba_d_head": s.head_dim, "mamba_n_groups": s.groups, "mamba_d_state": s.state, "mamba_d_conv": s.conv,
            "mamba_expand": s.inner // engine.width, "mamba_chunk_size": s.chunk, "mamba_conv_bias": s.conv_bias, "mamba_proj_bias": s.bias,
            "time_step_limit": [s.dt_lo, s.dt_hi if s.dt_hi is not None else float("inf")], "rms_norm_eps": s.eps, "z_loss_coefficient": 0.0}


def _granite_hybrid_config(engine: ir.Engine, layers: list, base: dict, common: dict, s, attn, moe, merges: set) -> dict:
    """The granitemoehybrid config of a hybrid engine with Granite's multipliers or routed experts beside a shared MLP."""
    mlps = [ly[1][1] for ly in layers if isinstance(ly[1][1], ir.Mlp)]
    if moe is None and mlps and not mlps[0].bias:  # no experts: the shared MLP alone
        return _granite_fields(engine, layers, base, common, s, attn, merges, {"num_local_experts": 0, "num_experts_per_tok": 0,
                               "intermediate_size": mlps[0].hidden, "shared_intermediate_size": mlps[0].hidden, "hidden_act": _HF_GATED.get(mlps[0].act, mlps[0].act)})
    if moe is None or not moe.shared or moe.shared_gate or not moe.normalize or moe.bias:
        raise Unsupported("turbine moe", "GraniteMoeHybrid's layers hold routed experts (renormalised top-k, no biases) beside an "
                          "ungated shared MLP (shared=), or the shared MLP alone")
    return _granite_fields(engine, layers, base, common, s, attn, merges, {"num_local_experts": moe.experts, "num_experts_per_tok": moe.top,
                           "intermediate_size": moe.hidden, "shared_intermediate_size": moe.shared, "hidden_act": _HF_GATED.get(moe.act, moe.act)})


def _granite_fields(engine: ir.Engine, layers: list, base: dict, common: dict, s, attn, merges: set, reactor: dict) -> dict:
    if s.inner % engine.width:
        raise Unsupported("expand", f"the config says mamba_expand as a whole number; the inner width {s.inner} is not a multiple of {engine.width}")
    types = ["attention" if isinstance(ly[0][1], ir.Attention) else "mamba" for ly in layers]
    scale = next(iter(merges)) if len(merges) == 1 else 1.0
    attn_scale = (attn.scale if attn.scale is not None else attn.head_dim ** -0.5) if attn else 1.0
    return {"model_type": "granitemoehybrid", "architectures": [CAUSAL_LM["granitemoehybrid"]], **base, **common, **reactor,
            "num_attention_heads": attn.heads if attn else 1,
            "num_key_value_heads": attn.kv_heads if attn else 1, "attention_bias": attn.bias if attn else False,
            "position_embedding_type": "rope" if attn is not None and attn.rotary_dims else None,
            "rope_parameters": {"rope_type": "default", "rope_theta": attn.rotary_base if attn else 10000.0},
            "embedding_multiplier": engine.feed.scale, "residual_multiplier": scale, "attention_multiplier": attn_scale,
            "logits_scaling": 1.0 / engine.nozzle.scale, "layer_types": types, "mamba_n_heads": s.heads,
            "mamba_d_head": s.head_dim, "mamba_n_groups": s.groups, "mamba_d_state": s.state, "mamba_d_conv": s.conv,
            "mamba_expand": s.inner // engine.width, "mamba_chunk_size": s.chunk, "mamba_conv_bias": s.conv_bias, "mamba_proj_bias": s.bias,
            "time_step_limit": [s.dt_lo, s.dt_hi if s.dt_hi is not None else float("inf")], "rms_norm_eps": s.eps}


def _put_hybrid_mixer(put, st: _Stage, h: str) -> None:
    """A Mamba-2 / attention hybrid's mixer under `h`: attention's q, k, v, o, or the Mamba-2 mixer (`mamba.`, transformers' names)."""
    if st.attn is not None:
        a = st.attn_node
        for p in ("weight", "bias"):
            put(f"{st.attn}.qkv.{p}", [h + f"self_attn.{n}_proj.{p}" for n in "qkv"],
                _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
            put(f"{st.attn}.proj.{p}", h + f"self_attn.o_proj.{p}")
        return
    for name in MAMBA2_MIXER:
        put(f"{st.ssm}.{name}", h + "mamba." + name)
    put(f"{st.ssm}.norm", h + "mamba.norm.weight")


def _plan_bamba(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Bamba: layer i is stage i: attention (q, k, v, o) or a Mamba-2 mixer (its names are transformers' own), then a
    gated MLP, each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        mixer = st.attn or st.ssm
        if mixer is None or st.mlp is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or ssm mixer, or an mlp; transformers' bamba layer {i} has both"
            continue
        put(f"{st.valves.get(mixer, _parent(mixer) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.mlp, _parent(st.mlp) + 'norm')}.weight", h + "pre_ff_layernorm.weight")
        _put_hybrid_mixer(put, st, h)
        _put_gated(put, st.mlp, h + "feed_forward.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "final_layernorm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_granitemoehybrid(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """GraniteMoeHybrid: layer i is stage i: attention or a Mamba-2 mixer, then routed experts (transformers 5's fused tensors, or
    the released files' input_linear / output_linear / router.layer) beside the shared MLP, each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        mixer, reactor = st.attn or st.ssm, st.moe or st.mlp
        if mixer is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or ssm mixer, or a moe or mlp; transformers' granitemoehybrid layer {i} has both"
            continue
        put(f"{st.valves.get(mixer, _parent(mixer) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(reactor, _parent(reactor) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        _put_hybrid_mixer(put, st, h)
        if st.moe is None:  # no experts (num_local_experts 0): the shared MLP alone
            put(f"{st.mlp}.fc.weight", h + "shared_mlp.input_linear.weight")
            put(f"{st.mlp}.proj.weight", h + "shared_mlp.output_linear.weight")
            continue
        b = h + "block_sparse_moe."
        legacy = not fused and b + "input_linear.weight" in state  # the released files' names (transformers renames them on load)
        put(f"{st.moe}.router.weight", b + ("router.layer.weight" if legacy else "router.weight"))
        n = st.work_node.experts
        for x in range(n):
            put(f"{st.moe}.experts.{x}.fc.weight", b + ("input_linear.weight" if legacy else "experts.gate_up_proj"), _Index(x, n))
            put(f"{st.moe}.experts.{x}.proj.weight", b + ("output_linear.weight" if legacy else "experts.down_proj"), _Index(x, n))
        put(f"{st.moe}.shared.fc.weight", h + "shared_mlp.input_linear.weight")  # rows [gate | up], as ours
        put(f"{st.moe}.shared.proj.weight", h + "shared_mlp.output_linear.weight")
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan
