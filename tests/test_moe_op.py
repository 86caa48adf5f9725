"""The MoE's custom ops, the path torch.compile takes (`routed_experts` around `expert_mlps`,
runtime/experts.py).

Eager mode splits the routed tokens by expert with a host sync; under torch.compile the
trace sees the router's logits go into one custom op (softmax, routing, experts, their
sum and the balance loss, with a hand-written backward) and each token's output and the
balance loss come out. These tests compile
the module (fullgraph, the eager backend) and hold that path to eager mode: the same
outputs and the same gradients for every activation, with and without biases, with
capacity drops and with an expert that gets no token, for every routing variant.
"""

from __future__ import annotations

import typing

import pytest

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang import ir  # noqa: E402
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.backends.torch.codegen import codegen  # noqa: E402

ACTS = sorted(set(typing.get_args(ir.Activation)) - {"swiglu_clamp"})  # gpt-oss's clamped SwiGLU has no custom op: its MoE runs the eager gather


def moe_spec(act: str, bias: bool, capacity: float = 1.0, options: str = "capacity={capacity} balance=0.01") -> str:
    options = options.format(capacity=capacity)
    return f"""engine tiny {{
  chamber width=24
  throat causal
  feed tokens vocab=64 context=32 position=none
  stage block x 1 {{
    prechamber burn {{
      norm rmsnorm
      turbine moe experts=4 top=2 {options} hidden=12 act={act} bias={str(bias).lower()}
    }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def op_name(act: str, op: str = "experts") -> str:
    """The name the generated source registers its `act` experts' op (or routed op) under."""
    src = codegen(cyclelang.parse(moe_spec(act, False)), fast=True)
    return next(ln.split('"')[1] for ln in src.splitlines() if ln.startswith(f"{op}_{act} = "))


def moe_module(act, bias, capacity=1.0, options="capacity={capacity} balance=0.01"):
    model = build(cyclelang.parse(moe_spec(act, bias, capacity, options)), seed=0, fast=True).double()
    return model, model.stages[0].burn.moe


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(moe):
    """The op path for real: dynamo captures the module whole (fullgraph), then runs the
    graph as plain torch calls (backend="eager": no C++ build), autograd included."""
    return torch.compile(moe, fullgraph=True, backend="eager")


def run_both(moe, x):
    """(output, gradients of x and every parameter, the balance loss's included) by the eager path, then by the op path."""
    params = [x] + list(moe.parameters())
    outs = []
    for fn in (moe, compiled(moe)):
        y = fn(x)
        y, balance = y if isinstance(y, tuple) else (y, 0.0)  # the output and its load-balancing loss
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
        outs.append((y, torch.autograd.grad((y * g).sum() + 10 * balance, params, allow_unused=True)))
    return outs


def assert_same(moe, got):
    (ya, ga), (yb, gb) = got
    torch.testing.assert_close(ya, yb, rtol=1e-12, atol=1e-12)
    names = ["x"] + [n for n, _ in moe.named_parameters()]
    for name, a, b in zip(names, ga, gb, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    return dict(zip(names, gb))


# The fast tier runs each activation once, with and without a bias by turns (so both biases too), in
# training; the full run every activation x bias x mode (test_every_routing_variant_takes_the_op_path_exactly
# keeps eval fast)
@pytest.mark.parametrize("act, bias, training", [
    pytest.param(act, bias, training, id=f"{'train' if training else 'eval'}-{act}-{'bias' if bias else 'nobias'}",
                 marks=() if training and bias == bool(i % 2) else pytest.mark.slow)
    for training in (True, False) for i, act in enumerate(ACTS) for bias in (False, True)])
def test_op_path_equals_the_eager_gather(act, bias, training):
    model, moe = moe_module(act, bias)
    moe.train(training)
    x = torch.randn(2, 16, 24, dtype=torch.float64, requires_grad=True)
    assert_same(moe, run_both(moe, x))


VARIANTS = {
    "unnormalised": "normalize=false capacity=1.0 balance=0.01",  # DeepSeek-V2, Switch: the top-k weights as they come
    "shared": "capacity=1.0 balance=0.01 shared=10",  # a shared expert beside the routed ones
    "shared-gated": "normalize=false shared=10 shared_gate",  # Qwen2-MoE; no capacity, no balance loss
    "dropless": "",  # no capacity, no balance loss: the op's limit is -1 in training too
}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("options", list(VARIANTS.values()), ids=list(VARIANTS))
def test_every_routing_variant_takes_the_op_path_exactly(options, training):
    """The router's gradient comes from the op's hand-written backward through top-k (and
    the renormalisation when on): held to autograd's through the eager gather."""
    model, moe = moe_module("swiglu", False, options=options)
    moe.train(training)
    with torch.no_grad():  # routing weights far from uniform, so a wrong renormalisation gradient shows
        moe.router.weight.mul_(20.0)
    x = torch.randn(2, 16, 24, dtype=torch.float64, requires_grad=True)
    grads = assert_same(moe, run_both(moe, x))
    assert grads["router.weight"].abs().max() > 1e-3  # the router learns through the op


def test_capacity_drops_and_an_idle_expert_take_the_same_path():
    """Force the router: every token's first choice is expert 0 and its second expert 1, so
    capacity 1.0 drops most of them and experts 2 and 3 get nothing."""
    model, moe = moe_module("swiglu", True)
    moe.train()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0], moe.router.weight[1, 0] = 50.0, 25.0
    x = torch.randn(2, 16, 24, dtype=torch.float64)
    x[..., 0] = x[..., 0].abs() + 1.0
    x.requires_grad_(True)
    flat = torch.topk(moe.router(x.view(-1, 24)), 2).indices
    assert set(flat.flatten().tolist()) == {0, 1}
    grads = assert_same(moe, run_both(moe, x))
    idle = [n for n in grads if n.startswith(("experts.2.", "experts.3."))]
    assert idle and all(grads[n] is not None and not grads[n].any() for n in idle)  # zeros, not missing


