"""Static fire: one forward and backward pass at initialisation, measured from outside.

Nothing here edits the generated model: forward hooks on the module tree record
the residual stream entering and leaving each stage instance and each branch's
input and output; one `torch.autograd.grad` call then returns the gradient of
the loss with respect to every recorded stream and every parameter. The model
is in eval mode (no dropout, MoE routing dropless, its correction bias held), so a reading is a pure
function of the weights and the tokens.
"""

from __future__ import annotations

import math

import sys
from dataclasses import dataclass

import torch

from .. import ir
from .result import BranchReading, Check, StageReading

DECODE_PREFIX = 4  # tokens fed in one call before decoding one at a time
DECODE_TOKENS = 12  # positions compared in the KV-cache check


@dataclass
class BranchSite:
    stage: str  # the stage instance's path ("stages.3", nested "stages.1.stages.2")
    attr: str  # attribute on the stage module
    br: ir.Prechamber

    @property
    def path(self) -> str:
        return f"{self.stage}.{self.attr}"


@dataclass
class StageSite:
    index: int  # the layer's place in the order the layers run (a nested engine's flattened index)
    name: str
    branches: list[BranchSite]
    path: str  # the instance's module path

    def module(self, model):
        return model.get_submodule(self.path)


def sites(spec: ir.Spec) -> list[StageSite]:
    """Every instance of a stage of ops, in the order they run, and its branches, named by the
    IR's layout (the model's paths; a nested stage's instances are its groups' too)."""
    out = []
    for i, (path, sl) in enumerate(ir.layout.layout(spec).layers()):
        out.append(StageSite(i, sl.stage.name, [BranchSite(path, b.attr, b.branch) for b in sl.branches()], path))
    return out


def _norm(t: torch.Tensor | None) -> float:
    return 0.0 if t is None else float(t.detach().double().norm())


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().double().pow(2).mean().sqrt())


def _merge_factor(stage_mod, site: BranchSite):
    """What the merge multiplies the branch's output by, relative to the main line's x
    (the kinds table says which: a fixed gain, a learned one, or a scaled main line)."""
    g = ir.kinds.gain(site.br.merge)
    value = getattr(getattr(stage_mod, site.attr), g.learned).detach() if g.learned else g.value
    return value / g.main  # alpha*x + f(x) (deepnorm): compare f(x) with alpha*x


def first_of(out):
    """A module's output without the auxiliary losses a stage, branch or MoE returns beside it."""
    return out[0] if isinstance(out, tuple) else out


def branch_hooks(branch, hook) -> list:
    """Put `hook(mod, args, out)` on a branch of the generated model as a whole: its module's
    forward, or, for a branch the stage calls op by op (an nn.ModuleDict: a norm, an op and a
    merge need no class), the first op's input and the last op's output. An output that comes
    with auxiliary losses (an MoE's `(y, balance_loss)`, a branch's `(x, losses)`) is its first
    element. Returns the handles."""
    if not isinstance(branch, torch.nn.ModuleDict):
        return [branch.register_forward_hook(lambda mod, args, out: hook(mod, args, first_of(out)))]
    ops, seen = list(branch.values()), {}

    def first(mod, args):
        seen["args"] = args

    def last(mod, args, out):
        hook(branch, seen.pop("args", args), first_of(out))

    return [ops[0].register_forward_pre_hook(first), ops[-1].register_forward_hook(last)]


class Recorder:
    """Forward hooks that keep the streams a reading needs; remove() takes them all off."""

    def __init__(self, model, stage_sites: list[StageSite]):
        self.handles = []
        self.feed_out = None
        self.stage_in: dict[int, torch.Tensor] = {}
        self.stage_out: dict[int, torch.Tensor] = {}
        self.branch_io: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self.handles.append(model.feed.register_forward_hook(self._feed))
        for s in stage_sites:
            mod = s.module(model)
            self.handles.append(mod.register_forward_pre_hook(self._stage_in(s.index)))
            self.handles.append(mod.register_forward_hook(self._stage_out(s.index)))
            for b in s.branches:
                self.handles += branch_hooks(getattr(mod, b.attr), self._branch(s.index, b.attr))

    def _feed(self, mod, args, out):
        self.feed_out = out

    def _stage_in(self, i):
        def hook(mod, args):
            self.stage_in[i] = args[0]
        return hook

    def _stage_out(self, i):
        def hook(mod, args, out):
            self.stage_out[i] = first_of(out)
        return hook

    def _branch(self, i, attr):
        def hook(mod, args, out):
            self.branch_io[(i, attr)] = (args[0], out)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def recorded_forward(model, stage_sites, idx, targets):
    """One forward pass in eval mode with the streams recorded; the hooks are gone after."""
    model.eval()
    rec = Recorder(model, stage_sites)
    try:
        _, loss = model(idx, targets)
    finally:
        rec.remove()
    return rec, loss


