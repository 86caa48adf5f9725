"""Latent attention: DeepSeek-V2 and V3 (and SarvamMLA, GLM-4.7-Flash, A.X-K1 under other model_types), MiniCPM3 and
Youtu's dense decoders: their records, readers, spec text, config parts and weight plans."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from ... import ir
from ..closed import Config, Keys, Unsupported
from ..mapping import _SAME, _Plan, _parent, _put_experts, _put_gated
from .core import (CAUSAL_LM, KEYS, _GATED_ACTS, _HF_GATED, _TP, _comment, _divides, _engine_lines, _eps, _header, _num, _padding, _partial, _rope,
                   _rope_kind, _whole)


@dataclass(frozen=True)
class DeepseekV2Family:
    """A DeepSeek-V2 checkpoint (DeepseekV2ForCausalLM): latent attention in every layer; a dense
    swiglu MLP in the first `dense` layers (first_k_dense_replace), then DeepSeekMoE: routed experts
    (raw softmax weights) beside a shared expert every token visits."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    dense: int
    heads: int
    head_dim: int
    rotary_dims: int
    v_dim: int
    latent: int
    q_latent: int | None
    rotary_base: float
    hidden: int
    moe_hidden: int
    experts: int
    top: int
    shared: int
    eps: float
    bias: bool
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)
    routing: tuple = ()  # the moe's router options beyond Mixtral's, as (option, value) (DeepSeek-V3's router; V2's groups and scale)
    post_moe_norm: bool = False  # an RMSNorm on the MoE block's output, before the residual (A.X-K1's post_mlp_layernorm)


def _deepseek_v2_text(a: DeepseekV2Family, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    q = f" q_latent={a.q_latent}" if a.q_latent is not None else ""
    base = f" rotary_base={_num(a.rotary_base)}" if a.rotary_base != 10000.0 else ""
    attn = (f"turbine attention heads={a.heads} latent={a.latent}{q} head_dim={a.head_dim} rotary_dims={a.rotary_dims} v_dim={a.v_dim}"
            f"{base} bias={_num(a.bias)}{_comment(src, 'attn', 'rotary_base' if base else '')}")
    mix = ["  prechamber mix {", f"    {norm}{_comment(src, 'eps')}", f"    {attn}", "  }"]
    stages = []
    if a.dense:
        stages += [f"# the first {a.dense} layers ({src['dense']}): latent attention, then a dense swiglu MLP", "stage dense_block {", *mix,
                   "  prechamber burn {", f"    {norm}", f"    turbine mlp hidden={a.hidden} act=swiglu bias=false{_comment(src, 'hidden')}",
                   "  }", "}", ""]
    if a.layers > a.dense:
        routing = dict(a.routing)
        normalize = "" if routing.pop("normalize", False) else " normalize=false"
        route = "".join(f" {k}={_num(v) if not isinstance(v, str) else v}" for k, v in routing.items())
        words = ("routed experts (DeepSeek-V3's router: sigmoid scores, a selection-only correction bias, group-limited top-k)"
                 if routing.get("router") == "sigmoid" else "routed experts (their raw softmax weights)")
        stages += [f"# then DeepSeekMoE: {words} beside a shared expert every token visits",
                   "stage moe_block {", *mix, "  prechamber burn {", f"    {norm}",
                   f"    turbine moe experts={a.experts} top={a.top} hidden={a.moe_hidden} act=swiglu bias=false{normalize}{route} "
                   f"shared={a.shared}{_comment(src, 'moe', 'routing' if route else '')}",
                   *([f"    {norm}  # post_mlp_layernorm: on the MoE block's output"] if a.post_moe_norm else []), "  }", "}", ""]
    body = ([f"  stage dense_block x {a.dense}"] if a.dense else []) + ([f"  stage moe_block x {a.layers - a.dense}"] if a.layers > a.dense else [])
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *_header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}; {a.layers} layers ({src['layers']})",
        "",
        *stages,
        *_engine_lines(a, src, f"{feed}{_comment(src, 'vocab', 'padding')}", body, norm)])


