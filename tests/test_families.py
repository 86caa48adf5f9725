"""Every supported transformers family, both directions, against the model itself.

For each family a tiny random transformers model at a config unlike the spec
library's (odd widths, GQA, head_dim set apart from width/heads, tied or untied,
non-default eps and rope base): `cyclec import` -> build -> load its (perturbed)
weights -> logits within 1e-5 relative in float32, loss equal, greedy decoding
identical, every gradient within 1e-5; then `cyclec export` -> `from_pretrained` ->
the same logits. Then each defect the issue lists: a checkpoint whose config implies
another engine is refused, naming the first differing field in both vocabularies.
Nothing is downloaded: every model is built from a config with random weights.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

import cyclelang

from .conftest import ROOT, need
from .roundtrip import B, V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.cli import main  # noqa: E402
from cyclelang.interop import InteropError, Unsupported, import_config, load_transformers  # noqa: E402


FAMILIES = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=V, n_positions=40, n_embd=48, n_layer=3, n_head=6, n_inner=72,
                                            layer_norm_epsilon=1e-6, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt2_relu_untied": lambda: transformers.GPT2Config(vocab_size=V, n_positions=40, n_embd=32, n_layer=2, n_head=2, activation_function="relu",
                                                        tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": lambda: transformers.LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                                              num_key_value_heads=2, head_dim=12, max_position_embeddings=40, rms_norm_eps=1e-5,
                                              rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, attention_bias=True, mlp_bias=True),
    "mistral": lambda: transformers.MistralConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=1, head_dim=16, max_position_embeddings=40, sliding_window=5, tie_word_embeddings=True),
    "mixtral": lambda: transformers.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=40, num_local_experts=3, num_experts_per_tok=2,
                                                  sliding_window=None),
    "mixtral_top1": lambda: transformers.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                                       num_key_value_heads=4, max_position_embeddings=40, num_local_experts=4, num_experts_per_tok=1,
                                                       sliding_window=7),
    "qwen3": lambda: transformers.Qwen3Config(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=16, max_position_embeddings=40, rms_norm_eps=1e-5,
                                              tie_word_embeddings=True),
    "phi3": lambda: transformers.Phi3Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                                            num_key_value_heads=3, max_position_embeddings=40, pad_token_id=5),
    "olmo": lambda: transformers.OlmoConfig(vocab_size=V, hidden_size=40, intermediate_size=56, num_hidden_layers=2, num_attention_heads=5,
                                            num_key_value_heads=5, max_position_embeddings=40, pad_token_id=1, eos_token_id=0),
    "olmo2": lambda: transformers.Olmo2Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                                              num_key_value_heads=2, max_position_embeddings=40, pad_token_id=1, eos_token_id=0, rms_norm_eps=1e-6),
    "gemma": lambda: transformers.GemmaConfig(vocab_size=V, hidden_size=32, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=1, head_dim=16, max_position_embeddings=40, pad_token_id=0, eos_token_id=1,
                                              bos_token_id=2),
    "granite": lambda: transformers.GraniteConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=40, embedding_multiplier=12.0,
                                                  residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0, pad_token_id=0),
    "phi": lambda: transformers.PhiConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=40, bos_token_id=0, eos_token_id=1, layer_norm_eps=1e-6),
    "starcoder2": lambda: transformers.Starcoder2Config(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                                                        num_key_value_heads=2, max_position_embeddings=40, sliding_window=6, bos_token_id=0,
                                                        eos_token_id=1),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(vocab_size=V, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                                   max_position_embeddings=40, bos_token_id=0, eos_token_id=1),
    "gpt_neox_sequential": lambda: transformers.GPTNeoXConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                                              num_attention_heads=6, max_position_embeddings=40, bos_token_id=0, eos_token_id=1,
                                                              use_parallel_residual=False,
                                                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "gptj": lambda: transformers.GPTJConfig(vocab_size=V, n_positions=40, n_embd=48, n_layer=2, n_head=4, rotary_dim=6, n_inner=80,
                                            bos_token_id=0, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "falcon": lambda: transformers.FalconConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=40,
                                                bos_token_id=0, eos_token_id=1, layer_norm_epsilon=1e-6),
    "falcon_sequential": lambda: transformers.FalconConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=4,
                                                           multi_query=False, parallel_attn=False, bias=True, ffn_hidden_size=64,
                                                           max_position_embeddings=40, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, max_position_embeddings=40, num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=24, shared_expert_intermediate_size=40),
    "qwen2_moe_normalized": lambda: transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=40, num_experts=3,
                                                                num_experts_per_tok=1, moe_intermediate_size=24, shared_expert_intermediate_size=16,
                                                                norm_topk_prob=True, qkv_bias=False),
    # the expander families: Mamba-1, the Jamba hybrid, DeepSeek-V2's latent attention and DeepSeekMoE
    "mamba2": lambda: transformers.Mamba2Config(vocab_size=V, hidden_size=24, num_heads=4, head_dim=12, state_size=6, n_groups=2, expand=2,
                                                conv_kernel=3, chunk_size=5, num_hidden_layers=2, layer_norm_epsilon=1e-6, tie_word_embeddings=False,
                                                time_step_limit=(0.01, 2.0), pad_token_id=None, bos_token_id=None, eos_token_id=None),
    "mamba": lambda: transformers.MambaConfig(vocab_size=V, hidden_size=24, state_size=6, num_hidden_layers=2, expand=2, conv_kernel=3,
                                              time_step_rank=5, layer_norm_epsilon=1e-6, use_conv_bias=True, pad_token_id=None, bos_token_id=None,
                                              eos_token_id=None),
    "mamba_untied_biased": lambda: transformers.MambaConfig(vocab_size=V, hidden_size=32, state_size=4, num_hidden_layers=2, expand=1,
                                                            conv_kernel=4, use_bias=True, use_conv_bias=False, tie_word_embeddings=False,
                                                            pad_token_id=None, bos_token_id=None, eos_token_id=None),
    "jamba": lambda: transformers.JambaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                                              num_key_value_heads=2, num_experts=3, num_experts_per_tok=2, attn_layer_period=4, attn_layer_offset=2,
                                              expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                                              mamba_dt_rank=5, rms_norm_eps=1e-5, max_position_embeddings=40, pad_token_id=None,
                                              bos_token_id=None, eos_token_id=None),
    "jamba_padded_tied": lambda: transformers.JambaConfig(vocab_size=V, hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=2,
                                                          num_key_value_heads=2, num_experts=4, num_experts_per_tok=1, attn_layer_period=3,
                                                          attn_layer_offset=0, expert_layer_period=3, expert_layer_offset=2, mamba_d_state=4,
                                                          mamba_d_conv=3, mamba_expand=1, mamba_proj_bias=True, rms_norm_eps=1e-6,
                                                          max_position_embeddings=40, tie_word_embeddings=True, pad_token_id=3,
                                                          bos_token_id=None, eos_token_id=None),
    "jamba_nested": lambda: transformers.JambaConfig(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=8, num_attention_heads=2,
                                                     num_key_value_heads=1, num_experts=2, num_experts_per_tok=1, attn_layer_period=4,
                                                     attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4,
                                                     mamba_d_conv=2, mamba_expand=2, mamba_dt_rank=3, rms_norm_eps=1e-5, max_position_embeddings=40,
                                                     pad_token_id=None, bos_token_id=None, eos_token_id=None),
    "deepseek_v2": lambda: transformers.DeepseekV2Config(vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                                         num_hidden_layers=3, num_attention_heads=4, q_lora_rank=24, kv_lora_rank=16,
                                                         qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=4, n_shared_experts=1,
                                                         num_experts_per_tok=2, first_k_dense_replace=1, max_position_embeddings=40,
                                                         rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                                                         pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager"),
    "deepseek_v2_full_q_biased": lambda: transformers.DeepseekV2Config(vocab_size=V, hidden_size=48, intermediate_size=40, moe_intermediate_size=12,
                                                                       num_hidden_layers=3, num_attention_heads=3, q_lora_rank=None, kv_lora_rank=8,
                                                                       qk_nope_head_dim=6, qk_rope_head_dim=2, v_head_dim=10, n_routed_experts=3,
                                                                       n_shared_experts=2, num_experts_per_tok=1, first_k_dense_replace=0,
                                                                       attention_bias=True, max_position_embeddings=40, tie_word_embeddings=True,
                                                                       pad_token_id=None, bos_token_id=None, eos_token_id=None,
                                                                       attn_implementation="eager"),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=12,  # routing: test_families_deepseek.py
                                                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
                                                         kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8,
                                                         n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                                         first_k_dense_replace=1, max_position_embeddings=40, pad_token_id=None, bos_token_id=None,
                                                         eos_token_id=None),
    "qwen2": lambda: transformers.Qwen2Config(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=6,
                                              num_key_value_heads=3, max_position_embeddings=40, tie_word_embeddings=True, rms_norm_eps=1e-6,
                                              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
}
FAMILIES.update({  # rotary scaling, each at T = 12 past its original context of 8 (linear: at every length)
    "llama_rope_linear": lambda: transformers.LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
                                                          rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.5}),
    "llama_rope_llama3": lambda: transformers.LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
                                                          rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    "llama_rope_yarn": lambda: transformers.LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                                        num_key_value_heads=2, head_dim=12, max_position_embeddings=32,
                                                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                                         "original_max_position_embeddings": 8, "beta_fast": 16.0, "beta_slow": 2.0,
                                                                         "mscale": 0.707, "mscale_all_dim": 1.0}),
    # Gemma 2: soft-caps low enough to bite, query_pre_attn_scalar apart from head_dim, local/global layers with a window under T
    "gemma2": lambda: transformers.Gemma2Config(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
                                                num_key_value_heads=2, head_dim=16, max_position_embeddings=40, sliding_window=5,
                                                query_pre_attn_scalar=24, attn_logit_softcapping=3.0, final_logit_softcapping=2.5, pad_token_id=0,
                                                eos_token_id=1, bos_token_id=2, attn_implementation="eager"),
    "gemma2_global_untied": lambda: transformers.Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                              num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=40,
                                                              layer_types=["full_attention"] * 2, attn_logit_softcapping=None, final_logit_softcapping=4.0,
                                                              tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                                                              attn_implementation="eager"),
    # Falcon with ALiBi in place of rotary (its bias scaled with the logits), parallel multi-query and sequential
    "falcon_alibi": lambda: transformers.FalconConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=40,
                                                      alibi=True, bos_token_id=0, eos_token_id=1, layer_norm_epsilon=1e-6),
    "falcon_alibi_sequential": lambda: transformers.FalconConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
                                                                 num_kv_heads=6, multi_query=False, parallel_attn=False, bias=True, alibi=True,
                                                                 ffn_hidden_size=64, max_position_embeddings=40, bos_token_id=0, eos_token_id=1),
    # Falcon's new decoder: grouped kv heads in its fused rows, two norms per parallel block (ln_attn, ln_mlp), or one
    "falcon_new_decoder": lambda: transformers.FalconConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_kv_heads=2,
                                                            new_decoder_architecture=True, bias=False, ffn_hidden_size=64, max_position_embeddings=40,
                                                            bos_token_id=0, eos_token_id=1, layer_norm_epsilon=1e-6),
    "falcon_new_decoder_one_norm": lambda: transformers.FalconConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                                                     num_kv_heads=2, new_decoder_architecture=True, num_ln_in_parallel_attn=1,
                                                                     bias=True, max_position_embeddings=40, bos_token_id=0, eos_token_id=1,
                                                                     tie_word_embeddings=False),
    # Qwen2-MoE's dense layers among the routed ones: the first dense (mlp_only_layers), and every other one sparse (decoder_sparse_step)
    "qwen2_moe_first_dense": lambda: transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=3,
                                                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40, num_experts=4,
                                                                 num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                                                 mlp_only_layers=[0]),
    "qwen2_moe_sparse_step": lambda: transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=56, num_hidden_layers=4,
                                                                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=40, num_experts=3,
                                                                 num_experts_per_tok=1, moe_intermediate_size=24, shared_expert_intermediate_size=16,
                                                                 decoder_sparse_step=2, norm_topk_prob=True),
    # Qwen2-MoE's own default window pattern (every other layer below max_window_layers), not Qwen2's
    "qwen2_moe_sliding": lambda: transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                                             num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                                             shared_expert_intermediate_size=40, use_sliding_window=True, sliding_window=3,
                                                             max_window_layers=4),
    # Qwen2's sliding window from max_window_layers on, and Qwen3's from layer_types: global then local layers
    "qwen2_window_from_layer": lambda: transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                                                use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "qwen3_layer_types": lambda: transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                                          num_key_value_heads=2, head_dim=8, max_position_embeddings=40, use_sliding_window=True,
                                                          sliding_window=5, layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    # the families that are a claimed one under another name: Llama's function (Seed-OSS with its own output bias),
    # Ministral's sliding window on the sliding layers only, Ministral 3 without Llama 4's query scaling
    "internlm3": lambda: transformers.InternLM3Config(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=16, max_position_embeddings=40, attention_bias=True,
                                                      mlp_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 20000.0}),
    "iquestcoder": lambda: transformers.IQuestCoderConfig(vocab_size=V, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
                                                          num_key_value_heads=1, max_position_embeddings=40, mlp_bias=True, tie_word_embeddings=True),
    "seed_oss": lambda: transformers.SeedOssConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                   num_key_value_heads=2, head_dim=12, max_position_embeddings=40, attention_bias=True,
                                                   attention_out_bias=False, pad_token_id=3, residual_dropout=0.0, attention_dropout=0.0),
    # Emu3's text decoder: AutoModelForCausalLM builds Emu3ForCausalLM from the text config and saves it as emu3_text_model
    "emu3": lambda: transformers.Emu3Config(
        text_config=dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=40, rms_norm_eps=1e-6, pad_token_id=3, bos_token_id=1, eos_token_id=2, attention_dropout=0.0,
                         rope_parameters={"rope_type": "default", "rope_theta": 20000.0}),
        vq_config=dict(embed_dim=8, codebook_size=16, base_channels=8, channel_multiplier=[1], num_res_blocks=1, attn_resolutions=[],
                       latent_channels=8, out_channels=3, in_channels=3, double_latent=False, temporal_downsample_factor=1)),
    "ministral": lambda: transformers.MinistralConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=12, max_position_embeddings=40, sliding_window=5,
                                                      layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    "ministral3": lambda: transformers.Ministral3Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                        num_key_value_heads=2, head_dim=12, max_position_embeddings=32, sliding_window=6,
                                                        rope_parameters={"rope_type": "yarn", "rope_theta": 30000.0, "factor": 4.0,
                                                                         "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                                                                         "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.0}),
    # ... and with it: the queries' temperature steps up at positions 3, 6, 9 and on through greedy decoding
    "ministral3_temperature": lambda: transformers.Ministral3Config(
        vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
        max_position_embeddings=32, rope_parameters={"rope_type": "yarn", "rope_theta": 30000.0, "factor": 4.0, "original_max_position_embeddings": 3,
                                                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.4}),
    # BLOOM: ALiBi added after the scale, a LayerNorm after the embedding; 6 heads (slopes interleaved past 4)
    "bloom": lambda: transformers.BloomConfig(vocab_size=V, hidden_size=48, n_layer=2, n_head=6, layer_norm_epsilon=1e-6, bos_token_id=0,
                                              eos_token_id=1, seq_length=40),
})


# these two take over half a second each: the full run (mamba and jamba stay in the fast tier)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in {"mamba2", "jamba_padded_tied"} else n
                                  for n in sorted(FAMILIES)])
def test_family_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def test_import_is_formatted_commented_and_repeats_a_template():
    text = import_config(FAMILIES["llama"]())
    from cyclelang.syntax.fmt import format_text

    assert text == format_text(text)
    assert re.search(r"let depth = 3\s+# num_hidden_layers", text)
    assert re.search(r"stage llama_block x depth", text)
    assert "rotary_base=5000" in text and "head_dim=12" in text and "eps=1e-05" in text


# --- checkpoints whose config implies another engine are refused -------------------------------


def spec_of(config, subs=None):
    text = import_config(config)
    for pat, rep in (subs or {}).items():
        new = re.sub(pat, rep, text)
        assert new != text, pat
        text = new
    return build(cyclelang.parse(text), seed=0).eval()


def refusal(spec_config, source, subs=None, **kw):
    ours = spec_of(spec_config, subs)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(InteropError) as info:
        load_transformers(ours, source, **kw)
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items()), "nothing is copied on error"
    return info.value


def llama(**over):
    return transformers.LlamaConfig(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, max_position_embeddings=40), **over})


def gpt2(**over):
    return transformers.GPT2Config(**{**dict(vocab_size=V, n_positions=40, n_embd=32, n_layer=2, n_head=4), **over})


def mixtral(**over):
    return transformers.MixtralConfig(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, max_position_embeddings=40, num_local_experts=4), **over})


SPEC_CHANGES = {  # a spec edited away from a plain Llama checkpoint: (regex, replacement, field named)
    "half rotary": (r"rotary bias", "rotary=0.5 bias", "rotary positions (turbine attention rotary=): spec 4 of each head's 8 dims, checkpoint all of each head (8 dims)"),
    "no rotary": (r"rotary bias", "bias", "rotary positions (turbine attention rotary=): spec none, checkpoint all of each head"),
    "merge scale": (r"(turbine mlp[^\n]*)", r"\1\n    merge scale=0.5", "residual merge (merge): spec scale, checkpoint add"),
    "feed scale": (r"position=none", "position=none scale=8", "embedding multiplier (feed tokens scale=): spec 8, checkpoint 1"),
    "gelu gate": (r"act=swiglu", "act=geglu", "activation (act=): spec geglu, checkpoint swiglu"),
}


@pytest.mark.parametrize("change", sorted(SPEC_CHANGES))
def test_plain_llama_refused_by_an_edited_spec(change):
    pat, rep, words = SPEC_CHANGES[change]
    err = refusal(llama(), hf(llama()), {pat: rep})
    assert words in str(err), str(err)


def test_two_rotary_bases_refused():
    text = import_config(llama())
    text = text.replace("stage llama_block x depth", "stage llama_block\n  stage second {\n"
                        "    prechamber mix { norm rmsnorm  turbine attention heads=4 kv_heads=2 rotary rotary_base=500 bias=false }\n"
                        "    prechamber burn { norm rmsnorm  turbine mlp hidden=48 act=swiglu bias=false }\n  }")
    ours = build(cyclelang.parse(text), seed=0)
    with pytest.raises(InteropError) as info:
        load_transformers(ours, hf(llama()))
    assert info.value.key == "stages.1.mix.attn" and "rotary base (rope_theta)" in str(info.value) and "spec 500, checkpoint 10000" in str(info.value)


def test_parallel_block_refused():
    text = import_config(llama())
    text = re.sub(r"stage llama_block \{.*?\n\}\n", "stage llama_block {\n  fullflow par {\n    norm rmsnorm\n"
                  "    prechamber mix { turbine attention heads=4 kv_heads=2 rotary bias=false }\n"
                  "    prechamber burn { turbine mlp hidden=48 act=swiglu bias=false }\n  }\n}\n", text, flags=re.S)
    ours = build(cyclelang.parse(text), seed=0)
    with pytest.raises(InteropError) as info:
        load_transformers(ours, hf(llama()))
    assert "block structure (the statement): spec parallel, checkpoint branch" in str(info.value)


CONFIG_CHANGES = {  # a checkpoint whose config differs from the spec imported from the plain config
    "llama hidden_act=gelu": (llama, dict(hidden_act="gelu"), "activation (act=): spec swiglu, checkpoint geglu"),
    "mixtral top-2 into top=3": (lambda **o: mixtral(**{"num_experts_per_tok": 3, **o}), dict(num_experts_per_tok=2),
                                 "experts per token (top-k) (turbine moe top=): spec 3, checkpoint 2"),
    "gpt2 relu": (gpt2, dict(activation_function="relu"), "activation (act=): spec gelu_tanh, checkpoint relu"),
    "llama tied into untied": (llama, dict(tie_word_embeddings=True), "tied input/output embeddings (nozzle head tied): spec its own matrix, checkpoint tied"),
    "llama3 rotary scaling into plain rotary": (llama, dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
                                                "rotary scaling (rope_type) (turbine attention rotary_scaling=): spec none, checkpoint llama3"),
    "linear factor 2 into factor 4": (lambda **o: llama(**{"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, **o}),
                                      dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
                                      "rotary scaling factor (turbine attention rotary_factor=): spec 4, checkpoint 2"),
    "yarn beta_fast": (lambda **o: llama(**{"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                                                "original_max_position_embeddings": 20}, **o}),
                       dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 20,
                                             "beta_fast": 8.0}), "YaRN beta_fast (turbine attention rotary_beta_fast=): spec 32, checkpoint 8"),
    "falcon alibi into rotary": (lambda **o: transformers.FalconConfig(**{**dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                                                 bos_token_id=0, eos_token_id=1), **o}), dict(alibi=True),
                                 "rotary positions (turbine attention rotary=): spec all of each head (8 dims), checkpoint none"),
    "falcon new decoder into the old": (lambda **o: transformers.FalconConfig(**{**dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                                                       bos_token_id=0, eos_token_id=1), **o}),
                                        dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
                                        "key/value heads (GQA) (turbine attention kv_heads=): spec 1, checkpoint 2"),
    "qwen2_moe dense layer 1 into all routed": (lambda **o: transformers.Qwen2MoeConfig(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=48,
                                                                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                                                                 num_experts=3, num_experts_per_tok=2, moe_intermediate_size=16,
                                                                                                 shared_expert_intermediate_size=16), **o}),
                                                dict(mlp_only_layers=[1]), "block structure (the statement): spec moe, checkpoint mlp"),
    "ministral3 query temperature into none": (lambda **o: ministral3(**{"llama_4_scaling_beta": 0.0, **o}), dict(llama_4_scaling_beta=0.4),
                                               "query temperature (llama_4_scaling_beta) (turbine attention rotary_temperature=): spec 0, checkpoint 0.4"),
    "gemma2 softcap": (lambda **o: transformers.Gemma2Config(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=40,
                                                                       pad_token_id=None, eos_token_id=None, bos_token_id=None), **o}),
                       dict(attn_logit_softcapping=20.0), "attention logit soft-cap (turbine attention softcap=): spec 50, checkpoint 20"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CHANGES))
@pytest.mark.parametrize("via", ["object", "folder"])
def test_checkpoint_implying_another_engine_is_refused(tmp_path, case, via):
    make, over, words = CONFIG_CHANGES[case]
    ref = hf(make(**over))
    source = ref
    if via == "folder":
        ref.save_pretrained(tmp_path)
        source = tmp_path
    err = refusal(make(), source)
    assert words in str(err), str(err)


def ministral3(rope_type="yarn", llama_4_scaling_beta=0.4):
    """A Ministral 3 whose rope parameters hold Llama 4's query temperature (original context 3)."""
    rope = {"rope_type": rope_type, "rope_theta": 30000.0, "original_max_position_embeddings": 3, "llama_4_scaling_beta": llama_4_scaling_beta}
    if rope_type == "yarn":
        rope.update(factor=4.0, beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    return transformers.Ministral3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=32, rope_parameters=rope)


