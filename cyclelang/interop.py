"""Load transformers checkpoints into compiled cyclelang modules.

    model = cyclelang.build(spec)
    cyclelang.interop.load_transformers(model, hf_model)        # a PreTrainedModel
    cyclelang.interop.load_transformers(model, "ckpt/")         # model.safetensors (+ config.json)
    cyclelang.interop.load_transformers(model, state_dict)      # a mapping of tensors

Supported checkpoints: GPT-2 (`GPT2LMHeadModel`, `GPT2Model`), Llama
(`LlamaForCausalLM`), Mistral (same keys as Llama; the window is in the config),
Mixtral (`MixtralForCausalLM`, both the transformers 5 fused-expert layout and
the `block_sparse_moe.experts.{e}.w1/w2/w3` layout of the released files) and
Mamba-2 (`Mamba2ForCausalLM`: each stage's `turbine ssm` and the valve before it).

The mapping is driven by the IR's layout (the parts' paths in the compiled module):
in each stage instance `stages.{i}` it takes the attention turbine, the reactor
(mlp or moe) and the valve beside each (the `norm` in the same prechamber, i.e.
Pre-LN), and maps transformers layer i onto them. Anything
that does not line up (a missing or extra key, a different shape, an eps or a
rotary base the config disagrees with) raises `InteropError` (a ValueError) naming
the first key that differs, before a single weight is copied.

Weights are read from safetensors only: pickled checkpoints (`.bin`, `.pt`) can
run code when loaded, so they are refused. torch is imported by the functions
that need it, never at import time of `cyclelang`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import ir

__all__ = ["InteropError", "load_transformers", "convert_state_dict", "detect_arch", "read_safetensors", "ARCHS"]

ARCHS = ("gpt2", "llama", "mistral", "mixtral", "mamba2")

# Suffixes of pickled checkpoints: refused, since unpickling can run code.
_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class InteropError(ValueError):
    """A checkpoint that does not fit the compiled module; `key` names the first difference."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


# --- reading -----------------------------------------------------------------------------


def read_safetensors(path) -> tuple[dict, dict | None]:
    """(state dict, config dict or None) from a .safetensors file or a checkpoint folder.

    A folder holds `model.safetensors` or a sharded `model.safetensors.index.json`, and
    optionally `config.json`. Pickled formats are refused."""
    from safetensors.torch import load_file

    path = Path(path)
    config = None
    if path.is_dir():
        if (path / "config.json").is_file():
            config = json.loads((path / "config.json").read_text("utf-8"))
        index = path / "model.safetensors.index.json"
        single = path / "model.safetensors"
        if single.is_file():
            return load_file(str(single)), config
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text("utf-8"))["weight_map"].values()))
            state: dict = {}
            for shard in shards:
                state.update(load_file(str(path / shard)))
            return state, config
        found = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLES)
        hint = f" (found {', '.join(found)}: pickled, refused)" if found else ""
        raise InteropError(str(path), f"no model.safetensors or model.safetensors.index.json here{hint}")
    if path.suffix in _PICKLES:
        raise InteropError(str(path), "pickled checkpoints can run code when loaded; convert it to safetensors first")
    if path.suffix != ".safetensors":
        raise InteropError(str(path), "expected a .safetensors file or a checkpoint folder")
    return load_file(str(path)), config


def _source(source) -> tuple[dict, dict | None]:
    """(state dict, config as a dict or None) from a model, a mapping, or a path."""
    if isinstance(source, (str, Path)):
        return read_safetensors(source)
    if isinstance(source, Mapping):
        return dict(source), None
    if hasattr(source, "state_dict"):
        config = getattr(source, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            config = config.to_dict()
        return dict(source.state_dict()), config
    raise TypeError(f"expected a transformers model, a state dict or a safetensors path, got {type(source).__name__}")


def detect_arch(keys, config: dict | None = None) -> str:
    """Which transformers architecture a state dict comes from: one of ARCHS."""
    if config and config.get("model_type") in ARCHS:
        return config["model_type"]
    keys = list(keys)
    if any(re.search(r"(^|\.)h\.\d+\.attn\.c_attn\.weight$", k) for k in keys):
        return "gpt2"
    if any(re.search(r"layers\.\d+\.mixer\.A_log$", k) for k in keys):
        return "mamba2"
    if any(re.search(r"layers\.\d+\.(mlp\.experts\.gate_up_proj|block_sparse_moe\.)", k) for k in keys):
        return "mixtral"
    if any(re.search(r"layers\.\d+\.mlp\.gate_proj\.weight$", k) for k in keys):
        return "llama"
    raise InteropError(keys[0] if keys else "<empty>", "not a GPT-2, Llama, Mistral, Mixtral or Mamba-2 checkpoint")


def _strip_prefix(state: dict, arch: str) -> dict:
    """Drop `transformer.` / `model.` so keys read `h.0....` / `layers.0....`; lm_head stays."""
    prefix = {"gpt2": "transformer.", "mamba2": "backbone."}.get(arch, "model.")
    if not any(k.startswith(prefix) for k in state):
        return dict(state)
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}


