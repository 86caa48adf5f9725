"""Graphviz back-end: power-cycle diagrams and computation graphs.

`draw(spec, view=...)` returns a `graphviz.Digraph`; `to_dot` its source text,
which is deterministic (ids from IR paths, sorted attributes, no timestamps or
paths); `render(dot, fmt)` runs the `dot` program. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

from ... import ir

VIEWS = ("cycle", "graph")
LABELS = ("rocket", "ml", "both")
THEMES = ("light", "dark")
RANKDIRS = ("LR", "TB", "RL", "BT")
FORMATS = ("svg", "png", "pdf", "dot")
# `expand` unrolls at most this many stages in all: past it a diagram is no longer
# readable and its DOT grows without bound (a stage may repeat 10,000 times).
MAX_EXPAND = 64

INSTALL_HINT = (
    "the Graphviz 'dot' program is not installed; install Graphviz "
    "(apt install graphviz, brew install graphviz or conda install graphviz) or write .dot output"
)


class GraphvizMissing(RuntimeError):
    pass


def draw(spec: ir.Spec, view: str = "cycle", expand: bool = False, labels: str = "both", rankdir: str | None = None, theme: str = "light",
         annotate=None):
    """Draw a resolved spec as a `graphviz.Digraph`.

    view: "cycle" (the power-cycle schematic) or "graph" (the computation graph with
    tensor shapes on edges and parameter counts on nodes). expand: unroll repeated
    stages. labels: "rocket", "ml" or "both". rankdir: Graphviz rank direction,
    by default LR for the cycle and TB for the graph. annotate: measurements keyed by
    layout path (`cyclelang.stand.readings.pressure_readings`), which set the cycle
    view's edge widths and colours (see annotate.py).
    """
    from ...diagnostics import CycleError, Diagnostic
    from .cycle import CycleView, Options
    from .graph import GraphView

    if not isinstance(spec, ir.Spec):
        raise TypeError(f"the graphviz back-end draws an ir.Spec, not {type(spec).__name__} (cyclelang.draw takes paths and text)")
    ir.validate(spec)  # an IR edited with model_copy skipped its models' checks
    for name, value, allowed in (("view", view, VIEWS), ("labels", labels, LABELS), ("theme", theme, THEMES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    if rankdir is not None and rankdir not in RANKDIRS:
        raise ValueError(f"rankdir must be one of {', '.join(RANKDIRS)}, not {rankdir!r}")
    s = spec
    if s.engine is None:
        raise CycleError([Diagnostic("E0213", "error", "nothing to draw: the spec defines no engine (only templates)", s.span,
                                     "draw the file that defines the engine; this one is meant to be included")])
    if expand:
        stages = [op for op in s.engine.body if isinstance(op, ir.Stage)]
        unrolled = sum(op.repeat for op in stages)
        if unrolled > MAX_EXPAND:
            big = max(stages, key=lambda op: op.repeat)
            raise CycleError([Diagnostic("E0220", "error", f"expanding would draw {unrolled:,} stages; a diagram unrolls at most {MAX_EXPAND}",
                                         big.span, f"draw it folded (without --expand): stage {big.name} is drawn once with a {chr(0xd7)}{big.repeat} badge")])
    if annotate is not None and view != "cycle":
        raise ValueError("annotate applies to the cycle view")
    opts = Options(expand=expand, labels=labels, rankdir=rankdir or ("LR" if view == "cycle" else "TB"), theme=theme, annotate=annotate)
    builder = CycleView(s.engine, opts) if view == "cycle" else GraphView(s.engine, opts)
    return builder.build()


HIGHLIGHT = {"added": "#2ca02c", "changed": "#ff7f0e", "moved": "#9467bd"}
_TOOLTIP_LINE = re.compile(r'tooltip="line (\d+)"')


def highlight(graph, lines: dict[int, str], note: str | None = None):
    """Restyle the nodes drawn from the given source lines ({line: "added" | "changed" |
    "moved"}, colours in HIGHLIGHT) and add `note` under the title: `cyclec diff --draw`.
    Nodes carry their spec line as a tooltip, which is what this reads."""
    body = []
    for stmt in graph.body:
        m = _TOOLTIP_LINE.search(stmt)
        status = lines.get(int(m.group(1))) if m else None
        if status is not None and stmt.rstrip().endswith("]"):
            colour = HIGHLIGHT[status]
            stmt = stmt.rstrip()[:-1] + f' color="{colour}" penwidth=4 class="diff-{status}"]\n'
        body.append(stmt)
    graph.body[:] = body
    if note:
        graph.node("diff.legend", note, shape="note", color="#5b6876", fontcolor="#5b6876", fontsize="11")
    return graph


def to_dot(spec, **kwargs) -> str:
    """The DOT source of `draw(spec, **kwargs)`."""
    return draw(spec, **kwargs).source


def render(dot: str, fmt: str) -> bytes:
    """Run Graphviz on DOT source; `fmt` is svg, png or pdf. Raises GraphvizMissing."""
    if fmt == "dot":
        return dot.encode("utf-8")
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing(INSTALL_HINT)
    args = [exe, f"-T{fmt}"]
    if fmt == "png":
        args.append("-Gdpi=150")  # slide-sharp without a huge file
    proc = subprocess.run(args, input=dot.encode("utf-8"), capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"dot failed ({proc.returncode}): {proc.stderr.decode('utf-8', 'replace').strip()[:2000]}")
    return proc.stdout


# Committed pictures (README, gallery) carry the hash of the DOT they were drawn from:
# a freshness check recomputes the DOT, so a Graphviz upgrade that shifts SVG bytes
# does not count as stale, while a change to a spec or to the drawing code does.
_STAMP = re.compile(r"<!-- cyclelang: dot sha256 ([0-9a-f]{64})")


def dot_digest(dot: str) -> str:
    return hashlib.sha256(dot.encode("utf-8")).hexdigest()


def stamped_svg(dot: str, command: str) -> bytes:
    """The SVG of `dot`, stamped with its DOT hash and the command that regenerates it."""
    svg = render(dot, "svg").decode("utf-8")
    stamp = f"<!-- cyclelang: dot sha256 {dot_digest(dot)}; regenerate with {command} -->\n"
    head, sep, rest = svg.partition("?>\n")  # after the XML declaration
    return ((head + sep + stamp + rest) if sep else (stamp + svg)).encode("utf-8")


def svg_is_current(svg_text: str | None, dot: str) -> bool:
    """Whether a stamped SVG was drawn from exactly this DOT."""
    m = _STAMP.search(svg_text) if svg_text is not None else None
    return m is not None and m.group(1) == dot_digest(dot)


__all__ = ["draw", "to_dot", "highlight", "HIGHLIGHT", "render", "stamped_svg", "svg_is_current", "dot_digest", "GraphvizMissing", "VIEWS", "LABELS", "THEMES", "FORMATS", "ir"]
