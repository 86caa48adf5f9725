"""The playground's server: static assets and one JSON endpoint, on 127.0.0.1 only.

GET  /                 the page (static/index.html, app.js, app.css)
GET  /api/language     the words the highlighter colours, from the compiler's own tables
GET  /api/initial      the spec the page starts with (SPEC given to `cyclec serve`, or GPT-2 small)
POST /api/analyze      {"text", "view", "labels"} -> diagnostics, SVG, report, source

Requests must name the loopback as their Host (a page elsewhere cannot reach it through DNS
rebinding), bodies are capped at twice the parser's size limit, and a spec never reaches
the file system: the playground reads the SPEC it was started with once and writes nothing.
"""

from __future__ import annotations

import json
import sys
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
    initial_text = DEFAULT_SPEC
    initial_name = "gpt2.cycle"
    spec_path: str | None = None
    quiet = False

    def log_message(self, fmt, *args):  # one line per request on stderr, unless quiet
        if not self.quiet:
            sys.stderr.write("cyclec serve: " + (fmt % args) + "\n")

    def _host_ok(self) -> bool:
        """The Host names the loopback (no DNS rebinding), and a request sent by a page says
        it comes from the loopback too (no other site's page can post specs here)."""
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
        origin = self.headers.get("Origin")
        if origin is not None:
            from urllib.parse import urlsplit

            if (urlsplit(origin).hostname or "") not in ("127.0.0.1", "localhost", "::1"):
                return False
        return host in ("127.0.0.1", "localhost", "::1")

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' blob: data:; style-src 'self'; script-src 'self'; connect-src 'self'")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj).encode("utf-8"), "application/json")

    def do_GET(self):
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
            return self._json(403, {"error": "the playground answers on the loopback only"})
        if self.path != "/api/analyze":
            return self._json(404, {"error": "not found"})
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            return self._json(415, {"error": "send the spec as application/json"})
        try:
            n = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            return self._json(400, {"error": "bad Content-Length"})
        if n < 0 or n > MAX_BODY:
            self.close_connection = True
            if 0 < n <= 8 * MAX_BODY:  # read what the client is sending, so it gets the answer instead of a broken pipe
                while n > 0:
                    chunk = self.rfile.read(min(n, 1 << 16))
                    if not chunk:
                        break
                    n -= len(chunk)
            return self._json(413, {"error": f"a spec is at most {MAX_SOURCE_BYTES // 1024} KiB"})
        try:
            req = json.loads(self.rfile.read(n).decode("utf-8"))
            text, view, labels = str(req.get("text", "")), req.get("view", "cycle"), req.get("labels", "both")
            out = payload(text, view, labels, self.spec_path)  # includes resolve beside SPEC
        except (ValueError, UnicodeDecodeError, AttributeError) as e:
            return self._json(400, {"error": f"bad request: {e}"})
        except Exception:
            sys.stderr.write("cyclec serve: internal error (a bug in cyclec):\n" + traceback.format_exc())
            return self._json(500, {"error": "internal error in cyclec; see the terminal"})
        self._json(200, out)


def make_server(port: int = 8765, text: str | None = None, name: str | None = None, quiet: bool = False) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1:port (0: any free port), starting on `text`."""
    attrs = {"quiet": quiet}
    if text is not None:
        attrs["initial_text"] = text
        attrs["initial_name"] = name or "spec.cycle"
        attrs["spec_path"] = name
    handler = type("PlaygroundHandler", (Handler,), attrs)
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler)
    srv.daemon_threads = True
    return srv
