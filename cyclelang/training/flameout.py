"""Flameout and spike checks on every training step.

`Watch.step(step, loss, grad_norm)` returns None, a `Spike` (combustion instability: the
loss jumps above the median of the last `window` steps by more than the stand's threshold,
`stand.train.spike_threshold`, the rule of `find_spikes` applied online) or raises `Flameout` (a non-finite
loss or gradient norm: the engine is out, nothing more can be learnt from the run).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from ..stand.train import SPIKE_WINDOW, spike_threshold


class Flameout(Exception):
    def __init__(self, step: int, what: str, value: float):
        super().__init__(f"flameout at step {step}: the {what} is {value}")
        self.step, self.what, self.value = step, what, value


@dataclass(frozen=True)
class Spike:
    step: int
    loss: float
    baseline: float
    size: float


class Watch:
    def __init__(self, window: int = SPIKE_WINDOW):
        self.window = window
        self.history: deque[float] = deque(maxlen=window)

    def step(self, step: int, loss: float, grad_norm: float | None) -> Spike | None:
        if not math.isfinite(loss):
            raise Flameout(step, "loss", loss)
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise Flameout(step, "gradient norm", grad_norm)
        spike = None
        if len(self.history) == self.window:
            base, line = spike_threshold(list(self.history))
            if loss - base > line:
                spike = Spike(step, loss, base, loss - base)
        self.history.append(loss)
        return spike

    def state(self) -> list[float]:
        return list(self.history)

    def load(self, history: list[float]) -> None:
        self.history.extend(history)
