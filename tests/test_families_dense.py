"""The dense Llama-shaped decoders of issue 33: OLMo 3, SmolLM3, EXAONE 4, ERNIE 4.5, Helium, CWM, EXAONE 3,
VaultGemma and HyperCLOVA X, each through the whole round trip (tests/roundtrip.py) at a config that
exercises what makes the family itself (windows under the 12 tokens tested, NoPE layers, a rope per
layer type, interleaved rotary pairs, post-norms, Peri-LN, multipliers); each option the language
cannot say refused by name; and each quirk shown to matter: the spec with it edited out computes
other logits. Nothing is downloaded: every model is built from a config with random weights.
"""

from __future__ import annotations

import re

import pytest

import cyclelang

from .conftest import need
from .roundtrip import V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402

NO_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)

CONFIGS = {
    # OLMo 3: OLMo-2's post-norms and qk-norm across heads; sliding layers (window 5) and a full one, each type its own rope
    "olmo3": lambda: transformers.Olmo3Config(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=4, num_attention_heads=6,
                                              num_key_value_heads=2, max_position_embeddings=40, sliding_window=5, rms_norm_eps=1e-6,
                                              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0},
                                                               "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}},
                                              **NO_TOKENS),
    # OLMo 3's default pattern (every fourth layer global), one rope for both types, tied, biased attention, head_dim apart
    "olmo3_default_pattern": lambda: transformers.Olmo3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                                              num_attention_heads=4, max_position_embeddings=40, sliding_window=3,
                                                              head_dim=12, attention_bias=True, tie_word_embeddings=True, **NO_TOKENS),
    # SmolLM3: a NoPE layer every third, the NoPE layers sliding (window 4), biases
    "smollm3": lambda: transformers.SmolLM3Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=40, no_rope_layer_interval=3,
                                                  use_sliding_window=True, sliding_window=4, attention_bias=True, mlp_bias=True,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 3000.0}, **NO_TOKENS),
    "smollm3_nope_list": lambda: transformers.SmolLM3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                                            num_attention_heads=4, num_key_value_heads=4, head_dim=10, max_position_embeddings=40,
                                                            no_rope_layers=[0, 1, 1, 0], tie_word_embeddings=False, **NO_TOKENS),
    # EXAONE 4: post-norms, per-head qk-norm, sliding layers (window 5) with rotary, the global one without
    "exaone4": lambda: transformers.Exaone4Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=40, sliding_window=5, sliding_window_pattern=2,
                                                  rms_norm_eps=1e-6, **NO_TOKENS),
    # without a window every layer is global with rotary; head_dim (no field of the class, but read as an attribute) apart
    "exaone4_global": lambda: transformers.Exaone4Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                         num_attention_heads=4, num_key_value_heads=4, head_dim=12, max_position_embeddings=40, sliding_window=None,
                                                         layer_types=["full_attention"] * 2, tie_word_embeddings=True, **NO_TOKENS),
    # ERNIE 4.5: interleaved rotary pairs, head_dim apart from width / heads, biases everywhere
    "ernie4_5": lambda: transformers.Ernie4_5Config(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, head_dim=10, max_position_embeddings=40, use_bias=True,
                                                    rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, **NO_TOKENS),
    # Helium: interleaved rotary pairs, q, k, v biased but not the output
    "helium": lambda: transformers.HeliumConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=2, head_dim=12, max_position_embeddings=40, attention_bias=True, mlp_bias=True,
                                                rms_norm_eps=1e-6, **NO_TOKENS),
    # CWM: global then sliding layers (window 4), its llama3 rope (here with an original context under 12)
    "cwm": lambda: transformers.CwmConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, max_position_embeddings=40, sliding_window=4,
                                          rope_parameters={"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 4.0, "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8}, bos_token_id=0, eos_token_id=1),
    # EXAONE 3: a Llama under GPT-2-like names in its files
    "exaone": lambda: transformers.ExaoneConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                                                num_key_value_heads=2, max_position_embeddings=40, attention_bias=True, **NO_TOKENS),
    # VaultGemma: Gemma 2 without its post-norms; soft-caps that bite, local layers with window 5
    "vaultgemma": lambda: transformers.VaultGemmaConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=4,
                                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=40,
                                                        sliding_window=5, query_pre_attn_scalar=24, attn_logit_softcapping=3.0,
                                                        final_logit_softcapping=2.5, attn_implementation="eager", **NO_TOKENS),
    # HyperCLOVA X: Granite's multipliers (logits multiplied) and Peri-LN: a norm before and after each sublayer
    "hyperclovax": lambda: transformers.HyperCLOVAXConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                                          embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.2,
                                                          logits_scaling=0.5, **NO_TOKENS),
    "hyperclovax_no_post_norm": lambda: transformers.HyperCLOVAXConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                                       num_attention_heads=4, max_position_embeddings=40, use_post_norm=False,
                                                                       residual_multiplier=0.5, tie_word_embeddings=True, **NO_TOKENS),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_family_round_trip(tmp_path, name):
    round_trip(tmp_path, CONFIGS[name]())


