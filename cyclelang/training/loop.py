"""The training run: the spec's startup block, real data, checkpoints, resume, many processes.

`run(spec, settings, spec_text=...)` trains the engine and returns a `Result`. The run
folder is self-describing:

    RUN_DIR/spec.cycle      the spec's text as given
    RUN_DIR/model.py        the generated source the run trains (the startup overrides in it)
    RUN_DIR/engine.json     the engine's IR without source positions (a resume must match it)
    RUN_DIR/run.json        the settings
    RUN_DIR/metrics.jsonl   one record per step (loss, lr, grad_norm, tokens, ...) and per eval
    RUN_DIR/curves.png      train and held-out loss, learning rate, gradient norm
    RUN_DIR/checkpoints/, LATEST   see `checkpoint.py`

One optimizer step takes `accum` micro-steps of `micro_batch` sequences per data-parallel
rank, so that a step sees `batch_tokens` tokens; the loss of a step is the mean over them.
The order of the data is (seed, step) (`data.Corpus.batch`), the RNG states and the
optimizer's are checkpointed, so an interrupted run resumed from its folder reproduces
the uninterrupted one's metrics exactly on the same machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import ir
from ..diagnostics import CycleError, Diagnostic
from ..io import atomic_write
from . import checkpoint
from .data import Corpus, load as load_corpus
from .flameout import Flameout, Watch
from .grads import clip_, grad_norm
from .progress import Metrics, Stop, _emit, _log, _progress

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SCHEDULES = ("constant", "cosine", "linear")
BIN_DTYPES = ("uint8", "uint16", "uint32", "int32", "int64")
TRAIN_EXTRA = "pip install 'cyclelang[train]'"


class MissingPackages(Exception):
    """Optional packages the run needs that are not installed (a usage error: exit 2)."""

    def __init__(self, missing: dict[str, str]):
        self.missing = missing
        what = ", ".join(f"'{name}' ({why})" for name, why in missing.items())
        install = TRAIN_EXTRA + (" transformers" if "transformers" in missing else "")
        s, are = ("s", "are") if len(missing) > 1 else ("", "is")
        super().__init__(f"this run needs the optional package{s} {what}, which {are} not installed: {install} "
                         "(nothing was created or trained)")


def show_progress_bar(show_progress: bool | None, rank0: bool = True) -> bool:
    """Whether the run draws a progress bar: asked for, or by default when stderr is a terminal."""
    if not rank0:
        return False
    if show_progress is not None:
        return bool(show_progress)
    return bool(getattr(sys.stderr, "isatty", None) and sys.stderr.isatty())


def needed_packages(s: "Settings", progress: bool) -> dict[str, str]:
    """The optional packages a run with these settings imports, each with what it is for."""
    need = {"numpy": "token arrays", "safetensors": "checkpoints", "matplotlib": "curves.png"}
    if progress:
        need["tqdm"] = "the progress bar; --no-progress runs without it"
    if s.tokenizer:
        if Path(s.tokenizer).is_dir():
            need["transformers"] = "--tokenizer FOLDER"
        else:
            need["tokenizers"] = "--tokenizer FILE"
    return need


def require(s: "Settings", progress: bool) -> None:
    """Import every optional package the run will need, before anything is created or trained;
    raise `MissingPackages` naming the ones that are not there and the install that fixes it."""
    missing = {}
    for name, why in needed_packages(s, progress).items():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            missing[name] = why
        except ImportError as e:  # installed, but broken
            missing[name] = f"{why}; it is installed but fails to import: {str(e).splitlines()[0] if str(e) else e}"
    if missing:
        raise MissingPackages(missing)


@dataclass
class Settings:
    """What a run is; saved in run.json, taken back on --resume."""

    data: list[str] = field(default_factory=list)
    steps: int = 1000
    seq: int | None = None  # tokens per sequence [default: min(context, 256)]
    micro_batch: int = 8  # sequences per micro-step on each data-parallel rank
    batch_tokens: int | None = None  # tokens per optimizer step [default: one micro-step's]
    tokenizer: str | None = None
    holdout: float = 0.1
    bin_dtype: str = "uint16"
    seed: int = 0
    dtype: str = "fp32"
    compile: bool = False
    compile_mode: str = "regional"  # with compile: each kind of stage once (regional) or one graph (whole)
    eval_every: int = 100
    eval_batches: int = 8
    ckpt_every: int = 500  # 0: only at the end and on Ctrl-C
    # the spec's startup, overridden (None: as the spec says)
    lr: float | None = None
    min_lr: float | None = None
    warmup: int | None = None
    schedule: str | None = None
    lr_steps: int | None = None
    clip: float | None = None
    betas: tuple[float, float] | None = None
    decay: float | None = None
    # parallelism
    fsdp: bool = False
    tp: int = 1
    checkpointing: str = "none"
    ep: int = 1  # expert parallelism (expert.py)
    cp: int = 1  # context parallelism: refused, with the reason per mixer (context.py)
    pp: int = 1  # pipeline pieces (ranks); see pipeline.py
    microbatches: int | None = None  # with pp: the micro-steps of a step, run as the pipeline's microbatches
    pp_schedule: str = "1f1b"


@dataclass
class Result:
    run_dir: Path
    step: int
    metrics: list[dict]
    val_loss: float | None
    val_bpb: float | None
    interrupted: bool = False
    signal: int | None = None  # the signal that stopped the run (SIGINT, SIGTERM)


def _bad(code: str, message: str, help: str | None = None, span=None) -> CycleError:
    return CycleError([Diagnostic(code, "error", message, span, help)])


def with_startup(spec: ir.Spec, s: Settings) -> ir.Spec:
    """The spec with the command line's startup overrides applied (validated again)."""
    e = spec.engine
    st, sch = e.startup, e.startup.schedule
    sch_up = {k: v for k, v in (("lr", s.lr), ("min_lr", s.min_lr), ("kind", s.schedule), ("steps", s.lr_steps)) if v is not None}
    st_up = {k: v for k, v in (("warmup", s.warmup), ("clip", s.clip), ("betas", tuple(s.betas) if s.betas else None), ("decay", s.decay))
             if v is not None}
    if s.clip is not None and s.clip <= 0:
        st_up["clip"] = None  # --clip 0: no clipping
    if not sch_up and not st_up:
        return spec
    try:
        startup = st.model_copy(update={**st_up, "schedule": sch.model_copy(update=sch_up)})
        return ir.validate(spec.model_copy(update={"engine": e.model_copy(update={"startup": startup})}))
    except Exception as err:  # pydantic's ValidationError: an override out of range
        raise _bad("E0507", f"a startup override is out of range: {str(err).splitlines()[-1].strip()}",
                   "see `cyclec train --help` for each option's range") from None


