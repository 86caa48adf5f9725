"""What an editor asks of a spec, answered from the compiler's own tables: pure functions.

`analyze(text, filename)` runs the front end and the reviewer once per change and keeps
what the other questions need (the syntax tree of the last text that parsed, the IR of
the last that resolved); `hover`, `complete`, `definition`, `symbols`, `format_edits` and
`quick_fixes` answer from it. Positions are 0-based (line, character) with characters
counted in UTF-16 code units, as the Language Server Protocol counts them; spans are the
compiler's 1-based (line, column) in code points. Nothing here knows about JSON-RPC:
`server.py` wires these functions to pygls, and the playground (`cyclelang.serve`) asks
the same ones, so the editor and the browser say the same things.

Hover and completion read the kinds table (`ir.kinds`), the option table the resolver
reads (`semantics.options.TABLE`), the keyword table of the parser and the grammar's
own parse tables (which keywords may come next): no second list.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import ir
from .. import review as rv
from ..codes import CODES, explanation
from ..diagnostics import CycleError, Diagnostic
from ..ir.kinds import BY_KEYWORD, KINDS, MERGE_BY_KEYWORD
from ..semantics.options import TABLE, Opt, option, options_for
from ..semantics.resolve import NORMS, parse
from ..semantics.values import Binding, EvalError, Scope, evaluate
from ..syntax import ast
from ..syntax.fmt import expr_text, format_text
from ..syntax.parser import KEYWORD_MEANINGS, KINDS as DIRECTIVE_KINDS, parse_module
from .prefix import _current_statement, _keyword_terminals, _lex_prefix, compact_prefix

SEVERITY = {"error": 1, "warning": 2, "note": 3}  # LSP DiagnosticSeverity: Error, Warning, Information

# --- positions ---------------------------------------------------------------------------


def _utf16_len(s: str) -> int:
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


def lines_of(text: str) -> list[str]:
    return text.split("\n")  # the parser counts lines at "\n" only


def lsp_position(lines: list[str], line1: int, col1: int) -> dict:
    """A compiler (line, column), 1-based code points, as an LSP position."""
    i = min(max(line1 - 1, 0), max(len(lines) - 1, 0))
    src = lines[i] if lines else ""
    return {"line": i, "character": _utf16_len(src[: max(col1 - 1, 0)])}


def lsp_range(lines: list[str], span: ir.Span | None) -> dict:
    if span is None:
        return {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}}
    return {"start": lsp_position(lines, span.line, span.column), "end": lsp_position(lines, span.end_line, span.end_column)}


def column_of(lines: list[str], line0: int, character: int) -> int:
    """An LSP character offset (UTF-16) on a line as a 1-based column in code points."""
    if not 0 <= line0 < len(lines):
        return 1
    src, units, col = lines[line0], 0, 0
    while col < len(src) and units < character:
        units += 2 if ord(src[col]) > 0xFFFF else 1
        col += 1
    return col + 1


def offset_of(lines: list[str], line0: int, character: int) -> int:
    line0 = min(max(line0, 0), len(lines) - 1)
    return sum(len(s) + 1 for s in lines[:line0]) + column_of(lines, line0, character) - 1


# --- one analysis per change -------------------------------------------------------------


@dataclass
class Analysis:
    text: str
    filename: str | None
    lines: list[str]
    diagnostics: list[Diagnostic]
    module: ast.Module | None  # this text's syntax tree; None when it does not parse
    spec: ir.Spec | None  # this text's IR; None when it does not resolve
    last_module: ast.Module | None = None  # the newest tree that parsed: hover keeps working while you type
    last_spec: ir.Spec | None = None
    report: dict | None = None  # the static analyses (params, FLOPs), computed on first use
    _report_done: bool = field(default=False, repr=False)

    @property
    def display(self) -> str:
        return self.filename or "<string>"

    def analysis(self) -> dict | None:
        if not self._report_done:
            spec = self.spec or self.last_spec
            self.report = rv.analyze(spec) if spec is not None else None
            self._report_done = True
        return self.report


def analyze(text: str, filename: str | None = None, previous: Analysis | None = None) -> Analysis:
    """Parse, resolve and review `text` once; never raises on a user's text."""
    display = filename or "<string>"
    module = spec = None
    try:
        module = parse_module(text, display)
    except CycleError as e:
        diags = list(e.diagnostics)
    else:
        try:
            spec = parse(text, filename, module=module)
        except CycleError as e:
            diags = list(e.diagnostics)
        else:
            diags = rv.apply_allows(rv.review(spec), {display: text})
    last_module = module or (previous.module or previous.last_module if previous else None)
    last_spec = spec or (previous.spec or previous.last_spec if previous else None)
    return Analysis(text, filename, lines_of(text), diags, module, spec, last_module, last_spec)


