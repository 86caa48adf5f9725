"""The families that route their experts the DeepSeek-V3 way (turbine moe's router options), each read
closed-world (closed.py) into an `Arch`: GLM-4.5 (glm4_moe) and dots.llm1 (dots1).

What makes each one (transformers 5.24's modeling files):
- glm4_moe: a Llama block with q, k, v biased (attention_bias) and o never, rotary on the first half of each
  head's dims by halves (partial_rotary_factor 0.5 by default), an optional per-head qk RMSNorm (use_qk_norm);
  the first first_k_dense_replace layers a dense swiglu MLP of intermediate_size, the rest DeepSeek-V3's MoE:
  sigmoid scores, a selection-only bias per expert (gate.e_score_correction_bias, a buffer of the checkpoint),
  n_group banks of which topk_group are kept (each scored by its two best), norm_topk_prob (divided by the
  sum + 1e-20), routed_scaling_factor, beside n_shared_experts x moe_intermediate_size shared swiglu experts.
- dots1: the same MoE and dense layers, with Qwen3's attention: a per-head qk RMSNorm always, attention_bias on
  q, k, v and o alike, sliding windows on the layers layer_types names (from max_window_layers on by default).

A multi-token prediction layer (GLM-4.5's num_mtp_layers, model.layers.{num_hidden_layers}.*) is not built by
transformers' causal LM; its weights in a checkpoint are refused by name on load (a layer the spec lacks).
"""

from __future__ import annotations

from ..closed import Config, Keys, Unsupported, _show
from .core import (_GATED_ACTS, _HF_GATED, _LLAMA, Arch, _count, _divides, _dynamic_context, _eps, _kv, _padding, _partial, _rope,
                   _rope_config, _rope_kind, _rope_scaling, _rotary, _sliding, _types, _windows)
from .dense import _window_types

_V3 = frozenset({"moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "n_routed_experts", "routed_scaling_factor",
                 "n_group", "topk_group", "first_k_dense_replace", "norm_topk_prob", "attention_bias", "head_dim"})
_MTP = ("multi-token prediction layers: transformers' causal LM does not build them (their weights, model.layers.{num_hidden_layers}.*, "
        "are refused by name on load)")

KEYS: dict[str, Keys] = {
    "glm4_moe": Keys(_LLAMA | _V3 | {"use_qk_norm"}, {"num_mtp_layers": _MTP}),
    "dots1": Keys(_LLAMA | _V3 | {"sliding_window", "max_window_layers", "layer_types"}),
    "solar_open": Keys(_LLAMA - {"intermediate_size"} | _V3 - {"first_k_dense_replace"}),
    "sarvam_moe": Keys(_LLAMA | _V3 | {"use_qk_norm"}, {"num_mtp_layers": _MTP}),
    "hy_v3": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias", "num_experts", "num_experts_per_tok", "num_shared_experts",
                            "moe_intermediate_size", "router_scaling_factor", "mlp_layer_types"},
                  {"enable_moe_fp32_combine": "adds the routed and shared experts' outputs in float32 before rounding back: the same sum, "
                                              "at the model's precision or finer"}),
    "ernie4_5_moe": Keys(_LLAMA | {"use_bias", "moe_intermediate_size", "moe_k", "moe_num_experts", "moe_num_shared_experts",
                                   "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval", "moe_norm_min", "head_dim"}),
    "minimax_m2": Keys(_LLAMA | {"head_dim", "num_local_experts", "num_experts_per_tok", "router_jitter_noise", "rotary_dim"}),
    "exaone_moe": Keys(_LLAMA | {"sliding_window", "sliding_window_pattern", "layer_types", "mlp_layer_types", "first_k_dense_replace",
                                 "moe_intermediate_size", "num_experts", "num_experts_per_tok", "num_shared_experts", "norm_topk_prob",
                                 "routed_scaling_factor", "n_group", "topk_group", "head_dim"}),
}

CAUSAL_LM = {"glm4_moe": "Glm4MoeForCausalLM", "dots1": "Dots1ForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
             "minimax_m2": "MiniMaxM2ForCausalLM", "exaone_moe": "ExaoneMoeForCausalLM",
             "solar_open": "SolarOpenForCausalLM", "sarvam_moe": "Glm4MoeForCausalLM",
             "hy_v3": "HYV3ForCausalLM"}


