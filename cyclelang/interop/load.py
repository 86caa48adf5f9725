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

Weights are read from safetensors only: pickled checkpoints (`.bin`, `.pt`) can
run code when loaded, so they are refused. torch is imported by the functions
that need it, never at import time of `cyclelang`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import ir
from ..ir.kinds import is_gated
from . import families
from .compare import difference

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

# OLMo Hybrid's files: its DeltaNet layers' norms under OLMo-core's names (families_delta.py)
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


# --- the module's layout -----------------------------------------------------------------


@dataclass
class _Stage:
    attn: str | None = None  # "stages.0.mix.attn"
    mlp: str | None = None  # "stages.0.burn.mlp"
    moe: str | None = None  # "stages.0.burn.moe"
    ssm: str | None = None  # "stages.0.mix.ssm"
    mamba1: str | None = None  # "stages.0.mix.ssm" (version=1)
    latent: str | None = None  # "stages.0.mix.attn" (latent attention)
    short_conv: str | None = None  # "stages.0.mix.short_conv"
    attn_node: object = None
    work_node: object = None
    experts: int = 0
    valves: dict = field(default_factory=dict)  # a turbine's path -> the valve in front of it ("stages.0.mix.norm")
    posts: dict = field(default_factory=dict)  # a turbine's path -> the valve right after it in its branch (OLMo-2)


@dataclass
class _Plan:
    """Where each key of the module comes from: key -> (source keys, transform)."""

    entries: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)  # module keys with no source: why


def _layout(spec) -> dict[int, _Stage]:
    """Each stage instance's attention, reactor and their experts, by the IR's layout paths."""
    lay = ir.layout.layout(spec)
    stages: dict[int, _Stage] = {}
    flat = {path: i for i, (path, _) in enumerate(lay.layers())}  # a layer's index in the order the layers run
    for sl in lay.stages:
        parts = [p for p in lay.parts() if p.stage is sl.stage and p.spath == sl.path and p.role != "merge"]
        for r, inst in enumerate(sl.instances()):
            st = stages.setdefault(flat[inst], _Stage())
            valve = None  # the latest valve on the way to each turbine, in its branch (Pre-LN)
            last = None  # the latest turbine, and its branch
            for part in parts:
                path = part.instances()[r]
                if part.role == "valve":
                    if last is not None and last[1] is part.branch is not None:
                        st.posts[last[0]] = path
                    valve = (part.branch, part.fullflow, path)
                    last = None
                    continue
                last = (path, part.branch)
                if valve is not None and (valve[0] is part.branch or valve[0] is None and valve[1] is part.fullflow is not None):
                    st.valves[path] = valve[2]
                if isinstance(part.node, ir.Attention) and st.attn is None:
                    st.attn, st.attn_node = path, part.node
                elif isinstance(part.node, ir.Mlp) and st.mlp is None:
                    st.mlp, st.work_node = path, part.node
                elif isinstance(part.node, ir.Moe) and st.moe is None:
                    st.moe, st.experts, st.work_node = path, part.node.experts, part.node
                elif isinstance(part.node, ir.Ssm) and st.ssm is None:
                    st.ssm = path
                elif isinstance(part.node, ir.Mamba1) and st.mamba1 is None:
                    st.mamba1 = path
                elif isinstance(part.node, ir.LatentAttention) and st.latent is None:
                    st.latent, st.attn_node = path, part.node
                elif isinstance(part.node, ir.ShortConv) and st.short_conv is None:
                    st.short_conv = path
    return stages


def _final_valve(spec) -> str:
    """The engine-level valve before the nozzle (`norm`), by the layout."""
    valves = [p.path for p in ir.layout.layout(spec).main if isinstance(p, ir.layout.Part) and p.role == "valve"]
    return valves[-1] if valves else "norm"


def _parent(prefix: str) -> str:
    return prefix.rsplit(".", 1)[0] + "."


# Transforms from checkpoint tensors to the module's, each with its inverse (export).


class _Same:
    def __call__(self, t):
        return t

    def inverse(self, t):
        return [t]


class _T:
    """GPT-2's Conv1D stores the transpose of nn.Linear's weight."""

    def __call__(self, t):
        return t.t()

    def inverse(self, t):
        return [t.t().contiguous()]


@dataclass(frozen=True)
class _Cat:
    """Several checkpoint matrices fused along rows (q, k, v; gate, up)."""

    sizes: tuple

    def __call__(self, *ts):
        import torch

        return torch.cat(ts, dim=0)

    def inverse(self, t):
        return [x.contiguous() for x in t.split(list(self.sizes), dim=0)]


@dataclass(frozen=True)
class _Shaped:
    """A checkpoint tensor of this shape, ours the same numbers as one vector (Cohere's (heads, head_dim) qk-norm gains)."""

    shape: tuple

    def __call__(self, t):
        if tuple(t.shape) != self.shape:
            raise ValueError(f"not of shape {self.shape}")
        return t.reshape(-1)

    def inverse(self, t):
        return [t.reshape(self.shape).contiguous()]


@dataclass(frozen=True)
class _Index:
    """One expert's slice of transformers 5's fused expert tensors."""

    x: int
    count: int

    def __call__(self, t):
        return t[self.x]

    def inverse(self, t):
        return [t]


_SAME, _TRANSPOSE = _Same(), _T()