UNEXPRESSIBLE = {  # config fields the language cannot write: refused by name, on import and on load
    # a family whose attention never reads it (transformers' Llama ignores the key): refused, not guessed inert
    "llama query temperature": (llama, dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                                             "original_max_position_embeddings": 20, "llama_4_scaling_beta": 0.1}),
                                "rope_parameters.llama_4_scaling_beta"),
    # Ministral 3's attention multiplies by 1 + beta ...: an absent beta has no default to fall to (transformers' model cannot run)
    "ministral3 query temperature absent": (ministral3, dict(llama_4_scaling_beta=None), "rope_parameters.llama_4_scaling_beta"),
    "ministral3 query temperature negative": (ministral3, dict(llama_4_scaling_beta=-0.5), "rope_parameters.llama_4_scaling_beta"),
    # Ministral 3's temperature over plain rotary: the language carries it on a scaling with an original context
    "ministral3 query temperature on plain rotary": (lambda **o: ministral3(**{"rope_type": "default", "llama_4_scaling_beta": 0.0, **o}),
                                                     dict(llama_4_scaling_beta=0.4), "rope_parameters.llama_4_scaling_beta"),
    "rope longrope": (llama, dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                                                   "long_factor": [2.0] * 4, "original_max_position_embeddings": 16}), "rope_parameters.rope_type"),
    "bloom residual after the norm": (lambda **o: transformers.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4, bos_token_id=0,
                                                                           eos_token_id=1, **o),
                                      dict(apply_residual_connection_post_layernorm=True), "apply_residual_connection_post_layernorm"),
    # "rope yarn untruncated": the language says it now (rotary_truncate=false); tests/test_families_sinks.py round-trips it
    "gpt2 inverse layer idx": (gpt2, dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    "gpt2 unscaled attention": (gpt2, dict(scale_attn_weights=False), "scale_attn_weights"),
    "neox odd rotary": (lambda **o: transformers.GPTNeoXConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                                               num_attention_heads=4, bos_token_id=0, eos_token_id=1,
                                                               **{"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                                      "partial_rotary_factor": 0.5}, **o}),
                        dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}), "partial_rotary_factor"),
    "qwen2_moe every layer dense": (lambda **o: transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                                            num_attention_heads=4, num_key_value_heads=2, num_experts=3,
                                                                            num_experts_per_tok=2, moe_intermediate_size=16,
                                                                            shared_expert_intermediate_size=16, **o),
                                    dict(mlp_only_layers=[0, 1]), "mlp_only_layers"),
}