def _v3_router(c: Config) -> dict:
    """DeepSeek-V3's MoE keys (sigmoid scores, the correction buffer, group-limited top-k, the scale), as Arch fields."""
    experts, top = _count(c, "n_routed_experts"), _count(c, "num_experts_per_tok")
    groups, keep = _count(c, "n_group"), _count(c, "topk_group")
    if experts % groups:
        raise Unsupported("n_group", f"{experts} experts do not split into {groups} equal groups (transformers' router cannot view them so)")
    size = experts // groups
    if size < 2:
        raise Unsupported("n_group", f"{groups} groups of {size} expert: the router scores a group by its two best experts")
    if keep > groups:
        raise Unsupported("topk_group", f"{keep} of {groups} groups")
    if top > keep * size:
        raise Unsupported("num_experts_per_tok", f"top-{top} of the {keep * size} experts in the {keep} kept groups (transformers would "
                          "pick masked ones)")
    scale = c["routed_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise Unsupported("routed_scaling_factor", f"{_show(scale)} is not a positive number")
    shared = _count(c, "n_shared_experts")  # transformers always builds the shared experts (0 or null: no width, or a failure)
    hidden = _count(c, "moe_intermediate_size")
    return {"experts": experts, "top": top, "hidden": hidden, "normalize": bool(c["norm_topk_prob"]), "shared": hidden * shared,
            "router": "sigmoid", "groups": groups, "top_groups": keep if groups > 1 else 1, "route_scale": float(scale), "correction": True}


def _first_dense(c: Config, layers: int) -> tuple:
    k = c["first_k_dense_replace"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise Unsupported("first_k_dense_replace", f"{_show(k)} is not a number of layers")
    if k >= layers:
        raise Unsupported("first_k_dense_replace", f"{k}: every one of the {layers} layers is dense, no experts to route")
    return tuple(i < k for i in range(layers)) if k else ()


def _reader(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        act = _GATED_ACTS.get(c["hidden_act"])
        if act is None:
            raise Unsupported("hidden_act", f"a gated MLP with {c['hidden_act']!r} has no counterpart (swiglu = silu, geglu = gelu)")
        if c.given("head_dim"):  # not a field of the class: its attention reads one config.json writes
            head_dim = c["head_dim"]
            if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
                raise Unsupported("head_dim", f"{_show(head_dim)} is not a head width")
        else:
            head_dim = width // heads  # getattr(config, "head_dim", hidden_size // num_attention_heads): rounded down
            if head_dim < 1:
                raise Unsupported("num_attention_heads", f"{heads} heads in hidden_size {width}: heads of no width")
        kv = _kv(c, heads)
        extra = _v3_router(c)
        dense = _first_dense(c, layers) if family != "solar_open" else ()  # Solar Open routes every layer
        if dense:
            extra.update(layer_dense=dense, dense_hidden=_count(c, "intermediate_size"))
        bias = bool(c["attention_bias"])
        eps = _eps(c, "rms_norm_eps")
        sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "moe_intermediate_size", "act": "hidden_act",
                   "eps": "rms_norm_eps", "rotary_base": "rope_parameters", "window": "sliding_window, layer_types",
                   "experts": "n_routed_experts", "top": "num_experts_per_tok",
                   "router": "n_group, topk_group, routed_scaling_factor, e_score_correction_bias", "tied": "tie_word_embeddings",
                   "dense_hidden": "intermediate_size, first_k_dense_replace"}
        context = c["max_position_embeddings"]
        if family in ("glm4_moe", "sarvam_moe"):  # Sarvam-MoE: GLM-4.5's model (its class), a whole rotary by default
            if _rope_kind(c)[2] != "default":
                raise Unsupported("rope_parameters.rope_type", "rotary scaling of GLM-4.5's partial rotary is not mapped")
            return Arch(family, vocab=c["vocab_size"], context=context, width=width, layers=layers, heads=heads, kv_heads=kv,
                        head_dim=head_dim, act=act, norm="rmsnorm", eps=eps, qkv_bias=bias, out_bias=False,
                        rotary=_rotary(_partial(c), head_dim), rotary_base=_rope(c),
                        qk_norm="head" if c["use_qk_norm"] else "none", qk_eps=eps, tied=bool(c["tie_word_embeddings"]),
                        padding=_padding(c), sources=sources, **extra)
        if family == "solar_open":  # GLM-4.5's MoE in every layer beside Llama's attention (q, k, v biased by attention_bias, o never)
            if _rope_kind(c)[2] != "default":
                raise Unsupported("rope_parameters.rope_type", "rotary scaling is not mapped for Solar Open")
            if _partial(c) != 1.0:
                raise Unsupported("partial_rotary_factor", f"{_partial(c)}: transformers' Solar Open computes fewer frequencies but rotates "
                                  "the whole head with them (it cannot run a partial rotary)")
            return Arch(family, vocab=c["vocab_size"], context=context, width=width, layers=layers, heads=heads, kv_heads=kv,
                        head_dim=head_dim, act=act, norm="rmsnorm", eps=eps, qkv_bias=bias, out_bias=False, rotary=1.0, rotary_base=_rope(c),
                        tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources, **extra)
        # dots1
        if _partial(c) != 1.0:
            raise Unsupported("partial_rotary_factor", f"{_partial(c)}: transformers' Dots1 rotates every dim of each head whatever this says")
        sw = _sliding(c)
        mwl = c["max_window_layers"]
        if mwl is not None and (isinstance(mwl, bool) or not isinstance(mwl, int)):
            raise Unsupported("max_window_layers", f"{_show(mwl)} is not a layer number")
        if mwl is None and sw is not None and c["layer_types"] is None:
            raise Unsupported("max_window_layers", "null beside a sliding_window and no layer_types: Dots1Config cannot make its pattern")
        types = _types(c, layers, lambda: ["sliding_attention" if sw is not None and i >= mwl else "full_attention" for i in range(layers)])
        if "sliding_attention" in types and sw is None:
            raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
        window, windows = _windows(types, sw)
        if windows and dense:
            raise Unsupported("layer_types", "sliding and global layers together with dense and routed ones (first_k_dense_replace): two "
                              "per-layer patterns at once are not mapped")
        if windows:
            extra["layer_windows"] = windows
        scaling = _rope_scaling(c, context)
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, scaling), width=width, layers=layers, heads=heads,
                    kv_heads=kv, head_dim=head_dim, act=act, norm="rmsnorm", eps=eps, qkv_bias=bias, out_bias=bias, rotary=1.0,
                    rotary_base=_rope(c), rotary_scaling=scaling, window=window, qk_norm="head", qk_eps=eps,
                    tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources, **extra)
    return read