def static_fire(model, spec: ir.Spec, idx: torch.Tensor, targets: torch.Tensor):
    """One forward and backward pass. Returns (loss, feed RMS, stage readings, engine param grads)."""
    stage_sites = sites(spec)
    rec, loss = recorded_forward(model, stage_sites, idx, targets)
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    streams = [rec.stage_in[s.index] for s in stage_sites] + [rec.stage_out[s.index] for s in stage_sites]
    grads = torch.autograd.grad(loss, list(streams) + list(params), allow_unused=True)
    n = len(stage_sites)
    g_in, g_out, g_par = grads[:n], grads[n : 2 * n], dict(zip(names, grads[2 * n :]))

    readings = []
    for k, s in enumerate(stage_sites):
        prefix = f"{s.path}."
        mod = s.module(model)
        pg = {name[len(prefix):]: _norm(g) for name, g in g_par.items() if name.startswith(prefix)}
        branches = []
        for b in s.branches:
            x, y = rec.branch_io[(s.index, b.attr)]
            factor = 1.0 if b.br.overboard else _merge_factor(mod, b)
            bp = [g for name, g in g_par.items() if name.startswith(f"{prefix}{b.attr}.")]
            gn = float(sum(_norm(g) ** 2 for g in bp) ** 0.5)
            branches.append(BranchReading(
                name=b.br.name, path=b.path, merge=None if b.br.merge is None else b.br.merge.kind, detach=b.br.detach,
                overboard=b.br.overboard, intensity=_norm(y * factor) / max(_norm(x), 1e-30), grad_norm=gn))
        readings.append(StageReading(
            depth=k + 1, stage=s.name, path=s.path, pressure=_rms(rec.stage_out[s.index]), grad_in=_norm(g_in[k]),
            grad_out=_norm(g_out[k]), params=pg, branches=branches))
    engine = {name: _norm(g) for name, g in g_par.items() if not name.startswith("stages.")}
    return float(loss.detach()), _rms(rec.feed_out), readings, engine


# --- checks: each holds exactly or fails loudly ---------------------------------------------


def check_detach(model, spec: ir.Spec, idx, targets) -> Check:
    """Open-cycle branches: no gradient from a detached branch reaches the main line, and a
    branch dumped overboard without a loss receives none."""
    stage_sites = sites(spec)
    open_sites = [(s, b) for s in stage_sites for b in s.branches if b.br.detach or (b.br.overboard and b.br.loss is None)]
    if not open_sites:
        return Check(name="detach", status="skip", value=None, detail="no open-cycle branches (detach, or overboard without a loss)")
    rec, loss = recorded_forward(model, stage_sites, idx, targets)
    worst, where = 0.0, []
    gen = torch.Generator().manual_seed(0)
    for s, b in open_sites:
        x_in = rec.stage_in[s.index]
        if b.br.detach:
            _, y = rec.branch_io[(s.index, b.attr)]
            probe = (y * torch.randn(y.shape, generator=gen, dtype=y.dtype)).sum()
            (g,) = torch.autograd.grad(probe, x_in, retain_graph=True, allow_unused=True)
            m = 0.0 if g is None else float(g.abs().max())
            if m != 0.0:
                where.append(f"{b.path} passes {m:.3g} back into its input")
            worst = max(worst, m)
        if b.br.overboard and b.br.loss is None:
            ps = [p for p in getattr(s.module(model), b.attr).parameters() if p.requires_grad]
            if ps:
                gs = torch.autograd.grad(loss, ps, retain_graph=True, allow_unused=True)
                m = max((0.0 if g is None else float(g.abs().max())) for g in gs)
                if m != 0.0:
                    where.append(f"{b.path} is dumped overboard but its weights get gradient {m:.3g}")
                worst = max(worst, m)
    names = ", ".join(sorted({f"{s.name}.{b.br.name}" for s, b in open_sites}))
    if where:
        return Check(name="detach", status="fail", value=worst, detail="; ".join(where))
    return Check(name="detach", status="pass", value=0.0, detail=f"exactly zero gradient through {names}")