KEYS["deepseek_v2"] = Keys(frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                      "attention_bias", "mlp_bias", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "n_routed_experts",
                                      "n_shared_experts", "qk_nope_head_dim", "qk_rope_head_dim", "routed_scaling_factor", "topk_method",
                                      "norm_topk_prob", "v_head_dim", "moe_intermediate_size", "rope_parameters", "num_experts_per_tok",
                                      "pad_token_id", "head_dim", "qk_head_dim", "n_group", "topk_group", "moe_layer_freq"}), _TP)


def _deepseek_v2(c: Config) -> DeepseekV2Family:
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"DeepSeek-V2's MLPs are silu-gated (swiglu); {c['hidden_act']!r} is not mapped")
    if c["mlp_bias"]:
        raise Unsupported("mlp_bias", "transformers' DeepseekV2 biases the dense and shared MLPs but never the routed experts; "
                          "the language's moe bias= covers all of them")
    if c["topk_method"] not in ("greedy", "group_limited_greedy"):
        raise Unsupported("topk_method", f"{c['topk_method']!r} is not one of transformers' DeepseekV2 routers (greedy, group_limited_greedy)")
    if c["norm_topk_prob"]:
        raise Unsupported("norm_topk_prob", "transformers' DeepseekV2 router never renormalises the top-k weights, whatever this says: "
                          "which one the checkpoint was trained with is not known")
    if c.given("moe_layer_freq") and c["moe_layer_freq"] != 1:
        raise Unsupported("moe_layer_freq", "transformers' DeepseekV2 puts experts in every layer from first_k_dense_replace on: "
                          "a checkpoint with experts in every other layer does not load there either")
    for k in ("n_group", "topk_group"):  # read by the group-limited router only
        if c[k] is not None and not (isinstance(c[k], int) and c[k] >= 1):
            raise Unsupported(k, f"{c[k]!r} is not a number of groups")
    routing = _scaled(c)
    if c["topk_method"] == "group_limited_greedy" and _any_routed(c):  # a group scored by its best probability; the others' masked to 0 (-inf here: the same
        routing += _groups(c, "max")  # choice, as a probability of a kept expert is never below 0)
    return _deepseek("deepseek_v2", c, routing)


def _any_routed(c: Config) -> bool:
    """Whether any layer routes (transformers builds no router in the first first_k_dense_replace layers)."""
    return c["num_hidden_layers"] > (c["first_k_dense_replace"] or 0)


