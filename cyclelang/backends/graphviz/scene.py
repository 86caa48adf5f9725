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
from dataclasses import replace

from ... import ir
from ...ir.layout import Part, StageLayout
from . import params, text
from .blocks import StageBlocks
from .geometry import Block, Box, Frame, Wire, balanced  # noqa: F401 (balanced: read as scene.balanced)
from .measure import DENSITIES, LINE, MODES, SMALL, Line, line_w, lines_size, text_w, wrapped
from .style import kind_style


class Scene(StageBlocks):
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


