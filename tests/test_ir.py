"""The IR as a contract: the kinds table is complete, the layout names every part once,
hostile IR is refused, and the passes recompute what they derive."""

from __future__ import annotations

import json
import math
import typing

import pytest
from pydantic import ValidationError

import cyclelang
from cyclelang import ir
from cyclelang.backends.graphviz import text as gv_text
from cyclelang.backends.graphviz.style import KIND_FILL, THEMES
from cyclelang.review import analyze

from .conftest import SPECS, spec_id, need, rotated


def _union_classes(annotation) -> set[type]:
    """The node classes a discriminated union (or a list / optional of one) admits."""
    out: set[type] = set()
    for arg in typing.get_args(annotation) or ():
        if isinstance(arg, type) and issubclass(arg, ir.Node):
            out.add(arg)
        else:
            out |= _union_classes(arg)
    return out


def _all_part_classes() -> set[type]:
    """Every class that can stand in an engine's body, a stage, a branch or a merge."""
    found = set()
    for model, field in ((ir.Engine, "body"), (ir.Stage, "ops"), (ir.Prechamber, "ops"), (ir.Prechamber, "merge")):
        found |= _union_classes(model.model_fields[field].annotation)
    return (found - {ir.Stage, ir.Prechamber, ir.Fullflow}) | {ir.Feed, ir.Nozzle}


# --- the kinds table ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", sorted(_all_part_classes(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_kind_has_a_record(cls):
    k = ir.kinds.KINDS.get(cls)
    assert k is not None, f"no kinds record for {cls.__name__}"
    assert k.role in ir.kinds.ROLES and k.rocket and k.ml and k.phrase
    if cls in ir.TURBINE_TYPES:
        assert k.keyword in ir.kinds.BY_KEYWORD and k.attr, cls.__name__


def test_a_missing_kind_fails_with_its_name():
    class Shift(ir.Node):
        op: typing.Literal["shift"] = "shift"

    with pytest.raises(KeyError, match="Shift"):
        ir.kinds.kind_of(Shift())


@pytest.mark.parametrize("cls", ir.TURBINE_TYPES, ids=lambda c: c.__name__)
def test_every_turbine_has_diagram_words_and_a_colour(cls):
    """A kind's diagram words come from its kinds record (graphviz/text.py TITLES only adds the
    numbers, and a kind without an entry is titled by its word); its colour is its style entry."""
    k = ir.kinds.KINDS[cls]
    assert gv_text.TITLES.get(cls) is not None or k.ml
    assert k.attr in KIND_FILL, f"graphviz/style.py KIND_FILL lacks {k.attr}"
    for theme in THEMES.values():
        assert KIND_FILL[k.attr] in theme, f"graphviz theme lacks a colour for {k.attr}"


def test_only_mixers_mix_positions():
    mixers = {k.cls for k in ir.kinds.OPS if k.mixes_positions}
    assert {ir.Attention, ir.Pool} <= mixers
    assert mixers == {k.cls for k in ir.kinds.OPS if k.role == "mixer"}
    assert all(k.masked for k in ir.kinds.OPS if k.mixes_positions)  # a causal throat must reach every mixer


def test_kv_state_is_what_decoding_keeps():
    a = ir.Attention(width=64, heads=8, kv_heads=2, head_dim=8, mask="causal", window=16, rotary_dims=0, rotary_base=1e4,
                     qk_norm=False, bias=False, dropout=0.0)
    k = ir.kinds.kind_of(a)
    assert k.state(a, 1) == 2 * 2 * 8  # K and V, 2 kv heads of 8
    assert k.state(a, 100) == k.state(a, 16) == 16 * 2 * 2 * 8  # the window caps it
    assert k.flops(a, 100)[1] == 4 * 64 * 16


# --- the layout: one name per part ------------------------------------------------------------------


def _small(path):
    """A library spec at a size the suite can build (the layout does not depend on sizes)."""
    spec = cyclelang.load(path)
    return ir.passes.shrink(spec, width=32, depth=2)


