"""Text to syntax tree, and lark's exceptions to cyclelang diagnostics.

This module is the one boundary where lark is visible: its trees become the
dataclasses of `ast.py`, and its exceptions become `CycleError`s with friendly
messages (a missing brace points at the brace that was never closed, a
misspelled keyword gets a suggestion, an option without a value says so).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, replace

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..diagnostics import CycleError, Diagnostic, did_you_mean
from ..ir import Span
from ..ir.kinds import BY_KEYWORD
from . import ast
from .grammar import COMMENTS, parser

MAX_SOURCE_BYTES = 1 << 20  # 1 MiB: a spec is a page of text, not a data file
MAX_NESTING = 32  # braces and parentheses; the deepest real spec nests 4 braces
# operators inside one expression (a run of signs, a long sum): the tree every later walk recurses
# over stays this deep, whatever recursion limit the process has (torch's compilers raise it)
MAX_EXPR_DEPTH = 200
MAX_IDENTIFIER = 128

# Where each statement keyword may appear, for "X cannot appear here" help lines.
KEYWORD_HOMES = {
    "let": "at the top of a file or inside an engine",
    "include": "at the top of a file",
    "engine": "at the top of a file",
    "chamber": "inside an engine",
    "throat": "inside an engine",
    "feed": "inside an engine",
    "nozzle": "inside an engine",
    "startup": "inside an engine",
    "stage": "at the top of a file (a template), inside an engine or inside a stage (a nested stage)",
    "prechamber": "inside a stage or a fullflow",
    "fullflow": "inside a stage",
    "norm": "inside an engine, a stage, a fullflow or a prechamber",
    "turbine": "inside an engine, a stage or a prechamber",
    "merge": "inside a prechamber",
    "warmup": "inside startup",
    "schedule": "inside startup",
    "clip": "inside startup",
    "betas": "inside startup",
    "decay": "inside startup",
    "init": "inside startup",
}

# What each keyword means, (network, engine): hover text in the language server and the
# playground; docs/language.md says the same at length.
KEYWORD_MEANINGS = {
    "let": ("a named constant, usable in any later expression", "a line on the test-stand sheet"),
    "include": ("read another file's lets and stage templates", "parts from the shelf"),
    "engine": ("the whole network", "the engine"),
    "chamber": ("the residual stream and its width d", "the main combustion chamber"),
    "throat": ("the causal mask (causal) or none (open)", "the throat: past it, nothing travels upstream"),
    "feed": ("token embedding and positions", "tanks and feed pumps"),
    "nozzle": ("the LM head: the stream to logits", "the nozzle"),
    "startup": ("the optimiser and its schedule: warmup, LR, clipping, betas, decay, init", "the start sequence"),
    "stage": ("a block, repeated with x N; at the top of a file, a block template; inside a stage, a nested stage (a per-layer pattern)",
              "a stage of the engine; a stage of stages repeats a set of them"),
    "prechamber": ("a residual branch x + f(x): split off, do work, merge back", "a preburner driving a turbine"),
    "fullflow": ("parallel branches that all read the same state (parallel attention + MLP)", "full-flow staged combustion"),
    "norm": ("a normalisation: on a branch it is Pre-LN, in series on the main line Post-LN", "a valve"),
    "turbine": ("an operator: attention, MLP, MoE, pooling, conv or a linear map", "a turbine, the work done on the flow"),
    "merge": ("how the branch returns to the stream: plain add, scaled, cooled init, ReZero, LayerScale, DeepNorm, gate", "the junction where the exhaust returns"),
    "warmup": ("linear LR warmup over N steps", "the open-loop start sequence"),
    "schedule": ("the LR after warmup: constant, cosine or linear", "the throttle programme"),
    "clip": ("gradient-norm clipping", "a restrictor orifice"),
    "betas": ("AdamW's betas", "the POGO accumulator"),
    "decay": ("AdamW's weight decay", ""),
    "init": ("weight initialisation: normal std=X or xavier", "the chill-down"),
    "x": ("repeat the stage N times", ""),
    "sqrt": ("square root, in an expression", ""),
}

# The kinds a directive names right after its keyword, for "needs a kind" help lines.
KINDS = {
    "norm": "layernorm|rmsnorm",
    "turbine": "|".join(BY_KEYWORD),
    "throat": "causal|open",
    "feed": "tokens",
    "nozzle": "head",
    "schedule": "constant|cosine|linear",
    "init": "normal|xavier",
}

LOOKALIKES = {
    "\uff1d": "=", "\u2261": "=", "\uff5b": "{", "\uff5d": "}", "\uff08": "(", "\uff09": ")",
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00d7": "x", "\u201c": '"', "\u201d": '"',
    "\uff0c": ",", "\u2018": "'", "\u2019": "'", "\u00a0": " ", "\u3000": " ",
}


KEPT_TEXT = 64 * 1024  # the longest text whose tree parse_module keeps (every library spec is under 8 KiB)


def parse_module(text: str, file: str = "<string>") -> ast.Module:
    """Parse one file's text. Raises CycleError with every syntax problem found (one).

    The same text and file name give the same tree, kept for the texts up to KEPT_TEXT (the
    tree is immutable: frozen dataclasses of tuples and frozen spans): a library spec is
    parsed once per process, not at every load, build and check of it. A refusal is not
    kept: it is raised anew each time."""
    return _kept(text, file) if len(text) <= KEPT_TEXT else _parse(text, file)


@functools.lru_cache(maxsize=256)
def _kept(text: str, file: str) -> ast.Module:
    return _parse(text, file)


def _parse(text: str, file: str) -> ast.Module:
    sources = {file: text}
    _check_size_and_nesting(text, file, sources)
    p = parser()
    COMMENTS.comments = []
    try:
        tree = p.parse(text, on_error=lambda e: _keyword_as_option(e, text))
    except UnexpectedInput as e:
        raise CycleError([_translate(e, text, file)], sources) from None
    except LarkError as e:  # pragma: no cover - lark's other errors are grammar bugs
        raise CycleError([Diagnostic("E0005", "error", f"syntax error: {e}", Span(file=file, line=1, column=1, end_line=1, end_column=2))], sources) from None
    comments = tuple(ast.Comment(t.value.rstrip(), t.line, t.column) for t in COMMENTS.comments)
    COMMENTS.comments = []
    builder = _Builder(file)
    try:
        items = tuple(builder.top(child) for child in tree.children)
    except _TooDeep as e:
        raise CycleError([Diagnostic("E0011", "error", f"an expression nested deeper than {MAX_EXPR_DEPTH} operators", e.span,
                                     "write it in steps: name its parts with let")], sources) from None
    except RecursionError:
        raise CycleError([Diagnostic("E0011", "error", "the spec is nested too deeply", _span_at(file, text, 0), f"keep expressions under {MAX_NESTING} levels of nesting")], sources) from None
    if builder.errors:
        raise CycleError(builder.errors, sources)
    return ast.Module(file=file, items=items, comments=comments)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EQUALS_NEXT = re.compile(r"[ \t\r\n]*=(?!=)")


def _keyword_as_option(e, text: str) -> bool:
    """Keywords do not steal option names: a keyword where an option name may stand, followed by
    '=', is that option (`merge rezero init=0.5`, where `init` is also startup's keyword). The LALR
    tables share the state after an option between every statement, so there the lexer sees the
    keyword; it is fed to the parser as the name it is and parsing resumes. Any other unexpected
    token stays an error."""
    if not isinstance(e, UnexpectedToken) or e.token.type == "NAME" or not _NAME.match(str(e.token.value)):
        return False
    if "NAME" not in e.interactive_parser.accepts() or not _EQUALS_NEXT.match(text, e.token.end_pos or 0):
        return False
    e.interactive_parser.feed_token(Token.new_borrow_pos("NAME", e.token.value, e.token))
    return True


# --- limits checked before lark sees the text ---------------------------------------


def _span_at(file: str, text: str, offset: int, length: int = 1) -> Span:
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return Span(file=file, line=line, column=col, end_line=line, end_column=col + length)


# A comment (to the end of the line), a string (to its quote or the end of the line), or a
# bracket: one regex pass instead of a Python loop over every character.
_SKIP_OR_BRACKET = re.compile(r'#[^\n]*|"[^"\n]*["\n]?|[{}()]')


def _brackets(text: str):
    """(offset, char) of every bracket outside comments and strings."""
    for m in _SKIP_OR_BRACKET.finditer(text):
        ch = m.group()
        if ch in ("{", "}", "(", ")"):
            yield m.start(), ch


def _check_size_and_nesting(text: str, file: str, sources: dict) -> None:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
        raise CycleError([Diagnostic("E0010", "error", f"the spec is larger than {MAX_SOURCE_BYTES // 1024} KiB", _span_at(file, text, 0), "split it into files joined with include")], sources)
    depth = 0
    for i, ch in _brackets(text):
        if ch in "{(":
            depth += 1
            if depth > MAX_NESTING:
                raise CycleError([Diagnostic("E0011", "error", f"nesting deeper than {MAX_NESTING} levels", _span_at(file, text, i), "blocks nest at most engine > stage (> nested stages) > fullflow > prechamber; simplify the expression")], sources)
        else:
            depth = max(depth - 1, 0)


def _unclosed_brace(text: str) -> int | None:
    """Offset of the innermost '{' that is never closed, or None."""
    stack: list[int] = []
    for i, ch in _brackets(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            stack.pop()
    return stack[-1] if stack else None


# What each block's body holds (the top of a file: None), for "is a '}' missing?": a statement
# that a block left open around it would take suggests the innermost one was not closed; one that
# no open block takes is just in the wrong place.
BLOCK_HOLDS: dict[str | None, frozenset[str]] = {
    None: frozenset({"let", "include", "stage", "engine"}),
    "engine": frozenset({"chamber", "throat", "feed", "stage", "norm", "turbine", "nozzle", "startup", "let"}),
    "stage": frozenset({"prechamber", "fullflow", "norm", "turbine", "stage"}),
    "prechamber": frozenset({"norm", "turbine", "merge"}),
    "fullflow": frozenset({"norm", "prechamber"}),
    "startup": frozenset({"warmup", "schedule", "clip", "betas", "decay", "init", "param"}),
}


@dataclass(frozen=True)
class _Block:
    """A block's '{': where it is, the keyword that opened it and its name (None: unnamed);
    `close`: the offset of the '}' that closes it, None while it is open."""

    offset: int
    keyword: str | None
    name: str | None
    template: bool = False  # a stage at the top of a file
    close: int | None = None

    def describe(self) -> str:
        if self.keyword is None:
            return "a block"
        word = "stage template" if self.template else self.keyword
        return f"{word} '{self.name}'" if self.name else f"the {word}"


def _blocks(text: str) -> tuple[list[_Block], list[_Block]]:
    """(the blocks still open at the end of `text`, outermost first; the blocks closed in it), each
    named by the statement that opened it. Braces pair by count: `text` is a prefix the parser
    accepted, so this is the parser's own view of what is open."""
    opened: list[_Block] = []
    closed: list[_Block] = []
    pending: list = []  # (keyword, name) of the block statement being read
    try:
        tokens = list(parser().lex(text))
    except LarkError:  # pragma: no cover - the text was parsed up to here
        tokens = []
        for i, ch in _brackets(text):
            if ch == "{":
                opened.append(_Block(i, None, None))
            elif ch == "}" and opened:
                closed.append(replace(opened.pop(), close=i))
        return opened, closed
    for tok in tokens:
        word = _keyword_of(tok.type) if tok.type != "NAME" else None
        if word is not None and word in BLOCK_HOLDS:
            pending = [word, None]
        elif tok.type == "NAME" and pending and pending[1] is None and pending[0] != "startup":
            pending[1] = str(tok.value)
        elif tok.value == "{":
            kw, name = pending if pending else (None, None)
            opened.append(_Block(tok.start_pos, kw, name, template=kw == "stage" and not opened))
            pending = []
        elif tok.value == "}":
            if opened:
                closed.append(replace(opened.pop(), close=tok.start_pos))
            pending = []
    return opened, closed


def _indent(text: str, offset: int) -> tuple[int, bool]:
    """(the indentation of the line holding `offset`, whether only blanks come before it there)."""
    start = text.rfind("\n", 0, offset) + 1
    head = text[start:offset]
    line = text[start:]
    return len(line) - len(line.lstrip(" \t")), not head.strip(" \t")


def _misplaced_close(text: str, closed: list[_Block], inside: int) -> _Block | None:
    """A block (opened after offset `inside`) closed by a '}' that starts a line indented less
    than the line of its '{': the '}' most likely belongs to an outer block, and this block's own
    '}' is the one missing. The first such '}' in the text; None when the indentation agrees."""
    suspects = []
    for b in closed:
        if b.offset <= inside or b.close is None:
            continue
        close_indent, first = _indent(text, b.close)
        if first and close_indent < _indent(text, b.offset)[0]:
            suspects.append(b)
    return min(suspects, key=lambda b: b.close) if suspects else None


def _open_block_note(text: str, file: str, upto: int, word: str | None = None) -> tuple[_Block, str] | None:
    """The block most likely left open before offset `upto`, and a help line that says so, with
    the line and column of its '{'. With `word` (the statement keyword found there), only when a
    block around the innermost one would take that statement: else no brace is missing."""
    opened, closed = _blocks(text[:upto])
    if not opened:
        return None
    if word is not None:
        outer = [None] + [b.keyword for b in opened[:-1]]
        if not any(word in BLOCK_HOLDS.get(k, frozenset()) for k in outer):
            return None
    moved = _misplaced_close(text, closed, opened[-1].offset)
    block = moved or opened[-1]
    help = f"is the '}}' closing {block.describe()} (its '{{' at {_span_at(file, text, block.offset)}) missing?"
    if moved is not None and moved.close is not None:
        help = f"the '}}' on line {text.count(chr(10), 0, moved.close) + 1} is indented like an outer block's: " + help
    return block, help


# --- lark exceptions to diagnostics -----------------------------------------------


def _describe(term: str) -> str:
    try:
        pattern = parser().get_terminal(term).pattern
    except (KeyError, AttributeError):
        return term.lower()
    if pattern.type == "str":
        return f"'{pattern.value}'"
    return {"NAME": "a name", "NUMBER": "a number", "STRING": "a string"}.get(term, term.lower())


def _keyword_of(term: str) -> str | None:
    try:
        pattern = parser().get_terminal(term).pattern
    except (KeyError, AttributeError):
        return None
    return pattern.value if pattern.type == "str" and pattern.value.isalpha() else None


def _token_span(file: str, tok: Token) -> Span:
    end_line = tok.end_line or tok.line
    end_col = tok.end_column or (tok.column + max(len(tok.value), 1))
    return Span(file=file, line=tok.line, column=tok.column, end_line=end_line, end_column=end_col)


def _prev_tokens(text: str, tok: Token, count: int) -> list[Token]:
    """The `count` tokens before `tok`, lexed with the basic lexer (good enough for hints)."""
    out: list[Token] = []
    try:
        for t in parser().lex(text[: tok.start_pos]):
            out.append(t)
    except LarkError:
        return []
    return out[-count:]


def _translate(e: UnexpectedInput, text: str, file: str) -> Diagnostic:
    if isinstance(e, UnexpectedCharacters):
        offset = e.pos_in_stream
        ch = text[offset] if offset < len(text) else ""
        span = _span_at(file, text, offset)
        if ch == '"':
            return Diagnostic("E0009", "error", "unterminated string", span, "close the string with '\"' on the same line")
        if ch in LOOKALIKES:
            name = unicodedata.name(ch, "unknown")
            return Diagnostic("E0002", "error", f"unexpected character '{ch}' (U+{ord(ch):04X} {name})", span, f"this looks like '{LOOKALIKES[ch]}'; use the ASCII character")
        shown = ch if ch.isprintable() else repr(ch)[1:-1]
        code = f" (U+{ord(ch):04X})" if ch and ord(ch) > 127 else ""
        return Diagnostic("E0002", "error", f"unexpected character '{shown}'{code}", span, "names are ASCII letters, digits and '_'; comments start with '#'" if ord(ch or " ") > 127 else None)

    if isinstance(e, UnexpectedEOF) or (isinstance(e, UnexpectedToken) and e.token.type == "$END"):
        found = _open_block_note(text, file, len(text))
        if found is not None:
            block, help = found
            return Diagnostic("E0003", "error", f"this '{{' of {block.describe()} is never closed", _span_at(file, text, block.offset),
                              "add the matching '}'" if help.startswith("is the") else help)
        end = len(text.rstrip()) or 0
        expected = sorted(_describe(t) for t in getattr(e, "expected", ()) if t != "$END")
        return Diagnostic("E0008", "error", "unexpected end of file", _span_at(file, text, max(end - 1, 0)), f"expected {_one_of(expected)}" if expected else None)

    assert isinstance(e, UnexpectedToken)
    tok = e.token
    span = _token_span(file, tok)
    expected = set(e.expected)
    value = tok.value

    if tok.type == "RBRACE" and "RBRACE" not in expected and _unclosed_brace(text[: tok.start_pos]) is None:
        return Diagnostic("E0004", "error", "unmatched '}'", span, "remove it, or add the '{' it should close")

    prev = _prev_tokens(text, tok, 3)
    if prev and prev[-1].type == "EQUAL" and len(prev) >= 2 and prev[-2].type == "NAME":
        return Diagnostic("E0007", "error", f"option '{prev[-2].value}' has no value after '='", _token_span(file, prev[-2]), f"write {prev[-2].value}=VALUE, or drop the '=' for a flag")
    if tok.type == "EQUAL" and len(prev) >= 3 and prev[-1].type == "NAME" and prev[-2].type == "EQUAL" and prev[-3].type == "NAME":
        return Diagnostic("E0007", "error", f"option '{prev[-3].value}' has no value after '='", _token_span(file, prev[-3]), f"write {prev[-3].value}=VALUE, or drop the '=' for a flag")

    keywords = sorted(k for k in (_keyword_of(t) for t in expected) if k)
    if tok.type == "NAME" and keywords:
        hint = did_you_mean(value, keywords)
        close = did_you_mean(value, KEYWORD_HOMES)
        if close and close != hint:
            word = close.split("'")[1]
            hint = f"{close} ('{word}' belongs {KEYWORD_HOMES[word]})"
        if hint:
            return Diagnostic("E0006", "error", f"unknown statement '{value}'", span, hint)
        return Diagnostic("E0006", "error", f"unknown statement '{value}'", span, f"expected {_one_of(sorted(_describe(t) for t in expected))}")
    if prev and expected == {"NAME"} and prev[-1].value in KINDS:
        word = prev[-1].value
        return Diagnostic("E0005", "error", f"'{word}' needs a kind", _token_span(file, prev[-1]), f"write '{word} {KINDS[word]}'")

    word = _keyword_of(tok.type)
    if word and word in KEYWORD_HOMES:
        home = f"'{word}' belongs {KEYWORD_HOMES[word]}"
        opened, _ = _blocks(text[: tok.start_pos])
        where = f"inside {opened[-1].describe()}" if opened else "at the top of a file"
        found = _open_block_note(text, file, tok.start_pos, word)
        help = f"{found[1]} ({home})" if found is not None else home
        return Diagnostic("E0005", "error", f"'{word}' cannot appear {where}", span, help)
    if tok.type == "LBRACE":
        return Diagnostic("E0005", "error", "unexpected '{'", span, f"expected {_one_of(sorted(_describe(t) for t in expected))}")
    shown = f"'{value}'" if value else tok.type
    return Diagnostic("E0005", "error", f"unexpected {shown}", span, f"expected {_one_of(sorted(_describe(t) for t in expected))}")


def _one_of(items: list[str]) -> str:
    items = list(dict.fromkeys(items))
    if len(items) == 1:
        return items[0]
    if len(items) > 8:
        return ", ".join(items[:8]) + ", ..."
    return "one of " + ", ".join(items)


# --- lark tree to syntax tree ---------------------------------------------------------


# The parser keeps every token (keep_all_tokens) and builds no positions: a node's span is
# the span from its first token to its last, keywords and braces included, found here
# only for the nodes that need one. This is what lark's propagate_positions computes,
# for every reduction, at a third of the parse time.
CONTENT = frozenset({"NAME", "NUMBER", "STRING"})  # every other token is a keyword or punctuation


def _content(t: Tree) -> list:
    """A node's children without its keywords and punctuation (placeholders stay)."""
    return [c for c in t.children if not (type(c) is Token and c.type not in CONTENT)]


def _edge(t: Tree, last: bool) -> Token | None:
    """The first (or last) token under t."""
    for c in reversed(t.children) if last else t.children:
        if type(c) is Token:
            return c
        if c is not None:
            tok = _edge(c, last)
            if tok is not None:
                return tok
    return None


class _TooDeep(Exception):
    def __init__(self, span):
        self.span = span


class _Builder:
    def __init__(self, file: str):
        self.file = file
        self.errors: list[Diagnostic] = []

    def span(self, node: Tree | Token) -> Span:
        if isinstance(node, Token):
            return _token_span(self.file, node)
        first, last = _edge(node, False), _edge(node, True)
        if first is None:
            return Span(file=self.file, line=1, column=1, end_line=1, end_column=2)
        return Span(file=self.file, line=first.line, column=first.column, end_line=last.end_line, end_column=last.end_column)

    def close_span(self, node: Tree) -> Span:
        last = _edge(node, True)
        return Span(file=self.file, line=last.end_line, column=max(last.end_column - 1, 1), end_line=last.end_line, end_column=last.end_column)

    def ident(self, tok: Token) -> ast.Ident:
        if len(tok.value) > MAX_IDENTIFIER:
            self.errors.append(Diagnostic("E0012", "error", f"name longer than {MAX_IDENTIFIER} characters", self.span(tok), "use a shorter name"))
        return ast.Ident(str(tok.value), self.span(tok))

    # top level
    def top(self, t: Tree):
        return getattr(self, "t_" + t.data)(t)

    def t_let_stmt(self, t: Tree) -> ast.Let:
        name, value = _content(t)
        return ast.Let(self.ident(name), self.expr(value), self.span(t))

    def t_include_stmt(self, t: Tree) -> ast.Include:
        (s,) = _content(t)
        return ast.Include(str(s.value)[1:-1], self.span(t))

    def t_template(self, t: Tree) -> ast.Template:
        name, params, *body = _content(t)
        ps = None if params is None else tuple(self.param(p) for p in params.children if type(p) is Tree)
        return ast.Template(self.ident(name), ps, tuple(self.stage_item(c) for c in body), self.span(t), self.close_span(t))

    def param(self, t: Tree) -> ast.Param:
        name, *default = _content(t)  # [NAME, expr] or [NAME, None, None]: "=" expr left out
        return ast.Param(self.ident(name), None if default[-1] is None else self.expr(default[-1]), self.span(t))

    def t_engine(self, t: Tree) -> ast.Engine:
        name, *body = _content(t)
        return ast.Engine(self.ident(name), tuple(self.engine_item(c) for c in body), self.span(t), self.close_span(t))

    def engine_item(self, t: Tree):
        if t.data == "stage":
            return self.stage(t)
        if t.data == "startup":
            return self.startup(t)
        if t.data == "let_stmt":
            return self.t_let_stmt(t)
        return self.directive(t)

    def stage(self, t: Tree) -> ast.Stage:
        name, alias, args, repeat, body = _content(t)
        template = self.ident(_content(alias)[0]) if alias is not None else None
        arg_list = None
        if args is not None:
            arg_list = tuple(self.arg(a) for a in args.children if type(a) is Tree)
        rep = self.expr(_content(repeat)[0]) if repeat is not None else None
        items = None
        close = None
        if body is not None:
            items = tuple(self.stage_item(c) for c in _content(body))
            close = self.close_span(body)
        return ast.Stage(self.ident(name), template, arg_list, rep, items, self.span(t), close)

    def arg(self, t: Tree) -> ast.Arg:
        if t.data == "named_arg":
            name, value = _content(t)
            return ast.Arg(self.ident(name), self.expr(value), self.span(t))
        (value,) = _content(t)
        return ast.Arg(None, self.expr(value), self.span(t))

    def stage_item(self, t: Tree):
        if t.data == "stage":  # a nested stage
            return self.stage(t)
        if t.data == "prechamber":
            return self.prechamber(t)
        if t.data == "fullflow":
            name, *body = _content(t)
            items = tuple(self.prechamber(c) if c.data == "prechamber" else self.directive(c) for c in body)
            return ast.Fullflow(None if name is None else self.ident(name), items, self.span(t), self.close_span(t))
        return self.directive(t)

    def prechamber(self, t: Tree) -> ast.Prechamber:
        name, *rest = _content(t)
        options = tuple(self.option(c) for c in rest if c.data == "option")
        body = tuple(self.directive(c) for c in rest if c.data != "option")
        return ast.Prechamber(self.ident(name), options, body, self.span(t), self.close_span(t))

    def startup(self, t: Tree) -> ast.Startup:
        items = []
        for c in _content(t):
            if c.data in ("schedule", "init", "parametrization"):
                d = self.directive(c)
                items.append(d if c.data != "parametrization" else ast.Directive("param", d.kind, d.options, d.span))
            else:
                items.append(ast.Scalar(str(c.data), tuple(self.expr(v) for v in _content(c)), self.span(c)))
        return ast.Startup(tuple(items), self.span(t), self.close_span(t))

    def directive(self, t: Tree) -> ast.Directive:
        keyword = str(t.data)
        children = _content(t)
        kind = None
        if children and isinstance(children[0], Token):
            kind = self.ident(children.pop(0))
        options = tuple(self.option(c) for c in children)
        return ast.Directive(keyword, kind, options, self.span(t))

    def option(self, t: Tree) -> ast.Option:
        name, *value = _content(t)  # [NAME, expr] or [NAME, None, None]: "=" expr left out
        return ast.Option(self.ident(name), None if value[-1] is None else self.expr(value[-1]), self.span(t))

    # expressions
    _BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**"}

    def expr(self, t: Tree, depth: int = 0) -> ast.Expr:
        span = self.span(t)
        d = t.data
        if d == "number":
            return ast.Num(str(t.children[0].value), span)
        if d == "ref":
            return ast.Ref(self.ident(t.children[0]).name, span)
        if depth >= MAX_EXPR_DEPTH:
            raise _TooDeep(span)
        if d == "group":
            return ast.Group(self.expr(_content(t)[0], depth + 1), span)
        if d == "sqrt":
            return ast.Sqrt(self.expr(_content(t)[0], depth + 1), span)
        if d in ("neg", "pos"):
            return ast.Unary("-" if d == "neg" else "+", self.expr(_content(t)[0], depth + 1), span)
        left, right = _content(t)
        return ast.Binary(self._BINARY[d], self.expr(left, depth + 1), self.expr(right, depth + 1), span)
