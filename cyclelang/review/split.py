"""The pipeline split of an engine: which stage instances each pipeline piece runs.

`cyclec train --pp N` runs an engine as N pieces in a row (N x V with interleaved virtual
stages), one after the other on the ranks of the pipeline; `cyclec check --report --pp N`
prints the split and the reviewer warns (W161) when one piece costs well over the mean.

The units a split moves are the engine's stage instances in the order they run
(`ir.layout.Layout.layers()`: a nested stage splits at the instances of the stages of ops
inside it, `stages.1.stages.0.stages.1`) and its main-line ops (the final norm). The feed
goes with the first piece, the nozzle and the loss with the last. A unit's cost is its
forward FLOPs per token at the context length, and its parameters, asked of the kinds table
through `report.part_flops` / `report.part_params` (one instance of each part of its stage);
the split is the contiguous one whose most expensive piece is cheapest (each piece holds at
least one stage instance), found by dynamic programming over the units.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from .report import _si, part_flops, part_params

IMBALANCE = 1.3  # a piece over this times the mean cost is worth a warning


@dataclass
class Unit:
    path: str  # instance path in the built model ("stages.3", "stages.1.stages.0.stages.1", "norm")
    flops: int  # forward FLOPs per token at the context length
    params: int
    stage: str | None  # the stage's name; None for a main-line op


@dataclass
class Piece:
    index: int
    units: list[Unit] = field(default_factory=list)
    feed: bool = False
    nozzle: bool = False
    flops: int = 0
    params: int = 0

    @property
    def stage_units(self) -> list[Unit]:
        return [u for u in self.units if u.stage is not None]


class SplitError(ValueError):
    """The engine cannot be split into that many pieces (the reason in the message)."""


def units(engine: ir.Engine) -> tuple[list[Unit], tuple[int, int], tuple[int, int]]:
    """(the units in the order they run, (feed flops, params), (nozzle flops, params))."""
    lay = ir.layout.layout(engine)
    n = engine.feed.context
    by_stage: dict[str, list] = {}
    for p in lay.parts():
        by_stage.setdefault(p.spath, []).append(p)

    def cost(ps) -> tuple[int, int]:
        return sum(sum(part_flops(p, n)) for p in ps), sum(part_params(p) for p in ps)

    out: list[Unit] = []

    def walk(sl, prefix: str) -> None:
        for r in range(sl.stage.repeat):
            here = f"{prefix}stages.{sl.first + r}"
            if sl.children:
                for c in sl.children:
                    walk(c, here + ".")
            else:
                f, c = cost(by_stage.get(sl.path, []))
                out.append(Unit(here, f, c, sl.stage.name))

    for it in lay.main:
        if isinstance(it, ir.layout.Part):
            f, c = cost([it])
            out.append(Unit(it.path, f, c, None))
        else:
            walk(it, "")
    return out, cost([lay.feed]), cost([lay.nozzle])


def split(engine: ir.Engine, pieces: int) -> list[Piece]:
    """The engine's units in `pieces` contiguous pieces, the costliest piece as cheap as it can be."""
    us, (ff, fp), (nf, np_) = units(engine)
    layers = sum(u.stage is not None for u in us)
    if pieces < 1:
        raise SplitError(f"a pipeline needs at least 1 piece, not {pieces}")
    if layers < pieces:
        raise SplitError(f"{engine.name} runs {layers} stage instance{'s' if layers != 1 else ''}, fewer than the "
                         f"{pieces} pipeline pieces asked: every piece needs one at least")
    cost = [u.flops for u in us]
    is_stage = [u.stage is not None for u in us]
    U = len(us)
    pre = [0]
    for c in cost:
        pre.append(pre[-1] + c)
    layers_pre = [0]
    for s in is_stage:
        layers_pre.append(layers_pre[-1] + s)
    INF = (float("inf"), float("inf"))
    # best[k][j]: (the costliest piece, the sum of the pieces' squared costs), least first, when
    # units[:j] make k pieces: the slowest piece as fast as it can be, then the others as even
    best = [[INF] * (U + 1) for _ in range(pieces + 1)]
    cut = [[0] * (U + 1) for _ in range(pieces + 1)]
    best[0][0] = (0, 0)
    for k in range(1, pieces + 1):
        for j in range(1, U + 1):
            for i in range(k - 1, j):
                if best[k - 1][i] == INF or layers_pre[j] == layers_pre[i]:
                    continue
                c = pre[j] - pre[i] + (ff if i == 0 else 0) + (nf if j == U else 0)
                v = (max(best[k - 1][i][0], c), best[k - 1][i][1] + c * c)
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    bounds = []
    j = U
    for k in range(pieces, 0, -1):
        i = cut[k][j]
        bounds.append((i, j))
        j = i
    out = []
    for idx, (i, j) in enumerate(reversed(bounds)):
        p = Piece(idx, us[i:j], feed=idx == 0, nozzle=idx == pieces - 1)
        p.flops = sum(u.flops for u in p.units) + (ff if p.feed else 0) + (nf if p.nozzle else 0)
        p.params = sum(u.params for u in p.units) + (fp if p.feed else 0) + (np_ if p.nozzle else 0)
        out.append(p)
    return out


def imbalance(pieces: list[Piece]) -> tuple[float, Piece]:
    """(the costliest piece's FLOPs over the mean, that piece)."""
    mean = sum(p.flops for p in pieces) / len(pieces)
    worst = max(pieces, key=lambda p: p.flops)
    return (worst.flops / mean if mean else 1.0), worst


def _ranges(paths: list[str]) -> str:
    """stages.0, stages.1, stages.2 -> stages.0-2 (consecutive top-level indices folded)."""
    out: list[str] = []
    run: list[int] = []
    prefix = None

    def flush():
        if run:
            out.append(f"{prefix}{run[0]}" if len(run) == 1 else f"{prefix}{run[0]}-{run[-1]}")

    for p in paths:
        head, _, last = p.rpartition(".")
        if last.isdigit() and head and prefix == head + "." and run and int(last) == run[-1] + 1:
            run.append(int(last))
            continue
        flush()
        run = [int(last)] if last.isdigit() and head else []
        prefix = head + "." if run else None
        if not run:
            out.append(p)
    flush()
    return ", ".join(out)


def as_json(pieces: list[Piece]) -> dict:
    ratio, worst = imbalance(pieces)
    return {"pieces": [{"index": p.index, "units": [u.path for u in p.units], "feed": p.feed, "nozzle": p.nozzle,
                        "params": p.params, "flops_per_token": p.flops} for p in pieces],
            "worst_over_mean": round(ratio, 4)}


def render_text(engine: ir.Engine, pieces: list[Piece]) -> str:
    ratio, worst = imbalance(pieces)
    out = [f"Pipeline split of {engine.name} into {len(pieces)} pieces (forward FLOPs per token at n={engine.feed.context})",
           f"  {'piece':<7}{'parameters':>14}{'FLOPs/token':>14}{'x mean':>8}  stage instances"]
    mean = sum(p.flops for p in pieces) / len(pieces)
    for p in pieces:
        what = _ranges([u.path for u in p.units])
        what = ("feed, " if p.feed else "") + what + (", nozzle + loss" if p.nozzle else "")
        out.append(f"  {p.index:<7}{p.params:>14,}{_si(p.flops):>14}{(p.flops / mean if mean else 1):>8.2f}  {what}")
    out.append(f"  the costliest piece ({worst.index}) is {ratio:.2f}x the mean" +
               (f" (over {IMBALANCE}x: see W161)" if ratio > IMBALANCE else ""))
    return "\n".join(out) + "\n"
