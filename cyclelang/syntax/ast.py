"""The syntax tree: what the source says, before any name is resolved.

It stays close to the text (numbers keep their spelling, options keep their
order) so that the formatter can print it back faithfully; the resolver turns it
into the IR. Nothing outside `cyclelang.syntax` and `cyclelang.semantics` should
need these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..ir import Span

# --- expressions ---------------------------------------------------------------


@dataclass(frozen=True)
class Num:
    text: str
    span: Span


@dataclass(frozen=True)
class Ref:
    name: str
    span: Span


@dataclass(frozen=True)
class Unary:
    op: str  # '-' or '+'
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / // % **
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(frozen=True)
class Group:
    inner: "Expr"
    span: Span


@dataclass(frozen=True)
class Sqrt:
    arg: "Expr"
    span: Span


Expr = Union[Num, Ref, Unary, Binary, Group, Sqrt]

# --- statements ----------------------------------------------------------------


@dataclass(frozen=True)
class Ident:
    name: str
    span: Span


@dataclass(frozen=True)
class Option:
    """`name` or `name=value`; a bare name is a flag (or, for merges, the kind)."""

    name: Ident
    value: Expr | None
    span: Span


@dataclass(frozen=True)
class Directive:
    """`KEYWORD [KIND] option*`: chamber, throat, feed, nozzle, norm, turbine, merge,
    schedule, init. `kind` is None for chamber and merge."""

    keyword: str
    kind: Ident | None
    options: tuple[Option, ...]
    span: Span


@dataclass(frozen=True)
class Scalar:
    """`warmup N`, `clip X`, `decay X`, `betas A B` inside startup."""

    keyword: str
    values: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class Prechamber:
    name: Ident
    options: tuple[Option, ...]
    body: tuple["BranchItem", ...]
    span: Span
    close: Span  # the closing brace, for the formatter's comment placement


@dataclass(frozen=True)
class Fullflow:
    name: Ident | None
    body: tuple[Union[Directive, Prechamber], ...]
    span: Span
    close: Span


BranchItem = Directive  # norm, turbine or merge
StageItem = Union[Prechamber, Fullflow, Directive, "Stage"]  # a Stage inside a stage: a nested stage


@dataclass(frozen=True)
class Arg:
    name: Ident | None  # None for a positional argument
    value: Expr
    span: Span


@dataclass(frozen=True)
class Stage:
    """A stage inside an engine: inline (`body` set) or an instance of a template
    (`template` set, or `name` is the template when there is no alias)."""

    name: Ident
    template: Ident | None  # `stage NAME = TEMPLATE(...)`
    args: tuple[Arg, ...] | None  # None when there are no parentheses
    repeat: Expr | None
    body: tuple[StageItem, ...] | None
    span: Span
    close: Span | None


@dataclass(frozen=True)
class Param:
    name: Ident
    default: Expr | None
    span: Span


@dataclass(frozen=True)
class Template:
    name: Ident
    params: tuple[Param, ...] | None
    body: tuple[StageItem, ...]
    span: Span
    close: Span


@dataclass(frozen=True)
class Let:
    name: Ident
    value: Expr
    span: Span


@dataclass(frozen=True)
class Include:
    path: str
    span: Span


@dataclass(frozen=True)
class Startup:
    body: tuple[Union[Scalar, Directive], ...]
    span: Span
    close: Span


EngineItem = Union[Directive, Stage, Startup, Let]


@dataclass(frozen=True)
class Engine:
    name: Ident
    body: tuple[EngineItem, ...]
    span: Span
    close: Span


TopItem = Union[Let, Include, Template, Engine]


@dataclass(frozen=True)
class Comment:
    text: str  # including the leading '#'
    line: int
    column: int


@dataclass(frozen=True)
class Module:
    file: str
    items: tuple[TopItem, ...]
    comments: tuple[Comment, ...] = field(default=())