def lsp_diagnostics(a: Analysis, uri: str) -> list[dict]:
    """The diagnostics as LSP wants them: code, severity, the help and notes as related
    information (at the diagnostic's own place), and what `cyclec explain` says in `data`."""
    out = []
    for d in a.diagnostics:
        here = d.span is None or d.span.file == a.display
        rng = lsp_range(a.lines, d.span if here else None)
        message = d.message if here else f"{d.span}: {d.message}"
        related = [{"location": {"uri": uri, "range": rng}, "message": f"help: {d.help}"}] if d.help else []
        related += [{"location": {"uri": uri, "range": rng}, "message": f"note: {n}"} for n in d.notes]
        c = CODES.get(d.code)
        if c is not None:
            related.append({"location": {"uri": uri, "range": rng}, "message": f"cyclec explain {d.code}: {c.title}"})
        item = {"range": rng, "severity": SEVERITY[d.severity], "code": d.code, "source": "cyclec", "message": message}
        if related:
            item["relatedInformation"] = related
        item["data"] = {"explain": explanation(c) if c else "", "help": d.help or ""}
        out.append(item)
    return out


# --- what sits under the cursor ----------------------------------------------------------


def _children(node):
    if isinstance(node, (tuple, list)):
        yield from node
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            if f.name not in ("span", "close"):
                yield getattr(node, f.name)


def _contains(span: ir.Span, line: int, col: int) -> bool:
    return (span.line, span.column) <= (line, col) <= (span.end_line, span.end_column)


def chain_at(module: ast.Module, line: int, col: int) -> list:
    """The syntax nodes containing (line, col), outermost first."""
    out: list = []
    stack = list(module.items)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (tuple, list)):
            stack = list(node) + stack
            continue
        span = getattr(node, "span", None)
        if span is None or not dataclasses.is_dataclass(node):
            continue
        if _contains(span, line, col):
            out.append(node)
            stack = list(_children(node))
    return out


def _word_at(lines: list[str], line0: int, character: int) -> tuple[str, int, int]:
    """The identifier under the cursor: (word, start column, end column), 1-based."""
    col = column_of(lines, line0, character)
    src = lines[line0] if 0 <= line0 < len(lines) else ""
    i = j = col - 1
    while i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_"):
        i -= 1
    while j < len(src) and (src[j].isalnum() or src[j] == "_"):
        j += 1
    return src[i:j], i + 1, j + 1


def _scopes(module: ast.Module, engine: ast.Engine | None = None) -> dict[str, tuple[ast.Let | ast.Param, object]]:
    """Every let (file-level, then the engine's) with its value where it evaluates."""
    out: dict = {}
    scope = Scope()
    lets = [i for i in module.items if isinstance(i, ast.Let)]
    if engine is not None:
        lets += [i for i in engine.body if isinstance(i, ast.Let)]
    for let in lets:
        try:
            v = evaluate(let.value, scope)
        except EvalError:
            v = None
        if v is not None:
            scope.names[let.name.name] = Binding(v, let.span)
        out[let.name.name] = (let, v)
    return out


