"""A kind missing from a table that must list every kind is the contributor's error: the module holding
the table refuses to import, naming the kind and the table (never a user's diagnostic such as
"prechamber has no turbine"). Each case re-imports one module with an extra IR class in the IR's
unions, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT

FAKE = """
import importlib, typing
import cyclelang
from cyclelang.ir import nodes, kinds
class Blower(nodes.Node):
    op: typing.Literal["blower"] = "blower"
    width: int
nodes.OP_TYPES = nodes.OP_TYPES + (Blower,)
{extra}
cyclelang.ir.OP_TYPES = nodes.OP_TYPES  # the package's re-export, which the back-ends read
try:
    importlib.reload(importlib.import_module({module!r}))
except kinds.RegistryError as e:
    print(e)
else:
    print("imported")
"""
RECORD = """kinds.OPS = kinds.OPS + (kinds.Kind(Blower, "blower", "blower", "mixer", "blower", "blower", "blower", params=lambda x, w: 0),)
kinds.KINDS[Blower] = kinds.OPS[-1]
kinds.BY_KEYWORD["blower"] = kinds.OPS[-1]"""


@pytest.mark.parametrize("module, extra, table", [
    ("cyclelang.ir.kinds", "", "cyclelang/ir/kinds.py KINDS"),
    ("cyclelang.backends.torch.emitters", RECORD, "cyclelang/backends/torch/emitters.py EMITTERS"),
    ("cyclelang.backends.graphviz.style", RECORD, "cyclelang/backends/graphviz/style.py KIND_FILL"),
    ("cyclelang.semantics.resolve", RECORD, "cyclelang/semantics/readers.py (its reader, _Resolver.t_blower)"),
])
def test_a_kind_missing_from_a_table_fails_at_import_naming_both(module, extra, table):
    code = FAKE.format(module=module, extra=extra)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"internal error: kind Blower has no entry in {table}"


def test_every_kind_is_registered_today():
    code = FAKE.format(module="cyclelang.backends.torch.emitters", extra="nodes.OP_TYPES = nodes.OP_TYPES[:-1]")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "imported", out.stderr
