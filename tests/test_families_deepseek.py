"""DeepSeek-V3 (Kimi K2 writes model_type deepseek_v3) and DeepSeek-V2's group-limited, scaled routing,
imported through the router's options (`turbine moe router=sigmoid groups= top_groups= scale= correction=`).

Each round trip uses sizes at which the routing options change the output: 8 experts in 4 groups of
which a token keeps 2, top-3, a scaling factor of 2.5, renormalised weights and a correction bias
spread far enough to change the choice (transformers' init leaves it zero, so it is set here, and
the import must load it from mlp.gate.e_score_correction_bias). Checks that getting each option
wrong changes the logits keep the sizes honest.
"""

from __future__ import annotations

import pytest

import cyclelang

from . import roundtrip
from .conftest import need
from .roundtrip import V, ids, moes, rel, round_trip, with_bias

torch = need("torch")
transformers = need("transformers")

from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import InteropError, Unsupported, import_config, load_transformers  # noqa: E402


def deepseek_v3(**over):
    return transformers.DeepseekV3Config(**{**dict(
        vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=12, num_hidden_layers=3, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        norm_topk_prob=True, max_position_embeddings=40, rms_norm_eps=1e-5, pad_token_id=None, bos_token_id=None, eos_token_id=None), **over})


def deepseek_v2(**over):
    return transformers.DeepseekV2Config(**{**dict(
        vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
        q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, max_position_embeddings=40, pad_token_id=None, bos_token_id=None,
        eos_token_id=None), **over})


def test_deepseek_v3_round_trip(tmp_path, spread_bias):
    ours, ref, spec_file = round_trip(tmp_path, deepseek_v3())
    text = spec_file.read_text()
    assert "router=sigmoid" in text and "groups=4 top_groups=2" in text and "scale=2.5" in text and "correction=true" in text
    assert "normalize=false" not in text and "stage dense_block x 1" in text and "stage moe_block x 2" in text
    for i, m in enumerate(moes(ours)):  # the bias came from the checkpoint (round_trip then adds 0.01 to every value it exports)
        want = ref.model.layers[i + 1].mlp.gate.e_score_correction_bias
        assert want.abs().max() > 0.05 and torch.allclose(m.correction - 0.01, want, rtol=0, atol=1e-6)


def test_each_routing_option_matters_at_these_sizes(tmp_path, spread_bias):
    """The imported model's logits move when any routing option is taken away: a reader that
    dropped it would fail the round trip."""
    ref = with_bias(deepseek_v3())
    ours, _, _ = roundtrip.imported(tmp_path, ref)
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
        assert rel(ours(idx), want) < 1e-5

        def off(attr, value):
            saved = [getattr(m, attr).clone() if torch.is_tensor(getattr(m, attr)) else getattr(m, attr) for m in moes(ours)]
            for m in moes(ours):
                if torch.is_tensor(getattr(m, attr)):
                    getattr(m, attr).fill_(value)
                else:
                    setattr(m, attr, value)
            out = ours(idx)
            for m, v in zip(moes(ours), saved):
                if torch.is_tensor(v):
                    getattr(m, attr).copy_(v)
                else:
                    setattr(m, attr, v)
            return rel(out, want)

        assert off("correction", 0.0) > 1e-3  # the bias changes the choice
        assert off("top_groups", 4) > 1e-3  # the group limit changes the choice
        assert off("scale", 1.0) > 1e-3


def test_deepseek_v3_unnormalised_without_groups_round_trip(tmp_path, spread_bias):
    """norm_topk_prob=false (raw sigmoid weights, scaled) and n_group=1 (no group limit); every layer routed."""
    _, _, spec_file = round_trip(tmp_path, deepseek_v3(norm_topk_prob=False, n_group=1, topk_group=1, first_k_dense_replace=0,
                                                       routed_scaling_factor=1.0, q_lora_rank=None, num_experts_per_tok=2))
    text = spec_file.read_text()
    assert "normalize=false" in text and "groups=" not in text and "scale=" not in text and "stage dense_block" not in text


def test_the_mtp_layer_is_refused_by_name(tmp_path):
    """Weights of a multi-token-prediction layer (model.layers.{N}.*, N = num_hidden_layers) have no
    place in the language: refused, naming them, never dropped; the config key alone changes nothing."""
    config = deepseek_v3(num_nextn_predict_layers=1)
    ref = with_bias(config)
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    from safetensors.torch import load_file, save_file

    state = load_file(str(ckpt / "model.safetensors"))
    for k in [k for k in state if k.startswith("model.layers.2.")]:
        state[k.replace("model.layers.2.", "model.layers.3.")] = state[k].clone()
    state["model.layers.3.eh_proj.weight"] = torch.zeros(32, 64)
    save_file(state, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    ours = build(cyclelang.parse(import_config(config)), seed=0)
    with pytest.raises(InteropError) as info:
        load_transformers(ours, ckpt)
    assert "model.layers.3" in str(info.value) and "multi-token-prediction" in str(info.value)


@pytest.mark.parametrize("over, field", [
    (dict(rope_interleave=False), "rope_interleave"),
    (dict(n_group=3), "n_group"),
    (dict(topk_group=5), "topk_group"),
    (dict(n_group=8, topk_group=2), "n_group"),  # a group of one expert has no two best
    (dict(topk_group=1), "num_experts_per_tok"),  # top-3 from one group of 2
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(routed_scaling_factor=0.0), "routed_scaling_factor"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 10}),
     "rope_parameters.rope_type"),
])
def test_deepseek_v3_unexpressible_refused_by_name(over, field):
    with pytest.raises(Unsupported) as info:
        import_config(deepseek_v3(**over))
    assert info.value.field == field


def test_deepseek_v2_group_limited_scaled_round_trip(tmp_path):
    """DeepSeek-V2's group_limited_greedy (a group scored by its best probability) and routed_scaling_factor, read."""
    _, _, spec_file = round_trip(tmp_path, deepseek_v2(topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=3.0))
    text = spec_file.read_text()
    assert "groups=4 top_groups=2 group_score=max" in text and "scale=3" in text and "router=" not in text


def test_deepseek_v2_group_limit_matters():
    """At these sizes the group limit changes a token's experts: without it the spec computes otherwise."""
    grouped = cyclelang.parse(import_config(deepseek_v2(topk_method="group_limited_greedy", n_group=4, topk_group=1)))
    free = cyclelang.parse(import_config(deepseek_v2()))
    a, b = build(grouped, seed=0).eval(), build(free, seed=0).eval()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        assert rel(a(ids()), b(ids())) > 1e-4


def test_deepseek_v2_norm_topk_prob_stays_refused():
    """transformers' DeepseekV2 never reads norm_topk_prob: which weights the checkpoint was trained with is not known."""
    with pytest.raises(Unsupported) as info:
        import_config(deepseek_v2(norm_topk_prob=True))
    assert info.value.field == "norm_topk_prob"
