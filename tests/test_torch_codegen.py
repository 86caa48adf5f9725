"""The torch back-end's structure: its emitter tables, the plan's names, what `lower` returns,
the IR-only entry points, the import decision, the summaries and `build_source`.

The numerics of the generated code are `test_torch_backend.py`'s; this file holds the
lowering to its contracts: a table entry per IR kind, every attribute from `ir.layout`,
a name map that points into the file, and one lowering that both writes and builds.
"""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.backends.torch.codegen import Lowered, codegen, lower
from cyclelang.backends.torch.emitters import EMITTERS, emitter_for
from cyclelang.backends.torch.merges import MERGE_EMITTERS, merge_emitter_for
from cyclelang.backends.torch.plan import AttentionVariant, MlpVariant, MoeVariant, OpPlan, make_plan

from .conftest import ROOT, SPECS, need
from .test_torch_backend import HOSTILE, KITCHEN_SINK

SINKS = {
    "sink_causal": KITCHEN_SINK.replace("THROAT", "causal"),
    "sink_open": KITCHEN_SINK.replace("THROAT", "open"),
    # a cosine schedule, learned positions and no MoE capacity: math from the schedule alone
    "sink_cosine": KITCHEN_SINK.replace("THROAT", "open").replace("position=sinusoidal", "position=learned")
    .replace("schedule linear", "schedule cosine").replace(" capacity=1.0", ""),
    # no sinusoids, no capacity, no ssm (its dt init), no cooling (Config's std formula), a linear
    # schedule: nothing reads math
    "sink_plain": KITCHEN_SINK.replace("THROAT", "causal").replace("position=sinusoidal", "position=none").replace(" capacity=1.0", "")
    .replace("turbine ssm heads=4 state=4 groups=2 chunk=4", "turbine mlp").replace("merge cooling", "merge plain"),
    "hostile": HOSTILE,
}


def all_specs() -> list[tuple[str, ir.Spec]]:
    out = [(p.stem, cyclelang.load(p)) for p in SPECS]
    return out + [(k, cyclelang.parse(t)) for k, t in SINKS.items()]


SPEC_CASES = all_specs()
IDS = [k for k, _ in SPEC_CASES]
# the same cases, the library's specs halved in the fast tier (every other one; the kitchen sinks always)
ROTATED_CASES = [c if i % 2 == 0 or i >= len(SPECS) else pytest.param(*c, marks=pytest.mark.slow) for i, c in enumerate(SPEC_CASES)]


# --- one emitter per kind ---------------------------------------------------------------------


def test_every_op_kind_has_an_emitter():
    missing = [cls.__name__ for cls in ir.OP_TYPES if cls not in EMITTERS]
    assert not missing, f"no torch emitter for {', '.join(missing)}: add one to cyclelang/backends/torch/emitters.py"


def test_every_merge_kind_has_an_emitter():
    missing = [cls.__name__ for cls in ir.MERGE_TYPES if cls not in MERGE_EMITTERS]
    assert not missing, f"no torch merge emitter for {', '.join(missing)}: add one to cyclelang/backends/torch/merges.py"


def test_the_tables_hold_nothing_else():
    assert set(EMITTERS) == set(ir.OP_TYPES) and set(MERGE_EMITTERS) == set(ir.MERGE_TYPES)


@pytest.mark.parametrize("lookup", [emitter_for, merge_emitter_for])
def test_a_missing_kind_fails_with_the_ir_class_name(lookup):
    class Thruster(ir.Node):
        pass

    with pytest.raises(NotImplementedError, match="no torch emitter for Thruster"):
        lookup(Thruster)


# --- the plan: names from the layout, variants as records -----------------------------------------


@pytest.mark.parametrize("name, spec", SPEC_CASES, ids=IDS)
def test_every_attribute_is_the_layouts(name, spec):
    plan = make_plan(spec)
    lay = ir.layout.layout(spec)
    paths = {p.path for p in lay.parts()}
    for o in plan.ops():
        assert o.path in paths and o.path.rsplit(".", 1)[-1] == o.attr, o.path
    for sp, sl in zip(plan.stages, lay.stages):
        assert sp.path == sl.path and sp.first == sl.first
        assert [b.attr for b in sp.branches()] == [b.attr for b in sl.branches()]
    main = [it.path for it in plan.main if isinstance(it, OpPlan)]
    assert main == [p.path for p in lay.main if isinstance(p, ir.layout.Part)]