@pytest.mark.slow  # opcheck and gradcheck take seconds; the fast tier holds the op path to eager above
def test_the_op_passes_torch_library_opcheck():
    """Schema, fake (meta) kernel, autograd registration and AOT dispatch, checked by torch."""
    model, moe = moe_module("gelu", True)
    op = type(moe).forward.__globals__["experts_gelu"]
    xs = torch.randn(10, 24, dtype=torch.float64, requires_grad=True)
    counts = torch.tensor([2, 3, 0, 4, 1])  # two dropped rows first, then experts 0..3; expert 1 idle
    weights = [p.detach().clone().requires_grad_(True) for ex in moe.experts for p in (ex.fc.weight, ex.fc.bias, ex.proj.weight, ex.proj.bias)]
    rows = torch.rand(10, dtype=torch.float64).add_(0.5).requires_grad_()  # each assignment's router weight
    for scale in (None, rows):
        torch.library.opcheck(op, (xs, counts, weights, True, scale))
        y = op(xs, counts, weights, True, scale)[0]
        assert not y[:2].any()  # dropped rows read zeros
    assert torch.autograd.gradcheck(lambda xs, *ws: op(xs, counts, list(ws), True, None)[0], (xs, *weights))
    assert torch.autograd.gradcheck(lambda xs, r, *ws: op(xs, counts, list(ws), True, r)[0], (xs, rows, *weights))


@pytest.mark.slow  # about 3 s a case; the fast tier holds the routed op to eager above
@pytest.mark.parametrize("normalize", [True, False], ids=["normalised", "unnormalised"])
@pytest.mark.parametrize("limit", [-1, 2], ids=["dropless", "capacity"])
def test_the_routed_op_passes_torch_library_opcheck_and_gradcheck(normalize, limit):
    """The routed op on its own: schema, fake kernel, autograd and AOT dispatch checked by
    torch, and its hand-written backward (x, the router's logits, every expert weight;
    through the output and the balance loss together) against finite differences; with
    limit 2, 4 experts take at most 8 of the 10 assignments, so some are dropped."""
    model, moe = moe_module("gelu", True)
    op = type(moe).forward.__globals__["routed_gelu"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 24, dtype=torch.float64, generator=gen, requires_grad=True)
    logits = (3 * torch.randn(5, 4, dtype=torch.float64, generator=gen)).requires_grad_(True)
    weights = [p.detach().clone().requires_grad_(True) for ex in moe.experts for p in (ex.fc.weight, ex.fc.bias, ex.proj.weight, ex.proj.bias)]
    torch.library.opcheck(op, (x, logits, weights, True, 2, limit, normalize, 0.5))
    y, loss, probs, routed, *_, counts, _, _ = op(x, logits, weights, True, 2, limit, normalize, 0.5)
    assert routed.sum().item() == pytest.approx(1.0) and counts.sum().item() == 10
    assert (counts[0].item() > 0) == (limit >= 0)  # the capacity drops some assignments, dropless none
    torch.testing.assert_close(probs, torch.softmax(logits, dim=-1))
    torch.testing.assert_close(loss, 0.5 * 4 * torch.sum(routed * probs.mean(dim=0)))
    g = torch.randn(5, 24, dtype=torch.float64, generator=gen)

    def both(x, logits, *ws):  # the output's gradient and the balance loss's, both through the logits
        y, loss = op(x, logits, list(ws), True, 2, limit, normalize, 0.5)[:2]
        return (y * g).sum() + 3 * loss

    assert torch.autograd.gradcheck(both, (x, logits, *weights))