def _plan(arch: str, spec, state: dict, fused: bool | None = None, halves: bool | None = None) -> _Plan:
    """fused: whether Mixtral's experts come as transformers 5's fused tensors (read from
    the state dict when None)."""
    plan = _Plan()
    e = plan.entries

    def put(ours, srcs, fn=_SAME):
        srcs = (srcs,) if isinstance(srcs, str) else tuple(srcs)
        e[ours] = (srcs, fn)

    gpt2, family_moe = arch == "gpt2", arch in ("mixtral", "qwen2_moe", "cohere2_moe", "hunyuan_v1_moe", "minimax_m2", "flint") or arch in ROUTED
    layout, final = _layout(spec), _final_valve(spec)
    if arch == "mamba2":
        return _plan_mamba2(plan, put, layout, final)
    if arch in ("minicpm3", "youtu"):
        return _plan_latent_dense(plan, put, layout, final, arch == "minicpm3" or bool(halves))
    if arch in _EXPANDER_PLANS:
        return _EXPANDER_PLANS[arch](plan, put, layout, final, state, fused)
    if arch in families._delta.READERS:  # the gated DeltaNet hybrids (families_delta.py)
        return families._delta.plan(arch, plan, put, spec, state, fused)
    if arch in families.lineage.READERS:  # the GPT-2 lineage's layers (lineage.py)
        return families.lineage.plan(arch, plan, put, spec, _SAME, _TRANSPOSE, _Cat, _NeoxQkv)
    for i, st in sorted(layout.items()):
        moe = family_moe and not ((arch in ("qwen2_moe", "qwen3_moe", "mellum", "flint") or arch in DENSE_AMONG) and st.moe is None and st.mlp is not None)  # their dense layers: a gated MLP
        if st.attn is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no attention turbine; transformers' {arch} layer {i} has one"
            continue
        reactor = st.moe if moe else st.mlp
        if reactor is None:
            kind = "moe" if moe else "mlp"
            plan.reasons[f"stages.{i}"] = f"stage {i} has no {kind} turbine; transformers' {arch} layer {i} has one"
            continue
        # a turbine without a valve before it maps its checkpoint norm nowhere, which is then left over
        an, rn = st.valves.get(st.attn, _parent(st.attn) + "norm"), st.valves.get(reactor, _parent(reactor) + "norm")
        if gpt2:
            h = f"h.{i}."
            for p in ("weight", "bias"):
                fn = _TRANSPOSE if p == "weight" else _SAME
                put(f"{an}.{p}", h + f"ln_1.{p}")
                put(f"{rn}.{p}", h + f"ln_2.{p}")
                put(f"{st.attn}.qkv.{p}", h + f"attn.c_attn.{p}", fn)
                put(f"{st.attn}.proj.{p}", h + f"attn.c_proj.{p}", fn)
                put(f"{reactor}.fc.{p}", h + f"mlp.c_fc.{p}", fn)
                put(f"{reactor}.proj.{p}", h + f"mlp.c_proj.{p}", fn)
            continue
        a, ks = st.attn_node, KEYS.get(arch, _Keys())
        if arch == "falcon" and _separate_parallel(spec):  # the new decoder's two norms
            ks = replace(ks, attn_norm="ln_attn", mlp_norm="ln_mlp")
        h = f"{ks.layers}.{i}."
        if arch == "sarvam_moe" and h + "self_attn.query_key_value.weight" in state:  # as saved (see _RENAMES)
            ks = replace(ks, fused_qkv="self_attn.query_key_value")
        qkv = _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim))
        gate_up = _Cat((st.work_node.hidden, st.work_node.hidden))
        for p in ("weight", "bias"):  # biases only where the spec (and the config) has them
            if st.attn in st.posts:  # OLMo-2: the norms follow the turbines; Gemma 2: on both sides
                put(f"{st.posts[st.attn]}.{p}", h + f"{ks.attn_post}.{p}")
            if st.attn not in st.posts or st.attn in st.valves:
                put(f"{an}.{p}", h + f"{ks.attn_norm}.{p}")
            if reactor in st.posts:
                put(f"{st.posts[reactor]}.{p}", h + f"{ks.mlp_post}.{p}")
            if (reactor not in st.posts or reactor in st.valves) and rn != an:  # a parallel block's shared norm (Phi) is the attention's
                put(f"{rn}.{p}", h + f"{ks.mlp_norm}.{p}")
        for p in ("weight", "bias"):  # qk-norms: Qwen3 per head, OLMo-2 across heads; Persimmon's layernorms have a bias
            if a.qk_norm_head_gains and arch in ("stablelm", "cohere"):  # each head's gain, ours one vector head by head
                for ours, theirs, n in (("q_norm", ks.qk_norms[0], a.heads), ("k_norm", ks.qk_norms[1], a.kv_heads)):
                    if arch == "stablelm":  # one LayerNorm per head: norms.{j}
                        put(f"{st.attn}.{ours}.{p}", [h + f"{theirs}.norms.{j}.{p}" for j in range(n)], _Cat((a.head_dim,) * n))
                    else:  # Cohere's one (heads, head_dim) weight
                        put(f"{st.attn}.{ours}.{p}", h + f"{theirs}.{p}", _Shaped((n, a.head_dim)))
                continue
            put(f"{st.attn}.q_norm.{p}", h + f"{ks.qk_norms[0]}.{p}")
            put(f"{st.attn}.k_norm.{p}", h + f"{ks.qk_norms[1]}.{p}")
        gated = is_gated(st.work_node.act)
        for p in ("weight", "bias"):
            if arch == "falcon" and 1 < a.kv_heads < a.heads:  # the new decoder's rows, group by group [q heads | k | v]
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}", _GroupedQkv(a.kv_heads, a.heads // a.kv_heads, a.head_dim))
            elif ks.neox_qkv and a.kv_heads == a.heads:  # Falcon's multi-query rows are [q heads | k | v], as ours
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}", _NeoxQkv(a.heads, a.head_dim))
            elif ks.mp_qkv:
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}", _GroupedRows(ks.mp_qkv))
            elif ks.fused_qkv:
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}")
            else:
                put(f"{st.attn}.qkv.{p}", [h + f"{ks.q.format(n)}.{p}" for n in "qkv"], _Turned(qkv.sizes, a.head_dim) if ks.turned else qkv)
            put(f"{st.attn}.proj.{p}", h + f"{ks.o}.{p}")
            if a.sinks:  # a learned sink per head (granite_swa, flint; Flint's files name it softmax_offset)
                put(f"{st.attn}.sinks", h + ("self_attn.softmax_offset" if h + "self_attn.softmax_offset" in state else "self_attn.sinks"))
            if moe:
                continue
            if not gated:
                put(f"{reactor}.fc.{p}", h + f"{ks.plain[0]}.{p}")
                put(f"{reactor}.proj.{p}", h + f"{ks.plain[1]}.{p}")
                continue
            if ks.fused_gate_up:
                put(f"{reactor}.fc.{p}", h + f"{ks.fused_gate_up}.{p}")
            else:
                put(f"{reactor}.fc.{p}", [h + f"{ks.gated[0]}.{p}", h + f"{ks.gated[1]}.{p}"], gate_up)
            put(f"{reactor}.proj.{p}", h + f"{ks.gated[2]}.{p}")
        if not moe:
            continue
        if arch in ROUTED:
            _put_routed(put, arch, reactor, h, st.work_node, state, fused)
            continue
        if arch == "hunyuan_v1_moe":  # the router mlp.gate.wg, one summed shared MLP (shared_mlp), the experts fused
            put(f"{reactor}.router.weight", h + "mlp.gate.wg.weight")
            s = h + "mlp.shared_mlp."
            put(f"{reactor}.shared.fc.weight", [s + "gate_proj.weight", s + "up_proj.weight"], _Cat((st.work_node.shared, st.work_node.shared)))
            put(f"{reactor}.shared.proj.weight", s + "down_proj.weight")
            is_fused = (h + "mlp.experts.gate_up_proj" in state) if fused is None else fused  # saved files: mlp.experts.{e}.gate_proj ...
            for x in range(st.experts):
                if is_fused:
                    put(f"{reactor}.experts.{x}.fc.weight", h + "mlp.experts.gate_up_proj", _Index(x, st.experts))
                    put(f"{reactor}.experts.{x}.proj.weight", h + "mlp.experts.down_proj", _Index(x, st.experts))
                    continue
                b = h + f"mlp.experts.{x}."
                put(f"{reactor}.experts.{x}.fc.weight", [b + "gate_proj.weight", b + "up_proj.weight"], gate_up)
                put(f"{reactor}.experts.{x}.proj.weight", b + "down_proj.weight")
            continue
        is_fused = (h + "mlp.experts.gate_up_proj" in state) if fused is None else fused
        qwen = arch in ("qwen2_moe", "cohere2_moe", "flint")  # their saved files: mlp.experts.{e}.gate_proj/up_proj/down_proj, the router mlp.gate
        put(f"{reactor}.router.weight", h + ("mlp.gate.weight" if is_fused or qwen else "block_sparse_moe.gate.weight"))
        if arch == "minimax_m2" and st.work_node.correction:  # Mixtral's names, and the selection-only bias on the block
            put(f"{reactor}.correction", h + ("mlp." if is_fused else "block_sparse_moe.") + "e_score_correction_bias")
        if st.work_node.shared:  # Qwen2-MoE's shared expert and its gate
            s = h + ("mlp.shared_experts." if arch == "cohere2_moe" else "mlp.shared_expert.")  # Cohere 2 MoE's: ungated
            put(f"{reactor}.shared.fc.weight", [s + "gate_proj.weight", s + "up_proj.weight"], _Cat((st.work_node.shared, st.work_node.shared)))
            put(f"{reactor}.shared.proj.weight", s + "down_proj.weight")
            put(f"{reactor}.shared_gate.weight", h + "mlp.shared_expert_gate.weight")
        for x in range(st.experts):
            ours = f"{reactor}.experts.{x}"
            if is_fused:
                put(f"{ours}.fc.weight", h + "mlp.experts.gate_up_proj", _Index(x, st.experts))
                put(f"{ours}.proj.weight", h + "mlp.experts.down_proj", _Index(x, st.experts))
            elif qwen:
                b = h + f"mlp.experts.{x}."
                put(f"{ours}.fc.weight", [b + "gate_proj.weight", b + "up_proj.weight"], gate_up)
                put(f"{ours}.proj.weight", b + "down_proj.weight")
            else:
                b = h + f"block_sparse_moe.experts.{x}."
                put(f"{ours}.fc.weight", [b + "w1.weight", b + "w3.weight"], gate_up)
                put(f"{ours}.proj.weight", b + "w2.weight")
    if gpt2:
        put("feed.tok.weight", "wte.weight")
        put("feed.pos.weight", "wpe.weight")
        put(f"{final}.weight", "ln_f.weight")
        put(f"{final}.bias", "ln_f.bias")
        put("head.weight", "lm_head.weight")
        return plan
    ks = KEYS.get(arch, _Keys())
    put("feed.tok.weight", f"{ks.embed}.weight")
    if arch == "bloom":  # BLOOM's norm right after the embedding: the first valve on the main line
        first = [p.path for p in ir.layout.layout(spec).main if isinstance(p, ir.layout.Part) and p.role == "valve"][0]
        for p in ("weight", "bias"):
            put(f"{first}.{p}", f"word_embeddings_layernorm.{p}")
    for p in ("weight", "bias"):
        put(f"{final}.{p}", f"{ks.final}.{p}")
        put(f"head.{p}", f"{ks.head}.{p}")
    put("head_bias", f"{ks.head}.bias")  # a tied head's own bias (CodeGen's, GPT-J's): the weight is the embedding
    return plan


