"""The limits a spec must stay within, and the parameter estimate `build` checks.

The front end's limits live where they are checked (file size, nesting and name
length in `syntax.parser`, include depth, repeat count and sizes in
`semantics.resolve`); this module gathers them for documentation and tests, and
adds the one limit that needs the whole IR: the total parameter count. The PyTorch
back-end calls `check_parameters` before it allocates anything, so a spec that
asks for a trillion weights gets a diagnostic instead of an out-of-memory kill;
`--allow-large` lifts it.

The estimate is closed form, from the IR alone (no torch): the kinds table's count
for every part of the layout, multiplied by each stage's repeat.
"""

from __future__ import annotations

from . import ir
from .diagnostics import CycleError, Diagnostic

MAX_PARAMETERS = 2_000_000_000  # 8 GB of fp32 weights before a single activation


def estimate_parameters(spec: ir.Spec) -> int:
    """Trainable parameters of the spec's engine (0 for a file of templates only)."""
    if spec.engine is None:
        return 0
    return sum(p.params * p.repeat for p in ir.layout.layout(spec.engine).parts())


def check_parameters(spec: ir.Spec, allow_large: bool = False, limit: int = MAX_PARAMETERS) -> int:
    """The estimate; raises CycleError (E0219) above `limit` unless `allow_large`."""
    n = estimate_parameters(spec)
    if n > limit and not allow_large:
        engine = spec.engine
        span = engine.span if engine is not None else spec.span
        raise CycleError([Diagnostic("E0219", "error", f"engine '{engine.name}' would have about {n:,} parameters, above the limit of {limit:,}", span,
                                     "pass --allow-large to build it anyway, or make it smaller")])
    return n
