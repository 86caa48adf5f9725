"""One walk over an engine, shared by the rules and the analyses.

The walk flattens the folded IR into *parts*: one per operator that owns
parameters or does work, in source order, each with the stage it sits in, the
branch (if any), its role and how many times it repeats. Repeated stages stay
folded: a part of `stage block x 12` is one part with `repeat=12`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .. import ir

# The roles of the analyses: mixers let positions interact (the injector),
# reactors work on each position alone (combustion).
ROLES = ("feed", "mixer", "reactor", "valve", "linear", "merge", "nozzle")
ROLE_OF_OP = {"attention": "mixer", "pool": "mixer", "mlp": "reactor", "moe": "reactor", "norm": "valve", "linear": "linear"}

GATED = ("swiglu", "geglu")


@dataclass(frozen=True)
class Part:
    """An operator (or a merge, the feed, the nozzle) at one place in the engine."""

    group: str  # parameter group: "feed", "block.mix", "layer.norm1", "main.norm0", "nozzle"
    stage: str  # the stage's name; "feed", "main" (engine-level ops) or "nozzle"
    stage_index: int  # position of the stage on the main line (feed -1, nozzle len(body))
    repeat: int
    role: str
    node: object  # the IR node: an op, a merge, the feed or the nozzle
    branch: ir.Prechamber | None = None
    fullflow: ir.Fullflow | None = None


def is_gated(act: str) -> bool:
    return act in GATED


def parts(engine: ir.Engine) -> Iterator[Part]:
    yield Part("feed", "feed", -1, 1, "feed", engine.feed)
    main_count: dict[str, int] = {}
    for i, op in enumerate(engine.body):
        if isinstance(op, ir.Stage):
            yield from _stage_parts(op, i)
        else:
            k = main_count.get(op.op, 0)
            main_count[op.op] = k + 1
            yield Part(f"main.{op.op}{k}", "main", i, 1, ROLE_OF_OP[op.op], op)
    yield Part("nozzle", "nozzle", len(engine.body), 1, "nozzle", engine.nozzle)


def _stage_parts(stage: ir.Stage, index: int) -> Iterator[Part]:
    count: dict[str, int] = {}
    for op in stage.ops:
        if isinstance(op, ir.Prechamber):
            yield from _branch_parts(stage, index, op, None, f"{stage.name}.{op.name}")
        elif isinstance(op, ir.Fullflow):
            if op.norm is not None:
                yield Part(f"{stage.name}.{op.name}.norm", stage.name, index, stage.repeat, "valve", op.norm, None, op)
            for b in op.branches:
                yield from _branch_parts(stage, index, b, op, f"{stage.name}.{b.name}")
        else:
            k = count.get(op.op, 0)
            count[op.op] = k + 1
            yield Part(f"{stage.name}.{op.op}{k}", stage.name, index, stage.repeat, ROLE_OF_OP[op.op], op)


def _branch_parts(stage: ir.Stage, index: int, b: ir.Prechamber, ff: ir.Fullflow | None, group: str) -> Iterator[Part]:
    for op in b.ops:
        yield Part(group, stage.name, index, stage.repeat, ROLE_OF_OP[op.op], op, b, ff)
    if b.merge is not None:
        yield Part(group, stage.name, index, stage.repeat, "merge", b.merge, b, ff)


def stages(engine: ir.Engine) -> list[ir.Stage]:
    return [op for op in engine.body if isinstance(op, ir.Stage)]


def attentions(engine: ir.Engine) -> list[tuple[ir.Attention, int]]:
    """Every attention with how many times it runs per forward pass."""
    return [(p.node, p.repeat) for p in parts(engine) if isinstance(p.node, ir.Attention)]


def merges_into_main_line(engine: ir.Engine) -> int:
    return sum(s.repeat * sum(1 for b in ir.stage_branches(s) if not b.overboard) for s in stages(engine))


def is_dead(b: ir.Prechamber) -> bool:
    """An overboard branch that no loss reads: nothing it computes is ever used."""
    return b.overboard and not b.loss
