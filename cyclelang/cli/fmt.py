"""`cyclec fmt`: canonical formatting of .cycle files."""

from __future__ import annotations

import sys

import click

from ..diagnostics import CycleError
from . import EXIT_FINDINGS, load_spec, report, spec_paths


@click.command()
@spec_paths
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if any file would be reformatted; change nothing.")
@click.option("--write", is_flag=True, help="Rewrite the files in place (atomically).")
def fmt(specs, check_only, write):
    """Format SPECS canonically (to stdout unless --check or --write)."""
    from ..io import InputRefused, read_input
    from ..syntax.fmt import format_text
    from ..syntax.parser import MAX_SOURCE_BYTES
    from . import UsageProblem, write_files

    if check_only and write:
        raise click.UsageError("--check and --write do not go together")
    if not check_only and not write and len(specs) > 1:
        raise click.UsageError("give one file to print, or use --check / --write for several")
    changed, failed = [], []
    for path in specs:
        try:
            raw = read_input(path, MAX_SOURCE_BYTES)
        except InputRefused as e:
            load_spec(path)  # renders the diagnostic `check` gives (E0010 too large, E0112 not a regular file)
            raise UsageProblem(f"cannot format '{path}': {e}") from None
        except OSError as e:
            raise click.FileError(path, e.strerror) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            load_spec(path)  # renders the encoding diagnostic
            raise
        try:
            out = format_text(text, path)
        except CycleError as e:
            failed.append(e)
            continue
        if check_only:
            if out != text:
                changed.append(path)
                click.echo(f"would reformat {path}", err=True)
        elif write:
            if out != text:
                write_files([(path, out)])
                changed.append(path)
                click.echo(f"reformatted {path}", err=True)
        else:
            click.echo(out, nl=False)
    for e in failed:
        report(e)
    if failed or (check_only and changed):
        sys.exit(EXIT_FINDINGS)
