"""`turbine short_conv`: LFM2's short gated convolution, held to its equations.

The reference is written here from the definition (Liquid AI's LFM2; the order-2 gate of
H3 and Hyena), in float64, position by position, with weights perturbed away from their
init:

    [B | C | x] = W_in h + b_in                     (each `width` wide)
    u[t, c] = b[c] + sum_j w[c, j] (B x)[t - K + 1 + j, c]   (zeros before the first position;
                                                              centred with an open throat)
    y = W_out (C u) + b_out

Decoding one token at a time with the Cache equals the full pass; the state it keeps is
the last K - 1 values of B x per channel, the same at 16 tokens and at 4,096; gradients
equal autograd's through the reference; the kinds record's parameters, FLOPs and state
are what the module holds and runs.
"""

from __future__ import annotations

import sys

import pytest

from .conftest import need

import cyclelang
from cyclelang import ir
from cyclelang.review import analyze, review

torch = need("torch")

SPEC = """
engine shortconv {{
  chamber width=16
  throat {throat}
  feed tokens vocab=40 context={context} position={position}
  stage block x {layers} {{
    prechamber mix {{ norm rmsnorm  turbine short_conv size={size} bias={bias}  merge cooling }}
    {burn}
  }}
  norm rmsnorm
  nozzle head
}}
"""
BURN = "prechamber burn { norm rmsnorm  turbine mlp ratio=2 act=swiglu bias=false  merge cooling }"


def _spec(throat="causal", size=3, bias="true", layers=2, context=24, burn=BURN):
    return cyclelang.parse(SPEC.format(throat=throat, size=size, bias=bias, layers=layers, context=context, burn=burn,
                                       position="none" if throat == "causal" else "learned"))


def _model(spec, dtype=torch.float64):
    model = cyclelang.build(spec, seed=0).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _reference(h, w_in, b_in, w, b, w_out, b_out, causal):
    """The short gated convolution, from its equations: every position, every channel, every tap."""
    Bt, T, W = h.shape
    K = w.size(-1)
    proj = h @ w_in.T + (0 if b_in is None else b_in)
    Bg, C, x = proj[..., :W], proj[..., W : 2 * W], proj[..., 2 * W :]
    v = Bg * x
    left = K - 1 if causal else (K - 1) // 2
    cols = []
    for t in range(T):
        u = torch.zeros(Bt, W, dtype=h.dtype) + (0 if b is None else b)
        for j in range(K):
            s = t - left + j
            if 0 <= s < T:
                u = u + w[:, 0, j] * v[:, s]
        cols.append(u)
    u = torch.stack(cols, dim=1)
    return (C * u) @ w_out.T + (0 if b_out is None else b_out)


def _ref_of(m, x, causal):
    return _reference(x, m.in_proj.weight, m.in_proj.bias, m.conv.weight, m.conv.bias, m.out_proj.weight, m.out_proj.bias, causal)


