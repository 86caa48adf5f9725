"""SarvamMLA and GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's latent attention and router under other
model_types, read by the deepseek_v3 reader's shape (families.py `_sarvam_mla`, `_glm4_moe_lite`).

Each round trip routes with options that change the output at these sizes: 8 experts in 4 groups of which
a token keeps 2, top-3, a scaling factor of 2.5, renormalised weights, a correction bias spread far enough
to change the choice (set here: transformers' init leaves the buffer zero and round_trip does not spread
buffers), and a dense first layer.
"""

from __future__ import annotations

import pytest

from . import roundtrip
from .conftest import need
from .roundtrip import V, moes, round_trip, with_bias

torch = need("torch")
transformers = need("transformers")

from cyclelang.interop import Unsupported, import_config  # noqa: E402

ROUTING = dict(n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
               norm_topk_prob=True)
SIZES = dict(vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=12, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
             max_position_embeddings=40, rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=None, eos_token_id=None)


def sarvam_mla(**over):
    return transformers.SarvamMLAConfig(**{**SIZES, **ROUTING, "first_k_dense_replace": 1, **over})


def glm4_moe_lite(**over):
    return transformers.Glm4MoeLiteConfig(**{**SIZES, **ROUTING, "mlp_layer_types": ["dense", "sparse", "sparse"], **over})


def axk1(**over):
    return transformers.AXK1Config(**{**SIZES, **ROUTING, "mlp_layer_types": ["dense", "sparse", "sparse"], **over})


CONFIGS = {"sarvam_mla": sarvam_mla, "glm4_moe_lite": glm4_moe_lite, "axk1": axk1}  # tests/test_closed_world.py's property runs over them too


@pytest.mark.parametrize("make", [sarvam_mla, glm4_moe_lite, axk1])
def test_round_trip(tmp_path, spread_bias, make):
    ours, ref, spec_file = round_trip(tmp_path, make())
    text = spec_file.read_text()
    assert "router=sigmoid" in text and "groups=4 top_groups=2" in text and "scale=2.5" in text and "correction=true" in text
    assert "stage dense_block x 1" in text and "stage moe_block x 2" in text and f"engine {ref.config.model_type}" in text
    for i, m in enumerate(moes(ours)):  # the bias came from the checkpoint (round_trip adds 0.01 to every value it exports)
        want = ref.model.layers[i + 1].mlp.gate.e_score_correction_bias
        assert want.abs().max() > 0.05 and torch.allclose(m.correction - 0.01, want, rtol=0, atol=1e-6)
    import json

    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == ref.config.model_type


def test_glm4_moe_lite_two_dense_layers_round_trip(tmp_path, spread_bias):
    """mlp_layer_types with two dense layers, no query latent, unnormalised weights, no group limit."""
    _, _, spec_file = round_trip(tmp_path, glm4_moe_lite(mlp_layer_types=["dense", "dense", "sparse"], q_lora_rank=None, n_group=1,
                                                         topk_group=1, norm_topk_prob=False))
    text = spec_file.read_text()
    assert "stage dense_block x 2" in text and "stage moe_block x 1" in text and "normalize=false" in text


@pytest.mark.parametrize("make, over, field", [
    (sarvam_mla, dict(rope_interleave=False), "rope_interleave"),
    (sarvam_mla, dict(n_group=3), "n_group"),
    (sarvam_mla, dict(hidden_act="gelu"), "hidden_act"),
    (sarvam_mla, dict(num_key_value_heads=2), "num_key_value_heads"),
    (sarvam_mla, dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 10}),
     "rope_parameters.rope_type"),
    (glm4_moe_lite, dict(mlp_layer_types=["sparse", "dense", "sparse"]), "mlp_layer_types"),
    (glm4_moe_lite, dict(rope_interleave=False), "rope_interleave"),
    (glm4_moe_lite, dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
     "rope_parameters.partial_rotary_factor"),
    (glm4_moe_lite, dict(topk_group=5), "topk_group"),
    (glm4_moe_lite, dict(hidden_act="gelu"), "hidden_act"),
    (axk1, dict(mlp_layer_types=["dense", "sparse", "dense"]), "mlp_layer_types"),
    (axk1, dict(rope_interleave=False), "rope_interleave"),
    (axk1, dict(n_group=3), "n_group"),
])
def test_unexpressible_refused_by_name(make, over, field):
    with pytest.raises(Unsupported) as info:
        import_config(make(**over))
    assert info.value.field == field