# --- each family's quirk matters: the spec with it edited out computes other logits -------------------------------


def _edited(config, subs):
    """(the reference, the imported spec loaded from it, the spec edited by `subs` holding the same weights)."""
    ref = hf(config)
    text = import_config(config)
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    for pat, rep in subs.items():
        new = re.sub(pat, rep, text)
        assert new != text, pat
        text = new
    other = build(cyclelang.parse(text), seed=0).eval()
    other.load_state_dict(ours.state_dict())
    return ref, ours, other


QUIRKS = {  # family config, the edit that drops its quirk
    "olmo3 sliding window": ("olmo3", {r" window=5": ""}),
    "olmo3 rope per layer type": ("olmo3", {r"rotary_base=500 ": "rotary_base=20000 rotary_scaling=linear rotary_factor=2 "}),
    "smollm3 NoPE layer": ("smollm3", {r"(heads=4 kv_heads=2) window=4": r"\1 rotary rotary_base=3000 window=4"}),
    "exaone4 NoPE global layer": ("exaone4", {r"(stage exaone4_global_nope \{\n  prechamber mix \{\n    turbine attention heads=4 kv_heads=2)":
                                              r"\1 rotary"}),
    "ernie4_5 interleaved pairs": ("ernie4_5", {r" rotary_interleaved": ""}),
    "helium interleaved pairs": ("helium", {r" rotary_interleaved": ""}),
    "cwm sliding window": ("cwm", {r" window=4": ""}),
    "vaultgemma (1 + w) gains": ("vaultgemma", {r" offset=1": ""}),
    "hyperclovax logits multiplied": ("hyperclovax", {r"nozzle head scale=0.5": "nozzle head scale=2"}),
}


@pytest.mark.parametrize("case", sorted(QUIRKS))
def test_a_family_quirk_edited_out_changes_the_logits(case):
    family, subs = QUIRKS[case]
    ref, ours, other = _edited(CONFIGS[family](), subs)
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
        assert rel(ours(idx), want) < 1e-5
        assert rel(other(idx), want) > 1e-3


def test_exaone3_files_hold_gpt2_like_names_and_a_doubled_weight_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    ref = hf(CONFIGS["exaone"]())
    ref.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert "transformer.h.0.attn.attention.q_proj.weight" in state  # what loads is the file's own naming
    state["model.layers.0.self_attn.q_proj.weight"] = state["transformer.h.0.attn.attention.q_proj.weight"] + 1
    save_file(state, str(tmp_path / "model.safetensors"))
    ours = build(cyclelang.parse(import_config(tmp_path)), seed=0)
    from cyclelang.interop import InteropError

    with pytest.raises(InteropError, match="under another name"):
        load_transformers(ours, tmp_path)


# --- options the language cannot say, or transformers cannot build, refused by name -------------------------------


def _dict(family, **over):
    return {**CONFIGS[family]().to_dict(), **over}


