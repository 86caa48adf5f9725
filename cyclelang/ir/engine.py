"""The IR's engine and spec: feed, nozzle, startup, lets, the `Engine` that checks the whole
main line (merge values against `formulas`), `Spec`, and `validate`. See `nodes.py`.
"""

from __future__ import annotations

import ast as pyast
import math
from typing import Annotated, Literal, Union

from pydantic import Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from .base import IR_VERSION, MAX_LAYERS, MAX_REPEATED_STAGES, MAX_STAGE_DEPTH, Count, Finite, IRError, Node, Positive, Rate, _name, checked
from .formulas import derived_values, merge_totals  # the formulas live with the pass that applies them
from .stages import (Fullflow, MainOp, Prechamber, Stage, _chain, _check_streams, _first_repeat, leaf_stages,
                     repeated_stages, walk)
from .turbines import Attention, LatentAttention, Mask, Mlp


__all__ = [  # what `ir.nodes` (and so `ir`) exports from here
    "Position", "Feed", "Nozzle", "Schedule", "Init", "Param", "STANDARD", "Startup", "Let", "formula_names", "Engine",
    "Spec", "validate",
]


# --- feed, nozzle, startup ----------------------------------------------------

Position = Literal["learned", "sinusoidal", "none"]


class Feed(Node):
    """Tanks and pumps: token embedding plus positions."""

    type: Literal["tokens"] = "tokens"
    vocab: Count
    context: Count
    position: Position
    width: Count
    scale: Finite  # embeddings are multiplied by this (the original Transformer: sqrt(width))
    dropout: Rate
    padding: Annotated[int, Field(ge=0)] | None = None  # the padding token: its embedding starts at 0 and gets no gradient
    # Gemma 4's per-layer inputs: a second table (per_layer_vocab x layers * per_layer) and a projection of the embedding
    # (each out of the IR's dump at its default: older IR stays as it was)
    per_layer: Annotated[int, Field(ge=0)] = Field(0, exclude_if=lambda v: v == 0)  # each layer's per-layer input width; 0: none
    per_layer_vocab: Annotated[int, Field(ge=0)] = Field(0, exclude_if=lambda v: v == 0)  # rows of the per-layer table
    per_layer_layers: Annotated[int, Field(ge=0)] = Field(0, exclude_if=lambda v: v == 0)  # derived: the per-layer mlps' instances, in the order they run
    per_layer_eps: Positive = Field(1e-6, exclude_if=lambda v: v == 1e-6)  # the per-layer projection's RMSNorm eps

    _checked = checked()

    def check(self) -> None:
        if self.position == "sinusoidal" and self.width % 2:
            raise ValueError("sinusoidal positions need an even width")
        if self.padding is not None and self.padding >= self.vocab:
            raise ValueError(f"the padding token {self.padding} is outside the vocabulary of {self.vocab}")
        if bool(self.per_layer) != bool(self.per_layer_vocab) or (self.per_layer_layers and not self.per_layer):
            raise ValueError("per-layer inputs need their width and their table's rows")
        if self.per_layer and self.padding is not None and self.padding >= self.per_layer_vocab:
            raise ValueError(f"the padding token {self.padding} is outside the per-layer vocabulary of {self.per_layer_vocab}")


class Nozzle(Node):
    type: Literal["head"] = "head"
    width: Count
    vocab: Count
    tied: bool  # shares the feed's embedding matrix
    bias: bool
    scale: Finite = 1.0  # the logits are multiplied by this (Granite: 1 / logits_scaling)
    softcap: Positive | None = None  # the logits pass through cap * tanh(z / cap) (Gemma 2's final_logit_softcapping)


class Schedule(Node):
    kind: Literal["constant", "cosine", "linear"]
    lr: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    min_lr: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    steps: Count | None  # None: constant after warmup, whatever the kind


class Init(Node):
    """Chill-down: how weights start before the first step."""

    kind: Literal["normal", "xavier"]
    std: Positive  # normal only; xavier derives its own


class Param(Node):
    """The parametrisation: how init and learning rates scale with width. "standard" (SP)
    uses the spec's numbers at every width; "mup" (maximal update, Tensor Programs V)
    equals them at `base_width` and scales them per parameter group by `ir.mup`'s rules."""

    kind: Literal["standard", "mup"]
    base_width: Count | None = None  # mup: the width at which it equals the standard one

    _checked = checked()

    def check(self) -> None:
        if (self.kind == "mup") != (self.base_width is not None):
            raise ValueError("base_width is set for mup, and only for mup")


STANDARD = Param(kind="standard")


class Startup(Node):
    """The start sequence: warmup is the open-loop valve timetable, betas the POGO
    accumulator, clip the restrictor orifice."""

    warmup: Annotated[int, Field(ge=0)]
    schedule: Schedule
    clip: Positive | None
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)], Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]]
    decay: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    init: Init
    param: Param = STANDARD

    _checked = checked()

    def check(self) -> None:
        if self.param.kind == "mup" and self.init.kind != "normal":
            raise ValueError("mup scales a normal init: it needs 'init normal'")


# A let's formula is the spec's arithmetic in Python's syntax, over names only: nothing else
# may reach the text a back-end writes from it.
_FORMULA_NODES = (pyast.Expression, pyast.BinOp, pyast.UnaryOp, pyast.Constant, pyast.Name, pyast.Load, pyast.Call, pyast.Attribute,
                  pyast.Add, pyast.Sub, pyast.Mult, pyast.Div, pyast.FloorDiv, pyast.Mod, pyast.Pow, pyast.USub, pyast.UAdd)


def formula_names(formula: str) -> list[str]:
    """The names a let's formula reads, each once; ValueError if it is more than arithmetic over
    names and numbers (`math.sqrt(x)` is its one call)."""
    try:
        tree = pyast.parse(formula, mode="eval")
    except SyntaxError:
        raise ValueError(f"formula {formula!r} is not an expression") from None
    names: list[str] = []
    for n in pyast.walk(tree):
        if not isinstance(n, _FORMULA_NODES):
            raise ValueError(f"formula {formula!r} holds {type(n).__name__}: only arithmetic over names and numbers")
        if isinstance(n, pyast.Constant) and (type(n.value) not in (int, float)):
            raise ValueError(f"formula {formula!r} holds a {type(n.value).__name__} constant")
        if isinstance(n, pyast.Call) and not (pyast.unparse(n.func) == "math.sqrt" and len(n.args) == 1 and not n.keywords):
            raise ValueError(f"formula {formula!r}: math.sqrt(x) is the only call")
        if isinstance(n, pyast.Attribute) and pyast.unparse(n) != "math.sqrt":
            raise ValueError(f"formula {formula!r}: math.sqrt is the only attribute")
        if isinstance(n, pyast.Name) and n.id != "math":
            _name(n.id, "name")
            if n.id not in names:
                names.append(n.id)
    return names


class Let(Node):
    """A `let` of the spec, kept so that back-ends can name what they make after it (the torch
    Config's fields): its value, and the spec's formula where it was computed from other lets or
    the built-ins width, vocab and context (`let hidden = 4 * width` keeps "4 * width")."""

    name: str
    value: Union[bool, int, float]
    formula: str | None = None  # Python's syntax over names (`sqrt(x)` is `math.sqrt(x)`); None: a number

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "let name")
        if self.formula is not None:
            formula_names(self.formula)


class Engine(Node):
    name: str
    width: Count
    throat: Mask
    feed: Feed
    body: list[MainOp]
    nozzle: Nozzle
    startup: Startup
    # the spec's lets, in definition order; out of the dump, as let_names are (see Node)
    lets: SkipJsonSchema[tuple[Let, ...]] = Field(default=(), exclude=True, repr=False)

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "engine name")
        if self.feed.width != self.width:
            raise ValueError(f"the feed is {self.feed.width} wide, the chamber {self.width}")
        dup = _first_repeat([op.name for op in self.body if isinstance(op, Stage)])
        if dup is not None:
            raise ValueError(f"two stages named '{dup}'")
        depth = max((v.depth + 1 for v in walk(self.body)), default=0)
        if depth > MAX_STAGE_DEPTH:
            raise ValueError(f"stages nest {depth} deep, above the limit of {MAX_STAGE_DEPTH}")
        leaves = leaf_stages(self.body)
        layers = sum(n for _, n in leaves)
        if layers > MAX_LAYERS:
            raise ValueError(f"{layers} stage instances in all, above the limit of {MAX_LAYERS}")
        if repeated_stages(self.body) > MAX_REPEATED_STAGES:
            raise ValueError(f"{repeated_stages(self.body)} stages repeat with counts of their own, above the limit of {MAX_REPEATED_STAGES}")
        w = _chain(self.body, self.width, "the main line")
        if self.nozzle.width != w:
            raise ValueError(f"the nozzle reads width {self.nozzle.width}, the main line ends at {w}")
        if self.nozzle.tied and self.nozzle.width != self.width:
            raise ValueError(f"a tied head reads the chamber's width {self.width}, not {self.nozzle.width}")
        if self.nozzle.vocab != self.feed.vocab:
            raise ValueError(f"the nozzle predicts {self.nozzle.vocab} tokens, the feed takes {self.feed.vocab}")
        causal = self.throat == "causal"
        for op in _all_ops(self.body):
            if isinstance(op, (Attention, LatentAttention)) and causal and op.mask == "open":
                raise ValueError("a bidirectional attention inside a causal engine would leak the future")
            if "causal" in type(op).model_fields and op.causal != causal:  # a kind with the flag follows the throat
                raise ValueError(f"a {op.op}'s causal flag follows the engine's throat")
        for b in (b for st, _ in leaves for b in st.branch_list()):
            if b.overboard and b.loss is not None and b.out_width != self.feed.vocab:
                raise ValueError(f"overboard branch '{b.name}' has a loss, so it must end at width vocab={self.feed.vocab}, not {b.out_width}")
        _check_streams(self.body)  # hyper-connections: a chamber of several streams
        kv_slots(self.body)
        per_layer = per_layer_mlps(self.body)
        if len(per_layer) != self.feed.per_layer_layers or any(m.hidden != self.feed.per_layer for m in per_layer):
            raise ValueError(f"the feed's per-layer inputs ({self.feed.per_layer_layers} of width {self.feed.per_layer}) must match "
                             f"the per-layer mlps ({len(per_layer)}, hidden {sorted({m.hidden for m in per_layer})})")
        totals = merge_totals(self.body)
        for b in (b for st, _ in leaves for b in st.branch_list()):
            if b.merge is None:
                continue
            for field, expect in derived_values(b.merge, totals, self.startup.init).items():
                got = getattr(b.merge, field)
                if got != expect and (got is None or not math.isclose(got, expect, rel_tol=1e-9, abs_tol=1e-12)):
                    raise ValueError(f"prechamber '{b.name}': merge {b.merge.kind} has {field}={got}, "
                                     f"but the engine gives {expect} (run ir.passes.finalize_merges)")


def kv_slots(body) -> dict:
    """KV sharing: each slot's (kv_heads, head_dim, window), checked in the order the layers run: a layer reads a slot a layer
    before it stored, of its own shape. ValueError otherwise."""
    slots: dict = {}

    def check(op) -> None:
        if isinstance(op, Attention) and (op.kv_store or op.kv_reuse):
            shape = (op.kv_heads, op.head_dim, op.window)
            if op.kv_store is not None and slots.setdefault(op.kv_store, shape) != shape:
                raise ValueError(f"KV slot {op.kv_store} is stored by attentions of different shapes (kv_heads, head_dim, window)")
            if op.kv_reuse is not None:
                if op.kv_reuse not in slots:
                    raise ValueError(f"an attention reads KV slot {op.kv_reuse} before any layer stores it")
                if slots[op.kv_reuse] != shape:
                    raise ValueError(f"an attention reads KV slot {op.kv_reuse} with kv_heads, head_dim and window {shape}, "
                                     f"but it holds {slots[op.kv_reuse]}")

    # in the order the layers run; two instances of a repeat settle it (the second reads what the first stored)
    for op in body:
        if not isinstance(op, Stage):
            check(op)
            continue
        for v in walk([op], unroll=True, cap=2):
            for o in _all_ops([v.stage]) if not v.stage.is_group else []:
                check(o)
    return slots


def per_layer_mlps(body) -> list:
    """Every per-layer mlp instance (Gemma 4), in the order the layers run: instance i reads per-layer input i."""
    ops = [op for st, n in leaf_stages(body) for op in _all_ops([st]) * n] + _all_ops([op for op in body if not isinstance(op, Stage)])
    return [op for op in ops if isinstance(op, Mlp) and op.per_layer]


def _all_ops(body) -> list:
    """Every norm and turbine in a main line: in stages, their branches and fullflows too."""
    out = []
    for op in body:
        if not isinstance(op, Stage):
            out.append(op)
            continue
        for v in walk([op]):
            for s in v.stage.ops if not v.stage.is_group else []:
                if isinstance(s, Fullflow):
                    out += ([s.norm] if s.norm else []) + [o for b in s.branches for o in b.ops]
                elif isinstance(s, Prechamber):
                    out += s.ops
                else:
                    out.append(s)
    return out


# How a notebook shows a Spec: set by the façade (cyclelang.api), which may import the
# back-ends; the IR imports none. (spec, "svg" | "html") -> text, or None for nothing.
NOTEBOOK_DISPLAY: list = []


class Spec(Node):
    """A resolved spec. A file of templates only (meant to be included) has no engine."""

    version: Literal[2] = IR_VERSION
    engine: Engine | None

    def _repr_svg_(self):  # Jupyter: the diagram
        return NOTEBOOK_DISPLAY[0](self, "svg") if NOTEBOOK_DISPLAY else None

    def _repr_html_(self):  # Jupyter: the diagram and the parameter/FLOP table
        return NOTEBOOK_DISPLAY[0](self, "html") if NOTEBOOK_DISPLAY else None


# --- re-checking a tree that was edited without validation ----------------------------


def validate(spec: Spec) -> Spec:
    """Check every invariant of the tree again; returns `spec` itself (spans and all).

    `model_copy(update=...)` skips validation, so every pass ends here. Raises
    IRError naming the first node that breaks one."""
    try:
        Spec.model_validate(spec.model_dump())
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-after", "tagged-union")))
        raise IRError(where or "spec", err["msg"].removeprefix("Value error, ")) from None
    return spec
