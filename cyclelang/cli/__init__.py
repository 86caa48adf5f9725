"""`cyclec`: the command line.

\b
Exit codes (the same for every command):
  0    success, nothing to report
  1    the spec has problems (diagnostics on stderr), or `fmt --check` would reformat
  2    usage error (a bad flag, a missing file argument)
  123  internal error: a bug in cyclec, please report it
  130  interrupted

Domain errors are mapped to exit codes in exactly one place (`CycleGroup.invoke`).
Diagnostics go to stderr; artifacts go to stdout or to `-o FILE`. This package
holds the group and what the commands share; each command lives in a module of
its own. Those that need torch or graphviz (`draw`, `build`, `fire`, `train`) are imported
only when that command runs, so `check`, `ir`, `fmt` and `schema` start fast.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from ..diagnostics import CycleError

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 123, 130

# Commands imported only when they run (or when --help lists them): name -> "module:attribute".
LAZY_COMMANDS: dict[str, str] = {
    "draw": "cyclelang.cli.draw:draw",
    "build": "cyclelang.cli.build:build",
    "fire": "cyclelang.cli.fire:fire",
    "import": "cyclelang.cli.interop:import_",
    "export": "cyclelang.cli.interop:export",
    "lsp": "cyclelang.cli.lsp:lsp",
    "serve": "cyclelang.cli.serve:serve",
    "diff": "cyclelang.cli.diff:diff",
    "train": "cyclelang.cli.train:train",
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
    from ..semantics.resolve import load

    return load(path, include_path=tuple(include_path))


def write_output(output: str | None, data: str | bytes) -> None:
    """An artifact to stdout, or atomically to a file."""
    if output is None or output == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            click.echo(data, nl=False)
        return
    from ..io import atomic_write

    atomic_write(output, data)


@click.group(cls=CycleGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=__doc__.split("\n\n")[1])
@click.version_option(package_name="cyclelang", prog_name="cyclec")
def main():
    """cyclec: compile .cycle specs of neural-network blocks, written as rocket-engine power cycles."""


def run() -> None:  # pragma: no cover - the console entry point
    main(prog_name="cyclec")


# The torch- and graphviz-free commands, registered eagerly (after everything they share
# is defined above). The package's attributes `check`, `fmt` and `info` are these modules.
from . import check, fmt, info  # noqa: E402

for _command in (check.check, info.explain, info.ir, info.schema, fmt.fmt):
    main.add_command(_command)
del _command
