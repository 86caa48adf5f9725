"""Llama-shaped decoders with routed experts (issue 33): Qwen3-MoE, OLMoE, FlexOlmo, GraniteMoE(-Shared), Aria's text
model, ...: their readers and the configs their Archs imply."""

from __future__ import annotations

import math

from ..closed import Config, Keys, Unsupported
from .core import (KEYS, _GATED_ACTS, _LLAMA, _TP, Arch, _count, _divides, _dynamic_context, _eps, _kv, _padding, _partial, _rope, _rope_scaling, _rotary,
                   _sliding, _top_ok, _types, _windows)

# --- Llama-shaped decoders with routed experts (issue 33): Qwen3-MoE, OLMoE, FlexOlmo, GraniteMoE(-Shared), Aria's text model ---
# Every one routes by softmax then top-k; GraniteMoE and Aria take the top-k logits first and softmax those, which is the
# same function as renormalising the top-k of the softmax (normalize=true). What distinguishes each:
#   qwen3_moe: qk RMSNorm per head, norm_topk_prob, dense layers (mlp_only_layers, decoder_sparse_step), one window for all layers
#   olmoe: qk RMSNorm across the heads, norm_topk_prob; flex_olmo: OLMo-2's norms after each turbine and its qk-norm across heads
#   granitemoe: Granite's four multipliers; granitemoeshared: ... and an ungated shared expert beside the routed ones
#   aria_text: a shared expert moe_num_shared_experts x intermediate_size wide; routed experts always silu-gated
_ROUTER = "the router's top-k renormalised softmax (a softmax over the top-k logits): the same function"
_ROUTED = {
    "qwen3_moe": Keys(_LLAMA | {"head_dim", "attention_bias", "use_sliding_window", "sliding_window", "decoder_sparse_step", "mlp_only_layers",
                                "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob", "max_window_layers"}),
    "olmoe": Keys(_LLAMA | {"attention_bias", "clip_qkv", "num_experts", "num_experts_per_tok", "norm_topk_prob"}),
    "flex_olmo": Keys(_LLAMA | {"attention_bias", "num_experts", "num_experts_per_tok", "norm_topk_prob"}),
    "granitemoe": Keys(_LLAMA | {"attention_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
                                 "num_local_experts", "num_experts_per_tok"}),
    "granitemoeshared": Keys(_LLAMA | {"attention_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
                                       "num_local_experts", "num_experts_per_tok", "shared_intermediate_size"}),
    "aria_text": Keys(_LLAMA | {"attention_bias", "mlp_bias", "head_dim", "moe_num_experts", "moe_topk", "moe_num_shared_experts"}, _TP),
    "mellum": Keys(_LLAMA | {"head_dim", "attention_bias", "sliding_window", "layer_types", "mlp_layer_types", "moe_intermediate_size", "num_experts",
                             "num_experts_per_tok", "norm_topk_prob"},
                   {k: "multi-token prediction layers: transformers' MellumForCausalLM does not build them (it ignores their weights on load)"
                    for k in ("num_mtp_layers", "mtp_layer_types", "mtp_mlp_layer_types")}),
}
KEYS.update(_ROUTED)


