"""`cyclec draw`: imported only when that command runs (it never imports torch)."""

from __future__ import annotations

import json
import math
import os
import sys

import click

from ..diagnostics import CycleError, Diagnostic
from . import UsageProblem, include_path_option, load_spec, output_option, refuse_output_over_input, write_output

EXTENSIONS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}


class GraphvizNotInstalled(UsageProblem):
    """One line on stderr, exit 2 (a usage error, as the README says): the environment lacks Graphviz's `dot`."""


def output_format(output: str) -> str:
    if output == "-":
        return "dot"
    ext = os.path.splitext(output)[1].lower()
    if ext not in EXTENSIONS:
        raise click.BadParameter(f"cannot tell the format from {output!r}: end it in .svg, .png, .pdf or .dot (or use '-' for DOT on stdout)",
                                 param_hint="'-o'")
    return EXTENSIONS[ext]


MAX_REPORT_BYTES = 64 << 20  # a stand report of a thousand-stage engine is a few MB


def _nonfinite(value, where: str = ""):
    """(JSON path, the number as JSON writes it) of the first NaN or infinite number in a parsed report, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the top level", "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, v in items:
        found = _nonfinite(v, path)
        if found:
            return found
    return None


def load_run(path, engine_name: str):
    """The run (a `stand.result.Firing`) of engine `engine_name` in the test-stand report at `path`,
    validated against the report's schema; every reading must be a finite number."""
    from ..io import InputRefused, read_input
    from ..stand.result import StandReport

    hint = "write one with: cyclec fire SPEC --json fire.json"
    try:
        raw = read_input(path, MAX_REPORT_BYTES)
    except InputRefused as e:
        raise CycleError([Diagnostic("E0112", "error", f"cannot read --annotate {path}: {e}", None)]) from None
    except OSError as e:
        raise CycleError([Diagnostic("E0105", "error", f"cannot read --annotate {path}: {e.strerror or e}", None)]) from None

    def bad(why: str):
        return CycleError([Diagnostic("E0114", "error", f"{path} is not a test-stand report: {why}", None, hint)])

    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"not JSON ({e})") from None
    except RecursionError:
        raise bad("nested too deeply") from None
    try:
        report = StandReport.model_validate(data)
    except ValueError as e:
        errors = getattr(e, "errors", lambda: [])()
        first = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'the top level'}: {err['msg']}" for err in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise bad((first or str(e)) + more) from None
    runs = [r for r in report.runs if r.name == engine_name]
    if not runs:
        names = ", ".join(r.name for r in report.runs) or "none"
        raise CycleError([Diagnostic("E0115", "error", f"the report holds no run of engine '{engine_name}' (it has: {names})", None,
                                     "fire this spec: cyclec fire SPEC --json fire.json")])
    i = report.runs.index(runs[0])
    found = _nonfinite(data["runs"][i], f"runs[{i}]")
    if found is not None:
        where, v = found
        raise CycleError([Diagnostic("E0114", "error", f"{path}: the reading {where} is {v}, not a finite number: the engine flamed out on the stand, and a diagram cannot be coloured by it", None,
                                     "fix the spec until `cyclec fire` reports finite readings, then fire it again")])
    return runs[0]


def check_run(run, spec, path) -> None:
    """A report fired at another depth or width is refused, never half-applied: its readings
    would land on the wrong instances or mean another engine."""
    from .. import ir

    lay = ir.layout.layout(spec)
    depth, width = lay.instance_count(), spec.engine.width
    got = run.settings
    if got.depth != depth or got.width != width:
        what = []
        if got.depth != depth:
            what.append(f"depth {got.depth}, this spec has {depth} stage instances")
        if got.width != width:
            what.append(f"width {got.width}, this spec has {width}")
        raise CycleError([Diagnostic("E0276", "error", f"{path} was fired at {'; '.join(what)}: its readings belong to another engine", None,
                                     "fire the spec as drawn: cyclec fire SPEC --json fire.json (without --depth or --width)")])


@click.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
@output_option
@click.option("--view", type=click.Choice(["cycle", "graph"]), default="cycle", show_default=True,
              help="cycle: the power-cycle schematic; graph: the same layout with parameter counts and tensor shapes.")
@click.option("--expand", is_flag=True, help="Unroll repeated stages (more than 4 repeats: the first, '⋯ k more ⋯', the last).")
@click.option("--labels", type=click.Choice(["rocket", "ml", "both"]), default="both", show_default=True,
              help="Words on the diagram (only the words change, never the layout).")
@click.option("--rankdir", type=click.Choice(["TB", "LR"]), default=None,
              help="TB (the default): tokens at the bottom, logits at the top; LR: left to right. With --size and no --rankdir, "
                   "the direction that fits the preset.")
@click.option("--size", type=click.Choice(["slide", "column", "page"]), default=None,
              help="Fit a 16:9 slide, a paper's column or its page, with text at 12 pt or more: the least dense layout that fits, "
                   "wrapped into columns between stages (refused, E0275, when none does, with a way that does).")
@click.option("--theme", type=click.Choice(["light", "dark"]), default="light", show_default=True)
@click.option("--annotate", type=click.Path(dir_okay=False, exists=True, path_type=str), default=None,
              help="A test-stand report (cyclec fire --json): the measured gradient on every wire, on one absolute scale.")
@include_path_option
def draw(specs, output, view, expand, labels, rankdir, size, theme, annotate, include_path):
    """Draw SPEC as a power-cycle diagram or a computation graph; several SPECs draw side by
    side as small multiples with one legend (and one annotate scale).

    The format follows OUT's extension: .svg, .png, .pdf or .dot; `-o -` writes
    DOT to stdout. Without -o, the SVG goes to stdout when it is not a terminal
    (`cyclec draw gpt2.cycle > gpt2.svg`); at a terminal it is written to SPEC.svg
    (the first SPEC's name, in the current directory) and a line says so on stderr.
    Only .dot works without the Graphviz `neato` program.
    """
    from ..backends.graphviz import GraphvizMissing, render, to_dot

    told = None  # the file chosen for an SVG that has no -o, to say so once it is written
    if output is None and _stdout_is_terminal():
        output = told = os.path.splitext(os.path.basename(specs[0]))[0] + ".svg"
    fmt = output_format(output) if output is not None else "svg"
    refuse_output_over_input(output, [*specs, annotate])
    loaded = [load_spec(p, include_path) for p in specs]
    readings = None
    if annotate is not None and all(s.engine is not None for s in loaded):  # without an engine, to_dot says there is nothing to draw
        from ..stand.readings import pressure_readings

        readings = []
        for s in loaded:
            run = load_run(annotate, s.engine.name)
            check_run(run, s, annotate)
            readings.append(pressure_readings(s, run))
    dot = to_dot(loaded if len(loaded) > 1 else loaded[0], view=view, expand=expand, labels=labels, rankdir=rankdir, theme=theme,
                 annotate=(readings if len(loaded) > 1 else readings[0]) if readings else None, size=size)
    try:
        data = render(dot, fmt)
    except GraphvizMissing as e:
        raise GraphvizNotInstalled(str(e)) from None
    write_output(output, dot if fmt == "dot" else data)
    if told is not None:
        click.echo(f"cyclec: wrote {told} (stdout is a terminal; -o FILE writes elsewhere, and a pipe or '> FILE' gets the SVG)", err=True)


def _stdout_is_terminal() -> bool:
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):  # closed, or no stream at all
        return False
