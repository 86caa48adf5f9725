"""GPT-2, BLOOM and the LayerNorm decoders with an ungated MLP (Phi, StarCoder2, GPT-NeoX, GPT-J, Falcon, Persimmon):
biases, learned positions or ALiBi or partial rotary, parallel blocks; their readers and the configs their Archs imply."""

from __future__ import annotations

from dataclasses import replace

from ..closed import Config, Keys, Unsupported
from .core import (CAUSAL_LM, KEYS, _HF_PLAIN, _PLAIN_ACTS, Arch, _divides, _dynamic_context, _eps, _kv, _max_positions, _padding, _partial, _rope,
                   _rope_config, _rope_scaling, _rotary, _sliding)

# --- the readers: one per family, each reading only the keys its Keys declare (closed.py) ------------

_GPT2_HEADS = "GPT2DoubleHeadsModel's multiple-choice head; the causal LM has none"
KEYS["gpt2"] = Keys(frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "layer_norm_epsilon",
                               "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "tie_word_embeddings"}),
                    {"summary_type": _GPT2_HEADS, "summary_use_proj": _GPT2_HEADS, "summary_activation": _GPT2_HEADS,
                     "summary_proj_to_labels": _GPT2_HEADS, "summary_first_dropout": _GPT2_HEADS,
                     "pad_token_id": "GPT-2's embedding has no padding row: the forward does not read it",
                     "reorder_and_upcast_attn": "computes the attention scores in float32 for half-precision training: the same function",
                     "n_ctx": "an older copy of the context length; transformers 5's GPT-2 reads n_positions"})


def _gpt2(c: Config) -> Arch:
    if not c["scale_attn_weights"]:
        raise Unsupported("scale_attn_weights", "attention without the 1/sqrt(head_dim) scale is not in the language")
    if c["scale_attn_by_inverse_layer_idx"]:
        raise Unsupported("scale_attn_by_inverse_layer_idx", "a per-layer attention scale 1/(layer + 1) is not in the language")
    width, heads = c["n_embd"], c["n_head"]
    _divides(width, heads, "n_head", "n_embd")
    act_name = c["activation_function"]
    act = _PLAIN_ACTS.get(act_name)
    if act is None:
        raise Unsupported("activation_function", f"{act_name!r} has no counterpart among the language's activations")
    return Arch("gpt2", vocab=c["vocab_size"], context=c["n_positions"], width=width, layers=c["n_layer"],
                heads=heads, kv_heads=heads, head_dim=width // heads, hidden=c["n_inner"] or 4 * width, act=act,
                norm="layernorm", eps=_eps(c, "layer_norm_epsilon"), position="learned", norm_bias=True, qkv_bias=True,
                out_bias=True, mlp_bias=True, tied=c["tie_word_embeddings"],
                sources={"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                         "hidden": "n_inner", "act": "activation_function", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"})


# Layernorm decoders with an ungated MLP, biases, partial rotary, parallel blocks.
_PLAIN_KEYS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
                         "max_position_embeddings", "tie_word_embeddings", "rope_parameters"})
_PLAIN = {
    "phi": Keys(_PLAIN_KEYS | {"num_key_value_heads", "layer_norm_eps", "qk_layernorm", "pad_token_id"}),
    "starcoder2": Keys(_PLAIN_KEYS | {"num_key_value_heads", "norm_epsilon", "use_bias", "sliding_window", "pad_token_id"}),
    "gpt_neox": Keys(_PLAIN_KEYS | {"layer_norm_eps", "use_parallel_residual", "attention_bias"},
                     {"is_decoder": "marks the model for use as an encoder-decoder's decoder; GPT-NeoX's causal LM does not read it",
                      "pad_token_id": "GPT-NeoX's embedding has no padding row: the forward does not read it"},
                     {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"}),
    "gptj": Keys(frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "rotary_dim", "activation_function",
                            "layer_norm_epsilon", "tie_word_embeddings"}),
                 {"pad_token_id": "GPT-J's embedding has no padding row: the forward does not read it"}),
    "falcon": Keys(frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_kv_heads", "multi_query",
                              "new_decoder_architecture", "num_ln_in_parallel_attn", "parallel_attn", "bias", "ffn_hidden_size", "activation",
                              "max_position_embeddings", "layer_norm_epsilon", "tie_word_embeddings", "alibi", "rope_parameters"}),
                   {"pad_token_id": "Falcon's embedding has no padding row: the forward does not read it"}),
}
KEYS.update(_PLAIN)


