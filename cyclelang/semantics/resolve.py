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
import os
from dataclasses import dataclass
from pathlib import Path

from .. import ir
from ..diagnostics import CycleError, did_you_mean, fold_template_uses
from ..syntax import ast
from ..syntax.parser import KEYWORD_HOMES
from .options import ACTIVATIONS, MAX_CONTEXT, MAX_EXPERTS, MAX_VOCAB, MAX_WIDTH, TABLE, Options  # noqa: F401 (limits re-exported)
from .includes import MAX_INCLUDE_BYTES, MAX_INCLUDE_DEPTH, MAX_INCLUDE_FILES, _Loader  # noqa: F401 (limits re-exported)
from .readers import NORMS, OpReaders, where  # noqa: F401 (NORMS re-exported)
from .startup import StartupReaders
from .values import Binding, EvalError, Keyword, Scope, evaluate, formula, let_ref, number, whole

MAX_REPEAT = 10_000
TURBINES = tuple(ir.kinds.BY_KEYWORD)  # each read through its rows of options.TABLE; a rules hook, t_<keyword> (readers.py), where it has one
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


# --- resolution -------------------------------------------------------------------------


class _Resolver(StartupReaders, OpReaders):
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
        hook = getattr(self, "t_" + kind, None)  # a kind with cross-option rules; the others are read as declared
        cls = ir.kinds.BY_KEYWORD[kind].cls
        op = hook(o, ctx, w, d) if hook is not None else self.made(cls, o.read(cls, where(ctx, w)), ctx, w, d)
        o.finish()
        return op.model_copy(update=dict(let_names=o.lets())) if op is not None and o.lets() else op


def _unfilled(cls, kw: str) -> list[str]:
    """The fields a kind's node needs that its rows do not fill: a kind without a rules hook is built
    from its rows alone (and its width, and `causal` from the throat)."""
    if hasattr(_Resolver, f"t_{kw}"):
        return []
    named = {r.field or r.name for r in TABLE.get(f"turbine {kw}", ()) if not r.hook}
    return [f for f, info in cls.model_fields.items() if info.is_required() and f not in named and f not in ("width", "causal")]


# every turbine keyword has its rows in the option table, and they fill its node unless a hook does; merges their rows
for _kw in TURBINES:
    ir.kinds.registered(lambda cls: f"turbine {_kw}" in TABLE, f"cyclelang/semantics/options.py TABLE (a row 'turbine {_kw}')",
                        (ir.kinds.BY_KEYWORD[_kw].cls,))
    _cls = ir.kinds.BY_KEYWORD[_kw].cls
    ir.kinds.registered(lambda cls: not _unfilled(cls, _kw), f"cyclelang/semantics/options.py TABLE (a row 'turbine {_kw}' for each field of its "
                        f"node: {', '.join(_unfilled(_cls, _kw))}; or a rules hook, _Resolver.t_{_kw})", (_cls,))
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


def _out_width(op, w):
    return None if w is None or op is None else ir.out_width(op, w)
