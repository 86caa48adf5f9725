"""The families with attention sinks (turbine attention sinks), each read closed-world (closed.py) into an `Arch`.

What makes each one (transformers 5.24's modeling files):
- gpt_oss: Llama's block with q, k, v and o biased (attention_bias), a learned sink logit per head in every softmax
  (self_attn.sinks), layers alternating sliding (sliding_window) and global attention by layer_types (by default the even
  layers slide), YaRN rotary whose correction range is not rounded (truncate: false, the class's default), and in every
  layer gpt-oss's MoE: a router with a bias whose top num_experts_per_tok logits are softmaxed (the same weights as the
  softmax over every expert renormalised over the chosen), and biased experts of the clamped SwiGLU, the gate capped at
  swiglu_limit and up clamped to [-limit, limit], out = (up + 1) * gate * sigmoid(swiglu_alpha * gate), gate and up
  interleaved column by column in the fused gate_up_proj (load.py's _Interleaved). hidden_act is read by nothing.
"""

from __future__ import annotations

from .closed import Config, Keys, Unsupported, _show
from .families import (_LLAMA, Arch, _count, _eps, _kv, _padding, _partial, _rope, _rope_config, _rope_scaling, _sliding,
                       _types, _windows)

_ALPHA = 1.702  # the language's swiglu_clamp: gate * sigmoid(1.702 * gate)

# gpt-oss's rope_parameters when config.json gives none (GptOssConfig.__post_init__), its rope_theta the class's default_theta
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}

KEYS: dict[str, Keys] = {
    "gpt_oss": Keys(_LLAMA | {"head_dim", "attention_bias", "num_local_experts", "num_experts_per_tok", "sliding_window", "layer_types",
                              "swiglu_alpha", "swiglu_limit"} - {"hidden_act"},
                    {"hidden_act": "gpt-oss's experts compute their own clamped SwiGLU (GptOssExperts._apply_gate); nothing reads hidden_act"}),
}

CAUSAL_LM = {"gpt_oss": "GptOssForCausalLM"}


def _number(c: Config, key: str) -> float:
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise Unsupported(key, f"{_show(v)} is not a positive number")
    return float(v)


def _gpt_oss(c: Config) -> Arch:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    if c["rope_parameters"] is None and not c.raw.get("rope_scaling"):  # __post_init__ writes gpt-oss's YaRN in
        c.raw["rope_parameters"] = dict(_GPT_OSS_ROPE)
    head_dim = c["head_dim"]
    if head_dim is None:  # __post_init__: hidden_size // num_attention_heads
        head_dim = width // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise Unsupported("head_dim", f"{_show(head_dim)} is not a head width")
    alpha = _number(c, "swiglu_alpha")
    if alpha != _ALPHA:
        raise Unsupported("swiglu_alpha", f"{alpha:g}: the language's swiglu_clamp gates by sigmoid({_ALPHA} x gate), gpt-oss's own alpha")
    limit = _number(c, "swiglu_limit")
    if _partial(c) != 1.0:
        raise Unsupported("rope_parameters.partial_rotary_factor", f"{_partial(c)}: gpt-oss rotates every dim of each head")
    experts, top = _count(c, "num_local_experts"), _count(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    sw = _sliding(c)
    types = _types(c, layers, lambda: ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)])
    if "sliding_attention" in types and sw is None:
        raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
    window, per = _windows(types, sw)
    context = c["max_position_embeddings"]
    bias = bool(c["attention_bias"])
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size",
               "act": "swiglu_alpha", "eps": "rms_norm_eps", "rotary_base": "rope_parameters", "window": "sliding_window, layer_types",
               "experts": "num_local_experts", "top": "num_experts_per_tok", "router": "swiglu_limit; the router's bias",
               "sinks": "self_attn.sinks", "tied": "tie_word_embeddings"}
    return Arch("gpt_oss", vocab=c["vocab_size"], context=context, width=width, layers=layers, heads=heads, kv_heads=_kv(c, heads),
                head_dim=head_dim, hidden=_count(c, "intermediate_size"), act="swiglu_clamp", norm="rmsnorm", eps=_eps(c, "rms_norm_eps"),
                qkv_bias=bias, out_bias=bias, mlp_bias=True, rotary=1.0, rotary_base=_rope(c), rotary_scaling=_rope_scaling(c, context),
                window=window, layer_windows=per, experts=experts, top=top, normalize=True, sinks=True, router_bias=True, clamp=limit,
                tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources)


READERS = {"gpt_oss": _gpt_oss}


def _gpt_oss_config(a: Arch) -> dict:
    if not a.sinks or a.act != "swiglu_clamp" or not a.router_bias or not a.mlp_bias:
        raise Unsupported("sinks", "gpt-oss's attention has sinks, its experts the clamped SwiGLU with biases, its router a bias "
                          "(sinks, act=swiglu_clamp bias=true router_bias)")
    if a.shared or a.layer_dense or not a.normalize or a.router != "softmax" or a.groups > 1 or a.route_scale != 1.0 or a.correction:
        raise Unsupported("router", "gpt-oss routes every layer by the softmax of its top-k logits, without shared experts")
    if a.qkv_bias != a.out_bias or a.qk_norm != "none" or a.rotary != 1.0 or a.rotary_interleaved:
        raise Unsupported("bias", "gpt-oss's attention biases q, k, v and o alike (attention_bias), without qk-norm, rotating every dim by halves")
    windows = a.layer_windows or (a.window,) * a.layers
    local = {w for w in windows if w is not None}
    if len(local) > 1:
        raise Unsupported("window", f"gpt-oss has one sliding_window; the spec's layers have {sorted(local)}")
    rope = _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base})
    return {"model_type": "gpt_oss", "architectures": [CAUSAL_LM["gpt_oss"]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied,
            "hidden_size": a.width, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim, "intermediate_size": a.hidden, "max_position_embeddings": a.context, "rms_norm_eps": a.eps,
            "pad_token_id": a.padding, "attention_bias": a.qkv_bias, "attention_dropout": 0.0, "num_local_experts": a.experts,
            "num_experts_per_tok": a.top, "swiglu_alpha": _ALPHA, "swiglu_limit": a.clamp, "rope_parameters": rope,
            "sliding_window": local.pop() if local else None,
            "layer_types": ["sliding_attention" if w is not None else "full_attention" for w in windows]}


def config_of(a: Arch) -> dict:
    """The transformers config of an Arch of these families; export then checks that importing it gives back the engine."""
    return _gpt_oss_config(a)