@pytest.mark.parametrize("case", sorted(UNEXPRESSIBLE))
def test_unexpressible_config_field_refused_by_name(case):
    make, over, field = UNEXPRESSIBLE[case]
    with pytest.raises(Unsupported) as info:
        import_config(make(**over))
    assert info.value.field == field
    err = refusal(make(), hf(make(**over)))  # and the plain family's spec will not take such a checkpoint
    assert err.key == field


GEMMA_GRANITE = {  # on main, a Gemma checkpoint loaded as a Llama (its (1 + w) gains read as w), a Granite one lost its multipliers
    "gemma": (lambda: transformers.GemmaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, head_dim=8, max_position_embeddings=40, tie_word_embeddings=False,
                                               pad_token_id=None, eos_token_id=None, bos_token_id=None),
              "embedding multiplier (feed tokens scale=): spec 1, checkpoint 5.65685"),
    "granite": (lambda: transformers.GraniteConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                                   num_key_value_heads=2, max_position_embeddings=40, embedding_multiplier=12.0, pad_token_id=None,
                                                   eos_token_id=None, bos_token_id=None),
                "embedding multiplier (feed tokens scale=): spec 1, checkpoint 12"),
}


@pytest.mark.parametrize("model_type", sorted(GEMMA_GRANITE))
def test_gemma_and_granite_never_load_as_llama(model_type):
    make, words = GEMMA_GRANITE[model_type]
    err = refusal(llama(), hf(make()))
    assert words in str(err), str(err)


