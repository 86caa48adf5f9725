"""One-way imports, read from the source with `ast` (nothing is imported to check them).

The pipeline runs text -> syntax -> semantics -> IR -> review / back-ends / stand; the
façade (`cyclelang.api`, re-exported by `cyclelang/__init__.py`) and the command line
(`cyclelang.cli`) sit on top and import downward only. A module below them takes an
`ir.Spec` and never reaches back up for `to_spec` or a CLI helper.

Every import counts, module-level or inside a function: a lazy import is still a
dependency. A violation names the module, the line and what it imports.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import ROOT

PKG_DIR = ROOT / "cyclelang"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


FILES = {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}
PACKAGES = {_module_name(p) for p in PKG_DIR.rglob("__init__.py")}
MODULES = set(FILES)

# the tops: may import anything below them (the façade anything but the CLI)
TOP = {"cyclelang", "cyclelang.__main__", "cyclelang.api", "cyclelang.cli", "cyclelang.interop"}
FORBIDDEN_BELOW = ("cyclelang.api", "cyclelang.cli")

# What each layer may import from cyclelang besides itself. Where the table says a
# layer, any module inside it counts (`ir` covers `ir.nodes`, `ir.layout`, ...).
CORE = {"ir", "diagnostics", "codes", "io", "limits"}
ALLOWED: dict[str, set[str]] = {
    "ir": set(),
    "codes": {"ir"},  # the kinds tables, to list the known kinds in the explanations
    "io": set(),
    "diagnostics": {"ir"},  # Span
    "limits": {"ir", "diagnostics"},
    "syntax": {"ir", "diagnostics", "codes", "limits"},  # ir: Span only, in practice
    "semantics": {"syntax"} | CORE,
    "review": CORE,
    "backends.torch": CORE,
    "backends.graphviz": CORE,
    "stand": {"backends.torch"} | CORE,  # it fires IR: the façade and the CLI resolve paths
    "interop": {"semantics", "syntax", "backends.torch"} | CORE,  # a config's implied spec is parsed text; export builds on meta
    # the editor's and the browser's front ends: the whole torch-free pipeline, not the CLI
    "lsp": {"syntax", "semantics", "review"} | CORE,
    "serve": {"lsp", "syntax", "semantics", "review", "backends.graphviz", "backends.torch"} | CORE,
    "training": {"backends.torch", "stand", "review"} | CORE,  # it trains IR through the torch back-end, with the stand's spike rule and the reviewer's pipeline split
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    target: str  # the module imported from (resolved, absolute)
    name: str | None  # the name imported from it (`from target import name`), or None

    @property
    def resolved(self) -> str:
        """The module this import depends on: `target.name` when that is a module, else `target`."""
        if self.name is not None and f"{self.target}.{self.name}" in MODULES:
            return f"{self.target}.{self.name}"
        return self.target

    def __str__(self) -> str:
        what = f"import {self.target}" if self.name is None else f"from {self.target} import {self.name}"
        return f"{self.module}, line {self.line}: {what}"


def imports_of(module: str, typing: bool = True) -> list[Import]:
    """Every import of a cyclelang module in `module`'s source, relative ones resolved
    (`typing=False`: leaving out those under `if TYPE_CHECKING:`, which never run)."""
    tree = ast.parse(FILES[module].read_text("utf-8"), str(FILES[module]))
    package = module if module in PACKAGES else module.rpartition(".")[0]
    skip = set() if typing else {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and ast.unparse(b.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                                  for s in b.body for n in ast.walk(s)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [Import(module, node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "cyclelang"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "cyclelang":
                out += [Import(module, node.lineno, target, a.name) for a in node.names]
    return out


@functools.cache
def all_imports() -> list:
    """Every cyclelang import of the package, parsed once, when the first test asks (not at collection)."""
    return [imp for module in sorted(FILES) for imp in imports_of(module)]


def layer(module: str) -> str | None:
    """`ir`, `syntax`, `backends.torch`, ... for a module below the tops; None for a top."""
    if module in TOP or module.startswith("cyclelang.cli."):
        return None
    parts = module.split(".")[1:]
    return ".".join(parts[:2]) if parts[0] == "backends" and len(parts) > 1 else parts[0]


def facade_violation(imp: Import) -> str | None:
    """Why `imp` reaches the façade or the CLI, or None."""
    dep = imp.resolved
    if any(dep == f or dep.startswith(f + ".") for f in FORBIDDEN_BELOW):
        return f"{imp}: {dep} sits on top"
    if dep == "cyclelang":
        if imp.name is None:
            return f"{imp}: `import cyclelang` reaches the façade; import the module it needs"
        return f"{imp}: `{imp.name}` comes from the façade; use the layer that defines it"
    return None


def test_the_scan_sees_the_package():
    assert {"cyclelang.ir", "cyclelang.api", "cyclelang.cli", "cyclelang.backends.torch.codegen", "cyclelang.stand.run"} <= MODULES
    assert {layer(m) for m in MODULES} - {None} <= set(ALLOWED), "a new layer: say in ALLOWED what it may import"
    # a resolved relative import, both forms
    imps = {(i.target, i.name) for i in imports_of("cyclelang.cli.draw")}
    assert ("cyclelang.diagnostics", "CycleError") in imps and ("cyclelang.cli", "load_spec") in imps


def test_below_the_tops_nothing_imports_the_facade_or_the_cli():
    bad = [why for imp in all_imports() if layer(imp.module) is not None and (why := facade_violation(imp))]
    assert not bad, "upward imports:\n  " + "\n  ".join(bad)


def test_the_facade_does_not_import_the_cli():
    bad = [str(imp) for imp in all_imports() if imp.module == "cyclelang.api" and imp.resolved.split(".")[:2] == ["cyclelang", "cli"]]
    assert not bad, "\n".join(bad)


def layering_violation(imp: Import) -> str | None:
    """Why `imp` goes against ALLOWED, or None (the tops and the façade are the tests above)."""
    own, dep = layer(imp.module), imp.resolved
    if own is None or dep == "cyclelang":
        return None
    other = layer(dep)
    if other == own or other in ALLOWED[own]:
        return None
    return f"{imp}: {own} may import {', '.join(sorted(ALLOWED[own])) or 'nothing outside itself'}"


def test_layers_import_downward_only():
    bad = [why for imp in all_imports() if (why := layering_violation(imp))]
    assert not bad, "imports against the layering:\n  " + "\n  ".join(bad)


def test_ir_imports_nothing_outside_ir():
    bad = [str(i) for i in all_imports() if layer(i.module) == "ir" and i.resolved != "cyclelang.ir" and not i.resolved.startswith("cyclelang.ir.")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("imp", [
    Import("cyclelang.backends.torch.codegen", 1, "cyclelang", "to_spec"),
    Import("cyclelang.stand.run", 1, "cyclelang", None),
    Import("cyclelang.backends.graphviz", 1, "cyclelang.cli", "load_spec"),
    Import("cyclelang.review.rules", 1, "cyclelang.api", "draw"),
])
def test_a_facade_import_is_caught(imp):
    assert facade_violation(imp) is not None


def test_a_subpackage_from_the_package_is_not_the_facade():
    assert facade_violation(Import("cyclelang.review.walk", 1, "cyclelang", "ir")) is None


@pytest.mark.parametrize("imp, bad", [
    (Import("cyclelang.backends.graphviz.annotate", 1, "cyclelang.stand.result", "Firing"), True),
    (Import("cyclelang.backends.graphviz.cycle", 1, "cyclelang.backends.torch", "codegen"), True),
    (Import("cyclelang.ir.nodes", 1, "cyclelang", "diagnostics"), True),
    (Import("cyclelang.syntax.parser", 1, "cyclelang.semantics", "resolve"), True),
    (Import("cyclelang.review.rules", 1, "cyclelang.ir", "layout"), False),
    (Import("cyclelang.stand.measure", 1, "cyclelang.backends.torch.codegen", "lower"), False),
])
def test_the_layering_check(imp, bad):
    assert (layering_violation(imp) is not None) == bad


def test_importing_cyclelang_stays_cheap():
    """The façade imports back-ends inside its functions: `import cyclelang` loads none of them."""
    code = ("import sys, cyclelang\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'graphviz', 'click', 'safetensors')\n"
            "               or m.startswith(('cyclelang.backends', 'cyclelang.stand', 'cyclelang.cli', 'cyclelang.interop')))\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
