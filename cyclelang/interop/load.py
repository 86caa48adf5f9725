"""Load transformers checkpoints into compiled cyclelang modules, checked by construction.

    model = cyclelang.build(spec)
    cyclelang.interop.load_transformers(model, hf_model)        # a PreTrainedModel
    cyclelang.interop.load_transformers(model, "ckpt/")         # model.safetensors + config.json
    cyclelang.interop.load_transformers(model, state_dict, config=config)

Before a weight is copied, the checkpoint's config is turned into the IR it implies
(`families.read_config` by its `model_type`, then `families.spec_text`, parsed) and
compared with the spec's IR field by field (`compare.difference`): any difference
refuses to load, naming the first differing field in both vocabularies. Then the
weights are mapped by the IR's layout (the parts' paths in the compiled module): in
each stage instance `stages.{i}` the attention turbine, the reactor (mlp or moe) and
the valve in front of each take transformers layer i. A missing or extra key or a
different shape raises `InteropError` (a ValueError) naming the first key that differs.

This module reads the files and converts; plans.py maps a family's checkpoint keys onto
the module's paths (each expander family's plan beside its reader in families/), and
mapping.py holds the layout and the tensor transforms the plans share.

Weights are read from safetensors only: pickled checkpoints (`.bin`, `.pt`) can
run code when loaded, so they are refused. torch is imported by the functions
that need it, never at import time of `cyclelang`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from .. import ir
from . import families
from .compare import difference
from .mapping import KEYS, _Index, _Keys
from .plans import _plan

__all__ = ["InteropError", "load_transformers", "convert_state_dict", "read_safetensors", "implied_engine", "check_config"]

# Suffixes of pickled checkpoints: refused, since unpickling can run code.
_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class InteropError(ValueError):
    """A checkpoint that does not fit the compiled module; `key` names the first difference."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


# --- reading -----------------------------------------------------------------------------


MAX_INDEX_BYTES = 64 << 20  # a sharded checkpoint's index: ~1 MiB for the largest models


