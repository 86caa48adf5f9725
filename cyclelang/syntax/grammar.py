"""Loading the lark grammar, and the parse tables precomputed from it.

Building an LALR parser from the grammar takes a few hundred milliseconds, more
than the whole rest of `cyclec check`. So the tables are computed once, written
as plain Python literals to `_tables.py` (no pickle), and loaded in a few
milliseconds. The tables record the SHA-256 of the grammar they came from; if
the grammar has changed since, the parser is rebuilt from the grammar instead,
and `python -m cyclelang.syntax.grammar` regenerates the tables. A test keeps
them in step.
"""

from __future__ import annotations

import hashlib
import pprint
from functools import lru_cache
from importlib import resources
from pathlib import Path

from lark import Lark

# Every token stays in the tree and no node carries positions: the builder in parser.py
# takes a node's span from its first and last tokens, only where it needs one.
LARK_OPTIONS = dict(parser="lalr", keep_all_tokens=True, maybe_placeholders=True)
TABLES_PATH = Path(__file__).with_name("_tables.py")


def grammar_text() -> str:
    """The grammar source: inside the installed package, or at the repository root."""
    try:
        return resources.files("cyclelang").joinpath("grammar/cycle.lark").read_text("utf-8")
    except (FileNotFoundError, OSError):
        pass
    root = Path(__file__).resolve().parents[2]
    return (root / "grammar" / "cycle.lark").read_text("utf-8")


def grammar_hash(text: str | None = None) -> str:
    return hashlib.sha256((text if text is not None else grammar_text()).encode()).hexdigest()


def build_from_grammar(strict: bool = False, **callbacks) -> Lark:
    return Lark(grammar_text(), strict=strict, **LARK_OPTIONS, **callbacks)


class _CommentSink:
    """Collects comment tokens while lexing; the parser is shared, the sink is reset per parse."""

    def __init__(self) -> None:
        self.comments: list = []

    def __call__(self, token):
        self.comments.append(token)
        return token


COMMENTS = _CommentSink()


@lru_cache(maxsize=1)
def parser() -> Lark:
    """The shared LALR parser, built once per process."""
    callbacks = {"lexer_callbacks": {"COMMENT": COMMENTS}}
    try:
        from . import _tables
    except ImportError:
        _tables = None
    if _tables is not None and _tables.GRAMMAR_SHA256 == grammar_hash():
        return Lark._load_from_dict(_tables.DATA, _tables.MEMO, **callbacks)
    return build_from_grammar(**callbacks)


def tables_source() -> str:
    """The text of `_tables.py` for the current grammar."""
    from lark.grammar import Rule
    from lark.lexer import TerminalDef

    data, memo = build_from_grammar().memo_serialize([TerminalDef, Rule])
    return (
        '"""Parse tables generated from grammar/cycle.lark by `python -m cyclelang.syntax.grammar`.\n\n'
        'Do not edit by hand."""\n\n'
        "# fmt: off\n"
        f"GRAMMAR_SHA256 = {grammar_hash()!r}\n"
        f"DATA = {pprint.pformat(data, width=120, sort_dicts=True)}\n"
        f"MEMO = {pprint.pformat(memo, width=120, sort_dicts=True)}\n"
    )


if __name__ == "__main__":  # pragma: no cover - a developer's command
    TABLES_PATH.write_text(tables_source(), "utf-8")
    print(f"wrote {TABLES_PATH}")
