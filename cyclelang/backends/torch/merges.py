"""One emitter per kind of merge: its own parameters, its junction, its init rule.

What a merge multiplies is the kinds table's (`ir.kinds.gain`: a fixed value, a learned
parameter and its name, a scaled main line, a gate); the attribute of a merge's own
parameters is its kind's first field (`scale`, `gate`), as in the layout's paths.
"""

from __future__ import annotations

from ... import ir
from ...ir.kinds import gain, kind_of, output_projection, registered
from ...ir.formulas import COOLING_STD, DEEPNORM_ALPHA, DEEPNORM_BETA, LAYERSCALE_INIT
from .emitters import emitter, lookup
from typing import Callable

from .config import Sizes
from .records import BranchPlan, Plan
from .writer import num


class MergeEmitter:
    """A merge without parameters or init rule: x + f(x)."""

    module = ""  # the class of its own parameters, for the name map ("" when it has none)

    def attr(self, m) -> str:
        return kind_of(m).fields[0]

    def module_of(self, m) -> str:
        """The class of this merge's own parameters, for the name map ("" when it has none)."""
        return self.module

    def sizes(self, m, b: BranchPlan, c: Sizes, totals: "Totals") -> dict:
        """What the merge reads from the config: {name: Ref or Expr} (its width is always there)."""
        return {}

    def ctor(self, m, args: dict) -> str | None:
        """`self.{attr} = ...` in the branch's __init__ (with its comment), or None."""
        return None

    def delta(self, m, attr: str, f: str) -> str:
        """The branch's contribution to the chamber, given the call f of the branch at `attr`."""
        return f

    def main(self, m) -> str | None:
        """What the main line's x is multiplied by at the junction (an attribute of the stage), None for 1."""
        return None

    def init(self, m, b: BranchPlan, pre: str) -> list[str]:
        """reset_parameters lines for the branch module at `pre`, after the default init."""
        return []


class ScaleEmitter(MergeEmitter):
    def delta(self, m, attr, f):
        return f"{num(gain(m).value)} * {f}"


class LearnedGainEmitter(MergeEmitter):
    """ReZero's scalar, LayerScale's per-channel vector: x + s * f(x), s learned."""

    module = "nn.Parameter"

    def sizes(self, m, b, c, totals):
        if isinstance(m, ir.RezeroMerge):
            return {"init": c.field("rezero_init", m.init, (), "ReZero's starting gain (0: the branch starts closed)", "float", let=m.let_of("init"))}
        if m.init_asked is not None:
            return {"init": c.field("layerscale_init", m.init, (), "LayerScale's starting gain", "float", let=m.let_of("init"))}
        layers = totals.layers()
        return {"init": c.prop("layerscale_init", m.init, (), "LayerScale's starting gain: CaiT's rule by depth",
                               lambda: LAYERSCALE_INIT.code(layers=layers()))}

    def ctor(self, m, args):
        if isinstance(m, ir.RezeroMerge):
            return f"nn.Parameter(torch.full((), {args['init']}))  # ReZero: the branch starts closed"
        return f"nn.Parameter(torch.full(({args['width']},), {args['init']}))  # LayerScale: per channel"

    def delta(self, m, attr, f):
        return f"self.{attr}.{gain(m).learned} * {f}"


class GateEmitter(MergeEmitter):
    module = "nn.Linear"

    def sizes(self, m, b, c, totals):
        return {"bias": c.field("gate_bias", m.bias, (), "the highway gate's starting bias (negative: the gate starts mostly shut)", "float", let=m.let_of("bias"))}

    def ctor(self, m, args):
        return f"nn.Linear({args['width']}, {args['width']})  # highway gate; its bias starts at {args['bias']}"

    def delta(self, m, attr, f):
        return f"torch.sigmoid(self.{attr}.{self.attr(m)}(x)) * ({f} - x)"

    def init(self, m, b, pre):
        return [f"nn.init.constant_({pre}.{self.attr(m)}.bias, {b.margs['bias']})  # the gate starts mostly shut"]


class CoolingEmitter(MergeEmitter):
    def sizes(self, m, b, c, totals):
        base = c.init_std() if m.base_asked is None else c.field("cooling_base", m.base, (), "cooling: the std before scaling", "float", let=m.let_of("std"))
        merges = totals.merges()
        return {"std": c.prop("cooling_std", m.std, (), "cooled output projections: std / sqrt(merges into the residual stream)",
                              lambda: COOLING_STD.code(base=base.own, merges=merges()))}

    def init(self, m, b, pre):
        last = output_projection([o.op for o in b.ops])  # the kinds table says which kinds have one
        if last is None:  # the reviewer refuses it (E0302): a cooling with nothing to cool is a plain add
            return []
        o = next(o for o in b.ops if o.op is last)
        lines = emitter(o.op).output_init(f"{pre}.{o.attr}", o.op, str(b.margs["std"]))
        if lines is None:
            raise NotImplementedError(f"{type(o.op).__name__} has an output projection (ir.kinds) but its emitter writes no output_init")
        return ["# scaled init: the output projection starts at std / sqrt(residual adds) (GPT-2)", *lines]


