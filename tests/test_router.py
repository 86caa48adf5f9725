"""DeepSeek-V3's router as `turbine moe` options: router=sigmoid, groups=/top_groups=/group_score=,
scale=, normalize, correction= and correction_rate= (auxiliary-loss-free balancing).

The built module is held to a float64 reference written here from the DeepSeek-V3 paper's
equations (section 2.1.2): s_i = sigmoid(u . e_i); the top-k is taken over s_i + b_i within the
top_groups best groups (a group scored by the sum of its two best biased scores), the gate of a
chosen expert is its unbiased s_i, renormalised over the chosen and times the routed scaling
factor; and b_i += gamma * sign(mean load - load_i) after each training step. Gradients are
held to autograd (the eager path) and to finite differences; the path torch.compile takes (the
routed custom op with its hand-written backward) is held to the eager one, bias update included.
"""

from __future__ import annotations

import pytest

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.backends.torch.codegen import codegen  # noqa: E402
from cyclelang.diagnostics import CycleError  # noqa: E402

DEEPSEEK = "router=sigmoid groups=4 top_groups=2 scale=2.5 correction=true"


def spec(options: str, experts: int = 8, top: int = 3) -> str:
    return f"""engine tiny {{
  chamber width=24
  throat causal
  feed tokens vocab=64 context=32 position=none
  stage block x 1 {{
    prechamber burn {{
      norm rmsnorm
      turbine moe experts={experts} top={top} hidden=12 act=swiglu bias=false {options}
    }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def moe_of(options: str, experts: int = 8, top: int = 3, seed: int = 0):
    model = build(cyclelang.parse(spec(options, experts, top)), seed=seed, fast=True).double()
    moe = model.stages[0].burn.moe
    with torch.no_grad():  # scores far from even, so a wrong choice or weight shows
        moe.router.weight.mul_(8.0)
        if hasattr(moe, "correction"):
            moe.correction.copy_(torch.linspace(-0.3, 0.25, moe.correction.numel()).roll(3))
    return moe


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def reference(moe, x, router="sigmoid", groups=4, top_groups=2, group_score="top2", top=3, normalize=True, scale=2.5):
    """The paper's equations, token by token, in float64: (y, each token's chosen experts)."""
    E = len(moe.experts)
    bias = moe.correction.double() if hasattr(moe, "correction") else torch.zeros(E, dtype=torch.float64)
    ys, chosen = [], []
    for u in x.reshape(-1, x.size(-1)):
        logit = moe.router.weight.double() @ u
        s = torch.sigmoid(logit) if router == "sigmoid" else torch.softmax(logit, dim=0)
        b = s + bias  # selection only
        size = E // groups
        if group_score == "top2":
            g = [sorted(b[i * size:(i + 1) * size].tolist())[-2:] for i in range(groups)]
            g = [sum(v) for v in g]
        else:
            g = [max(b[i * size:(i + 1) * size].tolist()) for i in range(groups)]
        kept = sorted(range(groups), key=lambda i: -g[i])[:top_groups]
        candidates = [i for i in range(E) if i // size in kept]
        pick = sorted(candidates, key=lambda i: -b[i].item())[:top]
        gate = torch.stack([s[i] for i in pick])
        if normalize:
            gate = gate / (gate.sum() + (1e-20 if router == "sigmoid" else 0.0))
        gate = gate * scale
        ys.append(sum(gate[j] * moe.experts[i](u[None])[0] for j, i in enumerate(pick)))
        chosen.append(sorted(pick))
    return torch.stack(ys).view(x.shape), chosen


CASES = {  # options, then the reference's arguments
    "deepseek-v3": (DEEPSEEK, {}),
    "deepseek-v3-max": (DEEPSEEK + " group_score=max", {"group_score": "max"}),
    "sigmoid-raw": ("router=sigmoid normalize=false correction=true", {"groups": 1, "top_groups": 1, "normalize": False, "scale": 1.0}),
    "deepseek-v2": ("normalize=false groups=4 top_groups=2 group_score=max scale=1.5",
                    {"router": "softmax", "group_score": "max", "normalize": False, "scale": 1.5}),
    "softmax-scaled": ("scale=0.5", {"router": "softmax", "groups": 1, "top_groups": 1, "scale": 0.5}),
}


@pytest.mark.parametrize("options, ref", list(CASES.values()), ids=list(CASES))
def test_the_router_is_the_papers(options, ref):
    moe = moe_of(options).eval()
    x = torch.randn(2, 7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want, _ = reference(moe, x, **ref)
    torch.testing.assert_close(moe(x), want, rtol=1e-12, atol=1e-12)


def test_the_bias_steers_the_choice_and_never_the_weights():
    """A large bias on expert 5 puts it among every token's choices, yet its weight stays its
    unbiased score; the group limit keeps a token inside its top_groups groups."""
    moe = moe_of(DEEPSEEK).eval()
    x = torch.randn(3, 5, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        moe.correction.zero_()
        moe.correction[5] = 10.0
    want, chosen = reference(moe, x)
    assert all(5 in c for c in chosen)
    assert all(len({i // 2 for i in c}) <= 2 for c in chosen)  # 4 groups of 2, 2 kept
    torch.testing.assert_close(moe(x), want, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # the same choice with the weights scaled by the bias would differ: the weights are unbiased
        moe.correction[5] = 20.0
    torch.testing.assert_close(moe(x), want, rtol=1e-12, atol=1e-12)


def test_the_group_limit_changes_the_choice():
    """Without the group limit the same scores pick other experts for some token: the test's
    sizes make the option matter."""
    moe = moe_of(DEEPSEEK).eval()
    x = torch.randn(2, 12, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    _, limited = reference(moe, x)
    _, free = reference(moe, x, groups=1, top_groups=1)
    assert limited != free


def compiled(moe):
    return torch.compile(moe, fullgraph=True, backend="eager")


def grads_of(fn, moe, x, g):
    y = fn(x)
    params = [x] + list(moe.parameters())
    return y, torch.autograd.grad((y * g).sum(), params)


# the fast tier compiles each router once, in training and in eval by turns; the full run both modes of each
@pytest.mark.parametrize("options, training", [
    pytest.param(options, training, id=f"{name}-{'train' if training else 'eval'}", marks=() if training == (i % 2 == 0) else pytest.mark.slow)
    for i, (name, options) in enumerate([*((k, c[0]) for k, c in CASES.items()), ("capacity", DEEPSEEK + " capacity=1.0")])
    for training in (True, False)])
def test_compile_equals_eager(options, training):
    """The op path (routed custom op, hand-written backward through the scale, the
    renormalisation and the sigmoid) against autograd through the eager gather."""
    moe = moe_of(options).train(training)
    x = torch.randn(2, 16, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(6), requires_grad=True)
    g = torch.randn(2, 16, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    ya, ga = grads_of(moe, moe, x, g)
    yb, gb = grads_of(compiled(moe), moe, x, g)
    torch.testing.assert_close(ya, yb, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(["x"] + [n for n, _ in moe.named_parameters()], ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    assert dict(zip([n for n, _ in moe.named_parameters()], ga[1:]))["router.weight"].abs().max() > 1e-3


@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_gradients_match_finite_differences(path):
    """gradcheck of the whole layer in x and the router's weight, on both paths."""
    moe = moe_of(DEEPSEEK).eval()
    fn = moe if path == "eager" else compiled(moe)
    x = torch.randn(1, 4, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(8), requires_grad=True)
    w = moe.router.weight

    def f(x, w_):
        with torch.no_grad():
            w.copy_(w_)
        return fn(x)

    # the router weight enters through the module: compare the layer's gradient in x, and in w by autograd vs finite differences
    assert torch.autograd.gradcheck(fn, (x,))
    w0 = w.detach().clone()
    y = fn(x)
    gy = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    (gw,) = torch.autograd.grad((y * gy).sum(), [w])
    eps, idx = 1e-6, [(0, 1), (3, 5), (7, 23)]
    for i, j in idx:
        d = torch.zeros_like(w0)
        d[i, j] = eps
        hi, lo = (f(x, w0 + d) * gy).sum(), (f(x, w0 - d) * gy).sum()
        assert (hi - lo).item() / (2 * eps) == pytest.approx(gw[i, j].item(), rel=1e-5, abs=1e-8)
    f(x, w0)