def _routed(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = _kv(c, heads)
        act_name = c["hidden_act"]
        act = _GATED_ACTS.get(act_name)
        if act is None:
            raise Unsupported("hidden_act", f"a gated MLP with {act_name!r} has no counterpart (the language has swiglu = silu, geglu = gelu, "
                              "geglu_tanh = the tanh GELU)")
        sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "moe_intermediate_size", "act": "hidden_act",
                   "eps": "rms_norm_eps", "rotary_base": "rope_theta", "window": "sliding_window", "experts": "num_experts",
                   "top": "num_experts_per_tok", "tied": "tie_word_embeddings"}
        extra: dict = {}
        head_dim = width // heads
        bias = bool(c["attention_bias"])
        shared, normalize, window = 0, True, None
        if family == "qwen3_moe":
            if c.given("head_dim"):  # not a field of Qwen3MoeConfig, but its attention reads it where config.json writes it
                head_dim = c["head_dim"]
                if head_dim is None:
                    raise Unsupported("head_dim", "null: Qwen3-MoE's attention reads head_dim wherever config.json writes it, and cannot use null")
            else:
                _divides(width, heads, "num_attention_heads", "hidden_size")
            if c["use_sliding_window"]:  # every layer's window (Qwen3MoeConfig has no max_window_layers or layer_types)
                window = _sliding(c)
            # not a field of Qwen3MoeConfig, but its released configs write it: transformers 5 reads nothing of it; transformers 4
            # gave the window only to the layers from it on. Without a window (or from layer 0) both compute the same.
            mwl = c["max_window_layers"]
            if mwl is not None and (isinstance(mwl, bool) or not isinstance(mwl, int)):
                raise Unsupported("max_window_layers", f"{mwl!r} is not a layer number")
            if window is not None and mwl:
                raise Unsupported("max_window_layers", f"{mwl}: transformers 5 gives every layer of a Qwen3-MoE the window and ignores this, "
                                  "transformers 4 gave it to the layers from max_window_layers on: which one the checkpoint was trained "
                                  "with is not known")
            step, only = _count(c, "decoder_sparse_step"), c["mlp_only_layers"]
            if only is not None and (not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only)):
                raise Unsupported("mlp_only_layers", f"{only!r} is not a list of layer numbers")
            dense = tuple(i in set(only or ()) or (i + 1) % step != 0 for i in range(layers))
            if all(dense):
                raise Unsupported("mlp_only_layers" if only else "decoder_sparse_step", "every layer is dense: write the checkpoint as a qwen3 (no experts)")
            if any(dense):
                extra.update(layer_dense=dense, dense_hidden=c["intermediate_size"])
                sources["dense_hidden"] = "intermediate_size"
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
            normalize = bool(c["norm_topk_prob"])
            extra.update(qk_norm="head", qk_eps=_eps(c, "rms_norm_eps"))
        elif family in ("olmoe", "flex_olmo"):
            _divides(width, heads, "num_attention_heads", "hidden_size")
            if family == "olmoe" and c["clip_qkv"] is not None:
                raise Unsupported("clip_qkv", "clamping q, k and v to a range is not in the language")
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["intermediate_size"]
            normalize = bool(c["norm_topk_prob"])
            extra.update(qk_norm="all", qk_eps=_eps(c, "rms_norm_eps"), post_norms=family == "flex_olmo")
            sources["hidden"] = "intermediate_size"
        elif family in ("granitemoe", "granitemoeshared"):
            _divides(width, heads, "num_attention_heads", "hidden_size")
            experts, top, hidden = _count(c, "num_local_experts"), _count(c, "num_experts_per_tok"), c["intermediate_size"]
            for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
                if isinstance(c[k], bool) or not isinstance(c[k], (int, float)) or not c[k]:
                    raise Unsupported(k, f"{c[k]!r}: Granite's multipliers are non-zero numbers")
            extra.update(embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                         attn_scale=float(c["attention_multiplier"]), logit_scale=1.0 / float(c["logits_scaling"]))
            sources.update(hidden="intermediate_size", experts="num_local_experts", embed_scale="embedding_multiplier",
                           residual_scale="residual_multiplier", attn_scale="attention_multiplier", logit_scale="logits_scaling")
            if family == "granitemoeshared":
                shared = _count(c, "shared_intermediate_size", 0)  # 0: no shared expert
        elif family == "mellum":
            head_dim = c["head_dim"]
            window, windows, rope = _mellum_layers(c, layers)
            if windows:
                extra["layer_windows"] = windows
            kinds = c["mlp_layer_types"]
            kinds = ["sparse"] * layers if kinds is None else kinds
            if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("dense", "sparse") for k in kinds):
                raise Unsupported("mlp_layer_types", f"mlp_layer_types are dense or sparse, one per layer ({layers})")
            dense = tuple(k == "dense" for k in kinds)
            if all(dense):
                raise Unsupported("mlp_layer_types", "every layer is dense: no experts to route")
            if any(dense):
                if windows:
                    raise Unsupported("mlp_layer_types", "sliding and global layers together with dense and routed ones: two per-layer "
                                      "patterns at once are not mapped")
                extra.update(layer_dense=dense, dense_hidden=c["intermediate_size"])
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
            normalize = bool(c["norm_topk_prob"])
            extra.update(qk_norm="head", qk_eps=_eps(c, "rms_norm_eps"))
            sources.update(window="sliding_window, layer_types", rotary_base="rope_parameters")
            context = c["max_position_embeddings"]
            return Arch(family, vocab=c["vocab_size"], context=context, width=width, layers=layers, heads=heads, kv_heads=kv,
                        head_dim=head_dim, hidden=hidden, act=act, norm="rmsnorm", eps=_eps(c, "rms_norm_eps"), qkv_bias=bias, out_bias=bias,
                        rotary=1.0, rotary_base=rope["rope_theta"], window=window,
                        experts=_top_ok(top, experts, "num_experts_per_tok"), top=top, normalize=normalize, tied=bool(c["tie_word_embeddings"]),
                        padding=_padding(c), sources=sources, **extra)
        else:  # aria_text
            _divides(width, heads, "num_attention_heads", "hidden_size")  # AriaTextConfig.validate_architecture refuses the rest
            head_dim = c["head_dim"] or head_dim
            if act_name not in ("silu", "swish"):
                raise Unsupported("hidden_act", f"Aria's routed experts are silu-gated whatever hidden_act says, its shared expert follows "
                                  f"{act_name!r}: one moe turbine has one activation")
            if c["mlp_bias"]:
                raise Unsupported("mlp_bias", "Aria biases its shared expert but never the routed ones; the language's moe bias= covers all of them")
            experts, top, hidden = _count(c, "moe_num_experts"), _count(c, "moe_topk"), c["intermediate_size"]
            shared = hidden * _count(c, "moe_num_shared_experts")
            sources.update(hidden="intermediate_size", experts="moe_num_experts", top="moe_topk")
        if not 1 <= top <= experts:
            raise Unsupported(sources["top"], f"top-{top} of {experts} experts")
        if _partial(c) != 1.0:  # their rotary embedding never reads it: the default rope turns the whole head, the others fail
            raise Unsupported("partial_rotary_factor", f"{_partial(c)}: transformers' {family} rotates every dim of each head whatever "
                              "this says (and cannot run it with a rotary scaling)")
        context = c["max_position_embeddings"]
        scaling = _rope_scaling(c, context)
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, scaling), width=width, layers=layers, heads=heads,
                    kv_heads=kv, head_dim=head_dim, hidden=hidden, act=act, norm="rmsnorm", eps=_eps(c, "rms_norm_eps"), qkv_bias=bias,
                    out_bias=bias, rotary=_rotary(_partial(c), head_dim), rotary_base=_rope(c), rotary_scaling=scaling, window=window,
                    experts=experts, top=top, normalize=normalize, shared=shared, tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
                    sources=sources, **extra)
    return read


