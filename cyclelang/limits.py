"""The limits a spec must stay within, and the parameter estimate `build` checks.

The front end's limits live where they are checked (file size, nesting and name
length in `syntax.parser`, include depth, repeat count and sizes in
`semantics.resolve`, how deep stages nest and how many stage instances an engine
runs in all, nested repeats multiplied out, in `ir.nodes`, which the resolver asks
too); this module gathers them for documentation and tests, and
adds the one limit that needs the whole IR: the total parameter count. The PyTorch
back-end calls `check_parameters` before it allocates anything, so a spec that
asks for a trillion weights gets a diagnostic instead of an out-of-memory kill;
`--allow-large` lifts it.

The estimate is closed form, from the IR alone (no torch): the kinds table's count
for every part of the layout, multiplied by each stage's repeat. The limit counts
every tensor the build allocates, not only the trainable ones: the fixed sinusoidal
position table (context x width) and the rotary cos/sin tables (2 x context x rotated
dims, one pair per distinct rotation), which `feed ... context=16777216
position=sinusoidal` makes 64 GiB of on a 4-million-parameter engine. Masks are made
per forward pass at the sequence's length, and the KV cache grows as a sequence is
decoded: neither is allocated at build.
"""

from __future__ import annotations

from . import ir
from .diagnostics import CycleError, Diagnostic

MAX_STAGE_DEPTH = ir.MAX_STAGE_DEPTH  # E0235
MAX_LAYERS = ir.MAX_LAYERS  # E0237
MAX_REPEATED_STAGES = ir.MAX_REPEATED_STAGES  # E0238
MAX_PARAMETERS = 2_000_000_000  # 8 GB of fp32 weights before a single activation


def estimate_parameters(spec: ir.Spec) -> int:
    """Trainable parameters of the spec's engine (0 for a file of templates only)."""
    if spec.engine is None:
        return 0
    return sum(p.params * p.repeat for p in ir.layout.layout(spec.engine).parts())


def estimate_buffers(spec: ir.Spec) -> int:
    """Values in the fixed tables the built model allocates beside its parameters."""
    e = spec.engine
    if e is None:
        return 0
    n = e.feed.context * e.feed.width if e.feed.position == "sinusoidal" else 0
    parts = list(ir.layout.layout(e).parts())
    ropes = ir.kinds.rotary_tables(p.node for p in parts)  # the planner's tables: one per distinct key
    held = sum(p.kind.buffers(p.node) * p.repeat for p in parts)  # an MoE's correction bias, ALiBi's slopes, ...
    # cos and sin, and a query temperature's column where the scaling has one
    tables = sum((2 * key[0] + bool(key[2] is not None and key[2].temperature)) * e.feed.context for key in ropes)
    return n + tables + held


def check_parameters(spec: ir.Spec, allow_large: bool = False, limit: int = MAX_PARAMETERS) -> int:
    """The parameter estimate; raises CycleError (E0219) when parameters and buffers together
    are above `limit` values, unless `allow_large`."""
    n = estimate_parameters(spec)
    b = estimate_buffers(spec)
    if n + b > limit and not allow_large:
        engine = spec.engine
        span = engine.span if engine is not None else spec.span
        what = f"about {n:,} parameters" + (f" and {b:,} values of fixed tables (positions, rotary)" if b else "")
        raise CycleError([Diagnostic("E0219", "error", f"engine '{engine.name}' would allocate {what}, above the limit of {limit:,} values", span,
                                     "pass --allow-large to build it anyway, or make it smaller (a shorter context shrinks the tables)")])
    return n
