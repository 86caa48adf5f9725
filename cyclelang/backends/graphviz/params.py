"""Parameter counts in closed form, from the IR alone (no torch).

One pure function per question: how many trainable numbers does this node hold?
The diagram prints these on nodes and clusters; they follow the usual layouts
(nanoGPT, Llama): separate q/k/v/o projections, a gated MLP with three matrices,
a bias-free router for experts, a tied head that owns nothing but its bias.
"""

from __future__ import annotations

from ... import ir

_GATED = ("swiglu", "geglu")


def _mlp(width: int, hidden: int, act: str, bias: bool) -> int:
    n_in = 2 if act in _GATED else 1  # gated units have a gate and an up projection
    weights = n_in * width * hidden + hidden * width
    return weights + ((n_in * hidden + width) if bias else 0)


def merge_count(merge, width: int, out_width: int) -> int:
    """A merge's own parameters: ReZero's one scalar, LayerScale's per-channel gains,
    a gate's projection and bias (g = sigmoid(W x + b)); the others are fixed numbers."""
    if isinstance(merge, ir.RezeroMerge):
        return 1
    if isinstance(merge, ir.LayerscaleMerge):
        return out_width
    if isinstance(merge, ir.GateMerge):
        return width * out_width + out_width
    return 0


def count(node) -> int:
    """Trainable parameters of one IR node; a stage counts one repeat, a spec the whole engine."""
    if isinstance(node, ir.Norm):
        return node.width * (2 if node.type == "layernorm" and node.bias else 1)
    if isinstance(node, ir.Attention):
        q = node.heads * node.head_dim
        kv = node.kv_heads * node.head_dim
        n = node.width * (q + 2 * kv) + q * node.width
        if node.bias:
            n += q + 2 * kv + node.width
        if node.qk_norm:
            n += 2 * node.head_dim  # one RMSNorm gain for queries, one for keys, shared by heads
        return n
    if isinstance(node, ir.Mlp):
        return _mlp(node.width, node.hidden, node.act, node.bias)
    if isinstance(node, ir.Moe):
        router = node.width * node.experts
        return router + node.experts * _mlp(node.width, node.hidden, node.act, node.bias)
    if isinstance(node, ir.Pool):
        return 0
    if isinstance(node, ir.Linear):
        return node.width * node.out + (node.out if node.bias else 0)
    if isinstance(node, ir.Prechamber):
        return sum(count(op) for op in node.ops) + merge_count(node.merge, node.width, node.out_width)
    if isinstance(node, ir.Fullflow):
        return (count(node.norm) if node.norm else 0) + sum(count(b) for b in node.branches)
    if isinstance(node, ir.Stage):
        return sum(count(op) for op in node.ops)
    if isinstance(node, ir.Feed):
        return node.vocab * node.width + (node.context * node.width if node.position == "learned" else 0)
    if isinstance(node, ir.Nozzle):
        return (0 if node.tied else node.width * node.vocab) + (node.vocab if node.bias else 0)
    if isinstance(node, ir.Engine):
        body = sum(count(op) * (op.repeat if isinstance(op, ir.Stage) else 1) for op in node.body)
        return count(node.feed) + body + count(node.nozzle)
    if isinstance(node, ir.Spec):
        return count(node.engine) if node.engine else 0
    raise TypeError(f"no parameter count for {type(node).__name__}")


def human(n: int) -> str:
    """124,439,808 -> '124.4M'; small counts stay exact."""
    if n < 10_000:
        return f"{n:,}"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)  # pragma: no cover
