"""Scale an engine down for the test stand: a pure IR -> IR transformation.

A stand run on a laptop cannot fire GPT-2 at full size, so `cyclec fire --width W
--depth N` fires a scale model: every width-like dimension is multiplied by
W / chamber width (heads kept where they still divide, hidden widths kept in
proportion), and every repeated stage repeats N times. Nothing else changes:
the same valves, merges, throat, feed and startup. An embedding scale of
sqrt(width) (the original Transformer's) follows the new width.

Values the resolver derived from the engine's size are derived again from the
new size (a scale model must be initialised like a real engine of that size):
cooling std = base / sqrt(merges), DeepNorm's alpha = (2N)^(1/4) and
beta = (8N)^(-1/4), LayerScale's depth rule. A value the spec set by hand stays
as written; one that equals the derived formula for the old size is taken to be
derived (the IR does not record which it was).
"""

from __future__ import annotations

import math

from .. import ir
from ..diagnostics import CycleError, Diagnostic
from ..semantics.resolve import _finalize_merges, layerscale_init

MIN_WIDTH = 4


def _error(message: str, help: str | None = None, code: str = "E0205", span: ir.Span | None = None) -> CycleError:
    return CycleError([Diagnostic(code, "error", message, span, help)])


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _layers(body) -> int:
    return sum(op.repeat for op in body if isinstance(op, ir.Stage) and any(not b.overboard for b in ir.stage_branches(op)))


def _forget_derived(body, old_layers: int):
    """Reset merge values that were derived from the old size, so `_finalize_merges` recomputes them."""

    def forget(m):
        if isinstance(m, ir.DeepnormMerge):
            n = m.layers
            upd = {}
            if _close(m.alpha, (2 * n) ** 0.25):
                upd["alpha"] = 0.0
            if _close(m.beta, (8 * n) ** -0.25):
                upd["beta"] = 0.0
            return m.model_copy(update=upd)
        if isinstance(m, ir.LayerscaleMerge) and _close(m.init, layerscale_init(old_layers)):
            return m.model_copy(update=dict(init=0.0))
        return m  # cooling keeps its base and recomputes std from the merge count

    return ir.map_branches(body, lambda b: b.model_copy(update=dict(merge=forget(b.merge))) if b.merge is not None else b)


class _Scaler:
    def __init__(self, old: int, new: int, vocab: int):
        self.old, self.new, self.vocab = old, new, vocab

    def dim(self, d: int) -> int:
        return max(1, round(d * self.new / self.old))

    def op(self, op):
        if isinstance(op, ir.Norm):
            return op.model_copy(update=dict(width=self.dim(op.width)))
        if isinstance(op, ir.Attention):
            return self.attention(op)
        if isinstance(op, ir.Mlp):
            return op.model_copy(update=dict(width=self.dim(op.width), hidden=self.dim(op.hidden)))
        if isinstance(op, ir.Moe):
            return op.model_copy(update=dict(width=self.dim(op.width), hidden=self.dim(op.hidden)))
        if isinstance(op, ir.Pool):
            return op.model_copy(update=dict(width=self.dim(op.width)))
        if isinstance(op, ir.Linear):
            return op.model_copy(update=dict(width=self.dim(op.width), out=op.out if op.out == self.vocab else self.dim(op.out)))
        if isinstance(op, ir.Prechamber):
            return op.model_copy(update=dict(width=self.dim(op.width), out_width=self.dim(op.out_width) if op.out_width != self.vocab or op.out_width == op.width else op.out_width,
                                             ops=[self.op(o) for o in op.ops]))
        if isinstance(op, ir.Fullflow):
            return op.model_copy(update=dict(width=self.dim(op.width), norm=self.op(op.norm) if op.norm else None,
                                             branches=[self.op(b) for b in op.branches]))
        if isinstance(op, ir.Stage):
            return op.model_copy(update=dict(width_in=self.dim(op.width_in), width_out=self.dim(op.width_out),
                                             ops=[self.op(o) for o in op.ops]))
        raise TypeError(f"unexpected IR node {type(op).__name__}")

    def attention(self, a: ir.Attention) -> ir.Attention:
        width = self.dim(a.width)
        inner = self.dim(a.heads * a.head_dim)
        # keep the head count where it still divides the inner width into even heads; else fewer heads
        heads = next((h for h in range(min(a.heads, inner), 0, -1) if inner % h == 0 and (inner // h) % 2 == 0), None)
        if heads is None:
            raise _error(f"attention at width {width} cannot be split into heads of even size",
                         "choose a --width that is a multiple of the spec's head count times 2", code="E0207")
        group = a.heads // a.kv_heads
        kv = max(1, heads // group)
        while heads % kv:
            kv -= 1
        head_dim = inner // heads
        rotary = 0
        if a.rotary_dims:
            rotary = max(2, int(a.rotary_dims / a.head_dim * head_dim) // 2 * 2)
            rotary = min(rotary, head_dim - head_dim % 2)
        return a.model_copy(update=dict(width=width, heads=heads, kv_heads=kv, head_dim=head_dim, rotary_dims=rotary))


def shrink(spec: ir.Spec, width: int | None = None, depth: int | None = None) -> ir.Spec:
    """The spec at chamber width `width` with every repeated stage repeated `depth` times.

    Stages that repeat more than once get `depth` instances; if no stage repeats, every
    stage does. None leaves that dimension as it is. Pure: returns a new IR."""
    e = spec.engine
    if e is None:
        raise _error("nothing to fire: the spec defines no engine (only templates)", code="E0213", span=spec.span)
    if width is None and depth is None:
        return spec
    body = list(e.body)
    old_layers = _layers(body)
    body = _forget_derived(body, old_layers)
    if depth is not None:
        if depth < 1:
            raise _error(f"--depth must be at least 1, not {depth}")
        repeated = [op for op in body if isinstance(op, ir.Stage) and op.repeat > 1]
        body = [op.model_copy(update=dict(repeat=depth)) if isinstance(op, ir.Stage) and (op.repeat > 1 or not repeated) else op
                for op in body]
    feed, nozzle, ew = e.feed, e.nozzle, e.width
    if width is not None and width != e.width:
        if width < MIN_WIDTH:
            raise _error(f"--width must be at least {MIN_WIDTH}, not {width}")
        if feed.position == "sinusoidal" and width % 2:
            raise _error("sinusoidal positions need an even width", f"--width {width + 1}")
        s = _Scaler(e.width, width, feed.vocab)
        body = [s.op(op) for op in body]
        ew = width
        scale = feed.scale
        if _close(scale, math.sqrt(e.width)):  # the original Transformer's sqrt(d) follows d
            scale = math.sqrt(width)
        feed = feed.model_copy(update=dict(width=width, scale=scale))
        nozzle = nozzle.model_copy(update=dict(width=s.dim(nozzle.width)))
    body = _finalize_merges(body, e.startup.init)
    engine = e.model_copy(update=dict(width=ew, feed=feed, nozzle=nozzle, body=body))
    return spec.model_copy(update=dict(engine=engine))
