"""Attention sinks and gpt-oss's MoE, held to float64 references written here from gpt-oss's equations.

Sinks (gpt-oss): each head h has a learned logit z_h that joins every softmax's denominator,
p_j = exp(s_j) / (exp(z_h) + sum_j' exp(s_j')), and the sink's share is dropped: y = sum_j p_j v_j.
The clamped SwiGLU: gate = min(gate, L), up = clamp(up, -L, L), out = (up + 1) * gate * sigmoid(1.702 gate).
The router: logits = W x + b, the top k logits chosen, their softmax (over the k only) the weights.
Each reference is computed in float64 from the built module's own (perturbed) weights; decoding with the
cache equals recomputing; yarn with truncate=false is transformers' own table.
"""

from __future__ import annotations

import math
import sys

import pytest

import cyclelang

from .conftest import need

torch = need("torch")
from cyclelang.backends.torch.build import build  # noqa: E402

SPEC = """
engine e {{
  chamber width=32
  throat causal
  feed tokens vocab=50 context=40 position=none
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  turbine attention heads=4 {opts} }}
    prechamber burn {{ norm rmsnorm  turbine {burn} }}
  }}
  norm rmsnorm
  nozzle head
}}
"""
MOE = "moe experts=6 top=2 hidden=24 act=swiglu_clamp clamp=0.5 router_bias bias=true"


def model_of(opts="sinks bias=true", burn="mlp hidden=48 act=swiglu bias=false", seed=0):
    m = build(cyclelang.parse(SPEC.format(opts=opts, burn=burn)), seed=seed).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


def attention_reference(attn, x, *, window=None, sinks=True):
    """gpt-oss's attention of x (B, T, C) in float64: the sink one more logit in each head's softmax."""
    B, T, C = x.shape
    H, KV, D = attn.heads, attn.kv_heads, attn.head_dim
    q, k, v = (x @ attn.qkv.weight.T + attn.qkv.bias).split([H * D, KV * D, KV * D], -1)
    q = q.view(B, T, H, D).transpose(1, 2)
    k = k.view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, 1)
    v = v.view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, 1)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = (j <= i) & ((i - j < window) if window else True)
    e = torch.exp(s).masked_fill(~seen, 0.0)
    denominator = e.sum(-1, keepdim=True) + (torch.exp(attn.sinks)[None, :, None, None] if sinks else 0.0)
    y = ((e / denominator) @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("opts,window", [("sinks bias=true", None), ("kv_heads=2 window=4 sinks bias=true", 4),
                                         ("kv_heads=1 window=3 sinks bias=true dropout=0.1", 3)], ids=["mha", "gqa_window", "mqa_window_dropout"])
def test_sinks_equal_the_reference(opts, window):
    attn = model_of(opts).stages[0].mix.attn
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        got = attn(x, None, None)
        want = attention_reference(attn, x, window=window)
        plain = attention_reference(attn, x, window=window, sinks=False)
    assert (got - want).abs().max().item() < 1e-12 * want.abs().max().item()
    assert (plain - want).abs().max().item() > 1e-2 * want.abs().max().item()  # the sinks matter at these sizes


def test_a_large_sink_vents_the_whole_flow_and_a_very_negative_one_is_plain_attention():
    attn = model_of().stages[0].mix.attn
    x = torch.randn(1, 7, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        attn.sinks.fill_(-1e4)
        assert torch.allclose(attn(x, None, None), attention_reference(attn, x, sinks=False), atol=1e-12)
        attn.sinks.fill_(1e4)
        assert torch.allclose(attn(x, None, None), attn.proj.bias.expand(1, 7, 32), atol=1e-12)  # nothing attended: the bias alone


def test_sinks_are_one_learned_logit_per_head_with_a_gradient():
    m = model_of("kv_heads=2 sinks bias=true")
    attn = m.stages[0].mix.attn
    assert attn.sinks.shape == (4,)
    idx = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(3))
    m.train()
    _, loss = m(idx, idx)
    loss.backward()
    assert attn.sinks.grad is not None and attn.sinks.grad.abs().sum() > 0
    from cyclelang import ir
    from cyclelang.ir.kinds import kind_of
    a = ir.Attention(width=32, heads=4, kv_heads=2, head_dim=8, mask="causal", window=None, rotary_dims=0, rotary_base=1e4, qk_norm=False,
                     bias=True, dropout=0.0, sinks=True)
    assert kind_of(a).params(a, 32) == kind_of(a).params(a.model_copy(update={"sinks": False}), 32) + 4
    assert sum(p.numel() for p in attn.parameters()) == kind_of(a).params(a, 32)


def swiglu_clamp_reference(fc_w, fc_b, proj_w, proj_b, x, limit):
    """gpt-oss's expert: the fc rows [gate | up], the gate capped at limit, up clamped to [-limit, limit]."""
    h = x @ fc_w.T + fc_b
    gate, up = h.chunk(2, -1)
    gate, up = torch.minimum(gate, torch.tensor(limit, dtype=h.dtype)), torch.maximum(torch.minimum(up, torch.tensor(limit, dtype=h.dtype)),
                                                                                     torch.tensor(-limit, dtype=h.dtype))
    glu = gate * (1.0 / (1.0 + torch.exp(-1.702 * gate)))
    return ((up + 1.0) * glu) @ proj_w.T + proj_b


def test_the_clamped_swiglu_mlp_equals_the_reference_and_the_clamp_bites():
    m = model_of(burn="mlp hidden=24 act=swiglu_clamp clamp=0.5 bias=true")
    mlp = m.stages[0].burn.mlp
    x = 3.0 * torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        got = mlp(x)
        want = swiglu_clamp_reference(mlp.fc.weight, mlp.fc.bias, mlp.proj.weight, mlp.proj.bias, x, 0.5)
        loose = swiglu_clamp_reference(mlp.fc.weight, mlp.fc.bias, mlp.proj.weight, mlp.proj.bias, x, 1e9)
    assert (got - want).abs().max().item() < 1e-12 * want.abs().max().item()
    assert (loose - want).abs().max().item() > 1e-1 * want.abs().max().item()


def router_reference(moe, x, limit):
    """gpt-oss's MoE of x (N, C): logits W x + b, the top k of them, their softmax, the clamped experts."""
    logits = x @ moe.router.weight.T + moe.router.bias
    top, choice = torch.topk(logits, moe.top, dim=-1)
    weight = torch.exp(top - top.amax(-1, keepdim=True))
    weight = weight / weight.sum(-1, keepdim=True)
    y = torch.zeros_like(x)
    for n in range(x.size(0)):
        for r in range(moe.top):
            ex = moe.experts[int(choice[n, r])]
            y[n] += weight[n, r] * swiglu_clamp_reference(ex.fc.weight, ex.fc.bias, ex.proj.weight, ex.proj.bias, x[n], limit)
    return y


def test_the_biased_router_and_clamped_experts_equal_the_reference():
    m = model_of(burn=MOE)
    moe = m.stages[0].burn.moe
    assert moe.router.bias is not None and moe.router.bias.shape == (6,)
    with torch.no_grad():
        moe.router.bias.copy_(torch.linspace(-2, 2, 6, dtype=torch.float64))  # a bias that changes the choice
    x = 2.0 * torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        got = moe(x)
        want = router_reference(moe, x.reshape(-1, 32), 0.5).view(2, 7, 32)
        moe.router.bias.zero_()
        unbiased = router_reference(moe, x.reshape(-1, 32), 0.5).view(2, 7, 32)
    assert (got - want).abs().max().item() < 1e-12 * want.abs().max().item()
    assert (unbiased - want).abs().max().item() > 1e-2 * want.abs().max().item()


@pytest.mark.parametrize("opts", ["kv_heads=2 window=4 sinks rotary bias=true", "sinks rotary rotary_scaling=yarn rotary_factor=4 rotary_original=16 "
                                  "rotary_truncate=false bias=true"], ids=["window", "yarn"])
def test_decoding_with_the_cache_equals_recomputing(opts):
    model = build(cyclelang.parse(SPEC.format(opts=opts, burn=MOE)), seed=0).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    idx = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(6))
    want = idx
    with torch.no_grad():
        for _ in range(12):
            want = torch.cat((want, model(want)[:, -1:].argmax(-1)), 1)
        assert torch.equal(model.generate(idx, 12, temperature=0), want)
        full = model(want)  # (B, 16, V): every position at once
        cache = sys.modules[type(model).__module__].Cache(40)  # the generated file's Cache
        steps = [model(want[:, :4], cache=cache)] + [model(want[:, t : t + 1], cache=cache) for t in range(4, want.size(1))]
        assert (torch.cat(steps, 1) - full).abs().max().item() < 1e-10 * full.abs().max().item()


