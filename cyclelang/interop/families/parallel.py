"""The parallel-block, interleaved-rotary and fused-projection families: Cohere, Cohere 2, Cohere 2 MoE,
Cohere Compass's text decoder, GLM, GLM-4, StableLM, CodeGen and MPT, each read closed-world (closed.py)
into an `Arch`.

What makes each one (transformers 5.24's modeling files):
- cohere: one LayerNorm without bias feeds attention and a gated MLP side by side (`fullflow` with one
  norm), rotary on interleaved pairs (GPT-J's), the logits multiplied by logit_scale.
- cohere2: Cohere's block, with sliding-window layers (rotary) and global layers (no rotary at all).
- cohere2_moe: Cohere 2 with routed experts (softmax over the top-k logits) and summed shared experts.
- cohere_compass_text: Cohere 2's block with rotary on the halves, its rope parameters per layer type.
- glm: a Llama block (RMSNorm, pre-norm) with a fused gate_up projection, biased q, k, v but not o,
  and interleaved rotary on the first half of each head (partial_rotary_factor 0.5 by default).
- glm4: GLM with a norm after each turbine too (input, post_self_attn, post_attention, post_mlp).
- stablelm: biased LayerNorms, a gated MLP, partial rotary on the halves, optional q/k/v biases; one
  shared norm in a parallel block (use_parallel_residual) or two in sequence.
- codegen: GPT-J's block with one fused qkv whose rows come in 4 groups of [q | v | k].
- mpt: ALiBi (BLOOM's slopes, the bias after the scale), no biases, one fused Wqkv, a 4x GELU MLP.

Cohere's use_qk_norm and StableLM's qk_layernorm are per-head LayerNorms (no bias, each head its own gain):
qk_norm qk_norm_type=layernorm qk_norm_head_gains. Options the language lacks are refused by name: MPT's clip_qkv,
prefix_lm, and qk_ln and the other switches transformers ignores.
"""

from __future__ import annotations

from ..closed import Config, Keys, Unsupported, _show
from .core import (_GATED_ACTS, _HF_GATED, _HF_PLAIN, _PLAIN_ACTS, Arch, _divides, _eps, _kv, _padding, _partial, _rope,
                   _rope_kind, _rotary, _sliding, _types, _windows)

_COHERE = frozenset({"vocab_size", "hidden_size", "intermediate_size", "logit_scale", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "hidden_act", "max_position_embeddings", "layer_norm_eps", "pad_token_id",
                     "tie_word_embeddings", "rope_parameters", "attention_bias"})
_GLM = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
                  "pad_token_id", "attention_bias"})
_MPT_IGNORED = "transformers' Mpt does not read it"
_MAX_LENGTH = {"model_max_length": "the tokenizer's longest input, which some released configs also carry; the forward does not read it"}
_OLD_HEADS = "GPT-2's multiple-choice head's setting, left in older configs; the causal LM has no such head and does not read it"

