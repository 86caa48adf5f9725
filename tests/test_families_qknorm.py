"""The qk-norm variants read where the language says them exactly (interop/families/parallel.py,
families.py): StableLM's qk_layernorm (one LayerNorm per head, each its own gain, no bias) and
Cohere's use_qk_norm (one (heads, head_dim) gain, a bias-free LayerNorm over each head), both
`qk_norm qk_norm_type=layernorm qk_norm_head_gains`; Phi's qk_layernorm (one biased LayerNorm over each
head's dims, shared by the heads: Persimmon's); HunYuan's dense and MoE decoders, whose qk
RMSNorms act after rotary (`qk_norm_after_rotary`).

Each one's round trip (tests/roundtrip.py) with the option on, the norms' gains spread away from 1
(roundtrip.hf perturbs every weight); each quirk shown to matter (the same weights through the spec
with it edited out compute other logits); what the language still cannot say refused by name.
"""

from __future__ import annotations

import pytest

import cyclelang

from .conftest import need
from .roundtrip import V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402


def stablelm(**o):
    return transformers.StableLmConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=6,
                                                 num_key_value_heads=2, max_position_embeddings=40, layer_norm_eps=1e-4, qk_layernorm=True,
                                                 use_qkv_bias=True, pad_token_id=3, bos_token_id=0, eos_token_id=1,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 3000.0, "partial_rotary_factor": 0.5}),
                                          **o})


def cohere(**o):
    return transformers.CohereConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                                               num_key_value_heads=2, max_position_embeddings=40, layer_norm_eps=1e-4, logit_scale=0.3,
                                               use_qk_norm=True, rope_parameters={"rope_type": "default", "rope_theta": 3000.0},
                                               pad_token_id=3, bos_token_id=0, eos_token_id=1), **o})


def phi(**o):
    return transformers.PhiConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=6,
                                            num_key_value_heads=3, max_position_embeddings=40, layer_norm_eps=1e-4, qk_layernorm=True,
                                            rope_parameters={"rope_type": "default", "rope_theta": 3000.0, "partial_rotary_factor": 0.5},
                                            bos_token_id=0, eos_token_id=1), **o})


def hunyuan_dense(**o):
    return transformers.HunYuanDenseV1Config(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=2, num_attention_heads=6,
                                                       num_key_value_heads=2, head_dim=10, max_position_embeddings=40, rms_norm_eps=1e-4,
                                                       rope_parameters={"rope_type": "default", "rope_theta": 3000.0}, pad_token_id=3,
                                                       bos_token_id=0, eos_token_id=1, eod_token_id=2), **o})


def hunyuan_moe(**o):
    return transformers.HunYuanMoEV1Config(**{**dict(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, head_dim=8, max_position_embeddings=40, rms_norm_eps=1e-4, num_experts=5,
                                                     moe_topk=2, rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, pad_token_id=3,
                                                     bos_token_id=0, eos_token_id=1, eod_token_id=2, sep_token_id=4), **o})


FAMILIES = {
    "stablelm_qk_layernorm": stablelm,
    "stablelm_qk_layernorm_parallel_mha_tied": lambda: stablelm(num_attention_heads=4, num_key_value_heads=4, use_parallel_residual=True,
                                                                tie_word_embeddings=True, use_qkv_bias=False, layer_norm_eps=1e-5),
    "cohere_qk_norm": cohere,
    "cohere_qk_norm_biased_untied_mha": lambda: cohere(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, attention_bias=True,
                                                       tie_word_embeddings=False, pad_token_id=None),
    "phi_qk_layernorm": phi,
    "phi_qk_layernorm_mha_full_rotary": lambda: phi(num_attention_heads=4, num_key_value_heads=4, layer_norm_eps=1e-5,
                                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}),
    "hunyuan_v1_dense": hunyuan_dense,
    "hunyuan_v1_dense_biased_tied_alpha": lambda: hunyuan_dense(attention_bias=True, tie_word_embeddings=True, num_key_value_heads=6,
                                                                rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 1.0, "alpha": 50.0}),
    "hunyuan_v1_moe": hunyuan_moe,
    "hunyuan_v1_moe_top1_untied_head_dim": lambda: hunyuan_moe(num_experts=3, moe_topk=1, head_dim=12, tie_word_embeddings=False,
                                                               attention_bias=True),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def imported(config):
    ref = hf(config)
    text = import_config(ref.config.to_dict())
    return ref, text, load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)


def differs(ref, model) -> bool:
    idx = ids()
    with torch.no_grad():
        return rel(model(idx), ref(idx).logits) > 1e-3


