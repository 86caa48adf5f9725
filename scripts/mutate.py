"""How many defects the suite catches: a seeded mutation run (docs/testing.md).

A mutant flips one operator or constant inside a function of the language's core
(`cyclelang/ir/`, `cyclelang/backends/torch/*.py`, `cyclelang/interop/` but its generated
field table): `+`<->`-`, `*`<->`/`, `<`<->`<=`, `==`<->`!=`, `in`<->`not in`, `and`<->`or`,
`not x` -> `x`, an int n -> n + 1, True<->False. The sample is fixed: every site of those
files in a deterministic order, `random.Random(seed).sample` of them. A mutant is killed when
a test fails with it; it is run against the tests that execute its line only.

  1. `collect`: the suite runs once under coverage.py with the test's node id as the coverage
     context (only the sampled files are traced), which gives line -> tests and each test's time.
  2. `run`: one parent process imports torch, cyclelang and the test modules once; each mutant is
     a fork of it that swaps the mutated function's code object in place (every function object
     sharing that code, closures made at import included) and runs its covering tests, fastest
     first, with `-x` and a time limit. A test failing, an error or a crash is a kill; a mutant
     whose tests all pass survives; one that runs out of time is counted apart (`timeout`).

    python scripts/mutate.py collect --root . -m "not slow"      # writes .mutate/coverage.json
    python scripts/mutate.py run --root . --sample 200 --seed 37 --limit 30 --workers 3  # .mutate/result.json
    python scripts/mutate.py restrict --coverage OLD.json --out NEW.json -m "not slow" FILES  # after cuts only

`--root` is the tree whose tests are measured (a checkout of another commit measures its suite
against this same sample, as long as the mutated files are the same).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny tensors: one thread each, whichever suite (tests/conftest.py)


def target_files(root: Path) -> list[Path]:
    files = sorted((root / "cyclelang" / "ir").glob("*.py"))
    files += sorted((root / "cyclelang" / "backends" / "torch").glob("*.py"))
    files += sorted(p for p in (root / "cyclelang" / "interop").glob("*.py") if p.name != "hf_fields.py")
    return [p for p in files if p.name != "__init__.py" or p.parent.name == "ir"]


# --- the mutation sites --------------------------------------------------------------------

BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
         ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr}
CMPOP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def _in_functions(tree: ast.Module):
    """The nodes inside function bodies (not decorators or defaults evaluated at import), in walk order."""
    out = []

    def visit(node, inside):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                visit(d, inside)
            for s in node.body:
                visit(s, True)
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        if inside:
            out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return out


def _mutations(node) -> list[tuple[str, object]]:
    """(description, apply) pairs for one node; apply(node) mutates it in place."""
    muts = []
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINOP:
        new = BINOP[type(node.op)]
        muts.append((f"{type(node.op).__name__}->{new.__name__}", lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in CMPOP:
                new = CMPOP[type(op)]
                muts.append((f"{type(op).__name__}->{new.__name__}", lambda n, i=i, new=new: n.ops.__setitem__(i, new())))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        muts.append((f"{type(node.op).__name__}->{new.__name__}", lambda n, new=new: setattr(n, "op", new())))
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        muts.append((f"{node.value}->{not node.value}", lambda n: setattr(n, "value", not n.value)))
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        muts.append((f"{node.value}->{node.value + 1}", lambda n: setattr(n, "value", n.value + 1)))
    return muts


def _not_removals(tree) -> list:
    return [n for n in _in_functions(tree) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)]


def sites(root: Path) -> list[dict]:
    """Every mutation site of the target files, in a fixed order: file, node index, mutation."""
    out = []
    for path in target_files(root):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text("utf-8"))
        nodes = _in_functions(tree)
        for k, node in enumerate(nodes):
            for j, (desc, _) in enumerate(_mutations(node)):
                out.append({"file": rel, "node": k, "mut": j, "line": node.lineno, "desc": desc})
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                out.append({"file": rel, "node": k, "mut": "drop-not", "line": node.lineno, "desc": "not x->x"})
    return out


def sample(root: Path, n: int, seed: int) -> list[dict]:
    every = sites(root)
    return sorted(random.Random(seed).sample(every, min(n, len(every))), key=lambda s: (s["file"], s["node"], str(s["mut"])))


def mutated_code(root: Path, site: dict):
    """The module's code object with the one mutation applied (line numbers unchanged)."""
    path = root / site["file"]
    tree = ast.parse(path.read_text("utf-8"))
    nodes = _in_functions(tree)
    node = nodes[site["node"]]
    if site["mut"] == "drop-not":
        parent = next(p for p in ast.walk(tree) for f, v in ast.iter_fields(p)
                      if v is node or (isinstance(v, list) and any(x is node for x in v)))
        for f, v in ast.iter_fields(parent):
            if v is node:
                setattr(parent, f, node.operand)
            elif isinstance(v, list):
                v[:] = [node.operand if x is node else x for x in v]
    else:
        _mutations(node)[site["mut"]][1](node)
    ast.fix_missing_locations(tree)
    return compile(tree, str(path), "exec")


