"""`turbine delta` held to the paper's equations (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024).

The reference is written here from the recurrent form, one token and one head at a time, in
float64, with the state S (v_dim x head_dim) mapping a key to a value:

    c_t   = silu(sum_j w_j * x_{t-K+1+j})            the short causal depthwise conv on [q | k | v]
    q, k  = q / |q|, k / |k| (eps 1e-6 under the root); q / sqrt(head_dim)
    alpha = exp(-exp(A_log) * softplus(a_t + dt_bias)),  beta = sigmoid(b_t)
    S_t   = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
    o_t   = S_t q_t
    y_t   = W_out [ norm(o_t) * w * silu(z_t) ]        per head, norm(o) = o / rms(o)

with value head h reading query/key head h // (heads / k_heads). Weights are perturbed away
from their init.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.review import analyze, review

from .conftest import need

torch = need("torch")
F = torch.nn.functional

SPEC = """
engine delta_toy {{
  chamber width=24
  throat {throat}
  feed tokens vocab=40 context={context} position=none
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  turbine delta {options}  merge cooling }}
    prechamber burn {{ norm rmsnorm  turbine mlp ratio=2  merge cooling }}
  }}
  norm rmsnorm
  nozzle head
}}
"""

GQA = "heads=4 k_heads=2 head_dim=6 v_dim=5"


def _spec(options=GQA, throat="causal", context=300):
    return cyclelang.parse(SPEC.format(throat=throat, options=options, context=context))


def _model(spec):
    torch.manual_seed(0)
    model = cyclelang.build(spec).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _reference(x, layer, heads, k_heads, dk, dv, eps=1e-6, beta_max=1.0):
    """The mixer from its equations: projections, the conv, the norms, the rule token by token."""
    B, T, _ = x.shape
    qkv = x @ layer.in_proj_qkv.weight.T
    w = layer.conv1d.weight[:, 0]  # (channels, K)
    K = w.size(1)
    padded = torch.cat((qkv.new_zeros(B, K - 1, qkv.size(-1)), qkv), dim=1)
    conv = torch.stack([sum(w[:, j] * padded[:, t + j] for j in range(K)) for t in range(T)], dim=1)
    conv = F.silu(conv)
    q, k, v = conv.split([k_heads * dk, k_heads * dk, heads * dv], dim=-1)
    q, k, v = q.reshape(B, T, k_heads, dk), k.reshape(B, T, k_heads, dk), v.reshape(B, T, heads, dv)
    z = (x @ layer.in_proj_z.weight.T).reshape(B, T, heads, dv)
    beta = beta_max * torch.sigmoid(x @ layer.in_proj_b.weight.T)  # (B, T, heads); 2 x: negative eigenvalues allowed
    alpha = torch.exp(-layer.A_log.exp() * F.softplus(x @ layer.in_proj_a.weight.T + layer.dt_bias))
    eye = torch.eye(dk, dtype=x.dtype)
    out = [[[None] * heads for _ in range(T)] for _ in range(B)]
    for b in range(B):
        for h in range(heads):
            kh = h // (heads // k_heads)  # the query/key head this value head reads
            S = x.new_zeros(dv, dk)
            for t in range(T):
                qt = q[b, t, kh] / torch.sqrt(q[b, t, kh] @ q[b, t, kh] + 1e-6) / dk**0.5
                kt = k[b, t, kh] / torch.sqrt(k[b, t, kh] @ k[b, t, kh] + 1e-6)
                S = alpha[b, t, h] * S @ (eye - beta[b, t, h] * torch.outer(kt, kt)) + beta[b, t, h] * torch.outer(v[b, t, h], kt)
                o = S @ qt
                out[b][t][h] = o / torch.sqrt(o.pow(2).mean() + eps) * layer.norm * F.silu(z[b, t, h])
    y = torch.stack([torch.stack([torch.stack(row) for row in seq]) for seq in out])  # (B, T, heads, dv)
    return y.reshape(B, T, heads * dv) @ layer.out_proj.weight.T


CASES = [(GQA, 4, 2, 6, 5), ("heads=3 conv=2", 3, 3, 8, 8), ("heads=2 k_heads=1 head_dim=12 negative_eigenvalues eps=1e-5", 2, 1, 12, 12)]


@pytest.mark.parametrize("options,heads,k_heads,dk,dv", CASES)
@pytest.mark.parametrize("chunk", [4, 64])  # several chunks (a ragged last one), and one chunk
def test_equals_the_recurrent_equations(options, heads, k_heads, dk, dv, chunk):
    model = _model(_spec(f"{options} chunk={chunk}"))
    layer = model.stages[0].mix.delta
    x = torch.randn(2, 11, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    negative = "negative_eigenvalues" in options
    want = _reference(x, layer, heads, k_heads, dk, dv, 1e-5 if negative else 1e-6, 2.0 if negative else 1.0)
    assert torch.allclose(layer(x, None), want, atol=1e-10, rtol=0)


def test_gradients_equal_autograd_of_the_reference():
    model = _model(_spec(f"{GQA} chunk=4"))
    layer = model.stages[0].mix.delta
    x = torch.randn(2, 9, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    probe = torch.randn(2, 9, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    params = [x, *layer.parameters()]
    ours = torch.autograd.grad((layer(x, None) * probe).sum(), params)
    want = torch.autograd.grad((_reference(x, layer, 4, 2, 6, 5) * probe).sum(), params)
    for (name, _), a, b in zip([("x", None), *layer.named_parameters()], ours, want):
        assert torch.allclose(a, b, atol=1e-9, rtol=0), name


@pytest.mark.parametrize("T", [29, 37])  # not multiples of the chunk
def test_chunked_form_equals_the_step_recurrence(T):
    from cyclelang.backends.torch.runtime.scan import gated_delta_scan

    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 3, T, 6, generator=g, dtype=torch.float64), torch.randn(2, 3, T, 6, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64)
    decay = -torch.rand(2, 3, T, generator=g, dtype=torch.float64) * 3
    beta = torch.rand(2, 3, T, generator=g, dtype=torch.float64)
    start = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64)
    chunked, end = gated_delta_scan(q, k, v, decay, beta, 8, start)
    state, steps = start, []
    for t in range(T):
        y, state = gated_delta_scan(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], decay[:, :, t : t + 1], beta[:, :, t : t + 1], 8, state)
        steps.append(y)
    assert torch.allclose(chunked, torch.cat(steps, dim=2), atol=1e-6, rtol=0)
    assert torch.allclose(end, state, atol=1e-6, rtol=0)


def test_decoding_with_the_cache_equals_the_full_forward():
    model = _model(_spec(f"{GQA} chunk=8"))
    Cache = sys.modules[type(model).__module__].Cache
    idx = torch.randint(0, 40, (2, 30), generator=torch.Generator().manual_seed(6))
    full = model(idx)
    cache = Cache()
    parts = [model(idx[:, :7], cache=cache), model(idx[:, 7:20], cache=cache)]
    parts += [model(idx[:, t : t + 1], cache=cache) for t in range(20, 30)]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10, rtol=0)
    sample = model.generate(idx[:, :4], 12, temperature=0)
    assert torch.equal(sample, model.generate(idx[:, :4], 12, temperature=0, use_cache=False))


def test_state_bytes_are_the_same_at_16_and_4096_tokens():
    spec = _spec(f"{GQA} chunk=64", context=4096)
    model = _model(spec).float()
    Cache = sys.modules[type(model).__module__].Cache
    idx = torch.randint(0, 40, (1, 4096), generator=torch.Generator().manual_seed(7))
    seen = {}
    with torch.no_grad():
        for n in (16, 4096):
            cache = Cache()
            model(idx[:, : n - 1], cache=cache)  # the chunked form, then one decoding step
            model(idx[:, n - 1 : n], cache=cache)
            seen[n] = cache.nbytes()
    part = ir.layout.layout(spec).part_of("stages.0.mix.delta.out_proj.weight")
    assert seen[16] == seen[4096] == 2 * 4 * part.kind.state(part.node, 4096)  # 2 stages, float32, the record's values
    # the conv window ([q | k | v] channels x (conv - 1)) and S (heads x head_dim x v_dim)
    assert part.kind.state(part.node, 16) == part.kind.state(part.node, 4096) == (2 * 12 + 20) * 3 + 4 * 6 * 5
    assert part.kind.state_kind == "recurrent"


def test_the_kinds_record_is_what_the_model_holds():
    spec = _spec(f"{GQA} chunk=8")
    model = _model(spec)
    part = ir.layout.layout(spec).part_of("stages.0.mix.delta.in_proj_qkv.weight")
    assert part.path == "stages.0-1.mix.delta" and part.role == "mixer" and part.kind.keyword == "delta"
    assert part.params == sum(p.numel() for p in model.stages[0].mix.delta.parameters())
    assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
    assert part.kind.flops(part.node, 4096) == part.kind.flops(part.node, 8) == part.kind.flops(part.node, 100)  # exponent 1
    assert part.kind.flops(part.node, 4)[1] < part.kind.flops(part.node, 8)[1]
    from torch.utils.flop_counter import FlopCounterMode

    layer = model.stages[0].mix.delta.float()
    for T in (8, 24, 5):  # one chunk, three, and less than one
        counter = FlopCounterMode(display=False)
        with counter:
            layer(torch.randn(1, T, 24), None)
        assert counter.get_total_flops() == T * sum(part.kind.flops(part.node, T)), T


def test_a_gated_delta_is_a_mixer_to_the_reviewer_the_diagram_and_the_stand():
    spec = _spec(GQA)
    assert "W109" not in {d.code for d in review(spec)}
    dot = cyclelang.draw(spec).source
    assert "pintle injector" in dot and "Gated DeltaNet · 4 heads" in dot  # the kind's words and text.TITLES
    assert not cyclelang.fire(spec, seq=8, batch=2).failed
    assert "nn.init.normal_(stage.mix.delta.out_proj.weight" in cyclelang.codegen(spec)


def test_the_generated_file_runs_with_only_torch(tmp_path):
    source = cyclelang.codegen(_spec(f"{GQA} chunk=4"))
    assert "cyclelang" not in "\n".join(ln for ln in source.splitlines() if ln.startswith(("import", "from")))
    (tmp_path / "model.py").write_text(source)
    run = ("import sys, torch; sys.modules['cyclelang'] = None; import model; m = model.build() if hasattr(model, 'build') else None; "
           "from model import *; print('ok')")
    done = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_an_open_throat_and_uneven_heads_are_diagnostics():
    with pytest.raises(cyclelang.CycleError) as err:
        _spec(GQA, throat="open")
    assert "E0284" in {d.code for d in err.value.diagnostics}
    with pytest.raises(cyclelang.CycleError) as err:
        _spec("heads=4 k_heads=3 head_dim=6")
    assert "E0285" in {d.code for d in err.value.diagnostics}
    with pytest.raises(cyclelang.CycleError) as err:
        _spec("heads=5")  # 24 / 5, no head_dim
    assert "E0230" in {d.code for d in err.value.diagnostics}


# --- attention's output gate (gate=channel|head, Qwen3-Next) ----------------------------------------------

GATED = """
engine gated {{
  chamber width=24
  throat causal
  feed tokens vocab=40 context=64 position=none
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  turbine attention heads=4 kv_heads=2 rotary gate={gate} bias=true  merge cooling }}
    prechamber burn {{ norm rmsnorm  turbine mlp ratio=2  merge cooling }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


@pytest.mark.parametrize("gate", ["channel", "head"])
def test_the_output_gate_is_sigmoid_of_a_projection_times_each_head(gate):
    spec = cyclelang.parse(GATED.format(gate=gate))
    model = _model(spec)
    layer = model.stages[0].mix.attn
    seen = {}
    layer.proj.register_forward_hook(lambda m, i, o: seen.setdefault("y", i[0]))
    plain = cyclelang.parse(GATED.format(gate="none"))
    ungated = _model(plain)
    ungated.load_state_dict({k: v for k, v in model.state_dict().items() if ".gate." not in k})
    ungated.stages[0].mix.attn.proj.register_forward_hook(lambda m, i, o: seen.setdefault("plain", i[0]))
    idx = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        model(idx), ungated(idx)
    g = torch.sigmoid(layer.gate(model.stages[0].mix.norm(model.feed(idx))))  # from the branch's input: the first layer's normed embedding
    want = seen["plain"] * (g if gate == "channel" else g.repeat_interleave(6, dim=-1))
    assert torch.allclose(seen["y"], want, atol=1e-12, rtol=0)
    part = ir.layout.layout(spec).part_of("stages.0.mix.attn.gate.weight")
    rows = 24 if gate == "channel" else 4
    assert part.params == sum(p.numel() for p in layer.parameters())
    assert part.params == ir.kinds.params(part.node.model_copy(update={"gate": "none"})) + rows * 25
    assert part.kind.flops(part.node, 7)[0] == part.kind.flops(part.node.model_copy(update={"gate": "none"}), 7)[0] + 2 * 24 * rows
    assert f"output gate per {gate}" in cyclelang.draw(spec).source