@pytest.mark.slow  # opcheck alone takes seconds; the fast tier holds the op's backward to autograd above
def test_the_routed_op_passes_opcheck_and_gradcheck():
    """The routed op with DeepSeek-V3's arguments on its own: schema, fake kernel, autograd,
    and its backward against finite differences in x and the logits (the experts' weights:
    test_compile_equals_eager)."""
    moe = moe_of(DEEPSEEK)
    op = type(moe).forward.__globals__["routed_swiglu"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 24, dtype=torch.float64, generator=gen, requires_grad=True)
    logits = (3 * torch.randn(5, 8, dtype=torch.float64, generator=gen)).requires_grad_(True)
    weights = [p.detach().clone().requires_grad_(True) for ex in moe.experts for p in (ex.fc.weight, ex.proj.weight)]
    corr = moe.correction.detach().clone()  # the selection bias rides last in the weights' list
    args, route = (False, 3, -1, True, 0.0), {"router": "sigmoid", "groups": 4, "top_groups": 2, "group_score": "top2", "scale": 2.5, "correction": True}
    torch.library.opcheck(op, (x, logits, weights + [corr], *args), route)
    g = torch.randn(5, 24, dtype=torch.float64, generator=gen)
    assert torch.autograd.gradcheck(lambda x, lg: (op(x, lg, weights + [corr], *args, **route)[0] * g).sum(), (x, logits))


