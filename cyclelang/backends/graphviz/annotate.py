"""Measurements on the diagram: `cyclec draw SPEC --annotate fire.json`.

The diagram never reads a stand report: it is handed readings keyed by layout path
(`cyclelang.stand.readings.pressure_readings` makes them from a report):

    {"chain":    {stage path: ||dL/dx|| of the residual stream entering it},
     "exit":     {stage path: ||dL/dx|| of the stream leaving it},
     "branches": {branch path: the gradient norm over that prechamber's parameters}}

and restyles the cycle view's edges by the path each one carries in its class
(`chain stages.0-11`, `exit stages.0-11`, `branch stages.0-11.mix`): a main-line edge
inside a stage shows the gradient entering it; an edge from a stage's end to an
engine-level op (the final valve, the nozzle) shows the gradient leaving it; a branch's
edges show its parameters' gradient norm. Width and colour run from thin and cool
(weakest measured) to thick and hot (strongest) on a log scale, separately for the
main line and the branches, and every restyled edge gets a tooltip with the number.
"""

from __future__ import annotations

import math
from typing import Mapping

COOL, HOT = (0x3B, 0x6F, 0xB6), (0xD7, 0x30, 0x1F)
MAIN_WIDTH, BRANCH_WIDTH = (2.0, 12.0), (1.0, 6.0)
READINGS = ("chain", "exit", "branches")
# The class's first word says which table of readings the edge's path is looked up in.
_TABLE = {"chain": "chain", "exit": "exit", "branch": "branches"}


def _color(x: float) -> str:
    return "#" + "".join(f"{round(c + (h - c) * x):02x}" for c, h in zip(COOL, HOT))


def _scale(values: dict, attrs_of: dict, widths: tuple[float, float], what: str) -> None:
    pos = [v for v in values.values() if v > 0]
    lo, hi = (math.log(min(pos)), math.log(max(pos))) if pos else (0.0, 0.0)
    for key, v in values.items():
        x = 0.0 if v <= 0 else (0.5 if hi == lo else (math.log(v) - lo) / (hi - lo))
        for attrs in attrs_of[key]:
            attrs["penwidth"] = f"{widths[0] + (widths[1] - widths[0]) * x:.2f}"
            attrs["color"] = _color(x)
            attrs["tooltip"] = f"{what} {v:.3g}"


def apply(edges: list, readings: Mapping[str, Mapping[str, float]]) -> None:
    """Restyle `edges` ((tail, head, attrs) with mutable attrs) in place from `readings`."""
    unknown = set(readings) - set(READINGS)
    if unknown:
        raise ValueError(f"readings hold {', '.join(sorted(unknown))}; expected {', '.join(READINGS)}")
    main_vals, main_attrs, br_vals, br_attrs = {}, {}, {}, {}
    for _, _, attrs in edges:
        role, _, path = attrs.get("class", "").partition(" ")
        table = _TABLE.get(role)
        value = readings.get(table, {}).get(path) if table else None
        if value is None:
            continue
        vals, into = (br_vals, br_attrs) if table == "branches" else (main_vals, main_attrs)
        vals[(table, path)] = value
        into.setdefault((table, path), []).append(attrs)
    _scale(main_vals, main_attrs, MAIN_WIDTH, "||dL/dx|| =")
    _scale(br_vals, br_attrs, BRANCH_WIDTH, "branch gradient norm =")
