"""Fuzzing the back-end: every spec that passes `check` builds and runs, or `check` refuses it.

Hypothesis draws specs from the grammar's constructs, wider than the front-end fuzzer's:
every turbine kind of the kinds table (the ones without an entry below get their
defaults, so a new kind is fuzzed the day it lands), every merge with its options,
detached and overboard branches, fullflows, Post-LN valves, main-line turbines (and, in a
second campaign, a nested stage: a group of one or two stages, repeated), every
feed, nozzle and init choice, and option values up to the edges of their ranges. Each
spec either ends in errors from the front end, or it must:

- build (`cyclelang.build`, the very source `cyclec build` writes) and run forward in
  eval and train mode, with targets, and backward;
- for a causal engine, decode token by token with the KV cache to the full pass's
  logits (the stand's check), and leak nothing from the future;
- give finite logits, loss and gradients at initialisation, unless the design reviewer warned
  (a NaN model that passes `check` silently is a failure).

Bounded to about a minute on one core; `FUZZ_SCALE=20` for a long run. Figures of the
campaigns are in docs/reliability.md.
"""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang import ir, review  # noqa: E402
from cyclelang.diagnostics import CycleError  # noqa: E402

SCALE = max(1, int(os.environ.get("FUZZ_SCALE", "1")))
EXAMPLES = 250
VOCAB, CONTEXT, T = 64, 16, 8
NAMES = [f"b{i}" for i in range(8)]

# Option choices per turbine kind: values inside and at the edges of their ranges. A kind of
# the table with no entry here is written with its defaults only.
TURBINE_OPTIONS = {
    "attention": [["heads=1"], ["heads=2"], ["heads=4"], ["heads=2", "kv_heads=1"], ["heads=2", "head_dim=3"], ["heads=2", "rotary"],
                  ["heads=2", "rotary=0.5"], ["heads=1", "rotary_base=2"], ["heads=2", "qk_norm"], ["heads=2", "window=3"],
                  ["heads=2", "mask=open"], ["heads=2", "bias=false", "dropout=0.1"], ["heads=4", "window=1", "rotary"]],
    "mlp": [[], ["ratio=1"], ["ratio=0.5"], ["hidden=3"], ["act=swiglu"], ["act=geglu", "bias=false"], ["act=relu", "dropout=0.2"],
            ["act=gelu_tanh"], ["act=silu", "hidden=1"]],
    "moe": [["experts=2", "top=1"], ["experts=4", "top=2", "capacity=1.25", "balance=0.01"], ["experts=2", "top=2", "capacity=0.5"],
            ["experts=3", "top=1", "capacity=1000", "balance=1000", "act=swiglu", "ratio=1"], ["experts=1", "top=1", "hidden=2"]],
    "pool": [[], ["size=1"], ["size=2"], ["size=5"], ["size=40"]],
    "conv": [[], ["size=1"], ["size=2", "bias=false"], ["size=7"]],
    "linear": [[], ["out=width"], ["out=vocab"], ["out=4", "bias=false"]],
}
MERGES = ["plain", "scale=0.5", "scale=-1", "scale=2", "scale=1000", "cooling", "cooling std=0.1", "cooling std=10", "rezero",
          "rezero init=0.5", "rezero init=1000", "layerscale", "layerscale init=0.1", "layerscale init=1000", "deepnorm",
          "deepnorm alpha=2 beta=0.5", "deepnorm alpha=1000 beta=1000", "gate", "gate bias=2", "gate bias=100", "gate bias=-100"]
NORMS = ["layernorm", "rmsnorm", "layernorm eps=1 bias=false", "rmsnorm eps=1e-12"]


def _kinds() -> list[str]:
    return list(ir.kinds.BY_KEYWORD)


@st.composite
def turbine(draw) -> str:
    kind = draw(st.sampled_from(_kinds()))
    opts = draw(st.sampled_from(TURBINE_OPTIONS.get(kind, [[]])))
    return " ".join(["turbine", kind, *opts])


