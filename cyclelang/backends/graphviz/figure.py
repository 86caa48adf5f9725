"""A figure: one or more engines' scenes, their title, one legend and one annotate scale,
mapped onto the page and written as DOT with every position pinned (`neato -n2`).

Size presets are physical: `slide` is a 16:9 slide (13.33 × 7.5 in), `column` a paper's
column (3.25 in wide), `page` a paper's text block (7 × 9.2 in). Everything is laid out
at 1:1 in points and no text is set under 12 pt, so at the preset's size every word
reads at 12 pt or more; a figure that does not fit its preset is refused (E0275) with
what it would need, never shrunk.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Mapping
from dataclasses import replace

from ... import ir
from . import params, text
from .annotate import colour, log_pos, ZERO
from .geometry import Box, Wire, balanced, log_scale
from .measure import DENSITIES, DETAIL, MODES, Line, lines_size, text_w, wrap
from .scene import Scene
from .style import FONT, THEMES, esc

SIZES = {"slide": (960.0, 540.0), "column": (234.0, 662.0), "page": (504.0, 662.0)}
WRAP = {"slide": 230.0, "column": 130.0, "page": 200.0, None: 230.0}
MARGIN = 12.0
TIGHT_MARGIN = 4.0
MAX_POINTS = 14400.0  # 200 in: past this a figure is no longer a figure (--expand's hard cap)


class Fit(Exception):
    """The figure does not fit its size preset (or the hard cap). `overflow`: how many times
    the preset it needs on its tighter side; `cap`: past the hard cap."""

    def __init__(self, message: str, overflow: float = math.inf, cap: bool = False):
        super().__init__(message)
        self.overflow, self.cap = overflow, cap


def _line_html(ln: Line, t: dict) -> str | None:
    if not ln.text:
        return None
    s = esc(ln.text)
    if ln.bold:
        s = f"<b>{s}</b>"
    if ln.italic:
        s = f"<i>{s}</i>"
    col = t["muted"] if ln.muted else t["fg"]
    if ln.tail:
        s += f'<font point-size="{DETAIL}" color="{t["muted"]}">{esc(ln.tail)}</font>'
    return f'<font point-size="{ln.size}" color="{col}">{s}</font>'


def html_label(lines: list[Line], t: dict, glyph: str = "", align: str = "") -> str:
    br = f'<br align="{align}"/>' if align and len(lines) > 1 else "<br/>"
    body = br.join(h for h in (_line_html(x, t) for x in lines) if h) or " "
    if align and len(lines) > 1:
        body += br
    if glyph:
        return (f'<<table border="0" cellborder="0" cellspacing="0" cellpadding="0"><tr><td>{body}</td></tr>'
                f'<tr><td>{glyph}</td></tr></table>>')
    return f"<{body}>"


# The densest level's shorter legend words, where the usual ones run long.
TERSE = {"main": ("stream, width \u221d d", "chamber"), "streams": ("n streams", "n chambers"), "merge_hyper": ("read, write, mix", "manifold"), "branch": ("branch", "prechamber"), "cut": ("detached", "cut"), "split": ("reads x", "tap"),
         "vent": ("side output", "overboard"), "repeat": ("\u00d7N: N times", "\u00d7N: N times"), "elided": ("left out", "left out"),
         "heads": ("Q heads", "elements"), "kv_heads": ("KV heads", "elements"), "experts": ("experts, top k", "elements"), "merge_cooling": ("x + f(x), init \u03c3", "cooling")}


# The legend: (key, {mode: words}); a key appears when the figure uses it.
@functools.cache  # a layout asks for each entry's words at every width it tries
def legend_words(key: str, terse: bool = False, one: bool = False) -> Mapping[str, str]:
    """`one`: each label mode's entry in one vocabulary (`--labels both` the network words).
    Read-only: the one mapping is shared by every caller."""
    return types.MappingProxyType(_legend_words(key, terse, one))


def _legend_words(key: str, terse: bool, one: bool) -> dict[str, str]:
    def say(ml: str, rocket: str) -> dict[str, str]:
        return {"ml": ml, "rocket": rocket, "both": f"{ml} \u00b7 {rocket}" if rocket != ml and not one else ml}

    if terse and key in TERSE:
        return say(*TERSE[key])

    fixed = {
        "main": say("residual stream, width \u221d d", "chamber"),
        "streams": say("several residual streams (hyper-connections)", "chambers side by side"),
        "branch": say("residual branch", "prechamber"),
        "cut": say("detached: no gradient", "cut"),
        "split": say("branch reads the stream", "tap"),
        "vent": say("side output, aux loss", "overboard"),
        "stage": say("block", "stage"),
        "repeat": {m: "\u00d7N: repeated N times" for m in MODES},
        "elided": say("instances left out", "stages left out"),
        "tokens": say("tokens", "tanks"),
        "feed": say("embedding", "pumps"),
        "head": say("LM head", "nozzle"),
        "heads": say("Q heads", "elements"),
        "kv_heads": say("KV heads, shared by Q heads", "elements"),
        "experts": say("experts, top k lit", "elements"),
        "spark": say("\u2016dL/dx\u2016 by depth", "pressure"),
        "mask_causal": say("causal mask", "choked throat"),
        "mask_causal_window": say("sliding-window mask", "choked throat"),
        "mask_none": say("no mask", "open throat"),
    }
    if key in fixed:
        return fixed[key]
    if key.startswith("merge_"):
        k = ir.kinds.MERGE_BY_KEYWORD[key[len("merge_"):]]
        return say(k.formula if k.keyword != "cooling" else "x + f(x), f's init \u03c3", k.rocket if k.keyword != "plain" else "closed")
    if key.startswith("kind_"):
        attr = key[len("kind_"):]
        for k in ir.kinds.KINDS.values():
            if k.attr == attr and k.role not in ("merge", "feed", "nozzle"):
                return say(k.ml if k.cls is not ir.Norm else "norm", k.rocket)
    return say(key, key)


LEGEND_ORDER = ("main", "streams", "branch", "split", "cut", "vent", "stage", "repeat", "elided", "tokens", "feed", "head")


class Figure:
    def __init__(self, engines: list[ir.Engine], *, view: str = "cycle", labels: str = "both", theme: str = "light", rankdir: str | None = "TB",
                 size: str | None = None, expand: bool = False, readings: list | None = None):
        """rankdir None: top-to-bottom, or (with a size preset) whichever direction fits it first."""
        self.engines, self.view, self.labels, self.t = engines, view, labels, THEMES[theme]
        self.size, self.expand = size, expand
        self.readings = readings
        vals = []
        for rd in readings or []:
            if rd:
                for table in rd.values():
                    vals += list(table.values())
        self.scale = log_scale(vals) if readings else None
        if size is None:
            self.attempt(rankdir or "TB", 0)
            return
        # with a size preset: the least dense level that fits, in the asked direction or, when
        # none was asked, top-to-bottom first and then left-to-right; else the closest miss
        misses = []
        for level in range(len(DENSITIES)):
            for rd in ([rankdir] if rankdir else ["TB", "LR"]):
                try:
                    self.attempt(rd, level)
                    return
                except Fit as e:
                    misses.append((e.overflow, e))
        if any(m[1].cap for m in misses):  # past the hard cap: say that, not the preset
            raise next(m[1] for m in misses if m[1].cap)
        raise min(misses, key=lambda m: m[0])[1]

    def attempt(self, rankdir: str, level: int) -> None:
        self.rankdir, self.level, self.d = rankdir, level, DENSITIES[level]
        self.built: list[Scene] | None = None
        self.nodes: list[tuple[str, dict]] = []
        self.edges: list[tuple[str, str, dict]] = []
        self.layout()

    @property
    def tb(self) -> bool:
        return self.rankdir == "TB"

    @property
    def margin(self) -> float:
        """Round the figure: the tightest level leaves the page's own margins to the page."""
        return TIGHT_MARGIN if self.d.tight else MARGIN

    def scenes(self, max_along: float | None) -> list[Scene]:
        """Each engine's scene at this attempt's direction and density, wrapped at `max_along`
        (built once per attempt, then only packed again)."""
        if self.built is None:
            self.built = [Scene(e, view=self.view, rankdir=self.rankdir, expand=self.expand, wrap_w=WRAP[self.size], max_along=None,
                                readings=(self.readings[i] if self.readings else None), scale=self.scale or (1e-3, 10.0), id_prefix=f"e{i}.",
                                density=self.level, ink=self.t, room=self.room())
                          for i, e in enumerate(self.engines)]
        return [s if max_along is None else s.repacked(max_along) for s in self.built]

    def room(self) -> float | None:
        """The preset's room across the main line, if it has one."""
        if self.size is None:
            return None
        W, H = SIZES[self.size]
        n = len(self.engines)  # small multiples share it, side by side (TB) or stacked (LR)
        return (W - 2 * self.margin - 36.0 * (n - 1)) / n if self.tb else (H - 2 * self.margin - 60.0 - 60.0 * (n - 1)) / n

    # -- layout -------------------------------------------------------------------------------

    def layout(self) -> None:
        """Lay the figure out; with a size preset, wrap the main line into columns (never inside
        a stage) so that it fits the preset's height (TB) or width (LR), if it can."""
        sc = self.scenes(None)
        used = set().union(*(s.used for s in sc))
        if self.size is None:
            self.lay_out(sc, used)
            return
        # the main line wrapped to fit the preset's height (TB) or width (LR) with the legend
        # beside it, then with the legend under it; the first that fits wins
        W, H = SIZES[self.size]
        title_h = 30.0 + (24.0 if len(self.engines) > 1 else 0.0)
        alongs = []
        for legend_below in (not self.legend_right(), self.legend_right()):
            lw, lh = self.legend_size(used, W - 2 * self.margin if legend_below else 260.0)
            if self.tb:
                alongs.append(H - 2 * self.margin - title_h - (lh + 10 if legend_below else 0) - 8)
            else:
                alongs.append(W - 2 * self.margin - (0 if legend_below else lw + 12) - 8)
        # and into more, shorter columns, which leave room for the legend over the last one
        for k in (2, 3, 4):
            caps = [balanced(s.lengths, k) for s in sc]
            if all(c is not None for c in caps):
                alongs.append(max(caps))
        miss = None
        for avail in [None] + sorted(set(alongs), reverse=True):
            if avail is not None and not any(self.extent(s)[0] > avail for s in sc):
                continue  # already that short: wrapping changes nothing
            try:
                self.nodes, self.edges = [], []
                self.lay_out(sc if avail is None else self.scenes(avail), used)
                return
            except Fit as e:
                if miss is None or e.cap or e.overflow < miss.overflow:
                    miss = e
        raise miss

    def lay_out(self, sc: list[Scene], used: set[str]) -> None:
        self.sc = sc
        self.shapes = {k: v for s in sc for k, v in s.shapes.items()}
        self.place(sc, used)

    def legend_right(self) -> bool:
        return self.tb

    def extent(self, s: Scene) -> tuple[float, float]:
        """(along, across) of a scene."""
        us = [b.u + s.along(b) / 2 for b in s.boxes] + [u for w in s.wires for u, _ in w.pts]
        u0 = min([b.u - s.along(b) / 2 for b in s.boxes] + [u for w in s.wires for u, _ in w.pts])
        vs = [b.v + s.across(b) / 2 for b in s.boxes] + [f.v1 for f in s.frames]
        v0 = min([b.v - s.across(b) / 2 for b in s.boxes] + [f.v0 for f in s.frames])
        return max(us) - u0, max(vs) - v0

    def xy(self, s: Scene, u: float, v: float) -> tuple[float, float]:
        return (v, u) if self.tb else (u, v)

    def legend_entries(self, used: set[str]) -> list[str]:
        keys = [k for k in LEGEND_ORDER if k in used]
        keys += sorted(k for k in used if k.startswith("kind_"))
        keys += sorted(k for k in used if k.startswith("mask_") or k in ("heads", "kv_heads", "experts"))
        keys += sorted(k for k in used if k.startswith("merge_"))
        keys += [k for k in ("spark",) if k in used]
        return keys

    def legend_cells(self, used: set[str], width: float) -> tuple[list[tuple[str, float, float, dict[str, list[str]]]], float, float]:
        """Where each legend entry goes: (key, left, top, {mode: its lines}) from the legend's
        top left corner, and the legend's (width, height). Natural and roomy figures set the
        entries in equal columns; a dense one flows them into rows, an entry wider than the
        legend on two lines."""
        keys = self.legend_entries(used)
        if self.level == 0:
            cw = max(text_w(legend_words(k)[m], DETAIL) for k in keys for m in MODES) + 36
            cols = max(1, int(width // cw))
            rows = -(-len(keys) // cols)
            cells = [(k, (i // rows) * cw, (i % rows) * 20.0, {m: [legend_words(k)[m]] for m in MODES}) for i, k in enumerate(keys)]
            return cells, min(width, cols * cw), rows * 20.0 + 20
        pitch, cells, x, y, used_w, row_h = self.pitch(), [], 0.0, 0.0, 0.0, 0.0
        if self.d.tight:
            return self.legend_grid(keys, width)
        for k in keys:
            lines = {m: wrap(legend_words(k, self.d.terse, self.d.tight)[m], DETAIL, False, width - 30) for m in MODES}
            ew = 26 + max(text_w(ln, DETAIL) for ls in lines.values() for ln in ls) + 14
            n = max(len(ls) for ls in lines.values())
            if x > 0 and (x + ew - 14 > width or n > 1):
                x, y = 0.0, y + row_h
            if x == 0:
                row_h = 0.0
            cells.append((k, x, y, lines))
            used_w = max(used_w, x + ew - 14)
            row_h = max(row_h, n * pitch)
            x += ew
            if n > 1:
                x = width  # an entry on two lines has its row to itself
        return cells, min(width, used_w), (y + row_h if cells else 0.0) + 8

    def legend_grid(self, keys: list[str], width: float) -> tuple[list[tuple[str, float, float, dict[str, list[str]]]], float, float]:
        """The tightest legend: aligned columns (two, split where the fewest rows result, or as
        many equal ones as the width holds), in order but for a short entry pulled forward to
        fill a row's free cell; an entry wider than its cell spans the next cells, one wider
        than the legend has a row to itself (on two lines)."""
        pitch = self.pitch()
        entries = []
        for k in keys:
            lines = {m: wrap(legend_words(k, True, True)[m], DETAIL, False, width - 32) for m in MODES}
            ew = 32 + max(self.legend_text_w(ln) for ls in lines.values() for ln in ls)  # swatch, gap, words and their slack
            entries.append((k, lines, ew, max(len(ls) for ls in lines.values())))

        def grid(edges: list[float]):
            """`edges`: each cell's left edge, then the legend's right edge."""
            cells, y, used_w, left = [], 0.0, 0.0, list(entries)
            while left:
                c, n = 0, 1
                while c < len(edges) - 1 and left:
                    # the next entry that fits from this cell on (the row's first: any entry)
                    e = left[0] if c == 0 else next((e for e in left if e[3] == 1 and edges[c] + e[2] <= edges[-1]), None)
                    if e is None:
                        break
                    left.remove(e)
                    cells.append((e[0], edges[c], y, e[1]))
                    used_w = max(used_w, edges[c] + e[2])
                    n = max(n, e[3])
                    if e[3] > 1:
                        break  # two lines: the row to itself
                    c = next((i for i in range(c + 1, len(edges) - 1) if edges[i] >= edges[c] + e[2] + 4), len(edges) - 1)
                y += n * pitch
            return cells, min(width, used_w), (y if cells else 0.0) + 2

        widest = max(e[2] for e in entries) if entries else width
        tries = [[0.0, min(max(ew + 4, 0.35 * width), 0.65 * width), width] for _, _, ew, _ in entries] + [[0.0, width / 2, width]]
        tries += [[width * i / k for i in range(k)] + [width] for k in range(3, int(width // min(widest + 4, width)) + 1)]
        return min((grid(x) for x in tries), key=lambda g: (g[2], g[1]))

    def legend_text_w(self, s: str) -> float:
        """A legend entry's words' width: the estimate, and at the tightest level (whose grid
        leaves no slack between cells) a little more for symbols set wider than estimated."""
        return text_w(s, DETAIL) * (1.08 if self.d.tight else 1.0)

    def pitch(self) -> float:
        """A flowed legend's line pitch: 12 pt words, and swatches a little shorter at the densest level."""
        return 15.0 if self.d.terse else 17.0

    def legend_size(self, used: set[str], width: float) -> tuple[float, float]:
        _, w, h = self.legend_cells(used, width)
        return w, h

    def place(self, scenes: list[Scene], used: set[str]) -> None:
        t = self.t
        # each scene's page box, side by side (TB) or stacked (LR), under one title
        placed = []
        for s in scenes:
            pts = []
            for b in s.boxes:
                X, Y = self.xy(s, b.u, b.v)
                pts += [(X - b.w / 2, Y - b.h / 2), (X + b.w / 2, Y + b.h / 2)]
            for f in s.frames:
                pts += [self.xy(s, f.u0, f.v0), self.xy(s, f.u1, f.v1)]
            for w in s.wires:  # a wire's pen over it is part of the page box: a thick main line clears the title
                pts += [(X, Y + self.pen(s, w) / 2) for X, Y in (self.xy(s, u, v) for u, v in w.pts)]
            x0, y0 = min(p[0] for p in pts), min(p[1] for p in pts)
            x1, y1 = max(p[0] for p in pts), max(p[1] for p in pts)
            placed.append((s, x0, y0, x1, y1))
        # offsets: TB places scenes left to right, LR top to bottom (first on top)
        offs = []
        if self.tb:
            cur = self.margin
            for s, x0, y0, x1, y1 in placed:
                offs.append((cur - x0, -y0))
                cur += (x1 - x0) + 36
        else:
            heights = [y1 - y0 for _, _, y0, _, y1 in placed]
            cur = sum(heights) + 36 * (len(placed) - 1)
            for (s, x0, y0, x1, y1), h in zip(placed, heights):
                cur -= h
                offs.append((self.margin - x0, cur - y0))
                cur -= 36
        body_w = max(o[0] + p[3] for o, p in zip(offs, placed)) + self.margin
        body_h = max(o[1] + p[4] for o, p in zip(offs, placed))
        # legend (and colour bar): in the free space over the last column (TB, one engine), to the
        # right, or below; with a size preset the first of these that fits, else to the right (TB)
        bar_h = 64.0 if self.scale else 0.0
        options = []
        if self.tb and len(placed) == 1 and len(scenes[0].columns) > 1:
            options.append("column")
        options += ["right", "below"] if self.tb else ["below", "right"]
        if self.size is None:
            options = ["right" if self.tb else "below"]
        W, H = SIZES[self.size] if self.size else (math.inf, math.inf)
        def legend_at(opt: str):
            if opt == "right":
                req = 260.0
                lw, lh = self.legend_size(used, req)
                lift = self.margin  # the body sits a margin up: the legend's top and the title clear it
                lx, ly = body_w + 12, max(body_h + lift, lh + bar_h + self.margin) - lh
                total_w, total_h = lx + lw + self.margin, ly + lh
                bx, by = lx, ly - bar_h
            elif opt == "below":
                req = max(body_w - 2 * self.margin, (W if self.size else 240.0) - 2 * self.margin)
                lw, lh = self.legend_size(used, req)
                lift = lh + bar_h + self.margin + (4 if self.d.tight else 6)
                lx, ly = self.margin, self.margin + bar_h
                bx, by = self.margin, self.margin
                total_w, total_h = max(body_w, lw + 2 * self.margin, 240.0 if bar_h else 0), body_h + lift
            else:  # over the last column, which is the shortest
                s0 = scenes[0]
                cdv, cneg, cpos, clen = s0.columns[-1]
                (X0, Y0), (X1, Y1) = self.xy(s0, 0, cdv - cneg), self.xy(s0, clen, cdv + cpos)
                X0, Y1 = X0 + offs[0][0], Y1 + offs[0][1]
                req = max(W - self.margin - X0, 120.0)  # as wide as the page leaves it: entries go on two lines
                lw, lh = self.legend_size(used, req)
                lift = self.margin
                lx, ly = X0, Y1 + 16 + bar_h + self.margin
                bx, by = lx, Y1 + 16 + self.margin
                total_w, total_h = max(body_w, lx + lw + self.margin), max(body_h + self.margin, ly + lh)
                lift = self.margin
            return lift, lx, ly, lw, lh, bx, by, total_w, total_h, req

        def overflow(r) -> float:
            return max(r[7] / W, (r[8] + 36) / H)

        tries = [legend_at(o) for o in options]
        fit = [r for r in tries if overflow(r) <= 1.0]
        lift, lx, ly, lw, lh, bx, by, total_w, total_h, req = fit[0] if fit else min(tries, key=overflow)
        # the figure title, and each engine's numbers: beside the title when one engine fits there
        names = ", ".join(e.name for e in self.engines)
        whats = {"cycle": {"ml": "residual stream", "both": "power cycle", "rocket": "power cycle"},
                 "graph": {"ml": "computation graph", "both": "computation graph", "rocket": "computation graph"}}[self.view]
        titles = {m: f"{names}: {w}" + (" \u00b7 annotated: \u2016dL/dx\u2016" if self.scale else "") for m, w in whats.items()}
        tsize = 18 if self.d.captions else 14
        limit = SIZES[self.size][0] - 2 * self.margin if self.size else max(total_w, 600.0)
        # a title wider than the preset goes on two lines (or more)
        tlines = {m: ([x] if self.size is None else wrap(x, tsize, True, limit - 6)) for m, x in titles.items()}
        tw = max(text_w(ln, tsize, True) for ls in tlines.values() for ln in ls)
        title_h = (28.0 if self.d.captions else 22.0) + (max(len(ls) for ls in tlines.values()) - 1) * tsize * 1.22

        def stats(s: Scene, named: bool = True) -> str:
            e = s.e
            width = f"d={e.width}" if self.d.tight else f"width {e.width}"  # tightest: the legend's d
            return (f"{e.name} \u00b7 " if named else "") + f"{params.human(params.count(e))} params \u00b7 {width} \u00b7 {s.lay.instance_count()} blocks"

        beside = len(placed) == 1 and tw + 16 + text_w(stats(placed[0][0]), DETAIL, True) <= limit
        # a subtitle wider than the preset goes on two lines (or more), broken at its dots; under
        # one engine's title, without the name the title already gives
        subs = {s.pre: ([stats(s)] if self.size is None or beside else wrap(stats(s, len(scenes) > 1 or self.level < 2), DETAIL, not self.d.tight, limit - 6))
                for s in scenes}
        sub_h = 0.0 if beside else (5.0 if self.d.tight else 8.0) + max(len(x) for x in subs.values()) * DETAIL * 1.22  # LR: the top engine's numbers over it
        top = total_h + sub_h + (5 if self.d.tight else 6)  # the subtitle clears a thick wire over the body
        for (s, x0, y0, x1, y1), (dx, dy) in zip(placed, offs):
            self.emit_scene(s, dx, dy + lift)
            lines = [Line(x, DETAIL, bold=not self.d.tight) for x in subs[s.pre]]  # tightest: plain, to keep it on one line
            sw, sh = lines_size(lines)
            if beside:
                X, Y = self.margin + tw + 16 + sw / 2 + 3, top + title_h / 2 - 2
            elif self.tb:
                X, Y = x0 + dx + sw / 2 + 3, top - sub_h / 2
            else:
                X, Y = x0 + dx + sw / 2 + 3, y1 + dy + lift + 12 + (len(lines) - 1) * DETAIL * 1.22 / 2
            self.text_node(f"{s.pre}subtitle", lines, X, Y, left=True)
        self.text_node("title", [Line(x, tsize, bold=True) for x in tlines[self.labels]], self.margin + tw / 2, top + title_h / 2, left=True, w=tw)
        self.legend(used, lx, ly, req)
        if self.scale:
            self.colour_bar(bx, by)
        self.W, self.H = math.ceil(max(total_w, self.margin + tw + self.margin)), math.ceil(top + title_h)  # whole points: the SVG's size is 1:1
        # pin the canvas to hold every node, in whole points (the SVG is then exactly 1:1)
        for _, a in self.nodes:
            X, Y = (float(q) for q in a["pos"].rstrip("!").split(","))
            self.W = max(self.W, math.ceil(X + float(a["width"]) * 36 + 2))
            self.H = max(self.H, math.ceil(Y + float(a["height"]) * 36 + 2))
        for nid, (X, Y) in (("canvas.lo", (0, 0)), ("canvas.hi", (self.W, self.H))):
            self.nodes.append((nid, {"pos": f"{X:.1f},{Y:.1f}!", "shape": "point", "style": "invis", "width": "0.01", "height": "0.01", "label": ""}))
        # the page itself, drawn first: the graph's own background is transparent, so every PNG
        # is RGBA whatever Graphviz would pick for an opaque one
        self.nodes.insert(0, ("canvas", {"pos": f"{self.W / 2:.1f},{self.H / 2:.1f}!", "shape": "box", "style": "filled", "fillcolor": self.t["bg"],
                                         "color": self.t["bg"], "penwidth": "0", "width": f"{self.W / 72:.3f}", "height": f"{self.H / 72:.3f}",
                                         "fixedsize": "true", "label": "", "class": "canvas"}))
        if self.size is not None:
            W, H = SIZES[self.size]
            if self.W > W + 0.5 or self.H > H + 0.5:
                raise Fit(f"the figure needs {self.W:.0f}\u00d7{self.H:.0f} pt; --size {self.size} is {W:.0f}\u00d7{H:.0f} pt "
                          f"at 12 pt text", max(self.W / W, self.H / H))
        if max(self.W, self.H) > MAX_POINTS:
            raise Fit(f"the figure would be {self.W:.0f}\u00d7{self.H:.0f} pt; a figure is at most {MAX_POINTS:.0f} pt on a side", cap=True)

    # -- emission -----------------------------------------------------------------------------

    def text_node(self, nid: str, lines: list[Line], X: float, Y: float, key: str = "text", left: bool = False, w: float | None = None,
                  pad: float = 4.0) -> None:
        """A piece of text centred at (X, Y); `w`: the width to size it for (the widest of the
        label modes, so the words never move the layout); `pad`: room above and below, in all."""
        w0, h = lines_size(lines)
        w = w0 if w is None else w
        label = html_label(lines, self.t, align="left" if left else "")
        if left:  # set from the box's left edge (the estimate of its width is generous)
            label = (f'<<table border="0" cellborder="0" cellspacing="0" cellpadding="0"><tr><td width="{w + 6:.0f}" height="{h + max(0.0, pad - 2):.0f}" '
                     f'fixedsize="true" align="left">{label[1:-1]}</td></tr></table>>')
        self.nodes.append((nid, {"pos": f"{X:.1f},{Y:.1f}!", "shape": "plaintext", "label": label, "width": f"{(w + 6) / 72:.3f}",
                                 "height": f"{(h + pad) / 72:.3f}", "fixedsize": "true", "margin": "0", "class": key}))

    def box_attrs(self, b: Box) -> dict:
        t = self.t
        shape = b.shape
        attrs = {"fixedsize": "true", "width": f"{b.w / 72:.3f}", "height": f"{b.h / 72:.3f}", "margin": "0", "class": f"{b.key} {b.path}".strip()}
        fill = {"feed": t["feed"], "tokens": t["feed"], "head": t["nozzle"], "vent": t["vent_fill"], "split": t["chamber"], "logits": t["bg"],
                "stage": t["stage_fill"]}.get(b.key)
        if b.key.startswith("kind_"):
            from .style import KIND_FILL

            fill = t[KIND_FILL.get(b.key[len("kind_"):], "other")]
        color = {"vent": t["vent"], "split": t["chamber"], "stage": t["stage_border"]}.get(b.key, t["chamber"])
        if b.key.startswith("merge_"):
            fill, color = t["junction"], t["chamber"]
        if shape == "rounded":
            attrs.update(shape="box", style="rounded,filled")
        elif shape == "text":
            attrs.update(shape="plaintext")
        elif shape == "point":
            attrs.update(shape="circle", style="filled")
        elif shape == "circle":
            attrs.update(shape="circle", style="filled,bold")
        elif shape == "trapezium":
            out_right = (b.key == "vent" and self.tb) or (b.key == "head" and not self.tb)
            attrs.update(shape="trapezium" if not out_right else "trapezium", style="filled",
                         orientation="90" if out_right else ("180" if b.key == "head" else "0"))
        elif shape == "cylinder":
            attrs.update(shape="cylinder", style="filled")
        if fill and shape != "text":
            attrs["fillcolor"] = fill
        if shape != "text":
            attrs["color"] = color
            attrs["penwidth"] = "2" if shape == "circle" else "1.2"
        if b.tooltip:
            attrs["tooltip"] = b.tooltip
        if shape == "circle":
            attrs["label"] = f'<<font point-size="{b.font}" color="{t["chamber"]}"><b>+</b></font>>'
        elif shape == "point":
            attrs["label"] = ""
        elif b.htmls:
            attrs["label"] = f"<{b.htmls[self.labels]}>"
        else:
            attrs["label"] = html_label(b.words.get(self.labels, []), t, b.html)
        return attrs

    def emit_scene(self, s: Scene, dx: float, dy: float) -> None:
        t = self.t
        for f in sorted(s.frames, key=lambda f: f.depth):
            if f.key == "summary":  # a stage drawn as one box: its box is drawn, the frame only places its readings
                continue
            (X0, Y0), (X1, Y1) = self.xy(s, f.u0, f.v0), self.xy(s, f.u1, f.v1)
            X0, X1 = sorted((X0, X1))
            Y0, Y1 = sorted((Y0, Y1))
            self.nodes.append((f.id, {"pos": f"{(X0 + X1) / 2 + dx:.1f},{(Y0 + Y1) / 2 + dy:.1f}!", "shape": "box", "style": "rounded,filled",
                                      "fillcolor": t["stage_fill"], "color": t["stage_border"], "penwidth": "1.5" if f.key == "stage" else "1",
                                      "width": f"{(X1 - X0) / 72:.3f}", "height": f"{(Y1 - Y0) / 72:.3f}", "fixedsize": "true", "label": "",
                                      "class": f"frame {f.path}"}))
        for b in s.boxes:
            X, Y = self.xy(s, b.u, b.v)
            self.nodes.append((b.id, {"pos": f"{X + dx:.1f},{Y + dy:.1f}!", **self.box_attrs(b)}))
        for w in s.wires:
            self.wire(s, w, dx, dy)
        if self.scale:
            self.values(s, dx, dy)

    @staticmethod
    def pen(s: Scene, w: Wire) -> float:
        """A wire's pen width: the main line's in proportion to the chamber's width."""
        return {"main": max(1.5, 8.0 * w.width / max(1, s.max_width)), "link": 1.5, "branch": 2.0, "cut": 2.0, "vent": 2.0, "spark": 1.5}[w.kind]

    STREAM_GAP = 3.5  # points between the streams of a chamber of several (hyper-connections)

    def wire(self, s: Scene, w: Wire, dx: float, dy: float, pen: float | None = None) -> None:
        t = self.t
        if pen is None and w.kind == "main" and s.streams > 1 and w.path.startswith("stages"):
            # a chamber of several streams: one thin line per stream, side by side across the main line
            for k in range(s.streams):
                off = (k - (s.streams - 1) / 2) * self.STREAM_GAP
                self.wire(s, replace(w, id=f"{w.id}.s{k}", pts=[(u, v + off) for u, v in w.pts]), dx, dy, pen=1.4)
            return
        pts = [self.xy(s, u, v) for u, v in w.pts]
        pts = [(X + dx, Y + dy) for X, Y in pts]
        pts = [p for i, p in enumerate(pts) if i == 0 or (abs(p[0] - pts[i - 1][0]) + abs(p[1] - pts[i - 1][1])) > 0.05]
        if len(pts) < 2:
            return
        attrs = {"class": f"{w.kind} {w.path}".strip(), "arrowhead": "none"}
        color = {"main": t["chamber"], "branch": t["branch"], "cut": t["cut"], "vent": t["vent"], "spark": t["spark"], "link": t["chamber"]}[w.kind]
        width = self.pen(s, w) if pen is None else pen
        if w.value is not None:
            color = ZERO if w.value == 0 else colour(log_pos(w.value, self.scale))
            what = "\u2016dL/dx\u2016" if w.table == "chain" else "gradient norm"
            attrs["tooltip"] = f"{w.path}: {what} = {text.num(w.value)}"
            attrs["class"] += f" value={text.num(w.value)}"
        style = "dashed" if (w.dashed or (w.value == 0 and w.value is not None)) else ("dotted" if w.dotted else "")
        if style:
            attrs["style"] = style
        tip = pts[-1]
        spline = list(pts)
        # a thick line's own arrowhead would be stroked with the line's pen, a blot that runs into
        # the box it points at: its head is a triangle of its own, a little wider than the line
        own_head = w.arrow and width > 2.5
        if w.arrow:
            (ax, ay), (bx, by) = pts[-2], pts[-1]
            L = math.hypot(bx - ax, by - ay)
            cut = min(7.0, L * 0.6) if not own_head else min(8.0, L * 0.8)
            spline[-1] = (bx - (bx - ax) * cut / L, by - (by - ay) * cut / L)
            if own_head:
                ux, uy, h = (bx - ax) / L, (by - ay) / L, cut / 0.75  # a triangle's base sits a quarter of its box under its centre
                orient = 0 if uy > 0.5 else 180 if uy < -0.5 else 270 if ux > 0 else 90
                self.nodes.append((f"{w.id}.head", {"pos": f"{bx - ux * h / 2:.1f},{by - uy * h / 2:.1f}!", "shape": "triangle", "fixedsize": "true",
                                                    "width": f"{(width + 6) / 72:.3f}", "height": f"{h / 72:.3f}", "style": "filled", "fillcolor": color,
                                                    "color": color, "penwidth": "0", "orientation": str(orient), "label": "",
                                                    "class": f"arrowhead {w.path}".strip()}))
            else:
                attrs["arrowhead"] = "normal"
                attrs["arrowsize"] = "0.6"
        bez = [spline[0]]
        for (ax, ay), (bx, by) in zip(spline, spline[1:]):
            bez += [(ax + (bx - ax) / 3, ay + (by - ay) / 3), (ax + 2 * (bx - ax) / 3, ay + 2 * (by - ay) / 3), (bx, by)]
        pos = " ".join(f"{x:.1f},{y:.1f}" for x, y in bez)
        attrs["pos"] = (f"e,{tip[0]:.1f},{tip[1]:.1f} " if w.arrow and not own_head else "") + pos
        attrs.update(color=color, penwidth=f"{width:.2f}")
        a, b = f"{w.id}.a", f"{w.id}.b"
        for nid, (X, Y) in ((a, pts[0]), (b, tip)):
            self.nodes.append((nid, {"pos": f"{X:.1f},{Y:.1f}!", "shape": "point", "style": "invis", "width": "0.01", "height": "0.01", "label": ""}))
        self.edges.append((a, b, attrs))

    def values(self, s: Scene, dx: float, dy: float) -> None:
        """The readings printed where they are measured: ‖dL/dx‖ entering each stage at its
        frame's edge (and leaving the last); each branch's gradient norm is in its title, and
        a cut says 0. One number per wire."""
        rd = s.readings or {}
        top = [f for f in s.frames if f.depth == 0]
        for f in s.frames:
            for table, u, where in (("chain", f.u0, "in"), ("exit", f.u1, "out")):
                v = rd.get(table, {}).get(f.path)
                if where == "out" and f is not top[-1]:
                    continue  # the next frame's "in" is the same wire: one value per wire
                if v is None:
                    continue
                lab = [Line(text.num(v), DETAIL, bold=True)]
                w, h = lines_size(lab)
                X, Y = self.xy(s, u, f.v0)
                if self.tb:
                    X, Y = X - w / 2 - 6, Y + (h / 2 + 2 if where == "in" else -h / 2 - 2)
                else:
                    X, Y = X + (w / 2 + 2 if where == "in" else -w / 2 - 2), Y - h / 2 - 4
                self.text_node(f"{f.id}.{where}", lab, X + dx, Y + dy, key=f"value {table} {f.path}")

    def legend(self, used: set[str], x: float, y: float, width: float) -> None:
        """The legend, its bottom left corner at (x, y)."""
        cells, _, h = self.legend_cells(used, width)
        top = y + h - (20.0 if self.level == 0 else 2.0 if self.d.tight else 8.0)  # the grid keeps its old margin below
        pitch = 20.0 if self.level == 0 else self.pitch()
        for k, cx, cy, lines in cells:
            n = len(lines[self.labels])
            X, Y = x + cx, top - cy - (pitch / 2 if self.level == 0 else pitch * max(len(ls) for ls in lines.values()) / 2)
            if self.level == 0:
                Y = top - cy - pitch + 10
            self.swatch(k, X + 12, Y)
            widest = max(self.legend_text_w(ln) for ls in lines.values() for ln in ls)
            self.text_node(f"legend.{k}.text", [Line(w, DETAIL) for w in lines[self.labels]], X + 26 + widest / 2 + 3, Y,
                           key=f"legend_text {k}", left=True, w=widest, pad=4.0 if self.level == 0 else 0.5)

    def swatch(self, key: str, X: float, Y: float) -> None:
        t = self.t
        nid = f"legend.{key}"
        if key == "streams":  # thin lines side by side, as the figure draws a chamber of several streams
            for k in range(3):
                a, b, y = f"{nid}.{k}.a", f"{nid}.{k}.b", Y + (k - 1) * self.STREAM_GAP
                for n2, XX in ((a, X - 11), (b, X + 11)):
                    self.nodes.append((n2, {"pos": f"{XX:.1f},{y:.1f}!", "shape": "point", "style": "invis", "width": "0.01", "height": "0.01", "label": ""}))
                self.edges.append((a, b, {"pos": f"{X - 11:.1f},{y:.1f} {X - 4:.1f},{y:.1f} {X + 4:.1f},{y:.1f} {X + 11:.1f},{y:.1f}",
                                          "color": t["chamber"], "penwidth": "1.4", "arrowhead": "none", "class": f"legend {key}"}))
            return
        if key in ("main", "branch", "cut", "vent", "spark"):
            x0, x1 = (X - 13, X - 3) if key == "vent" else (X - 11, X + 11)
            color = {"main": t["chamber"], "branch": t["branch"], "cut": t["cut"], "vent": t["vent"], "spark": t["spark"]}[key]
            width = {"main": "6", "branch": "2", "cut": "2", "vent": "2", "spark": "1.5"}[key]
            a, b = f"{nid}.a", f"{nid}.b"
            for n2, XX in ((a, x0), (b, x1)):
                self.nodes.append((n2, {"pos": f"{XX:.1f},{Y:.1f}!", "shape": "point", "style": "invis", "width": "0.01", "height": "0.01", "label": ""}))
            xa, xb = x0 + (x1 - x0) / 3, x0 + 2 * (x1 - x0) / 3
            attrs = {"pos": f"{x0:.1f},{Y:.1f} {xa:.1f},{Y:.1f} {xb:.1f},{Y:.1f} {x1:.1f},{Y:.1f}", "color": color, "penwidth": width,
                     "arrowhead": "none", "class": f"legend {key}"}
            if key == "cut":
                attrs["style"] = "dashed"
            self.edges.append((a, b, attrs))
            if key != "vent":
                return
            X, nid = X + 6, f"{nid}.nozzle"  # the dump nozzle the line ends in
        if key in ("stage", "repeat", "elided"):
            lab = {"stage": "", "repeat": "\u00d7N", "elided": "\u22ef"}[key]
            attrs = {"shape": "box", "style": "rounded,filled", "fillcolor": t["stage_fill"], "color": t["stage_border"], "label":
                     f'<<font point-size="12"><b>{esc(lab)}</b></font>>' if lab else "", "width": "0.33", "height": "0.22"}
        elif key.startswith("mask_"):  # the mask's own picture, small
            from types import SimpleNamespace

            from .text import mask_table

            op = SimpleNamespace(mask="causal" if key.startswith("mask_causal") else "open", window=2 if key.endswith("_window") else None)
            table, side = mask_table(op, t, 2)
            attrs = {"shape": "plaintext", "width": "0.25", "height": "0.25", "label": f"<{table}>"}
        elif key in ("heads", "kv_heads", "experts"):
            ink = {"heads": t["q"], "kv_heads": t["kv"], "experts": t["expert_on"]}[key]
            attrs = {"shape": "plaintext", "label": f'<<table border="0" cellspacing="1" cellpadding="0"><tr><td width="7" height="7" fixedsize="true" bgcolor="{ink}" border="1" color="{t["cell_border"]}"></td></tr></table>>',
                     "width": "0.2", "height": "0.2"}
        else:
            b = Box(nid, 0, 0, 22, 13 if self.d.terse else 16, "circle" if key.startswith("merge_") else self.shapes.get(key, "rounded"), key)
            if key == "split":
                b.w = b.h = 7
            if key.startswith("merge_"):
                b.w = b.h = 14 if self.d.terse else 16
                b.font = 12
            if b.shape == "trapezium":
                b.w = 14 if key == "vent" else 18
            attrs = self.box_attrs(b)
            attrs["label"] = attrs["label"] if key.startswith("merge_") else ""
            attrs["class"] = f"legend {key}"
            attrs["width"], attrs["height"] = f"{b.w / 72:.3f}", f"{b.h / 72:.3f}"
        attrs.setdefault("fixedsize", "true")
        attrs["class"] = f"legend {key}"
        self.nodes.append((nid, {"pos": f"{X:.1f},{Y:.1f}!", **attrs}))

    def colour_bar(self, x: float, y: float) -> None:
        """The annotate scale: log decades with their numbers, and the grey of an exact zero."""
        lo, hi = self.scale
        decades = round(math.log10(hi / lo))
        per = 4
        cells = "".join(f'<td width="14" height="12" fixedsize="true" bgcolor="{colour((i + 0.5) / (decades * per))}"></td>' for i in range(decades * per))
        def tick(d: int, span: int, align: str) -> str:
            return f'<td colspan="{span}" align="{align}"><font point-size="12">{esc(text.num(lo * 10 ** d))}</font></td>'

        ticks = tick(0, per // 2, "left") + "".join(tick(d, per, "center") for d in range(1, decades)) + tick(decades, per // 2, "right")
        html = (f'<<table border="0" cellspacing="0" cellpadding="1"><tr><td colspan="{decades * per + 2}" align="left"><font point-size="12"><b>'
                f'\u2016dL/dx\u2016, log scale</b></font></td></tr>'
                f'<tr>{cells}<td width="8"></td><td width="14" height="12" fixedsize="true" bgcolor="{ZERO}"></td></tr>'
                f'<tr>{ticks}<td></td><td><font point-size="12">0</font></td></tr></table>>')
        w = decades * per * 14 + 40
        self.nodes.append(("colourbar", {"pos": f"{x + w / 2:.1f},{y + 30:.1f}!", "shape": "plaintext", "label": html, "width": f"{w / 72:.3f}",
                                         "height": f"{60 / 72:.3f}", "fixedsize": "true", "class": f"colourbar {text.num(lo)} {text.num(hi)}"}))

    # -- DOT ----------------------------------------------------------------------------------

    def dot(self) -> str:
        t = self.t

        def attrs(d: dict) -> str:
            items = sorted(d.items(), key=lambda kv: (kv[0] != "label", kv[0]))
            return " ".join(f"{k}={_q(v)}" for k, v in items)

        out = [f"digraph {_q('figure')} {{",
               f"\tgraph [bb={_q(f'0,0,{self.W:.1f},{self.H:.1f}')} bgcolor=\"transparent\" fontname={_q(FONT)} outputorder=nodesfirst pad=0 "
               f"splines=true]",
               f"\tnode [fontcolor={_q(t['fg'])} fontname={_q(FONT)}]",
               f"\tedge [fontname={_q(FONT)}]"]
        for nid, a in self.nodes:
            out.append(f"\t{_q(nid)} [{attrs(a)}]")
        for a, b, d in self.edges:
            out.append(f"\t{_q(a)} -> {_q(b)} [{attrs(d)}]")
        out.append("}")
        return "\n".join(out) + "\n"


def _q(v) -> str:
    s = str(v)
    if s.startswith("<") and s.endswith(">"):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
