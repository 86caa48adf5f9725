"""μP's coordinate check, with no set-up, and the LR-transfer sweep. Imports torch.

The stand's shrink already knows every width-like dimension, so nothing is marked by
hand: each width is `shrink(spec, width=w)`, built with one seed and trained a few steps
on the same seeded batches. A coordinate's size is the mean absolute value of an
activation, recorded from outside the model (hooks; the attention scores through a
stand-in for `F.scaled_dot_product_attention` in the generated module), per step and
per layer type: the feed's output, each branch's output (by its folded layout path),
each attention's scores (q.k^T times the kernel's scale) and the nozzle's logits.
Under the standard parametrisation the logits and scores grow with width once training
moves the weights (Adam's updates are width-independent per coordinate, so a sum over
d of them grows like d); under μP every size stays flat. The fitted exponent is the
slope of log(size) against log(width).
"""

from __future__ import annotations

import math
import sys
from typing import Callable

import torch

from .. import ir
from .measure import branch_hooks
from .result import CoordCheck, CoordLayer, LrSweep, Sweep, SweepRun
from .shrink import shrink
from .train import hot_fire

COORD_FLAG = 0.25  # an exponent above this is flagged (measured at widths 32-128 after 5 steps: SP's logits 0.7, μP's within 0.1)


def fit_exponent(widths: list[int], sizes: list[float]) -> float:
    """Least-squares slope of log(size) against log(width); nan if a size is not positive."""
    if any(not (s > 0 and math.isfinite(s)) for s in sizes):
        return math.nan
    xs, ys = [math.log(w) for w in widths], [math.log(s) for s in sizes]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def param_label(spec: ir.Spec) -> str:
    p = spec.engine.startup.param
    return "standard" if p.kind == "standard" else f"mup (base width {p.base_width})"


def with_param(spec: ir.Spec, kind: str, base_width: int | None = None) -> ir.Spec:
    """The spec under another parametrisation (the LR sweep compares both)."""
    e = spec.engine
    param = ir.Param(kind=kind, base_width=base_width if kind == "mup" else None)
    startup = e.startup.model_copy(update=dict(param=param))
    return ir.validate(spec.model_copy(update=dict(engine=e.model_copy(update=dict(startup=startup)))))


