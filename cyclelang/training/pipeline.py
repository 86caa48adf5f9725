"""Pipeline parallelism for `cyclec train --pp N`, with torch.distributed.pipelining.

The split comes from the IR (`review.split`: stage instances in the order they run, balanced
by the kinds table's FLOPs; the feed with the first piece, the nozzle and the loss with the
last). Every rank builds the whole model from the seed (so the weights equal one process's),
applies tensor parallelism to it, then keeps its pieces: a piece is a *view* of the model,
a copy of its skeleton (groups, lists, rotary tables) that shares the modules of the units it
owns and holds a `Skip` (the stream through, with no auxiliary losses) in place of every
other unit, and a `Carry` in place of the feed after the first piece. A view runs the
generated `Model.forward` itself, so nested stages, rotary tables and the loss stay the
model's own code; the piece's output is the stream after its last unit (a forward hook
catches it), beside a running sum of the auxiliary losses (MoE balance, overboard heads'
weighted next-token losses) carried to the last piece's loss. A tied nozzle's embedding
(`feed.tok.weight`) lives on the first and the last pipeline rank: the other pieces' views
read an empty `Stub` for it (no logits), the two copies' gradients are summed by an
all-reduce between those two ranks, and the last rank's copy is left out of the norm.

Schedules: GPipe, 1F1B and interleaved 1F1B (`VIRTUAL` pieces per rank, piece i on rank
i mod N). A step's microbatches are its gradient-accumulation micro-steps (`--microbatches
M` makes M of them), so a pipelined step computes what one process computes with
`--batch-tokens` M micro-steps: the same rows per forward (the MoE's capacity and balance
loss see the same tokens), losses divided by M before their backward. Evaluation runs each
held-out batch as one microbatch. Parameters keep their names (`stages.5.mix.attn.qkv.weight`),
so DCP checkpoints load at another pipeline degree, one process included.

With --ep (expert.py) the experts are placed first, on the whole model: a piece's MoE layers
dispatch over the "ep" group of its pipeline rank, whose data-parallel ranks run the same
microbatch at the same point of every schedule; `keep` leaves the rank's own layers to the
experts' bookkeeping; with --tp too, the tensor parallelism of the whole model splits each local
expert over "tp" as any MoE's (`ExpertParallel.tp_layout` records its regrouped rows under every
expert's name). The schedule's shape inference (one forward per piece on its first
step) and a correction bias's trim are kept apart (`trims`).
"""

from __future__ import annotations

import copy
import functools
import inspect
import types

import torch
from torch import nn

from .. import ir
from ..diagnostics import CycleError, Diagnostic
from ..review import split as splitting

SCHEDULES = ("gpipe", "1f1b", "interleaved")
VIRTUAL = 2  # pieces per rank with the interleaved schedule


def _bad(message: str, help: str | None = None, code: str = "E0512") -> CycleError:
    return CycleError([Diagnostic(code, "error", message, None, help)])


class Skip(nn.Module):
    """A unit another piece runs: the stream passes through (with no auxiliary losses when the
    unit returns them)."""

    def __init__(self, aux: bool):
        super().__init__()
        self.aux = aux

    def forward(self, x, *args, **kwargs):
        return (x, {}) if self.aux else x


class Carry(nn.Module):
    """The feed of a later piece: the stream the previous piece sent. With a tied nozzle it holds
    the token embedding as `tok` (the last piece: the real one; others: `Stub`)."""

    def __init__(self, tok: nn.Module | None = None):
        super().__init__()
        self.x = None
        if tok is not None:
            self.tok = tok

    def forward(self, *args, **kwargs):
        return self.x


class Front(nn.Module):
    """The feed of a first piece that is not the last, with a tied nozzle: the real feed runs, and
    the head the model's forward still computes reads `Stub`'s empty embedding (no logits)."""

    def __init__(self, feed: nn.Module, tok: nn.Module):
        super().__init__()
        self.inner, self.tok = feed, tok

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