@st.composite
def prechamber(draw, name: str, merge: bool = True) -> str:
    flags = draw(st.sampled_from(["", "", "", "detach", "overboard loss=0.1", "overboard loss=1000", "detach overboard loss=0.5"]))
    body = []
    if draw(st.booleans()):
        body.append("norm " + draw(st.sampled_from(NORMS)))
    body += [draw(turbine()) for _ in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        body.append("norm " + draw(st.sampled_from(NORMS)))  # sandwich
    if "overboard" in flags:
        body.append("turbine linear out=vocab")
    elif merge and draw(st.booleans()):
        body.append("merge " + draw(st.sampled_from(MERGES)))
    return f"prechamber {name} {flags} {{ {'  '.join(body)} }}"


@st.composite
def stage(draw, name: str) -> str:
    items = []
    for i in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["pre", "pre", "pre", "fullflow", "norm", "turbine"]))
        if what == "pre":
            items.append(draw(prechamber(f"p{i}")))
        elif what == "fullflow":
            shared = "norm layernorm  " if draw(st.booleans()) else ""
            items.append(f"fullflow f{i} {{ {shared}{draw(prechamber(f'p{i}a', merge=False))} {draw(prechamber(f'p{i}b', merge=False))} }}")
        elif what == "norm":
            items.append("norm " + draw(st.sampled_from(NORMS)))  # Post-LN
        else:
            items.append(draw(turbine()))  # in series on the main line
    repeat = draw(st.sampled_from(["", "", "x 2", "x 3", "x 30"]))
    return f"stage {name} {repeat} {{ {'  '.join(items)} }}"


@st.composite
def specs(draw) -> str:
    width = draw(st.sampled_from([8, 12, 16]))
    throat = draw(st.sampled_from(["causal", "causal", "open"]))
    position = draw(st.sampled_from(["learned", "sinusoidal", "none"]))
    feed_extra = draw(st.sampled_from(["", "scale=4", "dropout=0.1", "scale=10000"]))
    lines = [f"chamber width={width}", f"throat {throat}", f"feed tokens vocab={VOCAB} context={CONTEXT} position={position} {feed_extra}"]
    for i in range(draw(st.integers(1, 3))):
        lines.append(draw(stage(NAMES[i])))
    if draw(st.booleans()):
        lines.append(draw(turbine()))
    if draw(st.booleans()):
        lines.append("norm " + draw(st.sampled_from(NORMS)))
    lines.append("nozzle head " + draw(st.sampled_from(["", "tied", "bias=true"])))
    lines.append("startup { " + draw(st.sampled_from(["", "init xavier", "init normal std=0.02", "init normal std=10", "init normal std=1e-30"])) + " }")
    return "engine fz {\n  " + "\n  ".join(lines) + "\n}\n"


@st.composite
def nested_specs(draw) -> str:
    """A spec whose stages sit in a group (a nested stage): one or two stages, the group repeated."""
    text = draw(specs())
    inner = "  ".join(draw(stage(f"n{k}")) for k in range(draw(st.integers(1, 2))))
    group = f"stage grp {draw(st.sampled_from(['', 'x 2', 'x 3']))} {{ {inner} }}"
    return text.replace("\n  nozzle head", f"\n  {group}\n  nozzle head", 1)


class Tally:
    """What the campaign saw, for docs/reliability.md (printed with -s)."""

    tried = refused = built = warned_nonfinite = warned_degenerate = 0


