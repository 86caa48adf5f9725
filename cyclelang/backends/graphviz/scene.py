"""A layout of our own: every position computed from the IR's layout, then pinned.

The picture is built in flow coordinates: `u` runs along the main line (tokens at
u=0, logits at the end) and `v` across it (the main line is v=0, branches at v>0,
titles never cross it). `Scene.place` maps (u, v) to the page: top-to-bottom puts the
tokens at the bottom and the logits at the top (the classic figure), left-to-right
puts them left and right. Every box's size is the largest its text needs in any label
mode, so `--labels` switches only the words, never the layout.

Pieces of a figure, in order along the main line:

    tokens, embedding             the feed (tanks and pumps)
    a stage                        one frame, however many times it repeats: a large ×N
                                   badge in its header, never split across columns
    a series op                    a box on the main line (a Post-LN norm, a linear)
    a branch                       split dot on the main line, its ops in a column
                                   beside it, a junction where it returns; a detached
                                   read is a cut ("no gradient"); an overboard branch
                                   ends in a dump nozzle outside the frame
    head, logits                   the nozzle

A tall engine wraps into columns between top-level pieces (never inside a stage); the
main line runs from one column's top over to the next column's bottom in the gap
between them. A nested stage (a stage among a stage's ops) is a frame inside the frame.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field, replace

from ... import ir
from ...ir.layout import BranchLayout, FullflowLayout, Part, StageLayout
from . import params, text
from .style import esc, kind_style

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


class Scene:
    """The whole figure: boxes, wires and frames in flow coordinates, plus what the legend needs."""

    def __init__(self, engine: ir.Engine, *, view: str, rankdir: str, expand: bool, wrap_w: float, max_along: float | None,
                 readings=None, scale: tuple[float, float] = (1e-3, 10.0), id_prefix: str = "", density: int = 0, ink: dict | None = None,
                 room: float | None = None):
        self.e, self.view, self.rankdir, self.expand = engine, view, rankdir, expand
        self.level, self.d = density, DENSITIES[density]
        from .style import THEMES

        self.ink = ink or THEMES["light"]
        self.wrap_w, self.max_along, self.readings, self.pre = wrap_w, max_along, readings, id_prefix
        # `room`: the preset's width across the main line. The densest level sets words as wide as
        # it allows (fewer lines): a box on the main line hangs to the branch side, a branch's op
        # sits in the column beside the line.
        self.room = room
        self.main_wrap = self.op_wrap = wrap_w
        if room is not None and not self.d.captions:
            self.main_wrap = max(wrap_w, min(room - self.d.box_w - 30, 200.0))
            self.op_wrap = max(wrap_w, min(room - 2 * (6 + self.d.pad) - self.d.col_gap - self.d.box_w - 4, 180.0))
            if self.d.tight:  # a branch's box as wide as the frame leaves it
                self.op_wrap = max(wrap_w, min(room - (6 + 2 * self.d.pad) - self.d.col_gap - self.d.box_w - 4, 190.0))
        self.readings_scale = scale
        self.col_len = 0.0
        self.lay = ir.layout.layout(engine)
        self.used: set[str] = set()
        self.shapes: dict[str, str] = {"split": "point"}  # each legend key's shape, as drawn
        self.boxes: list[Box] = []
        self.wires: list[Wire] = []
        self.frames: list[Frame] = []
        self.max_width = max([engine.width] + [p.width for p in self.lay.parts()])
        hyper = ir.chamber_streams(engine.body)  # hyper-connections: the stages' chamber is several, drawn side by side
        self.streams = hyper.streams if hyper is not None else 1
        self.n = 0
        self.build()

    # -- orientation: a box's extent along and across the main line ----------------------

    @property
    def tb(self) -> bool:
        return self.rankdir in ("TB", "BT")

    def along(self, b: Box) -> float:
        return b.h if self.tb else b.w

    def across(self, b: Box) -> float:
        return b.w if self.tb else b.h

    def nid(self, base: str) -> str:
        self.n += 1
        return f"{self.pre}{base}#{self.n}"

    # -- boxes ------------------------------------------------------------------------------

    def box(self, base: str, key: str, words: dict[str, list[Line]], shape: str = "rounded", path: str = "", min_w: float = 0.0,
            glyph_h: float = 0.0, glyph_w: float = 0.0, wrap_w: float | None = None, **kw) -> Box:
        """A box sized for the widest of its label modes (wrapped to the preset's width, or to
        its glyph's, which sets the box's width anyway)."""
        words = {m: wrapped(words[m], max(wrap_w or self.wrap_w, glyph_w)) for m in MODES}
        sizes = [lines_size(words[m]) for m in MODES]
        w = max([s[0] for s in sizes] + [glyph_w, min_w]) + self.d.box_w
        h = max(s[1] for s in sizes) + glyph_h + self.d.box_h
        if shape == "trapezium":
            w += 24
        if shape == "cylinder":
            h += 12
        self.used.add(key)
        self.shapes.setdefault(key, shape)
        return Box(self.nid(base), 0.0, 0.0, round(w, 1), round(h, 1), shape, key, words, path=path, **kw)

    def part_box(self, p: Part, on_branch: bool, grow: bool = True) -> Box:
        """A part's box. `grow`: top-to-bottom, a dense graph view may widen a norm to set its
        parameter count on its one line (the count costs nothing along the line)."""
        kind = p.kind
        ml_title, ml_detail, rocket_title, rocket_detail = text.part_words(p.node, on_branch)
        if self.d.terse and isinstance(p.node, (ir.Attention, ir.LatentAttention, ir.LinearAttention)):  # the mask glyph below draws it
            ml_title = ml_title.rsplit(text.DOT, 1)[0]
        glyph, gw, gh = text.glyph(p.node, self.ink, self.d.cells, self.d.mask_cell, self.d.tight)
        width = max(self.op_wrap if on_branch else self.main_wrap, gw)
        title = [Line(ml_title, self.d.title, bold=True)]
        words = {"ml": title + ([Line(ml_detail)] if ml_detail else []), "both": title + ([Line(ml_detail)] if ml_detail else []),
                 "rocket": [Line(rocket_title, self.d.title, bold=True)] + ([Line(rocket_detail)] if rocket_detail else [])}
        caps = {"ml": [], "both": self.cap(rocket_title), "rocket": []}
        if isinstance(p.node, ir.Norm):  # a norm says what it is in one line: where it sits is drawn
            words = {"ml": title, "both": title, "rocket": [Line(f"valve \u00b7 {ml_title}" if self.d.captions else ml_title, self.d.title, bold=True)]}
            caps = None
        words = self.counted(words, p.params, width, caps, least=gw, grow=grow and self.tb and isinstance(p.node, ir.Norm))
        key = kind_style(kind.attr)[0]
        one_line = self.d.compact and isinstance(p.node, ir.Norm)  # "valve · LayerNorm" on one line
        b = self.box(kind.attr or "op", key, words, path=p.path, glyph_h=gh, glyph_w=gw, html=glyph,
                     wrap_w=1e9 if one_line else (self.op_wrap if on_branch else self.main_wrap),
                     tooltip=f"{p.path} \u00b7 line {p.node.span.line}" if getattr(p.node, "span", None) else p.path)
        for k in text.glyph_keys(p.node):
            self.used.add(k)
        return b

    def counted(self, words: dict[str, list[Line]], n: int, width: float, caps: dict[str, list[Line]] | None = None, least: float = 0.0,
                grow: bool = False) -> dict[str, list[Line]]:
        """A part's words in each label mode with, in the graph view, its parameter count under
        them, then its caption (`caps`). A dense figure (no captions) sets the count after the words
        of the last line with room for it (one line less along the line) where the box, `least` wide
        at the least (its glyph), is no wider for it in any mode, or, with `grow` (a norm, whose one
        word leaves its box narrow; top-to-bottom, the embedding), where that line fits `width`."""
        caps = caps or {m: [] for m in MODES}
        words = {m: wrapped(words[m], width) for m in MODES}
        if self.view == "graph" and n:
            count = f"{params.human(n)} params"
            widest = max([least] + [line_w(x) for m in MODES for x in words[m] + caps[m]])
            for m, lines in words.items():
                fits = [i for i, x in enumerate(lines) if x.text and not x.tail and line_w(replace(x, tail=text.DOT + count)) <= (width if grow else widest)]
                if not self.d.captions and fits:  # after the last line that has room for it
                    i = fits[-1]
                    words[m] = lines[:i] + [replace(lines[i], tail=text.DOT + count)] + lines[i + 1:]
                else:
                    words[m] = lines + [Line(count, SMALL, muted=True)]
        return {m: words[m] + caps[m] for m in MODES}

    def branch_titles(self, br) -> dict[str, str]:
        """A branch's name in each label mode; the densest level drops "prechamber", which the
        legend's branch line says in both vocabularies."""
        names = text.branch_titles(br)
        return names if self.d.captions else {m: names["ml"] for m in MODES}

    def cap(self, s: str) -> list[Line]:
        """The rocket word as an italic caption under the network words (`--labels both`); the
        densest level leaves it to the legend, which names every colour in both vocabularies."""
        return [Line(s, self.d.caption, italic=True, muted=True)] if self.d.captions else []

    def point(self, base: str, path: str = "") -> Box:
        self.used.add("split")
        return Box(self.nid(base), 0, 0, 7, 7, "point", "split", path=path)

    def junction(self, merge, path: str) -> Box:
        k = ir.kinds.kind_of(merge) if merge is not None else ir.kinds.KINDS[ir.PlainMerge]
        key = f"merge_{k.keyword}"
        self.used.add(key)
        side = 16 if self.d.tight else 22
        return Box(self.nid("add"), 0, 0, side, side, "circle", key, {m: [] for m in MODES}, path=path, font=13 if self.d.tight else 16,
                   tooltip=f"{path}: {k.formula}")

    def tag(self, base: str, s: str, *, italic: bool = False, muted: bool = True, key: str = "text", size: int = SMALL, bold: bool = False) -> Box:
        words = {m: [Line(s, size, bold=bold, italic=italic, muted=muted)] for m in MODES}
        return self.tagw(base, words, key)

    def tagw(self, base: str, words: dict[str, list[Line]], key: str = "text") -> Box:
        words = {m: wrapped(words[m], self.wrap_w + 40) for m in MODES}
        sizes = [lines_size(words[m]) for m in MODES]
        return Box(self.nid(base), 0, 0, round(max(s[0] for s in sizes) + 6, 1), round(max(s[1] for s in sizes) + 4, 1), "text", key, words)

    # -- the engine -------------------------------------------------------------------------

    def build(self) -> None:
        e = self.e
        blocks: list[Block] = [self.feed_block()]
        for it in self.lay.main:
            if isinstance(it, StageLayout):
                blocks += self.stage_blocks(it)
            else:
                blocks.append(self.series_block(it, True))
        blocks.append(self.nozzle_block())
        self.blocks, self.built_n = blocks, self.n
        self.pack(blocks)
        if self.readings is not None:
            self.apply_readings()

    def repacked(self, max_along: float | None) -> "Scene":
        """The same scene, its main line wrapped at `max_along`: the blocks are packed again, not
        built again (a size preset tries several wraps of one layout)."""
        s = copy.copy(self)
        s.max_along, s.n = max_along, self.built_n
        s.boxes, s.wires, s.frames, s.col_len = [], [], [], 0.0
        s.pack(self.blocks)
        if s.readings is not None:
            s.apply_readings()
        return s

    def feed_block(self) -> Block:
        f = self.e.feed
        b = Block(width_in=f.width, width_out=f.width, path="feed")
        if self.d.terse:  # one line of words where the main line starts
            tok = self.tagw("tokens", {"ml": [Line("tokens", self.d.title, True)], "both": [Line("tokens \u00b7 tanks", self.d.title, True)],
                                       "rocket": [Line("tanks", self.d.title, True)]}, key="tokens_text")
        else:
            tok = self.box("tokens", "tokens", {"ml": [Line("tokens", self.d.title, True)], "both": [Line("tokens", self.d.title, True), *self.cap("tanks")],
                                              "rocket": [Line("tanks", self.d.title, True)]}, shape="cylinder", path="feed", min_w=70)
        emb = self.box("embed", "feed", self.end_words(f, self.lay.feed.params, grow=self.tb), path="feed", wrap_w=self.main_wrap)
        u = 0.0
        tok.u = self.along(tok) / 2
        u = self.along(tok) + self.d.gap
        emb.u = u + self.along(emb) / 2
        u += self.along(emb)
        b.boxes += [tok, emb]
        self.main_wire(b, [(self.along(tok), 0), (u - self.along(emb), 0)], f.width, "feed", arrow=True)
        b.length = u
        b.neg = b.pos = max(self.across(tok), self.across(emb)) / 2
        self.hang(b, [tok, emb])
        if self.view == "graph":
            self.shape_tag(b, u + 2, f.width)
            self.main_wire(b, [(u, 0), (b.length, 0)], f.width, "feed")
        return b

    def end_words(self, node, n: int, grow: bool = False) -> dict[str, list[Line]]:
        """The embedding's or the head's words in each label mode: its title, its detail if it
        has one, its parameter count (graph view) and the rocket caption."""
        ml_t, ml_d, r_t, r_d = text.part_words(node, False)

        def lines(title: str, detail: str) -> list[Line]:
            return [Line(title, self.d.title, True)] + ([Line(detail)] if detail else [])

        return self.counted({"ml": lines(ml_t, ml_d), "both": lines(ml_t, ml_d), "rocket": lines(r_t, r_d)}, n, self.main_wrap,
                            {"ml": [], "both": self.cap(r_t), "rocket": []}, grow=grow)

    def nozzle_block(self) -> Block:
        z = self.e.nozzle
        b = Block(width_in=z.width, width_out=z.vocab, path="head")
        head = self.box("head", "head", self.end_words(z, self.lay.nozzle.params), shape="trapezium", path="head", flip=True, wrap_w=self.main_wrap)
        th = text.throat(self.e.throat)
        if self.d.terse:
            logits = self.tagw("logits", {"ml": [Line(f"logits{text.DOT}{th.ml}", self.d.title, True)],
                                          "both": [Line(f"logits{text.DOT}{th.ml}", self.d.title, True)],
                                          "rocket": [Line(f"exhaust{text.DOT}{th.rocket}", self.d.title, True)]}, key="logits")
        else:
            logits = self.box("logits", "logits", {"ml": [Line("logits", self.d.title, True), Line(th.ml)],
                                                   "both": [Line("logits", self.d.title, True), Line(th.ml), *self.cap(th.rocket)],
                                                   "rocket": [Line("exhaust", self.d.title, True), Line(th.rocket)]}, shape="text", path="head")
        if self.view == "graph" and self.d.compact:  # dense: the logits' shape under their name, off the link's path
            for m in MODES:
                logits.words[m] = logits.words[m] + [Line(text.shape("B", "T", f"{z.vocab:,}"), SMALL, muted=True)]
            logits.h += SMALL * LINE
            logits.w = max(logits.w, text_w(text.shape("B", "T", f"{z.vocab:,}"), SMALL) + 6)
        u = self.d.gap
        head.u = u + self.along(head) / 2
        u += self.along(head)
        self.main_wire(b, [(0, 0), (u - self.along(head), 0)], z.width, "head", arrow=True)
        head_end = u
        if self.view == "graph" and not self.d.compact:
            self.shape_tag(b, u + 2, z.vocab)
            u = b.length
        b.boxes += [head, logits]
        u += self.d.gap
        logits.u = u + self.along(logits) / 2
        self.hang(b, [head])
        logits.v = head.v  # over the head's middle, and the link with it
        self.hang(b, [])  # the block's extents, the logits now in place
        self.main_wire(b, [(head_end, head.v), (u, head.v)], 0, "head", arrow=True, kind="link")
        u += self.along(logits)
        b.length = u
        if not self.d.compact:
            b.neg = b.pos = max(self.across(head), self.across(logits)) / 2
        else:
            b.pos = max(b.pos, logits.v + self.across(logits) / 2)
        return b

    def shape_tag(self, b: Block, u: float, width: int) -> None:
        """The graph view writes a tensor shape beside the main line where its width changes
        (on the title side, in length of its own, so it meets no frame and no branch)."""
        t = self.tag("shape", text.shape("B", "T", f"{width:,}"))
        t.u, t.v = u + self.along(t) / 2, -(6 + self.across(t) / 2)
        if self.d.compact:  # dense: on the branch side, where nothing else is at this height
            t.v = -t.v
        b.boxes.append(t)
        b.neg = max(b.neg, 6 + self.across(t)) if not self.d.compact else b.neg
        b.pos = max(b.pos, t.v + self.across(t) / 2)
        b.length = max(b.length, u + self.along(t) + 2)

    def main_wire(self, b: Block, pts, width: int, path: str, arrow: bool = False, kind: str = "main", table: str = "") -> Wire:
        w = Wire(self.nid("line"), [(float(u), float(v)) for u, v in pts], kind, width, path, arrow=arrow, table=table)
        b.wires.append(w)
        self.used.add(kind if kind != "link" else "main")
        if self.streams > 1 and kind == "main" and path.startswith("stages"):
            self.used.add("streams")
        return w

    def hang(self, b: Block, boxes: list[Box]) -> None:
        """Dense: hang boxes that sit on the main line to the branch side, so that no box
        sticks out past a frame's edge on the far side; the line still runs straight into them."""
        if not self.d.compact:
            return
        edge = 6 + self.d.pad
        for x in boxes:
            x.v += max(0.0, self.across(x) / 2 - edge)
            x.main = True
        b.neg = max([6.0] + [-(x.v - self.across(x) / 2) for x in b.boxes])
        b.pos = max([b.pos] + [x.v + self.across(x) / 2 for x in b.boxes])

    def series_block(self, p: Part, top: bool) -> Block:
        """A part on the main line, in its own block (top level) or inline in a stage."""
        b = Block(width_in=p.width, width_out=ir.out_width(p.node, p.width), path=p.path)
        bx = self.part_box(p, False)
        bx.u = self.d.gap + self.along(bx) / 2
        b.boxes.append(bx)
        self.main_wire(b, [(0, 0), (self.d.gap, 0)], p.width, p.path, arrow=True, table="chain")
        b.length = self.d.gap + self.along(bx)
        b.neg = b.pos = self.across(bx) / 2
        self.hang(b, [bx])
        out = b.width_out
        if self.view == "graph" and out != p.width:
            end = b.length
            self.shape_tag(b, end + 2, out)
            self.main_wire(b, [(end, 0), (b.length, 0)], out, p.path, table="chain")
        return b

    # -- stages -------------------------------------------------------------------------------

    def instances(self, sl: StageLayout) -> list[int | None]:
        """Which instances a stage draws: None (folded), or each r; an expanded stage of more
        than 4 repeats draws the first, "⋯ k more ⋯", and the last."""
        n = sl.stage.repeat
        if not self.expand or n == 1:
            return [None]
        if n <= 4:
            return list(range(n))
        return [0, -1, n - 1]  # -1: the elided run

    def stage_blocks(self, sl: StageLayout) -> list[Block]:
        out = []
        for r in self.instances(sl):
            if r == -1:
                out.append(self.elided_block(sl))
            else:
                out.append(self.stage_block(sl, r))
        return out

    def elided_block(self, sl: StageLayout) -> Block:
        k = sl.stage.repeat - 2
        b = Block(width_in=sl.stage.width_in, width_out=sl.stage.width_in, path=sl.path)
        t = self.tag("elided", f"\u22ef {k} more {sl.stage.name} \u22ef", muted=True, key="elided", size=self.d.title, bold=True)
        self.used.add("elided")
        t.u, t.v = self.d.gap + self.along(t) / 2, self.d.col_gap + self.across(t) / 2
        b.boxes.append(t)
        b.length = 2 * self.d.gap + self.along(t)
        self.main_wire(b, [(0, 0), (b.length, 0)], sl.stage.width_in, sl.path).dotted = True
        b.neg, b.pos = 6, self.d.col_gap + self.across(t)
        return b

    def stage_block(self, sl: StageLayout, r: int | None, depth: int = 0, within: str | None = None) -> Block:
        """One frame: the header (name, a large ×N badge, a sparkline when annotated), then its
        items along the main line, branches beside it. A nested stage is drawn folded inside the
        frame of its group's instance `within` (its path: that instance's, then its own range)."""
        st = sl.stage
        path = f"{within}.{ir.layout.stage_path(sl.first, st.repeat)}" if within is not None else sl.path if r is None else sl.instance(r)
        if self.d.summary and self.summarised(sl, depth):
            return self.summary_block(sl, r, path, depth)
        b = Block(width_in=st.width_in, path=path)
        # the header: on the branch side, at the frame's far end (TB) or above the branches (LR)
        name = self.tag("stage", st.name, muted=False, key="stage", size=self.d.stage_title, bold=True)
        badge = None
        if st.repeat > 1:
            badge_s = f"\u00d7{st.repeat}" if r is None else f"{r % st.repeat + 1}/{st.repeat}"
            badge = self.tag("badge", badge_s, muted=False, key="repeat" if r is None else "stage", size=self.d.badge if r is None else self.d.stage_title, bold=True)
            if r is None:
                self.used.add("repeat")
        pcount = params.human(sum(p.params for p in self.stage_parts(sl)))
        each = " each" if st.repeat > 1 and r is None else ""
        sub = self.tag("stage_params", f"{pcount} params{each}")
        u = self.d.pad
        items = list(sl.items)
        cur_w = st.width_in
        pos, neg = 0.0, 0.0
        self.used.add("stage")
        for it in items:
            if isinstance(it, Part):
                inner = self.series_block(it, False)
                cur_w = inner.width_out
            elif isinstance(it, BranchLayout):
                inner = self.branch_block(it, path, cur_w, r)
            elif isinstance(it, FullflowLayout):
                inner = self.fullflow_block(it, path, cur_w, r)
            elif isinstance(it, StageLayout):  # a nested stage: a frame inside the frame
                inner = self.stage_block(it, None, depth + 1, within=path)
                cur_w = inner.width_out
            else:  # pragma: no cover
                raise TypeError(type(it).__name__)
            inner = inner.shifted(u, 0)
            self.absorb(b, inner)
            u += inner.length
            pos, neg = max(pos, inner.pos), max(neg, inner.neg)
        # the header
        hdr = [name] + ([badge] if badge else [])
        hdr_w = sum(x.w for x in hdr) + 8 * (len(hdr) - 1)
        hdr_h = max(x.h for x in hdr)
        # a folded stage's instances, nested ones' all they run (not inside one group instance's frame)
        spark = self.sparkline(sl) if (r is None and sl.count > 1 and path == sl.path and self.readings is not None) else None
        if self.tb:
            # a band at the top of the frame, right of the main line
            u_hdr = u + self.d.gap / 2
            x = self.d.col_gap
            room = max(pos - self.d.col_gap, self.wrap_w) + 20  # a little wider than the column is fine
            if self.d.tight and self.room is not None:  # tightest: as wide as the preset leaves the frame
                room = self.room - neg - 2 * self.d.pad - self.d.col_gap - 8
            one_row = hdr_w + 10 + sub.w <= room
            stacked = not one_row and self.d.compact and badge is not None and max(name.w, sub.w) + 8 + badge.w <= room
            if not stacked:
                for h in hdr:
                    h.u, h.v = u_hdr + (0 if one_row else sub.h) + hdr_h / 2, x + h.w / 2
                    x += h.w + 8
            if one_row:  # the parameter count beside the badge, on its baseline
                sub.u, sub.v = u_hdr + sub.h / 2 + 2, x + 2 + sub.w / 2
                band = hdr_h
            elif stacked:  # dense: the name over the parameter count, the badge beside both
                band = max(badge.h, name.h + sub.h)
                sub.u, sub.v = u_hdr + sub.h / 2, x + sub.w / 2
                name.u, name.v = u_hdr + sub.h + name.h / 2, x + name.w / 2
                badge.u, badge.v = u_hdr + band / 2, x + max(name.w, sub.w) + 8 + badge.w / 2
                hdr_w = max(name.w, sub.w) + 8 + badge.w
            else:
                sub.u, sub.v = u_hdr + sub.h / 2, self.d.col_gap + sub.w / 2
                band = hdr_h + sub.h
            if spark is not None:
                band += self.place_spark(b, spark, u_hdr + band + 4, self.d.col_gap) + 4
            u = u_hdr + band + self.d.pad
            pos = max(pos, self.d.col_gap + max(hdr_w + (10 + sub.w if one_row else 0), sub.w, spark[2] if spark else 0))
        else:
            # a band above the branches, from the frame's left edge
            v_hdr = pos + self.d.pad
            x = self.d.pad
            for h in hdr:
                h.u, h.v = x + h.w / 2, v_hdr + hdr_h / 2
                x += h.w + 8
            sub.u, sub.v = x + sub.w / 2 + 4, v_hdr + hdr_h / 2
            x += sub.w + 12
            band = hdr_h
            if spark is not None:
                self.place_spark(b, spark, x, v_hdr + band - 2 - 30)
                x += spark[2]
            pos = v_hdr + band
            u = max(u + self.d.pad, x + self.d.pad)
        b.boxes += hdr + [sub]
        b.length = u
        b.width_out = cur_w
        b.neg, b.pos = neg + self.d.pad, pos + self.d.pad
        b.frames.insert(0, Frame(self.nid("frame"), 0, -b.neg, b.length, b.pos, "stage" if r is None else "stage_instance", path, depth))
        # a little main line outside the frame at each end, so frames never touch (nested ones neither)
        b = b.shifted(self.d.gap / 2, 0)
        b.length += self.d.gap
        self.fill_main(b, sl, r, path)
        self.vent_outside(b)
        return b

    def summarised(self, sl: StageLayout, depth: int) -> bool:
        """At the last level a stage that holds no stage is one box of its parts: inside a group,
        always; on the main line (either view; the graph view's box keeps each part's parameter
        count), unless the box would hide what the stage is about (a detached read or an overboard
        branch, drawn as a cut and a dump nozzle, or a main line that narrows inside it, as a
        throat's does). A full-flow stage is never one box: a line of cells would read its
        parallel branches as running one after the other."""
        if any(isinstance(it, (StageLayout, FullflowLayout)) for it in sl.items):
            return False
        if depth > 0:
            return True
        branches = [it for it in sl.items if isinstance(it, BranchLayout)]
        return not any(br.branch.detach or br.branch.overboard for br in branches) and \
            all(it.width == sl.stage.width_in for it in sl.items if isinstance(it, Part))

    def summary_block(self, sl: StageLayout, r: int | None, path: str, depth: int) -> Block:
        """Level 5: a stage holding no stage itself (`summarised`) as one box on the main line
        (the classic figure's block): its name and ×N, then its parts in order on one line, each
        a cell in its kind's colour with its title and key numbers, a "+" where a branch returns
        to the stream (its merge's formula in the tooltip). Every word is still 12 pt; each cell
        is sized for the widest label mode."""
        st, ink = sl.stage, self.ink
        from .style import KIND_FILL

        cells: list[tuple[dict[str, list[str]], str, bool]] = []  # (lines per mode, fill, bold)
        pluses: set[int] = set()  # the cells that are a "+"
        name = st.name + (f" \u00d7{st.repeat}" if st.repeat > 1 and r is None else f" {r % st.repeat + 1}/{st.repeat}" if st.repeat > 1 else "")
        graph = self.view == "graph"  # each part's parameter count under its words, the stage's under its name
        count = [f"{params.human(sum(p.params for p in self.stage_parts(sl)))} params"] if graph else []
        # annotated: the readings a frame would print stay printed (the gradient entering the stage is
        # printed at the box's edge, see figure.Figure.values): a folded stage's first and last reading
        # (its sparkline's numbers) under its name, each branch's gradient norm under its "+"
        spark = self.sparkline(sl) if (r is None and sl.count > 1 and path == sl.path and self.readings is not None) else None
        first_last = [f"{text.num(spark[0][0])} \u2192 {text.num(spark[0][-1])}"] if spark else []
        cells.append(({m: [name] + count + first_last for m in MODES}, "", True))
        grads = self.readings.get("branches", {}) if self.readings is not None else {}
        if st.repeat > 1 and r is None:
            self.used.add("repeat")
        tips = []

        def lines(title: str, detail: str) -> list[str]:
            """The title's " · " pieces that stay within 150 pt, then the rest of them and the
            detail's within 190 pt on a second line (a chip shows what tells its parts apart)."""
            segs = [x for x in title.split(text.DOT) if x not in ("causal", "bidirectional")]
            rest = [x for x in detail.split(text.DOT) if x]
            out = [segs.pop(0)]
            while segs and text_w(out[0] + text.DOT + segs[0], DETAIL) <= 150:
                out[0] += text.DOT + segs.pop(0)
            more = ""
            for seg in segs + rest:
                nxt = f"{more}{text.DOT}{seg}" if more else seg
                if text_w(nxt, DETAIL) > 190:
                    break
                more = nxt
            return out + ([more] if more else [])

        def chip(p: Part) -> None:
            ml_t, ml_d, r_t, r_d = text.part_words(p.node, True)
            ml = lines(ml_t, ml_d)
            rocket = [r_t.split(": ", 1)[-1] if not isinstance(p.node, ir.Norm) else p.kind.rocket] + ([lines(r_d, "")[0]] if r_d else [])
            key = kind_style(p.kind.attr)[0]
            self.used.add(key)
            self.shapes.setdefault(key, "rounded")
            count = [f"{params.human(p.params)} params"] if graph and p.params else []
            cells.append(({"ml": ml + count, "both": ml + count, "rocket": rocket + count}, ink[KIND_FILL.get(p.kind.attr, "other")], False))
            tips.append(f"{p.path}: {ml_t}" + (f" ({ml_d})" if ml_d else ""))

        def plus(merge, grad: list[str]) -> None:
            k = ir.kinds.kind_of(merge) if merge is not None else ir.kinds.KINDS[ir.PlainMerge]
            self.used.add(f"merge_{k.keyword}")
            pluses.add(len(cells))
            cells.append(({m: ["+"] + grad for m in MODES}, "", True))
            tips.append(f"+ {k.formula}")

        for it in sl.items:
            if isinstance(it, Part):
                chip(it)
            elif isinstance(it, BranchLayout):
                bpath = f"{path}.{it.attr}"
                grad = [f"grad {text.num(grads[bpath])}"] if bpath in grads else []
                for p in it.ops:
                    chip(p)
                if not it.branch.overboard:
                    plus(it.branch.merge, grad)
                elif grad:  # no "+": the branch's last part carries it
                    lines_of, fill, bold = cells[-1]
                    cells[-1] = ({m: ls + grad for m, ls in lines_of.items()}, fill, bold)
            elif isinstance(it, FullflowLayout):
                for p in ([it.norm] if it.norm else []) + [p for br in it.branches for p in br.ops]:
                    chip(p)
                returning = [br for br in it.branches if not br.branch.overboard]
                if returning:
                    plus(returning[0].branch.merge, [])
        widths = [max(text_w(x, DETAIL, bold and i == 0) for m in MODES for i, x in enumerate(w[m])) + 8 for w, _, bold in cells]
        rows = max(len(w[m]) for w, _, _ in cells for m in MODES)
        cell_h = rows * DETAIL * LINE + 4
        # one line of parts, or (where the preset's room across is short) a line per run of
        # branches, the name beside them all
        avail = math.inf if self.room is None else self.room - (6 + self.d.pad) - depth * (2 * self.d.pad + 6) - 8
        runs: list[list[int]] = [[]]  # a branch's cells, up to its "+"
        for i in range(1, len(cells)):
            runs[-1].append(i)
            if i in pluses and i < len(cells) - 1:
                runs.append([])

        def wide(ix: list[int], beside: bool = True) -> float:
            return sum(widths[j] + 3 for j in ix) + (widths[0] + 10 if beside else 7)

        def broken(beside: bool) -> list[list[int]]:
            pieces = []  # a branch too wide for a line of its own: a line per part (the "+" with the last)
            for run in runs:
                if wide(run, beside) <= avail:
                    pieces.append(run)
                    continue
                for j in run:
                    if j in pluses and pieces:
                        pieces[-1].append(j)
                    else:
                        pieces.append([j])
            out: list[list[int]] = [[]]
            for piece in pieces:
                if out[-1] and wide(out[-1] + piece, beside) > avail:
                    out.append([])
                out[-1] += piece
            return out

        lines = broken(True)
        # the graph view's cells (with their counts) too wide beside the name: the name above them
        above = graph and max(wide(ln) for ln in lines) > avail
        if above:
            lines = broken(False)

        if self.tb:  # the lines run up the page, as the main line does (tokens at the bottom)
            lines.reverse()

        def td(i: int, m: str) -> str:
            w, fill, bold = cells[i]
            words = [f'<font point-size="{DETAIL}" color="{ink["chamber"] if x == "+" and k == 0 else ink["fg"] if k == 0 else ink["muted"]}">'
                     f'{f"<b>{esc(x)}</b>" if bold and k == 0 else esc(x)}</font>' for k, x in enumerate(w[m])]
            attrs = f' bgcolor="{fill}" border="1" color="{ink["cell_border"]}"' if fill else ""
            return f'<td width="{widths[i]:.0f}" height="{cell_h:.0f}" fixedsize="true"{attrs}>{"<br/>".join(words)}</td>'

        htmls = {}
        rw = [sum(round(widths[i]) for i in ln) + 3 * (len(ln) + 1) for ln in lines]
        head_w = round(widths[0]) + 6  # the name's cell in its own table
        for m in MODES:
            if len(lines) == 1 and not above:
                htmls[m] = f'<table border="0" cellspacing="3" cellpadding="0"><tr>{"".join(td(i, m) for i in range(len(cells)))}</tr></table>'
                continue
            # every line as wide as the widest (and the name above them), so they start at one left edge
            full = max(rw + ([head_w] if above else []))
            pad = ['' if full - x < 4 else f'<td width="{full - x - 3:.0f}" height="{cell_h:.0f}" fixedsize="true"></td>' for x in rw]
            rows_html = [f'<table border="0" cellspacing="3" cellpadding="0"><tr>{"".join(td(i, m) for i in ln)}{p}</tr></table>' for ln, p in zip(lines, pad)]
            first = f'<table border="0" cellspacing="3" cellpadding="0"><tr>{td(0, m)}</tr></table>'
            if above:
                body = f'<tr><td align="left">{first}</td></tr>' + "".join(f'<tr><td align="left">{x}</td></tr>' for x in rows_html)
            else:
                side = f'<td rowspan="{len(lines)}">{first}</td>'
                body = "".join(f'<tr>{side if k == 0 else ""}<td>{x}</td></tr>' for k, x in enumerate(rows_html))
            htmls[m] = f'<table border="0" cellspacing="0" cellpadding="0">{body}</table>'
        if above:
            w, h = max(rw + [head_w]) + 4, (len(lines) + 1) * (cell_h + 6) + 4
        elif len(lines) == 1:
            w, h = sum(round(cw) for cw in widths) + 3 * (len(cells) + 1) + 4, cell_h + 7
        else:
            w = round(widths[0]) + 6 + max(sum(round(widths[i]) for i in ln) + 3 * (len(ln) + 1) for ln in lines) + 4
            h = len(lines) * (cell_h + 6) + 4
        b = Block(width_in=st.width_in, width_out=st.width_in, path=path)
        self.used.add("stage")
        bx = Box(self.nid("summary"), 0, 0, round(w, 1), round(h, 1), "rounded", "stage", {m: [] for m in MODES}, path=path,
                 tooltip="; ".join([path] + tips), htmls=htmls)
        bx.u = self.d.gap + self.along(bx) / 2
        b.boxes.append(bx)
        self.main_wire(b, [(0, 0), (self.d.gap, 0)], st.width_in, path, arrow=True, table="chain")
        b.length = self.d.gap + self.along(bx) + self.d.gap / 2
        b.neg = b.pos = self.across(bx) / 2
        self.hang(b, [bx])
        if self.readings is not None:  # where the readings of a frame go: its edges (not drawn)
            b.frames.append(Frame(self.nid("summary_at"), bx.u - self.along(bx) / 2, bx.v - self.across(bx) / 2,
                                  bx.u + self.along(bx) / 2, bx.v + self.across(bx) / 2, "summary", path, depth))
        self.main_wire(b, [(b.length - self.d.gap / 2, 0), (b.length, 0)], st.width_in, path, table="chain")
        return b

    def vent_outside(self, b: Block) -> None:
        """An overboard branch's dump nozzle sits outside the frame: its flow leaves the engine."""
        edge = b.pos
        for d in [x for x in b.boxes if x.key == "vent"]:
            w = next(w for w in b.wires if w.kind == "vent" and w.path == d.path)
            (u0, v0), (turn, _) = w.pts[0], w.pts[-1]
            d.v = edge + self.d.gap + self.across(d) / 2
            # TB: along to the turn, then across, out of the frame, into the nozzle's side;
            # LR: up out of the frame, then along into the nozzle
            w.pts = [(u0, v0), (turn, v0), (turn, d.v - self.across(d) / 2)] if self.tb else \
                [(u0, v0), (turn, v0), (turn, d.v), (d.u - self.along(d) / 2, d.v)]
            b.pos = max(b.pos, d.v + self.across(d) / 2)

    def stage_parts(self, sl: StageLayout) -> list[Part]:
        out = []
        for it in sl.items:
            if isinstance(it, Part):
                out.append(it)
            elif isinstance(it, BranchLayout):
                out += it.ops + ([it.merge] if it.merge else [])
            elif isinstance(it, FullflowLayout):
                out += ([it.norm] if it.norm else []) + [p for br in it.branches for p in br.ops + ([br.merge] if br.merge else [])]
            elif isinstance(it, StageLayout):
                out += self.stage_parts(it) * it.stage.repeat
        return out

    def absorb(self, b: Block, inner: Block) -> None:
        b.boxes += inner.boxes
        b.wires += inner.wires
        b.frames += inner.frames

    def fill_main(self, b: Block, sl: StageLayout, r: int | None, path: str | None = None) -> None:
        """The main line through the frame: from u=0 to the frame's end, between the pieces
        already on it (a series op's box is not crossed), carrying the chamber's width."""
        path = path or (sl.path if r is None else sl.instance(r))
        stops = sorted(((x.u - self.along(x) / 2, x.u + self.along(x) / 2, x) for x in b.boxes
                        if (abs(x.v) < 1e-6 or x.main) and x.shape not in ("text",)), key=lambda s: (s[0], s[1]))
        u, w = 0.0, sl.stage.width_in
        for a0, a1, x in stops:
            if a0 > u + 0.5:
                self.main_wire(b, [(u, 0), (a0, 0)], w, path, arrow=x.shape not in ("point", "circle"), table="chain")
            u = max(u, a1)
            if x.shape == "rounded" and x.path:
                p = self.part_of(x.path)
                if p is not None:
                    w = ir.out_width(p.node, p.width)
        self.main_wire(b, [(u, 0), (b.length, 0)], w, path, table="chain")

    def part_of(self, path: str) -> Part | None:
        for p in self.lay.parts():
            if p.path == path:
                return p
        return None

    def branch_block(self, bl: BranchLayout, spath: str, width: int, r: int | None, col_v: float | None = None) -> Block:
        br = bl.branch
        bpath = f"{spath}.{bl.attr}"
        b = Block(width_in=width, width_out=width, path=bpath)
        split = self.point("split", bpath)
        split.u = self.d.gap / 2
        cut = self.tag("cut", "0 \u00b7 no gradient" if self.readings is not None else "no gradient", key="cut_label", italic=True) if br.detach else None
        if self.tb and cut is not None:  # the "no gradient" under the cut stays inside the stage's frame
            split.u = max(split.u, cut.h + 2)
        b.boxes.append(split)
        ops = [self.part_box(p, True) for p in bl.ops]
        names = self.branch_titles(br)
        if self.readings is not None and bpath in self.readings.get("branches", {}):
            # the branch's measured gradient norm, once, in its title: one value per wire
            g = self.readings["branches"][bpath]
            names = {m: f"{w} \u00b7 grad {text.num(g)}" for m, w in names.items()}
        title = self.tagw("branch", {m: [Line(w, DETAIL, bold=True, muted=True)] for m, w in names.items()}, key="branch_title")

        def width(boxes: list[Box]) -> float:
            return max([self.across(o) for o in boxes] + ([self.across(title)] if self.tb else []))

        def room_beside(boxes: list[Box]) -> bool:
            return self.across(title) + self.across(boxes[0]) / 2 + 10 <= width(boxes) / 2

        # the branch's name beside the wire that runs to its first op, never across it: TB, right
        # of that wire and just past the split; LR, above the column's ops
        beside = self.tb and self.d.compact and ops and room_beside(ops)
        if self.tb and self.d.compact and self.view == "graph" and not self.d.captions and ops and not beside:
            # a narrower first op, its count under its words, may leave the name room
            narrow = [self.part_box(bl.ops[0], True, grow=False)] + ops[1:]
            if narrow[0].w < ops[0].w and room_beside(narrow):
                ops, beside = narrow, True
        col_w = width(ops)
        v = (col_v if col_v is not None else self.d.col_gap + col_w / 2)
        if beside:  # dense: right of the first op, in the column's free width, at no cost along
            u = split.u + self.d.gap
            title.u, title.v = u + self.along(ops[0]) / 2, v + self.across(ops[0]) / 2 + 6 + self.across(title) / 2
        elif self.tb:
            title.u, title.v = split.u + 2 + self.along(title) / 2, v + 6 + self.across(title) / 2
            u = max(split.u + self.d.gap, title.u + self.along(title) / 2 + 4)
        else:
            title.u = split.u + 6 + self.along(title) / 2
            title.v = v + max([self.across(o) for o in ops] + [0]) / 2 + 3 + self.across(title) / 2
            u = split.u + self.d.gap
        b.boxes.append(title)
        prev = (split.u, 0.0)
        first = True
        for o in ops:
            o.u, o.v = u + self.along(o) / 2, v
            b.boxes.append(o)
            pts = [prev, (prev[0], v), (u, v)] if first else [prev, (u, v)]
            wire = Wire(self.nid("bw"), pts, "cut" if (first and br.detach) else "branch", 0, bpath, arrow=True, dashed=first and br.detach,
                        table="branches")
            b.wires.append(wire)
            self.used.add(wire.kind)
            if first and br.detach:
                if self.tb:  # under the cut, halfway out to the column
                    cut.u, cut.v = prev[0] - cut.h / 2 - 1, v / 2 + 4
                else:  # beside the cut, halfway up, under the first op
                    cut.u, cut.v = prev[0] + 2 + cut.w / 2, min(v / 2, v - self.across(o) / 2 - 2 - self.across(cut) / 2)
                b.boxes.append(cut)
            first = False
            prev = (u + self.along(o), v)
            u = prev[0] + self.d.gap
        end_u = prev[0]
        if br.overboard:
            self.used.add("vent")
            loss = f"aux loss \u00d7{text.num(br.loss)}" if br.loss is not None else "never merged"
            dump = self.box("dump", "vent", {"ml": [Line("side output", self.d.title, True), Line(loss)],
                                             "both": [Line("side output", self.d.title, True), Line(loss), *self.cap("overboard")],
                                             "rocket": [Line("overboard", self.d.title, True), Line(loss)]}, shape="trapezium", path=bpath)
            turn = end_u + self.d.gap / 2
            dump.u = turn if self.tb else turn + self.d.gap / 2 + self.along(dump) / 2
            dump.v = v  # moved outside the frame by the stage (vent_outside)
            b.boxes.append(dump)
            b.wires.append(Wire(self.nid("vw"), [prev, (turn, v)], "vent", 0, bpath, arrow=True, table="branches"))
            b.length = dump.u + self.along(dump) / 2 + self.d.gap / 2
        else:
            j = self.junction(br.merge, bpath)
            j.u = end_u + self.d.gap + self.along(j) / 2
            b.boxes.append(j)
            wire = Wire(self.nid("bw"), [prev, (prev[0] + self.d.gap / 2, v), (j.u, v), (j.u, self.across(j) / 2)], "branch", 0, bpath, arrow=True,
                        table="branches")
            if isinstance(br.merge, ir.RezeroMerge) and br.merge.init == 0:
                wire.dotted = True  # unlit at ignition: alpha starts at 0
            b.wires.append(wire)
            note = text.merge_note(br.merge)
            main_note = text.main_note(br.merge)
            if main_note and note and self.d.tight and self.tb:  # tightest: DeepNet's α with its β, on the branch side
                note, main_note = f"{main_note}{text.DOT}{note}", ""
            after = self.d.gap / 2
            if note and self.tb and not self.d.captions:  # densest: beside the return wire's rise, at no cost along
                t = self.tag("merge_note", note, italic=True)
                t.u, t.v = max(end_u + self.along(t) / 2 + 1, j.u - self.along(t) / 2 + 4), v + 5 + self.across(t) / 2
                if self.d.tight and self.room is not None:
                    self.fit_note(t, v, self.across(j) / 2 + 4)
                    t.u = max(end_u + self.along(t) / 2 + 1, j.u - self.along(t) / 2 + 4)
                b.boxes.append(t)
                after = max(after, t.u + self.along(t) / 2 - j.u - self.along(j) / 2 + 2)
                b.pos = max(b.pos, t.v + self.across(t) / 2)
            elif note:  # just past the junction, beside the main line, before anything that follows
                t = self.tag("merge_note", note, italic=True)
                t.u, t.v = j.u + self.along(j) / 2 + 2 + self.along(t) / 2, self.across(j) / 2 + 4 + self.across(t) / 2
                b.boxes.append(t)
                after = max(after, self.along(t) + 4)
            if main_note:
                t = self.tag("main_note", main_note, italic=True, muted=False)
                t.u, t.v = j.u - self.along(j) / 2 - 4 - self.along(t) / 2, -(6 + self.across(t) / 2)
                b.boxes.append(t)
                b.neg = max(b.neg, 6 + self.across(t))
            b.length = j.u + self.along(j) / 2 + after
        b.pos = max(b.pos, v + col_w / 2, title.v + self.across(title) / 2)
        if not self.tb:
            b.length = max(b.length, title.u + self.along(title) / 2 + self.d.gap / 2)
        b.neg = max(b.neg, 6)
        return b

    def fit_note(self, t: Box, v: float, v_min: float) -> None:
        """Tightest: a junction's note within the preset's room across: right of the return
        wire's rise at `v` if it fits there, else left of it (clear of the junction, whose
        edge is at `v_min`), else on more lines, right of the rise."""
        room = self.room - 6 - 3 * self.d.pad - 2  # the frame's pads on both sides, the main line's own side
        w = self.across(t)
        if v + 5 + w <= room:
            return
        if v_min + 2 + w <= v - 5:
            t.v = v - 5 - w / 2
            return
        ln = t.words["ml"][0]
        lines = [Line(x, ln.size, ln.bold, ln.italic, ln.muted) for x in wrap(ln.text, ln.size, ln.bold, max(room - v - 11, 40.0))]
        t.words = {m: lines for m in MODES}
        tw, th = lines_size(lines)
        t.w, t.h = round(tw + 6, 1), round(th + 4, 1)
        t.v = v + 5 + self.across(t) / 2

    def fullflow_block(self, fl: FullflowLayout, spath: str, width: int, r: int | None) -> Block:
        """Full flow: x + f1(n(x)) + f2(n(x)). One split; the shared norm (on the branch side:
        the stream itself is not normalised) feeds every branch; the branches run side by side
        and all return at one junction, along one manifold above their tops."""
        b = Block(width_in=width, width_out=width, path=spath)
        split = self.point("split", spath)
        split.u = self.d.gap / 2
        b.boxes.append(split)
        cols = []  # (branch layout, path, op boxes, title, column width)
        for bl in fl.branches:
            bpath = f"{spath}.{bl.attr}"
            ops = [self.part_box(p, True) for p in bl.ops]
            names = self.branch_titles(bl.branch)
            if self.readings is not None and bpath in self.readings.get("branches", {}):
                names = {m: f"{w} \u00b7 grad {text.num(self.readings['branches'][bpath])}" for m, w in names.items()}
            title = self.tagw("branch", {m: [Line(w, DETAIL, bold=True, muted=True)] for m, w in names.items()}, key="branch_title")
            cw = max([self.across(o) for o in ops] + ([self.across(title) + 6] if self.tb else []))
            cols.append((bl, bpath, ops, title, cw))
        norm = self.part_box(fl.norm, True) if fl.norm is not None else None
        across = sum(c[4] for c in cols) + self.d.col_gap * len(cols)
        if (self.d.tight and self.tb and self.room is not None and across > self.room - (6 + 3 * self.d.pad) - 8
                and not any(c[0].branch.overboard for c in cols)):
            return self.fullflow_stacked(b, split, cols, norm, fl)
        v = self.d.col_gap
        vs = []
        for _, _, ops, title, cw in cols:
            vs.append(v + cw / 2)
            # LR: the branch's name sits over its ops, inside the column's own band
            v += cw + self.d.col_gap + (0 if self.tb else self.across(title) + 3)
        src = (split.u, 0.0)
        u = split.u + self.d.gap
        if norm is not None:  # in the first column, fed by the split
            norm.u, norm.v = u + self.along(norm) / 2, vs[0]
            b.boxes.append(norm)
            b.wires.append(Wire(self.nid("bw"), [src, (split.u, vs[0]), (u, vs[0])], "branch", 0, spath, arrow=True, table="branches"))
            self.used.add("branch")
            u += self.along(norm)
            src = (u, vs[0])
            u += self.d.gap
        fan_u = src[0] + self.d.gap / 2 if norm is not None else split.u
        ends = []
        for (bl, bpath, ops, title, cw), cv in zip(cols, vs):
            cu = u
            if self.tb:
                title.u, title.v = cu + self.along(title) / 2, cv + 6 + self.across(title) / 2
                cu += self.along(title) + 4
            else:
                title.u = cu + 6 + self.along(title) / 2
                title.v = cv + max([self.across(o) for o in ops] + [0]) / 2 + 3 + self.across(title) / 2
            b.boxes.append(title)
            prev = None
            for k, o in enumerate(ops):
                o.u, o.v = cu + self.along(o) / 2, cv
                b.boxes.append(o)
                if k == 0:
                    pts = [src, (fan_u, src[1]), (fan_u, cv), (cu, cv)] if norm is not None else [src, (src[0], cv), (cu, cv)]
                    cut = bl.branch.detach
                    b.wires.append(Wire(self.nid("bw"), pts, "cut" if cut else "branch", 0, bpath, arrow=True, dashed=cut, table="branches"))
                    self.used.add("cut" if cut else "branch")
                else:
                    b.wires.append(Wire(self.nid("bw"), [prev, (cu, cv)], "branch", 0, bpath, arrow=True, table="branches"))
                prev = (cu + self.along(o), cv)
                cu = prev[0] + self.d.gap
            ends.append((bl, bpath, prev if prev is not None else (u, cv)))
        top = max(e[2][0] for e in ends) + self.d.gap / 2
        returning = [e for e in ends if not e[0].branch.overboard]
        j = None
        if returning:
            j = self.junction(returning[0][0].branch.merge, spath)
            j.u = top + self.along(j) / 2
            b.boxes.append(j)
            for bl, bpath, (eu, ev) in returning:
                wire = Wire(self.nid("bw"), [(eu, ev), (j.u, ev), (j.u, self.across(j) / 2)], "branch", 0, bpath, arrow=True, table="branches")
                b.wires.append(wire)
        for bl, bpath, (eu, ev) in ends:
            if bl.branch.overboard:
                loss = f"aux loss \u00d7{text.num(bl.branch.loss)}" if bl.branch.loss is not None else "never merged"
                dump = self.box("dump", "vent", {"ml": [Line("side output", self.d.title, True), Line(loss)],
                                                 "both": [Line("side output", self.d.title, True), Line(loss), *self.cap("overboard")],
                                                 "rocket": [Line("overboard", self.d.title, True), Line(loss)]}, shape="trapezium", path=bpath)
                dump.u, dump.v = eu + self.d.gap / 2 + (0 if self.tb else self.d.gap / 2 + self.along(dump) / 2), ev
                b.boxes.append(dump)
                b.wires.append(Wire(self.nid("vw"), [(eu, ev), (eu + self.d.gap / 2, ev)], "vent", 0, bpath, arrow=True, table="branches"))
                self.used.add("vent")
        after = self.d.gap / 2
        note = text.merge_note(returning[0][0].branch.merge) if returning else ""
        if note and j is not None:
            t = self.tag("merge_note", note, italic=True)
            t.u, t.v = j.u + self.along(j) / 2 + 2 + self.along(t) / 2, self.across(j) / 2 + 4 + self.across(t) / 2
            b.boxes.append(t)
            after = max(after, self.along(t) + 4)
        b.length = (j.u + self.along(j) / 2 if j is not None else top) + after
        b.pos = max([x.v + self.across(x) / 2 for x in b.boxes] + [0.0])
        b.neg = 6
        return b

    def fullflow_stacked(self, b: Block, split: Box, cols: list, norm: Box | None, fl: FullflowLayout) -> Block:
        """Tightest, top to bottom, where the branches side by side are wider than the preset:
        the branches one after another in one column, each read from the shared norm (the later
        ones by a lane on the far side) and each returning to the stream at a junction of its
        own as it ends. The same sum: every branch reads n(x), never the stream it joins."""
        cw = max(c[4] for c in cols)
        vc = self.d.col_gap - 2 + cw / 2  # a little nearer the stream: the lane needs the room
        lane = vc + cw / 2 + 5
        src = (split.u, 0.0)
        u = split.u + self.d.gap
        if norm is not None:
            norm.u, norm.v = u + self.along(norm) / 2, vc
            b.boxes.append(norm)
            b.wires.append(Wire(self.nid("bw"), [src, (split.u, vc), (u, vc)], "branch", 0, b.path, arrow=True, table="branches"))
            self.used.add("branch")
            u += self.along(norm)
            src = (u, vc)
            u += self.d.gap
        fan = src[0] + self.d.gap / 2
        j = None
        for k, (bl, bpath, ops, title, _) in enumerate(cols):
            cut = bl.branch.detach
            if k == 0:
                feed = [src, (src[0], vc), (u, vc)] if norm is None else [src, (u, vc)]
            else:  # up the far lane, past the branches before it, and in from below
                u += self.d.gap
                feed = [src, (fan, src[1]), (fan, lane), (u - self.d.gap / 2, lane), (u - self.d.gap / 2, vc), (u, vc)]
                if norm is None:
                    feed = [src, (src[0] + self.d.gap / 2, 0.0), (src[0] + self.d.gap / 2, lane), (u - self.d.gap / 2, lane),
                            (u - self.d.gap / 2, vc), (u, vc)]
            title.u, title.v = u + self.along(title) / 2, vc + 6 + self.across(title) / 2
            b.boxes.append(title)
            cu = u + self.along(title) + 4
            feed[-1] = (cu, vc)
            b.wires.append(Wire(self.nid("bw"), feed, "cut" if cut else "branch", 0, bpath, arrow=True, dashed=cut, table="branches"))
            self.used.add("cut" if cut else "branch")
            prev = None
            for i, o in enumerate(ops):
                o.u, o.v = cu + self.along(o) / 2, vc
                b.boxes.append(o)
                if i > 0:
                    b.wires.append(Wire(self.nid("bw"), [prev, (cu, vc)], "branch", 0, bpath, arrow=True, table="branches"))
                prev = (cu + self.along(o), vc)
                cu = prev[0] + self.d.gap
            eu = prev[0] if prev is not None else cu
            j = self.junction(bl.branch.merge, b.path)
            j.u = eu + self.d.gap + self.along(j) / 2
            b.boxes.append(j)
            b.wires.append(Wire(self.nid("bw"), [(eu, vc), (eu + self.d.gap / 2, vc), (j.u, vc), (j.u, self.across(j) / 2)], "branch", 0, bpath,
                                arrow=True, table="branches"))
            u = j.u + self.along(j) / 2
        after = self.d.gap / 2
        note = text.merge_note(cols[0][0].branch.merge)
        if note:
            t = self.tag("merge_note", note, italic=True)
            t.u, t.v = j.u + self.along(j) / 2 + 2 + self.along(t) / 2, self.across(j) / 2 + 4 + self.across(t) / 2
            b.boxes.append(t)
            after = max(after, self.along(t) + 4)
        b.length = u + after
        b.pos = max([x.v + self.across(x) / 2 for x in b.boxes] + [lane + 1.5])
        b.neg = 6
        return b

    # -- annotate -----------------------------------------------------------------------------

    def sparkline(self, sl: StageLayout):
        vals = [self.readings.get("chain", {}).get(sl.instance(r)) for r in range(sl.count)]
        vals = [v for v in vals if v is not None]
        if len(vals) < 2:
            return None
        return vals, 30.0, 120.0

    def place_spark(self, b: Block, spark, u0: float, v0: float) -> float:
        """A per-depth sparkline of ||dL/dx|| entering each instance, with its first and last value."""
        from .annotate import log_pos

        vals, h, w = spark
        self.used.add("spark")
        n = len(vals)
        pos = [x for x in vals if x > 0] or [1.0]
        lo, hi = min(pos), max(pos)
        span = (lo / 1.05, hi * 1.05)
        pts = []
        for i, x in enumerate(vals):
            t = i / (n - 1)
            y = log_pos(x, span) * h if x > 0 else 0.0
            pts.append((t, y))
        if self.tb:
            wp = [(u0 + h - y, v0 + t * w) for t, y in pts]
        else:
            wp = [(u0 + t * w, v0 + y) for t, y in pts]
        b.wires.append(Wire(self.nid("spark"), wp, "spark", 0, ""))
        lo = self.tag("spark_lo", f"{text.num(vals[0])} \u2192 {text.num(vals[-1])}", key="spark_label")
        if self.tb:
            lo.u, lo.v = u0 + h + 2 + lo.h / 2, v0 + lo.w / 2
            b.boxes.append(lo)
            return h + lo.h + 2
        lo.u, lo.v = u0 + w / 2, v0 - lo.h / 2
        b.boxes.append(lo)
        return h

    def apply_readings(self) -> None:
        """Give each wire at most one reading: a main-line wire inside a stage the gradient
        entering that stage, a branch's wires its parameters' gradient norm (zero for a
        detached read's cut, which carries none)."""
        rd = self.readings
        for w in self.wires:
            if w.kind in ("main",) and w.table == "chain":
                w.value = rd.get("chain", {}).get(w.path)
            elif w.kind in ("branch", "vent"):
                w.value = rd.get("branches", {}).get(w.path)
            elif w.kind == "cut":
                w.value = 0.0  # a detached read: no gradient flows back through it

    # -- packing ---------------------------------------------------------------------------

    def pack(self, blocks: list[Block]) -> None:
        """Columns of blocks along the main line; a new column starts where the next block
        would pass `max_along`; never inside a block (a stage is one block)."""
        self.lengths = [bk.length for bk in blocks]
        cols: list[list[Block]] = [[]]
        total = 0.0
        for bk in blocks:
            if self.max_along and cols[-1] and total + bk.length > self.max_along:
                cols.append([])
                total = 0.0
            cols[-1].append(bk)
            total += bk.length
        # TB: the next column to the right (v grows); LR: the next row below (v falls)
        sgn = 1.0 if self.tb else -1.0
        dv = 0.0
        prev = None  # (end u, dv, neg, pos) of the previous column
        self.columns = []  # (dv, neg, pos, length) of each column, in flow coordinates
        for ci, col in enumerate(cols):
            neg = max(b.neg for b in col)
            pos = max(b.pos for b in col)
            if prev is not None:
                pu, pdv, pneg, ppos = prev
                dv = pdv + ppos + 2 * self.d.col_gap + neg if sgn > 0 else pdv - pneg - 2 * self.d.col_gap - pos
            u = 0.0
            for bk in col:
                sh = bk.shifted(u, dv)
                self.boxes += sh.boxes
                self.wires += sh.wires
                self.frames += sh.frames
                u += bk.length
            if prev is not None:
                # from the previous column's end over, through the gap between them, to this one's start
                pu, pdv, pneg, ppos = prev
                gap_v = pdv + ppos + self.d.col_gap if sgn > 0 else pdv - pneg - self.d.col_gap
                top = max(pu, self.col_len) + self.d.gap
                self.wires.append(Wire(self.nid("wrap"), [(pu, pdv), (top, pdv), (top, gap_v), (-self.d.gap, gap_v), (-self.d.gap, dv), (0, dv)], "main",
                                       col[0].width_in, col[0].path))
            self.col_len = max(self.col_len, u)
            self.columns.append((dv, neg, pos, u))
            prev = (u, dv, neg, pos)


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