def _layer_number(c: Config, key: str) -> int:
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise Unsupported(key, f"{_show(v)} is not a layer number")
    return v


def _head_width(c: Config, width: int, heads: int) -> int:
    """head_dim where config.json gives one (a whole number from 1), else hidden_size / heads (which must divide)."""
    if c.given("head_dim"):
        head_dim = c["head_dim"]
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise Unsupported("head_dim", f"{_show(head_dim)} is not a head width")
        return head_dim
    _divides(width, heads, "num_attention_heads", "hidden_size")
    return width // heads


def _ernie(c: Config) -> Arch:
    """ERNIE 4.5 MoE: ERNIE 4.5's block (interleaved rotary, use_bias on every linear), routed experts in the layers
    (i + 1) % moe_layer_interval == 0 between moe_layer_start_index and moe_layer_end_index, a dense MLP elsewhere; a
    softmax router whose choice adds a correction bias (moe_statics) and whose weights are renormalised."""
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"ERNIE 4.5 MoE's routed experts are silu-gated; {c['hidden_act']!r} is not mapped")
    if c["use_bias"]:
        raise Unsupported("use_bias", "ERNIE 4.5 MoE biases its attention, dense and shared MLPs and head, but never the routed experts: "
                          "the language's moe bias= covers all of them")
    head_dim = _head_width(c, width, heads)
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling of ERNIE 4.5's interleaved rotary is not mapped")
    if _partial(c) != 1.0:
        raise Unsupported("partial_rotary_factor", f"{_partial(c)}: a partial interleaved rotary is not mapped for ERNIE 4.5 MoE")
    experts, top = _count(c, "moe_num_experts"), _count(c, "moe_k")
    if top > experts:
        raise Unsupported("moe_k", f"top-{top} of {experts} experts")
    norm_min = c["moe_norm_min"]
    if isinstance(norm_min, bool) or not isinstance(norm_min, (int, float)) or not 0 <= norm_min <= top / experts:
        # the top-k of a softmax over E experts sums to at least k / E: a floor up to there never acts
        raise Unsupported("moe_norm_min", f"{_show(norm_min)}: a floor on the top-{top} weights' sum above {top}/{experts} (the least "
                          "it can be) would change the renormalised weights; the language divides by the sum")
    interval = _count(c, "moe_layer_interval")
    start, end = _layer_number(c, "moe_layer_start_index"), _layer_number(c, "moe_layer_end_index")
    end = layers - 1 if end == -1 else end  # __post_init__
    dense = tuple(not ((i + 1) % interval == 0 and start <= i <= end) for i in range(layers))
    if all(dense):
        raise Unsupported("moe_layer_start_index", "every layer is dense: write the checkpoint as an ernie4_5 (no experts)")
    hidden = _count(c, "moe_intermediate_size")
    shared = _count(c, "moe_num_shared_experts", 0)
    extra = {"layer_dense": dense, "dense_hidden": _count(c, "intermediate_size")} if any(dense) else {}
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "moe_intermediate_size", "act": "hidden_act",
               "eps": "rms_norm_eps", "rotary_base": "rope_parameters", "experts": "moe_num_experts", "top": "moe_k",
               "router": "moe_statics.e_score_correction_bias", "tied": "tie_word_embeddings",
               "dense_hidden": "intermediate_size, moe_layer_start_index, moe_layer_end_index, moe_layer_interval"}
    return Arch("ernie4_5_moe", vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=layers, heads=heads,
                kv_heads=_kv(c, heads), head_dim=head_dim, hidden=hidden, act="swiglu", norm="rmsnorm", eps=_eps(c, "rms_norm_eps"),
                rotary=1.0, rotary_interleaved=True, rotary_base=_rope(c), experts=experts, top=top, normalize=True,
                shared=hidden * shared, correction=True, tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources, **extra)


