"""Cross-checks of the static analyses against built PyTorch modules.

The reviewer works from the IR alone; these tests hold it to what the torch
back-end actually builds: the same parameter count, exactly; the same set of
parameters that receive no gradient as autograd shows; forward FLOPs within 5%
of torch's FlopCounterMode. Skipped until the back-end (`cyclelang.build`) exists.
"""

from __future__ import annotations

import functools

import pytest

import cyclelang
from cyclelang.review import analyze
from cyclelang.review.report import attention_flops_per_token, forward_flops_per_token

from .conftest import ROOT, SPECS, spec_id

torch = pytest.importorskip("torch")
build = getattr(cyclelang, "build", None)
pytestmark = pytest.mark.skipif(build is None, reason="the torch back-end (cyclelang.build) is not there yet")

CASES = sorted((ROOT / "tests" / "review_cases").glob("*.cycle"))
T = 32  # tokens per sequence: short, so every spec runs on two CPU cores


@functools.lru_cache(maxsize=None)
def _model(path):
    """One module per spec for all three checks: building the big ones dominates the run."""
    torch.manual_seed(0)
    return build(cyclelang.load(path)).train(False)


def _tokens(spec, t=T):
    g = torch.Generator().manual_seed(0)
    t = min(t, spec.engine.feed.context)
    return torch.randint(0, spec.engine.feed.vocab, (1, t), generator=g)


@pytest.mark.parametrize("path", SPECS + CASES, ids=spec_id)
def test_parameter_count_matches_the_module(path):
    spec = cyclelang.load(path)
    model = _model(path)
    assert sum(p.numel() for p in model.parameters()) == analyze(spec)["params"]["total"]


@pytest.mark.parametrize("path", SPECS + CASES, ids=spec_id)
def test_reachability_matches_autograd(path):
    spec = cyclelang.load(path)
    model = _model(path)
    model.zero_grad(set_to_none=True)
    idx = _tokens(spec)
    _, loss = model(idx, targets=idx)
    loss.backward()
    no_grad = sum(p.numel() for p in model.parameters() if p.grad is None)
    assert no_grad == analyze(spec)["gradient"]["unreached_params"]


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


@pytest.mark.parametrize("path", SPECS, ids=spec_id)
def test_flops_within_five_percent_of_flop_counter(path):
    from torch.utils.flop_counter import FlopCounterMode

    spec = cyclelang.load(path)
    model = _model(path)
    idx = _tokens(spec)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(idx, targets=idx)
    measured = counter.get_total_flops() / idx.shape[1]
    predicted = forward_flops_per_token(spec.engine, idx.shape[1])
    if not _sdpa_is_counted():
        predicted -= attention_flops_per_token(spec.engine, idx.shape[1])
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)
