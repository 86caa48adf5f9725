"""Diagnostics: one error type with a stable code and a span, rendered in one place.

Every stage of the pipeline reports problems as `Diagnostic`s; the parser and the
resolver collect as many as they can and raise one `CycleError` holding all of
them, sorted by position. `render` turns them into compiler-style text:

    specs/gpt2.cycle:7:17: error[E0101]: unknown name 'dept'
      |
    7 |   stage block x dept {
      |                 ^^^^
      = help: did you mean 'depth'?
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Iterable, Literal

from .ir import Span

Severity = Literal["error", "warning", "note"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "note": 2}


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: Severity
    message: str
    span: Span | None
    help: str | None = None
    notes: tuple[str, ...] = ()

    def sort_key(self) -> tuple:
        s = self.span
        where = (s.file, s.line, s.column) if s else ("", 0, 0)
        return (*where, SEVERITY_ORDER[self.severity], self.code, self.message)

    def to_json(self) -> dict:
        out: dict = {"code": self.code, "severity": self.severity, "message": self.message}
        if self.span is not None:
            out["span"] = self.span.model_dump()
        if self.help:
            out["help"] = self.help
        if self.notes:
            out["notes"] = list(self.notes)
        return out


class CycleError(Exception):
    """Raised by the front end and the back-ends for anything wrong with a spec.

    `diagnostics` holds every problem found (sorted by position); `sources` maps
    each file named in a span to its text so the error can be rendered anywhere.
    """

    def __init__(self, diagnostics: Iterable[Diagnostic], sources: dict[str, str] | None = None):
        self.diagnostics = sorted(diagnostics, key=Diagnostic.sort_key)
        self.sources = dict(sources or {})
        first = self.diagnostics[0] if self.diagnostics else None
        super().__init__(_one_line(first) if first else "cyclelang error")

    def render(self, color: bool = False) -> str:
        return render(self.diagnostics, self.sources, color=color)

    def __str__(self) -> str:
        """Every diagnostic, with its source line, caret, notes and help: what `cyclec` prints."""
        return self.render().rstrip("\n") if self.diagnostics else "cyclelang error"


def _one_line(d: Diagnostic) -> str:
    where = f"{d.span}: " if d.span else ""
    return f"{where}{d.severity}[{d.code}]: {d.message}"


_COLORS = {"error": "\x1b[1;31m", "warning": "\x1b[1;33m", "note": "\x1b[1;36m"}
_BOLD, _BLUE, _RESET = "\x1b[1m", "\x1b[1;34m", "\x1b[0m"


MAX_SHOWN_COLUMNS = 120  # a source line wider than this is shown as a window around the span
MAX_RENDERED = 200  # diagnostics rendered per error; a hostile spec can produce 100,000


def _shown(ch: str) -> str:
    # a spec cannot send escape sequences to the terminal through a quoted source line
    return ch if ch.isprintable() or ch == " " else "\ufffd"


def render_one(d: Diagnostic, sources: dict[str, str], color: bool = False, _lines: dict[str, list[str]] | None = None) -> str:
    def c(code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    head = f"{d.severity}[{d.code}]"
    lines = [(f"{d.span}: " if d.span else "") + c(_COLORS[d.severity], head) + c(_BOLD, f": {d.message}")]
    text = sources.get(d.span.file) if d.span else None
    if d.span is not None and text is not None:
        # split on "\n" only: that is how the parser counts lines (str.splitlines
        # would also break at \x0c, \u2028, ... and show the wrong line)
        if _lines is None:
            _lines = {}
        if d.span.file not in _lines:
            _lines[d.span.file] = text.split("\n")
        src_lines = _lines[d.span.file]
        if 1 <= d.span.line <= len(src_lines):
            src = src_lines[d.span.line - 1].rstrip("\r").expandtabs(1)
            num = str(d.span.line)
            pad = " " * len(num)
            start = max(d.span.column - 1, 0)
            if d.span.end_line == d.span.line:
                end = max(d.span.end_column - 1, start + 1)
            else:
                end = max(len(src), start + 1)
            end = min(end, max(len(src), start + 1))
            if len(src) > MAX_SHOWN_COLUMNS:
                lo = max(min(start - 40, len(src) - MAX_SHOWN_COLUMNS), 0)
                hi = lo + MAX_SHOWN_COLUMNS
                src = ("..." if lo else "") + src[lo:hi] + ("..." if hi < len(src) else "")
                shift = lo - (3 if lo else 0)
                start, end = start - shift, min(end, hi) - shift
                end = max(end, start + 1)
            src = "".join(map(_shown, src))
            lines.append(c(_BLUE, f"{pad} |"))
            lines.append(c(_BLUE, f"{num} |") + f" {src}")
            lines.append(c(_BLUE, f"{pad} |") + " " + " " * start + c(_COLORS[d.severity], "^" * (end - start)))
    gutter = " " * (len(str(d.span.line)) if d.span else 1)
    for note in d.notes:
        lines.append(f"{gutter} = note: {note}")
    if d.help:
        lines.append(f"{gutter} = help: {d.help}")
    return "\n".join(lines)


def render(diagnostics: Iterable[Diagnostic], sources: dict[str, str], color: bool = False) -> str:
    diagnostics = list(diagnostics)
    cache: dict[str, list[str]] = {}
    out = [render_one(d, sources, color, cache) for d in diagnostics[:MAX_RENDERED]]
    if len(diagnostics) > MAX_RENDERED:
        out.append(f"... and {len(diagnostics) - MAX_RENDERED} more (fix these first)")
    return "\n\n".join(out) + "\n"


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """A help line for a misspelled name, or None when nothing is close."""
    cands = sorted(set(candidates))
    match = difflib.get_close_matches(word, cands, n=1, cutoff=0.6)
    if not match:
        lowered = {c.lower(): c for c in cands}
        if word.lower() in lowered:
            match = [lowered[word.lower()]]
    return f"did you mean '{match[0]}'?" if match else None


MAX_USES_NAMED = 6  # a template's uses named in one note; the rest are counted


def _where(span: Span) -> str:
    return f"{span.file}:{span.line}"


def _use(chain: tuple[tuple[str, Span], ...]) -> str:
    """One use of a template: where the stage made from it is written and, when that is inside
    another template, where that one is used, and so on out (outermost last)."""
    *outer, (_, direct) = chain
    return _where(direct) + "".join(f" (in `{name}`, used at {_where(span)})" for name, span in reversed(outer))


def _and(items: list[str]) -> str:
    if len(items) > MAX_USES_NAMED:
        items = items[:MAX_USES_NAMED] + [f"{len(items) - MAX_USES_NAMED} more"]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def fold_template_uses(diagnostics: list[Diagnostic], uses: dict[int, tuple[str, tuple[tuple[str, Span], ...]]]) -> list[Diagnostic]:
    """A problem in a template's text is met once per use of the template: report it once, at the
    template's line, with a note naming the uses that met it. `uses` maps a diagnostic's index to
    (its template, the chain of uses it was met through: (template, where it is used), outermost
    first). A problem that differs by use (a value that one use's argument breaks) stays its own
    diagnostic and names its own uses; every other diagnostic is kept as it is, in order."""
    out: list[Diagnostic] = []
    groups: dict[tuple, tuple[int, list[str]]] = {}
    for i, d in enumerate(diagnostics):
        got = uses.get(i)
        if got is None:
            out.append(d)
            continue
        template, chain = got
        key = (d, template)
        if key not in groups:
            groups[key] = (len(out), [])
            out.append(d)
        where = _use(chain)
        if where not in groups[key][1]:
            groups[key][1].append(where)
    for (d, template), (i, wheres) in groups.items():
        out[i] = replace(d, notes=(*d.notes, f"in template `{template}`, used at {_and(wheres)}"))
    return out


@dataclass
class Collector:
    """Accumulates diagnostics during a pass instead of stopping at the first."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, message: str, span: Span | None, help: str | None = None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, "error", message, span, help, tuple(notes)))

    def warning(self, code: str, message: str, span: Span | None, help: str | None = None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, "warning", message, span, help, tuple(notes)))

    def note(self, code: str, message: str, span: Span | None, help: str | None = None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, "note", message, span, help, tuple(notes)))

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)
