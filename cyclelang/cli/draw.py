"""`cyclec draw`: imported only when that command runs (it never imports torch)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..diagnostics import CycleError, Diagnostic
from . import include_path_option, load_spec, output_option, spec_path, write_output

EXTENSIONS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}


class GraphvizNotInstalled(click.ClickException):
    """One line on stderr, exit 1: the environment lacks Graphviz's `dot`."""

    def show(self, file=None) -> None:
        click.echo(f"cyclec: {self.message}", err=True)


def output_format(output: str) -> str:
    if output == "-":
        return "dot"
    ext = os.path.splitext(output)[1].lower()
    if ext not in EXTENSIONS:
        raise click.BadParameter(f"cannot tell the format from {output!r}: end it in .svg, .png, .pdf or .dot (or use '-' for DOT on stdout)",
                                 param_hint="'-o'")
    return EXTENSIONS[ext]


def load_run(path, engine_name: str):
    """The run (a `stand.result.Firing`) of engine `engine_name` in the test-stand report at `path`."""
    from ..stand.result import StandReport

    try:
        text = Path(path).read_text("utf-8")
    except OSError as e:
        raise CycleError([Diagnostic("E0105", "error", f"cannot read --annotate {path}: {e.strerror or e}", None)]) from None
    try:
        report = StandReport.model_validate_json(text)
    except ValueError:
        raise CycleError([Diagnostic("E0205", "error", f"{path} is not a test-stand report", None,
                                     "write one with: cyclec fire SPEC --json fire.json")]) from None
    runs = [r for r in report.runs if r.name == engine_name]
    if not runs:
        names = ", ".join(r.name for r in report.runs) or "none"
        raise CycleError([Diagnostic("E0205", "error", f"the report holds no run of engine '{engine_name}' (it has: {names})", None,
                                     "fire this spec: cyclec fire SPEC --json fire.json")])
    return runs[0]


@click.command()
@spec_path
@output_option
@click.option("--view", type=click.Choice(["cycle", "graph"]), default="cycle", show_default=True,
              help="cycle: the power-cycle schematic; graph: the computation graph with shapes and parameter counts.")
@click.option("--expand", is_flag=True, help="Unroll repeated stages instead of drawing one with a ×N badge.")
@click.option("--labels", type=click.Choice(["rocket", "ml", "both"]), default="both", show_default=True, help="Words on the diagram.")
@click.option("--rankdir", type=click.Choice(["LR", "TB"]), default=None, help="Flow direction [default: LR for cycle, TB for graph].")
@click.option("--theme", type=click.Choice(["light", "dark"]), default="light", show_default=True)
@click.option("--annotate", type=click.Path(dir_okay=False, exists=True, path_type=str), default=None,
              help="A test-stand report (cyclec fire --json): edge widths and colours from the measured pressure chain (cycle view).")
@include_path_option
def draw(spec, output, view, expand, labels, rankdir, theme, annotate, include_path):
    """Draw SPEC as a power-cycle diagram or a computation graph.

    The format follows OUT's extension: .svg, .png, .pdf or .dot; `-o -` writes
    DOT to stdout. Without -o, writes SPEC's name with .svg in the current
    directory. Only .dot works without the Graphviz `dot` program.
    """
    from ..backends.graphviz import GraphvizMissing, render, to_dot

    if output is None:
        output = os.path.splitext(os.path.basename(spec))[0] + ".svg"
    fmt = output_format(output)
    if annotate is not None and view != "cycle":
        raise click.BadParameter("measurements go on the cycle view", param_hint="'--annotate'")
    s = load_spec(spec, include_path)
    readings = None
    if annotate is not None and s.engine is not None:  # without an engine, to_dot says there is nothing to draw
        from ..stand.readings import pressure_readings

        readings = pressure_readings(s, load_run(annotate, s.engine.name))
    dot = to_dot(s, view=view, expand=expand, labels=labels, rankdir=rankdir, theme=theme, annotate=readings)
    try:
        data = render(dot, fmt)
    except GraphvizMissing as e:
        raise GraphvizNotInstalled(str(e)) from None
    write_output(output, dot if fmt == "dot" else data)
