"""The figure's primitives in flow coordinates (`Box`, `Wire`, `Frame`, a `Block` of them) and
the packing's arithmetic (`balanced` columns, the readings' `log_scale`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .measure import Line


# --- primitives --------------------------------------------------------------------------


@dataclass
class Box:
    """A node: a part, a glyph or a piece of text. (u, v) is its centre; w, h its size on
    the page (points). `words` holds its lines per label mode."""

    id: str
    u: float
    v: float
    w: float
    h: float
    shape: str  # box | rounded | cylinder | trapezium | circle | point | text
    key: str  # the style and legend key ("attention", "norm", "junction", ...)
    words: dict[str, list[Line]] = field(default_factory=dict)
    fill: str = ""
    color: str = ""
    pen: float = 1.2
    dashed: bool = False
    path: str = ""  # the layout path it stands for
    tooltip: str = ""
    html: str = ""  # an extra HTML row under the words (glyphs)
    font: int = 0  # for a one-glyph box (the junction's "+")
    flip: bool = False  # a nozzle: the trapezium's narrow end towards the logits
    main: bool = False  # on the main line, though hung to the branch side (the line is not drawn through it)
    htmls: dict[str, str] = field(default_factory=dict)  # a whole HTML-table label per label mode (a summarised stage)


@dataclass
class Wire:
    """A polyline in (u, v). kind: main | branch | cut | vent | spark | link."""

    id: str
    pts: list[tuple[float, float]]
    kind: str
    width: float = 1.0  # the chamber's width there (main), else 0
    path: str = ""
    arrow: bool = False
    dashed: bool = False
    dotted: bool = False
    value: float | None = None  # an annotate reading
    table: str = ""  # which readings table the value came from


@dataclass
class Frame:
    id: str
    u0: float
    v0: float
    u1: float
    v1: float
    key: str  # stage | stage_instance | elided | summary (not drawn: where a stage drawn as one box sits, for its readings)
    path: str = ""
    depth: int = 0


@dataclass
class Block:
    """One top-level piece of the main line in local coordinates (u from 0 to `length`)."""

    length: float = 0.0
    neg: float = 0.0  # across extent on the title side
    pos: float = 0.0  # across extent on the branch side
    boxes: list[Box] = field(default_factory=list)
    wires: list[Wire] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    ends: tuple[str, str] = ("", "")  # ids of the main line's points at u=0 and u=length (for wiring)
    width_in: int = 0
    width_out: int = 0
    path: str = ""

    def shifted(self, du: float, dv: float) -> "Block":
        b = Block(self.length, self.neg, self.pos, width_in=self.width_in, width_out=self.width_out, path=self.path)
        b.boxes = [Box(**{**x.__dict__, "u": x.u + du, "v": x.v + dv}) for x in self.boxes]
        b.wires = [Wire(**{**w.__dict__, "pts": [(u + du, v + dv) for u, v in w.pts]}) for w in self.wires]
        b.frames = [Frame(f.id, f.u0 + du, f.v0 + dv, f.u1 + du, f.v1 + dv, f.key, f.path, f.depth) for f in self.frames]
        return b


def balanced(lengths: list[float], k: int) -> float | None:
    """The shortest column length into which blocks of these lengths pack, in order and
    greedily as `Scene.pack` does, in at most k columns (None: fewer than k+1 blocks, or one
    column already). A column's length is a sum of consecutive blocks, so it is one of those."""
    def columns(cap: float) -> int:
        n, total = 1, 0.0
        for x in lengths:
            if total and total + x > cap:
                n, total = n + 1, 0.0
            total += x
        return n

    if k < 2 or len(lengths) < k:
        return None
    sums = sorted({sum(lengths[i:j]) for i in range(len(lengths)) for j in range(i + 1, len(lengths) + 1)})
    for cap in sums:
        if cap >= max(lengths) and columns(cap + 1e-6) <= k:
            return cap + 1e-6
    return None


def log_scale(values) -> tuple[float, float]:
    """Decades that hold every positive value: the absolute scale of an annotated figure."""
    pos = [v for v in values if v and v > 0]
    if not pos:
        return 1e-3, 1.0
    lo, hi = math.floor(math.log10(min(pos))), math.ceil(math.log10(max(pos)))
    if hi == lo:
        hi += 1
    return 10.0 ** lo, 10.0 ** hi