def _scaled(c: Config) -> tuple:
    scale = c["routed_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1e3:
        raise Unsupported("routed_scaling_factor", f"{scale!r}: the routed weights' factor is a number in (0, 1000]")
    return (("scale", float(scale)),) if scale != 1.0 else ()


def _groups(c: Config, score: str) -> tuple:
    """(option, value) of group-limited top-k, n_group groups of which topk_group are kept; refused where transformers would
    fail or pick a masked expert (more experts asked than the kept groups hold)."""
    experts, groups, kept, top = c["n_routed_experts"], c["n_group"], c["topk_group"], c["num_experts_per_tok"]
    for k, v in (("n_group", groups), ("topk_group", kept)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise Unsupported(k, f"{v!r} is not a number of groups (the group-limited router reads it)")
    if experts % groups:
        raise Unsupported("n_group", f"{experts} experts do not split into {groups} equal groups")
    if kept > groups:
        raise Unsupported("topk_group", f"{kept} groups kept of {groups}")
    if score == "top2" and groups > 1 and experts // groups < 2:
        raise Unsupported("n_group", f"a group is scored by its two best experts, and {groups} groups of {experts} hold one each")
    if isinstance(top, int) and top > kept * (experts // groups):
        raise Unsupported("num_experts_per_tok", f"top-{top} from {kept} groups of {experts // groups} experts: transformers would pick "
                          "experts of the masked groups")
    if groups == 1:
        return ()
    return (("groups", groups), ("top_groups", kept), ("group_score", score))


def _deepseek(family: str, c: Config, routing: tuple, dense: int | None = None) -> DeepseekV2Family:
    """What DeepSeek-V2 and V3 share: latent attention, dense layers first, DeepSeekMoE."""
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling of latent attention's rotary key is not mapped (turbine attention "
                          "latent= takes no rotary_scaling yet)")
    shared = c["n_shared_experts"] or 0
    if shared < 1:
        raise Unsupported("n_shared_experts", "transformers' DeepSeekMoE always has its shared expert (0 gives it no width)")
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"]
    kv = heads if kv is None else kv
    if kv != heads:
        raise Unsupported("num_key_value_heads", f"latent attention expands every head's key and value from the latent; {kv} key/value "
                          f"heads for {heads} query heads would make transformers' DeepseekV2 repeat them past the heads it has")
    nope, rope_dims = c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    if c.given("qk_head_dim") and c["qk_head_dim"] != nope + rope_dims:  # derived in __post_init__, then the file's overrides it
        raise Unsupported("qk_head_dim", f"{c['qk_head_dim']}, not qk_nope_head_dim + qk_rope_head_dim = {nope + rope_dims}")
    if c.given("head_dim") and c["head_dim"] not in (None, rope_dims):  # __post_init__ sets it to qk_rope_head_dim
        raise Unsupported("head_dim", f"{c['head_dim']}, not qk_rope_head_dim = {rope_dims} (DeepseekV2's rotary reads head_dim)")
    dense = min(c["first_k_dense_replace"] or 0, layers) if dense is None else dense
    moe_hidden = c["moe_intermediate_size"]
    experts = c["n_routed_experts"]
    top = c["num_experts_per_tok"] if layers > dense else 1
    if layers > dense and (top is None or not 1 <= top <= experts):
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "dense": "first_k_dense_replace",
           "attn": "num_attention_heads, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
           "hidden": "intermediate_size", "moe": "n_routed_experts, num_experts_per_tok, moe_intermediate_size x n_shared_experts",
           "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "rotary_base": "rope_theta", "padding": "pad_token_id"}
    q = c["q_lora_rank"]  # null: a full-rank query projection
    if routing:
        src["routing"] = "routed_scaling_factor" + (", n_group, topk_group" if any(k == "groups" for k, _ in routing) else "")
    if family in _V3_LATENT:
        src["routing"] = "norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias: loaded"
    return DeepseekV2Family(family, c["vocab_size"], c["max_position_embeddings"], width, layers, dense, heads,
                            nope, rope_dims, c["v_head_dim"], c["kv_lora_rank"], q, _rope(c), c["intermediate_size"], moe_hidden,
                            experts, top, moe_hidden * shared, _eps(c, "rms_norm_eps"), bool(c["attention_bias"]),
                            bool(c["tie_word_embeddings"]), _padding(c), src, routing)


KEYS["deepseek_v3"] = Keys(frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                      "attention_bias", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "n_routed_experts",
                                      "n_shared_experts", "qk_nope_head_dim", "qk_rope_head_dim", "routed_scaling_factor", "norm_topk_prob",
                                      "v_head_dim", "moe_intermediate_size", "rope_parameters", "num_experts_per_tok", "pad_token_id",
                                      "head_dim", "qk_head_dim", "n_group", "topk_group", "rope_interleave", "num_mtp_layers"}),
                           {**_TP, "output_router_logits": "what forward returns besides the logits: transformers' DeepseekV3 adds no "
                                   "auxiliary loss from them"})


def _deepseek_v3(c: Config) -> DeepseekV2Family:
    """DeepSeek-V3 (and Kimi K2, which writes model_type deepseek_v3): V2's layers with DeepSeek-V3's router: sigmoid
    scores, a selection-only correction bias (loaded from mlp.gate.e_score_correction_bias; transformers holds it fixed),
    group-limited top-k (a group scored by the sum of its two best), the chosen weights renormalised and scaled."""
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"DeepSeek-V3's MLPs are silu-gated (swiglu); {c['hidden_act']!r} is not mapped")
    if not c["rope_interleave"]:
        raise Unsupported("rope_interleave", "rotary on the two halves of the rotary dims (rope_interleave=false) is not what latent "
                          "attention computes here (adjacent pairs, as DeepSeek's weights are laid out)")
    mtp = c["num_mtp_layers"]
    if isinstance(mtp, bool) or not isinstance(mtp, int) or mtp < 0:
        raise Unsupported("num_nextn_predict_layers", f"{mtp!r} is not a number of multi-token-prediction layers")
    groups = _groups(c, "top2") if _any_routed(c) else ()
    routing = (("normalize", bool(c["norm_topk_prob"])), ("router", "sigmoid"), *_scaled(c), *groups, ("correction", True))
    return _deepseek("deepseek_v3", c, routing)


