"""Constant evaluation: `let` arithmetic, template arguments, option values.

Values are ints, floats, bools and keywords (a bare name that is not bound, such
as `gelu` in `act=gelu`). `/` is true division; a float with an integral value
(768/12 = 64.0) is accepted wherever an integer is expected. Every failure is a
diagnostic, never a Python exception: division by zero, a number that overflows,
a name that is not defined.
"""

from __future__ import annotations

import ast as pyast
import math
from dataclasses import dataclass

from ..diagnostics import did_you_mean
from ..ir import Span
from ..syntax import ast

MAX_INT = 2**62  # past this, sizes and counts are nonsense and arithmetic is a DoS


@dataclass(frozen=True)
class Keyword:
    """A bare name that is not a constant: `gelu`, `causal`, `swiglu`."""

    name: str
    span: Span


Value = int | float | bool | Keyword


@dataclass(frozen=True)
class Binding:
    value: Value
    span: Span | None  # where it was defined; None for built-ins
    let: str | None = None  # the `let` this name is (a template parameter bound to a let's bare name: that let)


class EvalError(Exception):
    def __init__(self, code: str, message: str, span: Span, help: str | None = None):
        super().__init__(message)
        self.code, self.message, self.span, self.help = code, message, span, help


class Scope:
    """Name lookup, innermost first: template parameters, engine lets, file lets, built-ins."""

    def __init__(self, names: dict[str, Binding] | None = None, parent: "Scope | None" = None):
        self.names = dict(names or {})
        self.parent = parent

    def lookup(self, name: str) -> Binding | None:
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        return None

    def all_names(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            out |= set(s.names)
            s = s.parent
        return out

    def child(self, names: dict[str, Binding] | None = None) -> "Scope":
        return Scope(names, self)


def parse_number(text: str, span: Span) -> int | float:
    clean = text.replace("_", "")
    try:
        if any(c in clean for c in ".eE"):
            v = float(clean)
            if not math.isfinite(v):
                raise EvalError("E0210", f"number {text} is out of range", span)
            return v
        v = int(clean)
    except ValueError:
        raise EvalError("E0210", f"'{text}' is not a number", span) from None
    if abs(v) > MAX_INT:
        raise EvalError("E0210", f"number {text} is out of range", span, "keep integers below 2**62")
    return v


def _check(v: int | float, span: Span) -> int | float:
    if isinstance(v, float) and not math.isfinite(v):
        raise EvalError("E0210", "the result is not a finite number", span)
    if isinstance(v, int) and abs(v) > MAX_INT:
        raise EvalError("E0210", "the result is out of range", span, "keep integers below 2**62")
    return v


def evaluate(expr: ast.Expr, scope: Scope) -> Value:
    if isinstance(expr, ast.Num):
        return parse_number(expr.text, expr.span)
    if isinstance(expr, ast.Ref):
        b = scope.lookup(expr.name)
        if b is not None:
            return b.value
        if expr.name == "true":
            return True
        if expr.name == "false":
            return False
        return Keyword(expr.name, expr.span)
    if isinstance(expr, ast.Group):
        return evaluate(expr.inner, scope)
    if isinstance(expr, ast.Sqrt):
        v = number(expr.arg, scope)
        if v < 0:
            raise EvalError("E0210", "sqrt of a negative number", expr.span)
        return math.sqrt(v)
    if isinstance(expr, ast.Unary):
        v = number(expr.operand, scope)
        return -v if expr.op == "-" else v
    assert isinstance(expr, ast.Binary)
    a = number(expr.left, scope)
    b = number(expr.right, scope)
    op = expr.op
    try:
        if op == "+":
            r = a + b
        elif op == "-":
            r = a - b
        elif op == "*":
            r = a * b
        elif op == "/":
            r = a / b
        elif op == "//":
            r = a // b
        elif op == "%":
            r = a % b
        else:
            if abs(b) > 256 or (isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and abs(b) > 62):
                raise EvalError("E0210", "the power is out of range", expr.span)
            r = a**b
            if isinstance(r, complex):
                raise EvalError("E0210", "the power has no real value", expr.span)
    except ZeroDivisionError:
        raise EvalError("E0210", "division by zero", expr.span) from None
    except OverflowError:
        raise EvalError("E0210", "the result is out of range", expr.span) from None
    return _check(r, expr.span)


BUILTINS = ("width", "vocab", "context")  # the names an engine's lets may read besides other lets


def formula(expr: ast.Expr, scope: Scope) -> str | None:
    """A let's expression as Python text over the lets and built-ins it reads, for back-ends that
    keep the spec's arithmetic (`ir.Let.formula`); None where it is a plain number or reads a
    name that is neither."""
    def text(x: ast.Expr) -> str:
        if isinstance(x, ast.Num):
            return x.text
        if isinstance(x, ast.Ref):
            b = scope.lookup(x.name)
            if b is None or (b.let is None and not (b.span is None and x.name in BUILTINS)):
                raise LookupError(x.name)
            return b.let or x.name
        if isinstance(x, ast.Group):
            return f"({text(x.inner)})"
        if isinstance(x, ast.Sqrt):
            return f"math.sqrt({text(x.arg)})"
        if isinstance(x, ast.Unary):
            return f"({x.op}{text(x.operand)})"
        return f"({text(x.left)} {x.op} {text(x.right)})"

    if isinstance(expr, ast.Num) or (isinstance(expr, ast.Unary) and isinstance(expr.operand, ast.Num)):
        return None
    try:
        return pyast.unparse(pyast.parse(text(expr), mode="eval"))
    except LookupError:
        return None


def let_ref(expr: ast.Expr | None, scope: Scope) -> str | None:
    """The let an option's value names when it is a let's bare name (`heads=heads`), else None."""
    if isinstance(expr, ast.Ref):
        b = scope.lookup(expr.name)
        return b.let if b is not None else None
    return None


def number(expr: ast.Expr, scope: Scope) -> int | float:
    """Evaluate to a number; a keyword here is a name that is not defined."""
    v = evaluate(expr, scope)
    if isinstance(v, Keyword):
        raise unknown_name(v, scope)
    if isinstance(v, bool):
        raise EvalError("E0203", "expected a number, found a boolean", expr_span(expr))
    return v


def whole(v) -> int | None:
    """A number as an exact int when it is a whole number (never through float(): 2**53 + 1 stays itself), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def unknown_name(k: Keyword, scope: Scope) -> EvalError:
    return EvalError("E0101", f"unknown name '{k.name}'", k.span, did_you_mean(k.name, scope.all_names()))


def expr_span(expr: ast.Expr) -> Span:
    return expr.span
