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
