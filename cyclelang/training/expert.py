"""Expert parallelism (`cyclec train --ep N`): each MoE layer's experts spread over N ranks.

The mesh (`Distributed.from_env(ep=N)`) is ("edp", "ep", "tp"), with "edp" x "ep"
flattened to "dp": every data-parallel rank still takes its own rows of the batch (the
attention, the router, the shared expert and everything else are data-parallel as before:
DDP, or FSDP2 with --fsdp, and tensor-parallel over "tp" with --tp), and a MoE layer's E
experts are split into N contiguous blocks, rank k of the "ep" dim keeping experts
k*E/N .. (k+1)*E/N - 1 (each split over "tp" by the file's TP plan, as any MoE's). Each
"ep" group (the N ranks of one "edp" and "tp" index) routes its tokens with all-to-all, as
torchtitan's ExpertParallel style does for its grouped experts:

    route     every rank chooses its tokens' experts with the router it holds whole
              (runtime/experts.py's `expert_choice`: softmax or sigmoid, groups, bias, scale)
    dispatch  the assignments, sorted by expert, go to the experts' ranks
              (`all_to_all_single_autograd`: its backward sends the gradients back)
    experts   each local expert's MLP on the rows it received, from every rank in turn
    combine   the outputs come back the same way and each token adds its experts'
              weighted outputs up, in expert order, as one process does

Routing statistics are the global batch's, so a run equals one process on the whole
batch: the capacity queue (first choices before second, then token by token across the
ranks in data order) and the load-balancing loss's fraction routed to each expert count
every data-parallel rank's assignments (an integer all-gather), and each rank's share of
the loss is balance * E * sum(routed * its probabilities' sum / all tokens) * ranks, whose
mean over the ranks (what the run logs and differentiates) is one process's loss. Eval is
dropless as before. DeepSeek-V3's correction bias moves by the load summed over every rank
(the generated `trim`), so it too stays one process's.

An expert's gradient sums the contributions of every rank whose tokens it took; its copies
on the other "edp" indices are summed with it and the total divided by the data-parallel
size (FSDP2 over "edp" under --fsdp; an all-reduce over "edp" otherwise, the experts left
out of DDP). The gradient norm adds the "ep" group's experts.
Checkpoints: each rank's experts keep their names (`...experts.5.fc.weight`), DCP writes
them from the ranks that hold them (the optimizer state flattened per parameter) and a
checkpoint loads at another layout, one process included; the full weights gather every
expert on rank 0.
With --pp (pipeline.py) the mesh is ("pp", "edp", "ep", "tp"): each pipeline rank's pieces
route over its own "ep" group with its own data-parallel ranks' statistics, per microbatch.
With --compile dynamo traces the dispatch inside the stage's compiled region, whole:
torch.distributed's collectives become functional ones and the token counts data-dependent
sizes. An expert that is an FSDP2 unit of its own would break that graph (FSDP2's hooks are
not traced), so with --fsdp and --compile the experts stay whole, out of FSDP2's units, and
their gradients are summed over "edp" as without --fsdp (`sharded` False); the rest is
FSDP2-sharded as before.
"""

from __future__ import annotations

import functools
import inspect
import math
import types

import torch
from torch import nn

from ..diagnostics import CycleError, Diagnostic


def _bad(code: str, message: str, help: str | None = None) -> CycleError:
    return CycleError([Diagnostic(code, "error", message, None, help)])


def moe_parts(spec) -> list:
    """The spec's MoE parts (ir.layout's Part), in source order."""
    from .. import ir
    from ..ir.layout import layout

    return [p for p in layout(spec).parts() if isinstance(p.node, ir.Moe)]