def _minimax_m2(c: Config) -> Arch:
    """MiniMax-M2: Mixtral's block (routed experts in every layer, no shared ones) with OLMo-2's qk RMSNorm across the heads,
    rotary on the first rotary_dim dims of each head by halves, and a sigmoid router with a correction bias, renormalised."""
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"MiniMax-M2's experts are silu-gated here (swiglu); {c['hidden_act']!r} is not mapped")
    if c["router_jitter_noise"]:
        raise Unsupported("router_jitter_noise", "multiplicative noise on the experts' input while training is not in the language")
    head_dim = c["head_dim"]
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise Unsupported("head_dim", f"{_show(head_dim)} is not a head width")
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling of MiniMax-M2's partial rotary is not mapped")
    partial = _partial(c)
    rd = c["rotary_dim"]  # not a field: the released configs' name for the rotated dims, which transformers turns into the factor
    if rd is not None and (isinstance(rd, bool) or not isinstance(rd, int) or rd / head_dim != partial):
        raise Unsupported("rotary_dim", f"{_show(rd)} beside partial_rotary_factor {partial} of head_dim {head_dim}: which one transformers "
                          "reads depends on where each is written")
    experts, top = _count(c, "num_local_experts"), _count(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    eps = _eps(c, "rms_norm_eps")
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size", "act": "hidden_act",
               "eps": "rms_norm_eps", "rotary_base": "rope_parameters", "experts": "num_local_experts", "top": "num_experts_per_tok",
               "router": "e_score_correction_bias", "tied": "tie_word_embeddings"}
    return Arch("minimax_m2", vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=layers, heads=heads,
                kv_heads=_kv(c, heads), head_dim=head_dim, hidden=_count(c, "intermediate_size"), act="swiglu", norm="rmsnorm", eps=eps,
                rotary=_rotary(partial, head_dim), rotary_base=_rope(c), qk_norm="all", qk_eps=eps, experts=experts, top=top,
                normalize=True, router="sigmoid", correction=True, tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
                sources=sources)


def _minimax_config(a: Arch) -> dict:
    if a.router != "sigmoid" or not a.correction or a.groups > 1 or a.route_scale != 1.0 or not a.normalize:
        raise Unsupported("router", "MiniMax-M2 routes by sigmoid scores with a correction bias, renormalised, one group, unscaled")
    if a.shared or a.layer_dense or a.mlp_bias or a.qkv_bias or a.out_bias or a.act != "swiglu":
        raise Unsupported("shared", "MiniMax-M2 routes every layer through unbiased swiglu experts, without shared ones; its attention "
                          "has no biases")
    if a.qk_norm != "all" or a.qk_eps != a.eps or a.rotary_scaling is not None or a.rotary_interleaved:
        raise Unsupported("qk_norm", "MiniMax-M2's qk-norm is across the heads (qk_norm_across), with the norms' eps; its rotary turns "
                          "halves, unscaled")
    return {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied,
            "hidden_size": a.width, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim, "hidden_act": "silu", "max_position_embeddings": a.context, "rms_norm_eps": a.eps,
            "pad_token_id": a.padding, "intermediate_size": a.hidden, "num_local_experts": a.experts, "num_experts_per_tok": a.top,
            "router_jitter_noise": 0.0, "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base,
                                                              "partial_rotary_factor": a.rotary}}


class _Renamed:
    """A Config read under other names (EXAONE-MoE's num_experts, num_shared_experts as DeepSeek-V3's n_routed_experts,
    n_shared_experts), so that _v3_router reads both."""

    def __init__(self, c: Config, names: dict):
        self.c, self.names = c, names

    def __getitem__(self, key):
        return self.c[self.names.get(key, key)]