def _plain(family: str):
    def read(c: Config) -> Arch:
        pad = None
        if family == "gptj":
            width, heads, layers, context = c["n_embd"], c["n_head"], c["n_layer"], c["n_positions"]
            _divides(width, heads, "n_head", "n_embd")
            rd = c["rotary_dim"] or width // heads
            if rd > width // heads:
                raise Unsupported("rotary_dim", f"{rd} rotated dims exceed head_dim {width // heads}")
            partial, kv, hidden, act_key, eps_key = rd / (width // heads), heads, c["n_inner"] or 4 * width, "activation_function", "layer_norm_epsilon"
        elif family == "falcon":
            width, heads, layers, context = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["max_position_embeddings"]
            _divides(width, heads, "num_attention_heads", "hidden_size")
            new = bool(c["new_decoder_architecture"])  # grouped query attention, always parallel, one or two norms
            n_ln = c["num_ln_in_parallel_attn"]
            n_ln = 2 if n_ln is None else n_ln
            if new and n_ln not in (1, 2):
                raise Unsupported("num_ln_in_parallel_attn", "Falcon's new decoder has one norm (shared) or two (ln_attn, ln_mlp) per block")
            if new:
                kv = _kv(c, heads, "num_kv_heads")
            else:
                kv = 1 if c["multi_query"] else _kv(c, heads, "num_kv_heads")
            parallel = ("separate" if n_ln == 2 else "shared") if new else ("shared" if c["parallel_attn"] else "none")
            partial, hidden, act_key, eps_key = _partial(c), c["ffn_hidden_size"] or 4 * width, "activation", "layer_norm_epsilon"
        else:
            width, heads, layers, context = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["max_position_embeddings"]
            _divides(width, heads, "num_attention_heads", "hidden_size")
            kv = _kv(c, heads) if "num_key_value_heads" in c.keys.maps else heads
            partial, hidden, act_key = _partial(c), c["intermediate_size"], "hidden_act"
            eps_key = {"starcoder2": "norm_epsilon"}.get(family, "layer_norm_eps")
            pad = _padding(c) if "pad_token_id" in c.keys.maps else None
        act_name = c[act_key]
        act = _PLAIN_ACTS.get(act_name)
        if act is None:
            raise Unsupported(act_key, f"{act_name!r} has no counterpart among the language's activations")
        bias = bool(c["use_bias"]) if family == "starcoder2" else bool(c["bias"]) if family == "falcon" else False if family == "gptj" \
            else bool(c["attention_bias"]) if family == "gpt_neox" else True
        if family in ("phi", "gptj"):
            parallel = "shared"
        elif family == "gpt_neox":
            parallel = "separate" if c["use_parallel_residual"] else "none"
        elif family != "falcon":
            parallel = "none"
        alibi = family == "falcon" and bool(c["alibi"])  # ALiBi in place of rotary
        scaling = _rope_scaling(c, context) if family != "gptj" and not alibi else None
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, scaling), width=width, layers=layers,
                    heads=heads, kv_heads=kv, head_dim=width // heads, hidden=hidden, act=act, norm="layernorm",
                    rotary_scaling=scaling, eps=_eps(c, eps_key), norm_bias=True, qkv_bias=bias, out_bias=bias,
                    mlp_bias=bias if family in ("starcoder2", "falcon") else True, rotary=0.0 if alibi else _rotary(partial, width // heads),
                    rotary_base=_rope(c) if family != "gptj" else 10000.0,
                    window=_sliding(c) if family == "starcoder2" else None, tied=bool(c["tie_word_embeddings"]),
                    padding=pad, parallel=parallel, head_bias=family in ("phi", "gptj"), rotary_interleaved=family == "gptj", alibi=alibi,
                    sources={"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                             "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size",
                             "act": act_key, "eps": eps_key, "rotary_base": "rope_theta", "window": "sliding_window",
                             "tied": "tie_word_embeddings",
                             **({"kv_heads": "num_kv_heads, multi_query", "hidden": "ffn_hidden_size"} if family == "falcon" else {})}
                    if family != "gptj" else
                    {"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                     "hidden": "n_inner", "act": "activation_function", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"})
    return read


