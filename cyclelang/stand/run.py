"""`fire`: put engines on the stand. Imports torch (through the torch back-end)."""

from __future__ import annotations

import os
import sys
from typing import Callable

import torch

from .. import ir
from ..diagnostics import CycleError, Diagnostic
from .data import ALPHABET, ByteFile, Markov, RandomTokens
from .measure import check_causal, check_detach, check_kv_cache, static_fire
from .result import Firing, Settings, StandReport
from .shrink import shrink
from .train import Objective, hot_fire, mask_positions

DEFAULT_SEQ = 64
DEFAULT_BATCH = 4


def file_label(spec, s: ir.Spec) -> str:
    """How a report names the file a spec came from: a path as given (relative to here when
    it was absolute, else its name), or the engine's file name; never an absolute path."""
    if isinstance(spec, (str, os.PathLike)) and str(spec).endswith(".cycle") and "\n" not in str(spec):
        path = str(spec)
        if os.path.isabs(path):
            rel = os.path.relpath(path)
            path = rel if not rel.startswith("..") else os.path.basename(path)
        return path.replace(os.sep, "/")
    if s.engine is not None and s.engine.span is not None:
        return os.path.basename(s.engine.span.file)
    return "<spec>"


def propellant(spec: ir.Spec, data_source, T: int, seed: int):
    """(source, objective, floor, unigram) for training: next tokens behind a causal throat;
    behind an open one, masked tokens (a bidirectional engine would read the next token off
    its input), with a mask token outside the source's symbols and the floor of that objective.
    data_source: the --data file's bytes (floor unknown), or None for the Markov chain."""
    e = spec.engine
    masked = e.throat == "open"
    if data_source is not None:
        if not masked:
            return data_source, Objective(), None, None
        if e.feed.vocab < 257:
            raise _bad(f"{e.name} has an open throat: it trains on masked tokens, and a mask token needs a vocab above the 256 "
                       f"byte values, not {e.feed.vocab}", "fire it without --data (the Markov source), or give it vocab=257 or more")
        return data_source, Objective(mask=256), None, None
    symbols = min(ALPHABET, e.feed.vocab - 1 if masked else e.feed.vocab)
    if symbols < 2:
        raise _bad(f"{e.name}'s vocab of {e.feed.vocab} leaves no room for a source of 2 symbols"
                   + (" and a mask token (its throat is open: it trains on masked tokens)" if masked else ""),
                   "give the feed a larger vocab")
    src = Markov(symbols, seed=seed)
    if not masked:
        return src, Objective(), src.entropy_rate, src.unigram
    objective = Objective(mask=symbols)
    return src, objective, src.masked_floor(T, lambda shape, gen: mask_positions(shape, objective.rate, gen), seed), src.unigram


def startup_notes(model, spec: ir.Spec, steps: int) -> list[str]:
    """What makes a run of `steps` steps less than the spec's start sequence: a warmup or a
    schedule that outlasts it (the learning rates are the generated model's own)."""
    s = spec.engine.startup
    learning_rate = sys.modules[type(model).__module__].learning_rate
    notes = []
    peak, last = s.schedule.lr, learning_rate(steps - 1)
    if s.warmup >= steps:
        notes.append(f"the warmup of {s.warmup} steps outlasts --train {steps}: the learning rate ends at {last:.3g}, "
                     f"{last / peak:.1%} of its peak {peak:.3g}; a run this short learns little (--train {2 * s.warmup} or more)")
    elif s.schedule.kind != "constant" and s.schedule.steps is not None and s.schedule.steps > steps:
        notes.append(f"the {s.schedule.kind} schedule runs to step {s.schedule.steps}, past --train {steps}: "
                     f"the learning rate ends at {last:.3g}, not at its floor {s.schedule.min_lr:.3g}")
    return notes


def _bad(message: str, help: str | None = None) -> CycleError:
    return CycleError([Diagnostic("E0117", "error", message, None, help)])


def fire(specs, *, files=None, width: int | None = None, depth: int | None = None, seq: int | None = None, batch: int = DEFAULT_BATCH,
         seed: int = 0, data: str | None = None, train: int = 0, vocab: int | None = None, context: int | None = None, heads: int | None = None,
         progress: Callable[[str, int, int, float], None] | None = None, weights: str | None = None) -> StandReport:
    """Fire one resolved spec or several (`ir.Spec`) and return what the stand measured.

    files: how the report names each spec's file (default: its engine's file name).
    width/depth (and vocab, context, heads): fire a scale model (see `ir.passes.shrink`). seq, batch: the
    tokens of the static fire and of training. data: a file whose bytes are the tokens
    (default: seeded random tokens for the static fire, the Markov source for training).
    train: steps of training with the spec's startup block after the static fire.
    progress(name, step, steps, loss) is called after every training step. weights: a
    .safetensors file (one spec, full size) to fire instead of the initialisation.
    """
    from ..backends.torch.build import build

    if isinstance(specs, ir.Spec):
        specs = [specs]
    if not all(isinstance(s, ir.Spec) for s in specs):
        raise TypeError("the stand fires ir.Spec objects; cyclelang.fire takes paths and text")
    files = list(files) if files is not None else [file_label(s, s) for s in specs]
    if batch < 1:
        raise _bad(f"--batch must be at least 1, not {batch}")
    if train < 0:
        raise _bad(f"--train must be 0 or more steps, not {train}")
    sizes = dict(width=width, depth=depth, vocab=vocab, context=context, heads=heads)
    if weights is not None and (len(specs) != 1 or any(v is not None for v in sizes.values())):
        raise _bad("--weights fires one spec at its full size", "drop --width/--depth/--vocab/--context/--heads and the other specs")
    runs: list[Firing] = []
    interrupted = False
    for s, label in zip(specs, files):
        small = shrink(s, **sizes)
        e = small.engine
        T = min(DEFAULT_SEQ, e.feed.context) if seq is None else seq
        if not 1 <= T <= e.feed.context:
            raise _bad(f"--seq {T} does not fit {e.name}'s context of {e.feed.context}", f"use --seq {e.feed.context} or less")
        model = build(small, seed=seed, fast=True)
        if weights is not None:
            from ..backends.torch.build import WeightsError, load_weights

            try:
                load_weights(model, weights)
            except WeightsError as err:
                raise _bad(f"--weights {weights} do not fit {e.name}: {err}") from None
        source = ByteFile(data, e.feed.vocab) if data else RandomTokens(e.feed.vocab)
        tokens = source.batch(batch, T, torch.Generator().manual_seed(seed))
        idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        loss, feed_rms, stages, engine_params = static_fire(model, small, idx, targets)
        checks = [check_detach(model, small, idx, targets), check_causal(model, small, idx), check_kv_cache(model, small, idx)]
        training = None
        if train:
            src, objective, floor, unigram = propellant(small, source if data else None, T, seed)
            cb = None if progress is None else (lambda step, steps, value, _n=e.name: progress(_n, step, steps, value))
            training = hot_fire(model, small, src, train, batch, T, seed, floor, unigram, objective, startup_notes(model, small, train), cb)
        runs.append(Firing(
            name=e.name, file=label,
            settings=Settings(width=e.width, depth=len(stages), seq=T, batch=batch, seed=seed,
                              params=sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
                              data=source.name),
            loss=loss, feed_pressure=feed_rms, stages=stages, engine_params=engine_params, checks=checks, training=training))
        if training is not None and training.interrupted:
            interrupted = True
            break
    return StandReport(runs=runs, interrupted=interrupted)