def loads(moe, x):
    _, chosen = reference(moe, x)
    counts = torch.zeros(len(moe.experts), dtype=torch.int64)
    for c in chosen:
        counts[c] += 1
    return counts


@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_the_bias_moves_toward_an_even_load_each_training_step(path):
    """b_i += gamma * sign(mean load - load_i), each training forward, exactly; eval leaves it."""
    moe = moe_of(DEEPSEEK + " correction_rate=0.01").train()
    fn = moe if path == "eager" else compiled(moe)
    gen = torch.Generator().manual_seed(10)
    for step in range(4):
        x = torch.randn(2, 9, 24, dtype=torch.float64, generator=gen)
        load = loads(moe, x)  # with the bias as it is before this step
        want = moe.correction.clone() + 0.01 * torch.sign(load.double().mean() - load.double())
        fn(x).sum().backward()
        assert torch.equal(moe.correction, want.to(moe.correction.dtype)), step
    assert moe.correction.abs().sum() > 0
    moe.eval()
    before = moe.correction.clone()
    fn(torch.randn(2, 9, 24, dtype=torch.float64, generator=gen))
    assert torch.equal(moe.correction, before)


def test_the_bias_is_a_buffer_saved_with_the_weights():
    moe = moe_of(DEEPSEEK + " correction_rate=0.001")
    assert "correction" in moe.state_dict() and "correction" not in dict(moe.named_parameters())
    assert moe.correction.dtype == torch.float32 or moe.correction.dtype == torch.float64  # .double() casts buffers too
    held = moe_of(DEEPSEEK).train()  # correction without a rate: held, as a loaded checkpoint's
    before = held.correction.clone()
    held(torch.randn(1, 5, 24, dtype=torch.float64))
    assert torch.equal(held.correction, before)


def test_the_softmax_path_is_unchanged():
    """Mixtral's routing writes none of the DeepSeek lines, and takes the op with its old arguments."""
    src = codegen(cyclelang.parse(spec("")), fast=True)
    src = src[src.index("class Moe("):src.index("def plain_experts")]
    assert "self.correction" not in src and "def trim" not in src and "self.groups" not in src and "router=" not in src
    assert "return routed_swiglu(x, logits, weights, bias, self.top, limit, True, 0.0)[:2]" in src


@pytest.mark.parametrize("options, code, word", [
    ("groups=3", "E0205", "equal groups"),
    ("groups=4 top_groups=5", "E0205", "top_groups=5"),
    ("groups=4 top_groups=1", "E0205", "top=3"),
    ("groups=8 top_groups=4", "E0211", "two best"),
    ("correction_rate=0.01", "E0211", "correction=true"),
    ("router=sigmoid balance=0.01", "E0211", "sigmoid"),
])
def test_contradictory_router_options_are_refused(options, code, word):
    with pytest.raises(CycleError) as e:
        cyclelang.parse(spec(options))
    d = e.value.diagnostics[0]
    assert d.code == code and (word in d.message or word in (d.help or ""))


def test_the_reviewer_reads_the_correction_as_balancing():
    """W103 (no load-balancing loss) is quiet for a trimmed correction bias; a rate that outruns the scores is W112."""
    from cyclelang.review import review

    def codes(options):
        return {d.code for d in review(cyclelang.parse(spec(options)))}

    assert "W103" in codes(DEEPSEEK) and "W103" not in codes(DEEPSEEK + " correction_rate=0.001")
    assert "W112" in codes(DEEPSEEK + " correction_rate=0.5") and "W112" not in codes(DEEPSEEK + " correction_rate=0.001")


def test_the_bias_counts_as_a_buffer_not_a_parameter():
    from cyclelang.limits import estimate_buffers, estimate_parameters

    with_bias, without = cyclelang.parse(spec(DEEPSEEK)), cyclelang.parse(spec("router=sigmoid groups=4 top_groups=2 scale=2.5"))
    assert estimate_parameters(with_bias) == estimate_parameters(without)
    assert estimate_buffers(with_bias) - estimate_buffers(without) == 8
    assert sum(p.numel() for p in moe_of(DEEPSEEK).parameters()) == sum(p.numel() for p in moe_of("router=sigmoid").parameters())
