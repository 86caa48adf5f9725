"""transformers model families: a checkpoint's config as the spec it implies, and back.

Each family reads its `config.json` by its `model_type` (never by guessing from the
weights' key names) into an `Arch`, the few numbers a decoder of that family is made
of, and `spec_text(arch)` writes the spec those numbers imply. The IR a checkpoint
implies is therefore `parse(spec_text(read_config(config)))`: one home for the
mapping, used by `cyclec import`, by the check before weights load, and by
`cyclec export` (which writes a config and checks that importing it gives back the
spec it came from).

A config field the language cannot express is refused by name (`Unsupported`),
never approximated: a llama3 rotary scaling, GPT-2's layer-index attention scaling,
a per-layer pattern of sliding windows.

The package holds one module per group of families, each with its readers (and their Keys), its
spec writer, its export and (for the families without Llama's layer) its weight plan: core.py what
they share (the Arch record, the activation tables, the rotary and key readers, the Keys and class
tables they fill, the spec-line helpers); plain.py GPT-2, BLOOM and the LayerNorm decoders;
llama.py the Llama-shaped decoders (Gemma 3, Nemotron, HunYuan, ...) and their config; routed.py
their routed-expert kin; dense.py the dense decoders of 2025-26; ssm.py the Mamba families and
Jamba; latent.py DeepSeek's latent attention, MiniCPM3 and Youtu; bamba.py Bamba and
GraniteMoeHybrid; parallel.py, routed_v3.py, conv.py, hybrid.py, sinks.py, gemma4.py and delta.py
the families named in their docstrings; text.py (`spec_text`) and export.py (`arch_of`,
`config_of`, `expander_config`) choose a family's writer. This module is the registry: every
family's reader (READERS, in the order `FAMILIES` lists them), transformers class (CAUSAL_LM), and
`read_config`. The GPT-2 lineage's families are in ../lineage.py; the weights' plans of the
Llama-shaped ones in ../plans.py.
"""

from __future__ import annotations

from .. import lineage
from ..closed import CLASSES, INERT, Config, Unsupported, remap
from ..hf_fields import TRANSFORMERS_VERSION
from . import afmoe as _afmoe
from . import conv as _conv
from . import delta as _delta
from . import gemma4 as _gemma4
from . import hybrid as _hybrid
from . import laguna as _laguna
from . import parallel as _parallel
from . import routed_v3 as _routed_v3
from . import sinks as _sinks
from .bamba import _bamba, _granitemoehybrid
from .core import CAUSAL_LM, KEYS, _GATED_ACTS, _PLAIN_ACTS, _SCALINGS, Arch
from .dense import CAUSAL_LM_H2, _DENSE_H2, _dense_h2
from .export import arch_of, config_of, expander_config
from .latent import _axk1, _deepseek_v2, _deepseek_v3, _glm4_moe_lite, _latent_dense, _sarvam_mla
from .llama import _DECODERS, _DECODERS_UNGATED, _HUNYUAN, _decoder, _gemma3, _hunyuan, _jais2, _nanochat, _nemotron
from .plain import _PLAIN, _bloom, _gpt2, _persimmon, _phi, _plain
from .routed import _ROUTED, _routed
from .ssm import _falcon_mamba, _jamba, _mamba, _mamba2
from .text import spec_text

__all__ = ["FAMILIES", "KEYS", "READERS", "CAUSAL_LM", "SAME_AS", "Arch", "Unsupported", "read_config", "refusal", "explain_tables",
           "spec_text", "arch_of", "config_of", "expander_config"]

# The GPT-2 lineage (lineage.py): gpt_bigcode, gpt_neo, opt, biogpt, openai-gpt; gpt-sw3 is GPT2Config under another name
KEYS.update(lineage.KEYS)
KEYS["gpt-sw3"] = KEYS["gpt2"]
SAME_AS = {"gpt-sw3": "gpt2"}  # a model_type transformers reads with another's classes: its weights load by that family's plan
READERS = {"gpt2": _gpt2, **{f: _decoder(f) for f in _DECODERS}, **{f: _plain(f) for f in _PLAIN}, "mamba2": _mamba2,
           "mamba": _mamba, "jamba": _jamba, "deepseek_v2": _deepseek_v2, "bloom": _bloom}