def _show(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(getattr(v, "name", v))


def _md_option(key: str, o: Opt) -> str:
    lines = [f"**{o.name}** — option of `{key}`", "", o.ml]
    if o.rocket:
        lines += ["", f"*engine:* {o.rocket}"]
    lines += ["", f"type: {o.type}; {o.shown_range()}", f"default: {o.shown_default()}"]
    return "\n".join(lines)


def _md_kind(keyword: str, kind) -> str:
    key = f"{keyword} {kind.keyword}"
    lines = [f"**{key}**", "", f"{kind.ml} — *{kind.phrase}*", f"role: {kind.role}"]
    if kind.formula:
        lines.append(f"formula: `{kind.formula}`")
    opts = options_for(key)
    if opts:
        lines += ["", "options: " + ", ".join(f"`{o.name}`" for o in opts)]
    return "\n".join(lines)


def _md_norm(kind_name: str) -> str:
    k = KINDS[ir.Norm]
    opts = options_for(f"norm {kind_name}")
    return "\n".join([f"**norm {kind_name}**", "", f"{k.ml} — *{k.rocket}*", f"role: {k.role}", "", "options: " + ", ".join(f"`{o.name}`" for o in opts)])


def _md_keyword(word: str) -> str | None:
    if word not in KEYWORD_MEANINGS:
        return None
    ml, rocket = KEYWORD_MEANINGS[word]
    return f"**{word}**\n\n{ml}" + (f"\n\n*engine:* {rocket}" if rocket else "")


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:g}"


def _stage_facts(a: Analysis, stage: ast.Stage) -> str:
    """Parameters and FLOPs of the stage that starts at this source line, from the IR layout."""
    spec = a.spec or a.last_spec
    if spec is None or spec.engine is None:
        return ""
    e = spec.engine
    with ir.layout.held(e):
        lay = ir.layout.layout(e)
        sl = next((sl for sl in lay.all_stages() if sl.stage.span is not None and sl.stage.span.file == a.display
                   and sl.stage.span.line == stage.span.line and sl.stage.name == stage.name.name), None)
        if sl is None:
            return ""
        # a stage's parts, a group's: its stages' (each instance of the group runs them all)
        parts = [p for p in lay.parts() if p.spath == sl.path or p.spath.startswith(sl.path + ".")]
        if not parts:
            return ""
        n = e.feed.context
        per = sum(p.params * p.repeat for p in parts) // sl.count
        flops = sum(sum(p.flops(n)) * p.repeat for p in parts) // sl.count
        rep = sl.count
        path = sl.path
    return (f"\n\n`{path}`: {per:,} parameters per instance" + (f", {per * rep:,} for all {rep}" if rep > 1 else "")
            + f"; {_si(flops)} forward FLOPs per token per instance at context {n}")


def hover(a: Analysis, line0: int, character: int) -> dict | None:
    """Markdown for what is under the cursor, with its range; None for nothing."""
    module = a.module or a.last_module
    word, c0, c1 = _word_at(a.lines, line0, character)
    if not word:
        return None
    rng = {"start": lsp_position(a.lines, line0 + 1, c0), "end": lsp_position(a.lines, line0 + 1, c1)}
    text = None
    if module is not None:
        text = _hover_in_tree(a, module, line0 + 1, c0, word)
    if text is None:
        text = _md_keyword(word)
    return {"contents": {"kind": "markdown", "value": text}, "range": rng} if text else None


def _engine_of(chain) -> ast.Engine | None:
    return next((n for n in chain if isinstance(n, ast.Engine)), None)


def _template(module: ast.Module, name: str) -> ast.Template | None:
    return next((i for i in module.items if isinstance(i, ast.Template) and i.name.name == name), None)