# --- the module's layout -----------------------------------------------------------------


@dataclass
class _Stage:
    attn: str | None = None  # "stages.0.mix.attn"
    ssm: str | None = None  # "stages.0.mix.ssm"
    mlp: str | None = None  # "stages.0.burn.mlp"
    moe: str | None = None  # "stages.0.burn.moe"
    experts: int = 0
    valves: dict = field(default_factory=dict)  # a turbine's path -> the valve in front of it ("stages.0.mix.norm")


@dataclass
class _Plan:
    """Where each key of the module comes from: key -> (source keys, transform)."""

    entries: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)  # module keys with no source: why


def _layout(spec) -> dict[int, _Stage]:
    """Each stage instance's attention, reactor and their experts, by the IR's layout paths."""
    lay = ir.layout.layout(spec)
    stages: dict[int, _Stage] = {}
    for sl in lay.stages:
        parts = [p for p in lay.parts() if p.stage is sl.stage and p.role != "merge"]
        for r in range(sl.stage.repeat):
            st = stages.setdefault(sl.first + r, _Stage())
            valve = None  # the latest valve on the way to each turbine, in its branch (Pre-LN)
            for part in parts:
                path = part.instances()[r]
                if part.role == "valve":
                    valve = (part.branch, part.fullflow, path)
                    continue
                if valve is not None and (valve[0] is part.branch or valve[0] is None and valve[1] is part.fullflow is not None):
                    st.valves[path] = valve[2]
                if isinstance(part.node, ir.Attention):
                    st.attn = st.attn or path
                elif isinstance(part.node, ir.Ssm):
                    st.ssm = st.ssm or path
                elif isinstance(part.node, ir.Mlp):
                    st.mlp = st.mlp or path
                elif isinstance(part.node, ir.Moe) and st.moe is None:
                    st.moe, st.experts = path, part.node.experts
    return stages


def _final_valve(spec) -> str:
    """The engine-level valve before the nozzle (`norm`), by the layout."""
    valves = [p.path for p in ir.layout.layout(spec).main if isinstance(p, ir.layout.Part) and p.role == "valve"]
    return valves[-1] if valves else "norm"


def _parent(prefix: str) -> str:
    return prefix.rsplit(".", 1)[0] + "."


def _T(t):
    return t.t()


def _cat(*ts):
    import torch

    return torch.cat(ts, dim=0)


def _same(t):
    return t


