"""The families that need squared ReLU, the qk-norm's shapes or a (1 + w) LayerNorm: Arcee,
Gemma 3 (text), Nemotron, Persimmon.

Each family's round trip (tests/roundtrip.py) at a tiny config unlike its default, where each of
its own options changes the output; each option the language cannot say refused by name; and
for each quirk (a (1 + w) gain, relu2, a layer pattern with two rotary bases) a check that the
spec with the quirk edited out computes something else.
"""

from __future__ import annotations

import pytest

import cyclelang

from .conftest import need
from .roundtrip import hf, ids, rel, round_trip, V

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402


def arcee(**o):
    return transformers.ArceeConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                                              num_key_value_heads=2, head_dim=12, max_position_embeddings=40, rms_norm_eps=1e-5,
                                              rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, attention_bias=True,
                                              mlp_bias=True, pad_token_id=None, bos_token_id=None, eos_token_id=None), **o})


def gemma3(**o):
    return transformers.Gemma3TextConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
                                                   num_key_value_heads=2, head_dim=16, max_position_embeddings=40, rms_norm_eps=1e-5,
                                                   query_pre_attn_scalar=24, sliding_window=5,
                                                   layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                                                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                                                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0}},
                                                   pad_token_id=None, bos_token_id=None, eos_token_id=None), **o})


def nemotron(**o):
    return transformers.NemotronConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, head_dim=16, max_position_embeddings=40, norm_eps=1e-6,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
                                                 attention_bias=True, mlp_bias=True, pad_token_id=None, bos_token_id=None, eos_token_id=None), **o})


def persimmon(**o):
    return transformers.PersimmonConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                                  max_position_embeddings=40, layer_norm_eps=1e-6, qk_layernorm=True,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
                                                  pad_token_id=2, bos_token_id=None, eos_token_id=None), **o})


def jais2(**o):
    return transformers.Jais2Config(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                                              num_key_value_heads=2, head_dim=12, max_position_embeddings=40, layer_norm_eps=1e-6,
                                              rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, pad_token_id=4,
                                              bos_token_id=None, eos_token_id=None), **o})


def nanochat(**o):
    return transformers.NanoChatConfig(**{**dict(vocab_size=V, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, max_position_embeddings=40, rms_norm_eps=1e-5, final_logit_softcapping=3.0,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, attention_bias=True,
                                                 pad_token_id=2, bos_token_id=None, eos_token_id=None), **o})


FAMILIES = {
    "arcee": arcee,
    "gemma3_text": gemma3,
    "nemotron": nemotron,
    "persimmon": persimmon,
    "jais2": jais2,
    "nanochat": nanochat,
    "nanochat_uncapped_tied_mqa": lambda: nanochat(final_logit_softcapping=None, tie_word_embeddings=True, num_key_value_heads=1,
                                                   attention_bias=False, pad_token_id=None),
    "jais2_unbiased_tied_linear": lambda: jais2(attention_bias=False, mlp_bias=False, tie_word_embeddings=True, head_dim=None, num_key_value_heads=3,
                                                 pad_token_id=None, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    "persimmon_no_qk_norm_tied": lambda: persimmon(num_attention_heads=6, qk_layernorm=False, tie_word_embeddings=True, pad_token_id=None,
                                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    "nemotron_quarter_rotary_tied": lambda: nemotron(num_attention_heads=6, num_key_value_heads=1, head_dim=None, tie_word_embeddings=True, attention_bias=False,
                                                     mlp_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                                      "partial_rotary_factor": 0.25}),
    # Gemma 3 keeps attn_logit_softcapping but never applies it (eager or sdpa): an inert key; the final soft-cap is applied
    "gemma3_text_final_softcap": lambda: gemma3(attn_logit_softcapping=3.0, final_logit_softcapping=5.0, num_hidden_layers=2,
                                                layer_types=["full_attention", "sliding_attention"], attn_implementation="eager"),
    "gemma3_text_default_pattern_untied": lambda: gemma3(num_hidden_layers=6, layer_types=None, sliding_window=4, tie_word_embeddings=False,
                                                         num_key_value_heads=1, rope_parameters=None, pad_token_id=3),
    "arcee_yarn_tied": lambda: arcee(attention_bias=False, mlp_bias=False, tie_word_embeddings=True, num_key_value_heads=1,
                                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                                      "original_max_position_embeddings": 20}),
}


