"""The Llama-shaped decoders: rotary, a gated (or, for Arcee's kin, ungated) MLP, Pre-LN; their per-layer windows,
Gemma 3's rope per layer type, Nemotron's, Jais 2's and nanochat's norms, and HunYuan's dense and MoE decoders;
the config an Arch of these families (and of routed.py's) implies."""

from __future__ import annotations

import math
from dataclasses import replace

from ..closed import Config, Keys, Unsupported, fields_of
from .core import (CAUSAL_LM, KEYS, _GATED_ACTS, _HF_GATED, _HF_PLAIN, _LLAMA, _PLAIN_ACTS, _TP, Arch, _cap, _divides, _dynamic_context, _eps, _kv,
                   _max_positions, _padding, _partial, _rope, _rope_config, _rope_kind, _rope_scaling, _rotary, _sliding, _types, _whole, _windows)
from .routed import _ROUTED, _routed_config


_WINDOW_KEYS = frozenset({"layer_types", "max_window_layers", "use_sliding_window", "sliding_window"})
_MOE_KEYS = frozenset({"decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob", "num_experts", "num_experts_per_tok",
                       "qkv_bias", "shared_expert_intermediate_size"})
_DECODERS = {
    "llama": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}, _TP),
    "internlm3": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
    "iquestcoder": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
    "emu3_text_model": Keys(_LLAMA),  # Emu3's text decoder: a Llama without biases (class attributes, not config fields)
    "seed_oss": Keys(_LLAMA | {"head_dim", "attention_bias", "attention_out_bias", "mlp_bias"}, _TP),
    "mistral": Keys(_LLAMA | {"head_dim", "sliding_window"}),
    "ministral": Keys(_LLAMA | {"head_dim", "sliding_window", "layer_types"}),
    "ministral3": Keys(_LLAMA | {"head_dim", "sliding_window"}),
    "mixtral": Keys(_LLAMA | {"head_dim", "sliding_window", "num_local_experts", "num_experts_per_tok", "router_jitter_noise"}),
    "qwen2": Keys(_LLAMA | _WINDOW_KEYS),
    "qwen3": Keys(_LLAMA | _WINDOW_KEYS | {"head_dim", "attention_bias"}),
    "qwen2_moe": Keys(_LLAMA | _WINDOW_KEYS | _MOE_KEYS),
    "phi3": Keys(_LLAMA | {"original_max_position_embeddings", "sliding_window"}),
    "olmo": Keys(_LLAMA - {"rms_norm_eps"} | {"attention_bias", "clip_qkv"}),
    "olmo2": Keys(_LLAMA | {"attention_bias"}),
    "gemma": Keys(_LLAMA | {"head_dim", "attention_bias", "use_bidirectional_attention"},
                  {"hidden_activation": "Gemma's forward reads hidden_act; the hidden_activation some of its configs also write is ignored"}),
    "gemma2": Keys(_LLAMA - {"hidden_act"} | {"head_dim", "attention_bias", "use_bidirectional_attention", "hidden_activation",
                                               "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "layer_types",
                                               "sliding_window"},
                   {"hidden_act": "Gemma 2's forward reads hidden_activation; the hidden_act its released configs also write is ignored"}),
    "granite": Keys(_LLAMA | {"attention_bias", "mlp_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"}),
}
KEYS.update(_DECODERS)
_WINDOWED = ("mistral", "ministral3", "mixtral", "phi3")  # one sliding window for every layer
_LAYER_TYPES = ("qwen2", "qwen3", "qwen2_moe")  # use_sliding_window, from max_window_layers on: a per-layer pattern