@dataclass(frozen=True)
class _IndexT(_Index):
    """One expert's slice of a fused tensor stored (in, out), transposed (Aria's experts)."""

    def __call__(self, t):
        return t[self.x].t()

    def inverse(self, t):
        return [t.t()]


# The routed-expert families' names inside `layers.{i}.`: (the block, its router, the fused experts in memory,
# the experts as saved: "split" per expert gate/up/down_proj, or the fused tensors' saved names).
ROUTED = {
    "qwen3_moe": ("mlp.", "gate.weight", "split"),
    "olmoe": ("mlp.", "gate.weight", "split"),
    "flex_olmo": ("mlp.", "gate.weight", "split"),
    "granitemoe": ("block_sparse_moe.", "router.weight", ("input_linear.weight", "output_linear.weight", "router.layer.weight")),
    "granitemoeshared": ("block_sparse_moe.", "router.weight", ("input_linear.weight", "output_linear.weight", "router.layer.weight")),
    "aria_text": ("mlp.", "router.weight", ("experts.fc1.weight", "experts.fc2.weight", "router.weight")),
    "mellum": ("mlp.", "gate.weight", "split"),
    "glm4_moe": ("mlp.", "gate.weight", "split"),
    "dots1": ("mlp.", "gate.weight", "split"),
    "ernie4_5_moe": ("mlp.", "gate.weight", "split"),
    "exaone_moe": ("mlp.", "gate.weight", "split"),
    "solar_open": ("mlp.", "gate.weight", "split"),
    "sarvam_moe": ("mlp.", "gate.weight", "split"),
    "hy_v3": ("mlp.", "gate.weight", "split"),
    "granitemoe_swa": ("block_sparse_moe.", "router.weight", ("input_linear.weight", "output_linear.weight", "router.layer.weight")),
}
# DeepSeek-V3's routers (families_routed.py): the selection-only bias's name inside the block; their dense layers
CORRECTION = {"glm4_moe": "gate.e_score_correction_bias", "dots1": "gate.e_score_correction_bias", "solar_open": "gate.e_score_correction_bias",
              "sarvam_moe": "gate.e_score_correction_bias", "hy_v3": "e_score_correction_bias",
              "ernie4_5_moe": "moe_statics.e_score_correction_bias", "exaone_moe": ("e_score_correction_bias", "gate.e_score_correction_bias")}  # (as saved, as in memory)
