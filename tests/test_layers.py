"""The package's shape, read from the source with `ast` (nothing is imported): no import circle,
no upward import, no file over 800 lines.

The pipeline's data runs text -> syntax -> semantics -> IR -> review / back-ends / stand /
training / interop, with the façade (`api.py`) and the command line (`cli/`) on top. In
imports the IR is the floor: it is the vocabulary every stage speaks (`Span`, the nodes, the
kinds table), so the parser imports `ir.Span` and the resolver builds `ir` nodes, while `ir`
imports nothing of the package. The tiers below are that order; a module may import its own
package and any package of a lower tier, never a higher one nor a sibling of its own tier
(siblings stay independent: review never imports a back-end).

The import graph counts every import that runs, module-level or inside a function (a deferred
import that breaks a circle is still the circle); only `if TYPE_CHECKING:` imports are left out.
`tests/test_imports.py` holds each layer to the layers it may name (`ALLOWED`); here that table
is held to the tiers as well.
"""

from __future__ import annotations

import pytest

from .conftest import ROOT
from .test_imports import ALLOWED, FILES, Import, imports_of

MAX_LINES = 800
# Generated tables, written by a script and never read as prose: exempt from the line limit.
GENERATED = {"cyclelang/syntax/_tables.py", "cyclelang/interop/hf_fields.py"}
# interop/ is being split by family on another branch (families.py, load.py): its circle and its
# long files are that branch's. The lead removes this exemption when merging it.
PENDING = "cyclelang.interop"

# Lowest first. A key is a package under cyclelang/ (`backends.torch` and `backends.graphviz`
# count apart), a top-level module (`limits`, `api`), or `cyclelang` for the package's __init__.
TIERS: list[tuple[str, ...]] = [
    ("ir",),  # the nodes, the kinds table, layout and passes: imports nothing of the package
    ("diagnostics", "codes", "io"),  # CycleError and Span-carrying diagnostics; the code table; atomic file writes
    ("limits",),  # the size limits every entry point applies
    ("syntax",),
    ("semantics",),
    ("review", "backends.torch", "backends.graphviz"),  # each reads IR
    ("stand", "interop", "lsp"),  # stand fires torch models; interop builds on them; lsp runs the torch-free pipeline
    ("training", "serve"),  # training uses the stand's spike rule; serve the editor's analysis
    ("api",),  # the façade
    ("cli", "cyclelang"),  # the command line; the package's __init__ re-exports the façade
    ("__main__",),
]
TIER = {key: i for i, keys in enumerate(TIERS) for key in keys}


def key(module: str) -> str:
    """A module's package in TIERS: `cyclelang.backends.torch.plan` -> `backends.torch`."""
    parts = module.split(".")[1:]
    if not parts:
        return "cyclelang"
    return ".".join(parts[:2]) if parts[0] == "backends" and len(parts) > 1 else parts[0]


def upward(imp: Import) -> str | None:
    """Why `imp` goes up a tier or across to a sibling, or None."""
    own, dep = key(imp.module), key(imp.resolved)
    if own == dep or TIER[dep] < TIER[own]:
        return None
    where = "a sibling of its tier" if TIER[dep] == TIER[own] else "a higher tier"
    return f"{imp}: {own} (tier {TIER[own]}) imports {dep}, {where} (tier {TIER[dep]})"


def graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the cyclelang modules it imports (itself left out)."""
    return {m: {i.resolved for i in imports_of(m, typing=typing)} - {m} for m in FILES}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module, as a path
    `a -> b -> ... -> a` (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
            elif w not in g:
                continue
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(g[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return [_circle(g, comp) for comp in comps]


def _circle(g: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start, inside = comp[0], set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle in {comp}")


def test_every_package_has_a_tier():
    assert {key(m) for m in FILES} <= set(TIER), "a new package: give it a tier in TIERS"


def test_no_import_circle():
    found = [c for c in cycles(graph()) if not all(m.startswith(PENDING + ".") or m == PENDING for m in c)]
    assert not found, "import circles:\n  " + "\n  ".join(" -> ".join(c) for c in found)


def test_no_upward_import():
    bad = [why for m in FILES for imp in imports_of(m) if (why := upward(imp))]
    assert not bad, "upward imports:\n  " + "\n  ".join(bad)


def test_the_allowed_table_goes_downward():
    """test_imports.ALLOWED names, per layer, the layers it may import: each one lower."""
    bad = [f"{own} may import {dep}" for own, deps in ALLOWED.items() for dep in deps if TIER[dep] >= TIER[own]]
    assert not bad, bad


def test_no_file_over_the_line_limit():
    long = {}
    for path in sorted((ROOT / "cyclelang").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in GENERATED or rel.startswith(PENDING.replace(".", "/") + "/"):
            continue
        n = len(path.read_text("utf-8").splitlines())
        if n > MAX_LINES:
            long[rel] = n
    assert not long, f"files over {MAX_LINES} lines (split them by concern): {long}"


def test_the_generated_tables_exist():
    """The exemptions name real files (a renamed table would leave its exemption behind)."""
    assert all((ROOT / p).is_file() for p in GENERATED)


# --- the checks catch what they are meant to --------------------------------------------------


def test_a_circle_is_found_and_reported_as_a_path():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": set()}
    assert cycles(g) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module, target, bad", [
    ("cyclelang.syntax.parser", "cyclelang.semantics.resolve", True),  # up
    ("cyclelang.review.rules", "cyclelang.backends.torch.codegen", True),  # a sibling
    ("cyclelang.ir.nodes", "cyclelang.diagnostics", True),
    ("cyclelang.backends.torch.build", "cyclelang.cli", True),
    ("cyclelang.semantics.resolve", "cyclelang.ir.nodes", False),  # down
    ("cyclelang.training.loop", "cyclelang.stand.run", False),
    ("cyclelang.backends.torch.plan", "cyclelang.backends.torch.records", False),  # its own package
])
def test_the_tier_check(module, target, bad):
    assert (upward(Import(module, 1, target, None)) is not None) == bad
