"""Editor support: the TextMate grammar of editors/vscode and the Pygments lexer colour every
library spec (and every ```cycle fence in the docs) the way the compiler's own lexer reads it.

The expected colour of each token comes from the grammar's lexer (lark) and the tables:
a keyword terminal is a keyword, a NAME right after a directive that is one of its kinds is
a kind, a NAME written `name=` or a bare flag of the option table is an option, and so on.
The TextMate grammar is checked twice: with a small engine written here (its `match` rules,
leftmost match first, ties to the earlier rule, as TextMate scans), and with VS Code's own
engine (vscode-textmate + vscode-oniguruma, run by node) where node is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cyclelang.lsp import textmate
from cyclelang.lsp.words import kinds_of, words
from cyclelang.syntax.grammar import parser

from .conftest import ROOT, SPECS, require

VSCODE = ROOT / "editors" / "vscode"
GRAMMAR = VSCODE / "syntaxes" / "cycle.tmLanguage.json"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def _fences() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, m in enumerate(re.finditer(r"```cycle\n(.*?)```", doc.read_text("utf-8"), re.S)):
            out.append((f"{doc.name}#{i}", m.group(1)))
    return out


SOURCES = [(p.stem, p.read_text("utf-8")) for p in SPECS] + _fences()


def expected(text: str) -> list[tuple[int, int, int, str]]:
    """(line, start, end, scope) per token of the compiler's lexer; start/end are columns
    (0-based) in that line; names without a colour get 'source.cycle'."""
    w = words()
    kinds = kinds_of()
    kw_terms = {t.name: t.pattern.value for t in parser().terminals if t.pattern.type == "str" and t.pattern.value.isalpha()}
    toks = [t for t in parser().lex(text, dont_ignore=True) if t.type != "WS"]
    out = []
    for i, t in enumerate(toks):
        prev = toks[i - 1] if i else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if t.type == "COMMENT":
            scope = "comment.line.number-sign.cycle"
        elif t.type == "STRING":
            scope = "string.quoted.double.cycle"
        elif t.type in kw_terms:
            scope = "keyword.control.cycle"
        elif t.type == "NUMBER":
            scope = "constant.numeric.cycle"
        elif t.type == "NAME":
            if prev is not None and prev.type in kw_terms and t.value in kinds.get(kw_terms[prev.type], ()):
                scope = "support.type.kind.cycle"
            elif t.value in w["constants"]:
                scope = "constant.language.cycle"
            elif nxt is not None and nxt.type == "EQUAL" and nxt.start_pos == t.end_pos:
                scope = "variable.parameter.option.cycle"
            elif t.value in w["flags"]:
                scope = "variable.parameter.option.cycle"
            else:
                scope = "source.cycle"
        elif t.type in ("LBRACE", "RBRACE"):
            scope = "punctuation.section.block.cycle"
        elif t.type in ("LPAR", "RPAR", "COMMA"):
            scope = "punctuation.cycle"
        else:
            scope = "keyword.operator.cycle"
        out.append((t.line, t.column - 1, t.column - 1 + len(t.value), scope))
    return out


# --- a TextMate engine for `match` rules -------------------------------------------------------


def _compile(g: dict):
    rules = []
    for r in g["patterns"]:
        assert set(r) <= {"name", "match", "captures"}, f"the grammar keeps to match rules: {r}"
        rules.append((re.compile(r["match"]), r.get("name"), {int(k): v["name"] for k, v in r.get("captures", {}).items()}))
    return rules


def tokenize(g: dict, text: str) -> list[tuple[int, int, int, str]]:
    rules = _compile(g)
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        pos = 0
        while pos < len(line):
            best = None
            for rx, name, caps in rules:
                m = rx.search(line, pos)
                if m and m.end() > m.start() and (best is None or m.start() < best[0].start()):
                    best = (m, name, caps)
            if best is None:
                break
            m, name, caps = best
            if caps:
                for k, scope in sorted(caps.items()):
                    out.append((n, m.start(k), m.end(k), scope))
            else:
                out.append((n, m.start(), m.end(), name))
            pos = m.end()
    return out


def _scope_at(tokens, line: int, col: int) -> str:
    for ln, s, e, scope in tokens:
        if ln == line and s <= col < e:
            return scope
    return "source.cycle"


def _compare(label: str, text: str, tokens) -> None:
    bad = []
    for line, s, e, scope in expected(text):
        got = _scope_at(tokens, line, s)
        if got != scope:
            bad.append(f"{label}:{line}:{s + 1}: {text.split(chr(10))[line - 1][s:e]!r} is {got}, expected {scope}")
    assert not bad, "\n".join(bad[:20])


def test_the_committed_grammar_is_generated_from_the_tables():
    assert GRAMMAR.read_text("utf-8") == textmate.text(), "regenerate: python -m cyclelang.lsp.textmate > editors/vscode/syntaxes/cycle.tmLanguage.json"


@pytest.mark.parametrize("label, text", SOURCES, ids=[s[0] for s in SOURCES])
def test_grammar_tokenises_like_the_compiler(label, text):
    _compare(label, text, tokenize(json.loads(GRAMMAR.read_text("utf-8")), text))


def test_the_check_catches_a_wrong_grammar():
    g = json.loads(GRAMMAR.read_text("utf-8"))
    g["patterns"] = [r for r in g["patterns"] if r.get("name") != "constant.numeric.cycle"]
    text = dict(SOURCES)["gpt2"]
    with pytest.raises(AssertionError, match="constant.numeric"):
        _compare("gpt2", text, tokenize(g, text))


def _node_engine():
    node = shutil.which("node")
    modules = VSCODE / "test" / "node_modules"
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if node is None or not (modules / "vscode-textmate").is_dir():
        if ci:
            pytest.fail("node and editors/vscode/test/node_modules are missing in CI: apt-get install -y nodejs npm; npm install --prefix editors/vscode/test")
        pytest.skip("VS Code's TextMate engine is not installed (npm install --prefix editors/vscode/test)")
    return node


@pytest.mark.slow  # node tokenises every spec in a subprocess
def test_vscode_textmate_tokenises_every_library_spec(tmp_path):
    node = _node_engine()
    files = []
    for label, text in SOURCES:
        f = tmp_path / f"{label.replace('#', '_')}.cycle"
        f.write_text(text, "utf-8")
        files.append((label, text, f))
    r = subprocess.run([node, str(VSCODE / "test" / "tokenize.js"), *[str(f) for _, _, f in files]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    assert len(results) == len(files)
    for (label, text, _), res in zip(files, results):
        _compare(label, text, [tuple(t) for t in res["tokens"]])


def test_vscode_package():
    pkg = json.loads((VSCODE / "package.json").read_text("utf-8"))
    (lang,) = pkg["contributes"]["languages"]
    assert lang["id"] == "cycle" and lang["extensions"] == [".cycle"]
    assert (VSCODE / lang["configuration"]).is_file()
    (g,) = pkg["contributes"]["grammars"]
    assert (VSCODE / g["path"]).resolve() == GRAMMAR.resolve() and g["scopeName"] == json.loads(GRAMMAR.read_text())["scopeName"]
    assert pkg["contributes"]["configuration"]["properties"]["cyclelang.server.command"]["default"] == ["cyclec", "lsp"]
    conf = json.loads((VSCODE / "language-configuration.json").read_text("utf-8"))
    assert conf["comments"]["lineComment"] == "#"
    ext = (VSCODE / pkg["main"]).read_text("utf-8")
    assert "vscode-languageclient/node" in ext and "server.command" in ext
    if shutil.which("node"):
        assert subprocess.run(["node", "--check", str(VSCODE / pkg["main"])]).returncode == 0


# --- the Pygments lexer -------------------------------------------------------------------------

_PYGMENTS = {
    "comment.line.number-sign.cycle": "Comment", "string.quoted.double.cycle": "Literal.String", "keyword.control.cycle": "Keyword",
    "support.type.kind.cycle": "Name.Builtin", "constant.language.cycle": "Keyword.Constant", "variable.parameter.option.cycle": "Name.Attribute",
    "constant.numeric.cycle": "Literal.Number", "keyword.operator.cycle": "Operator", "punctuation.section.block.cycle": "Punctuation",
    "punctuation.cycle": "Punctuation", "source.cycle": "Name",
}


@pytest.mark.parametrize("label, text", SOURCES, ids=[s[0] for s in SOURCES])
def test_pygments_lexer_reads_like_the_compiler(label, text):
    require("pygments", "pip install pygments")
    from pygments.token import Error

    from cyclelang.lsp.lexer import CycleLexer

    toks = list(_with_positions(CycleLexer(), text))
    assert not [t for t in toks if t[0] in Error], label
    got = {}
    for ttype, value, ln, c in toks:
        got[(ln, c)] = str(ttype).removeprefix("Token.")
    bad = []
    for ln, s, e, scope in expected(text):
        g = got.get((ln, s), "?")
        want = _PYGMENTS[scope]
        if not (g == want or g.startswith(want + ".")):
            bad.append(f"{label}:{ln}:{s + 1}: {text.split(chr(10))[ln - 1][s:e]!r} is {g}, expected {want}")
    assert not bad, "\n".join(bad[:20])


def _with_positions(lexer, text):
    """(token type, value) with each token's (line, column) tracked, as the lexer emits them."""
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    import bisect

    for index, ttype, value in lexer.get_tokens_unprocessed(text):
        ln = bisect.bisect_right(line_starts, index)
        yield ttype, value, ln, index - line_starts[ln - 1]


def test_pygments_entry_point_is_declared():
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    assert re.search(r'\[project\.entry-points\."pygments\.lexers"\]\s*\ncycle = "cyclelang\.lsp\.lexer:CycleLexer"', text)
    require("pygments", "pip install pygments")
    from importlib.metadata import entry_points

    eps = {e.name: e for e in entry_points(group="pygments.lexers")}
    if "cycle" in eps:  # installed from this tree: pygments finds it by name
        from pygments.lexers import get_lexer_by_name

        assert get_lexer_by_name("cycle").__class__.__name__ == "CycleLexer"
