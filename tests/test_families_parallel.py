"""The parallel-block, interleaved-rotary and fused-projection families (interop/families/parallel.py):
Cohere, Cohere 2, Cohere 2 MoE, Cohere Compass (text), GLM, GLM-4, StableLM, CodeGen, MPT.

Each family's round trip (tests/roundtrip.py) at a tiny config that exercises what makes it itself:
Cohere's one bias-free LayerNorm in a parallel block, interleaved rotary and logit scale; Cohere 2's
sliding layers with rotary beside global layers without (Cohere 2 MoE with routed and shared experts,
Cohere Compass with rotary on the halves and its rope parameters per layer type); GLM's half-interleaved rotary and fused
gate_up; GLM-4's norms after each turbine; StableLM's partial rotary, q/k/v biases and both residual
forms; CodeGen's fused qkv in 4 groups of [q | v | k]; MPT's ALiBi (6 heads: the slopes past a power
of two), fused Wqkv and softmax_scale. Then each option the language lacks is refused by name, and
each quirk is shown to matter: the family's spec with it edited out computes other logits.
"""

from __future__ import annotations

import json

import pytest

import cyclelang

from .conftest import need
from .roundtrip import V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import InteropError, Unsupported, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402

FAMILIES = {
    "cohere": lambda: transformers.CohereConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                                                num_key_value_heads=2, max_position_embeddings=40, layer_norm_eps=1e-4, logit_scale=0.3,
                                                rope_parameters={"rope_type": "default", "rope_theta": 3000.0}, pad_token_id=3,
                                                bos_token_id=0, eos_token_id=1),
    "cohere_biased_untied": lambda: transformers.CohereConfig(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                                              num_attention_heads=4, max_position_embeddings=40, attention_bias=True,
                                                              tie_word_embeddings=False, hidden_act="gelu", pad_token_id=None,
                                                              bos_token_id=0, eos_token_id=1),
    "cohere2": lambda: transformers.Cohere2Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=40, sliding_window=5, logit_scale=0.5,
                                                  layer_norm_eps=1e-4, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                                                  pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "cohere2_global_first": lambda: transformers.Cohere2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                                               num_attention_heads=4, max_position_embeddings=40, sliding_window=4,
                                                               layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                                                               attention_bias=True, tie_word_embeddings=False, pad_token_id=None,
                                                               bos_token_id=0, eos_token_id=1),
    "cohere2_all_global": lambda: transformers.Cohere2Config(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                                             num_attention_heads=2, max_position_embeddings=40, sliding_window=3,
                                                             layer_types=["full_attention"] * 2, pad_token_id=1, bos_token_id=0, eos_token_id=1),
    "cohere2_moe": lambda: transformers.Cohere2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=4,
                                                         num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
                                                         sliding_window=5, num_experts=4, num_experts_per_tok=2, logit_scale=0.4,
                                                         layer_norm_eps=1e-4, rope_theta=4000.0, pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "cohere2_moe_shared_rms": lambda: transformers.Cohere2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                                                                    num_attention_heads=2, head_dim=16, max_position_embeddings=40, sliding_window=4,
                                                                    sliding_window_pattern=2, num_experts=3, num_experts_per_tok=1,
                                                                    num_shared_experts=2, shared_expert_combination_strategy="sum",
                                                                    rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=None,
                                                                    bos_token_id=0, eos_token_id=1),
    "cohere_compass_text": lambda: transformers.CohereCompassTextConfig(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=40, sliding_window=5, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 3000.0, "mrope_section": [4, 1, 1]}, "full_attention": None},
        logit_scale=0.4, layer_norm_eps=1e-4, pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "cohere_compass_text_global_rotary": lambda: transformers.CohereCompassTextConfig(
        vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=40,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}, attention_bias=True, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=0, eos_token_id=1),
    "glm": lambda: transformers.GlmConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, max_position_embeddings=40, rms_norm_eps=1e-5, pad_token_id=2,
                                          eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 7000.0, "partial_rotary_factor": 0.5}),
    "glm_full_rotary_tied": lambda: transformers.GlmConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                           num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=40,
                                                           attention_bias=False, tie_word_embeddings=True, pad_token_id=None, eos_token_id=1,
                                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                            "partial_rotary_factor": 1.0}),
    "glm4": lambda: transformers.Glm4Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                                            num_key_value_heads=2, head_dim=8, max_position_embeddings=40, rms_norm_eps=1e-5, pad_token_id=2,
                                            eos_token_id=1),
    "stablelm": lambda: transformers.StableLmConfig(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=3,
                                                    num_key_value_heads=1, max_position_embeddings=40, layer_norm_eps=1e-4, use_qkv_bias=True,
                                                    pad_token_id=3, bos_token_id=0, eos_token_id=1),
    "stablelm_parallel": lambda: transformers.StableLmConfig(vocab_size=V, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                                                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=40,
                                                             use_parallel_residual=True, tie_word_embeddings=True,
                                                             rope_parameters={"rope_type": "default", "rope_theta": 2000.0,
                                                                              "partial_rotary_factor": 0.5},
                                                             bos_token_id=0, eos_token_id=1),
    "codegen": lambda: transformers.CodeGenConfig(vocab_size=V, n_positions=40, n_ctx=40, n_embd=48, n_layer=2, n_head=4, rotary_dim=6, n_inner=80,
                                                  layer_norm_epsilon=1e-4, bos_token_id=0, eos_token_id=1),
    "codegen_full_rotary_tied": lambda: transformers.CodeGenConfig(vocab_size=V, n_positions=40, n_embd=32, n_layer=2, n_head=2, rotary_dim=16,
                                                                   activation_function="gelu", tie_word_embeddings=True, bos_token_id=0,
                                                                   eos_token_id=1),
    "mpt": lambda: transformers.MptConfig(vocab_size=V, d_model=48, n_heads=6, n_layers=2, max_seq_len=40, layer_norm_epsilon=1e-4),
    "mpt_scaled_untied": lambda: transformers.MptConfig(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=40, tie_word_embeddings=False,
                                                        attn_config={"softmax_scale": 0.2, "attn_impl": "torch"}),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


