"""`turbine ssm version=1`, Mamba-1's mixer (Gu & Dao 2023) as Jamba and Mamba use it.

Held to transformers' MambaForCausalLM and JambaForCausalLM (tiny random configs,
perturbed weights; the whole-model proofs, through interop, are in test_families.py)
and here to the paper's recurrence written out in float64, one position at a time;
the chunked scan equals the recurrent decoding step, the decoding state does not grow,
and the parameter count, FLOPs and state bytes the kinds record claims are what the
module holds and runs.
"""

from __future__ import annotations

import math
import sys

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.review import analyze, review

from .conftest import ROOT, need

torch = need("torch")
transformers = need("transformers")  # in CI a missing reference fails, it does not skip

SPEC = """
engine m1 {{
  chamber width=24
  throat causal
  feed tokens vocab=40 context=300 position=none
  stage block x {layers} {{
    prechamber mix {{ norm rmsnorm eps=1e-5  turbine ssm version=1 state=6 expand=2 dt_rank=4 conv=3 chunk={chunk} {extra} }}
  }}
  norm rmsnorm eps=1e-5
  nozzle head
}}
"""


def _spec(layers=2, chunk=4, extra="norms"):
    return cyclelang.parse(SPEC.format(layers=layers, chunk=chunk, extra=extra))


def _perturbed(spec, seed=1):
    model = cyclelang.build(spec, seed=0).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def reference_scan(x, dt, A, B, C):
    """The paper's recurrence, one position at a time: h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t, y_t = h_t C_t."""
    b, T, d = x.shape
    h = torch.zeros(b, d, A.size(-1), dtype=x.dtype)
    ys = []
    for t in range(T):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[..., None] * B[:, t, None, :]
        ys.append((h * C[:, t, None, :]).sum(-1))
    return torch.stack(ys, dim=1), h


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_the_chunked_scan_is_the_recurrence_in_float64(chunk):
    from cyclelang.backends.torch.runtime.scan import selective_scan

    g = torch.Generator().manual_seed(0)
    b, T, d, n = 2, 19, 5, 4
    x = torch.randn(b, T, d, generator=g, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(b, T, d, generator=g, dtype=torch.float64))
    A = -torch.exp(torch.randn(d, n, generator=g, dtype=torch.float64))
    B = torch.randn(b, T, n, generator=g, dtype=torch.float64)
    C = torch.randn(b, T, n, generator=g, dtype=torch.float64)
    want, h = reference_scan(x, dt, A, B, C)
    got, state = selective_scan(x, dt, A, B, C, chunk)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state, h, rtol=1e-12, atol=1e-12)
    # a state carried in: the second half continues from the first half's
    y1, s1 = selective_scan(x[:, :7], dt[:, :7], A, B[:, :7], C[:, :7], chunk)
    y2, s2 = selective_scan(x[:, 7:], dt[:, 7:], A, B[:, 7:], C[:, 7:], chunk, s1)
    torch.testing.assert_close(torch.cat((y1, y2), 1), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2, h, rtol=1e-12, atol=1e-12)


def test_long_steps_do_not_overflow():
    """Decays are multiplied, never divided: a step of 50 on a rate of -16 (exp(-800)) stays finite."""
    from cyclelang.backends.torch.runtime.scan import selective_scan

    x, dt = torch.ones(1, 40, 2), torch.full((1, 40, 2), 50.0)
    A = torch.tensor([[-16.0, -1.0], [-1.0, -16.0]])
    y, state = selective_scan(x, dt, A, torch.ones(1, 40, 2), torch.ones(1, 40, 2), 32)
    assert torch.isfinite(y).all() and torch.isfinite(state).all()
    torch.testing.assert_close(y[0, -1], torch.tensor([100.0, 100.0]))  # the past decayed to nothing: each dim holds dt x B = 50