def _codes(code, out=None):
    out = {} if out is None else out
    out[(code.co_qualname, code.co_firstlineno)] = code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            _codes(c, out)
    return out


def apply(root: Path, site: dict) -> int:
    """Swap in the mutated code of every live function of the file whose code changed; the count swapped."""
    import gc
    import types

    path = str((root / site["file"]).resolve())
    original = _codes(compile(Path(path).read_text("utf-8"), path, "exec"))
    new = _codes(mutated_code(root, site))
    changed = {k for k in new if k in original and new[k] != original[k]}
    n = 0
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and obj.__code__.co_filename == path:
            key = (obj.__code__.co_qualname, obj.__code__.co_firstlineno)
            if key in changed:
                obj.__code__ = new[key]
                n += 1
    return n


# --- coverage: line -> tests -----------------------------------------------------------------


def collect(root: Path, out: Path, pytest_args: list[str], base: Path | None = None) -> None:
    """Run the suite once under coverage.py, the node id as the context; write line -> tests and times.
    With `base` (an earlier collection of the same tier) only the test files given are run: their
    tests replace theirs in `base`, and every other file's tests keep the lines they covered there
    (a test file that did not change covers what it covered)."""
    import coverage

    files = [str(p.resolve()) for p in target_files(root)]
    cov = coverage.Coverage(data_file=str(out.with_suffix(".sqlite")), include=files, branch=False)
    durations: dict[str, float] = {}

    class Contexts:
        import pytest

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            cov.switch_context(item.nodeid)
            t = time.perf_counter()
            yield
            durations[item.nodeid] = time.perf_counter() - t
            cov.switch_context("")

    os.chdir(root)
    sys.path.insert(0, str(root))
    cov.start()
    import pytest

    rc = pytest.main(["-q", "-p", "no:cacheprovider", *pytest_args], plugins=[Contexts()])
    cov.stop()
    cov.save()
    data = cov.get_data()
    lines: dict[str, dict[str, list[str]]] = {}
    for f in data.measured_files():
        rel = Path(f).resolve().relative_to(root.resolve()).as_posix()
        lines[rel] = {str(ln): sorted(c for c in ctx if c) for ln, ctx in data.contexts_by_lineno(f).items()}
    if base is not None:
        old = json.loads(base.read_text("utf-8"))
        rerun = {t.split("::")[0] for t in durations} | {a.split("::")[0] for a in pytest_args if a.endswith(".py")}
        kept = lambda t: t.split("::")[0] not in rerun  # noqa: E731
        durations = {**{t: d for t, d in old["durations"].items() if kept(t)}, **durations}
        for f, by_line in old["lines"].items():
            mine = lines.setdefault(f, {})
            for ln, tests in by_line.items():
                mine[ln] = sorted(set(mine.get(ln, [])) | {t for t in tests if kept(t)})
    out.write_text(json.dumps({"pytest_args": pytest_args, "rc": int(rc), "durations": durations, "lines": lines}), "utf-8")
    print(f"coverage of {len(durations)} tests written to {out}")


