"""The gated DeltaNet hybrids (interop/families/delta.py): Qwen3-Next (qwen3_next) and Qwen3.5's text decoders
(qwen3_5_text, qwen3_5_moe_text).

Each family's round trip (tests/roundtrip.py) at a tiny config where what makes it matters: value heads twice the key
heads (grouped), key and value head widths that differ, a conv kernel of 3, the 3:1 layer pattern and one written out,
partial rotary, GQA in the attention layers, a non-default eps and rope base, tied and untied heads; Qwen3-Next's
routed experts beside a gated shared one, with a dense layer (mlp_only_layers). Then the quirks are shown to matter:
the (1 + w) gains, the attention's output gate, the partial rotary and the layer pattern each change the logits when
edited out of the spec; each option the language lacks is refused by name.
"""

from __future__ import annotations

import pytest

import cyclelang

from . import roundtrip
from .conftest import need
from .roundtrip import V, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config  # noqa: E402

_COMMON = dict(vocab_size=V, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
               rms_norm_eps=1e-5, linear_conv_kernel_dim=3, linear_key_head_dim=8, linear_value_head_dim=6, linear_num_key_heads=2,
               linear_num_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 20000.0, "partial_rotary_factor": 0.5},
               pad_token_id=0, bos_token_id=0, eos_token_id=1)


def qwen3_5_text(**over):
    return transformers.Qwen3_5TextConfig(**{**_COMMON, "intermediate_size": 40, "num_hidden_layers": 4, **over})


def qwen3_next(**over):
    return transformers.Qwen3NextConfig(**{**_COMMON, "intermediate_size": 40, "num_hidden_layers": 4, "num_experts": 6,
                                           "num_experts_per_tok": 2, "moe_intermediate_size": 12, "shared_expert_intermediate_size": 20,
                                           "mlp_only_layers": [1], "norm_topk_prob": True, **over})


def qwen3_5_moe_text(**over):
    return transformers.Qwen3_5MoeTextConfig(**{**_COMMON, "num_hidden_layers": 4, "num_experts": 6, "num_experts_per_tok": 2,
                                                "moe_intermediate_size": 12, "shared_expert_intermediate_size": 20, **over})


def hf(config, seed=1):
    """roundtrip.hf with decays of at most e^-(e^0.5 softplus(.)) per position (A_log in [-2.5, 0.5]). The class's init draws
    exp(A_log) up to 16, so after a few positions the log decays sum past -100; transformers' torch path then weighs
    positions by exp(a difference of those sums) in float32 and its gradients wander by 4e-5 of the largest (ours, chunked
    with masked sums, stay within 1e-6 of float64 there): the round trip's 1e-5 would measure transformers' rounding."""
    model = _PLAIN_HF(config, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.linspace(-2.5, 0.5, p.numel()).roll(seed))
    return model


_PLAIN_HF = roundtrip.hf


@pytest.fixture(autouse=True)
def _mild_decays(monkeypatch):
    monkeypatch.setattr(roundtrip, "hf", hf)


