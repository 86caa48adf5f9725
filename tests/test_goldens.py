"""The goldens, by intent: every construct of the language has a reviewed golden.

The library's goldens (tests/goldens/specs/: the IR, both diagrams, the model source and the check
report of each spec in specs/) cover the constructs the library uses; tests/goldens/constructs/
holds a small spec with those it does not, with its model source and diagram. The rule below reads
the IR's own tables, so a new kind or merge fails it until a golden shows it: a library spec of its
own (its goldens come with it) or a line in constructs.cycle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

import cyclelang
from cyclelang import ir

from .conftest import ROOT, SPECS

CONSTRUCTS = ROOT / "tests" / "goldens" / "constructs"
SPEC_GOLDENS = ROOT / "tests" / "goldens" / "specs"


def _walk(x):
    if isinstance(x, BaseModel):
        yield x
        for name in type(x).model_fields:
            yield from _walk(getattr(x, name))
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _walk(y)


def _golden_specs() -> list[Path]:
    """The specs whose model source and diagram are goldens."""
    library = [p for p in SPECS if (SPEC_GOLDENS / f"{p.stem}.model.py").exists() and (SPEC_GOLDENS / f"{p.stem}.cycle.dot").exists()]
    return library + sorted(CONSTRUCTS.glob("*.cycle"))


def _constructs():
    return [*ir.nodes.OP_TYPES, *ir.nodes.MERGE_TYPES, ir.nodes.Prechamber, ir.nodes.Fullflow, ir.nodes.Stage]


def test_every_construct_appears_in_a_golden():
    seen: set[type] = set()
    nested = False
    for path in _golden_specs():
        spec = cyclelang.load(path)
        for node in _walk(spec):
            seen.add(type(node))
            if isinstance(node, ir.nodes.Stage):
                nested = nested or any(isinstance(op, ir.nodes.Stage) for op in node.ops)
    missing = [c.__name__ for c in _constructs() if c not in seen]
    assert not missing, f"no golden shows {missing}: add a library spec (with its goldens) or a line to {CONSTRUCTS / 'constructs.cycle'}"
    assert nested, "no golden shows a stage nested in a stage"


@pytest.mark.parametrize("path", sorted(CONSTRUCTS.glob("*.cycle")), ids=lambda p: p.stem)
def test_constructs_model_source_golden(path, golden):
    from cyclelang.backends.torch.codegen import codegen

    golden.check(path.with_suffix(".model.py"), codegen(cyclelang.load(path)))


@pytest.mark.parametrize("path", sorted(CONSTRUCTS.glob("*.cycle")), ids=lambda p: p.stem)
def test_constructs_diagram_golden(path, golden):
    from cyclelang.backends.graphviz import to_dot

    golden.check(path.with_suffix(".cycle.dot"), to_dot(cyclelang.load(path), view="cycle"))
