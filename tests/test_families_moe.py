"""The Llama-shaped families with routed experts (issue 33): Qwen3-MoE, OLMoE, FlexOlmo, GraniteMoE,
GraniteMoE-Shared and Aria's text model, each through the whole round trip (tests/roundtrip.py) at a
config that sets what makes the family itself; each option the language cannot say refused by name;
and each family's quirk shown to matter (its spec with the quirk edited out computes other logits).
"""

from __future__ import annotations

import re

import pytest

import cyclelang

from .conftest import need
from .roundtrip import V, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config  # noqa: E402

ROPE = {"rope_type": "default", "rope_theta": 5000.0}

FAMILIES = {
    # per-head qk-norm, a head_dim apart from width/heads (a key its class lacks but its attention reads), norm_topk_prob,
    # a dense first layer (mlp_only_layers) of intermediate_size, biased attention, one window (5 < 12 tokens) for every layer
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                                     num_key_value_heads=2, head_dim=16, max_position_embeddings=40, rms_norm_eps=1e-5,
                                                     rope_parameters=ROPE, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                                                     norm_topk_prob=True, mlp_only_layers=[0], attention_bias=True, use_sliding_window=True,
                                                     sliding_window=5),
    # raw top-k weights, every other layer routed (decoder_sparse_step), tied, no window, YaRN past its original 10 positions
    "qwen3_moe_sparse_step": lambda: transformers.Qwen3MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
                                                                 num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=40,
                                                                 moe_intermediate_size=16, num_experts=3, num_experts_per_tok=2,
                                                                 norm_topk_prob=False, decoder_sparse_step=2, tie_word_embeddings=True,
                                                                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                                                  "original_max_position_embeddings": 10}),
    # qk RMSNorm across the heads (GQA: k's over the kv heads only), raw top-k weights, a padding row, biased attention
    "olmoe": lambda: transformers.OlmoeConfig(vocab_size=V, hidden_size=48, intermediate_size=24, num_hidden_layers=2, num_attention_heads=6,
                                              num_key_value_heads=2, max_position_embeddings=40, rms_norm_eps=1e-6, num_experts=4,
                                              num_experts_per_tok=2, norm_topk_prob=False, pad_token_id=1, eos_token_id=0, attention_bias=True,
                                              rope_parameters=ROPE),
    # OLMo-2's norms after each turbine, its qk-norm across heads, renormalised top-k, FlexOlmo's default rope base (500000)
    "flex_olmo": lambda: transformers.FlexOlmoConfig(vocab_size=V, hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, max_position_embeddings=40, rms_norm_eps=1e-5, num_experts=3,
                                                     num_experts_per_tok=2, norm_topk_prob=True, pad_token_id=0, eos_token_id=1),
    # Granite's four multipliers, a top-k of the logits then their softmax (= the renormalised softmax), GQA
    "granitemoe": lambda: transformers.GraniteMoeConfig(vocab_size=V, hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                                                        num_key_value_heads=2, max_position_embeddings=40, embedding_multiplier=12.0,
                                                        residual_multiplier=0.22, attention_multiplier=0.03, logits_scaling=6.0, num_local_experts=4,
                                                        num_experts_per_tok=2, pad_token_id=0, rope_parameters=ROPE),
    # ... and the ungated shared expert beside the routed ones, top-1, biased attention, tied
    "granitemoeshared": lambda: transformers.GraniteMoeSharedConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                                                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=40,
                                                                    embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.1,
                                                                    logits_scaling=4.0, num_local_experts=3, num_experts_per_tok=1,
                                                                    shared_intermediate_size=20, attention_bias=True, tie_word_embeddings=True),
    # a shared expert 2 x intermediate_size wide, experts stored (in, out), a head_dim apart from width/heads, padding row 2
    "aria_text": lambda: transformers.AriaTextConfig(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, head_dim=12, max_position_embeddings=40, rms_norm_eps=1e-5,
                                                     moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2, rope_parameters=ROPE),
    # sliding and global layers (layer_types) whose rope_parameters entries agree, raw top-k weights, per-head qk-norm, biased attention
    "mellum": lambda: transformers.MellumConfig(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                                                num_key_value_heads=2, head_dim=12, max_position_embeddings=40, rms_norm_eps=1e-5,
                                                moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                                                layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=5,
                                                rope_parameters={"full_attention": ROPE, "sliding_attention": dict(ROPE)}, attention_bias=True),
    # a dense first layer (mlp_only_layers), every layer global with MellumConfig's default rope (500000 for global layers)
    "mellum_dense": lambda: transformers.MellumConfig(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                                                      num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=40,
                                                      moe_intermediate_size=16, num_experts=3, num_experts_per_tok=2,
                                                      mlp_layer_types=["dense", "sparse", "sparse"], tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


# Each family's quirk, edited out of its imported spec: the same weights then compute other logits.
QUIRKS = {
    "qwen3_moe": (r"(turbine moe [^\n#]*?)(  #|\n)", r"\1 normalize=false\2"),  # norm_topk_prob
    "olmoe": (r" normalize=false", ""),  # the raw top-k weights
    "flex_olmo": (r"(\n +)(turbine attention[^\n]*)(\n +)(norm rmsnorm[^\n]*)", r"\1\4\3\2"),  # the norm after attention, not before
    "granitemoe": (r"(turbine moe [^\n#]*?)(  #|\n)", r"\1 normalize=false\2"),  # the softmax over the top-k logits
    "granitemoeshared": (r" shared=20", " shared=20 shared_gate"),  # an ungated shared expert
    "aria_text": (r"(turbine moe [^\n#]*?)(  #|\n)", r"\1 normalize=false\2"),
    "mellum": (r" normalize=false", ""),
}


@pytest.mark.parametrize("name", sorted(QUIRKS))
def test_quirk_matters(tmp_path, name):
    ours, _, spec_file = round_trip(tmp_path, FAMILIES[name]())
    text = spec_file.read_text()
    pat, rep = QUIRKS[name]
    edited = re.sub(pat, rep, text, count=1)
    assert edited != text, text
    other = build(cyclelang.parse(edited), seed=0).eval()
    state = ours.state_dict()
    if name == "granitemoeshared":  # the gate the edit adds: zero weights, a throttle of one half
        state = {**state, **{k: torch.zeros_like(v) for k, v in other.state_dict().items() if k not in state}}
    other.load_state_dict(state)
    ours.eval()
    with torch.no_grad():
        assert rel(other(ids()), ours(ids())) > 1e-3


def test_qwen3_moe_reads_num_local_experts_as_transformers_does():
    """save_pretrained writes Qwen3-MoE's expert count as num_local_experts; where a file has both names, that one wins."""
    base = {"model_type": "qwen3_moe", "vocab_size": V, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_experts_per_tok": 2}
    for cfg in ({**base, "num_local_experts": 3, "num_experts": 5}, {**base, "num_experts": 5, "num_local_experts": 3}):
        assert "experts=3 " in import_config(cfg)
        assert transformers.AutoConfig.for_model(**cfg).num_experts == 3


def test_qwen3_moe_released_config_imports():
    """Qwen3-30B-A3B's config.json as released (transformers 4's keys: rope_theta, max_window_layers, a head_dim its class lacks)."""
    released = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
                "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
                "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
                "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
                "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
                "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
                "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
    text = import_config(released)
    assert "heads=32 kv_heads=4 head_dim=128 rotary rotary_base=1000000 qk_norm bias=false" in text, text
    assert "turbine moe experts=128 top=8 hidden=768 act=swiglu bias=false  #" in text, text


def _cfg(model_type: str, **over) -> dict:
    small = {"vocab_size": V, "hidden_size": 32, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "pad_token_id": 0}
    return {"model_type": model_type, **small, **over}


UNEXPRESSIBLE = {
    "qwen3_moe null head_dim": (_cfg("qwen3_moe", head_dim=None), "head_dim"),
    "qwen3_moe every layer dense": (_cfg("qwen3_moe", mlp_only_layers=[0, 1]), "mlp_only_layers"),
    "qwen3_moe sparse step past the layers": (_cfg("qwen3_moe", decoder_sparse_step=3), "decoder_sparse_step"),
    "qwen3_moe top past the experts": (_cfg("qwen3_moe", num_experts=2, num_experts_per_tok=3), "num_experts_per_tok"),
    "qwen3_moe gelu_fast": (_cfg("qwen3_moe", hidden_act="gelu_fast"), "hidden_act"),
    "qwen3_moe window from a later layer": (_cfg("qwen3_moe", use_sliding_window=True, sliding_window=4, max_window_layers=1), "max_window_layers"),
    "qwen3_moe partial rotary": (_cfg("qwen3_moe", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
                                 "partial_rotary_factor"),
    "granitemoe partial rotary": (_cfg("granitemoe", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
                                  "partial_rotary_factor"),
    "mellum partial rotary": (_cfg("mellum", head_dim=8, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                                                             "partial_rotary_factor": 0.5}}),
                              "rope_parameters.full_attention.partial_rotary_factor"),
    "qwen3_moe heads not dividing": (_cfg("qwen3_moe", num_attention_heads=5, num_key_value_heads=5), "num_attention_heads"),
    "olmoe clip_qkv": (_cfg("olmoe", clip_qkv=8.0), "clip_qkv"),
    "olmoe head_dim": (_cfg("olmoe", head_dim=16), "head_dim"),  # not its class's: its q-norm is hidden_size wide
    "olmoe sliding_window": (_cfg("olmoe", sliding_window=4), "sliding_window"),
    "flex_olmo clip_qkv": (_cfg("flex_olmo", clip_qkv=8.0), "clip_qkv"),
    "flex_olmo rope longrope": (_cfg("flex_olmo", rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "long_factor": [1.0],
                                                                   "short_factor": [1.0]}), "rope_parameters.rope_type"),
    "granitemoe zero multiplier": (_cfg("granitemoe", residual_multiplier=0), "residual_multiplier"),
    "granitemoe null experts": (_cfg("granitemoe", num_local_experts=None), "num_local_experts"),
    "granitemoe null top": (_cfg("granitemoe", num_experts_per_tok=None), "num_experts_per_tok"),
    "granitemoeshared negative shared": (_cfg("granitemoeshared", shared_intermediate_size=-4), "shared_intermediate_size"),
    "mellum two rotary bases": (_cfg("mellum", layer_types=["sliding_attention", "full_attention"], head_dim=8), "rope_parameters"),
    "mellum flat rope": (_cfg("mellum", head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 1e4}), "rope_parameters"),
    "mellum legacy rope_theta": (_cfg("mellum", head_dim=8, rope_theta=1e4), "rope_theta"),
    "mellum rope scaling": (_cfg("mellum", head_dim=8, rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}),
                            "rope_parameters.full_attention.rope_type"),
    "mellum mlp type": (_cfg("mellum", head_dim=8, mlp_layer_types=["sparse", "moe"]), "mlp_layer_types"),
    "mellum two patterns": (_cfg("mellum", head_dim=8, mlp_layer_types=["dense", "sparse"], sliding_window=4,
                                 layer_types=["sliding_attention", "full_attention"],
                                 rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), "mlp_layer_types"),
    "mellum sliding without a window": (_cfg("mellum", head_dim=8, layer_types=["sliding_attention", "full_attention"], sliding_window=None),
                                        "sliding_window"),
    "aria_text gelu": (_cfg("aria_text", hidden_act="gelu"), "hidden_act"),
    "aria_text mlp_bias": (_cfg("aria_text", mlp_bias=True), "mlp_bias"),
    "aria_text no shared expert": (_cfg("aria_text", moe_num_shared_experts=0), "moe_num_shared_experts"),
    "aria_text top past the experts": (_cfg("aria_text", moe_num_experts=2, moe_topk=3), "moe_topk"),
}


@pytest.mark.parametrize("case", sorted(UNEXPRESSIBLE))
def test_unexpressible_option_refused_by_name(case):
    cfg, field = UNEXPRESSIBLE[case]
    with pytest.raises(Unsupported) as info:
        import_config(cfg)
    assert info.value.field == field, str(info.value)
