"""A short hot fire: train the engine for a few hundred steps with its own startup block.

`configure_optimizer()` and `learning_rate` come from the generated model, so the
warmup (the open-loop start sequence), schedule, clipping (the restrictor
orifice), betas (the POGO accumulator) and decay are exactly the spec's. Every
random draw (weights, batches, masks, dropout) comes from the seed, so a run repeats
bit for bit on the same machine and thread count. Ctrl-C ends the run between
steps; what was measured so far is returned, marked interrupted.

Readings that cannot flatter:
- the objective is one the engine cannot read off its input: next-token prediction
  behind a causal throat, masked-token prediction behind an open one (a bidirectional
  engine trained on next tokens sees the answer at the next position);
- a flameout (a non-finite loss, or a loss above the initial one by more than
  `DIVERGE_NATS` or `DIVERGE_FRACTION` of it) ends the run at that step, from step 1,
  and names the parameter group whose update ratio ||dp|| / ||p|| blew up;
- spikes are judged against a robust running baseline (median and MAD of the last
  `SPIKE_WINDOW` losses, from the `SPIKE_MIN_HISTORY`-th step on).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from .. import ir
from .result import Flameout, Spike, Training

SPIKE_WINDOW = 20  # steps of history a spike is measured against (fewer at the start)
SPIKE_MIN_HISTORY = 3  # a baseline needs this many finite losses
SPIKE_MIN = 0.1  # nats: smaller jumps are noise at these batch sizes
SPIKE_MADS = 6.0  # ... or this many robust deviations of the window, whichever is larger
DIVERGE_NATS = 1.0  # a loss this far above the initial loss is a flameout ...
DIVERGE_FRACTION = 0.2  # ... or this fraction of the initial loss, whichever is larger
MASK_RATE = 0.15  # masked-token objective: each position is masked with this probability (BERT)


@dataclass(frozen=True)
class Objective:
    """What the engine is trained to predict. `mask` is the token id that replaces masked
    inputs (None: next-token prediction)."""

    mask: int | None = None
    rate: float = MASK_RATE

    @property
    def name(self) -> str:
        if self.mask is None:
            return "next-token"
        return f"masked-token ({self.rate:.0%} of positions replaced by token {self.mask})"

    def inputs(self, tokens: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) from a (B, T + 1) batch; targets -1 are not scored."""
        if self.mask is None:
            return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        x = tokens[:, :-1]
        masked = mask_positions(x.shape, self.rate, gen)
        return torch.where(masked, torch.full_like(x, self.mask), x), torch.where(masked, x, torch.full_like(x, -1))


def mask_positions(shape, rate: float, gen: torch.Generator) -> torch.Tensor:
    """Each position masked with probability `rate`, at least one per sequence."""
    masked = torch.rand(shape, generator=gen) < rate
    first = torch.randint(0, shape[1], (shape[0],), generator=gen)
    masked[torch.arange(shape[0]), first] = True
    return masked


def spike_threshold(hist: list[float]) -> tuple[float, float]:
    """The robust baseline of a loss history and how far above it a spike starts: the median,
    and max(SPIKE_MIN, SPIKE_MADS robust deviations). The training loop's watch asks this too."""
    base = statistics.median(hist)
    mad = statistics.median(abs(v - base) for v in hist)
    return base, max(SPIKE_MIN, SPIKE_MADS * 1.4826 * mad)


def find_spikes(losses: list[float], window: int = SPIKE_WINDOW) -> list[Spike]:
    """Loss spikes (combustion instability): steps whose loss jumps above the median of the
    (up to) `window` finite losses before it by more than max(SPIKE_MIN, SPIKE_MADS x 1.4826 x
    MAD), from the first step with `SPIKE_MIN_HISTORY` losses behind it. The baseline only
    takes losses that were not themselves above the line, so a plateau after a jump is still
    measured against the level before it. Consecutive steps above the line are one spike,
    reported at its peak. A non-finite loss is a spike of infinite size (flameout)."""
    spikes: list[Spike] = []
    current: Spike | None = None
    calm: list[float] = []  # finite losses judged not to be spikes
    for t, v in enumerate(losses):
        hist = calm[-window:]
        if len(hist) >= SPIKE_MIN_HISTORY:
            base, line = spike_threshold(hist)
            size = v - base if math.isfinite(v) else math.inf
            if size > line:
                if current is None or size > current.size:
                    current = Spike(step=t, loss=v, baseline=base, size=size)
                continue
        if current is not None:
            spikes.append(current)
            current = None
        if math.isfinite(v):
            calm.append(v)
    if current is not None:
        spikes.append(current)
    return spikes


