"""The canonical formatter: `format_text(text) -> text`.

One statement per line, two-space indents, `{` on the statement's line, options
as `name=value` with no spaces inside expressions (spaces separate options),
`let` right-hand sides spaced. Numbers keep their spelling, parentheses the
user wrote stay. Comments are kept: a comment on its own line stays before the
statement that follows it, a trailing comment stays on its statement's line,
and trailing comments on consecutive lines are aligned. At most one blank line
is kept wherever the source had one or more.

The formatter is a pure function over the syntax tree. It is checked to be
stable (`format(format(x)) == format(x)`) and to preserve meaning (the same IR
before and after); `format_text` itself verifies that every comment survived.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ast
from .parser import parse_module

INDENT = "  "
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2, "**": 4}


def expr_text(e: ast.Expr, spaced: bool = False) -> str:
    if isinstance(e, ast.Num):
        return e.text
    if isinstance(e, ast.Ref):
        return e.name
    if isinstance(e, ast.Group):
        return f"({expr_text(e.inner, spaced)})"
    if isinstance(e, ast.Sqrt):
        return f"sqrt({expr_text(e.arg, spaced)})"
    if isinstance(e, ast.Unary):
        return f"{e.op}{expr_text(e.operand, spaced)}"
    sep = " " if spaced else ""
    return f"{expr_text(e.left, spaced)}{sep}{e.op}{sep}{expr_text(e.right, spaced)}"


def _options(opts) -> str:
    parts = []
    for o in opts:
        parts.append(o.name.name if o.value is None else f"{o.name.name}={expr_text(o.value)}")
    return (" " + " ".join(parts)) if parts else ""


@dataclass
class _Line:
    indent: int
    text: str
    start: int  # source line where the construct starts (0: synthetic)
    end: int  # source line a trailing comment would sit on
    kind: str = "stmt"  # stmt | open | close | comment | blank
    comment: str | None = None


class _Printer:
    def __init__(self) -> None:
        self.lines: list[_Line] = []

    def emit(self, indent: int, text: str, start: int, end: int, kind: str = "stmt") -> None:
        self.lines.append(_Line(indent, text, start, end, kind))

    def block(self, indent: int, header: str, span, body, close, item) -> None:
        if not body:
            self.emit(indent, header + " {}", span.line, span.end_line)
            return
        self.emit(indent, header + " {", span.line, span.line, "open")
        for child in body:
            item(indent + 1, child)
        self.emit(indent, "}", close.line, close.line, "close")

    def module(self, m: ast.Module) -> None:
        for item in m.items:
            self.top(0, item)

    def top(self, ind: int, item) -> None:
        if isinstance(item, ast.Let):
            self.emit(ind, f"let {item.name.name} = {expr_text(item.value, spaced=True)}", item.span.line, item.span.end_line)
        elif isinstance(item, ast.Include):
            self.emit(ind, f'include "{item.path}"', item.span.line, item.span.end_line)
        elif isinstance(item, ast.Template):
            params = ""
            if item.params is not None:
                params = "(" + ", ".join(p.name.name + ("" if p.default is None else f"={expr_text(p.default)}") for p in item.params) + ")"
            self.block(ind, f"stage {item.name.name}{params}", item.span, item.body, item.close, self.stage_item)
        elif isinstance(item, ast.Engine):
            self.block(ind, f"engine {item.name.name}", item.span, item.body, item.close, self.engine_item)

    def engine_item(self, ind: int, item) -> None:
        if isinstance(item, ast.Let):
            self.top(ind, item)
        elif isinstance(item, ast.Stage):
            self.stage(ind, item)
        elif isinstance(item, ast.Startup):
            self.block(ind, "startup", item.span, item.body, item.close, self.startup_item)
        else:
            self.directive(ind, item)

    def stage(self, ind: int, item: ast.Stage) -> None:
        """A stage in an engine, or nested in a stage."""
        head = f"stage {item.name.name}"
        if item.template is not None:
            head += f" = {item.template.name}"
        if item.args is not None:
            head += "(" + ", ".join((f"{a.name.name}=" if a.name else "") + expr_text(a.value) for a in item.args) + ")"
        if item.repeat is not None:
            head += f" x {expr_text(item.repeat)}"
        if item.body is None:
            self.emit(ind, head, item.span.line, item.span.end_line)
        else:
            self.block(ind, head, item.span, item.body, item.close, self.stage_item)

    def stage_item(self, ind: int, item) -> None:
        if isinstance(item, ast.Stage):
            self.stage(ind, item)
        elif isinstance(item, ast.Prechamber):
            self.block(ind, f"prechamber {item.name.name}{_options(item.options)}", item.span, item.body, item.close, self.directive)
        elif isinstance(item, ast.Fullflow):
            head = "fullflow" + (f" {item.name.name}" if item.name else "")
            self.block(ind, head, item.span, item.body, item.close, self.stage_item)
        else:
            self.directive(ind, item)

    def startup_item(self, ind: int, item) -> None:
        if isinstance(item, ast.Scalar):
            self.emit(ind, item.keyword + " " + " ".join(expr_text(v) for v in item.values), item.span.line, item.span.end_line)
        else:
            self.directive(ind, item)

    def directive(self, ind: int, d: ast.Directive) -> None:
        kind = f" {d.kind.name}" if d.kind is not None else ""
        self.emit(ind, f"{d.keyword}{kind}{_options(d.options)}", d.span.line, d.span.end_line)


def _is_allow(comment: str) -> bool:
    """Might silence a diagnostic (`review.allowed_codes` reads `# allow: CODE` anywhere in a line);
    erring towards yes only moves a harmless comment onto its own line."""
    return "allow" in comment.lower()


def _place_comments(lines: list[_Line], comments: tuple[ast.Comment, ...], source_lines: list[str]) -> list[_Line]:
    own: dict[int, list[ast.Comment]] = {}
    for c in comments:
        before = source_lines[c.line - 1][: c.column - 1] if c.line - 1 < len(source_lines) else ""
        if before.strip():
            # trailing: the first printed line that starts on this source line (a diagnostic points at
            # its statement's first line, so `# allow:` must stay there: `prechamber p { ... }  # allow:
            # N101` keeps it on `prechamber p {`, not on the `}` the block's expansion ends with) ...
            # a `}` carries no diagnostic, so a statement starting on the line wins over a close before it
            # (`} nozzle head }  # allow: W110` keeps the allow on `nozzle head`)
            starting = [ln for ln in lines if ln.start == c.line and ln.kind != "comment"]
            target = next((ln for ln in starting if ln.kind != "close"), starting[0] if starting else None)
            if target is None and _is_allow(c.text):
                # ... an allow comment trailing the continuation of a statement silences nothing; joined
                # onto the statement's line it would: it goes on a line of its own instead
                own.setdefault(c.line, []).append(c)
                continue
            if target is None:  # else the last printed line that ends on it, else the last that started before it
                for ln in lines:
                    if ln.end == c.line:
                        target = ln
            if target is None:
                for ln in lines:
                    if ln.start <= c.line:
                        target = ln
            if target is not None and target.comment is None:
                target.comment = c.text
            else:
                # a statement split over lines can carry two trailing comments; joining
                # them would make one comment of two, so the second gets its own line
                own.setdefault(c.line, []).append(c)
        else:
            own.setdefault(c.line, []).append(c)

    out: list[_Line] = []
    pending = sorted(own.items())
    i = 0
    for ln in lines:
        while i < len(pending) and pending[i][0] < ln.start:
            indent = ln.indent + 1 if ln.kind == "close" else ln.indent
            for c in pending[i][1]:
                out.append(_Line(indent, c.text, c.line, c.line, "comment"))
            i += 1
        out.append(ln)
    for _, cs in pending[i:]:
        for c in cs:
            out.append(_Line(0, c.text, c.line, c.line, "comment"))
    return out


def _blank_lines(lines: list[_Line], source_lines: list[str]) -> list[_Line]:
    out: list[_Line] = []
    prev: _Line | None = None
    for ln in lines:
        if prev is not None and ln.kind != "close" and prev.kind != "open" and ln.start > prev.end + 1:
            between = source_lines[prev.end : ln.start - 1]
            if any(not s.strip() for s in between):
                out.append(_Line(0, "", 0, 0, "blank"))
        out.append(ln)
        prev = ln
    return out


def _render(lines: list[_Line]) -> str:
    texts = [INDENT * ln.indent + ln.text if ln.kind != "blank" else "" for ln in lines]
    # align trailing comments over runs of consecutive commented lines
    i = 0
    while i < len(lines):
        if lines[i].comment is None:
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j].comment is not None:
            j += 1
        col = max(len(texts[k]) for k in range(i, j)) + 2
        for k in range(i, j):
            texts[k] = texts[k].ljust(col) + lines[k].comment
        i = j
    return "\n".join(t.rstrip() for t in texts).strip("\n") + "\n"


def format_module(m: ast.Module, text: str) -> str:
    p = _Printer()
    p.module(m)
    source_lines = text.split("\n")  # lines as the parser counts them: str.splitlines also breaks at U+2028, \x0c, ...
    lines = _place_comments(p.lines, m.comments, source_lines)
    lines = _blank_lines(lines, source_lines)
    return _render(lines)


def format_text(text: str, file: str = "<string>") -> str:
    """Format spec text. Raises CycleError if it does not parse."""
    m = parse_module(text, file)
    out = format_module(m, text)
    kept = sorted(c.text for c in parse_module(out, file).comments)
    assert kept == sorted(c.text for c in m.comments), "the formatter dropped a comment"
    return out
