"""The classes of branches and stages: a branch's ops in sequence, a stage's junctions."""

from __future__ import annotations

import keyword

from ... import ir
from ...ir.kinds import kind_of
from .emitters import emitter
from .merges import merge_emitter
from .plan import class_names
from .records import INPUTS, BranchPlan, FullflowPlan, OpPlan, Plan, StagePlan, signature
from .writer import Writer, camel, comment, doc_tag, num


def branch_role(b: ir.Prechamber) -> str:
    """The branch in ML words: its work, then how its output returns."""
    turbines = [o for o in b.ops if ir.is_turbine(o)]
    work = kind_of(turbines[-1]).ml if turbines else "a branch"
    return f"{work}; {merge_phrase(b)}"


def merge_phrase(b: ir.Prechamber, short: bool = False) -> str:
    """How the branch's output returns, in ML words (short: for the residual line itself)."""
    if b.overboard:
        ret = "an auxiliary output head, its loss weighted" if b.loss is not None else "its output leaves the model, never added back"
    elif short:
        k = kind_of(b.merge)
        ret = k.ml if isinstance(b.merge, ir.PlainMerge) else f"residual add, {k.ml}"
    else:
        ret = kind_of(b.merge).ml_words
    return ("input detached (no gradient flows back through it); " if b.detach else "") + ret


def merge_rocket(b: ir.Prechamber) -> str:
    """The engine words of the same: `prechamber mix, cooling`."""
    ret = "overboard" if b.overboard else kind_of(b.merge).rocket
    return f"prechamber {b.name}, " + ("open cycle, " if b.detach else "") + ret


def op_line(out: Writer, o: OpPlan, place: str) -> None:
    """`self.{attr} = <constructor>` with what the op does where it sits."""
    e = emitter(o.op)
    out.line(f"self.{o.attr} = {e.ctor(o)}" + comment(o.op.span, *e.phrase(o.op, place)), o.op.span)


def inline(b: BranchPlan) -> bool:
    """A branch that is a short chain of ops and a merge without parameters of its own has no
    class: its ops sit in an nn.ModuleDict and the stage's residual line calls them in turn
    (`x = x + self.mix.attn(self.mix.norm(x))`)."""
    return not b.br.overboard and len(b.ops) <= 3 and merge_emitter(b.br.merge).ctor(b.br.merge, b.margs) is None


class Temps:
    """Fresh names for the outputs a stage's forward keeps apart (y, y2, ...): an op's output
    that comes with an auxiliary loss."""

    def __init__(self):
        self.n = 0

    def fresh(self) -> str:
        self.n += 1
        return "y" if self.n == 1 else f"y{self.n}"


def aux_line(out: Writer, target: str, key: str, call: str, op) -> None:
    """`target, aux["key"] = call`: an op that returns its output and its auxiliary loss."""
    out.line(f'{target}, aux["{key}"] = {call}' + comment(op.span, "its output and its load-balancing loss, kept by name", kind_of(op).rocket), op.span)


def branch_call(out: Writer, b: BranchPlan, inp: str, temps: Temps) -> str:
    """The call of a branch on `inp`, from the stage's forward: its module, or its ops in turn.
    An op or branch that returns auxiliary losses is called on a line of its own first, its
    losses filed in `aux` under their names in the stage."""
    x = inp + (".detach()" if b.br.detach else "")
    if inline(b):
        for o in b.ops:
            x = emitter(o.op).call(o, f"self.{b.attr}", x)
            if o.aux:
                t = temps.fresh()
                aux_line(out, t, f"{b.attr}.{o.attr}", x, o.op)
                x = t
        return x
    call = f"self.{b.attr}({', '.join([x] + b.params[1:])})"
    if not b.aux:
        return call
    t = temps.fresh()
    out.line(f"{t}, losses = {call}")
    out.line(f'aux.update({{f"{b.attr}.{{name}}": loss for name, loss in losses.items()}})  # its auxiliary losses, by name')
    return t


def branch_ctor(out: Writer, b: BranchPlan, label: str) -> None:
    """`self.{branch} = ...` in the stage's __init__: its class, or its ops in an nn.ModuleDict."""
    w = out.line
    if not inline(b):
        w(f"self.{b.attr} = {b.cls}(config)" + comment(b.br.span, branch_role(b.br), label), b.br.span)
        return
    w(f"self.{b.attr} = nn.ModuleDict(dict(" + comment(b.br.span, branch_role(b.br), label), b.br.span)
    with out.indent():
        for o in b.ops:
            e = emitter(o.op)
            w(f"{o.attr}={e.ctor(o)}," + comment(o.op.span, *e.phrase(o.op, "branch")), o.op.span)
    w("))")


def branch_class(out: Writer, b: BranchPlan) -> None:
    br, w = b.br, out.line
    w(f"class {b.cls}(nn.Module):", br.span)
    with out.indent():
        w(f'"""Branch {br.name}: {branch_role(br)}{doc_tag(br.span, "prechamber")}."""')
        w()
        if br.overboard:
            w(f"loss_weight = {num(br.loss)}  # " + ("an auxiliary next-token head: its loss joins the total, weighted" if br.loss is not None else "dumped: no loss"))
            w()
        with out.constructor("config"):
            for o in b.ops:
                op_line(out, o, "branch")
            if br.merge is not None:
                me = merge_emitter(br.merge)
                ctor = me.ctor(br.merge, b.margs)
                if ctor is not None:
                    w(f"self.{me.attr(br.merge)} = {ctor}", br.merge.span)
        w()
        w(f"def forward(self, {signature(b.params)}):")
        with out.indent():
            if b.aux:
                w("aux = {}  # its ops' auxiliary losses, by name")
            for o in b.ops:
                call = emitter(o.op).call(o, "self", "x")
                if o.aux:
                    aux_line(out, "x", o.attr, call, o.op)
                else:
                    w(f"x = {call}")
            w("return x, aux" if b.aux else "return x")
    out.blank(2)


def merge_line(out: Writer, branches: list[BranchPlan], inp: str, temps: Temps) -> str:
    """One junction: x (scaled, for deepnorm) plus every merged branch's contribution."""
    deltas, alpha = [], None
    for b in branches:
        me = merge_emitter(b.br.merge)
        deltas.append(me.delta(b.br.merge, b.attr, branch_call(out, b, inp, temps)))
        alpha = alpha or me.main(b.br.merge)
    main = f"{alpha} * x" if alpha else "x"
    return f"x = {main} + " + " + ".join(deltas)


def branch_line(out: Writer, branches: list[BranchPlan], inp: str, span, phrase: tuple[str, str], temps: Temps) -> None:
    for b in branches:
        if b.br.overboard:  # its output is kept by name, never added back
            call = branch_call(out, b, inp, temps)
            out.line(f'aux["{b.attr}"] = {call}' + comment(b.br.span, f"{b.br.name}: {merge_phrase(b.br)}", merge_rocket(b.br)), b.br.span)
    merged = [b for b in branches if not b.br.overboard]
    for b in [b for b in merged if isinstance(b.br.merge, ir.HyperMerge)]:
        hyper_line(out, b, inp, temps)
    merged = [b for b in merged if not isinstance(b.br.merge, ir.HyperMerge)]
    if merged:
        line = merge_line(out, merged, inp, temps)
        out.line(line + comment(span, *phrase), span)


def hyper_line(out: Writer, b: BranchPlan, inp: str, temps: Temps) -> None:
    """A branch's junction with a chamber of several streams (hyper-connections): it reads a learned
    mix of the streams, and its output is written into each, the streams mixed."""
    m, hc = b.br.merge, f"self.{b.attr}.{kind_of(b.br.merge).fields[0]}"
    word = "manifold-constrained hyper-connection" if m.connections == "manifold" else "hyper-connection"
    out.line(f"h, post, res = {hc}({inp})" + comment(b.br.span, f"{b.br.name}: reads a learned mix of the streams ({word})", f"prechamber {b.br.name}, chamber manifold"), b.br.span)
    y = branch_call(out, b, "h", temps)
    out.line(f"{inp} = {hc}.write({inp}, {y}, post, res)" + comment(m.span or b.br.span, "its output into each stream, the streams mixed", "chamber manifold"), m.span or b.br.span)


def class_head(out: Writer, sp: StagePlan, what: str = "", word: str = "stage") -> None:
    """`class Block(nn.Module):` and its docstring: the block, how often it repeats, `what` it holds.
    A stage from a template is described by its template alone (no use of it, no spec line),
    so every use of one structure writes the same text and shares one class (`classes`)."""
    st, w = sp.stage, out.line
    w(f"class {sp.cls}(nn.Module):", st.span)
    with out.indent():
        if st.template:
            w(f'"""One `{st.template}` block{what}{doc_tag(None, word + " template")}."""')
        else:
            rep = f", repeated config.{sp.n.name} times" if sp.n is not None else ""
            if sp.parent is not None and sp.n is not None:
                rep += f" in each {sp.parent.stage.name}"
            w(f'"""One `{st.name}` block{rep}{what}{doc_tag(st.span, word)}."""')
        w()


def stage_class(out: Writer, sp: StagePlan) -> None:
    w = out.line
    class_head(out, sp)
    with out.indent():
        with out.constructor("config"):
            if any(merge_emitter(b.br.merge).main(b.br.merge) for b in sp.branches() if b.br.merge is not None):
                alpha = next(b.margs["alpha"] for b in sp.branches() if "alpha" in b.margs)
                w(f"self.alpha = {alpha}  # DeepNet: the residual stream is scaled up at each merge")
            for it in sp.items:
                if isinstance(it, OpPlan):
                    op_line(out, it, "stage")
                elif isinstance(it, BranchPlan):
                    branch_ctor(out, it, "prechamber " + it.br.name)
                else:
                    if it.norm is not None:
                        n = it.norm
                        w(f"self.{n.attr} = {emitter(n.op).ctor(n)}" + comment(n.op.span, "one norm shared by the parallel branches", "fullflow valve"), n.op.span)
                    label = "fullflow" if it.ff.name == "fullflow" else f"fullflow {it.ff.name}"
                    for b in it.branches:
                        branch_ctor(out, b, f"{label}: prechamber {b.br.name}")
        w()
        w(f"def forward(self, {signature(stage_params(sp))}):")
        with out.indent():
            temps = Temps()
            if sp.aux:
                w('"""Returns x and this block\'s auxiliary losses and outputs, by name."""')
                w("aux = {}")
            for it in sp.items:
                if isinstance(it, OpPlan):
                    e = emitter(it.op)
                    if it.aux:
                        aux_line(out, "x", it.attr, e.call(it, "self", "x"), it.op)
                    else:
                        w(f"x = {e.call(it, 'self', 'x')}" + comment(it.op.span, *e.phrase(it.op, "stage")), it.op.span)
                elif isinstance(it, BranchPlan):
                    branch_line(out, [it], "x", it.br.span, (f"{it.br.name}: {merge_phrase(it.br, short=True)}", merge_rocket(it.br)), temps)
                else:
                    fullflow_line(out, it, temps)
            w("return x, aux" if sp.aux else "return x")
    out.blank(2)


def stage_params(sp: StagePlan) -> list[str]:
    """The stage forward's parameters: x, then only what its ops and branches take (a group's:
    what its stages take)."""
    if sp.children:
        used = {i for c in sp.children for i in stage_params(c)}
    else:
        used = {i for o in sp.ops() for i in o.inputs}
    return ["x"] + [i for i in INPUTS if i in used]


def instances(p: Plan, sp: StagePlan, cfg: str = "config", container: str = "self.stages") -> str:
    """The stage's instances in `container` (model.stages, or its group's stages): all of them
    where it is the only stage there."""
    if (len(p.top) if sp.parent is None else len(sp.parent.children)) == 1:
        return container
    start = str(sp.start).replace("config.", f"{cfg}.")
    n = str(sp.n).replace("config.", f"{cfg}.")
    return f"{container}[:{n}]" if start == "0" else f"{container}[{start} : {start} + {n}]"


def module_list(plans: list[StagePlan]) -> str:
    """`nn.ModuleList(...)` of these stages' instances, in order."""
    parts: list[str] = []
    singles: list[str] = []  # a run of stages of one instance each: one list display, not a chain of `+`
    for sp in plans:
        if sp.n is None:
            singles.append(f"{sp.cls}(config)")
            continue
        if singles:
            parts.append("[" + ", ".join(singles) + "]")
            singles = []
        parts.append(f"[{sp.cls}(config) for _ in range({sp.n})]")
    if singles:
        parts.append("[" + ", ".join(singles) + "]")
    return "nn.ModuleList(" + " + ".join(parts) + ")"


def stage_call(out: Writer, p: Plan, sp: StagePlan) -> None:
    """The forward's lines that run one stage's instances on x (a loop where it repeats); a
    stage that returns auxiliary losses has them filed in `aux` under each instance's path."""
    st, w = sp.stage, out.line
    args = ", ".join(stage_params(sp))
    call = f"stage({args})"
    start = str(sp.start).replace("config.", "self.config.")
    tag = comment(st.span, f"block {st.name}", "stage")
    if sp.n is not None:
        where = instances(p, sp, "self.config")
        if sp.aux:
            loop = f"enumerate({where})" if start == "0" else f"enumerate({where}, start={start})"
            w(f"for i, stage in {loop}:" + tag, st.span)
            with out.indent():
                w(f"x, losses = {call}")
                w('aux.update({f"stages.{i}.{name}": loss for name, loss in losses.items()})')
        else:
            w(f"for stage in {where}:" + tag, st.span)
            with out.indent():
                w(f"x = {call}")
    elif sp.aux:
        w(f"x, losses = self.stages[{start}]({args})" + tag, st.span)
        index = start if start.isdigit() else "{" + start + "}"
        w(f'aux.update({{f"stages.{index}.{{name}}": loss for name, loss in losses.items()}})')
    else:
        w(f"x = self.stages[{start}]({args})" + tag, st.span)


def group_class(out: Writer, p: Plan, sp: StagePlan) -> None:
    """A stage of stages: its stages' instances in a ModuleList, run in order."""
    w = out.line
    inner = ", ".join(c.stage.name + (f" x config.{c.n.name}" if c.n is not None else "") for c in sp.children)
    class_head(out, sp, f": the stages {inner} in turn", "nested stage")
    with out.indent():
        with out.constructor("config"):
            if any(c.n is not None for c in sp.children) and len(sp.children) > 1:
                w("self.config = config  # the stages' counts")
            w("self.stages = " + module_list(sp.children))
        w()
        w(f"def forward(self, {signature(stage_params(sp))}):")
        with out.indent():
            if sp.aux:
                w('"""Returns x and its stages\' auxiliary losses and outputs, by path."""')
                w("aux = {}")
            for c in sp.children:
                stage_call(out, p, c)
            w("return x, aux" if sp.aux else "return x")
    out.blank(2)


def fullflow_line(out: Writer, ff: FullflowPlan, temps: Temps) -> None:
    inp = "x"
    if ff.norm is not None:
        out.line(f"h = self.{ff.norm.attr}(x)" + comment(ff.norm.op.span, "one shared norm", "fullflow valve"), ff.norm.op.span)
        inp = "h"
    branch_line(out, ff.branches, inp, ff.ff.span, ("parallel branches: each reads the same input, one residual add", "full flow"), temps)


def classes(out: Writer, p: Plan) -> None:
    """Every stage's branch classes, then the stage's own class, in source order; a group's
    class after its stages'. One class per distinct structure: a class whose text (its name
    aside) was written already is not written again, and its users take the first's name
    (jamba's three `routed` stages, all `mamba_moe`, share one class). A stage's class is
    named after the stage, or after its template where stages of other names are made from it
    (jamba's `pairs` and `last`: `Pair`); `Block` is appended where the name is taken (a
    turbine's class, a runtime name), and a number from 2 where another structure has it."""
    seen: dict[tuple[str, ...], str] = {}  # the class's lines with its own name blanked -> its name
    names = class_names() | {b.cls for sp in p.stages for b in sp.branches()}
    finals: set[str] = set()

    made: dict[str, set[str]] = {}  # template -> the names of the stages made from it
    for sp in p.all_stages():
        if sp.stage.template:
            made.setdefault(sp.stage.template, set()).add(sp.stage.name)

    def final_name(sp: StagePlan) -> str:
        st = sp.stage
        base = camel(st.template if st.template and len(made[st.template]) > 1 else st.name) or "Stage"
        if base in names or not base.isidentifier() or keyword.iskeyword(base):
            base = (base if base.isidentifier() else "Stage") + "Block"
        name, k = base, 2
        while name in names or name in finals:
            name, k = f"{base}{k}", k + 1
        finals.add(name)
        return name

    def once(obj, write, final=None) -> None:
        sub = out.child()
        write(sub)
        head = f"class {obj.cls}("
        assert sub.lines[0].lstrip().startswith(head), sub.lines[0]
        key = (sub.lines[0].replace(head, "class (", 1), *sub.lines[1:])
        if key in seen:
            obj.cls = seen[key]
            return
        if final is not None:
            name = final()
            sub.lines[0] = sub.lines[0].replace(head, f"class {name}(", 1)
            obj.cls = name
        seen[key] = obj.cls
        out.extend(sub)

    def write(sp: StagePlan) -> None:
        if sp.children:
            for c in sp.children:
                write(c)
            once(sp, lambda w: group_class(w, p, sp), lambda: final_name(sp))
            return
        for b in sp.branches():
            if not inline(b):
                once(b, lambda w, b=b: branch_class(w, b))
        once(sp, lambda w: stage_class(w, sp), lambda: final_name(sp))

    for sp in p.top:
        write(sp)