DENSE_AMONG = ("glm4_moe", "dots1", "ernie4_5_moe", "exaone_moe", "sarvam_moe", "hy_v3")


class _Row:
    """ERNIE 4.5's correction bias, stored as one row (1, experts): ours is (experts,)."""

    def __call__(self, t):
        return t.reshape(-1)

    def inverse(self, t):
        return [t.reshape(1, -1)]


def _put_routed(put, arch: str, reactor: str, h: str, node, state, fused) -> None:
    """A routed-expert family's moe turbine: its router, experts and shared expert, from transformers 5's fused expert
    tensors (a model's own state dict; export writes these) or the names save_pretrained writes."""
    block, router, saved = ROUTED[arch]
    b = h + block
    if saved == "split":
        put(f"{reactor}.router.weight", b + router)
        _put_experts(put, reactor, b, node, state, fused)
    else:
        mem = (b + "experts.gate_up_proj" in state) if fused is None else fused
        gate_up, down, rkey = (b + "experts.gate_up_proj", b + "experts.down_proj", b + router) if mem else tuple(b + k for k in saved)
        index = _IndexT if arch == "aria_text" else _Index  # Aria stores each expert (in, out)
        put(f"{reactor}.router.weight", rkey)
        for x in range(node.experts):
            put(f"{reactor}.experts.{x}.fc.weight", gate_up, index(x, node.experts))
            put(f"{reactor}.experts.{x}.proj.weight", down, index(x, node.experts))
    if node.correction and arch in CORRECTION:
        names = CORRECTION[arch] if isinstance(CORRECTION[arch], tuple) else (CORRECTION[arch],)
        name = next((n for n in names if b + n in state), names[0])
        put(f"{reactor}.correction", b + name, _Row() if arch == "ernie4_5_moe" else _SAME)
    if node.shared and arch in ("granitemoeshared", "granitemoe_swa"):  # one fused [gate | up] matrix, as ours
        put(f"{reactor}.shared.fc.weight", h + "shared_mlp.input_linear.weight")
        put(f"{reactor}.shared.proj.weight", h + "shared_mlp.output_linear.weight")
    elif node.shared:
        _put_gated(put, f"{reactor}.shared", b + "shared_experts.", node.shared)