@pytest.mark.parametrize("path", rotated(SPECS, 2, 1), ids=spec_id)  # half in the fast tier
def test_paths_are_the_same_in_report_model_and_diagram(path):
    torch = need("torch")
    spec = _small(path)
    lay = ir.layout.layout(spec)
    paths = {p.path for p in lay.parts()} | {f"{sl.path}.{b.attr}" for sl in lay.stages for b in sl.branches()}
    groups = {g["group"] for g in analyze(spec)["gradient"]["groups"]}
    assert groups <= paths, groups - paths

    torch.manual_seed(0)
    model = cyclelang.build(spec)
    modules = dict(model.named_modules())
    for p in lay.parts():
        if p.role in ("merge", "feed", "nozzle"):
            continue
        for inst in p.instances():  # the path is the module path
            assert inst in modules, f"{inst} is not a module of the built model"
    for name, param in model.named_parameters():
        part = lay.part_of(name)
        assert part is not None, f"no part owns {name}"
        assert part.group in groups, (name, part.group)
    owned = sum(p.numel() for p in model.parameters())
    assert owned == sum(p.params * p.repeat for p in lay.parts())

    for expand in (False, True):
        dot = cyclelang.draw(spec, expand=expand).source + cyclelang.draw(spec, view="graph", expand=expand).source
        # every box and wire that stands for a part names it by its path (legend, text and
        # value classes name none)
        words = [m.split() for m in __import__("re").findall(r'class="([^"]+)"', dot)]
        drawn = {w[1] for w in words if len(w) > 1 and w[0] not in ("legend", "legend_text", "value", "colourbar")}
        def frames(sl):  # a stage's frames: each level of its path folded or unfolded (a group's instance holds its stages folded)
            import itertools
            import re as _re

            levels = []
            for seg in _re.findall(r"stages\.([0-9]+(?:-[0-9]+)?)", sl.path):
                lo, _, hi = seg.partition("-")
                levels.append([seg] + ([str(i) for i in range(int(lo), int(hi) + 1)] if hi else []))
            return [".".join(f"stages.{x}" for x in combo) for combo in itertools.product(*levels)]

        unfolded = paths | {i for p in lay.parts() for i in p.instances()} | {f for sl in lay.all_stages() for f in frames(sl)}
        unfolded |= {f"{s}.{b.attr}" for sl in lay.stages for s in frames(sl) for b in sl.branches()}
        assert drawn and drawn <= unfolded, drawn - unfolded


def test_folded_paths_unfold():
    assert ir.layout.instances("stages.0-2.mix.attn") == ["stages.0.mix.attn", "stages.1.mix.attn", "stages.2.mix.attn"]
    assert ir.layout.instances("stages.4.probe") == ["stages.4.probe"]
    assert ir.layout.stage_path(3, 1) == "stages.3" and ir.layout.stage_path(0, 12) == "stages.0-11"


def test_spec_names_are_mangled_once_for_everyone():
    spec = cyclelang.parse("""
engine e {
  chamber width=16
  feed tokens vocab=32 context=8
  stage train x 2 {
    prechamber forward { norm layernorm  turbine attention heads=2 }
    prechamber gate { norm layernorm  turbine mlp ratio=2  turbine mlp ratio=2 }
  }
  norm layernorm
  nozzle head
}""")
    lay = ir.layout.layout(spec)
    paths = [p.path for p in lay.parts()]
    assert "stages.0-1.forward_.attn" in paths
    assert "stages.0-1.gate_.mlp1" in paths and "stages.0-1.gate_.mlp2" in paths
    assert lay.part_of("stages.1.gate_.mlp2.fc.weight").path == "stages.0-1.gate_.mlp2"


# --- hostile IR is refused -----------------------------------------------------------------------

GPT = """
engine tiny {
  chamber width=16
  feed tokens vocab=32 context=8
  stage block x 2 {
    prechamber mix { norm layernorm  turbine attention heads=2  merge cooling }
    prechamber burn { norm layernorm  turbine mlp ratio=2  merge layerscale }
  }
  norm layernorm
  nozzle head tied
}"""


