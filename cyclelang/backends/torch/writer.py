"""The line writer and the literals of generated code: nothing here knows a kind of part."""

from __future__ import annotations

import functools
import re
import textwrap
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
        self.in_doc = False  # inside a triple-quoted string
        self.source_map: list[tuple[int, ir.Span]] = []

    def line(self, text: str = "", span: ir.Span | None = None) -> None:
        """One line at the current indent. A line longer than WIDTH with a trailing comment
        has the comment moved above it, wrapped (the code line keeps the span)."""
        pad = "    " * self.level
        pad, text = pad + text[: len(text) - len(text.lstrip())], text.lstrip()  # a block's lines carry their indent
        doc = self.in_doc or text.startswith('"""')  # a docstring's line (prose)
        self.in_doc ^= text.count('"""') % 2 == 1
        if text.startswith("# ") and len(pad) + len(text) > WIDTH:  # a comment line: wrapped
            self.lines += [f"{pad}# {ln}" for ln in textwrap.wrap(text[2:], WIDTH - len(pad) - 2,
                                                                  break_on_hyphens=False, break_long_words=False)]
            return
        cut = trailing_comment(text) if len(pad) + len(text) > WIDTH else None
        if cut is not None and is_code(text[:cut]):
            code, note = text[:cut].rstrip(), text[cut:].lstrip("# ").rstrip()
            for ln in textwrap.wrap(note, max(WIDTH - len(pad) - 2, 40), break_on_hyphens=False):
                self.lines.append(f"{pad}# {ln}")
            text = code
        if span is not None:
            self.source_map.append((len(self.lines) + 1, span))
        if len(pad) + len(text) > WIDTH and is_code(text):
            self.lines += wrap(pad + text)
            return
        if len(pad) + len(text) > WIDTH and doc:  # a docstring's prose: wrapped at spaces, a one-line docstring opened up
            self.lines += [pad + ln for ln in textwrap.wrap(text, WIDTH - len(pad), break_on_hyphens=False,
                                                           break_long_words=False)]
            return
        self.lines.append((pad + text) if text else "")

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
        sub.level, sub.in_doc = self.level, self.in_doc
        return sub

    def extend(self, other: "Writer") -> None:
        """Append another writer's lines, its source map shifted to where they land."""
        self.source_map += [(n + len(self.lines), span) for n, span in other.source_map]
        self.lines += other.lines

    def text(self) -> str:
        out = "\n".join(self.lines).rstrip("\n") + "\n"
        return re.sub(r"\n{4,}", "\n\n\n", out)


WIDTH = 99  # the longest line the file should hold (nanoGPT's model.py stays under 100)


@functools.lru_cache(maxsize=1 << 14)  # long lines recur in every build of a spec
def trailing_comment(text: str) -> int | None:
    """Where a trailing `  # comment` starts in a line of code, or None: the first `#` outside a
    string literal, after code and two spaces. A line of a docstring has no code before it
    that closes its quotes, so nothing in it is taken for a comment."""
    quote = None
    k = 0
    while k < len(text):
        ch = text[k]
        if quote is not None:
            if ch == "\\":
                k += 1
            elif text.startswith(quote, k):
                k += len(quote) - 1
                quote = None
        elif ch in "'\"":
            quote = text[k : k + 3] if text[k : k + 3] in ('"""', "'''") else ch
            k += len(quote) - 1
        elif ch == "#":
            return k - 2 if k >= 2 and text[k - 2 : k] == "  " and text[: k - 2].strip() else None
        k += 1
    return None


@functools.lru_cache(maxsize=1 << 14)  # each probe a compile(): the same lines recur in every build
def is_code(text: str) -> bool:
    """Whether a line is a statement, a header or an argument (not a docstring's prose)."""
    s = text.strip()
    if s.startswith(("'", '"', "#")):
        return False
    s += "".join({"(": ")", "[": "]", "{": "}"}[c] for c in reversed(_unclosed(s)))  # `x = f(dict(` opens a block
    probes = (s, s + " pass", f"f({s})", f"f({s.rstrip(',')})", f"def _():\n {s}", f"def _():\n {s} pass",
              f"if 1: pass\n{s} pass", f"try: pass\n{s} pass", f"for _ in _:\n {s}")
    for probe in probes:
        try:
            compile(probe, "<line>", "exec")
            return True
        except SyntaxError:
            continue
    return False


def _unclosed(line: str) -> list[str]:
    """The brackets a line opens and leaves open, innermost last (strings skipped)."""
    stack, quote, k = [], None, 0
    while k < len(line):
        ch = line[k]
        if quote is not None:
            if ch == "\\":
                k += 1
            elif line.startswith(quote, k):
                k += len(quote) - 1
                quote = None
        elif ch in "'\"":
            quote = line[k : k + 3] if line[k : k + 3] in ('"""', "'''") else ch
            k += len(quote) - 1
        elif ch in "([{":
            stack.append(ch)
        elif ch in ")]}" and stack:
            stack.pop()
        k += 1
    return stack


def _scan(line: str):
    """(open brackets that close within the line as (start, end, depth), top-level commas per
    bracket start, string literals as (start, end))."""
    pairs, commas, strings, stack = [], {}, [], []
    k, quote, begin = 0, None, 0
    while k < len(line):
        ch = line[k]
        if quote is not None:
            if ch == "\\":
                k += 1
            elif line.startswith(quote, k):
                k += len(quote) - 1
                quote = None
                strings.append((begin, k + 1))
        elif ch in "'\"":
            quote = line[k : k + 3] if line[k : k + 3] in ('"""', "'''") else ch
            begin = k - 1 if k and line[k - 1] in "fFrRbB" else k
            k += len(quote) - 1
        elif ch in "([{":
            stack.append(k)
            commas[k] = []
        elif ch in ")]}":
            if stack:
                start = stack.pop()
                pairs.append((start, k, len(stack)))
        elif ch == "," and stack:
            commas[stack[-1]].append(k)
        k += 1
    return pairs, commas, strings