def _hover_in_tree(a: Analysis, module: ast.Module, line: int, col: int, word: str) -> str | None:
    chain = chain_at(module, line, col)
    if not chain:
        return None
    node = chain[-1]
    parent = chain[-2] if len(chain) > 1 else None
    at_start = getattr(node, "span", None) is not None and (node.span.line, node.span.column) == (line, col)
    if isinstance(node, ast.Directive):
        if at_start and word == node.keyword:
            return _md_keyword(word)
        if node.kind is not None and _contains(node.kind.span, line, col):
            return _hover_kind(node.keyword, node.kind.name)
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Option):
        node, parent = parent, chain[-3] if len(chain) > 2 else None
    if isinstance(node, ast.Option) and _contains(node.name.span, line, col):
        return _hover_option(parent, node, chain)
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Directive) and parent.kind is node:
        return _hover_kind(parent.keyword, node.name)
    if isinstance(node, ast.Ref):
        return _hover_name(a, module, chain, node.name)
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Let):
        return _hover_name(a, module, chain, node.name)
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Stage):
        return _hover_stage(a, module, parent, node)
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Template):
        return _md_template(parent)
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Prechamber):
        return f"**prechamber {node.name}**: a residual branch x + f(x)\n\n*engine:* {KEYWORD_MEANINGS['prechamber'][1]}"
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Param):
        tmpl = next((n for n in chain if isinstance(n, ast.Template)), None)
        return _md_param(tmpl.name.name if tmpl else "?", parent)
    if isinstance(node, ast.Ident) and isinstance(parent, ast.Arg):
        stage = next((n for n in reversed(chain) if isinstance(n, ast.Stage)), None)
        tname = (stage.template.name if stage.template is not None else stage.name.name) if stage is not None else None
        t = (_template(module, tname) or _included_template(a, module, tname)[0]) if tname else None
        p = next((p for p in (t.params or ()) if p.name.name == node.name), None) if t is not None else None
        if p is not None:
            return _md_param(tname, p)
    if isinstance(node, ast.Stage) and at_start:
        return _md_keyword("stage")
    if at_start and word in KEYWORD_MEANINGS:
        return _md_keyword(word)
    return None


def _hover_kind(keyword: str, name: str) -> str | None:
    if keyword == "turbine" and name in BY_KEYWORD:
        return _md_kind("turbine", BY_KEYWORD[name])
    if keyword == "norm" and name in NORMS:
        return _md_norm(name)
    opts = options_for(f"{keyword} {name}")
    if f"{keyword} {name}" in TABLE:
        ml, rocket = KEYWORD_MEANINGS.get(keyword, ("", ""))
        return f"**{keyword} {name}**\n\n{ml}" + (f"\n\n*engine:* {rocket}" if rocket else "") + (
            "\n\noptions: " + ", ".join(f"`{o.name}`" for o in opts) if opts else "")
    return None


def _statement_key(stmt) -> str | None:
    """The option-table key of the statement an option belongs to."""
    if isinstance(stmt, ast.Prechamber):
        return "prechamber"
    if isinstance(stmt, ast.Directive):
        if stmt.keyword == "merge":
            return f"merge {stmt.options[0].name.name}" if stmt.options else None
        if stmt.keyword == "chamber":
            return "chamber"
        return f"{stmt.keyword} {stmt.kind.name}" if stmt.kind is not None else None
    return None


def _hover_option(stmt, o: ast.Option, chain) -> str | None:
    if isinstance(stmt, ast.Directive) and stmt.keyword == "merge" and stmt.options and stmt.options[0] is o:
        k = MERGE_BY_KEYWORD.get(o.name.name)
        if k is None:
            return None
        text = _md_kind("merge", k)
        if o.name.name == "scale" and (spec := option("merge scale", "scale")):
            text += "\n\n" + _md_option("merge scale", spec)
        return text
    key = _statement_key(stmt)
    spec = option(key, o.name.name) if key else None
    return _md_option(key, spec) if spec else None


