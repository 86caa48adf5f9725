"""Mamba-2 inside attention hybrids, each read closed-world (closed.py): Falcon-H1 (falcon_h1).

What makes each one (transformers 5.24's modeling files):
- falcon_h1: every layer is one block in which attention and a Mamba-2 mixer both read one RMSNorm of the stream
  (input_layernorm) and their outputs are summed into it (a fullflow of two branches), then a gated MLP with its own
  RMSNorm (pre_ff_layernorm). Its muP multipliers, each said in the language exactly:
  * embedding_multiplier, lm_head_multiplier: the feed's and the nozzle's scale;
  * key_multiplier k (the keys times k) and attention_in_multiplier a (attention's input times a): the logits'
    scale k a^2 / sqrt(head_dim), and a on the branch's output with attention_out_multiplier (`merge scale=`); with
    attention_bias the input multiplier is no scale on the logits, so it is refused unless 1;
  * ssm_in_multiplier s and ssm_multipliers m (the five sections z, x, B, C, dt of in_proj's output, each times its
    own): in_proj's sections times s m (`turbine ssm z_scale= ... dt_scale=`); with mamba_proj_bias, s is refused unless 1;
    ssm_out_multiplier: the ssm branch's `merge scale=`;
  * mlp_multipliers (gate, down): the MLP's `gate_scale=` and its branch's `merge scale=`.
  The Mamba-2 output is gated, not normalised, unless mamba_rms_norm (then normalised before the gate when
  mamba_norm_before_gate): `turbine ssm out_norm=none | before_gate | gated`.
  Export writes the multipliers back from the spec: attention_in_multiplier and ssm_in_multiplier as 1, their factor
  already inside key_multiplier, attention_out_multiplier and ssm_multipliers (the same function, said once).
- nemotron_h: each layer ONE mixer behind its RMSNorm, as layers_block_type (or hybrid_override_pattern's M, *, -, E)
  says: a Mamba-2 mixer (Bamba's, its gated norm per group, dt clamped from time_step_min: transformers' mixer reads
  no time_step_limit), attention without positions and without biases (Jamba's), or an ungated MLP (relu2 by
  default); its MoE layers (E) are refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ... import ir
from ..closed import Config, Keys, Unsupported
from ..mapping import _Cat, _Index, _Plan, _parent, _put_gated
from .bamba import _put_hybrid_mixer
from .core import _divides, _eps, _header, _kv, _padding, _rope, _rope_kind
from .ssm import MAMBA2_MIXER

_LOGITS_TO_KEEP = ("how many positions' logits generation computes (logits_to_keep); the forward's logits of those positions "
                   "are the same")

KEYS: dict[str, Keys] = {
    "falcon_h1": Keys(frozenset({"vocab_size", "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps", "pad_token_id",
                                 "max_position_embeddings", "mamba_d_ssm", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                                 "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size", "mamba_conv_bias",
                                 "mamba_proj_bias", "mamba_norm_before_gate", "mamba_rms_norm", "time_step_limit", "projectors_bias",
                                 "rope_parameters", "lm_head_multiplier", "embedding_multiplier", "mlp_multipliers", "key_multiplier",
                                 "attention_out_multiplier", "attention_in_multiplier", "ssm_multipliers", "ssm_in_multiplier",
                                 "ssm_out_multiplier", "attention_bias", "mlp_bias"}),
                      {"num_logits_to_keep": _LOGITS_TO_KEEP}),
}

_NEMOTRON_H_LEGACY = {"hybrid_override_pattern": "layers_block_type", "mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                      "mamba_expand": "expand", "mamba_dt_min": "time_step_min", "mamba_dt_max": "time_step_max",
                      "mamba_dt_limit": "time_step_limit", "mamba_dt_init_floor": "time_step_floor", "mamba_conv_bias": "use_conv_bias",
                      "mamba_chunk_size": "chunk_size"}
_NOT_READ = "transformers' NemotronH model does not read it"
KEYS["nemotron_h"] = Keys(
    frozenset({"vocab_size", "hidden_size", "layers_block_type", "pad_token_id", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "intermediate_size", "mlp_hidden_act", "mlp_bias",
               "ssm_state_size", "mamba_num_heads", "mamba_head_dim", "mamba_hidden_act", "n_groups", "conv_kernel", "time_step_min",
               "use_conv_bias", "chunk_size", "use_bias", "layer_norm_epsilon", "num_nextn_predict_layers", "n_routed_experts",
               "moe_intermediate_size", "moe_shared_expert_intermediate_size", "moe_latent_size", "num_experts_per_tok",
               "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob"}),
    {"num_logits_to_keep": _LOGITS_TO_KEEP,
     "tie_word_embeddings": "NemotronHForCausalLM declares no tied weights (its _tied_weights_keys is empty): the head is its own "
                            "matrix whatever this says",
     "attention_bias": "Nemotron-H's attention (Jamba's) builds q, k, v and o without biases whatever this says; " + _NOT_READ,
     "sliding_window": "Nemotron-H's attention (Jamba's) attends to every earlier position whatever this says; " + _NOT_READ,
     "expand": "the mixer's inner width is mamba_num_heads x mamba_head_dim; " + _NOT_READ,
     "time_step_limit": "the mixer clamps its step from time_step_min up, without limit; " + _NOT_READ,
     "time_step_max": "the upper end of the step bias's init range; an import loads every weight",
     "time_step_floor": "the smallest step the step bias's init starts at; an import loads every weight",
     "mamba_proj_bias": _NOT_READ + " (use_bias puts the biases on the mixer's projections)",
     "mamba_ssm_cache_dtype": "the dtype transformers' generation keeps the scan's state in; the forward does not read it",
     "use_mamba_kernels": "deprecated and without effect (transformers picks the kernels itself)",
     "residual_in_fp32": _NOT_READ, "rescale_prenorm_residual": "an init rule for the output projections; an import loads every weight",
     "mtp_layers_block_type": "the multi-token prediction layers' kinds; transformers' causal LM builds no such layer",
     "num_hidden_layers": "a property: the length of layers_block_type; its setter ignores what config.json says",
     "n_shared_experts": "the MoE layers' shared expert is one MLP moe_shared_expert_intermediate_size wide; " + _NOT_READ,
     "moe_shared_expert_overlap": _NOT_READ},
    legacy=_NEMOTRON_H_LEGACY)

CAUSAL_LM = {"falcon_h1": "FalconH1ForCausalLM", "nemotron_h": "NemotronHForCausalLM"}


@dataclass(frozen=True)
class ParallelHybrid:
    """A Falcon-H1 checkpoint: each layer a fullflow (one RMSNorm) of a Mamba-2 ssm and attention, summed, each
    with its merge scale; then a gated MLP (act(gate_scale x gate) x up), its merge scale; feed and logits scaled."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    rotary_base: float
    attn_bias: bool
    attn_scale: float | None  # the logits' scale; None: 1 / sqrt(head_dim)
    attn_merge: float
    ssm: str  # the `turbine ssm ...` options
    ssm_merge: float
    hidden: int
    mlp_bias: bool
    gate_scale: float
    mlp_merge: float
    eps: float
    tied: bool
    padding: int | None
    embed_scale: float
    logit_scale: float
    sources: dict = field(default_factory=dict, compare=False)


