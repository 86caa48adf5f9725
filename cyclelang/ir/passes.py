"""IR -> IR passes. Each is pure, returns a new tree, and ends in `validate`.

    finalize_merges(body, init)   the merge values that depend on the whole engine
    shrink(spec, width, depth)    the test stand's scale model

A derived value is always computed from what the user asked for (`*_asked`) and
the topology, never from a previous derivation, so running a pass twice, or
after another pass changed the depth, gives the values a spec of that size gets.
"""

from __future__ import annotations

import math

from . import nodes as ir
from .formulas import derived_merge, layerscale_init, merge_totals  # noqa: F401 (layerscale_init: read as ir.passes.layerscale_init)
from .kinds import ShrinkError, kind_of  # noqa: F401 (ShrinkError: raised by the kinds' rules, caught by callers here)


def map_branches(body: list, fn) -> list:
    """A copy of a main line in which every prechamber (fullflow branches included)
    is replaced by `fn(prechamber)`; everything else is kept as it is."""
    out = []
    for op in body:
        if isinstance(op, ir.Stage) and op.is_group:
            op = op.model_copy(update=dict(ops=map_branches(op.ops, fn)))
        elif isinstance(op, ir.Stage):
            ops = []
            for s in op.ops:
                if isinstance(s, ir.Prechamber):
                    s = fn(s)
                elif isinstance(s, ir.Fullflow):
                    s = s.model_copy(update=dict(branches=[fn(b) for b in s.branches]))
                ops.append(s)
            op = op.model_copy(update=dict(ops=ops))
        out.append(op)
    return out


def finalize_merges(body: list, init: ir.Init) -> list:
    """The main line with every merge's derived values filled in (cooling's std from the
    number of merges, DeepNorm's alpha and beta from its layers, LayerScale's depth rule)."""
    totals = merge_totals(body)
    return map_branches(body, lambda b: b.model_copy(update=dict(merge=derived_merge(b.merge, totals, init))) if b.merge is not None else b)


# --- the test stand's scale model ------------------------------------------------------------

MIN_WIDTH = 4


class _Scaler:
    """Scales a body to a new chamber width: each kind by its record's rule (`Kind.shrink`), the
    structures that hold them (branches, full flows, stages) here."""

    def __init__(self, old: int, new: int, vocab: int):
        self.old, self.new, self.vocab = old, new, vocab

    def dim(self, d: int) -> int:
        return max(1, round(d * self.new / self.old))

    def op(self, op):
        if isinstance(op, ir.OP_TYPES):
            return kind_of(op).shrink(op, self)
        if isinstance(op, ir.Prechamber):
            out = self.dim(op.out_width) if op.out_width != self.vocab or op.out_width == op.width else op.out_width
            return op.model_copy(update=dict(width=self.dim(op.width), out_width=out, ops=[self.op(o) for o in op.ops]))
        if isinstance(op, ir.Fullflow):
            return op.model_copy(update=dict(width=self.dim(op.width), norm=self.op(op.norm) if op.norm else None,
                                             branches=[self.op(b) for b in op.branches]))
        if isinstance(op, ir.Stage):
            return op.model_copy(update=dict(width_in=self.dim(op.width_in), width_out=self.dim(op.width_out),
                                             ops=[self.op(o) for o in op.ops]))
        raise TypeError(f"no scale rule for IR node {type(op).__name__}")


def shrink(spec: ir.Spec, width: int | None = None, depth: int | None = None) -> ir.Spec:
    """The spec at chamber width `width` with every repeated stage repeated `depth` times
    (the stages on the main line; the stages nested in them keep their repeats).

    Every width-like dimension is multiplied by width / chamber width (heads kept where
    they still divide, hidden widths kept in proportion); stages that repeat get `depth`
    instances (if none repeats, every stage does). None leaves that dimension as it is.
    Values derived from the engine's size are derived again for the new size; values the
    spec set stay as written. An embedding scale of sqrt(width) follows the new width.
    Raises ShrinkError for a scale model that cannot be made."""
    e = spec.engine
    if e is None:
        raise ShrinkError("nothing to fire: the spec defines no engine (only templates)", code="E0213")
    if width is None and depth is None:
        return spec
    body = list(e.body)
    if depth is not None:
        if depth < 1:
            raise ShrinkError(f"--depth must be at least 1, not {depth}")
        repeated = [op for op in body if isinstance(op, ir.Stage) and op.repeat > 1]
        body = [op.model_copy(update=dict(repeat=depth)) if isinstance(op, ir.Stage) and (op.repeat > 1 or not repeated) else op
                for op in body]
    feed, nozzle, ew = e.feed, e.nozzle, e.width
    if width is not None and width != e.width:
        if width < MIN_WIDTH:
            raise ShrinkError(f"--width must be at least {MIN_WIDTH}, not {width}")
        if feed.position == "sinusoidal" and width % 2:
            raise ShrinkError("sinusoidal positions need an even width", f"--width {width + 1}")
        s = _Scaler(e.width, width, feed.vocab)
        body = [s.op(op) for op in body]
        ew = width
        scale = feed.scale
        if math.isclose(scale, math.sqrt(e.width), rel_tol=1e-9):  # the original Transformer's sqrt(d) follows d
            scale = math.sqrt(width)
        feed = feed.model_copy(update=dict(width=width, scale=scale))
        nozzle = nozzle.model_copy(update=dict(width=s.dim(nozzle.width)))
    body = finalize_merges(body, e.startup.init)
    if feed.per_layer:  # Gemma 4's per-layer inputs follow their mlps: their width and count
        mlps = ir.per_layer_mlps(body)
        feed = feed.model_copy(update=dict(per_layer=mlps[0].hidden, per_layer_layers=len(mlps)))
    engine = e.model_copy(update=dict(width=ew, feed=feed, nozzle=nozzle, body=body))
    return ir.validate(spec.model_copy(update=dict(engine=engine)))
