"""The IR walk of a figure: a stage's frame (its instances, a summary of a deep one), its
branches' columns and fullflows, each a `Block` in flow coordinates. `scene.Scene` inherits
these and packs the blocks.
"""

from __future__ import annotations

import math

from ... import ir
from ...ir.layout import BranchLayout, FullflowLayout, Part, StageLayout
from . import params, text
from .geometry import Block, Box, Frame, Wire
from .measure import DETAIL, LINE, MODES, Line, lines_size, text_w, wrap
from .style import esc, kind_style


class StageBlocks:
    """The stage, branch and fullflow blocks: mixed into `scene.Scene` (self.box, self.d, self.lay, ...)."""

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