def _check_settings(s: Settings, e: ir.Engine, dp: int) -> tuple[int, int]:
    """(seq, accum) for these settings, or a clear error."""
    seq = s.seq if s.seq is not None else min(e.feed.context, 256)
    if not 1 <= seq <= e.feed.context:
        raise _bad("E0507", f"--seq {seq} does not fit {e.name}'s context of {e.feed.context}", f"use --seq {e.feed.context} or less")
    for name, v, lo in (("--steps", s.steps, 1), ("--micro-batch", s.micro_batch, 1), ("--eval-batches", s.eval_batches, 1),
                        ("--eval-every", s.eval_every, 0), ("--ckpt-every", s.ckpt_every, 0)):
        if v < lo:
            raise _bad("E0507", f"{name} must be at least {lo}, not {v}")
    if s.seed < 0:
        raise _bad("E0507", f"--seed must be at least 0, not {s.seed}")
    for flag, value, allowed in (("--dtype", s.dtype, tuple(DTYPES)), ("--bin-dtype", s.bin_dtype, BIN_DTYPES),
                                 ("--schedule", s.schedule, (None, *SCHEDULES))):
        if value not in allowed:
            raise _bad("E0507", f"{flag} must be one of {', '.join(a for a in allowed if a)}, not {value}")
    per = s.micro_batch * seq * dp
    total = s.batch_tokens if s.batch_tokens is not None else per
    if total % per:
        raise _bad("E0507", f"--batch-tokens {total} is not a whole number of micro-steps of {per} tokens "
                   f"({s.micro_batch} sequences x {seq} tokens x {dp} data-parallel ranks)",
                   f"use a multiple of {per}, e.g. {max(1, round(total / per)) * per}")
    return seq, total // per


