"""A contributor's test (issue 36): a new turbine kind goes in by touching its node, its kinds
record, its option rows, its emitter and its diagram fill, and nothing else; docs/ir.md's
"Adding a kind" lists exactly these. Each case copies the package into a temporary folder,
writes the entries there as a contributor writes them into the source (`ENTRIES`), and runs
a fresh interpreter on that copy: with every entry, a spec using the kind parses, builds,
runs and draws; without any one of them, the module holding that table refuses to import,
naming the kind and the table.

The kind, `turbine squash`: y = act(W x + b) at each position, act tanh or sigmoid. Its options
map one to one onto its node's fields, so it needs no reader: the resolver reads them through
their rows (`Options.read`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

NODE = '''

class Squash(Node):
    """The contributor's test kind: y = act(W x + b) at each position."""

    op: Literal["squash"] = "squash"
    width: Count
    act: Literal["tanh", "sigmoid"]
    bias: bool


__all__.append("Squash")

'''

RECORD = '''
OPS = (*OPS, Kind(ir.Squash, "squash", "squash", "reactor", "squash plate", "squash", "squash plate: squeezes each position",
                  out_proj=True, params=lambda x, w: x.width * x.width + (x.width if x.bias else 0),
                  flops=lambda x, n, w=0: (2 * x.width * x.width, 0), activations=lambda x, n=0: (x.width, 0), shrink=_shrink_width))

'''

ROWS = '''

TABLE["turbine squash"] = (
    Opt("act", "choice", "the squashing function", "", default="tanh", choices=_choices(irn.Squash, "act")),
    Opt("bias", "bool", "a bias on the projection", "", default=False),
)
'''

EMITTER = '''"""The contributor's test kind (`turbine squash`): its variant and its emitter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from .ops import OpEmitter, call_args
from .writer import num


@dataclass(frozen=True)
class SquashVariant:
    kind: ClassVar[type] = ir.Squash
    base: ClassVar[str] = "Squash"
    act: str

    @classmethod
    def of(cls, op, causal):
        return cls(op.act)

    @property
    def inputs(self):
        return ()


class SquashEmitter(OpEmitter):
    variant = SquashVariant

    def sizes(self, op, c, scope):
        return {"width": c.width(op.width, scope)}

    def ctor(self, o):
        return f"{o.cls}({call_args(str(o.args['width']), bias=num(o.op.bias))})"

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.proj.weight.mul_({beta})"]

    def class_text(self, out, name, v, plan):
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            w('"""act(W x + b) at each position."""')
            w()
            with out.constructor("width", "bias"):
                w("self.proj = nn.Linear(width, width, bias=bias)")
            w()
            w("def forward(self, x):")
            with out.indent():
                w(f"return torch.{v.act}(self.proj(x))")
'''

EMITTER_LINE = '''from .squash import SquashEmitter  # noqa: E402

EMITTERS[ir.Squash] = SquashEmitter()
'''

FILL = '''KIND_FILL["squash"] = "squash"
'''
COLOURS = '''THEMES["light"]["squash"] = "#f3e6c8"
THEMES["dark"]["squash"] = "#4d3b17"
'''

# (file, anchor, text): the text goes in before the anchor's line (None: at the end of the file)
ENTRIES = {
    "node": ("ir/turbines.py", r"^TURBINE_TYPES = \(", NODE),
    "record": ("ir/kinds.py", r"^MERGES: tuple\[Kind, \.\.\.\] = \(", RECORD),
    "rows": ("semantics/options.py", None, ROWS),
    "emitter": ("backends/torch/emitters.py", r"^registered\(EMITTERS", EMITTER_LINE),
    "fill": ("backends/graphviz/style.py", r"^registered\(lambda cls: KINDS\[cls\]\.attr in KIND_FILL", FILL),
    "colours": ("backends/graphviz/style.py", r"^registered\(lambda cls: KINDS\[cls\]\.attr in KIND_FILL", COLOURS),
}


def _insert(path: Path, anchor: str | None, text: str) -> None:
    src = path.read_text("utf-8")
    if anchor is None:
        path.write_text(src + text, "utf-8")
        return
    m = re.search(anchor, src, re.M)
    assert m is not None, f"{path}: no line matching {anchor!r} to write the entry before"
    path.write_text(src[:m.start()] + text + src[m.start():], "utf-8")


def contributed(tmp: Path, leave_out: str = "", cut: str = "") -> Path:
    """A copy of the package with the kind's entries written in, but the entry `leave_out` ("types":
    the node's name in TURBINE_TYPES, the tuple every IR union is built from) and the piece `cut`."""
    shutil.copytree(ROOT / "cyclelang", tmp / "cyclelang", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "grammar", tmp / "grammar")  # the parser's tables are checked against it
    pkg = tmp / "cyclelang"
    assert not cut or any(cut in text for _, _, text in ENTRIES.values())
    for name, (file, anchor, text) in ENTRIES.items():
        if name != leave_out:
            _insert(pkg / file, anchor, text.replace(cut, "") if cut else text)
    if leave_out != "types":
        turbines = pkg / "ir" / "turbines.py"
        src, n = re.subn(r"^(TURBINE_TYPES = \(.*?)\)$", r"\1, Squash)", turbines.read_text("utf-8"), count=1, flags=re.M | re.S)
        assert n == 1
        turbines.write_text(src, "utf-8")
    (pkg / "backends" / "torch" / "squash.py").write_text(EMITTER, "utf-8")
    return tmp


