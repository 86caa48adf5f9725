"""transformers interop, both directions, checked by construction.

    text = cyclelang.interop.import_config("ckpt/")          # the spec a checkpoint implies
    model = cyclelang.build(cyclelang.parse(text))
    cyclelang.interop.load_transformers(model, "ckpt/")       # refused unless the IRs agree
    cyclelang.interop.export(spec, model.state_dict(), "out/")  # config.json + model.safetensors

Families (`families.FAMILIES`, listed with what maps to what in docs/families.md): the Llama-shaped decoders
(`families`, a package of one module per group: `families.parallel` for the parallel blocks of Cohere, GLM,
StableLM, CodeGen and MPT, ...), their
routed-expert kin, the GPT-2 lineage (`lineage`) and the expander families (an ssm, Mamba-1's mixer, latent
attention, DeepSeek-V3's router). Every config.json is read closed-world (`closed`): a key the family's reader does not
map, and that is not known to change nothing, is refused by name. Other model types are refused with the
nearest claimed family and what the language lacks (`unclaimed`). The modules: `closed` (config.json as
transformers reads it, against `hf_fields`, the classes' fields), `families` (config <-> the spec it implies),
`compare` (two engines field by field), `load` (reading safetensors, converting), `plans` and `mapping` (the weights
mapped by the IR's layout).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from .. import ir
from . import lineage
from .compare import Difference, difference
from .families import FAMILIES, Unsupported, arch_of, config_of, expander_config, spec_text
from .load import _embed_and_head
from .load import MAX_INDEX_BYTES, InteropError, check_config, convert_state_dict, export_state_dict, implied_engine, load_transformers
from .load import read_json, read_safetensors
from .sizes import MAX_CONFIG_BYTES, _key_of, check_sizes, read_arch

__all__ = ["InteropError", "Unsupported", "Difference", "FAMILIES", "load_transformers", "convert_state_dict",
           "read_safetensors", "import_config", "read_config_file", "export", "export_config", "check_config", "implied_engine",
           "difference", "OutputRefused", "export_plan", "check_sizes", "MAX_CONFIG_BYTES"]




def read_config_text(source) -> tuple[dict, str, str | None]:
    """(config dict, display name, the file's text or None) from a checkpoint folder, a config.json,
    a dict or a transformers config.

    A file is read through `io.read_input`: a FIFO, a device (/dev/zero), a socket or a directory is
    refused before a byte is read, and so is a file above MAX_CONFIG_BYTES (InteropError)."""
    if isinstance(source, Mapping):
        return dict(source), "config.json", None
    if hasattr(source, "to_dict"):
        return source.to_dict(), "config.json", None
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not os.path.lexists(path):
        raise InteropError(str(path), "no config.json here (a transformers checkpoint folder holds one)")
    config, text = read_json(path, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise InteropError(str(path), "a config.json holds one JSON object")
    return config, str(path), text


def read_config_file(source) -> tuple[dict, str]:
    """(config dict, display name) from a checkpoint folder, a config.json, a dict or a transformers config."""
    config, name, _ = read_config_text(source)
    return config, name


def _blame(text: str, d, arch, config: Mapping) -> str:
    """The config key behind a diagnostic on the spec text an Arch wrote: the key holding the value
    the message quotes (preferring those commented on the diagnostic's line), else the layers' key
    for a repeat count, else config.json."""
    if d.code in ("E0216", "E0237"):  # a repeat or the engine's layer count
        return _key_of(arch, "layers", getattr(arch, "layers", None), config)
    line = ""
    if d.span is not None:
        lines = text.splitlines()
        line = lines[d.span.line - 1] if 0 < d.span.line <= len(lines) else ""
    commented = re.findall(r"[A-Za-z_]\w*", line.split("#", 1)[1]) if "#" in line else []
    quoted = re.findall(r"'([^']*)'", d.message)
    numbers = []
    for m in re.finditer(r"(?:found|=)\s*(-?(?:\d+\.?\d*(?:e[+-]?\d+)?|inf|nan))", d.message):
        try:
            numbers.append(float(m.group(1)))
        except ValueError:
            pass

    def close(v, n: float) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        return math.isclose(float(v), n, rel_tol=1e-5) or (math.isnan(n) and math.isnan(float(v)))

    wanted = [lambda v, n=n: close(v, n) for n in numbers] + [lambda v, q=q: isinstance(v, str) and v == q for q in quoted]
    for holds in wanted:  # the first value the message quotes, then the next
        for keys in ([k for k in commented if k in config], list(config)):
            found = [k for k in keys if k != "model_type" and holds(config[k])]
            if found:
                return found[0]
    return "config.json"


def _resolves(text: str, arch, config: Mapping) -> None:
    """Refuse (Unsupported) a spec text that does not resolve: what `cyclec import` writes, `cyclec check`
    accepts, whatever a reader let through. The key named is the one holding the value refused."""
    from ..diagnostics import CycleError
    from ..semantics.resolve import parse

    try:
        parse(text, None)
    except CycleError as e:
        d = next((d for d in e.diagnostics if d.severity == "error"), e.diagnostics[0] if e.diagnostics else None)
        if d is None:
            raise Unsupported("config.json", f"the spec it implies is refused: {e}") from None
        raise Unsupported(_blame(text, d, arch, config), f"the spec it implies is refused: {d.message}") from None


def import_config(source, *, name: str | None = None) -> str:
    """The spec a transformers checkpoint implies, as formatted, commented .cycle text.

    source: a checkpoint folder, its config.json, a config dict or a transformers config;
    name: the file named in the spec's header (default: the config's file name).
    Raises Unsupported naming the first config field the language cannot express (a size
    above the language's limits included: the spec written always passes `cyclec check`),
    InteropError for a config that cannot be read."""
    from ..diagnostics import CycleError
    from ..syntax.fmt import format_text

    config, path, _ = read_config_text(source)
    arch = read_arch(config)
    try:
        text = format_text(spec_text(arch, name or Path(path).name))
    except CycleError as e:
        raise Unsupported("config.json", f"the spec it implies does not parse: {e}") from None
    _resolves(text, arch, config)
    return text


def export_config(spec) -> dict:
    """The transformers config.json of a spec shaped like a supported family.

    Refused (Unsupported) unless importing that config gives back the spec's function:
    the first field that differs is named."""
    engine = spec.engine if isinstance(spec, ir.Spec) else spec
    config = expander_config(engine)
    if config is None and engine.name in lineage.FAMILY_OF_ENGINE:  # the GPT-2 lineage, by the engine's name (lineage.py)
        config = lineage.engine_config(engine, lineage.FAMILY_OF_ENGINE[engine.name])
    if config is not None:  # an ssm or latent attention: mamba2, mamba, jamba or deepseek_v2; a GPT-2 lineage family
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


def _target(spec) -> dict:
    """The spec's module's state dict on the meta device: names, shapes and dtypes, nothing allocated."""
    import torch

    from ..backends.torch.build import build

    with torch.device("meta"):
        return build(spec if isinstance(spec, ir.Spec) else ir.Spec(engine=spec)).state_dict()


def _fits(weights: dict, spec, target: dict | None = None) -> None:
    """InteropError naming the first key, shape or dtype of `weights` the spec's module does not have."""
    target = _target(spec) if target is None else target
    for key, want in target.items():
        if key not in weights:
            raise InteropError(key, "the spec's module has it; the weights lack it")
        got = weights[key]
        if tuple(got.shape) != tuple(want.shape):
            raise InteropError(key, f"shape {tuple(want.shape)} in the spec's module, {tuple(got.shape)} in the weights")
        if got.dtype.is_complex or got.dtype.is_floating_point != want.dtype.is_floating_point:
            raise InteropError(key, f"dtype {got.dtype} in the weights, {want.dtype} in the spec's module")
    for key in weights:
        if key not in target:
            raise InteropError(key, "in the weights, but the spec's module has no such part")


class OutputRefused(ValueError):
    """An export that would write over something it did not create: one of its inputs, or a folder
    that holds other files (without force). The command line's usage error (exit 2)."""


# The two files an export writes, and the names of other weight files a folder may hold (another
# checkpoint's shards and index, pickles, TF/Flax weights): with force, those are removed, since
# transformers would read them instead of (or beside) the new model.safetensors.
CHECKPOINT_FILES = ("config.json", "model.safetensors")
_WEIGHT_FILE = re.compile(r"(model|pytorch_model|tf_model|flax_model)(-\d+-of-\d+)?\.(safetensors|bin|h5|msgpack|ckpt)(\.index(\.json)?)?")


def _listing(names: list[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def export_plan(out_dir, force: bool = False) -> list[str]:
    """The entries of `out_dir` an export would remove (stale weight files, sorted); refuses
    (OutputRefused) a folder that holds anything unless `force`, a path that is not a folder, and
    a folder whose config.json or model.safetensors is itself a folder."""
    out = os.fspath(out_dir)
    if not os.path.lexists(out):
        return []
    if not os.path.isdir(out):
        raise OutputRefused(f"-o {out} exists and is not a folder")
    entries = sorted(os.listdir(out))
    if entries and not force:
        raise OutputRefused(f"-o {out} is not empty (it holds {_listing(entries)}): pass --force to write the checkpoint into it, "
                            "replacing config.json and model.safetensors and removing other weight files")
    named = set()
    index = os.path.join(out, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            weight_map = read_json(index, MAX_INDEX_BYTES)[0].get("weight_map")
            named = {v for v in weight_map.values() if isinstance(v, str) and v.endswith(".safetensors")} if isinstance(weight_map, dict) else set()
        except (InteropError, AttributeError):
            pass
    stale = []
    for e in entries:
        p = os.path.join(out, e)
        if e in CHECKPOINT_FILES:
            if os.path.isdir(p) and not os.path.islink(p):
                raise OutputRefused(f"{p} is a folder: the export would write a file there")
        elif (_WEIGHT_FILE.fullmatch(e) or e in named) and (os.path.islink(p) or not os.path.isdir(p)):
            stale.append(e)
    return stale


def _same_as_input(out_dir, names, inputs) -> None:
    from ..io import same_file

    for name in names:
        target = os.path.join(os.fspath(out_dir), name)
        for path in inputs:
            if path is not None and same_file(target, path):
                verb = "overwrite" if name in CHECKPOINT_FILES else "remove"
                raise OutputRefused(f"-o {out_dir}: {target} is the input file {path}: refusing to {verb} it")


def export(spec, weights, out_dir, *, force: bool = False) -> dict:
    """Write out_dir/config.json and out_dir/model.safetensors, which
    `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` loads into the spec's function.

    weights: the compiled module's state dict, or a .safetensors file of it (`cyclec build
    --weights`). Returns the config written. All or nothing: a new folder appears whole (made
    beside its place and renamed into it); into an existing one both files are staged, then
    renamed over their names, and put back as they were if anything fails. A folder that holds
    anything is refused (OutputRefused) unless `force`, which also removes the weight files
    that would contradict the new ones (`export_plan` names them); so is an output that is the
    weights file itself."""
    from safetensors.torch import save

    from ..io import write_folder

    engine = spec.engine if isinstance(spec, ir.Spec) else spec
    config = export_config(engine)
    stale = export_plan(out_dir, force)
    target = _target(spec)
    if isinstance(weights, (str, os.PathLike)):
        _same_as_input(out_dir, [*CHECKPOINT_FILES, *stale], [weights])
        limit = 2 * sum(t.numel() * t.element_size() for t in target.values()) + (100 << 20)  # the module's bytes, a header, slack
        weights, _ = read_safetensors(weights, limit=limit)
    _fits(dict(weights), spec, target)
    state = export_state_dict(dict(weights), spec, config["model_type"])
    if config.get("tie_word_embeddings"):
        state.pop(head_key(config["model_type"]))  # save_pretrained leaves a tied head out of the file
    payload = save({k: v.contiguous() for k, v in sorted(state.items())}, metadata={"format": "pt"})
    write_folder(out_dir, [("config.json", json.dumps(config, indent=2, sort_keys=True) + "\n"), ("model.safetensors", payload)], remove=stale)
    return config
