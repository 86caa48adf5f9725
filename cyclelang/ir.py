"""The intermediate representation: the contract between the front end and every back-end.

By the time a back-end sees these models, everything is resolved: `let` constants
are numbers, templates are expanded, includes are read, and every default is
explicit (an attention's mask follows the engine's throat, a cooling merge knows
its std, a deepnorm merge knows its alpha and beta). Back-ends never guess.

All models are frozen and reject unknown fields. Node variants are discriminated
unions on `op` (main-line and branch operations) or `kind` (merges). Every node
carries its source span, which is left out of the JSON dump so that dumps are
stable across file locations.

Repeated stages stay folded (`Stage.repeat`): the diagram draws one block with a
xN badge and the PyTorch back-end builds one class with N instances.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

IR_VERSION = 1


class Span(BaseModel):
    """Where a node came from: 1-based line and column, end exclusive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    span: SkipJsonSchema[Span | None] = Field(default=None, exclude=True, repr=False)


# --- valves ------------------------------------------------------------------

NormType = Literal["layernorm", "rmsnorm"]


class Norm(Node):
    """A normalisation: a valve. On a branch it is an injector pressure drop (Pre-LN);
    at stage or engine level it sits in series on the main line (Post-LN, final norm)."""

    op: Literal["norm"] = "norm"
    type: NormType
    width: int
    eps: float
    bias: bool  # layernorm only; rmsnorm never has one


# --- turbines: the work done on a split-off flow -------------------------------

Activation = Literal["gelu", "gelu_tanh", "relu", "silu", "swiglu", "geglu"]
Mask = Literal["causal", "open"]


class Attention(Node):
    """The injector: the only operator that mixes positions."""

    op: Literal["attention"] = "attention"
    width: int
    heads: int
    kv_heads: int  # == heads: multi-head; 1: MQA; in between: GQA (injector baffles)
    head_dim: int
    mask: Mask  # follows the engine's throat unless the spec says otherwise
    window: int | None  # sliding-window size in tokens, None for full attention
    rotary_dims: int  # how many dims of each head are rotated (even); 0: no rotary
    rotary_base: float
    qk_norm: bool
    bias: bool
    dropout: float


class Mlp(Node):
    """Combustion: a position-wise reaction, no mixing between positions."""

    op: Literal["mlp"] = "mlp"
    width: int
    hidden: int
    act: Activation
    bias: bool
    dropout: float


class Moe(Node):
    """Hard-routed experts: liquid-liquid injection. `capacity` is the restrictor
    orifice (tokens per expert relative to an even share), `balance` the mixture trim
    (weight of the load-balancing auxiliary loss)."""

    op: Literal["moe"] = "moe"
    width: int
    hidden: int
    experts: int
    top: int
    capacity: float | None  # None: no token dropping
    balance: float  # 0.0: no balancing loss
    act: Activation
    bias: bool


class Pool(Node):
    """MetaFormer's pooling mixer: average over a window of positions, minus the input."""

    op: Literal["pool"] = "pool"
    width: int
    size: int
    causal: bool  # only past positions are pooled


class Linear(Node):
    """A single projection; a narrow one is a throat that caps the flow."""

    op: Literal["linear"] = "linear"
    width: int
    out: int
    bias: bool


Turbine = Annotated[Union[Attention, Mlp, Moe, Pool, Linear], Field(discriminator="op")]
TURBINE_TYPES = (Attention, Mlp, Moe, Pool, Linear)

BranchOp = Annotated[Union[Norm, Attention, Mlp, Moe, Pool, Linear], Field(discriminator="op")]


# --- merges: how a branch's exhaust returns to the chamber ---------------------


class PlainMerge(Node):
    kind: Literal["plain"] = "plain"


class ScaleMerge(Node):
    kind: Literal["scale"] = "scale"
    value: float


class CoolingMerge(Node):
    """Output projections start at std / sqrt(merges): a rich, cool preburner."""

    kind: Literal["cooling"] = "cooling"
    std: float  # the resulting init std of the branch's output projection
    base: float  # the std before cooling
    merges: int  # merges into the main line across the engine (GPT-2: 2 x layers)


class RezeroMerge(Node):
    kind: Literal["rezero"] = "rezero"
    init: float


class LayerscaleMerge(Node):
    kind: Literal["layerscale"] = "layerscale"
    init: float


class DeepnormMerge(Node):
    """DeepNet: x_next = LN(alpha * x + f(x)), with f's projections initialised with gain beta."""

    kind: Literal["deepnorm"] = "deepnorm"
    alpha: float
    beta: float
    layers: int  # the N the formulas were computed from