def _dump():
    return cyclelang.parse(GPT).model_dump(mode="json")


def _edit(fn):
    d = _dump()
    fn(d)
    return d


def _stage(d):
    return d["engine"]["body"][0]


HOSTILE = {
    "newline in a stage name": lambda d: _stage(d).update(name="block\nimport os"),
    "quote in a branch name": lambda d: _stage(d)["ops"][0].update(name="mix'); x = ('"),
    "dotted engine name": lambda d: d["engine"].update(name="../../etc"),
    "non-ascii name": lambda d: _stage(d).update(name="blöck"),
    "empty template name": lambda d: _stage(d).update(template=""),
    "widths that do not meet": lambda d: _stage(d)["ops"][1]["ops"][1].update(width=24),
    "branch that returns another width": lambda d: _stage(d)["ops"][1].update(out_width=24),
    "kv_heads that do not divide": lambda d: _stage(d)["ops"][0]["ops"][1].update(kv_heads=3, heads=4),
    "odd rotary": lambda d: _stage(d)["ops"][0]["ops"][1].update(rotary_dims=3),
    "negative width": lambda d: d["engine"]["nozzle"].update(width=-16),
    "NaN eps": lambda d: d["engine"]["body"][1].update(eps=float("nan")),
    "rmsnorm with a bias": lambda d: d["engine"]["body"][1].update(type="rmsnorm", bias=True),
    "two branches of one name": lambda d: _stage(d)["ops"][1].update(name="mix"),
    "a merge on an overboard branch": lambda d: _stage(d)["ops"][0].update(overboard=True),
    "cooling std that is not derived": lambda d: _stage(d)["ops"][0]["merge"].update(std=0.5),
    "an unfinalised merge": lambda d: _stage(d)["ops"][1]["merge"].update(init=None),
    "open attention in a causal engine": lambda d: _stage(d)["ops"][0]["ops"][1].update(mask="open"),
    "nozzle of another vocab": lambda d: d["engine"]["nozzle"].update(vocab=31),
    "an unknown field": lambda d: _stage(d).update(code="print(1)"),
}


def test_the_resolved_ir_round_trips():
    d = _dump()
    assert ir.Spec.model_validate(d).model_dump(mode="json") == d
    assert ir.Spec.model_validate_json(json.dumps(d)).model_dump(mode="json") == d


@pytest.mark.parametrize("what", HOSTILE, ids=list(HOSTILE))
def test_hostile_ir_is_refused(what):
    d = _edit(HOSTILE[what])
    with pytest.raises(ValidationError):
        ir.Spec.model_validate(d)
    with pytest.raises(ValidationError):
        ir.Spec.model_validate_json(json.dumps(d))


def test_validate_catches_edits_that_skip_validation():
    spec = cyclelang.parse(GPT)
    st = spec.engine.body[0]
    bad = spec.model_copy(update=dict(engine=spec.engine.model_copy(update=dict(body=[st.model_copy(update=dict(name="a\nb")), *spec.engine.body[1:]]))))
    with pytest.raises(ir.IRError, match="identifier"):
        ir.validate(bad)
    assert ir.validate(spec) is spec


# --- passes ------------------------------------------------------------------------------------


def _merge(spec, stage=0, op=0):
    return spec.engine.body[stage].ops[op].merge


def test_derived_values_follow_the_depth_and_asked_ones_stay():
    spec = cyclelang.parse(GPT.replace("merge cooling", "merge cooling std=0.05"))
    deep = ir.passes.shrink(spec, depth=30)
    assert _merge(deep).merges == 60 and _merge(deep).base == _merge(deep).base_asked == 0.05
    assert math.isclose(_merge(deep).std, 0.05 / math.sqrt(60))
    plain = ir.passes.shrink(cyclelang.parse(GPT), depth=30)
    assert _merge(plain, op=1).init == ir.passes.layerscale_init(30) == 1e-6
    again = ir.passes.shrink(ir.passes.shrink(plain, depth=2), depth=30)  # derived from what was asked, never guessed back
    assert again.model_dump() == plain.model_dump()


