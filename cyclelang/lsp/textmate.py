"""The TextMate grammar of editors/vscode, generated from `lsp.words` (the compiler's tables):
`python -m cyclelang.lsp.textmate > editors/vscode/syntaxes/cycle.tmLanguage.json`.
A test keeps the committed file equal to this output. Only `match` rules are used, so the
grammar means the same in every TextMate engine (VS Code, Sublime, GitHub's linguist)."""

from __future__ import annotations

import json
import re

from .words import kinds_of, words


def _alt(ws) -> str:
    return "|".join(re.escape(w) for w in sorted(ws, key=len, reverse=True))


def grammar() -> dict:
    w = words()
    patterns = [
        {"name": "comment.line.number-sign.cycle", "match": "#.*$"},
        {"name": "string.quoted.double.cycle", "match": '"[^"]*"'},
    ]
    for kw, kinds in kinds_of().items():
        patterns.append({"match": rf"\b({kw})\s+({_alt(kinds)})\b",
                         "captures": {"1": {"name": "keyword.control.cycle"}, "2": {"name": "support.type.kind.cycle"}}})
    patterns += [
        {"name": "keyword.control.cycle", "match": rf"\b({_alt(w['keywords'])})\b"},
        {"name": "constant.language.cycle", "match": rf"\b({_alt(w['constants'])})\b"},
        {"match": r"\b([A-Za-z_][A-Za-z0-9_]*)(=)", "captures": {"1": {"name": "variable.parameter.option.cycle"}, "2": {"name": "keyword.operator.cycle"}}},
        {"name": "variable.parameter.option.cycle", "match": rf"\b({_alt(w['flags'])})\b"},
        {"name": "constant.numeric.cycle", "match": r"(?:\b\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?"},
        {"name": "keyword.operator.cycle", "match": r"//|\*\*|[+\-*/%=]"},
        {"name": "punctuation.section.block.cycle", "match": r"[{}]"},
        {"name": "punctuation.cycle", "match": r"[(),]"},
    ]
    return {"$schema": "https://raw.githubusercontent.com/martinring/tmlanguage/master/tmlanguage.json",
            "name": "cyclelang", "scopeName": "source.cycle", "fileTypes": ["cycle"], "patterns": patterns}


def text() -> str:
    return json.dumps(grammar(), indent=2) + "\n"


if __name__ == "__main__":  # pragma: no cover - a developer's command
    print(text(), end="")
