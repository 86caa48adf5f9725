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

# What `render` hands to `dot`: at most this many lines of DOT (the largest diagram of the
# spec library is about 100; 1,600 distinct stages make 100,000 and take minutes to lay
# out), and `dot` runs at most DOT_TIMEOUT seconds.
MAX_DOT_LINES = 20_000
DOT_TIMEOUT = 60.0

INSTALL_HINT = (
    "the Graphviz 'neato' program is not installed; install Graphviz "
    "(apt install graphviz, brew install graphviz or conda install graphviz) or write .dot output"
)


class GraphvizMissing(RuntimeError):
    pass


SIZES = ("slide", "column", "page")


def _refuse(code: str, message: str, span, hint: str):
    from ...diagnostics import CycleError, Diagnostic

    return CycleError([Diagnostic(code, "error", message, span, hint)])


def draw(spec, view: str = "cycle", expand: bool = False, labels: str = "both", rankdir: str | None = None, theme: str = "light",
         annotate=None, size: str | None = None):
    """Draw a resolved spec, or several (a list: compare mode, small multiples on one grid with
    one legend and one annotate scale), as a `graphviz.Source` of pinned DOT.

    view: "cycle" (the power-cycle schematic) or "graph" (the same layout with parameter counts
    on the parts and tensor shapes where they change). expand: unroll repeated stages (more
    than 4 repeats: the first, "⋯ k more ⋯", the last). labels: "ml", "rocket" or "both",
    which switch only the words. rankdir: "TB" (the default: tokens at the bottom, logits at
    the top) or "LR". size: "slide", "column" or "page" (text at 12 pt or more at that physical
    size; a figure that does not fit is refused with E0275). annotate: readings keyed by layout
    path (`cyclelang.stand.readings.pressure_readings`), one per spec.
    """
    import graphviz

    from .figure import Figure, Fit

    specs = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not specs:
        raise ValueError("nothing to draw")
    for s in specs:
        if not isinstance(s, ir.Spec):
            raise TypeError(f"the graphviz back-end draws an ir.Spec, not {type(s).__name__} (cyclelang.draw takes paths and text)")
        ir.validate(s)  # an IR edited with model_copy skipped its models' checks
    for name, value, allowed in (("view", view, VIEWS), ("labels", labels, LABELS), ("theme", theme, THEMES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    if rankdir is not None and rankdir not in RANKDIRS:
        raise ValueError(f"rankdir must be one of {', '.join(RANKDIRS)}, not {rankdir!r}")
    if size is not None and size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    for s in specs:
        if s.engine is None:
            raise _refuse("E0213", "nothing to draw: the spec defines no engine (only templates)", s.span,
                          "draw the file that defines the engine; this one is meant to be included")
    if expand:
        def nested(sl) -> int:  # the frames of the stages nested in a stage, drawn folded inside each of its instances
            return sum(1 + nested(c) for c in sl.children)

        def frames(sl) -> int:  # the frames an expanded stage draws: its instances shown, each with its nested stages'
            return min(sl.stage.repeat, 4 if sl.stage.repeat <= 4 else 2) * (1 + nested(sl))

        for s in specs:
            lay = ir.layout.layout(s.engine)
            drawn = sum(frames(sl) for sl in lay.top)
            if drawn > MAX_EXPAND:
                stages = [sl.stage for sl in lay.top]
                big = max(stages, key=lambda op: op.repeat)
                raise _refuse("E0220", f"expanding would draw {drawn:,} stage frames; a diagram unrolls at most {MAX_EXPAND}", big.span,
                              f"draw it folded (without --expand): stage {big.name} is drawn once with a {chr(0xd7)}{big.repeat} badge")
    readings = None
    if annotate is not None:
        from .annotate import check

        readings = list(annotate) if isinstance(annotate, (list, tuple)) else [annotate]
        if len(readings) != len(specs):
            raise ValueError("annotate: one set of readings per spec drawn")
        for r in readings:
            if r is not None:
                check(r)
    rd = {"RL": "LR", "BT": "TB"}.get(rankdir, rankdir)
    engines = [s.engine for s in specs]
    kw = dict(view=view, labels=labels, theme=theme, expand=expand, readings=readings)
    try:
        fig = Figure(engines, rankdir=rd, size=size, **kw)
    except Fit as e:
        span = specs[0].engine.span
        raise _refuse("E0275", f"cannot draw {', '.join(s.engine.name for s in specs)}: {e}", span, _fit_hint(engines, rd, size, e, kw)) from None
    return graphviz.Source(fig.dot(), engine="neato")


def _fit_hint(engines, rankdir, size, miss, kw) -> str:
    """A hint that works: the first other way of drawing the figure that does fit, found by
    laying it out."""
    from .figure import Figure, Fit

    if miss.cap:
        return "draw it folded (without --expand)" if kw["expand"] else "split the engine into fewer distinct stages (stage templates with x N)"
    tries = []  # (rankdir, size, what to say, what else changes)
    if rankdir is not None:
        tries.append((None, size, f"without --rankdir {rankdir} it fits --size {size}", {}))
    if kw["view"] == "graph":  # the preset is the page's own: the same figure without the counts and shapes first
        tries.append((rankdir, size, f"the cycle view (--view cycle) fits --size {size}", {"view": "cycle"}))
    from .figure import SIZES as AREAS

    def area(p):
        return AREAS[p][0] * AREAS[p][1]

    nearest = sorted((p for p in SIZES if p != size), key=lambda p: abs(area(p) - area(size)))  # the closest preset first
    tries += [(rankdir, other, f"--size {other} fits", {}) for other in nearest]
    if kw["expand"]:
        tries.append((rankdir, size, f"folded (without --expand) it fits --size {size}", {"expand": False}))
    for rd, sz, say, other in tries:
        try:
            Figure(engines, rankdir=rd, size=sz, **{**kw, **other})
        except Fit:
            continue
        return say
    return "draw it at its natural size (without --size): every word is still at 12 pt there"


HIGHLIGHT = {"added": "#2ca02c", "changed": "#ff7f0e", "moved": "#9467bd"}
_TOOLTIP_LINE = re.compile(r'tooltip="[^"]*\bline (\d+)"')


def highlight(graph, lines: dict[int, str], note: str | None = None):
    """Restyle the boxes drawn from the given source lines ({line: "added" | "changed" |
    "moved"}, colours in HIGHLIGHT) and put `note` over the figure: `cyclec diff --draw`.
    A box carries its layout path and spec line as its tooltip (`path · line N`), which is
    what this reads; the layout stays pinned, only colours and pens change."""
    out = []
    for stmt in graph.source.splitlines(keepends=True):
        m = _TOOLTIP_LINE.search(stmt)
        status = lines.get(int(m.group(1))) if m else None
        if status is not None and stmt.rstrip().endswith("]"):
            stmt = re.sub(r' (color|penwidth)="[^"]*"', "", stmt.rstrip()[:-1])
            stmt += f' class="diff-{status}" color="{HIGHLIGHT[status]}" penwidth="4"]\n'
        elif note and stmt.startswith("\tgraph [") and "label=" not in stmt:
            esc = note.replace('"', '\\"')  # our own words; "\\n" in them is DOT's line break
            stmt = stmt.rstrip()[:-1] + f' label="{esc}" labeljust="l" labelloc="t" fontsize="11" fontcolor="#5b6876"]\n'
        out.append(stmt)
    return type(graph)("".join(out), engine=getattr(graph, "engine", "neato"))


def to_dot(spec, **kwargs) -> str:
    """The DOT source of `draw(spec, **kwargs)`."""
    return draw(spec, **kwargs).source


def render(dot: str, fmt: str, timeout: float | None = None) -> bytes:
    """Run Graphviz on DOT source; `fmt` is svg, png or pdf. Raises GraphvizMissing, or
    CycleError when the graph is above MAX_DOT_LINES (E0223) or `dot` runs past `timeout`
    seconds (default DOT_TIMEOUT; E0224)."""
    from ...diagnostics import CycleError, Diagnostic

    if fmt == "dot":
        return dot.encode("utf-8")
    lines = dot.count("\n")
    if lines > MAX_DOT_LINES:
        raise CycleError([Diagnostic("E0223", "error", f"the diagram is {lines:,} lines of DOT, above the {MAX_DOT_LINES:,} that Graphviz is given to lay out", None,
                                     "write the DOT itself (-o x.dot), draw it folded (without --expand), or split the engine into templates")])
    timeout = DOT_TIMEOUT if timeout is None else timeout
    exe = shutil.which("neato")
    if exe is None:
        raise GraphvizMissing(INSTALL_HINT)
    args = [exe, "-n2", "-Tpng:cairo" if fmt == "png" else f"-T{fmt}"]  # every position is pinned: neato only draws them
    if fmt == "png":
        args += ["-Gdpi=150", "-Gtruecolor=true"]  # slide-sharp; always RGBA
    try:
        proc = subprocess.run(args, input=dot.encode("utf-8"), capture_output=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CycleError([Diagnostic("E0224", "error", f"Graphviz did not finish laying out the diagram within {timeout:g} s", None,
                                     "write the DOT itself (-o x.dot) and lay it out separately, or draw a smaller engine")]) from None
    if proc.returncode != 0:
        raise RuntimeError(f"neato failed ({proc.returncode}): {proc.stderr.decode('utf-8', 'replace').strip()[:2000]}")
    out = proc.stdout
    if fmt == "pdf":  # cairo stamps the time of the run: fix it, so the same DOT gives the same bytes
        out = re.sub(rb"/CreationDate \(D:[0-9]{14}Z?[^)]*\)", lambda m: b"/CreationDate (D:20000101000000Z" + b" " * (len(m.group(0)) - 33) + b")", out)
    return out


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
