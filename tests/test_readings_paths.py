"""Stand readings are matched to the drawn spec by layout path, never by stage name (issue 36):
jamba's three `routed` stages (two in each pair, one on its own) get three readings."""

from __future__ import annotations

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.stand.readings import pressure_readings
from cyclelang.stand.result import BranchReading, Firing, StageReading

from .conftest import ROOT


def test_jambas_three_routed_stages_get_three_readings():
    spec = cyclelang.load(ROOT / "specs" / "jamba.cycle")
    stages = ir.layout.layout(spec).stages
    value = {sl.path: float(k + 1) for k, sl in enumerate(stages)}  # each folded stage its own reading
    readings = []
    for sl in stages:
        for path in sl.instances():
            branches = [BranchReading.model_construct(name=b.branch.name, grad_norm=10 * value[sl.path]) for b in sl.branches()]
            readings.append(StageReading.model_construct(stage=sl.stage.name, path=path, grad_in=value[sl.path],
                                                         grad_out=value[sl.path], branches=branches))
    firing = Firing.model_construct(stages=readings)
    got = pressure_readings(spec, firing)
    routed = [sl.path for sl in stages if sl.stage.name == "routed"]
    assert len(routed) == 3
    assert [got["chain"][p] for p in routed] == pytest.approx([value[p] for p in routed])  # three, each its own
    assert len({got["chain"][p] for p in routed}) == 3
    assert [got["branches"][f"{p}.burn"] for p in routed] == pytest.approx([10 * value[p] for p in routed])
    # a reading under another stage's name at a path is not this spec's: no reading
    readings[0] = readings[0].model_copy(update={"stage": "other"})
    assert stages[0].path not in pressure_readings(spec, Firing.model_construct(stages=readings))["chain"]