def _layer_windows(c: Config, family: str, layers: int) -> tuple[int | None, tuple]:
    """The windows of the families that say them per layer, as each class's __post_init__ fills layer_types in:
    Qwen2 and Qwen3 from max_window_layers on, Qwen2-MoE every other layer below it, Ministral every layer."""
    if family == "ministral":
        sw = _sliding(c)
        types = _types(c, layers, lambda: ["sliding_attention" if sw is not None else "full_attention"] * layers)
        if "sliding_attention" in types and sw is None:
            raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
        return _windows(types, sw)
    on = c["use_sliding_window"]
    sw = _sliding(c) if on else None
    mwl = c["max_window_layers"]
    if family == "qwen2_moe":
        default = lambda: ["sliding_attention" if (i + 1) % 2 and i < mwl and on else "full_attention" for i in range(layers)]  # noqa: E731
    else:
        default = lambda: ["sliding_attention" if sw is not None and i >= mwl else "full_attention" for i in range(layers)]  # noqa: E731
    types = _types(c, layers, default)
    if "sliding_attention" in types and sw is None:
        raise Unsupported("use_sliding_window", "layer_types has sliding layers, but use_sliding_window is off (transformers gives them no window)")
    return _windows(types, sw)


def _decoder(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = _kv(c, heads)
        act_name = c["hidden_activation"] if family == "gemma2" else c["hidden_act"]
        if family == "gemma" and act_name == "gelu":  # GemmaConfig.__post_init__: Gemma's "gelu" is the tanh GELU
            act_name = "gelu_pytorch_tanh"
        act = (_PLAIN_ACTS if family in _UNGATED else _GATED_ACTS).get(act_name)
        if act is None and family in _UNGATED:
            raise Unsupported("hidden_act", f"{act_name!r} has no counterpart among the language's activations (an ungated MLP)")
        if act is None:
            raise Unsupported("hidden_activation" if family == "gemma2" else "hidden_act",
                              f"a gated MLP with {act_name!r} has no counterpart (the language has swiglu = silu, geglu = gelu, "
                              "geglu_tanh = the tanh GELU)")
        window = _sliding(c) if family in _WINDOWED else None
        windows: tuple = ()
        if family in _LAYER_TYPES or family == "ministral":  # local and global layers
            window, windows = _layer_windows(c, family, layers)
        if family == "olmo" and c["clip_qkv"] is not None:
            raise Unsupported("clip_qkv", "clamping q, k and v to a range is not in the language")
        if family in ("gemma", "gemma2") and c["use_bidirectional_attention"]:
            raise Unsupported("use_bidirectional_attention", "a bidirectional Gemma is an encoder, not a causal LM")
        if family == "internlm3" and bool(c["attention_bias"]) != bool(c["mlp_bias"]):
            raise Unsupported("mlp_bias", "transformers refuses an InternLM3 whose attention_bias and mlp_bias differ")
        if family == "mixtral" and c["router_jitter_noise"]:
            raise Unsupported("router_jitter_noise", "multiplicative noise on the router's input while training is not in the language")
        experts = top = shared = 0
        normalize = True
        hidden = c["intermediate_size"]
        if family == "mixtral":
            experts, top = c["num_local_experts"], c["num_experts_per_tok"]
        pattern: dict = {}  # a per-layer pattern of dense and routed layers
        if family == "qwen2_moe":
            step, only = c["decoder_sparse_step"], c["mlp_only_layers"]
            only = set(only or ())
            dense = tuple(i in only or not (c["num_experts"] > 0 and (i + 1) % step == 0) for i in range(layers))
            if all(dense):
                raise Unsupported("mlp_only_layers" if only else "decoder_sparse_step", "every layer is dense: write the checkpoint as a qwen2 (no experts)")
            if any(dense):
                pattern.update(layer_dense=dense, dense_hidden=c["intermediate_size"])
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
            shared, normalize = c["shared_expert_intermediate_size"], bool(c["norm_topk_prob"])
        if experts and not 1 <= top <= experts:
            raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
        attention_bias = bool(c["attention_bias"]) if "attention_bias" in c.keys.maps else False
        qkv_bias = True if family == "qwen2" else bool(c["qkv_bias"]) if family == "qwen2_moe" else attention_bias
        out_bias = bool(c["attention_out_bias"]) if family == "seed_oss" else False if family in ("qwen2", "qwen2_moe") else attention_bias
        mlp_bias = bool(c["mlp_bias"]) if "mlp_bias" in c.keys.maps else False
        head_dim = (c["head_dim"] if "head_dim" in c.keys.maps else None) or width // heads
        if "head_dim" not in c.keys.maps or not c["head_dim"]:
            _divides(width, heads, "num_attention_heads", "hidden_size")
        sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size",
                   "act": "hidden_act", "eps": "rms_norm_eps", "rotary_base": "rope_theta", "window": "sliding_window",
                   "experts": "num_local_experts", "top": "num_experts_per_tok", "tied": "tie_word_embeddings"}
        extra: dict = dict(pattern)
        if windows:
            if pattern:
                raise Unsupported("layer_types", "sliding and global layers together with dense and routed ones: two per-layer patterns at once are not mapped")
            extra["layer_windows"] = windows
        if family == "olmo":
            extra.update(norm="layernorm", eps=1e-5, norm_affine=False, norm_bias=False)
            sources["eps"] = "OLMo's fixed 1e-5, no weight or bias"
        else:
            extra.update(norm="rmsnorm", eps=_eps(c, "rms_norm_eps"))
        if family == "olmo2":
            extra.update(post_norms=True, qk_norm="all", qk_eps=_eps(c, "rms_norm_eps"))
        if family == "qwen3":
            extra.update(qk_norm="head", qk_eps=_eps(c, "rms_norm_eps"))
        if family == "gemma":
            extra.update(norm_offset=1.0, embed_scale=float(width) ** 0.5)
            sources["embed_scale"] = "Gemma's sqrt(hidden_size)"
        if family == "gemma2":
            sw = _sliding(c)
            types = _types(c, layers, lambda: ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)])
            if sw is None:  # Gemma2Model builds the sliding mask whatever layer_types say
                raise Unsupported("sliding_window", "null: transformers' Gemma 2 cannot build its sliding-window mask without one "
                                  "(a model with only global layers still names a window)")
            window, extra["layer_windows"] = _windows(types, sw)
            if not extra["layer_windows"]:
                del extra["layer_windows"]
            scalar = c["query_pre_attn_scalar"]
            if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or not scalar > 0:
                raise Unsupported("query_pre_attn_scalar", f"{scalar!r} is not a positive number")
            extra.update(norm_offset=1.0, embed_scale=float(width) ** 0.5, sandwich=True, attn_scale=float(scalar) ** -0.5,
                         softcap=_cap(c, "attn_logit_softcapping"), logit_softcap=_cap(c, "final_logit_softcapping"))
            sources.update(embed_scale="Gemma's sqrt(hidden_size)", attn_scale="query_pre_attn_scalar", softcap="attn_logit_softcapping",
                           logit_softcap="final_logit_softcapping", window="sliding_window, layer_types", act="hidden_activation")
        if family == "granite":
            for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
                if not c[k]:
                    raise Unsupported(k, f"{c[k]!r}: Granite's multipliers are non-zero numbers")
            extra.update(embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                         attn_scale=float(c["attention_multiplier"]), logit_scale=1.0 / float(c["logits_scaling"]))
            sources.update(embed_scale="embedding_multiplier", residual_scale="residual_multiplier", attn_scale="attention_multiplier",
                           logit_scale="logits_scaling")
        context = c["max_position_embeddings"]
        scaling = _rope_scaling(c, context)
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, scaling), width=width, layers=layers,
                    heads=heads, kv_heads=kv, head_dim=head_dim, hidden=hidden, act=act, **extra,
                    qkv_bias=qkv_bias, out_bias=out_bias, mlp_bias=mlp_bias, rotary=_rotary(_whole_heads(c, family), head_dim), rotary_base=_rope(c),
                    rotary_scaling=scaling,
                    window=window, experts=experts, top=top, normalize=normalize, shared=shared, shared_gate=bool(shared),
                    tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources)
    return read


