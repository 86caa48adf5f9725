"""Syntax tree to IR: constants, includes, templates, defaults and the semantic checks.

One pass over the syntax tree builds the IR and collects every problem it meets
(unknown names, duplicates, shapes that do not divide, options that do not
belong, widths that do not meet at a merge) instead of stopping at the first.
What depends on the whole topology (the cooling std, 0.02 / sqrt(merges into the
main line); DeepNet's alpha and beta; LayerScale's depth-dependent start) is left
to `ir.passes.finalize_merges`, which fills it in from what the spec asked for.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import posixpath
import typing
from dataclasses import dataclass, field
from pathlib import Path

from .. import ir
from ..diagnostics import Collector, CycleError, did_you_mean, fold_template_uses
from ..syntax import ast
from ..syntax.parser import KEYWORD_HOMES, MAX_SOURCE_BYTES, parse_module
from .options import ACTIVATIONS, MAX_CONTEXT, MAX_EXPERTS, MAX_VOCAB, MAX_WIDTH, TABLE, Options  # noqa: F401 (limits re-exported)
from .values import MAX_INT, Binding, EvalError, Keyword, Scope, evaluate, formula, let_ref, number, whole

MAX_INCLUDE_DEPTH = 16
MAX_INCLUDE_FILES = 256  # distinct files a spec reads through its includes (each is read once)
MAX_INCLUDE_BYTES = 4 << 20  # bytes of spec text in all, the file itself and everything it includes
MAX_REPEAT = 10_000
TURBINES = tuple(ir.kinds.BY_KEYWORD)  # each has an option reader below, t_<keyword>
NORMS = typing.get_args(ir.NormType)
MERGES = tuple(ir.kinds.MERGE_BY_KEYWORD)
BUILTINS = ("width", "vocab", "context")


def _gc_paused(fn):
    """Run a front-end entry point with the cyclic garbage collector off.

    Parsing allocates tens of thousands of small acyclic objects (lark trees, tokens,
    pydantic nodes); each allocation burst triggers collections that rescan every
    live object, which cost a fifth of the parse time and made it grow faster than
    the spec. Reference counting still frees everything; the collector resumes after."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return wrapper


@_gc_paused
def load(path: str | os.PathLike, include_path: tuple[str, ...] = ()) -> ir.Spec:
    """Read, parse and resolve a spec file."""
    display = os.fspath(path)
    loader = _Loader(root=Path(os.path.realpath(display)).parent, include_path=tuple(Path(os.path.realpath(p)) for p in include_path))
    module = loader.read_main(Path(display), display)
    return _resolve_module(module, loader)


@_gc_paused
def parse(text: str, filename: str | None = None, include_path: tuple[str, ...] = (), module: ast.Module | None = None) -> ir.Spec:
    """Parse and resolve spec text. Includes are read relative to `filename`'s directory
    (the current directory when there is no filename). `module`: the text's syntax tree,
    when the caller has parsed it already (the language server keeps it for hover)."""
    display = filename or "<string>"
    base = Path(os.path.realpath(filename)).parent if filename else Path(os.path.realpath(os.getcwd()))
    loader = _Loader(root=base, include_path=tuple(Path(os.path.realpath(p)) for p in include_path))
    loader.sources[display] = text
    if module is None:
        module = loader.parse_text(text, display)
    if filename:
        loader.stack.append(Path(os.path.realpath(filename)))
    return _resolve_module(module, loader)


def _resolve_module(module: ast.Module | None, loader: "_Loader") -> ir.Spec:
    out = loader.out
    spec = None
    uses: dict = {}
    if module is not None:
        r = _Resolver(loader)
        spec = r.module(module)
        uses = r.template_uses
    if out.has_errors or spec is None:
        errors = [d for d in fold_template_uses(out.diagnostics, uses) if d.severity == "error"]
        stray = [d.span for d in errors if d.code == "E0006" and d.span is not None]
        # a block's missing part (E0206) that a misspelled statement inside it explains is a consequence: not shown
        errors = [d for d in errors if not (d.code == "E0206" and d.span is not None and any(_contains(d.span, s) for s in stray))]
        raise CycleError(errors, loader.sources)
    return spec


def _contains(outer: ir.Span, inner: ir.Span) -> bool:
    return outer.file == inner.file and (outer.line, outer.column) <= (inner.line, inner.column) and (inner.end_line, inner.end_column) <= (outer.end_line, outer.end_column)


# --- reading files and includes --------------------------------------------------------


@dataclass
class _Loader:
    root: Path
    include_path: tuple[Path, ...]
    sources: dict[str, str] = field(default_factory=dict)
    out: Collector = field(default_factory=Collector)
    stack: list[Path] = field(default_factory=list)
    included: set[Path] = field(default_factory=set)  # every file read: an include of one already read adds nothing
    bytes_read: int = 0

    def read_text(self, path: Path, display: str, span: ir.Span | None) -> str | None:
        from ..io import InputRefused, read_input

        try:
            data = read_input(path, MAX_SOURCE_BYTES)  # never blocks on a FIFO, never reads /dev/zero
        except InputRefused as e:
            where = span or ir.Span(file=display, line=1, column=1, end_line=1, end_column=2)  # the spec itself: its start
            if e.too_large:
                self.out.error("E0010", f"'{display}' is larger than {MAX_SOURCE_BYTES // 1024} KiB", where, "split it into files joined with include")
            else:
                self.out.error("E0112", f"'{display}' cannot be a spec: {e}", span, "give the path of a .cycle file")
            return None
        except FileNotFoundError:
            self.out.error("E0105", f"no such file: '{display}'", span)
            return None
        except IsADirectoryError:
            self.out.error("E0105", f"'{display}' is a directory, not a spec", span)
            return None
        except OSError as e:
            self.out.error("E0105", f"cannot read '{display}': {e.strerror or e}", span)
            return None
        self.bytes_read += len(data)
        if self.bytes_read > MAX_INCLUDE_BYTES:
            self.out.error("E0113", f"the spec and its includes are more than {MAX_INCLUDE_BYTES >> 20} MiB of text in all", span,
                           "a spec is a page of text; include each shared file once")
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            prefix = data[: e.start].decode("utf-8", "replace")
            line = prefix.count("\n") + 1
            col = len(prefix) - (prefix.rfind("\n") + 1) + 1
            self.sources[display] = data.decode("utf-8", "replace")
            self.out.error("E0001", f"the file is not valid UTF-8 (byte 0x{data[e.start]:02X})", ir.Span(file=display, line=line, column=col, end_line=line, end_column=col + 1), "save the spec as UTF-8")
            return None
        if text.startswith("\ufeff"):
            text = text[1:]
        self.sources[display] = text
        return text

    def parse_text(self, text: str, display: str) -> ast.Module | None:
        try:
            return parse_module(text, display)
        except CycleError as e:
            self.out.diagnostics.extend(e.diagnostics)
            self.sources.update(e.sources)
            return None

    def read_main(self, path: Path, display: str) -> ast.Module | None:
        text = self.read_text(path, display, None)
        if text is None:
            return None
        self.stack.append(path.resolve())
        return self.parse_text(text, display)

    def read_include(self, inc: ast.Include, from_display: str) -> tuple[ast.Module, str] | None:
        raw = inc.path
        if not raw or raw.startswith(("/", "\\", "~")) or (len(raw) > 1 and raw[1] == ":") or "\x00" in raw:
            self.out.error("E0107", f"include path '{raw}' must be relative to the spec", inc.span, "name a file in the spec's directory tree")
            return None
        if len(self.stack) > MAX_INCLUDE_DEPTH:
            self.out.error("E0111", f"includes nest deeper than {MAX_INCLUDE_DEPTH} files", inc.span)
            return None
        base = self.stack[-1].parent if self.stack else self.root
        try:
            target = (base / raw).resolve()
        except (RuntimeError, OSError):  # a symlink loop (RuntimeError before Python 3.13)
            self.out.error("E0105", f"cannot read include '{raw}': its symbolic links loop", inc.span)
            return None
        allowed = (self.root, *self.include_path)
        if not any(_inside(target, a) for a in allowed):
            self.out.error("E0107", f"include '{raw}' leaves the spec's directory", inc.span, "keep included files beside the spec or below it, or allow a directory with --include-path")
            return None
        if target in self.stack:
            chain = " -> ".join(p.name for p in [*self.stack[self.stack.index(target):], target])
            self.out.error("E0106", f"include cycle: {chain}", inc.span, "remove one of the includes")
            return None
        if target in self.included:  # read once: a second include of a file adds nothing (a diamond, or a fan-out bomb)
            return None
        if len(self.included) >= MAX_INCLUDE_FILES:
            self.out.error("E0113", f"the spec includes more than {MAX_INCLUDE_FILES} files", inc.span, "a spec is a page of text; gather shared templates in a few files")
            return None
        self.included.add(target)
        display = posixpath.normpath(posixpath.join(posixpath.dirname(from_display.replace(os.sep, "/")), raw))
        text = self.read_text(target, display, inc.span)
        if text is None:
            return None
        module = self.parse_text(text, display)
        if module is None:
            return None
        self.stack.append(target)
        return module, display

    def done_include(self) -> None:
        self.stack.pop()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


# --- resolution -------------------------------------------------------------------------