def engine_record(spec: ir.Spec) -> dict:
    """The engine as JSON without source positions: what a resumed run must match."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "span"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(json.loads(spec.engine.model_dump_json()))


def _read_json(path: Path, what: str, run_dir: Path):
    """A JSON file of a run folder, or E0509 saying it is missing or damaged."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        if what == "settings":
            raise _bad("E0509", f"--resume {run_dir}: not a run folder (no {path.name})",
                       "give the --out folder of an earlier `cyclec train`") from None
        raise _bad("E0509", f"--resume {run_dir}: its {path.name} is missing", _START_AGAIN.format(run_dir=run_dir)) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise _bad("E0509", f"--resume {run_dir}: its {path.name} is damaged ({why})", _START_AGAIN.format(run_dir=run_dir)) from None


_START_AGAIN = "the run cannot continue from this folder: train into a new --out, or remove it (rm -r {run_dir}) and start again"


def check_run_dir(run_dir: Path, engine: dict, resume: bool) -> None:
    """Refuse a new run's folder that holds files, or a resumed one from another spec."""
    if resume:
        if not (run_dir / "run.json").exists():
            raise _bad("E0509", f"--resume {run_dir}: not a run folder (no run.json)", "give the --out folder of an earlier `cyclec train`")
        saved = _read_json(run_dir / "engine.json", "engine", run_dir)
        if not isinstance(saved, dict):
            raise _bad("E0509", f"--resume {run_dir}: its engine.json is damaged (not an object)", _START_AGAIN.format(run_dir=run_dir))
        if saved != engine:
            name = saved.get("name", "?") if isinstance(saved.get("name"), str) else "?"
            raise _bad("E0508", f"--resume {run_dir}: the run folder was trained from another spec (engine {name}); "
                       "its engine.json differs from this spec's engine",
                       "resume with the spec that started the run (its text is RUN_DIR/spec.cycle), or train into a new --out")
        return
    if run_dir.exists() and any(run_dir.iterdir()):
        if (run_dir / "run.json").exists():
            has = checkpoint.folders(run_dir)
            help = (f"continue it with --resume {run_dir}, remove it (rm -r {run_dir}) to start over, or train into a new folder" if has else
                    f"it holds no checkpoint to resume (the run stopped before its first): remove it (rm -r {run_dir}) and start "
                    "again, or train into a new folder")
        else:
            help = "train into a new (or empty) folder"
        raise _bad("E0509", f"--out {run_dir} already holds files", help)


