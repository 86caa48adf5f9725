"""The families with attention sinks (interop/families/sinks.py): gpt-oss (gpt_oss), Granite SWA (granite_swa), Granite MoE SWA
(granitemoe_swa), Flint (flint).

Each family's round trip (tests/roundtrip.py) at a tiny config where what makes it matters: sinks (perturbed away
from their init), windows smaller than the 12 tokens on alternating layers, YaRN with truncate=false, a router bias,
experts whose clamp (swiglu_limit) bites, GQA, tied and untied heads. Then each quirk is shown to matter (the spec
with it edited out computes other logits), and what the language cannot say is refused by name.
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
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402

_YARN = {"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0, "beta_fast": 8.0, "beta_slow": 1.0, "truncate": False,
         "original_max_position_embeddings": 40}

FAMILIES = {
    "gpt_oss": lambda: transformers.GptOssConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                                 num_key_value_heads=2, head_dim=12, max_position_embeddings=40, rms_norm_eps=1e-5,
                                                 sliding_window=5, num_local_experts=6, num_experts_per_tok=2, swiglu_limit=0.2,
                                                 rope_parameters=dict(_YARN), pad_token_id=None, bos_token_id=0, eos_token_id=1),
    "gpt_oss_tied_full": lambda: transformers.GptOssConfig(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=2,
                                                           num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=40,
                                                           sliding_window=4, layer_types=["full_attention", "sliding_attention"],
                                                           num_local_experts=4, num_experts_per_tok=3, swiglu_limit=0.3,
                                                           attention_bias=False, tie_word_embeddings=True,
                                                           rope_parameters={"rope_type": "default", "rope_theta": 7000.0}, pad_token_id=0,
                                                           bos_token_id=0, eos_token_id=1),
    "granite_swa": lambda: transformers.GraniteSWAConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=4,
                                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                                         rms_norm_eps=1e-5, sliding_window=5, layer_rope_theta=[5000.0, 0, 7000.0, 5000.0],
                                                         embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
                                                         logits_scaling=4.0, attention_bias=True, mlp_bias=False, tie_word_embeddings=True,
                                                         pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "granite_swa_one_base": lambda: transformers.GraniteSWAConfig(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=3,
                                                                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=40,
                                                                  sliding_window=4, rope_parameters={"rope_type": "default", "rope_theta": 3000.0},
                                                                  embedding_multiplier=2.0, residual_multiplier=0.7, attention_multiplier=0.3,
                                                                  logits_scaling=2.0, mlp_bias=True, tie_word_embeddings=False,
                                                                  pad_token_id=None, bos_token_id=0, eos_token_id=1),
    "granitemoe_swa": lambda: transformers.GraniteMoeSWAConfig(vocab_size=V, hidden_size=32, intermediate_size=12, num_hidden_layers=3,
                                                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                                               sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                                               layer_rope_theta=[0, 6000.0, 6000.0], num_local_experts=6, num_experts_per_tok=2,
                                                               shared_intermediate_size=16, embedding_multiplier=2.5, residual_multiplier=0.6,
                                                               attention_multiplier=0.25, logits_scaling=3.0, attention_bias=False,
                                                               tie_word_embeddings=True, pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "granitemoe_swa_unshared": lambda: transformers.GraniteMoeSWAConfig(vocab_size=V, hidden_size=32, intermediate_size=12, num_hidden_layers=2,
                                                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=40,
                                                                        sliding_window=3, num_local_experts=4, num_experts_per_tok=2,
                                                                        embedding_multiplier=1.5, residual_multiplier=0.8, attention_multiplier=0.35,
                                                                        logits_scaling=2.0, tie_word_embeddings=False, pad_token_id=None,
                                                                        bos_token_id=0, eos_token_id=1),
    "flint": lambda: transformers.FlintConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=12, max_position_embeddings=40, rms_norm_eps=1e-5, sliding_window=5,
                                              moe_intermediate_size=12, num_experts=6, num_experts_per_tok=2, shared_expert_intermediate_size=16,
                                              norm_topk_prob=True, mlp_only_layers=[0], attention_bias=True,
                                              rope_parameters={"rope_type": "default", "rope_theta": 4000.0}, pad_token_id=0,
                                              bos_token_id=0, eos_token_id=1),
    "flint_default_pattern": lambda: transformers.FlintConfig(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=6,
                                                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=40,
                                                              sliding_window=3, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=3,
                                                              shared_expert_intermediate_size=8, norm_topk_prob=False, tie_word_embeddings=True,
                                                              pad_token_id=None, bos_token_id=0, eos_token_id=1),
    # YaRN with truncate=false is the language's now for every family that reads rope_parameters (Llama's here)
    "llama_yarn_untruncated": lambda: transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                                               num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                                               max_position_embeddings=40, rope_parameters=dict(_YARN), pad_token_id=None,
                                                               bos_token_id=0, eos_token_id=1),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def test_the_spec_says_sinks_clamp_router_bias_windows_and_yarn():
    text = import_config(FAMILIES["gpt_oss"]().to_dict())
    assert "sinks" in text and "act=swiglu_clamp" in text and "router_bias clamp=0.2" in text and "window=5" in text
    assert "rotary_scaling=yarn" in text and "rotary_truncate=false" in text


def test_the_default_config_reads_gpt_oss_yarn_and_alternation():
    a = read_config(transformers.GptOssConfig().to_dict())
    assert a.rotary_scaling.type == "yarn" and not a.rotary_scaling.truncate and a.rotary_scaling.factor == 32.0
    assert a.layer_windows[:4] == (128, None, 128, None) and a.sinks and a.router_bias and a.clamp == 7.0
    raw = {"model_type": "gpt_oss"}  # nothing written: the class's defaults, its YaRN filled in by __post_init__
    b = read_config(raw)
    assert b.rotary_scaling == a.rotary_scaling and b.rotary_base == 150000.0


QUIRKS = {"gpt_oss-sinks": ("gpt_oss", (" sinks", "")), "gpt_oss-clamp": ("gpt_oss", ("clamp=0.2", "clamp=100")),
          "gpt_oss-truncate": ("gpt_oss", (" rotary_truncate=false", "")), "gpt_oss-router_bias": ("gpt_oss", (" router_bias", "")),
          "granite_swa-sinks": ("granite_swa", (" sinks", "")), "flint-sinks": ("flint", (" sinks", "")),
          "flint-nope": ("flint", ("head_dim=12 sinks", "head_dim=12 rotary rotary_base=4000 sinks")), "granite_swa-nope": ("granite_swa", ("kv_heads=2 window=5 sinks", "kv_heads=2 rotary window=5 sinks"))}


@pytest.mark.parametrize("quirk", sorted(QUIRKS))
def test_each_quirk_matters(tmp_path, quirk):
    """The spec with one of gpt-oss's quirks edited out, the imported weights in it (less the edited-out ones), computes
    other logits; load_transformers refuses such a spec for the checkpoint (its config implies another engine)."""
    name, edit = QUIRKS[quirk]
    cfg = FAMILIES[name]()
    ref = roundtrip.hf(cfg)
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    text = import_config(cfg.to_dict())
    assert edit[0] in text
    (tmp_path / "s.cycle").write_text(text)
    (tmp_path / "e.cycle").write_text(text.replace(*edit))
    ours = load_transformers(build(cyclelang.load(tmp_path / "s.cycle"), seed=0).eval(), ckpt)
    other = build(cyclelang.load(tmp_path / "e.cycle"), seed=0).eval()
    keys = other.state_dict().keys()
    other.load_state_dict({k: v for k, v in ours.state_dict().items() if k in keys})
    with torch.no_grad():
        assert rel(ours(ids()), ref(ids()).logits) < 1e-5
        assert rel(other(ids()), ref(ids()).logits) > 1e-3
    with pytest.raises(Exception):
        load_transformers(build(cyclelang.load(tmp_path / "e.cycle"), seed=0), ckpt)


@pytest.mark.parametrize("key,value", [("swiglu_alpha", 1.5), ("swiglu_limit", 0.0), ("layer_types", ["sliding_attention"] * 2),
                                       ("sliding_window", None)])
def test_what_the_language_cannot_say_is_refused_by_name(key, value):
    cfg = FAMILIES["gpt_oss"]().to_dict()
    cfg[key] = value
    if key == "sliding_window":
        cfg["layer_types"] = ["sliding_attention", "full_attention", "sliding_attention"]
    with pytest.raises(Unsupported) as e:
        read_config(cfg)
    assert e.value.field.startswith(key), e.value