def _hover_name(a: Analysis, module: ast.Module, chain, name: str) -> str | None:
    tmpl = next((n for n in chain if isinstance(n, ast.Template)), None)
    if tmpl is not None and tmpl.params:
        for p in tmpl.params:
            if p.name.name == name:
                return _md_param(tmpl.name.name, p)
    lets = _scopes(module, _engine_of(chain))
    if name in lets:
        let, v = lets[name]
        value = f"value = {_show(v)}" if v is not None else "value: does not evaluate (see the diagnostics)"
        return f"```cycle\nlet {name} = {expr_text(let.value, spaced=True)}\n```\n{value}"
    if name in ("width", "vocab", "context"):
        return f"**{name}**: built-in, the chamber's width and the feed's vocabulary and context"
    return None


def _md_param(template: str, p: ast.Param) -> str:
    return f"**{p.name.name}**: a parameter of stage template `{template}`" + (f", default `{expr_text(p.default)}`" if p.default else "")


def _md_template(t: ast.Template) -> str:
    params = ", ".join(p.name.name + (f"={expr_text(p.default)}" if p.default else "") for p in t.params or ())
    branches = [i.name.name for i in t.body if isinstance(i, ast.Prechamber)]
    return f"```cycle\nstage {t.name.name}({params})\n```\na stage template" + (f"; branches: {', '.join(branches)}" if branches else "")


def _hover_stage(a: Analysis, module: ast.Module, stage: ast.Stage, ident: ast.Ident) -> str:
    tname = stage.template.name if stage.template is not None else (stage.name.name if stage.body is None else None)
    text = f"**stage {stage.name.name}**"
    if tname:
        t = _template(module, tname) or _included_template(a, module, tname)[0]
        if t is not None:
            text += "\n\n" + _md_template(t)
    return text + _stage_facts(a, stage)


# --- definitions -------------------------------------------------------------------------


def _include_path(a: Analysis, inc: ast.Include) -> Path | None:
    if not a.filename:
        return None
    p = (Path(a.filename).resolve().parent / inc.path.strip('"')).resolve()
    return p if p.is_file() else None


def _included_template(a: Analysis, module: ast.Module, name: str) -> tuple[ast.Template | None, Path | None]:
    for inc in (i for i in module.items if isinstance(i, ast.Include)):
        p = _include_path(a, inc)
        if p is None:
            continue
        try:
            m = parse_module(p.read_text("utf-8"), str(p))
        except (CycleError, OSError, UnicodeDecodeError):
            continue
        t = _template(m, name)
        if t is not None:
            return t, p
    return None, None


def definition(a: Analysis, line0: int, character: int, uri: str) -> dict | None:
    """Where the name under the cursor is defined: a let, a template parameter, a stage
    template (here or in an included file), or the included file itself."""
    module = a.module or a.last_module
    word, c0, _ = _word_at(a.lines, line0, character)
    if module is None:
        return None
    chain = chain_at(module, line0 + 1, column_of(a.lines, line0, character))
    here = lambda span: {"uri": uri, "range": lsp_range(a.lines, span)}  # noqa: E731
    for node in reversed(chain):
        if isinstance(node, ast.Include):
            p = _include_path(a, node)
            return {"uri": p.as_uri(), "range": lsp_range([], None)} if p else None
        if isinstance(node, ast.Stage):
            tname = node.template.name if node.template is not None else (node.name.name if node.body is None else None)
            if tname and word == tname:
                t = _template(module, tname)
                if t is not None:
                    return here(t.name.span)
                t, p = _included_template(a, module, tname)
                if t is not None:
                    return {"uri": p.as_uri(), "range": lsp_range(lines_of(p.read_text("utf-8")), t.name.span)}
    if chain and isinstance(chain[-1], ast.Ref):
        name = chain[-1].name
        tmpl = next((n for n in chain if isinstance(n, ast.Template)), None)
        for p in (tmpl.params or ()) if tmpl else ():
            if p.name.name == name:
                return here(p.name.span)
        lets = _scopes(module, _engine_of(chain))
        if name in lets:
            return here(lets[name][0].name.span)
    return None