def _number(c: Config, key: str, value=None, nonzero: bool = False) -> float:
    """A finite number (transformers multiplies by it); `value`: an element of the key's list."""
    v = c[key] if value is None else value
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (nonzero and v == 0):
        raise Unsupported(key, f"{v!r}: a multiplier here is a finite{' non-zero' if nonzero else ''} number")
    return float(v)


def _pair(c: Config, key: str, n: int, default: list) -> list[float]:
    v = c[key]
    v = default if v is None else v  # FalconH1Config.__post_init__: null is all ones
    if not isinstance(v, list) or len(v) != n:
        raise Unsupported(key, f"{v!r} is not a list of {n} numbers")
    return [_number(c, key, x) for x in v]


def _falcon_h1_ssm(c: Config, width: int, eps: float) -> tuple[str, dict]:
    """The `turbine ssm` options of Falcon-H1's Mamba-2 mixer (mamba_d_ssm wide, or int(mamba_expand x hidden_size))."""
    heads, groups = c["mamba_n_heads"], c["mamba_n_groups"]
    for k in ("mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_chunk_size"):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise Unsupported(k, f"{v!r} is not a whole number from 1")
    inner = c["mamba_d_ssm"]
    if inner is None:
        expand = c["mamba_expand"]
        if isinstance(expand, bool) or not isinstance(expand, int) or expand < 1:
            raise Unsupported("mamba_expand", f"{expand!r} is not a whole number from 1")
        inner = int(expand * width)
    elif isinstance(inner, bool) or not isinstance(inner, int) or inner < 1:
        raise Unsupported("mamba_d_ssm", f"{inner!r} is not a whole width")
    head_dim = c["mamba_d_head"]
    head_dim = inner // heads if head_dim == "auto" else head_dim  # FalconH1Config.__post_init__
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1 or head_dim * heads != inner:
        raise Unsupported("mamba_d_head", f"{head_dim!r} x mamba_n_heads {heads} is not the mixer's inner width {inner} (mamba_d_ssm)")
    if heads % groups or inner % groups:
        raise Unsupported("mamba_n_groups", f"{groups} groups do not divide {heads} heads and the inner width {inner}")
    limit = c["time_step_limit"]
    if limit is None:
        raise Unsupported("time_step_limit", "null: transformers' mixer clamps the step to this range and cannot run without one "
                          "(no clamp is [0.0, Infinity])")
    if not isinstance(limit, list) or len(limit) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in limit) \
            or not 0 <= limit[0] < limit[1]:
        raise Unsupported("time_step_limit", f"{limit!r} is not a range [low, high] of step sizes (high may be Infinity)")
    bias = bool(c["mamba_proj_bias"])
    if bool(c["projectors_bias"]) != bias:
        raise Unsupported("projectors_bias", f"{c['projectors_bias']!r} on the mixer's out_proj beside mamba_proj_bias "
                          f"{c['mamba_proj_bias']!r} on its in_proj: turbine ssm's bias= is one switch for both")
    s_in = _number(c, "ssm_in_multiplier")
    if bias and s_in != 1.0:
        raise Unsupported("ssm_in_multiplier", f"{s_in:g} on the input of an in_proj with a bias (mamba_proj_bias) is no scale on "
                          "in_proj's output, which is what the language says")
    scales = [s_in * m for m in _pair(c, "ssm_multipliers", 5, [1.0] * 5)]
    rms, before = c["mamba_rms_norm"], c["mamba_norm_before_gate"]
    out_norm = "none" if not rms else "before_gate" if before else "gated"
    lo, hi = float(limit[0]), float(limit[1])
    t = (f"heads={heads} head_dim={head_dim} state={c['mamba_d_state']} groups={groups} conv={c['mamba_d_conv']} "
         f"chunk={c['mamba_chunk_size']} bias={_num(bias)} conv_bias={_num(bool(c['mamba_conv_bias']))} eps={_num(eps)}")
    t += f" dt_lo={_num(lo)}" if lo else ""
    t += f" dt_hi={_num(hi)}" if not math.isinf(hi) else ""
    t += f" out_norm={out_norm}" if out_norm != "gated" else ""
    t += "".join(f" {p}_scale={_num(v)}" for p, v in zip(("z", "x", "b", "c", "dt"), scales) if v != 1.0)
    return t, {"out_norm": "mamba_rms_norm, mamba_norm_before_gate"}


