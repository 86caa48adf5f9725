"""The classes of branches and stages: a branch's ops in sequence, a stage's junctions."""

from __future__ import annotations

from ... import ir
from ...ir.kinds import kind_of
from .emitters import emitter
from .merges import merge_emitter
from .plan import BranchPlan, FullflowPlan, OpPlan, Plan, StagePlan, signature
from .writer import Writer, comment, where


def branch_role(b: ir.Prechamber) -> str:
    """The branch's power-cycle role in a few words: its work, then how its exhaust returns."""
    turbines = [o for o in b.ops if ir.is_turbine(o)]
    work = kind_of(turbines[-1]).phrase if turbines else "work"
    if b.overboard:
        ret = "overboard: an auxiliary head, weighted" if b.loss is not None else "overboard: the exhaust is dumped"
    else:
        ret = kind_of(b.merge).phrase
    if b.detach:
        ret = "open cycle, detached input; " + ret
    return f"{work}; {ret}"


def merge_phrase(b: ir.Prechamber) -> str:
    if b.overboard:
        ret = "overboard, an auxiliary head" if b.loss is not None else "overboard, dumped"
    else:
        ret = kind_of(b.merge).phrase
    return ("open cycle (detached); " if b.detach else "") + ret


def op_line(out: Writer, o: OpPlan, place: str) -> None:
    """`self.{attr} = <constructor>` with what the op does where it sits."""
    e = emitter(o.op)
    out.line(f"self.{o.attr} = {e.ctor(o)}" + comment(o.op.span, e.phrase(o.op, place)), o.op.span)


def branch_call(b: BranchPlan, inp: str) -> str:
    """The call of a branch module on `inp`, from the stage's forward."""
    return f"self.{b.attr}({', '.join([inp + ('.detach()' if b.br.detach else '')] + b.params[1:])})"


def branch_class(out: Writer, b: BranchPlan) -> None:
    br, w = b.br, out.line
    w(f"class {b.cls}(nn.Module):", br.span)
    with out.indent():
        w(f'"""{where(br.span)} prechamber {br.name}: {branch_role(br)}."""')
        w()
        if br.overboard:
            w("key = None  # this module's name in the model, set by Model")
            w()
        with out.constructor():
            for o in b.ops:
                op_line(out, o, "branch")
            if br.merge is not None:
                me = merge_emitter(br.merge)
                ctor = me.ctor(br.merge, br.width)
                if ctor is not None:
                    w(f"self.{me.attr(br.merge)} = {ctor}", br.merge.span)
        w()
        w(f"def forward(self, {signature(b.params)}):")
        with out.indent():
            for o in b.ops:
                w(f"x = {emitter(o.op).call(o, 'self', 'x')}")
            w("aux[self.key] = x  # overboard: filed, never merged" if br.overboard else "return x")
    out.blank(2)


def merge_line(branches: list[BranchPlan], inp: str) -> str:
    """One junction: x (scaled, for deepnorm) plus every merged branch's contribution."""
    deltas, alpha = [], None
    for b in branches:
        me = merge_emitter(b.br.merge)
        deltas.append(me.delta(b.br.merge, b.attr, branch_call(b, inp)))
        alpha = alpha or me.main(b.br.merge)
    main = f"{alpha} * x" if alpha else "x"
    return f"x = {main} + " + " + ".join(deltas)


def branch_line(out: Writer, branches: list[BranchPlan], inp: str, span, phrase: str) -> None:
    for b in branches:
        if b.br.overboard:
            out.line(branch_call(b, inp) + comment(b.br.span, f"{b.br.name}: {merge_phrase(b.br)}"), b.br.span)
    merged = [b for b in branches if not b.br.overboard]
    if merged:
        out.line(merge_line(merged, inp) + comment(span, phrase), span)


def stage_class(out: Writer, sp: StagePlan) -> None:
    st, w = sp.stage, out.line
    rep = f", x{st.repeat}" if st.repeat > 1 else ""
    w(f"class {sp.cls}(nn.Module):", st.span)
    with out.indent():
        tmpl = f" (from template {st.template})" if st.template else ""
        w(f'"""{where(st.span)} stage {st.name}{rep}{tmpl}."""')
        w()
        with out.constructor():
            for it in sp.items:
                if isinstance(it, OpPlan):
                    op_line(out, it, "stage")
                elif isinstance(it, BranchPlan):
                    w(f"self.{it.attr} = {it.cls}()" + comment(it.br.span, "prechamber " + it.br.name), it.br.span)
                else:
                    if it.norm is not None:
                        n = it.norm
                        w(f"self.{n.attr} = {emitter(n.op).ctor(n)}" + comment(n.op.span, "fullflow: one shared valve for every branch"), n.op.span)
                    label = "fullflow" if it.ff.name == "fullflow" else f"fullflow {it.ff.name}"
                    for b in it.branches:
                        w(f"self.{b.attr} = {b.cls}()" + comment(b.br.span, f"{label}: prechamber {b.br.name}"), b.br.span)
        w()
        w("def forward(self, x, rope, cache, aux, mask=None):")
        with out.indent():
            for it in sp.items:
                if isinstance(it, OpPlan):
                    e = emitter(it.op)
                    w(f"x = {e.call(it, 'self', 'x')}" + comment(it.op.span, e.phrase(it.op, "stage")), it.op.span)
                elif isinstance(it, BranchPlan):
                    branch_line(out, [it], "x", it.br.span, f"{it.br.name}: {merge_phrase(it.br)}")
                else:
                    fullflow_line(out, it)
            w("return x")
    out.blank(2)


def fullflow_line(out: Writer, ff: FullflowPlan) -> None:
    inp = "x"
    if ff.norm is not None:
        out.line(f"h = self.{ff.norm.attr}(x)" + comment(ff.norm.op.span, "fullflow: one shared valve"), ff.norm.op.span)
        inp = "h"
    branch_line(out, ff.branches, inp, ff.ff.span, "full flow: every branch reads the same state, one junction")


def classes(out: Writer, p: Plan) -> None:
    """Every stage's branch classes, then the stage's own class, in source order."""
    for sp in p.stages:
        for b in sp.branches():
            branch_class(out, b)
        stage_class(out, sp)
