"""The plan: every decision about the generated file made before a line is written.

Attribute names (and so parameter names) come from `ir.layout`, the one naming
authority: a part's attribute is the last segment of its layout path. What the plan
decides itself is what only the generated file has: class names (`Block`,
`BlockMix`, `Attention2`), which ops share a class (a *variant*: what decides the
text of a turbine's class, its sizes being constructor arguments), and the rotary
tables the model keeps.
"""

from __future__ import annotations

import builtins
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import ClassVar, Iterator, Union

from ... import ir
from ...ir.layout import BranchLayout, Layout, Names, Part, StageLayout, layout
from .config import WIDTH, Expr, Sizes
from .runtime import names as runtime_names
from .writer import camel, where

# Module-level names of the generated file that no class may shadow.
GLOBALS = frozenset({
    "math", "dataclass", "torch", "nn", "F", "Config", "Feed", "Model", "Cache", "Startup",
    "learning_rate", "causal_mask", "sliding_mask", "rotary_tables", "apply_rotary", "alibi_slopes",
    "apply_rotary_partial", "sinusoids", "OVERBOARD", "OVERBOARD_LOSS", "Optional", "next_token_loss", "lookup",
}) | frozenset(dir(builtins)) | runtime_names()  # the inlined helpers too (`stage cache` is a class Cache)

INPUTS = ("rope", "ple", "shared", "cache", "mask")  # what an op's call may take besides x, in this order (mask last: it defaults to None)


def signature(params) -> str:
    """A forward's parameters: the padding mask defaults to None (a call without one is unpadded)."""
    return ", ".join("mask=None" if p == "mask" else p for p in params)


# --- variants: one frozen record per kind, hashable, the key of a generated class ----------------


@dataclass(frozen=True)
class AttentionVariant:
    kind: ClassVar[type] = ir.Attention
    base: ClassVar[str] = "Attention"
    mask: str  # "causal" | "open"
    window: bool  # sliding-window attention
    rotary: str  # "none" | "full" | "partial" | "interleaved"
    qk_norm: bool
    gqa: bool  # kv_heads < heads
    dropout: bool
    causal: bool  # the engine's throat: the forward takes a KV cache
    split_bias: bool = False  # the output projection's bias differs from q, k, v's (out_bias)
    qk_across: bool = False  # the qk-norms span all heads (OLMo-2), not one head
    scaled: bool = False  # the scores take the constructor's scale: the spec's scale=, or μP's; not the kernel's 1/sqrt(head_dim)
    softcap: bool = False  # the scores pass through softcap * tanh(s / softcap): computed here, not in the fused kernel
    alibi: str = "none"  # "none" | "added" (after the scale: BLOOM, MPT) | "scaled" (with the logits: Falcon)
    qk_type: str = "rmsnorm"  # the qk-norms' kind: "rmsnorm" | "layernorm" (Persimmon)
    qk_bias: bool = False  # the qk layernorms have a bias
    qk_offset: bool = False  # the qk-norms' gain is qk_offset + w (Gemma 3)
    qk_affine: bool = True  # false: weightless qk-norms (nanochat)
    qk_late: bool = False  # the qk-norms act after rotary (nanochat)
    qk_heads: bool = False  # each head its own qk-norm gain (StableLM, Cohere)
    sinks: bool = False  # a learned logit per head in every softmax (gpt-oss): the scores computed here, not in the fused kernel
    gate: str = "none"  # an output gate, y * sigmoid(gate(x)): "channel" (Qwen3-Next), "head", or "none"
    gate_act: str = "sigmoid"  # ... its function: sigmoid, or softplus (Laguna)
    v_norm: bool = False  # a weightless RMSNorm on each head's values (Gemma 4)
    k_eq_v: bool = False  # the values are the keys' projection (Gemma 4): no value rows
    kv_store: bool = False  # KV sharing: its keys and values go to a slot of `shared`
    kv_reuse: bool = False  # KV sharing: it reads a slot's keys and values: q only, no cache of its own

    @classmethod
    def of(cls, a: ir.Attention, causal: bool) -> "AttentionVariant":
        rot = "none" if a.rotary_dims == 0 else "interleaved" if a.rotary_interleaved else ("full" if a.rotary_dims == a.head_dim else "partial")
        rot = "spread" if a.rotary_spread else rot
        return cls(a.mask, a.window is not None, rot, a.qk_norm, a.kv_heads != a.heads, a.dropout > 0, causal, a.out_bias != a.bias,
                   a.qk_norm and a.qk_norm_across, softcap=a.softcap is not None,
                   alibi="none" if not a.alibi else "scaled" if a.alibi_scaled else "added",
                   qk_type=a.qk_norm_type, qk_bias=a.qk_norm_bias, qk_offset=bool(a.qk_norm_offset), qk_affine=a.qk_norm_affine,
                   qk_late=a.qk_norm_after_rotary and a.rotary_dims > 0, qk_heads=a.qk_norm_head_gains, sinks=a.sinks, gate=a.gate, gate_act=a.gate_act,
                   v_norm=a.v_norm, k_eq_v=a.k_eq_v, kv_store=a.kv_store is not None, kv_reuse=a.kv_reuse is not None)

    @property
    def inputs(self) -> tuple[str, ...]:
        shared = ("shared",) if self.kv_store or self.kv_reuse else ()
        return (("rope",) if self.rotary != "none" else ()) + shared + (("cache", "mask") if self.causal else ())