KEYS: dict[str, Keys] = {
    "cohere": Keys(_COHERE | {"use_qk_norm"}, _MAX_LENGTH),
    "cohere2": Keys(_COHERE | {"sliding_window", "layer_types", "head_dim", "sliding_window_pattern"}, _MAX_LENGTH),
    "cohere2_moe": Keys(_COHERE | {"rope_theta", "rope_scaling", "sliding_window", "layer_types",
                                                          "head_dim", "sliding_window_pattern", "num_experts", "num_experts_per_tok",
                                                          "num_shared_experts", "shared_expert_combination_strategy", "expert_selection_fn",
                                                          "mlp_layer_types", "rms_norm_eps"},
                        {"norm_topk_prob": "read by the sigmoid router only (expert_selection_fn), which is refused; softmax over the top-k "
                                           "logits sums to 1 either way",
                         "prefix_dense_sliding_window_pattern": "read for the dense layers only (mlp_layer_types), which are refused",
                         "prefix_dense_intermediate_size": "read for the dense layers only (mlp_layer_types), which are refused"}),
    "cohere_compass_text": Keys(_COHERE | {"sliding_window", "layer_types", "head_dim"},
                                {"pooling": "how the sequence-classification head pools its positions; the causal LM has no such head"}),
    "glm": Keys(_GLM),
    "glm4": Keys(_GLM),
    "stablelm": Keys(frozenset({"vocab_size", "intermediate_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                "num_key_value_heads", "hidden_act", "max_position_embeddings", "layer_norm_eps", "tie_word_embeddings",
                                "rope_parameters", "use_qkv_bias", "qk_layernorm", "use_parallel_residual", "pad_token_id"})),
    "codegen": Keys(frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "rotary_dim", "n_inner", "activation_function",
                               "layer_norm_epsilon", "tie_word_embeddings", "scale_attn_weights"}),
                    {"n_ctx": "an older copy of the context length; transformers' CodeGen reads n_positions",
                     "pad_token_id": "CodeGen's embedding has no padding row: the forward does not read it",
                     "gradient_checkpointing": "recomputes activations in the backward pass to save memory: the same function",
                     **{k: _OLD_HEADS for k in ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                                                "summary_first_dropout")}}),
    "mpt": Keys(frozenset({"d_model", "n_heads", "n_layers", "expansion_ratio", "max_seq_len", "vocab_size", "layer_norm_epsilon",
                           "learned_pos_emb", "attn_config", "logit_scale", "no_bias", "tie_word_embeddings"}),
                {"emb_pdrop": "dropout: inactive in evaluation, and cyclelang trains without it",
                 "init_device": "the device weights are first made on; an import loads every weight",
                 "embedding_fraction": "scales the embedding's gradient (x * f + x.detach() * (1 - f)), not its value; "
                                       "transformers' Mpt does not read it",
                 "norm_type": "low_precision_layernorm computes the same LayerNorm in half precision; transformers' Mpt builds "
                              "a float LayerNorm whatever this says",
                 "pad_token_id": "MPT's embedding has no padding row: the forward does not read it",
                 "init_config": "MPT's own code's weight-initialisation settings; an import loads every weight",
                 "verbose": "MPT's own code's logging level",
                 "tokenizer_name": "which tokenizer MPT's own code loads"}),
}

CAUSAL_LM = {"cohere_compass_text": "CohereCompassForCausalLM", "cohere": "CohereForCausalLM", "cohere2": "Cohere2ForCausalLM", "cohere2_moe": "Cohere2MoeForCausalLM", "glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM",
             "stablelm": "StableLmForCausalLM", "codegen": "CodeGenForCausalLM", "mpt": "MptForCausalLM"}


def _plain_rope(c: Config, family: str) -> dict:
    """The rope parameters, refusing a rotary scaling: these families' rotary is read unscaled only."""
    rope, where, kind = _rope_kind(c)
    if kind != "default":
        raise Unsupported(f"{where}.rope_type", f"rotary scaling {kind!r} is not mapped for {family} (its interleaved or partial rotary "
                          "is read unscaled only)")
    return rope


def _gated(c: Config) -> str:
    act = _GATED_ACTS.get(c["hidden_act"])
    if act is None:
        raise Unsupported("hidden_act", f"a gated MLP with {c['hidden_act']!r} has no counterpart (the language has swiglu = silu, "
                          "geglu = gelu, geglu_tanh = the tanh GELU)")
    return act


_SOURCES = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
            "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size", "act": "hidden_act",
            "rotary_base": "rope_theta", "window": "sliding_window", "tied": "tie_word_embeddings"}


