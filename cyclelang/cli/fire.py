"""`cyclec fire`: imported only when that command runs (it imports torch)."""

from __future__ import annotations

import sys

import click

from . import EXIT_INTERRUPTED, EXIT_FINDINGS, include_path_option, load_spec, refuse_output_over_input, seed_option, spec_paths, weights_file, write_output

MAX_BATCH = 4096  # sequences per batch: past this the stand measures nothing new, and memory runs out


class Progress:
    """A progress bar on stderr when it is a terminal; otherwise a line every tenth of the run."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def __call__(self, name: str, step: int, steps: int, loss: float) -> None:
        if self.tty:
            filled = int(30 * step / steps)
            self.stream.write(f"\r{name}: [{'#' * filled}{'.' * (30 - filled)}] {step}/{steps} loss {loss:.3f}")
            if step == steps:
                self.stream.write("\n")
            self.stream.flush()
        elif step == steps or step % max(1, steps // 10) == 0:
            self.stream.write(f"{name}: step {step}/{steps} loss {loss:.3f}\n")
            self.stream.flush()


@click.command()
@spec_paths
@click.option("--width", type=click.IntRange(min=1), default=None, help="Fire a scale model at this chamber width (heads and hidden widths follow).")
@click.option("--depth", type=click.IntRange(min=1), default=None, help="Repeat every repeated stage on the main line this many times (the stages nested in them keep their repeats).")
@click.option("--vocab", type=click.IntRange(min=2), default=None, help="Fire a scale model with this vocabulary.")
@click.option("--context", type=click.IntRange(min=1), default=None, help="Fire a scale model at this context (sliding windows keep their share of it).")
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Fire a scale model with this many heads in every multi-head part.")
@click.option("--seq", type=click.IntRange(min=1), default=None, help="Tokens per sequence [default: 64, or the context if shorter].")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=4, show_default=True, help="Sequences per batch.")
@seed_option(0, "Seeds the weights, the tokens and training.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=str), default=None, help="Write the report as JSON here ('-': stdout, instead of the table).")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=str), default=None, help="Write PNG plots here, every spec overlaid.")
@click.option("--data", type=click.Path(dir_okay=False, exists=True, path_type=str), default=None, help="Fire on this file's bytes as tokens instead of random tokens (and train on it).")
@click.option("--train", "train_steps", type=click.IntRange(min=0), default=0, show_default=True, help="Then train this many steps with the spec's startup block (default source: a seeded Markov chain with a known entropy rate).")
@click.option("--coord-check", is_flag=True, help="μP's coordinate check instead: shrink to each of --widths, train --steps steps at a fixed lr, and fit how each layer type's mean |activation| grows with width.")
@click.option("--lr-sweep", is_flag=True, help="Train each of --widths at each of --lrs, under the standard parametrisation and under μP, and report the best lr per width.")
@click.option("--widths", type=str, default=None, help="Comma-separated widths for --coord-check [default: 64,128,256,512] and --lr-sweep.")
@click.option("--lrs", type=str, default=None, help="Comma-separated learning rates for --lr-sweep.")
@click.option("--steps", type=int, default=None, help="Training steps of --coord-check [default: 5] or of each --lr-sweep run [default: 200].")
@click.option("--lr", type=float, default=None, help="--coord-check's fixed learning rate [default: the schedule's peak].")
@click.option("--weights", type=click.Path(exists=True, path_type=str), default=None,
              help="Fire these weights: a .safetensors file or a `cyclec train` run folder (its newest checkpoint).")
@include_path_option
@click.pass_context
def fire(ctx, specs, width, depth, vocab, context, heads, seq, batch, seed, json_out, plot_out, data, train_steps, coord_check, lr_sweep, widths, lrs, steps,
         lr, weights, include_path):
    """The test stand: fire SPECS at initialisation and measure them.

    For each stage: chamber pressure (RMS of the residual stream after it), burn
    intensity of each branch (||f(x)|| / ||x||), and the pressure chain (the
    gradient norm entering the stage, and per parameter). Checks that fail loudly
    (exit 1): detached branches pass exactly zero gradient, a causal engine leaks
    nothing from the future, KV-cache decoding matches the full pass; with --train, a
    flameout (the loss NaN, infinite or above its initial value) also exits 1. Ctrl-C during
    --train stops the run and still writes what was measured (exit 130).
    """
    from ..stand.report import plot, table
    from ..stand.run import file_label, fire as run_fire

    for out, flag in ((json_out, "--json"), (plot_out, "--plot")):
        refuse_output_over_input(out, [*specs, data], flag)
    if plot_out is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:  # before minutes of firing, not after
            raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
    resolved = [load_spec(path, include_path) for path in specs]
    if coord_check or lr_sweep:
        for flag, given in (("--vocab", vocab), ("--context", context), ("--heads", heads)):
            if given is not None:
                raise click.UsageError(f"{flag} does not apply to {'--coord-check' if coord_check else '--lr-sweep'} (it sets its own sizes)")
        return scaling_runs(ctx, specs, resolved, coord_check, lr_sweep, widths, lrs, steps, lr, width, depth, seq, batch, seed,
                            json_out, plot_out, data, train_steps)
    weights = weights_file(weights)
    progress = Progress() if train_steps else None
    report = run_fire(resolved, files=[file_label(path, s) for path, s in zip(specs, resolved)], width=width, depth=depth, seq=seq,
                      vocab=vocab, context=context, heads=heads, batch=batch, seed=seed, data=data, train=train_steps, progress=progress, weights=weights)
    if json_out is not None:
        write_output(json_out, report.model_dump_json(indent=2) + "\n")
    if json_out != "-":
        click.echo(table(report), nl=False)
    if plot_out is not None:
        write_output(plot_out, plot(report))
    for name, check in report.failed:
        click.echo(f"cyclec: {name}: check '{check.name}' failed: {check.detail}", err=True)
    flameouts = [(r.name, r.training.flameout) for r in report.runs if r.training is not None and r.training.flameout is not None]
    for name, f in flameouts:
        click.echo(f"cyclec: {name}: flameout at step {f.step + 1}: {f.reason}" + (f" (largest update ratio: {f.group})" if f.group else ""), err=True)
    if report.interrupted:
        click.echo("cyclec: interrupted; wrote what was measured", err=True)
        ctx.exit(EXIT_INTERRUPTED)
    if report.failed or flameouts:
        ctx.exit(EXIT_FINDINGS)


def _numbers(text: str | None, name: str, kind):
    if text is None:
        return None
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.UsageError(f"{name} takes comma-separated numbers, not {text!r}") from None
    if not values:
        raise click.UsageError(f"{name} is empty")
    return values


def scaling_runs(ctx, specs, resolved, coord, sweep, widths, lrs, steps, lr, width, depth, seq, batch, seed, json_out, plot_out, data,
                 train_steps):
    """--coord-check and --lr-sweep: the widths are the measurement, so --width, --data and --train do not apply."""
    from ..stand.coord import coord_check, lr_sweep
    from ..stand.report import coord_plot, coord_table, sweep_plot, sweep_table
    from ..stand.run import file_label

    if coord and sweep:
        raise click.UsageError("--coord-check and --lr-sweep are two runs: ask for one at a time")
    for flag, given in (("--width", width is not None), ("--data", data is not None), ("--train", bool(train_steps))):
        if given:
            raise click.UsageError(f"{flag} does not apply to {'--coord-check' if coord else '--lr-sweep'} (it sets its own widths and steps)")
    ws = _numbers(widths, "--widths", int) or ([64, 128, 256, 512] if coord else None)
    if sweep and (ws is None or lrs is None):
        raise click.UsageError("--lr-sweep needs --widths and --lrs")
    if lr is not None and not coord:
        raise click.UsageError("--lr applies to --coord-check (the sweep sets its own)")
    progress = Progress()
    results = []
    for path, s in zip(specs, resolved):
        label = file_label(path, s)
        try:
            if coord:
                results.append(coord_check(s, file=label, widths=ws, steps=steps or 5, lr=lr, depth=depth, seq=seq, batch=batch,
                                           seed=seed, progress=progress))
            else:
                results.append(lr_sweep(s, file=label, widths=ws, lrs=_numbers(lrs, "--lrs", float), steps=steps or 200, depth=depth,
                                        seq=seq, batch=batch, seed=seed, progress=progress))
        except KeyboardInterrupt:
            click.echo("cyclec: interrupted; nothing written (a coordinate check or sweep is only read whole)", err=True)
            ctx.exit(EXIT_INTERRUPTED)
    if json_out is not None:
        text = "[" + ",\n".join(r.model_dump_json(indent=2) for r in results) + "]\n"
        write_output(json_out, text)
    if json_out != "-":
        click.echo("\n".join((coord_table if coord else sweep_table)(r) for r in results), nl=False)
    if plot_out is not None:
        write_output(plot_out, (coord_plot if coord else sweep_plot)(results))
    if coord and any(layer.flag for r in results for layer in r.layers):
        ctx.exit(EXIT_FINDINGS)
