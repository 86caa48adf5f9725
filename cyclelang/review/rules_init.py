"""Design rules on the engine at initialisation (its flow followed from the feed to the logits:
W130, W131), needless nesting, and hyper-connections' unread streams.
"""

from __future__ import annotations

import math
import struct

from .. import ir
from ..diagnostics import Diagnostic
from ..ir.kinds import output_projection
from .registry import ReviewConfig, _n, _w, rule
from .walk import groups


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

    def stage(self, st: ir.Stage, x: str) -> str:  # a stage of ops
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
            if not isinstance(op, ir.Stage):
                x = self.op(op, x)
            for v in ir.walk([op]):  # a group's stages in turn, each once
                x = x if v.stage.is_group else self.stage(v.stage, x)
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