def restrict(root: Path, cov_file: Path, out: Path, pytest_args: list[str]) -> None:
    """An earlier collection cut down to the tests `pytest_args` collect in `root` now: the coverage of a
    suite whose tests were only dropped, merged away or marked slow (a kept test runs what it ran), without
    running it again under coverage."""
    import pytest

    ids: set[str] = set()

    class Ids:
        def pytest_collection_finish(self, session):
            ids.update(item.nodeid for item in session.items)

    os.chdir(root)
    sys.path.insert(0, str(root))
    rc = pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider", *pytest_args], plugins=[Ids()])
    assert rc == 0, f"collection failed ({rc})"
    cov = json.loads(cov_file.read_text("utf-8"))
    lines = {f: {ln: [t for t in tests if t in ids] for ln, tests in by_line.items()} for f, by_line in cov["lines"].items()}
    durations = {t: d for t, d in cov["durations"].items() if t in ids}
    out.write_text(json.dumps({"pytest_args": pytest_args, "rc": cov["rc"], "durations": durations, "lines": lines,
                               "restricted_from": str(cov_file)}), "utf-8")
    print(f"{len(durations)} of {len(cov['durations'])} tests kept; {len(ids - set(cov['durations']))} collected now were not in {cov_file}")


# --- the run ---------------------------------------------------------------------------------


def _prepare(root: Path) -> None:
    """Import what the tests import once, in the parent every mutant is forked from."""
    os.chdir(root)
    sys.path.insert(0, str(root))
    import importlib

    for p in target_files(root):
        mod = ".".join(p.relative_to(root).with_suffix("").parts)
        importlib.import_module(mod.removesuffix(".__init__"))
    importlib.import_module("pytest")
    for p in sorted((root / "tests").glob("test_*.py")):
        try:
            importlib.import_module(f"tests.{p.stem}")
        except BaseException:  # a module that skips or fails at import is imported by pytest in the child
            pass


def _start(root: Path, site: dict, tests: list[str]) -> int:
    """Fork the mutant: swap its code in, run its tests (`-x`), exit with pytest's status."""
    pid = os.fork()
    if pid == 0:  # the mutant
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1), os.dup2(fd, 2)
            if apply(root, site) == 0:
                os._exit(70)
            import pytest

            rc = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", *tests])
            os._exit(int(rc))
        except BaseException:
            os._exit(71)
    return pid


def _verdict(status: int) -> str:
    rc = os.waitstatus_to_exitcode(status)
    return "not-applied" if rc == 70 else "survived" if rc == 0 else "killed"


