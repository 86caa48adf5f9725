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
    """Every stage of ops in source order, its `repeat` the number of times it runs: a stage
    nested in groups has their repeats multiplied in, so a rule that counts layers counts the
    flattened total (the stage a rule names keeps its span)."""
    return [st if n == st.repeat else st.model_copy(update={"repeat": n}) for st, n in ir.leaf_stages(engine.body)]


def groups(engine: ir.Engine) -> list[ir.Stage]:
    """Every stage of stages (a nested stage), outermost first."""
    return [v.stage for v in ir.walk(engine.body) if v.stage.is_group]


def merges_into_main_line(engine: ir.Engine) -> int:
    return ir.passes.merge_totals(engine.body).merges


def is_dead(b: ir.Prechamber) -> bool:
    """An overboard branch that no loss reads: nothing it computes is ever used."""
    return b.overboard and not b.loss
