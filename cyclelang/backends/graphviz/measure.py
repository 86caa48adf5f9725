"""The figure's sizes and its text measure: font sizes and gaps in points at the figure's
physical size, the density levels (`DENSITIES`), and how wide a string sets (`text_w`,
`wrap`, `Line`). `scene.Scene` lays out with them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


# --- sizes, in points at the figure's physical size --------------------------------------

TITLE, DETAIL, CAPTION, SMALL = 14, 12, 12, 12  # nothing is set under 12 pt
STAGE_TITLE, BADGE = 16, 30
GAP = 9.0  # along the line, between pieces
COL_GAP = 18.0  # across, from the main line to a branch column
PAD = 8.0  # inside a frame
LINE = 1.22  # line height / font size
MODES = ("ml", "both", "rocket")


@dataclass(frozen=True)
class Density:
    """How tightly a figure is set. The natural figure is level 0; a size preset that the
    figure does not fit tries the denser levels in turn (never under 12 pt):

    1. `compact`: a branch's name beside its first op when the column has room, a stage's
       parameter count under its name, boxes on the main line hung to the branch side (so
       nothing sticks out on the far side), the logits over the head (its link straight out of the head's top), norms on one line;
    2. also every title at 12 pt, tighter gaps and padding, at most 8 head or expert cells
       (the rest as "+k"), and no rocket caption under a part whose colour the legend
       already names in both vocabularies;
    3. also the legend's shortest words, the tokens and the logits each on one line, and an
       attention's title without "causal" (its mask glyph draws it);
    4. `tight` (a column's): the legend in two aligned columns in one vocabulary per label
       mode, 4 pt margins, the numbers under the title on one line, a branch's boxes as wide
       as the frame leaves them, smaller junctions and badges, a junction's note kept inside
       the frame (DeepNet's α beside its β), full flow's branches one after another where
       side by side they are wider than the preset (`Scene.fullflow_stacked`);
    5. `summary`: a stage that holds no stage itself drawn as one box on the main line, its
       parts on one line (`Scene.summary_block`; the graph view adds each part's parameter
       count under its words, the stage's under its name): inside a group of stages always, on
       the main line in the cycle view unless it holds a detached read, an overboard branch or
       a narrowing main line (`Scene.summarised`)."""

    title: int = TITLE
    stage_title: int = STAGE_TITLE
    badge: int = BADGE
    caption: int = CAPTION
    gap: float = GAP
    col_gap: float = COL_GAP
    pad: float = PAD
    box_w: float = 16.0  # a box's padding around its text, across and along
    box_h: float = 10.0
    compact: bool = False
    captions: bool = True
    cells: int = 12
    mask_cell: int = 6
    terse: bool = False  # level 3: the legend's shortest words; tokens and logits on one line; the mask glyph says "causal"
    tight: bool = False  # level 4: the legend in one vocabulary per label mode, headers on one row, the subtitle shorter
    summary: bool = False  # level 5: a stage holding no stage, on one line of its parts (see `Scene.summarised`)


_DENSE = dict(title=12, stage_title=13, badge=20, gap=6.0, col_gap=14.0, pad=6.0, box_w=10.0, box_h=6.0, compact=True, captions=False, cells=8,
              mask_cell=5)
DENSITIES = (
    Density(),
    Density(compact=True),
    Density(**_DENSE),
    Density(**{**_DENSE, "mask_cell": 4, "col_gap": 12.0, "pad": 5.0}, terse=True),
    Density(**{**_DENSE, "mask_cell": 4, "col_gap": 12.0, "pad": 4.0, "gap": 4.0, "box_h": 4.0, "badge": 16}, terse=True, tight=True),
    Density(**{**_DENSE, "mask_cell": 4, "col_gap": 12.0, "pad": 4.0, "gap": 4.0, "box_h": 4.0, "badge": 16}, terse=True, tight=True, summary=True),
)


_NARROW = set("iljtf.,:;'|!()[] \u00b7")
_WIDE = set("mwMW\u2192\u2016\u22ef")


@functools.lru_cache(maxsize=65536)  # a size preset lays a figure out many times over: the same words each time
def text_w(s: str, size: float, bold: bool = False) -> float:
    """About how wide Helvetica sets `s` (from its glyph widths, a little generous; a
    deterministic estimate, so the layout never depends on the machine's fonts)."""
    em = 0.0
    for ch in s:
        if ch in _NARROW:
            em += 0.28
        elif ch in _WIDE:
            em += 0.86
        elif ch.isupper():
            em += 0.69
        elif ch.isdigit():
            em += 0.56
        else:
            em += 0.55
    return em * size * (1.08 if bold else 1.03)


@dataclass
class Line:
    text: str
    size: int = DETAIL
    bold: bool = False
    italic: bool = False
    muted: bool = False
    tail: str = ""  # muted words after these, at 12 pt in the regular weight (the graph view's parameter count, dense)


def wrap(s: str, size: int, bold: bool, width: float) -> list[str]:
    """Break at ' · ', then at spaces, so that no line is wider than `width`."""
    if text_w(s, size, bold) <= width:
        return [s]
    for sep in (" \u00b7 ", ", ", " "):
        parts = s.split(sep)
        if len(parts) == 1:
            continue
        out, cur = [], ""
        for p in parts:
            nxt = f"{cur}{sep}{p}" if cur else p
            if cur and text_w(nxt, size, bold) > width:
                out.append(cur)
                cur = p
            else:
                cur = nxt
        out.append(cur)
        if all(text_w(x, size, bold) <= width for x in out) or sep == " ":
            return out
    return [s]


def wrapped(lines: list[Line], width: float) -> list[Line]:
    out = []
    for ln in lines:
        parts = wrap(ln.text, ln.size, ln.bold, width)
        out += [Line(t, ln.size, ln.bold, ln.italic, ln.muted, ln.tail if i == len(parts) - 1 else "") for i, t in enumerate(parts)]
    return out


def line_w(ln: Line) -> float:
    return text_w(ln.text, ln.size, ln.bold) + (text_w(ln.tail, DETAIL) if ln.tail else 0.0)


def lines_size(lines: list[Line]) -> tuple[float, float]:
    if not lines:
        return 0.0, 0.0
    return max(line_w(x) for x in lines), sum(x.size * LINE for x in lines)