def diverged(loss: float, initial: float) -> str | None:
    """Why a loss is a flameout, or None: non-finite, or too far above the initial loss."""
    if math.isnan(loss):
        return "the loss is NaN"
    if math.isinf(loss):
        return "the loss is infinite"
    line = initial + max(DIVERGE_NATS, DIVERGE_FRACTION * abs(initial))
    if loss > line:
        return f"the loss {loss:.4g} is above the initial {initial:.4g} (+{line - initial:.3g} nats allowed)"
    return None


def parameter_groups(model, spec: ir.Spec) -> dict[str, list[torch.nn.Parameter]]:
    """Trainable parameters by the layout's group (a branch's instance path, the feed, the
    head, an engine-level norm), in model order; shared parameters once."""
    lay = ir.layout.layout(spec)
    groups: dict[str, list] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        folded = lay.group_of(name)
        # the instance's own path: stages.3.mix rather than the folded stages.0-11.mix
        key = name if folded is None else _instance_group(name, folded)
        groups.setdefault(key, []).append(p)
    return groups


def _instance_group(name: str, folded: str) -> str:
    if not name.startswith("stages."):
        return folded
    head = ".".join(name.split(".")[:2])  # stages.3
    rest = folded.split(".", 2)[2:] if folded.startswith("stages.") else []
    return ".".join([head, *rest])


def _norm(ps) -> float:
    return float(torch.stack([p.detach().double().norm() for p in ps]).norm())


def _total_norm(params) -> float:
    norms = [p.grad.detach().double().norm() for p in params if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def hot_fire(model, spec: ir.Spec, source, steps: int, batch: int, seq: int, seed: int, floor: float | None, unigram: float | None,
             objective: Objective = Objective(), notes: list[str] | None = None,
             progress: Callable[[int, int, float], None] | None = None) -> Training:
    """Train `model` for `steps` steps on batches from `source`; returns the curves."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    mask_gen = torch.Generator().manual_seed(40_000 + seed)
    losses: list[float] = []
    gnorms: list[float] = []
    lrs: list[float] = []
    ratios: dict[str, list[float]] = {}
    interrupted = False
    flameout: Flameout | None = None
    params = [p for p in model.parameters() if p.requires_grad]
    groups = parameter_groups(model, spec)
    with torch.random.fork_rng(devices=[]):  # dropout draws from the seed, not the caller's stream
        torch.manual_seed(30_000 + seed)
        optimizer, scheduler = model.configure_optimizer()
        model.train()
        try:
            for step in range(steps):
                tokens = source.batch(batch, seq, gen)
                idx, targets = objective.inputs(tokens, mask_gen)
                g0 = optimizer.param_groups[0]
                lr = g0["lr"] / g0.get("lr_mult", 1.0)  # the spec's lr (μP's groups carry a multiplier)
                _, loss = model(idx, targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                value = float(loss.detach())
                gnorm = _total_norm(params)
                losses.append(value)
                gnorms.append(gnorm)
                lrs.append(lr)
                why = diverged(value, losses[0])
                if why is not None:
                    flameout = _flameout(step, value, why, ratios)
                    break  # the engine is shut down: nothing more to learn from this run
                before = {k: [p.detach().clone() for p in ps] for k, ps in groups.items()}
                model.clip_gradients()
                optimizer.step()
                scheduler.step()
                for k, ps in groups.items():
                    old = before[k]
                    delta = _norm([p - o for p, o in zip(ps, old)])
                    ratios.setdefault(k, []).append(delta / max(_norm(old), 1e-30))
                if progress is not None:
                    progress(step + 1, steps, value)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            model.eval()
    done = len(losses)
    tail = [v for v in losses[done - max(1, done // 10):] if math.isfinite(v)]
    return Training(steps=steps, done=done, interrupted=interrupted, source=source.name, objective=objective.name, floor=floor,
                    unigram=unigram, loss=losses, grad_norm=gnorms, lr=lrs, spikes=find_spikes(losses), flameout=flameout,
                    notes=list(notes or []), final_loss=sum(tail) / len(tail) if tail else None)


def _flameout(step: int, loss: float, why: str, ratios: dict[str, list[float]]) -> Flameout:
    """The flameout at `step`, blamed on the group with the largest update ratio in the update
    just before it (a non-finite ratio first; at step 0 no update was made yet)."""
    if not ratios or step == 0:
        return Flameout(step=step, loss=loss, reason=why, group=None, update_ratio=None, first_ratio=None)
    worst = max(ratios, key=lambda k: ratios[k][-1] if math.isfinite(ratios[k][-1]) else math.inf)
    return Flameout(step=step, loss=loss, reason=why, group=worst, update_ratio=ratios[worst][-1], first_ratio=ratios[worst][0])