def _falcon_h1(c: Config) -> ParallelHybrid:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    head_dim = width // heads
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the ssm's conv and gate use silu and the MLP is silu-gated; {c['hidden_act']!r} has no counterpart")
    rope, where, kind = _rope_kind(c)
    if kind != "default":
        raise Unsupported(f"{where}.rope_type", "rotary scaling in Falcon-H1's attention is not mapped")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise Unsupported(f"{where}.partial_rotary_factor", "Falcon-H1's attention (Llama's) rotates every dim of each head")
    eps = _eps(c, "rms_norm_eps")
    ssm, ssm_src = _falcon_h1_ssm(c, width, eps)
    attn_bias = bool(c["attention_bias"])
    a, k = _number(c, "attention_in_multiplier"), _number(c, "key_multiplier")
    if attn_bias and a != 1.0:
        raise Unsupported("attention_in_multiplier", f"{a:g} on the input of biased q, k, v projections (attention_bias) is no "
                          "scale on the logits and the output, which is what the language says")
    if not k * a * a > 0:
        raise Unsupported("key_multiplier", f"{k:g} (with attention_in_multiplier {a:g}): the logits' scale k a^2 / sqrt(head_dim) "
                          "is a positive number in the language")
    scale = None if k * a * a == 1.0 else k * a * a / math.sqrt(head_dim)
    gate, down = _pair(c, "mlp_multipliers", 2, [1.0, 1.0])
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "padding": "pad_token_id",
           "attn": "num_attention_heads, num_key_value_heads, rope_parameters, attention_bias",
           "attn_scale": "key_multiplier x attention_in_multiplier^2 / sqrt(head_dim)",
           "attn_merge": "attention_out_multiplier x attention_in_multiplier",
           "ssm": "mamba_n_heads, mamba_d_head, mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, mamba_proj_bias, "
                  "mamba_conv_bias, time_step_limit, " + ssm_src["out_norm"] + ", ssm_in_multiplier x ssm_multipliers",
           "ssm_merge": "ssm_out_multiplier", "hidden": "intermediate_size, mlp_bias, mlp_multipliers[0]", "mlp_merge": "mlp_multipliers[1]",
           "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "embed_scale": "embedding_multiplier", "logit_scale": "lm_head_multiplier"}
    return ParallelHybrid("falcon_h1", c["vocab_size"], c["max_position_embeddings"], width, layers, heads, _kv(c, heads), _rope(c),
                          attn_bias, scale, _number(c, "attention_out_multiplier") * a, ssm, _number(c, "ssm_out_multiplier"),
                          c["intermediate_size"], bool(c["mlp_bias"]), gate, down, eps, bool(c["tie_word_embeddings"]), _padding(c),
                          _number(c, "embedding_multiplier"), _number(c, "lm_head_multiplier"), src)