def run_one(text: str) -> None:
    Tally.tried += 1
    try:
        spec = cyclelang.parse(text)
    except CycleError:
        Tally.refused += 1
        return  # refused by the front end: fine, as long as it said so (the front-end fuzzer checks how)
    warnings = [d for d in review.review(spec) if d.severity in ("warning", "error")]
    model = cyclelang.build(spec, seed=0)
    Tally.built += 1
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (2, T), generator=gen)
    targets = torch.randint(0, VOCAB, (2, T), generator=gen)
    model.train()
    logits, loss = model(idx, targets)
    assert logits.shape == (2, T, VOCAB)
    finite = bool(torch.isfinite(logits).all()) and math.isfinite(float(loss.detach()))
    if finite:
        loss.backward()
        finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    if not finite:  # logits, loss or a gradient: NaN or infinite at initialisation
        assert warnings, f"a spec that passes check without a warning gives a non-finite model at init:\n{text}"
        Tally.warned_nonfinite += 1
        return
    model.eval()
    with torch.no_grad():
        assert model(idx).shape == (2, T, VOCAB)
    if spec.engine.throat == "causal":
        from cyclelang.stand.measure import check_causal, check_kv_cache

        model.zero_grad(set_to_none=True)
        causal = check_causal(model, spec, idx)
        kv = check_kv_cache(model, spec, idx)
        # A leak from the future is always a bug. Two outcomes are numerical degeneracy of a design
        # the reviewer warned about (a deep plain stack, nothing cooled): the gradient underflowing
        # to exactly zero ("depend on no input"), and fp32 round-off on logits in the millions
        # making cached decoding differ by more than the stand's 1e-4 relative tolerance.
        huge = float(logits.detach().abs().max()) > 1e4
        degenerate = warnings and (("no input" in causal.detail and causal.status == "fail") or (kv.status == "fail" and huge))
        if degenerate:
            Tally.warned_degenerate += 1
            assert "leaks" not in causal.detail, f"{causal.detail}\n{text}"
            return
        assert causal.status != "fail", f"{causal.detail}\n{text}"
        assert kv.status != "fail", f"{kv.detail}\n{text}"


@pytest.mark.slow  # builds, runs and decodes every generated spec
@settings(max_examples=EXAMPLES * SCALE, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(text=specs())
def test_every_spec_that_passes_check_builds_runs_and_decodes(text):
    torch.set_num_threads(1)
    run_one(text)


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(text=specs())
def test_a_fast_sample_of_specs_builds_runs_and_decodes(text):
    """The campaign's check on a dozen specs (another fixed draw) in the fast tier: the full campaign is slow."""
    torch.set_num_threads(1)
    run_one(text)


@pytest.mark.slow  # reads the campaign's tally: runs with it
def test_the_campaign_exercised_the_back_end():
    """The loop above asserted on something: most drawn specs got past the front end and ran."""
    if Tally.tried == 0:
        pytest.fail("run this file whole: the campaign test did not run before this one")
    assert Tally.built >= Tally.tried // 3, f"only {Tally.built} of {Tally.tried} drawn specs passed check: the generator is too wild"
    print(f"\nback-end fuzz: {Tally.tried} specs, {Tally.refused} refused by check, {Tally.built} built and run, "
          f"{Tally.warned_nonfinite} non-finite at init (each with a warning), "
          f"{Tally.warned_degenerate} numerically degenerate in the causal or cache check (each with a warning)")


@pytest.mark.slow  # builds, runs and decodes each generated nested spec
@settings(max_examples=EXAMPLES // 5 * SCALE, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(text=nested_specs())
def test_every_nested_spec_that_passes_check_builds_runs_and_decodes(text):
    """The same holds with a nested stage at the end of the main line (after the campaign's tally)."""
    torch.set_num_threads(1)
    assert "stage grp" in text
    run_one(text)


KNOWN_CRASHERS = {
    # issue 21, defect 7: each passed check and crashed in the back-end on main
    "pool then moe (a non-contiguous view)": "stage b { prechamber p { turbine pool  turbine moe experts=2 top=1 } }",
    "overboard pool (a non-contiguous head)": "stage b { prechamber a { turbine attention heads=2 }  prechamber p overboard loss=0.1 { turbine pool  turbine linear out=vocab } }",
    "deepnorm on a pool": "stage b { prechamber p { turbine pool  merge deepnorm }  norm layernorm }",
    "a branch whose class shadows a helper": "stage next_token { prechamber loss { turbine attention heads=2 } }",
}


@pytest.mark.parametrize("name", sorted(KNOWN_CRASHERS))
def test_known_back_end_crashers(name):
    run_one(f"engine fz {{ chamber width=8  feed tokens vocab={VOCAB} context={CONTEXT}  {KNOWN_CRASHERS[name]}  nozzle head }}")