# --- document symbols --------------------------------------------------------------------

_SYMBOL = {"engine": 2, "stage": 5, "template": 5, "prechamber": 6, "fullflow": 6, "let": 14, "include": 1, "directive": 8}  # LSP SymbolKind


def symbols(a: Analysis) -> list[dict]:
    """The engine's stages and branches, the templates, lets and includes, as DocumentSymbols."""
    module = a.module or a.last_module
    if module is None:
        return []

    def sym(name: str, detail: str, kind: str, span: ir.Span, sel: ir.Span, children=()) -> dict:
        return {"name": name, "detail": detail, "kind": _SYMBOL[kind], "range": lsp_range(a.lines, span),
                "selectionRange": lsp_range(a.lines, sel), "children": list(children)}

    def body(items) -> list[dict]:
        out = []
        for i in items or ():
            if isinstance(i, ast.Prechamber):
                ops = [f"{d.keyword} {d.kind.name}" if d.kind else d.keyword for d in i.body]
                out.append(sym(i.name.name, ", ".join(ops), "prechamber", i.span, i.name.span))
            elif isinstance(i, ast.Fullflow):
                out.append(sym(i.name.name if i.name else "fullflow", "parallel branches", "fullflow", i.span, (i.name or i).span, body(i.body)))
            elif isinstance(i, ast.Stage):
                rep = f" x {expr_text(i.repeat)}" if i.repeat is not None else ""
                tname = i.template.name if i.template is not None else (i.name.name if i.body is None else "")
                out.append(sym(i.name.name, (tname + rep).strip(), "stage", i.span, i.name.span, body(i.body)))
            elif isinstance(i, ast.Let):
                out.append(sym(i.name.name, expr_text(i.value, spaced=True), "let", i.span, i.name.span))
            elif isinstance(i, ast.Directive) and i.keyword in ("norm", "turbine"):
                out.append(sym(f"{i.keyword} {i.kind.name}" if i.kind else i.keyword, "on the main line", "directive", i.span, i.span))
        return out

    out = []
    for item in module.items:
        if isinstance(item, ast.Engine):
            out.append(sym(item.name.name, "engine", "engine", item.span, item.name.span, body(item.body)))
        elif isinstance(item, ast.Template):
            out.append(sym(item.name.name, "stage template", "template", item.span, item.name.span, body(item.body)))
        elif isinstance(item, ast.Let):
            out.append(sym(item.name.name, expr_text(item.value, spaced=True), "let", item.span, item.name.span))
        elif isinstance(item, ast.Include):
            out.append(sym(item.path, "include", "include", item.span, item.span))
    return out


# --- formatting and quick fixes ----------------------------------------------------------


def format_edits(a: Analysis) -> list[dict] | None:
    """One edit replacing the whole text with `cyclec fmt`'s; [] when already formatted,
    None when the text does not parse (an editor keeps the text as it is)."""
    try:
        out = format_text(a.text, a.display)
    except CycleError:
        return None
    if out == a.text:
        return []
    end = {"line": len(a.lines), "character": 0}
    return [{"range": {"start": {"line": 0, "character": 0}, "end": end}, "newText": out}]


_DID_YOU_MEAN = re.compile(r"did you mean '([^']+)'\?")


def quick_fixes(a: Analysis, uri: str, rng: dict | None = None) -> list[dict]:
    """A code action per 'did you mean' help: replace the diagnostic's span with the suggestion."""
    out = []
    for d, item in zip(a.diagnostics, lsp_diagnostics(a, uri)):
        m = _DID_YOU_MEAN.search(d.help or "")
        if m is None or d.span is None or d.span.file != a.display:
            continue
        if rng is not None and (item["range"]["end"]["line"] < rng["start"]["line"] or item["range"]["start"]["line"] > rng["end"]["line"]):
            continue
        edit = {"changes": {uri: [{"range": item["range"], "newText": m.group(1)}]}}
        out.append({"title": f"Change to '{m.group(1)}'", "kind": "quickfix", "diagnostics": [item], "edit": edit, "isPreferred": True})
    return out