def write_run_dir(run_dir: Path, spec_text: str, source: str, engine: dict, settings: Settings) -> None:
    """A new run folder: the spec's text, the generated source, the settings."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "spec.cycle", spec_text)
    atomic_write(run_dir / "model.py", source)
    atomic_write(run_dir / "engine.json", json.dumps(engine, indent=1, sort_keys=True) + "\n")
    atomic_write(run_dir / "run.json", json.dumps(dataclasses.asdict(settings), indent=1, sort_keys=True) + "\n")


def _fits(value, kind: str) -> bool:
    """Whether a run.json value has the type of a Settings field (its annotation, a string)."""
    optional = kind.endswith(" | None")
    base = kind.removesuffix(" | None")
    if value is None:
        return optional
    if base == "bool":
        return isinstance(value, bool)
    if base == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if base == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if base == "str":
        return isinstance(value, str)
    if base == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if base == "tuple[float, float]":
        return isinstance(value, list) and len(value) == 2 and all(_fits(v, "float") for v in value)
    return False


def load_settings(run_dir) -> Settings:
    """A run folder's run.json as Settings; E0509 when it is missing, not JSON, or holds a key
    or a value of a type Settings does not have (damage, or another program's file)."""
    run_dir = Path(run_dir)
    raw = _read_json(run_dir / "run.json", "settings", run_dir)
    if not isinstance(raw, dict):
        raise _bad("E0509", f"--resume {run_dir}: its run.json is damaged (not an object)", _START_AGAIN.format(run_dir=run_dir))
    fields = {f.name: f.type for f in dataclasses.fields(Settings)}
    wrong = [k for k in raw if k not in fields] + [k for k, v in raw.items() if k in fields and not _fits(v, fields[k])]
    wrong += ["compile_mode"] if raw.get("compile_mode", "regional") not in ("regional", "whole") else []
    if wrong:
        shown = ", ".join(f"{k[:40]!r}" for k in wrong[:5])
        raise _bad("E0509", f"--resume {run_dir}: its run.json is damaged (unknown key or wrong type: {shown})",
                   _START_AGAIN.format(run_dir=run_dir))
    if raw.get("betas") is not None:
        raw["betas"] = tuple(raw["betas"])
    return Settings(**raw)


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _no_checkpoint(run_dir: Path, notes: list[str]) -> CycleError:
    if not notes and not checkpoint.folders(run_dir):
        return _bad("E0509", f"--resume {run_dir}: the run folder holds no checkpoint (the run stopped before its first)",
                    _START_AGAIN.format(run_dir=run_dir))
    return _bad("E0509", f"--resume {run_dir}: no intact checkpoint to resume from ({'; '.join(notes)})",
                _START_AGAIN.format(run_dir=run_dir))


def _pick(run_dir: Path, dist, notes: list[str]):
    """The intact checkpoints to resume from, best first. Distributed: rank 0 verifies and
    every rank takes its choice (one reading of the files, the same answer everywhere)."""
    if dist is None:
        return checkpoint.intact(run_dir, notes)
    found = (None, None)
    if dist.rank == 0:
        ck, state = next(checkpoint.intact(run_dir, notes), (None, None))
        found = (ck.name if ck is not None else None, state)
    name, state, given = dist.broadcast_object((*found, list(notes)))
    notes[:] = given
    return iter([(run_dir / "checkpoints" / name, state)] if name is not None else [])


def run(spec: ir.Spec, settings: Settings, run_dir, *, spec_text: str, resume: bool = False, show_progress: bool | None = None,
        on_step=None, clock: dict | None = None, spec_path: str | None = None) -> Result:
    """Train `spec` into `run_dir` (see the module's docstring). `on_step(step)` is called after
    every step (tests use it to interrupt a run at a known point). `clock`, a dict, collects
    seconds: "data" (reading batches), "books" (watch, metrics, progress) and "steps" (whole
    steps, evaluations and checkpoints aside): the benchmark's measure of the loop's overhead.
    `spec_path`: the spec's file, named in the header (default: where the IR says it came from).

    Before anything is created: the optional packages the run needs are imported (a missing
    one raises `MissingPackages`), the settings, the spec and the run folder are checked, and
    on --resume the checkpoint to continue from is verified. A new run that stops before its
    first checkpoint (an error, a second Ctrl-C) removes what it created: there is nothing
    to resume, and a folder left behind would only block the rerun."""
    run_dir = Path(run_dir)
    rank0_env = os.environ.get("RANK", "0") == "0"
    require(settings, show_progress_bar(show_progress, rank0_env))
    existed = run_dir.exists()
    made = {"folder": False}  # set once the (checked: new or empty) run folder is written
    try:
        return _run(spec, settings, run_dir, spec_text=spec_text, resume=resume, show_progress=show_progress, on_step=on_step,
                    clock=clock, spec_path=spec_path, made=made)
    except BaseException:
        if made["folder"] and not resume and rank0_env:
            _remove_unstarted(run_dir, existed)
        raise


def _remove_unstarted(run_dir: Path, existed: bool) -> None:
    """A new run that wrote no checkpoint leaves nothing behind (the folder, if it made it)."""
    try:
        if not os.path.lexists(run_dir) or checkpoint.folders(run_dir):
            return
        if not existed:
            checkpoint.remove(run_dir)
        else:
            for p in run_dir.iterdir():
                checkpoint.remove(p)
        _emit(f"cyclec train: no checkpoint was written: removed what the run had created in {run_dir}")
    except OSError:
        pass


def _run(spec: ir.Spec, settings: Settings, run_dir: Path, *, spec_text: str, resume: bool, show_progress: bool | None,
         on_step, clock: dict | None, spec_path: str | None, made: dict) -> Result:
    clock = clock if clock is not None else {}
    for key in ("data", "books", "steps"):
        clock.setdefault(key, 0.0)
    from ..backends.torch.build import build_source, load_source
    from ..backends.torch.codegen import codegen, engine_spec
    from .distributed import Distributed

    s = settings
    spec = with_startup(engine_spec(spec), s)
    e = spec.engine
    if s.tp < 1:
        raise _bad("E0507", f"--tp must be at least 1, not {s.tp}")
    if s.checkpointing not in ("none", "stage", "selective"):
        raise _bad("E0507", f"--checkpointing must be none, stage or selective, not {s.checkpointing}")
    if s.ep != 1 or s.cp != 1:
        from . import context, expert

        expert.check(spec, s.ep, s)
        context.check(spec, s.cp)
    from . import pipeline

    pipeline.check(e, s, int(os.environ.get("WORLD_SIZE", "1")))
    dist = Distributed.from_env(tp=s.tp, ep=s.ep, pp=s.pp)
    rank0 = dist is None or dist.rank == 0
    say = (lambda line: _emit(f"cyclec train: {line}")) if rank0 else (lambda line: None)
    dp, dp_rank = (dist.dp, dist.dp_rank) if dist is not None else (1, 0)
    notes: list[str] = []
    picks, ck, state = None, None, None
    if dist is not None and dist.tp > 1 and dp > 1 and not s.fsdp:
        raise _bad("E0507", f"--tp {dist.tp} on {dist.world} processes leaves {dp} data-parallel replicas: add --fsdp to shard them")
    if s.tp > 1 and dist is None:
        raise _bad("E0513", f"--tp {s.tp} needs {s.tp} processes or more", f"launch with torchrun --nproc-per-node {s.tp} -m cyclelang train ...")
    source = codegen(spec, fast=True, parallel=True)  # the runtime's custom ops and `parallelize`
    engine = engine_record(spec)
    check_run_dir(run_dir, engine, resume)  # every rank, before rank 0 writes anything
    if resume:
        picks = _pick(run_dir, dist, notes)
        ck, state = next(picks, (None, None))
        for line in notes:
            say(line)
        if ck is None:
            raise _no_checkpoint(run_dir, notes)
        s = dataclasses.replace(s, micro_batch=_rows(state, dp, run_dir) // dp)  # the same global batch at another world size
    if s.microbatches is not None and s.batch_tokens is None:  # --microbatches M: a step of M micro-steps
        s = dataclasses.replace(s, batch_tokens=s.microbatches * s.micro_batch * dp * (s.seq if s.seq is not None else min(e.feed.context, 256)))
    seq, accum = _check_settings(s, e, dp)
    if s.microbatches is not None and accum != s.microbatches:
        raise _bad("E0507", f"--microbatches {s.microbatches} and --batch-tokens {s.batch_tokens} disagree ({accum} micro-steps)",
                   "give one of them")
    if rank0 and not resume:
        made["folder"] = True  # checked new or empty: from here on, what is in the folder is this run's
    if dist is not None:
        dist.barrier()

    def corpus_() -> Corpus:
        c = load_corpus(s.data, e.feed.vocab, tokenizer=s.tokenizer, cache=run_dir / "tokens", holdout=s.holdout, bin_dtype=s.bin_dtype)
        c.check_windows(seq, ", ".join(s.data))
        return c

    # the data are checked before the run folder is made; rank 0 encodes (into tokens/) first
    corpus = corpus_() if rank0 else None
    if dist is not None:
        dist.barrier()
        corpus = corpus or corpus_()
    if rank0 and not resume:
        write_run_dir(run_dir, spec_text, source, engine, s)
    if dist is not None:
        dist.barrier()

    device = dist.device if dist is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_source(spec, source, seed=s.seed).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    module = load_source(source, e.name)
    if dist is not None and dist.ep > 1:  # this rank's experts only, routed by all-to-all; `around` shards them before the rest
        from .expert import ExpertParallel

        dist.experts = ExpertParallel(model, dist.ep_mesh, dist.mesh["dp"], s.fsdp, compile=s.compile)
    pipe = None
    if dist is not None and dist.pp > 1:
        pipe = pipeline.Pipeline(spec, model, module, dist, s, accum)
        model = pipe.model  # this rank's pieces, under the model's own parameter names
    elif dist is not None and (s.fsdp or dist.tp > 1):
        try:
            plan = module.parallelize if dist.experts is None else dist.experts.around(module.parallelize)
            plan(model, dist.mesh, fsdp=s.fsdp, tp=dist.tp > 1, checkpointing=s.checkpointing, compile=s.compile and s.compile_mode)
        except ValueError as err:
            raise _bad("E0512", str(err).splitlines()[0], "\n".join(str(err).splitlines()[1:]) or None) from None
    elif s.checkpointing != "none":
        module.parallelize(model, None, fsdp=False, tp=False, checkpointing=s.checkpointing, compile=False)
    from torch.distributed.tensor import DTensor

    # DTensor parameters (FSDP2, TP, EP) step with torch's default kernels: with fused=True, torch
    # 2.13 stops a two-rank run with "got mixed torch.Tensor and DTensor" (pytorch/pytorch#153354)
    optimizer, scheduler = model.configure_optimizer(fused=not any(isinstance(p, DTensor) for p in model.parameters()))
    params = [p for p in model.parameters() if p.requires_grad]
    clip = e.startup.clip
    step_model = model
    if dist is not None and not s.fsdp and dist.tp == 1 and pipe is None:
        step_model = torch.nn.parallel.DistributedDataParallel(model)
    if s.compile and (dist is None or not (s.fsdp or dist.tp > 1)):
        module.compile_model(model, s.compile_mode)  # in place, after checkpointing (and inside DDP's wrapper)
    amp = DTYPES[s.dtype]
    scaler = torch.amp.GradScaler(device.type) if amp is torch.float16 else None

    def autocast():
        return torch.autocast(device.type, dtype=amp) if amp is not torch.float32 else contextlib.nullcontext()

    watch = Watch()
    metrics = Metrics(run_dir / "metrics.jsonl", rank0)
    start, tokens_seen, elapsed = 0, 0, 0.0
    rows = s.micro_batch * dp
    torch.manual_seed(s.seed + 1 + (dist.rank if dist is not None else 0))  # dropout; checkpointed from here on
    if resume:
        while True:
            try:
                state = checkpoint.load(ck, model, optimizer, scheduler, scaler, dist)
                break
            except checkpoint.Damaged as why:
                notes.append(f"checkpoint {ck.name} is damaged: {why}")
                say(notes[-1])
                ck, state = next(picks, (None, None)) if dist is None else (None, None)
                if ck is None:
                    raise _no_checkpoint(run_dir, notes) from None
                if state["rows"] != rows:
                    raise _bad("E0509", f"--resume {run_dir}: {ck.name} was saved with {state['rows']} sequences per micro-step, "
                               f"not {rows}", _START_AGAIN.format(run_dir=run_dir)) from None
        if notes:
            say(f"resuming from {ck.name}")
        if state["data"]["fingerprint"] != corpus.fingerprint():
            raise _bad("E0509", f"--resume {run_dir}: the data differ from the run's ({state['data']['fingerprint']['tokens']} tokens then, "
                       f"{corpus.fingerprint()['tokens']} now)", "resume with the same --data and --tokenizer")
        if state.get("tp", 1) != (dist.tp if dist is not None else 1):
            raise _bad("E0509", f"--resume {run_dir}: saved with --tp {state.get('tp', 1)}; a checkpoint's regrouped q/k/v rows "
                       "reload only at the same TP degree", f"resume with --tp {state.get('tp', 1)} (the data-parallel size may change)")
        start, tokens_seen, elapsed = state["step"], state["tokens"], float(state["elapsed"])
        watch.load(state["watch"])
        metrics.resume(start, say)
    part = slice(dp_rank * s.micro_batch, (dp_rank + 1) * s.micro_batch)
    last_saved = ck.name if resume else None

    def to_device(a: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.from_numpy(a).to(device)
        return t[:, :-1], t[:, 1:]

    def evaluate() -> tuple[float, float | None]:
        model.eval()
        total = torch.zeros((), dtype=torch.float64)
        with torch.no_grad():
            for i in range(s.eval_batches):
                x, y = to_device(corpus.eval_batch(s.seed, i, rows, seq, part))
                with autocast():
                    loss = step_model(x, y)[1] if pipe is None else pipe.eval(x, y)
                total += loss.detach().double().cpu()
        model.train()
        value = total / s.eval_batches
        value = float(dist.mean(value)) if dist is not None else float(value)
        bpb = value / math.log(2) / corpus.bytes_per_token if corpus.bytes_per_token else None
        return value, bpb

    def save(step: int) -> None:
        nonlocal last_saved
        meta = {"tokens": tokens_seen, "elapsed": elapsed, "watch": watch.state(), "tp": dist.tp if dist is not None else 1,
                "ep": dist.ep if dist is not None else 1, "pp": dist.pp if dist is not None else 1, "optim_flat": dist is not None,
                "world": dist.world if dist is not None else 1, "rows": rows,
                "data": {"seed": s.seed, "step": step, "fingerprint": corpus.fingerprint()}}
        try:
            checkpoint.save(run_dir, step, model, optimizer, scheduler, scaler, meta, dist)
        except OSError as err:
            kept = f"the last good checkpoint ({last_saved}) is intact" if last_saved is not None else "no earlier checkpoint exists"
            raise _bad("E0510", f"cannot write the checkpoint of step {step} in {run_dir}: {err.strerror or err}; {kept}",
                       f"free space and resume with --resume {run_dir}" if last_saved is not None else "free space and start again") from None
        last_saved = checkpoint.name(step)

    show = show_progress_bar(show_progress, rank0)
    if rank0:
        _header(say, e, spec_path or (e.span.file if e.span is not None else None), n_params, corpus, s, seq, accum, dp, dist, device,
                run_dir, start if resume else None)
    bar = _progress(s.steps, start, show) if rank0 else None
    val = (None, None)
    interrupted, signum = False, None
    step = start
    value = None
    model.train()
    try:
        with Stop(say=lambda line: _log(line, bar), last=lambda: last_saved) as stop:
            while step < s.steps:
                stop.current = step + 1
                t0 = time.perf_counter()
                lr = scheduler.get_last_lr()[0]
                optimizer.zero_grad(set_to_none=True)
                total = torch.zeros((), dtype=torch.float64)
                if pipe is not None:  # the micro-steps as the pipeline's microbatches
                    with autocast():
                        total += pipe.step([to_device(corpus.batch(s.seed, step, m, rows, seq, part)) for m in range(accum)])
                for m in range(accum if pipe is None else 0):
                    td = time.perf_counter()
                    x, y = to_device(corpus.batch(s.seed, step, m, rows, seq, part))
                    clock["data"] += time.perf_counter() - td
                    with autocast():
                        _, loss = step_model(x, y)
                    scaled = loss / accum
                    (scaler.scale(scaled) if scaler is not None else scaled).backward()
                    total += loss.detach().double().cpu()
                if dist is not None and dist.experts is not None:
                    dist.experts.sync_grads()
                if scaler is not None:
                    scaler.unscale_(optimizer)
                norm = (grad_norm(params) if dist is None or dist.experts is None else dist.experts.grad_norm(params, grad_norm)) if pipe is None else (
                    pipe.grad_norm(params))
                value = total / accum
                value = float(dist.mean(value)) if dist is not None else float(value)
                gn = float(norm)
                try:
                    spike = watch.step(step + 1, value, gn if scaler is None else None)
                except Flameout as f:
                    metrics.add({"step": step + 1, "loss": value, "lr": lr, "grad_norm": gn, "flameout": f.what})
                    raise _bad("E0511", f"{f}; training stopped", (f"the last good checkpoint ({last_saved}) is intact; " if last_saved else
                                                                   "no checkpoint was written, so the run folder is removed; ")
                               + "lower --lr, lengthen --warmup or set --clip") from None
                if clip is not None and math.isfinite(gn):
                    clip_(params, clip, norm)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                scheduler.step()
                step += 1
                tokens_seen += accum * rows * seq
                t1 = time.perf_counter()
                dt = t1 - t0
                elapsed += dt
                rec = {"step": step, "loss": value, "lr": lr, "grad_norm": gn, "tokens": tokens_seen,
                       "tokens_per_s": accum * rows * seq / dt if dt > 0 else None, "elapsed": elapsed}
                if spike is not None:
                    rec["spike"] = spike.size
                metrics.add(rec)
                if bar is not None:
                    bar.set_postfix_str(f"loss {value:.3f} lr {lr:.2e} {rec['tokens_per_s'] or 0:,.0f} tok/s", refresh=False)
                    bar.update(1)
                if spike is not None and rank0:
                    _log(f"step {step}: loss spike {value:.3f} ({spike.size:+.3f} over the median of the last steps)", bar)
                t2 = time.perf_counter()
                clock["books"] += t2 - t1
                clock["steps"] += t2 - t0
                if (s.eval_every and step % s.eval_every == 0) or step == s.steps:
                    val = evaluate()
                    metrics.add({"step": step, "val_loss": val[0], "val_bpb": val[1]})
                    if rank0:
                        bpb = f" ({val[1]:.3f} bits/byte)" if val[1] is not None else ""
                        _log(f"step {step}/{s.steps} | train {value:.4f} | held-out {val[0]:.4f}{bpb} | lr {lr:.2e} | "
                             f"grad norm {gn:.3f} | {tokens_seen:,} tokens", bar)
                if s.compile and rank0 and step == start + 1:
                    _log(compiled_line(model, module, dt), bar)
                if on_step is not None:
                    on_step(step)
                stopping = dist.any(stop.flag) if dist is not None else stop.flag
                if stopping or step == s.steps or (s.ckpt_every and step % s.ckpt_every == 0):
                    save(step)
                if stopping and step < s.steps:
                    interrupted, signum = True, stop.signum or signal.SIGINT
                    break
    finally:
        metrics.close()
        if bar is not None:
            bar.close()
    if rank0 and metrics.records:
        from .plot import plot

        checkpoint.replace_file(run_dir / "curves.png", plot(metrics.records, title=e.name))
    if rank0:
        loss = f"train loss {value:.4f}" if value is not None else "no step taken"
        if interrupted:
            what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            say(f"stopped at step {step}/{s.steps} ({what}): {loss}; checkpoint {last_saved} in {run_dir}; "
                f"continue with --resume {run_dir}")
        else:
            held = ""
            if val[0] is not None:
                held = f", held-out {val[0]:.4f}" + (f" ({val[1]:.3f} bits/byte)" if val[1] is not None else "")
            say(f"done: step {step}/{s.steps}, {loss}{held}; run folder {run_dir} (checkpoint {last_saved}, metrics.jsonl, curves.png)")
            if s.compile:
                say(compiled_line(model, module))
    if dist is not None:
        dist.barrier()
    if dist is not None:
        dist.barrier()  # every rank done (rank 0's last writes included) before any leaves the group
    return Result(run_dir, step, metrics.records, val[0], val[1], interrupted, signum)


def compiled_line(model, module, seconds: float | None = None) -> str:
    """What torch.compile made of the model (`compile_model`): its regions, the instances
    sharing each, the graphs dynamo holds and the recompiles among them (a region's graphs
    beyond its first: a new shape, evaluation's no-grad mode)."""
    regions, graphs = model.compiled_regions, module.compiled_graphs(model)
    made = sum(graphs.values())
    recompiles = sum(max(0, n - 1) for n in graphs.values())
    parts = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in regions.items())
    first = f" in the first step ({seconds:.1f} s)" if seconds is not None else ""
    return f"compiled ({'regional' if 'model' not in regions else 'whole'}): {len(regions)} region(s), {made} graph(s), {recompiles} recompile(s){first}; {parts}"


def _rows(state: dict, dp: int, run_dir: Path) -> int:
    rows = state["rows"]
    if rows % dp:
        raise _bad("E0509", f"--resume {run_dir}: {rows} sequences per micro-step do not split over {dp} data-parallel ranks",
                   "resume on a number of processes that divides them")
    return rows


def _header(say, e, spec_path, n_params, corpus: Corpus, s: Settings, seq, accum, dp, dist, device, run_dir, resumed_at) -> None:
    """What is about to run, on stderr: the spec, its size, the data, the batch, the devices, the folder."""
    where = f" from {spec_path}" if spec_path and spec_path != "<string>" else ""
    into = f"resuming {run_dir} at step {resumed_at}" if resumed_at is not None else f"into {run_dir}"
    say(f"{e.name}{where}, {n_params:,} parameters, {into}")
    files = len(corpus.sources)
    kind = "bytes" if corpus.tokenizer == "bytes" else corpus.tokenizer
    skipped = f"; skipped {len(corpus.skipped)} empty or binary" if corpus.skipped else ""
    _emit(f"  data: {_count(files, 'file')}, {corpus.total:,} tokens ({kind}): {corpus.split:,} for training, "
          f"{corpus.total - corpus.split:,} held out{skipped}")
    if corpus.skipped:  # listed, so a file left out by mistake is seen (the first eight)
        more = f", and {len(corpus.skipped) - 8} more" if len(corpus.skipped) > 8 else ""
        _emit(f"  skipped: {', '.join(corpus.skipped[:8])}{more}")
    per = accum * s.micro_batch * dp * seq
    _emit(f"  steps {(resumed_at or 0) + 1} to {s.steps}, {per:,} tokens each ({s.micro_batch * dp} sequences of {seq}, "
          f"{_count(accum, 'micro-step')}): {per * max(0, s.steps - (resumed_at or 0)):,} tokens")
    procs = f"{dist.world} processes" + (f", pipeline {dist.pp} ({s.pp_schedule}, {accum} microbatches)" if dist.pp > 1 else "") + (
        ", FSDP" if s.fsdp else "") + (f", tensor parallel {dist.tp}" if dist.tp > 1 else "") + (
        f", expert parallel {dist.ep}" if dist.ep > 1 else "") + (
        ", DDP" if not s.fsdp and dist.tp == 1 and dist.pp == 1 else "") if dist is not None else "1 process"
    name = f"{torch.cuda.get_device_name(device)} ({device})" if device.type == "cuda" else str(device)
    extra = (f", compiled ({s.compile_mode})" if s.compile else "") + (f", activation checkpointing {s.checkpointing}" if s.checkpointing != "none" else "")
    _emit(f"  device: {name}, {procs}, {s.dtype}{extra}")