def read_json(path, limit: int) -> tuple[object, str]:
    """(the JSON value, its text) of a file of at most `limit` bytes, read through `io.read_input`
    (a FIFO, a device, a socket or a directory is refused before a byte is read); InteropError
    for anything that is not one JSON text in UTF-8."""
    from ..io import InputRefused, read_input

    try:
        data = read_input(path, limit)
    except InputRefused as e:
        raise InteropError(str(path), f"cannot read it: {e}") from None
    except OSError as e:
        raise InteropError(str(path), f"cannot read it: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InteropError(str(path), f"not a JSON config: it is not UTF-8 text ({e})") from None
    try:
        return json.loads(text), text
    except RecursionError:
        raise InteropError(str(path), "not a config: its JSON nests deeper than Python can read") from None
    except ValueError as e:  # JSONDecodeError, and an integer of more digits than Python converts
        raise InteropError(str(path), f"not a JSON config: {e}") from None


def _load_file(path, limit: int | None) -> dict:
    """The tensors of one safetensors file, checked as `cyclec fire --weights` and `build(weights=)`
    check theirs (`backends.torch.build.load_weights`): a regular file within `limit` bytes, opened
    by safetensors only then, and any error reading it an InteropError naming the file."""
    import sys

    from safetensors import SafetensorError, safe_open

    from ..io import InputRefused, check_regular

    path = str(path)
    try:
        check_regular(path, sys.maxsize if limit is None else limit)  # a FIFO would block, a device read forever
    except InputRefused as e:
        raise InteropError(path, f"cannot read it as weights: {e}") from None
    except OSError as e:
        raise InteropError(path, f"cannot read it: {e.strerror or e}") from None
    try:
        with safe_open(path, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, RuntimeError, MemoryError, ValueError, TypeError, OverflowError) as e:
        raise InteropError(path, f"cannot read it as safetensors: {e}") from None
    except BaseException as e:  # pyo3's PanicException derives from BaseException: a reader bug on a hostile header
        if type(e).__name__ != "PanicException":
            raise
        raise InteropError(path, f"cannot read it as safetensors: {e}") from None


def _load_sharded(folder: Path, index: Path, limit: int | None) -> dict:
    """The tensors of a sharded checkpoint: every shard its index names, each a file beside it."""
    data, _ = read_json(index, MAX_INDEX_BYTES)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InteropError(str(index), "not a safetensors index: it holds a weight_map from each tensor's name to its shard's file name")
    root = folder.resolve()
    state: dict = {}
    held: dict[str, set] = {}
    left = limit
    for shard in sorted(set(weight_map.values())):
        where = root / shard
        bad = not shard or "\0" in shard or os.path.isabs(shard) or "/" in shard or "\\" in shard or shard in (".", "..")
        if not bad:
            try:
                bad = where.resolve().parent != root
            except (OSError, RuntimeError, ValueError):
                bad = True
        if bad or not os.path.lexists(where):
            raise InteropError(str(index), f"shard {shard!r} is not a file in the checkpoint's folder: an index names its shards beside it")
        part = _load_file(where, left)
        if left is not None:
            left -= os.path.getsize(where)
        for key in part:
            if key in state:
                raise InteropError(str(index), f"{key} is in two shards ({held_by(held, key)} and {shard}): which one is the checkpoint's?")
        held[shard] = set(part)
        state.update(part)
    for key, shard in weight_map.items():
        if key not in held[shard]:
            raise InteropError(str(index), f"the index places {key} in {shard}, which lacks it")
    return state


def held_by(held: dict, key: str) -> str:
    return next(s for s, keys in held.items() if key in keys)


def read_safetensors(path, limit: int | None = None) -> tuple[dict, dict | None]:
    """(state dict, config dict or None) from a .safetensors file or a checkpoint folder.

    A folder holds `model.safetensors` or a sharded `model.safetensors.index.json`, and
    optionally `config.json`. Pickled formats are refused. Every file is read as
    `read_json` and `_load_file` read: never a FIFO or a device, never more than `limit`
    bytes of weights (None: no limit); whatever is wrong with one is an InteropError."""
    from .sizes import MAX_CONFIG_BYTES

    path = Path(path)
    config = None
    if path.is_dir():
        cfg = path / "config.json"
        if os.path.lexists(cfg):
            config, _ = read_json(cfg, MAX_CONFIG_BYTES)
            if not isinstance(config, dict):
                raise InteropError(str(cfg), "a config.json holds one JSON object")
        index = path / "model.safetensors.index.json"
        single = path / "model.safetensors"
        if os.path.lexists(single):
            return _load_file(single, limit), config
        if os.path.lexists(index):
            return _load_sharded(path, index, limit), config
        found = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLES)
        hint = f" (found {', '.join(found)}: pickled, refused)" if found else ""
        raise InteropError(str(path), f"no model.safetensors or model.safetensors.index.json here{hint}")
    if path.suffix in _PICKLES:
        raise InteropError(str(path), "pickled checkpoints can run code when loaded; convert it to safetensors first")
    if path.suffix != ".safetensors":
        raise InteropError(str(path), "expected a .safetensors file or a checkpoint folder")
    return _load_file(path, limit), config