class _Resolver:
    def __init__(self, loader: _Loader):
        self.loader = loader
        self.out = loader.out
        self.globals = Scope()
        self.lets: dict[str, ir.Let] = {}  # every let, for the IR's provenance (`ir.Engine.lets`)
        self.templates: dict[str, ast.Template] = {}
        self.engines: list[ast.Engine] = []
        self.template_stack: list[str] = []  # the templates being expanded, outermost first
        self.uses: list[tuple[str, ir.Span]] = []  # (template, the stage statement using it) being expanded, outermost first
        # a diagnostic's index -> (the template whose text it points into, the uses it was met through):
        # a template's problem is met once per use and reported once (`diagnostics.fold_template_uses`)
        self.template_uses: dict[int, tuple[str, tuple[tuple[str, ir.Span], ...]]] = {}
        self.engine_scope: Scope = self.globals  # what a template's body reads besides its parameters

    # top level ----------------------------------------------------------
    def module(self, m: ast.Module) -> ir.Spec | None:
        self.items(m, included=False)
        if len(self.engines) > 1:
            for e in self.engines[1:]:
                self.out.error("E0109", f"a second engine '{e.name.name}' in one spec", e.name.span, "put each engine in its own file; share stages with include")
        if not self.engines:
            # a file of templates: point at its start, so that a back-end's 'no engine' has a place
            return ir.Spec(engine=None, span=ir.Span(file=m.file, line=1, column=1, end_line=1, end_column=2))
        engine = self.engine(self.engines[0])
        return ir.Spec(engine=engine, span=self.engines[0].span)

    def items(self, m: ast.Module, included: bool) -> None:
        for item in m.items:
            if isinstance(item, ast.Let):
                self.let(item, self.globals)
            elif isinstance(item, ast.Include):
                got = self.loader.read_include(item, m.file)
                if got is not None:
                    sub, _ = got
                    self.items(sub, included=True)
                    self.loader.done_include()
            elif isinstance(item, ast.Template):
                prev = self.templates.get(item.name.name)
                if prev is not None:
                    self.out.error("E0102", f"stage template '{item.name.name}' is defined twice", item.name.span, f"the first one is at {prev.name.span}")
                else:
                    self.templates[item.name.name] = item
            elif isinstance(item, ast.Engine):
                if included:
                    self.out.error("E0108", f"an included file defines engine '{item.name.name}'", item.name.span, "included files hold lets and stage templates only")
                else:
                    self.engines.append(item)

    def let(self, item: ast.Let, scope: Scope) -> None:
        name = item.name.name
        if name in scope.names:
            prev = scope.names[name]
            self.out.error("E0102", f"'{name}' is defined twice", item.name.span, f"the first definition is at {prev.span}" if prev.span else None)
            return
        try:
            v = evaluate(item.value, scope)
        except EvalError as e:
            self.out.error(e.code, e.message, e.span, e.help)
            return
        if isinstance(v, Keyword):
            self.out.error("E0101", f"unknown name '{v.name}'", v.span, did_you_mean(v.name, scope.all_names()) or "a let binds a number or true/false")
            return
        if name in self.lets:  # an engine's let shadowing a file's: the name keeps no provenance
            scope.names[name] = Binding(v, item.name.span)
            return
        scope.names[name] = Binding(v, item.name.span, let=name)
        self.lets[name] = ir.Let(name=name, value=v, formula=formula(item.value, scope), span=item.name.span)

    def value(self, expr: ast.Expr, scope: Scope):
        try:
            return evaluate(expr, scope)
        except EvalError as e:
            self.out.error(e.code, e.message, e.span, e.help)
            return None

    # engine ---------------------------------------------------------------
    def engine(self, e: ast.Engine) -> ir.Engine | None:
        scope = self.globals.child()
        singles: dict[str, ast.Directive | ast.Startup] = {}
        body_items: list = []
        for item in e.body:
            if isinstance(item, ast.Let):
                self.let(item, scope)
            elif isinstance(item, ast.Startup) or (isinstance(item, ast.Directive) and item.keyword in ("chamber", "throat", "feed", "nozzle")):
                key = "startup" if isinstance(item, ast.Startup) else item.keyword
                if key in singles:
                    self.out.error("E0214", f"a second '{key}' in engine '{e.name.name}'", item.span, f"the first is at {singles[key].span}")
                else:
                    singles[key] = item
            else:
                body_items.append(item)

        width = hyper = None
        if "chamber" not in singles:
            self.out.error("E0213", f"engine '{e.name.name}' has no chamber", e.name.span, "add 'chamber width=N' (the residual stream's width)")
        else:
            c = singles["chamber"]
            o = Options("chamber", c.options, scope, self.out, c.span)
            width = o.get("width")
            hyper = self.chamber_streams(o)  # hyper-connections: a chamber of several streams
            o.finish()
        throat = "causal"
        if "throat" in singles:
            t = singles["throat"]
            if t.kind.name not in ("causal", "open"):
                self.out.error("E0204", f"unknown throat '{t.kind.name}'", t.kind.span, did_you_mean(t.kind.name, ["causal", "open"]) or "a throat is causal or open")
            else:
                throat = t.kind.name
            Options(f"throat {t.kind.name}", t.options, scope, self.out, t.span).finish()
        feed_d = singles.get("feed")
        if feed_d is None:
            self.out.error("E0213", f"engine '{e.name.name}' has no feed", e.name.span, "add 'feed tokens vocab=N context=N'")
        nozzle_d = singles.get("nozzle")
        if nozzle_d is None:
            self.out.error("E0213", f"engine '{e.name.name}' has no nozzle", e.name.span, "add 'nozzle head' (or 'nozzle head tied')")

        builtins = {}
        if width is not None:
            builtins["width"] = Binding(width, None)
        # the feed may read the chamber's width (`scale=sqrt(width)`); vocab and context are its own
        feed_scope = Scope(dict(builtins))
        feed_scope.parent = None
        feed = self.feed(feed_d, _Chain(scope, feed_scope), width) if feed_d is not None else None
        if feed is not None:
            builtins["vocab"] = Binding(feed.vocab, None)
            builtins["context"] = Binding(feed.context, None)
        inner = Scope(builtins)
        inner.parent = None
        # user names shadow the built-ins: look up in `scope` first, then built-ins
        full = _Chain(scope, inner)

        ctx = _EngineCtx(throat=throat, vocab=feed.vocab if feed else None, context=feed.context if feed else None, width=width)
        ctx.hyper = hyper
        body: list = []
        stage_names: dict[str, ast.Ident] = {}
        w = width
        self.engine_scope = full
        layers = repeated = 0
        for item in body_items:
            if isinstance(item, ast.Stage):
                st = self.stage(item, full, ctx, w, stage_names)
                if st is not None:
                    layers += sum(n for _, n in ir.leaf_stages([st]))
                    if layers > ir.MAX_LAYERS:
                        self.out.error("E0237", f"the engine runs {layers:,} stage instances by stage '{st.name}', above the limit of {ir.MAX_LAYERS:,}",
                                       item.span, "nested repeats multiply: stage a x 100 { stage b x 1000 {...} } is 100,000 instances")
                        st = None
                        w = None
                        continue
                    repeated += ir.repeated_stages([st])
                    if repeated > ir.MAX_REPEATED_STAGES:
                        self.out.error("E0238", f"the engine has {repeated:,} stages that repeat with counts of their own by stage "
                                       f"'{st.name}', above the limit of {ir.MAX_REPEATED_STAGES:,}", item.span,
                                       "stages that repeat alike are one stage: a template used once with `x N`, or a nested stage")
                        st = None
                        w = None
                        continue
                    body.append(st)
                    w = st.width_out
            else:
                op = self.main_directive(item, full, ctx, w)
                if op is not None:
                    body.append(op)
                    w = _out_width(op, w)
        nozzle = self.nozzle(nozzle_d, full, w, width, feed) if nozzle_d is not None else None
        startup = self.startup(singles.get("startup"), full, width)
        if self.out.has_errors or width is None or feed is None or nozzle is None or startup is None:
            return None
        if hyper is not None and not self.streams_fit(body, hyper, singles["chamber"].span):
            return None
        body = ir.passes.finalize_merges(body, startup.init)
        per_layer = ir.nodes.per_layer_mlps(body)  # Gemma 4: the feed makes one per-layer input for each per-layer mlp instance
        if bool(per_layer) != bool(feed.per_layer) or any(m.hidden != feed.per_layer for m in per_layer):
            self.out.error("E0211", f"the feed's per_layer={feed.per_layer} must match the per-layer mlps' hidden width ({len(per_layer)} in the engine)",
                           feed.span, "set the feed's per_layer= to the per-layer mlps' hidden=, or drop both")
            return None
        if per_layer:
            feed = feed.model_copy(update={"per_layer_layers": len(per_layer)})
        try:  # KV sharing: each slot read after a layer stored it, at its shape
            ir.nodes.kv_slots(body)
        except ValueError as err:
            self.out.error("E0211", str(err), e.span, "store the slot (kv_store=N) in an earlier layer whose attention has the reader's shape")
            return None
        chamber = singles["chamber"]
        return ir.Engine(name=e.name.name, width=width, throat=throat, feed=feed, body=body, nozzle=nozzle, startup=startup, span=e.span,
                         lets=tuple(self.lets.values()), let_names=_lets(chamber.options, scope))

    def feed(self, d: ast.Directive, scope: Scope, width: int | None) -> ir.Feed | None:
        if d.kind.name != "tokens":
            self.out.error("E0204", f"unknown feed '{d.kind.name}'", d.kind.span, did_you_mean(d.kind.name, ["tokens"]) or "the feed is 'tokens'")
            return None
        o = Options("feed tokens", d.options, scope, self.out, d.span)
        vocab = o.get("vocab")
        context = o.get("context")
        position = o.get("position")
        scale = o.get("scale")
        dropout = o.get("dropout")
        padding = o.get("padding")
        per_layer = {k: o.get(k) for k in ("per_layer", "per_layer_vocab", "per_layer_eps")}
        o.finish()
        if None in (vocab, context, width, position, scale, dropout) or None in per_layer.values():
            return None
        if per_layer["per_layer"] and not per_layer["per_layer_vocab"]:
            per_layer["per_layer_vocab"] = vocab
        if not per_layer["per_layer"] and (o.has("per_layer_vocab") or o.has("per_layer_eps")):
            self.out.error("E0211", "per_layer_vocab= and per_layer_eps= shape per-layer inputs, but per_layer is 0", o.span_of("per_layer_vocab" if o.has("per_layer_vocab") else "per_layer_eps"), "add per_layer=N")
            return None
        if not per_layer["per_layer"]:
            per_layer["per_layer_vocab"] = 0
        if padding is not None and padding >= vocab:
            self.out.error("E0205", f"padding={padding} is outside the vocabulary of {vocab} tokens", o.span_of("padding"), f"a token id below {vocab}")
            return None
        if position == "sinusoidal" and width % 2:
            self.out.error("E0205", "sinusoidal positions need an even width", o.span_of("position"), f"the chamber width is {width}")
            return None
        return ir.Feed(vocab=vocab, context=context, position=position, width=width, scale=scale, dropout=dropout, padding=padding, span=d.span,
                       let_names=o.lets(), **per_layer)

    def nozzle(self, d: ast.Directive, scope, w: int | None, width: int | None, feed: ir.Feed | None) -> ir.Nozzle | None:
        if d.kind.name != "head":
            self.out.error("E0204", f"unknown nozzle '{d.kind.name}'", d.kind.span, did_you_mean(d.kind.name, ["head"]) or "the nozzle is 'head'")
            return None
        o = Options("nozzle head", d.options, scope, self.out, d.span)
        tied = o.get("tied")
        bias = o.get("bias")
        scale = o.get("scale")
        softcap = o.get("softcap")
        o.finish()
        if w is None or feed is None or scale is None:
            return None
        if tied and w != width:
            self.out.error("E0217", f"a tied head needs the chamber's width {width} at the nozzle, but the main line ends at width {w}", o.span_of("tied"), "untie the head, or bring the main line back to the chamber width")
            return None
        if tied and bias:
            pass  # a tied head may still learn its own bias
        return ir.Nozzle(width=w, vocab=feed.vocab, tied=tied, bias=bias, scale=scale, softcap=softcap, span=d.span, let_names=o.lets())

    def startup(self, s: ast.Startup | None, scope, width: int | None = None) -> ir.Startup | None:
        warmup, clip, betas, decay = 0, None, (0.9, 0.999), 0.01
        schedule = ir.Schedule(kind="constant", lr=1e-3, min_lr=0.0, steps=None)
        init = ir.Init(kind="normal", std=0.02)
        param = ir.STANDARD
        if s is None:
            return ir.Startup(warmup=warmup, schedule=schedule, clip=clip, betas=betas, decay=decay, init=init)
        seen: dict[str, ir.Span] = {}
        ok = True
        for item in s.body:
            key = item.keyword
            if key in seen:
                self.out.error("E0214", f"a second '{key}' in startup", item.span, f"the first is at {seen[key]}")
                continue
            seen[key] = item.span
            if isinstance(item, ast.Scalar):
                vals = []
                for v in item.values:
                    try:
                        vals.append(number(v, scope))
                    except EvalError as e:
                        self.out.error(e.code, e.message, e.span, e.help)
                        ok = False
                if len(vals) != len(item.values):
                    continue
                if key == "warmup":
                    steps = whole(vals[0])
                    if steps is None or not 0 <= steps <= MAX_INT:  # exact: 2**53 + 1 is a whole number too
                        self.out.error("E0205", "warmup is a whole number of steps, 0 or more (at most 2**62)", item.span)
                        ok = False
                    else:
                        warmup = steps
                elif key == "clip":
                    if not 0 < vals[0] <= 1e6:
                        self.out.error("E0205", "clip must be in (0, 1e6]", item.span, "remove the line to train without clipping")
                        ok = False
                    else:
                        clip = float(vals[0])
                elif key == "decay":
                    if not 0 <= vals[0] <= 10:
                        self.out.error("E0205", "decay must be in [0, 10]", item.span)
                        ok = False
                    else:
                        decay = float(vals[0])
                elif key == "betas":
                    if not all(0 <= b < 1 for b in vals):
                        self.out.error("E0205", "betas must be in [0, 1)", item.span)
                        ok = False
                    else:
                        betas = (float(vals[0]), float(vals[1]))
            elif key == "schedule":
                kind = item.kind.name
                if kind not in ("constant", "cosine", "linear"):
                    self.out.error("E0204", f"unknown schedule '{kind}'", item.kind.span, did_you_mean(kind, ["constant", "cosine", "linear"]) or "constant, cosine or linear")
                    ok = False
                    continue
                o = Options(f"schedule {kind}", item.options, scope, self.out, item.span)
                lr = o.get("lr")
                steps = o.get("steps")
                min_lr = o.get("min") if kind != "constant" else 0.0
                o.finish()
                if lr is not None and min_lr is not None and min_lr > lr:
                    self.out.error("E0205", f"min={min_lr:g} is above lr={lr:g}", o.span_of("min"))
                    ok = False
                elif lr is not None and min_lr is not None:
                    schedule = ir.Schedule(kind=kind, lr=lr, min_lr=min_lr, steps=steps, span=item.span)
            elif key == "init":
                kind = item.kind.name
                if kind not in ("normal", "xavier"):
                    self.out.error("E0204", f"unknown init '{kind}'", item.kind.span, did_you_mean(kind, ["normal", "xavier"]) or "normal or xavier")
                    ok = False
                    continue
                o = Options(f"init {kind}", item.options, scope, self.out, item.span)
                std = o.get("std") if kind == "normal" else 0.02
                o.finish()
                init = ir.Init(kind=kind, std=std, span=item.span, let_names=o.lets())
            elif key == "param":
                kind = item.kind.name
                if kind not in ("standard", "mup"):
                    self.out.error("E0204", f"unknown parametrisation '{kind}'", item.kind.span,
                                   did_you_mean(kind, ["standard", "mup"]) or "standard (the default) or mup")
                    ok = False
                    continue
                o = Options(f"param {kind}", item.options, scope, self.out, item.span)
                base = o.int("base_width", width) if kind == "mup" else None
                o.finish()
                if kind == "mup" and base is None:
                    ok = False  # the chamber's width is itself in error, or base_width is
                    continue
                param = ir.Param(kind=kind, base_width=base, span=item.span)
        if not ok:
            return None
        if param.kind == "mup" and init.kind != "normal":
            self.out.error("E0260", "mup scales a normal init, not xavier", init.span or param.span,
                           "use 'init normal std=0.02' (the std at base_width) with 'param mup'")
            return None
        return ir.Startup(warmup=warmup, schedule=schedule, clip=clip, betas=betas, decay=decay, init=init, param=param, span=s.span)

    # stages ---------------------------------------------------------------
    def stage(self, s: ast.Stage, scope, ctx: "_EngineCtx", w: int | None, names: dict, depth: int = 1) -> ir.Stage | None:
        """A stage (`_stage`); one made from a template records, for each problem found in the
        template's own text while expanding it, which use met it."""
        t = self.templates.get((s.template or s.name).name) if s.body is None else None
        if t is None:
            return self._stage(s, scope, ctx, w, names, depth)
        mark = len(self.out.diagnostics)
        self.uses.append((t.name.name, s.span))
        try:
            return self._stage(s, scope, ctx, w, names, depth)
        finally:
            chain = tuple(self.uses)
            self.uses.pop()
            for i in range(mark, len(self.out.diagnostics)):
                d = self.out.diagnostics[i]
                if i not in self.template_uses and d.span is not None and _contains(t.span, d.span):
                    self.template_uses[i] = (t.name.name, chain)

    def _stage(self, s: ast.Stage, scope, ctx: "_EngineCtx", w: int | None, names: dict, depth: int = 1) -> ir.Stage | None:
        """A stage on the main line (depth 1) or nested in one. `scope` is where the stage is
        written: its repeat and arguments read it, and so does an inline body; a template's body
        reads its own parameters, then the engine's names, never the scope it is used in."""
        name = s.name
        template_name = None
        body = s.body
        body_scope = scope
        if depth > ir.MAX_STAGE_DEPTH:
            self.out.error("E0235", f"stages nest deeper than {ir.MAX_STAGE_DEPTH} levels", name.span,
                           f"a stage holds stages {ir.MAX_STAGE_DEPTH - 1} levels down at most; fold the pattern into fewer levels")
            return None
        if s.template is not None or s.body is None:
            tname = s.template if s.template is not None else s.name
            if s.body is not None:
                self.out.error("E0215", "a stage made from a template has no body of its own", s.span, f"drop the '{{ ... }}', or drop '= {tname.name}'")
                return None
            t = self.templates.get(tname.name)
            if t is None:
                hint = did_you_mean(tname.name, self.templates)
                if hint is None:
                    hint = "a stage needs a body '{ ... }' or the name of a stage template"
                self.out.error("E0103", f"unknown stage template '{tname.name}'", tname.span, hint)
                return None
            if t.name.name in self.template_stack:
                chain = " -> ".join([*self.template_stack[self.template_stack.index(t.name.name):], t.name.name])
                self.out.error("E0236", f"stage template '{t.name.name}' uses itself: {chain}", tname.span,
                               "a template's stages are made from other templates, or written inline")
                return None
            template_name = t.name.name
            params = self.bind_args(t, s, scope)
            if params is None:
                return None
            body = t.body
            body_scope = _Chain(Scope(params), self.engine_scope)
        elif s.args is not None:
            self.out.error("E0215", f"stage '{name.name}' has arguments but is not a template", s.span, "define the template at the top of the file: stage NAME(params) { ... }")
            return None

        if name.name in names:
            self.out.error("E0102", f"a second stage named '{name.name}'", name.span, f"name it: stage other = {template_name or name.name}(...)" if template_name else "give each stage its own name")
            return None
        names[name.name] = name

        repeat = self.repeat(s.repeat, scope) if s.repeat is not None else 1

        ops: list = []
        prechamber_names: dict[str, ast.Ident] = {}
        stage_names: dict[str, ast.Ident] = {}
        w_in = w
        items = list(body or ())
        inner = [i for i in items if isinstance(i, ast.Stage)]
        if inner and len(inner) != len(items):
            other = next(i for i in items if not isinstance(i, ast.Stage))
            what = f"{other.keyword} {other.kind.name}" if isinstance(other, ast.Directive) and other.kind else (
                f"prechamber '{other.name.name}'" if isinstance(other, ast.Prechamber) else "a fullflow")
            self.out.error("E0234", f"stage '{name.name}' holds stages, so it cannot also hold {what}", other.span,
                           f"a stage holds either stages or ops; move it into a stage of its own inside '{name.name}': stage NAME {{ ... }}")
            return None
        if template_name is not None:
            self.template_stack.append(template_name)
        try:
            for item in items:
                if isinstance(item, ast.Stage):
                    op = self.stage(item, body_scope, ctx, w, stage_names, depth + 1)
                elif isinstance(item, ast.Prechamber):
                    op = self.prechamber(item, body_scope, ctx, w, prechamber_names)
                elif isinstance(item, ast.Fullflow):
                    op = self.fullflow(item, body_scope, ctx, w, prechamber_names)
                else:
                    op = self.main_directive(item, body_scope, ctx, w)
                if op is not None:
                    ops.append(op)
                    w = _out_width(op, w)
        finally:
            if template_name is not None:
                self.template_stack.pop()
        if w_in is None or w is None or repeat is None:
            return None
        if repeat > 1 and w != w_in:
            self.out.error("E0212", f"stage '{name.name}' repeats {repeat} times but changes the width from {w_in} to {w}", s.span, "a repeated stage must end at the width it starts with")
            return None
        let = let_ref(s.repeat, scope)
        return ir.Stage(name=name.name, template=template_name, repeat=repeat, width_in=w_in, width_out=w, ops=ops, span=s.span,
                        let_names=(("repeat", let),) if let else ())

    def repeat(self, expr: ast.Expr, scope) -> int | None:
        """The repeat count; None (reported) when it is not a sensible whole number."""
        try:
            rv = number(expr, scope)
        except EvalError as e:
            self.out.error(e.code, e.message, e.span, e.help)
            return None
        n = whole(rv)
        if n is None or n < 1:
            self.out.error("E0205", f"a stage repeats a whole number of times, 1 or more; found {rv:g}", expr.span)
            return None
        if n > MAX_REPEAT:
            self.out.error("E0216", f"repeat count {n} is above the limit of {MAX_REPEAT}", expr.span, "a spec describes a model that can be built")
            return None
        return n

    def bind_args(self, t: ast.Template, s: ast.Stage, scope) -> dict[str, Binding] | None:
        params = list(t.params or ())
        args = list(s.args or ())
        bound: dict[str, Binding] = {}
        ok = True
        positional = [a for a in args if a.name is None]
        seen_named = False
        for a in args:
            if a.name is not None:
                seen_named = True
            elif seen_named:
                self.out.error("E0104", "a positional argument after a named one", a.span, "put positional arguments first")
                ok = False
        if len(positional) > len(params):
            self.out.error("E0104", f"template '{t.name.name}' takes {len(params)} argument(s), {len(positional)} given", positional[len(params)].span)
            return None
        for p, a in zip(params, positional):
            v = self.value(a.value, scope)
            if v is None:
                ok = False
            else:
                bound[p.name.name] = Binding(v, a.span, let=let_ref(a.value, scope))
        pnames = [p.name.name for p in params]
        for a in args:
            if a.name is None:
                continue
            if a.name.name not in pnames:
                self.out.error("E0104", f"template '{t.name.name}' has no parameter '{a.name.name}'", a.name.span, did_you_mean(a.name.name, pnames) or (f"its parameters: {', '.join(pnames)}" if pnames else "it takes no parameters"))
                ok = False
                continue
            if a.name.name in bound:
                self.out.error("E0104", f"parameter '{a.name.name}' is given twice", a.name.span)
                ok = False
                continue
            v = self.value(a.value, scope)
            if v is None:
                ok = False
            else:
                bound[a.name.name] = Binding(v, a.span, let=let_ref(a.value, scope))
        for p in params:
            if p.name.name in bound:
                continue
            if p.default is None:
                self.out.error("E0104", f"template '{t.name.name}' needs argument '{p.name.name}'", s.span, f"add {p.name.name}=VALUE")
                ok = False
                continue
            v = self.value(p.default, _Chain(Scope(bound), scope))
            if v is None:
                ok = False
            else:
                bound[p.name.name] = Binding(v, p.span, let=let_ref(p.default, _Chain(Scope(bound), scope)))
        return bound if ok else None

    def fullflow(self, f: ast.Fullflow, scope, ctx, w, names) -> ir.Fullflow | None:
        name = f.name.name if f.name is not None else "fullflow"
        span = f.name.span if f.name is not None else f.span
        if name in names:
            self.out.error("E0102", f"a second branch named '{name}' in this stage", span, "give each prechamber and fullflow its own name" if f.name else "name it: fullflow NAME { ... }")
            return None
        names[name] = f.name
        norm = None
        branches = []
        for item in f.body:
            if isinstance(item, ast.Directive):  # a norm: the shared valve
                if branches or norm is not None:
                    self.out.error("E0215", "a fullflow's shared norm comes first, once", item.span, "put one norm before the prechambers")
                    continue
                norm = self.norm(item, scope, w)
            else:
                b = self.prechamber(item, scope, ctx, w, names)
                if b is not None:
                    branches.append(b)
        if len(f.body) and not any(isinstance(i, ast.Prechamber) for i in f.body):
            self.out.error("E0206", "a fullflow needs at least one prechamber", f.span)
            return None
        if not f.body:
            self.out.error("E0206", "a fullflow needs at least one prechamber", f.span)
            return None
        if w is None or len(branches) != sum(isinstance(i, ast.Prechamber) for i in f.body):
            return None
        return ir.Fullflow(name=name, width=w, norm=norm, branches=branches, span=f.span)

    def prechamber(self, p: ast.Prechamber, scope, ctx, w, names) -> ir.Prechamber | None:
        name = p.name.name
        if name in names:
            self.out.error("E0102", f"a second branch named '{name}' in this stage", p.name.span, "give each prechamber its own name")
            return None
        names[name] = p.name
        o = Options(f"prechamber {name}", p.options, scope, self.out, p.span, key="prechamber")
        detach = o.get("detach")
        overboard = o.get("overboard")
        loss = o.get("loss")
        o.finish()
        if loss is not None and not overboard:
            self.out.error("E0211", "loss= weighs an overboard branch's loss; this branch merges back", o.span_of("loss"), "add 'overboard', or drop loss=")
            return None
        ops = []
        merge_d = None
        bw = w
        ok = True
        items = list(p.body)
        for i, item in enumerate(items):
            if item.keyword == "merge":
                if merge_d is not None:
                    self.out.error("E0214", "a second merge in one prechamber", item.span, "a branch returns to the chamber once")
                    ok = False
                elif i != len(items) - 1:
                    self.out.error("E0215", "merge ends a prechamber", item.span, "move the merge after the turbines and norms")
                    ok = False
                merge_d = item
                continue
            if item.keyword == "norm":
                op = self.norm(item, scope, bw)
            else:
                op = self.turbine(item, scope, ctx, bw)
            if op is None:
                ok = False
                continue
            ops.append(op)
            bw = _out_width(op, bw)
        if not any(ir.is_turbine(op) for op in ops) and ok:
            self.out.error("E0206", f"prechamber '{name}' has no turbine", p.span, f"add the work it does: turbine {'|'.join(TURBINES)}")
            return None
        if not ok or w is None or bw is None:
            return None
        merge = None
        if overboard:
            if merge_d is not None:
                self.out.error("E0211", "an overboard branch never merges", merge_d.span, "drop the merge, or drop 'overboard'")
                return None
            if loss is not None and ctx.vocab is not None and bw != ctx.vocab:
                self.out.error("E0212", f"an overboard branch with a loss predicts the next token, so it must end at width vocab={ctx.vocab}; it ends at {bw}", p.span, "end the branch with 'turbine linear out=vocab'")
                return None
        else:
            if bw != w:
                self.out.error("E0212", f"prechamber '{name}' returns width {bw} to a chamber of width {w}", (merge_d or p).span, f"end the branch at width {w}, e.g. 'turbine linear out={w}'")
                return None
            merge = self.merge(merge_d, scope) if merge_d is not None else ir.PlainMerge()
            if merge is None:
                return None
            merge = self.hyper_merge(merge, ctx, merge_d)
            if merge is None:
                return None
        return ir.Prechamber(name=name, width=w, out_width=bw, detach=detach, overboard=overboard, loss=loss, ops=ops, merge=merge, span=p.span)

    def merge(self, d: ast.Directive, scope) -> ir.Merge | None:
        first = d.options[0]
        kind = first.name.name
        if kind not in MERGES:
            self.out.error("E0204", f"unknown merge '{kind}'", first.name.span, did_you_mean(kind, MERGES) or f"one of: {', '.join(MERGES)}")
            return None
        if kind != "scale" and first.value is not None:
            self.out.error("E0203", f"'merge {kind}' takes no value", first.span, f"write 'merge {kind}'")
            return None
        rest = d.options[1:] if kind != "scale" else d.options
        o = Options(f"merge {kind}", rest, scope, self.out, d.span)
        m = None
        if kind == "plain":
            m = ir.PlainMerge(span=d.span)
        elif kind == "scale":
            v = o.get("scale")
            if v is not None:
                m = ir.ScaleMerge(value=v, span=d.span)
        elif kind == "cooling":
            base = o.get("std")
            m = ir.CoolingMerge(base_asked=base, span=d.span)
        elif kind == "rezero":
            m = ir.RezeroMerge(init=o.get("init"), span=d.span)
        elif kind == "layerscale":
            init = o.get("init")
            m = ir.LayerscaleMerge(init_asked=init, span=d.span)
        elif kind == "deepnorm":
            alpha = o.get("alpha")
            beta = o.get("beta")
            m = ir.DeepnormMerge(alpha_asked=alpha, beta_asked=beta, span=d.span)
        elif kind == "gate":
            m = ir.GateMerge(bias=o.get("bias"), span=d.span)
        elif kind == "hyper":  # the chamber's options say which (hyper_merge)
            m = ir.HyperMerge(streams=1, connections="hyper", dynamic=False, span=d.span)
        o.finish()
        return m.model_copy(update=dict(let_names=o.lets())) if m is not None and o.lets() else m

    # hyper-connections: a chamber of several streams ------------------------------------------
    def chamber_streams(self, o: Options) -> ir.HyperMerge | None:
        """`chamber streams=N connections=hyper|manifold [dynamic] [sinkhorn=K]`: the junction every
        branch gets, or None (one stream, plain junctions)."""
        streams = o.get("streams")
        connections = o.get("connections")
        dynamic = o.get("dynamic")
        sinkhorn = o.get("sinkhorn")
        if connections is None and streams is not None and streams > 1:
            connections = "hyper"
        if connections is None:
            for name in ("dynamic", "sinkhorn"):
                if o.has(name):
                    self.out.error("E0290", f"{name}= describes hyper-connections, but the chamber holds one stream", o.span_of(name),
                                   "add streams=N (and connections=hyper|manifold), or drop it")
            return None
        if connections == "manifold":
            if o.has("dynamic") and not dynamic:
                self.out.error("E0290", "a manifold-constrained connection computes its weights from the streams: it is always dynamic",
                               o.span_of("dynamic"), "drop dynamic=false, or use connections=hyper")
                return None
            dynamic = True
        elif o.has("sinkhorn"):
            self.out.error("E0290", "sinkhorn= keeps the manifold connection's mixing doubly stochastic; connections=hyper has none",
                           o.span_of("sinkhorn"), "use connections=manifold, or drop sinkhorn=")
            return None
        if streams is None or sinkhorn is None or dynamic is None:
            return None
        return ir.HyperMerge(streams=streams, connections=connections, dynamic=dynamic, sinkhorn=sinkhorn,
                             eps=1e-6 if connections == "manifold" else 1e-5)

    def hyper_merge(self, merge, ctx: "_EngineCtx", d) -> object:
        """A branch's junction in a chamber of several streams: the chamber's hyper-connection, which
        replaces the add; any other merge is refused there, and `merge hyper` without streams."""
        if ctx.hyper is None:
            if isinstance(merge, ir.HyperMerge):
                self.out.error("E0290", "merge hyper joins a chamber of several streams, but this chamber holds one", d.span,
                               "say it on the chamber: chamber width=N streams=4 connections=hyper")
                return None
            return merge
        if d is not None and not isinstance(merge, ir.HyperMerge):
            self.out.error("E0290", f"merge {merge.kind}: in a chamber of {ctx.hyper.streams} streams every branch joins through the "
                           "chamber's hyper-connection", d.span, "drop the merge (or write 'merge hyper')")
            return None
        return ctx.hyper.model_copy(update=dict(span=d.span if d is not None else None))

    def streams_fit(self, body, hyper: ir.HyperMerge, span) -> bool:
        """The main line of a chamber of several streams: the stages first (their streams are summed where they
        end), each holding prechambers that return; E0291 otherwise."""
        ok, after = True, None
        for op in body:
            if not isinstance(op, ir.Stage):
                after = after or op
                continue
            if after is not None:
                self.out.error("E0291", f"stage '{op.name}' comes after a {after.op} on the main line, where the {hyper.streams} streams are "
                               "already summed", op.span or span, "put the main line's own ops after the last stage")
                ok = False
        for st, _ in ir.leaf_stages(body):
            for op in st.ops:
                if isinstance(op, ir.Prechamber) and not op.overboard:
                    continue
                what = f"prechamber '{op.name}' overboard" if isinstance(op, ir.Prechamber) else (
                    f"fullflow '{op.name}'" if isinstance(op, ir.Fullflow) else f"a {op.op} on the main line")
                self.out.error("E0291", f"stage '{st.name}': {what} in a chamber of {hyper.streams} streams", op.span or st.span or span,
                               "a chamber of several streams holds prechambers that return: each reads a mix of the streams and writes into each")
                ok = False
        return ok

    def missing_kind(self, d: ast.Directive, kinds) -> bool:
        """`norm turbine mlp`: the kind was left out and the next keyword was read as one."""
        if d.kind.name in KEYWORD_HOMES:
            self.out.error("E0005", f"'{d.keyword}' needs a kind", d.span, f"write '{d.keyword} {'|'.join(kinds)}'")
            return True
        return False

    def norm(self, d: ast.Directive, scope, w) -> ir.Norm | None:
        kind = d.kind.name
        if self.missing_kind(d, NORMS):
            return None
        if kind not in NORMS:
            self.out.error("E0204", f"unknown norm '{kind}'", d.kind.span, did_you_mean(kind, NORMS) or "layernorm or rmsnorm")
            return None
        o = Options(f"norm {kind}", d.options, scope, self.out, d.span)
        if kind == "scalar":  # Gemma 4's layer_scalar: no options
            o.finish()
            return None if w is None else ir.Norm(type=kind, width=w, eps=1e-6, bias=False, affine=False, span=d.span, let_names=o.lets())
        eps = o.get("eps")
        affine = o.get("affine")
        bias = o.get("bias", affine) if kind == "layernorm" else False
        offset = o.get("offset")
        o.finish()
        if w is None or eps is None or offset is None:
            return None
        if not affine and (bias or offset):
            what = "bias" if bias else "offset"
            self.out.error("E0211", f"a norm with affine=false learns no gain, so it has no {what}", o.span_of(what), f"drop {what}=, or the affine=false")
            return None
        return ir.Norm(type=kind, width=w, eps=eps, bias=bias, affine=affine, offset=offset, span=d.span, let_names=o.lets())

    def main_directive(self, d: ast.Directive, scope, ctx, w):
        if d.keyword == "norm":
            return self.norm(d, scope, w)
        return self.turbine(d, scope, ctx, w)

    def turbine(self, d: ast.Directive, scope, ctx: "_EngineCtx", w):
        kind = d.kind.name
        if self.missing_kind(d, TURBINES):
            return None
        if kind not in TURBINES:
            self.out.error("E0204", f"unknown turbine '{kind}'", d.kind.span, did_you_mean(kind, TURBINES) or f"one of: {', '.join(TURBINES)}")
            return None
        o = Options(f"turbine {kind}", d.options, scope, self.out, d.span)
        op = getattr(self, "t_" + kind)(o, ctx, w, d)
        o.finish()
        return op.model_copy(update=dict(let_names=o.lets())) if op is not None and o.lets() else op

    def t_attention(self, o: Options, ctx, w, d):
        if o.has("latent"):  # multi-head latent attention: a kind of its own
            return self.t_latent_attention(o, ctx, w, d)
        heads = o.get("heads")
        kv = o.get("kv_heads")
        head_dim = o.get("head_dim")
        mask = o.get("mask", ctx.throat)
        window = o.get("window")
        rotary = o.get("rotary")
        base = o.get("rotary_base")
        qk_norm = o.get("qk_norm")
        qk_eps = o.get("qk_norm_eps")
        qk_across = o.get("qk_norm_across")
        qk_shape = {k: o.get(k) for k in ("qk_norm_type", "qk_norm_bias", "qk_norm_offset", "qk_norm_affine", "qk_norm_after_rotary", "qk_norm_head_gains")}
        scale = o.get("scale")
        interleaved = o.get("rotary_interleaved")
        bias = o.get("bias")
        out_bias = o.get("out_bias", bias)
        dropout = o.get("dropout")
        softcap = o.get("softcap")
        alibi = o.get("alibi")
        alibi_scaled = o.get("alibi_scaled")
        gate = o.get("gate")
        if alibi_scaled and not alibi:
            self.out.error("E0211", "alibi_scaled says how ALiBi positions are scaled, but alibi is off", o.span_of("alibi_scaled"), "add alibi")
            return None
        gate_act = o.get("gate_act") or "sigmoid"
        if gate_act != "sigmoid" and (gate or "none") == "none":
            self.out.error("E0211", f"gate_act={gate_act} is the output gate's function, but there is no gate", o.span_of("gate_act"), "add gate=channel or gate=head")
            return None
        scaling = self._rotary_scaling(o, ctx, rotary)
        if None in (heads, w, mask, rotary, base, dropout, qk_eps) or scaling is False:
            return None
        if interleaved and not rotary:
            self.out.error("E0211", "rotary_interleaved says how rotary positions pair the dims, but rotary is off", o.span_of("rotary_interleaved"), "add rotary")
            return None
        if (o.has("qk_norm_eps") or qk_across) and not qk_norm:
            self.out.error("E0211", "qk_norm_eps= and qk_norm_across set a qk-norm, but qk_norm is off", o.span_of("qk_norm_eps" if o.has("qk_norm_eps") else "qk_norm_across"), "add qk_norm")
            return None
        said = next((k for k in ("qk_norm_type", "qk_norm_bias", "qk_norm_offset", "qk_norm_affine", "qk_norm_after_rotary", "qk_norm_head_gains") if o.has(k)), None)
        if said and not qk_norm:
            self.out.error("E0211", f"{said} shapes a qk-norm, but qk_norm is off", o.span_of(said), "add qk_norm")
            return None
        if None in qk_shape.values():
            return None
        if qk_across and qk_shape["qk_norm_after_rotary"]:
            self.out.error("E0211", "a qk-norm across heads acts before the heads split, so before rotary", o.span_of("qk_norm_after_rotary"),
                           "drop qk_norm_across or qk_norm_after_rotary")
            return None
        if qk_shape["qk_norm_head_gains"] and (qk_across or not qk_shape["qk_norm_affine"]):
            self.out.error("E0211", "a gain per head needs a learned gain on each head's own norm", o.span_of("qk_norm_head_gains"),
                           "drop qk_norm_head_gains, or the qk_norm_across / qk_norm_affine=false")
            return None
        if qk_shape["qk_norm_bias"] and qk_shape["qk_norm_type"] != "layernorm":
            self.out.error("E0211", "a qk rmsnorm has no bias", o.span_of("qk_norm_bias"), "add qk_norm_type=layernorm, or drop qk_norm_bias")
            return None
        if not qk_shape["qk_norm_affine"] and (qk_shape["qk_norm_bias"] or qk_shape["qk_norm_offset"]):
            what = "qk_norm_bias" if qk_shape["qk_norm_bias"] else "qk_norm_offset"
            self.out.error("E0211", f"a qk-norm with qk_norm_affine=false learns no gain, so it has no {what.removeprefix('qk_norm_')}", o.span_of(what),
                           f"drop {what}, or the qk_norm_affine=false")
            return None
        if kv is None:
            kv = heads
        if heads % kv:
            self.out.error("E0208", f"kv_heads={kv} does not divide heads={heads}", o.span_of("kv_heads"), "each group of query heads shares one KV head; pick a divisor of heads")
            return None
        head_dim = self._head_dim(o, w, heads, head_dim)
        if head_dim is None:
            return None
        if self._leaks(o, ctx, mask):
            return None
        if window is not None and mask == "open":
            self.out.error("E0211", "a sliding window is defined for causal attention only", o.span_of("window"))
            return None
        rotary_dims = int(head_dim * rotary) // 2 * 2
        if rotary > 0 and rotary_dims == 0:
            self.out.error("E0205", f"rotary={rotary:g} of head_dim {head_dim} rotates no pair of dimensions", o.span_of("rotary"), "raise the fraction")
            return None
        gemma4 = self._gemma4_attention(o, rotary_dims, interleaved, head_dim, qk_norm)
        if gemma4 is None:
            return None
        return ir.Attention(**gemma4, width=w, heads=heads, kv_heads=kv, head_dim=head_dim, mask=mask, window=window, rotary_dims=rotary_dims,
                            rotary_base=base, qk_norm=qk_norm, bias=bias, out_bias=out_bias, dropout=dropout,
                            qk_norm_eps=qk_eps, qk_norm_across=qk_across, scale=scale, rotary_interleaved=interleaved,
                            rotary_scaling=scaling, softcap=softcap, alibi=alibi, alibi_scaled=alibi_scaled, **qk_shape,
                            sinks=bool(o.get("sinks")), gate=gate or "none", gate_act=gate_act, span=d.span)  # sinks: gpt-oss's learned logit per head in every softmax

    def _gemma4_attention(self, o: Options, rotary_dims: int, interleaved: bool, head_dim: int, qk_norm: bool) -> dict | None:
        """Gemma 4's attention options: rotary_spread, v_norm, k_eq_v (None after an error)."""
        out = {k: o.get(k) for k in ("rotary_spread", "v_norm", "k_eq_v")}
        if None in out.values():
            return None
        out.update({k: o.get(k) for k in ("kv_store", "kv_reuse")})
        if out["kv_reuse"] is not None and (out["kv_store"] is not None or out["k_eq_v"] or out["v_norm"]):
            what = next(k for k in ("kv_store", "k_eq_v", "v_norm") if out[k])
            self.out.error("E0211", f"kv_reuse reads another layer's keys and values: this attention has none to {'store' if what == 'kv_store' else what}",
                           o.span_of(what), f"drop {what}")
            return None
        if out["rotary_spread"] and (not rotary_dims or interleaved or head_dim % 2):
            self.out.error("E0211", "rotary_spread spreads the rotated pairs over the two halves of a head: it needs rotary, not interleaved, and an even head_dim",
                           o.span_of("rotary_spread"), "add rotary=FRACTION, or drop rotary_spread")
            return None
        if out["v_norm"] and not qk_norm:
            self.out.error("E0211", "v_norm normalises the values as the qk-norm does the keys (its eps is qk_norm_eps), but qk_norm is off",
                           o.span_of("v_norm"), "add qk_norm")
            return None
        return out

    _SCALING_OPTIONS = {"rotary_factor": ("linear", "dynamic", "llama3", "yarn"), "rotary_original": ("dynamic", "llama3", "yarn"),
                        "rotary_low": ("llama3",), "rotary_high": ("llama3",), "rotary_beta_fast": ("yarn",),
                        "rotary_beta_slow": ("yarn",), "rotary_attention_factor": ("yarn",), "rotary_truncate": ("yarn",)}

    def _rotary_scaling(self, o: Options, ctx, rotary):
        """The attention's RotaryScaling, None for plain rotary, False after an error."""
        before = len(self.out.diagnostics)
        kind = o.get("rotary_scaling")
        values = {name: o.get(name) for name in self._SCALING_OPTIONS}
        if kind is None or len(self.out.diagnostics) > before:  # a kind or a value already refused: nothing more to say
            return False
        for name, kinds in self._SCALING_OPTIONS.items():
            if o.has(name) and kind not in kinds:
                which = " or ".join(kinds)
                self.out.error("E0240", f"{name}= belongs to rotary_scaling={which}, but this attention's is {kind}", o.span_of(name),
                               f"set rotary_scaling={kinds[0]}, or drop {name}=" if kind == "none" else f"drop {name}=")
                return False
        if kind == "none":
            return None
        if not rotary:
            self.out.error("E0241", f"rotary_scaling={kind} stretches rotary positions, but rotary is off", o.span_of("rotary_scaling"), "add rotary")
            return False
        if values["rotary_factor"] is None:
            self.out.error("E0242", f"rotary_scaling={kind} needs rotary_factor=", o.span_of("rotary_scaling"),
                           "how many times the pretraining context the positions stretch over, e.g. rotary_factor=4")
            return False
        original = None if kind == "linear" else values["rotary_original"] or ctx.context
        if original is None and kind != "linear":  # no context to default to: the feed's own error says why
            return False
        if kind == "llama3" and values["rotary_high"] <= values["rotary_low"]:
            self.out.error("E0243", f"llama3 scaling needs rotary_high ({values['rotary_high']:g}) above rotary_low ({values['rotary_low']:g})",
                           o.span_of("rotary_high"), "transformers' defaults are rotary_low=1 rotary_high=4")
            return False
        return ir.RotaryScaling(type=kind, factor=values["rotary_factor"], original=original, low=values["rotary_low"], high=values["rotary_high"],
                                beta_fast=values["rotary_beta_fast"], beta_slow=values["rotary_beta_slow"],
                                attention_factor=values["rotary_attention_factor"], truncate=values["rotary_truncate"])

    def _head_dim(self, o: Options, w: int, heads: int, head_dim: int | None) -> int | None:
        """head_dim as given, or the width split into the heads (E0207 when they do not divide it)."""
        if head_dim is not None:
            return head_dim
        if w % heads:
            self.out.error("E0207", f"heads={heads} does not divide the width {w}", o.span_of("heads"), _divisor_hint(w, heads) + ", or set head_dim=")
            return None
        return w // heads

    def _leaks(self, o: Options, ctx, mask: str) -> bool:
        if ctx.throat == "causal" and mask == "open":
            self.out.error("E0218", "a bidirectional mixer inside a causal engine would leak the future", o.span_of("mask"), "drop mask=open, or make the engine 'throat open'")
            return True
        return False

    def t_latent_attention(self, o: Options, ctx, w, d):
        heads = o.get("heads")
        latent = o.get("latent")
        q_latent = o.get("q_latent")
        head_dim = o.get("head_dim")
        rotary_dims = o.get("rotary_dims")
        v_dim = o.get("v_dim")
        base = o.get("rotary_base")
        eps = o.get("eps")
        bias = o.get("bias")
        mask = o.get("mask", ctx.throat)
        if None in (heads, latent, base, eps, mask, w) or (q_latent is None and o.has("q_latent")):
            return None
        head_dim = self._head_dim(o, w, heads, head_dim)
        if head_dim is None:
            return None
        rotary_dims = head_dim // 2 // 2 * 2 if rotary_dims is None else rotary_dims
        if rotary_dims < 2 or rotary_dims % 2:
            self.out.error("E0233", f"rotary_dims={rotary_dims}: latent attention's decoupled rotary key needs an even number of dims, at least 2",
                           o.span_of("rotary_dims"), "set rotary_dims= to an even number (DeepSeek-V2: 64 beside head_dim=128)")
            return None
        if self._leaks(o, ctx, mask):
            return None
        return ir.LatentAttention(width=w, heads=heads, head_dim=head_dim, rotary_dims=rotary_dims, v_dim=v_dim or head_dim, latent=latent,
                                  q_latent=q_latent, rotary_base=base, eps=eps, bias=bias, mask=mask, span=d.span)

    def _hidden(self, o: Options, w: int | None):
        ratio_given, hidden_given = o.has("ratio"), o.has("hidden")
        ratio = o.get("ratio")
        hidden = o.get("hidden")
        if ratio_given and hidden_given:
            self.out.error("E0211", "give ratio= or hidden=, not both", o.span_of("hidden"))
            return None
        if w is None:
            return None
        if hidden is not None:
            return hidden
        if hidden_given or ratio_given and ratio is None:
            return None
        r = 4.0 if ratio is None else ratio
        h = r * w
        if not math.isfinite(h) or h > MAX_WIDTH * 64:  # ratio=1e308 overflows to inf
            self.out.error("E0205", f"ratio={r:g} of width {w} gives a hidden width above the limit of {MAX_WIDTH * 64}", o.span_of("ratio"))
            return None
        if abs(h - round(h)) > 1e-6:
            self.out.error("E0209", f"ratio={r:g} of width {w} is {h:g}, not a whole width", o.span_of("ratio"), f"set the hidden width directly, e.g. hidden={int(round(h))}")
            return None
        if round(h) < 1:
            self.out.error("E0205", "the hidden width is below 1", o.span_of("ratio"))
            return None
        return int(round(h))

    def t_mlp(self, o: Options, ctx, w, d):
        hidden = self._hidden(o, w)
        act = o.get("act")
        bias = o.get("bias")
        dropout = o.get("dropout")
        clamp = self._clamp(o, act)
        gate_scale = o.get("gate_scale")
        per_layer = o.get("per_layer")
        if None in (hidden, act, dropout, w, clamp, gate_scale, per_layer):
            return None
        if gate_scale != 1.0 and act not in ir.nodes.GATE_SCALED:  # the node's own rule
            self.out.error("E0211", f"gate_scale scales a gated MLP's gate; act={act} has none", o.span_of("gate_scale"),
                           "use a gated act (swiglu, geglu), or drop gate_scale=")
            return None
        if per_layer and act in ir.nodes.GATED:  # the node's own rule
            self.out.error("E0211", f"a per-layer mlp is gated by its per-layer input: act={act} is gated already", o.span_of("act"), "a plain act (gelu_tanh: Gemma 4's)")
            return None
        return ir.Mlp(width=w, hidden=hidden, act=act, bias=bias, dropout=dropout, clamp=clamp, gate_scale=gate_scale, per_layer=per_layer, span=d.span)

    def _clamp(self, o: Options, act):
        """swiglu_clamp's bound (clamp=), None after an error: it bounds that activation only."""
        clamp = o.get("clamp")
        if o.has("clamp") and act is not None and act != "swiglu_clamp":
            self.out.error("E0211", f"clamp= bounds swiglu_clamp's gate and up, but the activation is {act}", o.span_of("clamp"),
                           "add act=swiglu_clamp, or drop clamp=")
            return None
        return clamp

    def t_moe(self, o: Options, ctx, w, d):
        experts = o.get("experts")
        top = o.get("top", 2 if (experts or 0) >= 2 else 1)
        capacity = o.get("capacity")
        balance = o.get("balance")
        hidden = self._hidden(o, w)
        act = o.get("act")
        bias = o.get("bias")
        normalize = o.get("normalize")
        shared = o.get("shared")
        shared_gate = o.get("shared_gate")
        if None in (experts, top, balance, hidden, act, w, shared):
            return None
        if shared_gate and not shared:
            self.out.error("E0211", "shared_gate gates a shared expert, but there is none", o.span_of("shared_gate"), "add shared=N (its hidden width)")
            return None
        if top > experts:
            self.out.error("E0205", f"top={top} routes to more experts than the {experts} there are", o.span_of("top"))
            return None
        routing = self._routing(o, experts, top, balance)
        clamp = self._clamp(o, act)  # gpt-oss's experts (act=swiglu_clamp) and its biased router (router_bias)
        if routing is None or clamp is None:
            return None
        return ir.Moe(width=w, hidden=hidden, experts=experts, top=top, capacity=capacity, balance=balance, act=act, bias=bias, normalize=normalize, shared=shared,
                      shared_gate=shared_gate, **routing, router_bias=bool(o.get("router_bias")), clamp=clamp, span=d.span)

    def _routing(self, o: Options, experts: int, top: int, balance: float) -> dict | None:
        """The router's DeepSeek-V3 options (scores, groups, scale, correction bias), each checked
        against the others where it is written."""
        router, groups, group_score, scale = o.get("router"), o.get("groups"), o.get("group_score"), o.get("scale")
        correction, rate = o.get("correction"), o.get("correction_rate")
        top_groups = o.get("top_groups", groups)
        if None in (router, groups, top_groups, group_score, scale, rate):
            return None
        bad = None
        if experts % groups:
            bad = ("E0205", "groups", f"{experts} experts do not split into {groups} equal groups", "groups must divide experts")
        elif top_groups > groups:
            bad = ("E0205", "top_groups", f"top_groups={top_groups} keeps more groups than the {groups} there are", None)
        elif top > top_groups * (experts // groups):
            bad = ("E0205", "top", f"top={top} routes to more experts than the {top_groups} kept groups of {experts // groups} hold", None)
        elif group_score == "top2" and groups > 1 and experts // groups < 2:
            bad = ("E0211", "groups", "group_score=top2 sums a group's two best scores, but each group holds one expert", "use group_score=max, or fewer groups")
        elif rate and not correction:
            bad = ("E0211", "correction_rate", "correction_rate updates the correction bias, but there is none", "add correction=true")
        elif router == "sigmoid" and balance:
            bad = ("E0211", "balance", "balance= is the Switch loss over softmax probabilities, and sigmoid scores do not sum to 1",
                   "balance a sigmoid router with correction=true correction_rate=0.001 (auxiliary-loss-free)")
        if bad is not None:
            self.out.error(bad[0], bad[2], o.span_of(bad[1]), bad[3])
            return None
        return {"router": router, "groups": groups, "top_groups": top_groups, "group_score": group_score, "scale": scale,
                "correction": correction, "correction_rate": rate}

    def t_pool(self, o: Options, ctx, w, d):
        size = o.get("size")
        if size is None or w is None:
            return None
        return ir.Pool(width=w, size=size, causal=ctx.throat == "causal", span=d.span)

    def t_conv(self, o: Options, ctx, w, d):
        size = o.get("size")  # a kernel past the context is unwise, not wrong
        bias = o.get("bias")
        if size is None or w is None:
            return None
        return ir.Conv(width=w, size=size, bias=bias, causal=ctx.throat == "causal", span=d.span)

    def t_short_conv(self, o: Options, ctx, w, d):
        size = o.get("size")
        bias = o.get("bias")
        if size is None or w is None:
            return None
        return ir.ShortConv(width=w, size=size, bias=bias, causal=ctx.throat == "causal", span=d.span)

    def _inner_heads(self, o: Options, w, heads, inner_what: str, inner=None):
        """head_dim: given, or the inner width (`inner`, else the chamber's) split into heads (E0230)."""
        head_dim = o.get("head_dim")
        if heads is None or w is None or (head_dim is None and o.has("head_dim")):
            return None
        if head_dim is not None:
            return head_dim
        inner = w if inner is None else inner
        if inner % heads:
            self.out.error("E0230", f"heads={heads} do not divide the {inner_what} {inner}", o.span_of("heads"),
                           _divisor_hint(inner, heads) + ", or set head_dim=")
            return None
        return inner // heads

    def t_ssm(self, o: Options, ctx, w, d):
        if o.get("version") == 1:  # Mamba-1: a kind of its own
            return self.t_mamba1(o, ctx, w, d)
        for name in ("dt_rank", "norms", "norms_affine"):
            if o.has(name):
                o.known.append(name)
                self.out.error("E0280", f"{name}= belongs to Mamba-1's mixer, not Mamba-2's", o.span_of(name),
                               "add version=1 (Jamba's and Mamba's mixer), or drop it")
        heads = o.get("heads")
        state = o.get("state")
        groups = o.get("groups")
        expand_given = o.has("expand")
        expand = o.get("expand")
        conv = o.get("conv")
        chunk = o.get("chunk")
        bias = o.get("bias")
        conv_bias = o.get("conv_bias")
        eps = o.get("eps")
        dt_min = o.get("dt_min")
        dt_max = o.get("dt_max")
        dt_lo = o.get("dt_lo")
        dt_hi = o.get("dt_hi")
        out_norm = o.get("out_norm")
        scales = tuple(o.get(f"{p}_scale") for p in ("z", "x", "b", "c", "dt"))
        if None in (heads, state, groups, expand, conv, chunk, eps, dt_min, dt_max, dt_lo, w, out_norm, *scales):
            return None
        inner = expand * w
        if abs(inner - round(inner)) > 1e-6:
            self.out.error("E0209", f"expand={expand:g} of width {w} is {inner:g}, not a whole width", o.span_of("expand"),
                           "choose an expand that gives a whole inner width, or set head_dim=")
            return None
        if expand_given and o.has("head_dim"):
            self.out.error("E0211", "give expand= or head_dim=, not both (heads x head_dim is the inner width)", o.span_of("head_dim"))
            return None
        head_dim = self._inner_heads(o, w, heads, "inner width (expand x width)", int(round(inner)))
        if head_dim is None:
            return None
        if heads % groups:
            self.out.error("E0231", f"groups={groups} does not divide heads={heads}", o.span_of("groups"),
                           "each group of heads shares one B and one C; pick a divisor of heads")
            return None
        if dt_min > dt_max:
            self.out.error("E0211", f"dt_min={dt_min:g} is above dt_max={dt_max:g}", o.span_of("dt_min"))
            return None
        if dt_hi is not None and dt_hi <= dt_lo:
            self.out.error("E0211", f"dt_hi={dt_hi:g} must be above dt_lo={dt_lo:g}", o.span_of("dt_hi"))
            return None
        return ir.Ssm(width=w, heads=heads, head_dim=head_dim, state=state, groups=groups, conv=conv, chunk=chunk, bias=bias,
                      conv_bias=conv_bias, eps=eps, dt_min=dt_min, dt_max=dt_max, dt_lo=dt_lo, dt_hi=dt_hi, out_norm=out_norm,
                      scales=scales, span=d.span)

    def t_mamba1(self, o: Options, ctx, w, d):
        for name in ("heads", "head_dim", "groups", "dt_lo", "dt_hi", "out_norm", "z_scale", "x_scale", "b_scale", "c_scale", "dt_scale"):  # Mamba-2's: read, so they are refused once, here
            if o.has(name):
                o.known.append(name)
                self.out.error("E0280", f"{name}= belongs to Mamba-2's mixer; version=1 has one state per channel, no heads"
                               + (" and no clamp on the step" if name.startswith("dt_") else ""), o.span_of(name),
                               "drop it, or write version=2")
        state = o.get("state", 16)
        expand = o.get("expand")
        dt_rank = o.get("dt_rank")
        conv = o.get("conv")
        chunk = o.get("chunk", 32)
        bias = o.get("bias")
        conv_bias = o.get("conv_bias")
        norms = o.get("norms")
        norms_affine = o.get("norms_affine")
        eps = o.get("eps", 1e-6)
        dt_min = o.get("dt_min")
        dt_max = o.get("dt_max")
        if None in (state, expand, conv, chunk, eps, dt_min, dt_max, w) or (dt_rank is None and o.has("dt_rank")):
            return None
        inner = expand * w
        if abs(inner - round(inner)) > 1e-6 or round(inner) < 1:
            self.out.error("E0209", f"expand={expand:g} of width {w} is {inner:g}, not a whole width", o.span_of("expand"),
                           "choose an expand that gives a whole inner width")
            return None
        if dt_min > dt_max:
            self.out.error("E0211", f"dt_min={dt_min:g} is above dt_max={dt_max:g}", o.span_of("dt_min"))
            return None
        if norms_affine is False and not norms:
            self.out.error("E0211", "norms_affine=false takes the weight off the dt/B/C norms, which this mixer does not have",
                           o.span_of("norms_affine"), "add norms, or drop norms_affine=")
            return None
        return ir.Mamba1(width=w, inner=int(round(inner)), state=state, dt_rank=dt_rank or math.ceil(w / 16), conv=conv, chunk=chunk,
                         bias=bias, conv_bias=conv_bias, norms=norms, eps=eps, norms_affine=norms_affine is not False, dt_min=dt_min,
                         dt_max=dt_max, span=d.span)

    def t_linear_attention(self, o: Options, ctx, w, d):
        heads = o.get("heads")
        feature = o.get("feature")
        normalize = o.get("normalize")
        decay = o.get("retention")  # `decay` is the startup's word: RetNet's name for the decayed form
        chunk = o.get("chunk")
        bias = o.get("bias")
        head_dim = self._inner_heads(o, w, heads, "width")
        if None in (head_dim, feature, chunk, w):
            return None
        if decay and ctx.throat != "causal":
            self.out.error("E0232", "a decay is defined for causal linear attention only", o.span_of("retention"),
                           "drop retention, or make the engine 'throat causal'")
            return None
        return ir.LinearAttention(width=w, heads=heads, head_dim=head_dim, feature=feature, normalize=normalize, decay=decay,
                                  chunk=chunk, bias=bias, causal=ctx.throat == "causal", span=d.span)

    def t_delta(self, o: Options, ctx, w, d):
        heads = o.get("heads")
        k_heads = o.get("k_heads")
        v_dim = o.get("v_dim")
        conv = o.get("conv")
        chunk = o.get("chunk")
        eps = o.get("eps")
        negative = o.get("negative_eigenvalues")
        head_dim = self._inner_heads(o, w, heads, "width")
        if None in (head_dim, conv, chunk, eps, w) or (v_dim is None and o.has("v_dim")) or (k_heads is None and o.has("k_heads")):
            return None
        if ctx.throat != "causal":
            self.out.error("E0284", "the gated delta rule reads only the past: it has no bidirectional form", d.span,
                           "make the engine 'throat causal', or use attention in an open engine")
            return None
        k_heads = heads if k_heads is None else k_heads
        if heads % k_heads:
            self.out.error("E0285", f"k_heads={k_heads} does not divide heads={heads}", o.span_of("k_heads"),
                           "each group of value heads reads one query/key head; pick a divisor of heads")
            return None
        return ir.GatedDelta(width=w, heads=heads, k_heads=k_heads, head_dim=head_dim, v_dim=v_dim or head_dim, conv=conv,
                             chunk=chunk, eps=eps, negative_eigenvalues=bool(negative), span=d.span)

    def t_linear(self, o: Options, ctx, w, d):
        out = o.get("out", w)
        bias = o.get("bias")
        if out is None or w is None:
            return None
        return ir.Linear(width=w, out=out, bias=bias, span=d.span)


# every turbine keyword has its option reader and its rows in the option table; merges and norms their rows
for _kw in TURBINES:
    ir.kinds.registered(lambda cls: hasattr(_Resolver, f"t_{_kw}"), f"cyclelang/semantics/resolve.py (its reader, _Resolver.t_{_kw})",
                        (ir.kinds.BY_KEYWORD[_kw].cls,))
    ir.kinds.registered(lambda cls: f"turbine {_kw}" in TABLE, f"cyclelang/semantics/options.py TABLE (a row 'turbine {_kw}')",
                        (ir.kinds.BY_KEYWORD[_kw].cls,))
for _kw, _k in ir.kinds.MERGE_BY_KEYWORD.items():
    ir.kinds.registered(lambda cls: f"merge {_kw}" in TABLE, f"cyclelang/semantics/options.py TABLE (a row 'merge {_kw}')", (_k.cls,))


@dataclass
class _EngineCtx:
    throat: str
    vocab: int | None
    context: int | None
    width: int | None
    hyper: "ir.HyperMerge | None" = None  # a chamber of several streams: every branch's junction


class _Chain(Scope):
    """Look in `first`, then `second` (user names shadow the built-ins)."""

    def __init__(self, first: Scope, second: Scope):
        super().__init__({}, None)
        self.first, self.second = first, second

    def lookup(self, name):
        return self.first.lookup(name) or self.second.lookup(name)

    def all_names(self):
        return self.first.all_names() | self.second.all_names()


def _lets(options, scope) -> tuple[tuple[str, str], ...]:
    """(option, let) for the options written as a let's bare name (`ir.Node.let_names`)."""
    return tuple((o.name.name, let) for o in options if (let := let_ref(o.value, scope)) is not None)


def _divisor_hint(w: int, heads: int) -> str:
    divs = [h for h in range(1, min(w, 4 * heads) + 1) if w % h == 0]
    near = sorted(divs, key=lambda h: (abs(h - heads), h))[:2]
    return "heads that divide it: " + " or ".join(str(h) for h in sorted(near))


def _out_width(op, w):
    return None if w is None or op is None else ir.out_width(op, w)