def test_the_routed_op_saves_no_expert_outputs_for_its_backward():
    """The experts' op weights each row's activations by its router weight before the second
    matmul, so the backward reads the (A, fc rows) pre-activations and never the (A, C) expert
    outputs: a MoE layer saves A x C floats less. (gelu: fc rows 12, width 24, A = 5 x 2.)"""
    model, moe = moe_module("gelu", True)
    op = type(moe).forward.__globals__["routed_gelu"]
    x = torch.randn(5, 24, dtype=torch.float64, requires_grad=True)
    weights = [p for ex in moe.experts for p in (ex.fc.weight, ex.fc.bias, ex.proj.weight, ex.proj.bias)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        y = op(x, moe.router(x), weights, True, 2, -1, True, 0.0)[0]
    assert (10, 12) in saved  # the pre-activations
    assert (10, 24) not in saved  # no expert outputs
    y.sum().backward()
    assert x.grad is not None and moe.experts[0].proj.weight.grad is not None


def test_the_op_is_defined_once_per_process_and_named_by_its_code():
    """Two builds share the op (a second registration would raise); its name carries a digest
    of the op's source, so changed code can never reuse an op registered by older code."""
    name = op_name("silu")
    a = build(cyclelang.parse(moe_spec("silu", False)), seed=0, fast=True)
    b = build(cyclelang.parse(moe_spec("silu", False)), seed=1, fast=True)
    assert hasattr(torch.ops.cyclelang, name)
    op_a = type(a.stages[0].burn.moe).forward.__globals__["experts_silu"]
    op_b = type(b.stages[0].burn.moe).forward.__globals__["experts_silu"]
    assert op_a is op_b is getattr(torch.ops.cyclelang, name)
    assert "experts_silu" not in codegen(cyclelang.parse(moe_spec("swiglu", False)), fast=True)  # only the acts a spec uses


def test_autocast_casts_the_op_inputs_as_linear_would():
    model, moe = moe_module("swiglu", False)
    moe.float().eval()
    x = torch.randn(2, 8, 24)
    outs = []
    for fn in (moe, compiled(moe)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(fn(x)[0])
    assert outs[0].dtype == outs[1].dtype
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)


def test_autocast_leaves_a_float64_model_alone():
    """autocast does not cast float64 for F.linear, so neither does the op path."""
    model, moe = moe_module("swiglu", True)
    moe.eval()
    x = torch.randn(2, 8, 24, dtype=torch.float64)
    outs = []
    for fn in (moe, compiled(moe)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(fn(x)[0])
    assert outs[0].dtype == outs[1].dtype == torch.float64
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)


class Doubled(torch.nn.Linear):
    """A replaced expert layer (as LoRA or quantisation would leave): not a plain nn.Linear."""

    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.slow  # three compiles
def test_a_replaced_expert_layer_takes_the_gather_under_compile():
    """The op reads plain Linear weights; a replaced layer must still be run, at the price of
    a graph break (so fullgraph refuses, and the default compile matches eager)."""
    model, moe = moe_module("gelu", False)
    moe.eval()
    old = moe.experts[1].fc
    new = Doubled(old.in_features, old.out_features, bias=False).double()
    new.load_state_dict(old.state_dict())
    moe.experts[1].fc = new
    assert not moe.plain_experts()
    x = torch.randn(2, 8, 24, dtype=torch.float64)
    eager = moe(x)[0]
    torch.testing.assert_close(torch.compile(moe, backend="eager")(x)[0], eager, rtol=1e-12, atol=1e-12)
    torch._dynamo.reset()  # compiled code is cached per code object, whatever the wrapper's fullgraph
    with pytest.raises(Exception, match="bincount"):  # the gather's host sync for the counts breaks the graph
        compiled(moe)(x)[0]
    torch._dynamo.reset()
    moe.experts[1].fc = old  # plain again: the op path, and the outputs move
    assert moe.plain_experts()
    assert not torch.allclose(compiled(moe)(x)[0], eager)


def test_the_ops_are_marked_unsafe_for_cuda_graphs():
    """Both ops sync with the host (counts.tolist()), which a CUDA graph cannot capture;
    the tag makes inductor's cudagraphs (mode="reduce-overhead") leave them out."""
    model, moe = moe_module("relu", False)
    for name in (op_name("relu"), op_name("relu", "routed")):
        for op in (getattr(torch.ops.cyclelang, name), getattr(torch.ops.cyclelang, name + "_backward")):
            assert torch.Tag.cudagraph_unsafe in op.default.tags


def test_frozen_experts_get_no_weight_gradients_and_the_same_input_gradient():
    model, moe = moe_module("swiglu", True)
    moe.train()
    for p in moe.experts.parameters():
        p.requires_grad_(False)
    x = torch.randn(2, 16, 24, dtype=torch.float64, requires_grad=True)
    grads = []
    for fn in (moe, compiled(moe)):
        y = fn(x)[0]
        (gx,) = torch.autograd.grad(y.square().sum(), [x])
        grads.append(gx)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)
    y = compiled(moe)(x)[0]
    y.square().sum().backward()
    assert all(p.grad is None for p in moe.experts.parameters())
    assert moe.router.weight.grad is not None
