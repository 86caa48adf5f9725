"""`turbine conv`: a depthwise convolution over positions, held to its equation.

The reference is written here from the definition, y[t, c] = b[c] + sum_j w[c, j] x[t - K + 1 + j, c]
(zeros before the first position; centred with an open throat), with weights perturbed
away from their init, in float64.
"""

from __future__ import annotations

import pytest

from .conftest import need

import cyclelang
from cyclelang import ir
from cyclelang.review import analyze, review

torch = need("torch")

SPEC = """
engine convtoy {{
  chamber width=16
  throat {throat}
  feed tokens vocab=40 context=24 position={position}
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  turbine conv size={size} bias={bias} }}
    prechamber burn {{ norm rmsnorm  turbine mlp ratio=2  merge cooling }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def _spec(throat="causal", size=3, bias="true"):
    return cyclelang.parse(SPEC.format(throat=throat, size=size, bias=bias, position="none" if throat == "causal" else "learned"))


def _model(spec):
    torch.manual_seed(0)
    model = cyclelang.build(spec).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _reference(x, weight, bias, size, causal):
    """The convolution, position by position, channel by channel."""
    B, T, C = x.shape
    left = size - 1 if causal else (size - 1) // 2
    y = torch.zeros_like(x)
    for t in range(T):
        for j in range(size):
            s = t - left + j
            if 0 <= s < T:
                y[:, t] += weight[:, 0, j] * x[:, s]
    return y + (bias if bias is not None else 0)


@pytest.mark.parametrize("throat", ["causal", "open"])
@pytest.mark.parametrize("size,bias", [(1, "true"), (3, "true"), (4, "false")])
def test_conv_equals_its_equation(throat, size, bias):
    model = _model(_spec(throat, size, bias))
    conv = model.stages[0].mix.conv
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got = conv(x, None) if throat == "causal" else conv(x)
    want = _reference(x, conv.conv.weight, conv.conv.bias, size, throat == "causal")
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_decoding_keeps_a_bounded_state_and_equals_the_full_pass():
    spec = _spec(size=4)
    model = _model(spec)
    idx = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(3))
    full = model(idx)
    Cache = type(model).__module__ and __import__("sys").modules[type(model).__module__].Cache
    cache = Cache()
    parts = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 20)]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10)
    kept = [v for k, v in cache.state.items() if isinstance(k, torch.nn.Module) and k.__class__.__name__.startswith("Conv")]
    assert kept and all(v.size(1) == 3 for v in kept)  # size - 1 inputs, not 20
    sample = model.generate(idx[:, :4], 8, temperature=0)
    assert torch.equal(sample, model.generate(idx[:, :4], 8, temperature=0, use_cache=False))


def test_the_kinds_record_is_what_the_model_holds_and_runs():
    from torch.utils.flop_counter import FlopCounterMode

    spec = _spec(size=5)
    model = _model(spec).float()
    conv = ir.layout.layout(spec).part_of("stages.0.mix.conv.conv.weight")
    assert conv.path == "stages.0-1.mix.conv" and conv.role == "mixer" and conv.kind.mixes_positions
    assert conv.params == sum(p.numel() for p in model.stages[0].mix.conv.parameters()) == 16 * 5 + 16
    assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
    x = torch.randn(1, 7, 16)
    counter = FlopCounterMode(display=False)
    with counter:
        model.stages[0].mix.conv(x, None)
    assert counter.get_total_flops() == 7 * conv.kind.flops(conv.node, 7)[0]
    assert conv.kind.state(conv.node, 1000) == 16 * 4  # the window, whatever the length


def test_a_conv_is_a_mixer_to_the_reviewer_and_the_diagram():
    spec = _spec()
    assert "W109" not in {d.code for d in review(spec)}  # positions do mix
    dot = cyclelang.draw(spec).source
    assert "swirl injector" in dot and "Conv · depthwise 3" in dot


def test_a_conv_engine_fires_as_a_scale_model_and_cools():
    spec = _spec(size=3)
    small = ir.passes.shrink(spec, width=8, depth=3)
    conv = ir.layout.layout(small).part_of("stages.2.mix.conv.conv.weight")
    assert conv.node.width == 8 and conv.repeat == 3
    report = cyclelang.fire(spec, width=8, depth=3, seq=8, batch=2)
    assert not report.failed and [c.status for c in report.runs[0].checks][1:] == ["pass", "pass"]
    cooled = cyclelang.codegen(cyclelang.parse(SPEC.format(throat="causal", size=3, bias="true", position="none")
                                               .replace("turbine conv size=3 bias=true", "turbine conv size=3 bias=true  merge cooling")))
    assert "nn.init.normal_(stage.mix.conv.conv.weight" in cooled  # the convolution is the branch's output


def test_an_oversized_kernel_is_a_diagnostic_not_a_traceback():
    big = SPEC.format(throat="causal", size=100000, bias="true", position="none")
    spec = cyclelang.parse(big)  # wider than the context: legal, if unwise
    assert spec.engine.body[0].ops[0].ops[1].size == 100000