def _qk_norms(model):
    return [m for n, m in model.named_modules() if n.endswith(("q_norm", "k_norm"))]


@pytest.mark.parametrize("name", ["stablelm_qk_layernorm", "cohere_qk_norm"])
def test_each_head_its_own_gain_and_the_mean_removed_matter(name):
    """The qk-norms are LayerNorms (an RMSNorm in their place computes other logits), and each head's gain is its own (head 0's
    gain on every head computes other logits)."""
    ref, text, ours = imported(FAMILIES[name]())
    assert " qk_norm_type=layernorm" in text and " qk_norm_head_gains" in text and "qk_norm_bias" not in text
    assert not differs(ref, ours)
    rms = build(cyclelang.parse(text.replace(" qk_norm_type=layernorm", "")), seed=0).eval()
    rms.load_state_dict(ours.state_dict())
    assert differs(ref, rms)
    shared = build(cyclelang.parse(text), seed=0).eval()
    shared.load_state_dict(ours.state_dict())
    with torch.no_grad():
        for m in _qk_norms(shared):
            w = m.weight.view(m.heads, -1)
            w.copy_(w[:1].expand_as(w))
    assert differs(ref, shared)


def test_export_refuses_a_qk_norm_the_family_does_not_have(tmp_path):
    """A Cohere-named spec whose qk-norms are RMSNorms has no use_qk_norm to say them: refused by name, not written as LayerNorms."""
    from dataclasses import replace

    from cyclelang.interop import export_config
    from cyclelang.interop.families import arch_of, config_of

    for family, make in (("cohere", cohere), ("stablelm", stablelm)):
        spec = cyclelang.parse(import_config(make().to_dict()).replace(" qk_norm_type=layernorm", ""))
        with pytest.raises(Unsupported) as e:
            config_of(replace(arch_of(spec.engine), family=family))
        assert e.value.field == "qk_norm"
        with pytest.raises(Unsupported):
            export_config(spec)


def test_phi_qk_layernorms_matter():
    """Phi's qk_layernorm: biased LayerNorms over each head's dims; as RMSNorms without the bias the same weights compute other logits."""
    ref, text, ours = imported(FAMILIES["phi_qk_layernorm"]())
    assert " qk_norm_type=layernorm qk_norm_bias" in text and "qk_norm_head_gains" not in text
    assert not differs(ref, ours)
    rms = build(cyclelang.parse(text.replace(" qk_norm_type=layernorm qk_norm_bias", "")), seed=0).eval()
    rms.load_state_dict(ours.state_dict(), strict=False)  # the qk-norms' biases have no place
    assert differs(ref, rms)


@pytest.mark.parametrize("name", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_hunyuan_qk_norms_after_rotary_matter(name):
    """HunYuan's qk RMSNorms act on the rotated q and k: the same weights with them before rotary compute other logits."""
    ref, text, ours = imported(FAMILIES[name]())
    assert " qk_norm_after_rotary" in text
    assert not differs(ref, ours)
    early = build(cyclelang.parse(text.replace(" qk_norm_after_rotary", "")), seed=0).eval()
    early.load_state_dict(ours.state_dict())
    assert differs(ref, early)


def test_hunyuan_alpha_is_a_fixed_base_not_dynamic_ntk():
    """rope_type dynamic with an alpha is HunYuan's ntk_alpha: rope_theta * alpha ** (d / (d - 2)), the same at every length."""
    text = import_config(FAMILIES["hunyuan_v1_dense_biased_tied_alpha"]().to_dict())
    assert "dynamic" not in text and f"rotary_base={1000.0 * 50.0 ** (10 / 8):g}"[:16] in text


REFUSED = [  # (config, the key named, words of the reason)
    (lambda: hunyuan_dense(head_dim=None, rope_parameters={"rope_type": "dynamic", "rope_theta": 1000.0, "factor": 1.0, "alpha": 50.0}),
     "rope_parameters.alpha", "head_dim null"),
    (lambda: hunyuan_moe(head_dim=None), "head_dim", "fails without one"),
    (lambda: hunyuan_moe(moe_topk=[1, 2]), "moe_topk", "per layer"),
    (lambda: hunyuan_moe(num_experts=2, moe_topk=3), "moe_topk", "top-3 of 2"),
    (lambda: transformers.MptConfig(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=40, attn_config={"qk_ln": True}),
     "attn_config.qk_ln", "transformers' Mpt ignores it"),
]


@pytest.mark.parametrize("case", range(len(REFUSED)))
def test_still_refused_by_name(case):
    make, key, words = REFUSED[case]
    with pytest.raises(Unsupported) as e:
        read_config(make().to_dict())
    assert e.value.field == key and words in str(e.value)
