"""The test stand: fire an engine and measure flow, the pressure chain and stability.

    fire(specs, width=, depth=, ...) -> StandReport     (run.py; imports torch)
    shrink(spec, width=, depth=) -> Spec                (shrink.py; a pure IR transformation)
    table(report) -> str, plot(report, path)            (report.py)

The result models (result.py) are torch-free, so `cyclec draw --annotate` can
read a report without torch.
"""

from __future__ import annotations

from .result import BranchReading, Check, Firing, Flameout, Settings, Spike, StageReading, StandReport, Training
from .shrink import shrink

__all__ = ["fire", "shrink", "StandReport", "Firing", "StageReading", "BranchReading", "Check", "Training", "Flameout", "Spike", "Settings"]


def fire(specs, **kwargs) -> StandReport:
    """Fire SPECS on the stand; see `cyclelang.stand.run.fire` (imports torch)."""
    from .run import fire as _fire

    return _fire(specs, **kwargs)
