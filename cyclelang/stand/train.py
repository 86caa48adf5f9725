"""A short hot fire: train the engine for a few hundred steps with its own startup block.

`configure_optimizer()` and `learning_rate` come from the generated model, so the
warmup (the open-loop start sequence), schedule, clipping (the restrictor
orifice), betas (the POGO accumulator) and decay are exactly the spec's. Every
random draw (weights, batches, dropout) comes from the seed, so a run repeats
bit for bit on the same machine and thread count. Ctrl-C ends the run between
steps; what was measured so far is returned, marked interrupted.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable

import torch

from .result import Spike, Training

SPIKE_WINDOW = 20  # steps of history a spike is measured against
SPIKE_MIN = 0.1  # nats: smaller jumps are noise at these batch sizes
SPIKE_MADS = 6.0  # ... or this many robust deviations of the window, whichever is larger


def find_spikes(losses: list[float], window: int = SPIKE_WINDOW) -> list[Spike]:
    """Loss spikes (combustion instability): steps whose loss jumps above the median of the
    `window` steps before by more than max(SPIKE_MIN, SPIKE_MADS x 1.4826 x MAD).
    Consecutive steps above the line are one spike, reported at its peak. A non-finite
    loss is a spike of infinite size (flameout)."""
    spikes: list[Spike] = []
    current: Spike | None = None
    for t in range(window, len(losses)):
        hist = [v for v in losses[t - window : t] if math.isfinite(v)]
        if len(hist) < window // 2:
            continue
        base = statistics.median(hist)
        mad = statistics.median(abs(v - base) for v in hist)
        line = max(SPIKE_MIN, SPIKE_MADS * 1.4826 * mad)
        v = losses[t]
        size = v - base if math.isfinite(v) else math.inf
        if size > line:
            if current is None or size > current.size:
                current = Spike(step=t, loss=v, baseline=base, size=size)
        elif current is not None:
            spikes.append(current)
            current = None
    if current is not None:
        spikes.append(current)
    return spikes


def _total_norm(params) -> float:
    norms = [p.grad.detach().double().norm() for p in params if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def hot_fire(model, source, steps: int, batch: int, seq: int, seed: int, floor: float | None, unigram: float | None,
             progress: Callable[[int, int, float], None] | None = None) -> Training:
    """Train `model` for `steps` steps on batches from `source`; returns the curves."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    losses: list[float] = []
    gnorms: list[float] = []
    lrs: list[float] = []
    interrupted = False
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.random.fork_rng(devices=[]):  # dropout draws from the seed, not the caller's stream
        torch.manual_seed(30_000 + seed)
        optimizer, scheduler = model.configure_optimizer()
        model.train()
        try:
            for step in range(steps):
                tokens = source.batch(batch, seq, gen)
                idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
                lr = optimizer.param_groups[0]["lr"]
                _, loss = model(idx, targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                value = float(loss.detach())
                gnorm = _total_norm(params)
                losses.append(value)
                gnorms.append(gnorm)
                lrs.append(lr)
                if not math.isfinite(value):
                    break  # flameout: nothing more to learn from this run
                model.clip_gradients()
                optimizer.step()
                scheduler.step()
                if progress is not None:
                    progress(step + 1, steps, value)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            model.eval()
    done = len(losses)
    tail = [v for v in losses[done - max(1, done // 10):] if math.isfinite(v)]
    return Training(steps=steps, done=done, interrupted=interrupted, source=source.name, floor=floor, unigram=unigram,
                    loss=losses, grad_norm=gnorms, lr=lrs, spikes=find_spikes(losses),
                    final_loss=sum(tail) / len(tail) if tail else None)
