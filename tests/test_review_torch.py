"""Cross-checks of the static analyses against built PyTorch modules.

The reviewer works from the IR alone; these tests hold it to what the torch
back-end actually builds: the same parameter count, exactly; the same set of
parameters that receive no gradient as autograd shows; forward FLOPs within 5%
of torch's FlopCounterMode. Skipped until the back-end (`cyclelang.build`) exists.
"""

from __future__ import annotations

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.review import analyze
from cyclelang.review.report import forward_flops_per_token

from .conftest import ROOT, SPECS, shrink, spec_id, need, swept

torch = need("torch")
build = cyclelang.build

CASES = sorted((ROOT / "tests" / "review_cases").glob("*.cycle"))
# Every library spec in the full run; the fast tier checks these (two branches, experts, a
# detached read and an overboard branch, Post-LN's main-line norms, nested stages) and every case
FAST = {"moe", "gas_generator", "post_ln", "striped"}
# The FLOP count sweeps the library; the fast tier leaves out the specs that take over a third of
# a second to build and count (the mixers' own FLOP tests, test_ssm.py and the like, stay fast)
FAST_FLOPS = FAST | {"highway", "poolformer", "pressure_fed", "throat"}
# The facts checked here (a count, the reachable groups, FLOPs per token against the counter) do not
# depend on sizes: the library specs are checked at a scale model (`ir.passes.shrink`: width 64, two
# of each repeated stage, a vocabulary of 250), and one spec at full size (`FULL`)
FULL = "moe"
FULL_CASE = f"{FULL} at full size"
T = 32  # tokens per sequence: short, so every spec runs on two CPU cores


BIG = 10_000_000  # parameters of its parts above which a review case is checked as a scale model too


def _spec(path):
    """The spec these checks build: a library spec as a scale model, a review case as written
    (most are small already; one written at full size for its FLOPs, W161's 24 blocks at width
    512, as a scale model) or the full-size case (`FULL_CASE`) as written."""
    if path == FULL_CASE:
        return cyclelang.load(ROOT / "specs" / f"{FULL}.cycle")
    if path.parent != ROOT / "specs":
        spec = cyclelang.load(path)
        if sum(p.params for p in cyclelang.ir.layout.layout(spec.engine).parts()) < BIG:
            return spec
    return shrink(path, width=64, depth=2, vocab=250)


def _id(path) -> str:
    return path.replace(" ", "_") if isinstance(path, str) else spec_id(path)


_MODELS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _release_models():
    """The modules are built once for the checks of this file and released at its end."""
    yield
    _MODELS.clear()


def _model(path):
    """One module per spec for all the checks (building dominates the run)."""
    if path not in _MODELS:
        torch.manual_seed(0)
        _MODELS[path] = build(_spec(path)).train(False)
    return _MODELS[path]


def _tokens(spec, t=T):
    g = torch.Generator().manual_seed(0)
    t = min(t, spec.engine.feed.context)
    return torch.randint(0, spec.engine.feed.vocab, (1, t), generator=g)


@pytest.mark.parametrize("path", swept(SPECS, FAST) + CASES + [FULL_CASE], ids=_id)
def test_parameter_count_matches_the_module(path):
    spec = _spec(path)
    model = _model(path)
    assert sum(p.numel() for p in model.parameters()) == analyze(spec)["params"]["total"]


@pytest.mark.parametrize("path", swept(SPECS, FAST) + CASES + [FULL_CASE], ids=_id)
def test_reachability_matches_autograd(path):
    """The total count of parameters without a gradient, as the report states it."""
    spec = _spec(path)
    model = _model(path)
    model.zero_grad(set_to_none=True)
    idx = _tokens(spec)
    _, loss = model(idx, targets=idx)
    loss.backward()
    no_grad = sum(p.numel() for p in model.parameters() if p.grad is None)
    model.zero_grad(set_to_none=True)
    assert no_grad == analyze(spec)["gradient"]["unreached_params"]


# --- reachability group by group --------------------------------------------------------------
#
# Each torch parameter is mapped to the report's parameter group through the IR's
# layout, the one naming authority (test_ir.py holds its paths to the built model's
# module paths). Then, loss by loss, the groups autograd reaches must be the groups
# the report lists that loss for.


def group_of(name: str, lay) -> str:
    group = lay.group_of(name)
    if group is None:
        raise AssertionError(f"{name} belongs to no part of the layout")
    return group


@pytest.mark.parametrize("path", swept(SPECS, FAST) + CASES + [FULL_CASE], ids=_id)
def test_parameter_count_group_by_group(path):
    """Each group's count in the report equals the module's parameters under that group's names."""
    spec = _spec(path)
    prefixes = ir.layout.layout(spec)
    built: dict[str, int] = {}
    for n, p in _model(path).named_parameters():
        g = group_of(n, prefixes)
        built[g] = built.get(g, 0) + p.numel()
    report = {g["group"]: g["params"] for g in analyze(spec)["gradient"]["groups"] if g["params"]}
    assert built == report