def _mellum_layers(c: Config, layers: int) -> tuple:
    """Mellum's windows and its rotary parameters: rope_parameters hold one entry per layer type (a base for the
    sliding layers, another for the global ones), which the spec says only where every layer present has the same."""
    from ..closed import LEGACY_ROPE

    for k in LEGACY_ROPE:
        if c.given(k):
            raise Unsupported(k, "MellumConfig does not read it: its rope_parameters, one entry per layer type, hold the rotary base")
    types = _types(c, layers, lambda: ["full_attention"] * layers)
    sw = _sliding(c)
    if "sliding_attention" in types and sw is None:
        raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
    window, windows = _windows(types, sw)
    per = c["rope_parameters"]
    if per is None:  # MellumConfig.__post_init__'s default
        per = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    if not isinstance(per, dict) or any(not isinstance(per.get(t), dict) for t in set(types)):
        raise Unsupported("rope_parameters", "Mellum's rope_parameters hold one object per layer type (full_attention, sliding_attention) "
                          "for each type its layers use")
    ropes = []
    for t in sorted(set(types)):
        rope = per[t]
        if rope.get("rope_type", "default") != "default":
            raise Unsupported(f"rope_parameters.{t}.rope_type", f"{rope.get('rope_type')!r}: rotary scaling per layer type is not mapped")
        for k in rope:
            if k not in ("rope_type", "rope_theta", "partial_rotary_factor"):
                raise Unsupported(f"rope_parameters.{t}.{k}", "not a parameter of plain rotary, the only kind mapped for Mellum")
        theta = rope.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
            raise Unsupported(f"rope_parameters.{t}.rope_theta", f"{theta!r} is not a positive number")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:  # its rotary computes fewer frequencies, its attention rotates the whole head
            raise Unsupported(f"rope_parameters.{t}.partial_rotary_factor", "transformers' Mellum cannot run a partial rotary (its cos and sin "
                              "no longer match the head)")
        ropes.append(float(theta))
    if any(r != ropes[0] for r in ropes):
        raise Unsupported("rope_parameters", f"its sliding and global layers rotate with different bases ({sorted(set(ropes))}): one rotary "
                          "base per layer type is not mapped yet")
    return window, windows, {"rope_theta": ropes[0]}


