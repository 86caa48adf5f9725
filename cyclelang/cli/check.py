"""`cyclec check`: parse, resolve, validate and review specs."""

from __future__ import annotations

import json
import sys

import click

from ..diagnostics import CycleError
from . import EXIT_FINDINGS, include_path_option, load_spec, report, spec_paths


@click.command()
@spec_paths
@include_path_option
@click.option("--strict", is_flag=True, help="Treat the design reviewer's warnings as errors.")
@click.option("--report", "want_report", is_flag=True, help="Print the static analyses on stdout: parameters, FLOPs, gradient reachability, scaling.")
@click.option("--json", "as_json", is_flag=True, help="Print diagnostics and the analyses as JSON on stdout.")
@click.option("--pp", type=click.IntRange(min=1), default=1, help="Weigh the pipeline split into N pieces (W161); with --report, print it.")
def check(specs, include_path, strict, want_report, as_json, pp):
    """Parse, resolve, validate and review SPECS; report every problem found.

    Warnings and notes come from the design reviewer (`cyclec explain CODE` says why);
    a line silences one with a comment, `# allow: W102`. Exit 1 on errors, or on
    warnings with --strict.
    """
    from .. import review as rv

    failed: list[CycleError] = []
    texts: list[str] = []
    entries: list[dict] = []
    shown = False

    def show(e: CycleError) -> None:
        """One file's diagnostics; a blank line sets them apart from the previous file's."""
        nonlocal shown
        if shown:
            click.echo("", err=True)
        report(e)
        shown = True

    for path in specs:
        try:
            spec = load_spec(path, include_path)
        except CycleError as e:
            failed.append(e)
            show(e)
            entries.append({"file": path, "diagnostics": [d.to_json() for d in e.diagnostics], "report": None})
            continue
        diags = rv.review(spec, rv.ReviewConfig(pp=pp))
        sources = _span_sources(diags)
        diags = rv.apply_allows(diags, sources)
        if strict:
            diags = rv.strict(diags)
        if diags:
            found = CycleError(diags, sources)
            show(found)
            if any(d.severity == "error" for d in diags):
                failed.append(found)
        analysis = rv.analyze(spec) if (want_report or as_json) else None
        pieces = _pipeline(spec, pp) if analysis is not None and pp > 1 else None
        if as_json:
            if pieces is not None:
                analysis = {**analysis, "pipeline": split_json(pieces)}
            entries.append({"file": path, "diagnostics": [d.to_json() for d in diags], "report": analysis})
        elif analysis is not None:
            texts.append(rv.render_text(analysis) + (split_text(spec.engine, pieces) if pieces is not None else ""))
    if as_json:
        click.echo(json.dumps(entries, indent=2))
    elif texts:
        click.echo("\n".join(texts), nl=False)
    if failed:
        n = sum(sum(d.severity == "error" for d in e.diagnostics) for e in failed)
        click.echo(f"cyclec: {n} problem{'s' if n != 1 else ''} in {len(failed)} file{'s' if len(failed) != 1 else ''}", err=True)
        sys.exit(EXIT_FINDINGS)


def _pipeline(spec, pp: int):
    """The pipeline split into pp pieces, or None where it cannot be made (W161 says why)."""
    from ..review import split

    if spec.engine is None:
        return None
    try:
        return split.split(spec.engine, pp)
    except split.SplitError:
        return None


def split_json(pieces) -> dict:
    from ..review import split

    return split.as_json(pieces)


def split_text(engine, pieces) -> str:
    from ..review import split

    return "\n" + split.render_text(engine, pieces)


def _span_sources(diags) -> dict[str, str]:
    """The text of each file a diagnostic points into, for carets and `# allow:` comments."""
    from ..io import read_input
    from ..syntax.parser import MAX_SOURCE_BYTES

    out: dict[str, str] = {}
    for d in diags:
        f = d.span.file if d.span else None
        if f and f not in out:
            try:
                out[f] = read_input(f, MAX_SOURCE_BYTES).decode("utf-8").removeprefix("\ufeff")
            except (OSError, UnicodeDecodeError):
                pass
    return out
