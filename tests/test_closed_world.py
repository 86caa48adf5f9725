"""The closed-world config reader (interop/closed.py): no checkpoint loads into another function.

Every case goes through what users load: a transformers model with its weights spread away
from init, `save_pretrained` to a folder (its JSON quirks included), `cyclec import` of that
folder, build, load; the reference is `from_pretrained` of the same folder.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import random

import pytest
from click.testing import CliRunner

import cyclelang

from .conftest import ROOT, need

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.cli import main  # noqa: E402
from cyclelang.interop import Unsupported, load_transformers  # noqa: E402
from cyclelang.interop.closed import CLASSES, FIXED, INERT  # noqa: E402
from cyclelang.interop import families  # noqa: E402
from cyclelang.interop.families import FAMILIES, KEYS, read_config  # noqa: E402

from .test_families import FAMILIES as CONFIGS  # noqa: E402
# each group's configs (tests/test_families_<group>.py: CONFIGS, or FAMILIES) join test_families.py's for the property below
_GROUPS = [importlib.import_module(f"{__package__}.{path.stem}") for path in sorted(ROOT.glob("tests/test_families_*.py"))]
CONFIGS = {**CONFIGS, **{k: v for m in _GROUPS for k, v in (getattr(m, "CONFIGS", None) or getattr(m, "FAMILIES", {})).items()}}
SAME_AS = set(families.SAME_AS)  # read by another family's class (gpt-sw3: GPT2Config), so saved as that family: tested in test_families_gpt

V, B, T = 96, 2, 12


def spread(model, seed=1, scale=0.05):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def reference(folder):
    """What a user gets from the folder: AutoModelForCausalLM, in float32, eager attention (soft-caps are eager's alone); the
    class the folder names where transformers maps no causal LM to its config (Emu3's text decoder: Emu3ForCausalLM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = transformers.AutoConfig.from_pretrained(folder)
    cls = transformers.AutoModelForCausalLM if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else getattr(transformers, config.architectures[0])
    return cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def cli_import(folder, out):
    return CliRunner().invoke(main, ["import", str(folder), "-o", str(out)])


def imported(folder, tmp_path):
    out = tmp_path / "imported.cycle"
    res = cli_import(folder, out)
    assert res.exit_code == 0, res.output
    spec = cyclelang.load(out)
    return load_transformers(build(spec, seed=0).eval(), folder), out.read_text()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def ids(seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def same_function(ours, ref):
    """Logits within 1e-5 (relative) and greedy decoding with our cache equal to transformers' step by step."""
    idx = ids()
    with torch.no_grad():
        want, got = ref(idx, use_cache=False).logits, ours(idx)
    assert rel(got, want) < 1e-5
    seq = idx[:1, :4]
    for _ in range(8):
        with torch.no_grad():
            seq = torch.cat((seq, ref(seq, use_cache=False).logits[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(ours.generate(idx[:1, :4], 8, temperature=0), seq)
    return want


# --- the table of transformers' classes is transformers' own ----------------------------------------


def _fields_script():
    spec = importlib.util.spec_from_file_location("hf_fields_script", ROOT / "scripts" / "hf_fields.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fields_table_is_the_installed_transformers():
    mod = _fields_script()
    assert mod.OUT.read_text() == mod.render(*mod.table()), "hf_fields.py is stale: run python scripts/hf_fields.py and read the diff"


def test_the_classes_named_are_transformers_classes_for_those_model_types():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    assert {f: CONFIG_MAPPING[f].__name__ for f in CLASSES} == CLASSES
    assert set(KEYS) <= set(CLASSES)


@pytest.mark.parametrize("family", sorted(KEYS))
def test_every_field_of_a_claimed_class_is_mapped_or_declared_inert(family):
    """A transformers release that adds a key to a claimed class fails here, naming it."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    keys = KEYS[family]
    known = keys.maps | set(keys.inert) | set(INERT) | set(FIXED)
    missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in known)
    assert not missing, f"{family}: transformers' {cls.__name__} has keys the reader neither maps nor declares inert: {missing}"


# --- the three wrong loads of the issue ----------------------------------------------------------------


@pytest.mark.parametrize("types", [["full_attention"] * 3, ["sliding_attention", "full_attention", "full_attention"]])
def test_mistral_with_layer_types_loads_as_transformers_reads_it(tmp_path, types):
    """transformers reads model_type mistral with layer_types as Ministral: the window on the sliding layers only."""
    config = transformers.MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=40, sliding_window=3, layer_types=types)
    spread(transformers.MistralForCausalLM(config)).save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["model_type"] == "mistral" and saved["layer_types"] == types
    ref = reference(tmp_path / "ckpt")
    assert type(ref).__name__ == "MinistralForCausalLM"
    ours, text = imported(tmp_path / "ckpt", tmp_path)
    assert text.count("window=3") == types.count("sliding_attention")  # a window of 3 under T = 12 changes the logits
    same_function(ours, ref)


def test_gemma2_null_soft_caps_are_none_and_a_null_window_is_refused(tmp_path):
    """null is not "absent": no soft-cap (not 50 and 30); a null window is not 4096 either, but a model transformers cannot run."""
    config = transformers.Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=16, max_position_embeddings=40, query_pre_attn_scalar=1,
                                       attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=3, pad_token_id=0,
                                       eos_token_id=1, bos_token_id=2)
    model = spread(transformers.Gemma2ForCausalLM(config), scale=1.0)
    model.save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["attn_logit_softcapping"] is None and saved["final_logit_softcapping"] is None
    ours, text = imported(tmp_path / "ckpt", tmp_path)
    assert "softcap=" not in text and "window=3" in text
    logits = same_function(ours, reference(tmp_path / "ckpt"))
    assert (30 * torch.tanh(logits / 30) - logits).abs().max() > 1  # the final cap of 30 the reader used to assume bites here
    # and the caps the class gives when the keys are absent are read as such
    del saved["attn_logit_softcapping"], saved["final_logit_softcapping"]
    arch = read_config(saved)
    assert (arch.softcap, arch.logit_softcap) == (50.0, 30.0)
    # a null window: Gemma2Model builds a sliding mask for every model and cannot without one
    with pytest.raises(Unsupported) as e:
        read_config({**saved, "sliding_window": None, "layer_types": ["full_attention"] * 2})
    assert e.value.field == "sliding_window"
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**saved, "sliding_window": None}))
    with pytest.raises(ValueError, match="sliding_window"):
        reference(tmp_path / "ckpt")(ids(), use_cache=False)


def test_a_saved_mamba2_folder_imports_and_loads(tmp_path):
    """Mamba-2's default time_step_limit ends at infinity: transformers writes {"__float__": "Infinity"}."""
    config = transformers.Mamba2Config(vocab_size=V, hidden_size=24, num_heads=4, head_dim=12, state_size=6, n_groups=2, expand=2,
                                       conv_kernel=3, chunk_size=5, num_hidden_layers=2, pad_token_id=None, bos_token_id=None,
                                       eos_token_id=None)
    spread(transformers.Mamba2ForCausalLM(config)).save_pretrained(tmp_path / "ckpt")
    assert '"__float__": "Infinity"' in (tmp_path / "ckpt" / "config.json").read_text()
    ours, text = imported(tmp_path / "ckpt", tmp_path)
    assert "dt_hi" not in text  # no upper limit
    same_function(ours, reference(tmp_path / "ckpt"))


# --- null and absence, and values of the wrong kind ------------------------------------------------------


def _mistral(**over):
    cfg = {"model_type": "mistral", "vocab_size": V, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 16, "max_position_embeddings": 40}
    return {**cfg, **over}


def test_null_and_absent_are_told_apart():
    assert read_config(_mistral(sliding_window=None)).window is None  # null: no window
    assert read_config(_mistral()).window == 4096  # absent: MistralConfig's default
    assert read_config(_mistral()).kv_heads == 8
    with pytest.raises(Unsupported, match="null is not a value of this key"):  # its annotation has no None: transformers refuses it too
        read_config(_mistral(num_key_value_heads=None))
    llama = {**_mistral(), "model_type": "llama"}
    assert read_config({**llama, "num_key_value_heads": None}).kv_heads == 16  # LlamaConfig: null is every query head


def test_what_a_class_does_to_a_value_before_its_model_sees_it():
    gemma = {"model_type": "gemma", "vocab_size": V, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "hidden_act": "gelu"}
    assert read_config(gemma).act == "geglu_tanh"  # GemmaConfig.__post_init__: Gemma's "gelu" is the tanh GELU
    assert read_config({**gemma, "model_type": "gemma2", "hidden_activation": "gelu", "sliding_window": 8}).act == "geglu"  # Gemma 2's is not
    assert read_config(_mistral(pad_token_id=-1)).padding == V - 1  # nn.Embedding counts a negative padding_idx from the end
    neox = {"model_type": "gpt_neox", "vocab_size": V, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 40}
    assert read_config(neox).rotary == 0.25  # GPTNeoXConfig's rotary_pct default
    assert read_config({**neox, "rotary_pct": 0.5, "rotary_emb_base": 500.0}).rotary_base == 500.0  # its legacy names
    assert read_config({**neox, "rotary_pct": 0.5}).rotary == 0.5
    bloom = {"model_type": "bloom", "vocab_size": V, "n_embed": 48, "n_layer": 1, "n_head": 4}
    assert read_config(bloom).width == 48  # BloomConfig's n_embed
    # remote code runs only with trust_remote_code=True: without it AutoConfig reads this model_type's own class
    remote = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    assert read_config(_mistral(auto_map=remote)) == read_config(_mistral())


@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", "2", "is not a whole number"),
    ("rms_norm_eps", None, "null is not a value of this key"),
    ("hidden_size", 0, "a size is a whole number from 1"),
    ("num_attention_heads", True, "is not a whole number"),
    ("pad_token_id", "0 scale=100", "is not null or a whole number"),
    ("rms_norm_eps", {"__float__": "NaN"}, "is not a finite number"),
    ("is_encoder_decoder", True, "not a causal LM"),
    ("per_layer_config", {"0": {"hidden_act": "gelu"}}, "per-layer overrides"),
    ("quantization_config", {"quant_method": "bitsandbytes"}, "not a key of transformers' MistralConfig"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1e4, "wobble": 2}, "not a rope parameter"),
])
def test_a_value_of_the_wrong_kind_is_refused_by_name(key, value, words):
    with pytest.raises(Unsupported) as e:
        read_config(_mistral(**{key: value}))
    assert e.value.field.startswith(key) and words in str(e.value)


# --- the property: an inert key changes nothing, an unknown key is refused ------------------------------


@functools.cache
def per_family() -> dict:
    """One test config's name per family (made when a test asks: each config is built to read its
    model_type, which collection need not pay for)."""
    out = {}
    for name in sorted(CONFIGS):
        family = CONFIGS[name]().get_text_config().model_type  # a multimodal config's causal LM is its text model (Emu3's)
        out.setdefault(family, name)
    return out


FAST = {"llama", "gemma2", "qwen2_moe", "falcon", "mamba", "deepseek_v2"}
# inert keys whose every value transformers' own loading refuses or reroutes on a machine without CUDA kernels
# (and what forward returns: the test reads transformers' logits from its usual output)
_NOT_DRAWN = {"use_mamba_kernels", "dtype", "torch_dtype", "attn_implementation", "experts_implementation", "problem_type", "architectures",
              "return_dict", "output_hidden_states", "output_attentions"}


def _draw(rng: random.Random, types: tuple):
    if "bool" in types:
        return rng.random() < 0.5
    if "float" in types:
        return round(rng.uniform(0.0, 0.5), 4)
    if "int" in types:
        return rng.randrange(1, V)
    return None


def test_the_property_covers_every_claimed_family():
    assert set(per_family()) == set(FAMILIES) - SAME_AS


@pytest.mark.parametrize("family", [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in sorted(FAMILIES) if f not in SAME_AS])
def test_an_inert_key_loads_exactly_and_an_unknown_key_is_refused(tmp_path, family):
    rng = random.Random(f"closed-{family}")
    config = CONFIGS[per_family()[family]]()
    spread(transformers.AutoModelForCausalLM.from_config(config)).save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "config.json"
    saved = json.loads(path.read_text())
    fields = {f.name: f for f in dataclasses.fields(type(config.get_text_config()))}
    from cyclelang.interop.closed import fields_of

    table = fields_of(family)
    pool = sorted(k for k in set(KEYS[family].inert) | set(INERT) if k in fields and k not in _NOT_DRAWN and _draw(rng, table[k][1]) is not None)
    key = rng.choice(pool)
    value = _draw(rng, table[key][1])
    path.write_text(json.dumps({**saved, key: value}, indent=2))
    ours, _ = imported(tmp_path / "ckpt", tmp_path)
    same_function(ours, reference(tmp_path / "ckpt"))

    unknown = f"x_{rng.randrange(16 ** 6):06x}"
    path.write_text(json.dumps({**saved, unknown: rng.choice([0, 1.5, True, "on", [1, 2]])}, indent=2))
    res = cli_import(tmp_path / "ckpt", tmp_path / "never.cycle")
    assert res.exit_code == 1 and "E0401" in res.output and unknown in res.output, res.output
    line = next(n for n, ln in enumerate(path.read_text().splitlines(), 1) if f'"{unknown}"' in ln)
    assert f"config.json:{line}:" in res.output  # the diagnostic points at the key in the file
    assert not (tmp_path / "never.cycle").exists()


# --- refusals a user can act on --------------------------------------------------------------------------


def test_an_unclaimed_family_names_the_nearest_claimed_one_and_what_is_lacking():
    from cyclelang.interop.unclaimed import UNCLAIMED

    assert not set(UNCLAIMED) & set(FAMILIES)
    lacking = next(mt for mt, (_, lacks) in sorted(UNCLAIMED.items()) if lacks)
    near, lacks = UNCLAIMED[lacking]
    with pytest.raises(Unsupported) as e:
        read_config({"model_type": lacking})
    assert near in str(e.value) and lacks in str(e.value)
    only = next((mt for mt, (_, lacks) in sorted(UNCLAIMED.items()) if lacks is None), None)
    if only is not None:
        with pytest.raises(Unsupported, match="only an importer is missing"):
            read_config({"model_type": only})


def test_every_causal_lm_of_transformers_is_claimed_unclaimed_or_left_out():
    """A transformers release's new family shows up here by name: it is neither read, nor refused with what the
    language lacks (interop/unclaimed.py), nor left out as no decoder-only text model."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from cyclelang.interop.unclaimed import LEFT_OUT, UNCLAIMED

    tables = set(FAMILIES) | set(UNCLAIMED) | LEFT_OUT
    assert not set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - tables, sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - tables)
    assert not (set(UNCLAIMED) | LEFT_OUT) - set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)  # no entry for a family transformers lacks
    assert not LEFT_OUT & set(UNCLAIMED) and not LEFT_OUT & set(FAMILIES)
    with pytest.raises(Unsupported, match="not a decoder-only text model"):
        read_config({"model_type": "bert"})


def test_cli_lists_the_supported_families_once(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "made_up_lm"}))
    res = CliRunner().invoke(main, ["import", str(tmp_path)])
    assert res.exit_code == 1 and "E0402" in res.output
    assert res.output.count("deepseek_v2") == 1


@pytest.mark.parametrize("code", ["E0401", "E0402"])
def test_explain_says_what_the_language_can_say_today(code):
    res = CliRunner().invoke(main, ["explain", code])
    assert res.exit_code == 0
    text = res.output
    if code == "E0402":
        assert all(f in text for f in FAMILIES)
        from cyclelang.interop.unclaimed import UNCLAIMED

        assert all(mt in text for mt, (_, lacks) in UNCLAIMED.items() if lacks is None)
    else:
        from cyclelang.interop.families import _SCALINGS

        assert all(s in text for s in _SCALINGS)  # the rotary scalings the language has are named as read, not refused
        assert "YaRN rotary scaling" not in text and "per-layer pattern of sliding windows" not in text


@pytest.mark.parametrize("config", [{"model_type": "mamba", "max_position_embeddings": "2048 scale=3"},
                                    {"model_type": "mamba2", "max_position_embeddings": "2048 scale=3"},
                                    {"model_type": "bloom", "seq_length": "2048 scale=3"}])
def test_a_key_outside_the_class_is_type_checked_too(config):
    """Keys a family maps that its class does not declare (a context length) are sizes: never text for the spec."""
    with pytest.raises(Unsupported, match="a size is a whole number"):
        read_config(config)


def test_a_config_nested_past_reading_is_a_diagnostic(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "rope_parameters": ' + "[" * 100000 + "]" * 100000 + "}")
    res = CliRunner().invoke(main, ["import", str(tmp_path)])
    assert res.exit_code == 1 and "E0403" in res.output and "nests deeper" in res.output
    deep: dict = {}
    cur = deep
    for _ in range(5000):
        cur["a"] = cur = {}
    with pytest.raises(Unsupported, match="nests deeper"):
        read_config({"model_type": "llama", "rope_parameters": deep})
