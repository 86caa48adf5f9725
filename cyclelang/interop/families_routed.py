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

from .closed import Config, Keys, Unsupported, _show
from .families import (_GATED_ACTS, _HF_GATED, _LLAMA, Arch, _count, _divides, _dynamic_context, _eps, _kv, _padding, _partial,
                       _rope, _rope_config, _rope_kind, _rope_scaling, _rotary, _sliding, _types, _windows)

_V3 = frozenset({"moe_intermediate_size", "num_experts_per_tok", "n_shared_experts", "n_routed_experts", "routed_scaling_factor",
                 "n_group", "topk_group", "first_k_dense_replace", "norm_topk_prob", "attention_bias", "head_dim"})
_MTP = ("multi-token prediction layers: transformers' causal LM does not build them (their weights, model.layers.{num_hidden_layers}.*, "
        "are refused by name on load)")

KEYS: dict[str, Keys] = {
    "glm4_moe": Keys(_LLAMA | _V3 | {"use_qk_norm"}, {"num_mtp_layers": _MTP}),
    "dots1": Keys(_LLAMA | _V3 | {"sliding_window", "max_window_layers", "layer_types"}),
    "ernie4_5_moe": Keys(_LLAMA | {"use_bias", "moe_intermediate_size", "moe_k", "moe_num_experts", "moe_num_shared_experts",
                                   "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval", "moe_norm_min", "head_dim"}),
}

CAUSAL_LM = {"glm4_moe": "Glm4MoeForCausalLM", "dots1": "Dots1ForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM"}


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
            _divides(width, heads, "num_attention_heads", "hidden_size")
            head_dim = width // heads
        kv = _kv(c, heads)
        extra = _v3_router(c)
        dense = _first_dense(c, layers)
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
        if family == "glm4_moe":
            if _rope_kind(c)[2] != "default":
                raise Unsupported("rope_parameters.rope_type", "rotary scaling of GLM-4.5's partial rotary is not mapped")
            return Arch(family, vocab=c["vocab_size"], context=context, width=width, layers=layers, heads=heads, kv_heads=kv,
                        head_dim=head_dim, act=act, norm="rmsnorm", eps=eps, qkv_bias=bias, out_bias=False,
                        rotary=_rotary(_partial(c), head_dim), rotary_base=_rope(c),
                        qk_norm="head" if c["use_qk_norm"] else "none", qk_eps=eps, tied=bool(c["tie_word_embeddings"]),
                        padding=_padding(c), sources=sources, **extra)
        # dots1
        if _partial(c) != 1.0:
            raise Unsupported("partial_rotary_factor", f"{_partial(c)}: transformers' Dots1 rotates every dim of each head whatever this says")
        sw = _sliding(c)
        mwl = c["max_window_layers"]
        if mwl is not None and (isinstance(mwl, bool) or not isinstance(mwl, int)):
            raise Unsupported("max_window_layers", f"{_show(mwl)} is not a layer number")
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
    if c.given("head_dim"):
        head_dim = c["head_dim"]
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise Unsupported("head_dim", f"{_show(head_dim)} is not a head width")
    else:
        _divides(width, heads, "num_attention_heads", "hidden_size")
        head_dim = width // heads
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


READERS = {"glm4_moe": _reader("glm4_moe"), "dots1": _reader("dots1"), "ernie4_5_moe": _ernie}


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
    if a.family == "glm4_moe":
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
