"""The playground's server: static assets and one JSON endpoint, on 127.0.0.1 only.

GET  /                 the page (static/index.html, app.js, app.css)
GET  /api/language     the words the highlighter colours, from the compiler's own tables
GET  /api/initial      the spec the page starts with (SPEC given to `cyclec serve`, or GPT-2 small)
POST /api/analyze      {"text", "view", "labels"} -> diagnostics, SVG, report, source

Requests must name the loopback as their Host (a page elsewhere cannot reach it through DNS
rebinding), bodies are capped at twice the parser's size limit, and a spec never reaches
the file system: the playground reads the SPEC it was started with once and writes nothing.

What a client sends cannot hurt the server: a malformed, oversized or deeply nested request
is a 4xx with a JSON error (a 5xx is a bug in cyclec), a connection that stalls is closed
(`TIMEOUT_S` without progress, `REQUEST_DEADLINE_S` to read one request), at most `MAX_CONNECTIONS`
are served at once (the rest wait in a listen backlog of `BACKLOG`, never spinning on a
descriptor limit), and every answer carries the same security headers (`SECURITY_HEADERS`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

from .. import ir
from .. import review as rv
from ..diagnostics import CycleError
from ..lsp import analysis as an
from ..lsp.words import words
from ..syntax.parser import MAX_SOURCE_BYTES

MAX_BODY = 2 * MAX_SOURCE_BYTES
TIMEOUT_S = 10.0  # a read or write on a connection that waits longer: the connection is closed
REQUEST_DEADLINE_S = 30.0  # the whole of one request, however slowly it trickles in
MAX_CONNECTIONS = 64  # served at once; the rest wait in the backlog
BACKLOG = 128  # the listen queue: a burst of parallel requests waits here instead of being reset
CSP = ("default-src 'self'; img-src 'self' blob: data:; style-src 'self'; script-src 'self'; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",  # no other site's page may embed an answer
}
STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
VIEWS, LABELS = ("cycle", "graph"), ("both", "ml", "rocket")

DEFAULT_SPEC = """# GPT-2 small as a closed, staged-combustion cycle with Pre-LN.
let depth = 12

engine gpt2 {
  chamber width=768  # the residual stream
  throat causal      # nothing travels upstream: causal mask
  feed tokens vocab=50257 context=1024 position=learned

  stage block x depth {
    prechamber mix {
      norm layernorm  # valve on the branch: Pre-LN
      turbine attention heads=12
      merge cooling
    }
    prechamber burn {
      norm layernorm
      turbine mlp ratio=4 act=gelu_tanh
      merge cooling
    }
  }

  norm layernorm  # one valve on the main line
  nozzle head tied
}
"""


def language() -> dict:
    """What the page's highlighter colours (`lsp.words`: from the compiler's tables)."""
    return words()


def _diag(d, display: str) -> dict:
    here = d.span is not None and d.span.file == display
    out = {"severity": d.severity, "code": d.code, "message": d.message if here or d.span is None else f"{d.span}: {d.message}", "help": d.help or ""}
    if here:
        out.update(line=d.span.line, column=d.span.column, end_line=d.span.end_line, end_column=d.span.end_column)
    else:
        out.update(line=1, column=1, end_line=1, end_column=1)
    return out


def payload(text: str, view: str = "cycle", labels: str = "both", filename: str | None = None) -> dict:
    """Everything the page shows for one text: never raises on a user's text."""
    from ..backends.graphviz import GraphvizMissing, render, to_dot
    from ..backends.torch.codegen import codegen

    if view not in VIEWS or labels not in LABELS:
        raise ValueError(f"view must be one of {VIEWS}, labels one of {LABELS}")
    a = an.analyze(text, filename)
    display = a.display
    out: dict = {"diagnostics": [_diag(d, display) for d in a.diagnostics], "svg": None, "report": None, "source": None, "diagram_error": None}
    spec = a.spec
    if spec is None:
        return out
    if spec.engine is None:
        out["diagram_error"] = "this file defines templates only: there is no engine to draw"
        return out
    try:
        out["svg"] = render(to_dot(spec, view=view, labels=labels), "svg").decode("utf-8")
    except GraphvizMissing as e:
        out["diagram_error"] = str(e)
    except CycleError as e:
        out["diagram_error"] = "; ".join(d.message for d in e.diagnostics)
    out["report"] = rv.render_text(a.analysis())
    try:
        out["source"] = codegen(spec)
    except CycleError as e:
        out["source"] = "# " + "\n# ".join(d.message for d in e.diagnostics) + "\n"
    out["engine"] = spec.engine.name
    out["stages"] = [op.name for op in spec.engine.body if isinstance(op, ir.Stage)]
    return out


