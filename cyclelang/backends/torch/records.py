"""The plan's records: what `plan.make_plan` decides about the generated file, read by the
emitters, the stage and model writers and the merges (`plan.py` is the planner that fills them;
each kind's variant lives beside its emitter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from ... import ir
from ...ir.layout import Layout, Part, StageLayout
from .config import Expr, Sizes

if TYPE_CHECKING:
    from .plan import Variant

INPUTS = ("rope", "ple", "shared", "cache", "mask")  # what an op's call may take besides x, in this order (mask last: it defaults to None)


def signature(params) -> str:
    """A forward's parameters: the padding mask defaults to None (a call without one is unpadded)."""
    return ", ".join("mask=None" if p == "mask" else p for p in params)



# --- the plan's records -------------------------------------------------------------------------


@dataclass
class OpPlan:
    op: object  # ir.Norm or a turbine
    attr: str  # its attribute on the module that holds it (the layout path's last segment)
    path: str  # the layout path ("stages.0-11.mix.attn")
    variant: Variant | None = None  # None: a torch module (norms, linears)
    cls: str = ""  # the generated class of its variant
    rope: int | None = None  # index into the model's rotary tables
    scale: float | None = None  # μP: the attention scores' scale (ir.mup.attention_scale)
    args: dict = field(default_factory=dict)  # constructor arguments over the config (`OpEmitter.sizes`)

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.variant.inputs if self.variant is not None else ()

    @property
    def aux(self) -> bool:
        """Its forward returns (y, an auxiliary loss): an MoE's balance loss."""
        return getattr(self.variant, "aux", False)


@dataclass
class BranchPlan:
    br: ir.Prechamber
    attr: str
    cls: str
    ops: list[OpPlan]
    path: str  # "stages.0-11.mix"
    merge: Part | None  # the merge's layout part (its own path when it owns parameters)
    fullflow: bool = False
    margs: dict = field(default_factory=dict)  # the merge's config values (`merges.merge_sizes`)

    @property
    def params(self) -> list[str]:
        """The branch forward's parameters: x, then what its ops take."""
        used = {i for o in self.ops for i in o.inputs}
        return ["x"] + [i for i in INPUTS if i in used]

    @property
    def aux(self) -> bool:
        """Its ops return auxiliary losses: its forward returns (x, {op: loss})."""
        return any(o.aux for o in self.ops)


@dataclass
class FullflowPlan:
    ff: ir.Fullflow
    norm: OpPlan | None
    branches: list[BranchPlan]


@dataclass
class StagePlan:
    stage: ir.Stage
    cls: str
    first: int  # index of the first instance in model.stages (nested: in its group's `stages`)
    items: list  # OpPlan | BranchPlan | FullflowPlan, in source order; a group's: its stages' StagePlans
    path: str  # "stages.0-11"; nested: "stages.0-3.stages.0-2"
    n: object = None  # config.Ref of its repeat count (None: one instance)
    start: object = "0"  # its first instance's index, over the config's counts (str() it once the fields are named)
    branch_plans: list[BranchPlan] = field(default_factory=list)  # every branch in source order, fullflows' included
    parent: "StagePlan | None" = None  # the group it is nested in
    layout: StageLayout | None = None
    key: str = ""  # its name in config field names (`lower_n_head`): the stage's, qualified where two share one

    def branches(self) -> list[BranchPlan]:
        return self.branch_plans

    @property
    def children(self) -> list["StagePlan"]:
        """A group's stages; [] for a stage of ops."""
        return [it for it in self.items if isinstance(it, StagePlan)]

    @property
    def siblings(self) -> int:
        """How many stages share its container (the model's `stages`, or its group's)."""
        return len(self.parent.children) if self.parent is not None else -1

    def chain(self) -> list["StagePlan"]:
        """Its groups from the outermost, then itself."""
        return ([] if self.parent is None else self.parent.chain()) + [self]

    @property
    def aux(self) -> bool:
        """It returns (x, {name: auxiliary loss or output}): an MoE's balance loss, an overboard
        branch's output (a group: where one of its stages does)."""
        if self.children:
            return any(c.aux for c in self.children)
        return any(o.aux for o in self.ops()) or any(b.br.overboard for b in self.branch_plans)

    def ops(self) -> Iterator[OpPlan]:
        """Every op of the stage: stage-level ones and fullflow valves in source order, then the branches'."""
        for it in self.items:
            if isinstance(it, OpPlan):
                yield it
            elif isinstance(it, FullflowPlan) and it.norm is not None:
                yield it.norm
        for b in self.branch_plans:
            yield from b.ops