def test_variants_are_frozen_hashable_records():
    a = AttentionVariant(mask="causal", window=False, rotary="full", qk_norm=False, gqa=True, dropout=False, causal=True)
    assert a == AttentionVariant("causal", False, "full", False, True, False, True)
    assert {a: "Attention"}[dataclasses.replace(a)] == "Attention"
    assert a.inputs == ("rope", "cache", "mask")  # mask: a padded batch's key mask
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.window = True
    assert MoeVariant("swiglu", True, True, True).expert == MlpVariant("swiglu", False)


def test_variants_share_a_class_and_number_the_rest():
    plan = make_plan(cyclelang.parse(SINKS["sink_causal"]))
    names = list(plan.turbine_classes.values())
    assert len(names) == len(set(names)) and names[0] == "Attention"
    assert plan.turbine_classes[MlpVariant("geglu", False)].startswith("Mlp")  # the experts' class is planned too


# --- lower: source, source map, name map ----------------------------------------------------------


@pytest.mark.parametrize("name, spec", SPEC_CASES, ids=IDS)
def test_lower_names_the_class_of_every_part(name, spec):
    low = lower(spec)
    assert isinstance(low, Lowered) and low.source == codegen(spec)
    lay = ir.layout.layout(spec)
    owning = {p.path for p in lay.parts() if p.owns()}  # every part with parameters of its own
    assert owning - ({"head"} if spec.engine.nozzle.tied else set()) <= set(low.names)
    classes = set(re.findall(r"^class (\w+)\(", low.source, re.M))
    for path, cls in low.names.items():
        assert cls in classes or cls.startswith("nn."), (path, cls)
    assert all(0 < line <= low.source.count("\n") for line, _ in low.source_map)


def test_the_name_map_points_at_the_built_modules():
    torch = need("torch")
    from cyclelang.backends.torch.build import build

    spec = cyclelang.parse(SINKS["sink_causal"])
    names = lower(spec).names
    with torch.device("meta"):
        model = build(spec)
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    for path, cls in names.items():
        for inst in ir.layout.instances(path):
            got = modules.get(inst, params.get(inst))
            assert got is not None, inst
            expect = cls.removeprefix("nn.")
            assert type(got).__name__ == expect, (inst, type(got).__name__, cls)


# --- the back-end takes an ir.Spec ------------------------------------------------------------------


@pytest.mark.parametrize("fn", ["codegen", "lower", "build"])
def test_the_backend_refuses_paths_and_text(fn):
    import importlib

    mod = importlib.import_module("cyclelang.backends.torch.build" if fn == "build" else "cyclelang.backends.torch.codegen")
    for value in (str(ROOT / "specs" / "gpt2.cycle"), ROOT / "specs" / "gpt2.cycle", SINKS["sink_open"]):
        with pytest.raises(TypeError, match="takes an ir.Spec"):
            getattr(mod, fn)(value)


def test_a_spec_without_an_engine_is_E0213():
    lib = cyclelang.parse("stage blk { prechamber p { turbine mlp } }\n")
    with pytest.raises(cyclelang.CycleError, match="E0213"):
        codegen(lib)


def test_the_facade_still_takes_paths_and_text():
    path = ROOT / "specs" / "gpt2.cycle"
    assert cyclelang.codegen(str(path)) == cyclelang.codegen(path) == codegen(cyclelang.load(path))


# --- imports decided before emitting -----------------------------------------------------------------


@pytest.mark.parametrize("name, spec", SPEC_CASES, ids=IDS)
def test_math_is_imported_exactly_when_read(name, spec):
    src = codegen(spec)
    body = src.replace("import math\n", "", 1)
    assert ("import math\n" in src) == ("math." in body)
    compile(src, f"{name}.py", "exec")  # the full-size file compiles (test_torch_backend's copy of this check, merged here)


def test_each_reason_for_math_is_seen():
    reads = {k: "import math\n" in codegen(cyclelang.parse(t)) for k, t in SINKS.items() if k.startswith("sink")}
    assert reads == {"sink_causal": True, "sink_open": True, "sink_cosine": True, "sink_plain": False}


# --- summaries: roles from the kinds table, owners from the layout -------------------------------------


def test_role_doc_covers_the_roles_in_order():
    from cyclelang.backends.torch.build import ROLE_DOC

    labels = [ir.kinds.ROLE_WORDS[r][0] for r in ir.kinds.ROLES]
    positions = [ROLE_DOC.index(f"{label} (") for label in labels]
    assert positions == sorted(positions) and ROLE_DOC.startswith("Roles: ")


