"""`cyclec`: the command line.

\b
Exit codes (the same for every command):
  0    success, nothing to report
  1    the spec has problems (diagnostics on stderr), or `fmt --check` would reformat
  2    usage error (a bad flag or value, a missing file argument, an output that is an input,
       a missing optional package or Graphviz program)
  3    the system refused to read or write a file (a missing or read-only directory, a full
       disk, a file-size limit, a closed stdout)
  123  internal error: a bug in cyclec, please report it
  130  interrupted (Ctrl-C); 128 + N for a caught signal N (143 for SIGTERM, 129 for SIGHUP)

Domain errors are mapped to exit codes in exactly one place (`CycleGroup.invoke`).
Diagnostics go to stderr; artifacts go to stdout or to `-o FILE`. This package
holds the group and what the commands share; each command lives in a module of
its own, imported only when that command runs (`LAZY_COMMANDS`): `check`, `ir`, `fmt` and
`schema` never load torch or graphviz, which `draw`, `build`, `fire` and `train` need.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from ..diagnostics import CycleError

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_IO, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 123, 130

# An optional package's import name -> how to install it (a missing one is a usage error, exit 2).
INSTALL_HINTS: dict[str, str] = {
    "torch": "pip install torch==2.13.0 && pip install 'cyclelang[torch]'",
    "safetensors": "pip install 'cyclelang[torch]'",
    "numpy": "pip install 'cyclelang[torch]'",
    "matplotlib": "pip install 'cyclelang[stand]'",
}


class UsageProblem(click.ClickException):
    """One line on stderr, exit 2: something about the invocation or the environment the user can fix."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:
        click.echo(f"cyclec: {self.message}", err=True)


class SystemRefused(UsageProblem):
    """One line on stderr, exit 3: the operating system refused a read or a write."""

    exit_code = EXIT_IO


def os_problem(e: OSError, path: str | None = None) -> SystemRefused:
    import errno

    where = path or e.filename
    why = e.strerror or str(e)
    if e.errno == errno.ENOENT and where:
        why = "the directory does not exist" if not os.path.isdir(os.path.dirname(os.path.abspath(where))) else why
    return SystemRefused(f"cannot write '{where}': {why}" if where else f"cannot write the output: {why}")


def refuse_output_over_input(output: str | None, inputs, what: str = "-o") -> None:
    """A usage error when an output path names one of the input files (it would overwrite the spec):
    by its path, through a symlink (the output's or a folder's on its way), or as a hard link to
    the same inode (`io.same_file`). Every command that writes a file calls it before it reads."""
    from ..io import same_file

    if output is None or output == "-":
        return
    for path in inputs:
        if path and same_file(output, path):
            raise UsageProblem(f"{what} {output} is the input file {path}: refusing to overwrite it")

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
    # the torch- and graphviz-free commands: lazy too, so the package never imports a module
    # that imports it back (tests/test_layers.py: no import circle)
    "check": "cyclelang.cli.check:check",
    "explain": "cyclelang.cli.info:explain",
    "ir": "cyclelang.cli.info:ir",
    "schema": "cyclelang.cli.info:schema",
    "fmt": "cyclelang.cli.fmt:fmt",
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
        from ..io import Terminated, signals_raise

        try:
            with signals_raise():
                return super().invoke(ctx)
        except CycleError as e:
            report(e)
            ctx.exit(EXIT_FINDINGS)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("cyclec: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except Terminated as e:
            click.echo(f"cyclec: terminated by signal {e.signum}", err=True)
            ctx.exit(128 + e.signum)
        except BrokenPipeError:
            ctx.exit(EXIT_OK)
        except ModuleNotFoundError as e:
            root = (e.name or "").split(".")[0]
            if root not in INSTALL_HINTS:
                raise
            UsageProblem(f"this command needs the optional package '{root}', which is not installed: {INSTALL_HINTS[root]}").show()
            ctx.exit(EXIT_USAGE)
        except OSError as e:  # the environment, not a bug: a full disk, a closed stdout, a read-only directory
            if e.errno is None:
                raise
            os_problem(e).show()
            ctx.exit(EXIT_IO)
        except Exception:
            click.echo("cyclec: internal error (this is a bug in cyclec, not in your spec):", err=True)
            click.echo(traceback.format_exc(), err=True)
            ctx.exit(EXIT_INTERNAL)


spec_paths = click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
spec_path = click.argument("spec", type=click.Path(dir_okay=False, path_type=str))
output_option = click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None, help="Write to this file instead of stdout.")
MAX_SEED = 2**63 - 1  # what every torch generator takes, with room for the stand's derived seeds


def seed_option(default, help: str):
    return click.option("--seed", type=click.IntRange(0, MAX_SEED), default=default, show_default=default is not None, help=help)


include_path_option = click.option("--include-path", "include_path", multiple=True, type=click.Path(file_okay=False, path_type=str), help="Also allow includes from this directory (repeatable).")


def load_spec(path: str, include_path=()):
    from ..semantics.resolve import load

    return load(path, include_path=tuple(include_path))


def weights_file(path: str | None) -> str | None:
    """`--weights` names a .safetensors file or a `cyclec train` run folder: the folder's newest
    complete checkpoint's weights."""
    if path is None or not os.path.isdir(path):
        return path
    from ..training.checkpoint import weights as run_weights

    found = run_weights(path)
    if found is None:
        raise click.BadParameter(f"{path} is not a run folder with a complete checkpoint", param_hint="--weights")
    return str(found)


def write_output(output: str | None, data: str | bytes) -> None:
    """An artifact to stdout (as UTF-8 bytes, whatever the locale's encoding), or atomically to a file."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if output is None or output == "-":
        stream = sys.stdout
        if stream is None:  # stdout was closed: there is nowhere to write the artifact
            raise SystemRefused("cannot write the output: stdout is closed")
        buffer = getattr(stream, "buffer", None)
        try:
            if buffer is not None:
                stream.flush()
                buffer.write(payload)
                buffer.flush()
            else:
                stream.write(payload.decode("utf-8"))
                stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise SystemRefused(f"cannot write the output to stdout: {e.strerror or e}") from None
        return
    write_files([(output, payload)])


def write_files(items) -> None:
    """Several artifacts (path, data), all or none (`io.atomic_write_all`); OSError becomes exit 3."""
    from ..io import atomic_write_all

    try:
        atomic_write_all(items)
    except OSError as e:
        raise os_problem(e, getattr(e, "filename", None) or items[0][0]) from None


@click.group(cls=CycleGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=__doc__.split("\n\n")[1])
@click.version_option(package_name="cyclelang", prog_name="cyclec")
def main():
    """cyclec: compile .cycle specs of neural-network blocks, written as rocket-engine power cycles."""


def run() -> None:  # pragma: no cover - the console entry point
    main(prog_name="cyclec")