_NEMOTRON_LAYERS = {"linear_attention": "mamba", "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
_PLAIN_ACTS = {"relu2": "relu2", "relu": "relu", "silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh"}


@dataclass(frozen=True)
class SingleMixerHybrid:
    """A Nemotron-H checkpoint: each layer one RMSNorm, then one mixer (`pattern`: mamba, attention or mlp), added back."""

    family: str
    vocab: int
    context: int
    width: int
    pattern: tuple  # per layer (kind, "layer")
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    act: str
    mlp_bias: bool
    ssm: str
    eps: float
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)
    moe: str = ""  # the MoE layers' `turbine moe ...` options


def _nemotron_moe(c: Config, act: str) -> str:
    """The `turbine moe` options of Nemotron-H's MoE layers: DeepSeek-V3's sigmoid router (its correction bias, groups, top groups,
    renormalised top-k + 1e-20, the scale) over ungated experts, beside one ungated shared expert."""
    if c["moe_latent_size"] is not None:
        raise Unsupported("moe_latent_size", "the experts reading a down-projected latent (fc1_latent_proj, fc2_latent_proj) are not "
                          "in the language")
    if c["mlp_bias"]:
        raise Unsupported("mlp_bias", "with MoE layers: their shared expert would be biased and the routed experts not; turbine moe's "
                          "bias= is one switch for both")
    values = {}
    for k in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size", "n_group",
              "topk_group"):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise Unsupported(k, f"{v!r} is not a whole number from 1")
        values[k] = v
    experts, top, groups, keep = values["n_routed_experts"], values["num_experts_per_tok"], values["n_group"], values["topk_group"]
    if experts % groups or experts // groups < 2:
        raise Unsupported("n_group", f"{experts} experts in {groups} groups: the router views them as equal groups and scores each by "
                          "its two best, so each holds 2 or more")
    if keep > groups:
        raise Unsupported("topk_group", f"{keep} of {groups} groups")
    if top > keep * (experts // groups):
        raise Unsupported("num_experts_per_tok", f"top-{top} of the {keep * (experts // groups)} experts in the {keep} kept groups")
    scale = c["routed_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise Unsupported("routed_scaling_factor", f"{scale!r} is not a positive number")
    t = (f"experts={experts} top={top} hidden={values['moe_intermediate_size']} act={act} bias=false"
         f"{'' if c['norm_topk_prob'] else ' normalize=false'} shared={values['moe_shared_expert_intermediate_size']} router=sigmoid")
    t += f" groups={groups} top_groups={keep}" if groups > 1 else ""
    t += f" scale={_num(float(scale))}" if scale != 1.0 else ""
    return t + " correction=true"


def _legacy(c: Config, key: str):
    """A field, or the older name transformers' __post_init__ moves into it (it wins, as the pop does)."""
    old = next((k for k, to in _NEMOTRON_H_LEGACY.items() if to == key), None)
    return c[old] if old is not None and c.given(old) else c[key]


def _nemotron_h(c: Config) -> SingleMixerHybrid:
    width = c["hidden_size"]
    types = c["layers_block_type"]
    if types is None:
        pattern = c["hybrid_override_pattern"] if c.given("hybrid_override_pattern") else None
        if pattern is not None and (not isinstance(pattern, str) or any(ch not in _PATTERN for ch in pattern) or not pattern):
            raise Unsupported("hybrid_override_pattern", f"{pattern!r} is not a string of M, *, - and E")
        types = [_PATTERN[ch] for ch in pattern] if pattern is not None else ["linear_attention", "moe", "full_attention", "mlp"]
    if not isinstance(types, list) or not types or any(t not in _NEMOTRON_LAYERS for t in types):
        raise Unsupported("layers_block_type", f"{types!r}: a list of linear_attention, full_attention, mlp and moe")
    if c["num_nextn_predict_layers"]:
        raise Unsupported("num_nextn_predict_layers", "multi-token prediction layers are not in the language")
    if c["mamba_hidden_act"] not in ("silu", "swish"):
        raise Unsupported("mamba_hidden_act", f"the ssm's conv and gate use silu; {c['mamba_hidden_act']!r} has no counterpart")
    act = _PLAIN_ACTS.get(c["mlp_hidden_act"])
    if act is None:
        raise Unsupported("mlp_hidden_act", f"{c['mlp_hidden_act']!r} has no ungated counterpart (relu2, relu, silu, gelu, the tanh gelu)")
    heads, head_dim = c["num_attention_heads"], c["head_dim"]
    kv = _kv(c, heads)
    eps = _eps(c, "layer_norm_epsilon")
    mheads, mdim, groups = c["mamba_num_heads"], c["mamba_head_dim"], _legacy(c, "n_groups")
    inner = mheads * mdim
    for key, v in (("n_groups", groups), ("conv_kernel", _legacy(c, "conv_kernel")), ("chunk_size", _legacy(c, "chunk_size"))):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise Unsupported(key, f"{v!r} is not a whole number from 1")
    if mheads % groups or inner % groups:
        raise Unsupported("n_groups", f"{groups} groups do not divide {mheads} heads and the inner width {inner}")
    lo = _legacy(c, "time_step_min")
    if isinstance(lo, bool) or not isinstance(lo, (int, float)) or not 0 < lo < math.inf:
        raise Unsupported("time_step_min", f"{lo!r}: the step's floor (and the log of its init range) is a positive number; "
                          "transformers' model cannot build with another")
    ssm = (f"heads={mheads} head_dim={mdim} state={c['ssm_state_size']} groups={groups} conv={_legacy(c, 'conv_kernel')} "
           f"chunk={_legacy(c, 'chunk_size')} bias={_num(bool(c['use_bias']))} conv_bias={_num(bool(_legacy(c, 'use_conv_bias')))} "
           f"eps={_num(eps)} dt_lo={_num(float(lo))}")
    moe = _nemotron_moe(c, act) if "moe" in types else ""
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "len(layers_block_type)", "pattern": "layers_block_type",
           "moe": "n_routed_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, moe_shared_expert_intermediate_size, "
                  "routed_scaling_factor, n_group, topk_group; the sigmoid router's correction bias",
           "attn": "num_attention_heads, num_key_value_heads, head_dim (no positions, no biases)",
           "ssm": "mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, conv_kernel, chunk_size, use_bias, use_conv_bias, "
                  "time_step_min (the step's floor)",
           "hidden": "intermediate_size, mlp_hidden_act, mlp_bias", "eps": "layer_norm_epsilon",
           "tied": "its own matrix (tie_word_embeddings ties nothing in transformers' NemotronH)", "padding": "pad_token_id"}
    return SingleMixerHybrid("nemotron_h", c["vocab_size"], c["max_position_embeddings"], width,
                             tuple((_NEMOTRON_LAYERS[t], "layer") for t in types), heads, kv, head_dim, c["intermediate_size"], act,
                             bool(c["mlp_bias"]), ssm, eps, False, _padding(c), src, moe)


READERS = {"falcon_h1": _falcon_h1, "nemotron_h": _nemotron_h}


def single_mixer_text(a: SingleMixerHybrid, source: str) -> str:
    from .core import _engine_lines
    from .ssm import _jamba_body

    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    hd = f" head_dim={a.head_dim}" if a.head_dim * a.heads != a.width else ""
    turbines = {"mamba": f"turbine ssm {a.ssm}{_comment(src, 'ssm')}",
                "attention": f"turbine attention heads={a.heads}{kv}{hd} bias=false{_comment(src, 'attn')}",
                "mlp": f"turbine mlp hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}{_comment(src, 'hidden')}",
                "moe": f"turbine moe {a.moe}{_comment(src, 'moe')}"}
    templates: list[str] = []
    for kind, tag in dict.fromkeys(a.pattern):
        templates += [f"stage {kind}_{tag} {{", "  prechamber mix {", f"    {norm}", f"    {turbines[kind]}", "  }", "}", ""]
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *_header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: each one RMSNorm ({src['eps']}), then one",
        "# mixer (a Mamba-2 ssm, attention, an MLP or routed experts), added back",
        *templates,
        *_engine_lines(a, src, f"{feed}{_comment(src, 'vocab', 'padding')}", _jamba_body(a), norm)])


