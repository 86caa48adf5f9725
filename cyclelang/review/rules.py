"""The design rules: each a pure function from an engine to diagnostics.

A spec can be valid and still unwise. These rules come from the article behind
cyclelang (each rule's rationale is the explanation on its decorator): keep the main line
unobstructed, cool the preburners of a deep engine, recover every exhaust, trim
the injection of a mixture of experts, and know where the throat is.

Every rule returns warnings or notes with a stable code, except a dead branch,
which is an error (its parameters can never learn). `review(spec)` runs them all
and returns the diagnostics sorted by position.

A rule is registered by its decorator, `@rule(code, title, explanation, example)`, one per
code it may emit: the code, its title and what `cyclec explain` prints live on the rule and
go into `cyclelang.codes.CODES` from there.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable

from .. import codes, ir
from ..diagnostics import Diagnostic
from ..ir.kinds import OPS, Gain, gain, kind_of, output_projection
from .report import DTYPE_BYTES, _bytes, _state_bytes, decode_state_bytes, recurrent_kinds
from .walk import Part, groups, is_dead, merges_into_main_line, parts, stages



@dataclass(frozen=True)
class ReviewConfig:
    post_ln_depth: int = 12  # layers of Post-LN (or a plain stack) that count as deep
    deep_merges: int = 24  # merges into the main line that count as deep for cooling
    kv_note_bytes: int = 64 * 1024  # KV cache per token (2-byte values) from full multi-head attention worth a note
    pp: int = 1  # `cyclec check --pp N`: the pipeline split to weigh (W161)


Rule = Callable[["ir.Engine", ReviewConfig], list[Diagnostic]]
RULES: list[Rule] = []  # in the order they are defined
REVIEW_CODES: list[str] = []  # the codes the rules may emit, for the docs and `cyclec explain`


def rule(code: str, title: str, explanation: str, example: str = "") -> Callable[[Rule], Rule]:
    """Register the decorated function as a design rule that may emit `code`, explained once, here."""
    def register(fn: Rule) -> Rule:
        codes.add(code, title, explanation, example)
        REVIEW_CODES.append(code)
        if fn not in RULES:
            RULES.append(fn)
        return fn
    return register


def _w(code, message, span, help=None, notes=()) -> Diagnostic:
    return Diagnostic(code, "warning", message, span, help, tuple(notes))


def _n(code, message, span, help=None, notes=()) -> Diagnostic:
    return Diagnostic(code, "note", message, span, help, tuple(notes))


def _blocks(e: ir.Engine) -> list[ir.Stage]:
    return [s for s in stages(e) if ir.stage_branches(s)]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


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


# --- N102: the throat of the main line ---------------------------------------------------------


@rule("N102", "narrowest width on the main line", """
A linear at stage or engine level narrows the main line below the chamber's width.
Like a nozzle's throat, the narrowest section sets the flow: no more numbers per
position pass it than its width, whatever the widths after it. The note says where
the throat is; it is a fact about the design, not a fault.""", "stage squeeze { turbine linear out=64 }")
def narrowest_width(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    narrowest, where = e.width, None
    for p in parts(e):
        if p.branch is not None or p.role in ("feed", "nozzle", "merge"):
            continue  # a branch's width is its own; the main line's is what the ops on it leave
        w = p.kind.out_width(p.node, p.width)
        if w < narrowest:
            narrowest, where = w, p.node
    if where is None:
        return []
    return [_n("N102", f"the main line narrows to width {narrowest} here, from a chamber of {e.width}: the throat of this engine", where.span,
               None, [f"whatever comes after, no more than {narrowest} numbers per position pass this point"])]


# --- W105: rotary on an odd head ---------------------------------------------------------------


@rule("W105", "rotary positions on an odd head", """
Rotary embeddings turn the dimensions of a head in pairs. With an odd head_dim one
dimension is never turned, so it carries no position, and a fraction of the head
rounds down further than asked. Choose heads (or head_dim=) so each head has an
even number of dimensions.""", "chamber width=195 ... turbine attention heads=3 rotary")
def rotary_odd_head(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if isinstance(a, ir.Attention) and a.rotary_dims > 0 and a.head_dim % 2:
            out.append(_w("W105", f"rotary positions on an odd head_dim {a.head_dim}: only {a.rotary_dims} of its dimensions turn", a.span,
                          "choose heads (or head_dim=) so that each head has an even number of dimensions",
                          ["rotary turns dimensions in pairs, so the odd one out never carries position"]))
    return out


# --- W106: a window that never slides -----------------------------------------------------------


@rule("W106", "sliding window at least as long as the context", """
A sliding window of the context's length or more never slides: the attention is
full attention with the cost of a window mask. Drop `window=`, or make it shorter
than the context if the point was to bound the KV cache.""", "feed tokens vocab=32000 context=2048 ... turbine attention heads=8 window=4096")
def window_over_context(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if isinstance(a, ir.Attention) and a.window is not None and a.window >= e.feed.context:
            out.append(_w("W106", f"a sliding window of {a.window} tokens over a context of {e.feed.context}: it never slides", a.span,
                          f"drop window=, or make it smaller than the context ({e.feed.context})"))
    return out


# --- W107: a deep plain stack -------------------------------------------------------------------


@rule("W107", "deep plain stack", """
Turbines work in series on the main line with no prechamber around them, twelve
layers or more: a pressure-fed engine. With no residual path the gradient passes
through every turbine on its way up, and it fades or explodes with depth. Put the
turbines in prechambers (`x = x + f(x)`), so the main line runs straight through.""", "stage layer x 12 { norm layernorm  turbine attention heads=4  norm layernorm  turbine mlp }")
def deep_plain_stack(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    def working(op) -> bool:  # a turbine that does work: a mixer or a reactor, not a projection
        return ir.is_turbine(op) and ir.kinds.kind_of(op).role in ("mixer", "reactor")

    plain = [s for s in stages(e) if not ir.stage_branches(s) and any(working(op) for op in s.ops)]
    layers = sum(s.repeat for s in plain)
    if layers < cfg.post_ln_depth:
        return []
    first = next(op for op in plain[0].ops if working(op))
    return [_w("W107", f"{_plural(layers, 'layer')} of turbines in series on the main line, with no branch to carry the flow around them", first.span,
               "put the turbines in prechambers (x = x + f(x)) so the main line runs straight through",
               ["with no residual path the gradient must pass every turbine on its way up, and it fades or blows up with depth"])]


# --- W108: no positions in a bidirectional engine ----------------------------------------------


@rule("W108", "no positions in a bidirectional engine", """
With an open throat and `position=none` and no rotary, nothing tells a position
where it is: attention without a mask treats the sequence as a bag of tokens and
cannot tell 'a b' from 'b a'. (A causal mask leaks order by itself, which is why
the rule is about open throats only.) Give the feed learned or sinusoidal
positions, or add rotary to the attention.""", "throat open  feed tokens vocab=1000 context=128 position=none")
def open_without_positions(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    if e.throat != "open" or e.feed.position != "none":
        return []
    ps = list(parts(e))
    if any(isinstance(p.node, ir.Attention) and p.node.rotary_dims or p.kind.mixes_positions and not isinstance(p.node, ir.Attention) for p in ps):
        return []  # rotary carries positions; a mixer that is not attention (pool) sees order by construction
    return [_w("W108", "no position information in an engine with an open throat", e.feed.span,
               "give the feed position=learned or sinusoidal, or add rotary to the attention",
               ["attention without a mask or positions treats the sequence as a bag: it cannot tell 'a b' from 'b a'"])]


# --- W109: no mixer -------------------------------------------------------------------------------


@rule("W109", "no mixer", """
No turbine mixes positions: there is no mixer (""" + ", ".join(dict.fromkeys(k.keyword for k in OPS if k.mixes_positions)) + """), so every token
is processed alone and the prediction at a position ignores all the others. An
engine can use many kinds of injector, but it cannot go without one.""", "stage block x 4 { prechamber burn { norm layernorm  turbine mlp } }")
def no_mixer(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    if any(p.kind.mixes_positions for p in parts(e)):
        return []
    mixers = list(dict.fromkeys(k.keyword for k in ir.kinds.OPS if k.mixes_positions))  # latent attention is attention's
    return [_w("W109", "no turbine mixes positions: every token is processed alone", e.span,
               "add a mixer: " + ", ".join(f"'turbine {m}'" for m in mixers[:-1]) + f" or 'turbine {mixers[-1]}'",
               [f"an engine needs an injector; only the mixers ({', '.join(mixers)}) carry information between positions"])]


# --- W110: Pre-LN with no final valve ------------------------------------------------------------


@rule("W110", "Pre-LN without a final norm", """
The stages keep their norms on the branches (Pre-LN), so the main line is never
normalised, and its norm grows with every merge. Without a norm on the main line
before the nozzle the head reads that growing stream unregulated. Add a norm after
the last stage (GPT-2's ln_f).""", "stage block x 12 { prechamber mix { norm layernorm ... } ... }  nozzle head")
def pre_ln_without_final_norm(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    last = e.body[-1] if e.body else None
    if isinstance(last, ir.Stage) and last.is_group:
        last = stages(e)[-1]  # the last layer a nested stage runs
    if not isinstance(last, ir.Stage) or not ir.stage_branches(last):
        return []
    if isinstance(last.ops[-1], ir.Norm) and last.ops[-1].type != "scalar":
        return []  # Post-LN: the stage ends with its own valve
    branches = [b for b in ir.stage_branches(last) if not b.overboard]
    shared = any(isinstance(op, ir.Fullflow) and op.norm is not None for op in last.ops)
    if not branches or not (shared or all(isinstance(b.ops[0], ir.Norm) for b in branches)):
        return []
    if all(isinstance(b.merge, ir.DeepnormMerge) for b in branches):
        return []
    return [_w("W110", "the main line reaches the nozzle without a norm, after Pre-LN stages", e.nozzle.span,
               "add a norm on the main line before the nozzle (GPT-2's ln_f)",
               ["with the valves on the branches, the chamber's norm grows stage after stage and the head reads it unregulated"])]


# --- N103: every head keeps its own K and V, and the cache is large -----------------------------


@rule("N103", "large KV cache with every head keeping its own K and V", """
In a causal engine every attention layer caches the keys and values of each past
token for decoding: layers x kv_heads x head_dim x 2 x 2 bytes per token at 16-bit
values. With `kv_heads` equal to `heads` (plain multi-head attention) each head keeps
its own pair, and once that reaches 64 KiB per token (the threshold of this note:
GPT-2 medium's 96 KiB is above it, GPT-2 small's 36 KiB below) the cache, not the
weights, is what limits batch size and context at inference, and every decoding step
reads all of it. Grouped-query attention (`kv_heads=heads/4`, say) or multi-query
attention (`kv_heads=1`) lets several heads share one K and V: the baffled injector,
where baffles group the injector elements so fewer feed passages serve the same
chamber. Quality usually moves little, and the cache shrinks by heads/kv_heads. The
note is a fact about the design; silence it with `# allow: N103` where full heads are
meant.""", "stage block x 24 { prechamber mix { ... turbine attention heads=16 ... } }   # width 1024")
def full_kv_cache(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    if e.throat != "causal":
        return []  # an open throat caches nothing
    mha_parts = [p for p in parts(e) if isinstance(p.node, ir.Attention) and p.node.kv_heads == p.node.heads > 1]
    mha = [(p.node, p.repeat) for p in mha_parts]

    def cache(n: int) -> int:
        return sum(p.kind.state(p.node, n) * p.repeat for p in mha_parts) * DTYPE_BYTES

    per_token = cache(1)
    if not mha or per_token < cfg.kv_note_bytes:
        return []
    layers = sum(r for _, r in mha)
    a = mha[0][0]
    shape = (f"{layers} layers x {a.kv_heads} kv_heads x {a.head_dim} x 2 x {DTYPE_BYTES} bytes"
             if all(x.kv_heads == a.kv_heads and x.head_dim == a.head_dim for x, _ in mha) else f"{_plural(layers, 'attention layer')}")
    n = e.feed.context
    seq = cache(n)
    g = a.heads // 4 if a.heads % 4 == 0 and a.heads >= 8 else 1  # a quarter of the heads, Llama 2's 64 -> 8 in spirit
    return [_n("N103", f"every head keeps its own K and V: the KV cache takes {_bytes(per_token)} per token ({shape})", a.span,
               (f"share K and V between heads (the baffled injector): kv_heads={g} (GQA) cuts the cache {a.heads // g}x, kv_heads=1 (MQA) {a.heads}x"
                if g > 1 else f"share K and V between heads (the baffled injector): kv_heads=1 (MQA) cuts the cache {a.heads}x, or choose heads with a divisor for GQA"),
               [f"at the full context of {n} tokens that is {_bytes(seq)} per sequence, read in full at every decoding step"]
               + _fixed_state_note(e, n))]


def _fixed_state_note(e: ir.Engine, n: int) -> list[str]:
    """For a hybrid: what its recurrent mixers keep beside the cache, which does not grow."""
    rec = recurrent_kinds(e)
    if not rec:
        return []
    fixed = decode_state_bytes(e, n) - _state_bytes(e, n, DTYPE_BYTES)
    return [f"its {' and '.join(rec)} mixers keep a fixed state of {_bytes(fixed)} per sequence whatever its length: only attention's cache grows"]



# --- W125: an attention scale far from 1/sqrt(head_dim) --------------------------------------------


@rule("W125", "attention scale far from 1/sqrt(head_dim)", """
`turbine attention scale=` sets the factor the attention logits q.k are multiplied by
(Granite's attention_multiplier, Gemma 2's query_pre_attn_scalar**-0.5). The usual
1/sqrt(head_dim) keeps the logits' spread near 1 whatever the head size. A scale eight
times larger (or smaller) than that starts the softmax nearly one-hot (or nearly
uniform): in engine terms an injector that fires through a few elements, or one that
mixes every position evenly so that nothing is attended. The warning fires at a factor
of 8 either way; Granite's 1/64 at head_dim 128 (5.7 times smaller) stays quiet.""",
     "turbine attention heads=4 scale=1.0   # width 256: head_dim 64, usual scale 0.125")
def attention_scale_far_off(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if not isinstance(a, ir.Attention) or a.scale is None:
            continue
        usual = a.head_dim ** -0.5
        ratio = a.scale / usual
        if ratio >= 8 or ratio <= 1 / 8:
            out.append(_w("W125", f"attention scale={a.scale:g} is {ratio:.3g} times 1/sqrt(head_dim) = {usual:.3g}", a.span,
                          "drop scale= for the usual 1/sqrt(head_dim), or bring it within a factor of 8 of it",
                          ["the logits' spread sets how peaked the softmax starts: far above, the injector fires through a few "
                           "elements and their gradients vanish; far below, every position is mixed evenly and nothing is attended"]))
    return out


# --- W126: a norm gain offset other than 0 or 1 ------------------------------------------------------


@rule("W126", "norm gain offset other than 0 or 1", """
`norm rmsnorm offset=c` computes the gain as c + w (Gemma: c = 1, so a stored weight
of 0 is the identity gain, and whatever shrinks weights toward 0 (weight decay,
quantisation, pruning) pulls the valve toward the identity). The weight starts at
1 - c, so the gain starts at 1 for any c; but with c other than 0 or 1 a shrunk weight
moves the valve toward the arbitrary setting c, and no checkpoint family stores its
norms that way. The same holds for `norm layernorm offset=c` (Nemotron's LayerNorm1P:
c = 1) and for attention's `qk_norm_offset=c` (Gemma 3's qk-norms: c = 1).""", "norm rmsnorm offset=0.5")
def norm_offset_unusual(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        n = p.node
        if isinstance(n, ir.Norm) and n.offset not in (0.0, 1.0):
            out.append(_w("W126", f"a norm gain offset of {n.offset:g}: a stored weight of 0 means a gain of {n.offset:g}", n.span,
                          "use offset=1 (Gemma: the gain is 1 + w, so a weight of 0 is the identity) or no offset",
                          ["the weight starts at 1 - offset so the gain starts at 1; any shrinkage of the weight (weight decay, "
                           "quantisation, pruning) then moves the valve toward an arbitrary setting, and no checkpoint family stores it so"]))
        if isinstance(n, ir.Attention) and n.qk_norm_offset not in (0.0, 1.0):
            out.append(_w("W126", f"a qk-norm gain offset of {n.qk_norm_offset:g}: a stored weight of 0 means a gain of {n.qk_norm_offset:g}",
                          n.span, "use qk_norm_offset=1 (Gemma 3: the gain is 1 + w) or no offset",
                          ["the weight starts at 1 - offset so the gain starts at 1; any shrinkage of the weight then moves the qk-norm "
                           "toward an arbitrary setting, and no checkpoint family stores it so"]))
    return out


# --- W127: a rotary scaling that changes nothing (or squeezes) ---------------------------------------


@rule("W127", "rotary scaling that changes nothing, or shrinks", """
A rotary scaling stretches positions past the pretraining context. With
`rotary_factor` of 1 or less it stretches nothing (or squeezes the positions, so the
engine sees each position as further than it was trained for); a dynamic, llama3 or
yarn scaling whose `rotary_original=` is at or past the feed's context never reaches
the positions it rescales for (dynamic: never triggers at all). Dynamic (NTK) scaling
over 2 rotated dims changes nothing either: it raises the base, and the one pair of 2
dims turns at base**0 = 1 whatever the base (transformers' exponent dims / (dims - 2)
divides by zero there; the built model keeps the plain tables). In engine terms a
re-orificed injector that delivers the design flow: extra parts for nothing.""",
     "feed tokens vocab=256 context=64 ... turbine attention heads=4 rotary rotary_scaling=dynamic rotary_factor=2")
def rotary_scaling_idle(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        sc = getattr(a, "rotary_scaling", None)
        if sc is None:
            continue
        if sc.factor <= 1:
            what = "stretches nothing" if sc.factor == 1 else "squeezes positions: each looks further than it was trained for"
            out.append(_w("W127", f"rotary_scaling={sc.type} with rotary_factor={sc.factor:g} {what}", a.span,
                          "a factor above 1 stretches the positions; or drop rotary_scaling=",
                          ["the factor is how many times the pretraining context the positions stretch over"]))
        elif sc.type == "dynamic" and a.rotary_dims == 2:
            out.append(_w("W127", "rotary_scaling=dynamic over 2 rotated dims changes nothing: their one pair turns at base**0 = 1, whatever the base", a.span,
                          "rotate at least 4 dims (more heads' dims, or a larger rotary= fraction), or use rotary_scaling=linear",
                          ["dynamic NTK stretches positions by raising the base by (factor n / original - factor + 1) ** (dims / (dims - 2)); "
                           "over 2 dims the exponent is unbounded and the only frequency does not depend on the base"]))
        elif sc.original is not None and sc.original >= e.feed.context:
            what = "never triggers" if sc.type == "dynamic" else "rescales for positions the engine never reaches"
            out.append(_w("W127", f"rotary_scaling={sc.type} from rotary_original={sc.original} {what}: the context is {e.feed.context}", a.span,
                          "set rotary_original= to the pretraining context, below the feed's context",
                          ["the scaling stretches positions past the original context; at or past the feed's context there are none"]))
    return out


# --- W128: a soft-cap low enough to flatten the logits ----------------------------------------------


@rule("W128", "soft-cap so low it flattens the logits", """
A soft-cap computes cap * tanh(z / cap): values well under the cap pass unchanged, and
none exceeds it. Gemma 2 caps attention logits at 50 and the final logits at 30. A cap
under 5 on the attention logits (under 2 on the final logits) squashes ordinary values:
softmax over logits bounded by +-cap cannot be much sharper than e^(2 cap) to 1, so
the attention cannot focus (the model cannot be confident). A relief valve set below
the working pressure vents all the time.""", "turbine attention heads=4 softcap=1")
def softcap_too_low(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    caps = [(p.node.softcap, 5.0, "attention logits", p.node.span) for p in parts(e) if isinstance(p.node, ir.Attention) and p.node.softcap is not None]
    if e.nozzle.softcap is not None:
        caps.append((e.nozzle.softcap, 2.0, "final logits", e.nozzle.span))
    for cap, low, what, span in caps:
        if cap < low:
            out.append(_w("W128", f"softcap={cap:g} bounds the {what} to +-{cap:g}: the softmax over them cannot be sharp", span,
                          f"Gemma 2 caps attention logits at 50 and final logits at 30; keep the cap at {low:g} or more",
                          ["cap * tanh(z / cap) passes values well under the cap unchanged and squashes the rest: "
                           "a relief valve set below the working pressure vents all the time"]))
    return out


# --- W129: ALiBi with a second position scheme ----------------------------------------------------


@rule("W129", "ALiBi beside another position scheme", """
`turbine attention alibi` tells each head where the keys are by a bias linear in the
distance; BLOOM, Falcon and MPT use it instead of any other position signal (no
rotary, `feed tokens position=none`). With rotary on the same attention, or learned or
sinusoidal positions on the feed, the engine gets two position signals that agree
within the training length and disagree past it, which is where ALiBi's extrapolation
is the reason to use it. Two injectors timing one chamber.""", "turbine attention heads=4 rotary alibi")
def alibi_with_other_positions(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if not isinstance(a, ir.Attention) or not a.alibi:
            continue
        other = "rotary positions" if a.rotary_dims else f"{e.feed.position} positions on the feed" if e.feed.position != "none" else None
        if other:
            out.append(_w("W129", f"ALiBi and {other} both tell this attention where tokens are", a.span,
                          "keep one: ALiBi alone (BLOOM, Falcon, MPT: no rotary, position=none), or drop alibi",
                          ["ALiBi's bias is meant to be the only position signal; with a second one the engine learns two that "
                           "disagree past the training length, which is where ALiBi's extrapolation was the point"]))
    return out


# --- W138: attention sinks in an open throat; W139: a clamped SwiGLU clamped under 1 (gpt-oss's options) ---------


@rule("W138", "attention sinks on bidirectional attention", """
`turbine attention sinks` gives each head a learned logit that joins every softmax's
denominator, so a query may attend to nothing (gpt-oss). It answers a causal problem:
a query must spread all of its attention over the keys it sees, and what it has
nowhere to put lands on the first tokens, which every query sees (the attention-sink
effect). A bidirectional query sees every token, itself included; there the sink only
thins what each head reads. A bleed valve on an injector that is never starved.""", "throat open ... turbine attention heads=4 sinks")
def sinks_open(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if isinstance(a, ir.Attention) and a.sinks and a.mask == "open":
            out.append(_w("W138", "attention sinks on bidirectional attention", a.span, "drop sinks, or make this attention causal",
                          ["a sink is where a causal query puts the attention it has nowhere to put (gpt-oss; without one it "
                           "lands on the first tokens, which every query sees); a bidirectional query sees every token, "
                           "itself included, and the sink only thins what it reads"]))
    return out


@rule("W139", "clamped SwiGLU clamped under 1", """
`act=swiglu_clamp` (gpt-oss's experts) caps the gate at `clamp` and holds up within
+-clamp before they meet as gate·σ(1.702·gate)·(up + 1). gpt-oss clamps at 7, where
only outliers are cut. Under 1 every hidden unit is bounded by clamp·(clamp + 1), most
units are clamped, and a clamped unit passes no gradient: the reactor hardly reacts.
A pressure limiter set below the working pressure.""", "turbine moe experts=8 act=swiglu_clamp clamp=0.5")
def clamp_under_one(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        m = p.node
        if isinstance(m, (ir.Mlp, ir.Moe)) and m.act == "swiglu_clamp" and m.clamp < 1.0:
            out.append(_w("W139", f"clamp={m.clamp:g} bounds the clamped SwiGLU's gate and up under 1", m.span,
                          "gpt-oss clamps at 7 (swiglu_limit); raise clamp=",
                          [f"every hidden unit then lies under {m.clamp * (m.clamp + 1):g} in size: the reactor barely reacts, and "
                           "the gradient of every clamped unit is 0"]))
    return out


# --- W111: a mixture that routes every token to every expert ----------------------------------


@rule("W111", "mixture of experts with top equal to experts", """
A mixture of experts earns its keep by sparsity: each token visits a few experts,
so the engine holds many experts' parameters but pays for only `top` of them per
token. With `top` equal to `experts` every token runs through every expert: the
compute is that of one mlp `experts` times as wide, the router only reweighs outputs
that were all computed anyway, and the capacity and balance machinery guard against
an imbalance that cannot happen. In engine terms it is a multi-element injector whose
elements are all wide open on every cycle: the plumbing of a throttleable injector
with none of the throttling. Route each token to one or two experts (Switch,
Mixtral), or write one `turbine mlp` if the dense compute is what you want.""",
     "turbine moe experts=4 top=4 capacity=1.25 balance=0.01 hidden=512")
def moe_without_sparsity(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        m = p.node
        if isinstance(m, ir.Moe) and m.top >= m.experts:
            out.append(_w("W111", f"top={m.top} of {_plural(m.experts, 'expert')}: every token visits every expert, so nothing is sparse", m.span,
                          "route each token to a few experts (top=1 or top=2), or use one 'turbine mlp' if the dense compute is meant",
                          [f"each token pays for {_plural(m.experts, 'expert')} of compute, and the router only reweighs outputs that are all computed anyway"]))
    return out


# --- W140: a short conv of one tap ------------------------------------------------------------


@rule("W140", "short conv that mixes no positions", """
A short gated convolution (`turbine short_conv`) of size 1 convolves each channel of
B·x with its own position alone: the layer is C·(w·B·x), a gated unit at each
position, and no position reads another. It is built as written, but the mixer in
that prechamber mixes nothing; LFM2's layers use 3 taps (conv_L_cache). In engine
terms: a pintle injector with no stroke.""",
     "turbine short_conv size=1")
def short_conv_without_mixing(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        c = p.node
        if isinstance(c, ir.ShortConv) and c.size == 1:
            out.append(_w("W140", "a short conv of size 1: each position is convolved with itself alone, so no positions mix", c.span,
                          "size=3 (LFM2's conv_L_cache) or more",
                          ["the layer is C·(w·B·x) at each position: a gated unit, not a mixer"]))
    return out


# --- W112: legal but unwise values -------------------------------------------------------------


@rule("W112", "unwise value", """
A value inside its range (outside it is E0205) that is still unlikely to be meant: a
learning rate of 1 or more, weight decay of 1 or more, dropout of one half or more, an
init std of 1 or more or below 1e-6 (the products of weights underflow), a merge scale above 1 (it heats the branch instead of cooling it),
a gate bias beyond 10 (the gate starts saturated and barely learns), a balance weight of 1
or more. Each is legal; each usually makes a model that diverges or learns nothing.""",
     "startup { schedule constant lr=3 }")
def unwise_values(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    """Values inside their ranges (E0205 guards those) that are still unlikely to be meant."""
    out = []
    st = e.startup
    if st is not None:
        where = st.schedule.span or st.span or e.span
        if st.schedule.lr >= 1:
            out.append(_w("W112", f"a learning rate of {st.schedule.lr:g}: AdamW steps of that size throw the weights far from anything learned", where,
                          "transformers train at 1e-4 to 1e-3 (small models up to about 1e-2)"))
        if st.decay >= 1:
            out.append(_w("W112", f"weight decay {st.decay:g}: each step shrinks every weight by lr x {st.decay:g}, which outpulls the gradient", st.span or e.span,
                          "AdamW's decay is usually 0.01 to 0.1"))
        if st.init.kind == "normal" and st.init.std >= 1:
            out.append(_w("W112", f"init std {st.init.std:g}: weights this large saturate every activation and blow up the chamber's norm at the first stage", st.init.span or st.span or e.span,
                          "transformers start at std 0.02 (or 1/sqrt(width))"))
        if st.init.kind == "normal" and st.init.std < 1e-6:
            out.append(_w("W112", f"init std {st.init.std:g}: weights this small start every matrix at about zero, so the logits hardly depend on the "
                          "input and the products of weights (attention scores, gradients) underflow in fp32", st.init.span or st.span or e.span,
                          "transformers start at std 0.02 (or 1/sqrt(width))"))
    if e.feed.dropout >= 0.5:
        out.append(_w("W112", f"feed dropout {e.feed.dropout:g} drops most of every embedding", e.feed.span, "dropout is usually 0 to 0.3"))
    for p in parts(e):
        node = p.node
        rate = getattr(node, "dropout", None)
        if isinstance(rate, float) and rate >= 0.5 and node is not e.feed:
            out.append(_w("W112", f"dropout {rate:g} at {p.path}: most of the branch's output is thrown away on every training step", node.span,
                          "dropout is usually 0 to 0.3"))
        if isinstance(node, ir.ScaleMerge) and abs(node.value) > 1:
            out.append(_w("W112", f"merge scale={node.value:g} amplifies every branch it returns: the chamber's norm grows by that factor per merge", node.span,
                          "scale below 1 cools a branch; above 1 it heats it"))
        if isinstance(node, ir.GateMerge) and abs(node.bias) > 10:
            out.append(_w("W112", f"gate bias={node.bias:g}: the sigmoid starts saturated at {'1' if node.bias > 0 else '0'}, so the gate learns almost nothing", node.span,
                          "the highway default is -1; keep |bias| below about 5"))
        if isinstance(node, ir.Moe) and node.balance >= 1:
            out.append(_w("W112", f"balance={node.balance:g}: the load-balancing loss outweighs the language-modelling loss", node.span,
                          "the Switch Transformer uses 0.01"))
        if isinstance(node, ir.Moe) and node.correction_rate >= 0.1:
            out.append(_w("W112", f"correction_rate={node.correction_rate:g}: each step moves the selection bias by that much, and "
                          f"{node.router} scores lie in (0, 1): the choice follows the trim, not the router", node.span,
                          "DeepSeek-V3 uses 0.001"))
    return out


# --- W130, W131: the engine at initialisation, followed from the feed to the logits ----------------
#
# The model is built in float32, so a value the spec writes is the float32 it rounds to: a gain
# of 1e-50 is 0 there, and a scale of 1e39 is inf. The walk follows what the main line carries
# at initialisation, in four states: it depends on the tokens (DEP), it does not (CONST), it
# is exactly 0 (ZERO, a CONST), or it is NaN. Only what holds whatever the random weights are
# is decided: a zero gain, a layernorm over one channel (x - mean(x) is 0: it outputs its bias),
# a norm whose epsilon is 0 in float32 reading a zero vector (0 / sqrt(0)), an infinite logit
# scale. Magnitudes that overflow only through the product of many layers' random weights are
# not decided here (W112 warns on the values that make them likely).

DEP, CONST, ZERO, NAN = "depends", "constant", "zero", "nan"


def f32(v: float) -> float:
    """The float32 the built model holds for v: 0 below half the smallest subnormal, inf above its max."""
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _join(*states: str) -> str:
    """A sum's state: NaN wins, then a term that depends, then all zero."""
    if NAN in states:
        return NAN
    if DEP in states:
        return DEP
    return ZERO if all(s == ZERO for s in states) else CONST


class _Flow:
    """The main line's state through the engine; the first place it stops depending on the
    tokens (`cut`) and the first NaN (`nan`), each (span, reason)."""

    def __init__(self, e: ir.Engine):
        self.e = e
        self.cut: tuple | None = None
        self.nan: tuple | None = None

    def _at(self, before: str, after: str, span, cut: str, nan: str) -> str:
        if after == NAN and before != NAN and self.nan is None:
            self.nan = (span, nan)
        if before == DEP and after != DEP and after != NAN and self.cut is None:
            self.cut = (span, cut)
        return after

    def op(self, op, s: str) -> str:
        """One operator applied to a flow in state s (on the main line or in a branch)."""
        if s == NAN:
            return NAN
        if isinstance(op, ir.Norm):
            eps0 = f32(op.eps) == 0
            single = op.type == "layernorm" and op.width == 1
            if single or s == ZERO:
                why = "a layernorm over 1 channel: x - mean(x) is 0" if single else "it reads a zero vector"
                after = NAN if eps0 else ZERO
                return self._at(s, after, op.span, f"{why}, so it outputs its bias whatever the input",
                                f"{why} and its eps={op.eps:g} is 0 in float32: 0 / sqrt(0 + 0) is NaN")
            return s
        if isinstance(op, ir.Pool):
            return s  # the mean of zeros minus zero: a pool keeps every state
        return CONST if s == ZERO else s  # a turbine of a zero vector: its biases (zero at init, a conv's not)

    def _branch_zero(self, b: ir.Prechamber) -> str | None:
        """Why the branch's contribution is exactly 0 at init, whatever it computes; None if it is not."""
        m = b.merge
        if isinstance(m, ir.ScaleMerge) and f32(m.value) == 0:
            return f"'merge scale={m.value:g}'"
        if isinstance(m, (ir.RezeroMerge, ir.LayerscaleMerge)) and f32(m.init) == 0:
            return f"'merge {ir.kinds.kind_of(m).keyword}' starting at {m.init:g}"
        if isinstance(m, ir.CoolingMerge) and f32(m.std) == 0 and output_projection(b.ops) is b.ops[-1]:
            return f"'merge cooling' with std {m.std:g} (0 in float32)"
        if isinstance(m, ir.DeepnormMerge) and f32(m.beta) == 0 and output_projection(b.ops) is b.ops[-1]:
            return f"'merge deepnorm' with beta={m.beta:g} (0 in float32)"
        return None

    def junction(self, branches: list, x: str, inp: str, alpha: float | None, span) -> str:
        """x = alpha * x + the branches' contributions (each reading `inp`)."""
        terms, zeros = [], []
        for b in branches:
            t = inp
            for op in b.ops:
                t = self.op(op, t)
            why = self._branch_zero(b)
            if why is not None and t != NAN:
                zeros.append(f"prechamber '{b.name}' by {why}")
                t = ZERO
            terms.append(t)
        main = x
        if alpha is not None and f32(alpha) == 0 and x != NAN:
            main = ZERO
        after = _join(main, *terms)
        cut = "the main line is multiplied by DeepNorm's alpha=" + f"{alpha:g} (0 in float32)" if main != x else "the main line stops here"
        if zeros:
            cut += ("; the branches start at zero: " if len(zeros) > 1 else "; the branch starts at zero: ") + ", ".join(zeros)
        return self._at(x, after, span, cut, "a branch is NaN at init")

    def stage(self, st: ir.Stage, x: str) -> str:
        if st.is_group:
            for sub in st.ops:
                x = self.stage(sub, x)
            return x
        alpha = next((b.merge.alpha for b in ir.stage_branches(st) if isinstance(b.merge, ir.DeepnormMerge)), None)  # the stage's one self.alpha
        for op in st.ops:
            if isinstance(op, ir.Prechamber):
                if not op.overboard:
                    x = self.junction([op], x, x, alpha if isinstance(op.merge, ir.DeepnormMerge) else None, op.merge.span or op.span)
            elif isinstance(op, ir.Fullflow):
                inp = self.op(op.norm, x) if op.norm is not None else x
                merged = [b for b in op.branches if not b.overboard]
                if merged:
                    deep = any(isinstance(b.merge, ir.DeepnormMerge) for b in merged)
                    x = self.junction(merged, x, inp, alpha if deep else None, op.span)
            else:
                x = self.op(op, x)
        return x

    def run(self) -> str:
        e = self.e
        f = e.feed
        x = DEP
        if f32(f.scale) == 0:
            x = self._at(x, ZERO if f.position == "none" else CONST, f.span,
                         f"feed scale={f.scale:g} is 0 in float32: every token embeds to zero", "")
        for op in e.body:
            x = self.stage(op, x) if isinstance(op, ir.Stage) else self.op(op, x)
        z = e.nozzle
        if math.isinf(f32(z.scale)) and x != NAN:
            return self._at(x, NAN, z.span, "", f"nozzle scale={z.scale:g} is inf in float32: the logits are inf or NaN")
        if f32(z.scale) == 0:
            return self._at(x, ZERO, z.span, f"nozzle scale={z.scale:g} is 0 in float32: every logit is 0", "")
        return x


@rule("W131", "NaN or inf at initialisation", """
A value the spec writes rounds, in float32, to something that makes the first forward
pass NaN, whatever the random weights are: a logit scale above float32's largest value
(3.4e38) is inf, and inf times the logits is inf or NaN; a norm whose eps is 0 in
float32 (below about 1e-45) divides 0 by sqrt(0) when it reads a zero vector, which a
layernorm over one channel always does (x - mean(x) is 0), as does a norm reading a
main line whose embeddings were scaled to 0. Only what holds for any weights is
decided here; overflow through the product of many layers' random weights is not.""",
     "stage s { turbine linear out=1  norm layernorm eps=1e-50 } ...")
@rule("W130", "logits independent of the input at initialisation", """
Followed from the feed to the nozzle, the engine at initialisation stops carrying the
tokens somewhere: every path passes a gain that is 0 in float32 (the model's dtype: a
`scale=1e-50` is 0 there) or a layernorm over one channel (x - mean(x) is 0, so it
outputs its bias whatever it reads). Typical: a junction whose main line DeepNorm's
alpha multiplies away while every branch into it starts at zero (rezero's 0, a zero
scale, a beta of 0), a feed or nozzle scale that rounds to 0, a chamber of width 1
under a layernorm. Every token then gets the same logits, and the gradient reaches
nothing before the cut through the main line. In engine terms: the feed lines are
closed, and the nozzle exhausts whatever the igniter left in the chamber.""",
     "chamber width=1 ... norm layernorm  nozzle head")
def init_flow(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    flow = _Flow(e)
    end = flow.run()
    out = []
    if end == NAN and flow.nan is not None:
        span, why = flow.nan
        out.append(_w("W131", f"the engine is NaN at initialisation: {why}", span or e.span,
                      "keep eps at 1e-12 or more, a layernorm over more than one channel, and every scale within float32 (1e-38 to 3e38)",
                      ["the model runs in float32: the value written here rounds to 0 or inf there, and every logit and gradient after it is NaN"]))
    elif end != DEP and flow.cut is not None:
        span, why = flow.cut
        out.append(_w("W130", f"the logits do not depend on the input at initialisation: {why}", span or e.span,
                      "keep a path from the feed to the nozzle that starts open: a main line no gain multiplies away, or a branch that starts above zero",
                      ["every token then gets the same prediction, and no gradient reaches the feed through the main line: what comes before "
                       "this point cannot learn from the first steps (or ever, for a layernorm over one channel)"]))
    return out


# --- N110: a nested stage that adds nothing -----------------------------------------------------


@rule("N110", "a nested stage that adds nothing", """
A stage of stages that runs once and holds one stage is the same engine as that
stage written on its own: the nesting adds a level to every path and a class to
the generated model, and says nothing. Nesting pays off when a pattern of several
stages repeats (`stage group x 4 { stage ssm_layer x 3 {...} stage attn_layer {...} }`).""",
     "stage wrapper { stage block x 12 { prechamber mix { norm layernorm  turbine attention heads=4 } } }")
def needless_nesting(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for g in groups(e):
        if g.repeat == 1 and len(g.ops) == 1:
            (inner,) = g.ops
            out.append(_n("N110", f"stage '{g.name}' runs its one stage '{inner.name}' once: the nesting adds nothing", g.span,
                          f"write stage '{inner.name}' in its place" + (f" (x {inner.repeat})" if inner.repeat > 1 else ""),
                          ["a stage of stages pays off when it repeats a pattern of several stages, e.g. stage group x 4 { stage a x 3 {...} stage b {...} }"]))
    return out


# --- W160: hyper-connections whose static reads leave streams unread ----------------------------


@rule("W160", "streams no branch reads at init", """
In a chamber of several streams (`chamber streams=N connections=hyper`) branch k starts
reading stream k mod N, as Zhu et al. (2024) start layer k, and writes every stream. An
engine of fewer branches than streams leaves the streams past the last branch unread at
initialisation: they start as copies of the others and only the learned mixing can ever
make them differ, so they widen the chamber by their cost (N x N mixing per junction)
and add nothing at the start. Fewer streams, or more layers, make every stream a chamber
that some branch reads. A manifold connection (mHC) reads every stream at init.""",
     "chamber width=64 streams=8 connections=hyper\n  stage block x 2 { prechamber mix {...}  prechamber burn {...} }")
def streams_never_read(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    hyper = ir.chamber_streams(e.body)
    if hyper is None or hyper.connections != "hyper":
        return []
    branches = sum(n * sum(not b.overboard for b in st.branch_list()) for st, n in ir.leaf_stages(e.body))
    if branches >= hyper.streams:
        return []
    first = next(iter(ir.leaf_stages(e.body)))[0]
    return [_w("W160", f"{hyper.streams} streams, but only {branches} branch{'' if branches == 1 else 'es'} read them: streams {branches} to {hyper.streams - 1} "
                       "start unread", first.span,
               f"use streams={max(1, branches)} or fewer, or connections=manifold (its reads start on every stream)",
               [f"branch k starts reading stream k mod {hyper.streams} (Zhu et al. 2024); an unread stream starts as a copy of the others"])]


# --- W161: a pipeline split with one piece well over the mean -----------------------------------


@rule("W161", "unbalanced pipeline split", """
With `--pp N` (`cyclec check --pp N`, `cyclec train --pp N`) the engine's stage instances are
split into N pieces that run one after another on N ranks, the feed with the first piece and
the nozzle with the last; the split is the one whose costliest piece is cheapest, by the
kinds table's FLOPs. Every rank waits for the slowest piece at every microbatch, so a piece
well over the mean (more than 1.3x) leaves the others idle for the difference: few, uneven
stage instances (a large nozzle beside a handful of blocks, a heavy attention layer among
light ones) cannot be split evenly at instance boundaries. Fewer pieces, more (smaller) stage
instances, or a cheaper nozzle even it out; `cyclec check --report --pp N` prints the split.""",
     "stage block x 4 {...}   # cyclec check --pp 4: the last piece also carries the nozzle")
def pipeline_imbalance(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    from . import split

    if cfg.pp <= 1:
        return []
    try:
        pieces = split.split(e, cfg.pp)
    except split.SplitError as why:
        return [_w("W161", f"--pp {cfg.pp}: {why}", e.span, f"use --pp {sum(u.stage is not None for u in split.units(e)[0])} or fewer")]
    ratio, worst = split.imbalance(pieces)
    if ratio <= split.IMBALANCE:
        return []
    mean = sum(p.flops for p in pieces) / len(pieces)
    return [_w("W161", f"--pp {cfg.pp}: piece {worst.index} costs {ratio:.2f}x the mean of the {cfg.pp} pieces "
                       f"({worst.flops:,} against {mean:,.0f} FLOPs per token)", e.span,
               "use fewer pipeline pieces or more, smaller stage instances; `cyclec check --report --pp N` prints the split",
               [f"piece {p.index}: {p.flops:,} FLOPs per token" for p in pieces])]


def review(spec: ir.Spec, config: ReviewConfig = ReviewConfig()) -> list[Diagnostic]:
    """Every design-rule diagnostic of a spec, sorted by position."""
    if spec.engine is None:
        return []
    out: list[Diagnostic] = []
    with ir.layout.held(spec.engine):  # every rule walks the same parts
        for rule in RULES:
            out.extend(rule(spec.engine, config))
    return sorted(out, key=Diagnostic.sort_key)
