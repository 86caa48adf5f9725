"""A firing's measurements keyed by the drawn spec's layout paths, for `cyclec draw --annotate`.

Torch-free. The diagram asks for readings by path and never sees a stand report:

    {"chain":    {stage path: ||dL/dx|| of the stream entering it},
     "exit":     {stage path: ||dL/dx|| of the stream leaving it},
     "branches": {branch path: gradient norm over the branch's parameters}}

Every stage and branch has two keys: its folded path (`stages.0-11`, its instances'
readings averaged geometrically) and each instance's (`stages.3`, that instance's).
Stages are matched by path only: a report fired at another --depth is refused before
this is asked (E0276), and matching by name gave every stage of one name (jamba's three
`routed` stages) the same readings.
"""

from __future__ import annotations

import math

from .. import ir
from .result import Firing


def _gmean(values: list[float]) -> float | None:
    pos = [v for v in values if v > 0]
    if not pos:
        return 0.0 if values else None
    return math.exp(sum(math.log(v) for v in pos) / len(pos))


def pressure_readings(spec: ir.Spec, firing: Firing) -> dict[str, dict[str, float]]:
    by_path = {s.path: s for s in firing.stages}
    out: dict[str, dict[str, float]] = {"chain": {}, "exit": {}, "branches": {}}

    def put(table: str, path: str, values: list[float]) -> None:
        v = _gmean(values)
        if v is not None:
            out[table][path] = v

    for sl in ir.layout.layout(spec).stages:
        got = [by_path.get(path) for path in sl.instances()]
        if not all(r is not None and r.stage == sl.stage.name for r in got):  # not this spec's firing: no reading
            continue
        groups = [(sl.path, got)] + [(sl.instance(r), got[r : r + 1]) for r in range(sl.count)]
        for path, rs in groups:
            put("chain", path, [r.grad_in for r in rs])
            if rs:
                out["exit"][path] = rs[-1].grad_out
            for b in sl.branches():
                put("branches", f"{path}.{b.attr}", [br.grad_norm for r in rs for br in r.branches if br.name == b.branch.name])
    return out