def test_yarn_without_truncation_is_transformers_table():
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from cyclelang.backends.torch.runtime.positions import scaled_rotary_tables

    for truncate in (True, False):
        cfg = PretrainedConfig()
        cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.max_position_embeddings = 64, 2, 32, 512
        cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 128,
                               "beta_fast": 32.0, "beta_slow": 1.0, "truncate": truncate}
        inv, gain = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        cos, sin = scaled_rotary_tables(20, 32, 150000.0, {"type": "yarn", "factor": 4.0, "original": 128, "beta_fast": 32.0,
                                                            "beta_slow": 1.0, "gain": gain, "truncate": truncate})
        freqs = torch.outer(torch.arange(20).float(), inv)
        assert torch.allclose(cos, torch.cat((freqs, freqs), -1).cos() * gain, atol=1e-6)
    a = scaled_rotary_tables(20, 32, 150000.0, {"type": "yarn", "factor": 4.0, "original": 128, "beta_fast": 32.0, "beta_slow": 1.0, "gain": 1.0})[0]
    b = scaled_rotary_tables(20, 32, 150000.0, {"type": "yarn", "factor": 4.0, "original": 128, "beta_fast": 32.0, "beta_slow": 1.0, "gain": 1.0,
                                                "truncate": False})[0]
    assert (a - b).abs().max() > 1e-4  # the rounding matters at these sizes


BAD = {  # the misuses the resolver refuses, each with its code
    "heads=4 rotary rotary_truncate=false": ("mlp hidden=48 act=swiglu", "E0240"),
    "heads=4": ("mlp hidden=48 act=swiglu clamp=3", "E0211"),
    "heads=4 ": ("moe experts=4 top=2 hidden=8 act=swiglu clamp=3", "E0211"),
}


@pytest.mark.parametrize("opts", sorted(BAD))
def test_misuses_are_refused(opts):
    burn, code = BAD[opts]
    with pytest.raises(Exception) as e:
        cyclelang.parse(SPEC.format(opts=opts.replace("heads=4", ""), burn=burn))
    assert code in str(e.value)