def single_mixer_config(engine: ir.Engine, layers: list, base: dict) -> dict:
    """The nemotron_h config of an engine whose every layer is one branch: a Mamba-2 ssm, attention or an MLP."""
    turbines = [ly[0][1] for ly in layers]
    s = next(t for t in turbines if isinstance(t, ir.Ssm))
    at = next((t for t in turbines if isinstance(t, ir.Attention)), None)
    mlp = next((t for t in turbines if isinstance(t, ir.Mlp)), None)
    moe = next((t for t in turbines if isinstance(t, ir.Moe)), None)
    kinds = {ir.Ssm: "linear_attention", ir.Attention: "full_attention", ir.Mlp: "mlp", ir.Moe: "moe"}
    if any(type(t) not in kinds for t in turbines):
        raise Unsupported("stages", "a Nemotron-H layer is one Mamba-2 ssm, attention, MLP or routed-experts branch")
    acts = {v: k for k, v in _PLAIN_ACTS.items() if k not in ("swish", "gelu_new")}
    experts = {} if moe is None else {
        "n_routed_experts": moe.experts, "num_experts_per_tok": moe.top, "moe_intermediate_size": moe.hidden,
        "moe_shared_expert_intermediate_size": moe.shared or 1, "norm_topk_prob": moe.normalize, "routed_scaling_factor": moe.scale,
        "n_group": moe.groups, "topk_group": moe.top_groups, "moe_latent_size": None}
    if moe is not None and mlp is None:
        mlp = ir.Mlp(width=moe.width, hidden=1, act=moe.act, bias=False, dropout=0.0)  # the act the experts share
    return {"model_type": "nemotron_h", "architectures": [CAUSAL_LM["nemotron_h"]], **{k: v for k, v in base.items() if k != "num_hidden_layers"},
            "max_position_embeddings": engine.feed.context, "layers_block_type": [kinds[type(t)] for t in turbines],
            "layer_norm_epsilon": engine.body[-1].eps, "num_attention_heads": at.heads if at else 1,
            "num_key_value_heads": at.kv_heads if at else 1, "head_dim": at.head_dim if at else 1,
            "intermediate_size": mlp.hidden if mlp else 1, "mlp_hidden_act": acts.get(mlp.act, mlp.act) if mlp else "relu2",
            "mlp_bias": mlp.bias if mlp else False, "mamba_num_heads": s.heads, "mamba_head_dim": s.head_dim, "ssm_state_size": s.state,
            "n_groups": s.groups, "conv_kernel": s.conv, "chunk_size": s.chunk, "use_bias": s.bias, "use_conv_bias": s.conv_bias,
            "time_step_min": s.dt_lo, "mamba_hidden_act": "silu", "num_nextn_predict_layers": 0, **experts}