class DeepnormEmitter(MergeEmitter):
    def sizes(self, m, b, c, totals):
        n = totals.deep()
        out = {}
        for what, asked, value, formula in (("alpha", m.alpha_asked, m.alpha, lambda: DEEPNORM_ALPHA.code(layers=n())),
                                            ("beta", m.beta_asked, m.beta, lambda: DEEPNORM_BETA.code(layers=n()))):
            if asked is not None:
                out[what] = c.field(f"deepnorm_{what}", value, (), f"DeepNet's {what}", "float", let=m.let_of(what))
            else:
                out[what] = c.prop(f"deepnorm_{what}", value, (), f"DeepNet's {what} over N = the layers", formula)
        return out

    def main(self, m):
        return "self.alpha"

    def init(self, m, b, pre):
        out = []
        for o in b.ops:
            out += emitter(o.op).deepnorm_init(f"{pre}.{o.attr}", o.op, str(b.margs["beta"]))
        if not out:  # a branch without weights (a pool): beta has nothing to scale; alpha still scales the main line
            return []
        return ["# deepnorm: v, the output projection and the reactor start with gain beta = (8N)^-1/4 (DeepNet)", *out]


class HyperEmitter(MergeEmitter):
    """Hyper-connections (runtime/hyper.py): the branch's junction with a chamber of several streams. The
    stage reads and writes the streams itself (`stages.hyper_line`): `delta` is never asked."""

    module = "HyperConnection"

    def module_of(self, m) -> str:
        return "ManifoldConnection" if m.connections == "manifold" else "HyperConnection"

    def sizes(self, m, b, c, totals):
        out = {"streams": c.field("streams", m.streams, (), "residual streams the chamber holds (hyper-connections)", let=c.e.let_of("streams"))}
        if m.connections == "manifold":
            out["sinkhorn"] = c.field("sinkhorn", m.sinkhorn, (), "Sinkhorn iterations keeping the streams' mixing doubly stochastic (mHC)")
            out["eps"] = c.field("hyper_eps", m.eps, (), "mHC: the streams' RMSNorm eps and the weights' floor", "float")
            out["std"] = c.init_std() if c.e.startup.init.kind == "normal" else "0.02"
        elif m.dynamic:
            out["eps"] = c.field("hyper_eps", m.eps, (), "dynamic hyper-connections: their LayerNorm's eps", "float")
        return out

    def ctor(self, m, args):
        if m.connections == "manifold":
            return (f"ManifoldConnection({args['width']}, {args['streams']}, {args['sinkhorn']}, {args['eps']}, {args['std']})"
                    "  # mHC: weights from the streams, their mixing doubly stochastic")
        if m.dynamic:
            return f"HyperConnection({args['width']}, {args['streams']}, dynamic=True, eps={args['eps']})  # dynamic hyper-connection"
        return f"HyperConnection({args['width']}, {args['streams']})  # static hyper-connection: learned read, write and mixing weights"

    def delta(self, m, attr, f):
        raise NotImplementedError("a hyper-connection is no add: stages.hyper_line writes its junction")


MERGE_EMITTERS: dict[type, MergeEmitter] = {
    ir.PlainMerge: MergeEmitter(),
    ir.ScaleMerge: ScaleEmitter(),
    ir.CoolingMerge: CoolingEmitter(),
    ir.RezeroMerge: LearnedGainEmitter(),
    ir.LayerscaleMerge: LearnedGainEmitter(),
    ir.DeepnormMerge: DeepnormEmitter(),
    ir.GateMerge: GateEmitter(),
    ir.HyperMerge: HyperEmitter(),
}
registered(MERGE_EMITTERS, "cyclelang/backends/torch/merges.py MERGE_EMITTERS", ir.MERGE_TYPES)


class Totals:
    """The engine's merge totals (`ir.passes.merge_totals`) as formulas over the config's depths."""

    def __init__(self, p: Plan):
        self.p = p

    def _sum(self, weight) -> Callable[[], str]:
        def text() -> str:
            terms, const = [], 0
            for sp in self.p.stages:
                k = weight(sp)
                if not k:
                    continue
                counts = [c.n.own for c in sp.chain() if c.n is not None]  # a nested stage runs in every instance of its groups
                if not counts:
                    const += k
                else:
                    terms.append(" * ".join(([] if k == 1 else [str(k)]) + counts))
            if const or not terms:
                terms.append(str(max(const, 1)))
            return " + ".join(terms)
        return text

    @staticmethod
    def _returning(sp) -> list:
        return [b for b in sp.stage.branch_list() if not b.overboard]

    def merges(self):
        return self._sum(lambda sp: len(self._returning(sp)))

    def layers(self):
        return self._sum(lambda sp: 1 if self._returning(sp) else 0)

    def deep(self):
        return self._sum(lambda sp: 1 if any(isinstance(b.merge, ir.DeepnormMerge) for b in self._returning(sp)) else 0)


def merge_sizes(p: Plan) -> None:
    """Every merge's config values (`BranchPlan.margs`), then the init std, then the names."""
    totals = Totals(p)
    for sp in p.stages:
        for b in sp.branches():
            b.margs = {"width": p.sizes.width(b.br.width, (sp.key, b.attr))}
            if b.br.merge is not None:
                b.margs.update(merge_emitter(b.br.merge).sizes(b.br.merge, b, p.sizes, totals))
    if p.engine.startup.init.kind == "normal":
        p.sizes.init_std()
    p.sizes.resolve()


def merge_emitter_for(cls: type) -> MergeEmitter:
    return lookup(MERGE_EMITTERS, cls)


def merge_emitter(m) -> MergeEmitter:
    return lookup(MERGE_EMITTERS, type(m))