@dataclass
class Plan:
    engine: ir.Engine
    layout: Layout
    file: str  # the spec's base name, for comments
    stages: list[StagePlan] = field(default_factory=list)  # every stage of ops, nested ones included, in source order
    main: list = field(default_factory=list)  # StagePlan | OpPlan in body order
    groups: list[StagePlan] = field(default_factory=list)  # every stage of stages, outermost first
    ropes: list[tuple] = field(default_factory=list)  # (dims, base, scaling) per rotary table
    turbine_classes: dict[Variant, str] = field(default_factory=dict)  # variant -> class name, in order of first use
    sizes: Sizes | None = None  # the Config's fields and what reads them
    head_width: object = None  # config.Ref of the nozzle's input width
    fast: bool = False  # the fused loss and the custom ops (the runtime section at the end)
    rope_args: list = field(default_factory=list)  # (dims, base) config expressions per rotary table
    feed_args: dict = field(default_factory=dict)  # the feed's config values: scale, dropout
    logit_scale: object = None  # config.Ref of the nozzle's logit scale (None: 1)
    schedule: dict = field(default_factory=dict)  # the startup block's Config fields (`schedule_sizes`)

    @property
    def causal(self) -> bool:
        return self.engine.throat == "causal"

    def all_stages(self) -> list[StagePlan]:
        """Every stage plan, groups included, each group before the stages nested in it."""
        out: list[StagePlan] = []

        def walk(sp: StagePlan) -> None:
            out.append(sp)
            for c in sp.children:
                walk(c)

        for sp in self.top:
            walk(sp)
        return out

    @property
    def top(self) -> list[StagePlan]:
        """The stages on the main line: the entries of model.stages, group by group."""
        return [it for it in self.main if isinstance(it, StagePlan)]

    @property
    def turbine_order(self) -> list[Variant]:
        return list(self.turbine_classes)

    def ops(self) -> Iterator[OpPlan]:
        """Every op of the engine: in the stages, then on the main line."""
        for sp in self.stages:
            yield from sp.ops()
        yield from (it for it in self.main if isinstance(it, OpPlan))

    def turbine_class(self, v: Variant) -> str:
        if getattr(v, "expert", None) is not None:  # an MoE's variant
            self.turbine_class(v.expert)  # the experts' class comes first
        if v not in self.turbine_classes:
            n = sum(1 for k in self.turbine_classes if type(k) is type(v))
            self.turbine_classes[v] = v.base if n == 0 else f"{v.base}{n + 1}"
        return self.turbine_classes[v]

    def rope_index(self, op, args: dict) -> int | None:
        k = ir.kinds.kind_of(op).rotary(op)  # the kinds record's key: the size limit counts the same tables
        if k is None:
            return None
        if k not in self.ropes:
            self.ropes.append(k)
            self.rope_args.append((args.get("rotary_dims", repr(op.rotary_dims)), args.get("rotary_base", repr(op.rotary_base))))  # a kind without config sizes keeps literals
            if getattr(op, "rotary_spread", False):  # Gemma 4's proportional rope: base^(dims/head_dim) over the rotated dims
                dims, base = self.rope_args[-1]
                hd = args.get("head_dim", repr(op.head_dim))
                self.rope_args[-1] = (dims, Expr(lambda: f"{base} ** ({dims} / {hd})"))
        return self.ropes.index(k)
