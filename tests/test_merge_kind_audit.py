"""Every merge on every turbine kind: it builds and trains a step, or `check` refuses it.

Issue "Hardening, round three", defect 1: `merge deepnorm` on a `pool` branch passed
`check` and built a file that did not compile (a `for` over the stage's instances whose
body was a comment), and `merge cooling` on a pool was drawn with an init σ the model
never applied. A merge whose init rule reaches the branch's output projection (its kinds
record says `inits_output`) on a branch none of whose kinds has one (`Kind.out_proj`) is
refused by the reviewer (E0302) where the rule is all the merge does (cooling); DeepNorm
still scales the main line by alpha there, so it builds, with nothing for beta to scale.
"""

from __future__ import annotations

import math

import pytest

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang import ir  # noqa: E402
from cyclelang.backends.torch.emitters import emitter_for  # noqa: E402
from cyclelang.diagnostics import CycleError, render  # noqa: E402
from cyclelang.ir.kinds import KINDS, MERGES, OPS  # noqa: E402
from cyclelang.review import review  # noqa: E402

# One small turbine of every kind in the table (a new kind fails the coverage test below)
TURBINES = {
    ir.Attention: "turbine attention heads=2",
    ir.LatentAttention: "turbine attention heads=2 latent=8 head_dim=4 rotary_dims=2 v_dim=4",
    ir.Mlp: "turbine mlp ratio=2",
    ir.Moe: "turbine moe experts=2 top=1 ratio=1",
    ir.Pool: "turbine pool size=3",
    ir.Conv: "turbine conv size=3",
    ir.Ssm: "turbine ssm heads=2 state=4 chunk=4",
    ir.Mamba1: "turbine ssm version=1 state=4 dt_rank=2 chunk=4",
    ir.LinearAttention: "turbine linear_attention heads=2 chunk=4",
    ir.GatedDelta: "turbine delta heads=2 chunk=4",
    ir.Linear: "turbine linear",
    ir.ShortConv: "turbine short_conv size=3",
}
MERGE_TEXT = {k.cls: "merge " + (k.keyword + "=0.5" if k.keyword == "scale" else k.keyword) for k in MERGES}


def _spec(turbine: str, merge: str) -> str:
    return ("engine e {\n  chamber width=16\n  throat causal\n  feed tokens vocab=32 context=16\n"
            f"  stage s x 2 {{\n    prechamber p {{\n      norm layernorm\n      {turbine}\n      {merge}\n    }}\n  }}\n"
            "  norm layernorm\n  nozzle head\n}\n")


def test_the_audit_covers_every_turbine_and_merge_kind():
    turbines = {k.cls for k in OPS if k.cls is not ir.Norm}
    assert set(TURBINES) == turbines, "add the new kind to TURBINES"
    assert set(MERGE_TEXT) == set(ir.MERGE_TYPES)


def test_the_output_projection_fact_has_one_home():
    """`Kind.out_proj` is the record's; each emitter's output_init agrees with it."""
    for cls, turbine in TURBINES.items():
        spec = cyclelang.parse(_spec(turbine, "merge plain"))
        op = next(o for o in ir.stage_branches(spec.engine.body[0])[0].ops if type(o) is cls)
        has = emitter_for(cls).output_init("a", op, "0.02") is not None
        assert KINDS[cls].out_proj == has, cls.__name__
    assert not KINDS[ir.Norm].out_proj and not KINDS[ir.Pool].out_proj
    assert {k.keyword for k in MERGES if k.inits_output} == {"cooling", "deepnorm"}


def _run(text: str):
    spec = cyclelang.parse(text, "audit.cycle")
    errors = [d for d in review(spec) if d.severity == "error"]
    if errors:
        return spec, errors, None
    torch.manual_seed(0)
    model = cyclelang.build(spec, seed=0)
    idx = torch.randint(0, 32, (2, 8))
    _, loss = model(idx, torch.randint(0, 32, (2, 8)))
    loss.backward()
    return spec, [], float(loss.detach())


@pytest.mark.parametrize("merge", list(MERGE_TEXT), ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", list(TURBINES), ids=lambda c: c.__name__)
def test_merge_kind_audit(kind, merge):
    text = _spec(TURBINES[kind], MERGE_TEXT[merge])
    try:
        spec, errors, loss = _run(text)
    except CycleError as e:  # refused by the front end: with a code and a place
        assert all(d.code and d.span is not None for d in e.diagnostics), text
        return
    if errors:
        for d in errors:
            assert d.code in ("E0302",) and d.span is not None, render(errors, {"audit.cycle": text})
        assert not KINDS[kind].out_proj and KINDS[merge].inits_output
        return
    assert math.isfinite(loss), text
    assert not (KINDS[merge].inits_output and merge is ir.CoolingMerge and not KINDS[kind].out_proj)


def test_E0302_cooling_on_a_pool_is_refused_with_its_place():
    text = _spec("turbine pool", "merge cooling")
    diags = [d for d in review(cyclelang.parse(text, "audit.cycle")) if d.code == "E0302"]
    assert len(diags) == 1 and diags[0].severity == "error"
    out = render(diags, {"audit.cycle": text})
    assert "audit.cycle:9:7: error[E0302]" in out and "pool" in out


def test_deepnorm_on_a_pool_builds_with_alpha_and_nothing_for_beta():
    """The reported case: a repeated stage whose only merge init was a comment."""
    text = _spec("turbine pool", "merge deepnorm").replace("      norm layernorm\n", "")
    source = cyclelang.codegen(cyclelang.parse(text))
    compile(source, "model.py", "exec")
    spec, errors, loss = _run(text)
    assert not errors and math.isfinite(loss)


def test_a_pool_then_a_projection_is_cooled_through_the_projection():
    text = _spec("turbine pool\n      turbine linear", "merge cooling")
    spec = cyclelang.parse(text)
    assert not [d for d in review(spec) if d.code == "E0302"]
    assert "nn.init.normal_(stage.p.linear.weight" in cyclelang.codegen(spec)
