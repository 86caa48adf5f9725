"""`cyclec train`: imported only when that command runs (it imports torch)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from . import EXIT_INTERRUPTED, EXIT_USAGE, UsageProblem, include_path_option, load_spec, write_output

SPEC_HELP = "The spec's startup block (warmup, schedule, clip, betas, decay), unless overridden here."


@click.command(epilog=SPEC_HELP)
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=str))
@click.option("--data", multiple=True, type=str, help="Text files, folders of them, or .bin/.npy token arrays (repeatable).")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=str), default=None, help="The run folder to create.")
@click.option("--resume", type=click.Path(file_okay=False, exists=True, path_type=str), default=None,
              help="Continue the run in this folder from its latest checkpoint (SPEC defaults to its spec.cycle).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, exists=True, path_type=str), default=None,
              help="Only draw RUN_DIR's curves (RUN_DIR/curves.png, or -o) and exit.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str), default=None, help="With --plot: write the PNG here.")
@click.option("--steps", type=int, default=1000, show_default=True, help="Optimizer steps.")
@click.option("--seq", type=int, default=None, help="Tokens per sequence [default: the context, at most 256].")
@click.option("--micro-batch", type=int, default=8, show_default=True, help="Sequences per micro-step on each data-parallel rank.")
@click.option("--batch-tokens", type=int, default=None, help="Tokens per optimizer step, reached by gradient accumulation [default: one micro-step].")
@click.option("--tokenizer", type=click.Path(exists=True, path_type=str), default=None,
              help="A tokenizers JSON file or a transformers tokenizer folder [default: bytes, 256 tokens].")
@click.option("--holdout", type=float, default=0.1, show_default=True, help="Fraction of the data held out for evaluation (its end).")
@click.option("--bin-dtype", type=click.Choice(["uint8", "uint16", "uint32", "int32", "int64"]), default="uint16", show_default=True,
              help="The token type of .bin files.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the weights, the data order and dropout.")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Mixed precision: autocast to this type (fp16 with a GradScaler).")
@click.option("--compile", "compile_", is_flag=True,
              help="torch.compile the model in place, each distinct stage once (regional; its instances share the graph).")
@click.option("--compile-mode", type=click.Choice(["regional", "whole"]), default="regional", show_default=True,
              help="With --compile: regional (each kind of stage a graph of its own, the ends eager) or whole (one graph).")
@click.option("--eval-every", type=int, default=100, show_default=True, help="Evaluate the held-out loss every N steps (0: at the end only).")
@click.option("--eval-batches", type=int, default=8, show_default=True, help="Micro-batches per evaluation.")
@click.option("--ckpt-every", type=int, default=500, show_default=True, help="Checkpoint every N steps (0: at the end and on Ctrl-C only).")
@click.option("--lr", type=float, default=None, help="Peak learning rate (the schedule's lr=).")
@click.option("--min-lr", type=float, default=None, help="The schedule's floor (min=).")
@click.option("--warmup", type=int, default=None, help="Warmup steps (the open-loop start sequence).")
@click.option("--schedule", type=click.Choice(["constant", "cosine", "linear"]), default=None, help="The schedule's shape.")
@click.option("--lr-steps", type=int, default=None, help="Steps the schedule decays over (steps=).")
@click.option("--clip", type=float, default=None, help="Clip the gradient norm at this (0: no clipping): the restrictor orifice.")
@click.option("--betas", type=float, nargs=2, default=None, help="AdamW's betas: the POGO accumulator.")
@click.option("--decay", type=float, default=None, help="Weight decay of the matrices.")
@click.option("--fsdp", is_flag=True, help="Distributed: shard parameters, gradients and optimizer state (FSDP2) over the data-parallel ranks.")
@click.option("--tp", type=int, default=1, show_default=True, help="Distributed: tensor-parallel degree (heads and hidden widths split).")
@click.option("--pp", type=int, default=1, show_default=True,
              help="Distributed: pipeline-parallel degree (the engine's stage instances split into pieces, balanced by FLOPs).")
@click.option("--microbatches", type=int, default=None, help="With --pp: micro-steps per optimizer step, run as the pipeline's microbatches "
              "[default: from --batch-tokens].")
@click.option("--pp-schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), default="1f1b", show_default=True,
              help="With --pp: the pipeline schedule (interleaved: two pieces per rank).")
@click.option("--ep", type=int, default=1, show_default=True,
              help="Distributed: expert-parallel degree (each MoE's experts split over this many ranks, tokens routed by all-to-all; "
              "with --pp, among the ranks of each pipeline rank).")
@click.option("--cp", type=int, default=1, show_default=True,
              help="Distributed: context-parallel degree (refused for now, naming each mixer and why).")
@click.option("--checkpointing", type=click.Choice(["none", "stage", "selective"]), default="none", show_default=True,
              help="Activation checkpointing per stage.")
@click.option("--progress/--no-progress", default=None, help="The progress bar [default: when stderr is a terminal].")
@include_path_option
@click.pass_context
def train(ctx, spec, data, out, resume, plot_dir, output, include_path, progress, compile_, **options):
    """Train SPEC on --data into the run folder --out.

    A progress bar shows loss, tokens/s and ETA; every --eval-every steps a line
    gives the held-out loss and bits per byte. The run folder holds spec.cycle,
    model.py (the generated source), metrics.jsonl, curves.png and checkpoints
    (safetensors weights + optimizer, scheduler, data order and RNG state).
    Ctrl-C writes a checkpoint and stops (exit 130; SIGTERM 143); --resume RUN_DIR continues
    exactly where it stopped. Distributed: torchrun --nproc-per-node N -m cyclelang
    train ... [--fsdp] [--tp N] [--pp N --microbatches M] [--ep N] [--checkpointing stage].
    """
    from ..training.loop import TRAIN_EXTRA, MissingPackages, Settings, load_settings, require, run, show_progress_bar
    from ..training.plot import plot, read_metrics

    def warn(line: str) -> None:
        click.echo(f"cyclec train: {line}", err=True)

    if plot_dir is not None:
        try:
            import matplotlib  # noqa: F401  (checked before anything is read or written)
        except ImportError:
            raise UsageProblem(f"--plot needs the optional package 'matplotlib', which is not installed: {TRAIN_EXTRA}") from None
        path = Path(plot_dir) / "metrics.jsonl"
        records = read_metrics(plot_dir, warn=warn) if path.is_file() else None
        if not records:
            raise click.UsageError(f"{plot_dir} holds no metrics.jsonl to plot" if not path.is_file() else
                                   f"{path} holds no metrics records to plot")
        target = output or os.path.join(plot_dir, "curves.png")
        write_output(target, plot(records, title=Path(plot_dir).name))
        click.echo(f"cyclec: wrote {target}", err=True)
        return
    given = ctx.get_parameter_source
    if resume is not None:
        settings = load_settings(resume)
        for key in ("steps", "eval_every", "ckpt_every"):  # a resumed run may be made longer or logged differently
            if given(key) == click.core.ParameterSource.COMMANDLINE:
                setattr(settings, key, options[key])
        settings.ep = options["ep"]  # the layout is this launch's: DCP reloads the experts at another --ep (1 by default)
        settings.pp = options["pp"]  # the pipeline follows the launch (DCP reloads at another degree)
        if given("pp_schedule") == click.core.ParameterSource.COMMANDLINE:
            settings.pp_schedule = options["pp_schedule"]
        if data:
            settings.data = list(data)
        spec = spec or os.path.join(resume, "spec.cycle")
        run_dir = resume
    else:
        if spec is None or out is None or not data:
            click.echo("cyclec train: give SPEC, --data and --out (or --resume RUN_DIR, or --plot RUN_DIR)", err=True)
            ctx.exit(EXIT_USAGE)
        names = {f.name for f in dataclasses.fields(Settings)}
        settings = Settings(data=list(data), compile=compile_, **{k: (tuple(v) if k == "betas" and v else v) for k, v in options.items()
                                                                   if k in names})
        run_dir = out
    try:  # every optional package the run will need, before anything is created or trained
        require(settings, show_progress_bar(progress, os.environ.get("RANK", "0") == "0"))
    except MissingPackages as e:
        raise UsageProblem(str(e)) from None
    s = load_spec(spec, include_path)
    text = Path(spec).read_text("utf-8")
    try:
        result = run(s, settings, run_dir, spec_text=text, resume=resume is not None, show_progress=progress, spec_path=spec)
    except MissingPackages as e:
        raise UsageProblem(str(e)) from None
    except ImportError as e:  # a package imported past the check (a broken install): still a usage error
        raise UsageProblem(f"this run needs the package '{e.name}', which failed to import: {TRAIN_EXTRA}") from None
    if result.interrupted:
        ctx.exit(128 + result.signal if result.signal else EXIT_INTERRUPTED)
