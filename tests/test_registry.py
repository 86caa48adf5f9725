"""A kind missing from a table that must list every kind is the contributor's error: the module holding
the table refuses to import, naming the kind and the table (never a user's diagnostic such as
"prechamber has no turbine"). Each case re-imports one module with an extra IR class in the IR's
unions, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Annotated, Literal, Union, get_args, get_origin

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
    ("cyclelang.semantics.resolve", RECORD, "cyclelang/semantics/options.py TABLE (a row 'turbine blower')"),
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


# --- a kind's option rows and its node's fields: two declarations held to each other --------------


def _plain(annotation):
    """A field's type with Annotated and Optional taken off (a Literal stays one)."""
    args = get_args(annotation)
    if get_origin(annotation) is Annotated:
        return _plain(args[0])
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return _plain(rest[0]) if len(rest) == 1 else annotation
    return annotation


def test_every_row_of_a_turbine_names_a_field_of_its_node_or_is_its_hooks():
    """`Options.read` fills a node's fields from the rows that name them: each row of a turbine kind
    names a field of a node of that keyword (`Opt.field`, else its name) of the row's type, a choice
    row offering exactly the field's Literal, or says that the kind's rules hook reads it (`Opt.hook`),
    and then that hook exists. A kind built from its rows alone has a row for each field its node needs."""
    from cyclelang.ir import kinds
    from cyclelang.semantics.options import TABLE
    from cyclelang.semantics.resolve import _Resolver

    python = {"int": int, "float": float, "bool": bool}
    tied = 0
    for kw in kinds.BY_KEYWORD:
        classes = [k.cls for k in kinds.OPS if k.keyword == kw]
        ops = {c.model_fields["op"].default: c for c in classes}
        hooked = hasattr(_Resolver, f"t_{kw}")
        for row in TABLE[f"turbine {kw}"]:
            where = f"turbine {kw} {row.name}"
            assert row.context in ("", "width", "throat"), where
            assert set(row.only) <= set(ops), where
            if row.hook:
                assert hooked and not row.field, f"{where}: read by a hook, but turbine {kw} has none (_Resolver.t_{kw})"
                continue
            field = row.field or row.name
            filled = [c for op, c in ops.items() if field in c.model_fields and (not row.only or op in row.only)]
            assert filled, f"{where}: names no field of {[c.__name__ for c in classes]}"
            for cls in filled:
                t = _plain(cls.model_fields[field].annotation)
                if row.type == "choice":
                    assert get_origin(t) is Literal and set(get_args(t)) == set(row.choices), f"{where}: {row.choices} against {cls.__name__}.{field}: {t}"
                else:
                    assert t is python[row.type], f"{where}: a {row.type} row for {cls.__name__}.{field}: {t}"
                tied += 1
        if not hooked:
            named = {r.field or r.name for r in TABLE[f"turbine {kw}"]}
            needed = {f for f, info in classes[0].model_fields.items() if info.is_required()} - {"width", "causal"}
            assert needed <= named, (kw, needed - named)
    assert tied > 100


# a rule that fails early (a missing heads=, ratio= beside hidden=, alibi_scaled without alibi)
EARLY = {"attention": "alibi_scaled", "mlp": "ratio=2 hidden=8"}


def test_every_option_of_a_kind_is_read_whatever_rule_refuses_it_first():
    """A kind's rows are read before any of its rules refuses the op, so an option it takes is never
    called unknown because another option broke a rule (once "unknown option 'router' for turbine
    moe", when experts= was missing)."""
    from cyclelang import CycleError, parse
    from cyclelang.ir import kinds
    from cyclelang.semantics.options import TABLE

    engine = "engine e {{\n  chamber width=64\n  throat causal\n  feed tokens vocab=64 context=16\n  stage s {{ prechamber p {{ {} }} }}\n  nozzle head\n}}\n"
    checked = 0
    for kw, rec in kinds.BY_KEYWORD.items():
        early = EARLY.get(kw, "")
        for row in TABLE[f"turbine {kw}"]:
            if not (row.hook or (row.field or row.name) in rec.cls.model_fields and not row.only) or row.name in {t.split("=")[0] for t in early.split()}:
                continue  # a row of another kind of the keyword (latent attention's, Mamba-1's), or one the rule writes
            try:
                parse(engine.format(f"turbine {kw} {early} {row.name}=nowhere"))
            except CycleError as e:
                messages = [d.message for d in e.diagnostics]
            else:
                raise AssertionError(f"turbine {kw} {early} {row.name}=nowhere: no error")
            assert any("'nowhere'" in m for m in messages), (kw, row.name, messages)  # its value was read, and refused
            assert not any("unknown option" in m or "unknown statement" in m for m in messages), (kw, row.name, messages)
            checked += 1
    assert checked > 80