# --- SarvamMLA and GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's layers under another model_type -----
# transformers builds sarvam_mla as DeepseekV3ForCausalLM (its config DeepseekV3Config's with other defaults and
# aliases); Glm4MoeLite is DeepseekV3's latent attention and router with GLM-4.5's MoE block (the same function:
# sigmoid scores, selection-only correction bias, groups scored by their two best, renormalised and scaled), its
# dense layers said by mlp_layer_types instead of first_k_dense_replace, and no MTP key.

_V3_LATENT = ("deepseek_v3", "sarvam_mla", "glm4_moe_lite", "axk1")
KEYS["sarvam_mla"] = Keys(KEYS["deepseek_v3"].maps, KEYS["deepseek_v3"].inert)


def _sarvam_mla(c: Config) -> DeepseekV2Family:
    """Sarvam's 105B (sarvam_mla): DeepSeek-V3's model (DeepseekV3ForCausalLM), read as deepseek_v3 is."""
    a = _deepseek_v3(c)
    return replace(a, family="sarvam_mla")


KEYS["glm4_moe_lite"] = Keys(KEYS["deepseek_v3"].maps - {"first_k_dense_replace", "num_mtp_layers"} | {"mlp_layer_types"},
                             {**_TP, "output_router_logits": "what forward returns besides the logits: transformers' Glm4MoeLite adds no "
                                     "auxiliary loss from them",
                              "num_nextn_predict_layers": "not a field of the class (the released config.json writes it): kept as an "
                                                          "attribute that nothing reads, no MTP module is built; MTP weights in the file are "
                                                          "refused by name on load"})


def _glm4_moe_lite(c: Config, family: str = "glm4_moe_lite") -> DeepseekV2Family:
    """GLM-4.7-Flash (glm4_moe_lite): latent attention (DeepseekV3Attention), DeepSeek-V3's router, mlp_layer_types
    "dense" for the first layers then "sparse"; any other pattern, and a partial rotary factor, refused by name."""
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"GLM-4.7-Flash's MLPs are silu-gated (swiglu); {c['hidden_act']!r} is not mapped")
    if not c["rope_interleave"]:
        raise Unsupported("rope_interleave", "rotary on the two halves of the rotary dims (rope_interleave=false) is not what latent "
                          "attention computes here (adjacent pairs, as the weights are laid out)")
    if _partial(c) != 1.0:
        raise Unsupported("rope_parameters.partial_rotary_factor", "Glm4MoeLite's rotary then turns only part of qk_rope_head_dim; "
                          "latent attention's rotary_dims rotate whole")
    layers = c["num_hidden_layers"]
    kinds = c["mlp_layer_types"]
    kinds = ["dense"] + ["sparse"] * (layers - 1) if kinds is None else kinds  # __post_init__'s default
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("dense", "sparse") for k in kinds):
        raise Unsupported("mlp_layer_types", f"{kinds!r} is not 'dense' or 'sparse' for each of the {layers} layers")
    dense = kinds.count("dense")
    if kinds != ["dense"] * dense + ["sparse"] * (layers - dense):
        raise Unsupported("mlp_layer_types", "dense layers after sparse ones: the language's DeepSeek layers are dense first, then routed")
    groups = _groups(c, "top2") if layers > dense else ()
    routing = (("normalize", bool(c["norm_topk_prob"])), ("router", "sigmoid"), *_scaled(c), *groups, ("correction", True))
    a = _deepseek(family, c, routing, dense)
    a.sources["dense"] = "mlp_layer_types"
    return a


# A.X-K1 (axk1, AXK1ForCausalLM): DeepSeek-V3 with glm4_moe_lite's mlp_layer_types and one more RMSNorm, post_mlp_layernorm, on
# each MoE block's output (routed experts plus the shared expert) before the residual; dense layers have none. Its attention
# always has a query latent (q_lora_rank null cannot build).
KEYS["axk1"] = Keys(KEYS["glm4_moe_lite"].maps, {**_TP, "output_router_logits": "what forward returns besides the logits: transformers' "
                                                 "AXK1 adds no auxiliary loss from them",
                                                 "num_nextn_predict_layers": KEYS["glm4_moe_lite"].inert["num_nextn_predict_layers"]})


