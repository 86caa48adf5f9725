"""A Pygments lexer for .cycle specs, registered as the `cycle` entry point (pygments.lexers):
```cycle fences in the docs, and any Pygments-based tool (Sphinx, mkdocs, pygmentize -l cycle).
Its words are `lsp.words`, from the compiler's tables."""

from __future__ import annotations

import re

from pygments.lexer import RegexLexer, bygroups, words as _words
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Text, Whitespace

from .words import kinds_of, words

_W = words()
_KINDS = kinds_of()


def _kind_rules():
    for kw, kinds in _KINDS.items():
        yield (r"\b(%s)(\s+)(%s)\b" % (kw, "|".join(map(re.escape, sorted(kinds, key=len, reverse=True)))),
               bygroups(Keyword, Whitespace, Name.Builtin))


class CycleLexer(RegexLexer):
    name = "cyclelang"
    aliases = ["cycle", "cyclelang"]
    filenames = ["*.cycle"]
    mimetypes = ["text/x-cycle"]
    url = "https://github.com/cyclelang"

    tokens = {
        "root": [
            (r"#[^\n]*", Comment.Single),
            (r'"[^"\n]*"', String.Double),
            *_kind_rules(),
            (_words(_W["keywords"], prefix=r"\b", suffix=r"\b"), Keyword),
            (_words(_W["constants"], prefix=r"\b", suffix=r"\b"), Keyword.Constant),
            (r"\b([A-Za-z_][A-Za-z0-9_]*)(=)", bygroups(Name.Attribute, Operator)),
            (_words(_W["flags"], prefix=r"\b", suffix=r"\b"), Name.Attribute),
            (r"(\d[\d_]*(\.[\d_]*)?|\.\d[\d_]*)([eE][+-]?\d+)?", Number),
            (r"//|\*\*|[+\-*/%=]", Operator),
            (r"[{}(),]", Punctuation),
            (r"[A-Za-z_][A-Za-z0-9_]*", Name),
            (r"\s+", Whitespace),
            (r".", Text),
        ]
    }