@dataclass(frozen=True)
class MlpVariant:
    kind: ClassVar[type] = ir.Mlp
    base: ClassVar[str] = "Mlp"
    act: str
    dropout: bool
    gate_scale: float = 1.0  # the gate's pre-activation times this (Falcon-H1's mlp_multipliers)
    per_layer: bool = False  # Gemma 4: act(gate x) times this layer's per-layer input

    @classmethod
    def of(cls, m: ir.Mlp, causal: bool) -> "MlpVariant":
        return cls(m.act, m.dropout > 0, gate_scale=m.gate_scale, per_layer=m.per_layer)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("ple",) if self.per_layer else ()


@dataclass(frozen=True)
class MoeVariant:
    kind: ClassVar[type] = ir.Moe
    base: ClassVar[str] = "Moe"
    act: str
    capacity: bool  # training drops assignments past each expert's capacity
    balance: bool  # returns a load-balancing loss beside its output
    normalize: bool  # the chosen weights are renormalised to sum to 1 (for every top, as Mixtral)
    shared: bool = False  # a shared expert every token visits (Qwen2-MoE)
    shared_gate: bool = False  # ... scaled by sigmoid(w . x)
    router: str = "softmax"  # the scores: softmax, or sigmoid (DeepSeek-V3)
    groups: str = ""  # group-limited top-k, each group scored by "top2" or "max"; "": none
    scale: bool = False  # the chosen weights x routed_scaling_factor
    correction: bool = False  # a selection-only bias per expert (a buffer)
    trim: bool = False  # ... moved toward an even load each training forward
    router_bias: bool = False  # the router's linear has a bias (gpt-oss)

    @classmethod
    def of(cls, m: ir.Moe, causal: bool) -> "MoeVariant":
        return cls(m.act, m.capacity is not None, m.balance > 0, m.normalize, m.shared > 0, m.shared_gate, m.router,
                   m.group_score if m.groups > 1 else "", m.scale != 1.0, m.correction, m.correction_rate > 0, m.router_bias)

    @property
    def clamped(self) -> bool:
        """Its experts are gpt-oss's clamped SwiGLU (their bound a constructor argument; no custom op: eager gather)."""
        return self.act == "swiglu_clamp"

    @property
    def deepseek(self) -> bool:
        """Routes otherwise than Mixtral's softmax top-k (`ir.Moe.deepseek`)."""
        return self.router != "softmax" or bool(self.groups) or self.scale or self.correction

    @property
    def expert(self) -> MlpVariant:
        """Its experts are mlps of the same activation, without dropout."""
        return MlpVariant(self.act, False)

    inputs: ClassVar[tuple[str, ...]] = ()

    @property
    def aux(self) -> bool:
        """Its forward returns (y, its balance loss)."""
        return self.balance


@dataclass(frozen=True)
class PoolVariant:
    kind: ClassVar[type] = ir.Pool
    base: ClassVar[str] = "Pool"
    causal: bool  # only past positions are pooled
    engine_causal: bool  # the forward takes a cache

    @classmethod
    def of(cls, p: ir.Pool, causal: bool) -> "PoolVariant":
        return cls(p.causal, causal)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.engine_causal else ()


Variant = Union[AttentionVariant, MlpVariant, MoeVariant, PoolVariant]


def variants() -> dict[type, type]:
    """The kinds that get a class of their own in the generated file (norms and linears use
    torch's): each emitter names its variant, so a new kind registers in one table."""
    from .emitters import EMITTERS

    return {cls: e.variant for cls, e in EMITTERS.items() if e.variant is not None}


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
        if isinstance(v, MoeVariant):
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