def test_counting_conventions_hold_in_the_module():
    """The conventions the report assumes, looked up in the built modules by name: qk-norm
    is one RMSNorm weight of head_dim for q and one for k (shared by the heads); the MoE
    router has no bias whatever the experts' bias; a tied head with a bias adds only head_bias."""
    cases = ROOT / "tests" / "review_cases"
    m = dict(_model(cases / "crosscheck_baffles.cycle").named_parameters())
    assert m["stages.0.mix.attn.q_norm.weight"].shape == m["stages.0.mix.attn.k_norm.weight"].shape == (16,)  # 64 / 4 heads
    assert m["stages.2.mix.attn.q_norm.weight"].shape == (8,)  # 64 / 8 heads
    assert "head.weight" not in m and m["head_bias"].shape == (97,)
    m = dict(_model(cases / "crosscheck_injection.cycle").named_parameters())
    assert m["stages.0.burn.moe.router.weight"].shape == (4, 64) and "stages.0.burn.moe.router.bias" not in m  # bias=true
    assert "stages.3.burn.moe.router.bias" not in m and not any(n.startswith("stages.3.burn.moe.experts.") and n.endswith(".bias") for n in m)
    assert m["stages.0.burn.moe.experts.0.fc.bias"].shape == (2 * 96,)  # geglu: fused [gate | up]
    assert m["stages.3.norm.weight"].shape == (64,)  # the fullflow's shared valve sits on the stage


def _reached(loss, groups: list[str], params: list) -> set[str]:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return {g for g, gr in zip(groups, grads) if gr is not None and bool(gr.ne(0).any())}


# W130's cases cut the gradient with a gain that is 0 in float32: the report's reachability is structural, and
# that the numbers reach nothing is exactly what W130 says of them
@pytest.mark.parametrize("path", swept(SPECS, FAST) + [c for c in CASES if not c.name.startswith("W130_")] + [FULL_CASE], ids=_id)
def test_reachability_group_by_group(path):
    """For the nozzle's loss, for each overboard head's loss, and for the total (MoE
    balance losses included, in training mode), the set of groups with a non-zero
    gradient is the set the report says each loss reaches. Groups without parameters
    (a pool, a plain merge) cannot show a gradient and are left out."""
    import torch.nn.functional as F

    spec = _spec(path)
    report = analyze(spec)["gradient"]
    model = _model(path)
    prefixes = ir.layout.layout(spec)
    named = [(n, p) for n, p in model.named_parameters()]
    groups = [group_of(n, prefixes) for n, _ in named]
    params = [p for _, p in named]
    with_params = {g["group"] for g in report["groups"] if g["params"]}
    assert set(groups) == with_params  # every group with parameters owns some, and no other

    idx = _tokens(spec)

    def losses() -> dict[str, object]:
        """One forward pass: the nozzle's cross-entropy, each report loss's sum over its
        instances (the overboard heads), and the total with the MoE balance losses."""
        logits, total = model(idx, targets=idx)
        out = {"nozzle": F.cross_entropy(logits.view(-1, logits.size(-1)), idx.reshape(-1))}
        for key, value in model.aux_losses.items():
            g = group_of(key, prefixes)
            if g in report["losses"]:
                out[g] = out[g] + value if g in out else value
        out["total"] = total
        return out

    model.train(True)  # the MoE balance losses are training-time losses
    try:
        assert set(losses()) == set(report["losses"]) | {"total"}
        for name in report["losses"]:  # a fresh graph for each: the back-end may free or reuse saved buffers
            expected = {g["group"] for g in report["groups"] if name in g["losses"]} & with_params
            assert _reached(losses()[name], groups, params) == expected, name
        expected = {g["group"] for g in report["groups"] if g["losses"]} & with_params
        assert _reached(losses()["total"], groups, params) == expected, "total"
        assert with_params - expected == set(report["unreached"]) & with_params
    finally:
        model.train(False)


def _sdpa_is_counted() -> bool:
    """FlopCounterMode has no formula for some fused kernels (the CPU flash kernel among
    them); where it counts nothing for attention, leave attention out of the prediction."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    q = torch.randn(1, 1, 4, 8)
    counter = FlopCounterMode(display=False)
    with counter:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return counter.get_total_flops() > 0


@pytest.mark.parametrize("path", swept(SPECS, FAST_FLOPS) + [FULL_CASE], ids=_id)
def test_flops_within_five_percent_of_flop_counter(path):
    from torch.utils.flop_counter import FlopCounterMode

    spec = _spec(path)
    model = _model(path)
    idx = _tokens(spec)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(idx, targets=idx)
    measured = counter.get_total_flops() / idx.shape[1]
    predicted = forward_flops_per_token(spec.engine, idx.shape[1])
    if not _sdpa_is_counted():  # the fused kernel's scores and sums go uncounted; the scans' einsums and
        # latent attention's math kernel (its value width is not its key's) are matmuls, and counted
        n = idx.shape[1]
        # (attention with sinks or a soft-cap computes its scores by matmuls, outside the kernel: counted)
        predicted -= sum(p.flops(n)[1] * p.repeat for p in ir.layout.layout(spec).parts()
                         if isinstance(p.node, ir.Attention) and not (p.node.sinks or p.node.softcap))
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)
