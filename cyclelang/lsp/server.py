"""`cyclec lsp`: the Language Server Protocol over stdio, on pygls.

The answers come from `analysis` (pure functions over the text); this module only keeps
one `Analysis` per open document, refreshed on open and on every change, and turns the
plain dicts into lsprotocol's types. A handler never lets a user's text take the server
down: whatever goes wrong inside one is logged to stderr and answered with nothing.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, default_converter
from pygls.protocol.json_rpc import ResponseError, ResponseErrorMessage
from pygls.uris import to_fs_path

from ..syntax.parser import MAX_SOURCE_BYTES
from . import analysis as an

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


class CycleServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("cyclec-lsp", _version(), protocol_cls=_Protocol, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.analyses: dict[str, an.Analysis] = {}

    def report_server_error(self, error: Exception, source) -> None:
        """A message that is not JSON gets JSON-RPC's parse error (-32700, id null); the rest is logged."""
        if isinstance(error, json.JSONDecodeError) or isinstance(error.__cause__, json.JSONDecodeError):
            self.protocol._send_data(ResponseErrorMessage(id=None, error=ResponseError(code=-32700, message="parse error: the message is not JSON")))
        print(f"cyclec lsp: {type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def analysis(self, uri: str) -> an.Analysis:
        """The analysis of the document's current text (recomputed if it changed since)."""
        if uri not in self.workspace.text_documents:
            raise _NotOpen(uri)  # never read a file the client has not opened
        text = self.workspace.get_text_document(uri).source
        a = self.analyses.get(uri)
        if a is None or a.text != text:
            a = an.analyze(text, _filename(uri), previous=a)
            self.analyses[uri] = a
        return a

    def refresh(self, uri: str, version: int | None) -> None:
        a = self.analysis(uri)
        diags = [_convert.structure(d, types.Diagnostic) for d in an.lsp_diagnostics(a, uri)]
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diags, version=version))


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
    ls.refresh(params.text_document.uri, params.text_document.version)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
@_guarded
def did_change(ls: CycleServer, params: types.DidChangeTextDocumentParams):
    ls.refresh(params.text_document.uri, params.text_document.version)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
@_guarded
def did_save(ls: CycleServer, params: types.DidSaveTextDocumentParams):
    ls.refresh(params.text_document.uri, None)  # an included file may have changed on disk


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
@_guarded
def did_close(ls: CycleServer, params: types.DidCloseTextDocumentParams):
    ls.analyses.pop(params.text_document.uri, None)
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
