"""Build: compile and execute exactly the text `codegen` writes (one lowering path).

The generated source is registered as a real module (`cyclelang._generated.<engine>_<hash>`)
with its text in linecache, so tracebacks, `inspect.getsource`, pickling of the classes
and torch.compile all see the same file a user would get from `cyclec build -o`.
`build_source` executes a source lowered once (`cyclec build` writes and runs the same
text); `param_summary` and `summary_text` count the built model's parameters by the
part that owns each one, as `ir.layout` names them.
"""

from __future__ import annotations

import hashlib
import linecache
import sys
import types

from ... import ir
from ...ir.kinds import ROLE_WORDS, ROLES
from .codegen import codegen, engine_spec

# What each role counts, for the command line's help: one phrase per role, in ROLES order.
ROLE_DOC = "Roles: " + "; ".join(f"{ROLE_WORDS[r][0]} ({ROLE_WORDS[r][1]})" for r in ROLES) + "."

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
    from safetensors import SafetensorError, safe_open

    from ...io import InputRefused, check_regular

    target = model.state_dict()
    limit = 2 * sum(t.numel() * t.element_size() for t in target.values()) + (100 << 20)  # the model's bytes, a header, slack
    try:
        check_regular(path, limit)  # a FIFO would block, a device read forever, a huge file exhaust memory
    except InputRefused as e:
        raise WeightsError(path, f"cannot read it as weights for this engine: {e}") from None
    except OSError as e:
        raise WeightsError(path, f"cannot read it: {e.strerror or e}") from None
    try:
        with safe_open(path, framework="pt") as f:
            # names and shapes from the header first: nothing is allocated for a tensor the engine lacks
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            for key in sorted(set(target) | set(shapes)):
                if key not in shapes:
                    raise WeightsError(key, "missing from the weights file")
                if key not in target:
                    raise WeightsError(key, "in the weights file but not in this engine")
                if shapes[key] != tuple(target[key].shape):
                    raise WeightsError(key, f"shape {shapes[key]} in the file, {tuple(target[key].shape)} in the engine")
            state = {k: f.get_tensor(k) for k in sorted(shapes)}
    except (SafetensorError, OSError, RuntimeError, MemoryError) as e:
        raise WeightsError(path, f"cannot read it as safetensors: {e}") from None
    for key in sorted(target):
        if state[key].dtype != target[key].dtype:
            raise WeightsError(key, f"dtype {state[key].dtype} in the file, {target[key].dtype} in the engine")
    with torch.no_grad():
        model.load_state_dict(state, strict=True)
    return model


def build(spec: ir.Spec, seed: int | None = None, allow_large: bool = False, fast: bool = False, parallel: bool = False):
    """The spec as a torch.nn.Module (the generated `Model`), initialised per its startup block.

    With `seed`, initialisation draws from torch.manual_seed(seed) without touching the
    caller's global RNG state; the same seed gives the same weights. Before anything is
    allocated the parameter estimate is checked (E0219, `cyclelang.limits`) unless
    `allow_large`; building under `torch.device("meta")` allocates nothing and skips it.
    `fast=True` builds the fast form (`cyclec build --fast`): the same model, the loss and,
    under torch.compile, the token lookup and the MoE through the runtime's custom ops;
    `parallel=True` adds `parallelize` to the module (`cyclec build --parallel`)."""
    return build_source(spec, codegen(engine_spec(spec), fast=fast, parallel=parallel), seed=seed, allow_large=allow_large)


def build_source(spec: ir.Spec, source: str, seed: int | None = None, allow_large: bool = False):
    """`build`, executing `source`, which must be `codegen(spec)`: a caller that also writes
    the file (`cyclec build`) lowers once and runs the very text it writes. The model
    keeps the IR it was built from as `model.spec` (a plain attribute, not state)."""
    import torch

    from ...limits import check_parameters

    ir_spec = engine_spec(spec)
    if not allow_large and torch.empty(0).device.type != "meta":
        check_parameters(ir_spec)
    module = load_source(source, ir_spec.engine.name)
    if seed is None:
        model = module.Model()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = module.Model()
    model.spec = ir_spec  # the IR it was built from: interop reads the parts' paths from its layout
    return model


# --- what the parameters are: asked of the layout -----------------------------------------


def parameter_roles(spec: ir.Spec, names) -> dict[str, tuple[str, str]]:
    """name -> (role, stage) for parameter names of the built model: the role (`ir.kinds.ROLES`)
    of the layout part that owns the parameter, and its stage's name ('' outside stages).
    A name no part owns (a module added after the build) is ("other", "")."""
    lay = ir.layout.layout(engine_spec(spec))
    out = {}
    for name in names:
        part = lay.part_of(name)
        out[name] = ("other", "") if part is None else (part.role, part.stage.name if part.stage is not None else "")
    return out


def param_summary(spec: ir.Spec, model) -> dict:
    """Parameter counts: total, per role and per stage name (a nested stage's parts count under its own name).

    Roles: see ROLE_DOC. Parameters are counted once even when shared."""
    params, seen = [], set()
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params.append((name, p.numel()))
    roles = parameter_roles(spec, [name for name, _ in params])
    by_role: dict[str, int] = {}
    by_stage: dict[str, int] = {}
    for name, n in params:
        role, stage = roles[name]
        by_role[role] = by_role.get(role, 0) + n
        if stage:
            by_stage[stage] = by_stage.get(stage, 0) + n
    return {"total": sum(n for _, n in params), "roles": by_role, "stages": by_stage}


def summary_text(spec: ir.Spec, model) -> str:
    """The summary `cyclec build` prints: the total, the chamber, each stage, each role."""
    e = spec.engine
    info = param_summary(spec, model)
    lines = [f"engine {e.name}: {info['total']:,} parameters"]
    lines.append(f"  chamber: (B, T<={e.feed.context}, {e.width}), throat {e.throat}, vocab {e.feed.vocab}")
    lay = ir.layout.layout(engine_spec(spec))
    per_stage: dict[str, int] = {}  # folded stage path -> parameters of all its instances (a group's: its stages')
    stages = lay.all_stages()
    paths = {sl.path for sl in stages}
    owners: dict[str, list[str]] = {}  # a part's stage path -> it and the groups it is nested in (a lookup, not a scan)
    seen = set()
    for name, prm in model.named_parameters():
        part = lay.part_of(name)
        if id(prm) in seen or part is None or not part.spath:
            continue
        seen.add(id(prm))
        if part.spath not in owners:
            pieces = part.spath.split(".")
            owners[part.spath] = [q for q in (".".join(pieces[:k]) for k in range(1, len(pieces) + 1)) if q in paths]
        for path in owners[part.spath]:
            per_stage[path] = per_stage.get(path, 0) + prm.numel()
    for sl in stages:
        n, op = per_stage.get(sl.path, 0), sl.stage
        each = f" ({n // sl.count:,} each)" if sl.count > 1 else ""
        lines.append(f"  {'  ' * (sl.depth - 1)}stage {op.name} x{sl.count}: {n:,}{each}")
    roles = info["roles"]
    for r in (*ROLES, "other"):
        if r in roles or r in ("feed", "nozzle"):
            n = roles.get(r, 0)
            note = " (tied to the feed)" if r == "nozzle" and e.nozzle.tied and n == 0 else ""
            lines.append(f"  {ROLE_WORDS[r][0] if r in ROLE_WORDS else r}: {n:,}{note}")
    return "\n".join(lines) + "\n"
