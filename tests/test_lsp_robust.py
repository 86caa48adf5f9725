"""`cyclec lsp` under a client that frames badly or types fast.

Each framing defect: the bad frame is reported (a line on stderr, and JSON-RPC's error
answer where JSON-RPC wants one), and the next well-framed message is served. Fast typing:
of many queued changes only the newest text is analysed, and a hover does not wait behind
the rest. A fixed-seed fuzz of frames, in process (the framer alone) and over stdio (the
whole server), keeps both true. No assertion here is about time: the server's own count of
analyses, the versions its diagnostics carry and the order of its answers are.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from .conftest import require
from .lsp_client import Client

HOVER_NOWHERE = {"textDocument": {"uri": "file:///never/opened.cycle"}, "position": {"line": 0, "character": 0}}


@pytest.fixture(scope="module")
def client():
    require("pygls", "pip install 'cyclelang[lsp]'")
    c = Client()
    c.initialize()
    yield c
    assert c.close() == 0
    err = b"".join(c.stderr).decode(errors="replace")
    assert "Traceback" not in err, err


def _frame(msg: dict) -> bytes:
    body = json.dumps(msg, ensure_ascii=False).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _stderr(c: Client) -> str:
    return b"".join(c.stderr).decode(errors="replace")


def _stderr_grows(c: Client, before: int, needle: str = "", timeout: float = 10) -> str:
    """What the server wrote to stderr after `before` characters, once it says `needle` (bounded wait)."""
    end = time.monotonic() + timeout
    while True:
        new = _stderr(c)[before:]
        if new.strip() and needle.lower() in new.lower():
            return new
        if time.monotonic() > end:
            raise AssertionError(f"nothing on stderr mentioning {needle!r}; it has: {new!r}")
        time.sleep(0.02)


def _serves(c: Client, timeout: float = 10) -> list[dict]:
    """A well-framed request after whatever was sent is answered; the messages read before
    its answer are returned."""
    c.next_id += 1
    rid = c.next_id
    seen: list[dict] = []
    c.send({"jsonrpc": "2.0", "id": rid, "method": "textDocument/hover", "params": HOVER_NOWHERE})
    r = c.wait(lambda m: seen.append(m) or m.get("id") == rid and "method" not in m, timeout)
    assert r.get("result", "missing") is None, r
    assert c.proc.poll() is None
    return seen[:-1]


_chars = json.dumps({"jsonrpc": "2.0", "method": "x/typed", "params": {"t": "naïve wörd — ≠"}}, ensure_ascii=False)
# each framing defect of the issue, as the bytes a client sends, and what stderr must mention
FRAMING = {
    "content_length_in_characters_not_bytes": (b"Content-Length: %d\r\n\r\n" % len(_chars) + _chars.encode(), "not JSON"),
    "missing_content_length_header": (b'Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{"jsonrpc":"2.0","method":"x/y"}',
                                      "without a Content-Length"),
    "missing_header_block_entirely": (b'{"jsonrpc":"2.0","method":"x/y"}', "skipped"),
    "non_numeric_content_length": (b"Content-Length: twelve\r\n\r\n{}", "not a number"),
    "negative_content_length": (b"Content-Length: -5\r\n\r\n{}", "not a number"),
    "garbage_before_the_header": (b"\x00\xffjunk on the wire ", "skipped"),
    "truncated_body": (b'Content-Length: 400\r\n\r\n{"jsonrpc":"2.0","method":"x/', "ended after"),
    "invalid_json_body": (b"Content-Length: 9\r\n\r\n{not json", "not JSON"),
    "body_json_but_not_an_object": (b"Content-Length: 7\r\n\r\n[1,2,3]", "not a JSON-RPC message"),
    "unknown_header": (b"X-Editor-Mood: cheerful\r\n" + _frame({"jsonrpc": "2.0", "id": 4242, "method": "textDocument/hover", "params": HOVER_NOWHERE}),
                       "X-Editor-Mood"),
    "content_length_past_the_cap_is_refused_unread": (b"Content-Length: 99999999999999999999\r\n\r\n{}", "refused"),
}


@pytest.mark.parametrize("defect", list(FRAMING))
def test_framing_error_is_reported_and_the_server_keeps_serving(client, defect):
    data, says = FRAMING[defect]
    before = len(_stderr(client))
    client.send_raw(data)
    seen = _serves(client)
    errors = [m for m in seen if "error" in m and "method" not in m]
    if defect == "invalid_json_body":  # JSON-RPC: a parse error is answered, with id null
        assert [(m["error"]["code"], m.get("id", "missing")) for m in errors] == [(-32700, None)]
    elif defect == "body_json_but_not_an_object":  # and an invalid request likewise
        assert [(m["error"]["code"], m.get("id", "missing")) for m in errors] == [(-32600, None)]
    elif defect == "unknown_header":  # the header is reported and ignored: the message itself is served
        assert any(m.get("id") == 4242 and m.get("result", "missing") is None for m in seen)
    _stderr_grows(client, before, says)


def test_content_length_past_memory_is_refused_with_its_body_streaming_in(client):
    """A refused length is not allocated, and its body (a mebibyte of it here) is skipped in
    chunks while the reader looks for the next header."""
    before = len(_stderr(client))
    client.send_raw(b"Content-Length: 9223372036854775807\r\n\r\n" + b'{"x":"' + b"a" * (1 << 20) + b'"}')
    _serves(client)
    _stderr_grows(client, before, "refused")


# --- fast typing ---------------------------------------------------------------------------


def _spec(n: int = 25) -> str:
    """About 300 lines: n stage templates of 12 lines and an engine using each (benchmarks/run.py's, with merges)."""
    parts = ["# \n"]
    for i in range(n):
        parts.append(f"stage s{i}(h) {{\n  prechamber mix {{\n    norm layernorm\n    turbine attention heads=h\n    merge cooling\n  }}\n"
                     f"  prechamber burn {{\n    norm layernorm\n    turbine mlp ratio=4 act=gelu\n    merge cooling\n  }}\n}}\n")
    parts.append("engine synth {\n  chamber width=64\n  throat causal\n  feed tokens vocab=256 context=64 position=learned\n")
    parts += [f"  stage s{i}(h=4)\n" for i in range(n)]
    parts.append("  norm layernorm\n  nozzle head tied\n}\n")
    return "".join(parts)


def _keystrokes(c: Client, uri: str, text: str, n: int = 200) -> tuple[bytes, int, str]:
    """n didChange notifications as one burst, as an editor sends them when the user types
    faster than the server answers: n-1 characters typed into the comment on line 0, then a
    typo (`heads` -> `haeds`) as the last. Returns the bytes, the last version and its text."""
    out = []
    for i in range(n - 1):
        out.append(_frame({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
            "textDocument": {"uri": uri, "version": 2 + i},
            "contentChanges": [{"range": {"start": {"line": 0, "character": 2 + i}, "end": {"line": 0, "character": 2 + i}}, "text": "x"}]}}))
    text = "# " + "x" * (n - 1) + text[2:]
    line = text.split("\n").index("    turbine attention heads=h")
    col = len("    turbine attention ")
    out.append(_frame({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
        "textDocument": {"uri": uri, "version": n + 1},
        "contentChanges": [{"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col + 5}}, "text": "haeds"}]}}))
    return b"".join(out), n + 1, text.replace("heads=h", "haeds=h", 1)


def _published(msgs: list[dict], uri: str) -> list[dict]:
    return [m["params"] for m in msgs if m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri]


def _analyses(c: Client) -> int | None:
    """How many texts the server has analysed (its `cyclelang/stats` request)."""
    return (c.request("cyclelang/stats", {}).get("result") or {}).get("analyses")


def test_many_fast_changes_analyse_only_the_latest(client):
    uri = "file:///tmp/robust/typing.cycle"
    text = _spec()
    assert len(text.split("\n")) >= 300
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cycle", "version": 1, "text": text}})
    assert client.diagnostics(uri, 1) == []
    before = _analyses(client)
    burst, last, _ = _keystrokes(client, uri, text)
    seen: list[dict] = []
    client.send_raw(burst)
    client.wait(lambda m: seen.append(m) or m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri
                and m["params"].get("version") == last, timeout=60)
    pub = _published(seen, uri)
    client.notifications = [m for m in client.notifications if m not in seen]
    versions = [p["version"] for p in pub]
    assert versions == sorted(versions) and versions[-1] == last  # in order, ending at the newest
    assert len(pub) <= 20, f"{len(pub)} of 200 versions were analysed and published"
    assert [d["code"] for d in pub[-1]["diagnostics"]] == ["E0201"]  # the typo of the last change
    assert _analyses(client) - before <= 20


def test_hover_does_not_wait_behind_queued_analyses(client):
    uri = "file:///tmp/robust/hover.cycle"
    text = _spec()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cycle", "version": 1, "text": text}})
    assert client.diagnostics(uri, 1) == []
    burst, last, final = _keystrokes(client, uri, text)
    client.next_id += 1
    rid = client.next_id
    line = final.split("\n").index("    turbine attention haeds=h")
    hover = _frame({"jsonrpc": "2.0", "id": rid, "method": "textDocument/hover",
                    "params": {"textDocument": {"uri": uri}, "position": {"line": line, "character": 14}}})
    seen: list[dict] = []
    client.send_raw(burst + hover)
    r = client.wait(lambda m: seen.append(m) or m.get("id") == rid and "method" not in m, timeout=60)
    assert "turbine attention" in r["result"]["contents"]["value"]  # about the newest text
    ahead = _published(seen, uri)
    assert len(ahead) <= 10, f"the hover waited behind {len(ahead)} analyses"
    assert [d["code"] for d in client.diagnostics(uri, last, timeout=60)] == ["E0201"]


def test_save_rereads_included_files(client, tmp_path):
    """Diagnostics are due on save even when the text is unchanged: an included file may have changed."""
    (tmp_path / "blocks.cycle").write_text("stage blk { prechamber p { turbine mlp } }\n", "utf-8")
    text = 'include "blocks.cycle"\nengine e {\n  chamber width=64\n  feed tokens vocab=32 context=16\n  stage blk\n  nozzle head\n}\n'
    main = tmp_path / "main.cycle"
    main.write_text(text, "utf-8")
    uri = main.as_uri()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cycle", "version": 1, "text": text}})
    assert "E0201" not in [d["code"] for d in client.diagnostics(uri, 1)]
    (tmp_path / "blocks.cycle").write_text("stage blk { prechamber p { turbine mlp ratoi=4 } }\n", "utf-8")
    client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    assert "E0201" in [d["code"] for d in client.diagnostics(uri)]


# --- fuzz ----------------------------------------------------------------------------------

METHODS = ["textDocument/hover", "textDocument/completion", "textDocument/definition", "textDocument/documentSymbol",
           "textDocument/formatting", "textDocument/codeAction", "textDocument/didChange", "textDocument/didOpen",
           "workspace/executeCommand", "$/cancelRequest", "x/unknown", "initialize", ""]


def _value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([None, True, 0, -1, 2**70, 1.5, "", "é≠\u2028", "file:///x.cycle", "\ud800", "x" * rng.randint(0, 50)])
    if r < 0.6:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["textDocument", "uri", "position", "line", "character", "text", "version", "contentChanges", "range", "id", "command"]
    return {rng.choice(keys): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _message(rng: random.Random, ident: int) -> dict:
    msg = {"jsonrpc": rng.choice(["2.0", "2.0", "2.0", "1.0", 2])}
    if rng.random() < 0.8:
        msg["method"] = rng.choice(METHODS)
    if rng.random() < 0.5:
        msg["id"] = rng.choice([ident, str(ident), None, [ident], {"n": ident}])
    if rng.random() < 0.8:
        msg["params"] = _value(rng)
    return msg


def _corrupt(rng: random.Random, ident: int) -> tuple[bytes, bool]:
    """One case: bytes, and whether they are a framing error (which must be reported on stderr)."""
    body = json.dumps(_message(rng, ident), ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    kind = rng.randrange(12)
    if kind == 0:  # well framed: whatever JSON-RPC makes of it
        return b"Content-Length: %d\r\n\r\n" % len(body) + body, False
    if kind == 1:
        return b"Content-Length: %d\r\n\r\n" % (len(body) - rng.randint(1, 3)) + body, True
    if kind == 2:
        return b"Content-Length: %d\r\n\r\n" % (len(body) + rng.randint(1, 64)) + body, True
    if kind == 3:
        return rng.choice([b"", b"\r\n", b"Content-Type: x\r\n\r\n"]) + body, True
    if kind == 4:
        return b"Content-Length: " + rng.choice([b"-1", b"abc", b"0x10", b"1e3", b"", b" ", b"\xff", b"9" * 30]) + b"\r\n\r\n" + body, True
    if kind == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 80))).replace(b"\n", b"") + b"Content-Length: %d\r\n\r\n" % len(body) + body, True
    if kind == 6:
        return b"Content-Length: %d\r\n\r\n" % len(body) + body[: rng.randrange(len(body))], True
    if kind == 7:
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        return b"Content-Length: %d\r\n\r\n" % len(junk) + junk, True
    if kind == 8:
        other = json.dumps(rng.choice([[], [1], "s", 3, None, True, [{"jsonrpc": "2.0"}]])).encode()
        return b"Content-Length: %d\r\n\r\n" % len(other) + other, True
    if kind == 9:
        return b"Content-Length: %d\r\nX-%d: y\r\n\r\n" % (len(body), ident) + body, True
    if kind == 10:
        return b"Content-Length: %d\r\n" % len(body) + body, True  # no blank line
    deep = b"[" * rng.randint(2000, 200_000)
    return b"Content-Length: %d\r\n\r\n" % len(deep) + deep, True


def _fuzz_over_stdio(n: int, seed: int) -> None:
    require("pygls", "pip install 'cyclelang[lsp]'")
    rng = random.Random(seed)
    c = Client()
    try:
        c.initialize()
        c.notify("textDocument/didOpen", {"textDocument": {"uri": "file:///x.cycle", "languageId": "cycle", "version": 1, "text": "engine e {"}})
        for i in range(n):
            data, framing_error = _corrupt(rng, 10_000 + i)
            before = len(_stderr(c))
            c.send_raw(data)
            _serves(c)  # a hang or an exit fails here
            if framing_error:
                _stderr_grows(c, before)
        assert c.close() == 0
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
    err = _stderr(c)
    assert "Traceback" not in err and "internal error" not in err, err


@pytest.mark.slow  # a server process; the in-process framing tests stay in the fast tier
def test_fuzz_jsonrpc_frames_over_stdio():
    _fuzz_over_stdio(60, seed=20260)


@pytest.mark.slow
def test_fuzz_jsonrpc_frames_over_stdio_long():
    _fuzz_over_stdio(600, seed=7)


def _fuzz_framer(n: int, seed: int) -> None:
    """The framer alone: good frames with corrupted ones between them, read in random chunk
    sizes. Every good frame comes out, in order; every corruption is a problem; it ends."""
    from cyclelang.lsp.framing import Message, Problem, frames

    rng = random.Random(seed)
    for case in range(n):
        stream, want, bad = [], [], 0
        for i in range(rng.randint(1, 8)):
            if rng.random() < 0.4:
                data, framing_error = _corrupt(rng, -1)
                if framing_error:
                    stream.append(data)
                    bad += 1
            ident = case * 100 + i
            body = json.dumps({"jsonrpc": "2.0", "id": ident, "method": "m", "params": {"t": "".join(rng.choice("aé≠\"\\{}:\n") for _ in range(rng.randint(0, 30)))}},
                              ensure_ascii=rng.random() < 0.5).encode()
            stream.append(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            want.append(ident)
        data = b"".join(stream)
        pos = 0

        def read():
            nonlocal pos
            k = rng.choice([1, 2, 7, 64, 4096, 1 << 20])
            chunk = data[pos : pos + k]
            pos += len(chunk)
            return chunk

        out = list(frames(read, max_body=1 << 20))
        got = [m.obj["id"] for m in out if isinstance(m, Message) and m.obj.get("method") == "m" and isinstance(m.obj.get("id"), int) and m.obj["id"] >= 0]
        assert got == want, (case, data[:400])
        assert bad == 0 or any(isinstance(m, Problem) for m in out), (case, data[:400])


def test_fuzz_framer_in_process():
    _fuzz_framer(300, seed=1)


@pytest.mark.slow
def test_fuzz_framer_in_process_long():
    _fuzz_framer(5000, seed=2)