# The Llama-shaped families whose rope reads partial_rotary_factor; the others' default rope turns whole heads
# whatever it says (and a scaled rope then fails on a factor), so a factor other than 1 is refused for them.
_PARTIAL_READ = ("phi3", "nemotron")


def _whole_heads(c: Config, family: str) -> float:
    """The rotary fraction of a Llama-shaped family: the config's where its rope reads it, else 1 (any other value refused)."""
    partial = _partial(c)
    if family not in _PARTIAL_READ and partial != 1.0:
        raise Unsupported(f"{_rope_kind(c)[1]}.partial_rotary_factor", f"{partial}: transformers' {family} rotates whole heads whatever this "
                          "says (its default rope reads no partial factor; a scaled one fails on it)")
    return partial

# --- squared ReLU, the qk-norm's shapes, per-layer rotary bases ---------------------------------

# Llama's layer with an ungated MLP (up, act, down): Arcee's relu2.
_UNGATED = ("arcee", "nemotron", "jais2", "nanochat")
_DECODERS_UNGATED = {
    "arcee": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
}
# Nemotron: Arcee's layer with (1 + w) LayerNorms (LayerNorm1P, biased) and partial rotary (half of each head by default).
# Jais 2: Arcee's layer with biased LayerNorms (eps layer_norm_eps).
KEYS["jais2"] = Keys(_LLAMA - {"rms_norm_eps"} | {"layer_norm_eps", "head_dim", "attention_bias", "mlp_bias"})
# nanochat: weightless RMSNorms (one more right after the embedding: the final norm, used twice), weightless qk RMSNorms
# after rotary, a relu2 MLP without biases, a final-logit soft-cap; its rotary turns the other way (the load plan's _Turned).
KEYS["nanochat"] = Keys(_LLAMA | {"attention_bias", "final_logit_softcapping"})
KEYS["nemotron"] = Keys(_LLAMA - {"rms_norm_eps"} | {"norm_eps", "head_dim", "attention_bias", "mlp_bias"})
KEYS.update(_DECODERS_UNGATED)

