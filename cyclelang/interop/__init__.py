"""transformers interop, both directions, checked by construction.

    text = cyclelang.interop.import_config("ckpt/")          # the spec a checkpoint implies
    model = cyclelang.build(cyclelang.parse(text))
    cyclelang.interop.load_transformers(model, "ckpt/")       # refused unless the IRs agree
    cyclelang.interop.export(spec, model.state_dict(), "out/")  # config.json + model.safetensors

Families (`families.FAMILIES`, docs/families.md): gpt2, llama (and internlm3, iquestcoder, seed_oss), mistral,
ministral, ministral3, mixtral, qwen2, qwen2_moe, qwen3, phi3, olmo, olmo2, gemma, gemma2, granite, phi, starcoder2,
gpt_neox, gptj, falcon, bloom; mamba2, mamba, jamba and deepseek_v2 (the expander families: an ssm, Mamba-1's
mixer, latent attention). Every config.json is read closed-world (`closed`): a key the family's reader does not
map, and that is not known to change nothing, is refused by name. Other model types are refused with the
nearest claimed family and what the language lacks (`unclaimed`). The modules: `closed` (config.json as
transformers reads it, against `hf_fields`, the classes' fields), `families` (config <-> the spec it implies),
`compare` (two engines field by field), `load` (reading safetensors, mapping weights by the IR's layout).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from .. import ir
from .compare import Difference, difference
from .families import FAMILIES, Unsupported, arch_of, config_of, expander_config, read_config, spec_text
from .load import _embed_and_head
from .load import InteropError, check_config, convert_state_dict, export_state_dict, implied_engine, load_transformers, read_safetensors

__all__ = ["InteropError", "Unsupported", "Difference", "FAMILIES", "load_transformers", "convert_state_dict",
           "read_safetensors", "import_config", "read_config_file", "export", "export_config", "check_config", "implied_engine",
           "difference"]


def read_config_file(source) -> tuple[dict, str]:
    """(config dict, display name) from a checkpoint folder, a config.json, a dict or a transformers config."""
    if isinstance(source, Mapping):
        return dict(source), "config.json"
    if hasattr(source, "to_dict"):
        return source.to_dict(), "config.json"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InteropError(str(path), "no config.json here (a transformers checkpoint folder holds one)")
    try:
        config = json.loads(path.read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InteropError(str(path), f"not a JSON config: {e}") from None
    except RecursionError:
        raise InteropError(str(path), "not a config: its JSON nests deeper than Python can read") from None
    if not isinstance(config, dict):
        raise InteropError(str(path), "a config.json holds one JSON object")
    return config, str(path)


def import_config(source) -> str:
    """The spec a transformers checkpoint implies, as formatted, commented .cycle text.

    source: a checkpoint folder, its config.json, a config dict or a transformers config.
    Raises Unsupported naming the first config field the language cannot express."""
    from ..syntax.fmt import format_text

    config, name = read_config_file(source)
    return format_text(spec_text(read_config(config), Path(name).name))


def export_config(spec) -> dict:
    """The transformers config.json of a spec shaped like a supported family.

    Refused (Unsupported) unless importing that config gives back the spec's function:
    the first field that differs is named."""
    engine = spec.engine if isinstance(spec, ir.Spec) else spec
    config = expander_config(engine)
    if config is not None:  # an ssm or latent attention: mamba2, mamba, jamba or deepseek_v2
        try:
            d = difference(engine, implied_engine(config))
        except InteropError as e:
            raise Unsupported(e.key, f"{config['model_type']} cannot say what the spec does: {str(e).split(': ', 1)[1]}") from None
        if d is not None:
            raise Unsupported(d.field, f"{config['model_type']} cannot say what the spec does at {d.where}: {d.text()}")
        return config
    arch = arch_of(engine)
    if engine.name in FAMILIES and engine.name != arch.family and arch.family != "gpt2":
        # an engine named after a family (as `cyclec import` names it) exports as that family when it computes the spec
        try:
            config = config_of(replace(arch, family=engine.name))
            if difference(engine, implied_engine(config)) is None:
                return config
        except (Unsupported, InteropError):
            pass
    config = config_of(arch)
    try:
        d = difference(engine, implied_engine(config))
    except InteropError as e:  # the config written does not read back: no family computes the spec
        raise Unsupported(e.key, f"{arch.family} cannot say what the spec does: {str(e).split(': ', 1)[1]}") from None
    if d is not None:
        raise Unsupported(d.field, f"{arch.family} cannot say what the spec does at {d.where}: {d.text()}")
    return config


def head_key(family: str) -> str:
    return _embed_and_head(family)[1]


def _fits(weights: dict, spec) -> None:
    """InteropError naming the first key or shape of `weights` the spec's module does not have."""
    import torch

    from ..backends.torch.build import build

    with torch.device("meta"):
        target = build(spec if isinstance(spec, ir.Spec) else ir.Spec(engine=spec)).state_dict()
    for key, want in target.items():
        if key not in weights:
            raise InteropError(key, "the spec's module has it; the weights lack it")
        if tuple(weights[key].shape) != tuple(want.shape):
            raise InteropError(key, f"shape {tuple(want.shape)} in the spec's module, {tuple(weights[key].shape)} in the weights")
    for key in weights:
        if key not in target:
            raise InteropError(key, "in the weights, but the spec's module has no such part")


def export(spec, weights, out_dir) -> dict:
    """Write out_dir/config.json and out_dir/model.safetensors, which
    `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` loads into the spec's function.

    weights: the compiled module's state dict, or a .safetensors file of it (`cyclec build
    --weights`). Returns the config written."""
    from safetensors.torch import save

    from ..io import atomic_write

    engine = spec.engine if isinstance(spec, ir.Spec) else spec
    config = export_config(engine)
    if isinstance(weights, (str, Path)):
        weights, _ = read_safetensors(weights)
    _fits(dict(weights), spec)
    state = export_state_dict(dict(weights), spec, config["model_type"])
    if config.get("tie_word_embeddings"):
        state.pop(head_key(config["model_type"]))  # save_pretrained leaves a tied head out of the file
    payload = save({k: v.contiguous() for k, v in sorted(state.items())}, metadata={"format": "pt"})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    atomic_write(out / "model.safetensors", payload)
    return config
