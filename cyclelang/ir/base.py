"""The IR's foundations: `Node` (frozen, spans and let names out of the dump), `Span`,
`IRError`, the size limits and the number types every node uses. See `nodes.py`.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema


__all__ = [  # what `ir.nodes` (and so `ir`) exports from here
    "IR_VERSION", "IRError", "Span", "Node", "MAX_STAGE_DEPTH", "MAX_LAYERS", "MAX_REPEATED_STAGES",
]

IR_VERSION = 2  # 2: merges keep what was asked (`*_asked`) apart from what was derived

MAX_STAGE_DEPTH = 4  # stages nest at most 4 deep: engine > stage > stage > stage > stage
MAX_LAYERS = 100_000  # stage instances in all, nested repeats multiplied out (a built model's layer count)
# stages with a repeat count of their own (a Config field each): the generated source indexes a stage by the sum of
# the counts before it, so its size grows with their square; 256 is far past any published architecture
MAX_REPEATED_STAGES = 256

# Every name in the IR is a Python identifier in ASCII, as the grammar's NAME is:
# nothing a name holds can close a string, start a line or reach a path.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")

Count = Annotated[int, Field(ge=1, le=2**62)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]  # a dropout probability


class IRError(ValueError):
    """An IR that breaks an invariant; `where` names the node."""

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


def _name(value: str | None, what: str) -> None:
    if value is not None and not NAME.match(value):
        raise ValueError(f"{what} {value!r} is not an identifier (letters, digits and _, not starting with a digit)")


class Span(BaseModel):
    """Where a node came from: 1-based line and column, end exclusive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    span: SkipJsonSchema[Span | None] = Field(default=None, exclude=True, repr=False)
    # Provenance like the span, and like it out of the dump: the options of this node that the
    # spec wrote as a `let`'s name, (option, let) pairs (`heads=heads`, a stage's `x depth` is
    # ("repeat", "depth")); back-ends name what they make after them (the torch Config's fields).
    let_names: SkipJsonSchema[tuple[tuple[str, str], ...]] = Field(default=(), exclude=True, repr=False)

    def let_of(self, option: str) -> str | None:
        """The let the spec wrote this option with, or None (a number, or an expression)."""
        return next((let for o, let in self.let_names if o == option), None)

    def check(self) -> None:
        """This node's own invariants (its children check theirs); raises ValueError. A class
        that has some says so with `_checked = checked()`, so the others pay nothing."""


def _run_check(cls, value, handler):
    if isinstance(value, cls):
        return value  # built (and checked) already: a parent does not check its children again
    node = handler(value)
    node.check()
    return node


def checked():
    """The model validator that runs `check` when a node is built from data."""
    return model_validator(mode="wrap")(classmethod(_run_check))
