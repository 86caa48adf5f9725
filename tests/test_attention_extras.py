"""ALiBi and the attention logit soft-cap, held to references written here from their papers' equations.

ALiBi (Press et al., 2022): score(i, j) = q_i . k_j * scale - m_h * (i - j), with m_h the
geometric slopes 2^(-8h/n); Falcon multiplies the bias by the scale as well. The soft-cap
(Gemma 2): score = cap * tanh(q . k * scale / cap), then the mask. Each is computed in
float64 from the built module's own (perturbed) weights and compared with its forward,
with and without a sliding window and GQA, and decoding with the cache equals recomputing.
"""

from __future__ import annotations

import math

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
    prechamber mix {{ norm rmsnorm  turbine attention heads=4 {opts} bias=false }}
    prechamber burn {{ norm rmsnorm  turbine mlp hidden=48 act=swiglu bias=false }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def slopes(n):
    return torch.tensor([2 ** (-8 * (h + 1) / n) for h in range(n)], dtype=torch.float64)


def reference(attn, x, *, alibi=None, softcap=None, window=None, scale=None):
    """The attention of x (B, T, C) in float64 from the module's weights."""
    B, T, C = x.shape
    H, KV, D = attn.heads, attn.kv_heads, attn.head_dim
    W = attn.qkv.weight.double()
    q, k, v = (x.double() @ W.T).split([H * D, KV * D, KV * D], -1)
    q = q.view(B, T, H, D).transpose(1, 2)
    k = k.view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, 1)
    v = v.view(B, T, KV, D).transpose(1, 2).repeat_interleave(H // KV, 1)
    s = (q @ k.transpose(-2, -1)) * (scale or D ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if alibi:
        bias = -slopes(H)[:, None, None] * (i - j)
        s = s + (bias * (scale or D ** -0.5) if alibi == "scaled" else bias)
    seen = (j <= i) & ((i - j < window) if window else True)
    s = s.masked_fill(~seen, -math.inf)
    y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ attn.proj.weight.double().T


CASES = {
    "alibi": ("alibi", dict(alibi="added")),
    "alibi_scaled_gqa": ("kv_heads=2 alibi alibi_scaled", dict(alibi="scaled")),
    "alibi_window": ("alibi window=5", dict(alibi="added", window=5)),
    "softcap_rotaryless": ("softcap=2", dict(softcap=2.0)),
    "softcap_gqa_window_scale": ("kv_heads=1 softcap=1.5 window=4 scale=0.5", dict(softcap=1.5, window=4, scale=0.5)),
    "softcap_alibi": ("alibi softcap=3", dict(alibi="added", softcap=3.0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_equals_the_reference(case):
    opts, kw = CASES[case]
    model = build(cyclelang.parse(SPEC.format(opts=opts)), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    attn = model.stages[0].mix.attn
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = attn(x, None, None) if "cache" in attn.forward.__code__.co_varnames else attn(x)
    want = reference(attn, x, **kw)
    assert (got.double() - want).abs().max().item() < 1e-5 * want.abs().max().item()
    if kw.get("softcap") or kw.get("alibi"):  # the option matters here: the plain attention differs
        plain = reference(attn, x, window=kw.get("window"), scale=kw.get("scale"))
        assert (plain - want).abs().max().item() > 1e-3 * want.abs().max().item()


@pytest.mark.parametrize("case", sorted(CASES))
def test_decoding_with_the_cache_equals_recomputing(case):
    model = build(cyclelang.parse(SPEC.format(opts=CASES[case][0])), seed=0).eval()
    idx = torch.randint(0, 50, (1, 4), generator=torch.Generator().manual_seed(2))
    want = idx
    with torch.no_grad():
        for _ in range(12):
            want = torch.cat((want, model(want)[:, -1:].argmax(-1)), 1)
    assert torch.equal(model.generate(idx, 12, temperature=0), want)


def test_final_logit_softcap_bounds_the_logits():
    text = SPEC.format(opts="rotary").replace("nozzle head", "nozzle head softcap=2.5")
    model = build(cyclelang.parse(text), seed=0).eval()
    plain = build(cyclelang.parse(SPEC.format(opts="rotary")), seed=0).eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in plain.parameters():
            p.mul_(4.0)
        model.load_state_dict(plain.state_dict())
        idx = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(3))
        z = plain(idx)
        assert torch.allclose(model(idx), 2.5 * torch.tanh(z / 2.5), atol=1e-6)
        assert z.abs().max() > 2.5  # the cap bites


def test_slopes_are_the_papers_for_a_power_of_two_and_the_interleave_beyond():
    from cyclelang.backends.torch.runtime.positions import alibi_slopes

    assert torch.allclose(alibi_slopes(8).double(), slopes(8))
    # 6 heads: the 4 slopes of 4 heads, then the odd powers of 8 heads' base (Press et al.'s code, BLOOM, Falcon)
    assert torch.allclose(alibi_slopes(6).double(), torch.cat((slopes(4), slopes(8)[[0, 2]])))


BAD = {  # the options around rotary scaling, ALiBi and the soft-cap that cannot hold, each with its code
    "rotary rotary_scaling=linear rotary_factor=2 rotary_original=5": "E0240",
    "rotary rotary_factor=2": "E0240",
    "rotary rotary_scaling=yarn rotary_factor=2 rotary_low=2": "E0240",
    "rotary_scaling=yarn rotary_factor=2": "E0241",
    "rotary rotary_scaling=llama3": "E0242",
    "rotary rotary_scaling=llama3 rotary_factor=2 rotary_low=4 rotary_high=1": "E0243",
    "alibi_scaled": "E0211",
    "softcap=0": "E0205",
    "rotary rotary_scaling=nope rotary_factor=2": "E0203",  # not one of the choices
}


@pytest.mark.parametrize("opts", sorted(BAD))
def test_unholdable_options_are_located_diagnostics(opts):
    from cyclelang.diagnostics import CycleError

    with pytest.raises(CycleError) as info:
        cyclelang.parse(SPEC.format(opts=opts))
    codes = [d.code for d in info.value.diagnostics]
    assert codes == [BAD[opts]], codes  # one error, no cascade
    d = info.value.diagnostics[0]
    assert d.span is not None and d.span.line == 7
