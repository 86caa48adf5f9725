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


# --- the qk-norm's shapes, squared ReLU and the (1 + w) LayerNorm --------------------------------
# qk-norm (Dehghani et al. 2023): q and k of each head normalised before their dot product, as
# RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g or LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b;
# g is offset + w (Gemma 3: 1 + w), or 1 without a learned gain (nanochat), and the norm acts on
# the rotated q and k when it comes after rotary (nanochat). Rotary (Su et al.): the first
# rotary_dims channels of a head turn by pos * base^(-2i / rotary_dims), the two halves paired.


def rope_ref(x, rd, base=10000.0):
    """x (B, H, T, D) with its first rd channels rotated, the two halves paired (GPT-NeoX, Llama)."""
    T = x.size(2)
    inv = base ** (-torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    r, rest = x[..., :rd], x[..., rd:]
    turned = torch.cat((-r[..., rd // 2:], r[..., : rd // 2]), -1)
    return torch.cat((r * cos + turned * sin, rest), -1)


def qk_norm_ref(x, norm, kind, offset, eps):
    """One qk-norm of x (B, H, T, D) by its equation, the module's gain and bias read from `norm`."""
    g = (offset + norm.weight.double()) if getattr(norm, "weight", None) is not None else 1.0
    b = norm.bias.double() if getattr(norm, "bias", None) is not None else 0.0
    if getattr(norm, "heads", None):  # each head its own gain (and bias), heads * D of them, head by head
        g = g.view(norm.heads, 1, -1)
        b = b.view(norm.heads, 1, -1) if torch.is_tensor(b) else b
    if kind == "layernorm":
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps) * g + b
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * g


def qk_reference(attn, x, *, rd, kind="rmsnorm", offset=0.0, late=False, eps=1e-6, norm=True):
    """Causal attention of x (B, T, C) in float64, q and k through the qk-norms as the options say."""
    B, T, C = x.shape
    H, KV, D = attn.heads, attn.kv_heads, attn.head_dim
    q, k, v = (x.double() @ attn.qkv.weight.double().T).split([H * D, KV * D, KV * D], -1)
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
    nq = (lambda t: qk_norm_ref(t, attn.q_norm, kind, offset, eps)) if norm else (lambda t: t)
    nk = (lambda t: qk_norm_ref(t, attn.k_norm, kind, offset, eps)) if norm else (lambda t: t)
    if not late:
        q, k = nq(q), nk(k)
    q, k = rope_ref(q, rd), rope_ref(k, rd)
    if late:
        q, k = nq(q), nk(k)
    k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    s = (q @ k.transpose(-2, -1)) * D ** -0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ attn.proj.weight.double().T


QK_CASES = {  # options -> (rotated dims of head_dim 8, the reference's keywords)
    "gemma3_offset_gain": ("rotary qk_norm qk_norm_offset=1", 8, dict(offset=1.0)),
    "persimmon_layernorm_bias": ("rotary=0.5 qk_norm qk_norm_type=layernorm qk_norm_bias qk_norm_eps=1e-5", 4, dict(kind="layernorm", eps=1e-5)),
    "layernorm_no_bias_gqa": ("kv_heads=2 rotary qk_norm qk_norm_type=layernorm", 8, dict(kind="layernorm")),
    "nanochat_weightless_after_rotary": ("rotary qk_norm qk_norm_affine=false qk_norm_after_rotary", 8, dict(late=True)),
    "gained_after_rotary_gqa": ("kv_heads=1 rotary=0.5 qk_norm qk_norm_after_rotary", 4, dict(late=True)),
    "stablelm_head_gains_layernorm_gqa": ("kv_heads=2 rotary=0.5 qk_norm qk_norm_type=layernorm qk_norm_head_gains", 4, dict(kind="layernorm")),
    "cohere_head_gains_bias_offset": ("rotary qk_norm qk_norm_type=layernorm qk_norm_bias qk_norm_head_gains qk_norm_offset=1", 8,
                                      dict(kind="layernorm", offset=1.0)),
    "head_gains_rms_after_rotary": ("kv_heads=1 rotary qk_norm qk_norm_head_gains qk_norm_after_rotary", 8, dict(late=True)),
    "layernorm_offset_weightless": ("rotary qk_norm qk_norm_type=layernorm qk_norm_affine=false", 8, dict(kind="layernorm")),
}


def rope_of(model, attn, T):
    """The rotary tables the model hands its attention for T positions (captured from a forward)."""
    got = {}
    hook = attn.register_forward_pre_hook(lambda module, args: got.update(rope=args[1]))
    with torch.no_grad():
        model(torch.zeros(1, T, dtype=torch.long))
    hook.remove()
    return got["rope"]


@pytest.mark.parametrize("case", sorted(QK_CASES))
def test_qk_norm_shapes_equal_their_equations(case):
    opts, rd, kw = QK_CASES[case]
    model = build(cyclelang.parse(SPEC.format(opts=opts)), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    attn = model.stages[0].mix.attn
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = attn(x, rope_of(model, attn, 11), None)
    want = qk_reference(attn, x, rd=rd, **kw)
    assert (got.double() - want).abs().max().item() < 1e-5 * want.abs().max().item()
    # each part of the shape matters here: the offset, the place (before or after rotary), the kind
    for other in (dict(kw, offset=0.0 if kw.get("offset") else 1.0), dict(kw, late=not kw.get("late", False)),
                  dict(kw, kind="rmsnorm" if kw.get("kind") == "layernorm" else "layernorm")):
        weightless = getattr(attn.q_norm, "weight", None) is None
        if weightless and (other.get("offset") or (other.get("late", False) != kw.get("late", False) and rd == 8 and other.get("kind") != "layernorm")):
            continue  # no gain, no offset; a weightless RMSNorm of a whole head commutes with rotary, which keeps its length
        wrong = qk_reference(attn, x, rd=rd, **other)
        assert (wrong - want).abs().max().item() > 1e-3 * want.abs().max().item(), other


@pytest.mark.parametrize("case", sorted(QK_CASES))
def test_qk_norm_shapes_decode_with_the_cache_as_recomputing(case):
    model = build(cyclelang.parse(SPEC.format(opts=QK_CASES[case][0])), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    idx = torch.randint(0, 50, (1, 4), generator=torch.Generator().manual_seed(2))
    want = idx
    with torch.no_grad():
        for _ in range(10):
            want = torch.cat((want, model(want)[:, -1:].argmax(-1)), 1)
    assert torch.equal(model.generate(idx, 10, temperature=0), want)


def test_qk_norm_parameters_are_counted_as_built():
    from cyclelang.review import analyze

    for opts, _, _ in QK_CASES.values():
        spec = cyclelang.parse(SPEC.format(opts=opts))
        assert analyze(spec)["params"]["total"] == sum(p.numel() for p in build(spec, seed=0).parameters()), opts


def test_head_gains_are_vectors_to_decay_and_mup():
    """Each head's qk-norm gains are one vector (heads * head_dim): no weight decay, μP's vector rule."""
    text = SPEC.format(opts="rotary qk_norm qk_norm_head_gains").replace("nozzle head", "nozzle head\n  startup { param mup base_width=16 }")
    model = build(cyclelang.parse(text), seed=0)
    q = model.stages[0].mix.attn.q_norm
    assert q.weight.shape == (4 * 8,) and torch.equal(q.weight, torch.ones(32))  # the gains start at 1, as the standard init's
    opt, _ = model.configure_optimizer()
    group = next(g for g in opt.param_groups if any(p is q.weight for p in g["params"]))
    assert group["weight_decay"] == 0.0 and group["rule"] == "vector"


def test_relu2_and_the_offset_layernorm_equal_their_equations():
    """relu2(x) = relu(x)^2 (Primer); LayerNorm1P (Nemotron): (x - mean) / sqrt(var + eps) * (1 + w) + b."""
    text = (SPEC.format(opts="rotary").replace("hidden=48 act=swiglu", "hidden=48 act=relu2")
            .replace("norm rmsnorm  turbine mlp", "norm layernorm offset=1 eps=1e-5  turbine mlp"))
    model = build(cyclelang.parse(text), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    burn = model.stages[0].burn
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mu = x.mean(-1, keepdim=True)
    h = (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5) * (1 + burn.norm.weight.double()) + burn.norm.bias.double()
    fc, proj = burn.mlp.fc, burn.mlp.proj
    want = (torch.relu(h @ fc.weight.double().T) ** 2) @ proj.weight.double().T  # the spec's MLP has no biases
    with torch.no_grad():
        got = burn.mlp(burn.norm(x.float()))
    assert (got.double() - want).abs().max().item() < 1e-5 * want.abs().max().item()
    assert float(burn.norm.offset) == 1.0
    fresh = build(cyclelang.parse(text), seed=0)
    assert torch.equal(fresh.stages[0].burn.norm.weight, torch.zeros(32))  # the gain 1 + w starts at 1


QK_BAD = {  # qk-norm options that cannot hold, each a located E0211
    "qk_norm_offset=1": "E0211",  # no qk_norm
    "qk_norm qk_norm_bias": "E0211",  # an rmsnorm has no bias
    "qk_norm qk_norm_affine=false qk_norm_offset=1": "E0211",
    "qk_norm qk_norm_across qk_norm_after_rotary rotary": "E0211",
    "qk_norm qk_norm_type=groupnorm": "E0203",
    "qk_norm qk_norm_across qk_norm_head_gains": "E0211",
    "qk_norm qk_norm_affine=false qk_norm_head_gains": "E0211",
}


@pytest.mark.parametrize("opts", sorted(QK_BAD))
def test_unholdable_qk_norm_options_are_located_diagnostics(opts):
    from cyclelang.diagnostics import CycleError

    with pytest.raises(CycleError) as info:
        cyclelang.parse(SPEC.format(opts=opts))
    assert [d.code for d in info.value.diagnostics] == [QK_BAD[opts]]
    assert info.value.diagnostics[0].span.line == 7
