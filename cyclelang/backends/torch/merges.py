"""One emitter per kind of merge: its own parameters, its junction, its init rule.

What a merge multiplies is the kinds table's (`ir.kinds.gain`: a fixed value, a learned
parameter and its name, a scaled main line, a gate); the attribute of a merge's own
parameters is its kind's first field (`scale`, `gate`), as in the layout's paths.
"""

from __future__ import annotations

from ... import ir
from ...ir.kinds import gain, kind_of
from .emitters import emitter, lookup
from .plan import BranchPlan
from .writer import num


class MergeEmitter:
    """A merge without parameters or init rule: x + f(x)."""

    module = ""  # the class of its own parameters, for the name map ("" when it has none)

    def attr(self, m) -> str:
        return kind_of(m).fields[0]

    def ctor(self, m, width: int) -> str | None:
        """`self.{attr} = ...` in the branch's __init__ (with its comment), or None."""
        return None

    def delta(self, m, attr: str, f: str) -> str:
        """The branch's contribution to the chamber, given the call f of the branch at `attr`."""
        return f

    def main(self, m) -> str | None:
        """What the main line's x is multiplied by at the junction, None for 1."""
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

    def ctor(self, m, width):
        if isinstance(m, ir.RezeroMerge):
            return f"nn.Parameter(torch.full((), {num(m.init)}))  # ReZero: the branch starts closed"
        return f"nn.Parameter(torch.full(({num(width)},), {num(m.init)}))  # LayerScale: per channel"

    def delta(self, m, attr, f):
        return f"self.{attr}.{gain(m).learned} * {f}"


class GateEmitter(MergeEmitter):
    module = "nn.Linear"

    def ctor(self, m, width):
        return f"nn.Linear({num(width)}, {num(width)})  # highway gate; bias starts at {num(m.bias)}"

    def delta(self, m, attr, f):
        return f"torch.sigmoid(self.{attr}.{self.attr(m)}(x)) * ({f} - x)"

    def init(self, m, b, pre):
        return [f"nn.init.constant_({pre}.{self.attr(m)}.bias, {num(m.bias)})  # the gate starts mostly shut"]


class CoolingEmitter(MergeEmitter):
    def init(self, m, b, pre):
        for o in reversed(b.ops):  # the branch's last op with an output projection
            lines = emitter(o.op).output_init(f"{pre}.{o.attr}", o.op, num(m.std))
            if lines is not None:
                return [f"# cooling: the output projection starts at {num(m.base)} / sqrt({m.merges}) (GPT-2's scaled init)", *lines]
        return []


class DeepnormEmitter(MergeEmitter):
    def main(self, m):
        return num(gain(m).main)

    def init(self, m, b, pre):
        out = [f"# deepnorm: v, the output projection and the reactor start with gain beta = (8N)^-1/4, N = {m.layers} (DeepNet)"]
        for o in b.ops:
            out += emitter(o.op).deepnorm_init(f"{pre}.{o.attr}", o.op, num(m.beta))
        return out


MERGE_EMITTERS: dict[type, MergeEmitter] = {
    ir.PlainMerge: MergeEmitter(),
    ir.ScaleMerge: ScaleEmitter(),
    ir.CoolingMerge: CoolingEmitter(),
    ir.RezeroMerge: LearnedGainEmitter(),
    ir.LayerscaleMerge: LearnedGainEmitter(),
    ir.DeepnormMerge: DeepnormEmitter(),
    ir.GateMerge: GateEmitter(),
}


def merge_emitter_for(cls: type) -> MergeEmitter:
    return lookup(MERGE_EMITTERS, cls)


def merge_emitter(m) -> MergeEmitter:
    return lookup(MERGE_EMITTERS, type(m))