def _cohere_moe(c: Config) -> dict:
    """Cohere 2 MoE's routed experts (every layer: dense layers are refused), as Arch fields."""
    layers = c["num_hidden_layers"]
    kinds = c["mlp_layer_types"]
    kinds = ["sparse"] * layers if kinds is None else kinds
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("dense", "sparse") for k in kinds):
        raise Unsupported("mlp_layer_types", f"dense or sparse, one per layer ({layers})")
    if "dense" in kinds:
        raise Unsupported("mlp_layer_types", "dense layers among the routed ones (with their own rotary rule, force_rope) beside Cohere 2's "
                          "sliding and global layers: two per-layer patterns at once are not mapped")
    if c["expert_selection_fn"] != "softmax":
        raise Unsupported("expert_selection_fn", f"{_show(c['expert_selection_fn'])}: sigmoid router scores are not in the language "
                          "(softmax over the top-k logits is: the renormalised top-k)")
    shared = c["num_shared_experts"]
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise Unsupported("num_shared_experts", f"{_show(shared)} is not a count of shared experts")
    if shared and c["shared_expert_combination_strategy"] != "sum":
        raise Unsupported("shared_expert_combination_strategy", f"{_show(c['shared_expert_combination_strategy'])}: the routed and shared "
                          "experts' outputs averaged is not in the language (summed is: shared=)")
    experts, top = c["num_experts"], c["num_experts_per_tok"]
    if not 1 <= top <= experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    rp = c["rope_parameters"]  # not a field of the class: what standardize_rope_params wrote beside rope_theta
    if rp is not None and not isinstance(rp, dict):
        raise Unsupported("rope_parameters", f"{_show(rp)} is not an object")
    if rp and rp.get("rope_theta", c["rope_theta"]) != c["rope_theta"]:
        raise Unsupported("rope_parameters", "its rope_theta and the class's rope_theta field differ: which one transformers reads is not "
                          "certain")
    return {"experts": experts, "top": top, "normalize": True, "shared": c["intermediate_size"] * shared}


_COMPASS_ROPE = frozenset({"rope_type", "type", "rope_theta", "mrope_section", "mrope_interleaved"})


def _compass_rope(c: Config, types: list) -> dict:
    """Cohere Compass's rope parameters, one set per layer type (null: that type has no rotary), as {type: rope_theta or None}.
    Its multimodal rotary (mrope_section) gives a text position the same angle in all three sections: plain rotary."""
    rp = c["rope_parameters"]
    if not isinstance(rp, dict):
        raise Unsupported("rope_parameters", f"{_show(rp)}: Cohere Compass reads one set of rope parameters per layer type")
    for k in rp:
        if k not in ("sliding_attention", "full_attention") and not (k in ("rope_theta", "rope_type") and set(types) & set(rp)):
            raise Unsupported(f"rope_parameters.{k}", "not a layer type: Cohere Compass reads rope_parameters[layer_type]")
    out = {}
    for t in dict.fromkeys(types):
        if t not in rp:
            raise Unsupported(f"rope_parameters.{t}", "missing: transformers' Cohere Compass reads the rope parameters of each layer type "
                              "(null: no rotary)")
        r = rp[t]
        if r is None:
            out[t] = None
            continue
        if not isinstance(r, dict):
            raise Unsupported(f"rope_parameters.{t}", f"{_show(r)} is not an object or null")
        if r.get("rope_type", r.get("type", "default")) != "default":
            raise Unsupported(f"rope_parameters.{t}.rope_type", f"rotary scaling {_show(r.get('rope_type', r.get('type')))} is not mapped for "
                              "Cohere Compass")
        for k in r:
            if k not in _COMPASS_ROPE:
                raise Unsupported(f"rope_parameters.{t}.{k}", "not a rope parameter the importer knows: it cannot tell whether it changes "
                                  "the function")
        theta = r.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise Unsupported(f"rope_parameters.{t}.rope_theta", f"{_show(theta)} is not a positive number (transformers fails without one)")
        section = r.get("mrope_section", [24, 20, 20])
        if not isinstance(section, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in section):
            raise Unsupported(f"rope_parameters.{t}.mrope_section", f"{_show(section)} is not a list of section sizes")
        out[t] = float(theta)
    return out


