"""The families with attention sinks (turbine attention sinks), each read closed-world (closed.py) into an `Arch`.

What makes each one (transformers 5.24's modeling files):
- gpt_oss: Llama's block with q, k, v and o biased (attention_bias), a learned sink logit per head in every softmax
  (self_attn.sinks), layers alternating sliding (sliding_window) and global attention by layer_types (by default the even
  layers slide), YaRN rotary whose correction range is not rounded (truncate: false, the class's default), and in every
  layer gpt-oss's MoE: a router with a bias whose top num_experts_per_tok logits are softmaxed (the same weights as the
  softmax over every expert renormalised over the chosen), and biased experts of the clamped SwiGLU, the gate capped at
  swiglu_limit and up clamped to [-limit, limit], out = (up + 1) * gate * sigmoid(swiglu_alpha * gate), gate and up
  interleaved column by column in the fused gate_up_proj (_Interleaved, in the weight plan below). hidden_act is read by nothing.
- granite_swa: Granite's block (its four multipliers) with a learned sink per head (the eager path's
  o * sigmoid(logsumexp(s) - sink), the same function), sliding windows on the layers layer_types names (by default all
  but every fourth, i % 4 == 0), and a rotary base per layer (layer_rope_theta; 0: no rotary on that layer, NoPE).
- granitemoe_swa: the same attention in GraniteMoeShared's layer (its routed experts and optional shared expert).
- flint: Qwen3-MoE's attention (a per-head qk RMSNorm, attention_bias on q, k, v and o) with a sink per head, rotary on
  the sliding layers only (the full ones NoPE; by default layers 0, 1, every i % 4 == 1 and the last are full), and
  Qwen2-MoE's layers (dense MLPs on mlp_only_layers, by default [0, 1], and off decoder_sparse_step) whose router takes
  the top-k of each expert's sigmoid (renormalised by norm_topk_prob) beside an ungated shared expert.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..closed import Config, Keys, Unsupported, _show
from ..mapping import _Cat, _Index, _IndexT, _Plan, _parent
from .core import (_GATED_ACTS, _HF_GATED, _LLAMA, Arch, _count, _eps, _kv, _padding, _partial, _rope, _rope_config, _rope_scaling, _sliding,
                   _types, _windows)
from .dense import _per_layer
from .llama import _decoder, _decoder_config
from .routed import _ROUTED, _routed

_ALPHA = 1.702  # the language's swiglu_clamp: gate * sigmoid(1.702 * gate)

# gpt-oss's rope_parameters when config.json gives none (GptOssConfig.__post_init__), its rope_theta the class's default_theta
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}

KEYS: dict[str, Keys] = {
    "gpt_oss": Keys(_LLAMA | {"head_dim", "attention_bias", "num_local_experts", "num_experts_per_tok", "sliding_window", "layer_types",
                              "swiglu_alpha", "swiglu_limit"} - {"hidden_act"},
                    {"hidden_act": "gpt-oss's experts compute their own clamped SwiGLU (GptOssExperts._apply_gate); nothing reads hidden_act"}),
}

_GRANITE = _LLAMA | {"attention_bias", "mlp_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"}
_SWA = frozenset({"sliding_window", "layer_types", "layer_rope_theta"})
KEYS["granite_swa"] = Keys(_GRANITE | _SWA)
KEYS["granitemoe_swa"] = Keys(_LLAMA | {"attention_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                        "logits_scaling", "num_local_experts", "num_experts_per_tok", "shared_intermediate_size"} | _SWA)
KEYS["flint"] = Keys(_LLAMA | {"head_dim", "attention_bias", "sliding_window", "layer_types", "decoder_sparse_step", "mlp_only_layers",
                               "moe_intermediate_size", "norm_topk_prob", "num_experts", "num_experts_per_tok", "shared_expert_intermediate_size"})
_BASE = {"granite_swa": "granite", "granitemoe_swa": "granitemoeshared"}  # the block each reads as, then its sinks and windows

CAUSAL_LM = {"gpt_oss": "GptOssForCausalLM", "granite_swa": "GraniteSWAForCausalLM", "granitemoe_swa": "GraniteMoeSWAForCausalLM",
             "flint": "FlintForCausalLM"}


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


def _layer_ropes(c: Config, a: Arch, layers: int, windows: list) -> dict:
    """The Arch's per-layer attention fields for layer_rope_theta (each layer's rotary base; 0: NoPE) and these windows."""
    thetas = c["layer_rope_theta"]
    if thetas is None:  # __post_init__: rope_theta on every layer
        thetas = [a.rotary_base] * layers
    if not isinstance(thetas, list) or len(thetas) != layers or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf")
                                                                    for t in thetas):
        raise Unsupported("layer_rope_theta", f"a rotary base per layer ({layers}), each a number from 0 (0: no rotary on that layer)")
    per = [(w, 1.0 if t else 0.0, float(t) if t else 10000.0, a.rotary_scaling if t else None) for w, t in zip(windows, thetas)]
    if len({p[1:] for p in per}) > 1:
        first = per[0]
        return {"layer_attn": tuple(per), "window": first[0], "rotary": first[1], "rotary_base": first[2], "rotary_scaling": first[3]}
    if not per[0][1]:  # every layer NoPE
        return {"rotary": 0.0, "rotary_base": 10000.0, "rotary_scaling": None, **_windowed(windows)}
    return {"rotary_base": per[0][2], **_windowed(windows)}


def _windowed(windows: list) -> dict:
    return {"window": windows[0], "layer_windows": ()} if len(set(windows)) == 1 else {"window": None, "layer_windows": tuple(windows)}


def _granite_swa(c: Config) -> Arch:
    """Granite's (or GraniteMoeShared's) reader for the block, then the sinks, the windows and the rotary base per layer."""
    layers = c["num_hidden_layers"]
    family = c.family
    a = (_routed if _BASE[family] in _ROUTED else _decoder)(_BASE[family])(c)
    sw = _sliding(c)
    types = _types(c, layers, lambda: ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)])
    if "sliding_attention" in types and sw is None:
        raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
    windows = [sw if t == "sliding_attention" else None for t in types]
    sources = {**a.sources, "window": "sliding_window, layer_types", "rotary_base": "layer_rope_theta, rope_parameters", "sinks": "self_attn.sinks"}
    return replace(a, family=family, sinks=True, sources=sources, **_layer_ropes(c, a, layers, windows))


def _flint(c: Config) -> Arch:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    act = _GATED_ACTS.get(c["hidden_act"])
    if act is None:
        raise Unsupported("hidden_act", f"a gated MLP with {c['hidden_act']!r} has no counterpart (swiglu = silu, geglu = gelu)")
    head_dim = c["head_dim"]
    if head_dim is None:
        head_dim = width // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise Unsupported("head_dim", f"{_show(head_dim)} is not a head width")
    if _partial(c) != 1.0:
        raise Unsupported("rope_parameters.partial_rotary_factor", f"{_partial(c)}: Flint rotates every dim of its sliding layers' heads")
    sw = _sliding(c)
    types = _types(c, layers, lambda: ["full_attention" if i < 2 or i % 4 == 1 or i == layers - 1 else "sliding_attention" for i in range(layers)])
    if "sliding_attention" in types and sw is None:
        raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
    step, only = _count(c, "decoder_sparse_step"), c["mlp_only_layers"]
    only = [0, 1] if only is None else only  # __post_init__
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise Unsupported("mlp_only_layers", f"{_show(only)} is not a list of layer numbers")
    dense = tuple(i in set(only) or (i + 1) % step != 0 for i in range(layers))
    if all(dense):
        raise Unsupported("mlp_only_layers", "every layer is dense: Flint's model without experts is not a family the language exports")
    experts, top = _count(c, "num_experts"), _count(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    context = c["max_position_embeddings"]
    base, scaling = _rope(c), _rope_scaling(c, context)
    per = tuple((sw, 1.0, base, scaling) if t == "sliding_attention" else (None, 0.0, 10000.0, None) for t in types)
    first = per[0]
    ropes = {"layer_attn": per} if len({p[1:] for p in per}) > 1 else {"rotary_base": base, "rotary_scaling": scaling, **_windowed([p[0] for p in per])}
    if len({p[1:] for p in per}) > 1:
        ropes.update(window=first[0], rotary=first[1], rotary_base=first[2], rotary_scaling=first[3])
    elif not first[1]:
        ropes.update(rotary=0.0, rotary_base=10000.0, rotary_scaling=None)
    else:
        ropes.update(rotary=1.0)
    eps = _eps(c, "rms_norm_eps")
    bias = bool(c["attention_bias"])
    sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
               "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "moe_intermediate_size", "act": "hidden_act",
               "eps": "rms_norm_eps", "rotary_base": "rope_parameters", "window": "sliding_window, layer_types", "experts": "num_experts",
               "top": "num_experts_per_tok", "router": "norm_topk_prob; sigmoid scores", "sinks": "self_attn.sinks",
               "tied": "tie_word_embeddings", "dense_hidden": "intermediate_size, mlp_only_layers, decoder_sparse_step"}
    return Arch("flint", vocab=c["vocab_size"], context=context, width=width, layers=layers, heads=heads, kv_heads=_kv(c, heads),
                head_dim=head_dim, hidden=_count(c, "moe_intermediate_size"), act=act, norm="rmsnorm", eps=eps, qkv_bias=bias, out_bias=bias,
                qk_norm="head", qk_eps=eps, experts=experts, top=top, normalize=bool(c["norm_topk_prob"]),
                shared=_count(c, "shared_expert_intermediate_size"), router="sigmoid", sinks=True,
                layer_dense=dense if any(dense) else (), dense_hidden=_count(c, "intermediate_size") if any(dense) else 0,
                tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources, **ropes)


def _flint_config(a: Arch) -> dict:
    if not a.sinks or a.router != "sigmoid" or a.correction or a.groups > 1 or a.route_scale != 1.0 or a.router_bias:
        raise Unsupported("router", "Flint's attention has sinks, its router the top-k of each expert's sigmoid, unbiased and unscaled")
    if not a.shared or a.shared_gate or a.mlp_bias or a.qk_norm != "head" or a.qk_eps != a.eps or a.qkv_bias != a.out_bias:
        raise Unsupported("shared", "Flint's layers have an ungated, unbiased shared expert, a per-head qk-norm with the norms' eps, "
                          "attention_bias on q, k, v and o alike")
    act = _HF_GATED.get(a.act)
    if act is None:
        raise Unsupported("act", f"Flint's MLPs are swiglu or geglu, not {a.act}")
    per = _per_layer(a)
    if any((w is None) == bool(rot) for w, rot, _, _ in per):
        raise Unsupported("rotary", "Flint rotates its sliding layers (whole heads) and leaves its full layers without rotary")
    local = {w for w, *_ in per if w is not None}
    ropes = {(b, sc) for w, rot, b, sc in per if rot}
    if len(local) > 1 or len(ropes) > 1:
        raise Unsupported("window", "Flint has one sliding_window and one rope for its sliding layers")
    base, sc = ropes.pop() if ropes else (a.rotary_base, None)
    dense = a.layer_dense or (False,) * a.layers
    return {"model_type": "flint", "architectures": [CAUSAL_LM["flint"]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied,
            "hidden_size": a.width, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim, "hidden_act": act, "max_position_embeddings": a.context, "rms_norm_eps": a.eps,
            "pad_token_id": a.padding, "attention_bias": a.qkv_bias, "attention_dropout": 0.0,
            "intermediate_size": a.dense_hidden if a.layer_dense else a.hidden, "moe_intermediate_size": a.hidden, "num_experts": a.experts,
            "num_experts_per_tok": a.top, "norm_topk_prob": a.normalize, "shared_expert_intermediate_size": a.shared,
            "decoder_sparse_step": 1, "mlp_only_layers": [i for i, d in enumerate(dense) if d],
            "sliding_window": local.pop() if local else None, "layer_types": ["sliding_attention" if w is not None else "full_attention" for w, *_ in per],
            "rope_parameters": _rope_config(replace(a, rotary_scaling=sc), {"rope_type": "default", "rope_theta": base})}


READERS = {"gpt_oss": _gpt_oss, "granite_swa": _granite_swa, "granitemoe_swa": _granite_swa, "flint": _flint}


def _granite_swa_config(a: Arch) -> dict:
    if not a.sinks:
        raise Unsupported("sinks", f"{a.family}'s attention has a learned sink per head (sinks)")
    per = _per_layer(a)
    local = {w for w, *_ in per if w is not None}
    if len(local) > 1:
        raise Unsupported("window", f"{a.family} has one sliding_window; the spec's layers have {sorted(local)}")
    ropes = {(sc, rot) for _, rot, _, sc in per if rot}
    if len(ropes) > 1 or any(rot not in (0.0, 1.0) for _, rot, _, _ in per):
        raise Unsupported("rotary", f"{a.family}'s layers rotate whole heads by one rope_parameters (their own base, layer_rope_theta) or not at all")
    (sc, _), = ropes or {(None, 1.0)}
    base = next((b for _, rot, b, _ in per if rot), 10000.0)
    cfg = _decoder_config(replace(a, family=_BASE[a.family], sinks=False, window=None, layer_windows=(), layer_attn=(), rotary=1.0, rotary_base=base,
                        rotary_scaling=sc))
    return {**cfg, "model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "sliding_window": local.pop() if local else None,
            "layer_types": ["sliding_attention" if w is not None else "full_attention" for w, *_ in per],
            "layer_rope_theta": [b if rot else 0 for _, rot, b, _ in per]}


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
    if a.family in _BASE:
        return _granite_swa_config(a)
    if a.family == "flint":
        return _flint_config(a)
    return _gpt_oss_config(a)


# --- gpt-oss's weights: q, k, v, o biased, a sink per head, a biased router, the experts' fused tensors
# stored (in, out) with gate and up interleaved column by column, and biased ---------------------------------------


@dataclass(frozen=True)
class _Interleaved(_Index):
    """One expert's slice of gpt-oss's gate_up_proj (E, in, 2 x hidden) or its bias (E, 2 x hidden), whose gate and up
    alternate (gate the even columns, up the odd ones): ours is [gate | up] by rows, (2 x hidden, in) or (2 x hidden,)."""

    def __call__(self, t):
        import torch

        t = t[self.x].t() if t.dim() == 3 else t[self.x]
        return torch.cat((t[0::2], t[1::2]), dim=0)

    def inverse(self, t):
        import torch

        gate, up = t.chunk(2, dim=0)
        both = torch.stack((gate, up), dim=1).reshape(t.shape)  # rows gate_0, up_0, gate_1, ...
        return [both.t() if t.dim() == 2 else both]


def _plan_gpt_oss(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    for i, st in sorted(layout.items()):
        if st.attn is None or st.moe is None:
            plan.reasons[f"stages.{i}"] = f"stage {i}: a gpt-oss layer is attention then routed experts"
            continue
        a, m, h = st.attn_node, st.work_node, f"layers.{i}."
        put(f"{st.valves.get(st.attn, _parent(st.attn) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.moe, _parent(st.moe) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        qkv = _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim))
        for p in ("weight", "bias"):
            put(f"{st.attn}.qkv.{p}", [h + f"self_attn.{n}_proj.{p}" for n in "qkv"], qkv)
            put(f"{st.attn}.proj.{p}", h + f"self_attn.o_proj.{p}")
            put(f"{st.moe}.router.{p}", h + f"mlp.router.{p}")
        put(f"{st.attn}.sinks", h + "self_attn.sinks")
        e = h + "mlp.experts."
        for x in range(m.experts):
            ours = f"{st.moe}.experts.{x}"
            put(f"{ours}.fc.weight", e + "gate_up_proj", _Interleaved(x, m.experts))
            put(f"{ours}.fc.bias", e + "gate_up_proj_bias", _Interleaved(x, m.experts))
            put(f"{ours}.proj.weight", e + "down_proj", _IndexT(x, m.experts))
            put(f"{ours}.proj.bias", e + "down_proj_bias", _Index(x, m.experts))
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan
