"""The IR's branches and stages: prechambers, fullflows, stages (nested ones too) and the
width chain through them. See `nodes.py`.
"""

from __future__ import annotations

from typing import Annotated, Iterator, Literal, NamedTuple, Union

from pydantic import Field

from .base import Count, Node, _name, checked
from .merges import HyperMerge, Merge
from .turbines import OP_TYPES, TURBINE_TYPES, BranchOp, Linear, Norm


__all__ = [  # what `ir.nodes` (and so `ir`) exports from here
    "chamber_streams", "Prechamber", "Fullflow", "StageOp", "Stage", "MainOp", "out_width", "leaf_stages",
    "repeated_stages", "walk", "Visit",
]


# --- branches and stages -------------------------------------------------------


def out_width(op, w: int) -> int:
    """The width of the main line (or a branch) after `op`, given the width before it."""
    if isinstance(op, Linear):
        return op.out
    if isinstance(op, Stage):
        return op.width_out
    return w


def _first_repeat(names: list[str]) -> str | None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            return n
        seen.add(n)
    return None


def _chain(ops, w: int, what: str, name: str | None = None) -> int:
    """Walk ops from width w, checking each reads the width it is given; the width after.
    (The message is formatted only when it is needed: this runs for every node built.)"""
    for k, op in enumerate(ops):
        got = op.width_in if isinstance(op, Stage) else op.width
        if got != w:
            where = what if name is None else f"{what} '{name}'"
            raise ValueError(f"{where} op {k} ({op.op}) reads width {got}, but the flow there is {w} wide")
        w = out_width(op, w)
    return w


class Prechamber(Node):
    """A residual branch: split off the chamber, do work, return the exhaust."""

    op: Literal["prechamber"] = "prechamber"
    name: str
    width: Count  # chamber width where the branch splits off
    out_width: Count  # width of the branch's exhaust
    detach: bool  # open cycle: the branch's input carries no gradient back
    overboard: bool  # the exhaust never returns to the chamber
    loss: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None  # overboard with a loss: an auxiliary head, weighted
    ops: list[BranchOp]
    merge: Merge | None  # None exactly when overboard

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "prechamber name")
        if not any(isinstance(op, TURBINE_TYPES) for op in self.ops):
            raise ValueError(f"prechamber '{self.name}' has no turbine")
        end = _chain(self.ops, self.width, "prechamber", self.name)
        if end != self.out_width:
            raise ValueError(f"prechamber '{self.name}' ends at width {end}, not its out_width {self.out_width}")
        if self.overboard != (self.merge is None):
            raise ValueError(f"prechamber '{self.name}': a merge exactly when the branch is not overboard")
        if self.loss is not None and not self.overboard:
            raise ValueError(f"prechamber '{self.name}': loss weighs an overboard branch only")
        if not self.overboard and self.out_width != self.width:
            raise ValueError(f"prechamber '{self.name}' returns width {self.out_width} to a chamber of width {self.width}")


class Fullflow(Node):
    """Full-flow staged combustion: parallel branches fed from the same state."""

    op: Literal["fullflow"] = "fullflow"
    name: str
    width: Count
    norm: Norm | None  # one shared valve in front of every branch
    branches: Annotated[list[Prechamber], Field(min_length=1)]

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "fullflow name")
        if self.norm is not None and self.norm.width != self.width:
            raise ValueError(f"fullflow '{self.name}': its valve is {self.norm.width} wide, the flow {self.width}")
        for b in self.branches:
            if b.width != self.width:
                raise ValueError(f"fullflow '{self.name}': branch '{b.name}' reads width {b.width}, the flow is {self.width}")


StageOp = Annotated[Union[(Prechamber, Fullflow, *OP_TYPES, "Stage")], Field(discriminator="op")]


class Stage(Node):
    op: Literal["stage"] = "stage"
    name: str
    template: str | None  # the template it was expanded from, if any
    repeat: Annotated[int, Field(ge=1, le=1 << 20)]
    width_in: Count
    width_out: Count
    ops: list[StageOp]  # branches and ops; or, for a group (a nested stage), stages only

    _checked = checked()

    @property
    def is_group(self) -> bool:
        """A stage that holds stages (and nothing else)."""
        return any(isinstance(op, Stage) for op in self.ops)

    def check(self) -> None:
        _name(self.name, "stage name")
        _name(self.template, "template name")
        if self.is_group:
            if not all(isinstance(op, Stage) for op in self.ops):
                raise ValueError(f"stage '{self.name}' holds stages and other ops: a stage of stages holds stages only")
            dup = _first_repeat([op.name for op in self.ops])
            if dup is not None:
                raise ValueError(f"stage '{self.name}' has two stages named '{dup}'")
        dup = _first_repeat([b.name for b in self.branch_list()] + [op.name for op in self.ops if isinstance(op, Fullflow)])
        if dup is not None:
            raise ValueError(f"stage '{self.name}' has two branches named '{dup}'")
        w = self.width_in
        for k, op in enumerate(self.ops):
            if isinstance(op, (Prechamber, Fullflow)):
                if op.width != w:
                    raise ValueError(f"stage '{self.name}' op {k} ({op.op} '{op.name}') reads width {op.width}, but the flow there is {w} wide")
            else:
                w = _chain([op], w, "stage", self.name)
        if w != self.width_out:
            raise ValueError(f"stage '{self.name}' ends at width {w}, not its width_out {self.width_out}")
        if self.repeat > 1 and self.width_in != self.width_out:
            raise ValueError(f"stage '{self.name}' repeats {self.repeat} times but changes the width")

    def branch_list(self) -> list[Prechamber]:
        """Every prechamber of this stage in source order, fullflow branches included (a group
        has none of its own: its stages' are theirs, see `leaf_stages`)."""
        out: list[Prechamber] = []
        for op in self.ops:
            if isinstance(op, Prechamber):
                out.append(op)
            elif isinstance(op, Fullflow):
                out.extend(op.branches)
        return out


Stage.model_rebuild()


class Visit(NamedTuple):
    """One stage met by `walk`."""

    stage: Stage
    depth: int  # 0: a stage on the main line; 1: a stage inside one group; and so on
    times: int  # how many times it runs in all: its repeat times its groups' (1 when walked unrolled: one instance)


def walk(body, unroll: bool = False, cap: int | None = None) -> Iterator[Visit]:
    """The one walk over a main line's stages: every stage (groups and the stages in them, at any
    depth), each group before the stages it holds, in source order. Ops that are not stages are
    skipped (a caller that needs the main line's other ops reads `body` itself).

    Folded (the default): each stage once, `times` the number of times it runs in all.
    unroll: each instance in the order they run (a group's instance, then its stages' instances,
    then its next instance), `times` 1; `cap`: at most that many instances of each repeat (a check
    that settles after two passes over a stage need not walk a stage repeated a million times)."""

    def go(ops, depth: int, mult: int) -> Iterator[Visit]:
        for op in ops:
            if not isinstance(op, Stage):
                continue
            if unroll:
                for _ in range(op.repeat if cap is None else min(op.repeat, cap)):
                    yield Visit(op, depth, 1)
                    if op.is_group:
                        yield from go(op.ops, depth + 1, 1)
            else:
                yield Visit(op, depth, mult * op.repeat)
                if op.is_group:
                    yield from go(op.ops, depth + 1, mult * op.repeat)

    return go(body, 0, 1)


def repeated_stages(body) -> int:
    """How many stages (groups included, at any depth) repeat: each has a count of its own."""
    return sum(v.stage.repeat > 1 for v in walk(body))


def leaf_stages(body) -> list[tuple[Stage, int]]:
    """Every stage that holds ops (not stages) in source order, with the number of times it
    runs in all: its repeat times the repeats of the stages around it."""
    return [(v.stage, v.times) for v in walk(body) if not v.stage.is_group]


MainOp = Annotated[Union[(Stage, *OP_TYPES)], Field(discriminator="op")]


def chamber_streams(body) -> HyperMerge | None:
    """The first hyper-connection of a main line (every returning branch has one, alike), or None:
    the chamber then holds one stream and every junction is an add."""
    for st, _ in leaf_stages(body):
        for b in st.branch_list():
            if isinstance(b.merge, HyperMerge):
                return b.merge
    return None


def _check_streams(body) -> None:
    """A chamber of several streams: every branch joins it through a hyper-connection of the same
    streams and kind; the stages come first on the main line and hold only prechambers that return."""
    first = chamber_streams(body)
    if first is None:
        return
    seen_op = False
    for op in body:
        if not isinstance(op, Stage):
            seen_op = True
            continue
        if seen_op:
            raise ValueError(f"stage '{op.name}' comes after an op on the main line, where the streams are already summed")
    for st, _ in leaf_stages(body):
        for op in st.ops:
            if not isinstance(op, Prechamber) or op.overboard:
                raise ValueError(f"stage '{st.name}': a chamber of {first.streams} streams holds only prechambers that return (not {op.op}"
                                 + (" overboard" if isinstance(op, Prechamber) else "") + ")")
            m = op.merge
            if not isinstance(m, HyperMerge) or (m.streams, m.connections, m.dynamic) != (first.streams, first.connections, first.dynamic):
                raise ValueError(f"prechamber '{op.name}': every branch joins the {first.streams} streams through the same kind of hyper-connection")