def run(tmp: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp)})


IMPORTS = """
try:
    import cyclelang, cyclelang.semantics.resolve, cyclelang.backends.torch.emitters, cyclelang.backends.graphviz.style
except Exception as e:
    if type(e).__name__ != "RegistryError":  # ir.kinds.RegistryError: the contributor's error, raised while importing
        raise
    print(e)
else:
    print("imported")
"""

LEFT_OUT = {  # what is left out (an entry, or a piece of one) -> the table the import names
    "types": ("types", "", "cyclelang/ir/turbines.py TURBINE_TYPES"),
    "record": ("record", "", "cyclelang/ir/kinds.py KINDS"),
    "shrink rule": ("", ", shrink=_shrink_width", "cyclelang/ir/kinds.py (its record's shrink rule)"),
    "rows": ("rows", "", "cyclelang/semantics/options.py TABLE (a row 'turbine squash')"),
    # a kind built from its rows alone has a row for each field its node needs (never a user's spec
    # failing in the IR's validation)
    "a field's row": ("", ROWS.splitlines()[3] + "\n",
                      "cyclelang/semantics/options.py TABLE (a row 'turbine squash' for each field of its node: act; or a rules hook, _Resolver.t_squash)"),
    "emitter": ("emitter", "", "cyclelang/backends/torch/emitters.py EMITTERS"),
    "fill": ("fill", "", "cyclelang/backends/graphviz/style.py KIND_FILL"),
    "colours": ("colours", "", "every theme of cyclelang/backends/graphviz/style.py THEMES"),
}


@pytest.mark.parametrize("case", list(LEFT_OUT))
def test_leaving_out_any_entry_fails_at_import_naming_the_kind_and_the_table(tmp_path, case):
    entry, cut, table = LEFT_OUT[case]
    out = run(contributed(tmp_path, leave_out=entry, cut=cut), IMPORTS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"internal error: kind Squash has no entry in {table}"


def test_with_every_entry_the_package_imports(tmp_path):
    out = run(contributed(tmp_path), IMPORTS)
    assert out.stdout.strip() == "imported", out.stderr


PIPELINE = r'''
import torch, cyclelang
from cyclelang.review import analyze

SPEC = """
engine squashed {
  chamber width=16
  throat causal
  feed tokens vocab=32 context=8 position=none
  stage block x 2 {
    prechamber mix { norm rmsnorm  turbine attention heads=2 rotary  merge cooling }
    prechamber squeeze { norm rmsnorm  turbine squash act=sigmoid bias  merge cooling }
  }
  norm rmsnorm
  nozzle head
}
"""
spec = cyclelang.parse(SPEC)
def found(x):
    if isinstance(x, dict):
        return ([x] if x.get("op") == "squash" else []) + [o for v in x.values() for o in found(v)]
    return [o for v in x for o in found(v)] if isinstance(x, list) else []
ops = found(spec.model_dump())
assert [{k: op[k] for k in ("op", "width", "act", "bias")} for op in ops] == [{"op": "squash", "width": 16, "act": "sigmoid", "bias": True}], ops

try:  # a misread option is the user's diagnostic, its choices the node's own Literal
    cyclelang.parse(SPEC.replace("act=sigmoid", "act=relu"))
except cyclelang.CycleError as e:
    print("diagnostic", [(d.code, d.message) for d in e.diagnostics])

model = cyclelang.build(spec, seed=0).double().eval()
g = torch.Generator().manual_seed(1)
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
squash = [m for m in model.modules() if type(m).__name__ == "Squash"]
seen = []
for m in squash:
    m.register_forward_hook(lambda m, a, y: seen.append((m, a[0], y)))
idx = torch.randint(0, 32, (2, 8), generator=g)
logits = model(idx)
logits = logits[0] if isinstance(logits, tuple) else logits
assert logits.shape == (2, 8, 32) and torch.isfinite(logits).all()
assert len(seen) == 2
for m, x, y in seen:  # the reference, from the equation: sigmoid(x W^T + b)
    ref = torch.sigmoid(x @ m.proj.weight.T + m.proj.bias)
    assert torch.equal(y, ref) or (y - ref).abs().max() < 1e-12
params = sum(p.numel() for p in model.parameters())
assert analyze(spec)["params"]["total"] == params, (analyze(spec)["params"]["total"], params)
print("params", params)
assert "class Squash(nn.Module):" in cyclelang.codegen(spec)
dot = cyclelang.draw(spec).source
from cyclelang.backends.graphviz.style import THEMES
assert "squash plate" in dot and THEMES["light"]["squash"] in dot
print("drawn")
'''


def test_a_new_kind_from_its_entries_alone_parses_builds_runs_and_draws(tmp_path):
    out = run(contributed(tmp_path), PIPELINE)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "diagnostic [('E0203', \"'act' must be one of tanh, sigmoid; found 'relu'\")]", lines
    assert lines[-1] == "drawn", lines