MAMBA2_MIXER = ("in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "out_proj.weight", "out_proj.bias")


def _plan_mamba2(plan: _Plan, put, layout: dict, final: str) -> _Plan:
    """Mamba-2: layer i is stage i's ssm (its names are transformers' own) and the valve before it."""
    for i, st in sorted(layout.items()):
        if st.ssm is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no ssm turbine; transformers' mamba2 layer {i} has one"
            continue
        h = f"layers.{i}."
        put(f"{st.valves.get(st.ssm, _parent(st.ssm) + 'norm')}.weight", h + "norm.weight")
        for name in MAMBA2_MIXER:  # biases only where the config has use_bias / use_conv_bias
            put(f"{st.ssm}.{name}", h + "mixer." + name)
        put(f"{st.ssm}.norm", h + "mixer.norm.weight")  # the gated RMSNorm's gain
    put("feed.tok.weight", "embeddings.weight")
    put(f"{final}.weight", "norm_f.weight")
    put("head.weight", "lm_head.weight")
    return plan


MAMBA1_MIXER = ("in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "x_proj.weight", "A_log", "D", "out_proj.weight",
                "out_proj.bias", "dt_layernorm.weight", "b_layernorm.weight", "c_layernorm.weight")


def _put_mamba1(put, ours: str, theirs: str) -> None:
    """A Mamba-1 mixer: transformers' names, but dt_proj's weight and bias are dt_weight and dt_bias."""
    for name in MAMBA1_MIXER:  # biases and Jamba's norms only where the spec (and the config) has them
        put(f"{ours}.{name}", theirs + name)
    put(f"{ours}.dt_weight", theirs + "dt_proj.weight")
    put(f"{ours}.dt_bias", theirs + "dt_proj.bias")


def _plan_mamba(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Mamba-1: layer i is stage i's ssm (version=1) and the valve before it."""
    for i, st in sorted(layout.items()):
        if st.mamba1 is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no ssm turbine (version=1); transformers' mamba layer {i} has one"
            continue
        put(f"{st.valves.get(st.mamba1, _parent(st.mamba1) + 'norm')}.weight", f"layers.{i}.norm.weight")
        _put_mamba1(put, st.mamba1, f"layers.{i}.mixer.")
    put("feed.tok.weight", "embeddings.weight")
    put(f"{final}.weight", "norm_f.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _put_experts(put, reactor: str, h: str, node, state, fused) -> None:
    """Routed experts: transformers 5's fused tensors (`{h}experts.gate_up_proj`, a model's own state dict) or
    one expert at a time (`{h}experts.{e}.gate_proj`, ..., as save_pretrained writes them); fused None: as `state` has them."""
    fused = (h + "experts.gate_up_proj" in state) if fused is None else fused
    for x in range(node.experts):
        if fused:
            put(f"{reactor}.experts.{x}.fc.weight", h + "experts.gate_up_proj", _Index(x, node.experts))
            put(f"{reactor}.experts.{x}.proj.weight", h + "experts.down_proj", _Index(x, node.experts))
        else:
            b = h + f"experts.{x}."
            put(f"{reactor}.experts.{x}.fc.weight", [b + "gate_proj.weight", b + "up_proj.weight"], _Cat((node.hidden, node.hidden)))
            put(f"{reactor}.experts.{x}.proj.weight", b + "down_proj.weight")


def _put_gated(put, reactor: str, h: str, hidden: int) -> None:
    """A swiglu MLP from gate_proj, up_proj, down_proj under `h`."""
    for p in ("weight", "bias"):
        put(f"{reactor}.fc.{p}", [h + f"gate_proj.{p}", h + f"up_proj.{p}"], _Cat((hidden, hidden)))
        put(f"{reactor}.proj.{p}", h + f"down_proj.{p}")


def _plan_jamba(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Jamba: layer i is stage i: attention (q, k, v, o) or a Mamba-1 mixer, then an MLP or routed experts, each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        mixer = st.attn or st.mamba1
        reactor = st.moe or st.mlp
        if mixer is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or ssm (version=1) mixer, or an mlp or moe; transformers' jamba layer {i} has both"
            continue
        put(f"{st.valves.get(mixer, _parent(mixer) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(reactor, _parent(reactor) + 'norm')}.weight", h + "pre_ff_layernorm.weight")
        if st.attn is not None:
            a = st.attn_node
            put(f"{st.attn}.qkv.weight", [h + f"self_attn.{n}_proj.weight" for n in "qkv"],
                _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
            put(f"{st.attn}.proj.weight", h + "self_attn.o_proj.weight")
        else:
            _put_mamba1(put, st.mamba1, h + "mamba.")
        if st.moe is not None:
            put(f"{st.moe}.router.weight", h + "feed_forward.router.weight")
            _put_experts(put, st.moe, h + "feed_forward.", st.work_node, state, fused)
        else:
            _put_gated(put, st.mlp, h + "feed_forward.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "final_layernorm.weight")
    put("head.weight", "lm_head.weight")
    return plan


DEEPSEEK_V2_ATTN = ("q_a_proj", "q_a_layernorm", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj")


def _plan_deepseek_v2(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """DeepSeek-V2: layer i is stage i: latent attention (transformers' names), then a dense MLP or DeepSeekMoE
    (routed experts and the shared expert of one moe turbine), each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        reactor = st.moe or st.mlp
        if st.latent is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks a latent attention or an mlp or moe; transformers' deepseek_v2 layer {i} has both"
            continue
        put(f"{st.valves.get(st.latent, _parent(st.latent) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(reactor, _parent(reactor) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        for name in DEEPSEEK_V2_ATTN:
            for p in ("weight", "bias"):
                put(f"{st.latent}.{name}.{p}", h + f"self_attn.{name}.{p}")
        if st.moe is not None:
            put(f"{st.moe}.router.weight", h + "mlp.gate.weight")
            if st.work_node.correction:  # DeepSeek-V3's selection bias, a buffer on both sides
                put(f"{st.moe}.correction", h + "mlp.gate.e_score_correction_bias")
            _put_experts(put, st.moe, h + "mlp.", st.work_node, state, fused)
            _put_gated(put, f"{st.moe}.shared", h + "mlp.shared_experts.", st.work_node.shared)
        else:
            _put_gated(put, st.mlp, h + "mlp.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_deepseek_v3(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """DeepSeek-V3: V2's layout, the router's correction bias with it (an moe with correction), and its MTP layers refused."""
    _plan_deepseek_v2(plan, put, layout, final, state, fused)
    _refuse_mtp(plan, state, len(layout))
    return plan


def _plan_axk1(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """A.X-K1: DeepSeek-V3's layout, and the RMSNorm after each MoE block (post_mlp_layernorm: at the layer in the files,
    under mlp. in transformers' module); a dense layer has none."""
    _plan_deepseek_v3(plan, put, layout, final, state, fused)
    for i, st in sorted(layout.items()):
        reactor = st.moe or st.mlp
        post = st.posts.get(reactor) if reactor is not None else None
        if (st.moe is not None) != (post is not None):
            plan.reasons[f"stages.{i}"] = (f"stage {i}: A.X-K1 norms the output of an MoE block (post_mlp_layernorm) and of nothing else; "
                                           "this stage's reactor " + ("lacks it" if post is None else "is a dense MLP with a norm after it"))
            continue
        if post is not None:
            h = f"layers.{i}."
            put(f"{post}.weight", h + ("mlp.post_mlp_layernorm.weight" if h + "mlp.post_mlp_layernorm.weight" in state else "post_mlp_layernorm.weight"))
    return plan


def _refuse_mtp(plan: _Plan, state, layers: int) -> None:
    """DeepSeek-V3's multi-token-prediction layers are saved as layers.{N}.* past the last one
    (num_nextn_predict_layers of them): a module the language does not have, and transformers
    drops them as it loads. Refused by name here rather than dropped."""
    extra = sorted({int(m.group(1)) for k in state if (m := re.match(r"layers\.(\d+)\.", k)) and int(m.group(1)) >= layers})
    if extra:
        plan.reasons[f"model.layers.{extra[0]}"] = (
            f"multi-token-prediction weights (layers {', '.join(map(str, extra))}, past the {layers} layers; num_nextn_predict_layers): "
            "the language has no MTP module, so they cannot load; save the checkpoint without them to load the causal LM")


@dataclass(frozen=True)
class _RopeHalves:
    """Rows of a projection whose blocks of `pre` + `rope` rows end in a rotary part rotated by halves (dim j with
    j + rope/2, transformers' rotate_half), as ours: rotated in adjacent pairs (2j, 2j + 1). Permuting q's and k's
    rotary rows alike leaves every q.k, so the attention, unchanged."""

    pre: int
    rope: int

    def __call__(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(-1, self.pre + self.rope, *rest)
        r = g[:, self.pre:].reshape(g.shape[0], 2, self.rope // 2, *rest).transpose(1, 2).reshape(g.shape[0], self.rope, *rest)
        return torch.cat([g[:, : self.pre], r], 1).reshape(t.shape)

    def inverse(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(-1, self.pre + self.rope, *rest)
        r = g[:, self.pre:].reshape(g.shape[0], self.rope // 2, 2, *rest).transpose(1, 2).reshape(g.shape[0], self.rope, *rest)
        return [torch.cat([g[:, : self.pre], r], 1).reshape(t.shape).contiguous()]


def _plan_latent_dense(plan: _Plan, put, layout: dict, final: str, halves: bool) -> _Plan:
    """MiniCPM3 and Youtu: layer i is stage i: latent attention (DeepSeek-V2's names), then a gated MLP, each with its
    valve. halves: the checkpoint rotates its rotary rows by halves (MiniCPM3; Youtu with rope_interleave false)."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        if st.latent is None or st.mlp is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks a latent attention or an mlp; the checkpoint's layer {i} has both"
            continue
        a = st.attn_node
        put(f"{st.valves.get(st.latent, _parent(st.latent) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.mlp, _parent(st.mlp) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        for name in DEEPSEEK_V2_ATTN:
            for p in ("weight", "bias"):
                fn = _SAME
                if halves and name in ("q_proj", "q_b_proj"):
                    fn = _RopeHalves(a.head_dim, a.rotary_dims)
                elif halves and name == "kv_a_proj_with_mqa":
                    fn = _RopeHalves(a.latent, a.rotary_dims)
                put(f"{st.latent}.{name}.{p}", h + f"self_attn.{name}.{p}", fn)
        _put_gated(put, st.mlp, h + "mlp.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _put_hybrid_mixer(put, st: _Stage, h: str) -> None:
    """A Mamba-2 / attention hybrid's mixer under `h`: attention's q, k, v, o, or the Mamba-2 mixer (`mamba.`, transformers' names)."""
    if st.attn is not None:
        a = st.attn_node
        for p in ("weight", "bias"):
            put(f"{st.attn}.qkv.{p}", [h + f"self_attn.{n}_proj.{p}" for n in "qkv"],
                _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
            put(f"{st.attn}.proj.{p}", h + f"self_attn.o_proj.{p}")
        return
    for name in MAMBA2_MIXER:
        put(f"{st.ssm}.{name}", h + "mamba." + name)
    put(f"{st.ssm}.norm", h + "mamba.norm.weight")


def _plan_bamba(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Bamba: layer i is stage i: attention (q, k, v, o) or a Mamba-2 mixer (its names are transformers' own), then a
    gated MLP, each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        mixer = st.attn or st.ssm
        if mixer is None or st.mlp is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or ssm mixer, or an mlp; transformers' bamba layer {i} has both"
            continue
        put(f"{st.valves.get(mixer, _parent(mixer) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.mlp, _parent(st.mlp) + 'norm')}.weight", h + "pre_ff_layernorm.weight")
        _put_hybrid_mixer(put, st, h)
        _put_gated(put, st.mlp, h + "feed_forward.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "final_layernorm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_granitemoehybrid(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """GraniteMoeHybrid: layer i is stage i: attention or a Mamba-2 mixer, then routed experts (transformers 5's fused tensors, or
    the released files' input_linear / output_linear / router.layer) beside the shared MLP, each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        mixer, reactor = st.attn or st.ssm, st.moe or st.mlp
        if mixer is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or ssm mixer, or a moe or mlp; transformers' granitemoehybrid layer {i} has both"
            continue
        put(f"{st.valves.get(mixer, _parent(mixer) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(reactor, _parent(reactor) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        _put_hybrid_mixer(put, st, h)
        if st.moe is None:  # no experts (num_local_experts 0): the shared MLP alone
            put(f"{st.mlp}.fc.weight", h + "shared_mlp.input_linear.weight")
            put(f"{st.mlp}.proj.weight", h + "shared_mlp.output_linear.weight")
            continue
        b = h + "block_sparse_moe."
        legacy = not fused and b + "input_linear.weight" in state  # the released files' names (transformers renames them on load)
        put(f"{st.moe}.router.weight", b + ("router.layer.weight" if legacy else "router.weight"))
        n = st.work_node.experts
        for x in range(n):
            put(f"{st.moe}.experts.{x}.fc.weight", b + ("input_linear.weight" if legacy else "experts.gate_up_proj"), _Index(x, n))
            put(f"{st.moe}.experts.{x}.proj.weight", b + ("output_linear.weight" if legacy else "experts.down_proj"), _Index(x, n))
        put(f"{st.moe}.shared.fc.weight", h + "shared_mlp.input_linear.weight")  # rows [gate | up], as ours
        put(f"{st.moe}.shared.proj.weight", h + "shared_mlp.output_linear.weight")
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


# --- gpt-oss (families_sinks.py): q, k, v, o biased, a sink per head, a biased router, the experts' fused tensors
# stored (in, out) with gate and up interleaved column by column, and biased ---------------------------------------


@dataclass(frozen=True)
class _Interleaved(_Index):
    """One expert's slice of gpt-oss's gate_up_proj (E, in, 2 x hidden) or its bias (E, 2 x hidden), whose gate and up
    alternate (gate the even columns, up the odd ones): ours is [gate | up] by rows, (2 x hidden, in) or (2 x hidden,)."""

    def __call__(self, t):
        import torch

        t = t[self.x].t() if t.dim() == 3 else t[self.x]
        return torch.cat((t[0::2], t[1::2]), dim=0)

    def inverse(self, t):
        import torch

        gate, up = t.chunk(2, dim=0)
        both = torch.stack((gate, up), dim=1).reshape(t.shape)  # rows gate_0, up_0, gate_1, ...
        return [both.t() if t.dim() == 2 else both]


def _plan_gpt_oss(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    for i, st in sorted(layout.items()):
        if st.attn is None or st.moe is None:
            plan.reasons[f"stages.{i}"] = f"stage {i}: a gpt-oss layer is attention then routed experts"
            continue
        a, m, h = st.attn_node, st.work_node, f"layers.{i}."
        put(f"{st.valves.get(st.attn, _parent(st.attn) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.moe, _parent(st.moe) + 'norm')}.weight", h + "post_attention_layernorm.weight")
        qkv = _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim))
        for p in ("weight", "bias"):
            put(f"{st.attn}.qkv.{p}", [h + f"self_attn.{n}_proj.{p}" for n in "qkv"], qkv)
            put(f"{st.attn}.proj.{p}", h + f"self_attn.o_proj.{p}")
            put(f"{st.moe}.router.{p}", h + f"mlp.router.{p}")
        put(f"{st.attn}.sinks", h + "self_attn.sinks")
        e = h + "mlp.experts."
        for x in range(m.experts):
            ours = f"{st.moe}.experts.{x}"
            put(f"{ours}.fc.weight", e + "gate_up_proj", _Interleaved(x, m.experts))
            put(f"{ours}.fc.bias", e + "gate_up_proj_bias", _Interleaved(x, m.experts))
            put(f"{ours}.proj.weight", e + "down_proj", _IndexT(x, m.experts))
            put(f"{ours}.proj.bias", e + "down_proj_bias", _Index(x, m.experts))
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_falcon_h1(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Falcon-H1: layer i is stage i: one norm before both the Mamba-2 mixer (`mamba.`, transformers' names) and attention
    (q, k, v, o), then a gated MLP (`feed_forward.`) with its own valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        if st.attn is None or st.ssm is None or st.mlp is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks its ssm, attention or mlp; transformers' falcon_h1 layer {i} has all three"
            continue
        put(f"{st.valves.get(st.ssm, _parent(st.ssm) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(st.mlp, _parent(st.mlp) + 'norm')}.weight", h + "pre_ff_layernorm.weight")
        _put_hybrid_mixer(put, replace(st, attn=None), h)  # the Mamba-2 mixer ...
        _put_hybrid_mixer(put, st, h)  # ... and attention
        _put_gated(put, st.mlp, h + "feed_forward.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "final_layernorm.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_nemotron_h(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Nemotron-H: layer i is stage i: its valve (`norm`) and one mixer (`mixer.`): a Mamba-2 mixer, attention or an ungated MLP."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        turbine = st.ssm or st.attn or st.mlp or st.moe
        if turbine is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no ssm, attention, mlp or moe; transformers' nemotron_h layer {i} has one"
            continue
        put(f"{st.valves.get(turbine, _parent(turbine) + 'norm')}.weight", h + "norm.weight")
        if st.ssm is not None:
            for name in MAMBA2_MIXER:
                put(f"{st.ssm}.{name}", h + "mixer." + name)
            put(f"{st.ssm}.norm", h + "mixer.norm.weight")
        elif st.attn is not None:
            a = st.attn_node
            put(f"{st.attn}.qkv.weight", [h + f"mixer.{n}_proj.weight" for n in "qkv"],
                _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
            put(f"{st.attn}.proj.weight", h + "mixer.o_proj.weight")
        elif st.moe is not None:  # a sigmoid router with its correction buffer, fused ungated experts, one shared expert
            n = st.work_node.experts
            put(f"{st.moe}.router.weight", h + "mixer.gate.weight")
            put(f"{st.moe}.correction", h + "mixer.gate.e_score_correction_bias")
            mem = (h + "mixer.experts.up_proj" in state) if fused is None else fused  # the model's 3-D tensors, or one expert a key as saved
            for x in range(n):
                for ours, theirs in (("fc", "up_proj"), ("proj", "down_proj")):
                    if mem:
                        put(f"{st.moe}.experts.{x}.{ours}.weight", h + f"mixer.experts.{theirs}", _Index(x, n))
                    else:
                        put(f"{st.moe}.experts.{x}.{ours}.weight", h + f"mixer.experts.{x}.{theirs}.weight")
            put(f"{st.moe}.shared.fc.weight", h + "mixer.shared_experts.up_proj.weight")
            put(f"{st.moe}.shared.proj.weight", h + "mixer.shared_experts.down_proj.weight")
        else:
            for p in ("weight", "bias"):
                put(f"{st.mlp}.fc.{p}", h + f"mixer.up_proj.{p}")
                put(f"{st.mlp}.proj.{p}", h + f"mixer.down_proj.{p}")
    put("feed.tok.weight", "embeddings.weight")
    put(f"{final}.weight", "norm_f.weight")
    put("head.weight", "lm_head.weight")
    return plan


_EXPANDER_PLANS = {"mamba": _plan_mamba, "jamba": _plan_jamba, "deepseek_v2": _plan_deepseek_v2, "deepseek_v3": _plan_deepseek_v3,
                   "falcon_mamba": _plan_mamba,
                   "sarvam_mla": _plan_deepseek_v3,
                   "glm4_moe_lite": _plan_deepseek_v3,
                   "axk1": _plan_axk1,
                   "bamba": _plan_bamba,
                   "granitemoehybrid": _plan_granitemoehybrid,
                   "gpt_oss": _plan_gpt_oss,
                   "falcon_h1": _plan_falcon_h1,
                   "nemotron_h": _plan_nemotron_h,
                   }
_EXPANDER_PLANS.update(families._conv.PLANS)  # LFM2, LFM2-MoE (families_conv.py)


_EXPANDER_PLANS[families._gemma4.FAMILY] = families._gemma4.plan  # Gemma 4's layers (families_gemma4.py)
_EXPANDER_PLANS[families._gemma4.UNIFIED] = families._gemma4.plan
_EXPANDER_PLANS[families._afmoe.FAMILY] = families._afmoe.plan  # AFMoE's layers (families_afmoe.py)
_EXPANDER_PLANS[families._laguna.FAMILY] = families._laguna.plan  # Laguna's layers (families_laguna.py)


def _prefix(arch: str) -> str:
    return {"mamba2": "backbone.", "mamba": "backbone.", "falcon_mamba": "backbone.", "gpt2": "transformer.", "gptj": "transformer.", "falcon": "transformer.", "gpt_neox": "gpt_neox.",
            "bloom": "transformer.", "codegen": "transformer.", "mpt": "transformer.", **families.lineage.PREFIX}.get(arch, "model.")


@dataclass(frozen=True)
class _Keys:
    """A Llama-shaped family's key names, inside `layers.{i}.` (and at the top: embed, final, head)."""

    attn_norm: str = "input_layernorm"
    mlp_norm: str = "post_attention_layernorm"
    q: str = "self_attn.{}_proj"  # q, k, v formatted in; None when fused
    fused_qkv: str | None = None  # one matrix: "self_attn.qkv_proj"
    neox_qkv: bool = False  # the fused matrix groups rows head by head, [q_h | k_h | v_h] (GPT-NeoX)
    o: str = "self_attn.o_proj"
    gated: tuple = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    fused_gate_up: str | None = None  # "mlp.gate_up_proj" (Phi-3)
    mp_qkv: int = 0  # the fused matrix's rows come in this many groups, each [q | v | k] (CodeGen's mp_num)
    plain: tuple = ("mlp.c_fc", "mlp.c_proj")  # an ungated MLP's (in, out)
    embed: str = "embed_tokens"
    final: str = "norm"
    head: str = "lm_head"
    layers: str = "layers"
    attn_post: str = "post_attention_layernorm"  # the norm after attention (OLMo-2, Gemma 2's sandwich)
    mlp_post: str = "post_feedforward_layernorm"  # the norm after the MLP
    qk_norms: tuple = ("self_attn.q_norm", "self_attn.k_norm")
    turned: bool = False  # the rotary turns the other way (nanochat): each head's second half of q and k rows negated


KEYS = {
    "phi3": _Keys(fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj"),
    "phi": _Keys(o="self_attn.dense", plain=("mlp.fc1", "mlp.fc2"), final="final_layernorm", qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm")),
    "gpt_neox": _Keys(fused_qkv="attention.query_key_value", neox_qkv=True, o="attention.dense",
                      plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"), embed="embed_in", final="final_layer_norm"),
    "falcon": _Keys(fused_qkv="self_attention.query_key_value", neox_qkv=True, o="self_attention.dense",
                    plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"), embed="word_embeddings", final="ln_f", layers="h"),
    "mamba2": _Keys(embed="embeddings", final="norm_f"),
    "mamba": _Keys(embed="embeddings", final="norm_f"),
    "falcon_mamba": _Keys(embed="embeddings", final="norm_f"),
    "jamba": _Keys(final="final_layernorm"),
    "bamba": _Keys(final="final_layernorm"),
    "falcon_h1": _Keys(final="final_layernorm"),
    "nemotron_h": _Keys(embed="embeddings", final="norm_f"),
    "gemma2": _Keys(mlp_norm="pre_feedforward_layernorm"),
    "arcee": _Keys(plain=("mlp.up_proj", "mlp.down_proj")),
    "gemma3_text": _Keys(mlp_norm="pre_feedforward_layernorm"),
    "nemotron": _Keys(plain=("mlp.up_proj", "mlp.down_proj")),
    "jais2": _Keys(plain=("mlp.up_proj", "mlp.down_proj")),
    "nanochat": _Keys(plain=("mlp.fc1", "mlp.fc2"), turned=True),
    "persimmon": _Keys(fused_qkv="self_attn.query_key_value", neox_qkv=True, o="self_attn.dense", plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
                       final="final_layernorm", qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm")),
    "bloom": _Keys(fused_qkv="self_attention.query_key_value", neox_qkv=True, o="self_attention.dense",
                   plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"), embed="word_embeddings", final="ln_f", layers="h"),
    "vaultgemma": _Keys(mlp_norm="pre_feedforward_layernorm"),
    "hyperclovax": _Keys(attn_post="post_norm1", mlp_post="post_norm2"),  # Peri-LN: a norm before and after each sublayer
    "gptj": _Keys(attn_norm="ln_1", q="attn.{}_proj", o="attn.out_proj", plain=("mlp.fc_in", "mlp.fc_out"), embed="wte", final="ln_f",
                  layers="h"),
    "glm": _Keys(fused_gate_up="mlp.gate_up_proj"),
    "glm4": _Keys(mlp_norm="post_attention_layernorm", fused_gate_up="mlp.gate_up_proj", attn_post="post_self_attn_layernorm",
                  mlp_post="post_mlp_layernorm"),
    "stablelm": _Keys(qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm")),
    "hunyuan_v1_dense": _Keys(qk_norms=("self_attn.query_layernorm", "self_attn.key_layernorm")),
    "hunyuan_v1_moe": _Keys(qk_norms=("self_attn.query_layernorm", "self_attn.key_layernorm")),
    "codegen": _Keys(attn_norm="ln_1", fused_qkv="attn.qkv_proj", mp_qkv=4, o="attn.out_proj", plain=("mlp.fc_in", "mlp.fc_out"),
                     embed="wte", final="ln_f", layers="h"),
    "mpt": _Keys(attn_norm="norm_1", mlp_norm="norm_2", fused_qkv="attn.Wqkv", o="attn.out_proj", plain=("ffn.up_proj", "ffn.down_proj"),
                 embed="wte", final="norm_f", layers="blocks"),
}


def _separate_parallel(spec) -> bool:
    """Whether the spec's layers are parallel blocks with a norm in each branch (GPT-NeoX, Falcon's new decoder)."""
    for op in spec.body if isinstance(spec, ir.Engine) else spec.engine.body:
        if isinstance(op, ir.Stage):
            return len(op.ops) == 1 and isinstance(op.ops[0], ir.Fullflow) and op.ops[0].norm is None
    return False


@dataclass(frozen=True)
class _GroupedQkv:
    """Falcon's new-decoder fused rows, kv group by group [q_1 .. q_g | k | v], as ours: [all q | all k | all v]."""

    kv_heads: int
    group: int
    head_dim: int

    def __call__(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(self.kv_heads, self.group + 2, self.head_dim, *rest)
        return torch.cat([g[:, : self.group].reshape(-1, *rest), g[:, self.group].reshape(-1, *rest), g[:, self.group + 1].reshape(-1, *rest)])

    def inverse(self, t):
        import torch

        rest = t.shape[1:]
        n = self.kv_heads * self.group * self.head_dim
        q = t[:n].reshape(self.kv_heads, self.group, self.head_dim, *rest)
        k = t[n : n + self.kv_heads * self.head_dim].reshape(self.kv_heads, 1, self.head_dim, *rest)
        v = t[n + self.kv_heads * self.head_dim :].reshape(self.kv_heads, 1, self.head_dim, *rest)
        return [torch.cat([q, k, v], 1).reshape(-1, *rest).contiguous()]


@dataclass(frozen=True)
class _GroupedRows:
    """CodeGen's fused rows: `groups` groups, each [q_g | v_g | k_g] (a group is width / groups rows of each), as ours:
    [all q | all k | all v], each the groups' parts in order."""

    groups: int

    def __call__(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(self.groups, 3, -1, *rest)  # (groups, [q, v, k], local rows, ...)
        return torch.cat([g[:, 0].reshape(-1, *rest), g[:, 2].reshape(-1, *rest), g[:, 1].reshape(-1, *rest)])

    def inverse(self, t):
        import torch

        rest = t.shape[1:]
        q, k, v = (x.reshape(self.groups, 1, -1, *rest) for x in t.chunk(3))
        return [torch.cat([q, v, k], 1).reshape(-1, *rest).contiguous()]


@dataclass(frozen=True)
class _NeoxQkv:
    """GPT-NeoX's fused rows, head by head [q_h | k_h | v_h], as ours: [all q | all k | all v]."""

    heads: int
    head_dim: int

    def __call__(self, t):
        rest = t.shape[1:]
        return t.reshape(self.heads, 3, self.head_dim, *rest).transpose(0, 1).reshape(3 * self.heads * self.head_dim, *rest)

    def inverse(self, t):
        rest = t.shape[1:]
        return [t.reshape(3, self.heads, self.head_dim, *rest).transpose(0, 1).reshape(3 * self.heads * self.head_dim, *rest).contiguous()]


@dataclass(frozen=True)
class _Turned(_Cat):
    """q, k, v fused as _Cat does, each head's second half of q and k rows negated: nanochat's rotary turns each pair
    (x1, x2) by -θ (its rotate_half is (x2, -x1)), which is ours turning (x1, -x2) by θ, then the second half negated;
    q . k, and the norms of q and k (its qk-norms are weightless), are unchanged by negating both second halves."""

    head_dim: int = 0

    def _flip(self, t):
        import torch

        sign = torch.ones(self.head_dim, dtype=t.dtype, device=t.device)
        sign[self.head_dim // 2 :] = -1
        q, k = self.sizes[0], self.sizes[1]
        flip = torch.cat((sign.repeat(q // self.head_dim), sign.repeat(k // self.head_dim), torch.ones(self.sizes[2], dtype=t.dtype, device=t.device)))
        return t * flip.view(-1, *([1] * (t.dim() - 1)))

    def __call__(self, *ts):
        return self._flip(super().__call__(*ts))

    def inverse(self, t):
        return super().inverse(self._flip(t))


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