@pytest.mark.parametrize("model_type", ["gemma3", "jetmoe"])
def test_families_not_yet_supported_are_refused_by_name(model_type):
    with pytest.raises(Unsupported) as info:
        import_config({"model_type": model_type})
    from cyclelang.interop.unclaimed import UNCLAIMED

    near, lacks = UNCLAIMED[model_type]  # the nearest claimed family, and what the language lacks (or only the importer)
    assert info.value.field == "model_type" and f"'{model_type}'" in str(info.value) and f"nearest claimed family: {near}" in str(info.value)
    assert (lacks or "only an importer is missing") in str(info.value)


def test_unknown_model_type_refused_by_name():
    with pytest.raises(Unsupported) as info:
        import_config({"model_type": "my_own_net", "hidden_size": 8})
    assert info.value.field == "model_type" and "unknown model type 'my_own_net'" in str(info.value)


def test_top1_moe_renormalises_as_mixtral():
    """On main a top-1 MoE used the raw router probability; Mixtral renormalises for every k."""
    ref = hf(mixtral(num_experts_per_tok=1))
    ours = load_transformers(spec_of(mixtral(num_experts_per_tok=1)), ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
    assert "turbine moe experts=4 top=1" in import_config(mixtral(num_experts_per_tok=1))


def test_moe_normalize_false_is_the_raw_probability():
    """normalize=false: the top-k weights are the router's softmax probabilities as they are."""
    text = import_config(mixtral(num_experts_per_tok=2)).replace("act=swiglu", "act=swiglu normalize=false")
    ours = build(cyclelang.parse(text), seed=0).eval()
    moe = ours.stages[0].burn.moe
    x = torch.randn(1, 3, 32)
    probs = torch.softmax(moe.router(x.view(3, 32)), -1)
    w, c = probs.topk(2, -1)
    want = torch.stack([sum(w[n, j] * moe.experts[c[n, j]](x[0, n]) for j in range(2)) for n in range(3)])
    with torch.no_grad():
        torch.testing.assert_close(moe(x)[0], want, rtol=1e-5, atol=1e-6)


def test_feed_scale_may_read_width():
    spec = cyclelang.parse(import_config(llama()).replace("position=none", "position=none scale=sqrt(width)"))
    assert spec.engine.feed.scale == pytest.approx(32 ** 0.5)


# --- the command line's diagnostics ---------------------------------------------------------------


def test_cli_import_names_the_field_with_its_line(tmp_path):
    cfg = llama(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                                 "original_max_position_embeddings": 16})
    cfg.save_pretrained(tmp_path)
    res = CliRunner().invoke(main, ["import", str(tmp_path)])
    assert res.exit_code == 1
    assert re.search(r"config\.json:\d+:\d+: error\[E0401\]: rope_parameters\.rope_type: rotary scaling 'longrope'", res.output), res.output


