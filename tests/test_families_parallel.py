"""The parallel-block, interleaved-rotary and fused-projection families (interop/families_parallel.py):
Cohere, Cohere 2, GLM, GLM-4, StableLM, CodeGen, MPT.

Each family's round trip (tests/roundtrip.py) at a tiny config that exercises what makes it itself:
Cohere's one bias-free LayerNorm in a parallel block, interleaved rotary and logit scale; Cohere 2's
sliding layers with rotary beside global layers without; GLM's half-interleaved rotary and fused
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
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402
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
