"""Shared test machinery: golden files.

A golden is the expected output of a deterministic stage, kept in the repository
beside the case it belongs to. `golden.check(path, text)` compares; a missing or
different golden fails the test. `pytest --update-goldens` rewrites them instead
(review the diff before committing).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

# One intra-op thread in the test process and the processes it starts (they inherit the variable): the
# suite's tensors are tiny, and two OpenMP threads spinning for them cost five times the CPU of one
# (and far more wall time on a machine shared with another run). Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode caches written whatever PYTHONDONTWRITEBYTECODE says (a machine that sets it otherwise has
# each run, in each worker, compile the package again and rewrite every test module's asserts: ~5 s
# of a worker's collection on two cores). The processes a test starts keep the variable; they read
# the caches written here.
sys.dont_write_bytecode = False

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.cycle"))


def shrink(path: Path, **sizes):
    """A library spec at a scale model small enough to build and run in the suite:
    `ir.passes.shrink(load(path), **sizes)` (width, depth, vocab, context, heads)."""
    import cyclelang

    return cyclelang.ir.passes.shrink(cyclelang.load(path), **sizes)


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(module: str):
    """Import an optional test dependency. Where it is not installed the test skips, except in CI
    (`CI=true`), where a missing dependency fails: CI installs everything (.ci/run). An import
    that is broken (the package is there but raises) always fails: it is never a skip."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not module.startswith(e.name.split(".")[0]):
            raise  # the package is there, but something it imports is not: a broken install, not a skip
        if IN_CI:
            pytest.fail(f"{module} is not installed, and CI installs every test dependency (.ci/run)", pytrace=False)
        pytest.skip(f"{module} is not installed", allow_module_level=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skip for a missing dependency (an importorskip anywhere) is a failure."""
    outcome = yield
    rep = outcome.get_result()
    if IN_CI and rep.skipped and call.excinfo is not None:
        reason = str(call.excinfo.value)
        if "could not import" in reason or "not installed" in reason:
            rep.outcome = "failed"
            rep.longrepr = f"skipped for a missing dependency in CI: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped at import (a module-level importorskip)."""
    outcome = yield
    rep = outcome.get_result()
    if IN_CI and rep.skipped:
        reason = str(rep.longrepr[-1]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if "could not import" in reason or "not installed" in reason:
            rep.outcome = "failed"
            rep.longrepr = f"module skipped for a missing dependency in CI: {reason}"


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False, help="rewrite golden files from the current outputs")


class Golden:
    def __init__(self, update: bool):
        self.update = update

    def check(self, path: Path, actual: str) -> None:
        path = Path(path)
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text("utf-8") != actual:
                path.write_text(actual, "utf-8")
            return
        if not path.exists():
            pytest.fail(f"missing golden {path.relative_to(ROOT)}; run pytest --update-goldens and review it")
        expected = path.read_text("utf-8")
        if expected != actual:
            import difflib

            diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), "golden", "actual", n=2))
            pytest.fail(f"output differs from golden {path.relative_to(ROOT)}:\n{diff[:6000]}")


@pytest.fixture
def golden(request) -> Golden:
    return Golden(request.config.getoption("--update-goldens"))


def spec_id(path: Path) -> str:
    return path.stem


def swept(paths, fast):
    """`paths` for a parametrized sweep: those whose stem is in `fast` in the fast tier
    (`-m "not slow"`), the rest marked slow, so the full run still sweeps them all."""
    return [p if p.stem in fast else pytest.param(p, marks=pytest.mark.slow) for p in paths]


def swept_except(paths, slow):
    """`paths` for a parametrized sweep with those whose stem is in `slow` marked slow: the fast
    tier sweeps the rest, the full run all of them."""
    return swept(paths, {p.stem for p in paths} - set(slow))


def rotated(paths, every: int, offset: int = 0, slow=()):
    """`paths` for a sweep that compares two computations of one fact per spec: every `every`-th path
    (from `offset`) in the fast tier, the rest marked slow. Sweeps given different offsets share the
    library between them; a spec added to specs/ joins one of them by its place, with nothing to edit.
    Stems in `slow` (specs that take a second or more in that sweep) run in the full run only."""
    return [p if i % every == offset % every and p.stem not in slow else pytest.param(p, marks=pytest.mark.slow)
            for i, p in enumerate(paths)]