# Gemma 3 (text): Gemma 2's layer with (1 + w) qk RMSNorms, a layer pattern of one global layer in six, and
# rope parameters per layer type (sliding layers: rope_local_base_freq's 10000 by default; global: 1e6).
KEYS["gemma3_text"] = Keys(_DECODERS["gemma2"].maps - {"attn_logit_softcapping"},
                           {"hidden_act": "Gemma 3's forward reads hidden_activation; a hidden_act its configs also write is ignored",
                            "attn_logit_softcapping": "Gemma 3's attention keeps it but never hands it to the attention function: "
                                                      "its scores are not soft-capped",
                            "_sliding_window_pattern": "the copy of sliding_window_pattern to_dict writes; __post_init__ reads only "
                                                       "sliding_window_pattern (and only where layer_types is absent)"},
                           {"rope_local_base_freq": "rope_parameters.sliding_attention.rope_theta", "sliding_window_pattern": "layer_types"})
_GEMMA3_THETA = {"full_attention": ("rope_theta", 1_000_000.0), "sliding_attention": ("rope_local_base_freq", 10_000.0)}


class _View:
    """A family's config seen by another family's reader: its own layer types and one layer type's rope parameters."""

    def __init__(self, c: Config, rope: dict | None = None, where: str = "", types: list | None = None, renamed: dict | None = None,
                 fixed: dict | None = None):
        self._c, self._rope, self._where, self._types, self._renamed = c, rope, where, types, renamed or {}
        self._fixed = fixed or {}  # keys the other reader reads that this family's forward never reads: their value in effect
        self.keys, self.raw, self.family = c.keys, c.raw, c.family

    def __getitem__(self, key: str):
        if key == "layer_types" and self._types is not None:
            return self._types
        if key in self._fixed:
            return self._fixed[key]
        return self._c[self._renamed.get(key, key)]

    def __contains__(self, key: str) -> bool:
        return key in self._c.raw

    def given(self, key: str) -> bool:
        return self._c.given(key)

    def rope(self) -> tuple[dict, str]:
        return (self._rope, self._where) if self._rope is not None else self._c.rope()