def _source(source, limit: int | None = None) -> tuple[dict, dict | None]:
    """(state dict, config as a dict or None) from a model, a mapping, or a path (read within `limit` bytes)."""
    if isinstance(source, (str, os.PathLike)):
        return read_safetensors(source, limit)
    if isinstance(source, Mapping):
        return dict(source), None
    if hasattr(source, "state_dict"):
        config = getattr(source, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            config = config.to_dict()
        return dict(source.state_dict()), config
    raise TypeError(f"expected a transformers model, a state dict or a safetensors path, got {type(source).__name__}")


def _prefix(arch: str) -> str:
    return {"mamba2": "backbone.", "mamba": "backbone.", "falcon_mamba": "backbone.", "gpt2": "transformer.", "gptj": "transformer.", "falcon": "transformer.", "gpt_neox": "gpt_neox.",
            "bloom": "transformer.", "codegen": "transformer.", "mpt": "transformer.", **families.lineage.PREFIX}.get(arch, "model.")


def _strip_prefix(state: dict, arch: str) -> dict:
    """Drop `transformer.` / `model.` / `gpt_neox.` so keys read `h.0....` / `layers.0....`; the head stays."""
    prefix = _prefix(arch)
    aliases = _ALIASES.get(arch, {})
    state = {aliases.get(k, k): v for k, v in state.items()}
    if arch in _RENAMES:
        state = _renamed(state, _RENAMES[arch])
    if not any(k.startswith(prefix) for k in state):
        return dict(state)
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}