def run(root: Path, cov_file: Path, n: int, seed: int, limit: float, out: Path, workers: int = 1, retry: Path | None = None,
        differing: Path | None = None) -> None:
    """Run the sample; with `retry` (an earlier result), run again only the mutants that ran out of
    time there, with this `limit`, and keep the other verdicts. With `differing` (another suite's
    collection), run only the mutants whose covering tests differ between the two: the others run the
    same tests on the same code in both suites, so their verdict is the same (`same-tests`)."""
    cov = json.loads(cov_file.read_text("utf-8"))
    durations, lines = cov["durations"], cov["lines"]
    chosen = sample(HERE, n, seed)  # the sample is drawn from this checkout's sources
    _prepare(root)
    results: list[dict] = [{} for _ in chosen]
    t0 = time.perf_counter()
    todo = list(enumerate(chosen))
    if retry is not None:
        before = json.loads(retry.read_text("utf-8"))["mutants"]
        assert [(m["file"], m["node"], m["mut"]) for m in before] == [(m["file"], m["node"], m["mut"]) for m in chosen], "another sample"
        results = [m if m["verdict"] != "timeout" else {} for m in before]
        todo = [(i, site) for i, site in todo if not results[i]]
    if differing is not None:
        other = json.loads(differing.read_text("utf-8"))["lines"]
        covering = lambda ls, site: sorted(ls.get(site["file"], {}).get(str(site["line"]), []))  # noqa: E731
        for i, site in list(todo):
            if covering(lines, site) == covering(other, site):
                results[i] = {**site, "tests": len(covering(lines, site)), "verdict": "same-tests", "seconds": 0.0}
        todo = [(i, site) for i, site in todo if not results[i]]
    running: dict[int, tuple[int, float, list[str]]] = {}  # pid -> (index, start, tests)

    def done(i, verdict, took, tests):
        site = chosen[i]
        results[i] = {**site, "tests": len(tests), "verdict": verdict, "seconds": round(took, 2)}
        print(f"[{sum(1 for r in results if r)}/{len(chosen)} {time.perf_counter() - t0:6.0f}s] {site['file']}:{site['line']} "
              f"{site['desc']}: {verdict} ({len(tests)} tests, {took:.1f}s)", flush=True)

    while todo or running:
        while todo and len(running) < workers:
            i, site = todo.pop(0)
            tests = sorted(lines.get(site["file"], {}).get(str(site["line"]), []), key=lambda t: (durations.get(t, 0.0), t))
            if not tests:
                done(i, "uncovered", 0.0, tests)
                continue
            running[_start(root, site, tests)] = (i, time.perf_counter(), tests)
        for pid, (i, started, tests) in list(running.items()):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                del running[pid]
                done(i, _verdict(status), time.perf_counter() - started, tests)
            elif time.perf_counter() - started > limit:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
                done(i, "timeout", time.perf_counter() - started, tests)
        time.sleep(0.05)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    summary = {"root": str(root), "sample": len(results), "seed": seed, "limit_s": limit, "pytest_args": cov["pytest_args"],
               "counts": counts, "kill_rate": round(counts.get("killed", 0) / len(results), 4),
               "seconds": round(time.perf_counter() - t0)}
    out.write_text(json.dumps({"summary": summary, "mutants": results}, indent=1), "utf-8")
    print(json.dumps(summary))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="run the suite under coverage: line -> tests")
    c.add_argument("--root", type=Path, default=HERE)
    c.add_argument("--out", type=Path, default=None)
    c.add_argument("-m", dest="marker", default=None, help='a marker expression for the suite (e.g. "not slow")')
    c.add_argument("paths", nargs="*", help="test files or node ids (default: the whole suite)")
    c.add_argument("--base", type=Path, default=None, help="an earlier collection: rerun only the files given, keep the rest")
    r = sub.add_parser("run", help="run the seeded sample of mutants")
    r.add_argument("--root", type=Path, default=HERE)
    r.add_argument("--coverage", type=Path, default=None)
    r.add_argument("--sample", type=int, default=200)
    r.add_argument("--seed", type=int, default=37)
    r.add_argument("--limit", type=float, default=30.0, help="seconds per mutant")
    r.add_argument("--out", type=Path, default=None)
    r.add_argument("--workers", type=int, default=1, help="mutants run at once")
    r.add_argument("--retry", type=Path, default=None, help="an earlier result: rerun its timeouts only (with --limit)")
    r.add_argument("--only-differing", type=Path, default=None, dest="differing",
                   help="another suite's collection: run only the mutants whose covering tests differ from it")
    k = sub.add_parser("restrict", help="an earlier collection cut down to the tests collected now")
    k.add_argument("--root", type=Path, default=HERE)
    k.add_argument("--coverage", type=Path, required=True)
    k.add_argument("--out", type=Path, required=True)
    k.add_argument("-m", dest="marker", default=None)
    k.add_argument("paths", nargs="*")
    s = sub.add_parser("sites", help="print the sample")
    s.add_argument("--sample", type=int, default=200)
    s.add_argument("--seed", type=int, default=37)
    a = ap.parse_args(argv)
    if a.cmd == "sites":
        every = sites(HERE)
        print(f"{len(every)} sites")
        for site in sample(HERE, a.sample, a.seed):
            print(f"{site['file']}:{site['line']} {site['desc']}")
        return
    root = a.root.resolve()
    work = root / ".mutate"
    work.mkdir(exist_ok=True)
    if a.cmd == "restrict":
        restrict(root, a.coverage.resolve(), a.out.resolve(), (["-m", a.marker] if a.marker else []) + a.paths)
    elif a.cmd == "collect":
        collect(root, (a.out or work / "coverage.json").resolve(), (["-m", a.marker] if a.marker else []) + a.paths, a.base)
    else:
        run(root, (a.coverage or work / "coverage.json").resolve(), a.sample, a.seed, a.limit, (a.out or work / "result.json").resolve(), a.workers, a.retry, a.differing)


if __name__ == "__main__":
    main()