# --- what the language lacks is refused by name ----------------------------------------------------------


def _config(name: str, **over) -> dict:
    """The family's test config as config.json holds it, with some keys changed (attn_config: merged)."""
    d = FAMILIES[name]().to_dict()
    if isinstance(over.get("attn_config"), dict):
        over["attn_config"] = {**d["attn_config"], **over["attn_config"]}
    return {**d, **over}


REFUSED = [
    ("cohere", {"rope_parameters": {"rope_type": "linear", "rope_theta": 3000.0, "factor": 2.0}}, "rope_parameters.rope_type", "not mapped"),
    ("cohere", {"rope_parameters": {"rope_type": "default", "rope_theta": 3000.0, "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor", "every dim"),
    ("cohere", {"logit_scale": None}, "logit_scale", "non-zero"),
    ("cohere2", {"sliding_window": None}, "sliding_window", "null"),
    ("cohere2", {"head_dim": 16}, "head_dim", "hidden_size / num_attention_heads"),
    ("cohere2", {"use_qk_norm": True}, "use_qk_norm", "not a key"),
    ("cohere2_moe", {"expert_selection_fn": "sigmoid"}, "expert_selection_fn", "sigmoid"),
    ("cohere2_moe", {"num_shared_experts": 1}, "shared_expert_combination_strategy", "averaged"),
    ("cohere2_moe", {"mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]}, "mlp_layer_types", "dense layers"),
    ("cohere2_moe", {"num_experts_per_tok": 5}, "num_experts_per_tok", "top-5 of 4"),
    ("cohere2_moe", {"rope_parameters": {"rope_type": "default", "rope_theta": 9.0}}, "rope_parameters", "differ"),
    ("cohere2_moe", {"rope_parameters": "default"}, "rope_parameters", "not an object"),
    ("cohere2_moe", {"first_k_dense_replace": 1}, "first_k_dense_replace", "not a key"),
    ("cohere_compass_text", {"rope_parameters": {}}, "rope_parameters.sliding_attention", "missing"),
    ("cohere_compass_text", {"rope_parameters": {"sliding_attention": {"rope_theta": 3000.0}, "full_attention": {"rope_theta": 50.0}}},
     "rope_parameters", "bases differ"),
    ("cohere_compass_text", {"rope_parameters": {"sliding_attention": None, "full_attention": {"rope_theta": 50.0}}},
     "rope_parameters.sliding_attention", "reverse"),
    ("cohere_compass_text", {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "rope_theta": 3.0, "factor": 2.0},
                                                 "full_attention": None}}, "rope_parameters.sliding_attention.rope_type", "not mapped"),
    ("cohere_compass_text", {"rope_parameters": {"sliding_attention": {"rope_theta": None}, "full_attention": None}},
     "rope_parameters.sliding_attention.rope_theta", "positive"),
    ("cohere_compass_text", {"rope_parameters": {"sliding_attention": {"rope_theta": 3.0, "beta": 1}, "full_attention": None}},
     "rope_parameters.sliding_attention.beta", "not a rope parameter"),
    ("cohere_compass_text", {"rope_parameters": {"sliding_attention": None, "full_attention": None, "chunked_attention": None}},
     "rope_parameters.chunked_attention", "not a layer type"),
    ("cohere_compass_text", {"sliding_window": None}, "sliding_window", "null"),
    ("cohere_compass_text", {"head_dim": 24}, "head_dim", "hidden_size / num_attention_heads"),
    ("glm", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 7000.0, "factor": 2.0, "partial_rotary_factor": 0.5}},
     "rope_parameters.rope_type", "not mapped"),
    ("glm", {"rope_parameters": {"rope_type": "default", "rope_theta": 7000.0, "partial_rotary_factor": 0.3125}}, "partial_rotary_factor", "odd"),
    ("codegen", {"rotary_dim": None}, "rotary_dim", "null"),
    ("codegen", {"rotary_dim": 5}, "rotary_dim", "even"),
    ("codegen", {"rotary_dim": 14}, "rotary_dim", "even"),
    ("codegen", {"n_embd": 18, "n_head": 3}, "n_embd", "groups of rows"),
    ("codegen", {"scale_attn_weights": False}, "scale_attn_weights", "1/sqrt(head_dim)"),
    ("mpt", {"attn_config": {"clip_qkv": 6.0}}, "attn_config.clip_qkv", "clamping"),
    ("mpt", {"attn_config": {"qk_ln": True}}, "attn_config.qk_ln", "LayerNorm over all heads"),
    ("mpt", {"attn_config": {"prefix_lm": True}}, "attn_config.prefix_lm", "prefix"),
    ("mpt", {"attn_config": {"attn_uses_sequence_id": True}}, "attn_config.attn_uses_sequence_id", "packed"),
    ("mpt", {"attn_config": {"attn_type": "multiquery_attention"}}, "attn_config.attn_type", "multi-head"),
    ("mpt", {"attn_config": {"alibi": False}}, "attn_config.alibi", "ALiBi"),
    ("mpt", {"attn_config": {"alibi_bias_max": 16}}, "attn_config.alibi_bias_max", "slopes"),
    ("mpt", {"attn_config": {"rope": True}}, "attn_config.rope", "MptAttentionConfig"),
    ("mpt", {"attn_config": {"softmax_scale": -1.0}}, "attn_config.softmax_scale", "positive"),
    ("mpt", {"attn_config": "torch"}, "attn_config", "object"),
    ("mpt", {"expansion_ratio": 2}, "expansion_ratio", "4 x d_model"),
    ("mpt", {"no_bias": False}, "no_bias", "no biases"),
    ("mpt", {"logit_scale": 0.5}, "logit_scale", "does not read"),
    ("mpt", {"learned_pos_emb": False}, "learned_pos_emb", "default"),
]