class _Scores:
    """Stands in for torch.nn.functional in a generated module: records mean |q k^T * scale|
    of every attention call under the attention part whose forward is running."""

    def __init__(self, real):
        self.real, self.current, self.sizes = real, None, {}

    def __getattr__(self, name):
        return getattr(self.real, name)

    def scaled_dot_product_attention(self, q, k, v, *args, **kwargs):
        if self.current is not None:
            with torch.no_grad():
                kk = k
                if kk.size(1) != q.size(1):  # grouped-query: each kv head serves a group of query heads
                    kk = kk.repeat_interleave(q.size(1) // kk.size(1), dim=1)
                scale = kwargs.get("scale") or 1.0 / math.sqrt(q.size(-1))
                s = (q.double() @ kk.double().transpose(-1, -2)) * scale
                self.sizes.setdefault(self.current, []).append(float(s.abs().mean()))
        return self.real.scaled_dot_product_attention(q, k, v, *args, **kwargs)


def _coords(model, spec: ir.Spec):
    """Install the recorders on one model; returns (sizes dict filled on each forward, remove)."""
    lay = ir.layout.layout(spec)
    sizes: dict[tuple[str, str], list[float]] = {}
    handles = []

    def put(key, t):
        if torch.is_tensor(t):
            sizes.setdefault(key, []).append(float(t.detach().double().abs().mean()))

    handles.append(model.feed.register_forward_hook(lambda m, a, out: put(("feed", "feed"), out)))
    gen_mod = sys.modules[type(model).__module__]
    scores = _Scores(gen_mod.F)
    for sl in lay.stages:
        for b in sl.branches():
            folded = f"{sl.path}.{b.attr}"
            for inst in sl.instances():
                mod = getattr(model.get_submodule(inst), b.attr)
                if not b.branch.overboard:
                    handles += branch_hooks(mod, lambda m, a, out, _k=(folded, "branch"): put(_k, out))
                for part in b.ops:
                    if isinstance(part.node, ir.Attention):
                        local = part.local.split(".", 1)[1]
                        am = mod.get_submodule(local)
                        name = part.path

                        def pre(m, a, _n=name):
                            scores.current = _n

                        def post(m, a, out):
                            scores.current = None

                        handles += [am.register_forward_pre_hook(pre), am.register_forward_hook(post)]
    for part in lay.main:  # engine-level attention (a pressure-fed turbine) is rare, but named the same way
        if isinstance(part, ir.layout.Part) and isinstance(part.node, ir.Attention):
            am = model.get_submodule(part.path)
            handles.append(am.register_forward_pre_hook(lambda m, a, _n=part.path: setattr(scores, "current", _n)))
            handles.append(am.register_forward_hook(lambda m, a, out: setattr(scores, "current", None)))
    gen_mod.F = scores

    def remove():
        gen_mod.F = scores.real
        for h in handles:
            h.remove()

    return sizes, scores, remove


def _fixed_lr(optimizer, lr: float | None) -> None:
    """Every group at its full rate (the schedule's peak times μP's multiplier), or at `lr` times
    the multiplier: no warmup, no decay."""
    for g in optimizer.param_groups:
        base = g.get("initial_lr", g["lr"])
        g["lr"] = base if lr is None else lr * g.get("lr_mult", 1.0)


def coord_check(spec: ir.Spec, *, file: str, widths: list[int], steps: int = 5, lr: float | None = None, depth: int | None = None,
                seq: int | None = None, batch: int = 8, seed: int = 0,
                progress: Callable[[str, int, int, float], None] | None = None) -> CoordCheck:
    """The coordinate check of `spec` at `widths` (see the module's docstring)."""
    from ..backends.torch.build import build
    from .run import DEFAULT_SEQ, _bad, propellant

    if len(widths) < 2:
        raise _bad("--coord-check needs at least two --widths to fit an exponent")
    if steps < 1:
        raise _bad(f"--steps must be at least 1, not {steps}")
    widths = sorted(set(widths))
    per_width = []
    losses = []
    for k, w in enumerate(widths):
        small = shrink(spec, width=w, depth=depth)
        e = small.engine
        T = min(DEFAULT_SEQ, e.feed.context) if seq is None else seq
        src, objective, _, _ = propellant(small, None, T, seed)
        model = build(small, seed=seed, fast=True)
        sizes, scores, remove = _coords(model, small)
        logits_sizes = []
        gen, mask_gen = torch.Generator().manual_seed(20_000 + seed), torch.Generator().manual_seed(40_000 + seed)
        step_losses = []
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(30_000 + seed)
                optimizer, _ = model.configure_optimizer()
                _fixed_lr(optimizer, lr)
                model.train()
                for step in range(steps):
                    idx, targets = objective.inputs(src.batch(batch, T, gen), mask_gen)
                    logits, loss = model(idx, targets)
                    logits_sizes.append(float(logits.detach().double().abs().mean()))
                    step_losses.append(float(loss.detach()))
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    model.clip_gradients()
                    optimizer.step()
                    if progress is not None:
                        progress(f"{e.name} width {w}", step + 1, steps, step_losses[-1])
        finally:
            remove()
            model.eval()
        rows = {key: _per_step(vals, steps) for key, vals in sizes.items()}
        rows.update({(f"{n} logits", "attention logits"): _per_step(v, steps) for n, v in scores.sizes.items()})
        rows[("logits", "logits")] = logits_sizes
        per_width.append(rows)
        losses.append(step_losses)
    layers = []
    for key in per_width[0]:
        if not all(key in r for r in per_width):
            continue
        name, what = key
        size = [[per_width[k][key][t] for k in range(len(widths))] for t in range(steps)]
        exps = [fit_exponent(widths, s) for s in size]
        last = exps[-1]
        flag = "grows" if math.isfinite(last) and last > COORD_FLAG else None
        layers.append(CoordLayer(name=name, what=what, size=size, exponent=exps, flag=flag))
    first = shrink(spec, width=widths[0], depth=depth).engine
    return CoordCheck(name=spec.engine.name, file=file, param=param_label(spec), widths=widths, steps=steps,
                      lr=lr if lr is not None else spec.engine.startup.schedule.lr, seed=seed, batch=batch,
                      seq=min(DEFAULT_SEQ, first.feed.context) if seq is None else seq, flag_at=COORD_FLAG,
                      loss=[[losses[k][t] for k in range(len(widths))] for t in range(steps)], layers=layers)


def _per_step(values: list[float], steps: int) -> list[float]:
    """One number per step: a layer type recorded several times per forward pass (every
    instance of a repeated stage) is averaged over them."""
    n = len(values) // steps
    return [sum(values[t * n:(t + 1) * n]) / n for t in range(steps)]


def with_lr(spec: ir.Spec, lr: float) -> ir.Spec:
    """The spec at a constant learning rate `lr`, no warmup (its betas, clip, decay and init kept):
    a sweep of a few hundred steps would otherwise measure a spec's 2000-step warmup."""
    e = spec.engine
    sch = ir.Schedule(kind="constant", lr=lr, min_lr=0.0, steps=None)
    startup = e.startup.model_copy(update=dict(schedule=sch, warmup=0))
    return ir.validate(spec.model_copy(update=dict(engine=e.model_copy(update=dict(startup=startup)))))


def lr_sweep(spec: ir.Spec, *, file: str, widths: list[int], lrs: list[float], steps: int = 200, depth: int | None = None,
             seq: int | None = None, batch: int = 8, seed: int = 0, base_width: int | None = None,
             progress: Callable[[str, int, int, float], None] | None = None) -> LrSweep:
    """Train every width at every learning rate (constant, no warmup; the rest of the start sequence kept),
    under the standard parametrisation and under μP (base width: the spec's own if it is μP,
    else `base_width`, else the smallest width); the best lr per width is the lowest final loss."""
    from ..backends.torch.build import build
    from .run import DEFAULT_SEQ, _bad, propellant

    if not widths or not lrs:
        raise _bad("--lr-sweep needs --widths and --lrs")
    if any(not (lr > 0 and math.isfinite(lr)) for lr in lrs):
        raise _bad("every --lrs value must be a positive number")
    widths, lrs = sorted(set(widths)), sorted(set(lrs))
    p = spec.engine.startup.param
    base = p.base_width if p.kind == "mup" else (base_width or widths[0])
    sweeps = []
    source_name = ""
    for kind in ("standard", "mup"):
        variant = with_param(spec, kind, base)
        runs = []
        for w in widths:
            for lr in lrs:
                small = shrink(with_lr(variant, lr), width=w, depth=depth)
                e = small.engine
                T = min(DEFAULT_SEQ, e.feed.context) if seq is None else seq
                src, objective, floor, unigram = propellant(small, None, T, seed)
                source_name = src.name
                model = build(small, seed=seed, fast=True)
                cb = None if progress is None else (lambda step, n, v, _n=f"{kind} width {w} lr {lr:g}": progress(_n, step, n, v))
                t = hot_fire(model, small, src, steps, batch, T, seed, floor, unigram, objective, progress=cb)
                if t.interrupted:
                    raise KeyboardInterrupt
                runs.append(SweepRun(width=w, lr=lr, final_loss=None if t.flameout else t.final_loss,
                                     flameout_step=None if t.flameout is None else t.flameout.step + 1))
        best = {}
        for w in widths:
            ok = [r for r in runs if r.width == w and r.final_loss is not None]
            best[w] = min(ok, key=lambda r: r.final_loss).lr if ok else None
        sweeps.append(Sweep(param=param_label(variant), runs=runs, best=best))
    first = shrink(spec, width=widths[0], depth=depth).engine
    return LrSweep(name=spec.engine.name, file=file, widths=widths, lrs=lrs, steps=steps, seed=seed, batch=batch,
                   seq=min(DEFAULT_SEQ, first.feed.context) if seq is None else seq, source=source_name, sweeps=sweeps)