def _gemma3_ropes(c: Config) -> dict:
    """Each layer type's rope parameters, as Gemma3TextConfig.convert_rope_params_to_dict fills them in."""
    from ..closed import ROPE_KEYS

    rope = c["rope_parameters"]
    rope = {"sliding_attention": None, "full_attention": None} if rope is None else rope
    if not isinstance(rope, dict) or set(rope) - set(_GEMMA3_THETA):
        raise Unsupported("rope_parameters", "Gemma 3's rope parameters are one object per layer type (sliding_attention, full_attention)")
    old = c.raw.get("rope_scaling")
    out = {}
    for kind, (theta_key, theta) in _GEMMA3_THETA.items():
        where = f"rope_parameters.{kind}"
        p = rope.get(kind)
        if p is not None and not isinstance(p, dict):
            raise Unsupported(where, "is not an object")
        p = dict(p or {"rope_type": "default"})
        if kind == "full_attention" and old:  # rope_scaling: the global layers' (transformers' own conversion)
            if not isinstance(old, dict):
                raise Unsupported("rope_scaling", "is not an object")
            p.update(old)
        p.setdefault("rope_theta", c.raw.get(theta_key, theta))
        p.setdefault("rope_type", p.get("type", "default"))
        for k, v in p.items():
            if k not in ROPE_KEYS:
                raise Unsupported(f"{where}.{k}", "not a rope parameter the importer knows: it cannot tell whether it changes the function")
            if k in ("rope_theta", "factor", "partial_rotary_factor") and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                                          or not math.isfinite(v) or not v > 0):
                raise Unsupported(f"{where}.{k}", f"{v!r} is not a positive number")
        if p.get("partial_rotary_factor", 1.0) != 1.0:
            raise Unsupported(f"{where}.partial_rotary_factor", "Gemma 3's rotary turns every dim of a head (its default rope reads no partial factor)")
        if p["rope_type"] == "dynamic":
            raise Unsupported(f"{where}.rope_type", "dynamic NTK on one layer type of two is not mapped")
        out[kind] = (p, where)
    return out


def _gemma3(c: Config) -> Arch:
    """Gemma 2's reader over Gemma 3's config, then its own: (1 + w) qk-norms, each layer type's rotary."""
    layers = c["num_hidden_layers"]
    types = c["layer_types"]
    if types is None:  # __post_init__: every sliding_window_pattern-th layer global (6; older configs say it)
        pattern = c.raw.get("sliding_window_pattern", 6)
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise Unsupported("sliding_window_pattern", f"{pattern!r}: a pattern is a whole number of layers from 1")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    ropes = _gemma3_ropes(c)
    full = _View(c, *ropes["full_attention"], types, fixed={"attn_logit_softcapping": None})
    a = _decoder("gemma2")(full)
    eps = _eps(c, "rms_norm_eps")
    local = _View(c, *ropes["sliding_attention"], types)
    context = c["max_position_embeddings"]
    lb, ls = _rope(local), _rope_scaling(local, context)
    rotary: dict = {}
    if a.layer_windows:
        if (lb, ls) != (a.rotary_base, a.rotary_scaling):
            rotary["local_rotary"] = (lb, ls)
    elif a.window is not None:  # every layer slides: the sliding layers' rotary everywhere
        rotary.update(rotary_base=lb, rotary_scaling=ls)
    sources = {**a.sources, "rotary_base": "rope_parameters (per layer type)", "act": "hidden_activation"}
    return replace(a, family="gemma3_text", qk_norm="head", qk_eps=eps, qk_offset=1.0, sources=sources, **rotary)


def _jais2(c: Config) -> Arch:
    """Llama's reader with an ungated MLP, then Jais 2's norms: LayerNorms with a bias, eps layer_norm_eps."""
    a = _decoder("jais2")(_View(c, renamed={"rms_norm_eps": "layer_norm_eps"}))
    return replace(a, norm="layernorm", norm_bias=True, eps=_eps(c, "layer_norm_eps"), sources={**a.sources, "eps": "layer_norm_eps"})


def _nanochat(c: Config) -> Arch:
    """Llama's reader with an ungated MLP, then nanochat's weightless norms and qk-norms, its norm after the embedding, its soft-cap."""
    a = _decoder("nanochat")(c)
    return replace(a, norm_affine=False, qk_norm="head", qk_eps=a.eps, qk_affine=False, qk_late=True, embed_norm=True,
                   logit_softcap=_cap(c, "final_logit_softcapping"), sources={**a.sources, "logit_softcap": "final_logit_softcapping"})