def test_deepnorm_asked_alpha_stays_beta_is_derived():
    spec = cyclelang.parse(GPT.replace("merge cooling", "merge deepnorm alpha=2.5").replace("merge layerscale", "merge deepnorm"))
    m = _merge(ir.passes.shrink(spec, depth=8))
    assert m.alpha == 2.5 and m.layers == 8 and math.isclose(m.beta, 64 ** -0.25)


def test_an_injected_name_never_reaches_generated_code():
    """The public IR cannot smuggle a statement into `cyclelang.build`: a stage name with a
    newline is refused from JSON, and an edited tree is refused by the back-end."""
    d = _dump()
    _stage(d)["name"] = "block\nimport os; os.system('echo pwned')"
    with pytest.raises(ValidationError):
        ir.Spec.model_validate(d)
    spec = cyclelang.parse(GPT)
    st = spec.engine.body[0].model_copy(update=dict(name="block\nimport os"))
    bad = spec.model_copy(update=dict(engine=spec.engine.model_copy(update=dict(body=[st, *spec.engine.body[1:]]))))
    from cyclelang.backends.torch.codegen import codegen

    with pytest.raises(ir.IRError):
        codegen(bad)


def test_a_tied_head_reads_the_chamber():
    d = _dump()
    d["engine"]["body"].insert(1, {"op": "linear", "width": 16, "out": 8, "bias": False})
    d["engine"]["body"][2]["width"] = 8  # the final norm
    d["engine"]["nozzle"]["width"] = 8
    with pytest.raises(ValidationError, match="tied head"):
        ir.Spec.model_validate(d)
    d["engine"]["nozzle"]["tied"] = False
    ir.Spec.model_validate(d)  # untied, the head may read a narrower line


# --- let provenance: the spec's names for its sizes, out of the dump ------------------------

LET_SPEC = """
let depth = 4
let d = 64
let heads = 2
let hidden = 4 * d + sqrt(d) * 0
stage layer(h) { prechamber mix { norm layernorm  turbine attention heads=h } }
engine e {
  chamber width=d
  feed tokens vocab=32 context=8
  stage block x depth { prechamber burn { norm layernorm  turbine mlp hidden=hidden } }
  stage top = layer(h=heads)
  nozzle head tied
}
"""


def test_lets_are_kept_with_their_formulas_and_the_options_that_named_them():
    e = cyclelang.parse(LET_SPEC).engine
    assert [(x.name, x.value, x.formula) for x in e.lets] == [
        ("depth", 4, None), ("d", 64, None), ("heads", 2, None), ("hidden", 256.0, "4 * d + math.sqrt(d) * 0")]
    assert e.let_of("width") == "d"
    block, top = e.body
    assert block.let_of("repeat") == "depth"
    assert block.ops[0].ops[1].let_of("hidden") == "hidden"
    assert top.ops[0].ops[1].let_of("heads") == "heads"  # through the template's parameter
    assert top.ops[0].ops[0].let_names == ()  # written without a name


def test_let_provenance_stays_out_of_the_dump():
    spec = cyclelang.parse(LET_SPEC)
    dumped = spec.model_dump_json()
    assert "let_names" not in dumped and "lets" not in dumped and "depth" not in dumped
    assert ir.Spec.model_validate_json(dumped).engine.body[0].repeat == 4
    assert "let_names" not in json.dumps(ir.json_schema())


@pytest.mark.parametrize("formula", ['__import__("os").system("x")', "d.__class__", "'x'", "d if d else d", "[d][0]", "math.pi", "print(d)"])
def test_a_let_formula_is_arithmetic_only(formula):
    with pytest.raises(ValidationError):
        ir.Let.model_validate({"name": "x", "value": 1, "formula": formula})
    assert ir.Let.model_validate({"name": "x", "value": 1, "formula": "2 * d // 3 - math.sqrt(k) ** 2 % 5"}).formula
