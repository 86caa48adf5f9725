"""Laguna (laguna, interop/families/laguna.py): its round trip at tiny configs where every option of its own changes the output
(the softplus output gate per head or per channel, heads per layer, each layer type's rope with a partial rotary, the
sliding window, the selection-only correction bias, the routed scale, the shared expert, the dense layers), each quirk
shown to matter, and what is refused by name."""

from __future__ import annotations

import pytest

from .conftest import need
from .roundtrip import V, hf, round_trip
from .test_families_afmoe import bias_picks, quirk_matters

torch = need("torch")
transformers = need("transformers")

from cyclelang.interop import Unsupported, import_config  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402


def laguna(**o):
    """A tiny laguna: 5 layers (global local local global local), 6 4 4 6 4 heads over 2 KV heads, a gate per head, the full
    layers' rope on half of each head at base 5000, the sliding ones' on all at 300, a window of 5 < 12 tokens; layers 0 and 3
    dense, the rest 6 experts top 2 with a shared expert 10 wide, scale 1.6; eps 1e-5, untied."""
    c = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5, sliding_window=5, moe_intermediate_size=12,
             shared_expert_intermediate_size=10, num_experts_per_tok=2, num_experts=6, moe_routed_scaling_factor=1.6,
             layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
             mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse"], num_attention_heads_per_layer=[6, 4, 4, 6, 4],
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 300.0, "partial_rotary_factor": 1.0}},
             tie_word_embeddings=False)
    c.update(o)
    return transformers.LagunaConfig(**c)


def laguna_channel():
    """A softplus gate per channel (gating per-element), the defaults' layer pattern (every layer global, the first dense),
    tied, eps 1e-6."""
    return laguna(gating="per-element", num_hidden_layers=3, layer_types=None, mlp_layer_types=None, num_attention_heads_per_layer=None,
                  tie_word_embeddings=True, rms_norm_eps=1e-6, moe_routed_scaling_factor=1.0)


CONFIGS = {"laguna": laguna, "laguna_channel": laguna_channel}


def _spread(ref):
    with torch.no_grad():  # the correction bias spread wide enough to change which experts are chosen
        for m in ref.modules():
            if type(m).__name__ == "LagunaTopKRouter":
                m.e_score_correction_bias.copy_(0.5 * torch.randn(m.e_score_correction_bias.shape))
    return ref


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, CONFIGS[name]())


def test_the_default_config_imports_as_the_library_spec():
    from .conftest import ROOT

    text = import_config(transformers.LagunaConfig().to_dict())
    assert "gate=head gate_act=softplus" in text and "rotary=0.5 rotary_base=500000" in text and "correction=true" in text
    lib = (ROOT / "specs" / "families" / "laguna.cycle").read_text()
    assert lib == text.replace("imported from config.json", "imported from transformers' default laguna config", 1)


QUIRKS = {  # config, the spec's words for the quirk, the words without it
    "the softplus gate": (laguna, " gate_act=softplus", ""),
    "the sliding window": (laguna, " window=5", ""),
    "the partial rotary": (laguna, " rotary=0.5 ", " rotary "),
    "the full layers' rotary base": (laguna, " rotary_base=5000 ", " "),
    "the routed scale": (laguna, " scale=1.6", ""),
}


@pytest.mark.parametrize("case", sorted(QUIRKS))
def test_the_quirk_matters(case):
    config, old, new = QUIRKS[case]
    quirk_matters(_spread(hf(config())), old, new)


def test_the_correction_bias_picks_but_never_weighs():
    bias_picks(_spread(hf(laguna())))


REFUSED = {  # an option the language cannot say -> the key named
    "biased attention": ({"attention_bias": True}, "attention_bias"),
    "router soft-cap": ({"moe_router_logit_softcapping": 30.0}, "moe_router_logit_softcapping"),
    "weights on the input": ({"moe_apply_router_weight_on_input": True}, "moe_apply_router_weight_on_input"),
    "an unknown gating": ({"gating": "per-token"}, "gating"),
    "yarn": ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 2.0},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}}, "rope_parameters.full_attention.rope_type"),
    "an odd partial rotary": ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.375},
                                                   "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}},
                              "rope_parameters.full_attention.partial_rotary_factor"),
    "heads per layer KV cannot split": ({"num_attention_heads_per_layer": [6, 4, 3, 6, 4]}, "num_attention_heads_per_layer"),
    "ungated act": ({"hidden_act": "relu"}, "hidden_act"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_option_the_language_cannot_say_is_refused_by_name(case):
    over, key = REFUSED[case]
    config = {**laguna().to_dict(), **over}
    with pytest.raises(Unsupported) as e:
        read_config(config)
    assert e.value.field == key, e.value


def test_gating_false_is_a_gate_per_channel():
    """LagunaAttention gates per head only for gating true or "per-head": false gates every channel, as "per-element" does."""
    text = import_config({**laguna().to_dict(), "gating": False})
    assert text == import_config({**laguna().to_dict(), "gating": "per-element"}) and " gate=channel gate_act=softplus" in text
    assert " gate=head gate_act=softplus" in import_config(laguna().to_dict())