class Handler(BaseHTTPRequestHandler):
    server_version = "cyclec-serve"
    sys_version = ""  # no Python version in the Server header
    default_request_version = "HTTP/1.0"  # every answer has a status line, even to an HTTP/0.9 request
    initial_text = DEFAULT_SPEC
    initial_name = "gpt2.cycle"
    spec_path: str | None = None
    quiet = False
    timeout = TIMEOUT_S  # per read and write: StreamRequestHandler sets it on the socket
    request_deadline = REQUEST_DEADLINE_S

    def log_message(self, fmt, *args):  # one line per request on stderr, unless quiet
        if not self.quiet:
            sys.stderr.write("cyclec serve: " + (fmt % args) + "\n")

    def handle_one_request(self) -> None:
        """One request, read within `request_deadline` however slowly it trickles in: past it the
        connection is shut, which ends any read in progress."""
        self._deadline = threading.Timer(self.request_deadline, self._expire)
        self._deadline.daemon = True
        self._deadline.start()
        try:
            super().handle_one_request()
        finally:
            self._read()

    def _expire(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _read(self) -> None:
        """The request is read: what is left (answering) has no deadline but the per-write timeout."""
        timer = getattr(self, "_deadline", None)
        if timer is not None:
            timer.cancel()

    def _linger(self) -> None:
        """After an answer sent before the request was read to its end: let the client's bytes
        arrive and drop them (a little while, a bounded amount), so that closing does not reset
        the connection and lose the answer on its way."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(1.0)
            left = 8 * MAX_BODY
            while left > 0:
                chunk = self.connection.recv(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)

    def _refuse(self, code: int, message: str) -> None:
        """A 4xx sent before the body was read."""
        self._read()
        self.close_connection = True
        self._json(code, {"error": message})
        self._linger()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, a header too long, a method it has no
        do_ for), as JSON with the security headers; never a 5xx for what a client sent."""
        if code == 501:  # no do_METHOD: the method is not allowed here
            code, message = 405, f"method {self.command!r} not allowed: GET or POST"
        elif code == 505:  # a version http.server cannot speak: the request is malformed
            code = 400
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"
        short = message or self.responses.get(code, ("error",))[0]
        self.log_error("code %d, message %s", code, short)
        self._refuse(code, short)

    def _host_ok(self) -> bool:
        """The Host names the loopback (no DNS rebinding), and a request sent by a page says
        it comes from the loopback too (no other site's page can post specs here)."""
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
        origin = self.headers.get("Origin")
        if origin is not None:
            from urllib.parse import urlsplit

            try:
                if (urlsplit(origin).hostname or "") not in ("127.0.0.1", "localhost", "::1"):
                    return False
            except ValueError:  # not a URL (an unclosed IPv6 bracket, say)
                return False
        return host in ("127.0.0.1", "localhost", "::1")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in SECURITY_HEADERS.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj).encode("utf-8"), "application/json")

    def do_GET(self):
        self._read()
        if not self._host_ok():
            return self._json(403, {"error": "the playground answers on the loopback only"})
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if path in ("/", "/index.html"):
            path = "/static/index.html"
        if path.startswith("/static/") and path[len("/static/"):] in STATIC:
            name = path[len("/static/"):]
            return self._send(200, resources.files(__package__).joinpath("static", name).read_bytes(), STATIC[name])
        if path == "/api/language":
            return self._json(200, language())
        if path == "/api/initial":
            return self._json(200, {"text": self.initial_text, "name": self.initial_name})
        return self._json(404, {"error": "not found"})

    def do_POST(self):
        if not self._host_ok():
            return self._refuse(403, "the playground answers on the loopback only")
        if self.path != "/api/analyze":
            return self._refuse(404, "not found")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            return self._refuse(415, "send the spec as application/json")
        if self.headers.get("Transfer-Encoding") is not None:
            return self._refuse(411, "send the body with a Content-Length, not a Transfer-Encoding")
        lengths = self.headers.get_all("Content-Length") or []
        raw = lengths[0].strip() if lengths else ""
        if len(set(lengths)) > 1 or not raw.isascii() or not raw.isdigit():
            return self._refuse(411 if not lengths else 400, "a POST needs one Content-Length, a number of bytes")
        n = int(raw) if len(raw) <= 18 else MAX_BODY + 1
        if n > MAX_BODY:
            return self._refuse(413, f"a spec is at most {MAX_SOURCE_BYTES // 1024} KiB")
        body = self.rfile.read(n)
        self._read()
        if len(body) < n:
            self.close_connection = True
            return self._json(400, {"error": f"the body ended after {len(body)} of its {n} bytes"})
        try:
            req = json.loads(body.decode("utf-8"))
        except RecursionError:
            return self._json(400, {"error": "bad request: the JSON is nested too deeply"})
        except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return self._json(400, {"error": f"bad request: the body is not JSON: {e}"})
        if not isinstance(req, dict):
            return self._json(400, {"error": 'bad request: send a JSON object {"text", "view", "labels"}'})
        text, view, labels = req.get("text", ""), req.get("view", "cycle"), req.get("labels", "both")
        if not isinstance(text, str) or not isinstance(view, str) or not isinstance(labels, str):
            return self._json(400, {"error": "bad request: text, view and labels are strings"})
        if view not in VIEWS or labels not in LABELS:
            return self._json(400, {"error": f"bad request: view must be one of {VIEWS}, labels one of {LABELS}"})
        try:
            out = payload(text, view, labels, self.spec_path)  # includes resolve beside SPEC
        except Exception:
            sys.stderr.write("cyclec serve: internal error (a bug in cyclec):\n" + traceback.format_exc())
            return self._json(500, {"error": "internal error in cyclec; see the terminal"})
        self._json(200, out)