class GateMerge(Node):
    """Highway merge: x + g * (f(x) - x) with g = sigmoid(W x + b), b starts negative."""

    kind: Literal["gate"] = "gate"
    bias: float


Merge = Annotated[
    Union[PlainMerge, ScaleMerge, CoolingMerge, RezeroMerge, LayerscaleMerge, DeepnormMerge, GateMerge],
    Field(discriminator="kind"),
]


# --- branches and stages -------------------------------------------------------


class Prechamber(Node):
    """A residual branch: split off the chamber, do work, return the exhaust."""

    op: Literal["prechamber"] = "prechamber"
    name: str
    width: int  # chamber width where the branch splits off
    out_width: int  # width of the branch's exhaust
    detach: bool  # open cycle: the branch's input carries no gradient back
    overboard: bool  # the exhaust never returns to the chamber
    loss: float | None  # overboard with a loss: an auxiliary head, weighted
    ops: list[BranchOp]
    merge: Merge | None  # None exactly when overboard


class Fullflow(Node):
    """Full-flow staged combustion: parallel branches fed from the same state."""

    op: Literal["fullflow"] = "fullflow"
    name: str
    width: int
    norm: Norm | None  # one shared valve in front of every branch
    branches: list[Prechamber]


StageOp = Annotated[
    Union[Prechamber, Fullflow, Norm, Attention, Mlp, Moe, Pool, Linear], Field(discriminator="op")
]


class Stage(Node):
    op: Literal["stage"] = "stage"
    name: str
    template: str | None  # the template it was expanded from, if any
    repeat: int
    width_in: int
    width_out: int
    ops: list[StageOp]


MainOp = Annotated[
    Union[Stage, Norm, Attention, Mlp, Moe, Pool, Linear], Field(discriminator="op")
]


# --- feed, nozzle, startup ----------------------------------------------------

Position = Literal["learned", "sinusoidal", "none"]


class Feed(Node):
    """Tanks and pumps: token embedding plus positions."""

    type: Literal["tokens"] = "tokens"
    vocab: int
    context: int
    position: Position
    width: int
    scale: float  # embeddings are multiplied by this (the original Transformer: sqrt(width))
    dropout: float


class Nozzle(Node):
    type: Literal["head"] = "head"
    width: int
    vocab: int
    tied: bool  # shares the feed's embedding matrix
    bias: bool


class Schedule(Node):
    kind: Literal["constant", "cosine", "linear"]
    lr: float
    min_lr: float
    steps: int | None  # None: constant after warmup, whatever the kind


class Init(Node):
    """Chill-down: how weights start before the first step."""

    kind: Literal["normal", "xavier"]
    std: float  # normal only; xavier derives its own


class Startup(Node):
    """The start sequence: warmup is the open-loop valve timetable, betas the POGO
    accumulator, clip the restrictor orifice."""

    warmup: int
    schedule: Schedule
    clip: float | None
    betas: tuple[float, float]
    decay: float
    init: Init


class Engine(Node):
    name: str
    width: int
    throat: Mask
    feed: Feed
    body: list[MainOp]
    nozzle: Nozzle
    startup: Startup


class Spec(Node):
    """A resolved spec. A file of templates only (meant to be included) has no engine."""

    version: int = IR_VERSION
    engine: Engine | None


# --- helpers shared by back-ends ----------------------------------------------


def is_turbine(op: object) -> bool:
    return isinstance(op, TURBINE_TYPES)


def stage_branches(stage: Stage) -> list[Prechamber]:
    """Every prechamber of a stage in source order, fullflow branches included."""
    out: list[Prechamber] = []
    for op in stage.ops:
        if isinstance(op, Prechamber):
            out.append(op)
        elif isinstance(op, Fullflow):
            out.extend(op.branches)
    return out


def map_branches(body: list, fn) -> list:
    """A copy of a main line in which every prechamber (fullflow branches included)
    is replaced by `fn(prechamber)`; everything else is kept as it is."""
    out = []
    for op in body:
        if isinstance(op, Stage):
            ops = []
            for s in op.ops:
                if isinstance(s, Prechamber):
                    s = fn(s)
                elif isinstance(s, Fullflow):
                    s = s.model_copy(update=dict(branches=[fn(b) for b in s.branches]))
                ops.append(s)
            op = op.model_copy(update=dict(ops=ops))
        out.append(op)
    return out


def json_schema() -> dict:
    return Spec.model_json_schema()