def check(spec, ep: int, settings=None) -> None:
    """Refuse --ep N where the spec has no MoE, a MoE's experts do not split over N ranks, the
    processes do not, or the run asks for what expert parallelism does not compose with yet."""
    import os

    if ep < 1:
        raise _bad("E0507", f"--ep must be at least 1, not {ep}")
    if ep == 1:
        return
    s = settings
    if s is not None and s.compile and s.tp > 1 and s.checkpointing != "none":
        raise _bad("E0507", f"--ep {ep} with --compile, --tp {s.tp} and --checkpointing {s.checkpointing} is not supported yet: "
                   "torch 2.13's compiled backward of the recomputed stage fails on the tensor-parallel experts' parameters "
                   "(AOT autograd: \"expected all tensors_saved_with_vc_check to be Tensors\")",
                   "drop one of --compile, --tp and --checkpointing")
    parts = moe_parts(spec)
    if not parts:
        raise _bad("E0512", f"--ep {ep}: {spec.engine.name} has no MoE layer (turbine moe) whose experts could be spread over ranks",
                   "expert parallelism splits experts; for a dense model use --fsdp or --tp")
    why = [f"{p.path}: {p.node.experts} experts do not split over {ep} ranks" for p in parts if p.node.experts % ep]
    why += [f"{p.path}: gpt-oss's clamped SwiGLU experts have no routed op to dispatch from" for p in parts if p.node.act == "swiglu_clamp"]
    if why:
        raise _bad("E0512", f"expert parallelism --ep {ep} cannot split this model: {why[0]}", "\n".join(why[1:]) or
                   "use an --ep that divides every MoE's experts")
    trimmed = [p.path for p in parts if p.node.correction_rate > 0]
    if s is not None and s.checkpointing != "none" and trimmed:
        raise _bad("E0507", f"--ep {ep} with --checkpointing {s.checkpointing}: {trimmed[0]} moves its correction bias in every "
                   "training forward (correction_rate), so the recomputed forward would route with another bias",
                   "drop --checkpointing")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp, pp = (s.tp, s.pp) if s is not None else (1, 1)
    if world < pp * ep * tp or world % (pp * ep * tp):
        what = (f"--pp {pp} x " if pp > 1 else "") + f"--ep {ep}" + (f" x --tp {tp}" if tp > 1 else "")
        raise _bad("E0513", f"{what} needs a number of processes that it divides, not {world}",
                   f"launch with torchrun --nproc-per-node {pp * ep * tp} (or a multiple) -m cyclelang train ...")


class LocalExperts(nn.ModuleDict):
    """A MoE layer's experts on one rank: only its own, under their global numbers (so the
    parameters keep the names one process gives them), indexed and iterated as the list."""

    def __getitem__(self, i):
        return list(self._modules.values())[i] if isinstance(i, int) else super().__getitem__(i)

    def __iter__(self):
        return iter(self._modules.values())