def _nemotron(c: Config) -> Arch:
    """Llama's reader with an ungated MLP, then Nemotron's norms: LayerNorm1P, gain 1 + w, a bias, eps norm_eps."""
    a = _decoder("nemotron")(_View(c, renamed={"rms_norm_eps": "norm_eps"}))
    return replace(a, norm="layernorm", norm_bias=True, norm_offset=1.0, eps=_eps(c, "norm_eps"),
                   sources={**a.sources, "eps": "norm_eps", "rotary": "partial_rotary_factor"})


# HunYuan's dense and MoE decoders (HunYuanDenseV1, HunYuanMoEV1): Llama's layer, its per-head qk RMSNorms (query_layernorm,
# key_layernorm, eps rms_norm_eps) acting on the rotated q and k; the MoE's layer a softmax top-k router (renormalised)
# and its fused experts beside one summed, ungated gated MLP (shared_mlp), all intermediate_size wide.
_HUNYUAN_KEYS = _LLAMA | {"head_dim", "attention_bias"}
_HUNYUAN_INERT = {**_TP, "eod_token_id": "a tokenizer's end-of-document token; the forward does not read it"}
KEYS["hunyuan_v1_dense"] = Keys(_HUNYUAN_KEYS, _HUNYUAN_INERT)
KEYS["hunyuan_v1_moe"] = Keys(_HUNYUAN_KEYS | {"num_experts", "moe_topk"}, _HUNYUAN_INERT)


def _hunyuan_rope(c: Config) -> dict | None:
    """HunYuan's rope read as its rotary embedding reads it: rope_type dynamic with an alpha is no dynamic NTK but a fixed base,
    rope_theta * alpha ** (head_dim / (head_dim - 2)) (ntk_alpha); None where the rope is read as Llama's."""
    rope, where = c.rope()
    alpha = rope.get("alpha")
    if rope.get("rope_type") != "dynamic" or not alpha:
        return None
    dim = c["head_dim"]
    if not dim:
        raise Unsupported(f"{where}.alpha", "with head_dim null: transformers' ntk_alpha rotary reads config.head_dim and fails without one")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 or dim < 4:
        raise Unsupported(f"{where}.alpha", f"{alpha!r} with head_dim {dim}: a positive number, on heads of 4 dims or more")
    base = float(rope["rope_theta"]) * float(alpha) ** (dim / (dim - 2))
    return {"rope_type": "default", "rope_theta": base}


def _hunyuan_count(c: Config, key: str, layers: int) -> int:
    """num_experts or moe_topk: a number, or one per layer (read here when every layer's is the same)."""
    v = c[key]
    if isinstance(v, list):
        if len(v) != layers or len(set(v)) != 1:
            raise Unsupported(key, f"{v!r}: a different count per layer is not mapped (one number, or the same one per layer, {layers})")
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise Unsupported(key, f"{v!r} is not a count from 1")
    return v


def _hunyuan(family: str):
    def read(c: Config) -> Arch:
        rope = _hunyuan_rope(c)
        a = _decoder(family)(_View(c, rope, c.rope()[1]) if rope is not None else c)
        qk = dict(qk_norm="head", qk_eps=a.eps, qk_late=True)
        if rope is not None:
            a = replace(a, rotary_base=rope["rope_theta"], sources={**a.sources, "rotary_base": "rope_theta * alpha ** (head_dim / (head_dim - 2))"})
        if family == "hunyuan_v1_dense":
            return replace(a, **qk)
        if not c["head_dim"]:
            raise Unsupported("head_dim", f"{c['head_dim']!r}: transformers' HunYuan MoE attention reads config.head_dim as it is and fails "
                              "without one")
        layers = c["num_hidden_layers"]
        experts, top = _hunyuan_count(c, "num_experts", layers), _hunyuan_count(c, "moe_topk", layers)
        if top > experts:
            raise Unsupported("moe_topk", f"top-{top} of {experts} experts")
        return replace(a, **qk, experts=experts, top=top, normalize=True, shared=a.hidden, shared_gate=False,
                       sources={**a.sources, "experts": "num_experts", "top": "moe_topk"})
    return read