def _compass(c: Config) -> Arch:
    """Cohere Compass's text decoder: Cohere 2's parallel block, rotary on the halves (not interleaved), one set of rope
    parameters per layer type (null: none), a logit scale that null leaves at 1."""
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    head_dim = width // heads
    if c.given("head_dim") and c["head_dim"] != head_dim:  # __post_init__ sets it to hidden / heads
        raise Unsupported("head_dim", f"{_show(c['head_dim'])}, not hidden_size / num_attention_heads = {head_dim} (the attention reads that)")
    types = _types(c, layers, lambda: ["full_attention"] * layers)
    bases = _compass_rope(c, types)
    thetas = {b for b in bases.values() if b is not None}
    if len(thetas) > 1:
        raise Unsupported("rope_parameters", f"the layer types' rotary bases differ ({sorted(thetas)}): one rotary_base per spec is mapped")
    if bases.get("sliding_attention", 0.0) is None and bases.get("full_attention") is not None:
        raise Unsupported("rope_parameters.sliding_attention", "null beside rotary global layers: sliding layers without rotary are not mapped "
                          "(Cohere 2's pattern is the reverse)")
    sw = c["sliding_window"]
    if "sliding_attention" in types:
        sw = _sliding(c)
        if sw is None:
            raise Unsupported("sliding_window", "null, with sliding layers: transformers then gives them no window")
    window, windows = _windows(types, sw)
    rotary, base = (1.0, min(thetas)) if thetas else (0.0, 10000.0)
    scale = c["logit_scale"]
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale == 0):
        raise Unsupported("logit_scale", f"{_show(scale)}: the logits are multiplied by this non-zero number (null: 1)")
    bias = bool(c["attention_bias"])
    return Arch("cohere_compass_text", vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=layers, heads=heads,
                kv_heads=_kv(c, heads), head_dim=head_dim, hidden=c["intermediate_size"], act=_gated(c), norm="layernorm",
                eps=_eps(c, "layer_norm_eps"), norm_bias=False, qkv_bias=bias, out_bias=bias, mlp_bias=False,
                logit_scale=1.0 if scale is None else float(scale), rotary=rotary, rotary_base=base, window=window,
                layer_windows=windows, layer_attn=_global_nope(windows, base) if windows and bases.get("full_attention") is None else (),
                tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
                parallel="shared", sources=dict(_SOURCES, eps="layer_norm_eps", logit_scale="logit_scale", rotary_base="rope_parameters",
                                                window="sliding_window, layer_types"))


def _cohere(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        moe = _cohere_moe(c) if family == "cohere2_moe" else {}
        if family == "cohere2_moe":
            head_dim = c["head_dim"]  # a field of its own: the attention reads it
        else:
            _divides(width, heads, "num_attention_heads", "hidden_size")
            head_dim = width // heads
        if family == "cohere2" and c.given("head_dim") and c["head_dim"] != head_dim:  # __post_init__ sets it to hidden / heads
            raise Unsupported("head_dim", f"{_show(c['head_dim'])}, not hidden_size / num_attention_heads = {head_dim} (Cohere 2's "
                              "attention reads that)")
        rope = _plain_rope(c, family)
        if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
            raise Unsupported("rope_parameters.partial_rotary_factor", "Cohere's rotary turns every dim of the head (transformers "
                              "fails on a part of it)")
        scale = c["logit_scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale == 0:
            raise Unsupported("logit_scale", f"{_show(scale)}: Cohere multiplies its logits by this non-zero number")
        bias = bool(c["attention_bias"])
        window, windows, rotary = None, (), 1.0
        src = dict(_SOURCES, eps="layer_norm_eps", logit_scale="logit_scale")
        if moe:
            src.update(experts="num_experts", top="num_experts_per_tok")
        norm, eps = "layernorm", _eps(c, "layer_norm_eps")
        if family == "cohere2_moe" and c["rms_norm_eps"] is not None:  # RMSNorms in place of the LayerNorms
            norm, eps = "rmsnorm", _eps(c, "rms_norm_eps")
            src["eps"] = "rms_norm_eps"
        if family in ("cohere2", "cohere2_moe"):
            sw = _sliding(c)
            if sw is None:
                raise Unsupported("sliding_window", "null: transformers' Cohere 2 builds its sliding-window mask from it (and gives its "
                                  "sliding layers neither window nor rotary without one)")
            every = c["sliding_window_pattern"]
            every = 4 if every is None else every
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise Unsupported("sliding_window_pattern", f"{_show(every)}: every how many layers one is global, a whole number from 1")
            types = _types(c, layers, lambda: ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)])
            window, windows = _windows(types, sw)
            if window is None and not windows:  # every layer global: no rotary anywhere
                rotary = 0.0
            src["window"] = "sliding_window, layer_types"
        return Arch(family, vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=layers, heads=heads,
                    kv_heads=_kv(c, heads), head_dim=head_dim, hidden=c["intermediate_size"], act=_gated(c), norm=norm,
                    eps=eps, norm_bias=False, **moe, qkv_bias=bias, out_bias=bias, mlp_bias=False,
                    logit_scale=float(scale), rotary=rotary, rotary_base=float(rope["rope_theta"]), rotary_interleaved=True,
                    window=window, layer_windows=windows, layer_attn=_global_nope(windows, float(rope["rope_theta"])),
                    tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
                    parallel="shared", sources=src, **(_per_head_qk(eps) if family == "cohere" and c["use_qk_norm"] else {}))
    return read


