"""Reading a statement's options against what that statement accepts.

Each statement kind reads its options through `Options`: typed getters with
defaults and ranges. At the end, `finish()` reports whatever was not read as an
unknown option, with a suggestion from the options that statement does accept.
Duplicates are reported once. Nothing raises: problems go to the collector and
the getter returns the default so that checking can go on.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..diagnostics import Collector, did_you_mean
from ..ir import Span
from ..syntax import ast
from .values import MAX_INT, EvalError, Keyword, Scope, evaluate, unknown_name

_MISSING = object()


class Options:
    def __init__(self, what: str, options: Sequence[ast.Option], scope: Scope, out: Collector, span: Span):
        self.what = what  # "turbine attention", used in messages
        self.scope = scope
        self.out = out
        self.span = span
        self.by_name: dict[str, ast.Option] = {}
        self.known: list[str] = []
        self.missing: list[str] = []
        for o in options:
            if o.name.name in self.by_name:
                out.error("E0202", f"option '{o.name.name}' is given twice", o.name.span, "keep one of them")
            else:
                self.by_name[o.name.name] = o

    def has(self, name: str) -> bool:
        return name in self.by_name

    def span_of(self, name: str) -> Span:
        o = self.by_name.get(name)
        return o.span if o is not None else self.span

    def _raw(self, name: str, required: bool):
        self.known.append(name)
        o = self.by_name.get(name)
        if o is None:
            if required:
                self.missing.append(name)  # reported by finish(), unless a misspelling explains it
            return _MISSING, None
        if o.value is None:
            return None, o  # a bare flag
        try:
            return evaluate(o.value, self.scope), o
        except EvalError as e:
            self.out.error(e.code, e.message, e.span, e.help)
            return _MISSING, None

    def _bad_keyword(self, v: Keyword) -> None:
        e = unknown_name(v, self.scope)
        self.out.error(e.code, e.message, e.span, e.help)

    def int(self, name: str, default=None, *, required=False, min: int | None = 1, max: int | None = None):
        v, o = self._raw(name, required)
        if v is _MISSING:
            return default
        if v is None:
            self.out.error("E0203", f"option '{name}' needs a value", o.span, f"write {name}=N")
            return default
        if isinstance(v, Keyword):
            self._bad_keyword(v)
            return default
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            self.out.error("E0203", f"'{name}' must be a whole number, found {_show(v)}", o.value.span)
            return default
        v = int(v)
        if max is None:
            max = MAX_INT  # steps=1e30 is a float that passes as whole: a count past 2**62 is nonsense
        if min is not None and v < min:
            self.out.error("E0205", f"'{name}' must be at least {min}, found {v}", o.value.span)
            return default
        if max is not None and v > max:
            self.out.error("E0205", f"'{name}' must be at most {max}, found {v}", o.value.span)
            return default
        return v

    def float(self, name: str, default=None, *, required=False, lo: float | None = None, hi: float | None = None,
              lo_open=False, hi_open=False, flag=_MISSING):
        v, o = self._raw(name, required)
        if v is _MISSING:
            return default
        if v is None:
            if flag is not _MISSING:
                return flag
            self.out.error("E0203", f"option '{name}' needs a value", o.span, f"write {name}=X")
            return default
        if isinstance(v, Keyword):
            self._bad_keyword(v)
            return default
        if isinstance(v, bool):
            self.out.error("E0203", f"'{name}' must be a number, found {_show(v)}", o.value.span)
            return default
        v = float(v)
        if not math.isfinite(v):
            self.out.error("E0205", f"'{name}' must be finite", o.value.span)
            return default
        bad = (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and (v > hi or (hi_open and v == hi)))
        if bad:
            left = "(" if lo_open else "["
            right = ")" if hi_open else "]"
            rng = f"{left}{_fmt(lo) if lo is not None else '-inf'}, {_fmt(hi) if hi is not None else 'inf'}{right}"
            self.out.error("E0205", f"'{name}' must be in {rng}, found {_fmt(v)}", o.value.span)
            return default
        return v

    def bool(self, name: str, default: bool) -> bool:
        v, o = self._raw(name, False)
        if v is _MISSING:
            return default
        if v is None:
            return True
        if isinstance(v, bool):
            return v
        if isinstance(v, Keyword):
            self.out.error("E0203", f"'{name}' must be true or false, found '{v.name}'", o.value.span, did_you_mean(v.name, ["true", "false"]))
        else:
            self.out.error("E0203", f"'{name}' must be true or false, found {_show(v)}", o.value.span)
        return default

    def choice(self, name: str, choices: Sequence[str], default=None, *, required=False):
        v, o = self._raw(name, required)
        if v is _MISSING:
            return default
        if v is None:
            self.out.error("E0203", f"option '{name}' needs a value", o.span, f"one of: {', '.join(choices)}")
            return default
        if isinstance(v, Keyword) and v.name in choices:
            return v.name
        shown = v.name if isinstance(v, Keyword) else _show(v)
        hint = did_you_mean(shown, choices) or f"one of: {', '.join(choices)}"
        self.out.error("E0203", f"'{name}' must be one of {', '.join(choices)}; found '{shown}'", o.value.span, hint)
        return default

    def finish(self) -> None:
        explained = set()
        for name, o in self.by_name.items():
            if name not in self.known:
                hint = did_you_mean(name, self.known)
                if hint is not None:
                    explained.add(hint.split("'")[1])
                if hint is None and self.known:
                    hint = f"{self.what} takes: {', '.join(sorted(set(self.known)))}"
                elif hint is None:
                    hint = f"{self.what} takes no options"
                self.out.error("E0201", f"unknown option '{name}' for {self.what}", o.name.span, hint)
        for name in self.missing:
            if name not in explained:
                self.out.error("E0206", f"{self.what} needs '{name}='", self.span, f"add {name}=VALUE")


def _fmt(x: float) -> str:
    return f"{x:g}"


def _show(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _fmt(v)
    return str(v)
