"""The launch: a process group from torchrun's environment, the device mesh, and DCP.

`torchrun --nproc-per-node N -m cyclelang train ...` sets RANK, WORLD_SIZE, LOCAL_RANK
and the rendezvous; `Distributed.from_env()` joins it (gloo on CPU, NCCL on GPU).
The mesh is ("dp", "tp") with tp = --tp; data parallelism is FSDP2 with --fsdp and DDP
otherwise. With --ep N the mesh is ("edp", "ep", "tp") with "dp" = "edp" x "ep" flattened
(`expert.py`: the experts split over "ep"); the run sees ("dp", "tp") as before. With --pp N
it is ("pp", "dp", "tp") (`pipeline.py`: the stage instances split over "pp"); with both,
("pp", "edp", "ep", "tp"), the run seeing ("pp", "dp", "tp") (each piece's MoE layers route
among the "ep" ranks of their own pipeline rank).
Checkpoints are torch.distributed.checkpoint folders (sharded, loadable at another
data-parallel world size, --ep and --pp) plus the full weights gathered on rank 0.
"""

from __future__ import annotations

import atexit
import os
import warnings
from dataclasses import dataclass

import torch


def _close(dist) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _pickle_meshes_without_their_hash() -> None:
    """Keep a DeviceMesh's cached `hash()` out of its pickled state (torch 2.13).

    The mesh caches `hash()` of its key in `_hash`. That key holds the dims' names, so the value
    changes with each process's PYTHONHASHSEED, and `__getstate__` kept it. Inductor's FX graph
    cache pickles every input of a graph into its key, and a tensor-parallel region takes the mesh
    as one. Each process therefore computed a key of its own: a `--tp` run missed the cache
    on every start. The moe --ep 2 --fsdp --tp 2 --compile job of tests/test_train_3d.py (4
    processes) took 38 to 39 s on every start; with this, 27 s once the cache has seen it. The
    value means nothing to another process either: `__hash__` recomputes it when it is missing.
    Applied once, before the first mesh is made.
    """
    from torch.distributed.device_mesh import DeviceMesh

    own = DeviceMesh.__getstate__
    if getattr(own, "_without_hash", False):
        return

    def __getstate__(self) -> dict:
        state = own(self)
        state.pop("_hash", None)
        return state

    __getstate__._without_hash = True
    DeviceMesh.__getstate__ = __getstate__


@dataclass
class Distributed:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    mesh: object = None  # DeviceMesh ("dp", "tp"); ("pp", "dp", "tp") when pp > 1
    tp: int = 1
    ep: int = 1
    ep_mesh: object = None  # --ep: DeviceMesh ([pp,] "edp", "ep", "tp"), "dp" flattened (mesh: [pp x] "dp" x "tp", or "dp")
    experts: object = None  # --ep: the model's expert.ExpertParallel, once applied
    pp: int = 1  # --pp: pipeline ranks (the mesh's outer dim "pp")

    @classmethod
    def from_env(cls, tp: int = 1, ep: int = 1, pp: int = 1) -> "Distributed | None":
        """The run's process group when launched by torchrun (WORLD_SIZE > 1), else None."""
        _pickle_meshes_without_their_hash()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1 and tp <= 1 and pp <= 1:
            return None
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        local = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
            # Left to the interpreter's teardown, gloo's threads can outlive the group and abort the
            # process ("terminate called without an active exception") after a good run.
            atexit.register(_close, dist)
        if world % tp:
            raise ValueError(f"--tp {tp} does not divide the world size {world}")
        device = torch.device("cuda", local) if cuda else torch.device("cpu")
        if ep > 1:  # expert parallelism (expert.py): ([pp,] "edp", "ep", "tp"), "dp" = "edp" x "ep"
            if world % (pp * ep * tp):
                raise ValueError(f"--pp {pp} x --ep {ep} x --tp {tp} does not divide the world size {world}")
            outer = [("pp", pp)] if pp > 1 else []  # each pipeline rank's MoE layers route among its own "ep" group
            dims = outer + [("edp", world // (pp * ep * tp)), ("ep", ep), ("tp", tp)]
            ep_mesh = init_device_mesh(device.type, tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
            dp_mesh = ep_mesh["edp", "ep"]._flatten("dp")
            with warnings.catch_warnings():  # ("dp", "tp") with "dp" flattened: torch warns it may change how
                warnings.simplefilter("ignore", UserWarning)  # such a slice is taken, not that it is wrong
                mesh = ep_mesh["pp", "dp", "tp"] if pp > 1 else ep_mesh["dp", "tp"] if tp > 1 else dp_mesh
            return cls(dist.get_rank(), world, local, device, mesh, tp, ep, ep_mesh, pp=pp)
        if world % (tp * pp):
            raise ValueError(f"--tp {tp} x --pp {pp} does not divide the world size {world}")
        dims = ([("pp", pp)] if pp > 1 else []) + [("dp", world // (tp * pp)), ("tp", tp)]  # outermost first
        mesh = init_device_mesh(device.type, tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
        return cls(dist.get_rank(), world, local, device, mesh, tp, pp=pp)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def dp_rank(self) -> int:
        return self.mesh["dp"].get_local_rank()

    def barrier(self) -> None:
        torch.distributed.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The data-parallel mean of a scalar (every TP rank holds the same one)."""
        t = value.detach().clone().reshape(1).to(torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM, group=self.mesh["dp"].get_group())
        return t[0] / self.dp

    def any(self, flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0])
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t[0])

    def broadcast_object(self, obj):
        """Rank 0's `obj` (picklable, small: a checkpoint's name and state.json) on every rank."""
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def gather_rng(self, state: torch.Tensor) -> list[torch.Tensor]:
        out = [None] * self.world
        torch.distributed.all_gather_object(out, state)
        return out

    def save(self, path, model, optimizer) -> dict:
        """Write the model's and optimizer's shards with DCP; return the full weights (rank 0:
        every tensor; the other ranks: an empty dict), in the generated file's own layout."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

        # the optimizer's state flattened per parameter (state.json's "optim_flat"): a rank that holds some
        # experts only (--ep), or some pipeline pieces (--pp), writes their entries, and the checkpoint
        # reloads at another --ep or --pp
        msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=self.pp == 1))
        if self.experts is not None:  # every rank's experts, on rank 0
            full.update(self.experts.full_experts(model))
        if self.pp > 1:  # every pipeline rank's pieces, on rank 0
            from .pipeline import gather_full

            full = gather_full(full, self)
        return unshard_layout(full, getattr(model, "tp_layout", {})) if self.rank == 0 else {}


def unshard_layout(state: dict, layout: dict) -> dict:
    """Full weights with the fused rows TP regrouped put back in the file's order."""
    from ..backends.torch.runtime.parallel import unshard_rows

    return {k: unshard_rows(v, *layout[k]) if k in layout else v for k, v in state.items()}


def dcp_load(path, model, optimizer, dist: Distributed | None, flat: bool = False) -> None:
    """Load a DCP checkpoint into a model (sharded or not) and its optimizer, resharding as needed.
    flat: the optimizer's state was saved flattened per parameter (state.json's "optim_flat")."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    msd, osd = get_state_dict(model, optimizer, options=options)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
