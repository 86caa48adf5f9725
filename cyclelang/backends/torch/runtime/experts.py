"""The MoE experts under torch.compile: each activation with its gradient, and the custom op.

`{act}_grad(h, g=None)` returns act(h) and, given the output's gradient g, the gradient
at h, with torch's own backward kernels (the ones autograd runs); a gated unit's h is
[gate | up]. `expert_mlps(name, act_grad)` defines the custom op `cyclelang::{name}`
that runs every expert's MLP with a hand-written backward. The generated file inlines
the functions of the activations its MoEs use, then `expert_mlps`.
"""

import torch
from torch.nn import functional as F


def gelu_grad(h, g=None):
    """gelu(h) and, given g (the gradient of its output), the gradient at h."""
    a = F.gelu(h)
    if g is None:
        return a, None
    return a, torch.ops.aten.gelu_backward(g, h)


def gelu_tanh_grad(h, g=None):
    """gelu_tanh(h) and, given g (the gradient of its output), the gradient at h."""
    a = F.gelu(h, approximate="tanh")
    if g is None:
        return a, None
    return a, torch.ops.aten.gelu_backward(g, h, approximate="tanh")


def relu_grad(h, g=None):
    """relu(h) and, given g (the gradient of its output), the gradient at h."""
    a = F.relu(h)
    if g is None:
        return a, None
    return a, torch.ops.aten.threshold_backward(g, a, 0)


def silu_grad(h, g=None):
    """silu(h) and, given g (the gradient of its output), the gradient at h."""
    a = F.silu(h)
    if g is None:
        return a, None
    return a, torch.ops.aten.silu_backward(g, h)


def swiglu_grad(h, g=None):
    """swiglu(h) and, given g (the gradient of its output), the gradient at h."""
    gate, up = h.chunk(2, dim=-1)
    s = F.silu(gate)
    a = s * up
    if g is None:
        return a, None
    gh = torch.empty_like(h)  # [d gate | d up], both halves written in place (no cat)
    d_gate, d_up = gh.chunk(2, dim=-1)
    torch.mul(g, s, out=d_up)
    torch.ops.aten.silu_backward.grad_input(g * up, gate, grad_input=d_gate)
    return a, gh


def geglu_grad(h, g=None):
    """geglu(h) and, given g (the gradient of its output), the gradient at h."""
    gate, up = h.chunk(2, dim=-1)
    s = F.gelu(gate)
    a = s * up
    if g is None:
        return a, None
    gh = torch.empty_like(h)  # [d gate | d up], both halves written in place (no cat)
    d_gate, d_up = gh.chunk(2, dim=-1)
    torch.mul(g, s, out=d_up)
    torch.ops.aten.gelu_backward.grad_input(g * up, gate, grad_input=d_gate)
    return a, gh


def geglu_tanh_grad(h, g=None):
    """geglu_tanh(h) (the gate's GELU with the tanh approximation, Gemma) and, given g, the gradient at h."""
    gate, up = h.chunk(2, dim=-1)
    s = F.gelu(gate, approximate="tanh")
    a = s * up
    if g is None:
        return a, None
    gh = torch.empty_like(h)  # [d gate | d up], both halves written in place (no cat)
    d_gate, d_up = gh.chunk(2, dim=-1)
    torch.mul(g, s, out=d_up)
    torch.ops.aten.gelu_backward.grad_input(g * up, gate, approximate="tanh", grad_input=d_gate)
    return a, gh


def expert_mlps(name, act_grad):
    """The custom op `cyclelang::{name}`: every expert's MLP on the assignments sorted by expert.

    torch.compile traces the routing (fixed shapes) and calls this op, which it cannot see
    into, for the experts: inside, the exact row counts may steer Python (one host sync),
    so no expert computes padding and the model stays one graph (fullgraph=True).
    xs: (A, C) assignments sorted by expert, the dropped ones first; counts: (E + 1,)
    [dropped, then per expert]; weights: per expert fc.weight, (fc.bias,) proj.weight,
    (proj.bias). Returns the (A, C) outputs (zero for dropped rows) and the (A, fc rows)
    pre-activations the hand-written backward reads. Defined once per process.
    """
    try:
        return getattr(torch.ops.cyclelang, name)
    except AttributeError:
        pass

    def unpack(weights, e, bias):
        if bias:
            return weights[4 * e : 4 * e + 4]
        fc, proj = weights[2 * e : 2 * e + 2]
        return fc, None, proj, None

    def linear_into(out, x, w, b):
        return torch.mm(x, w.t(), out=out) if b is None else torch.addmm(b, x, w.t(), out=out)

    unsafe = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()  # a host sync inside

    @torch.library.custom_op("cyclelang::" + name, mutates_args=(), tags=unsafe)
    def run(xs: torch.Tensor, counts: torch.Tensor, weights: list[torch.Tensor], bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = counts.tolist()  # [dropped, then per expert]: the one host sync
        out, h = torch.empty_like(xs), xs.new_empty(xs.size(0), weights[0].size(0))
        start = sizes[0]
        out[:start].zero_(), h[:start].zero_()
        for e, n in enumerate(sizes[1:]):
            fc, fc_b, proj, proj_b = unpack(weights, e, bias)
            rows = slice(start, start + n)
            a, _ = act_grad(linear_into(h[rows], xs[rows], fc, fc_b))
            linear_into(out[rows], a, proj, proj_b)
            start += n
        return out, h

    @run.register_fake
    def _(xs, counts, weights, bias):
        return torch.empty_like(xs), xs.new_empty(xs.size(0), weights[0].size(0))

    @torch.library.custom_op("cyclelang::" + name + "_backward", mutates_args=(), tags=unsafe)
    def run_backward(
        grad: torch.Tensor, xs: torch.Tensor, h: torch.Tensor, counts: torch.Tensor, weights: list[torch.Tensor], bias: bool, weight_grads: bool
    ) -> list[torch.Tensor]:
        sizes = counts.tolist()
        gx = torch.empty_like(xs)
        start = sizes[0]
        gx[:start].zero_()
        grads = []
        for e, n in enumerate(sizes[1:]):
            fc, fc_b, proj, proj_b = unpack(weights, e, bias)
            rows = slice(start, start + n)
            g = grad[rows]  # (n, C)
            a, gh = act_grad(h[rows], g @ proj)  # (n, hidden), (n, fc rows)
            if weight_grads:  # frozen experts skip two of the three matmuls
                grads += [gh.t() @ xs[rows]] + ([gh.sum(dim=0)] if bias else []) + [g.t() @ a] + ([g.sum(dim=0)] if bias else [])
            torch.mm(gh, fc, out=gx[rows])
            start += n
        return [gx] + grads

    @run_backward.register_fake
    def _(grad, xs, h, counts, weights, bias, weight_grads):
        return [torch.empty_like(xs)] + ([torch.empty_like(w) for w in weights] if weight_grads else [])

    def setup_context(ctx, inputs, output):
        xs, counts, weights, ctx.bias = inputs
        ctx.weight_grads = any(w.requires_grad for w in weights)
        ctx.save_for_backward(xs, output[1], counts, *weights)
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, grad, _):
        xs, h, counts, *weights = ctx.saved_tensors
        gx, *gw = run_backward(grad.contiguous(), xs, h, counts, weights, ctx.bias, ctx.weight_grads)
        return gx, None, gw if ctx.weight_grads else [None] * len(weights), None

    run.register_autograd(backward, setup_context=setup_context)
    return getattr(torch.ops.cyclelang, name)
