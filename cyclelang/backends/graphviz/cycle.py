"""The power-cycle view: the engine drawn as a propulsion schematic.

The main chamber (residual stream) is one heavy straight line from the tanks to
the nozzle; every prechamber leaves it at a split point, does its work on a side
branch and returns its exhaust at a merge junction. Node ids are IR paths
(`b0.o1.t1`: body item 0, stage op 1, branch op 1), never names, so a spec's
names reach the DOT only inside escaped labels.
"""

from __future__ import annotations

import graphviz

from ... import ir
from . import params, text
from .style import FONT, THEMES, esc, label

# A long engine wraps into rows no wider than about this many points (2600 px at the
# 150 dpi of a PNG), between stages or between a stage's branches, so that a cycle
# view keeps a slide's proportions. Widths are estimated from the labels' text.
ROW_POINTS = 1150
RANKSEP = 18.0  # ranksep 0.25 in


def text_w(s: str | None, size: float, bold: bool = False) -> float:
    """About how wide Helvetica sets `s` at `size` points (a deterministic estimate)."""
    return len(s or "") * size * (0.6 if bold else 0.53)


class Options:
    def __init__(self, *, expand: bool, labels: str, rankdir: str, theme: str, annotate=None):
        self.expand, self.labels, self.rankdir, self.theme = expand, labels, rankdir, theme
        self.annotate = annotate  # readings keyed by layout path to restyle edges from (see annotate.py), or None


def new_graph(name: str, title: str, opts: Options, t: dict[str, str], **graph_attr) -> graphviz.Digraph:
    g = graphviz.Digraph(name=name)
    g.attr(
        "graph",
        bgcolor=t["bg"],
        fontcolor=t["fg"],
        fontname=FONT,
        label=label(title, None, muted=t["muted"], size=18),
        labelloc="t",
        labeljust="l",
        rankdir=opts.rankdir,
        **graph_attr,
    )
    g.attr("node", fontname=FONT, fontcolor=t["fg"], color=t["fg"], penwidth="1.2")
    g.attr("edge", fontname=FONT, fontcolor=t["muted"], fontsize="11")
    return g