def test_each_routing_option_matters_at_these_sizes(tmp_path, spread_bias):
    """The imported glm4_moe_lite's logits move when a routing option is taken away: a reader that dropped it would fail."""
    from .roundtrip import ids, rel

    ref = with_bias(glm4_moe_lite())
    ours, _, _ = roundtrip.imported(tmp_path, ref)
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
        assert rel(ours(idx), want) < 1e-5
        for attr, value in (("correction", 0.0), ("top_groups", 4), ("scale", 1.0)):
            for m in moes(ours):
                saved = getattr(m, attr).clone() if torch.is_tensor(getattr(m, attr)) else getattr(m, attr)
                if torch.is_tensor(saved):
                    getattr(m, attr).fill_(value)
                else:
                    setattr(m, attr, value)
                m._saved = saved
            assert rel(ours(idx), want) > 1e-3, attr
            for m in moes(ours):
                if torch.is_tensor(m._saved):
                    getattr(m, attr).copy_(m._saved)
                else:
                    setattr(m, attr, m._saved)


@pytest.mark.parametrize("over, field", [
    (dict(q_lora_rank=None), "q_lora_rank"),  # A.X-K1's attention cannot build without a query latent
    (dict(first_k_dense_replace=2), "first_k_dense_replace"),  # __post_init__'s legacy kwargs: not read, so refused
    (dict(moe_layer_freq=2), "moe_layer_freq"),
])
def test_axk1_file_keys_refused_by_name(over, field):
    with pytest.raises(Unsupported) as info:
        import_config({**axk1().to_dict(), **over})
    assert info.value.field == field


def test_axk1_post_moe_norm_matters(tmp_path):
    """A.X-K1's quirk: the RMSNorm on each MoE block's output. The spec with it edited out, given the same weights,
    computes otherwise, and refuses the checkpoint (its config implies the norm) rather than dropping its weights."""
    import cyclelang
    from cyclelang.backends.torch.build import build
    from cyclelang.interop import load_transformers

    from .roundtrip import ids, rel

    ref = with_bias(axk1())
    ours, ckpt, spec_file = roundtrip.imported(tmp_path, ref)
    lines = spec_file.read_text().splitlines()
    assert sum("post_mlp_layernorm" in line for line in lines) == 1
    other = build(cyclelang.parse("\n".join(line for line in lines if "post_mlp_layernorm" not in line)), seed=0).eval()
    with pytest.raises(Exception) as info:
        load_transformers(other, ckpt)
    assert "stages.1.burn" in str(info.value) and "implies another engine" in str(info.value)
    state = {k.replace(".burn.norm1.", ".burn.norm."): v for k, v in ours.state_dict().items()
             if ".burn.norm2." not in k}  # a branch with two norms names them norm1, norm2; with one, norm
    other.load_state_dict(state)
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
        assert rel(ours(idx), want) < 1e-5
        assert rel(other(idx), want) > 1e-3


@pytest.mark.parametrize("make", [glm4_moe_lite, axk1])
def test_mtp_key_is_inert_and_its_weights_refused(tmp_path, make):
    """GLM-4.7-Flash's config.json writes num_nextn_predict_layers, which neither class has (nothing reads it); the MTP
    layer's weights (layers.{N}.*) are refused by name on load, never dropped."""
    from safetensors.torch import load_file, save_file

    import cyclelang
    from cyclelang.backends.torch.build import build
    from cyclelang.interop import InteropError, load_transformers

    config = make()
    assert import_config({**config.to_dict(), "num_nextn_predict_layers": 1}) == import_config(config)
    ref = with_bias(config)
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    state = load_file(str(ckpt / "model.safetensors"))
    for k in [k for k in state if k.startswith("model.layers.2.")]:
        state[k.replace("model.layers.2.", "model.layers.3.")] = state[k].clone()
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    ours = build(cyclelang.parse(import_config(config)), seed=0)
    with pytest.raises(InteropError) as info:
        load_transformers(ours, ckpt)
    assert "model.layers.3" in str(info.value) and "multi-token-prediction" in str(info.value)