@pytest.mark.parametrize("name, over, field, words", REFUSED, ids=[f"{n}-{f}-{i}" for i, (n, _, f, _) in enumerate(REFUSED)])
def test_unexpressible_option_refused_by_name(name, over, field, words):
    with pytest.raises(Unsupported) as e:
        read_config(_config(name, **over))
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_cohere2_legacy_pattern_and_inert_keys_read_as_transformers_does():
    """sliding_window_pattern (popped by Cohere2Config) says which layers are global when layer_types is absent;
    MPT's attn_impl and attn_pdrop, CodeGen's n_ctx change nothing."""
    cfg = {k: v for k, v in _config("cohere2").items() if k != "layer_types"}
    a = read_config({**cfg, "num_hidden_layers": 4, "sliding_window_pattern": 2})
    assert a.layer_windows == (5, None, 5, None)
    assert read_config(_config("mpt", attn_config={"attn_impl": "flash", "attn_pdrop": 0.1})) == read_config(_config("mpt"))
    assert read_config(_config("codegen", n_ctx=7)) == read_config(_config("codegen"))
    # keys released configs carry that transformers' classes do not declare (mpt-7b's, codegen-350M's, command-r's)
    assert read_config(_config("mpt", init_config={"name": "kaiming_normal_"}, verbose=0, tokenizer_name="EleutherAI/gpt-neox-20b")) \
        == read_config(_config("mpt"))
    assert read_config(_config("codegen", scale_attn_weights=True, gradient_checkpointing=False, summary_type="cls_index")) \
        == read_config(_config("codegen"))
    assert read_config(_config("cohere", model_max_length=131072)) == read_config(_config("cohere"))


# --- each quirk matters: the family's spec with it edited out computes other logits ---------------------


def _imported(tmp_path, name):
    ref = hf(FAMILIES[name]())
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    text = import_config(ckpt)
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ckpt)
    with torch.no_grad():
        assert rel(ours(ids()), ref(ids()).logits) < 1e-5
    return ref, ours, text, ckpt


