"""`cyclec`: the command line.

\b
Exit codes (the same for every command):
  0    success, nothing to report
  1    the spec has problems (diagnostics on stderr), or `fmt --check` would reformat
  2    usage error (a bad flag, a missing file argument)
  123  internal error: a bug in cyclec, please report it
  130  interrupted

Domain errors are mapped to exit codes in exactly one place (`CycleGroup.invoke`).
Diagnostics go to stderr; artifacts go to stdout or to `-o FILE`. Commands that
need torch or graphviz live in their back-end's module and are imported only
when that command runs, so `check`, `ir`, `fmt` and `schema` start fast.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

import click

from .diagnostics import CycleError

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 123, 130

# Commands that live in back-end modules: name -> "module:attribute".
LAZY_COMMANDS: dict[str, str] = {
    "draw": "cyclelang.backends.graphviz.cli:draw",
    "build": "cyclelang.backends.torch.cli:build",
    "fire": "cyclelang.stand.cli:fire",
}


def _use_color(stream) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def report(err: CycleError) -> None:
    """Render diagnostics on stderr."""
    click.echo(err.render(color=_use_color(sys.stderr)), err=True, nl=False)


class CycleGroup(click.Group):
    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CycleError as e:
            report(e)
            ctx.exit(EXIT_FINDINGS)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("cyclec: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            ctx.exit(EXIT_OK)
        except Exception:
            click.echo("cyclec: internal error (this is a bug in cyclec, not in your spec):", err=True)
            click.echo(traceback.format_exc(), err=True)
            ctx.exit(EXIT_INTERNAL)


spec_paths = click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
spec_path = click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
output_option = click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None, help="Write to this file instead of stdout.")
include_path_option = click.option("--include-path", "include_path", multiple=True, type=click.Path(file_okay=False, path_type=str), help="Also allow includes from this directory (repeatable).")


def load_spec(path: str, include_path=()):
    from .semantics.resolve import load

    return load(path, include_path=tuple(include_path))


def write_output(output: str | None, data: str | bytes) -> None:
    """An artifact to stdout, or atomically to a file."""
    if output is None or output == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            click.echo(data, nl=False)
        return
    from .io import atomic_write

    atomic_write(output, data)


@click.group(cls=CycleGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=__doc__.split("\n\n")[1])
@click.version_option(package_name="cyclelang", prog_name="cyclec")
def main():
    """cyclec: compile .cycle specs of neural-network blocks, written as rocket-engine power cycles."""


@main.command()
@spec_paths
@include_path_option
@click.option("--strict", is_flag=True, help="Treat the design reviewer's warnings as errors.")
@click.option("--report", "want_report", is_flag=True, help="Print the static analyses on stdout: parameters, FLOPs, gradient reachability, scaling.")
@click.option("--json", "as_json", is_flag=True, help="Print diagnostics and the analyses as JSON on stdout.")
def check(specs, include_path, strict, want_report, as_json):
    """Parse, resolve, validate and review SPECS; report every problem found.

    Warnings and notes come from the design reviewer (`cyclec explain CODE` says why);
    a line silences one with a comment, `# allow: W102`. Exit 1 on errors, or on
    warnings with --strict.
    """
    from . import review as rv

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
        diags = rv.review(spec)
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
        if as_json:
            entries.append({"file": path, "diagnostics": [d.to_json() for d in diags], "report": analysis})
        elif analysis is not None:
            texts.append(rv.render_text(analysis))
    if as_json:
        click.echo(json.dumps(entries, indent=2))
    elif texts:
        click.echo("\n".join(texts), nl=False)
    if failed:
        n = sum(sum(d.severity == "error" for d in e.diagnostics) for e in failed)
        click.echo(f"cyclec: {n} problem{'s' if n != 1 else ''} in {len(failed)} file{'s' if len(failed) != 1 else ''}", err=True)
        sys.exit(EXIT_FINDINGS)


def _span_sources(diags) -> dict[str, str]:
    """The text of each file a diagnostic points into, for carets and `# allow:` comments."""
    out: dict[str, str] = {}
    for d in diags:
        f = d.span.file if d.span else None
        if f and f not in out:
            try:
                with open(f, encoding="utf-8") as fh:
                    out[f] = fh.read().removeprefix("\ufeff")
            except (OSError, UnicodeDecodeError):
                pass
    return out


@main.command()
@click.argument("code")
def explain(code):
    """Print what diagnostic CODE means, why it matters and how to fix it."""
    from .codes import CODES
    from .diagnostics import did_you_mean

    c = CODES.get(code.upper())
    if c is None:
        # letters typed for digits (W1O1) first, then the closest spelling
        norm = code[:1].upper() + code[1:].upper().replace("O", "0").replace("I", "1").replace("L", "1")
        hint = f"did you mean '{norm}'?" if norm in CODES else did_you_mean(code.upper(), CODES)
        raise click.UsageError(f"no diagnostic code '{code}'" + (f"; {hint}" if hint else "; codes look like E0101, W102, N101"))
    out = f"{c.code}: {c.title}\n\n{c.explanation}\n"
    if c.example:
        out += "\nexample:\n" + "".join(f"    {line}\n" for line in c.example.splitlines())
    click.echo(out, nl=False)


@main.command()
@spec_path
@output_option
@include_path_option
def ir(spec, output, include_path):
    """Print the resolved IR of SPEC as JSON."""
    s = load_spec(spec, include_path)
    write_output(output, json.dumps(s.model_dump(mode="json"), indent=2) + "\n")


@main.command()
@output_option
def schema(output):
    """Print the JSON Schema of the IR."""
    from .ir import json_schema

    write_output(output, json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


@main.command()
@spec_paths
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if any file would be reformatted; change nothing.")
@click.option("--write", is_flag=True, help="Rewrite the files in place (atomically).")
def fmt(specs, check_only, write):
    """Format SPECS canonically (to stdout unless --check or --write)."""
    from .io import atomic_write
    from .syntax.fmt import format_text

    if check_only and write:
        raise click.UsageError("--check and --write do not go together")
    if not check_only and not write and len(specs) > 1:
        raise click.UsageError("give one file to print, or use --check / --write for several")
    changed, failed = [], []
    for path in specs:
        try:
            with open(path, "rb") as f:
                raw = f.read()
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
                atomic_write(path, out)
                changed.append(path)
                click.echo(f"reformatted {path}", err=True)
        else:
            click.echo(out, nl=False)
    for e in failed:
        report(e)
    if failed or (check_only and changed):
        sys.exit(EXIT_FINDINGS)


def run() -> None:  # pragma: no cover - the console entry point
    main(prog_name="cyclec")


if __name__ == "__main__":  # pragma: no cover
    run()
