"""Several `cyclec train` runs in one launch: the distributed tests' start-up paid once.

A launch of N processes (`python -m tests.train_jobs --nproc N JOBS.json`; plain
`python -m tests.train_jobs JOBS.json` for one) imports torch, its distributed packages and
cyclelang once, then forks its N ranks; each joins the process group (gloo, rendezvous through a
file beside JOBS.json) and runs each job's `cyclec train` arguments in turn through the CLI
itself (`cyclelang.cli.main`, as `python -m cyclelang` does): the process group stays up between
jobs (`Distributed.from_env` finds it joined), each job makes its own mesh, seeds its own weights
and data, and dynamo is reset after it, so a job is the run a launch of its own would make. Each
rank's stderr of a job goes to `LOGS/NAME.rankR.err`, and `LOGS/NAME.rankR.done` marks that the
rank finished it. A job that fails (a nonzero exit, an exception) ends the launch: the launcher
then stops the other ranks. `Launches(..., torchrun=True)` launches under torchrun instead (each
rank a process of its own that imports everything and joins through torchrun's rendezvous, as a
user's run does): tests/test_train_distributed.py keeps that path.

On the test side `Launches` declares the launches of a test file (in the order they run: a
resume after the run it resumes), runs them all once (a module fixture) and hands each test
its job: `launches[name].stderr`, or a failure naming the launch's output when the job did not
finish.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STACKS_AFTER = float(os.environ.get("CYCLELANG_JOB_STACKS_AFTER", 420))
# what every rank of a launch imports, imported once before the ranks are forked
PRELOAD = ("torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.distributed.pipelining", "torch.distributed.tensor.parallel",
           "torch._dynamo", "torch._inductor.compile_fx", "cyclelang.backends.torch.build", "cyclelang.cli", "cyclelang.training.expert",
           "cyclelang.training.loop", "cyclelang.training.pipeline")


def _run_jobs(path: str) -> None:
    import faulthandler
    import gc

    from cyclelang.cli import main

    rank = os.environ.get("RANK", "0")
    jobs = json.loads(Path(path).read_text("utf-8"))
    for job in jobs:
        logs = Path(job["logs"])
        print(f"[rank {rank}] job {job['name']}: cyclec train {' '.join(job['args'])}", file=sys.__stderr__, flush=True)
        # a job still running after STACKS_AFTER seconds prints every thread's stack (a hang then says where it waits)
        faulthandler.dump_traceback_later(STACKS_AFTER, file=sys.__stderr__)
        with open(logs / f"{job['name']}.rank{rank}.err", "w", encoding="utf-8") as err, contextlib.redirect_stderr(err):
            try:
                main(["train", *job["args"]], prog_name="cyclec")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        faulthandler.cancel_dump_traceback_later()
        if code:
            sys.__stderr__.write((logs / f"{job['name']}.rank{rank}.err").read_text("utf-8")[-6000:])
            print(f"[rank {rank}] job {job['name']} exited {code}", file=sys.__stderr__, flush=True)
            sys.exit(code)
        torch = sys.modules.get("torch")
        if torch is not None and "torch._dynamo" in sys.modules:
            torch._dynamo.reset()  # a job compiles from nothing, as in a process of its own
        gc.collect()
        (logs / f"{job['name']}.rank{rank}.done").touch()
    faulthandler.dump_traceback_later(STACKS_AFTER / 4, file=sys.__stderr__)  # and a hang at the teardown (the group's atexit close)


def _fork_ranks(nproc: int, path: str) -> None:
    """Import what every rank needs once, then fork the `nproc` ranks of the launch at `path`.
    Forking is safe here: the imports start no thread (OMP_NUM_THREADS=1, tests/test_train_distributed.env),
    and each rank joins the group, and so starts gloo's threads, only after the fork."""
    import importlib

    import torch.multiprocessing as mp

    for name in PRELOAD:
        importlib.import_module(name)
    threads = os.listdir("/proc/self/task")  # Linux: the process's threads, native ones included
    assert len(threads) == 1, f"{len(threads)} threads before forking the ranks: a forked rank could inherit a held lock"

    store = Path(path).with_suffix(".store")
    store.unlink(missing_ok=True)
    # a rank that exits nonzero stops the others, and the launch fails with its exit code
    mp.start_processes(_rank, args=(nproc, path, str(store)), nprocs=nproc, start_method="fork")


