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
from dataclasses import replace
from typing import Union

from ... import ir
from ...ir.layout import BranchLayout, Names, Part, layout
from .attention import AttentionVariant
from .config import WIDTH, Expr, Sizes
from .emitters import EMITTERS, emitter
from .merges import merge_sizes
from .moe import MoeVariant
from .ops import MlpVariant, PoolVariant
from .records import BranchPlan, FullflowPlan, OpPlan, Plan, StagePlan
from .runtime import names as runtime_names
from .writer import camel, where

# Module-level names of the generated file that no class may shadow.
GLOBALS = frozenset({
    "math", "dataclass", "torch", "nn", "F", "Config", "Feed", "Model", "Cache", "Startup",
    "learning_rate", "causal_mask", "sliding_mask", "rotary_tables", "apply_rotary", "alibi_slopes",
    "apply_rotary_partial", "sinusoids", "OVERBOARD", "OVERBOARD_LOSS", "Optional", "next_token_loss", "lookup",
}) | frozenset(dir(builtins)) | runtime_names()  # the inlined helpers too (`stage cache` is a class Cache)

Variant = Union[AttentionVariant, MlpVariant, MoeVariant, PoolVariant]


def variants() -> dict[type, type]:
    """The kinds that get a class of their own in the generated file (norms and linears use
    torch's): each emitter names its variant, so a new kind registers in one table."""
    return {cls: e.variant for cls, e in EMITTERS.items() if e.variant is not None}


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
