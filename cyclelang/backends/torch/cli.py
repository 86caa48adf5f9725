"""`cyclec build`: the PyTorch back-end on the command line (imported only when it runs)."""

from __future__ import annotations

import os

import click

from ...cli import include_path_option, load_spec, output_option, spec_path, write_output
from .codegen import ROLE_DOC

ROLE_ORDER = ("feed", "mixers", "reactors", "throats", "valves", "merges", "nozzle", "other")


@click.command(epilog=ROLE_DOC.replace("\n", " "))
@spec_path
@output_option
@click.option("--weights", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Also write the initialised weights to this .safetensors file.")
@click.option("--seed", type=int, default=None, help="Seed the initialisation (the same seed gives the same weights).")
@click.option("--allow-large", is_flag=True, help="Build even above the parameter limit (E0219).")
@include_path_option
def build(spec, output, weights, seed, allow_large, include_path):
    """Compile SPEC to standalone PyTorch source (stdout or -o) and print a summary.

    The source imports only torch and the standard library; `cyclelang.build`
    executes exactly this text. The summary (stderr) counts parameters per
    stage and per role and gives the main chamber's shape.
    """
    from ...io import atomic_write
    from .build import build as build_model
    from .codegen import _engine_spec, codegen

    s = _engine_spec(load_spec(spec, include_path))
    source = codegen(s)
    model = build_model(s, seed=seed, allow_large=allow_large)
    payload = None
    if weights is not None:
        from safetensors.torch import save

        tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        # one metadata key: safetensors writes the metadata map in hash order, and a
        # single key keeps the file byte-identical from run to run
        payload = save(tensors, metadata={"format": "pt"})
    # write the artifacts only once everything has been computed, and only when every
    # target directory is there, so a failure leaves no new file beside an old one
    for path in (output, weights):
        if path is not None and path != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise click.FileError(path, "the directory does not exist")
    if output is not None and output != "-":
        _write(output, source, atomic_write)
    else:
        write_output(output, source)
    if payload is not None:
        _write(weights, payload, atomic_write)
    click.echo(summary_text(s, model), err=True, nl=False)


def _write(path: str, data, atomic_write) -> None:
    try:
        atomic_write(path, data)
    except OSError as e:
        raise click.FileError(path, e.strerror or str(e)) from None


def summary_text(s, model) -> str:
    from .build import param_summary

    e = s.engine
    info = param_summary(s, model)
    lines = [f"engine {e.name}: {info['total']:,} parameters"]
    lines.append(f"  chamber: (B, T<={e.feed.context}, {e.width}), throat {e.throat}, vocab {e.feed.vocab}")
    from ... import ir

    for op in e.body:
        if isinstance(op, ir.Stage):
            n = info["stages"].get(op.name, 0)
            each = f" ({n // op.repeat:,} each)" if op.repeat > 1 else ""
            lines.append(f"  stage {op.name} x{op.repeat}: {n:,}{each}")
    roles = info["roles"]
    for r in ROLE_ORDER:
        if r in roles or r in ("feed", "nozzle"):
            n = roles.get(r, 0)
            note = " (tied to the feed)" if r == "nozzle" and e.nozzle.tied and n == 0 else ""
            lines.append(f"  {r}: {n:,}{note}")
    return "\n".join(lines) + "\n"
