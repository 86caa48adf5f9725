"""The language's size limits applied to a checkpoint's config at import, before a spec is written.

A config the reader accepts may still ask for a model no spec can say (10^8 layers, a
hidden size of 10^12): `read_arch` refuses the layer count before a reader lists every
layer, then `check_sizes` refuses any size of the Arch above the language's limits,
naming the config key (E0401)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass

from .families import Unsupported, read_config

MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KiB; past this it is not one (the index of the largest checkpoints: ~1 MiB)


# The config keys that count a checkpoint's layers: checked before a reader runs, since some list each layer's type.
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


# An Arch field -> (the language's limit, what it is). Fields not named here are not sizes.
def _size_limits() -> dict:
    from ..limits import MAX_LAYERS
    from ..semantics.options import MAX_CONTEXT, MAX_EXPERTS, MAX_VOCAB, MAX_WIDTH

    width, hidden, context = (MAX_WIDTH, "a width"), (MAX_WIDTH * 64, "a hidden width"), (MAX_CONTEXT, "a context length")
    return {"vocab": (MAX_VOCAB, "a vocabulary"), "padding": (MAX_VOCAB, "a token id"), "context": context, "window": context,
            "conv": context, "chunk": context, "layer_windows": context,
            "width": width, "heads": width, "kv_heads": width, "head_dim": width, "state": width, "groups": width, "latent": width,
            "q_latent": width, "rotary_dims": width, "v_dim": width, "dt_rank": width,
            "hidden": hidden, "dense_hidden": hidden, "moe_hidden": hidden, "shared": hidden, "inner": hidden,
            "experts": (MAX_EXPERTS, "an expert count"), "top": (MAX_EXPERTS, "an expert count"),
            "layers": (MAX_LAYERS, "a layer count"), "dense": (MAX_LAYERS, "a layer count"), "pattern": (MAX_LAYERS, "a layer count")}


# Where a field's value comes from when the reader's sources do not say (or say a group of keys).
_FIELD_KEYS = {"context": "max_position_embeddings", "vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers",
               "window": "sliding_window", "padding": "pad_token_id"}


# Readers that name a group of keys for several fields (DeepSeek-V2's attention, its experts; Jamba's routing).
_GROUPS = {"heads": ("attn",), "head_dim": ("attn",), "latent": ("attn",), "q_latent": ("attn",), "rotary_dims": ("attn",),
           "v_dim": ("attn",), "moe_hidden": ("moe",), "experts": ("moe",), "top": ("experts", "moe"), "shared": ("moe",)}


def _key_of(arch, field: str, value, config: Mapping | None) -> str:
    """The config key a field of `arch` came from: the reader's source, narrowed to the one key of a
    group ("num_kv_heads, multi_query") that holds the value."""
    sources = getattr(arch, "sources", None) or {}
    src = sources.get(field) or next((sources[g] for g in _GROUPS.get(field, ()) if g in sources), None)
    if src is None:
        key = _FIELD_KEYS.get(field, field)
        return key if config is None or key in config else field
    if config is not None and value is not None:
        for n in (n.strip() for n in re.split(r",|/| x ", src)):
            if n in config and config[n] == value and not isinstance(config[n], bool):
                return n
        holding = [k for k, v in config.items() if v == value and type(v) is type(value)]
        if len(holding) == 1:  # the source names no key ("BLOOM has no context field"), but one key holds the value
            return holding[0]
    return src


def check_sizes(arch, config: Mapping | None = None) -> None:
    """Refuse (Unsupported, E0401, naming the config key) a size of `arch` (what `families.read_config`
    returns) above the language's limits (`cyclelang.limits`, the options' maxima): the spec it would
    write is one `cyclec check` refuses. `config`: the raw config, to name the key of a group."""
    limits = _size_limits()

    def check(obj, group: str | None) -> None:
        for f in fields(obj):
            if f.name == "sources":
                continue
            value = getattr(obj, f.name)
            if is_dataclass(value):
                check(value, f.name)
                continue
            if f.name not in limits:
                continue
            limit, what = limits[f.name]
            values = [len(value)] if f.name == "pattern" else list(value) if isinstance(value, (tuple, list)) else [value]
            for v in values:
                if v is None:  # no window, no query latent, no padding token
                    continue
                if isinstance(v, bool) or not isinstance(v, int):  # a string would be written into the spec's text as it is
                    key = _key_of(arch, f.name if group is None else group, v, config)
                    raise Unsupported(key, f"{v!r} is not a whole number, which {what} is")
                if v > limit:
                    key = _key_of(arch, f.name if group is None else group, v if f.name != "pattern" else None, config)
                    raise Unsupported(key, f"{v:,} is above the language's limit of {limit:,} for {what}: no spec can say this model")

    check(arch, None)


def _check_layer_keys(config: Mapping) -> None:
    """Refuse a layer count above the language's limit before a reader lists each layer (1e8 layers cost GBs)."""
    from ..limits import MAX_LAYERS

    for key in _LAYER_KEYS:
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_LAYERS:
            raise Unsupported(key, f"{v:,} layers is above the language's limit of {MAX_LAYERS:,} stage instances: no spec can say this model")


def read_arch(config: Mapping):
    """`families.read_config` within the language's size limits (Unsupported names the key)."""
    _check_layer_keys(config)
    arch = read_config(config)
    check_sizes(arch, config)
    return arch
