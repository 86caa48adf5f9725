"""Arcee's AFMoE (afmoe, interop/families/afmoe.py): its round trip at tiny configs where every option of its own changes
the output (the output gate, the sandwich norms, rotary on the sliding layers only, the selection-only expert bias,
route_scale, the shared expert, the dense first layers, mup_enabled), each quirk shown to matter, and what is refused
by name."""

from __future__ import annotations

import pytest

from .conftest import need
from .roundtrip import V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")

import cyclelang  # noqa: E402
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402


def afmoe(**o):
    """A tiny afmoe: 5 layers (local local global local global), the first dense; 6 experts, top 2, 2 shared; a window of 5 < 12
    tokens, GQA, route_scale 1.7, rope base 1000, eps 1e-5, untied."""
    c = dict(vocab_size=V, hidden_size=32, intermediate_size=40, moe_intermediate_size=12, num_hidden_layers=5, num_dense_layers=1,
             num_attention_heads=4, num_key_value_heads=2, head_dim=10, max_position_embeddings=64, rms_norm_eps=1e-5,
             num_experts=6, num_experts_per_tok=2, num_shared_experts=2, route_scale=1.7, sliding_window=5,
             layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, tie_word_embeddings=False)
    c.update(o)
    return transformers.AfmoeConfig(**c)


def afmoe_mup():
    """mup_enabled (the embedding times sqrt(hidden_size)), tied, no dense layer, the default pattern (every 3rd layer global),
    one shared expert, top 3, route_scale 1."""
    return afmoe(num_hidden_layers=4, num_dense_layers=0, layer_types=None, global_attn_every_n_layers=3, mup_enabled=True,
                 tie_word_embeddings=True, num_shared_experts=1, num_experts_per_tok=3, route_scale=1.0, rms_norm_eps=1e-6)


def afmoe_yarn():
    """YaRN on the sliding layers' rotary (factor 4 over an original context of 4 < 12 tokens, attention factor from mscale);
    the global layers stay without positions."""
    return afmoe(rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 4,
                                  "beta_fast": 8.0, "beta_slow": 0.5})


CONFIGS = {"afmoe": afmoe, "afmoe_mup": afmoe_mup, "afmoe_yarn": afmoe_yarn}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, CONFIGS[name]())


def test_the_default_config_imports_as_the_library_spec():
    from .conftest import ROOT

    text = import_config(transformers.AfmoeConfig().to_dict())
    assert "gate=channel" in text and "router=sigmoid" in text and "correction=true" in text and "shared=2816" in text
    lib = (ROOT / "specs" / "families" / "afmoe.cycle").read_text()
    assert lib == text.replace("imported from config.json", "imported from transformers' default afmoe config", 1)


# --- the quirks: each edited out, the same weights compute something else ----------------------------


QUIRKS = {  # config, the spec's words for the quirk, the words without it
    "the output gate": (afmoe, " gate=channel", ""),
    "the sliding window": (afmoe, " window=5", ""),
    "rotary on the sliding layers": (afmoe, " rotary rotary_base=1000", ""),
    "the rotary base": (afmoe, " rotary_base=1000", ""),
    "route_scale": (afmoe, " scale=1.7", ""),
    "mup's embedding scale": (afmoe_mup, " scale=sqrt(width)", ""),
    "yarn": (afmoe_yarn, " rotary_scaling=yarn rotary_factor=4 rotary_original=4 rotary_beta_fast=8 rotary_beta_slow=0.5", ""),
}


def _spread(ref):
    with torch.no_grad():  # the expert bias spread wide enough to change which experts are chosen
        for m in ref.modules():
            if type(m).__name__ == "AfmoeSparseMoeBlock":
                m.expert_bias.copy_(0.5 * torch.randn(m.expert_bias.shape))
    return ref


def quirk_matters(ref, old: str, new: str) -> None:
    """The imported spec gives transformers' logits; with `old` edited to `new` the same weights compute something else."""
    text = import_config(ref.config.to_dict())
    assert old in text
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        wrong = build(cyclelang.parse(text.replace(old, new)), seed=0).eval()
        wrong.load_state_dict(ours.state_dict(), strict=False)
        assert rel(wrong(idx), ref(idx).logits) > 1e-3


@pytest.mark.parametrize("case", sorted(QUIRKS))
def test_the_quirk_matters(case):
    config, old, new = QUIRKS[case]
    quirk_matters(_spread(hf(config())), old, new)


def bias_picks(ref) -> None:
    """A spread selection-only bias loads into the correction buffer and gives transformers' logits; zeroed, the choice changes."""
    text = import_config(ref.config.to_dict())
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        want = ours(idx)
        for name, b in ours.named_buffers():
            if name.endswith("correction"):
                b.zero_()
        assert rel(ours(idx), want) > 1e-3


def test_the_expert_bias_picks_but_never_weighs():
    bias_picks(_spread(hf(afmoe())))


REFUSED = {  # an option the language cannot say -> the key named
    "biased attention": ({"attention_bias": True}, "attention_bias"),
    "longrope": ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1000.0, "factor": 2.0, "short_factor": [1.0] * 5,
                                      "long_factor": [1.0] * 5, "original_max_position_embeddings": 32}}, "rope_parameters.rope_type"),
    "partial rotary": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}},
                       "rope_parameters.partial_rotary_factor"),
    "no shared expert": ({"num_shared_experts": 0}, "num_shared_experts"),
    "null head_dim": ({"head_dim": None}, "head_dim"),
    "null num_dense_layers": ({"num_dense_layers": None}, "num_dense_layers"),
    "ungated act": ({"hidden_act": "relu"}, "hidden_act"),
    "a layer type unknown": ({"layer_types": ["sliding_attention"] * 4 + ["chunked_attention"]}, "layer_types"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_option_the_language_cannot_say_is_refused_by_name(case):
    over, key = REFUSED[case]
    config = {**afmoe().to_dict(), **over}
    with pytest.raises(Unsupported) as e:
        read_config(config)
    assert e.value.field == key, e.value