def _per_head_qk(eps: float) -> dict:
    """Cohere's use_qk_norm, StableLM's qk_layernorm: q and k LayerNorms over each head's dims, without a bias, each head
    its own gain (Cohere's one (heads, head_dim) weight, StableLM's one LayerNorm per head), eps the norms' own."""
    return dict(qk_norm="head", qk_eps=eps, qk_type="layernorm", qk_heads=True)


def _head_layernorms(a: Arch, key: str) -> bool:
    """Export: whether the spec's qk-norms are the per-head LayerNorms `key` turns on (refused when they are another kind)."""
    if a.qk_norm != "none" and (a.qk_norm, a.qk_type, a.qk_bias, a.qk_offset, a.qk_affine, a.qk_late, a.qk_heads, a.qk_eps) != (
            "head", "layernorm", False, 0.0, True, False, True, a.eps):
        raise Unsupported("qk_norm", f"{a.family}'s qk-norms ({key}) are LayerNorms over each head's dims before rotary, each head its "
                          "own gain, no bias, with the norms' eps")
    return a.qk_norm == "head"


def _global_nope(windows: tuple, base: float) -> tuple:
    """Cohere 2's layers as `Arch.layer_attn`: each sliding layer rotary (its window), each global one without rotary."""
    return tuple((w, 1.0, base, None) if w is not None else (None, 0.0, 10000.0, None) for w in windows)


def _glm(family: str):
    def read(c: Config) -> Arch:
        width, heads = c["hidden_size"], c["num_attention_heads"]
        head_dim = c["head_dim"]
        if head_dim is None:
            _divides(width, heads, "num_attention_heads", "hidden_size")
            head_dim = width // heads
        _plain_rope(c, family)
        bias = bool(c["attention_bias"])
        return Arch(family, vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=c["num_hidden_layers"],
                    heads=heads, kv_heads=_kv(c, heads), head_dim=head_dim, hidden=c["intermediate_size"], act=_gated(c), norm="rmsnorm",
                    eps=_eps(c, "rms_norm_eps"), qkv_bias=bias, out_bias=False, mlp_bias=False, rotary=_rotary(_partial(c), head_dim),
                    rotary_base=_rope(c), rotary_interleaved=True, sandwich=family == "glm4", tied=bool(c["tie_word_embeddings"]),
                    padding=_padding(c), sources=dict(_SOURCES, eps="rms_norm_eps"))
    return read