class CycleView:
    def __init__(self, engine: ir.Engine, opts: Options):
        self.e, self.o, self.t = engine, opts, THEMES[opts.theme]
        self.used: set[str] = set()  # legend entries that appear
        # Edges are written last, at the top level: an edge statement inside a cluster
        # would pull both of its ends into that cluster.
        self.edges: list[tuple[str, str, dict]] = []
        self.merges: set[str] = set()  # points on the main line a next branch may split from
        self.last_branch: str | None = None  # the last node of the latest branch on this row
        # Layout paths: the edges say which part of the model they stand for.
        self.layout = ir.layout.layout(engine)
        self.stage_layout = {sl.index: sl for sl in self.layout.stages}
        self.branch_attr = {id(b.branch): b.attr for sl in self.layout.stages for b in sl.branches()}
        self.ctx: tuple[str, str] | None = None  # ("chain" | "exit", stage path) for main-line edges
        self.stage_here: str | None = None  # the path of the stage being drawn
        self.branch_path: str | None = None  # the path of the prechamber being drawn
        title = self.title()
        self.g = new_graph(
            "cycle", title, opts, self.t,
            nodesep="0.2", ranksep="0.25", newrank="true", splines="spline", forcelabels="true",
        )

    def title(self) -> str:
        return f"{self.e.name}: " + ("residual stream" if self.o.labels == "ml" else "power cycle")

    # -- drawing primitives ----------------------------------------------------

    def words(self, w: text.Words) -> tuple[str, str]:
        return text.pick(w, self.o.labels)

    def lab(self, title, detail=None, **kw) -> str:
        return label(title, detail, muted=self.t["muted"], **kw)

    def main_node(self, g, nid: str, lbl: str, span=None, **attrs) -> None:
        attrs.setdefault("group", "main")  # keeps the chamber line straight
        if span is not None:
            attrs["tooltip"] = f"line {span.line}"
        g.node(nid, lbl, **attrs)

    def flow(self, g, a: str, b: str, **attrs) -> None:
        """The main chamber: heavy, straight, high pressure. The edge's class names the
        layout path it stands for: `chain stages.0-11` inside a stage, `exit stages.0-11`
        from a stage's end to what follows on the main line."""
        if self.ctx is not None:
            attrs.setdefault("class", " ".join(self.ctx))
        self.edges.append((a, b, {"color": self.t["chamber"], "penwidth": "6", "weight": "100", "arrowsize": "0.5", **attrs}))

    def branch(self, g, a: str, b: str, **attrs) -> None:
        """A branch's flow; its class is `branch PATH`, the prechamber's layout path."""
        if self.branch_path is not None:
            attrs.setdefault("class", f"branch {self.branch_path}")
        self.edges.append((a, b, {"color": self.t["branch"], "penwidth": "2", "arrowsize": "0.7", **attrs}))

    def junction(self, g, nid: str, kind: str) -> None:
        t = self.t
        if kind == "split":
            g.node(nid, "", shape="point", width="0.14", color=t["chamber"], group="main", ordering="out")
        else:
            self.merges.add(nid)
            g.node(nid, "+", shape="circle", width="0.34", fixedsize="true", fontsize="16", style="filled,bold",
                   fillcolor=t["junction"], color=t["chamber"], fontcolor=t["chamber"], group="main", penwidth="2.5",
                   ordering="out")

    # -- the engine ------------------------------------------------------------

    def build(self) -> graphviz.Digraph:
        e, t, g = self.e, self.t, self.g
        f = text.feed(e.feed)
        title, detail = self.words(f)
        tank_t = "tanks" if self.o.labels != "ml" else "tokens"
        self.main_node(g, "feed.tank", self.lab(tank_t, f"vocab {e.feed.vocab:,}", size=13), e.feed.span,
                       shape="cylinder", style="filled", fillcolor=t["feed"], color=t["chamber"])
        pump_t = "embedding" if self.o.labels == "ml" else "feed pumps"
        pos = {"learned": "+ learned positions", "sinusoidal": "+ sinusoidal positions", "none": None}[e.feed.position]
        pump_d = f"{e.feed.vocab:,}{text.TIMES}{e.feed.width}" if self.o.labels != "rocket" else f"width {e.feed.width}"
        extra = [x for x in (pos if self.o.labels != "rocket" else None, self._feed_extra(e.feed)) if x]
        self.main_node(g, "feed.pump", self.lab(pump_t, pump_d, extra=extra, size=13), e.feed.span,
                       shape="box", style="rounded,filled", fillcolor=t["feed"], color=t["chamber"])
        self.flow(g, "feed.tank", "feed.pump")
        cur = "feed.pump"
        units = self.units()
        widths = [self.est_feed()] + [self.est_unit(op, j) for _, op, _, j in units]
        widths[-1] += self.est_nozzle()
        # A row never starts with an overboard branch: with no branch before it on its row,
        # nothing keeps it above the line.
        # A stage breaks inside only when it is long (over half a row).
        span: dict[str, float] = {}
        for k, (path, _, _, j) in enumerate(units):
            span[path] = span.get(path, 0.0) + widths[k + 1]
        breaks = rows(widths, keep={k + 1 for k, (path, op, _, j) in enumerate(units)
                                    if j and (getattr(op.ops[j], "overboard", False) or span[path] < ROW_POINTS / 2)})
        k = 0
        while k < len(units):
            if k and k + 1 in breaks:
                cur = self.connector(g, len([b for b in breaks if b <= k + 1]) - 1, cur)
            path, op, rep, j = units[k]
            if j is None:
                cur = self.main_op(g, path, op, rep, cur)
                k += 1
                continue
            end = k + 1  # this stage's units up to its end or the next row break
            while end < len(units) and units[end][0] == path and end + 1 not in breaks:
                end += 1
            cur = self.stage(g, path, op, rep, cur, [u[3] for u in units[k:end]])
            k = end
        nz = text.nozzle(e.nozzle)
        nz_t, nz_d = self.words(nz)
        if self.o.labels == "both":
            nz_d = nz.ml
        self.main_node(g, "nozzle", self.lab(nz_t, nz_d, extra=nz.ml_detail if self.o.labels == "both" else None, size=13, detail_size=10),
                       e.nozzle.span, shape="trapezium", orientation="270", style="filled", fillcolor=t["nozzle"],
                       color=t["chamber"], margin="0")
        self.flow(g, cur, "nozzle")
        self.throat_note(g)
        if self.o.annotate is not None:
            from .annotate import apply

            apply(self.edges, self.o.annotate)
        for a, b, attrs in self.edges:
            g.edge(a, b, **attrs)
        self.legend()
        return g

    def units(self) -> list[tuple[str, object, int | None, int | None]]:
        """The pieces a row may break between: (path, op, repeat index, op index in the
        stage, or None for a piece on the main line outside any stage). A long stage may
        break between its ops; it is then drawn as two clusters, the second "continued"."""
        out = []
        for path, op, rep in self.items():
            if isinstance(op, ir.Stage) and op.ops:
                out += [(path, op, rep, j) for j in range(len(op.ops))]
            else:
                out.append((path, op, rep, None))
        return out

    # -- width estimates (points, from the labels' text; no Graphviz needed) ----

    def est_feed(self) -> float:
        f = self.e.feed
        return 2 * RANKSEP + max(60.0, text_w(f"vocab {f.vocab:,}", 11) + 20) + text_w(f"{f.vocab:,}{text.TIMES}{f.width}, + sinusoidal positions"[:22], 11) + 24

    def est_nozzle(self) -> float:
        nz, th = text.nozzle(self.e.nozzle), text.throat(self.e.throat)
        note = max(text_w(th.rocket_detail, 10), text_w(th.ml_detail, 10)) + 20  # the throat note sits level with it
        return RANKSEP + max(text_w(nz.ml_detail, 10), text_w(nz.rocket, 13, bold=True), note / 2) + 40 + note / 2

    def est_op(self, op, on_branch: bool) -> float:
        if isinstance(op, ir.Norm):
            return 76.0
        w = text.turbine(op)
        if self.o.labels == "ml" or (self.o.labels == "both" and not on_branch):
            lines = [(w.ml, 13, True), (w.ml_detail, 11, False)]
        else:
            lines = [(w.rocket, 13, True), (w.rocket_detail, 11, False)]
        lines.append(("123.4K params", 11, False))
        return max(text_w(s, size, bold) for s, size, bold in lines) + 18

    def est_branch(self, p: ir.Prechamber) -> float:
        inner = sum(self.est_op(op, True) + RANKSEP for op in p.ops)
        if p.overboard:  # the vent, then the line runs on to a point level with it
            inner += 4 * (90 + RANKSEP)
        else:
            m = text.merge(p.merge, params.merge_count(p.merge, p.width, p.out_width), self.o.labels)
            inner += text_w(m, 10) + RANKSEP + 25
        if p.detach:
            inner += text_w("cut: detach", 10)
        first, *rest = text.wrap(text.prechamber(p, self.o.labels), 30)
        title = max([text_w(first, 12, True)] + [text_w(x, 11) for x in rest]) + 16
        return max(inner, title + 25)

    def est_unit(self, op, j: int | None) -> float:
        """About how wide a piece draws: its nodes, edge labels and ranks, or its
        cluster's title where that is wider."""
        if j is not None:
            x = op.ops[j]
            w = 24.0 if j == 0 or j == len(op.ops) - 1 else 0.0  # the stage cluster's margins
            if isinstance(x, ir.Prechamber):
                return w + RANKSEP + 10 + self.est_branch(x)
            if isinstance(x, ir.Fullflow):
                return w + RANKSEP + 10 + (76 + RANKSEP if x.norm is not None else 0) + max(self.est_branch(b) for b in x.branches)
            return w + RANKSEP + self.est_op(x, False)
        if isinstance(op, ir.Stage):
            return 24.0 + text_w(text.stage(op, None), 15, True)
        return RANKSEP + self.est_op(op, False)

    def items(self) -> list[tuple[str, object, int | None]]:
        """The main line's top-level pieces in order: (path, op, repeat index); an
        expanded stage gives one piece per repeat, so rows may break between them."""
        out = []
        for i, op in enumerate(self.e.body):
            if isinstance(op, ir.Stage) and self.o.expand and op.repeat > 1:
                out += [(f"b{i}.r{r}", op, r) for r in range(op.repeat)]
            else:
                out.append((f"b{i}", op, None))
        return out

    def connector(self, g, n: int, cur: str) -> str:
        """Wrap the main line onto a new row: it runs into a lettered connector at the
        row's end and leaves the same letter at the next row's start (the schematic
        convention for a line continued elsewhere). No edge joins the two, so each row
        is laid out on its own, one under the other, with no line running back."""
        t = self.t
        letter = chr(ord("A") + n) if n < 26 else str(n + 1)
        a, b = f"row{n}.out", f"row{n}.in"
        for nid, tip in ((a, "continues on the next row"), (b, "continued from the row above")):
            g.node(nid, letter, shape="circle", style="filled", fillcolor=t["chamber"], color=t["chamber"],
                   fontcolor=t["junction"], fontsize="14", width="0.36", fixedsize="true", group="main", tooltip=tip)
        self.flow(g, cur, a)
        self.edges.append((a, b, {"constraint": "false", "style": "invis"}))
        self.last_branch = None
        return b

    def throat_note(self, g) -> None:
        """The throat is annotation, not a component: the mask acts in every injector,
        so it is a note pinned above the nozzle's narrow end, dotted, with no flow."""
        t = self.t
        th = text.throat(self.e.throat)
        if self.o.labels == "ml":
            title, detail = th.ml, th.ml_detail
        elif self.o.labels == "rocket":
            title, detail = th.rocket, th.rocket_detail
        else:
            title, detail = f"{th.rocket} = {th.ml}", th.rocket_detail
        g.node("throat", self.lab(title, detail, size=11, detail_size=10), shape="note", style="dashed",
               color=t["muted"], fontcolor=t["muted"], margin="0.08,0.04")
        with g.subgraph() as r:
            r.attr(rank="same")
            r.node("throat")
            r.node("nozzle")
        g.edge("throat", "nozzle", style="dotted", color=t["muted"], arrowhead="none", penwidth="1.2")

    def _feed_extra(self, f: ir.Feed) -> str | None:
        bits = []
        if f.scale != 1.0:
            bits.append(f"scaled {text.TIMES}{text.num(f.scale)}")
        if f.dropout:
            bits.append(f"dropout {text.num(f.dropout)}")
        return ", ".join(bits) or None

    def main_op(self, g, path: str, op, rep: int | None, cur: str) -> str:
        if isinstance(op, ir.Stage):
            return self.stage(g, path, op, rep, cur)
        out = self.series_valve(g, path, op, cur) if isinstance(op, ir.Norm) else self.series_turbine(g, path, op, cur)
        self.ctx = None  # past an engine-level op, the flow is no stage's any more
        return out

    def stage(self, g, path: str, s: ir.Stage, rep: int | None, cur: str, ops: list[int] | None = None) -> str:
        """A stage's cluster, or the part of it holding `ops` (indices) when a row break
        falls inside it: the part after a break is its own cluster, titled "continued"."""
        t = self.t
        n = params.count(s)
        each = " each" if s.repeat > 1 and rep is None else ""
        ops = list(range(len(s.ops))) if ops is None else ops
        sl = self.stage_layout[int(path[1:].split(".")[0])]
        self.stage_here = sl.path if rep is None else sl.instance(rep)
        self.ctx = ("chain", self.stage_here)
        name, title, detail = f"cluster_{path}", text.stage(s, rep), f"{params.human(n)} params{each}"
        if ops and ops[0] > 0:
            name, title, detail = f"cluster_{path}.c{ops[0]}", f"{title}  (continued)", None
        with g.subgraph(name=name) as c:
            c.attr(label=self.lab(title, detail, size=15, align="left"),
                   style="rounded,filled", fillcolor=t["stage_fill"], color=t["stage_border"],
                   penwidth="1.5", labeljust="l", margin="12")
            if s.repeat > 1 and rep is None:
                self.used.add("repeat")
            for j in ops:
                cur = self.stage_op(c, f"{path}.o{j}", s.ops[j], cur)
        self.ctx = ("exit", self.stage_here)
        return cur

    def stage_op(self, g, path: str, op, cur: str) -> str:
        if isinstance(op, ir.Prechamber):
            return self.prechamber(g, path, op, cur)
        if isinstance(op, ir.Fullflow):
            return self.fullflow(g, path, op, cur)
        if isinstance(op, ir.Norm):
            return self.series_valve(g, path, op, cur)
        return self.series_turbine(g, path, op, cur)

    def series_valve(self, g, path: str, op: ir.Norm, cur: str) -> str:
        self.used.add("valve_main")
        t = self.t
        title, detail = self.words(text.norm(op, on_branch=False))
        if self.o.labels == "both":
            detail = text.pick(text.norm(op, False), "ml")[0]
        self.main_node(g, path, label(title, detail, muted=t["valve_main_text"], size=11, detail_size=9), op.span,
                       shape="diamond", style="filled", fillcolor=t["valve_main"], color=t["chamber"],
                       fontcolor=t["valve_main_text"], fixedsize="true", width="1.05", height="0.62")
        self.flow(g, cur, path)
        return path

    def series_turbine(self, g, path: str, op, cur: str) -> str:
        self.used.add("turbine_main")
        self.turbine_node(g, path, op, on_main=True, penwidth="3", color=self.t["chamber"], group="main")
        self.flow(g, cur, path)
        return path

    def turbine_node(self, g, nid: str, op, on_main: bool = False, **attrs) -> None:
        w = text.turbine(op)
        if self.o.labels == "ml" or (self.o.labels == "both" and on_main):
            title, detail = w.ml, w.ml_detail
        else:  # the branch's label already carries the network words
            title, detail = w.rocket, w.rocket_detail
        attrs.setdefault("color", self.t["branch"])
        g.node(nid, self.lab(title, detail, extra=f"{params.human(params.count(op))} params", size=13),
               shape="box", style="rounded,filled", fillcolor=self.t[op.op], tooltip=f"line {op.span.line}" if op.span else None,
               margin="0.12,0.06", **attrs)

    def branch_ops(self, g, path: str, p: ir.Prechamber) -> tuple[str, str]:
        """The branch's valves and turbines in a row; returns (first, last) node ids."""
        t = self.t
        ids = []
        for k, op in enumerate(p.ops):
            nid = f"{path}.t{k}"
            if isinstance(op, ir.Norm):
                self.used.add("valve_branch")
                title, detail = self.words(text.norm(op, on_branch=True))
                if self.o.labels == "both":
                    detail = text.pick(text.norm(op, True), "ml")[0]
                g.node(nid, self.lab(title, detail, size=11, detail_size=9), shape="diamond", style="filled",
                       fillcolor=t["valve_branch"], color=t["branch"], penwidth="2", fixedsize="true", width="1.0", height="0.6",
                       tooltip=f"line {op.span.line}" if op.span else None)
            else:
                self.turbine_node(g, nid, op)
            if ids:
                self.branch(g, ids[-1], nid)
            ids.append(nid)
        return ids[0], ids[-1]

    def branch_cluster(self, g, path: str, p: ir.Prechamber, split: str, merge: str | None) -> None:
        """Draw one prechamber from `split` to `merge` (or overboard when merge is None)."""
        t = self.t
        self.used.add("branch")
        self.branch_path = f"{self.stage_here}.{self.branch_attr[id(p)]}"
        with g.subgraph(name=f"cluster_{path}") as c:
            first, *rest = text.wrap(text.prechamber(p, self.o.labels), 30)
            c.attr(label=self.lab(first, None, size=12, extra=rest, detail_size=11, align="left"), style="rounded,filled,dashed" if p.detach else "rounded,filled",
                   fillcolor=t["branch_fill"], color=t["branch_border"], labeljust="l", margin="8", penwidth="1.2")
            first, last = self.branch_ops(c, path, p)
            if p.overboard:
                self.used.add("vent")
                vent = f"{path}.vent"
                loss = f"aux loss {text.TIMES}{text.num(p.loss)}" if p.loss is not None else "never merged"
                ttl = {"rocket": "overboard", "ml": "side output", "both": "overboard"}[self.o.labels]
                c.node(vent, self.lab(ttl, loss, size=12), shape="invhouse", style="filled", fillcolor=t["vent_fill"],
                       color=t["vent"], fontcolor=t["vent"], penwidth="2")
                self.branch(c, last, vent, color=t["vent"], style="bold")
        if p.detach:
            self.used.add("cut")
            cut = {"rocket": "cut", "ml": "detach", "both": "cut: detach"}[self.o.labels]
            # A label (not an xlabel) gets its own place on this very edge, clear of the lines.
            self.edges.append((split, first, dict(color=t["cut"], penwidth="2", style="dashed", dir="both", arrowtail="tee", **{"class": f"branch {self.branch_path}"},
                                                  arrowsize="0.8", label=self.lab(None, cut, detail_size=10), fontcolor=t["cut"])))
        else:
            self.branch(g, split, first)
        if merge is not None:
            kind = p.merge.kind if p.merge is not None else "plain"
            self.used.add(f"merge_{kind}")
            m = text.merge(p.merge, params.merge_count(p.merge, p.width, p.out_width), self.o.labels)
            self.branch(g, last, merge, label=self.lab(None, m, detail_size=10) if m else None)
        self.branch_path = None  # what follows is the main line's, or the next branch's

    def split_from(self, g, path: str, cur: str) -> str:
        """The split point for a branch: the previous merge junction when the flow has
        just returned there (one rank less per branch), else a new point on the line."""
        if cur in self.merges:
            return cur
        split = f"{path}.split"
        self.junction(g, split, "split")
        self.flow(g, cur, split)
        return split

    def prechamber(self, g, path: str, p: ir.Prechamber, cur: str) -> str:
        split = self.split_from(g, path, cur)
        if p.overboard:
            self.branch_cluster(g, path, p, split, None)
            if self.last_branch is not None:
                # Left to itself Graphviz drops a dead-end branch below the line; an
                # invisible edge from the branch before it keeps it above, with the others.
                self.edges.append((self.last_branch, f"{path}.t0", {"style": "invis", "weight": "0"}))
            self.last_branch = f"{path}.t{len(p.ops) - 1}"
            return self.pass_point(g, path, split, len(p.ops) + 1)
        merge = f"{path}.merge"
        self.junction(g, merge, "merge")
        self.branch_cluster(g, path, p, split, merge)
        self.flow(g, split, merge)
        self.last_branch = f"{path}.t{len(p.ops) - 1}"
        return merge

    def fullflow(self, g, path: str, f: ir.Fullflow, cur: str) -> str:
        t = self.t
        self.used.add("fullflow")
        split = self.split_from(g, path, cur)
        returns = any(not b.overboard for b in f.branches)
        merge = f"{path}.merge" if returns else None
        if merge:
            self.junction(g, merge, "merge")
        with g.subgraph(name=f"cluster_{path}") as c:
            ttl = {"rocket": "full flow", "ml": "parallel branches", "both": "full flow"}[self.o.labels]
            det = "one shared valve, all flow through turbines" if self.o.labels != "ml" else "fed from the same state"
            c.attr(label=self.lab(ttl, det, size=13, align="left"), style="rounded,dashed", color=t["branch_border"], labeljust="l",
                   margin="10", penwidth="1.5")
            fan = split
            if f.norm is not None:
                self.used.add("valve_branch")
                fan = f"{path}.valve"
                title, detail = self.words(text.norm(f.norm, on_branch=True))
                if self.o.labels == "both":
                    detail = text.pick(text.norm(f.norm, True), "ml")[0]
                c.node(fan, self.lab(title, detail, size=11, detail_size=9), shape="diamond", style="filled",
                       fillcolor=t["valve_branch"], color=t["branch"], penwidth="2", fixedsize="true", width="1.0", height="0.6",
                       ordering="out")
                self.branch(c, split, fan)
            for k, b in enumerate(f.branches):
                self.branch_cluster(c, f"{path}.f{k}", b, fan, None if b.overboard else merge)
        if merge:
            self.flow(g, split, merge)
            return merge
        return self.pass_point(g, path, split, (1 if f.norm else 0) + max(len(b.ops) for b in f.branches) + 1)

    def pass_point(self, g, path: str, split: str, length: int) -> str:
        """After an overboard branch the chamber flows on inside the stage to a point
        `length` ranks on, level with the vent, so what follows stays on the straight line."""
        nid = f"{path}.pass"
        g.node(nid, "", shape="point", width="0.14", color=self.t["chamber"], group="main", ordering="out")
        self.merges.add(nid)
        self.flow(g, split, nid, minlen=str(length), arrowhead="none")
        return nid

    # -- the legend ------------------------------------------------------------

    def legend(self) -> None:
        """Title and legend together in the graph's label: a label takes no rank, so the
        legend does not widen the schematic."""
        t = self.t
        # (key, colour, symbol, {label mode: words})
        def say(rocket: str, ml: str, both: str | None = None) -> dict[str, str]:
            return {"rocket": rocket, "ml": ml, "both": both or f"{rocket} = {ml}"}

        entries = [
            ("main", t["chamber"], "\u2501\u2501", say("main chamber", "residual stream")),
            ("branch", t["branch"], "\u2500\u2500", say("prechamber", "residual branch")),
            ("cut", t["cut"], "\u254c\u254c", say("cut: no flow back", "detach: no gradient back", "cut: detach, no gradient back")),
            ("valve_main", t["chamber"], "\u25c6", say("valve in series", "norm on the main line (Post-LN)", "valve in series = main-line norm")),
            ("valve_branch", t["branch"], "\u25c7", say("valve on a branch", "norm on the branch (Pre-LN)", "valve on a branch = Pre-LN norm")),
            ("turbine_main", t["chamber"], "\u25ad", say("turbine in series: works on all flow", "layer in series: acts on the whole stream",
                                                        "turbine in series: works on all flow")),
            *((f"merge_{k}", t["chamber"], "\u2295", say(text.merge_legend(k, "rocket"), text.merge_legend(k, "ml"), text.merge_legend(k, "both")))
              for k in text.MERGE_LEGEND),
            ("vent", t["vent"], "\u25bd", say("overboard vent: never merged", "side output: never merged", "overboard vent: never merged")),
            ("repeat", t["fg"], text.TIMES + "N", say("stage repeated N times", "stage repeated N times", "stage repeated N times")),
        ]
        used = self.used | {"main"}
        cells = [
            f'<td align="right"><font color="{c}" point-size="14"><b>{esc(sym)}</b></font></td>'
            f'<td align="left"><font point-size="11" color="{t["muted"]}">{esc(words)}</font></td>'
            for key, c, sym, words in ((k, c, sym, w[self.o.labels]) for k, c, sym, w in entries) if key in used
        ]
        cols = 4
        rows = "".join("<tr>" + "".join(cells[i:i + cols]) + "</tr>" for i in range(0, len(cells), cols))
        title = esc(self.title())
        total = esc(f"{params.human(params.count(self.e))} params")
        self.g.attr("graph", label=(
            f'<<table border="0" cellspacing="0" cellpadding="2"><tr><td align="left"><font point-size="20"><b>{title}</b></font>'
            f'<font point-size="13" color="{t["muted"]}">   {total}</font></td></tr>'
            f'<tr><td align="left"><table border="0" cellspacing="0" cellpadding="3">{rows}</table></td></tr></table>>'))


def rows(widths: list[float], budget: float = ROW_POINTS, keep: set[int] = frozenset()) -> set[int]:
    """Where to start new rows: indices into `widths` (pieces in order, the first
    never breaks), for rows of about equal width, none much over `budget`."""
    widths = list(widths)
    for k in sorted(keep, reverse=True):  # a kept piece rides with the one before it
        if 0 < k < len(widths):
            widths[k - 1], widths[k] = widths[k - 1] + widths[k], 0.0
    total = sum(widths)
    n = -(-total // budget)
    target = total / n
    out, cur = set(), 0
    for k, w in enumerate(widths):
        if k and k not in keep and cur and cur + w / 2 > target and len(out) < n - 1 and sum(widths[k:]) > target / 2:  # no stub last row
            out.add(k)
            cur = 0
        cur += w
    return out
