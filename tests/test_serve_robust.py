"""`cyclec serve` under clients that stall, crowd in or send nonsense.

A stalled connection is closed; at most `max_connections` are served at once and the rest
wait in the listen backlog; fifty parallel requests all succeed; a malformed, oversized or
deeply nested request is a 4xx with a JSON error; every answer forbids framing. A fixed-seed
fuzz of raw HTTP requests keeps all of it true: no 5xx, no traceback, no hang. Every server
here binds 127.0.0.1, every socket has a timeout, and every server is stopped.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import urllib.error
import urllib.request

import pytest

from cyclelang.serve import app
from cyclelang.serve.app import Handler, make_server

from .conftest import need

TINY = "engine tiny {\n  chamber width=64\n  feed tokens vocab=256 context=32\n  turbine mlp\n  nozzle head\n}\n"


@contextlib.contextmanager
def running(**kw):
    srv = make_server(0, quiet=True, **kw)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=10)


def _raw(port: int, data: bytes, timeout: float = 10, shut: bool = True) -> bytes:
    """Send raw bytes, close our side, read until the server closes (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):  # the server may refuse before reading it all
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        out = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(1 << 16):
                out += chunk
        return out


def _status(resp: bytes) -> tuple[int, dict, bytes]:
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1."), resp[:200]
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _post(port: int, body: bytes, ctype: str = "application/json") -> bytes:
    return (b"POST /api/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + ctype.encode()
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


# --- stalled and crowding clients -------------------------------------------------------------


def test_stalled_connection_is_closed():
    assert Handler.timeout is not None and Handler.timeout <= 60  # the default closes a stalled connection
    with running(timeout=0.3, request_deadline=1) as srv:  # the deadline only has to outlast the 0.3 s stall timeout
        port = srv.server_address[1]
        for stall in (b"", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n", _post(port, b'{"text": "spec"}')[:-3]):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(stall)  # ...and then nothing, without closing
                _until_closed(s)
        # a client trickling a byte at a time (never stalling a whole timeout) is cut off at the deadline
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            trickle = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 2000
            for sent in range(len(trickle)):
                try:
                    s.sendall(trickle[sent : sent + 1])
                    s.settimeout(0.05)
                    if s.recv(1) == b"":
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            assert sent < len(trickle) - 1, "a trickling client was never cut off"


def _until_closed(s: socket.socket) -> None:
    """Read until the server closes the connection; the socket's timeout bounds the wait."""
    s.settimeout(10)
    try:
        while s.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError("the server kept a stalled connection open") from None


def test_concurrent_connections_are_capped_and_wait_in_the_backlog():
    with running(timeout=0.5, max_connections=3) as srv:
        port = srv.server_address[1]
        assert srv.max_connections == 3
        stalled = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/initial", timeout=20) as r:
                assert r.status == 200  # served once the stalled ones were timed out
        finally:
            for s in stalled:
                s.close()
        assert srv.peak_connections <= 3


def test_default_connection_cap_is_finite():
    srv = make_server(0, quiet=True)
    try:
        assert 1 <= srv.max_connections <= 64
    finally:
        srv.server_close()


def test_fifty_parallel_requests_all_succeed():
    with running() as srv:
        assert srv.request_queue_size >= 128
        port = srv.server_address[1]
        barrier = threading.Barrier(50)
        results: list = []

        def one():
            barrier.wait(timeout=30)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/language", timeout=30) as r:
                    results.append(r.status)
            except OSError as e:
                results.append(repr(e))

        threads = [threading.Thread(target=one) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results == [200] * 50


# --- malformed requests ------------------------------------------------------------------------


def test_deeply_nested_json_body_is_a_400():
    with running() as srv:
        port = srv.server_address[1]
        for body in (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"[" * 200_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
            code, headers, out = _status(_raw(port, _post(port, body)))
            assert code == 400 and headers["content-type"] == "application/json", (code, out[:200])
            assert "nested" in json.loads(out)["error"]


@pytest.mark.parametrize("case", ["negative_length", "letters_length", "two_lengths", "chunked", "short_body", "not_an_object",
                                  "text_not_a_string", "bad_utf8", "unknown_method", "http_0_9", "http_2", "bad_origin_url"])
def test_malformed_request_is_a_4xx_with_a_json_error(case):
    with running() as srv:
        port = srv.server_address[1]
        base = b"POST /api/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        data = {
            "negative_length": base + b"Content-Length: -5\r\n\r\n{}",
            "letters_length": base + b"Content-Length: ten\r\n\r\n{}",
            "two_lengths": base + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{} ",
            "chunked": base + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "short_body": base + b"Content-Length: 100\r\n\r\n{}",
            "not_an_object": _post(port, b"[1, 2]"),
            "text_not_a_string": _post(port, b'{"text": {"a": 1}}'),
            "bad_utf8": _post(port, b'{"text": "\xff\xfe"}'),
            "unknown_method": b"BREW /api/analyze HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "http_0_9": b"GET /\r\n",
            "http_2": b"GET / HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n",
            "bad_origin_url": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://[::1\r\n\r\n",
        }[case]
        code, headers, body = _status(_raw(port, data))
        assert 400 <= code < 500, (code, body[:200])
        assert headers["content-type"] == "application/json" and json.loads(body)["error"]
        assert "frame-ancestors 'none'" in headers["content-security-policy"]


# --- security headers ------------------------------------------------------------------------


def test_csp_forbids_framing_on_every_answer():
    assert "frame-ancestors 'none'" in app.SECURITY_HEADERS["Content-Security-Policy"]
    with running() as srv:
        port = srv.server_address[1]
        for req in (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"GET /static/app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                    b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n",
                    _post(port, b"{not json"), b"NONSENSE\r\n\r\n"):
            code, headers, _ = _status(_raw(port, req))
            csp = headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp and "object-src 'none'" in csp, (code, csp)
            assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
            assert headers["cache-control"] == "no-store" and headers["referrer-policy"] == "no-referrer"
            assert headers["cross-origin-resource-policy"] == "same-origin"
            assert "python" not in headers.get("server", "").lower()


# --- fuzz ------------------------------------------------------------------------------------


def _fuzz_request(rng: random.Random, port: int) -> bytes:
    method = rng.choice([b"GET"] * 3 + [b"POST"] * 8 + [b"HEAD", b"PUT", b"OPTIONS", b"DELETE", b"G\xffT", b""])
    path = b"/api/analyze" if method == b"POST" and rng.random() < 0.8 else rng.choice([
        b"/", b"/api/analyze", b"/api/initial", b"/api/language", b"/static/app.js", b"/static/../app.py",
        b"/%00", b"/" + b"a" * rng.randint(1, 70_000), b"*", b"http://127.0.0.1/", b"/?q=\xff"])
    version = rng.choice([b"HTTP/1.1"] * 6 + [b"HTTP/1.0"] * 2 + [b"HTTP/2.0", b"HTTP/9", b"FTP/1.0", b"HTTP/1.1 extra"])
    headers = []
    if rng.random() < 0.95:
        headers.append(b"Host: " + rng.choice([b"127.0.0.1"] * 6 + [b"localhost:1", b"[::1]", b"evil.example", b"", b"\xff"]))
    if rng.random() < 0.3:
        headers.append(b"Origin: " + rng.choice([b"http://127.0.0.1", b"https://evil.example", b"http://[::1", b"null", b"\x00"]))
    if rng.random() < 0.8:
        headers.append(b"Content-Type: " + rng.choice([b"application/json", b"application/json; charset=utf-8", b"text/plain", b""]))
    body = rng.choice([
        json.dumps({"text": TINY.replace("mlp", rng.choice(["mlp", "mlpp", "attention heads=0"]))}).encode(),
        json.dumps({"text": "engine {", "view": rng.choice(["cycle", "graph", "x", 3]), "labels": rng.choice(["ml", None])}).encode(),
        b"[" * rng.randint(1, 100_000),
        b'{"text": "\\ud800"}',
        b'{"text": 1e999999}',
        b'{"text": ' + b"9" * 5000 + b"}",
        bytes(rng.randrange(256) for _ in range(rng.randint(0, 200))),
        b"",
        b"null",
    ])
    n = len(body)
    length = rng.choice([b"%d" % n, b"%d" % n, b"%d" % (n + 7), b"%d" % max(n - 3, 0), b"-1", b"x", b"99999999999999999999999", None])
    if length is not None:
        headers.append(b"Content-Length: " + length)
    if rng.random() < 0.1:
        headers.append(b"Transfer-Encoding: chunked")
    if rng.random() < 0.1:
        headers.append(b"X-Long: " + b"a" * rng.randint(60_000, 70_000))
    if rng.random() < 0.05:
        headers += [b"X-%d: y" % i for i in range(120)]
    if rng.random() < 0.1:
        headers.append(b"no colon here")
    sep = rng.choice([b"\r\n"] * 4 + [b"\n"])
    return method + b" " + path + b" " + version + sep + sep.join(headers) + sep + sep + body


def _fuzz(n: int, seed: int, capfd) -> None:
    rng = random.Random(seed)
    with running() as srv:  # every request is sent whole and half-closed: nothing waits on a timeout
        port = srv.server_address[1]
        for i in range(n):
            req = _fuzz_request(rng, port)
            resp = _raw(port, req, timeout=15)
            if not resp:
                continue  # the connection closed without a request line to answer (nothing was asked)
            code, headers, body = _status(resp)
            assert code < 500, (i, req[:300], resp[:300])
            if code >= 400 and not req.startswith(b"HEAD "):
                assert headers["content-type"] == "application/json" and "error" in json.loads(body), (i, req[:300], resp[:300])
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
        # still serving
        code, _, _ = _status(_raw(port, b"GET /api/initial HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
        assert code == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err


def test_fuzz_http_requests(capfd):
    _fuzz(60, seed=2026, capfd=capfd)


@pytest.mark.slow
def test_fuzz_http_requests_long(capfd):
    _fuzz(600, seed=11, capfd=capfd)


@pytest.mark.slow  # a server in a subprocess, its descriptor limit lowered to 64
def test_stalled_clients_at_the_descriptor_limit_do_not_wedge_the_server(tmp_path):
    """More stalled clients than the server has descriptors: it accepts only what it can hold,
    times them out, and then answers a real request (before: accept failed with EMFILE in a
    busy loop, and the stalled connections were never closed)."""
    import os
    import subprocess
    import sys

    need("resource")  # POSIX only
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
            "from cyclelang.serve.app import make_server\n"
            "srv = make_server(0, quiet=True, timeout=0.5)\n"
            "print(srv.server_address[1], srv.max_connections, flush=True)\n"
            "srv.serve_forever(poll_interval=0.05)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=root), cwd=root)
    stalled = []
    try:
        port, cap = map(int, proc.stdout.readline().split())
        assert cap < 32
        for _ in range(100):
            stalled.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/initial", timeout=60) as r:
            assert r.status == 200
        assert proc.poll() is None
    finally:
        for s in stalled:
            s.close()
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err