@pytest.mark.parametrize("name, spec", ROTATED_CASES, ids=IDS)
def test_every_parameter_has_a_role(name, spec):
    torch = need("torch")
    from cyclelang.backends.torch.build import build, param_summary, parameter_roles

    with torch.device("meta"):
        model = build(spec)
    roles = parameter_roles(spec, [n for n, _ in model.named_parameters()])
    assert {r for r, _ in roles.values()} <= set(ir.kinds.ROLES)
    info = param_summary(spec, model)
    assert sum(info["roles"].values()) == info["total"] == sum(p.numel() for p in model.parameters())
    assert set(info["stages"]) <= {st.name for st, _ in ir.leaf_stages(spec.engine.body)}  # a nested stage's parts: its own name


def test_summary_lists_roles_in_the_kinds_order():
    torch = need("torch")
    from cyclelang.backends.torch.build import build, summary_text

    spec = cyclelang.parse(SINKS["sink_causal"])
    with torch.device("meta"):
        text = summary_text(spec, build(spec))
    labels = [ln.split(":")[0].strip() for ln in text.splitlines()[2:] if not ln.strip().startswith("stage ")]
    order = [ir.kinds.ROLE_WORDS[r][0] for r in ir.kinds.ROLES]
    assert labels == [x for x in order if x in labels] and {"mixers", "reactors", "projections", "merges"} <= set(labels)
    assert "nozzle: 0 (tied to the feed)" not in text  # this tied head has a bias


# --- lower once -----------------------------------------------------------------------------------


def test_build_source_runs_the_text_it_is_given():
    torch = need("torch")
    import inspect

    from cyclelang.backends.torch.build import build, build_source

    spec = cyclelang.parse(SINKS["sink_open"])
    source = codegen(spec)
    a, b = build_source(spec, source, seed=4), build(spec, seed=4)
    assert inspect.getsource(sys.modules[type(a).__module__]) == source
    for (k, v), (_, w) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(v, w), k


# --- dynamic NTK rotary over 2 dims (issue "Hardening, round three", defect 3) -------------------

DYNAMIC_2 = """engine e {
  chamber width=16
  throat causal
  feed tokens vocab=32 context=16 position=none
  stage s x 2 {
    prechamber mix { norm layernorm  turbine attention heads=8 rotary SCALING }
    prechamber burn { norm layernorm  turbine mlp }
  }
  norm layernorm
  nozzle head
}
"""


def test_dynamic_ntk_over_two_rotated_dims_runs_and_keeps_the_plain_tables():
    """It passed check and `cyclec fire` ended in ZeroDivisionError (dims / (dims - 2)). Over 2 dims
    the one pair turns at base**0 = 1 whatever the base: the tables are the plain ones."""
    torch = need("torch")
    from cyclelang.backends.torch.runtime.positions import rotary_tables, scaled_rotary_tables

    dyn = cyclelang.parse(DYNAMIC_2.replace("SCALING", "rotary_scaling=dynamic rotary_factor=2 rotary_original=4"))
    plain = cyclelang.parse(DYNAMIC_2.replace("SCALING", ""))
    assert dyn.engine.body[0].ops[0].ops[1].rotary_dims == 2
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))  # 12 positions: past the original 4
    a, b = cyclelang.build(dyn, seed=0), cyclelang.build(plain, seed=0)
    logits, loss = a(idx, idx)
    loss.backward()
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    assert torch.equal(logits, b(idx))
    cos, sin = scaled_rotary_tables(12, 2, 10000.0, {"type": "dynamic", "factor": 2.0, "original": 4}, seq_len=12)
    assert all(torch.equal(x, y) for x, y in zip((cos, sin), rotary_tables(12, 2, 10000.0)))
    # over 4 dims the base still grows, as transformers' _compute_dynamic_ntk_parameters computes it
    grown = 10000.0 * (2.0 * 12 / 4 - 1) ** (4 / 2)
    assert torch.allclose(scaled_rotary_tables(12, 4, 10000.0, {"type": "dynamic", "factor": 2.0, "original": 4}, seq_len=12)[0],
                          rotary_tables(12, 4, grown)[0])


def test_dynamic_ntk_over_two_rotated_dims_is_reviewed():
    from cyclelang.review import review

    spec = cyclelang.parse(DYNAMIC_2.replace("SCALING", "rotary_scaling=dynamic rotary_factor=2 rotary_original=4"))
    assert [d.code for d in review(spec) if "2 rotated dims" in d.message] == ["W127"]
