"""`cyclec build`: the PyTorch back-end on the command line (imported only when it runs)."""

from __future__ import annotations

import click

from ..backends.torch.build import ROLE_DOC
from . import include_path_option, load_spec, output_option, refuse_output_over_input, seed_option, spec_path, write_files, write_output



@click.command(epilog=ROLE_DOC.replace("\n", " "))
@spec_path
@output_option
@click.option("--weights", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Also write the initialised weights to this .safetensors file.")
@seed_option(None, "Seed the initialisation (the same seed gives the same weights).")
@click.option("--allow-large", is_flag=True, help="Build even above the parameter limit (E0219).")
@click.option("--fast/--readable", default=False, show_default=True,
              help="--fast (benchmarks/run.py measures it faster; cyclec train uses it) adds the fused next-token loss and "
                   "the token lookup's and the MoE experts' custom ops in a runtime section at the end of the file; "
                   "--readable (the default) leaves them out (F.cross_entropy, one plain MoE routing path). "
                   "The same model either way.")
@click.option("--parallel", is_flag=True,
              help="Add the tensor-parallel plan (TP_PLAN) and `parallelize` (FSDP2, tensor parallelism, activation "
                   "checkpointing) at the end of the file; cyclec train asks for them.")
@click.option("--comments", type=click.Choice(["ml", "both", "none"]), default="ml", show_default=True,
              help="Comments in ML words (ml), with a tag of the spec line and the engine word (both), or none.")
@include_path_option
def build(spec, output, weights, seed, allow_large, fast, parallel, comments, include_path):
    """Compile SPEC to standalone PyTorch source (stdout or -o) and print a summary.

    The source imports only torch and the standard library; `cyclelang.build`
    executes exactly this text. The summary (stderr) counts parameters per
    stage and per role and gives the main chamber's shape.
    """
    from ..backends.torch.build import build_source, summary_text
    from ..backends.torch.codegen import codegen

    refuse_output_over_input(output, [spec])
    refuse_output_over_input(weights, [spec], "--weights")
    if output is not None and weights is not None and output != "-":
        from ..io import same_file

        if same_file(output, weights) or output == weights:
            raise click.UsageError("-o and --weights name the same file")
    s = load_spec(spec, include_path)
    source = codegen(s, fast=fast, comments=comments, parallel=parallel)  # lowered once: the model runs the very text that is written
    model = build_source(s, source, seed=seed, allow_large=allow_large)
    payload = None
    if weights is not None:
        from safetensors.torch import save

        tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        # one metadata key: safetensors writes the metadata map in hash order, and a
        # single key keeps the file byte-identical from run to run
        payload = save(tensors, metadata={"format": "pt"})
    # write the artifacts only once everything has been computed, as one transaction:
    # the source and the weights on disk are both new or both old
    files = [(path, data) for path, data in ((output, source), (weights, payload)) if path is not None and path != "-" and data is not None]
    if files:
        write_files(files)
    if output is None or output == "-":
        write_output(output, source)
    click.echo(summary_text(s, model), err=True, nl=False)