CONFIGS = FAMILIES  # tests/test_closed_world.py's property runs over them too


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_round_trip(tmp_path, family):
    round_trip(tmp_path, FAMILIES[family]())


def edited(text: str, old: str, new: str):
    """The imported spec with one quirk edited out, built."""
    assert old in text, old
    return build(cyclelang.parse(text.replace(old, new)), seed=0).eval()


def differs(ref, model) -> bool:
    idx = ids()
    with torch.no_grad():
        return rel(model(idx), ref(idx).logits) > 1e-3


QUIRKS = {  # case -> (family, the spec's words for its quirk, the words without it)
    "arcee relu2": ("arcee", "act=relu2", "act=relu"),
    "gemma3_text (1 + w) qk gains": ("gemma3_text", " qk_norm_offset=1", ""),
    "nemotron (1 + w) layernorms": ("nemotron", " offset=1", ""),
    "nemotron relu2": ("nemotron", "act=relu2", "act=relu"),
    "persimmon qk layernorms": ("persimmon", " qk_norm_type=layernorm qk_norm_bias", ""),
    "persimmon relu2": ("persimmon", "act=relu2", "act=relu"),
    "jais2 relu2": ("jais2", "act=relu2", "act=relu"),
    "nanochat relu2": ("nanochat", "act=relu2", "act=relu"),
    "nanochat norm after the embedding": ("nanochat", "  norm rmsnorm eps=1e-05 affine=false  # the final norm, applied to the embedding too\n", ""),
    "nanochat final soft-cap": ("nanochat", " softcap=3", ""),
    "nemotron partial rotary": ("nemotron", "rotary=0.5", "rotary"),
    "gemma3_text the sliding layers' own rotary base": ("gemma3_text", " rotary_base=500", ""),
    "gemma3_text final soft-cap": ("gemma3_text_final_softcap", " softcap=5", ""),
}


@pytest.mark.parametrize("case", sorted(QUIRKS))
def test_the_quirk_matters(case):
    """The imported spec loads and matches; with its quirk edited out the same weights compute something else."""
    family, old, new = QUIRKS[case]
    ref = hf(FAMILIES[family]())
    text = import_config(ref.config.to_dict())
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    assert not differs(ref, ours)
    wrong = edited(text, old, new)
    wrong.load_state_dict(ours.state_dict(), strict=False)  # Persimmon: the qk layernorms without their bias
    assert differs(ref, wrong)


def test_nanochat_rotary_turns_the_other_way(monkeypatch):
    """nanochat's rotate_half is (x2, -x1): its rotary turns by -θ. Loaded as Llama's (without the plan's negated
    second halves of q and k) the same weights compute something else."""
    from dataclasses import replace

    from cyclelang.interop import load

    ref = hf(nanochat())
    text = import_config(ref.config.to_dict())
    assert not differs(ref, load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref))
    monkeypatch.setitem(load.KEYS, "nanochat", replace(load.KEYS["nanochat"], turned=False))
    assert differs(ref, load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref))