def _exaone_moe(c: Config) -> Arch:
    """EXAONE-MoE: EXAONE 4's attention (a per-head qk RMSNorm; with a sliding window, rotary on the sliding layers only) in a
    pre-norm block, dense or DeepSeek-V3 MoE layers as mlp_layer_types (or first_k_dense_replace) say."""
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    act = _GATED_ACTS.get(c["hidden_act"])
    if act is None:
        raise Unsupported("hidden_act", f"a gated MLP with {c['hidden_act']!r} has no counterpart (swiglu = silu, geglu = gelu)")
    head_dim = _head_width(c, width, heads)
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling of EXAONE-MoE's rotary is not mapped")
    if _partial(c) != 1.0:
        raise Unsupported("partial_rotary_factor", f"{_partial(c)}: transformers' EXAONE-MoE rotates every dim of each head")
    sw = _sliding(c)
    pattern = c["sliding_window_pattern"]
    if c["layer_types"] is None:
        if sw is None:
            pattern = 0  # __post_init__: then the default pattern divides by zero
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise Unsupported("sliding_window_pattern", f"{_show(pattern)}: without layer_types, the pattern is a whole number of layers "
                              "from 1 (its 'LLLG' strings are not read by the default pattern)")
    types, sw = _window_types(c, layers, lambda: ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)])
    kinds = c["mlp_layer_types"]
    if kinds is None:
        k = c["first_k_dense_replace"]
        if isinstance(k, bool) or not isinstance(k, int):
            raise Unsupported("first_k_dense_replace", f"{_show(k)} is not a number of layers")
        kinds = ["dense" if i < k else "sparse" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or any(x not in ("dense", "sparse") for x in kinds):
        raise Unsupported("mlp_layer_types", f"dense or sparse, one per layer ({layers})")
    if "sparse" not in kinds:
        raise Unsupported("mlp_layer_types", "every layer is dense: no experts to route")
    extra = _v3_router(_Renamed(c, {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts"}))
    if "dense" in kinds:
        extra.update(layer_dense=tuple(x == "dense" for x in kinds), dense_hidden=_count(c, "intermediate_size"))
    base = _rope(c)
    window, windows = _windows(types, sw)
    per = [(sw if t == "sliding_attention" else None, 1.0 if sw is None or t == "sliding_attention" else 0.0) for t in types]
    rotary = per[0][1]
    if len({p[1] for p in per}) > 1:  # rotary differs by layer: the global layers are NoPE
        extra["layer_attn"] = tuple((w, rot, base if rot else 10000.0, None) for w, rot in per)
        window, rotary = None, 1.0
    elif windows:
        extra["layer_windows"] = windows
    eps = _eps(c, "rms_norm_eps")
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "moe_intermediate_size", "act": "hidden_act",
               "eps": "rms_norm_eps", "rotary_base": "rope_parameters", "window": "sliding_window, layer_types", "experts": "num_experts",
               "top": "num_experts_per_tok", "router": "n_group, topk_group, routed_scaling_factor, e_score_correction_bias",
               "tied": "tie_word_embeddings", "dense_hidden": "intermediate_size, mlp_layer_types"}
    return Arch("exaone_moe", vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=layers, heads=heads,
                kv_heads=_kv(c, heads), head_dim=head_dim, act=act, norm="rmsnorm", eps=eps, rotary=rotary,
                rotary_base=base, window=window, qk_norm="head", qk_eps=eps, tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
                sources=sources, **extra)


def _exaone_config(a: Arch) -> dict:
    if a.router != "sigmoid" or not a.correction or a.shared_gate or a.mlp_bias or not a.shared or a.shared % a.hidden:
        raise Unsupported("router", "EXAONE-MoE routes by sigmoid scores with a correction bias, beside ungated, unbiased shared experts "
                          "a whole number of experts wide")
    if a.qk_norm != "head" or a.qk_eps != a.eps or a.qkv_bias or a.out_bias or a.rotary_interleaved or a.rotary_scaling is not None:
        raise Unsupported("qk_norm", "EXAONE-MoE's attention has a per-head qk-norm with the norms' eps, no biases, unscaled rotary by halves")
    act = _HF_GATED.get(a.act)
    if act is None:
        raise Unsupported("act", f"EXAONE-MoE's MLPs are swiglu or geglu, not {a.act}")
    if a.layer_attn:
        per = list(a.layer_attn)
    else:
        per = [(w, a.rotary, a.rotary_base, None) for w in (a.layer_windows or (a.window,) * a.layers)]
    local = {p[0] for p in per if p[0] is not None}
    if len(local) > 1:
        raise Unsupported("window", f"EXAONE-MoE has one sliding_window; the spec's layers have {sorted(local)}")
    sw = local.pop() if local else a.context  # ExaoneMoeConfig takes no null window: one no layer uses then
    bases = {base for w, rot, base, sc in per if rot}
    for w, rot, base, sc in per:  # the class always has a window: rotary on the sliding layers alone
        if rot not in (0.0, 1.0) or bool(rot) != (w is not None) or sc is not None or len(bases) > 1:
            raise Unsupported("rotary", "EXAONE-MoE turns every dim of its sliding layers by one rotary and none of its global ones")
    theta = bases.pop() if bases else a.rotary_base
    return {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied,
            "hidden_size": a.width, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim, "hidden_act": act, "max_position_embeddings": a.context, "rms_norm_eps": a.eps, "pad_token_id": a.padding,
            "intermediate_size": a.dense_hidden if a.layer_dense else a.hidden, "moe_intermediate_size": a.hidden, "num_experts": a.experts,
            "num_experts_per_tok": a.top, "num_shared_experts": a.shared // a.hidden, "routed_scaling_factor": a.route_scale,
            "n_group": a.groups, "topk_group": a.top_groups, "norm_topk_prob": a.normalize,
            "mlp_layer_types": ["dense" if d else "sparse" for d in (a.layer_dense or (False,) * a.layers)],
            "first_k_dense_replace": 0, "sliding_window": sw, "sliding_window_pattern": None,
            "layer_types": ["sliding_attention" if p[0] is not None else "full_attention" for p in per],
            "rope_parameters": {"rope_type": "default", "rope_theta": theta}}


def _hy_v3(c: Config) -> Arch:
    """Hunyuan 3 (HY-V3): Qwen3's attention (a per-head qk RMSNorm, attention_bias on q, k, v and o), dense or routed layers as
    mlp_layer_types say; a sigmoid router with a correction bias on the block, renormalised (+ 1e-20), scaled by
    router_scaling_factor, beside num_shared_experts x moe_intermediate_size shared swiglu experts."""
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    act = _GATED_ACTS.get(c["hidden_act"])
    if act is None:
        raise Unsupported("hidden_act", f"a gated MLP with {c['hidden_act']!r} has no counterpart (swiglu = silu, geglu = gelu)")
    if c["mlp_bias"]:
        raise Unsupported("mlp_bias", "HY-V3 biases its dense and shared MLPs but never the routed experts: the language's moe bias= covers "
                          "all of them")
    head_dim = c["head_dim"]
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise Unsupported("head_dim", f"{_show(head_dim)} is not a head width")
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling is not mapped for HY-V3")
    if _partial(c) != 1.0:
        raise Unsupported("partial_rotary_factor", f"{_partial(c)}: transformers' HY-V3 cannot run a partial rotary")
    experts, top = _count(c, "num_experts"), _count(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    scale = c["router_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise Unsupported("router_scaling_factor", f"{_show(scale)} is not a positive number")
    hidden, dense_hidden = _count(c, "moe_intermediate_size"), _count(c, "intermediate_size")
    shared = _count(c, "num_shared_experts", 0)
    kinds = c["mlp_layer_types"]
    if kinds is None:  # __post_init__: the first layer dense
        kinds = ["dense"] * min(layers, 1) + ["sparse"] * max(layers - 1, 0)
    if not isinstance(kinds, list) or len(kinds) != layers or any(x not in ("dense", "sparse") for x in kinds):
        raise Unsupported("mlp_layer_types", f"dense or sparse, one per layer ({layers})")
    if "sparse" not in kinds:
        raise Unsupported("mlp_layer_types", "every layer is dense: no experts to route")
    extra = {"layer_dense": tuple(x == "dense" for x in kinds), "dense_hidden": dense_hidden} if "dense" in kinds else {}
    bias = bool(c["attention_bias"])
    eps = _eps(c, "rms_norm_eps")
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "moe_intermediate_size", "act": "hidden_act",
               "eps": "rms_norm_eps", "rotary_base": "rope_parameters", "experts": "num_experts", "top": "num_experts_per_tok",
               "router": "router_scaling_factor, e_score_correction_bias", "tied": "tie_word_embeddings",
               "dense_hidden": "intermediate_size, mlp_layer_types"}
    # num_shared_experts 0 builds a shared MLP of intermediate_size (HYV3MLP's `intermediate_size or config.intermediate_size`)
    return Arch("hy_v3", vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=layers, heads=heads,
                kv_heads=_kv(c, heads), head_dim=head_dim, hidden=hidden, act=act, norm="rmsnorm", eps=eps, qkv_bias=bias, out_bias=bias,
                rotary=1.0, rotary_base=_rope(c), qk_norm="head", qk_eps=eps, experts=experts, top=top, normalize=True,
                shared=hidden * shared if shared else dense_hidden, router="sigmoid", route_scale=float(scale), correction=True,
                tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources, **extra)


def _hy_v3_config(a: Arch) -> dict:
    if a.router != "sigmoid" or not a.correction or a.groups > 1 or not a.normalize or a.shared_gate or a.mlp_bias or not a.shared:
        raise Unsupported("router", "HY-V3 routes by sigmoid scores with a correction bias, renormalised, one group, beside an ungated, "
                          "unbiased shared expert")
    if a.qk_norm != "head" or a.qk_eps != a.eps or a.qkv_bias != a.out_bias or a.rotary != 1.0 or a.rotary_scaling is not None \
            or a.rotary_interleaved:
        raise Unsupported("qk_norm", "HY-V3's attention has a per-head qk-norm with the norms' eps, attention_bias on q, k, v and o alike, "
                          "a whole unscaled rotary by halves")
    act = _HF_GATED.get(a.act)
    if act is None:
        raise Unsupported("act", f"HY-V3's MLPs are swiglu or geglu, not {a.act}")
    n, inter = a.shared // a.hidden, a.dense_hidden if a.layer_dense else a.hidden
    if a.shared % a.hidden:  # num_shared_experts 0: a shared MLP of intermediate_size, the dense layers' width
        if a.layer_dense and a.dense_hidden != a.shared:
            raise Unsupported("shared", f"HY-V3's shared expert is a whole number of experts wide ({a.hidden}), or as wide as its dense "
                              f"layers ({a.dense_hidden})")
        n, inter = 0, a.shared
    return {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied,
            "hidden_size": a.width, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim, "hidden_act": act, "max_position_embeddings": a.context, "rms_norm_eps": a.eps, "pad_token_id": a.padding,
            "attention_bias": a.qkv_bias, "mlp_bias": False, "intermediate_size": inter,
            "moe_intermediate_size": a.hidden, "num_experts": a.experts, "num_experts_per_tok": a.top,
            "num_shared_experts": n, "router_scaling_factor": a.route_scale, "enable_moe_fp32_combine": True,
            "mlp_layer_types": ["dense" if d else "sparse" for d in (a.layer_dense or (False,) * a.layers)],
            "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}}


READERS = {"glm4_moe": _reader("glm4_moe"), "dots1": _reader("dots1"), "solar_open": _reader("solar_open"), "sarvam_moe": _reader("sarvam_moe"), "ernie4_5_moe": _ernie, "minimax_m2": _minimax_m2,
           "exaone_moe": _exaone_moe, "hy_v3": _hy_v3}


def _ernie_layers(dense: tuple, layers: int) -> tuple[int, int, int]:
    """(moe_layer_start_index, moe_layer_end_index, moe_layer_interval) that give these dense layers, or Unsupported."""
    for interval in range(1, layers + 1):
        moe = [i for i in range(layers) if not (dense[i] if dense else False)]
        if not moe:
            break
        start, end = moe[0], moe[-1]
        if tuple(not ((i + 1) % interval == 0 and start <= i <= end) for i in range(layers)) == (dense or (False,) * layers):
            return start, end, interval
    raise Unsupported("stages", "ERNIE 4.5 MoE routes every moe_layer_interval-th layer between a first and a last: the spec's "
                      "pattern of dense and routed layers is not one of those")


def _ernie_config(a: Arch) -> dict:
    if a.router != "softmax" or not a.correction or a.groups > 1 or a.route_scale != 1.0 or not a.normalize:
        raise Unsupported("router", "ERNIE 4.5 MoE routes by softmax with a correction bias, renormalised, one group, unscaled")
    if a.shared_gate or a.mlp_bias or a.qkv_bias or a.out_bias or a.shared % a.hidden:
        raise Unsupported("shared", "ERNIE 4.5 MoE's shared experts are ungated and a whole number of experts wide; no biases are mapped")
    if not a.rotary_interleaved or a.rotary != 1.0 or a.rotary_scaling is not None or a.qk_norm != "none" or a.act != "swiglu":
        raise Unsupported("rotary", "ERNIE 4.5 MoE rotates every dim by interleaved pairs, unscaled, without qk-norm, its MLPs swiglu")
    start, end, interval = _ernie_layers(a.layer_dense, a.layers)
    return {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied,
            "hidden_size": a.width, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim, "hidden_act": "silu", "max_position_embeddings": a.context, "rms_norm_eps": a.eps,
            "pad_token_id": a.padding, "use_bias": False, "intermediate_size": a.dense_hidden if a.layer_dense else a.hidden,
            "moe_intermediate_size": a.hidden, "moe_num_experts": a.experts, "moe_k": a.top, "moe_num_shared_experts": a.shared // a.hidden,
            "moe_layer_start_index": start, "moe_layer_end_index": end, "moe_layer_interval": interval, "moe_norm_min": 1e-12,
            "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}}


# --- export: the config.json an Arch of these families implies -----------------------------------


def config_of(a: Arch) -> dict:
    """The transformers config of an Arch of one of these families; export then checks that importing it gives back the engine."""
    if not a.experts:
        raise Unsupported("turbine mlp", f"{a.family} routes its MLPs through experts; the spec's layers are all dense")
    if a.family == "ernie4_5_moe":
        return _ernie_config(a)
    if a.family == "minimax_m2":
        return _minimax_config(a)
    if a.family == "exaone_moe":
        return _exaone_config(a)
    if a.family == "hy_v3":
        return _hy_v3_config(a)
    if a.router != "sigmoid" or not a.correction:
        raise Unsupported("router", f"{a.family} routes by sigmoid scores with a correction bias (router=sigmoid correction=true)")
    if a.shared_gate or a.mlp_bias or not a.shared or a.shared % a.hidden:
        raise Unsupported("shared", f"{a.family}'s shared experts are ungated, unbiased and a whole number of experts wide ({a.hidden})")
    dense = a.layer_dense
    k = next((i for i, d in enumerate(dense) if not d), 0)
    if any(dense[k:]):
        raise Unsupported("stages", f"{a.family}'s dense layers come first (first_k_dense_replace), then only routed ones")
    act = _HF_GATED.get(a.act)
    if act is None:
        raise Unsupported("act", f"{a.family}'s MLPs are swiglu or geglu, not {a.act}")
    if a.qk_norm not in ("none", "head") or (a.qk_norm == "head" and a.qk_eps != a.eps):
        raise Unsupported("qk_norm", f"{a.family}'s qk-norm is per head, with the norms' eps")
    rope = {"rope_type": "default", "rope_theta": a.rotary_base}
    cfg = {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied,
           "hidden_size": a.width, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "head_dim": a.head_dim, "hidden_act": act, "max_position_embeddings": a.context, "rms_norm_eps": a.eps,
           "pad_token_id": a.padding, "attention_dropout": 0.0, "intermediate_size": a.dense_hidden if dense else a.hidden,
           "moe_intermediate_size": a.hidden, "n_routed_experts": a.experts, "num_experts_per_tok": a.top,
           "n_shared_experts": a.shared // a.hidden, "routed_scaling_factor": a.route_scale, "n_group": a.groups,
           "topk_group": a.top_groups, "first_k_dense_replace": k, "norm_topk_prob": a.normalize, "attention_bias": a.qkv_bias}
    if a.family == "solar_open":
        if dense or a.out_bias or a.qk_norm != "none" or a.rotary != 1.0 or a.rotary_scaling is not None or a.rotary_interleaved:
            raise Unsupported("stages", "Solar Open routes every layer; its attention has no qk-norm, no output bias, a whole unscaled rotary")
        del cfg["intermediate_size"], cfg["first_k_dense_replace"]
        return {**cfg, "rope_parameters": rope}
    if a.family in ("glm4_moe", "sarvam_moe"):
        if a.out_bias:
            raise Unsupported("out_bias", "GLM-4.5's output projection has no bias")
        if a.rotary_scaling is not None:
            raise Unsupported("rotary_scaling", "rotary scaling of GLM-4.5's partial rotary is not mapped")
        return {**cfg, "use_qk_norm": a.qk_norm == "head", "num_mtp_layers": 0, "rope_parameters": {**rope, "partial_rotary_factor": a.rotary}}
    if a.qk_norm != "head" or a.out_bias != a.qkv_bias or a.rotary != 1.0:
        raise Unsupported("qk_norm", "dots1's attention has a per-head qk-norm, attention_bias on q, k, v and o alike, and a whole rotary")
    windows = a.layer_windows or (a.window,) * a.layers
    local = {w for w in windows if w is not None}
    if len(local) > 1:
        raise Unsupported("window", f"dots1 has one sliding_window; the spec's layers have {sorted(local)}")
    return {**cfg, "rope_parameters": _rope_config(a, rope), "sliding_window": local.pop() if local else None,
            "max_window_layers": a.layers, "layer_types": ["sliding_attention" if w is not None else "full_attention" for w in windows]}
