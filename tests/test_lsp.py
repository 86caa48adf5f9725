"""`cyclec lsp` driven over stdio with real JSON-RPC messages, as an editor drives it.

One server process serves the whole module (it is what an editor keeps running); each
test opens its own documents. The answers are checked against the compiler's own
tables and passes: the diagnostics are `review(parse(text))`'s, the options offered are
the option table's, the formatting is `cyclec fmt`'s.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cyclelang import review as rv
from cyclelang.ir.kinds import BY_KEYWORD, MERGE_BY_KEYWORD
from cyclelang.semantics.options import options_for
from cyclelang.semantics.resolve import parse
from cyclelang.syntax.fmt import format_text

from .conftest import ROOT, SPECS, require, rotated, swept_except
from .lsp_client import Client


@pytest.fixture(scope="module")
def client():
    require("pygls", "pip install 'cyclelang[lsp]'")
    c = Client()
    init = c.initialize()
    c.capabilities = init["result"]["capabilities"]
    yield c
    assert c.close() == 0
    assert b"Traceback" not in b"".join(c.stderr), b"".join(c.stderr).decode(errors="replace")


def _open(c: Client, uri: str, text: str, version: int = 1) -> list[dict]:
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cycle", "version": version, "text": text}})
    return c.diagnostics(uri, version)


def _change(c: Client, uri: str, text: str, version: int) -> list[dict]:
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]})
    return c.diagnostics(uri, version)


def _at(text: str, needle: str, delta: int = 0) -> dict:
    """The LSP position of the first `needle` in text (plus delta characters)."""
    i = text.index(needle) + delta
    line = text.count("\n", 0, i)
    return {"line": line, "character": i - (text.rfind("\n", 0, i) + 1)}


def test_capabilities(client):
    caps = client.capabilities
    for key in ("hoverProvider", "completionProvider", "definitionProvider", "documentSymbolProvider", "documentFormattingProvider", "codeActionProvider"):
        assert caps.get(key), key
    assert "cyclelang.explain" in caps["executeCommandProvider"]["commands"]
    assert caps["textDocumentSync"]["change"] == 2  # incremental


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_library_spec(client, path: Path):
    """Each library spec: the diagnostics `cyclec check` gives, hover on each turbine kind from
    the kinds table, completion after it offering exactly the options it has not given."""
    text = path.read_text("utf-8")
    uri = path.as_uri()
    diags = _open(client, uri, text)
    expected = rv.apply_allows(rv.review(parse(text, str(path))), {str(path): text})
    assert sorted(d["code"] for d in diags) == sorted(d.code for d in expected)
    for d, e in zip(sorted(diags, key=lambda d: (d["range"]["start"]["line"], d["code"])), sorted(expected, key=lambda d: (d.span.line, d.code))):
        assert d["range"]["start"]["line"] == e.span.line - 1

    # a space after each turbine statement, where the next option would be typed
    lines = [re.sub(r"^(\s*turbine [^#]*?)\s*(#.*)?$", lambda m: m.group(1) + " " + (m.group(2) or ""), line) for line in text.split("\n")]
    _change(client, uri, "\n".join(lines), 2)
    for i, line in enumerate(lines):
        m = re.search(r"^\s*turbine (\w+)", line)
        if not m:
            continue
        kind = BY_KEYWORD[m.group(1)]
        h = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": i, "character": m.start(1) + 1}})["result"]
        assert f"turbine {kind.keyword}" in h["contents"]["value"] and kind.ml in h["contents"]["value"]
        end = len(line.split("#")[0])
        r = client.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": i, "character": end}})["result"]
        labels = {it["label"].rstrip("=") for it in r["items"] if it["kind"] == 10}
        given = {o.split("=")[0] for o in line[m.end():end].split()}
        assert labels == {o.name for o in options_for(f"turbine {kind.keyword}")} - given, line
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert client.diagnostics(uri) == []


def test_typo_diagnostic_quick_fix_and_clear(client):
    good = (ROOT / "specs" / "gpt2.cycle").read_text("utf-8")
    uri = "file:///tmp/typo/gpt2.cycle"
    assert _open(client, uri, good) == []
    bad = good.replace("turbine attention heads=12", "turbine attention haeds=12", 1)
    diags = _change(client, uri, bad, 2)
    assert [d["code"] for d in diags] == ["E0201"]
    d = diags[0]
    assert d["range"]["start"] == _at(bad, "haeds") and d["range"]["end"] == _at(bad, "haeds", 5)
    assert d["severity"] == 1 and "haeds" in d["message"]
    assert any(r["message"] == "help: did you mean 'heads'?" for r in d["relatedInformation"])
    assert any(r["message"].startswith("cyclec explain E0201") for r in d["relatedInformation"])
    actions = client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": d["range"], "context": {"diagnostics": [d]}})["result"]
    fixes = [x for x in actions if x.get("kind") == "quickfix"]
    assert len(fixes) == 1
    edit = fixes[0]["edit"]["changes"][uri][0]
    assert edit["newText"] == "heads" and edit["range"] == d["range"]
    # and one that shows `cyclec explain E0201`'s text
    (explain,) = [x for x in actions if x.get("command")]
    assert explain["command"]["arguments"] == ["E0201"] and explain["title"].startswith("Explain E0201")
    text = client.request("workspace/executeCommand", {"command": explain["command"]["command"], "arguments": ["E0201"]})["result"]
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "cyclelang.cli", "explain", "E0201"], capture_output=True, text=True, cwd=ROOT).stdout
    assert text == shown and d["data"]["explain"] == shown
    msg = client.notification("window/showMessage")
    assert msg["params"]["message"] == shown
    assert _change(client, uri, good, 3) == []
    # an incremental change, as editors send them: replace the five characters of 'heads'
    start = _at(good, "heads=12")
    end = {"line": start["line"], "character": start["character"] + 5}
    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 4},
                                            "contentChanges": [{"range": {"start": start, "end": end}, "text": "haeds"}]})
    diags = client.diagnostics(uri, 4)
    assert [d["code"] for d in diags] == ["E0201"] and diags[0]["range"]["start"] == start
    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 5},
                                            "contentChanges": [{"range": {"start": start, "end": end}, "text": "heads"}]})
    assert client.diagnostics(uri, 5) == []


def test_syntax_error_keeps_hover_working(client):
    good = (ROOT / "specs" / "gpt2.cycle").read_text("utf-8")
    uri = "file:///tmp/syntax/gpt2.cycle"
    _open(client, uri, good)
    broken = good.replace("prechamber burn {", "prechamber burn {{", 1)
    diags = _change(client, uri, broken, 2)
    assert diags and diags[0]["severity"] == 1 and diags[0]["code"].startswith("E000")
    h = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _at(broken, "turbine attention", 10)})["result"]
    assert "turbine attention" in h["contents"]["value"]  # from the last text that parsed


def test_hover_option_let_and_stage(client):
    path = ROOT / "specs" / "llama.cycle"
    text = path.read_text("utf-8")
    uri = path.as_uri()
    _open(client, uri, text)

    def hover(pos):
        return client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": pos})["result"]["contents"]["value"]

    h = hover(_at(text, "kv_heads=kv", 1))
    assert "key/value heads" in h and "default: heads" in h and "type: int" in h
    h = hover(_at(text, "act=swiglu", 1))
    assert "gelu | gelu_tanh | relu | relu2 | silu | swiglu | geglu | geglu_tanh" in h
    h = hover(_at(text, "norm rmsnorm", 6))
    assert "norm rmsnorm" in h and "valve" in h
    h = hover(_at(text, "chamber", 1))
    assert "residual stream" in h and "combustion chamber" in h
    # a stage: its template's definition, and parameters and FLOPs from the IR layout
    spec = parse(text, str(path))
    report = rv.analyze(spec)
    stage = next(s for s in report["params"]["by_stage"] if s["name"] == "llama_block")
    h = hover(_at(text, "heads=8, kv=2", 1))
    assert "parameter of stage template `llama_block`" in h
    h = hover(_at(text, "stage llama_block(heads=8", 7))
    assert "stage llama_block(heads, kv, hidden)" in h and f"{stage['params']:,} for all 8" in h and stage["path"] in h


def test_definition_let_template_param_include(client, tmp_path):
    (tmp_path / "blocks.cycle").write_text("# shared blocks\nstage blk(h) {\n  prechamber mix { turbine attention heads=h }\n}\n", "utf-8")
    text = ("include \"blocks.cycle\"\nlet d = 64\nlet heads = d / 16\n\nengine e {\n  chamber width=d\n  feed tokens vocab=32 context=16\n"
            "  stage blk(h=heads) x 2\n  nozzle head\n}\n")
    main = tmp_path / "main.cycle"
    main.write_text(text, "utf-8")
    uri = main.as_uri()
    assert _open(client, uri, text) == []

    def define(pos):
        return client.request("textDocument/definition", {"textDocument": {"uri": uri}, "position": pos})["result"]

    loc = define(_at(text, "width=d", 6))
    assert loc["uri"] == uri and loc["range"]["start"] == _at(text, "d = 64")
    loc = define(_at(text, "h=heads", 3))
    assert loc["range"]["start"] == _at(text, "heads = d")
    loc = define(_at(text, "blk(h=", 1))
    assert loc["uri"] == (tmp_path / "blocks.cycle").as_uri() and loc["range"]["start"] == {"line": 1, "character": 6}
    loc = define(_at(text, "blocks.cycle", 2))
    assert loc["uri"] == (tmp_path / "blocks.cycle").as_uri()
    # completion: template names after `stage`, the template's parameters inside its parentheses
    edited = text.replace("  stage blk(h=heads) x 2\n", "  stage blk(h=heads) x 2\n  stage \n", 1)
    _change(client, uri, edited, 2)
    pos = _at(edited, "  stage \n", 8)
    items = client.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": pos})["result"]["items"]
    assert "blk" in {i["label"] for i in items}
    pos = _at(edited, "blk(h=heads)", 4)
    items = client.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": pos})["result"]["items"]
    assert "h=" in {i["label"] for i in items}


def test_completion_keywords_kinds_and_values(client):
    text = "engine e {\n  chamber width=64\n  \n  stage b {\n    prechamber p {\n      turbine mlp\n      \n    }\n  }\n}\n"
    uri = "file:///tmp/complete/e.cycle"
    _open(client, uri, text)

    def labels(pos):
        return {i["label"] for i in client.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": pos})["result"]["items"]}

    # at engine level: the engine's statements, not a prechamber's
    got = labels({"line": 2, "character": 2})
    assert {"feed", "nozzle", "stage", "norm", "turbine", "throat", "startup", "let"} <= got and not got & {"prechamber", "merge", "warmup"}
    # after `turbine`: the kinds table's turbine keywords, nothing else
    assert labels({"line": 5, "character": 14}) == set(BY_KEYWORD)
    # inside a prechamber, after a turbine: its statements, or more options of that turbine
    # (newlines carry no meaning, so both may come next), and nothing else
    got = labels({"line": 6, "character": 6})
    assert got == {"norm", "turbine", "merge"} | {o.name + ("" if o.type == "bool" else "=") for o in options_for("turbine mlp")}
    # a choice option's values
    text2 = text.replace("turbine mlp\n", "turbine mlp act=\n")
    _change(client, uri, text2, 2)
    assert labels(_at(text2, "act=", 4)) == {"gelu", "gelu_tanh", "relu", "relu2", "silu", "swiglu", "geglu", "geglu_tanh", "swiglu_clamp"}
    # after `merge`: the merge kinds; after a merge kind: only its options
    text3 = text.replace("      \n    }", "      merge layerscale \n    }")
    _change(client, uri, text3, 3)
    assert labels(_at(text3, "merge layerscale", 6)) == set(MERGE_BY_KEYWORD)
    got = labels(_at(text3, "merge layerscale ", 17))
    assert {"init="} <= got and not got & {"heads=", "ratio=", "alpha="}


def test_document_symbols(client):
    path = ROOT / "specs" / "full_flow.cycle"
    text = path.read_text("utf-8")
    _open(client, path.as_uri(), text)
    syms = client.request("textDocument/documentSymbol", {"textDocument": {"uri": path.as_uri()}})["result"]
    engine = next(s for s in syms if s["kind"] == 2)
    spec = parse(text, str(path))
    assert engine["name"] == spec.engine.name
    stage_names = [s["name"] for s in engine["children"] if s["kind"] == 5]
    assert stage_names == [st.name for st in spec.engine.body if hasattr(st, "repeat")]
    flat = []

    def walk(s):
        flat.append(s["name"])
        for c in s.get("children", []):
            walk(c)

    walk(engine)
    assert {"mix", "burn"} <= set(flat)


def test_formatting_is_fmt(client):
    text = "engine e {chamber width=64\n feed tokens vocab=32 context=16   # the tanks\n  turbine mlp\n nozzle head }\n"
    uri = "file:///tmp/fmt/e.cycle"
    _open(client, uri, text)
    edits = client.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}})["result"]
    assert len(edits) == 1 and edits[0]["newText"] == format_text(text) and "# the tanks" in edits[0]["newText"]
    _change(client, uri, format_text(text), 2)
    assert client.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}})["result"] == []
    _change(client, uri, "engine {", 3)
    assert client.request("textDocument/formatting", {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": True}})["result"] is None


def test_bad_input_keeps_the_server_serving(client):
    uri = "file:///tmp/bad/x.cycle"
    huge = "let a = 1\n" * 150_000  # 1.5 MB, past the 1 MiB limit
    diags = _open(client, uri, huge)
    assert [d["code"] for d in diags] == ["E0010"]
    assert client.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": 5, "character": 0}})["result"]["items"] == []
    binary = bytes(range(256)).decode("latin-1") * 4
    diags = _change(client, uri, binary, 2)
    assert diags and diags[0]["severity"] == 1
    for method in ("textDocument/hover", "textDocument/completion", "textDocument/definition"):
        assert "result" in client.request(method, {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 3}})
    # malformed JSON-RPC: a body that is not JSON, then a message that is not a request
    client.send_raw(b"Content-Length: 9\r\n\r\n{not json")
    client.send({"jsonrpc": "2.0", "id": 999, "method": "textDocument/hover", "params": {"nonsense": True}})
    r = client.wait(lambda m: m.get("id") == 999)
    assert "error" in r
    # a position past the end, a document never opened
    r = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 10_000, "character": 10_000}})
    assert "result" in r or "error" in r
    client.request("textDocument/hover", {"textDocument": {"uri": "file:///never/opened.cycle"}, "position": {"line": 0, "character": 0}})
    # the document changes while a request about it is in flight: the answer is about the new text
    text = (ROOT / "specs" / "gpt2.cycle").read_text("utf-8")
    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 3}, "contentChanges": [{"text": text}]})
    h = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": _at(text, "turbine attention", 10)})["result"]
    assert "turbine attention" in h["contents"]["value"]
    assert client.proc.poll() is None


@pytest.mark.slow  # starts a second server
def test_closed_connection_ends_quietly():
    require("pygls", "pip install 'cyclelang[lsp]'")
    c = Client()
    c.initialize()
    c.notify("textDocument/didOpen", {"textDocument": {"uri": "file:///tmp/c.cycle", "languageId": "cycle", "version": 1, "text": "engine e {"}})
    c.diagnostics("file:///tmp/c.cycle")
    c.proc.stdin.close()  # the editor went away without shutdown
    assert c.proc.wait(timeout=20) == 0
    import time

    time.sleep(0.2)
    assert b"Traceback" not in b"".join(c.stderr)


@pytest.mark.slow  # a fresh process; test_hardening keeps the usage error fast
def test_without_pygls_it_is_a_usage_error(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "pygls").mkdir()
    (tmp_path / "pygls" / "__init__.py").write_text("raise ImportError('no pygls here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    r = subprocess.run([sys.executable, "-m", "cyclelang.cli", "lsp"], capture_output=True, text=True, env=env, cwd=ROOT, input="")
    assert r.returncode == 2 and "pip install" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow  # every library spec at many places; the corpus below keeps the questions fast
def test_every_question_at_every_place_answers(tmp_path):
    """In-process, over each library spec cut short at many places (text being typed): hover,
    completion, definition, symbols, formatting and quick fixes answer, never raise."""
    from cyclelang.lsp import analysis as an

    for path in SPECS:
        text = path.read_text("utf-8")
        prev = None
        for cut in range(0, len(text) + 1, max(len(text) // 12, 1)):
            a = an.analyze(text[:cut], str(path), previous=prev)
            prev = a
            lines = a.lines
            for line in range(0, len(lines), 3):
                for ch in range(0, len(lines[line]) + 1, 9):
                    an.hover(a, line, ch)
                    an.definition(a, line, ch, path.as_uri())
                    assert isinstance(an.complete(a, line, ch), list)
            an.symbols(a)
            an.format_edits(a)
            an.quick_fixes(a, path.as_uri())
            an.lsp_diagnostics(a, path.as_uri())


BROKEN = sorted((ROOT / "tests" / "bad").glob("*.cycle")) + sorted((ROOT / "tests" / "hostile").glob("*.cycle"))
# the hostile files that take over half a second to question: the full run sweeps them too
HEAVY = {"many_unknown_options", "regression_long_line_many_diagnostics", "thousands_of_stages_one_error", "two_thousand_duplicate_lets",
         "unary_chain"}


@pytest.mark.parametrize("path", swept_except(BROKEN, HEAVY), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_broken_and_hostile_specs(path):
    """The diagnostics corpus and the hostile corpus: diagnostics as check gives them, and no
    question at any sampled place raises."""
    from cyclelang.lsp import analysis as an

    text = path.read_bytes().decode("utf-8", errors="replace")
    a = an.analyze(text, str(path))
    diags = an.lsp_diagnostics(a, path.as_uri())
    assert all(d["severity"] in (1, 2, 3) and d["code"] for d in diags)
    lines = a.lines
    places = [(line, ch) for line in range(0, len(lines), max(len(lines) // 12, 1)) for ch in range(0, min(len(lines[line]), 400) + 1, 11)]
    for line, ch in places[:: max(len(places) // 60, 1)]:  # about 60 places a file: a 10,000-line file costs one parse per completion
        an.hover(a, line, ch)
        an.definition(a, line, ch, path.as_uri())
        if len(text) <= 1 << 20:
            an.complete(a, line, ch)
    an.symbols(a)
    an.format_edits(a)
    an.quick_fixes(a, path.as_uri())


@pytest.mark.parametrize("path", rotated(SPECS, 3, 1), ids=lambda p: p.stem)  # a third in the fast tier
def test_the_compacted_prefix_leaves_the_parser_where_the_full_one_does(path):
    """Completion parses `compact_prefix(prefix)` instead of the whole text before the cursor:
    at every token boundary of every library spec, the grammar accepts the same terminals
    after both, and the statement being written is the same."""
    from cyclelang.lsp.analysis import _current_statement, _lex_prefix, compact_prefix

    text = path.read_text("utf-8")
    ends = sorted({m.end() for m in re.finditer(r"\S+", text)})
    for end in ends[:: max(len(ends) // 80, 1)]:
        prefix = text[:end] + " "
        full_toks, full = _lex_prefix(prefix)
        short_toks, short = _lex_prefix(compact_prefix(prefix))
        assert short == full, (path.name, text[max(0, end - 40):end])
        stmt_full, rest_full = _current_statement(full_toks)
        stmt_short, rest_short = _current_statement(short_toks)
        assert (stmt_full, [t.value for t in rest_full]) == (stmt_short, [t.value for t in rest_short]), text[max(0, end - 40):end]