def _stablelm(c: Config) -> Arch:
    width, heads = c["hidden_size"], c["num_attention_heads"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    _plain_rope(c, "stablelm")
    return Arch("stablelm", vocab=c["vocab_size"], context=c["max_position_embeddings"], width=width, layers=c["num_hidden_layers"],
                heads=heads, kv_heads=_kv(c, heads), head_dim=width // heads, hidden=c["intermediate_size"], act=_gated(c),
                norm="layernorm", eps=_eps(c, "layer_norm_eps"), norm_bias=True, qkv_bias=bool(c["use_qkv_bias"]), out_bias=False,
                mlp_bias=False, rotary=_rotary(_partial(c), width // heads), rotary_base=_rope(c), tied=bool(c["tie_word_embeddings"]),
                padding=_padding(c), parallel="shared" if c["use_parallel_residual"] else "none",
                sources=dict(_SOURCES, eps="layer_norm_eps"), **(_per_head_qk(_eps(c, "layer_norm_eps")) if c["qk_layernorm"] else {}))


MP_NUM = 4  # CodeGen's qkv rows come in this many groups (transformers' CodeGenAttention.mp_num)


def _codegen(c: Config) -> Arch:
    if c.given("scale_attn_weights") and c["scale_attn_weights"] is not True:  # GPT-2's key, in older CodeGen configs
        raise Unsupported("scale_attn_weights", f"{_show(c['scale_attn_weights'])}: transformers' CodeGen scales by 1/sqrt(head_dim) whatever "
                          "this says; the checkpoint was trained without it")
    width, heads = c["n_embd"], c["n_head"]
    _divides(width, heads, "n_head", "n_embd")
    if width % MP_NUM:
        raise Unsupported("n_embd", f"{width} is not a multiple of {MP_NUM}: CodeGen's fused qkv comes in {MP_NUM} groups of rows")
    head_dim = width // heads
    rd = c["rotary_dim"]
    if rd is None:
        raise Unsupported("rotary_dim", "null: CodeGen then rotates hidden_size dims of each head, which only a single head has")
    if rd > head_dim or rd % 2:
        raise Unsupported("rotary_dim", f"{rd}: CodeGen rotates an even number of each head's {head_dim} dims")
    act = _PLAIN_ACTS.get(c["activation_function"])
    if act is None:
        raise Unsupported("activation_function", f"{c['activation_function']!r} has no counterpart among the language's activations")
    return Arch("codegen", vocab=c["vocab_size"], context=c["n_positions"], width=width, layers=c["n_layer"], heads=heads, kv_heads=heads,
                head_dim=head_dim, hidden=c["n_inner"] or 4 * width, act=act, norm="layernorm", eps=_eps(c, "layer_norm_epsilon"),
                norm_bias=True, qkv_bias=False, out_bias=False, mlp_bias=True, rotary=rd / head_dim, rotary_interleaved=True,
                tied=bool(c["tie_word_embeddings"]), parallel="shared", head_bias=True,
                sources={"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                         "hidden": "n_inner", "act": "activation_function", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"})


# MptAttentionConfig's fields (attn_config, a nested config): the ones read, and the ones that change nothing
_MPT_ATTN_READ = ("attn_type", "clip_qkv", "softmax_scale", "prefix_lm", "qk_ln", "attn_uses_sequence_id", "alibi", "alibi_bias_max")
_MPT_ATTN_DEFAULTS = {"attn_type": "multihead_attention", "clip_qkv": None, "softmax_scale": None, "prefix_lm": False, "qk_ln": False,
                      "attn_uses_sequence_id": False, "alibi": True, "alibi_bias_max": 8}
_MPT_ATTN_INERT = {"attn_pdrop": "dropout: inactive in evaluation, and cyclelang trains without it",
                   "attn_impl": "which kernel computes attention (torch, flash, triton): the same function"}
# the keys every nested config writes (PreTrainedConfig's own): none is read by the attention
_NESTED_BASE = frozenset({"architectures", "output_hidden_states", "output_attentions", "return_dict", "dtype", "torch_dtype",
                          "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type", "_name_or_path",
                          "model_type", "transformers_version", "use_cache", "tie_word_embeddings"})


def _mpt_attn(raw) -> dict:
    """attn_config read closed-world: each key MptAttentionConfig's, read or changing nothing."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise Unsupported("attn_config", f"{_show(raw)} is not an object")
    out = dict(_MPT_ATTN_DEFAULTS)
    for k, v in raw.items():
        if k in _MPT_ATTN_DEFAULTS:
            out[k] = v
        elif k not in _MPT_ATTN_INERT and k not in _NESTED_BASE:
            raise Unsupported(f"attn_config.{k}", "not a key of transformers' MptAttentionConfig the importer knows: it cannot tell "
                              "whether it changes the function")
    return out


def _mpt(c: Config) -> Arch:
    a = _mpt_attn(c["attn_config"])
    if a["clip_qkv"]:
        raise Unsupported("attn_config.clip_qkv", "clamping q, k and v to a range is not in the language")
    for k, why in (("qk_ln", "MPT's own code's LayerNorm over all heads' q and one over k (the language's qk_norm_across "
                              "qk_norm_type=layernorm); transformers' Mpt ignores it, so its weights would not load there and the "
                              "checkpoint's function there is another"),
                   ("prefix_lm", "bidirectional attention over a prefix is not a causal LM the language says (transformers' Mpt ignores it)"),
                   ("attn_uses_sequence_id", "attention kept within each packed sequence is not in the language (transformers' Mpt "
                                             "ignores it)")):
        if a[k]:
            raise Unsupported(f"attn_config.{k}", why)
    if a["attn_type"] != "multihead_attention":
        raise Unsupported("attn_config.attn_type", f"{_show(a['attn_type'])}: transformers' Mpt builds multi-head attention whatever "
                          "this says, so other checkpoints' weights do not load there")
    if a["alibi"] is not True:
        raise Unsupported("attn_config.alibi", f"{_show(a['alibi'])}: transformers' Mpt adds ALiBi whatever this says; the checkpoint "
                          "was trained without it")
    if a["alibi_bias_max"] != 8:
        raise Unsupported("attn_config.alibi_bias_max", f"{_show(a['alibi_bias_max'])}: transformers' Mpt builds ALiBi's slopes from 8 "
                          "whatever this says (the language's are 8's too)")
    scale = a["softmax_scale"]
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
        raise Unsupported("attn_config.softmax_scale", f"{_show(scale)} is not a positive number (null: 1 / sqrt(head_dim))")
    if c["expansion_ratio"] != 4:
        raise Unsupported("expansion_ratio", f"{_show(c['expansion_ratio'])}: transformers' Mpt builds a 4 x d_model MLP whatever this "
                          "says, so other checkpoints' weights do not load there")
    if c["no_bias"] is not True:
        raise Unsupported("no_bias", f"{_show(c['no_bias'])}: transformers' Mpt builds no biases whatever this says; the checkpoint's "
                          "would be dropped")
    if c["logit_scale"] is not None:
        raise Unsupported("logit_scale", f"{_show(c['logit_scale'])}: MPT's own code scales the logits by it; {_MPT_IGNORED}")
    if c["learned_pos_emb"] is not True:  # True is the default, and what every MPT writes: ALiBi carries the positions either way
        raise Unsupported("learned_pos_emb", f"{_show(c['learned_pos_emb'])}: {_MPT_IGNORED}, and the importer reads it at its default only")
    width, heads = c["d_model"], c["n_heads"]
    _divides(width, heads, "n_heads", "d_model")
    return Arch("mpt", vocab=c["vocab_size"], context=c["max_seq_len"], width=width, layers=c["n_layers"], heads=heads, kv_heads=heads,
                head_dim=width // heads, hidden=4 * width, act="gelu", norm="layernorm", eps=_eps(c, "layer_norm_epsilon"), norm_bias=False,
                qkv_bias=False, out_bias=False, mlp_bias=False, attn_scale=None if scale is None else float(scale), alibi=True,
                alibi_scaled=False, tied=bool(c["tie_word_embeddings"]),
                sources={"vocab": "vocab_size", "context": "max_seq_len", "width": "d_model", "layers": "n_layers", "heads": "n_heads",
                         "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings", "attn_scale": "attn_config.softmax_scale",
                         "hidden": "MPT's 4 x d_model"})


READERS = {"cohere_compass_text": _compass, "cohere": _cohere("cohere"), "cohere2": _cohere("cohere2"), "cohere2_moe": _cohere("cohere2_moe"), "glm": _glm("glm"), "glm4": _glm("glm4"), "stablelm": _stablelm,
           "codegen": _codegen, "mpt": _mpt}


# --- export: the config.json an Arch of these families implies -----------------------------------


def config_of(a: Arch) -> dict:
    """The transformers config of an Arch of one of these families; export then checks that importing it gives back the engine."""
    base = {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "tie_word_embeddings": a.tied}
    if a.family == "codegen":
        act = _HF_PLAIN.get(a.act)
        if act is None:
            raise Unsupported("act", f"CodeGen has no '{a.act}' activation")
        return {**base, "n_positions": a.context, "n_ctx": a.context, "n_embd": a.width, "n_layer": a.layers, "n_head": a.heads,
                "rotary_dim": round(a.rotary * a.head_dim), "n_inner": a.hidden, "activation_function": act, "layer_norm_epsilon": a.eps,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if a.family == "mpt":
        return {**base, "d_model": a.width, "n_heads": a.heads, "n_layers": a.layers, "expansion_ratio": 4, "max_seq_len": a.context,
                "layer_norm_epsilon": a.eps, "no_bias": True,
                "attn_config": {"softmax_scale": a.attn_scale, "alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0}}
    act = _HF_GATED.get(a.act)
    if act is None:
        raise Unsupported("act", f"{a.family}'s gated MLP has no '{a.act}' form (swiglu, geglu or geglu_tanh)")
    base_ = next((b for _, rot, b, _ in a.layer_attn if rot), a.rotary_base)  # Cohere 2: its sliding layers' (the global ones have none)
    rope = {"rope_type": "default", "rope_theta": base_}
    cfg = {**base, "hidden_size": a.width, "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "hidden_act": act, "max_position_embeddings": a.context, "pad_token_id": a.padding,
           "rope_parameters": rope, "attention_dropout": 0.0}
    if a.family in ("glm", "glm4"):
        return {**cfg, "head_dim": a.head_dim, "rms_norm_eps": a.eps, "attention_bias": a.qkv_bias,
                "rope_parameters": {**rope, "partial_rotary_factor": a.rotary}}
    if a.head_dim * a.heads != a.width and a.family != "cohere2_moe":  # Cohere 2 MoE's head_dim is a field of its own
        raise Unsupported("head_dim", f"{a.family}'s head_dim is hidden_size / num_attention_heads")
    if a.family == "stablelm":
        return {**cfg, "layer_norm_eps": a.eps, "use_qkv_bias": a.qkv_bias, "use_parallel_residual": a.parallel == "shared",
                "qk_layernorm": _head_layernorms(a, "qk_layernorm"), "hidden_dropout": 0.0, "rope_parameters": {**rope, "partial_rotary_factor": a.rotary}}
    cfg.update(layer_norm_eps=a.eps, attention_bias=a.qkv_bias, logit_scale=a.logit_scale)
    if a.family == "cohere":
        return {**cfg, "use_qk_norm": _head_layernorms(a, "use_qk_norm")}
    if a.layer_attn and a.layer_attn != _global_nope(tuple(w for w, *_ in a.layer_attn), base_):
        raise Unsupported("rotary", f"{a.family}'s sliding layers turn by one rotary (interleaved, every dim), its global layers by none")
    if a.family == "cohere_compass_text":
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"Cohere Compass has one sliding_window; the spec's layers have {sorted(local)}")
        if a.rotary_interleaved:
            raise Unsupported("rotary_interleaved", "Cohere Compass rotates the halves of each head, not interleaved pairs")
        types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
        rope = {"rope_type": "default", "rope_theta": base_} if a.rotary else None
        return {**cfg, "sliding_window": local.pop() if local else a.context, "layer_types": types,
                "rope_parameters": {t: (rope if t == "sliding_attention" or not a.layer_attn else None) for t in dict.fromkeys(types)}}
    windows = a.layer_windows or (a.window,) * a.layers  # cohere2, cohere2_moe
    local = {w for w in windows if w is not None}
    if len(local) > 1:
        raise Unsupported("window", f"Cohere 2 has one sliding_window; the spec's layers have {sorted(local)}")
    cfg.update(sliding_window=local.pop() if local else a.context,  # transformers builds the sliding mask even when no layer slides
               layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])
    if a.family == "cohere2":
        return cfg
    if a.shared % a.hidden:
        raise Unsupported("shared", f"Cohere 2 MoE's shared experts are a whole number of intermediate_size {a.hidden} wide, not {a.shared}")
    rope = cfg.pop("rope_parameters")
    return {**cfg, "head_dim": a.head_dim, "rope_theta": rope["rope_theta"], "num_experts": a.experts, "num_experts_per_tok": a.top,
            "num_shared_experts": a.shared // a.hidden, "shared_expert_combination_strategy": "sum", "expert_selection_fn": "softmax",
            "mlp_layer_types": ["sparse"] * a.layers, "rms_norm_eps": a.eps if a.norm == "rmsnorm" else None}
