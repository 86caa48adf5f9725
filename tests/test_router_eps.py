"""The sigmoid router's renormalisation epsilon (`turbine moe normalize_eps=`) and LFM2-MoE's norm_topk_prob.

DeepSeek-V3 divides the chosen sigmoid scores by their sum + 1e-20 (the language's default); LFM2-MoE
(transformers' Lfm2MoeTopKRouter) by their sum + 1e-6. The two are the same number unless the chosen
scores are small, so every check here runs where they differ: router logits near -16, chosen scores
near 1e-7, where 1e-6 changes each weight by a factor of about 3.

The built module (the generated file's own text) is held to a float64 reference written here from the
equations: s = sigmoid(u . e_i); the top-k is taken over s + b (b the selection-only correction); the
chosen weights are s / (sum of the chosen s + eps), times scale. Its gradients are held to autograd
through that reference, on the eager path and on the path torch.compile takes (the routed custom op with
its hand-written backward), and the op's backward to finite differences. Then lfm2_moe: a tiny
Lfm2MoeForCausalLM with norm_topk_prob true and false, its router pushed into that regime, passes the
families' round trip (tests/roundtrip.py: logits 1e-5 in float32, loss, greedy decoding, gradients,
export -> from_pretrained), and export writes back the config's keys.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang.diagnostics import CycleError

from .conftest import need

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.cli import main  # noqa: E402
from cyclelang.interop import InteropError, Unsupported, export_config, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families.conv import KEYS  # noqa: E402

from . import roundtrip  # noqa: E402
from .roundtrip import ids, rel, round_trip  # noqa: E402
from .test_families_conv import _lfm2_moe, _logits  # noqa: E402
from .test_router import compiled  # noqa: E402
from .test_router import spec as router_spec  # noqa: E402

SHIFT = -16.0  # the router logits' centre: sigmoid(-16) is 1.1e-7, so the chosen scores sum to about 3e-7


def spec(options: str) -> str:
    return router_spec("router=sigmoid correction=true " + options)


def moe_of(options: str):
    """The built layer in float64, its router logits near SHIFT for inputs whose channel 0 is 1 (`tokens`),
    its selection bias on the scores' own scale (so it steers some choices, not all)."""
    model = build(cyclelang.parse(spec(options)), seed=0, fast=True).double()
    moe = model.stages[0].burn.moe
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        moe.router.weight.copy_(0.1 * torch.randn(moe.router.weight.shape, dtype=torch.float64, generator=gen))
        moe.router.weight[:, 0] = SHIFT
        moe.correction.copy_(1e-7 * torch.linspace(-1.0, 1.0, 8).roll(3))
        for p in moe.experts.parameters():  # away from init
            p.add_(0.05 * torch.randn(p.shape, dtype=torch.float64, generator=gen))
    return moe