def _hunyuan_config(a: Arch, cfg: dict) -> dict:
    """HunYuan's config over Llama's: its qk-norms per-head RMSNorms after rotary with the norms' eps; the MoE's experts and shared MLP
    as wide as intermediate_size, the router's top-k renormalised, the shared MLP summed."""
    if (a.qk_norm, a.qk_type, a.qk_offset, a.qk_affine, a.qk_late, a.qk_heads, a.qk_eps) != ("head", "rmsnorm", 0.0, True, True, False, a.eps):
        raise Unsupported("qk_norm", f"{a.family}'s qk-norms are per-head RMSNorms after rotary, with the norms' eps")
    cfg.update(attention_bias=a.qkv_bias)
    if a.family == "hunyuan_v1_moe":
        if a.shared != a.hidden or a.shared_gate or not a.normalize or a.layer_dense:
            raise Unsupported("shared", "HunYuan MoE's layers each route top-k renormalised experts beside one ungated shared MLP, both "
                              "intermediate_size wide")
        cfg.update(num_experts=a.experts, moe_topk=a.top)
    return cfg


_HUNYUAN = ("hunyuan_v1_dense", "hunyuan_v1_moe")


# --- the config an Arch implies (export) ----------------------------------------------------------


def _decoder_config(a: Arch) -> dict:
    """The transformers config of an Arch of a Llama-shaped family (config_of's families without a writer of their own)."""
    if a.family == "emu3_text_model":  # export falls back to llama: the same function, and a folder AutoModelForCausalLM loads
        raise Unsupported("model_type", "AutoModelForCausalLM does not load an emu3_text_model folder back (transformers maps no "
                          "causal LM to Emu3TextConfig); the same model exports as llama")
    act = (_HF_PLAIN if a.family in _UNGATED else _HF_GATED).get(a.act)
    if act is None and a.family in _UNGATED:
        raise Unsupported("act", f"{a.family}'s ungated MLP has no '{a.act}' activation")
    if act is None:
        raise Unsupported("act", f"{a.family}'s gated MLP has no '{a.act}' form (swiglu, geglu or geglu_tanh)")
    rope = {"rope_type": "default", "rope_theta": a.rotary_base}
    if a.rotary not in (0.0, 1.0):
        rope["partial_rotary_factor"] = a.rotary
    cfg = {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "hidden_size": a.width,
           "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "hidden_act": act,
           "max_position_embeddings": _max_positions(a),
           "tie_word_embeddings": a.tied, "rope_parameters": _rope_config(a, rope),
           "pad_token_id": a.padding}
    if "rms_norm_eps" in fields_of(a.family):
        cfg["rms_norm_eps"] = a.eps if a.norm == "rmsnorm" else a.qk_eps
    if "head_dim" in fields_of(a.family):
        cfg["head_dim"] = a.head_dim
    elif a.head_dim * a.heads != a.width and a.family != "qwen3_moe":  # Qwen3-MoE's attention reads a head_dim its class lacks
        raise Unsupported("head_dim", f"{a.family}'s head_dim is hidden_size / num_attention_heads")
    if a.family in ("llama", "granite", "qwen3", "olmo", "olmo2", "gemma", "internlm3", "iquestcoder", "arcee", "nemotron", "jais2"):
        cfg["attention_bias"] = a.qkv_bias
    if a.family in ("llama", "granite", "internlm3", "iquestcoder", "arcee", "nemotron", "jais2"):
        cfg["mlp_bias"] = a.mlp_bias
    if a.family == "jais2":
        cfg["layer_norm_eps"] = a.eps
    if a.family == "nanochat":
        cfg.update(attention_bias=a.qkv_bias, final_logit_softcapping=a.logit_softcap)
    if a.family == "nemotron":  # its eps is norm_eps; partial rotary always written (an absent factor is Nemotron's 0.5)
        cfg.update(norm_eps=a.eps, rope_parameters={**cfg["rope_parameters"], "partial_rotary_factor": a.rotary})
    if a.family in _WINDOWED:
        cfg["sliding_window"] = a.window
    if a.family == "ministral3":  # its rotary reads Llama 4's query scaling: none (beta 0) at the rope's original context
        cfg["rope_parameters"] = {"llama_4_scaling_beta": 0.0, **cfg["rope_parameters"]}  # rotary_temperature=, else none
        cfg["rope_parameters"].setdefault("original_max_position_embeddings", _max_positions(a))
    if a.family == "ministral":
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"Ministral has one sliding_window; the spec's layers have {sorted(local)}")
        cfg.update(sliding_window=local.pop() if local else None,
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])
    if a.family == "seed_oss":
        cfg.update(attention_bias=a.qkv_bias, attention_out_bias=a.out_bias, mlp_bias=a.mlp_bias, residual_dropout=0.0, attention_dropout=0.0)
    if a.family == "mixtral":
        cfg.update(num_local_experts=a.experts, num_experts_per_tok=a.top, router_jitter_noise=0.0)
    if a.family == "qwen2_moe":
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, moe_intermediate_size=a.hidden,
                   intermediate_size=a.dense_hidden if a.layer_dense else a.hidden,
                   shared_expert_intermediate_size=a.shared, norm_topk_prob=a.normalize, decoder_sparse_step=1,
                   mlp_only_layers=[i for i, d in enumerate(a.layer_dense) if d],
                   qkv_bias=a.qkv_bias)
    if a.family in _LAYER_TYPES:
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"{a.family} has one sliding_window; the spec's layers have {sorted(local)}")
        cfg.update(use_sliding_window=bool(local), sliding_window=local.pop() if local else None,
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])
        if cfg["use_sliding_window"]:
            cfg["max_window_layers"] = next(i for i, w in enumerate(windows) if w is not None)
    if a.family in ("gemma2", "gemma3_text"):
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"Gemma 2 has one sliding_window; the spec's layers have {sorted(local)}")
        del cfg["hidden_act"]
        cfg.update(hidden_activation=act, attention_bias=a.qkv_bias, sliding_window=local.pop() if local else a.context,  # transformers wants one even when no layer slides
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows],
                   query_pre_attn_scalar=_whole((a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5) ** -2),
                   attn_logit_softcapping=a.softcap, final_logit_softcapping=a.logit_softcap)
    if a.family == "gemma3_text":
        _gemma3_config(a, cfg)
    if a.family == "granite":
        cfg.update(embedding_multiplier=a.embed_scale, residual_multiplier=a.residual_scale,
                   attention_multiplier=a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5,
                   logits_scaling=1.0 / a.logit_scale)
    if a.family in _ROUTED:
        cfg = _routed_config(a, cfg)
    if a.family in _HUNYUAN:
        cfg = _hunyuan_config(a, cfg)
    return cfg


def _gemma3_config(a: Arch, cfg: dict) -> None:
    """Gemma 3's config over Gemma 2's: each layer type's rope parameters; its qk-norms are (1 + w) RMSNorms with the norms' eps."""
    if a.qk_norm != "head" or a.qk_offset != 1.0 or a.qk_eps != a.eps or a.qk_type != "rmsnorm" or not a.qk_affine or a.qk_late:
        raise Unsupported("qk_norm", "Gemma 3's qk-norms are per-head (1 + w) RMSNorms with the norms' eps, before rotary")
    windows = a.layer_windows or (a.window,) * a.layers
    full = _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base})
    base, scaling = a.local_rotary or (a.rotary_base, a.rotary_scaling)
    local = _rope_config(replace(a, rotary_scaling=scaling), {"rope_type": "default", "rope_theta": base})
    if all(w is not None for w in windows):  # every layer slides: the spec's rotary is the sliding layers'
        full = local
    cfg.update(rope_parameters={"full_attention": full, "sliding_attention": local}, use_bidirectional_attention=False)