KEYS["bloom"] = Keys(frozenset({"vocab_size", "hidden_size", "n_layer", "n_head", "layer_norm_epsilon", "apply_residual_connection_post_layernorm",
                                "tie_word_embeddings", "seq_length"}),
                     {"pretraining_tp": "with slow_but_exact, slices a matmul and sums the pieces: the same function, rounded otherwise",
                      "slow_but_exact": "slices a matmul and sums the pieces: the same function, rounded otherwise",
                      "pad_token_id": "BLOOM's embedding has no padding row: the forward does not read it",
                      "n_inner": "BLOOM's MLP is 4 x hidden_size whatever this says: transformers does not read it",
                      "unk_token_id": "the tokenizer's unknown token; the forward does not read it",
                      **{k: "a Megatron-DeepSpeed training switch (fused kernels, fp32 softmax); transformers' Bloom does not read it"
                         for k in ("masked_softmax_fusion", "bias_dropout_fusion", "skip_bias_add", "skip_bias_add_qkv",
                                   "attention_softmax_in_fp32", "offset_alibi")}})


def _bloom(c: Config) -> Arch:
    """BLOOM: ALiBi (added after the scale), a LayerNorm after the embedding, biased LayerNorm
    blocks with a 4x tanh-GELU MLP, per-head fused q, k, v, a tied head."""
    if c["apply_residual_connection_post_layernorm"]:
        raise Unsupported("apply_residual_connection_post_layernorm", "a residual taken after the norm (the branch's normed input) is not in the language")
    width, heads = c["hidden_size"], c["n_head"]
    _divides(width, heads, "n_head", "hidden_size")
    return Arch("bloom", vocab=c["vocab_size"], context=c["seq_length"] or 2048, width=width,
                layers=c["n_layer"], heads=heads, kv_heads=heads, head_dim=width // heads, hidden=4 * width,
                act="gelu_tanh", norm="layernorm", eps=_eps(c, "layer_norm_epsilon"), norm_bias=True, qkv_bias=True, out_bias=True,
                mlp_bias=True, tied=bool(c["tie_word_embeddings"]), alibi=True, alibi_scaled=False, embed_norm=True,
                sources={"vocab": "vocab_size", "context": "BLOOM has no context field (ALiBi has no table): the spec's own", "width": "hidden_size",
                         "layers": "n_layer", "heads": "n_head", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"})
# Persimmon: a sequential GPT-NeoX layer (per-head fused q, k, v rows) with a relu2 MLP and per-head qk LayerNorms.
KEYS["persimmon"] = Keys(_PLAIN_KEYS | {"layer_norm_eps", "qk_layernorm", "pad_token_id"})


def _persimmon(c: Config) -> Arch:
    """GPT-NeoX's sequential layer read as the plain decoders are, then Persimmon's per-head qk LayerNorms (with a bias)."""
    a = _plain("persimmon")(c)
    qk = dict(qk_norm="head", qk_eps=a.eps, qk_type="layernorm", qk_bias=True) if c["qk_layernorm"] else {}
    return replace(a, **qk, sources={**a.sources, "rotary": "partial_rotary_factor"})


def _phi(c: Config) -> Arch:
    """Phi's parallel block read as the plain decoders are, then its qk LayerNorms (qk_layernorm: one over each head's dims,
    shared by the heads, with a bias, before the partial rotary), Persimmon's."""
    a = _plain("phi")(c)
    return replace(a, qk_norm="head", qk_eps=a.eps, qk_type="layernorm", qk_bias=True) if c["qk_layernorm"] else a


def _persimmon_config(a: Arch) -> dict:
    """Persimmon's config: every projection biased, as many key/value heads as query heads, qk LayerNorms (with a bias) or none."""
    act = _HF_PLAIN.get(a.act)
    if act is None:
        raise Unsupported("act", f"persimmon has no '{a.act}' activation")
    if a.kv_heads != a.heads or a.head_dim * a.heads != a.width:
        raise Unsupported("kv_heads" if a.kv_heads != a.heads else "head_dim", "Persimmon's heads split the width, each with its own key and value")
    if a.qk_norm not in ("none", "head") or (a.qk_norm == "head" and (a.qk_type, a.qk_bias, a.qk_eps) != ("layernorm", True, a.eps)):
        raise Unsupported("qk_norm", "Persimmon's qk-norms are per-head LayerNorms with a bias and the norms' eps")
    return {"model_type": "persimmon", "architectures": [CAUSAL_LM["persimmon"]], "vocab_size": a.vocab, "hidden_size": a.width,
            "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "hidden_act": act,
            "max_position_embeddings": _max_positions(a), "layer_norm_eps": a.eps, "tie_word_embeddings": a.tied,
            "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base, "partial_rotary_factor": a.rotary}),
            "qk_layernorm": a.qk_norm == "head", "hidden_dropout": 0.0, "attention_dropout": 0.0, "pad_token_id": a.padding}


def _falcon_common(a: Arch, act: str) -> dict:
    return {"model_type": "falcon", "architectures": [CAUSAL_LM["falcon"]], "vocab_size": a.vocab, "hidden_size": a.width,
            "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "bias": a.qkv_bias, "ffn_hidden_size": a.hidden,
            "activation": act, "max_position_embeddings": _max_positions(a), "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied,
            "alibi": a.alibi, "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base}),
            "hidden_dropout": 0.0, "attention_dropout": 0.0}


def _plain_config(a: Arch) -> dict:
    act = _HF_PLAIN.get(a.act)
    if act is None:
        raise Unsupported("act", f"{a.family} has no '{a.act}' activation")
    if a.family == "falcon":
        if a.head_dim * a.heads != a.width:
            raise Unsupported("head_dim", "Falcon's head_dim is width / heads")
        new = a.parallel == "separate" or a.kv_heads not in (1, a.heads)  # grouped kv heads or two norms: the new decoder
        if new and a.parallel == "none":
            raise Unsupported("kv_heads", "Falcon's sequential (old) decoder has multi-query (1) or full key/value heads")
        if new:
            return {**_falcon_common(a, act), "num_kv_heads": a.kv_heads, "new_decoder_architecture": True, "parallel_attn": True,
                    "num_ln_in_parallel_attn": 2 if a.parallel == "separate" else 1}
        return {"model_type": "falcon", "architectures": [CAUSAL_LM["falcon"]], "vocab_size": a.vocab, "hidden_size": a.width,
                "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_kv_heads": a.kv_heads,
                "multi_query": a.kv_heads == 1 and a.heads > 1, "parallel_attn": a.parallel == "shared", "bias": a.qkv_bias,
                "ffn_hidden_size": a.hidden, "activation": act, "max_position_embeddings": _max_positions(a), "layer_norm_epsilon": a.eps,
                "tie_word_embeddings": a.tied, "new_decoder_architecture": False, "alibi": a.alibi,
                "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base}), "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if a.family == "gptj":
        return {"model_type": "gptj", "architectures": [CAUSAL_LM["gptj"]], "vocab_size": a.vocab, "n_positions": a.context,
                "n_embd": a.width, "n_layer": a.layers, "n_head": a.heads, "n_inner": a.hidden, "rotary_dim": round(a.rotary * a.head_dim),
                "activation_function": act, "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied, "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if a.family == "starcoder2":
        act = {"gelu_new": "gelu_pytorch_tanh"}.get(act, act)
    cfg = {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "hidden_size": a.width,
           "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "hidden_act": act,
           "max_position_embeddings": _max_positions(a),
           "tie_word_embeddings": a.tied,
           "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base, "partial_rotary_factor": a.rotary})}
    if a.family in ("phi", "starcoder2"):
        cfg["num_key_value_heads"] = a.kv_heads
    elif a.kv_heads != a.heads:
        raise Unsupported("kv_heads", f"{a.family} has as many key/value heads as query heads")
    if a.family == "starcoder2":
        cfg.update(norm_epsilon=a.eps, use_bias=a.qkv_bias, sliding_window=a.window, pad_token_id=a.padding, residual_dropout=0.0,
                   embedding_dropout=0.0)
    else:
        cfg.update(layer_norm_eps=a.eps)
    if a.family == "phi":
        if a.qk_norm not in ("none", "head") or (a.qk_norm == "head" and (a.qk_type, a.qk_bias, a.qk_eps, a.qk_offset, a.qk_affine, a.qk_late,
                                                                          a.qk_heads) != ("layernorm", True, a.eps, 0.0, True, False, False)):
            raise Unsupported("qk_norm", "Phi's qk-norms (qk_layernorm) are LayerNorms with a bias over each head's dims, shared by the heads, "
                              "before rotary, with the norms' eps")
        cfg.update(qk_layernorm=a.qk_norm == "head", pad_token_id=a.padding, resid_pdrop=0.0, embd_pdrop=0.0)
    if a.family == "gpt_neox":
        cfg.update(use_parallel_residual=a.parallel == "separate", attention_bias=a.qkv_bias, hidden_dropout=0.0)
    return cfg