def tokens(shape=(2, 7), seed=3, requires_grad=False):
    x = torch.randn(*shape, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x[..., 0] = 1.0  # the channel the router's SHIFT column reads
    return x.requires_grad_(requires_grad)


def reference(moe, x, eps: float, scale: float, logits=None):
    """The equations in float64, every token at once, differentiable: y (B, T, C). The router's logits are
    u . e_i, or `logits` (N, E) where given."""
    u = x.reshape(-1, x.size(-1))  # (N, C)
    s = torch.sigmoid(u @ moe.router.weight.t() if logits is None else logits)  # (N, E): each expert's own score
    choice = torch.topk(s + moe.correction, 3, dim=-1).indices  # (N, k): chosen on the biased scores
    chosen = s.gather(-1, choice)  # (N, k): weighted by the unbiased ones
    w = chosen / (chosen.sum(dim=-1, keepdim=True) + eps) * scale  # (N, k)
    y = [sum(w[n, j] * moe.experts[int(e)](u[n : n + 1])[0] for j, e in enumerate(choice[n])) for n in range(u.size(0))]
    return torch.stack(y).view(x.shape)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# (options, eps, scale): the backward has one branch for a scaled renormalisation, one for an unscaled one
CASES = {
    "lfm2-scaled": ("normalize_eps=1e-6 scale=2.5", 1e-6, 2.5),
    "lfm2-unscaled": ("normalize_eps=1e-6", 1e-6, 1.0),
    "deepseek-default": ("scale=2.5", 1e-20, 2.5),
}


@pytest.mark.parametrize("options, eps, scale", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_the_router_is_the_equations_forward_and_backward(path, options, eps, scale):
    moe = moe_of(options).eval()
    fn = moe if path == "eager" else compiled(moe)
    x = tokens(requires_grad=True)
    g = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    params = [x, moe.router.weight, *moe.experts.parameters()]
    want = reference(moe, x, eps, scale)
    got = fn(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    grads_want = torch.autograd.grad((want * g).sum(), params)
    grads_got = torch.autograd.grad((got * g).sum(), params)
    names = ["x", "router.weight", *(n for n, _ in moe.experts.named_parameters())]
    for name, a, b in zip(names, grads_got, grads_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    assert grads_want[1].abs().max() > 1e-2  # the router's gradient is not rounding: the weights depend on its logits


def test_the_epsilon_changes_the_weights_here():
    """At chosen scores near 1e-7, sum + 1e-6 and sum + 1e-20 are different functions: the test's regime
    makes the option matter, and the reference with the other epsilon is far from the module."""
    lfm, ds = moe_of("normalize_eps=1e-6 scale=2.5").eval(), moe_of("scale=2.5").eval()
    x = tokens()
    with torch.no_grad():
        a, b = lfm(x), ds(x)
        assert ((a - b).norm() / b.norm()).item() > 0.3
        assert ((a - reference(lfm, x, 1e-20, 2.5)).norm() / a.norm()).item() > 0.3


@pytest.mark.parametrize("eps", [1e-6, 1e-20])
def test_the_routed_ops_backward_matches_finite_differences(eps):
    """gradcheck of the routed custom op's hand-written backward in x and the logits, near -16."""
    moe = moe_of("normalize_eps=1e-6 scale=2.5")
    op = type(moe).forward.__globals__["routed_swiglu"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 24, dtype=torch.float64, generator=gen, requires_grad=True)
    logits = (SHIFT + 0.5 * torch.randn(5, 8, dtype=torch.float64, generator=gen)).requires_grad_(True)
    weights = [p.detach().clone() for ex in moe.experts for p in (ex.fc.weight, ex.proj.weight)]
    corr = moe.correction.detach().clone()
    route = {"router": "sigmoid", "scale": 2.5, "correction": True, "eps": eps}
    g = torch.randn(5, 24, dtype=torch.float64, generator=gen)

    def f(x, lg):
        return (op(x, lg, weights + [corr], False, 3, -1, True, 0.0, **route)[0] * g).sum()

    assert torch.autograd.gradcheck(f, (x, logits))
    with torch.no_grad():  # and the value is the equations': eps reaches the op's forward too
        torch.testing.assert_close(op(x, logits, weights + [corr], False, 3, -1, True, 0.0, **route)[0],
                                   reference(moe, x, eps, 2.5, logits), rtol=1e-12, atol=1e-15)


@pytest.mark.slow  # opcheck alone takes seconds; the fast tier holds the op to the equations above
def test_the_routed_op_passes_opcheck_with_an_epsilon():
    """The op's schema, fake kernel and autograd registration take the eps keyword."""
    moe = moe_of("normalize_eps=1e-6 scale=2.5")
    op = type(moe).forward.__globals__["routed_swiglu"]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 24, dtype=torch.float64, generator=gen, requires_grad=True)
    logits = (SHIFT + 0.5 * torch.randn(5, 8, dtype=torch.float64, generator=gen)).requires_grad_(True)
    weights = [p.detach().clone().requires_grad_(True) for ex in moe.experts for p in (ex.fc.weight, ex.proj.weight)]
    torch.library.opcheck(op, (x, logits, weights + [moe.correction.detach().clone()], False, 3, -1, True, 0.0),
                          {"router": "sigmoid", "scale": 2.5, "correction": True, "eps": 1e-6})


def test_the_generated_file_carries_the_epsilon(tmp_path):
    """`cyclec build` writes normalize_eps where the spec sets it (a constructor argument, the eager line and
    the op's keyword) and nothing of it where the spec keeps DeepSeek-V3's default."""
    for name, options in (("lfm", "normalize_eps=1e-6"), ("ds", "")):
        (tmp_path / f"{name}.cycle").write_text(spec(options))
        res = CliRunner().invoke(main, ["build", str(tmp_path / f"{name}.cycle"), "--fast", "-o", str(tmp_path / f"{name}.py")])
        assert res.exit_code == 0, res.output
    lfm, ds = (tmp_path / "lfm.py").read_text(), (tmp_path / "ds.py").read_text()
    assert "normalize_eps=1e-06" in lfm and "+ self.normalize_eps)" in lfm and "eps=self.normalize_eps" in lfm
    assert "normalize_eps" not in ds and "+ 1e-20)" in ds


def test_the_default_stays_out_of_the_ir_and_the_diagram():
    from cyclelang.backends.graphviz.text import TITLES

    lfm, ds = cyclelang.parse(spec("normalize_eps=1e-6")), cyclelang.parse(spec(""))
    assert "normalize_eps" not in ds.model_dump_json() and '"normalize_eps":1e-6' in lfm.model_dump_json().replace(" ", "")
    moe = lambda s: next(op for st in s.engine.body for b in st.branch_list() for op in b.ops if op.op == "moe")  # noqa: E731
    assert "renormalised + 1e-06" in TITLES[type(moe(lfm))](moe(lfm))[1] and "renormalised" not in TITLES[type(moe(ds))](moe(ds))[1]


@pytest.mark.parametrize("options, code, col_of, word", [
    ("normalize_eps=0", "E0205", "normalize_eps=0", "(0, 1]"),
    ("normalize_eps=-1e-6", "E0205", "normalize_eps=-1e-6", "(0, 1]"),
    ("normalize_eps=2", "E0205", "normalize_eps=2", "(0, 1]"),
    ("normalize_eps=true", "E0203", "normalize_eps=true", "number"),
    ("normalize_eps", "E0203", "normalize_eps", "needs a value"),
    ("normalize=false normalize_eps=1e-6", "E0211", "normalize_eps=1e-6", "normalize is false"),
])
def test_a_bad_epsilon_is_refused_where_it_is_written(options, code, col_of, word):
    text = spec(options)
    with pytest.raises(CycleError) as e:
        cyclelang.parse(text, "eps.cycle")
    d = e.value.diagnostics[0]
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "turbine moe" in ln)
    col = text.splitlines()[line - 1].index(col_of) + 1
    if code != "E0211" and "=" in col_of:  # a bad value is pointed at where the value starts
        col += len(col_of.split("=")[0]) + 1
    assert d.code == code and word in d.message and str(d.span).startswith(f"eps.cycle:{line}:{col}"), (d.code, d.message, str(d.span))


def test_a_softmax_router_takes_no_epsilon():
    text = spec("normalize_eps=1e-6").replace("router=sigmoid correction=true", "")
    with pytest.raises(CycleError) as e:
        cyclelang.parse(text)
    d = e.value.diagnostics[0]
    assert d.code == "E0211" and "softmax" in d.message and "router=sigmoid" in d.help


# --- lfm2_moe: norm_topk_prob is normalize=true normalize_eps=1e-6 -------------------------------------


def _quiet_router(model, seed=8):
    """Push every routed layer's router logits near -15: a common direction u added to every token's embedding
    dominates the stream, each gate row reads -15 along it (plus some noise per expert, so tokens differ), and
    the selection-only bias is spread on the scores' scale. transformers' +1e-6 then weighs as much as the
    chosen scores themselves."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        d = emb.size(1)
        u = torch.randn(d, generator=gen)
        u /= u.norm()
        emb.add_(2.0 * u)
        for name, p in model.named_parameters():
            if name.endswith("feed_forward.gate.weight"):  # (E, d): rmsnorm makes the stream about sqrt(d) u
                p.copy_(-15.0 / d ** 0.5 * u + 0.02 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(1e-7 * torch.randn(b.shape, generator=gen))
    return model


@pytest.fixture
def quiet_router(monkeypatch):
    plain = roundtrip._HF
    monkeypatch.setattr(roundtrip, "hf", lambda config, seed=1: _quiet_router(plain(config, seed)))


def _gate_scores(model, idx):
    """The sigmoid scores each routed layer's router computes on idx: (layers, tokens, experts)."""
    seen = []
    hooks = [m.register_forward_hook(lambda mod, a, out: seen.append(out[0].sigmoid()))
             for name, m in model.named_modules() if name.endswith("feed_forward.gate")]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    return torch.stack(seen)


@pytest.mark.parametrize("norm", [True, False], ids=["norm_topk_prob", "raw"])
def test_lfm2_moe_round_trip_with_and_without_norm_topk_prob(tmp_path, norm, quiet_router):
    config = _lfm2_moe(norm_topk_prob=norm)
    ours, ref, spec_file = round_trip(tmp_path, config)
    text = spec_file.read_text()
    if norm:
        assert "normalize=true router=sigmoid normalize_eps=1e-06" in text
    else:
        assert "normalize=false router=sigmoid" in text and "normalize_eps" not in text
    # the regime is the one where the epsilon matters: the top chosen scores well under 1e-6
    assert _gate_scores(ref, ids()).topk(2, dim=-1).values.sum(-1).max() < 1e-5
    # export wrote back the keys the checkpoint had, norm_topk_prob with them
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    back = json.loads((tmp_path / "out" / "config.json").read_text())
    assert back["norm_topk_prob"] is norm
    for key in KEYS["lfm2_moe"].maps:
        assert back.get(key) == saved.get(key), key


def test_lfm2_moe_norm_topk_prob_matters(tmp_path):
    """In this regime the imported spec with DeepSeek-V3's epsilon (normalize_eps dropped) computes other logits
    than transformers', given the same weights; loading the checkpoint into it is refused, naming the option."""
    ref = _quiet_router(roundtrip.hf(_lfm2_moe(norm_topk_prob=True)))
    ref.save_pretrained(tmp_path / "ckpt")
    text, idx = import_config(tmp_path / "ckpt"), ids()
    with torch.no_grad():
        want = ref(idx).logits
    assert rel(_logits(text, tmp_path / "ckpt", idx), want) < 1e-5
    plain = text.replace(" normalize_eps=1e-06", "")
    assert plain != text
    with pytest.raises(InteropError) as e:
        _logits(plain, tmp_path / "ckpt", idx)
    assert "normalize_eps" in str(e.value) and "1e-06" in str(e.value)
    ours = load_transformers(build(cyclelang.parse(text), seed=0), tmp_path / "ckpt")
    other = build(cyclelang.parse(plain), seed=0).eval()
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert rel(other(idx), want) > 1e-3


def test_export_refuses_an_epsilon_lfm2_moe_cannot_say(tmp_path):
    ref = roundtrip.hf(_lfm2_moe(norm_topk_prob=True))
    ref.save_pretrained(tmp_path / "ckpt")
    text = import_config(tmp_path / "ckpt")
    assert export_config(cyclelang.parse(text))["norm_topk_prob"] is True
    other = text.replace("normalize_eps=1e-06", "normalize_eps=0.001")
    assert other != text
    with pytest.raises(Unsupported) as e:
        export_config(cyclelang.parse(other))
    assert e.value.field == "normalize_eps" and "1e-06" in str(e.value) and "0.001" in str(e.value)