def class_names() -> frozenset[str]:
    """Names no stage or branch class may take: the file's globals, the runtime's, and every
    turbine class (numbered variants of fixed bases; a generous set reserved)."""
    bases = [v.base for v in variants().values()]
    return GLOBALS | set(bases) | {f"{b}{i}" for b in bases for i in range(2, 64)}


def _class_names() -> Names:
    return Names(class_names())


def attention_scale(e: ir.Engine, a) -> float | None:
    """The scores' scale when it is not the kernel's 1/sqrt(head_dim): the spec's `scale=`, μP's
    sqrt(d0)/d, or both (μP then rescales the spec's own by the same factor)."""
    mup = ir.mup.attention_scale(e, a)
    if getattr(a, "scale", None) is None:  # latent attention has no scale= of its own
        return mup
    return a.scale if mup is None else a.scale * mup * math.sqrt(a.head_dim)


class Offsets:
    """The running index of the stages of one container (model.stages, or a group's `stages`):
    the sum of the counts of the stages so far, each run of single instances kept as one integer
    (`config.n_a + 3`, not `config.n_a + 1 + 1 + 1`). A chain of `1 + 1 + ...` made the source
    quadratic in the number of stages and sent the compiler into a RecursionError; a stage's
    index is now as long as the number of repeated stages before it, and a spec of stages used
    once indexes each by a plain integer."""

    def __init__(self):
        self.terms: list = []  # Refs of repeated stages' counts and ints, runs of ints merged

    def start(self) -> Expr:
        """The index of the next stage's first instance (written once the fields are named)."""
        terms = self.terms
        const = terms[-1] if terms and isinstance(terms[-1], int) else 0
        k = len(terms) - (1 if const else 0)  # terms[:k] never change: only a trailing int grows, and it is `const`
        return Expr(lambda: " + ".join([*map(str, terms[:k]), *([str(const)] if const else [])]) or "0")

    def add(self, n) -> None:
        """Count one stage: n its count's Ref, or None for a stage of one instance."""
        if n is not None:
            self.terms.append(n)
        elif self.terms and isinstance(self.terms[-1], int):
            self.terms[-1] += 1
        else:
            self.terms.append(1)


