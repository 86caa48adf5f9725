"""`turbine linear_attention` held to the paper's equations (Katharopoulos et al. 2020).

The reference is written here from the recurrent form, one token at a time, in float64:

    S_t = g S_{t-1} + phi(k_t) v_t^T,   z_t = g z_{t-1} + phi(k_t),
    y_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps)      (normalised; else phi(q_t)^T S_t)

with phi(x) = elu(x) + 1 (or relu), g = 1 (the paper) or RetNet's 1 - 2^(-5 - h) per head;
with an open throat every position reads the sums over all positions. Weights are
perturbed away from their init.
"""

from __future__ import annotations

import sys

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.review import analyze, review

from .conftest import need

torch = need("torch")
F = torch.nn.functional

SPEC = """
engine linear_toy {{
  chamber width=24
  throat {throat}
  feed tokens vocab=40 context=300 position={position}
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  turbine linear_attention heads=3 {options}  merge cooling }}
    prechamber burn {{ norm rmsnorm  turbine mlp ratio=2  merge cooling }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def _spec(options="", throat="causal"):
    return cyclelang.parse(SPEC.format(throat=throat, options=options, position="none" if throat == "causal" else "learned"))


def _model(spec):
    torch.manual_seed(0)
    model = cyclelang.build(spec).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _reference(x, layer, heads, feature, normalize, decay, causal, eps=1e-6):
    """The mixer from its equations: projections, phi, the recurrence token by token."""
    B, T, C = x.shape
    d = layer.qkv.weight.size(0) // (3 * heads)
    qkv = x @ layer.qkv.weight.T + (layer.qkv.bias if layer.qkv.bias is not None else 0)
    q, k, v = (t.reshape(B, T, heads, d) for t in qkv.split(heads * d, dim=-1))
    phi = (lambda t: F.elu(t) + 1) if feature == "elu" else F.relu
    q, k = phi(q), phi(k)
    y = torch.zeros(B, T, heads, d, dtype=x.dtype)
    for b in range(B):
        for h in range(heads):
            g = 1 - 2.0 ** (-5 - h) if decay else 1.0
            if not causal:
                S = sum(torch.outer(k[b, s, h], v[b, s, h]) for s in range(T))
                z = k[b, :, h].sum(0)
            else:
                S, z = torch.zeros(d, d, dtype=x.dtype), torch.zeros(d, dtype=x.dtype)
            for t in range(T):
                if causal:
                    S = g * S + torch.outer(k[b, t, h], v[b, t, h])
                    z = g * z + k[b, t, h]
                num = q[b, t, h] @ S
                y[b, t, h] = num / (q[b, t, h] @ z + eps) if normalize else num
    return y.reshape(B, T, heads * d) @ layer.proj.weight.T + (layer.proj.bias if layer.proj.bias is not None else 0)


CASES = [("", "elu", True, False), ("retention", "elu", True, True), ("normalize=false retention", "elu", False, True),
         ("feature=relu bias=false", "relu", True, False)]


@pytest.mark.parametrize("options,feature,normalize,decay", CASES)
@pytest.mark.parametrize("chunk", [4, 64])  # several chunks (a ragged last one), and one chunk
def test_equals_the_recurrent_equations(options, feature, normalize, decay, chunk):
    model = _model(_spec(f"{options} chunk={chunk}"))
    layer = model.stages[0].mix.attn
    x = torch.randn(2, 11, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want = _reference(x, layer, 3, feature, normalize, decay, causal=True)
    assert torch.allclose(layer(x, None), want, atol=1e-6, rtol=0)


def test_an_open_throat_reads_the_sums_over_every_position():
    model = _model(_spec("", throat="open"))
    layer = model.stages[0].mix.attn
    x = torch.randn(2, 9, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(layer(x), _reference(x, layer, 3, "elu", True, False, causal=False), atol=1e-6, rtol=0)


@pytest.mark.parametrize("options", ["chunk=8", "retention chunk=8"])
def test_chunked_training_form_equals_recurrent_decoding(options):
    model = _model(_spec(options))
    Cache = sys.modules[type(model).__module__].Cache
    idx = torch.randint(0, 40, (2, 30), generator=torch.Generator().manual_seed(4))
    full = model(idx)
    cache = Cache()
    parts = [model(idx[:, :7], cache=cache), model(idx[:, 7:20], cache=cache)]
    parts += [model(idx[:, t : t + 1], cache=cache) for t in range(20, 30)]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10, rtol=0)
    sample = model.generate(idx[:, :4], 12, temperature=0)
    assert torch.equal(sample, model.generate(idx[:, :4], 12, temperature=0, use_cache=False))


def test_state_bytes_do_not_grow_from_16_to_256_tokens():
    model = _model(_spec("retention chunk=16")).float()
    Cache = sys.modules[type(model).__module__].Cache
    cache = Cache()
    idx = torch.randint(0, 40, (1, 256), generator=torch.Generator().manual_seed(5))
    seen = {}
    model(idx[:, :1], cache=cache)
    for t in range(1, 256):
        model(idx[:, t : t + 1], cache=cache)
        if t + 1 in (16, 256):
            seen[t + 1] = cache.nbytes()
    part = ir.layout.layout(_spec("retention chunk=16")).part_of("stages.0.mix.attn.qkv.weight")
    assert seen[16] == seen[256] == 2 * 4 * part.kind.state(part.node, 256)  # 2 stages, float32, the record's values
    assert part.kind.state(part.node, 16) == part.kind.state(part.node, 256) == 3 * 8 * 9  # heads x d x (d + the ones column)


@pytest.mark.parametrize("options", ["chunk=8", "normalize=false chunk=8", "retention chunk=8"])
def test_the_kinds_record_is_what_the_model_holds_and_runs(options):
    from torch.utils.flop_counter import FlopCounterMode

    spec = _spec(options)
    model = _model(spec).float()
    part = ir.layout.layout(spec).part_of("stages.0.mix.attn.qkv.weight")
    assert part.path == "stages.0-1.mix.attn" and part.role == "mixer" and part.kind.keyword == "linear_attention"
    assert part.params == sum(p.numel() for p in model.stages[0].mix.attn.parameters())
    assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
    for T in (8, 24, 5):
        counter = FlopCounterMode(display=False)
        with counter:
            model.stages[0].mix.attn(torch.randn(1, T, 24), None)
        assert counter.get_total_flops() == T * sum(part.kind.flops(part.node, T)), T
    assert part.kind.flops(part.node, 4096) == part.kind.flops(part.node, 64)


def test_a_linear_attention_is_a_mixer_to_the_reviewer_the_diagram_and_the_stand():
    spec = _spec("retention")
    assert "W109" not in {d.code for d in review(spec)}
    dot = cyclelang.draw(spec).source
    assert "expander injector" in dot and "Linear attention · 3 heads" in dot  # the kind's words and text.TITLES
    assert not cyclelang.fire(spec, seq=8, batch=2).failed
    assert "nn.init.normal_(stage.mix.attn.proj.weight" in cyclelang.codegen(spec)


def test_decay_with_an_open_throat_is_a_diagnostic():
    with pytest.raises(cyclelang.CycleError) as err:
        _spec("retention", throat="open")
    assert "E0232" in {d.code for d in err.value.diagnostics}
    with pytest.raises(cyclelang.CycleError) as err:
        cyclelang.parse(SPEC.format(throat="causal", options="", position="none").replace("heads=3", "heads=5"))  # 24 / 5
    assert "E0230" in {d.code for d in err.value.diagnostics}