UNEXPRESSIBLE = {  # a config.json option the language cannot say (over the family's tiny config), refused by the key's name
    "arcee gelu_fast": (arcee, dict(hidden_act="gelu_fast"), "hidden_act"),
    "arcee longrope": (arcee, dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 6,
                                                    "long_factor": [1.0] * 6, "original_max_position_embeddings": 20}),
                       "rope_parameters.rope_type"),
    "nemotron gelu_fast": (nemotron, dict(hidden_act="gelu_fast"), "hidden_act"),
    "nemotron odd rotary": (nemotron, dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.3125}),
                            "partial_rotary_factor"),
    "persimmon gelu_fast": (persimmon, dict(hidden_act="gelu_fast"), "hidden_act"),
    "persimmon kv heads": (persimmon, dict(num_key_value_heads=2), "num_key_value_heads"),
    "arcee partial rotary": (arcee, dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                             "rope_parameters.partial_rotary_factor"),  # Arcee's rope turns whole heads whatever it says
    "llama partial rotary": (lambda: transformers.LlamaConfig(vocab_size=V, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                                                              num_attention_heads=4),
                             dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                             "rope_parameters.partial_rotary_factor"),  # so does Llama's (imported as rotary=0.5 before: a wrong load)
    "jais2 gelu_fast": (jais2, dict(hidden_act="gelu_fast"), "hidden_act"),
    "jais2 partial rotary": (jais2, dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                             "rope_parameters.partial_rotary_factor"),
    "nanochat gelu_fast": (nanochat, dict(hidden_act="gelu_fast"), "hidden_act"),
    "nanochat partial rotary": (nanochat, dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                                "rope_parameters.partial_rotary_factor"),
    "nanochat zero soft-cap": (nanochat, dict(final_logit_softcapping=0.0), "final_logit_softcapping"),
    "gemma3_text bidirectional": (gemma3, dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    "gemma3_text flat rope": (gemma3, dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "rope_parameters"),
    "gemma3_text partial rotary": (gemma3, dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                                                       "partial_rotary_factor": 0.5},
                                                                 "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
                                   "rope_parameters.sliding_attention.partial_rotary_factor"),
    "gemma3_text dynamic": (gemma3, dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                          "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}),
                            "rope_parameters.full_attention.rope_type"),
    "gemma3_text longrope": (gemma3, dict(rope_parameters={"sliding_attention": {"rope_type": "longrope", "rope_theta": 10000.0},
                                                           "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
                             "rope_parameters.sliding_attention.rope_type"),
    "gemma3_text unknown rope key": (gemma3, dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "wobble": 1},
                                                                   "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
                                     "rope_parameters.sliding_attention.wobble"),
}


@pytest.mark.parametrize("case", sorted(UNEXPRESSIBLE))
def test_unexpressible_option_refused_by_name(case):
    make, over, field = UNEXPRESSIBLE[case]
    with pytest.raises(Unsupported) as info:
        import_config({**make().to_dict(), **over})
    assert info.value.field == field, str(info.value)


def test_gemma3_legacy_rope_keys_read_as_transformers_converts_them():
    """A Hub config's rope_theta (global), rope_local_base_freq (sliding), rope_scaling (global) and sliding_window_pattern."""
    legacy = {k: v for k, v in gemma3(layer_types=None, num_hidden_layers=6).to_dict().items() if k not in ("rope_parameters", "layer_types")}
    legacy.update(rope_theta=20000.0, rope_local_base_freq=700.0, rope_scaling={"rope_type": "linear", "factor": 4.0}, sliding_window_pattern=3)
    ref = transformers.Gemma3TextConfig(**{k: v for k, v in legacy.items() if k not in ("model_type", "transformers_version", "_sliding_window_pattern")})
    assert ref.layer_types == ["sliding_attention", "sliding_attention", "full_attention"] * 2
    assert import_config(legacy) == import_config(ref.to_dict())


def test_export_of_layers_with_different_rotary_bases_is_refused_unless_by_layer_type():
    """Gemma 3's sliding and global layers may turn by their own bases; sliding layers that differ among themselves cannot be exported."""
    from cyclelang.interop import export_config

    spec = cyclelang.parse(import_config(gemma3().to_dict()))
    assert export_config(spec)["rope_parameters"]["sliding_attention"]["rope_theta"] == 500.0
    with pytest.raises(Unsupported):
        export_config(_with_base(spec, "layers_3", 700.0))  # layer 3 slides, as layers 0 and 1, with another base


def _with_base(spec, stage_name: str, base: float):
    """The spec with one stage template's attention turning by another rotary base (an IR edit: no spec text says it)."""
    import cyclelang.ir as ir

    def edit(node):
        if isinstance(node, ir.Stage) and node.name == stage_name:
            return node.model_copy(update={"ops": [edit_ops(o) for o in node.ops]})
        if isinstance(node, ir.Stage):
            return node.model_copy(update={"ops": [edit(o) for o in node.ops]})
        return node

    def edit_ops(node):
        if isinstance(node, ir.Attention):
            return node.model_copy(update={"rotary_base": base})
        if hasattr(node, "ops"):
            return node.model_copy(update={"ops": [edit_ops(o) for o in node.ops]})
        return node

    engine = spec.engine.model_copy(update={"body": [edit(o) for o in spec.engine.body]})
    return spec.model_copy(update={"engine": engine})
