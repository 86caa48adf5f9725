"""`cyclec build`: the PyTorch back-end on the command line (imported only when it runs)."""

from __future__ import annotations

import os

import click

from ..backends.torch.build import ROLE_DOC, summary_text
from . import include_path_option, load_spec, output_option, spec_path, write_output


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
    from ..backends.torch.build import build_source
    from ..backends.torch.codegen import codegen
    from ..io import atomic_write

    s = load_spec(spec, include_path)
    source = codegen(s)  # lowered once: the model runs the very text that is written
    model = build_source(s, source, seed=seed, allow_large=allow_large)
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