def _rank(rank: int, nproc: int, path: str, store: str) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=nproc)
    try:
        _run_jobs(path)
    finally:
        dist.destroy_process_group()  # a forked rank ends in os._exit: no atexit close


def launch_session(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run a launch; past `timeout` it is stopped, the launcher and every rank (none is left running
    beside the rest of the suite, or holding the output pipes open), and it fails with what it
    printed, each hung rank's stacks included (STACKS_AFTER)."""
    import signal

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        ranks = _descendants(p.pid)  # torchrun starts each rank in a session of its own
        p.terminate()  # torchrun, and the fork launcher (torch.multiprocessing), stop their ranks on SIGTERM
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            for pid in [p.pid, *ranks]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            out, err = p.communicate()
        err += f"\n[the launch was stopped after {timeout:.0f} s]\n"
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (Linux; elsewhere none)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        above = todo.pop()
        kids = [c for c, parent in parents.items() if parent == above]
        found += kids
        todo += kids
    return found


class Job:
    def __init__(self, name: str, nproc: int, stderr: str):
        self.name, self.nproc, self.stderr = name, nproc, stderr


class Launches:
    """The launches of a test file: `add(nproc, name, *args)` in the order they must run (jobs of
    one world size in a row share a launch), then `run()` once; `self[name]` is a finished job."""

    def __init__(self, tmp: Path, torchrun: bool = False):
        self.tmp = Path(tmp)
        self.torchrun = torchrun
        self.logs = self.tmp / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.plan: list[tuple[int, list[dict]]] = []
        self.owner: dict[str, int] = {}  # job name -> the index of its launch
        self.outcome: list[subprocess.CompletedProcess | None] = []

    def add(self, nproc: int, name: str, *args) -> None:
        assert name not in self.owner, name
        if not self.plan or self.plan[-1][0] != nproc:
            self.plan.append((nproc, []))
        self.plan[-1][1].append({"name": name, "args": [str(a) for a in args], "logs": str(self.logs)})
        self.owner[name] = len(self.plan) - 1

    def run(self, timeout: float = 900) -> "Launches":
        from .test_train_distributed import env

        for i, (nproc, jobs) in enumerate(self.plan):
            spec = self.tmp / f"launch-{i}.json"
            spec.write_text(json.dumps(jobs), "utf-8")
            if nproc > 1 and self.torchrun:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone", "-m", "tests.train_jobs"]
            else:
                cmd = [sys.executable, "-m", "tests.train_jobs", *(["--nproc", str(nproc)] if nproc > 1 else [])]
            self.outcome.append(launch_session([*cmd, str(spec)], env(), timeout))
        return self

    def __getitem__(self, name: str) -> Job:
        i = self.owner[name]
        nproc = self.plan[i][0]
        p = self.outcome[i] if i < len(self.outcome) else None
        # every rank finished the job, and the launch exited cleanly (a crash at the process group's
        # teardown fails its jobs as it failed a launch of one)
        if p is None or p.returncode != 0 or not all((self.logs / f"{name}.rank{r}.done").exists() for r in range(nproc)):
            import pytest

            pytest.fail(f"job {name} did not finish (launch {i}, {nproc} process(es), exit "
                        f"{None if p is None else p.returncode}):\n" + ("" if p is None else p.stdout[-3000:] + p.stderr[-20000:]),
                        pytrace=False)
        stderr = "".join((self.logs / f"{name}.rank{r}.err").read_text("utf-8") for r in range(nproc))
        return Job(name, nproc, stderr)


if __name__ == "__main__":
    if sys.argv[1] == "--nproc":
        _fork_ranks(int(sys.argv[2]), sys.argv[3])
    else:
        _run_jobs(sys.argv[1])
