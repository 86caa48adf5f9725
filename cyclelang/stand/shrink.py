"""The stand's scale model: `ir.passes.shrink`, with its failures as diagnostics."""

from __future__ import annotations

from .. import ir
from ..diagnostics import CycleError, Diagnostic
from ..ir.passes import MIN_WIDTH, ShrinkError

__all__ = ["shrink", "MIN_WIDTH"]


def shrink(spec: ir.Spec, width: int | None = None, depth: int | None = None, **sizes) -> ir.Spec:
    """`ir.passes.shrink` (sizes: its vocab=, context=, heads=); a scale model that cannot be made is a CycleError."""
    try:
        return ir.passes.shrink(spec, width=width, depth=depth, **sizes)
    except ShrinkError as e:
        span = spec.span if e.code == "E0213" else None
        raise CycleError([Diagnostic(e.code, "error", e.message, span, e.help)]) from None
