"""`cyclec diff A B`: what changed between two designs (imported only when that command runs)."""

from __future__ import annotations

import json
import sys

import click

from ..diagnostics import CycleError
from . import EXIT_FINDINGS, EXIT_USAGE, include_path_option, load_spec, refuse_output_over_input, report, write_output


@click.command()
@click.argument("a", type=click.Path(dir_okay=False, path_type=str))
@click.argument("b", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON on stdout.")
@click.option("--draw", "draw_to", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Draw B with the parts that differ from A highlighted (.svg, .png, .pdf or .dot).")
@include_path_option
def diff(a, b, as_json, draw_to, include_path):
    """Compare two specs in the IR's terms: parts added, removed, changed and moved (named by
    their layout paths), and the parameter, FLOP and KV-cache deltas per stage and in total.

    Exit status, as diff's: 0 when both resolve to the same IR, 1 when they differ, 2 when a
    spec cannot be read or resolved (its diagnostics on stderr).
    """
    from ..review.diff import diff as compare, marks, render_text

    refuse_output_over_input(draw_to, [a, b], "--draw")  # before anything is read: B through a link is still B
    specs = []
    for path in (a, b):
        try:
            specs.append(load_spec(path, include_path))
        except CycleError as e:
            report(e)
            sys.exit(EXIT_USAGE)
    if any(s.engine is None for s in specs):
        click.echo("cyclec: diff compares two engines; a file of templates only has none", err=True)
        sys.exit(EXIT_USAGE)
    d = compare(*specs)
    if draw_to is not None:
        _draw(specs[1], d, draw_to, marks(d, specs[1]))
    if as_json:
        click.echo(json.dumps({"files": {"a": a, "b": b}, **d}, indent=2, sort_keys=True))
    else:
        click.echo(render_text(d, a, b), nl=False)
    sys.exit(0 if d["equal"] else EXIT_FINDINGS)


def _draw(spec, d: dict, output: str, lines: dict[int, str]) -> None:
    from ..backends.graphviz import GraphvizMissing, draw, highlight, render
    from .draw import GraphvizNotInstalled, output_format

    fmt = output_format(output)
    removed = [e["path"] for e in d["parts"]["removed"]]
    legend = "against A: green added, orange changed, purple moved" + (f"\\nremoved: {', '.join(removed)}" if removed else "")
    g = highlight(draw(spec), lines, legend)
    try:
        data = render(g.source, fmt)
    except GraphvizMissing as e:
        raise GraphvizNotInstalled(str(e)) from None
    write_output(output, g.source if fmt == "dot" else data)