class Stub(nn.Module):
    """An embedding of no tokens: a tied head that another piece computes costs nothing here."""

    def __init__(self, like: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", like.new_empty(0, like.size(1)), persistent=False)


class Holder(nn.Module):
    """The last rank's `feed` with a tied nozzle: the token embedding alone, under its own name."""

    def __init__(self, tok: nn.Module):
        super().__init__()
        self.tok = tok


def pieces_of(engine, pp: int, schedule: str) -> list[splitting.Piece]:
    n = pp * (VIRTUAL if schedule == "interleaved" else 1)
    try:
        return splitting.split(engine, n)
    except splitting.SplitError as e:
        raise _bad(f"--pp {pp}" + (f" with {VIRTUAL} virtual pieces per rank" if n != pp else "") + f": {e}",
                   "lower --pp" + (", or use --pp-schedule 1f1b (one piece per rank)" if n != pp else "")) from None


def check(engine, s, world: int) -> None:
    """Refuse, by name, what the pipeline cannot run (before any process group is made)."""
    if s.pp_schedule not in SCHEDULES:
        raise _bad(f"--pp-schedule must be one of {', '.join(SCHEDULES)}, not {s.pp_schedule}", code="E0507")
    if s.pp < 1:
        raise _bad(f"--pp must be at least 1, not {s.pp}", code="E0507")
    if s.microbatches is not None and s.microbatches < 1:
        raise _bad(f"--microbatches must be at least 1, not {s.microbatches}", code="E0507")
    if s.pp == 1:
        return
    ep = getattr(s, "ep", 1)
    what = f"--pp {s.pp}" + (f" x --ep {ep}" if ep > 1 else "") + (f" x --tp {s.tp}" if s.tp > 1 else "")
    if world < s.pp * ep * s.tp:
        raise _bad(f"{what} needs {s.pp * ep * s.tp} processes or more",
                   f"launch with torchrun --nproc-per-node {s.pp * ep * s.tp} -m cyclelang train ...", code="E0513")
    if world % (s.pp * ep * s.tp):
        raise _bad(f"{what} does not divide the {world} processes",
                   "launch a multiple of pp x " + ("ep x " if ep > 1 else "") + "tp processes", code="E0513")
    if ir.chamber_streams(engine.body) is not None:
        raise _bad(f"--pp {s.pp}: {engine.name} carries several residual streams (hyper-connections) between stages; "
                   "a piece sends one stream", "train it without --pp")
    if s.compile:
        raise _bad(f"--pp {s.pp} with --compile: the pieces run the model's own forward with other pieces' units "
                   "skipped, which torch.compile would trace per piece; not supported yet", "drop --compile")
    if s.dtype == "fp16":
        raise _bad(f"--pp {s.pp} with --dtype fp16: the GradScaler's loss scale and its overflow check would have to "
                   "agree over the pipeline's ranks; not supported yet", "use --dtype bf16 (no loss scaling) or fp32")
    pieces_of(engine, s.pp, s.pp_schedule)
    m = s.microbatches
    if m is not None and s.pp_schedule in ("1f1b", "interleaved") and m < s.pp:
        raise _bad(f"--microbatches {m} is fewer than the {s.pp} pipeline ranks the {s.pp_schedule} schedule fills",
                   f"use --microbatches {s.pp} or more, or --pp-schedule gpipe", code="E0507")
    dp = world // (s.pp * s.tp)  # with --ep, its ranks are data-parallel ranks too
    if dp > 1 and not s.fsdp:
        raise _bad(f"--pp {s.pp} on {world} processes leaves {dp} data-parallel replicas: add --fsdp to shard them", code="E0507")


class PieceModule(nn.Module):
    """One pipeline piece: its own units registered (its parameters and nothing else) and
    the view that runs them."""

    def __init__(self, piece: splitting.Piece, view: nn.Module, owned: dict[str, nn.Module], carry: Carry | None, flags):
        super().__init__()
        self.flags = flags  # the pipeline's: `inferring` while the schedule infers shapes (`forward`)
        self.unprobed = {True, False}  # the modes (training, eval) whose schedule has not inferred its shapes yet
        self.index = piece.index
        self.first, self.last = piece.feed, piece.nozzle
        self.units = nn.ModuleList(list(owned.values()))
        object.__setattr__(self, "view", view)  # not registered: its other modules are skips
        self.carry = carry
        self.out = None
        self.sent: list[torch.Tensor] = []
        view.get_submodule(piece.units[-1].path).register_forward_hook(self._catch)  # the stream after its last unit

    def _catch(self, mod, args, output):
        self.out = output[0] if isinstance(output, tuple) else output

    def forward(self, *inputs, idx, targets):
        # each schedule (training, eval) infers the shapes it sends by running each piece once, on
        # its first step, on empty tensors past the first piece: that forward must not move state
        # (a correction bias's trim, `trims`), and it runs on zeros, not on uninitialised memory,
        # so that a MoE's tensor-parallel ranks route its tokens alike (--ep with --tp: the
        # experts' row-wise all-reduce takes as many rows on each)
        mode = self.view.training
        inferring = mode in self.unprobed
        self.unprobed.discard(mode)
        self.flags.inferring = inferring and mode
        try:
            return self._forward(*inputs, idx=idx, targets=targets, inferring=inferring)
        finally:
            self.flags.inferring = False

    def _forward(self, *inputs, idx, targets, inferring=False):
        view = self.view
        acc = None
        if not self.first:
            x, acc = inputs
            if inferring:  # zeros still of the inputs (the schedule infers their gradients' shapes too), out of place
                x, acc = (t.masked_fill(t.new_ones((), dtype=torch.bool), 0) for t in (x, acc))  # (FSDP2's inputs are views)
            self.carry.x = x
        if self.last:
            _, loss = view(idx, targets)
            return loss.reshape(1) + (acc if acc is not None else 0)
        view(idx)
        total = acc if acc is not None else self.out.new_zeros(1, dtype=torch.float32)
        for value in view.aux_losses.values():
            total = total + value.reshape(1)
        for name, weight in getattr(view, "overboard", {}).items():
            if weight is not None:
                head = view.exhaust[name]
                loss = view.loss_fn(head, targets)
                total = total + weight * loss.reshape(1)
        self.sent.append(total)  # held until the step ends: a send in flight reads it (gloo)
        return self.out, total


class _Param(nn.Module):
    """A parameter of the model itself (a tied head's bias) registered with the piece that uses it."""

    def __init__(self, p: nn.Parameter):
        super().__init__()
        self.p = p


class Pipeline:
    """This rank's pieces of `model` and the schedules that run them (see the module's docstring)."""

    def __init__(self, spec, model: nn.Module, module, dist, s, accum: int):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        e = spec.engine
        self.dist, self.accum = dist, accum
        self.flags = types.SimpleNamespace(inferring=False)
        pieces = pieces_of(e, dist.pp, s.pp_schedule)
        self.pieces = pieces
        pp_mesh = dist.mesh["pp"]
        rank = pp_mesh.get_local_rank()
        self.group = pp_mesh.get_group()
        mine = [p for p in pieces if p.index % dist.pp == rank]
        # which units return (x, auxiliary losses): asked of the model itself, once, on one token
        arity: dict[str, bool] = {}
        paths = [u.path for p in pieces for u in p.units]
        hooks = []
        for path in paths:
            def hook(mod, args, out, path=path):
                arity[path] = isinstance(out, tuple)
            hooks.append(model.get_submodule(path).register_forward_hook(hook))
        was = model.training
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, 1, dtype=torch.long, device=dist.device))
        model.train(was)
        for h in hooks:
            h.remove()
        # tensor parallelism (and activation checkpointing) on the whole model, before the split
        if dist.tp > 1 or s.checkpointing != "none":
            try:
                module.parallelize(model, dist.mesh["dp", "tp"] if dist.tp > 1 else None, fsdp=False, tp=dist.tp > 1,
                                   checkpointing=s.checkpointing, compile=False)
            except ValueError as err:
                raise _bad(str(err).splitlines()[0], "\n".join(str(err).splitlines()[1:]) or None) from None
            if dist.tp > 1 and dist.experts is not None:  # --ep with --tp: each local expert split over "tp", as `around` does
                dist.experts.tp_layout(model)
        overboard = getattr(model, "overboard", {})
        tied = e.nozzle.tied  # feed.tok.weight is also the head: the first and the last piece each hold it
        bias = getattr(model, ir.layout.TIED_BIAS, None) if tied else None

        def view_of(keep: list[splitting.Piece], run: bool = True):
            kept = {u.path for p in keep for u in p.units}
            memo: dict[int, object] = {}
            carry = None
            for path in paths:
                if path not in kept:
                    memo[id(model.get_submodule(path))] = Skip(arity.get(path, False))
                else:
                    memo[id(model.get_submodule(path))] = model.get_submodule(path)
            feed, head = any(p.feed for p in keep), any(p.nozzle for p in keep)
            if tied:
                tok = model.feed.tok if head else Stub(model.feed.tok.weight)
                if not run:  # the state: the real modules under their names
                    memo[id(model.feed)] = model.feed if feed else Holder(model.feed.tok) if head else Carry()
                elif feed and not head:
                    memo[id(model.feed)] = Front(model.feed, tok)
                elif not feed:
                    carry = memo[id(model.feed)] = Carry(tok)
                else:
                    memo[id(model.feed)] = model.feed
                if bias is not None:
                    memo[id(bias)] = bias
            elif not feed:
                carry = Carry()
                memo[id(model.feed)] = carry
            else:
                memo[id(model.feed)] = model.feed
            if not tied:
                memo[id(model.head)] = model.head if head else Skip(False)
            view = copy.deepcopy(model, memo)
            if bias is not None and not head:  # the tied head's bias: the last piece's
                del view._parameters[ir.layout.TIED_BIAS]
                setattr(view, ir.layout.TIED_BIAS, bias.new_empty(0) if run else None)
            if overboard:
                view.overboard = {n: w for n, w in overboard.items() if any(n == k or n.startswith(k + ".") for k in kept)}
            return view, carry

        # the rank's state: every unit of its pieces under its own name (checkpoints, the optimizer)
        self.model, _ = view_of(mine, run=False)
        self.stages, self.views = [], []
        for p in mine:
            view, carry = view_of([p])
            owned = {u.path: view.get_submodule(u.path) for u in p.units}
            if p.feed:
                owned = {"feed": view.feed, **owned}
            if p.nozzle and not tied:
                owned["head"] = view.head
            elif p.nozzle:
                if not p.feed:
                    owned["feed.tok"] = model.feed.tok
                if bias is not None:
                    owned["bias"] = _Param(bias)
            piece = PieceModule(p, view, owned, carry, self.flags)
            if s.fsdp:
                from torch.distributed.fsdp import fully_shard

                for name, unit in owned.items():
                    if name not in ("feed.tok", "bias"):  # read, not called, by the tied head: the piece's root gathers them
                        if dist.experts is not None:  # --ep: its experts first, each over "edp"
                            dist.experts.shard(unit)
                        fully_shard(unit, mesh=dist.mesh["dp"])
                fully_shard(piece, mesh=dist.mesh["dp"])
            self.views.append(view)
            self.stages.append((piece, PipelineStage(piece, p.index, len(pieces), dist.device, group=self.group),
                                PipelineStage(piece, p.index, len(pieces), dist.device, group=self.group)))
        self.last = any(p.nozzle for p in mine)
        self.first = any(p.feed for p in mine)
        if dist.experts is not None:  # --ep: this rank's MoE layers only (gathered, reduced and measured over its "ep" group)
            dist.experts.keep(self.model)
        trims(self.model, dist.mesh["dp"].get_group(), self.flags)
        # a tied embedding: its two copies (first and last pipeline rank) get the sum of their
        # gradients; the last rank's is left out of the gradient norm (counted on the first)
        self.tied, self.tied_group, self.twice = [], None, []
        last_rank = (len(pieces) - 1) % dist.pp
        if tied and last_rank != 0:
            grid = dist.mesh.mesh.reshape(dist.pp, -1)
            for col in range(grid.size(1)):  # every process makes every group, in the same order
                g = torch.distributed.new_group([int(grid[0, col]), int(grid[last_rank, col])])
                if dist.rank in (int(grid[0, col]), int(grid[last_rank, col])):
                    self.tied_group = g
            if self.first or self.last:
                self.tied = [model.feed.tok.weight]
            if self.last and not self.first:
                self.twice = [model.feed.tok.weight]
        self.seen: list[torch.Tensor] = []

        def loss_fn(out, target):
            self.seen.append(out.detach().sum())
            return out.sum() / accum

        def eval_loss(out, target):
            return out.sum()

        train_stages = [st for _, st, _ in self.stages]
        eval_stages = [st for _, _, st in self.stages]
        try:
            if s.pp_schedule == "interleaved":
                self.schedule = ScheduleInterleaved1F1B(train_stages, n_microbatches=accum, loss_fn=loss_fn, scale_grads=False)
                self.eval_schedule = ScheduleInterleaved1F1B(eval_stages, n_microbatches=1, loss_fn=eval_loss, scale_grads=False)
            else:
                kind = ScheduleGPipe if s.pp_schedule == "gpipe" else Schedule1F1B
                self.schedule = kind(train_stages[0], n_microbatches=accum, loss_fn=loss_fn, scale_grads=False)
                self.eval_schedule = ScheduleGPipe(eval_stages[0], n_microbatches=1, loss_fn=eval_loss, scale_grads=False)
        except ValueError as err:
            raise _bad(f"--pp-schedule {s.pp_schedule}: {err}", "use more --microbatches, or --pp-schedule gpipe",
                       code="E0507") from None

    def _sum_over_pieces(self, value: torch.Tensor) -> torch.Tensor:
        t = value.detach().reshape(1).to(torch.float64).cpu().clone()
        if t.device != self.dist.device and self.dist.device.type == "cuda":
            t = t.to(self.dist.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM, group=self.group)
        return t[0].cpu()

    def _mode(self, training: bool) -> None:
        for v in self.views:
            v.train(training)

    def step(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step's forward and backward over its micro-steps; the sum of their losses
        (float64, on every rank)."""
        self._mode(True)
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        self.seen.clear()
        for piece, _, _ in self.stages:
            piece.sent.clear()
        args = (x,) if self.first else ()
        self.schedule.step(*args, target=y if self.last else None, idx=x, targets=y)
        # the last `accum`: on its first step the schedule also infers shapes with a loss of no batch
        total = torch.stack(self.seen[-self.accum:]).double().sum() if self.seen else torch.zeros((), dtype=torch.float64)
        for p in self.tied:
            g = p.grad._local_tensor if hasattr(p.grad, "_local_tensor") else p.grad
            torch.distributed.all_reduce(g, group=self.tied_group)
        return self._sum_over_pieces(total)

    def eval(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of one held-out batch (run as one microbatch), on every rank."""
        self._mode(False)
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        with torch.no_grad():
            self.eval_schedule.eval(*args, target=y if self.last else None, losses=losses, idx=x, targets=y)
        self._mode(True)
        total = losses[0].double() if losses else torch.zeros((), dtype=torch.float64)
        return self._sum_over_pieces(total)

    def grad_norm(self, params) -> torch.Tensor:
        """The global gradient norm of the pipeline's parameters (this rank's, summed in squares
        over the pipeline; a tied embedding once)."""
        from .grads import grad_norm

        params = [p for p in params if not any(p is q for q in self.twice)]
        experts = self.dist.experts  # --ep: each rank's experts summed over its "ep" group first
        norm = grad_norm(params) if experts is None else experts.grad_norm(params, grad_norm)
        return self._sum_over_pieces(norm.double() ** 2).sqrt()


class _Torch:
    """torch, as a generated function sees it, with `distributed.all_reduce` over one group."""

    def __init__(self, group):
        self.distributed = types.SimpleNamespace(is_available=torch.distributed.is_available, is_initialized=torch.distributed.is_initialized,
                                                 all_reduce=functools.partial(torch.distributed.all_reduce, group=group))

    def __getattr__(self, name):
        return getattr(torch, name)


def trims(model: nn.Module, group, flags) -> None:
    """Each MoE of `model` whose correction bias moves (DeepSeek-V3's trim, `correction_rate`): the
    generated `trim` with its load summed over `group` (the pipeline rank's data-parallel ranks,
    which run the same MoE layers on other rows; the generated one sums over every process, which
    here run other layers) and left out of the schedule's shape inference (`flags.inferring`)."""
    for m in model.modules():
        f = getattr(type(m), "trim", None)
        if f is None or not getattr(m, "correction_rate", 0):
            continue
        body = inspect.unwrap(f)  # under its torch.no_grad()
        grouped = types.FunctionType(body.__code__, {**body.__globals__, "torch": _Torch(group)}, body.__name__, body.__defaults__,
                                     body.__closure__)

        def trim(self, choice, grouped=grouped):
            if not flags.inferring:
                with torch.no_grad():
                    grouped(self, choice)

        m.trim = types.MethodType(trim, m)


def gather_full(full: dict, dist) -> dict:
    """Rank 0: the full weights of every piece (each pipeline rank's own, gathered); else {}."""
    rank = dist.mesh["pp"].get_local_rank()
    others = [dist.mesh[n].get_local_rank() for n in dist.mesh.mesh_dim_names if n != "pp"]
    if any(others):
        return {}
    box = [None] * dist.pp
    torch.distributed.gather_object({k: v.detach().cpu() for k, v in full.items()}, box if rank == 0 else None, dst=0,
                                    group=dist.mesh["pp"].get_group())
    if dist.rank != 0:
        return {}
    out: dict = {}
    for part in box:
        out.update(part)
    return out
