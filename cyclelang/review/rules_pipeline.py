"""The pipeline split's rule (W161): `cyclec check --pp N` weighs the split of `review.split`."""

from __future__ import annotations

from .. import ir
from ..diagnostics import Diagnostic
from .registry import ReviewConfig, _w, rule


# --- W161: a pipeline split with one piece well over the mean -----------------------------------


@rule("W161", "unbalanced pipeline split", """
With `--pp N` (`cyclec check --pp N`, `cyclec train --pp N`) the engine's stage instances are
split into N pieces that run one after another on N ranks, the feed with the first piece and
the nozzle with the last; the split is the one whose costliest piece is cheapest, by the
kinds table's FLOPs. Every rank waits for the slowest piece at every microbatch, so a piece
well over the mean (more than 1.3x) leaves the others idle for the difference: few, uneven
stage instances (a large nozzle beside a handful of blocks, a heavy attention layer among
light ones) cannot be split evenly at instance boundaries. Fewer pieces, more (smaller) stage
instances, or a cheaper nozzle even it out; `cyclec check --report --pp N` prints the split.""",
     "stage block x 4 {...}   # cyclec check --pp 4: the last piece also carries the nozzle")
def pipeline_imbalance(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    from . import split

    if cfg.pp <= 1:
        return []
    try:
        pieces = split.split(e, cfg.pp)
    except split.SplitError as why:
        return [_w("W161", f"--pp {cfg.pp}: {why}", e.span, f"use --pp {sum(u.stage is not None for u in split.units(e)[0])} or fewer")]
    ratio, worst = split.imbalance(pieces)
    if ratio <= split.IMBALANCE:
        return []
    mean = sum(p.flops for p in pieces) / len(pieces)
    return [_w("W161", f"--pp {cfg.pp}: piece {worst.index} costs {ratio:.2f}x the mean of the {cfg.pp} pieces "
                       f"({worst.flops:,} against {mean:,.0f} FLOPs per token)", e.span,
               "use fewer pipeline pieces or more, smaller stage instances; `cyclec check --report --pp N` prints the split",
               [f"piece {p.index}: {p.flops:,} FLOPs per token" for p in pieces])]