def require(module: str, install: str):
    """Import an optional test dependency: skip without it locally, fail in CI (CI=true),
    where `.ci/run` installs it and a missing one is a broken machine, not a reason to skip."""
    import importlib
    import os

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{module} is missing in CI: {install}")
        pytest.skip(f"{module} is not installed ({install})")


def _peak_mib() -> float:
    import resource

    # (not RUSAGE_CHILDREN: a forked subprocess reports the parent's size at the fork as its own peak)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker (`-n 2`): its peak goes to the controller
        workeroutput["peak_mib"] = _peak_mib()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker has finished; keep its peak."""
    node.config.stash.setdefault(_WORKER_PEAKS, []).append(node.workeroutput.get("peak_mib", 0.0))


_WORKER_PEAKS = pytest.StashKey[list]()
_TOGETHER = pytest.StashKey[list]()


def _children_rss_mib(pid: int) -> float:
    """The resident memory of `pid`'s direct children (pytest-xdist's workers) now, from /proc."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != pid:
                    continue
            with open(f"/proc/{d}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, ValueError, IndexError, StopIteration):
            continue  # gone, or no memory of its own (a zombie)
    return total / 1024


# The longest files first (their seconds in a full run on two workers: 146 to 65). Under
# `--dist loadfile` a free worker takes the next file in collection order, so a long file
# collected late leaves the other worker idle at the end; longest first packs them evenly.
LONGEST_FIRST = ("test_train_3d", "test_perf_guards", "test_draw", "test_regional_compile", "test_train",
                 "test_train_pipeline", "test_train_distributed", "test_train_expert", "test_torch_backend",
                 "test_train_ep_pp")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each file's order kept


def pytest_configure(config):
    """Under `-n N` the controller samples its workers' resident memory together (every 0.2 s),
    for the peak the machine holds: the sum of each worker's own peak only bounds it."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") and os.path.isdir("/proc/self"):
        import threading

        seen = config.stash[_TOGETHER] = [0.0]

        def sample():
            while True:
                seen[0] = max(seen[0], _children_rss_mib(os.getpid()))
                threading.Event().wait(0.2)

        threading.Thread(target=sample, daemon=True, name="worker-memory").start()


def pytest_terminal_summary(terminalreporter, config):
    """The run's peak resident memory, so its growth is seen when it happens (printed before pytest's
    closing line). Under `-n N`: each worker's peak, and their sum (a bound on the machine's peak)."""
    own = _peak_mib()
    workers = config.stash.get(_WORKER_PEAKS, [])
    if not workers:
        terminalreporter.write_sep("-", f"peak resident memory of the test process: {own:,.0f} MiB")
        return
    each = ", ".join(f"{w:,.0f}" for w in sorted(workers, reverse=True))
    together = config.stash.get(_TOGETHER, [0.0])[0]
    terminalreporter.write_sep("-", f"peak resident memory of the {len(workers)} test workers: {each} MiB; together (sampled) "
                                    f"{together:,.0f} MiB, and the controller {own:,.0f} MiB")


@pytest.fixture
def spread_bias(monkeypatch):
    """round_trip's reference with a spread correction bias in its routers (tests/roundtrip.py's with_bias)."""
    from . import roundtrip

    monkeypatch.setattr(roundtrip, "hf", roundtrip.with_bias)


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the test modules and their tables: about a
    million objects) lives until the end; `gc.freeze` takes it out of the cyclic collector's sweeps.
    Every full collection, the interpreter's own and `_release_between_modules`'s, otherwise walks
    all of it: half a second each, 15 to 30 s of the fast tier."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def _release_between_modules():
    """What a test file built is let go when it ends: dynamo's compiled frames and guards (they hold
    the modules they were compiled for) and whatever only a cycle still references. Without it the
    test process grows with every file that compiles or builds models."""
    yield
    import gc
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    gc.collect()
    gc.freeze()  # what outlives a file's collection (modules it imported, module-level tables) lives on: out of later sweeps