READERS.update({f: _dense_h2(f) for f in _DENSE_H2})
READERS.update({f: _routed(f) for f in _ROUTED})
# Cohere, Cohere 2, GLM, GLM-4, StableLM, CodeGen, MPT (parallel.py)
KEYS.update(_parallel.KEYS)
READERS.update(_parallel.READERS)
# GLM-4.5, dots.llm1, ERNIE 4.5 MoE, ...: DeepSeek-V3's router (routed_v3.py)
KEYS.update(_routed_v3.KEYS)
READERS.update(_routed_v3.READERS)
# LFM2, LFM2-MoE: the short gated convolution (conv.py)
KEYS.update(_conv.KEYS)
READERS.update(_conv.READERS)
# Falcon-H1: Mamba-2 beside attention in one block (hybrid.py)
KEYS.update(_hybrid.KEYS)
READERS.update(_hybrid.READERS)
READERS.update({**lineage.READERS, "gpt-sw3": _gpt2})
READERS.update({"minicpm3": _latent_dense("minicpm3"), "youtu": _latent_dense("youtu"), "falcon_mamba": _falcon_mamba, "bamba": _bamba,
                "granitemoehybrid": _granitemoehybrid})
READERS.update({f: _decoder(f) for f in _DECODERS_UNGATED})
READERS["gemma3_text"] = _gemma3
READERS["nemotron"] = _nemotron
READERS["persimmon"] = _persimmon
READERS["phi"] = _phi
READERS["jais2"] = _jais2
READERS["nanochat"] = _nanochat
READERS["deepseek_v3"] = _deepseek_v3
READERS["sarvam_mla"] = _sarvam_mla
READERS["glm4_moe_lite"] = _glm4_moe_lite
READERS["axk1"] = _axk1
# gpt-oss, ...: attention sinks (sinks.py)
KEYS.update(_sinks.KEYS)
READERS.update(_sinks.READERS)
# Gemma 4's text decoder: per-layer inputs, K = V, values normed (gemma4.py)
KEYS.update(_gemma4.KEYS)
READERS[_gemma4.FAMILY] = _gemma4.read
READERS[_gemma4.UNIFIED] = _gemma4.read
# Arcee's AFMoE: output-gated attention, sandwich norms, DeepSeek-V3's router (afmoe.py)
KEYS.update(_afmoe.KEYS)
READERS[_afmoe.FAMILY] = _afmoe.read
# Laguna: a softplus output gate, heads per layer, DeepSeek-V3's router (laguna.py)
KEYS.update(_laguna.KEYS)
READERS[_laguna.FAMILY] = _laguna.read
READERS.update({f: _hunyuan(f) for f in _HUNYUAN})
# Qwen3-Next, Qwen3.5: gated DeltaNet hybrids (delta.py)
KEYS.update(_delta.KEYS)
READERS.update(_delta.READERS)
FAMILIES = tuple(READERS)
assert set(READERS) == set(KEYS) <= set(CLASSES), "every claimed family has a reader, its Keys and its transformers class"

# The transformers classes a family's weights come from (what export's config names), core.py's table and the rest.
CAUSAL_LM.update({"hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM", "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM"})
CAUSAL_LM.update(CAUSAL_LM_H2)
CAUSAL_LM.update(_parallel.CAUSAL_LM)
CAUSAL_LM.update(_routed_v3.CAUSAL_LM)
CAUSAL_LM.update(_sinks.CAUSAL_LM)
CAUSAL_LM.update(_delta.CAUSAL_LM)
CAUSAL_LM.update(_conv.CAUSAL_LM)
CAUSAL_LM.update(_hybrid.CAUSAL_LM)
CAUSAL_LM.update(lineage.CAUSAL_LM)
CAUSAL_LM["gpt-sw3"] = "GPT2LMHeadModel"
CAUSAL_LM.update({"minicpm3": "MiniCPM3ForCausalLM", "youtu": "YoutuForCausalLM", "falcon_mamba": "FalconMambaForCausalLM",
                  "bamba": "BambaForCausalLM", "granitemoehybrid": "GraniteMoeHybridForCausalLM"})