# The names a family's released files use, which transformers renames on loading (and back on saving):
# EXAONE 3's GPT-2-like names for a Llama.
_RENAMES = {"exaone": ((r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
                       (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
                       (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"\.ln_1\.", ".input_layernorm."),
                       (r"\.ln_2\.", ".post_attention_layernorm."), (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
                       (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj."))}
# Sarvam-MoE's files keep Bailing's names (its fused [q | k | v] rows, as ours, read from self_attn.query_key_value)
_RENAMES["sarvam_moe"] = ((r"^model\.word_embeddings\.", "model.embed_tokens."), (r"\.attention\.", ".self_attn."),
                          (r"\.self_attn\.dense\.", ".self_attn.o_proj."), (r"\.self_attn\.query_layernorm\.", ".self_attn.q_norm."),
                          (r"\.self_attn\.key_layernorm\.", ".self_attn.k_norm."), (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"))
# HY-V3's files: its router, correction bias and shared expert under their own names
_RENAMES["hy_v3"] = ((r"\.mlp\.expert_bias$", ".mlp.e_score_correction_bias"), (r"\.mlp\.router\.gate\.", ".mlp.gate."),
                     (r"\.mlp\.shared_mlp\.", ".mlp.shared_experts."))

# OLMo Hybrid's files: its DeltaNet layers' norms under OLMo-core's names (families/delta.py)
_RENAMES["olmo_hybrid"] = ((r"\.attention_layer_norm\.", ".input_layernorm."), (r"\.feedforward_layer_norm\.", ".post_attention_layernorm."))
# Nemotron-H's files keep the released names under `backbone.` (transformers renames them to `model.` on load, and back on saving)
_RENAMES["nemotron_h"] = ((r"^backbone\.", "model."),)


def _renamed(state: dict, renames) -> dict:
    """The state dict under transformers' names; two keys that land on one name are refused (which one is the checkpoint's?)."""
    out: dict = {}
    for k, v in state.items():
        new = k
        for pat, to in renames:
            new = re.sub(pat, to, new)
        if new in out:
            raise InteropError(k, f"the checkpoint also holds {new} under another name: which one is its weight?")
        out[new] = v
    return out


# Older names of a key that transformers still yields somewhere (GPT-NeoX's named_parameters: embed_out).
_ALIASES = {"gpt_neox": {"embed_out.weight": "lm_head.weight"}}


# --- converting and checking -------------------------------------------------------------


def convert_state_dict(state: Mapping, target: Mapping, config: dict, *, spec) -> dict:
    """Map a transformers state dict onto `target` (the compiled module's state dict:
    names and shapes are all that is read), whose parts `spec` (the IR it was built
    from) names; `config` is the checkpoint's config (its model_type picks the family).
    Returns a dict with exactly target's keys.

    Raises InteropError at the first key that differs: a module key with no source, a
    source key missing, a shape that differs (in the module's key order), then a
    checkpoint key left over."""
    arch = config.get("model_type")
    if arch not in families.CAUSAL_LM:
        raise InteropError("model_type", f"unknown model type {arch!r}; supported: {', '.join(families.FAMILIES)}")
    arch = families.SAME_AS.get(arch, arch)
    src = _strip_prefix(dict(state), arch)
    plan = _plan(arch, spec, src, halves=arch == "youtu" and not config.get("rope_interleave", True))  # null rotates by halves too
    for where, why in plan.reasons.items():
        raise InteropError(where, why)
    used: set[str] = set()
    out: dict = {}
    tied = "head.weight" not in target
    for key, want in target.items():
        if key not in plan.entries:
            raise InteropError(key, f"the module has it; transformers' {arch} has nothing that maps to it")
        srcs, fn = plan.entries[key]
        missing = [s for s in srcs if s not in src]
        if missing:
            raise InteropError(key, f"the checkpoint lacks {missing[0]}")
        try:
            value = fn(*[src[s] for s in srcs])
        except (RuntimeError, IndexError, ValueError, TypeError) as e:  # a fused or transposed tensor of another shape
            shapes = ", ".join(str(tuple(getattr(src[s], "shape", ()))) for s in srcs)
            raise InteropError(key, f"shape {tuple(want.shape)} in the module; {' + '.join(srcs)} of shape {shapes} do not make it ({e})") from None
        used.update(srcs)
        if tuple(value.shape) != tuple(want.shape):
            raise InteropError(key, f"shape {tuple(want.shape)} in the module, {tuple(value.shape)} from {' + '.join(srcs)}")
        if value.dtype.is_complex or value.dtype.is_floating_point != want.dtype.is_floating_point:
            raise InteropError(key, f"dtype {want.dtype} in the module, {value.dtype} from {' + '.join(srcs)}")
        out[key] = value
    embed, head_key = _embed_and_head(arch)
    if tied and head_key in src:
        # A tied nozzle reuses the token embedding: an untied head that differs has no place.
        if not _same_tensor(src[head_key], src[embed]):
            raise InteropError(head_key, "the spec ties the nozzle to the feed, but the checkpoint's head differs from its embedding")
        used.add(head_key)
    for key in src:
        if key not in used and not _ignorable(key):
            raise InteropError(key, "in the checkpoint, but the module has no place for it (more layers, or a construct the spec lacks)")
    return out


def export_state_dict(model_state: Mapping, spec, family: str) -> dict:
    """The transformers state dict (full key names) of a compiled module's weights: the
    inverse of convert_state_dict, with Mixtral's experts in transformers 5's fused layout."""
    import torch

    plan = _plan(family, spec, {}, fused=True)
    for where, why in plan.reasons.items():
        raise InteropError(where, why)
    out: dict = {}
    stacks: dict = {}
    pieces: dict = {}
    for key, value in model_state.items():
        if key not in plan.entries:
            raise InteropError(key, f"the module has it; transformers' {family} has no place for it")
        srcs, fn = plan.entries[key]
        if isinstance(fn, _Index):
            stacks.setdefault(srcs[0], [None] * fn.count)[fn.x] = fn.inverse(value)[0]
            continue
        for s, t in zip(srcs, fn.inverse(value.detach())):
            if isinstance(t, families._delta.Piece):  # a share of a checkpoint tensor several module tensors split (Qwen3-Next's)
                pieces.setdefault(s, []).append(t)
                continue
            out[s] = t
    for s, shares in pieces.items():
        out[s] = families._delta.Piece.join(shares)
    for s, parts in stacks.items():
        out[s] = torch.stack([p.detach() for p in parts]).contiguous()
    pre = _prefix(family)
    embed, head_key = _embed_and_head(family)
    full = {(k if k.startswith(head_key.rsplit(".", 1)[0] + ".") else pre + k): v.contiguous() for k, v in out.items()}
    if head_key not in full:
        full[head_key] = full[pre + embed].clone()  # tied: the head is the embedding (from_pretrained ties them again)
    return full


def _embed_and_head(arch: str) -> tuple[str, str]:
    """The token embedding's key (without the prefix) and the head's weight key."""
    if arch == "gpt2":
        return "wte.weight", "lm_head.weight"
    if arch in families.lineage.EMBED_HEAD:
        return families.lineage.EMBED_HEAD[arch]
    ks = KEYS.get(arch, _Keys())
    return f"{ks.embed}.weight", f"{ks.head}.weight"


def _same_tensor(a, b) -> bool:
    """Equal values (shape-only on the meta device, where there are none)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device.type == "meta" or b.device.type == "meta":
        return True
    return a.data_ptr() == b.data_ptr() or torch.equal(a, b)


def _ignorable(key: str) -> bool:
    # Buffers some transformers versions save: GPT-2's causal-mask tables, rotary caches.
    return bool(re.search(r"(attn\.(bias|masked_bias)|rotary_emb\.inv_freq)$", key))


def implied_engine(config: dict) -> ir.Engine:
    """The IR a checkpoint's config implies (by its model_type); InteropError names a field it cannot express."""
    from ..diagnostics import CycleError
    from ..semantics.resolve import parse
    from .sizes import read_arch

    if not isinstance(config, Mapping):
        raise InteropError("config", f"a config is one JSON object, not {type(config).__name__}")
    try:
        arch = read_arch(config)  # within the language's size limits
    except families.Unsupported as e:
        raise InteropError(e.field, str(e).split(": ", 1)[1]) from None
    try:
        return parse(families.spec_text(arch), "<config.json>").engine
    except CycleError as e:
        d = e.diagnostics[0] if e.diagnostics else None
        raise InteropError("config.json", f"the spec it implies is refused: {d.message if d is not None else e}") from None


def check_config(spec, config: dict) -> str:
    """Refuse (InteropError) unless the spec's engine computes what `config` implies; its family."""
    engine = spec.engine if isinstance(spec, ir.Spec) else spec
    implied = implied_engine(config)
    d = difference(engine, implied)
    if d is not None:
        raise InteropError(d.where, f"{d.text()} (the {config['model_type']} checkpoint's config implies another engine)")
    return config["model_type"]


def load_transformers(model, source, *, config: dict | None = None, spec=None):
    """Copy a transformers checkpoint's weights into `model` (a compiled cyclelang module).

    spec: the IR the model was built from; `cyclelang.build` records it on the model
    (`model.spec`), so it is needed only for a model made from a generated file.

    source: a transformers model, a state dict, or a safetensors file / checkpoint folder.
    config: the checkpoint's config (a dict or a transformers config), needed when the
    source does not carry one (a state dict, a bare .safetensors file): a state dict
    alone does not say what it computes. Returns `model`. Nothing is copied unless the
    config implies the spec's IR and every key and shape lines up; otherwise
    InteropError names the first difference."""
    import torch

    spec = spec if spec is not None else getattr(model, "spec", None)
    if spec is None:
        raise InteropError(type(model).__name__, "the model does not say which spec it was built from; pass spec= (its IR)")
    target = model.state_dict()
    limit = 2 * sum(t.numel() * t.element_size() for t in target.values()) + (100 << 20)  # the module's bytes, a header, slack
    state, found = _source(source, limit)
    config = _config_dict(config if config is not None else found)
    if config is None:
        raise InteropError("config", "the checkpoint comes without its config (config.json): pass config=, "
                           "since its keys alone do not say what it computes")
    check_config(spec, config)
    converted = convert_state_dict(state, target, config, spec=spec)
    try:
        with torch.no_grad():
            model.load_state_dict(converted, strict=True)
    except RuntimeError as e:
        raise InteropError(type(model).__name__, f"the converted weights do not load: {e}") from None
    return model


def _config_dict(config):
    if config is None or isinstance(config, dict):
        return config
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(f"config: expected a dict or a transformers config, got {type(config).__name__}")