class ExpertParallel:
    """The experts of a model spread over the "ep" dim of `mesh` (see the module's docstring)."""

    def __init__(self, model: nn.Module, mesh, dp_mesh, fsdp: bool, compile: bool = False):
        self.mesh = mesh  # ("edp", "ep"); dp_mesh: the two flattened
        self.ep, self.edp = mesh["ep"].size(), mesh["edp"].size()
        self.dp = self.ep * self.edp
        self.ep_rank = mesh["ep"].get_local_rank()
        self.ep_group, self.edp_group, self.dp_group = (mesh["ep"].get_group(), mesh["edp"].get_group(), dp_mesh.get_group())
        # each expert an FSDP2 unit over "edp" (--fsdp); under --compile it stays whole (a unit's hooks break the graph)
        self.sharded = fsdp and not compile
        self.layers: list[tuple[str, nn.Module, int]] = []  # (path, MoE module, experts in all)
        for path, m in model.named_modules():
            if isinstance(getattr(m, "experts", None), nn.ModuleList) and hasattr(m, "router") and hasattr(m, "compiled_experts"):
                self.layers.append((path, m, len(m.experts)))
        if not self.layers:
            raise _bad("E0512", "expert parallelism found no MoE layer with a routed op in the built model",
                       "the model must be built from the fast source (codegen(spec, fast=True, parallel=True)), as `cyclec train` builds it")
        for path, m, E in self.layers:
            extra = [n for n in inspect.signature(m.forward).parameters if n != "x"]
            if extra:
                raise _bad("E0512", f"{path}: a MoE whose forward takes {', '.join(extra)} besides x is not dispatched yet")
            per = E // self.ep
            mine = range(self.ep_rank * per, (self.ep_rank + 1) * per)
            m.experts = LocalExperts({str(e): m.experts[e] for e in mine})
            m.forward = types.MethodType(_forward, m)
            # compiled_experts, with every routed op of the file replaced by this layer's dispatch
            f = type(m).compiled_experts
            names = {k: functools.partial(_dispatch, self, m, E) for k in f.__code__.co_names if k.startswith("routed_")}
            # without "__name__", torch.compile guards these globals themselves, not the file's module's
            scope = {k: v for k, v in {**f.__globals__, **names}.items() if k != "__name__"}
            m.compiled_experts = types.MethodType(types.FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__), m)
        self._collect()
        if not fsdp:  # DDP leaves them to `sync_grads` (FSDP2 too, where `sharded` is False: they are set aside, `around`)
            names = [n for n, p in model.named_parameters() if id(p) in self.params]
            nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)

    def around(self, parallelize):
        """The generated file's `parallelize` with the experts' own sharding inside, in torchtitan's
        order: tensor parallelism (each local expert's MLP split like any MoE's), then FSDP2 of
        each expert over "edp" (a unit of its own: its forward gathers it), then the file's
        checkpointing, compile and FSDP2 of the rest over "dp"."""

        def run(model, mesh, *, fsdp, tp, checkpointing="none", compile=False):
            if tp:
                parallelize(model, mesh, fsdp=False, tp=True)
                self.tp_layout(model)
            if fsdp and self.sharded:
                self.shard(model)
            aside = [(m, m.experts) for _, m, _ in self.layers] if fsdp and not self.sharded else []
            for m, _ in aside:  # out of the stages' FSDP2 units: each rank's own experts, whole
                m.experts = nn.ModuleDict()
            try:
                return parallelize(model, mesh, fsdp=fsdp, tp=False, checkpointing=checkpointing, compile=compile)
            finally:
                for m, experts in aside:
                    m.experts = experts

        return run

    def _collect(self) -> None:
        self.params = {id(p): p for _, m, _ in self.layers for p in m.experts.parameters()}

    def shard(self, root: nn.Module) -> None:
        """FSDP2 of each expert of the MoE layers inside `root` over "edp" (a unit of its own: its
        forward gathers it), before `root` itself is sharded over "dp"."""
        from torch.distributed.fsdp import fully_shard

        inside = {id(m) for m in root.modules()}
        for _, m, _ in self.layers:
            if id(m) in inside:
                for ex in m.experts:
                    fully_shard(ex, mesh=self.mesh["edp"])
        self._collect()

    def keep(self, model: nn.Module) -> None:
        """Only the MoE layers of `model` (a pipeline rank's pieces, --pp): the others run on other
        pipeline ranks, whose "ep" groups gather, reduce and measure them."""
        inside = {id(m) for m in model.modules()}
        self.layers = [layer for layer in self.layers if id(layer[1]) in inside]
        self._collect()

    def tp_layout(self, model) -> None:
        """The TP plan numbered this rank's experts 0, 1, ... in `model.tp_layout` (the fused rows
        it regrouped); every expert of a layer has the same layout: record it under each global
        name, so the gathered full weights (every expert's, on rank 0) are put back in order.
        The plan made new (DTensor) parameters: they are the experts' from here on."""
        layout = getattr(model, "tp_layout", {})
        for path, _, E in self.layers:
            head = f"{path}.experts."
            local = {k: layout.pop(k) for k in [k for k in layout if k.startswith(head)]}
            for k, v in local.items():
                tail = k[len(head):].split(".", 1)[1]
                for e in range(E):
                    layout[f"{head}{e}.{tail}"] = v
        self._collect()

    # --- the training loop's hooks ------------------------------------------------------

    def sync_grads(self) -> None:
        """Each expert's gradient summed over its copies ("edp") and divided by the data-parallel
        size, once per optimizer step (after the last micro-step's backward). FSDP2 has reduced
        it over "edp" already, divided by that size: what is left is 1 / ep (its divide factor
        would do it in the reduction, but gloo has no PREMUL_SUM)."""
        for p in self.params.values():
            if p.grad is not None:
                if not self.sharded and self.edp > 1:
                    torch.distributed.all_reduce(p.grad, group=self.edp_group)
                p.grad.div_(self.ep if self.sharded else self.dp)

    def grad_norm(self, params, norm_of) -> torch.Tensor:
        """The global gradient norm: `norm_of` (the loop's) over the rest, plus every expert's
        over the "ep" group (each rank's own experts: their norm over "edp" is whole already)."""
        rest = [p for p in params if id(p) not in self.params]
        mine = [p for p in params if id(p) in self.params]
        device = mine[0].grad.device if mine and mine[0].grad is not None else torch.device("cpu")
        sq = (norm_of(mine) ** 2).reshape(1).to(device)  # on the group's device (NCCL takes no CPU tensor)
        torch.distributed.all_reduce(sq, group=self.ep_group)
        return (norm_of(rest) ** 2 + sq.cpu()[0]).sqrt()

    def full_experts(self, model) -> dict[str, torch.Tensor]:
        """Every expert's weights, gathered over the "ep" group (rank 0 keeps them), under the
        names of the file's own layout. Called on every rank: it all-gathers."""
        out: dict[str, torch.Tensor] = {}
        prefix = {id(m): path for path, m, _ in self.layers}
        for path, m, E in self.layers:
            per = E // self.ep
            local = list(m.experts)
            for name, _ in local[0].named_parameters():
                mine = []
                for ex in local:
                    p = ex.get_parameter(name)
                    mine.append((p.full_tensor() if hasattr(p, "full_tensor") else p).detach())
                stacked = torch.stack(mine)
                parts = [torch.empty_like(stacked) for _ in range(self.ep)]
                torch.distributed.all_gather(parts, stacked.contiguous(), group=self.ep_group)
                for k, t in enumerate(parts):
                    for j in range(per):
                        out[f"{prefix[id(m)]}.experts.{k * per + j}.{name}"] = t[j].cpu().clone()
        return out