REFUSED = {
    "olmo3 top-level rope key": (lambda: _dict("olmo3", rope_parameters={"rope_theta": 1000.0, "full_attention": {"rope_type": "default"}}),
                                 "rope_parameters.rope_theta"),
    "olmo3 longrope on full layers": (lambda: _dict("olmo3", rope_parameters={"full_attention": {"rope_type": "longrope", "rope_theta": 1e4}}),
                                      "rope_parameters.full_attention.rope_type"),
    "olmo3 rope_scaling with no full_attention to go to": (lambda: _dict("olmo3", rope_parameters={"sliding_attention": {"rope_type": "default"}},
                                                                          rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling"),
    "olmo3 sliding layers without a window": (lambda: _dict("olmo3", sliding_window=None), "sliding_window"),
    "smollm3 sliding layers without use_sliding_window": (lambda: _dict("smollm3", use_sliding_window=False), "use_sliding_window"),
    "smollm3 too few no_rope_layers": (lambda: _dict("smollm3", no_rope_layers=[1, 0]), "no_rope_layers"),
    "exaone4 null head_dim": (lambda: _dict("exaone4", head_dim=None), "head_dim"),
    "olmo3 head_dim not a size": (lambda: _dict("olmo3", head_dim=0), "head_dim"),
    "exaone4 no window and no layer_types": (lambda: _dict("exaone4", sliding_window=None, layer_types=None), "sliding_window"),
    "ernie4_5 partial rotary": (lambda: _dict("ernie4_5", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
                                "rope_parameters.partial_rotary_factor"),
    "helium heads x head_dim apart from the width": (lambda: _dict("helium", head_dim=8), "head_dim"),
    "cwm legacy rope_theta without rope_parameters": (lambda: {k: v for k, v in _dict("cwm", rope_theta=500.0).items() if k != "rope_parameters"},
                                                      "rope_theta"),
    "vaultgemma null window": (lambda: _dict("vaultgemma", sliding_window=None), "sliding_window"),
    "vaultgemma relu gate": (lambda: _dict("vaultgemma", hidden_activation="relu"), "hidden_activation"),
    "hyperclovax zero logits_scaling": (lambda: _dict("hyperclovax", logits_scaling=0.0), "logits_scaling"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_a_family_cannot_say_is_refused_by_name(case):
    make, field = REFUSED[case]
    with pytest.raises(Unsupported) as info:
        import_config(make())
    assert info.value.field == field, str(info.value)


def test_cwm_without_rope_parameters_reads_its_own_llama3_rope():
    config = {k: v for k, v in _dict("cwm").items() if k != "rope_parameters"}
    text = import_config(config)
    assert "rotary_scaling=llama3 rotary_factor=16" in text and "rotary_base=1000000" in text
    assert transformers.CwmConfig(**{k: v for k, v in config.items() if k != "model_type"}).rope_parameters["rope_type"] == "llama3"


def test_olmo3_legacy_rope_keys_read_as_olmo3config_places_them():
    """Released OLMo 3 configs write rope_theta and a YaRN rope_scaling: transformers gives both to the full-attention
    layers alone (the sliding ones keep the class's 500000); the import of the file is the import of what the class makes."""
    legacy = {k: v for k, v in _dict("olmo3").items() if k != "rope_parameters"}
    legacy.update(rope_theta=1234.0, max_position_embeddings=32,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "attention_factor": 1.2})
    made = transformers.Olmo3Config(**{k: v for k, v in legacy.items() if k != "model_type"})
    assert made.rope_parameters["sliding_attention"]["rope_theta"] == 500000.0
    text = import_config(legacy)
    assert text == import_config(made.to_dict())
    assert "rotary_base=1234 rotary_scaling=yarn" in text and "rotary_base=500000 window=5" in text


def test_olmo3_yarn_on_full_layers_round_trips(tmp_path):
    config = CONFIGS["olmo3"]()
    config.rope_parameters = {"full_attention": {"rope_type": "yarn", "rope_theta": 1234.0, "factor": 4.0, "original_max_position_embeddings": 8,
                                                 "attention_factor": 1.2},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}
    round_trip(tmp_path, config)


def test_interleaved_rotary_takes_a_scaling(tmp_path):
    config = CONFIGS["ernie4_5"]()
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8}
    round_trip(tmp_path, config)


def test_exaone3_reads_its_attribute_map_names():
    plain = _dict("exaone")
    aliased = {k: v for k, v in plain.items() if k not in ("num_hidden_layers", "rms_norm_eps", "hidden_act")}
    aliased.update(num_layers=plain["num_hidden_layers"], layer_norm_epsilon=plain["rms_norm_eps"], activation_function=plain["hidden_act"])
    assert import_config(aliased) == import_config(plain)


def test_released_style_keys_outside_a_class_that_change_nothing():
    """EXAONE 3's released configs write embed_dropout, VaultGemma's may write hidden_act beside hidden_activation: neither is read."""
    assert import_config(_dict("exaone", embed_dropout=0.1)) == import_config(_dict("exaone"))
    assert import_config(_dict("vaultgemma", hidden_act="relu")) == import_config(_dict("vaultgemma"))
