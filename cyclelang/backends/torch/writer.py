"""The line writer and the literals of generated code: nothing here knows a kind of part."""

from __future__ import annotations

import re
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import PurePath

from ... import ir


class Writer:
    """A tiny line writer (after Jinja2's CodeGenerator): `line`, `indent`, `blank`, `block`.

    Each output line may name the span that produced it; `source_map` keeps
    (output line number, span) pairs for tools that want to point back at the spec."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0
        self.source_map: list[tuple[int, ir.Span]] = []

    def line(self, text: str = "", span: ir.Span | None = None) -> None:
        if span is not None:
            self.source_map.append((len(self.lines) + 1, span))
        self.lines.append(("    " * self.level + text) if text else "")

    def blank(self, n: int = 1) -> None:
        for _ in range(n):
            self.lines.append("")

    def block(self, text: str) -> None:
        """Several lines of fixed text at the current indent."""
        for ln in text.strip("\n").split("\n"):
            self.line(ln.rstrip())

    def nested(self, head: str, *body: str) -> None:
        """A header line (`if ...:`, `else:`) and the lines under it."""
        self.line(head)
        with self.indent():
            for ln in body:
                self.line(ln)

    @contextmanager
    def constructor(self, *params: str):
        """`def __init__(self, ...):` and `super().__init__()`; the body goes inside."""
        self.line(f"def __init__({', '.join(['self', *params])}):")
        with self.indent():
            self.line("super().__init__()")
            yield

    @contextmanager
    def indent(self):
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def child(self) -> "Writer":
        """An empty writer at this one's indent, for text that may or may not be kept (`extend`)."""
        sub = Writer()
        sub.level = self.level
        return sub

    def extend(self, other: "Writer") -> None:
        """Append another writer's lines, its source map shifted to where they land."""
        self.source_map += [(n + len(self.lines), span) for n, span in other.source_map]
        self.lines += other.lines

    def text(self) -> str:
        out = "\n".join(self.lines).rstrip("\n") + "\n"
        return re.sub(r"\n{4,}", "\n\n\n", out)


def num(x: float | int | bool | None) -> str:
    """A Python literal for a number from the IR (repr is exact and deterministic)."""
    if x is None or isinstance(x, bool):
        return repr(x)
    if isinstance(x, int):
        return str(int(x))
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"non-finite number {x!r} in the IR")
    return repr(x)


def where(span: ir.Span | None) -> str:
    """`file.cycle:LINE` with the base name only; nothing from a path can leave a comment."""
    if span is None:
        return ""
    name = PurePath(span.file.replace("\\", "/")).name or "spec"
    name = re.sub(r"[^A-Za-z0-9._<>+-]", "_", name)[:80]
    return f"{name}:{int(span.line)}"


# What the generated file's comments say (`cyclec build --comments`): "ml", the ML words;
# "both", the ML words then a short tag with the spec line and the engine word; "none".
COMMENTS: ContextVar[str] = ContextVar("comments", default="both")
COMMENT_MODES = ("ml", "both", "none")


def tag(span, rocket: str = "") -> str:
    """`gpt2.cycle:18 · injector`, in "both" mode only ("" otherwise)."""
    if COMMENTS.get() != "both":
        return ""
    return " · ".join(x for x in (where(span), rocket) if x)


def comment(span, ml: str, rocket: str = "") -> str:
    """A trailing comment: what the line does in ML words, then the tag (`# attention · gpt2.cycle:18 · injector`)."""
    if COMMENTS.get() == "none":
        return ""
    t = tag(span, rocket)
    return f"  # {ml} · {t}" if t else f"  # {ml}"


def doc_tag(span, rocket: str = "") -> str:
    """The tag at the end of a docstring: ` (gpt2.cycle:15 · stage block)`, or ""."""
    t = tag(span, rocket)
    return f" ({t})" if t else ""


def camel(name: str) -> str:
    parts = [p for p in name.split("_") if p]
    return "".join(p[:1].upper() + p[1:] for p in parts)
