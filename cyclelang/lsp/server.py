"""`cyclec lsp`: the Language Server Protocol over stdio, on pygls.

The answers come from `analysis` (pure functions over the text); this module only keeps
one `Analysis` per open document and turns the plain dicts into lsprotocol's types. A
handler never lets a user's text take the server down: whatever goes wrong inside one is
logged to stderr and answered with nothing.

Reading stdin is ours, not pygls's: a thread splits it into messages with `framing.frames`
(a malformed frame is a line on stderr, and reading resumes at the next header) and hands
them to the event loop. Diagnostics are not computed per change: open, change and save mark
the document, and the marked documents are analysed, the newest text only, once no message
is waiting. Two hundred keystrokes queued behind one analysis cost one more analysis, not
two hundred, and a hover waits for at most the analysis in progress.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
import traceback

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.protocol.json_rpc import ResponseError, ResponseErrorMessage
from pygls.io_ import StdoutWriter
from pygls.uris import to_fs_path

from ..syntax.parser import MAX_SOURCE_BYTES
from . import analysis as an
from . import framing

_convert = default_converter()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cyclelang")
    except PackageNotFoundError:
        return "0"


class _Ignored:
    """A message that was answered with an error while it was read: nothing more to do."""

    jsonrpc = "ignored"


class _Protocol(LanguageServerProtocol):
    """pygls's protocol, answering a request it cannot read with a JSON-RPC error
    (invalid params, -32602) instead of leaving the client waiting."""

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "id" in data and "method" in data:
                self._send_data(ResponseErrorMessage(id=data["id"], error=ResponseError(code=exc.code, message=f"{exc.message} for {data['method']}")))
            return _Ignored()

    def handle_message(self, message):
        if isinstance(message, _Ignored):
            return
        super().handle_message(message)


SETTLE_S = 0.002  # how long the input must stay quiet before the marked documents are analysed
MAX_DELAY_S = 1.0  # ...or how long they wait at most while messages keep coming
QUEUED_BYTES = 64 << 20  # the reader waits while this much read input is not yet handled


class _Budget:
    """Bytes read but not yet handled: the reader thread waits past the limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.cv = limit, 0, threading.Condition()

    def take(self, n: int) -> None:
        with self.cv:
            while self.used and self.used + n > self.limit:
                self.cv.wait()
            self.used += n

    def give(self, n: int) -> None:
        with self.cv:
            self.used -= n
            self.cv.notify_all()


class CycleServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("cyclec-lsp", _version(), protocol_cls=_Protocol, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.analyses: dict[str, an.Analysis] = {}
        self.pending: dict[str, bool] = {}  # documents whose diagnostics are due -> re-read included files
        self.deferred = False  # True while our own loop runs: diagnostics wait for a quiet input
        self.due_since = 0.0  # when the oldest marked document was marked
        self.analyses_run = 0  # how many texts were analysed (the `cyclelang/stats` request tells)
        self.framing_problems = 0

    # --- the transport -----------------------------------------------------------------------

    def start_io(self, stdin=None, stdout=None) -> None:
        """Serve on stdin/stdout until the client says exit or closes stdin."""
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        self.deferred = True
        try:
            asyncio.run(self._serve(stdin))
        except BrokenPipeError:
            print("cyclec lsp: the client closed the connection", file=sys.stderr, flush=True)
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            self.deferred = False
            self.shutdown()

    async def _serve(self, stdin) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()
        budget = _Budget(QUEUED_BYTES)
        read = _reader(stdin)

        def pump() -> None:  # the reader thread
            try:
                for item in framing.frames(read):
                    n = item.size if isinstance(item, framing.Message) else 0
                    budget.take(n)
                    loop.call_soon_threadsafe(inbox.put_nowait, (item, n))
            except RuntimeError:
                return  # the loop is closed: the server has exited
            except Exception as e:  # pragma: no cover - reading stdin failed
                print(f"cyclec lsp: cannot read stdin: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, None)
            except RuntimeError:
                pass

        threading.Thread(target=pump, name="cyclec-lsp-stdin", daemon=True).start()
        get: asyncio.Future | None = None
        while not self._stop_event.is_set():
            if get is None:
                get = asyncio.ensure_future(inbox.get())
            if self.pending and not get.done():
                done, _ = await asyncio.wait({get}, timeout=SETTLE_S)
                if not done:
                    self.flush_one()  # the input is quiet: the next marked document, newest text
                    continue
            elif self.pending and time.monotonic() - self.due_since > MAX_DELAY_S:
                self.flush_one()  # the input never goes quiet: diagnostics are not put off for ever
                continue
            item = await get
            get = None
            if item is None:
                break
            msg, n = item
            budget.give(n)
            self.handle(msg)
        if get is not None:
            get.cancel()

    def handle(self, item) -> None:
        """One thing the reader found: a framing problem (logged, and answered where JSON-RPC
        wants an answer) or a JSON object for pygls."""
        if isinstance(item, framing.Problem):
            self.problem(item.text, item.code, item.id)
            return
        obj = item.obj
        if "jsonrpc" not in obj:
            rid = obj.get("id")
            self.problem("a JSON object that is not a JSON-RPC message (no \"jsonrpc\")", framing.INVALID_REQUEST,
                         rid if isinstance(rid, (int, str)) and not isinstance(rid, bool) else None)
            return
        try:
            message = self.protocol.structure_message(obj)
            self.protocol.handle_message(message)
        except (SystemExit, KeyboardInterrupt, BrokenPipeError):
            raise
        except Exception as e:
            print(f"cyclec lsp: error: cannot handle the message: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def problem(self, text: str, code: int | None = None, rid=None) -> None:
        self.framing_problems += 1
        print(f"cyclec lsp: error: {text}", file=sys.stderr, flush=True)
        if code is not None:  # JSON-RPC's answer to a message it could not read: its id, or null
            self.protocol._send_data({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": text}})

    def report_server_error(self, error: Exception, source) -> None:
        """A message that is not JSON gets JSON-RPC's parse error (-32700, id null); the rest is logged."""
        if isinstance(error, json.JSONDecodeError) or isinstance(error.__cause__, json.JSONDecodeError):
            self.protocol._send_data({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error: the message is not JSON"}})
        print(f"cyclec lsp: {type(error).__name__}: {error}", file=sys.stderr, flush=True)

    # --- documents -----------------------------------------------------------------------------

    def analysis(self, uri: str) -> an.Analysis:
        """The analysis of the document's current text (recomputed if it changed since)."""
        if uri not in self.workspace.text_documents:
            raise _NotOpen(uri)  # never read a file the client has not opened
        text = self.workspace.get_text_document(uri).source
        a = self.analyses.get(uri)
        if a is None or a.text != text:
            a = an.analyze(text, _filename(uri), previous=a)
            self.analyses_run += 1
            self.analyses[uri] = a
        return a

    def mark(self, uri: str, reread: bool = False) -> None:
        """The document's diagnostics are due: now, or (under our loop) once the input is quiet,
        so that of many queued changes only the newest text is analysed."""
        if not self.pending:
            self.due_since = time.monotonic()
        self.pending[uri] = self.pending.get(uri, False) or reread
        if not self.deferred:
            self.flush_one(uri)

    def flush_one(self, uri: str | None = None) -> None:
        uri = uri if uri is not None else next(iter(self.pending))
        reread = self.pending.pop(uri, False)
        self.due_since = time.monotonic()
        try:
            if reread and uri in self.analyses:
                self.analyses[uri].text = None  # an included file may have changed on disk
            self.refresh(uri)
        except _NotOpen:
            pass
        except Exception:
            print(f"cyclec lsp: internal error in diagnostics (a bug in cyclec):\n{traceback.format_exc()}", file=sys.stderr, flush=True)

    def refresh(self, uri: str) -> None:
        a = self.analysis(uri)
        version = self.workspace.get_text_document(uri).version
        diags = [_convert.structure(d, types.Diagnostic) for d in an.lsp_diagnostics(a, uri)]
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diags, version=version))


def _reader(stdin):
    """A function returning what stdin has now (b"" at its end), without a lock another
    thread could be left holding: the file descriptor where there is one."""
    if stdin is None:
        fd = sys.stdin.fileno()
        return lambda: os.read(fd, 1 << 16)
    read1 = getattr(stdin, "read1", None)
    if read1 is not None:
        return lambda: read1(1 << 16)
    return lambda: stdin.read(1 << 16)


def _filename(uri: str) -> str | None:
    if not uri.startswith("file:"):
        return None
    try:
        return to_fs_path(uri)
    except Exception:
        return None


class _NotOpen(Exception):
    pass


def _guarded(fn):
    """Log and swallow what a handler raises: the server keeps serving."""

    def wrapper(ls, params):
        try:
            return fn(ls, params)
        except _NotOpen:
            return None
        except Exception:
            print(f"cyclec lsp: internal error in {fn.__name__} (a bug in cyclec):\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            return None

    wrapper.__name__ = fn.__name__
    return wrapper


server = CycleServer()


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
@_guarded
def did_open(ls: CycleServer, params: types.DidOpenTextDocumentParams):
    ls.mark(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
@_guarded
def did_change(ls: CycleServer, params: types.DidChangeTextDocumentParams):
    ls.mark(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
@_guarded
def did_save(ls: CycleServer, params: types.DidSaveTextDocumentParams):
    ls.mark(params.text_document.uri, reread=True)  # an included file may have changed on disk


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
@_guarded
def did_close(ls: CycleServer, params: types.DidCloseTextDocumentParams):
    ls.analyses.pop(params.text_document.uri, None)
    ls.pending.pop(params.text_document.uri, None)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))


@server.feature(types.TEXT_DOCUMENT_HOVER)
@_guarded
def hover(ls: CycleServer, params: types.HoverParams):
    a = ls.analysis(params.text_document.uri)
    h = an.hover(a, params.position.line, params.position.character)
    return _convert.structure(h, types.Hover) if h else None


@server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[" ", "="]))
@_guarded
def completion(ls: CycleServer, params: types.CompletionParams):
    a = ls.analysis(params.text_document.uri)
    if len(a.text) > MAX_SOURCE_BYTES:
        return types.CompletionList(is_incomplete=False, items=[])
    items = an.complete(a, params.position.line, params.position.character)
    return types.CompletionList(is_incomplete=False, items=[_convert.structure(i, types.CompletionItem) for i in items])


@server.feature(types.TEXT_DOCUMENT_DEFINITION)
@_guarded
def definition(ls: CycleServer, params: types.DefinitionParams):
    a = ls.analysis(params.text_document.uri)
    loc = an.definition(a, params.position.line, params.position.character, params.text_document.uri)
    return _convert.structure(loc, types.Location) if loc else None


@server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
@_guarded
def document_symbol(ls: CycleServer, params: types.DocumentSymbolParams):
    a = ls.analysis(params.text_document.uri)
    return [_convert.structure(s, types.DocumentSymbol) for s in an.symbols(a)]


@server.feature(types.TEXT_DOCUMENT_FORMATTING)
@_guarded
def formatting(ls: CycleServer, params: types.DocumentFormattingParams):
    a = ls.analysis(params.text_document.uri)
    edits = an.format_edits(a)
    return None if edits is None else [_convert.structure(e, types.TextEdit) for e in edits]


@server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
@_guarded
def code_action(ls: CycleServer, params: types.CodeActionParams):
    a = ls.analysis(params.text_document.uri)
    rng = _convert.unstructure(params.range)
    actions = an.quick_fixes(a, params.text_document.uri, rng) + an.explain_actions(a, params.text_document.uri, rng)
    return [_convert.structure(c, types.CodeAction) for c in actions]


@server.command(an.EXPLAIN)
def explain(ls: CycleServer, *args):
    """`cyclec explain CODE`'s text: shown to the user, and returned."""
    if len(args) == 1 and isinstance(args[0], list):  # pygls 1 passes the arguments as one list
        args = tuple(args[0])
    code = args[0] if args else ""
    text = an.explain_text(str(code).upper()) if isinstance(code, str) else None
    if text is None:
        return None
    ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Info, message=text))
    return text


@server.feature("cyclelang/stats")
def stats(ls: CycleServer, *args):
    """How much work the server did: texts analysed, framing problems met, documents due."""
    return {"analyses": ls.analyses_run, "framing_problems": ls.framing_problems, "pending": len(ls.pending)}


class _OneLine(logging.Formatter):
    """pygls's log records, one line each: a malformed message is the client's, not a crash."""

    def format(self, record: logging.LogRecord) -> str:
        first = record.getMessage().splitlines()[0] if record.getMessage() else ""
        return f"cyclec lsp: {record.levelname.lower()}: {first}"


def main() -> None:
    """Serve on stdin/stdout until the client says exit or closes the pipe."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    log = logging.getLogger("pygls")
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False
    server.start_io()
