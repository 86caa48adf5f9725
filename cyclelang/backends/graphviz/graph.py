"""The graph view: the computation graph, a tensor shape on every edge.

Nodes are operations with their parameter counts; edges carry symbolic shapes
(`B×T×768`). Residual branches read the stream and add back at a `+` node whose
label names the merge; a detached read is dashed; an overboard output ends at
its loss. Ids are IR paths, as in the cycle view.
"""

from __future__ import annotations

import graphviz

from ... import ir
from . import params, text
from .cycle import Options, new_graph
from .style import THEMES, label


class GraphView:
    def __init__(self, engine: ir.Engine, opts: Options):
        self.e, self.o, self.t = engine, opts, THEMES[opts.theme]
        total = params.human(params.count(engine))
        self.g = new_graph("graph", f"{engine.name}: computation graph, {total} params", opts, self.t,
                           nodesep="0.3", ranksep="0.35", newrank="true")
        self.edges: list[tuple[str, str, dict]] = []
        # Each op node's layout path (an expanded stage's instance), for the edges into it.
        lay = ir.layout.layout(engine)
        self.part_path = {id(p.node): p.path for p in lay.parts() if p.role != "merge"}
        self.node_path: dict[str, str] = {"feed.embed": "feed", "nozzle": "head"}
        self.rep: int | None = None

    def lab(self, title, detail=None, **kw) -> str:
        return label(title, detail, muted=self.t["muted"], **kw)

    def op_node(self, g, nid: str, w: text.Words, n: int | None, fill: str, span=None, **attrs) -> None:
        title, detail = text.pick(w, self.o.labels)
        extra = f"{params.human(n)} params" if n else None
        attrs.setdefault("shape", "box")
        attrs.setdefault("style", "rounded,filled")
        g.node(nid, self.lab(title, detail, extra=extra, size=13), fillcolor=fill,
               tooltip=f"line {span.line}" if span is not None else None, **attrs)

    def edge(self, a: str, b: str, shape: str, **attrs) -> None:
        attrs = {"label": self.lab(None, shape, detail_size=10), "color": self.t["fg"], "arrowsize": "0.7", **attrs}
        self.edges.append((a, b, attrs))

    @staticmethod
    def bt(width: int | str) -> str:
        return text.shape("B", "T", width)

    def build(self) -> graphviz.Digraph:
        e, t, g = self.e, self.t, self.g
        f = e.feed
        # Every node on the residual line shares group "main" and every edge along it is
        # heavy, so the line runs straight down and the branches hang off to the side.
        g.node("in.tokens", self.lab("tokens", "token ids", size=13), shape="oval", style="filled", fillcolor=t["feed"], group="main")
        self.op_node(g, "feed.embed", text.Words("feed pumps", "embedding", "embedding", f"{f.vocab:,}{text.TIMES}{f.width}"),
                     f.vocab * f.width, t["feed"], f.span, group="main")
        self.edge("in.tokens", "feed.embed", text.shape("B", "T"), weight="10")
        cur, w = "feed.embed", f.width
        if f.position != "none":
            n = f.context * f.width if f.position == "learned" else 0
            self.op_node(g, "feed.pos", text.Words("positions", f.position, f"{f.position} positions", f"{f.context}{text.TIMES}{f.width}"),
                         n, t["feed"], f.span)
            g.node("feed.add", "+", shape="circle", width="0.35", fixedsize="true", group="main")
            self.edge(cur, "feed.add", self.bt(w), weight="10")
            self.edge("feed.pos", "feed.add", text.shape("T", w))
            cur = "feed.add"
        if f.scale != 1.0 or f.dropout:
            bits = ([f"{text.TIMES}{text.num(f.scale)}"] if f.scale != 1.0 else []) + ([f"dropout {text.num(f.dropout)}"] if f.dropout else [])
            g.node("feed.post", self.lab(", ".join(bits), None, size=12, bold=False), shape="box", style="rounded", group="main")
            self.edge(cur, "feed.post", self.bt(w), weight="10")
            cur = "feed.post"
        for i, op in enumerate(e.body):
            cur, w = self.main_op(g, f"b{i}", op, cur, w)
        n = e.nozzle
        self.op_node(g, "nozzle", text.nozzle(n), params.count(n), t["nozzle"], n.span, group="main")
        self.edge(cur, "nozzle", self.bt(w), weight="10")
        g.node("out.logits", self.lab("logits", None, size=13), shape="oval", style="filled", fillcolor=t["nozzle"], group="main")
        self.edge("nozzle", "out.logits", self.bt(n.vocab), weight="10")
        for a, b, attrs in self.edges:
            if b in self.node_path:  # the edge feeds a part: it carries the part's path
                attrs.setdefault("class", f"part {self.node_path[b]}")
            g.edge(a, b, **attrs)
        return g

    def main_op(self, g, path: str, op, cur: str, w: int) -> tuple[str, int]:
        if isinstance(op, ir.Stage):
            reps = range(op.repeat) if self.o.expand and op.repeat > 1 else [None]
            for r in reps:
                self.rep = r
                p = path if r is None else f"{path}.r{r}"
                each = " each" if op.repeat > 1 and r is None else ""
                with g.subgraph(name=f"cluster_{p}") as c:
                    c.attr(label=self.lab(text.stage(op, r), f"{params.human(params.count(op))} params{each}", size=14, align="left"),
                           style="rounded,filled", fillcolor=self.t["stage_fill"], color=self.t["stage_border"], labeljust="l")
                    for j, sop in enumerate(op.ops):
                        cur, w = self.stage_op(c, f"{p}.o{j}", sop, cur, w)
            self.rep = None
            return cur, w
        return self.series(g, path, op, cur, w)

    def series(self, g, path: str, op, cur: str, w: int) -> tuple[str, int]:
        self.leaf(g, path, op, on_branch=False)
        self.edge(cur, path, self.bt(w), weight="10")
        return path, ir.out_width(op, w)

    def leaf(self, g, nid: str, op, on_branch: bool) -> None:
        path = self.part_path[id(op)]
        self.node_path[nid] = path if self.rep is None else ir.layout.instances(path)[self.rep]
        main = {} if on_branch else {"group": "main"}
        if isinstance(op, ir.Norm):
            self.op_node(g, nid, text.norm(op, on_branch), params.count(op), self.t["valve_branch"], op.span,
                         color=self.t["branch"] if on_branch else self.t["chamber"], **main)
        else:
            self.op_node(g, nid, text.turbine(op), params.count(op), self.t[op.op], op.span, **main)

    def stage_op(self, g, path: str, op, cur: str, w: int) -> tuple[str, int]:
        if isinstance(op, ir.Prechamber):
            return self.residual(g, path, [op], None, cur, w)
        if isinstance(op, ir.Fullflow):
            return self.residual(g, path, op.branches, op.norm, cur, w)
        return self.series(g, path, op, cur, w)

    def residual(self, g, path: str, branches: list[ir.Prechamber], shared: ir.Norm | None, cur: str, w: int) -> tuple[str, int]:
        """x + f(x) for one prechamber, or x + f1(n(x)) + f2(n(x)) for a full-flow group."""
        t = self.t
        src = cur
        if shared is not None:
            src = f"{path}.norm"
            self.leaf(g, src, shared, on_branch=True)
            self.edge(cur, src, self.bt(w))
        returning = [b for b in branches if not b.overboard]
        add = f"{path}.add"
        if returning:
            words = [text.merge(b.merge, params.merge_count(b.merge, b.width, b.out_width), self.o.labels) for b in returning]
            kinds = list(dict.fromkeys(x for x in words if x))
            g.node(add, self.lab("+", kinds[0] if kinds else None, extra=kinds[1:], size=16, detail_size=10),
                   shape="ellipse" if kinds else "circle", style="filled", fillcolor=t["junction"], color=t["chamber"],
                   penwidth="2", margin="0.02", group="main")
            self.edge(cur, add, self.bt(w), color=t["chamber"], penwidth="3", weight="10")
        for k, b in enumerate(branches):
            bp = path if len(branches) == 1 and shared is None else f"{path}.f{k}"
            with g.subgraph(name=f"cluster_{bp}") as c:
                first, *rest = text.wrap(text.prechamber(b, self.o.labels), 36)
                c.attr(label=self.lab(first, None, extra=rest, size=11, detail_size=10, align="left"), style="rounded,dashed" if b.detach else "rounded",
                       color=t["branch_border"], labeljust="l")
                prev, bw = src, b.width
                for j, op in enumerate(b.ops):
                    nid = f"{bp}.t{j}"
                    self.leaf(c, nid, op, on_branch=True)
                    if j == 0 and b.detach:
                        self.edge(prev, nid, f"detach, {self.bt(bw)}", style="dashed", color=t["cut"], dir="both", arrowtail="tee")
                    else:
                        self.edge(prev, nid, self.bt(bw))
                    prev, bw = nid, ir.out_width(op, bw)
                if b.overboard:
                    loss = f"aux loss {text.TIMES}{text.num(b.loss)}" if b.loss is not None else "output, never merged"
                    dump = "side output" if self.o.labels == "ml" else "overboard"
                    c.node(f"{bp}.vent", self.lab(dump, loss, size=12), shape="note", style="filled",
                           fillcolor=t["vent_fill"], color=t["vent"])
                    self.edge(prev, f"{bp}.vent", self.bt(bw))
            if not b.overboard:
                self.edge(prev, add, self.bt(bw), color=t["branch"])
        if returning:
            return add, returning[0].out_width
        return cur, w