EXPLAIN = "cyclelang.explain"  # the server's command: `cyclec explain CODE`'s text


def explain_text(code: str) -> str | None:
    c = CODES.get(code)
    return explanation(c) if c is not None else None


def explain_actions(a: Analysis, uri: str, rng: dict | None = None) -> list[dict]:
    """A code action per diagnostic code in range: show what `cyclec explain CODE` says."""
    seen, out = set(), []
    for d, item in zip(a.diagnostics, lsp_diagnostics(a, uri)):
        if d.code in seen or d.code not in CODES:
            continue
        if rng is not None and (item["range"]["end"]["line"] < rng["start"]["line"] or item["range"]["start"]["line"] > rng["end"]["line"]):
            continue
        seen.add(d.code)
        out.append({"title": f"Explain {d.code}: {CODES[d.code].title}", "diagnostics": [item],
                    "command": {"title": f"cyclec explain {d.code}", "command": EXPLAIN, "arguments": [d.code]}})
    return out


# --- completion --------------------------------------------------------------------------

def _item(label: str, kind: int, detail: str = "", doc: str = "") -> dict:
    out = {"label": label, "kind": kind}
    if detail:
        out["detail"] = detail
    if doc:
        out["documentation"] = {"kind": "markdown", "value": doc}
    return out


_K_KEYWORD, _K_ENUM, _K_PROPERTY, _K_CLASS, _K_CONSTANT, _K_VALUE = 14, 13, 10, 7, 21, 12  # LSP CompletionItemKind


def complete(a: Analysis, line0: int, character: int) -> list[dict]:
    """What may be typed at the cursor: statement keywords valid in this block (the
    grammar's parse tables say which), a directive's kinds, only the options that
    statement accepts and has not been given yet, an option's values, template names
    and parameters, and the names in scope."""
    off = offset_of(a.lines, line0, character)
    prefix = a.text[:off]
    if re.search(r'^[^"#\n]*("[^"\n]*"[^"#\n]*)*#[^\n]*$', prefix[prefix.rfind("\n") + 1:]):
        return []  # inside a comment
    i = len(prefix)  # the word being typed is left out: scanned back by hand (a regex anchored at $ is quadratic in a long word)
    while i > 0 and (prefix[i - 1].isascii() and (prefix[i - 1].isalnum() or prefix[i - 1] == "_")):
        i -= 1
    if i < len(prefix) and not prefix[i].isdigit():  # a number being typed stays: `heads=1` still wants options next
        prefix = prefix[:i]
    toks, accepts = _lex_prefix(compact_prefix(prefix))
    kw_of = _keyword_terminals()
    last = toks[-1] if toks else None
    items: list[dict] = []
    module = a.module or a.last_module

    if last is not None and last.type in kw_of and kw_of[last.type] in DIRECTIVE_KINDS:
        return _kind_items(kw_of[last.type])
    if last is not None and last.type == "MERGE":
        return [_item(k, _K_ENUM, f"{v.ml} — {v.rocket}", _md_kind("merge", v)) for k, v in MERGE_BY_KEYWORD.items()]
    if last is not None and last.type == "STAGE" and module is not None:
        items += [_item(t.name.name, _K_CLASS, "stage template", _md_template(t)) for t in _templates(a, module)]
    stmt, rest = _current_statement(toks)
    if last is not None and last.type == "EQUAL":
        name = toks[-2].value if len(toks) >= 2 and toks[-2].type == "NAME" else None
        key = _key_from_tokens(stmt, rest[:-2])
        spec = option(key, name) if key and name else None
        if spec is not None and spec.type == "choice":
            return [_item(c, _K_VALUE, f"{name}=", "") for c in spec.choices]
        if spec is not None and spec.type == "bool":
            return [_item(c, _K_VALUE, f"{name}=") for c in ("true", "false")]
        return _name_items(a, module, toks)
    if accepts is None:
        return items
    if stmt is not None and "NAME" in accepts:
        key = _key_from_tokens(stmt, rest)
        if key is not None:
            named = stmt not in ("chamber",)  # the kind (or the branch's name) comes first
            given = {t.value for t in rest[1 if named else 0:] if t.type == "NAME"}
            items += [_item(o.name + ("" if o.type == "bool" else "="), _K_PROPERTY, f"{o.type}, default {o.shown_default()}", _md_option(key, o))
                      for o in options_for(key) if o.name not in given]
    if stmt is None and "NAME" in accepts and _in_args(toks):
        tname = _args_template(toks)
        t = (_template(module, tname) or _included_template(a, module, tname)[0]) if module is not None and tname else None
        items += [_item(p.name.name + "=", _K_PROPERTY, "template parameter", _md_param(tname, p)) for p in ((t.params or ()) if t is not None else ())]
    for term in sorted(accepts):
        word = kw_of.get(term)
        if word and word in KEYWORD_MEANINGS and word not in ("x", "sqrt"):
            ml, rocket = KEYWORD_MEANINGS[word]
            items.append(_item(word, _K_KEYWORD, ml, _md_keyword(word) or ""))
    return items