def olmo_hybrid(**over):
    return transformers.OlmoHybridConfig(**{"vocab_size": V, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 4,
                                            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                                            "rms_norm_eps": 1e-5, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                            "linear_key_head_dim": 8, "linear_value_head_dim": 6, "linear_conv_kernel_dim": 3,
                                            "rope_parameters": {"rope_type": "default", "rope_theta": 30000.0},
                                            "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 1, **over})


def lara_mini(**over):
    return transformers.LaraMiniConfig(**{**{k: v for k, v in _COMMON.items() if k != "rope_parameters"}, "num_hidden_layers": 5,
                                          "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
                                          "shared_expert_intermediate_size": 20, "sliding_window": 5, "tie_word_embeddings": False,
                                          "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}, **over})


FAMILIES = {
    "qwen3_5_text": lambda: qwen3_5_text(),
    "qwen3_5_text_tied_pattern": lambda: qwen3_5_text(tie_word_embeddings=True, num_hidden_layers=3, attention_bias=True,
                                                      layer_types=["full_attention", "linear_attention", "linear_attention"],
                                                      linear_num_key_heads=4, linear_value_head_dim=8, pad_token_id=None),
    "qwen3_next": lambda: qwen3_next(),
    "qwen3_next_raw_weights": lambda: qwen3_next(norm_topk_prob=False, mlp_only_layers=None, attention_bias=True,
                                                 layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
    "qwen3_5_moe_text": lambda: qwen3_5_moe_text(),
    "olmo_hybrid": lambda: olmo_hybrid(),
    "lara_mini": lambda: lara_mini(),
    "olmo_hybrid_nope_defaults": lambda: olmo_hybrid(rope_parameters={"rope_type": "default", "rope_theta": None}, linear_num_key_heads=None,
                                                     linear_num_value_heads=None, linear_key_head_dim=None, linear_value_head_dim=None,
                                                     linear_allow_neg_eigval=False, tie_word_embeddings=True,
                                                     layer_types=["linear_attention", "full_attention", "linear_attention"],
                                                     num_hidden_layers=3),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def _logits(text: str, ckpt_model):
    from cyclelang.interop import convert_state_dict

    ours = build(cyclelang.parse(text), seed=0).eval()
    ours.load_state_dict(convert_state_dict(ckpt_model.state_dict(), ours.state_dict(), ckpt_model.config.to_dict(), spec=ours.spec))
    with torch.no_grad():
        out = ours(ids())
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("make", [qwen3_5_text, qwen3_next])
def test_the_quirks_are_in_the_spec_and_matter(make):
    ref = hf(make())
    text = import_config(ref.config)
    assert "turbine delta heads=4 k_heads=2 head_dim=8 v_dim=6 conv=3" in text and "gate=channel" in text
    assert "norm rmsnorm offset=1" in text and "qk_norm_offset=1" in text and "rotary=0.5" in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    for edit in (("norm rmsnorm offset=1", "norm rmsnorm"), ("qk_norm_offset=1 ", ""), ("gate=channel", "gate=none"),
                 ("rotary=0.5", "rotary")):
        edited = text.replace(*edit)
        if edit[0] == "gate=channel":  # the gate's weights have no place without it: the same weights, the gate left out
            ours = build(cyclelang.parse(text), seed=0).eval()
            from cyclelang.interop import convert_state_dict

            ours.load_state_dict(convert_state_dict(ref.state_dict(), ours.state_dict(), ref.config.to_dict(), spec=ours.spec))
            plain = build(cyclelang.parse(edited), seed=0).eval()
            plain.load_state_dict({k: v for k, v in ours.state_dict().items() if ".gate." not in k})
            with torch.no_grad():
                assert rel(plain(ids()), want) > 1e-3, edit
            continue
        assert rel(_logits(edited, ref), want) > 1e-4, edit


def test_the_layer_pattern_matters():
    """A pattern read wrong is no silent load: the default pattern's spec has no place for the attention weights of layer 1."""
    from cyclelang.interop import InteropError

    ref = hf(qwen3_5_text(layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"]))
    text = import_config(ref.config)
    assert "stage layer1 = attention_mlp" in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    with pytest.raises(InteropError):
        _logits(import_config(qwen3_5_text()), ref)  # full attention at layer 3


def test_the_default_pattern_is_three_deltas_then_attention():
    text = import_config(qwen3_5_text(num_hidden_layers=8).to_dict())
    assert "stage delta_mlp {" in text and "stage attention_mlp {" in text and "x 2 {" in text


def test_olmo_hybrid_quirks_are_in_the_spec_and_matter():
    ref = hf(olmo_hybrid())
    text = import_config(ref.config)
    assert "negative_eigenvalues" in text and "eps=1e-05" in text and "qk_norm_across" in text and "gate=" not in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    assert rel(_logits(text.replace(" negative_eigenvalues", ""), ref), want) > 1e-4
    assert rel(_logits(text.replace("rotary_base=30000", "rotary_base=10000"), ref), want) > 1e-4


def test_lara_mini_window_and_unrotated_full_layers_matter():
    ref = hf(lara_mini())
    text = import_config(ref.config)
    assert "window=5" in text and "# no rotary" in text and "shared_gate" not in text and "offset=1" not in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    assert rel(_logits(text.replace(" window=5", ""), ref), want) > 1e-4
    full = next(ln for ln in text.splitlines() if "# no rotary" in ln)
    assert rel(_logits(text.replace(full, full.replace(" qk_norm ", " rotary rotary_base=20000 qk_norm ", 1)), ref), want) > 1e-4


UNEXPRESSIBLE = {
    "gelu": (qwen3_5_text, dict(hidden_act="gelu"), "hidden_act"),
    "scaled rope": (qwen3_5_text, dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "rope_parameters.rope_type"),
    "key heads": (qwen3_5_text, dict(linear_num_key_heads=3), "linear_num_key_heads"),
    "layer kind": (qwen3_5_text, dict(layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention"]), "layer_types"),
    "odd rotary": (qwen3_5_text, dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.375}),
                   "partial_rotary_factor"),
    "next top past experts": (qwen3_next, dict(num_experts_per_tok=7), "num_experts_per_tok"),
    "next sparse step": (qwen3_next, dict(decoder_sparse_step=0), "decoder_sparse_step"),
    "olmo gelu": (olmo_hybrid, dict(hidden_act="gelu"), "hidden_act"),
    "olmo scaled rope": (olmo_hybrid, dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "rope_parameters.rope_type"),
    "olmo nope with a factor": (olmo_hybrid, dict(rope_parameters={"rope_type": "default", "rope_theta": None, "factor": 2.0}), "rope_parameters"),
    "olmo key heads": (olmo_hybrid, dict(linear_num_key_heads=3), "linear_num_key_heads"),
    "lara layer kind": (lara_mini, dict(layer_types=["linear_attention", "chunked_attention", "linear_attention", "full_attention",
                                                    "linear_attention"]), "layer_types"),
    "lara scaled rope": (lara_mini, dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}), "rope_parameters.rope_type"),
}


@pytest.mark.parametrize("case", list(UNEXPRESSIBLE))
def test_unexpressible_option_refused_by_name(case):
    make, over, key = UNEXPRESSIBLE[case]
    config = make().to_dict()
    config.update(over)
    with pytest.raises(Unsupported) as info:
        import_config(config)
    assert info.value.field == key, str(info.value)


@pytest.mark.parametrize("family", ["kimi_linear", "bailing_hybrid"])
def test_kimi_style_delta_rules_stay_refused_by_name(family):
    from cyclelang.interop.unclaimed import UNCLAIMED

    assert "delta" in UNCLAIMED[family][1]
    with pytest.raises(Unsupported) as info:
        import_config({"model_type": family})
    assert "delta" in str(info.value)
