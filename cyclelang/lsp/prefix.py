"""The text before the cursor, read as the grammar reads it: its tokens and what the LALR
parser accepts next (`_lex_prefix`), the prefix cut to what decides that (`compact_prefix`),
and the statement being written (`_current_statement`). `analysis.complete` asks these.
"""

from __future__ import annotations

import re

from ..syntax.grammar import COMMENTS, parser


_KEYWORD_TERMINALS = None


def _keyword_terminals() -> dict[str, str]:
    """Terminal name -> keyword, for the grammar's alphabetic anonymous terminals."""
    global _KEYWORD_TERMINALS
    if _KEYWORD_TERMINALS is None:
        _KEYWORD_TERMINALS = {t.name: t.pattern.value for t in parser().terminals
                              if t.pattern.type == "str" and t.pattern.value.isalpha()}
    return _KEYWORD_TERMINALS


def _lex_prefix(prefix: str):
    """Feed the text before the cursor to the grammar's LALR parser: (tokens, acceptable
    terminal names), or (tokens so far, None) when the prefix has a syntax error."""
    p = parser()
    toks: list = []
    try:
        ip = p.parse_interactive(prefix)
        for t in ip.iter_parse():
            toks.append(t)
        return toks, ip.accepts()
    except Exception:  # lark's errors on a half-typed prefix: fall back to the tokens read
        return toks, None
    finally:
        COMMENTS.comments = []


_STATEMENTS = {"chamber", "throat", "feed", "nozzle", "norm", "turbine", "merge", "schedule", "init", "prechamber"}
_STARTS = _STATEMENTS | {"let", "include", "engine", "stage", "fullflow", "startup", "warmup", "clip", "betas", "decay"}
# After these a word is a name or a kind, even one spelled like a keyword (`engine throat`).
_NAMED_NEXT = {"engine", "stage", "prechamber", "fullflow", "let", "turbine", "norm", "throat", "feed", "nozzle", "schedule", "init", "merge", "=", "(", ",", "x"}
_LEX = re.compile(r'#[^\n]*|"[^"\n]*"?|[{}]|[A-Za-z_][A-Za-z0-9_]*|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?|//|\*\*|\S')


def compact_prefix(prefix: str) -> str:
    """The text before the cursor, cut to what decides what may come next: each closed
    block becomes `{}`, and at each open level only the statement being written is kept
    (the items before it are complete, whatever they were). The grammar's state after it
    is the same as after the whole prefix, and a 10,000-line spec costs a regex pass."""
    levels: list[list[str]] = [[]]
    prev = ""
    for m in _LEX.finditer(prefix):
        t = m.group()
        if t[0] == "#":
            continue
        after, prev = prev, t
        if t in _STARTS and after in _NAMED_NEXT:
            levels[-1].append(t)  # a name spelled like a keyword: `engine throat`, `act=norm`
            continue
        if t == "{":
            levels[-1].append(t)
            levels.append([])
        elif t == "}":
            if len(levels) > 1:
                levels.pop()
                levels[-1].append("}")
            else:
                levels[-1].append(t)  # unmatched: the parser will say so
        elif t in _STARTS:
            levels[-1] = [t]
        else:
            levels[-1].append(t)
    return " ".join(t for level in levels for t in level) + " "


def _current_statement(toks) -> tuple[str | None, list]:
    """The statement the cursor is inside, as (keyword, its tokens after the keyword), or
    (None, []) when the cursor sits where a statement may start."""
    kw = _keyword_terminals()
    depth = 0
    closed = False  # a block's body has closed since: the statement is complete
    for i in range(len(toks) - 1, -1, -1):
        t = toks[i]
        if t.type in ("RBRACE", "RPAR"):
            closed |= t.type == "RBRACE" and depth == 0
            depth += 1
        elif t.type in ("LBRACE", "LPAR"):
            if depth == 0:
                return None, []
            depth -= 1
        elif depth == 0 and t.type in kw and kw[t.type] in _STARTS:
            return (None, []) if closed else (kw[t.type], toks[i + 1:])
    return None, []