def _plan(arch: str, spec, state: dict) -> _Plan:
    plan = _Plan()
    e = plan.entries

    def put(ours, srcs, fn=_same):
        srcs = (srcs,) if isinstance(srcs, str) else tuple(srcs)
        e[ours] = (srcs, fn)

    layout, final = _layout(spec), _final_valve(spec)
    if arch == "mamba2":
        return _plan_mamba2(plan, put, layout, final)
    for i, st in sorted(layout.items()):
        if st.attn is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no attention turbine; transformers' {arch} layer {i} has one"
            continue
        reactor = st.moe if arch == "mixtral" else st.mlp
        if reactor is None:
            kind = "moe" if arch == "mixtral" else "mlp"
            plan.reasons[f"stages.{i}"] = f"stage {i} has no {kind} turbine; transformers' {arch} layer {i} has one"
            continue
        # a turbine without a valve before it maps its checkpoint norm nowhere, which is then left over
        an, rn = st.valves.get(st.attn, _parent(st.attn) + "norm"), st.valves.get(reactor, _parent(reactor) + "norm")
        if arch == "gpt2":
            h = f"h.{i}."
            for p in ("weight", "bias"):
                put(f"{an}.{p}", h + f"ln_1.{p}")
                put(f"{rn}.{p}", h + f"ln_2.{p}")
                put(f"{st.attn}.qkv.{p}", h + f"attn.c_attn.{p}", _T if p == "weight" else _same)
                put(f"{st.attn}.proj.{p}", h + f"attn.c_proj.{p}", _T if p == "weight" else _same)
                put(f"{reactor}.fc.{p}", h + f"mlp.c_fc.{p}", _T if p == "weight" else _same)
                put(f"{reactor}.proj.{p}", h + f"mlp.c_proj.{p}", _T if p == "weight" else _same)
            continue
        h = f"layers.{i}."
        put(f"{an}.weight", h + "input_layernorm.weight")
        put(f"{rn}.weight", h + "post_attention_layernorm.weight")
        for p in ("weight", "bias"):  # biases only where the config has attention_bias
            put(f"{st.attn}.qkv.{p}", [h + f"self_attn.{n}_proj.{p}" for n in "qkv"], _cat)
            put(f"{st.attn}.proj.{p}", h + f"self_attn.o_proj.{p}")
        if arch in ("llama", "mistral"):
            put(f"{reactor}.fc.weight", [h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"], _cat)
            put(f"{reactor}.proj.weight", h + "mlp.down_proj.weight")
            continue
        fused = h + "mlp.experts.gate_up_proj" in state
        put(f"{reactor}.router.weight", h + ("mlp.gate.weight" if fused else "block_sparse_moe.gate.weight"))
        for x in range(st.experts):
            ours = f"{reactor}.experts.{x}"
            if fused:
                put(f"{ours}.fc.weight", h + "mlp.experts.gate_up_proj", lambda t, x=x: t[x])
                put(f"{ours}.proj.weight", h + "mlp.experts.down_proj", lambda t, x=x: t[x])
            else:
                b = h + f"block_sparse_moe.experts.{x}."
                put(f"{ours}.fc.weight", [b + "w1.weight", b + "w3.weight"], _cat)
                put(f"{ours}.proj.weight", b + "w2.weight")
    if arch == "gpt2":
        put("feed.tok.weight", "wte.weight")
        put("feed.pos.weight", "wpe.weight")
        put(f"{final}.weight", "ln_f.weight")
        put(f"{final}.bias", "ln_f.bias")
    else:
        put("feed.tok.weight", "embed_tokens.weight")
        put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


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


# --- converting and checking -------------------------------------------------------------


def convert_state_dict(state: Mapping, target: Mapping, arch: str | None = None, config: dict | None = None, *, spec) -> dict:
    """Map a transformers state dict onto `target` (the compiled module's state dict:
    names and shapes are all that is read), whose parts `spec` (the IR it was built
    from) names. Returns a dict with exactly target's keys.

    Raises InteropError at the first key that differs: a module key with no source, a
    source key missing, a shape that differs (in the module's key order), then a
    checkpoint key left over."""
    arch = arch or detect_arch(state.keys(), config)
    if arch not in ARCHS:
        raise InteropError(arch, f"unknown architecture; supported: {', '.join(ARCHS)}")
    src = _strip_prefix(dict(state), arch)
    plan = _plan(arch, spec, src)
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
        value = fn(*[src[s] for s in srcs])
        used.update(srcs)
        if tuple(value.shape) != tuple(want.shape):
            raise InteropError(key, f"shape {tuple(want.shape)} in the module, {tuple(value.shape)} from {' + '.join(srcs)}")
        out[key] = value
    if tied and "lm_head.weight" in src:
        # A tied nozzle reuses the token embedding: an untied head that differs has no place.
        emb = src[{"gpt2": "wte.weight", "mamba2": "embeddings.weight"}.get(arch, "embed_tokens.weight")]
        head = src["lm_head.weight"]
        if not _same_tensor(head, emb):
            raise InteropError("lm_head.weight", "the spec ties the nozzle to the feed, but the checkpoint's head differs from its embedding")
        used.add("lm_head.weight")
    for key in src:
        if key not in used and not _ignorable(key):
            raise InteropError(key, "in the checkpoint, but the module has no place for it (more layers, or a construct the spec lacks)")
    return out


def _same_tensor(a, b) -> bool:
    """Equal values (shape-only on the meta device, where there are none)."""
    import torch

    if a.shape != b.shape:
        return False
    if a.device.type == "meta" or b.device.type == "meta":
        return True
    return a.data_ptr() == b.data_ptr() or torch.equal(a, b)


def _ignorable(key: str) -> bool:
    # Buffers some transformers versions save: GPT-2's causal-mask tables, rotary caches.
    return bool(re.search(r"(attn\.(bias|masked_bias)|rotary_emb\.inv_freq)$", key))


def _check_config(model, arch: str, config: dict) -> None:
    """What the keys cannot show: norm eps, rotary base, sliding window, an ssm's dt limits."""
    import torch
    from torch import nn

    eps = config.get("layer_norm_epsilon" if arch in ("gpt2", "mamba2") else "rms_norm_eps")
    kinds = (nn.LayerNorm,) if arch == "gpt2" else (nn.RMSNorm,)
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.LayerNorm, nn.RMSNorm)) and not isinstance(mod, kinds):
            raise InteropError(name, f"{type(mod).__name__} in the module; transformers' {arch} uses {kinds[0].__name__}")
        if eps is not None and isinstance(mod, kinds) and mod.eps is not None and not math.isclose(mod.eps, eps, rel_tol=1e-6):
            raise InteropError(name, f"norm eps {mod.eps} in the module, {eps} in the config (set eps= on the norm)")
        if arch == "mamba2" and hasattr(mod, "A_log"):  # an ssm turbine: its gated norm and its dt limits
            limit = tuple(config.get("time_step_limit", (0.0, float("inf"))))
            if not math.isclose(mod.eps, eps, rel_tol=1e-6) if eps is not None else False:
                raise InteropError(name, f"gated norm eps {mod.eps} in the module, {eps} in the config (set eps= on the ssm)")
            if (mod.dt_lo, float("inf") if mod.dt_hi is None else mod.dt_hi) != (float(limit[0]), float(limit[1])):
                raise InteropError(name, f"dt limits ({mod.dt_lo}, {mod.dt_hi}) in the module, {limit} in the config (set dt_lo=, dt_hi=)")
        if hasattr(mod, "qkv") and hasattr(mod, "heads"):  # an attention turbine
            window = getattr(mod, "window", None)
            want = config.get("sliding_window") if arch in ("mistral", "mixtral") else None
            if (window or None) != (want or None):
                raise InteropError(name, f"sliding window {window} in the module, {want} in the config")
    if arch != "gpt2" and hasattr(model, "rope_cos"):
        rope = config.get("rope_parameters") or {}
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        dims = model.rope_cos.shape[-1]
        inv = 1.0 / (theta ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims))
        if model.rope_cos.shape[0] > 1:
            want = torch.cat((inv, inv)).cos().to(model.rope_cos.dtype)
            if not torch.allclose(model.rope_cos[1].cpu(), want, rtol=1e-4, atol=1e-6):
                raise InteropError("rope_cos", f"the module's rotary base differs from rope_theta={theta} (set rotary_base=)")


def load_transformers(model, source, *, arch: str | None = None, check_config: bool = True, spec=None):
    """Copy a transformers checkpoint's weights into `model` (a compiled cyclelang module).

    spec: the IR the model was built from; `cyclelang.build` records it on the model
    (`model.spec`), so it is needed only for a model made from a generated file.

    source: a transformers model, a state dict, or a safetensors file / checkpoint folder.
    arch: 'gpt2', 'llama', 'mistral', 'mixtral' or 'mamba2'; detected from the keys (or the
    config's model_type) when omitted. Returns `model`. Nothing is copied unless every
    key and shape lines up; otherwise InteropError names the first difference."""
    import torch

    spec = spec if spec is not None else getattr(model, "spec", None)
    if spec is None:
        raise InteropError(type(model).__name__, "the model does not say which spec it was built from; pass spec= (its IR)")
    state, config = _source(source)
    arch = arch or detect_arch(state.keys(), config)
    target = model.state_dict()
    converted = convert_state_dict(state, target, arch, config, spec=spec)
    if check_config and config:
        _check_config(model, arch, config)
    with torch.no_grad():
        model.load_state_dict(converted, strict=True)
    return model
