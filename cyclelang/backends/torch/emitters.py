"""The op emitters' table, keyed by IR class (the merges' is `merges.MERGE_EMITTERS`).

Like sqlglot's Generator, a kind the table lacks fails with the IR class's name; a
test holds both tables to `ir.OP_TYPES` and `ir.MERGE_TYPES`.
"""

from __future__ import annotations

from typing import TypeVar

from ... import ir
from ...ir.kinds import registered
from .attention import AttentionEmitter
from .conv import ConvEmitter
from .delta import GatedDeltaEmitter
from .mla import LatentAttentionEmitter
from .moe import MoeEmitter
from .ops import LinearEmitter, MlpEmitter, NormEmitter, OpEmitter, PoolEmitter
from .recurrent import LinearAttentionEmitter, Mamba1Emitter, SsmEmitter
from .short_conv import ShortConvEmitter

E = TypeVar("E")

EMITTERS: dict[type, OpEmitter] = {
    ir.Norm: NormEmitter(),
    ir.Attention: AttentionEmitter(),
    ir.LatentAttention: LatentAttentionEmitter(),
    ir.Mlp: MlpEmitter(),
    ir.Moe: MoeEmitter(),
    ir.Pool: PoolEmitter(),
    ir.Conv: ConvEmitter(),
    ir.Ssm: SsmEmitter(),
    ir.LinearAttention: LinearAttentionEmitter(),
    ir.Mamba1: Mamba1Emitter(),
    ir.ShortConv: ShortConvEmitter(),
    ir.Linear: LinearEmitter(),
    ir.GatedDelta: GatedDeltaEmitter(),
}


registered(EMITTERS, "cyclelang/backends/torch/emitters.py EMITTERS", ir.OP_TYPES)


def lookup(table: dict[type, E], cls: type) -> E:
    """The emitter of an IR class; a kind without one fails with the class's name."""
    try:
        return table[cls]
    except KeyError:
        raise NotImplementedError(f"no torch emitter for {cls.__name__}") from None


def emitter_for(cls: type) -> OpEmitter:
    return lookup(EMITTERS, cls)


def emitter(op) -> OpEmitter:
    return lookup(EMITTERS, type(op))