CAUSAL_LM.update({
    "arcee": "ArceeForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "persimmon": "PersimmonForCausalLM",
    "jais2": "Jais2ForCausalLM",
    "nanochat": "NanoChatForCausalLM",
})
CAUSAL_LM["deepseek_v3"] = "DeepseekV3ForCausalLM"
CAUSAL_LM["sarvam_mla"] = "DeepseekV3ForCausalLM"  # transformers builds sarvam_mla as DeepSeek-V3
CAUSAL_LM["glm4_moe_lite"] = "Glm4MoeLiteForCausalLM"
CAUSAL_LM["axk1"] = "AXK1ForCausalLM"
CAUSAL_LM.update(_gemma4.CAUSAL_LM)
CAUSAL_LM.update(_afmoe.CAUSAL_LM)
CAUSAL_LM.update(_laguna.CAUSAL_LM)


def refusal(model_type: str) -> str:
    """Why an unclaimed model_type does not import: the nearest claimed family and what the language lacks."""
    from ..unclaimed import LEFT_OUT, UNCLAIMED

    if model_type in LEFT_OUT:
        return (f"{model_type!r} is not a decoder-only text model (an encoder, an encoder-decoder, or a speech, music or "
                "image-to-text generator): the importer reads causal decoders")
    near = UNCLAIMED.get(model_type)
    if near is None:
        return (f"unknown model type {model_type!r}: not a decoder-only family of transformers {TRANSFORMERS_VERSION} that the importer "
                "knows, so it cannot tell what the checkpoint computes")
    family, lacks = near
    if lacks is None:
        return (f"{model_type!r} is not imported yet, though the language can say the whole model (nearest claimed family: {family}): "
                "only an importer is missing")
    return f"{model_type!r} is not imported: the language lacks {lacks} (nearest claimed family: {family})"


def read_config(config: dict) -> Arch:
    """The Arch a config implies, by its model_type, read closed-world (closed.py); Unsupported names the first
    key that cannot be read, or that the importer cannot tell changes nothing."""
    mt = config.get("model_type")
    if mt is None:
        raise Unsupported("model_type", "the config does not say its model_type, and interop never guesses it from key names")
    if not isinstance(mt, str):
        raise Unsupported("model_type", f"{mt!r} is not a family's name")
    family = remap(config)
    if family not in READERS:
        raise Unsupported("model_type", refusal(mt))
    try:
        return READERS[family](Config(config, family, KEYS[family]))
    except RecursionError:
        raise Unsupported("config.json", "nests deeper than any config transformers writes") from None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
        if isinstance(e, Unsupported):
            raise
        raise Unsupported("config.json", f"a value the {family} reader cannot use ({type(e).__name__}: {e})") from None


def explain_tables(code: str) -> str:
    """The part of `cyclec explain E0401/E0402` that the importer's tables write."""
    import textwrap

    def para(title: str, items) -> str:
        return "\n" + textwrap.fill(f"{title}: {', '.join(items)}.", 84, break_on_hyphens=False, break_long_words=False) + "\n"

    if code == "E0401":
        gated = sorted({k for k, v in _GATED_ACTS.items() if v})
        plain = sorted({k for k, v in _PLAIN_ACTS.items() if v})
        return (para("Rotary scalings read (rope_type)", ("default", *_SCALINGS)) + para("Activations read for a gated MLP", gated)
                + para("Activations read for a plain MLP", plain)
                + para("Keys every family reads as changing nothing", sorted(k for k, why in INERT.items() if "generation setting" not in why)))
    from ..unclaimed import UNCLAIMED

    only = sorted(mt for mt, (_, lacks) in UNCLAIMED.items() if lacks is None)
    return (para(f"Claimed families ({len(FAMILIES)}, transformers {TRANSFORMERS_VERSION})", FAMILIES)
            + para(f"Not claimed, though the language says them whole ({len(only)}; only an importer is missing)", only)
            + f"\n{len(UNCLAIMED) - len(only)} other decoder families are refused with what the language lacks for each.\n")