def _routed_config(a: Arch, cfg: dict) -> dict:
    """The config fields of the routed-expert families (config_of's generic part is `cfg`)."""
    if a.experts == 0:
        raise Unsupported("turbine mlp", f"{a.family} routes its MLPs through experts; the spec's layers are all dense")
    if a.shared_gate:
        raise Unsupported("shared_gate", f"{a.family}'s shared expert is not gated (Qwen2-MoE's is)")
    if a.shared and a.family not in ("granitemoeshared", "aria_text"):
        raise Unsupported("shared", f"{a.family} has no shared expert")
    if a.layer_dense and a.family not in ("qwen3_moe", "mellum"):
        raise Unsupported("stages", f"{a.family} routes every layer; only qwen3_moe and mellum have dense layers among their routed ones")
    if not a.normalize and a.family in ("granitemoe", "granitemoeshared", "aria_text"):
        raise Unsupported("normalize", f"{a.family}'s router always renormalises its top-k weights (a softmax over the top-k logits)")
    if a.mlp_bias:
        raise Unsupported("bias", f"{a.family}'s experts have no biases")
    if a.qkv_bias != a.out_bias:
        raise Unsupported("out_bias", f"{a.family}'s attention_bias covers q, k, v and the output alike")
    want_qk = {"qwen3_moe": "head", "mellum": "head", "olmoe": "all", "flex_olmo": "all"}.get(a.family, "none")
    if a.qk_norm != want_qk or (a.qk_norm != "none" and a.qk_eps != a.eps):
        raise Unsupported("qk_norm", f"{a.family}'s qk-norm is {want_qk}" + (", with the norms' eps" if want_qk != "none" else ""))
    cfg = dict(cfg, attention_bias=a.qkv_bias)
    cfg.pop("head_dim", None)
    if a.family == "qwen3_moe":
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, moe_intermediate_size=a.hidden, head_dim=a.head_dim,
                   intermediate_size=a.dense_hidden if a.layer_dense else a.hidden, norm_topk_prob=a.normalize, decoder_sparse_step=1,
                   mlp_only_layers=[i for i, d in enumerate(a.layer_dense) if d], use_sliding_window=a.window is not None,
                   sliding_window=a.window)
    elif a.family == "mellum":
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"Mellum has one sliding_window; the spec's layers have {sorted(local)}")
        if a.rotary_scaling is not None:
            raise Unsupported("rotary_scaling", "rotary scaling per layer type is not mapped for Mellum")
        rope = {"rope_type": "default", "rope_theta": a.rotary_base}
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, moe_intermediate_size=a.hidden, head_dim=a.head_dim,
                   intermediate_size=a.dense_hidden if a.layer_dense else a.hidden, norm_topk_prob=a.normalize,
                   mlp_layer_types=["dense" if d else "sparse" for d in (a.layer_dense or (False,) * a.layers)],
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows],
                   sliding_window=local.pop() if local else None, rope_parameters={"full_attention": rope, "sliding_attention": dict(rope)})
    elif a.family in ("olmoe", "flex_olmo"):
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, norm_topk_prob=a.normalize)
    elif a.family in ("granitemoe", "granitemoeshared"):
        cfg.update(num_local_experts=a.experts, num_experts_per_tok=a.top, embedding_multiplier=a.embed_scale,
                   residual_multiplier=a.residual_scale, attention_multiplier=a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5,
                   logits_scaling=1.0 / a.logit_scale)
        if a.family == "granitemoeshared":
            cfg["shared_intermediate_size"] = a.shared
    else:  # aria_text
        if not a.shared or a.shared % a.hidden:
            raise Unsupported("shared", f"Aria's shared expert is a whole multiple (moe_num_shared_experts) of the experts' width {a.hidden}")
        cfg.update(moe_num_experts=a.experts, moe_topk=a.top, moe_num_shared_experts=a.shared // a.hidden, head_dim=a.head_dim, mlp_bias=False)
    return cfg
