"""The README's test command works on a fresh machine: what a test imports, the repo installs.

The defect: tests/test_notebook.py needed IPython, which neither `.ci/run` nor any extra
installed; CI passed only because the machine's system Python had it. `.ci/run` now runs the
suite in a virtual environment it creates without the system's site packages, and this test
checks, from the source alone, that every third-party package a test imports is named by an
extra in pyproject.toml or a pip line in `.ci/run`.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib

from .conftest import ROOT

# import name -> distribution name, where they differ
_DIST = {"IPython": "ipython", "yaml": "pyyaml", "lark": "lark", "safetensors": "safetensors", "PIL": "pillow", "mup": "mup"}


def _norm(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _installed_by_repo() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_norm(r) for r in project["dependencies"]}
    names |= {_norm(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        if re.match(r"\s*(pip_install|.*pip install)\b", line) and not line.lstrip().startswith("#"):
            names |= {_norm(t) for t in line.split()[1:] if not t.startswith(("-", "'", '"', "$")) and "install" not in t}
    return names | {"torch"}  # torch: .ci/run's first pip line, pinned (`torch==2.13.0`)


def _imported_by_tests() -> dict[str, str]:
    """top-level module -> a test file that imports it (import statements, and the names given to need, require
    and pytest's import-or-skip)."""
    own = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"cyclelang", "tests", "conftest"}
    out: dict[str, str] = {}
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn in ("need", "require", "importorskip", "import_module"):
                    names = [node.args[0].value]
            for name in names:
                top = name.split(".")[0]
                if top and top not in sys.stdlib_module_names and top not in own and not top.startswith("_"):
                    out.setdefault(top, path.name)
    return out


def _here(top: str) -> bool:
    """Installed in this environment, and not one of the repo's own scripts (scripts/, examples/, benchmarks/)."""
    import importlib.util

    local = any((ROOT / d / f"{top}.py").exists() or (ROOT / d / top / "__init__.py").exists() for d in ("scripts", "examples", "benchmarks"))
    try:
        return not local and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def test_every_package_a_test_imports_is_installed_by_the_repo():
    """A package installed here by hand hides from a green run what a fresh machine lacks; one installed nowhere
    fails loudly on every machine (and the hardening tests import made-up names on purpose), so it is left out."""
    installed = _installed_by_repo()
    missing = {top: f for top, f in _imported_by_tests().items()
               if _here(top) and _DIST.get(top, top).lower().replace("_", "-") not in installed}
    assert not missing, f"imported by tests but installed by no extra and no .ci/run line: {missing}"


def test_ci_runs_the_suite_in_a_venv_of_its_own():
    script = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"python3 -m venv \"\$venv\"", script) and "--system-site-packages" not in script
    assert '"$py" -m pytest' in script  # the suite runs with the venv's interpreter, not the system's