def _descriptor_room() -> int:
    """Connections this process can hold open beside what it has: half its descriptor limit
    (the other half for files, pipes, Graphviz), less some held back."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max((soft - 32) // 2, 1)


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with a listen backlog of BACKLOG, and at most `max_connections`
    connections served at once: past that it does not accept (the next wait in the backlog)
    until one ends, so it never runs out of descriptors or spins on accept."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, address, handler, max_connections: int = MAX_CONNECTIONS) -> None:
        self.max_connections = max(1, min(max_connections, _descriptor_room()))
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._count_lock = threading.Lock()
        self.connections = 0  # being served now
        self.peak_connections = 0  # the most at once, since the start
        super().__init__(address, handler)

    def _handle_request_noblock(self) -> None:
        # serve_forever calls this when the listening socket is readable: take a slot first,
        # and while there is none, leave the connection in the backlog (waiting, not spinning)
        if not self._slots.acquire(timeout=0.5):
            return
        try:
            request, client_address = self.get_request()
        except OSError as e:
            self._slots.release()
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(0.1)  # out of descriptors regardless: let the others finish
            return
        with self._count_lock:
            self.connections += 1
            self.peak_connections = max(self.peak_connections, self.connections)
        try:
            self.process_request(request, client_address)
        except Exception:
            self._done()
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self._count_lock:
            self.connections -= 1
        self._slots.release()

    def handle_error(self, request, client_address) -> None:
        """A client that hung up or stalled is no error of ours: one line, no traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
            if not getattr(self.RequestHandlerClass, "quiet", False):
                sys.stderr.write(f"cyclec serve: {client_address[0]}: connection ended: {type(exc).__name__}\n")
            return
        sys.stderr.write("cyclec serve: internal error (a bug in cyclec):\n" + traceback.format_exc())


def make_server(port: int = 8765, text: str | None = None, name: str | None = None, quiet: bool = False,
                timeout: float = TIMEOUT_S, max_connections: int = MAX_CONNECTIONS, request_deadline: float = REQUEST_DEADLINE_S) -> Server:
    """A server bound to 127.0.0.1:port (0: any free port), starting on `text`; a connection
    is closed after `timeout` seconds without progress or `request_deadline` seconds for one
    request, and at most `max_connections` are served at once."""
    attrs = {"quiet": quiet, "timeout": timeout, "request_deadline": request_deadline}
    if text is not None:
        attrs["initial_text"] = text
        attrs["initial_name"] = name or "spec.cycle"
        attrs["spec_path"] = name
    handler = type("PlaygroundHandler", (Handler,), attrs)
    return Server(("127.0.0.1", port), handler, max_connections)