def _forward(self, x):
    """A MoE layer under expert parallelism: the router, the dispatch (compiled_experts with
    the routed op replaced), the shared expert and its gate where the layer has them."""
    B, T, C = x.size()
    x = x.reshape(B * T, C)
    y, balance_loss = self.compiled_experts(x, self.router(x))
    if hasattr(self, "shared"):
        shared = self.shared(x)
        if hasattr(self, "shared_gate"):
            shared = torch.sigmoid(self.shared_gate(x)) * shared
        y = y + shared
    y = y.view(B, T, C)
    return (y, balance_loss) if hasattr(self, "balance") else y


def _ints(t: torch.Tensor) -> list[int]:
    """A 1-D tensor's entries as Python ints. `t.tolist()` traces, under --compile, to a method call
    on a node that is not a tensor, and AOT autograd's cache refuses such a graph: every start
    traced the forward and backward again. Unbinding first gives a graph the cache accepts."""
    return [v.item() for v in t.unbind()]


def _dispatch(plan: ExpertParallel, moe, E, x, logits, weights, bias, top, limit, normalize, balance, *, router="softmax",
              groups=1, top_groups=1, group_score="top2", scale=1.0, correction=False, eps=1e-20):
    """routed_experts' contract (runtime/experts.py) across the "ep" group: returns a tuple
    whose [0] is y (N, C), [1] the balance loss (this rank's share) and [7] the choice (N, k)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    from ..backends.torch.runtime.experts import expert_choice

    N = logits.size(0)
    p = torch.promote_types(logits.dtype, torch.float32)
    # as the routed op scores
    probs = torch.sigmoid(logits.to(p)) if router == "sigmoid" else torch.softmax(logits, dim=-1, dtype=p)
    weight, choice = expert_choice(probs, top, normalize, router, groups, top_groups, group_score, scale,
                                   weights[-1] if correction else None, eps)
    onehot = (choice.t().reshape(top, N, 1) == torch.arange(E, device=x.device)).long()  # (k, N, E), first choices first
    # every data-parallel rank's assignments per (choice, expert), and its token count
    mine = torch.cat([onehot.sum(dim=1).reshape(-1), torch.tensor([N], device=x.device)])
    every = [torch.empty_like(mine) for _ in range(plan.dp)]
    torch.distributed.all_gather(every, mine, group=plan.dp_group)
    every = torch.stack(every)  # (ranks, k * E + 1)
    total = int(every[:, -1].sum())  # tokens of the global batch
    slots = every[:, :-1].view(plan.dp, top, E)
    routed = slots.sum(dim=(0, 1)).float() / (top * total)  # (E,): as onehot.float().mean(0) over the global batch
    loss = balance * E * torch.sum(routed * probs.sum(dim=0) / total) * plan.dp if balance else probs.new_zeros(())
    kept = choice
    if limit >= 0:  # training with a capacity (the generated file's formula, moe.py), over the global batch
        limit = min(math.ceil(moe.capacity * total * top / E), total)
        me = torch.distributed.get_rank(plan.dp_group)
        # an assignment's place in its expert's queue: the earlier choices of every rank, this
        # choice of the ranks before this one, then this rank's tokens up to it
        before = torch.cumsum(slots.sum(dim=0), dim=0) - slots.sum(dim=0) + slots[:me].sum(dim=0)  # (k, E)
        place = ((torch.cumsum(onehot, dim=1) + before[:, None, :]) * onehot).sum(dim=-1)  # (k, N)
        kept = torch.where((place <= limit).t(), choice, -1)
    flat = kept.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat + 1, minlength=E + 1)
    order = order[int(counts[0]):]
    token = order // top
    per = E // plan.ep
    send = counts[1:].view(plan.ep, per)  # (ranks, their experts): what this rank sends each
    recv = torch.empty_like(send)
    torch.distributed.all_to_all_single(recv, send, group=plan.ep_group)  # (ranks, my experts): what each sends me
    send_rows, recv_rows = _ints(send.sum(dim=1)), _ints(recv.sum(dim=1))
    got = all_to_all_single_autograd(x[token], recv_rows, send_rows, plan.ep_group)  # rank by rank, expert by expert
    # regroup by expert: the blocks (rank r, expert j) in the order (j, r), each block's rows kept in order
    sizes = recv.reshape(-1)  # rank by rank
    first = torch.cumsum(sizes, dim=0) - sizes  # where each block starts in `got`
    blocks = (torch.arange(per, device=x.device)[:, None] + torch.arange(plan.ep, device=x.device)[None, :] * per).reshape(-1)
    lens = sizes[blocks]
    perm = torch.repeat_interleave(first[blocks] - (torch.cumsum(lens, dim=0) - lens), lens) + torch.arange(got.size(0), device=x.device)
    rows = got[perm].split(_ints(recv.sum(dim=0)))
    out = torch.cat([expert(xe) for expert, xe in zip(moe.experts, rows)])
    back = out[torch.argsort(perm)]  # rank by rank again
    e = all_to_all_single_autograd(back, send_rows, recv_rows, plan.ep_group)  # (A, C): this rank's assignments, by expert
    ew = e * weight.reshape(-1)[order, None]
    y = ew.new_zeros(x.shape).index_add_(0, token, ew)
    return (y, loss) + (None,) * 5 + (choice, weight)