def _num(x) -> str:
    from .core import _num as num

    return num(x)


def _comment(src: dict, *keys: str) -> str:
    from .core import _comment as comment

    return comment(src, *keys)


def spec_text(a: ParallelHybrid, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    rot = " rotary" + (f" rotary_base={_num(a.rotary_base)}" if a.rotary_base != 10000.0 else "")
    rot += f" scale={_num(a.attn_scale)}" if a.attn_scale is not None else ""

    def merge(value: float, key: str, pad: str) -> list[str]:
        return [f"{pad}merge scale={_num(value)}{_comment(src, key)}"] if value != 1.0 else []

    gate = f" gate_scale={_num(a.gate_scale)}" if a.gate_scale != 1.0 else ""
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    feed += f" scale={_num(a.embed_scale)}" if a.embed_scale != 1.0 else ""
    head = "nozzle head" + (" tied" if a.tied else "") + (f" scale={_num(a.logit_scale)}" if a.logit_scale != 1.0 else "")
    return "\n".join([
        *_header(a.family, source),
        f"let depth = {a.layers}  # {src['layers']}",
        f"let d_model = {a.width}  # {src['width']}",
        "",
        "# one layer: a Mamba-2 ssm and attention read one RMSNorm and are summed into the stream, each",
        f"# scaled; then a gated MLP with its own RMSNorm ({src['eps']})",
        f"stage {a.family}_block {{",
        "  fullflow {",
        f"    {norm}  # input_layernorm, read by both branches",
        "    prechamber ssm {",
        f"      turbine ssm {a.ssm}  # {src['ssm']}",
        *merge(a.ssm_merge, "ssm_merge", "      "),
        "    }",
        "    prechamber mix {",
        f"      turbine attention heads={a.heads}{kv}{rot} bias={_num(a.attn_bias)}{_comment(src, 'attn', 'attn_scale')}",
        *merge(a.attn_merge, "attn_merge", "      "),
        "    }",
        "  }",
        "  prechamber burn {",
        f"    {norm}  # pre_ff_layernorm",
        f"    turbine mlp hidden={a.hidden} act=swiglu bias={_num(a.mlp_bias)}{gate}{_comment(src, 'hidden')}",
        *merge(a.mlp_merge, "mlp_merge", "    "),
        "  }",
        "}",
        "",
        f"engine {a.family} {{",
        "  chamber width=d_model",
        "  throat causal",
        f"  {feed}{_comment(src, 'vocab', 'padding', 'embed_scale')}",
        "",
        f"  stage {a.family}_block x depth",
        "",
        f"  {norm}  # the final norm",
        f"  {head}{_comment(src, 'tied', 'logit_scale')}",
        "}",
        ""])


# --- export: the config an engine of these families implies ---------------------------------


def is_parallel_hybrid(engine: ir.Engine) -> bool:
    """Whether a stage holds a fullflow with a Mamba-2 ssm among its branches (Falcon-H1's block)."""
    return any(isinstance(op, ir.Fullflow) and any(isinstance(o, ir.Ssm) for b in op.branches for o in b.ops)
               for st, _ in ir.nodes.leaf_stages(engine.body) for op in st.ops)


def _merge(b: ir.Prechamber) -> float:
    if isinstance(b.merge, ir.ScaleMerge):
        return b.merge.value
    if isinstance(b.merge, ir.PlainMerge):
        return 1.0
    raise Unsupported(f"prechamber {b.name}", "Falcon-H1's branches add to the stream plainly or scaled (merge scale=)")


def engine_config(engine: ir.Engine) -> dict:
    """The falcon_h1 config of an engine of Falcon-H1's blocks; only the shape is read here (export then checks,
    field by field, that importing the config gives back the engine)."""
    stages = ir.nodes.leaf_stages(engine.body)
    st = stages[0][0]
    if len(st.ops) != 2 or not isinstance(st.ops[0], ir.Fullflow) or not isinstance(st.ops[1], ir.Prechamber):
        raise Unsupported(f"stage {st.name}", "a Falcon-H1 layer is a fullflow of a Mamba-2 ssm and attention, then an MLP branch")
    ff, burn = st.ops
    turbines = {type(o): (o, b) for b in ff.branches for o in b.ops if not isinstance(o, ir.Norm)}
    if set(turbines) != {ir.Ssm, ir.Attention} or len(ff.branches) != 2:
        raise Unsupported(f"stage {st.name}", "a Falcon-H1 fullflow holds one Mamba-2 ssm branch and one attention branch")
    (s, sb), (at, ab) = turbines[ir.Ssm], turbines[ir.Attention]
    mlp = next((o for o in burn.ops if isinstance(o, ir.Mlp)), None)
    if mlp is None:
        raise Unsupported(f"prechamber {burn.name}", "a Falcon-H1 layer's second branch is a gated MLP")
    key = 1.0 if at.scale is None else at.scale * math.sqrt(at.head_dim)
    final = engine.body[-1]
    return {"model_type": "falcon_h1", "architectures": [CAUSAL_LM["falcon_h1"]], "vocab_size": engine.feed.vocab,
            "hidden_size": engine.width, "num_hidden_layers": sum(n for _, n in stages), "tie_word_embeddings": engine.nozzle.tied,
            "pad_token_id": engine.feed.padding, "max_position_embeddings": engine.feed.context, "hidden_act": "silu",
            "rms_norm_eps": final.eps if isinstance(final, ir.Norm) else 1e-5, "intermediate_size": mlp.hidden, "mlp_bias": mlp.bias,
            "num_attention_heads": at.heads, "num_key_value_heads": at.kv_heads, "attention_bias": at.bias,
            "rope_parameters": {"rope_type": "default", "rope_theta": at.rotary_base},
            "mamba_d_ssm": s.inner, "mamba_n_heads": s.heads, "mamba_d_head": s.head_dim, "mamba_n_groups": s.groups,
            "mamba_d_state": s.state, "mamba_d_conv": s.conv, "mamba_chunk_size": s.chunk, "mamba_conv_bias": s.conv_bias,
            "mamba_proj_bias": s.bias, "projectors_bias": s.bias, "mamba_rms_norm": s.out_norm != "none",
            "mamba_norm_before_gate": s.out_norm != "gated",
            "time_step_limit": [s.dt_lo, s.dt_hi if s.dt_hi is not None else float("inf")],
            "embedding_multiplier": engine.feed.scale, "lm_head_multiplier": engine.nozzle.scale,
            "attention_in_multiplier": 1.0, "key_multiplier": key, "attention_out_multiplier": _merge(ab),
            "ssm_in_multiplier": 1.0, "ssm_multipliers": list(s.scales), "ssm_out_multiplier": _merge(sb),
            "mlp_multipliers": [mlp.gate_scale, _merge(burn)]}


def _plan_falcon_h1(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Falcon-H1: layer i is stage i: one norm before both the Mamba-2 mixer (`mamba.`, transformers' names) and attention
    (q, k, v, o), then a gated MLP (`feed_forward.`) with its own valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        if st.attn is None or st.ssm is None or st.mlp is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks its ssm, attention or mlp; transformers' falcon_h1 layer {i} has all three"
            continue
        put(f"{st.valves.get(st.ssm, _parent(st.ssm) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.mlp, _parent(st.mlp) + 'norm')}.weight", h + "pre_ff_layernorm.weight")
        _put_hybrid_mixer(put, replace(st, attn=None), h)  # the Mamba-2 mixer ...
        _put_hybrid_mixer(put, st, h)  # ... and attention
        _put_gated(put, st.mlp, h + "feed_forward.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "final_layernorm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_nemotron_h(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Nemotron-H: layer i is stage i: its valve (`norm`) and one mixer (`mixer.`): a Mamba-2 mixer, attention or an ungated MLP."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        turbine = st.ssm or st.attn or st.mlp or st.moe
        if turbine is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no ssm, attention, mlp or moe; transformers' nemotron_h layer {i} has one"
            continue
        put(f"{st.valves.get(turbine, _parent(turbine) + 'norm')}.weight", h + "norm.weight")
        if st.ssm is not None:
            for name in MAMBA2_MIXER:
                put(f"{st.ssm}.{name}", h + "mixer." + name)
            put(f"{st.ssm}.norm", h + "mixer.norm.weight")
        elif st.attn is not None:
            a = st.attn_node
            put(f"{st.attn}.qkv.weight", [h + f"mixer.{n}_proj.weight" for n in "qkv"],
                _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
            put(f"{st.attn}.proj.weight", h + "mixer.o_proj.weight")
        elif st.moe is not None:  # a sigmoid router with its correction buffer, fused ungated experts, one shared expert
            n = st.work_node.experts
            put(f"{st.moe}.router.weight", h + "mixer.gate.weight")
            put(f"{st.moe}.correction", h + "mixer.gate.e_score_correction_bias")
            mem = (h + "mixer.experts.up_proj" in state) if fused is None else fused  # the model's 3-D tensors, or one expert a key as saved
            for x in range(n):
                for ours, theirs in (("fc", "up_proj"), ("proj", "down_proj")):
                    if mem:
                        put(f"{st.moe}.experts.{x}.{ours}.weight", h + f"mixer.experts.{theirs}", _Index(x, n))
                    else:
                        put(f"{st.moe}.experts.{x}.{ours}.weight", h + f"mixer.experts.{x}.{theirs}.weight")
            put(f"{st.moe}.shared.fc.weight", h + "mixer.shared_experts.up_proj.weight")
            put(f"{st.moe}.shared.proj.weight", h + "mixer.shared_experts.down_proj.weight")
        else:
            for p in ("weight", "bias"):
                put(f"{st.mlp}.fc.{p}", h + f"mixer.up_proj.{p}")
                put(f"{st.mlp}.proj.{p}", h + f"mixer.down_proj.{p}")
    put("feed.tok.weight", "embeddings.weight")
    put(f"{final}.weight", "norm_f.weight")
    put("head.weight", "lm_head.weight")
    return plan