QUIRKS = [
    ("cohere", " rotary_interleaved", ""),  # GPT-J's pairs, not the halves
    ("cohere", " scale=0.3", ""),  # the logit scale
    ("cohere2", "heads=4 kv_heads=2 bias=false", "heads=4 kv_heads=2 rotary rotary_interleaved rotary_base=5000 bias=false"),  # global: no rotary
    ("cohere_compass_text", " rotary rotary_base=3000", " rotary rotary_interleaved rotary_base=3000"),  # the halves, not pairs
    ("glm", " rotary_interleaved", ""),
    ("glm", "rotary=0.5", "rotary"),  # half of each head, not all of it
    ("stablelm", "rotary=0.25", "rotary=0.25 rotary_interleaved"),  # the halves, not pairs
    ("codegen", " rotary_interleaved", ""),
    ("mpt", " alibi ", " alibi alibi_scaled "),  # the bias after the scale
]


@pytest.mark.parametrize("name, old, new", QUIRKS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(QUIRKS)])
def test_the_quirk_edited_out_changes_the_logits_and_is_refused(tmp_path, name, old, new):
    ref, ours, text, ckpt = _imported(tmp_path, name)
    assert old in text
    edited = build(cyclelang.parse(text.replace(old, new)), seed=0).eval()
    edited.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert rel(edited(ids()), ref(ids()).logits) > 1e-3
    with pytest.raises(InteropError):
        load_transformers(build(cyclelang.parse(text.replace(old, new)), seed=0), ckpt)


def test_glm4_post_norms_are_each_their_own(tmp_path):
    """GLM-4's four norms per layer load into four valves: the spec without the norms after the turbines is refused."""
    _, ours, text, ckpt = _imported(tmp_path, "glm4")
    assert text.count("norm rmsnorm eps=1e-05") == 4 + 1
    norms = [k for k in ours.state_dict() if k.startswith("stages.0.") and "norm" in k]
    assert len(norms) == 4, norms
    lines = text.splitlines()
    posts = [i for i, ln in enumerate(lines) if ln.strip() == "norm rmsnorm eps=1e-05" and "turbine" in lines[i - 1]]
    assert len(posts) == 2
    plain = "\n".join(ln for i, ln in enumerate(lines) if i not in posts)
    with pytest.raises(InteropError):
        load_transformers(build(cyclelang.parse(plain), seed=0), ckpt)


def test_codegen_qkv_rows_come_in_mp_num_groups(tmp_path):
    """CodeGen's fused rows read as [q | k | v] (no regrouping) give other logits: the 4 groups of [q | v | k] are mapped."""
    ref, ours, _, _ = _imported(tmp_path, "codegen")
    state = ours.state_dict()
    key = next(k for k in state if k.endswith(".qkv.weight"))
    state[key] = ref.state_dict()["transformer.h.0.attn.qkv_proj.weight"]
    ours.load_state_dict(state)
    with torch.no_grad():
        assert rel(ours(ids()), ref(ids()).logits) > 1e-3


def test_mpt_alibi_slopes_past_a_power_of_two_are_mpts(tmp_path):
    """MPT's slopes for 6 heads (its interleave of 8's) are the language's (BLOOM's) series."""
    from cyclelang.backends.torch.runtime.positions import alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    for heads in (1, 4, 6, 12):
        mpt = build_mpt_alibi_tensor(heads, 3)[:, 0, 1] * -1  # (heads,): the slope of each, from the bias one key back
        assert torch.allclose(mpt.float(), alibi_slopes(heads).float(), rtol=1e-6), heads


@pytest.mark.parametrize("name, legacy", [
    ("cohere", {"rope_theta": 3000.0}),  # command-r's config.json: rope_theta, no rope_parameters
    ("stablelm", {"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_scaling": None}),
    ("glm", {"rope_theta": 7000.0, "partial_rotary_factor": 0.5}),
])
def test_legacy_rope_keys_read_as_transformers_reads_them(tmp_path, name, legacy):
    """A released config.json with the rotary keys at the top level (and no rope_parameters) loads as from_pretrained reads it."""
    ckpt = tmp_path / "ckpt"
    hf(FAMILIES[name]()).save_pretrained(ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["rope_parameters"]
    (ckpt / "config.json").write_text(json.dumps({**cfg, **legacy}))
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ours = load_transformers(build(cyclelang.parse(import_config(ckpt)), seed=0).eval(), ckpt)
    with torch.no_grad():
        assert rel(ours(ids()), ref(ids()).logits) < 1e-5
