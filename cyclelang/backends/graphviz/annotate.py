"""Measurements on the diagram: `cyclec draw SPEC --annotate fire.json`.

Reads a test-stand report (`cyclec fire --json`; torch-free pydantic models) and
restyles the cycle view's edges from the measured pressure chain:

- main-line edges entering a stage: ||dL/dx|| of the residual stream entering it
  (the stage's instances averaged geometrically when the diagram folds them); an
  edge from a stage to an engine-level op (the final valve, the nozzle) carries the
  gradient leaving the stage's last instance;
- branch edges: the gradient norm over that prechamber's parameters.

Width and colour run from thin and cool (weakest measured) to thick and hot
(strongest) on a log scale, separately for the main line and the branches, and
every restyled edge gets a tooltip with the number. Stages are matched by name,
so a report fired at another --depth still applies.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ... import ir
from ...diagnostics import CycleError, Diagnostic

_NODE = re.compile(r"^b(\d+)(?:\.r(\d+))?(?:\.o(\d+)(?:\.f(\d+))?)?(?:\.|$)")
COOL, HOT = (0x3B, 0x6F, 0xB6), (0xD7, 0x30, 0x1F)
MAIN_WIDTH, BRANCH_WIDTH = (2.0, 12.0), (1.0, 6.0)


def load_run(source, engine_name: str):
    """The run for `engine_name` from a report path, JSON text, StandReport or Firing."""
    from ...stand.result import Firing, StandReport

    if isinstance(source, Firing):
        return source
    if isinstance(source, StandReport):
        report = source
    else:
        try:
            text = Path(source).read_text("utf-8")
        except OSError as e:
            raise CycleError([Diagnostic("E0105", "error", f"cannot read --annotate {source}: {e.strerror or e}", None)]) from None
        try:
            report = StandReport.model_validate_json(text)
        except ValueError:
            raise CycleError([Diagnostic("E0205", "error", f"{source} is not a test-stand report", None,
                                         "write one with: cyclec fire SPEC --json fire.json")]) from None
    runs = [r for r in report.runs if r.name == engine_name]
    if not runs:
        names = ", ".join(r.name for r in report.runs) or "none"
        raise CycleError([Diagnostic("E0205", "error", f"the report holds no run of engine '{engine_name}' (it has: {names})", None,
                                     "fire this spec: cyclec fire SPEC --json fire.json")])
    return runs[0]


def _gmean(values: list[float]) -> float | None:
    pos = [v for v in values if v > 0]
    if not pos:
        return 0.0 if values else None
    return math.exp(sum(math.log(v) for v in pos) / len(pos))


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


def apply(engine: ir.Engine, edges: list, run, theme: dict[str, str]) -> None:
    """Restyle `edges` ((tail, head, attrs) with mutable attrs) in place from `run`."""
    by_stage: dict[str, list] = {}
    for s in run.stages:
        by_stage.setdefault(s.stage, []).append(s)

    def readings(i: int, rep):
        st = engine.body[i]
        got = by_stage.get(st.name, []) if isinstance(st, ir.Stage) else []
        return got if rep is None else got[int(rep) : int(rep) + 1]

    def is_stage(m) -> bool:
        return m is not None and isinstance(engine.body[int(m.group(1))], ir.Stage)

    main_vals, main_attrs, br_vals, br_attrs = {}, {}, {}, {}
    for a, b, attrs in edges:
        if attrs.get("color") == theme["chamber"]:
            mb, ma = _NODE.match(b), _NODE.match(a)
            if is_stage(mb):  # the stream entering (or running through) a stage
                key = (mb.group(1), mb.group(2))
                value = _gmean([r.grad_in for r in readings(int(mb.group(1)), mb.group(2))])
            elif is_stage(ma):  # leaving a stage for the main line's own valve or the nozzle
                rs = readings(int(ma.group(1)), ma.group(2))
                key, value = ("out", ma.group(1), ma.group(2)), (rs[-1].grad_out if rs else None)
            else:
                continue
            if value is None:
                continue
            main_vals[key] = value
            main_attrs.setdefault(key, []).append(attrs)
            continue
        m = _NODE.match(b) or _NODE.match(a)
        if not m or m.group(3) is None:
            continue
        st = engine.body[int(m.group(1))]
        if not isinstance(st, ir.Stage):
            continue
        op = st.ops[int(m.group(3))]
        if isinstance(op, ir.Fullflow):
            if m.group(4) is None:
                continue  # the shared valve's feed edge
            op = op.branches[int(m.group(4))]
        if not isinstance(op, ir.Prechamber):
            continue
        rs = readings(int(m.group(1)), m.group(2))
        value = _gmean([br.grad_norm for r in rs for br in r.branches if br.name == op.name])
        if value is None:
            continue
        key = (m.group(1), m.group(2), m.group(3), m.group(4))
        br_vals[key] = value
        br_attrs.setdefault(key, []).append(attrs)
    _scale(main_vals, main_attrs, MAIN_WIDTH, "||dL/dx|| =")
    _scale(br_vals, br_attrs, BRANCH_WIDTH, "branch gradient norm =")
