"""IR -> IR passes. Each is pure, returns a new tree, and ends in `validate`.

    finalize_merges(body, init)   the merge values that depend on the whole engine
    shrink(spec, width, depth, vocab=, context=, heads=)    the test stand's scale model

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
    """Scales a body to a new chamber width (and vocabulary, context, head count): each kind by its
    record's rule (`Kind.shrink`), the structures that hold them (branches, full flows, stages) here."""

    def __init__(self, old: int, new: int, vocab: int, new_vocab: int, context: int, new_context: int, heads: int | None):
        self.old, self.new, self.vocab, self.new_vocab = old, new, vocab, new_vocab
        self.context, self.new_context, self.heads = context, new_context, heads

    def dim(self, d: int) -> int:
        """A width-like size at the new chamber width."""
        return max(1, round(d * self.new / self.old))

    def out(self, d: int) -> int:
        """A projection's output: the vocabulary becomes the new one, any other width scales."""
        return self.new_vocab if d == self.vocab else self.dim(d)

    def window(self, w: int | None) -> int | None:
        """A sliding window (None: none) in proportion to the context: it still covers that share of it."""
        return None if w is None else max(1, round(w * self.new_context / self.context))

    def split(self, heads: int, size: int, what: str) -> tuple[int, int]:
        """(heads, each head's size) of a multi-head part whose heads are `size` wide: without `heads=`
        the heads kept and each narrower; with it, the inner width (heads x size, scaled) cut into
        that many heads."""
        if self.heads is None:
            return heads, self.dim(size)
        inner = self.dim(heads * size)
        if inner < self.heads:
            raise ShrinkError(f"{what} at --width {self.new} is {inner} wide inside: too narrow for {self.heads} heads",
                              "choose fewer --heads or a larger --width")
        return self.heads, inner // self.heads

    def divisor(self, n: int, heads: int) -> int:
        """A count that must divide the heads (kv heads, key heads, groups): kept where it still does, else
        the largest below it that does."""
        n = min(n, heads)
        while heads % n:
            n -= 1
        return n

    def op(self, op):
        if isinstance(op, ir.OP_TYPES):
            return kind_of(op).shrink(op, self)
        if isinstance(op, ir.Prechamber):
            out = self.out(op.out_width) if op.out_width != op.width else self.dim(op.out_width)
            return op.model_copy(update=dict(width=self.dim(op.width), out_width=out, ops=[self.op(o) for o in op.ops]))
        if isinstance(op, ir.Fullflow):
            return op.model_copy(update=dict(width=self.dim(op.width), norm=self.op(op.norm) if op.norm else None,
                                             branches=[self.op(b) for b in op.branches]))
        if isinstance(op, ir.Stage):
            return op.model_copy(update=dict(width_in=self.dim(op.width_in), width_out=self.dim(op.width_out),
                                             ops=[self.op(o) for o in op.ops]))
        raise TypeError(f"no scale rule for IR node {type(op).__name__}")


def _at_least(value: int | None, least: int, flag: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShrinkError(f"{flag} must be a whole number, not {value!r}")
    if value < least:
        raise ShrinkError(f"{flag} must be at least {least}, not {value}")


def shrink(spec: ir.Spec, width: int | None = None, depth: int | None = None, *, vocab: int | None = None,
           context: int | None = None, heads: int | None = None) -> ir.Spec:
    """The spec at chamber width `width` with every repeated stage repeated `depth` times
    (the stages on the main line; the stages nested in them keep their repeats).

    Every width-like dimension is multiplied by width / chamber width (heads kept where
    they still divide, hidden widths kept in proportion); stages that repeat get `depth`
    instances (if none repeats, every stage does). None leaves that dimension as it is.
    Values derived from the engine's size are derived again for the new size; values the
    spec set stay as written. An embedding scale of sqrt(width) follows the new width.

    vocab: the vocabulary (the feed's, the nozzle's, and every projection to it).
    context: the longest sequence; every sliding window keeps its share of it (a window of
    256 in a context of 2,048 is 4 in a context of 32), so local attention stays local.
    heads: every multi-head part's head count (attention, latent attention, linear attention,
    ssm, gated delta): its inner width, as the width scales it, cut into that many heads; the
    counts that divide the heads (kv heads, key heads, groups) kept where they still do.

    Raises ShrinkError for a scale model that cannot be made."""
    e = spec.engine
    if e is None:
        raise ShrinkError("nothing to fire: the spec defines no engine (only templates)", code="E0213")
    _at_least(depth, 1, "--depth")
    _at_least(width, MIN_WIDTH, "--width")
    _at_least(vocab, 2, "--vocab")
    _at_least(context, 1, "--context")
    _at_least(heads, 1, "--heads")
    if width is None and depth is None and vocab is None and context is None and heads is None:
        return spec
    body = list(e.body)
    if depth is not None:
        repeated = [op for op in body if isinstance(op, ir.Stage) and op.repeat > 1]
        body = [op.model_copy(update=dict(repeat=depth)) if isinstance(op, ir.Stage) and (op.repeat > 1 or not repeated) else op
                for op in body]
    feed, nozzle, ew = e.feed, e.nozzle, e.width
    if (width is not None and width != e.width) or vocab is not None or context is not None or heads is not None:
        width = e.width if width is None else width
        if feed.position == "sinusoidal" and width % 2:
            raise ShrinkError("sinusoidal positions need an even width", f"--width {width + 1}")
        nv = feed.vocab if vocab is None else vocab
        if feed.padding is not None and feed.padding >= nv:
            raise ShrinkError(f"the padding token {feed.padding} is outside a vocabulary of {nv}", f"--vocab {feed.padding + 1} or more")
        s = _Scaler(e.width, width, feed.vocab, nv, feed.context, feed.context if context is None else context, heads)
        body = [s.op(op) for op in body]
        ew = width
        scale = feed.scale
        if math.isclose(scale, math.sqrt(e.width), rel_tol=1e-9):  # the original Transformer's sqrt(d) follows d
            scale = math.sqrt(width)
        per_layer_vocab = nv if feed.per_layer_vocab == feed.vocab else feed.per_layer_vocab
        feed = feed.model_copy(update=dict(width=width, scale=scale, vocab=nv, context=s.new_context, per_layer_vocab=per_layer_vocab))
        nozzle = nozzle.model_copy(update=dict(width=s.dim(nozzle.width), vocab=nv))
    body = finalize_merges(body, e.startup.init)
    if feed.per_layer:  # Gemma 4's per-layer inputs follow their mlps: their width and count
        mlps = ir.per_layer_mlps(body)
        feed = feed.model_copy(update=dict(per_layer=mlps[0].hidden, per_layer_layers=len(mlps)))
    engine = e.model_copy(update=dict(width=ew, feed=feed, nozzle=nozzle, body=body))
    engine = engine.model_copy(update=dict(lets=_followed_lets(engine)))
    return ir.validate(spec.model_copy(update=dict(engine=engine)))


def _held(node, out: dict) -> dict:
    """{let: the values the nodes under `node` hold for the options the spec wrote as that let}."""
    if isinstance(node, ir.Node):
        for option, let in node.let_names:
            value = getattr(node, option, None)
            if isinstance(value, (int, float)):
                out.setdefault(let, set()).add(value)
        for name in type(node).model_fields:
            if name not in ("lets", "span", "let_names"):
                _held(getattr(node, name), out)
    elif isinstance(node, (list, tuple)):
        for x in node:
            _held(x, out)
    return out


def _followed_lets(e: ir.Engine) -> tuple:
    """The engine's lets moved to the sizes a pass gave the nodes written with them, so that a scale
    model keeps the spec's names (the torch Config names a field after a let only where the let holds
    the field's value): a let of a number takes the value its nodes now hold where they agree; a let
    computed from others is computed again, and kept only where its nodes hold that. Any other let
    stays as it was (a consumer then leaves its name out)."""
    held = _held(e, {})
    values = {"width": e.width, "vocab": e.feed.vocab, "context": e.feed.context}  # the built-ins a formula may read
    out = []
    for let in e.lets:
        value = let.value
        if isinstance(value, bool):
            pass
        elif let.formula is None:
            got = held.get(let.name, set())
            value = next(iter(got)) if len(got) == 1 else value
        else:
            try:
                ir.formula_names(let.formula)
                value = eval(let.formula, {"__builtins__": {}, "math": math}, dict(values))  # arithmetic over names only (checked above)
            except (ValueError, ArithmeticError, NameError, TypeError):
                value = let.value
            if let.name in held and held[let.name] != {value}:
                value = let.value
        values[let.name] = value
        out.append(let if value == let.value else let.model_copy(update=dict(value=value)))
    return tuple(out)
