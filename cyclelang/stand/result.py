"""What the test stand reports: plain pydantic models, the same data as `cyclec fire --json`.

Torch-free, so a report can be read back (`StandReport.model_validate_json`) by
tools that only draw it, such as `cyclec draw --annotate`.

Units: pressures are RMS values of the residual stream; intensities are ratios of
norms (Frobenius norms over the whole batch); gradient norms are L2 norms of the
gradient of the mean next-token cross-entropy (nats per token). Depth counts
stage instances from 1 (depth 0 is the feed's output).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

REPORT_VERSION = 3  # 2: readings carry their layout path; 3: training's objective, flameout and notes


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")  # a flameout is NaN


class BranchReading(_Model):
    """One prechamber of one stage instance."""

    name: str
    path: str  # the branch's layout path in the fired model: "stages.3.mix"
    merge: str | None  # merge kind; None for overboard
    detach: bool
    overboard: bool
    intensity: float  # ||what the merge adds|| / ||x|| at the branch's input: how hard it burns
    grad_norm: float  # gradient norm over the branch's parameters


class StageReading(_Model):
    depth: int  # 1-based position of the stage instance
    stage: str  # the stage's name in the spec
    path: str  # the instance's layout path in the fired model: "stages.3"
    pressure: float  # RMS of the residual stream leaving the stage
    grad_in: float  # ||dL/dx|| for the residual stream entering the stage: the pressure chain
    grad_out: float  # ||dL/dx|| for the stream leaving it
    params: dict[str, float]  # gradient norm per parameter, named relative to the stage
    branches: list[BranchReading]


class Check(_Model):
    name: Literal["detach", "causal", "kv_cache"]
    status: Literal["pass", "fail", "skip"]
    value: float | None  # the measured quantity (max gradient, max difference)
    detail: str


class Spike(_Model):
    step: int  # the step whose loss peaked
    loss: float
    baseline: float  # median loss over the steps before it
    size: float  # loss - baseline, nats


class Flameout(_Model):
    """Training that diverged: the step it was seen, and the group whose update blew up."""

    step: int  # 0-based step whose loss is the flameout
    loss: float
    reason: str
    group: str | None  # the parameter group (layout path of the instance) with the largest update ratio just before
    update_ratio: float | None  # that group's ||dp|| / ||p|| in the update before the flameout
    first_ratio: float | None  # ... and in the first update, for scale


class Training(_Model):
    steps: int  # steps asked for
    done: int  # steps completed (fewer when interrupted)
    interrupted: bool
    source: str  # "markov(alphabet=32, seed=0)" or "file:NAME"
    objective: str  # "next-token", or "masked-token (...)" behind an open throat
    floor: float | None  # the lowest loss any model can reach on this source and objective (nats/token); None: unknown
    unigram: float | None  # entropy of the source's symbol frequencies: what a model ignoring context reaches
    loss: list[float]
    grad_norm: list[float]  # before clipping
    lr: list[float]
    spikes: list[Spike]
    flameout: Flameout | None = None  # the run stopped: the loss diverged or is not finite
    notes: list[str] = []  # what makes the run less than it looks (a warmup longer than the run)
    final_loss: float | None  # mean of the last 10% of steps


class Settings(_Model):
    width: int
    depth: int  # stage instances
    seq: int
    batch: int
    seed: int
    params: int  # parameters in the fired engine
    data: str  # "random tokens" or "file:NAME"


class Firing(_Model):
    """One engine on the stand."""

    name: str
    file: str
    settings: Settings
    loss: float  # at initialisation
    feed_pressure: float  # RMS of the feed's output (depth 0)
    stages: list[StageReading]
    engine_params: dict[str, float]  # gradient norms of parameters outside stages
    checks: list[Check]
    training: Training | None = None

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]


class StandReport(_Model):
    """Everything one `cyclec fire` measured: one Firing per spec, in command-line order."""

    version: int = REPORT_VERSION
    runs: list[Firing]
    interrupted: bool = False  # Ctrl-C: the runs hold what was measured before it

    @property
    def failed(self) -> list[tuple[str, Check]]:
        return [(r.name, c) for r in self.runs for c in r.failed]


# --- the coordinate check and the LR-transfer sweep (`cyclec fire --coord-check`, `--lr-sweep`) ---


class CoordLayer(_Model):
    """One layer type's coordinate size (mean |activation|) at every width and step."""

    name: str  # "feed", a branch's folded layout path ("stages.0-11.mix"), "<attention path> logits", "logits"
    what: Literal["feed", "branch", "attention logits", "logits"]
    size: list[list[float]]  # [step][width index]
    exponent: list[float]  # per step: the slope of log(size) against log(width), least squares
    flag: Literal["grows"] | None  # at the last step, the exponent is above `CoordCheck.flag_at`


class CoordCheck(_Model):
    """μP's coordinate check of one spec: shrunk to each width, a few steps at a fixed learning
    rate; steps count from 1 (step 1: the forward pass at initialisation)."""

    version: int = REPORT_VERSION
    name: str
    file: str
    param: str  # "standard" or "mup (base width N)"
    widths: list[int]
    steps: int
    lr: float
    seed: int
    batch: int
    seq: int
    flag_at: float  # an exponent above this at the last step is flagged: the coordinate grows with width
    loss: list[list[float]]  # [step][width index]
    layers: list[CoordLayer]


class SweepRun(_Model):
    width: int
    lr: float
    final_loss: float | None  # mean of the last 10% of steps; None: flameout
    flameout_step: int | None


class Sweep(_Model):
    """Train every width over a grid of learning rates, under one parametrisation."""

    param: str  # "standard" or "mup (base width N)"
    runs: list[SweepRun]
    best: dict[int, float | None]  # width -> the learning rate with the lowest final loss


class LrSweep(_Model):
    version: int = REPORT_VERSION
    name: str
    file: str
    widths: list[int]
    lrs: list[float]
    steps: int
    seed: int
    batch: int
    seq: int
    source: str
    sweeps: list[Sweep]  # standard, then mup
