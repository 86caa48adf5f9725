"""Checkpoints: written whole or not at all, so the last good one always survives.

    RUN_DIR/checkpoints/step-000100/
        model.safetensors    the full weights (what `cyclec fire --weights RUN_DIR` reads)
        state.safetensors    one process: the optimizer's tensors and the RNG states
        dcp/                 distributed: model and optimizer as torch.distributed.checkpoint
                             shards, loadable at another world size
        state.json           step, scheduler, grad scaler, optimizer's param groups, data
                             order, the flameout watch's window
    RUN_DIR/LATEST           the name of the newest complete checkpoint

A checkpoint is written into a temporary folder beside the others, every file flushed
to disk, then renamed into place; only then is LATEST replaced (atomically) and the
oldest beyond `KEEP` removed. An error on the way (a full disk) removes the partial
folder and leaves LATEST and what it names untouched. Nothing here unpickles: the
single-process state is safetensors and JSON (DCP's own metadata is torch's format).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..io import atomic_write

KEEP = 2  # complete checkpoints kept: the newest and the one before it


def name(step: int) -> str:
    return f"step-{step:06d}"


def latest(run_dir) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    run = Path(run_dir)
    try:
        current = (run / "LATEST").read_text("utf-8").strip()
    except FileNotFoundError:
        return None
    path = run / "checkpoints" / current
    return path if (path / "state.json").exists() else None


def weights(run_dir) -> Path | None:
    """The full weights of a run folder's newest checkpoint."""
    ck = latest(run_dir)
    return ck / "model.safetensors" if ck is not None else None


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def _write_bytes(path: Path, data: bytes) -> None:
    """The one place checkpoint bytes reach the disk (a test fills the disk here)."""
    with open(path, "wb") as f:
        f.write(data)


def _optimizer_tensors(osd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, rest = {}, {}
    for idx, st in osd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                rest.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": osd["param_groups"], "scalars": rest}


def _rng() -> dict[str, torch.Tensor]:
    out = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["rng.cuda"] = torch.cuda.get_rng_state()
    return out


def save(run_dir, step: int, model, optimizer, scheduler, scaler, meta: dict, dist=None) -> Path:
    """Write the checkpoint of `step`; returns its folder. `dist`: the run's `Distributed` (or None)."""
    from safetensors.torch import save as st_save

    run = Path(run_dir)
    root = run / "checkpoints"
    final, tmp = root / name(step), root / f".{name(step)}.tmp"
    rank0 = dist is None or dist.rank == 0
    state = {"step": step, "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict() if scaler is not None else None, **meta}
    try:
        if rank0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        if dist is None:
            full = model.state_dict()
            tensors, rest = _optimizer_tensors(optimizer.state_dict())
            state["optimizer"] = rest
            tensors.update(_rng())
            _write_bytes(tmp / "state.safetensors", st_save(tensors, metadata={"format": "pt"}))
        else:
            full = dist.save(tmp / "dcp", model, optimizer)  # every rank writes its shards; rank 0 gets the full weights
            rngs = dist.gather_rng(_rng()["rng.cpu"])
            if rank0:
                _write_bytes(tmp / "state.safetensors", st_save({f"rng.cpu.{r}": t for r, t in enumerate(rngs)}, metadata={"format": "pt"}))
        if rank0:
            _write_bytes(tmp / "model.safetensors", st_save({k: v.detach().cpu().contiguous() for k, v in full.items()}, metadata={"format": "pt"}))
            _write_bytes(tmp / "state.json", (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8"))
            _fsync_tree(tmp)
            if final.exists():  # an earlier attempt at this step that LATEST does not name
                shutil.rmtree(final)
            os.replace(tmp, final)
            atomic_write(run / "LATEST", name(step) + "\n")
            keep = sorted(p for p in root.iterdir() if p.name.startswith("step-"))[-KEEP:]
            for p in root.iterdir():
                if p.name.startswith("step-") and p not in keep and p != final:
                    shutil.rmtree(p, ignore_errors=True)
    except BaseException:
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if dist is not None:
            dist.barrier()
    return final


def load(ck: Path, model, optimizer, scheduler, scaler, dist=None) -> dict:
    """Restore a checkpoint into the model, optimizer, scheduler and scaler; returns state.json."""
    from safetensors.torch import load_file

    state = json.loads((ck / "state.json").read_text("utf-8"))
    tensors = load_file(ck / "state.safetensors")
    if (ck / "dcp").exists():
        from .distributed import dcp_load

        dcp_load(ck / "dcp", model, optimizer, dist)
        rank = dist.rank if dist is not None else 0
        if f"rng.cpu.{rank}" in tensors:
            torch.set_rng_state(tensors[f"rng.cpu.{rank}"])
    else:
        if dist is not None:
            raise ValueError("a single-process checkpoint resumes in one process")
        model.load_state_dict(load_file(ck / "model.safetensors"), strict=True)
        osd = {"state": {}, "param_groups": state["optimizer"]["param_groups"]}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, idx, k = key.split(".", 2)
                osd["state"].setdefault(int(idx), {})[k] = value
        for idx, rest in state["optimizer"]["scalars"].items():
            osd["state"].setdefault(int(idx), {}).update(rest)
        optimizer.load_state_dict(osd)
        torch.set_rng_state(tensors["rng.cpu"])
        if "rng.cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng.cuda"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    return state