_NONFINITE = "the logits are not finite (NaN or infinite) at initialisation: the engine flames out, so the check measures nothing"


def check_causal(model, spec: ir.Spec, idx) -> Check:
    """The throat: logits at positions before t do not depend on the feed at t or later."""
    if spec.engine.throat != "causal":
        return Check(name="causal", status="skip", value=None, detail="open throat: every position sees every other by design")
    T = idx.size(1)
    if T < 2:
        return Check(name="causal", status="skip", value=None, detail="a sequence of one token has no future")
    model.eval()
    t = T // 2
    captured = {}
    h = model.feed.register_forward_hook(lambda m, a, out: captured.setdefault("x", out))
    try:
        logits = model(idx)
    finally:
        h.remove()
    if not bool(torch.isfinite(logits).all()):
        return Check(name="causal", status="fail", value=float("nan"), detail=_NONFINITE)
    gen = torch.Generator().manual_seed(1)
    past = logits[:, :t]
    probe = (past * torch.randn(past.shape, generator=gen, dtype=past.dtype)).sum()
    (g,) = torch.autograd.grad(probe, captured["x"])
    leak = float(g[:, t:].abs().max())
    seen = float(g[:, :t].abs().max())
    if not (math.isfinite(leak) and math.isfinite(seen)):
        return Check(name="causal", status="fail", value=float("nan"), detail="the gradient through the logits is not finite (NaN or infinite): " + _NONFINITE.split(": ", 1)[1])
    if leak != 0.0:
        return Check(name="causal", status="fail", value=leak,
                     detail=f"positions < {t} receive gradient {leak:.3g} from positions >= {t}: the future leaks")
    if seen == 0.0:
        return Check(name="causal", status="fail", value=0.0, detail="the logits depend on no input at all")
    return Check(name="causal", status="pass", value=0.0, detail=f"logits at positions < {t} carry exactly zero gradient to positions >= {t}")


@torch.no_grad()
def check_kv_cache(model, spec: ir.Spec, idx) -> Check:
    """Decoding with the KV cache, a token at a time, gives the logits of one full forward pass."""
    if spec.engine.throat != "causal":
        return Check(name="kv_cache", status="skip", value=None, detail="open throat: a KV cache is not legal")
    Cache = getattr(sys.modules[type(model).__module__], "Cache", None)
    if Cache is None:
        return Check(name="kv_cache", status="skip", value=None, detail="the generated model has no Cache")
    model.eval()
    x = idx[:2, : min(idx.size(1), DECODE_TOKENS)]
    T = x.size(1)
    full = model(x)
    if not bool(torch.isfinite(full).all()):
        return Check(name="kv_cache", status="fail", value=float("nan"), detail=_NONFINITE)
    cache = Cache()
    p = min(DECODE_PREFIX, T)
    parts = [model(x[:, :p], cache=cache)]
    held = cache.nbytes() if hasattr(cache, "nbytes") else None  # every mixer's state: KV buffers, windows, recurrent states
    for i in range(p, T):
        parts.append(model(x[:, i : i + 1], cache=cache))
    dec = torch.cat(parts, dim=1)
    diff = float((dec - full).abs().max())
    tol = 1e-4 * max(1.0, float(full.abs().max()))
    if not diff <= tol:
        return Check(name="kv_cache", status="fail", value=diff,
                     detail=f"cached decoding differs from the full pass by {diff:.3g} (tolerance {tol:.1g})")
    state = "" if held is None else f"; the cache held {held:,} bytes after {p} positions and {cache.nbytes():,} after {T}"
    return Check(name="kv_cache", status="pass", value=diff,
                 detail=f"{T} positions ({p} prefilled, then one at a time) match the full pass within {tol:.1g}{state}")
