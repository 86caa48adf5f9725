"""The resolver's readers of an engine's ends: the feed, the nozzle and the startup block
(schedule, init, parametrisation). `resolve._Resolver` inherits them.
"""

from __future__ import annotations


from .. import ir
from ..diagnostics import did_you_mean
from ..syntax import ast
from .options import Options
from .values import MAX_INT, EvalError, Scope, number, whole


class StartupReaders:
    """feed, nozzle, startup: mixed into `resolve._Resolver` (self.out, self.value, ...)."""

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