def test_cli_import_unknown_type_and_unreadable(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gemma3"}')
    res = CliRunner().invoke(main, ["import", str(tmp_path)])
    assert res.exit_code == 1 and "error[E0402]" in res.output
    (tmp_path / "config.json").write_text("[1, 2")
    res = CliRunner().invoke(main, ["import", str(tmp_path / "config.json")])
    assert res.exit_code == 1 and "error[E0403]" in res.output


def test_cli_export_refuses_a_spec_no_family_computes(tmp_path):
    spec = ROOT / "specs" / "deepnet.cycle"
    (tmp_path / "w.safetensors").write_bytes(b"")
    res = CliRunner().invoke(main, ["export", str(spec), "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 1 and "error[E0404]" in res.output and not (tmp_path / "out").exists()
    text = re.sub(r"(turbine attention[^\n]*)", r"\1\n    merge scale=0.5", import_config(llama()))  # one branch scaled, not both
    (tmp_path / "s.cycle").write_text(text)
    res = CliRunner().invoke(main, ["export", str(tmp_path / "s.cycle"), "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 1 and "stages.0.burn: residual merge (merge): spec add, checkpoint scale" in res.output, res.output


def test_export_a_llama_with_an_embedding_multiplier_is_granite(tmp_path):
    """What a family can say is found by construction: a feed scale is Granite's embedding_multiplier."""
    spec = cyclelang.parse(import_config(llama()).replace("position=none", "position=none scale=8"))
    config = cyclelang.interop.export_config(spec)
    assert config["model_type"] == "granite" and config["embedding_multiplier"] == 8.0 and config["residual_multiplier"] == 1.0


def test_cli_export_refuses_weights_of_another_spec(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "s.cycle").write_text(import_config(llama()))
    other = build(cyclelang.parse(import_config(llama(hidden_size=16, head_dim=4))), seed=0)
    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(tmp_path / "w.safetensors"))
    res = CliRunner().invoke(main, ["export", str(tmp_path / "s.cycle"), "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 1 and "error[E0405]" in res.output and "feed.tok.weight" in res.output and not (tmp_path / "out").exists()


@pytest.mark.slow  # imports every family's default config in a fresh process (about 5 s)
def test_family_library_is_the_import_of_each_default_config():
    """specs/families/ is what `cyclec import` writes for transformers' default config of each family."""
    import importlib.util

    loader = importlib.util.spec_from_file_location("family_specs", ROOT / "scripts" / "family_specs.py")
    family_specs = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(family_specs)
    res = subprocess.run([sys.executable, "scripts/family_specs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    for family in cyclelang.interop.FAMILIES:
        if family in family_specs.SKIP:  # its default config is refused: the refusal is the library's entry
            with pytest.raises(cyclelang.interop.Unsupported):
                cyclelang.interop.import_config(family_specs.default_config(family))
            continue
        spec = cyclelang.load(ROOT / "specs" / "families" / f"{family}.cycle")
        cyclelang.interop.check_config(spec, family_specs.default_config(family))


def test_cli_import_failure_leaves_the_output_file_as_it_was(tmp_path):
    out = tmp_path / "spec.cycle"
    out.write_text("# mine\n")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text('{"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": true}')
    res = CliRunner().invoke(main, ["import", str(tmp_path / "ck"), "-o", str(out)])
    assert res.exit_code == 1 and "error[E0401]: scale_attn_by_inverse_layer_idx" in res.output
    assert out.read_text() == "# mine\n"
    res = CliRunner().invoke(main, ["import", str(tmp_path / "ck" / "config.json").replace("config.json", "missing.json")])
    assert res.exit_code == 2  # a path that does not exist is a usage error


# --- the expander families: what their configs say that the language cannot -----------------------


def deepseek_v2(**over):
    return transformers.DeepseekV2Config(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                                                   num_attention_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                                   v_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                                   first_k_dense_replace=1, max_position_embeddings=40, pad_token_id=None, bos_token_id=None,
                                                   eos_token_id=None), **over})


def jamba(**over):
    return transformers.JambaConfig(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, num_experts=3, num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1,
                                              expert_layer_period=2, expert_layer_offset=0, mamba_d_state=4, max_position_embeddings=40,
                                              pad_token_id=None, bos_token_id=None, eos_token_id=None), **over})


EXPANDER_UNEXPRESSIBLE = {
    "deepseek topk method": (deepseek_v2, dict(topk_method="noaux_tc"), "topk_method"),  # scaling and group routing read: test_families_deepseek.py
    "deepseek norm_topk_prob": (deepseek_v2, dict(norm_topk_prob=True), "norm_topk_prob"),
    "deepseek mlp bias": (deepseek_v2, dict(mlp_bias=True), "mlp_bias"),
    "deepseek yarn": (deepseek_v2, dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 10}), "rope_parameters.rope_type"),
    "jamba gelu": (jamba, dict(hidden_act="gelu"), "hidden_act"),
    "deepseek grouped kv": (deepseek_v2, dict(num_key_value_heads=2), "num_key_value_heads"),
}


@pytest.mark.parametrize("case", sorted(EXPANDER_UNEXPRESSIBLE))
def test_expander_config_field_refused_by_name(case):
    make, over, field = EXPANDER_UNEXPRESSIBLE[case]
    with pytest.raises(Unsupported) as info:
        import_config(make(**over))
    assert info.value.field == field
    err = refusal(make(), hf(make(**over)))  # and the plain family's spec will not take such a checkpoint
    assert err.key == field


def test_deepseek_v2_moe_layer_freq_refused_by_name():
    """transformers' DeepseekV2 ignores moe_layer_freq (experts in every layer from first_k_dense_replace on)."""
    config = {**deepseek_v2().to_dict(), "moe_layer_freq": 2}
    with pytest.raises(Unsupported) as info:
        import_config(config)
    assert info.value.field == "moe_layer_freq" and "does not load there either" in str(info.value)


def test_deepseek_v2_first_k_dense_layers_are_consecutive_stages():
    text = import_config(deepseek_v2(num_hidden_layers=5, first_k_dense_replace=2))
    assert "stage dense_block x 2" in text and "stage moe_block x 3" in text
    assert "stage dense_block" not in import_config(deepseek_v2(first_k_dense_replace=0))
    engine = cyclelang.parse(text).engine
    assert [type(s.ops[1].ops[1]).__name__ for s in engine.body[:-1]] == ["Mlp", "Moe"]


def test_jamba_pattern_is_a_nested_stage():
    text = import_config(FAMILIES["jamba_nested"]())
    assert "stage jamba_block x 2 {" in text and "stage layer1 = attention_moe" in text
    engine = cyclelang.parse(text).engine
    assert engine.body[0].is_group and engine.body[0].repeat == 2 and len(engine.body[0].ops) == 4


def test_jamba_pattern_folds_runs_and_refuses_a_spec_of_another_pattern():
    text = import_config(jamba(num_hidden_layers=6, attn_layer_period=6, attn_layer_offset=5, expert_layer_period=1, expert_layer_offset=0))
    assert "stage layers0_4 = mamba_moe x 5" in text and "stage layer5 = attention_moe" in text
    spec = re.sub(r"stage layer1 = attention_mlp", "stage layer1 = mamba_mlp", import_config(jamba()).replace(
        "stage attention_mlp {", "stage mamba_mlp {\n  prechamber mix {\n    norm rmsnorm\n"
        "    turbine ssm version=1 state=4 expand=2 dt_rank=2 conv=4 bias=false conv_bias=true norms\n  }\n"
        "  prechamber burn {\n    norm rmsnorm\n    turbine mlp hidden=48 act=swiglu bias=false\n  }\n}\n\nstage attention_mlp {"))
    ours = build(cyclelang.parse(spec), seed=0)
    with pytest.raises(InteropError) as info:
        load_transformers(ours, hf(jamba()))
    assert info.value.key == "stages.1.mix.ssm" and "block structure (the statement): spec mamba1, checkpoint attention" in str(info.value), str(info.value)


def test_export_of_an_ssm_spec_no_family_computes_names_the_reason(tmp_path):
    """An ssm beside an MLP with a post-norm is no family's layer: refused with where and why, not a generic message."""
    text = import_config(transformers.MambaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, state_size=4, pad_token_id=None,
                                                  bos_token_id=None, eos_token_id=None))
    text = text.replace("conv_bias=true", "conv_bias=true\n    merge scale=0.5")
    with pytest.raises(Unsupported) as info:
        cyclelang.interop.export_config(cyclelang.parse(text))
    assert "prechamber mix" in str(info.value) or "plain residual" in str(info.value), str(info.value)
    text = import_config(jamba(num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=1, expert_layer_period=1, expert_layer_offset=0))
    assert "stage layers2_3 = mamba_moe x 2" in text
    uneven = text.replace("stage layers2_3 = mamba_moe x 2", "stage layer2 = attention_moe\n  stage layer3 = mamba_moe")  # attention at 1 and 2
    with pytest.raises(Unsupported) as info:
        cyclelang.interop.export_config(cyclelang.parse(uneven))
    assert info.value.field == "attention layers" and "layers [1, 2] are not every k-th layer" in str(info.value), str(info.value)
    even = text.replace("stage layers2_3 = mamba_moe x 2", "stage layer2 = mamba_moe\n  stage layer3 = attention_moe")  # at 1 and 3
    config = cyclelang.interop.export_config(cyclelang.parse(even))
    assert (config["attn_layer_period"], config["attn_layer_offset"]) == (2, 1)


def test_cli_export_of_linear_attention_names_the_reason(tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"")
    res = CliRunner().invoke(main, ["export", str(ROOT / "specs" / "expander.cycle"), "--weights", str(tmp_path / "w.safetensors"),
                                    "-o", str(tmp_path / "out")])
    assert res.exit_code == 1 and "error[E0404]" in res.output and "no transformers model family computes linear attention" in res.output
    assert not (tmp_path / "out").exists()


# --- rotary scaling: it matters at these lengths, and dynamic NTK follows the sequence --------------


@pytest.mark.parametrize("name", ["llama_rope_linear", "llama_rope_llama3", "llama_rope_yarn"])
def test_rotary_scaling_matters_at_the_tested_length(name):
    """The same weights with plain rotary give other logits at T = 12: the round trip's equality is the scaling's."""
    ref = hf(FAMILIES[name]())
    plain = FAMILIES[name]()
    plain.rope_parameters = {"rope_type": "default", "rope_theta": ref.config.rope_parameters["rope_theta"]}
    other = transformers.AutoModelForCausalLM.from_config(plain).eval()
    other.load_state_dict(ref.state_dict())
    idx = ids()
    with torch.no_grad():
        assert rel(other(idx).logits, ref(idx).logits) > 1e-3


def test_query_temperature_matters_at_the_tested_length():
    """The same weights without Llama 4's query temperature give other logits at T = 12: ministral3_temperature's round trip is the temperature's."""
    ref = hf(FAMILIES["ministral3_temperature"]())
    plain = FAMILIES["ministral3_temperature"]()
    plain.rope_parameters = {**plain.rope_parameters, "llama_4_scaling_beta": 0.0}
    other = transformers.AutoModelForCausalLM.from_config(plain).eval()
    other.load_state_dict(ref.state_dict())
    idx = ids()
    with torch.no_grad():
        assert rel(other(idx).logits, ref(idx).logits) > 1e-3


def dynamic_llama(**over):
    return transformers.LlamaConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=12, max_position_embeddings=8,
                                              rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 3.0}), **over})