def _templates(a: Analysis, module: ast.Module) -> list[ast.Template]:
    out = [i for i in module.items if isinstance(i, ast.Template)]
    for inc in (i for i in module.items if isinstance(i, ast.Include)):
        p = _include_path(a, inc)
        if p is None:
            continue
        try:
            out += [i for i in parse_module(p.read_text("utf-8"), str(p)).items if isinstance(i, ast.Template)]
        except (CycleError, OSError, UnicodeDecodeError):
            pass
    return out


def _in_args(toks) -> bool:
    depth = 0
    for t in reversed(toks):
        if t.type == "RPAR":
            depth += 1
        elif t.type == "LPAR":
            if depth == 0:
                return True
            depth -= 1
        elif t.type in ("LBRACE", "RBRACE"):
            return False
    return False


def _args_template(toks) -> str | None:
    """`stage NAME(` or `stage NAME = TEMPLATE(`: the template whose arguments are being written."""
    for i in range(len(toks) - 1, 0, -1):
        if toks[i].type == "LPAR" and toks[i - 1].type == "NAME":
            return toks[i - 1].value
    return None


def _key_from_tokens(stmt: str | None, rest) -> str | None:
    if stmt == "prechamber":
        return "prechamber"
    if stmt == "chamber":
        return "chamber"
    if stmt == "merge":
        return f"merge {rest[0].value}" if rest and rest[0].type == "NAME" else None
    if stmt in DIRECTIVE_KINDS:
        return f"{stmt} {rest[0].value}" if rest and rest[0].type == "NAME" and f"{stmt} {rest[0].value}" in TABLE else None
    return None


def _kind_items(keyword: str) -> list[dict]:
    if keyword == "turbine":
        return [_item(k, _K_ENUM, f"{v.ml} — {v.rocket}", _md_kind("turbine", v)) for k, v in BY_KEYWORD.items()]
    if keyword == "norm":
        return [_item(n, _K_ENUM, "norm — valve", _md_norm(n)) for n in NORMS]
    kinds = [k.split(" ", 1)[1] for k in TABLE if k.startswith(keyword + " ")]
    return [_item(k, _K_ENUM, keyword) for k in kinds]


def _name_items(a: Analysis, module: ast.Module | None, toks) -> list[dict]:
    if module is None:
        return []
    lets = _scopes(module, next((i for i in module.items if isinstance(i, ast.Engine)), None))
    out = [_item(n, _K_CONSTANT, f"= {_show(v)}" if v is not None else "let") for n, (_, v) in lets.items()]
    return out + [_item(n, _K_CONSTANT, "built-in") for n in ("width", "vocab", "context")]