def _split_string(lit: str, room: int) -> list[str]:
    """A long (f-)string literal as adjacent literals of at most `room` characters each (and
    3 to spare for what closes the line), cut after spaces outside {}."""
    prefix = lit[: len(lit) - len(lit.lstrip("fFrRbB"))]
    q = lit[len(prefix)]
    body = lit[len(prefix) + 1 : -1]
    words, cur, depth = [], "", 0
    for ch in body:
        cur += ch
        depth += ch == "{"
        depth -= ch == "}"
        if ch == " " and depth == 0:
            words.append(cur)
            cur = ""
    words.append(cur)
    pieces, cur = [], ""
    for word in words:
        if cur and len(cur) + len(word) + len(prefix) + 2 > room - 3:
            pieces.append(cur)
            cur = ""
        cur += word
    pieces.append(cur)
    return [f"{prefix if '{' in p or 'f' not in prefix else prefix.replace('f', '').replace('F', '')}{q}{p}{q}" for p in pieces if p]


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """A long line of code as several (inside its brackets, so no backslash is needed): the
    arguments of its outermost bracket filled line by line under the first, or hanging 4
    spaces in where that column is too far right; a lone long string split into adjacent
    literals. Lines it cannot shorten stay as they are."""
    return list(_wrapped(line, width))


@functools.lru_cache(maxsize=1 << 14)  # the same long lines recur in every build of a spec
def _wrapped(line: str, width: int) -> tuple[str, ...]:
    return tuple(_wrap(line, width))


def _wrap(line: str, width: int) -> list[str]:
    pad = len(line) - len(line.lstrip())
    pairs, commas, strings = _scan(line)
    for start, end, depth in sorted(pairs, key=lambda t: (t[2], t[0])):
        items, k = [], start + 1
        for c in commas[start] + [end]:
            items.append(line[k:c].strip() + ("," if c != end else ""))
            k = c + 1
        items = [i for i in items if i not in ("", ",")]
        if len(items) == 1 and not any(line[a:b] == items[0] for a, b in strings):
            items = _operands(items[0])  # one long expression: cut before its top-level + - and or
        if len(items) == 1 and end - start > 40:
            lit = items[0]
            if any(line[a:b] == lit for a, b in strings):
                col = start + 1 if start + 1 + 40 < width else pad + 4
                parts = _split_string(lit, width - col)
                if len(parts) > 1:
                    head = line[: start + 1] + ("" if col == start + 1 else "")
                    if col == start + 1:
                        out = [head + parts[0]] + [" " * col + p for p in parts[1:]]
                    else:
                        out = [head] + [" " * col + p for p in parts]
                    out[-1] += line[end:]
                    return out
            continue
        if len(items) < 2:
            continue
        tail = line[end:]
        col = start + 1
        if col + max(len(i) for i in items) + len(tail) > width or col > 0.6 * width:
            col = pad + 4  # hanging: break after the bracket
            out, cur = [line[: start + 1]], ""
        else:
            out, cur = [], line[: start + 1]
        for n, item in enumerate(items):
            if cur.strip() and len(cur) + 1 + len(item) + (len(tail) if n == len(items) - 1 else 0) > width:
                out.append(cur.rstrip())
                cur = ""
            if not cur.strip():
                cur = " " * col + item if cur == "" else cur + item
            else:
                cur += (" " if not cur.endswith(("(", "[", "{")) else "") + item
        out.append(cur + tail)
        if any(len(ln) > width for ln in out):
            continue  # an item too long for this bracket: try an inner one
        return out
    eq = _top_assign(line) if not _unclosed(line) else None
    if eq is not None and not line.rstrip().endswith((")", "]", "}")) or eq is not None and "," in line[eq:]:
        lhs, rhs = line[:eq], line[eq + 3 :]
        if "(" + rhs not in line and not rhs.startswith("("):
            wrapped = wrap(f"{lhs} = ({rhs.rstrip()})", width)
            if len(wrapped) > 1 and all(len(ln) <= width for ln in wrapped):
                return wrapped
    return [line]


def _depth_walk(text: str):
    """(index, character, bracket depth) outside string literals."""
    depth, quote, k = 0, None, 0
    while k < len(text):
        ch = text[k]
        if quote is not None:
            if ch == "\\":
                k += 1
            elif text.startswith(quote, k):
                k += len(quote) - 1
                quote = None
        elif ch in "'\"":
            quote = text[k : k + 3] if text[k : k + 3] in ('"""', "'''") else ch
            k += len(quote) - 1
        else:
            depth += ch in "([{"
            depth -= ch in ")]}"
            yield k, ch, depth
        k += 1


def _operands(expr: str) -> list[str]:
    """An expression cut before each top-level ` + `, ` - `, ` and `, ` or ` (one piece if none)."""
    cuts = [k for k, ch, d in _depth_walk(expr) if d == 0 and ch == " "
            and any(expr.startswith(op, k) for op in (" + ", " - ", " and ", " or "))]
    pieces, prev = [], 0
    for k in cuts:
        pieces.append(expr[prev:k].strip())
        prev = k + 1
    pieces.append(expr[prev:].strip())
    return [p for p in pieces if p]


def _top_assign(line: str) -> int | None:
    """Where ` = ` (an assignment, not `==`) stands at bracket depth 0, or None."""
    for k, ch, d in _depth_walk(line):
        if d == 0 and line.startswith(" = ", k):
            return k
    return None


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
