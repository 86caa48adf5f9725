"""Build: compile and execute exactly the text `codegen` writes (one lowering path).

The generated source is registered as a real module (`cyclelang._generated.<engine>_<hash>`)
with its text in linecache, so tracebacks, `inspect.getsource`, pickling of the classes
and torch.compile all see the same file a user would get from `cyclec build -o`.
"""

from __future__ import annotations

import hashlib
import linecache
import sys
import types

from .codegen import codegen, module_roles

_PACKAGE = "cyclelang._generated"


def load_source(source: str, name: str = "model") -> types.ModuleType:
    """Execute generated source as a module; the same source gives the same module object."""
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    modname = f"{_PACKAGE}.{name}_{digest}"
    if modname in sys.modules:
        return sys.modules[modname]
    if _PACKAGE not in sys.modules:
        pkg = types.ModuleType(_PACKAGE)
        pkg.__path__ = []  # a namespace for generated models, nothing on disk
        sys.modules[_PACKAGE] = pkg
    filename = f"<cyclelang:{name}:{digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(modname)
    module.__file__ = filename
    code = compile(source, filename, "exec")
    sys.modules[modname] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[modname]
        raise
    return module


class WeightsError(ValueError):
    """Weights that do not fit the compiled engine; `key` names the first difference."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


def load_weights(model, path):
    """Load a safetensors file written by `cyclec build --weights` (or any state dict saved
    as safetensors) into `model`, refusing anything that does not fit exactly.

    Only safetensors is read: a pickle can run code when loaded. Every name and shape is
    compared before anything is copied; the first missing, unexpected or differently
    shaped tensor is named in a WeightsError and the model is left untouched."""
    import os

    import torch

    path = os.fspath(path)
    if not path.endswith(".safetensors"):
        raise WeightsError(path, "weights are read from .safetensors files only (a pickle can run code when loaded)")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(path)
    except (SafetensorError, OSError) as e:
        raise WeightsError(path, f"cannot read it as safetensors: {e}") from None
    target = model.state_dict()
    for key in sorted(set(target) | set(state)):
        if key not in state:
            raise WeightsError(key, "missing from the weights file")
        if key not in target:
            raise WeightsError(key, "in the weights file but not in this engine")
        if tuple(state[key].shape) != tuple(target[key].shape):
            raise WeightsError(key, f"shape {tuple(state[key].shape)} in the file, {tuple(target[key].shape)} in the engine")
        if state[key].dtype != target[key].dtype:
            raise WeightsError(key, f"dtype {state[key].dtype} in the file, {target[key].dtype} in the engine")
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    return model


def build(spec, seed: int | None = None, allow_large: bool = False):
    """The spec as a torch.nn.Module (the generated `Model`), initialised per its startup block.

    With `seed`, initialisation draws from torch.manual_seed(seed) without touching the
    caller's global RNG state; the same seed gives the same weights. Before anything is
    allocated the parameter estimate is checked (E0219, `cyclelang.limits`) unless
    `allow_large`; building under `torch.device("meta")` allocates nothing and skips it."""
    import torch

    from ...limits import check_parameters
    from .codegen import _engine_spec

    ir_spec = _engine_spec(spec)
    if not allow_large and torch.empty(0).device.type != "meta":
        check_parameters(ir_spec)
    module = load_source(codegen(ir_spec), ir_spec.engine.name)
    if seed is None:
        return module.Model()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return module.Model()


def param_summary(spec, model) -> dict:
    """Parameter counts: total, per role and per stage (name -> (instances, total)).

    Roles: see codegen.ROLE_DOC. Parameters are counted once even when shared."""
    roles = sorted(module_roles(spec), key=lambda r: -len(r[0]))
    by_role: dict[str, int] = {}
    by_stage: dict[str, int] = {}
    seen: set[int] = set()
    total = 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel()
        total += n
        role, stage = "other", ""
        for prefix, r, st in roles:
            if name.startswith(prefix) or name == prefix:
                role, stage = r, st
                break
        by_role[role] = by_role.get(role, 0) + n
        if stage:
            by_stage[stage] = by_stage.get(stage, 0) + n
    return {"total": total, "roles": by_role, "stages": by_stage}
