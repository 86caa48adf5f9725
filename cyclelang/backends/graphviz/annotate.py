"""Measurements on the diagram: `cyclec draw SPEC --annotate fire.json`.

The diagram never reads a stand report: it is handed readings keyed by layout path
(`cyclelang.stand.readings.pressure_readings` makes them from a report):

    {"chain":    {stage path: ||dL/dx|| of the residual stream entering it},
     "exit":     {stage path: ||dL/dx|| of the stream leaving it},
     "branches": {branch path: the gradient norm over that prechamber's parameters}}

The scale is absolute: whole decades that hold every value of every engine in the
figure (a compare figure shares one), drawn as a colour bar with its numbers, so a 10%
spread reads as 10% and two figures on the same decades compare. Colour alone carries
the reading (a wire's width stays the chamber's width); an exact zero (a detached read)
is drawn grey and dashed and printed as 0. Each wire carries at most one reading, and
the numbers are printed where they are measured (see figure.Figure.values).
"""

from __future__ import annotations

import math

# a perceptually ordered ramp (viridis-like, dark blue to yellow): light on a white page at the top
RAMP = ((0x44, 0x01, 0x54), (0x3B, 0x52, 0x8B), (0x21, 0x90, 0x8C), (0x5D, 0xC8, 0x63), (0xE0, 0xC0, 0x20))
ZERO = "#b0b8c0"  # exactly zero: no gradient at all
READINGS = ("chain", "exit", "branches")


def colour(x: float) -> str:
    """The ramp's colour at x in [0, 1]."""
    x = min(1.0, max(0.0, x)) * (len(RAMP) - 1)
    i = min(int(x), len(RAMP) - 2)
    f = x - i
    return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(RAMP[i], RAMP[i + 1]))


def log_pos(v: float, scale: tuple[float, float]) -> float:
    """Where v sits on the absolute log scale, 0 at its low end and 1 at its high end."""
    lo, hi = scale
    if v <= 0:
        return 0.0
    return min(1.0, max(0.0, (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))))


def check(readings) -> None:
    unknown = set(readings) - set(READINGS)
    if unknown:
        raise ValueError(f"readings hold {', '.join(sorted(unknown))}; expected {', '.join(READINGS)}")