def test_dynamic_ntk_rotary_follows_the_sequence_length(tmp_path):
    """Dynamic NTK grows the rotary base once a sequence passes max_position_embeddings (8 here):
    the spec's context is factor x 8 = 24, logits at 20 tokens and greedy decoding across 8
    with the cache equal transformers' (whose cached keys, too, keep the base they were rotated with)."""
    text = import_config(dynamic_llama())
    assert "context=24" in text and "rotary_scaling=dynamic rotary_factor=3 rotary_original=8" in text
    ref = hf(dynamic_llama())
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    idx = torch.randint(0, V, (B, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        short = idx[:, :6]  # under the original context: the plain base
        assert rel(ours(short), ref(short).logits) < 1e-5
        want = ref.generate(idx[:1, :4], max_new_tokens=14, do_sample=False, min_new_tokens=14)  # its own cache, growing past 8
    assert torch.equal(ours.generate(idx[:1, :4], 14, temperature=0), want)
    plain = dynamic_llama(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=24)
    other = transformers.AutoModelForCausalLM.from_config(plain).eval()
    other.load_state_dict(ref.state_dict())
    with torch.no_grad():
        assert rel(other(idx).logits, ref(idx).logits) > 1e-3  # past 8 tokens the scaling matters
        assert rel(other(short).logits, ref(short).logits) < 1e-6  # under it, it does not
    # export writes max_position_embeddings = the original context back
    from cyclelang.interop.families import arch_of, config_of

    cfg = config_of(arch_of(cyclelang.parse(text).engine))
    assert cfg["max_position_embeddings"] == 8 and cfg["rope_parameters"]["rope_type"] == "dynamic" and cfg["rope_parameters"]["factor"] == 3.0


def test_rotary_scaling_runtime_equals_transformers_inv_freq():
    """rotary_tables' frequencies are rope_utils', bit for bit, for each kind (and YaRN's gain)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from cyclelang.backends.torch.runtime.positions import scaled_rotary_tables as rotary_tables

    cases = {
        "linear": ({"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.5}, {"type": "linear", "factor": 2.5}),
        "llama3": ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}, {"type": "llama3", "factor": 8.0, "original": 64, "low": 1.0, "high": 4.0}),
        "yarn": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 1.3},
                 {"type": "yarn", "factor": 4.0, "original": 64, "beta_fast": 32.0, "beta_slow": 1.0, "gain": 1.3}),
    }
    for kind, (rope, ours) in cases.items():
        cfg = transformers.LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=256, rope_parameters=rope)
        inv, gain = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
        freqs = torch.outer(torch.arange(256).float(), inv)
        cos, sin = rotary_tables(256, 32, rope["rope_theta"], ours)
        assert torch.equal(cos, torch.cat((freqs, freqs), -1).cos() * gain), kind
        assert torch.equal(sin, torch.cat((freqs, freqs), -1).sin() * gain), kind
    cfg = transformers.LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=64,
                                   rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, "cpu", seq_len=torch.tensor(100))
    freqs = torch.outer(torch.arange(100).float(), inv)
    cos, _ = rotary_tables(100, 32, 10000.0, {"type": "dynamic", "factor": 2.0, "original": 64}, seq_len=100)
    assert torch.equal(cos, torch.cat((freqs, freqs), -1).cos())


# torch missing: test_hardening's d9 (build, fire) shows the same refusal in the fast tier; this one's own hint is safetensors'
@pytest.mark.parametrize("module, hint", [pytest.param("torch", "pip install torch", marks=pytest.mark.slow),
                                          ("safetensors", "pip install 'cyclelang[torch]'")])
def test_cli_export_without_an_optional_package_is_a_usage_error(tmp_path, module, hint):
    """`cyclec export` with torch or safetensors missing: exit 2 naming the pip install, no traceback, nothing written."""
    (tmp_path / "s.cycle").write_text(import_config(llama()))
    ours = build(cyclelang.load(tmp_path / "s.cycle"), seed=0)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in ours.state_dict().items()}, str(tmp_path / "w.safetensors"))
    code = f"import sys; sys.modules[{module!r}] = None; from cyclelang.cli import main; main(sys.argv[1:], prog_name='cyclec')"
    r = subprocess.run([sys.executable, "-c", code, "export", "s.cycle", "--weights", "w.safetensors", "-o", "out"], cwd=tmp_path,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    assert hint in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.cycle", "w.safetensors"]


def test_gemma2_alternating_windows_fold_into_a_nested_stage():
    """Gemma 2's local, global, local, ... layers import as one stage of stages, not unrolled; the IR runs them in that order."""
    text = import_config(FAMILIES["gemma2"]())
    assert re.search(r"stage layers x 2 \{[^\n]*\n\s+stage local = gemma2_local\n\s+stage global = gemma2_global\n\s+\}", text), text
    from cyclelang.interop.families.core import _run_order

    layers = _run_order([op for op in cyclelang.parse(text).engine.body if op.op == "stage"])
    windows = [next(o for b in s.ops for o in b.ops if o.op == "attention").window for s in layers]
    assert windows == [5, None, 5, None]
    # first-k-dense does not repeat: its runs are consecutive stages
    text = import_config(FAMILIES["qwen2_moe_first_dense"]())
    assert re.search(r"stage layers_0 = qwen2_moe_dense +# layer 0\n +stage layers_1 = qwen2_moe_moe x 2 +# layer 1 to 2\n", text), text