def make_plan(spec: ir.Spec) -> Plan:
    e = spec.engine
    assert e is not None
    lay = layout(e)
    p = Plan(engine=e, layout=lay, file=where(e.span).rsplit(":", 1)[0] if e.span else "spec")
    from .emitters import emitter

    classes = _class_names()
    kinds = variants()
    p.sizes = sizes = Sizes(e)
    scope: tuple[str, ...] = ()
    every = lay.all_stages()  # groups before the stages nested in them
    repeated = [sl for sl in every if sl.stage.repeat > 1]
    names = Counter(sl.stage.name for sl in every)
    plans: dict[int, StagePlan] = {}
    counts: dict[int, Offsets] = {}  # per container (a group's id, or 0 for the model): its stages' counts so far
    for sl in every:  # each stage's depth is a field: its let's name, else n_layer where one stage (of ops) repeats, else n_{stage}
        parent = plans[id(sl.parent)] if sl.parent is not None else None
        key = sl.stage.name if names[sl.stage.name] == 1 or parent is None else f"{parent.key}_{sl.stage.name}"
        held = counts.setdefault(id(sl.parent) if sl.parent is not None else 0, Offsets())
        start = held.start()
        if sl.stage.repeat > 1:
            name = "n_layer" if len(repeated) == 1 and not sl.children else f"n_{key}"  # a group's count is not a layer count
            within = f" in each {parent.stage.name}" if parent is not None else ""
            n = sizes.named(name, sl.stage.repeat, f"instances of stage {sl.stage.name}{within}", let=sl.stage.let_of("repeat"))
        else:
            n = None
        held.add(n)
        sp = StagePlan(sl.stage, "", sl.first, [], sl.path, n, start, parent=parent, layout=sl, key=key)
        plans[id(sl)] = sp
        if parent is not None:
            parent.items.append(sp)

    def op(part: Part) -> OpPlan:
        v = kinds[type(part.node)].of(part.node, p.causal) if type(part.node) in kinds else None
        scale = attention_scale(e, part.node) if isinstance(part.node, (ir.Attention, ir.LatentAttention)) else None
        if scale is not None:
            v = replace(v, scaled=True)
        args = emitter(part.node).sizes(part.node, sizes, scope)
        return OpPlan(part.node, part.local.rsplit(".", 1)[-1], part.path, v, p.turbine_class(v) if v else "",
                      p.rope_index(part.node, args), scale, args)

    for sl in every:  # the stages first, then the main line's own ops: class and table order
        sp = plans[id(sl)]
        sp.cls = classes.fresh(camel(sl.stage.name) or "Stage")
        if sl.children:
            p.groups.append(sp)
            continue
        scope = (sp.key,)

        def branch(b: BranchLayout) -> BranchPlan:
            nonlocal scope
            cls = classes.fresh(sp.cls + (camel(b.branch.name) or "Branch"))
            scope = (sp.key, b.attr)
            bp = BranchPlan(b.branch, b.attr, cls, [op(o) for o in b.ops], f"{sl.path}.{b.attr}", b.merge, b.fullflow is not None)
            scope = (sp.key,)
            sp.branch_plans.append(bp)
            return bp

        for it in sl.items:
            if isinstance(it, Part):
                sp.items.append(op(it))
            elif isinstance(it, BranchLayout):
                sp.items.append(branch(it))
            else:
                norm = op(it.norm) if it.norm is not None else None
                sp.items.append(FullflowPlan(it.fullflow, norm, [branch(b) for b in it.branches]))
        p.stages.append(sp)
    scope = ()
    p.main = [op(it) if isinstance(it, Part) else plans[id(it)] for it in lay.main]
    p.head_width = sizes.width(e.nozzle.width, ())  # asked before the names are given (merge_sizes resolves)
    f = e.feed
    if f.scale != 1.0:
        if f.scale == math.sqrt(e.width):
            p.feed_args["scale"] = sizes.prop("feed_scale", f.scale, (), "token embeddings are multiplied by sqrt(width)", lambda: "math.sqrt(self.width)")
        else:
            p.feed_args["scale"] = sizes.named("feed_scale", f.scale, "token embeddings are multiplied by this", "float", let=f.let_of("scale"))
    if e.nozzle.scale != 1.0:
        p.logit_scale = sizes.named("logit_scale", e.nozzle.scale, "the LM head's logits are multiplied by this", "float", let=e.nozzle.let_of("scale"))
    if f.dropout > 0:
        p.feed_args["dropout"] = sizes.named("feed_dropout", f.dropout, "dropout on the embeddings", "float", let=f.let_of("dropout"))
    if ir.mup.is_mup(e):  # the μP tables are written for the spec's width and depths
        for r in [WIDTH] + [sp.n for sp in [*p.groups, *p.stages] if sp.n is not None]:
            value = e.width if r is WIDTH else r.value
            sizes.check(lambda r=r, value=value: f"{r.own} == {value}",
                        lambda r=r, value=value: f"{r.name} ({{{r.own}}}) must stay {value} under μP: MUP_PARTS was computed for the spec's sizes; change the spec and rebuild")
    schedule_sizes(p)
    from .merges import merge_sizes

    merge_sizes(p)
    return p


def schedule_sizes(p: Plan) -> None:
    """The startup block's constants as Config fields (nanoGPT's train.py keeps them in its config):
    the learning rate and its schedule, AdamW's decay and betas, the clip."""
    s, c = p.engine.startup, p.sizes
    sch = s.schedule
    t = p.schedule
    t["lr"] = c.named("lr", sch.lr, "the peak learning rate (AdamW)", "float", let=sch.let_of("lr"))
    if s.warmup:
        t["warmup"] = c.named("warmup_steps", s.warmup, "steps of linear warmup", let=s.let_of("warmup"))
    if sch.steps is not None and sch.kind != "constant":
        t["min_lr"] = c.named("min_lr", sch.min_lr, f"the learning rate at the end of the {sch.kind} decay", "float",
                              let=sch.let_of("min_lr"))
        t["steps"] = c.named("lr_steps", sch.steps, "the step at which the decay reaches min_lr", let=sch.let_of("steps"))
    t["decay"] = c.named("weight_decay", s.decay, "AdamW's weight decay (matrices only)", "float", let=s.let_of("decay"))
    t["beta1"] = c.named("beta1", s.betas[0], "AdamW's first-moment decay", "float")
    t["beta2"] = c.named("beta2", s.betas[1], "AdamW's second-moment decay", "float")
    if s.clip is not None:
        t["clip"] = c.named("grad_clip", s.clip, "the global gradient norm is clipped at this", "float", let=s.let_of("clip"))