@pytest.mark.parametrize("norms", [True, False], ids=["jamba", "mamba"])
def test_the_mixer_equals_transformers_mixer(norms):
    """The module alone against JambaMambaMixer (with its dt/B/C norms) or MambaMixer, weights copied by name."""
    spec = _spec(extra="norms" if norms else "")
    ours = _perturbed(spec).stages[0].mix.ssm
    if norms:
        cfg = transformers.JambaConfig(hidden_size=24, mamba_d_state=6, mamba_expand=2, mamba_dt_rank=4, mamba_d_conv=3, rms_norm_eps=1e-6,
                                       num_attention_heads=2, num_key_value_heads=2, use_mamba_kernels=False)
        from transformers.models.jamba.modeling_jamba import JambaMambaMixer as Mixer
    else:
        cfg = transformers.MambaConfig(hidden_size=24, state_size=6, expand=2, time_step_rank=4, conv_kernel=3)
        from transformers.models.mamba.modeling_mamba import MambaMixer as Mixer
    theirs = Mixer(cfg, layer_idx=0).eval()
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(mine[{"dt_proj.weight": "dt_weight", "dt_proj.bias": "dt_bias"}.get(name, name)])
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(2, 13, 24, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = theirs(x)
        got = ours(x, None)
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5


def test_decoding_step_equals_the_chunked_scan_and_the_state_stays_fixed():
    model = _perturbed(_spec())
    Cache = sys.modules[type(model).__module__].Cache
    idx = torch.randint(0, 40, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(idx)
        cache = Cache()
        parts = [model(idx[:, :7], cache=cache), model(idx[:, 7:18], cache=cache)]  # a ragged prefill, then several tokens at once
        sizes = []
        for t in range(18, 30):
            parts.append(model(idx[:, t : t + 1], cache=cache))
            sizes.append(cache.nbytes())
    assert ((torch.cat(parts, 1) - full).abs().max() / full.abs().max()).item() < 1e-5
    assert len(set(sizes)) == 1
    part = ir.layout.layout(_spec()).part_of("stages.0.mix.ssm.A_log")
    assert part.path == "stages.0-1.mix.ssm" and part.kind.state_kind == "recurrent"
    assert sizes[0] == 2 * 2 * 4 * part.kind.state(part.node, 30)  # batch x layers x float32 bytes x the record's values
    assert part.kind.state(part.node, 30) == 48 * 2 + 48 * 6  # inner x (conv - 1) + inner x state
    assert torch.equal(model.generate(idx[:1, :5], 12, temperature=0), model.generate(idx[:1, :5], 12, temperature=0, use_cache=False))


def test_state_bytes_do_not_grow_from_16_to_256_tokens():
    model = cyclelang.build(_spec(layers=1)).eval()
    Cache = sys.modules[type(model).__module__].Cache
    cache, seen = Cache(), {}
    idx = torch.randint(0, 40, (1, 256), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        for t in range(256):
            model(idx[:, t : t + 1], cache=cache)
            if t + 1 in (16, 256):
                seen[t + 1] = cache.nbytes()
    assert seen[16] == seen[256] > 0


@pytest.mark.parametrize("extra", ["norms", "", "bias=true conv_bias=false"])
def test_the_kinds_record_is_what_the_model_holds_and_runs(extra):
    from torch.utils.flop_counter import FlopCounterMode

    spec = _spec(chunk=8, extra=extra)
    model = cyclelang.build(spec)
    part = ir.layout.layout(spec).part_of("stages.0.mix.ssm.in_proj.weight")
    assert part.role == "mixer" and part.kind.mixes_positions and isinstance(part.node, ir.Mamba1)
    assert part.params == sum(p.numel() for p in model.stages[0].mix.ssm.parameters())
    assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
    for T in (8, 24, 5):
        counter = FlopCounterMode(display=False)
        with counter:
            model.stages[0].mix.ssm(torch.randn(1, T, 24), None)
        proj, mixing = part.kind.flops(part.node, T)
        assert counter.get_total_flops() == T * (proj + mixing), T
    assert part.kind.flops(part.node, 4096) == part.kind.flops(part.node, 64)  # per token: flat in the context


def test_dt_rank_defaults_to_a_sixteenth_of_the_width():
    text = SPEC.format(layers=1, chunk=4, extra="").replace(" dt_rank=4", "").replace("width=24", "width=40")
    node = cyclelang.parse(text).engine.body[0].ops[0].ops[1]
    assert node.dt_rank == math.ceil(40 / 16) == 3 and node.inner == 80 and node.eps == 1e-6 and node.state == 6


@pytest.mark.parametrize("option,code,words", [
    ("version=1 heads=4", "E0280", "heads= belongs to Mamba-2's mixer"),
    ("version=1 dt_hi=0.5", "E0280", "no clamp on the step"),
    ("dt_rank=4", "E0280", "dt_rank= belongs to Mamba-1's mixer"),
    ("norms", "E0280", "norms= belongs to Mamba-1's mixer"),
    ("version=1 expand=1.01", "E0209", "not a whole width"),
    ("version=3", "E0205", "at most 2"),
])
def test_bad_options_are_diagnostics(option, code, words):
    text = f"""
engine bad {{
  chamber width=32
  throat causal
  feed tokens vocab=40 context=64 position=none
  stage block {{ prechamber mix {{ norm rmsnorm  turbine ssm heads=4 {option} }} }}
  norm rmsnorm
  nozzle head
}}
""".replace("heads=4 version=1 heads=4", "version=1 heads=4").replace("heads=4 version=1", "version=1")
    with pytest.raises(cyclelang.CycleError) as err:
        cyclelang.parse(text)
    found = [d for d in err.value.diagnostics if d.code == code]
    assert found and words in found[0].message, [str(d) for d in err.value.diagnostics]
    assert len(err.value.diagnostics) == 1  # refused once, not again as an unknown option


@pytest.mark.slow  # fires jamba at the stand
def test_a_mamba1_mixer_is_a_mixer_to_the_reviewer_the_diagram_the_report_and_the_stand():
    spec = _spec()
    assert "W109" not in {d.code for d in review(spec)}
    dot = cyclelang.draw(spec).source
    assert "SSM (Mamba-1) · 48 channels" in dot and "state 6" in dot and "dt rank 4 · conv 3 · dt/B/C norms" in dot
    scaling = analyze(spec)["scaling"]
    assert scaling["exponents"]["state_bytes"] == 0 and scaling["exponents"]["attention_flops"] == 1
    cooled = cyclelang.codegen(cyclelang.parse(SPEC.format(layers=2, chunk=4, extra="norms  merge cooling")))
    assert "nn.init.normal_(stage.mix.ssm.out_proj.weight" in cooled
    report = cyclelang.fire(cyclelang.load(ROOT / "specs" / "jamba.cycle"), width=32, depth=8, seq=16, batch=2)
    assert not report.failed
    kv = {c.name: c for c in report.runs[0].checks}["kv_cache"]
    assert kv.status == "pass"


def test_the_jamba_library_spec_keeps_a_fixed_state_beside_two_kv_caches():
    spec = cyclelang.load(ROOT / "specs" / "jamba.cycle")
    lay = ir.layout.layout(spec)
    mixers = [p for p in lay.parts() if p.role == "mixer"]
    assert sum(len(p.instances()) for p in mixers if isinstance(p.node, ir.Mamba1)) == 14
    assert sum(len(p.instances()) for p in mixers if isinstance(p.node, ir.Attention)) == 2
    n = 2048
    fixed = sum(len(p.instances()) * p.kind.state(p.node, n) for p in mixers if isinstance(p.node, ir.Mamba1))
    kv = sum(len(p.instances()) * p.kind.state(p.node, n) for p in mixers if isinstance(p.node, ir.Attention))
    assert fixed == 14 * 1024 * (3 + 16) and kv == 2 * 2 * 2 * 64 * n  # 532 KiB and 1,024 bytes a token at 2-byte values
