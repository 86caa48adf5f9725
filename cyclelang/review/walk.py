"""The reviewer's view of an engine: the IR layout's parts, and a few questions over them.

Parts come from `ir.layout` (one per operator, merge, the feed and the nozzle, in
source order, each with its canonical path, stage, branch, role and repeat);
repeated stages stay folded: a part of `stage block x 12` is one part with
`repeat=12` and a path `stages.0-11....`.
"""

from __future__ import annotations

from typing import Iterator

from .. import ir
from ..ir.kinds import ROLES, is_gated  # noqa: F401 - re-exported for the analyses
from ..ir.layout import Part


def parts(engine: ir.Engine) -> Iterator[Part]:
    return ir.layout.layout(engine).parts()


def stages(engine: ir.Engine) -> list[ir.Stage]:
    return [op for op in engine.body if isinstance(op, ir.Stage)]


def attentions(engine: ir.Engine) -> list[tuple[ir.Attention, int]]:
    """Every attention with how many times it runs per forward pass."""
    return [(p.node, p.repeat) for p in parts(engine) if isinstance(p.node, ir.Attention)]


def merges_into_main_line(engine: ir.Engine) -> int:
    return ir.passes.merge_totals(engine.body).merges


def is_dead(b: ir.Prechamber) -> bool:
    """An overboard branch that no loss reads: nothing it computes is ever used."""
    return b.overboard and not b.loss
