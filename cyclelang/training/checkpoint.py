"""Checkpoints: written whole or not at all, verified before use, so the last good one always survives.

    RUN_DIR/checkpoints/step-000100/
        model.safetensors    the full weights (what `cyclec fire --weights RUN_DIR` reads)
        state.safetensors    one process: the optimizer's tensors and the RNG states
        dcp/                 distributed: model and optimizer as torch.distributed.checkpoint
                             shards, loadable at another world size
        state.json           step, scheduler, grad scaler, optimizer's param groups, data
                             order, the flameout watch's window
        manifest.json        every other file's sha256 and size: written last, so a folder
                             without it is incomplete, and one whose files differ is damaged
    RUN_DIR/LATEST           the name of the newest complete checkpoint (`step-000100`)

A checkpoint is written into a temporary folder beside the others, every file flushed
to disk, then renamed into place; only then is LATEST replaced (atomically, never
through a link) and the oldest beyond `KEEP` removed. An error on the way (a full disk)
removes the partial folder and leaves LATEST and what it names untouched. Nothing here
unpickles: the single-process state is safetensors and JSON (DCP's own metadata is
torch's format).

Reading is the other half (`intact`, `latest`, `weights`): LATEST must hold the name of a
checkpoint folder of this run (`step-` and digits: no path, nothing outside
RUN_DIR/checkpoints, no link out of it), and a checkpoint is used only when every file
its manifest lists has the recorded size and sha256 and its state.json has the shape
this module writes. When the one LATEST names is damaged (or LATEST itself is), the
newest intact older one is used and the reason is said; when none is intact there is
nothing to resume from, and the caller refuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path, PurePosixPath

import torch

KEEP = 2  # complete checkpoints kept: the newest and the one before it
MANIFEST = "manifest.json"
REQUIRED = ("model.safetensors", "state.safetensors", "state.json")
NAME = re.compile(r"step-(\d{6,12})")
HASH_BLOCK = 1 << 22


class Damaged(Exception):
    """A checkpoint that cannot be used, with the reason (a file missing, truncated, altered)."""


def name(step: int) -> str:
    return f"step-{step:06d}"


def _sha256(path: Path) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


def _inside(path: Path, root: Path) -> bool:
    try:
        return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == os.path.realpath(root)
    except ValueError:
        return False


def _is_dir(p: Path) -> bool:
    """A real folder: not a link to one (a link could lead out of the run folder)."""
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def read_latest(run_dir) -> tuple[str | None, str | None]:
    """(the checkpoint name LATEST holds, None) or (None, why it holds none usable)."""
    path = Path(run_dir) / "LATEST"
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None, "LATEST is not a file" if not os.path.islink(path) else "LATEST is a link, not a file"
        raw = path.read_bytes()[:256]
    except FileNotFoundError:
        return None, "there is no LATEST"
    except OSError as e:
        return None, f"LATEST cannot be read ({e.strerror or e})"
    text = raw.decode("utf-8", "replace").strip()
    if not NAME.fullmatch(text):
        shown = text[:60] + ("..." if len(text) > 60 else "")
        return None, f"LATEST holds {shown!r}, not the name of a checkpoint in RUN_DIR/checkpoints" if text else "LATEST is empty"
    return text, None


def _manifest(ck: Path) -> dict[str, dict]:
    try:
        m = json.loads((ck / MANIFEST).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise Damaged(f"it has no {MANIFEST} (written partly, or before checkpoints carried digests)") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise Damaged(f"its {MANIFEST} is unreadable ({getattr(e, 'strerror', None) or e})") from None
    files = m.get("files") if isinstance(m, dict) else None
    if not isinstance(files, dict):
        raise Damaged(f"its {MANIFEST} lists no files")
    for rel, entry in files.items():
        p = PurePosixPath(rel)
        if (not rel or "\\" in rel or p.is_absolute() or ".." in p.parts or rel == MANIFEST or not isinstance(entry, dict)
                or not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int) or isinstance(entry.get("bytes"), bool)):
            raise Damaged(f"its {MANIFEST} lists {rel[:80]!r}, not a file of the checkpoint")
        if not _inside(ck / rel, ck):
            raise Damaged(f"{rel} leads out of the checkpoint folder")
    missing = [f for f in REQUIRED if f not in files]
    if missing:
        raise Damaged(f"its {MANIFEST} does not list {', '.join(missing)}")
    return files


def verify(ck: Path, run_dir, *, only: tuple[str, ...] | None = None) -> dict | None:
    """Check one checkpoint folder of `run_dir` against its manifest; returns its state.json
    (checked for shape), or None with `only` (just those files checked). Raises `Damaged`."""
    ck, run = Path(ck), Path(run_dir)
    if not _is_dir(ck) or not _inside(ck, run / "checkpoints"):
        raise Damaged("it is not a folder of RUN_DIR/checkpoints" + (" (a link)" if os.path.islink(ck) else ""))
    files = _manifest(ck)
    for rel in (only if only is not None else sorted(files)):
        entry, path = files[rel], ck / rel
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise Damaged(f"{rel} is not a file")
            digest, size = _sha256(path)
        except FileNotFoundError:
            raise Damaged(f"{rel} is missing") from None
        except OSError as e:
            raise Damaged(f"{rel} cannot be read ({e.strerror or e})") from None
        if size != entry["bytes"]:
            raise Damaged(f"{rel} is {size:,} bytes, not the {entry['bytes']:,} written (truncated or overwritten)")
        if digest != entry["sha256"]:
            raise Damaged(f"{rel} does not match the sha256 {MANIFEST} records (a byte changed since they were written)")
    if only is not None:
        return None
    try:
        state = json.loads((ck / "state.json").read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Damaged(f"state.json is not JSON ({e})") from None
    _check_state(state, int(NAME.fullmatch(ck.name).group(1)) if NAME.fullmatch(ck.name) else None, (ck / "dcp").exists())
    return state


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_state(state, step: int | None, dcp: bool) -> None:
    """state.json has what `load` and the loop read, of the types they read."""
    def bad(what: str):
        raise Damaged(f"state.json {what}")

    if not isinstance(state, dict):
        bad("is not an object")
    if not _whole(state.get("step")) or state["step"] < 1 or (step is not None and state["step"] != step):
        bad(f"names step {state.get('step')!r}, not the folder's {step}")
    checks = {"scheduler": lambda v: isinstance(v, dict), "tokens": _whole, "elapsed": _number,
              "watch": lambda v: isinstance(v, list) and all(_number(x) for x in v),
              "rows": lambda v: _whole(v) and v >= 1, "tp": lambda v: _whole(v) and v >= 1,
              "ep": lambda v: _whole(v) and v >= 1, "pp": lambda v: _whole(v) and v >= 1, "optim_flat": lambda v: isinstance(v, bool), "scaler": lambda v: v is None or isinstance(v, dict),
              "data": lambda v: isinstance(v, dict) and isinstance(v.get("fingerprint"), dict) and _whole(v["fingerprint"].get("tokens"))}
    for key, ok in checks.items():
        if key not in state and key in ("tp", "ep", "pp", "optim_flat", "scaler"):
            continue
        if key not in state or not ok(state[key]):
            bad(f"has no valid {key!r}")
    if not dcp:
        opt = state.get("optimizer")
        if not (isinstance(opt, dict) and isinstance(opt.get("param_groups"), list) and isinstance(opt.get("scalars"), dict)):
            bad("has no valid 'optimizer'")


def folders(run_dir) -> list[Path]:
    """The `step-N` entries of RUN_DIR/checkpoints, newest first (not yet verified)."""
    root = Path(run_dir) / "checkpoints"
    try:
        names = [p.name for p in root.iterdir()] if _is_dir(root) else []
    except OSError:
        names = []
    return [root / n for n in sorted((n for n in names if NAME.fullmatch(n)), key=lambda n: int(n[5:]), reverse=True)]


def intact(run_dir, notes: list[str] | None = None, *, only: tuple[str, ...] | None = None):
    """Yield (checkpoint folder, state.json or None) for each intact checkpoint of `run_dir`,
    the one LATEST names first, then the others newest first. Each that is passed over is
    explained in `notes` (LATEST's own problem too)."""
    run = Path(run_dir)
    notes = notes if notes is not None else []
    current, why = read_latest(run)
    order = folders(run)
    if os.path.lexists(run / "checkpoints") and not _is_dir(run / "checkpoints"):
        notes.append("RUN_DIR/checkpoints is not a folder")
    if current is not None:
        first = run / "checkpoints" / current
        order = [first] + [p for p in order if p.name != current]
        if not (os.path.lexists(first)):
            notes.append(f"LATEST names {current}, which does not exist")
            order = order[1:]
    elif why == "there is no LATEST":
        if order:
            notes.append("there is no LATEST (the run stopped between writing a checkpoint and naming it, or it was removed)")
    else:
        notes.append(f"{why}: ignored")
    for ck in order:
        try:
            state = verify(ck, run, only=only)
        except Damaged as e:
            notes.append(f"checkpoint {ck.name} is damaged: {e}")
            continue
        yield ck, state


def latest(run_dir) -> Path | None:
    """The newest intact checkpoint of a run folder (verified), or None."""
    return next((ck for ck, _ in intact(run_dir)), None)


def weights(run_dir, *, say=None) -> Path | None:
    """The full weights of a run folder's newest intact checkpoint (their digest checked),
    or None; what was passed over and why goes to `say` (stderr by default)."""
    notes: list[str] = []
    found = next((ck for ck, _ in intact(run_dir, notes, only=("model.safetensors",))), None)
    say = say or (lambda line: print(f"cyclec: {line}", file=sys.stderr, flush=True))
    for line in notes:
        say(f"{run_dir}: {line}")
    if found is not None and notes:
        say(f"{run_dir}: using the weights of {found.name}")
    return found / "model.safetensors" if found is not None else None


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def _write_bytes(path: Path, data: bytes) -> None:
    """The one place checkpoint bytes reach the disk (a test fills the disk here)."""
    with open(path, "wb") as f:
        f.write(data)


def remove(path: Path) -> None:
    """Remove a file, a link (not what it points to) or a folder."""
    if os.path.islink(path) or (os.path.lexists(path) and not _is_dir(path)):
        os.unlink(path)
    elif _is_dir(path):
        shutil.rmtree(path)


def replace_file(path: Path, data: bytes) -> None:
    """Write `path` atomically and never through a link: a link planted there is replaced,
    not followed (LATEST, metrics.jsonl and curves.png of a run folder)."""
    path = Path(path)
    if _is_dir(path):
        shutil.rmtree(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


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
    files: dict[str, dict] = {}

    def put(rel: str, data: bytes) -> None:
        _write_bytes(tmp / rel, data)
        files[rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    try:
        failed = None
        if rank0:
            try:
                if os.path.lexists(root) and not _is_dir(root):  # a file (or a link) where the folder belongs
                    remove(root)
                root.mkdir(parents=True, exist_ok=True)
                if os.path.lexists(tmp):
                    remove(tmp)
                tmp.mkdir()
            except OSError as e:
                failed = e
        # No rank writes before rank 0 has made the folder: DCP's writers make theirs inside it, and one
        # ahead would make `tmp` first (rank 0's mkdir then fails, or its clearing deletes their shards)
        # while the others wait in DCP's collectives. Every rank learns whether it was made.
        if dist is not None and dist.any(failed is not None):
            raise failed or OSError(f"rank 0 could not make the checkpoint folder {tmp}")
        if failed is not None:
            raise failed
        if dist is None:
            full = model.state_dict()
            tensors, rest = _optimizer_tensors(optimizer.state_dict())
            state["optimizer"] = rest
            tensors.update(_rng())
            put("state.safetensors", st_save(tensors, metadata={"format": "pt"}))
        else:
            full = dist.save(tmp / "dcp", model, optimizer)  # every rank writes its shards; rank 0 gets the full weights
            rngs = dist.gather_rng(_rng()["rng.cpu"])
            if rank0:
                put("state.safetensors", st_save({f"rng.cpu.{r}": t for r, t in enumerate(rngs)}, metadata={"format": "pt"}))
                for p in sorted((tmp / "dcp").rglob("*")):
                    if p.is_file():
                        digest, size = _sha256(p)
                        files[p.relative_to(tmp).as_posix()] = {"sha256": digest, "bytes": size}
        if rank0:
            put("model.safetensors", st_save({k: v.detach().cpu().contiguous() for k, v in full.items()}, metadata={"format": "pt"}))
            put("state.json", (json.dumps(state, indent=1, sort_keys=True) + "\n").encode("utf-8"))
            _write_bytes(tmp / MANIFEST, (json.dumps({"format": 1, "step": step, "files": files}, indent=1, sort_keys=True) + "\n").encode())
            _fsync_tree(tmp)
            if os.path.lexists(final):  # an earlier attempt at this step that LATEST does not name, or a damaged one
                remove(final)
            os.replace(tmp, final)
            replace_file(run / "LATEST", (name(step) + "\n").encode())
            # kept: this step and the newest before it; a folder of a later step is from the
            # timeline this run left when it resumed from an earlier checkpoint (a damaged one)
            older = [p for p in folders(run) if int(p.name[5:]) < step]
            for p in folders(run):
                if p != final and p not in older[: KEEP - 1]:
                    try:
                        remove(p)
                    except OSError:
                        pass
    except BaseException:
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if dist is not None:
            dist.barrier()
    return final


def load(ck: Path, model, optimizer, scheduler, scaler, dist=None) -> dict:
    """Restore a checkpoint into the model, optimizer, scheduler and scaler; returns state.json.
    A checkpoint whose files verify but do not fit (another model's tensors) raises `Damaged`."""
    try:
        return _load(ck, model, optimizer, scheduler, scaler, dist)
    except (Damaged, KeyboardInterrupt):
        raise
    except Exception as e:  # safetensors' and torch's own errors for tensors that do not fit
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Damaged(f"it cannot be loaded ({type(e).__name__}: {first[:300]})") from None


def _load(ck: Path, model, optimizer, scheduler, scaler, dist=None) -> dict:
    from safetensors.torch import load_file

    state = json.loads((ck / "state.json").read_text("utf-8"))
    tensors = load_file(ck / "state.safetensors")
    if (ck / "dcp").exists():
        from .distributed import dcp_load

        dcp_load(ck / "dcp", model, optimizer, dist, flat=state.get("optim_flat", False))
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