@pytest.mark.parametrize("throat", ["causal", "open"])
@pytest.mark.parametrize("size,bias", [(1, "true"), (3, "true"), (4, "false")])
def test_short_conv_equals_its_equations(throat, size, bias):
    model = _model(_spec(throat, size, bias))
    m = model.stages[0].mix.short_conv
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got = m(x, None) if throat == "causal" else m(x)
    torch.testing.assert_close(got, _ref_of(m, x, throat == "causal"), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("throat", ["causal", "open"])
def test_gradients_equal_autograd_through_the_reference(throat):
    model = _model(_spec(throat, 4, "true"))
    m = model.stages[0].mix.short_conv
    x = torch.randn(2, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    target = torch.randn(2, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    params = [m.in_proj.weight, m.in_proj.bias, m.conv.weight, m.conv.bias, m.out_proj.weight, m.out_proj.bias]
    got = torch.autograd.grad(((m(x, None) if throat == "causal" else m(x)) * target).sum(), [x, *params])
    want = torch.autograd.grad((_ref_of(m, x, throat == "causal") * target).sum(), [x, *params])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(lambda inp: m(inp, None) if throat == "causal" else m(inp), (x[:1, :5].detach().requires_grad_(),))


@pytest.mark.parametrize("size", [1, 2, 4])
def test_decoding_step_by_step_equals_the_full_pass(size):
    model = _model(_spec(size=size))
    Cache = sys.modules[type(model).__module__].Cache
    idx = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(5))
    full = model(idx)
    cache = Cache()
    parts = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 20)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-6, atol=1e-6)
    one = Cache()  # and one token at a time from the first
    steps = [model(idx[:, t : t + 1], cache=one) for t in range(20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-6, atol=1e-6)
    kept = [v for k, v in cache.state.items() if type(k).__name__.startswith("ShortConv")]
    assert len(kept) == 2 and all(v.shape == (2, size - 1, 16) for v in kept)  # size - 1 values of B x, not 20
    sample = model.generate(idx[:, :4], 8, temperature=0)
    assert torch.equal(sample, model.generate(idx[:, :4], 8, temperature=0, use_cache=False))


def test_state_bytes_are_the_same_at_16_and_4096_tokens():
    spec = _spec(size=4, context=4112, burn="")
    model = _model(spec, torch.float32)
    Cache = sys.modules[type(model).__module__].Cache
    part = ir.layout.layout(spec).part_of("stages.0.mix.short_conv.conv.weight")
    assert part.kind.state_kind == "window"
    seen = {}
    with torch.no_grad():
        for n in (16, 4096):
            cache = Cache()
            idx = torch.randint(0, 40, (1, n), generator=torch.Generator().manual_seed(6))
            for s in range(0, n, 1024):
                model(idx[:, s : s + 1024], cache=cache)
            model(idx[:, :1], cache=cache)  # and one decoding step
            seen[n] = cache.nbytes()
    assert seen[16] == seen[4096] == 2 * 4 * part.kind.state(part.node, 4096)  # layers x float32 bytes x the record's values
    assert part.kind.state(part.node, 16) == part.kind.state(part.node, 4096) == 16 * 3
    scaling = analyze(spec)["scaling"]
    assert scaling["exponents"]["state_bytes"] == 0


def test_the_kinds_record_is_what_the_module_holds_and_runs():
    from torch.utils.flop_counter import FlopCounterMode

    for bias in ("true", "false"):
        spec = _spec(size=5, bias=bias)
        model = _model(spec, torch.float32)
        part = ir.layout.layout(spec).part_of("stages.0.mix.short_conv.conv.weight")
        assert part.path == "stages.0-1.mix.short_conv" and part.role == "mixer" and part.kind.mixes_positions
        assert part.params == sum(p.numel() for p in model.stages[0].mix.short_conv.parameters())
        assert part.params == 4 * 16 * 16 + 16 * 5 + (5 * 16 if bias == "true" else 0)
        assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
        counter = FlopCounterMode(display=False)
        with counter:
            model.stages[0].mix.short_conv(torch.randn(1, 7, 16), None)
        assert counter.get_total_flops() == 7 * part.kind.flops(part.node, 7)[0]


def test_the_reviewer_and_the_diagram():
    assert "W140" not in {d.code for d in review(_spec(size=3))}
    one = [d for d in review(_spec(size=1)) if d.code == "W140"]
    assert len(one) == 1 and "no positions mix" in one[0].message  # the stage's one short conv, repeated
    assert "W109" not in {d.code for d in review(_spec(size=3))}  # it is a mixer
    dot = cyclelang.draw(_spec()).source
    assert "pintle injector" in dot and "Short conv · 3 taps · causal" in dot


def test_an_engine_of_short_convs_fires_as_a_scale_model_and_cools():
    spec = _spec(size=3, layers=3)
    small = ir.passes.shrink(spec, width=8, depth=3)
    part = ir.layout.layout(small).part_of("stages.2.mix.short_conv.conv.weight")
    assert part.node.width == 8 and part.repeat == 3
    report = cyclelang.fire(spec, width=8, depth=3, seq=8, batch=2)
    assert not report.failed
    src = cyclelang.codegen(spec)
    assert "nn.init.normal_(stage.mix.short_conv.out_proj.weight" in src  # the branch's output projection starts cooled


def test_the_generated_file_runs_with_torch_alone():
    import inspect
    import re

    from cyclelang.backends.torch.build import build, build_source

    for throat in ("causal", "open"):
        spec = _spec(throat, size=3)
        src = cyclelang.codegen(spec)
        assert not re.search(r"^import (?!math|torch)|^from (?!dataclasses|torch)", src, re.M)  # torch and the standard library only
        a, b = build_source(spec, src, seed=4), build(spec, seed=4)
        assert inspect.getsource(sys.modules[type(a).__module__]) == src
        for (k, v), (_, w) in zip(a.state_dict().items(), b.state_dict().items()):
            assert torch.equal(v, w), k


def test_mup_and_tensor_parallel_rules():
    from cyclelang.ir import kinds

    k = kinds.KINDS[ir.ShortConv]
    assert k.mup_sub == (("conv", "vector"),) and k.tp == "replicate"