def _axk1(c: Config) -> DeepseekV2Family:
    """A.X-K1: glm4_moe_lite's reading (DeepSeek-V3's layers, mlp_layer_types), and an RMSNorm after each MoE block."""
    if c["q_lora_rank"] is None:
        raise Unsupported("q_lora_rank", "A.X-K1's attention always projects queries through a latent; null cannot build there")
    return replace(_glm4_moe_lite(c, "axk1"), post_moe_norm=True)


# --- MiniCPM3 and Youtu: latent attention with a dense MLP in every layer --------------------------


@dataclass(frozen=True)
class LatentDenseFamily:
    """A MiniCPM3 or Youtu checkpoint: latent attention (DeepSeek-V2's MLA) then a dense gated MLP in every
    layer. MiniCPM3 multiplies the embedding by scale_emb, each branch by scale_depth / sqrt(layers) and
    divides the final hidden state by hidden_size / dim_model_base; Youtu scales nothing."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    head_dim: int
    rotary_dims: int
    v_dim: int
    latent: int
    q_latent: int | None
    rotary_base: float
    hidden: int
    act: str
    eps: float
    bias: bool
    mlp_bias: bool
    tied: bool
    padding: int | None
    embed_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    sources: dict = field(default_factory=dict, compare=False)


def _latent_dense_text(a: LatentDenseFamily, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    q = f" q_latent={a.q_latent}" if a.q_latent is not None else ""
    base = f" rotary_base={_num(a.rotary_base)}" if a.rotary_base != 10000.0 else ""
    attn = (f"turbine attention heads={a.heads} latent={a.latent}{q} head_dim={a.head_dim} rotary_dims={a.rotary_dims} v_dim={a.v_dim}"
            f"{base} bias={_num(a.bias)}{_comment(src, 'attn', 'rotary_base' if base else '')}")
    merge = [f"    merge scale={_num(a.residual_scale)}{_comment(src, 'residual_scale')}"] if a.residual_scale != 1.0 else []
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none"
    feed += f" scale={_num(a.embed_scale)}" if a.embed_scale != 1.0 else ""
    feed += f" padding={a.padding}" if a.padding is not None else ""
    nozzle = "nozzle head" + (" tied" if a.tied else "") + (f" scale={_num(a.logit_scale)}" if a.logit_scale != 1.0 else "")
    block = f"{a.family}_block"
    return "\n".join([
        *_header(a.family, source),
        f"let depth = {a.layers}  # {src['layers']}",
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# one {a.family} layer: latent attention, then a gated MLP, each with its RMSNorm in front (the layers repeat it)",
        f"stage {block} {{",
        "  prechamber mix {", f"    {norm}{_comment(src, 'eps')}", f"    {attn}", *merge, "  }",
        "  prechamber burn {", f"    {norm}", f"    turbine mlp hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}{_comment(src, 'hidden')}",
        *merge, "  }",
        "}",
        "",
        f"engine {a.family} {{", "  chamber width=d_model", "  throat causal",
        f"  {feed}{_comment(src, 'vocab', 'embed_scale', 'padding')}", "",
        f"  stage {block} x depth", "",
        f"  {norm}  # the final norm", f"  {nozzle}{_comment(src, 'tied', 'logit_scale')}", "}", ""])


_LATENT_KEYS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "attention_bias", "kv_lora_rank",
                          "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_parameters", "pad_token_id",
                          "qk_head_dim"})
KEYS["minicpm3"] = Keys(_LATENT_KEYS | {"mlp_bias", "scale_emb", "scale_depth", "dim_model_base"},
                        {**_TP, "head_dim": "MiniCPM3Config.__post_init__ sets it to qk_rope_head_dim whatever the file says"})
KEYS["youtu"] = Keys(_LATENT_KEYS | {"rope_interleave", "head_dim"},
                     {"embedding_initializer_range": "the spread of freshly initialised embeddings; an import loads every weight"})


def _latent_dense(family: str):
    def read(c: Config) -> LatentDenseFamily:
        act = _GATED_ACTS.get(c["hidden_act"])
        if act is None:
            raise Unsupported("hidden_act", f"a gated MLP with {c['hidden_act']!r} has no counterpart (swiglu = silu, geglu = gelu)")
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = c["num_key_value_heads"]
        if kv is not None and kv != heads:
            raise Unsupported("num_key_value_heads", f"latent attention expands every head's key and value from the latent; {kv} key/value "
                              f"heads for {heads} query heads would make transformers repeat them past the heads it has")
        if _rope_kind(c)[2] != "default":
            raise Unsupported("rope_parameters.rope_type", "rotary scaling of latent attention's rotary key is not mapped (turbine attention "
                              "latent= takes no rotary_scaling yet)")
        v_dim = c["v_head_dim"]
        if v_dim is None:
            if family == "youtu":
                raise Unsupported("v_head_dim", "null is not a value width transformers' Youtu can build")
            _divides(width, heads, "num_attention_heads", "hidden_size")
            v_dim = width // heads  # MiniCPM3Config.__post_init__
        rope_dims, nope = c["qk_rope_head_dim"], c["qk_nope_head_dim"]
        if c.given("qk_head_dim") and c["qk_head_dim"] != nope + rope_dims:  # derived in __post_init__, then the file's overrides it
            raise Unsupported("qk_head_dim", f"{c['qk_head_dim']}, not qk_nope_head_dim + qk_rope_head_dim = {nope + rope_dims}")
        if family == "youtu" and c.given("head_dim") and c["head_dim"] not in (None, rope_dims):  # __post_init__ sets it, the file's overrides
            raise Unsupported("head_dim", f"{c['head_dim']}, not qk_rope_head_dim = {rope_dims} (the rotary reads head_dim)")
        if rope_dims % 2:
            raise Unsupported("qk_rope_head_dim", f"{rope_dims}: the rotary key's dims are rotated in pairs, an even number")
        extra: dict = {}
        src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers",
               "attn": "num_attention_heads, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
               "hidden": "intermediate_size, hidden_act", "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "rotary_base": "rope_theta",
               "padding": "pad_token_id"}
        if family == "minicpm3":
            emb, depth, base = c["scale_emb"], c["scale_depth"], c["dim_model_base"]
            depth = math.sqrt(layers) if depth is None else depth  # MiniCPM3Config.__post_init__: null is no scaling
            base = width if base is None else base
            for k, v in (("scale_emb", emb), ("scale_depth", depth), ("dim_model_base", base)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v == 0:
                    raise Unsupported(k, f"{v!r}: MiniCPM3's scales are finite non-zero numbers")
            extra = dict(embed_scale=float(emb), residual_scale=float(depth) / math.sqrt(layers), logit_scale=float(base) / width)
            src.update(embed_scale="scale_emb", residual_scale="scale_depth / sqrt(num_hidden_layers)",
                       logit_scale="1 / (hidden_size / dim_model_base)")
        return LatentDenseFamily(family, c["vocab_size"], c["max_position_embeddings"], width, layers, heads, c["qk_nope_head_dim"],
                                 rope_dims, v_dim, c["kv_lora_rank"], c["q_lora_rank"], _rope(c), c["intermediate_size"], act,
                                 _eps(c, "rms_norm_eps"), bool(c["attention_bias"]), bool(c["mlp_bias"]) if family == "minicpm3" else False,
                                 bool(c["tie_word_embeddings"]), _padding(c), **extra, sources=src)
    return read


def _latent_dense_config(engine: ir.Engine, layers: list, base: dict) -> dict | None:
    """The minicpm3 or youtu config of an engine whose every layer is latent attention then a gated MLP, when it
    scales its feed, branches or logits (MiniCPM3) or is named after one of them; None otherwise (deepseek_v2's)."""
    if not all(len(ly) == 2 and isinstance(ly[0][1], ir.LatentAttention) and isinstance(ly[1][1], ir.Mlp) for ly in layers):
        return None
    merges = {b.merge.value if isinstance(b.merge, ir.ScaleMerge) else 1.0
              for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list()}
    scaled = engine.feed.scale != 1.0 or engine.nozzle.scale != 1.0 or merges != {1.0}
    family = engine.name if engine.name in ("minicpm3", "youtu") else "minicpm3" if scaled else None
    if family is None:
        return None
    a, m = layers[0][0][1], layers[0][1][1]
    act = _HF_GATED.get(m.act)
    if act is None:
        raise Unsupported("act", f"{family}'s gated MLP has no '{m.act}' form")
    cfg = {"model_type": family, "architectures": [CAUSAL_LM[family]], **base, "hidden_act": act, "rms_norm_eps": engine.body[-1].eps,
           "max_position_embeddings": engine.feed.context, "num_attention_heads": a.heads, "num_key_value_heads": a.heads,
           "q_lora_rank": a.q_latent, "kv_lora_rank": a.latent, "qk_nope_head_dim": a.head_dim, "qk_rope_head_dim": a.rotary_dims,
           "v_head_dim": a.v_dim, "attention_bias": a.bias, "intermediate_size": m.hidden,
           "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}}
    if family == "youtu":
        return {**cfg, "rope_interleave": True}
    scale = next(iter(merges)) if len(merges) == 1 else 1.0
    base_dim = _whole(engine.nozzle.scale * engine.width)
    if not isinstance(base_dim, int):
        raise Unsupported("nozzle scale", f"MiniCPM3 divides the logits by hidden_size / dim_model_base, a whole number: "
                          f"{engine.nozzle.scale} x {engine.width} is not one")
    return {**cfg, "mlp_bias": m.bias, "scale_emb": engine.feed.scale, "scale_depth": scale * math.sqrt(len(layers)),
            "dim_model_base": base_dim}


def _v3_named(name: str, config: dict) -> dict:
    """A DeepSeek-V3-shaped config as the family the engine is named after (`cyclec import` names it so): sarvam_mla
    (DeepSeek-V3's model under its own model_type) or glm4_moe_lite (its dense layers said by mlp_layer_types)."""
    if name == "sarvam_mla":
        return {**config, "model_type": "sarvam_mla", "architectures": [CAUSAL_LM["sarvam_mla"]]}
    if name in ("glm4_moe_lite", "axk1"):
        out = {k: v for k, v in config.items() if k not in ("first_k_dense_replace", "num_nextn_predict_layers")}
        dense = config["first_k_dense_replace"]
        return {**out, "model_type": name, "architectures": [CAUSAL_LM[name]],
                "mlp_layer_types": ["dense"] * dense + ["sparse"] * (config["num_hidden_layers"] - dense)}
    return config


def _shared_experts(m: ir.Moe) -> int:
    """DeepSeekMoE's shared expert is n_shared_experts x moe_intermediate_size wide."""
    if not m.shared or m.shared % m.hidden or m.shared_gate:
        raise Unsupported("shared", f"DeepSeek-V2's shared expert is an ungated whole multiple of the experts' width {m.hidden}, not "
                          + ("a gated one" if m.shared_gate else f"{m.shared} wide"))
    return m.shared // m.hidden


DEEPSEEK_V2_ATTN = ("q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")


def _plan_deepseek_v2(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """DeepSeek-V2: layer i is stage i: latent attention (transformers' names), then a dense MLP or DeepSeekMoE
    (routed experts and the shared expert of one moe turbine), each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        reactor = st.moe or st.mlp
        if st.latent is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks a latent attention or an mlp or moe; transformers' deepseek_v2 layer {i} has both"
            continue
        put(f"{st.valves.get(st.latent, _parent(st.latent) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(reactor, _parent(reactor) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        for name in DEEPSEEK_V2_ATTN:
            for p in ("weight", "bias"):
                put(f"{st.latent}.{name}.{p}", h + f"self_attn.{name}.{p}")
        if st.moe is not None:
            put(f"{st.moe}.router.weight", h + "mlp.gate.weight")
            if st.work_node.correction:  # DeepSeek-V3's selection bias, a buffer on both sides
                put(f"{st.moe}.correction", h + "mlp.gate.e_score_correction_bias")
            _put_experts(put, st.moe, h + "mlp.", st.work_node, state, fused)
            _put_gated(put, f"{st.moe}.shared", h + "mlp.shared_experts.", st.work_node.shared)
        else:
            _put_gated(put, st.mlp, h + "mlp.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_deepseek_v3(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """DeepSeek-V3: V2's layout, the router's correction bias with it (an moe with correction), and its MTP layers refused."""
    _plan_deepseek_v2(plan, put, layout, final, state, fused)
    _refuse_mtp(plan, state, len(layout))
    return plan


def _plan_axk1(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """A.X-K1: DeepSeek-V3's layout, and the RMSNorm after each MoE block (post_mlp_layernorm: at the layer in the files,
    under mlp. in transformers' module); a dense layer has none."""
    _plan_deepseek_v3(plan, put, layout, final, state, fused)
    for i, st in sorted(layout.items()):
        reactor = st.moe or st.mlp
        post = st.posts.get(reactor) if reactor is not None else None
        if (st.moe is not None) != (post is not None):
            plan.reasons[f"stages.{i}"] = (f"stage {i}: A.X-K1 norms the output of an MoE block (post_mlp_layernorm) and of nothing else; "
                                           "this stage's reactor " + ("lacks it" if post is None else "is a dense MLP with a norm after it"))
            continue
        if post is not None:
            h = f"layers.{i}."
            put(f"{post}.weight", h + ("mlp.post_mlp_layernorm.weight" if h + "mlp.post_mlp_layernorm.weight" in state else "post_mlp_layernorm.weight"))
    return plan


def _refuse_mtp(plan: _Plan, state, layers: int) -> None:
    """DeepSeek-V3's multi-token-prediction layers are saved as layers.{N}.* past the last one
    (num_nextn_predict_layers of them): a module the language does not have, and transformers
    drops them as it loads. Refused by name here rather than dropped."""
    extra = sorted({int(m.group(1)) for k in state if (m := re.match(r"layers\.(\d+)\.", k)) and int(m.group(1)) >= layers})
    if extra:
        plan.reasons[f"model.layers.{extra[0]}"] = (
            f"multi-token-prediction weights (layers {', '.join(map(str, extra))}, past the {layers} layers; num_nextn_predict_layers): "
            "the language has no MTP module, so they cannot load; save the checkpoint without them to load the causal LM")


@dataclass(frozen=True)
class _RopeHalves:
    """Rows of a projection whose blocks of `pre` + `rope` rows end in a rotary part rotated by halves (dim j with
    j + rope/2, transformers' rotate_half), as ours: rotated in adjacent pairs (2j, 2j + 1). Permuting q's and k's
    rotary rows alike leaves every q.k, so the attention, unchanged."""

    pre: int
    rope: int

    def __call__(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(-1, self.pre + self.rope, *rest)
        r = g[:, self.pre:].reshape(g.shape[0], 2, self.rope // 2, *rest).transpose(1, 2).reshape(g.shape[0], self.rope, *rest)
        return torch.cat([g[:, : self.pre], r], 1).reshape(t.shape)

    def inverse(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(-1, self.pre + self.rope, *rest)
        r = g[:, self.pre:].reshape(g.shape[0], self.rope // 2, 2, *rest).transpose(1, 2).reshape(g.shape[0], self.rope, *rest)
        return [torch.cat([g[:, : self.pre], r], 1).reshape(t.shape).contiguous()]


def _plan_latent_dense(plan: _Plan, put, layout: dict, final: str, halves: bool) -> _Plan:
    """MiniCPM3 and Youtu: layer i is stage i: latent attention (DeepSeek-V2's names), then a gated MLP, each with its
    valve. halves: the checkpoint rotates its rotary rows by halves (MiniCPM3; Youtu with rope_interleave false)."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        if st.latent is None or st.mlp is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks a latent attention or an mlp; the checkpoint's layer {i} has both"
            continue
        a = st.attn_node
        put(f"{st.valves.get(st.latent, _parent(st.latent) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.mlp, _parent(st.mlp) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        for name in DEEPSEEK_V2_ATTN:
            for p in ("weight", "bias"):
                fn = _SAME
                if halves and name in ("q_proj", "q_b_proj"):
                    fn = _RopeHalves(a.head_dim, a.rotary_dims)
                elif halves and name == "kv_a_proj_with_mqa":
                    fn = _RopeHalves(a.latent, a.rotary_dims)
                put(f"{st.latent}.{name}.{p}", h + f"self_attn.{name}.{p}", fn)
        _put_gated(put, st.mlp, h + "mlp.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan
