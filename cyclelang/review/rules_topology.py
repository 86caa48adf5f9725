"""Design rules on the engine's topology: Post-LN depth and warmup, cooling, dead and detached
branches, merges with nothing to act on, DeepNorm's alphas, a mixture's balance and capacity.
"""

from __future__ import annotations


from .. import ir
from ..diagnostics import Diagnostic
from ..ir.kinds import Gain, gain, kind_of, output_projection
from .registry import ReviewConfig, _blocks, _n, _plural, _w, rule
from .walk import Part, is_dead, merges_into_main_line, parts, stages


# --- W101: Post-LN, deep, no warmup ----------------------------------------------------------


@rule("W101", "deep Post-LN without warmup", """
A norm at stage level sits in series on the main line (Post-LN, as in the original
Transformer): every valve in series adds a pressure drop that the backward pass must
climb, so in a deep engine (12 layers or more) the gradient reaching the first layers
is tiny and early training diverges unless the learning rate starts small. Warmup is
the open-loop start sequence that gets such an engine going. Fix it with
`startup { warmup N }`, by moving the norms into the prechambers (Pre-LN: the main
line runs unobstructed), or by returning the branches with `merge deepnorm`, which
up-weights the main line so Post-LN can go deep.""", "stage layer x 12 { prechamber mix { turbine attention heads=8 }  norm layernorm ... }")
def post_ln_without_warmup(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    post = [s for s in _blocks(e) if any(isinstance(op, ir.Norm) and op.type != "scalar" for op in s.ops)]  # a scalar gain normalises nothing
    layers = sum(s.repeat for s in post)
    if not post or layers < cfg.post_ln_depth or e.startup.warmup > 0:
        return []
    branches = [b for s in post for b in ir.stage_branches(s) if not b.overboard]
    if branches and all(isinstance(b.merge, ir.DeepnormMerge) for b in branches):
        return []  # DeepNet: Post-LN made deep by up-weighting the main line
    valve = next(op for op in post[0].ops if isinstance(op, ir.Norm) and op.type != "scalar")
    return [_w("W101", f"a norm in series on the main line of {_plural(layers, 'Post-LN layer')}, with no warmup", valve.span,
               "add 'startup { warmup 4000 }', move the norm into each prechamber (Pre-LN), or return the branches with 'merge deepnorm'",
               ["every valve in series adds a pressure drop the gradient must climb; deep Post-LN needs an open-loop start"])]


# --- W102: deep, nothing cooled --------------------------------------------------------------


@rule("W102", "deep engine with nothing cooled", """
Twenty-four or more branches merge into the main line and none of them is cooled:
no `merge cooling`, `rezero`, `layerscale`, `deepnorm`, `gate` or `scale` below 1.
A staged-combustion preburner runs rich so the turbine survives; a deep network asks
each branch for a small update for the same reason. With full-strength merges the
chamber's norm grows with every one of them at initialisation, and so do the
gradients. `merge cooling` starts each output projection at std/sqrt(merges)
(GPT-2's rule); rezero and layerscale start each branch near zero.""", "stage block x 12 { prechamber mix { ... }  prechamber burn { ... } }")
def deep_without_cooling(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    if ir.chamber_streams(e.body) is not None:  # hyper-connections: the junction is the chamber's, no merge can be written (E0290)
        return []
    merges = merges_into_main_line(e)
    # a norm in series on the main line (Post-LN, BERT) renormalises the chamber after every
    # layer, so its merges do not add up: the stand measures its chamber at RMS 1 at every depth
    unregulated = sum(s.repeat * sum(not b.overboard for b in ir.stage_branches(s)) for s in stages(e)
                      if not any(isinstance(op, ir.Norm) and op.type != "scalar" for op in s.ops))
    if merges < cfg.deep_merges or unregulated < cfg.deep_merges:
        return []
    branches = [b for s in stages(e) for b in ir.stage_branches(s) if not b.overboard]
    if any(ir.kinds.kind_of(b.merge).cooled or isinstance(b.merge, ir.ScaleMerge) and abs(b.merge.value) < 1 for b in branches):
        return []
    first = next(s for s in _blocks(e))
    return [_w("W102", f"{merges} branches return to the main line at full strength: nothing is cooled", first.span,
               "end the prechambers with 'merge cooling' (output projections start at std/sqrt(merges)), or use rezero, layerscale or deepnorm",
               [f"each merge adds an update of full size, so the chamber's norm grows with all {merges} of them at initialisation"])]


# --- E0301: a dead branch --------------------------------------------------------------------


@rule("E0301", "dead branch", """
An overboard branch never returns its exhaust to the chamber, and this one has no
loss (or a loss weighted 0) either, so nothing reads its output: its parameters
never receive a gradient and its work is thrown away on every step. In engine
terms it is a turbine whose exhaust is dumped without driving anything. Give the
branch a weight (`overboard loss=0.1`) to make it an auxiliary head, or delete it.
This is an error, and `# allow:` does not silence it.""", "prechamber probe overboard { norm layernorm  turbine linear out=vocab }")
def dead_branch(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    seen = set()
    for p in parts(e):
        b = p.branch
        if b is None or id(b) in seen or not is_dead(b):
            continue
        seen.add(id(b))
        n = sum(q.params for q in parts(e) if q.branch is b) * p.repeat
        why = "weighs its loss at 0" if b.loss == 0 else "has no loss"
        out.append(Diagnostic("E0301", "error", f"prechamber '{b.name}' goes overboard and {why}: a dead branch", b.span,
                              "give it a weight, 'overboard loss=0.1', to make it an auxiliary head, or delete it",
                              (f"its {n:,} parameters never receive a gradient, and its work is thrown away every step",)))
    return out


# --- E0302: a merge whose init rule has nothing to act on ----------------------------------------


@rule("E0302", "merge init rule with nothing to act on", """
`merge cooling` does one thing: it starts the branch's output projection (attention's
and an MLP's last matrix, a linear turbine's weight) at std / sqrt(merges). A branch
whose turbines have no output projection (a pool, with only norms beside it) has no
weight to start small, so the merge would be a plain residual add that the diagrams and
the reviewer count as cooled. End the branch with a turbine that has one, write
`merge plain`, or start the branch small another way (`merge rezero`, `merge scale=`).
`merge deepnorm` on such a branch is accepted: its alpha still scales the main line,
and beta has nothing to scale. This is an error, and `# allow:` does not silence it.""",
     "prechamber mix { norm layernorm  turbine pool  merge cooling }")
def merge_init_without_output(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    """A merge whose whole effect is its init rule on the branch's output projection (cooling's
    sigma; DeepNorm with alpha=1), on a branch whose kinds have none (`Kind.out_proj`): a plain
    add that says it is cooled. DeepNorm's alpha still scales the main line, so it builds."""
    out, seen = [], set()
    for s in stages(e):
        for b in ir.stage_branches(s):
            m = b.merge
            if m is None or not kind_of(m).inits_output or output_projection(b.ops) is not None or gain(m) != Gain():
                continue
            key = (m.span.file, m.span.line, m.span.column) if m.span is not None else id(b)
            if key in seen:
                continue
            seen.add(key)
            word = kind_of(m).keyword
            ops = ", ".join(dict.fromkeys(kind_of(op).ml for op in b.ops))
            lacking = " and ".join(dict.fromkeys(k.ml + "s" for k in ir.kinds.OPS if not k.out_proj))
            out.append(Diagnostic("E0302", "error", f"'merge {word}' sets the init of the branch's output projection, but prechamber "
                                  f"'{b.name}' ({ops}) has none: the merge would be a plain residual add", m.span,
                                  "end the branch with a turbine that has one ('turbine linear', 'turbine mlp'), or write 'merge plain' "
                                  "(or 'merge rezero' / 'merge scale=0.1' to start the branch small)",
                                  (f"{lacking} have no output projection: there is no weight for the init rule to start small",)))
    return out


# --- E0303: DeepNorm branches of one stage with different alphas --------------------------------


@rule("E0303", "DeepNorm merges of one stage with different alphas", """
DeepNet (`merge deepnorm`) scales the residual stream by alpha at each merge, x_next =
alpha * x + f(x), with one alpha for every merge of a block: the built stage holds one.
Two branches of one stage that ask for different alphas (`alpha=` on one, another or the
default (2N)^(1/4) on the other) would silently compute with the first one's, so the spec
is refused. Give the stage's DeepNorm merges one alpha, or put the branches in stages of
their own.""", "stage s { prechamber a { turbine mlp  merge deepnorm alpha=1.5 }  prechamber b { turbine mlp  merge deepnorm alpha=3 } }")
def deepnorm_alphas_differ(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    """DeepNet scales the residual stream by one alpha at every merge of a block; the built stage holds
    one `alpha`. Branches of one stage that ask for different ones would silently take the first's."""
    out, seen = [], set()
    for s in stages(e):
        first = None
        for b in ir.stage_branches(s):
            m = b.merge
            if not isinstance(m, ir.DeepnormMerge):
                continue
            if first is None:
                first = (b, m)
                continue
            if m.alpha == first[1].alpha:
                continue
            key = (m.span.file, m.span.line, m.span.column) if m.span is not None else id(b)
            if key in seen:
                continue
            seen.add(key)
            out.append(Diagnostic("E0303", "error", f"prechamber '{b.name}' merges with DeepNorm alpha {m.alpha:g}, but prechamber "
                                  f"'{first[0].name}' of the same stage '{s.name}' with alpha {first[1].alpha:g}", m.span,
                                  "give the stage's DeepNorm merges one alpha (or leave it out: (2N)^(1/4)), or put the branches in stages "
                                  "of their own", ("DeepNet scales the residual stream by one alpha at every merge of a block",)))
    return out


# --- N101: detached branch --------------------------------------------------------------------


@rule("N101", "detached branch", """
A detached prechamber reads the chamber but passes no gradient back through its
input: an open cycle, like a gas generator whose turbine exhausts to ambient and
feels nothing of the chamber's pressure. The note lists the parameters upstream
that lose the path through this branch (they still learn through the main line)
and the branch's own parameters, which still learn through its merge or its loss.
Easier to control, but the exhaust's energy is not recovered: the branch never
shapes what it reads.""", "prechamber critic detach { norm layernorm  turbine mlp ratio=2  merge cooling }")
def detached_branch(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    ps = list(parts(e))
    seen = set()
    for p in ps:
        b = p.branch
        if b is None or id(b) in seen or not b.detach or is_dead(b):
            continue
        seen.add(id(b))
        upstream = _upstream_names(ps, p)
        own = sum(q.params for q in ps if q.branch is b) * p.repeat
        trained = "its own loss" if b.overboard else "its merge"
        notes = [f"cut: no gradient from '{b.name}' reaches {', '.join(upstream)}" +
                 ("" if b.overboard else "; they still learn through the main line"),
                 f"still trained: the branch's own {own:,} parameters, through {trained}"]
        out.append(_n("N101", f"prechamber '{b.name}' is detached: its input passes no gradient back (an open cycle)", b.span,
                      "drop 'detach' to close the cycle, if the branch should shape what it reads", notes))
    return out


def _upstream_names(ps: list[Part], at: Part) -> list[str]:
    names: list[str] = []
    for q in ps:
        if q.stage_index > at.stage_index or q.group == at.group:
            break
        if q.branch is not None and q.branch.overboard:
            continue
        if q.stage_index == at.stage_index and at.fullflow is not None and q.fullflow is at.fullflow and q.branch is not None:
            continue  # a parallel branch reads the same state; it is not upstream
        label = q.group  # a folded path names its range of instances
        if label not in names:
            names.append(label)
    if at.repeat > 1:
        names.append(f"the earlier instances of stage '{at.stage.name}'")
    return names


# --- W103, W104: MoE without trim or orifices ---------------------------------------------------


@rule("W103", "mixture of experts with no balance loss", """
A hard-routed mixture of experts is a liquid-liquid injector: mixing is uneven by
nature. Without the mixture trim, a load-balancing auxiliary loss (`balance=0.01`,
as in the Switch Transformer), the router keeps sending tokens to the experts it
already prefers; a few run hot, the rest starve and never learn. A correction bias
turned each step (`correction=true correction_rate=0.001`, DeepSeek-V3's
auxiliary-loss-free balancing) trims the injection too, and silences the rule.""", "turbine moe experts=8 top=2 capacity=1.25 hidden=512")
@rule("W104", "mixture of experts with no capacity factor", """
With no restrictor orifice (`capacity=`), one expert may receive every token of a
batch: its compute and memory spike and the batch is as slow as that expert. A
capacity of 1.25 lets each expert take a quarter more than an even share and drops
the overflow to the residual line. Dropless implementations route every token by
design; silence the rule there with `# allow: W104`.""", "turbine moe experts=8 top=2 balance=0.01 hidden=512")
def moe_injection(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        m = p.node
        if not isinstance(m, ir.Moe) or m.experts < 2 or m.top >= m.experts:
            continue
        if m.balance == 0 and not m.correction_rate:  # the correction's trim balances without a loss (DeepSeek-V3)
            out.append(_w("W103", f"a mixture of {m.experts} experts with no load-balancing loss", m.span,
                          "add balance=0.01 (the Switch Transformer's auxiliary loss)",
                          ["without a trim the router favours the experts it already favours; a few run hot, the rest starve"]))
        if m.capacity is None:
            out.append(_w("W104", f"a mixture of {m.experts} experts with no capacity factor", m.span,
                          "add capacity=1.25 to cap each expert's share of the tokens (or allow this rule for a dropless implementation)",
                          ["with no restrictor orifice one expert may take every token of a batch, and its memory with it"]))
    return out
