"""Parameter counts for the diagram's labels, asked of the IR's kinds table (no torch).

A leaf (a norm, a turbine, the feed, the nozzle) counts what its kinds record says;
a branch, a fullflow, a stage (one repeat) and the engine add up their parts.
"""

from __future__ import annotations

from ... import ir
from ...ir.kinds import KINDS


def merge_count(merge, width: int, out_width: int) -> int:
    """A merge's own parameters (ReZero's scalar, LayerScale's gains, a gate's projection)."""
    return 0 if merge is None else ir.kinds.params(merge, out_width)


def count(node) -> int:
    """Trainable parameters of one IR node; a stage counts one repeat, a spec the whole engine."""
    if type(node) in KINDS:
        return ir.kinds.params(node, getattr(node, "width", 0))
    if isinstance(node, ir.Prechamber):
        return sum(count(op) for op in node.ops) + merge_count(node.merge, node.width, node.out_width)
    if isinstance(node, ir.Fullflow):
        return (count(node.norm) if node.norm else 0) + sum(count(b) for b in node.branches)
    if isinstance(node, ir.Stage):
        return sum(count(op) for op in node.ops)
    if isinstance(node, ir.Engine):
        return sum(p.params * p.repeat for p in ir.layout.layout(node).parts())
    if isinstance(node, ir.Spec):
        return count(node.engine) if node.engine else 0
    raise TypeError(f"no parameter count for {type(node).__name__}")


def human(n: int) -> str:
    """124,439,808 -> '124.4M'; small counts stay exact."""
    if n < 10_000:
        return f"{n:,}"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)  # pragma: no cover
