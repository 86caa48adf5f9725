"""A MoE layer under torch.compile: each activation with its gradient, and the custom ops.

`{act}_grad(h, g=None)` returns act(h) and, given the output's gradient g, the gradient
at h, with torch's own backward kernels (the ones autograd runs); a gated unit's h is
[gate | up]. `expert_mlps(name, act_grad)` defines the custom op `cyclelang::{name}`
that runs every expert's MLP with a hand-written backward; `expert_choice` picks each
token's experts and weights from the router's scores; `routed_experts(name, experts_name,
expert_choice)` the op around it that routes the tokens, runs the experts' op and adds
their weighted outputs up. The generated file inlines the functions of the activations
its MoEs use, then `expert_mlps`, `expert_choice` and `routed_experts`.
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


def relu2_grad(h, g=None):
    """relu(h)^2 (squared ReLU) and, given g (the gradient of its output), the gradient at h: 2
    relu(h) g."""
    r = F.relu(h)
    a = r.square()
    if g is None:
        return a, None
    return a, 2.0 * r * g


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
    """geglu_tanh(h) (the gate's GELU with the tanh approximation, Gemma) and, given g, the
    gradient at h."""
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
    so no expert computes padding and the model stays one graph (fullgraph=True). Only
    the matmuls run per expert: the activation (and its gradient) runs once over every
    kept row, as inductor's fused kernel would, not as many small calls as experts.
    xs: (A, C) assignments sorted by expert, the dropped ones first; counts: (E + 1,)
    [dropped, then per expert]; weights: per expert fc.weight, (fc.bias,) proj.weight,
    (proj.bias); rows: None, or (A,) a weight per assignment (its router weight), which
    scales the row's output: it multiplies the activations before the second matmul (and
    that matmul's bias), the same product, one pass over the (A, hidden) activations where
    weighting the outputs would be one over (A, C), and the backward needs no saved outputs.
    Returns the (A, C) outputs (zero for dropped rows) and the (A, fc rows) pre-activations
    the hand-written backward reads. Defined once per process.
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

    def linear_into(out, x, w, b, scale=None):
        """out = x w^T + b, the bias times `scale` (n,) row by row where given."""
        if b is None:
            return torch.mm(x, w.t(), out=out)
        if scale is None:
            return torch.addmm(b, x, w.t(), out=out)
        return torch.mm(x, w.t(), out=out).addr_(scale, b)

    # a host sync inside
    unsafe = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

    @torch.library.custom_op("cyclelang::" + name, mutates_args=(), tags=unsafe)
    def run(xs: torch.Tensor, counts: torch.Tensor, weights: list[torch.Tensor], bias: bool,
            rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = counts.tolist()  # [dropped, then per expert]: the one host sync
        out, h = torch.empty_like(xs), xs.new_empty(xs.size(0), weights[0].size(0))
        start = sizes[0]
        out[:start].zero_(), h[:start].zero_()
        for e, n in enumerate(sizes[1:]):
            fc, fc_b, _, _ = unpack(weights, e, bias)
            linear_into(h[start : start + n], xs[start : start + n], fc, fc_b)
            start += n
        # every expert's rows in one call: elementwise, so row by row the same
        a, _ = act_grad(h[sizes[0] :])
        w = None if rows is None else rows[sizes[0] :].to(a.dtype)  # (kept,)
        if w is not None:
            a = a.mul_(w[:, None])  # a fresh tensor: weighted in place
        start = 0
        for e, n in enumerate(sizes[1:]):
            _, _, proj, proj_b = unpack(weights, e, bias)
            linear_into(out[sizes[0] + start : sizes[0] + start + n], a[start : start + n], proj,
                        proj_b, None if w is None else w[start : start + n])
            start += n
        return out, h

    @run.register_fake
    def _(xs, counts, weights, bias, rows):
        return torch.empty_like(xs), xs.new_empty(xs.size(0), weights[0].size(0))

    @torch.library.custom_op("cyclelang::" + name + "_backward", mutates_args=(), tags=unsafe)
    def run_backward(
        grad: torch.Tensor, xs: torch.Tensor, h: torch.Tensor, counts: torch.Tensor, weights: list[torch.Tensor], bias: bool, weight_grads: bool,
        rows: torch.Tensor | None
    ) -> list[torch.Tensor]:
        """[the gradient at xs, (at rows,) then at each weight where weight_grads]."""
        sizes = counts.tolist()
        gx = torch.empty_like(xs)
        start = sizes[0]
        gx[:start].zero_()
        grads = []
        # (kept rows, hidden): the gradient at the (weighted) activations
        ga = grad.new_empty(xs.size(0) - start, unpack(weights, 0, bias)[2].size(1))
        for e, n in enumerate(sizes[1:]):
            torch.mm(grad[start : start + n], unpack(weights, e, bias)[2],
                     out=ga[start - sizes[0] : start - sizes[0] + n])
            start += n
        g_rows = w = None
        if rows is None:  # every expert's rows in one call: (kept, hidden), (kept, fc rows)
            a, gh = act_grad(h[sizes[0] :], ga)
        else:  # a weighted row: the activations' gradient times its weight, the weight's the dot
            w = rows[sizes[0] :].to(ga.dtype)[:, None]
            a, gh = act_grad(h[sizes[0] :], ga * w)
            g_rows = rows.new_zeros(rows.shape)  # dropped rows: zero
            # in the weights' dtype (float32 under autocast, as the gather path's router gradient)
            g_rows[sizes[0] :] = (ga.to(rows.dtype) * a.to(rows.dtype)).sum(dim=-1)
            a = a.mul_(w)  # the second matmul's input, as the forward weighted it
        start = sizes[0]
        for e, n in enumerate(sizes[1:]):
            fc, fc_b, proj, proj_b = unpack(weights, e, bias)
            rows_e, own = slice(start, start + n), slice(start - sizes[0], start - sizes[0] + n)
            g = grad[rows_e]  # (n, C)
            if w is not None and proj_b is not None:  # the weight also scales the bias
                g_rows[rows_e] += (g @ proj_b).to(g_rows.dtype)
            if weight_grads:  # frozen experts skip two of the three matmuls
                g_proj_b = [] if not bias else [g.sum(dim=0) if w is None else g.t() @ w[own, 0]]
                grads += [gh[own].t() @ xs[rows_e]] + ([gh[own].sum(dim=0)] if bias else []) + [g.t() @ a[own]] + g_proj_b
            torch.mm(gh[own], fc, out=gx[rows_e])
            start += n
        return [gx] + ([] if g_rows is None else [g_rows]) + grads

    @run_backward.register_fake
    def _(grad, xs, h, counts, weights, bias, weight_grads, rows):
        return [torch.empty_like(xs)] + ([] if rows is None else [torch.empty_like(rows)]) + (
            [torch.empty_like(w) for w in weights] if weight_grads else [])

    def setup_context(ctx, inputs, output):
        xs, counts, weights, ctx.bias, rows = inputs
        ctx.weight_grads = any(w.requires_grad for w in weights)
        ctx.weighted = rows is not None
        ctx.save_for_backward(xs, output[1], counts, rows, *weights)
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, grad, _):
        xs, h, counts, rows, *weights = ctx.saved_tensors
        gx, *rest = run_backward(grad.contiguous(), xs, h, counts, weights, ctx.bias,
                                 ctx.weight_grads, rows)
        g_rows, gw = (rest[0], rest[1:]) if ctx.weighted else (None, rest)
        return gx, None, gw if ctx.weight_grads else [None] * len(weights), None, g_rows

    run.register_autograd(backward, setup_context=setup_context)
    return getattr(torch.ops.cyclelang, name)


def expert_choice(probs, top, normalize, router="softmax", groups=1, top_groups=1, group_score="top2", scale=1.0,
                  correction=None, eps=1e-20):
    """(weight, choice), (N, k) each: every token's top experts and their weights from the
    router's probabilities (N, E) (softmax or sigmoid scores). Mixtral's: top-k, renormalised
    with normalize. DeepSeek-V3's where the options say so: correction (E,) added to the
    scores for the choice only, group-limited choice (groups, top_groups, group_score "top2"
    or "max"), sigmoid renormalisation over sum + eps (1e-20), x scale. The routed op's routing and
    expert parallelism's dispatch (cyclelang/training/expert.py) both choose with it."""
    E = probs.size(-1)
    # Mixtral's
    if router == "softmax" and groups == 1 and scale == 1.0 and correction is None:
        weight, choice = torch.topk(probs, top, dim=-1)
        if normalize:
            weight = weight / weight.sum(dim=-1, keepdim=True)
    else:  # DeepSeek-V3's, op for op as the eager path's
        pick = probs if correction is None else probs + correction
        if groups > 1:
            banks = pick.view(-1, groups, E // groups)
            group = banks.topk(
                2, dim=-1).values.sum(dim=-1) if group_score == "top2" else banks.amax(dim=-1)
            kept = torch.zeros_like(group, dtype=torch.bool).scatter_(
                1, torch.topk(group, top_groups, dim=-1).indices, True)
            pick = pick.masked_fill(~kept.repeat_interleave(E // groups, dim=1), float("-inf"))
        choice = torch.topk(pick, top, dim=-1).indices
        weight = probs.gather(-1, choice)
        if normalize:
            weight = weight / (
                weight.sum(dim=-1, keepdim=True)
                + eps) if router == "sigmoid" else weight / weight.sum(dim=-1, keepdim=True)
        if scale != 1.0:
            weight = weight * scale
    return weight, choice


def routed_experts(name, experts_name, choose):
    """The custom op `cyclelang::{name}`: a MoE layer's routing, experts and combination in one.

    torch.compile's trace sees only the router's logits go in and each token's output
    and the balance loss come out, so it generates no kernels for the routing (the
    softmax, top-k, capacity ranks, the sort by expert, the gathers and scatters, the
    balance loss, forward and backward: each C++ kernel is about a second of a cold
    compile); inside, eager kernels run it and the experts' op
    `cyclelang::{experts_name}` (expert_mlps) does the rest; `choose` is `expert_choice`. x: (N, C) tokens; logits:
    (N, E) router logits; weights, bias: as for the experts' op; top: experts per token;
    limit: the most assignments an expert takes (training with a capacity), -1 for none;
    normalize: the chosen weights renormalised to sum to 1; balance: the weight of the
    load-balancing loss. The probabilities are softmax(logits) in float32 at least, as the
    eager path computes them. Returns y (N, C), each token's weighted expert outputs
    summed in expert order, and the balance loss (Switch Transformer's: balance * E *
    sum_e(fraction of assignments routed to e, before capacity, * mean probability of e)),
    then what the hand-written backward reads. The logits' gradient flows through the
    chosen weights and the mean probabilities, as autograd's through softmax and top-k
    would. DeepSeek-V3's router, where its keyword arguments say so: router "sigmoid" scores each
    expert on its own; with correction, the last tensor of weights is a bias (E,) added to
    the scores for the choice only (a None argument would not survive torch's autograd
    wrapper, so it rides in the list, and gets no gradient); with
    groups > 1 a token keeps its top_groups best groups (scored by group_score, "top2" or
    "max") and picks inside them; the weights are the unbiased scores of the chosen,
    renormalised (sigmoid: over sum + eps, 1e-20 by default) and x scale. None of these moves a gradient but
    through the chosen weights. Defined once per process.
    """
    try:
        return getattr(torch.ops.cyclelang, name)
    except AttributeError:
        pass
    experts = getattr(torch.ops.cyclelang, experts_name)
    experts_backward = getattr(torch.ops.cyclelang, experts_name + "_backward")
    # the experts' host sync
    unsafe = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

    def routing(probs, top, limit, normalize, router="softmax", groups=1, top_groups=1,
                group_score="top2", scale=1.0, correction=None, eps=1e-20):
        """(weight, choice): each token's top experts and their weights, (N, k) each; then
        (order, counts, routed): the assignments sorted by expert (dropped ones first), the
        count of dropped assignments and of each expert's, and the fraction per expert."""
        N, E = probs.shape
        weight, choice = choose(probs, top, normalize, router, groups, top_groups, group_score, scale, correction, eps)
        kept = choice
        if limit >= 0:  # GShard: a place in its expert's queue, first choices before second ones
            # (k * N, E), first choices first
            onehot = choice.t().reshape(-1, 1) == torch.arange(E, device=probs.device)
            routed = onehot.float().mean(dim=0)
            rank = (torch.cumsum(onehot, dim=0) * onehot).sum(dim=-1)
            kept = torch.where((rank <= limit).view(top, N).t(), choice, -1)
        flat = kept.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat + 1, minlength=E + 1)
        if limit < 0:  # nothing dropped: the fractions from the counts (the same floats as the one-hot's mean)
            routed = counts[1:].float() / flat.numel()
        return weight, choice, order, counts, routed

    @torch.library.custom_op("cyclelang::" + name, mutates_args=(), tags=unsafe)
    def run(
        x: torch.Tensor, logits: torch.Tensor, weights: list[torch.Tensor], bias: bool, top: int, limit: int, normalize: bool, balance: float, *,
        router: str = "softmax", groups: int = 1, top_groups: int = 1, group_score: str = "top2", scale: float = 1.0, correction: bool = False,
        eps: float = 1e-20,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if router == "sigmoid":
            probs = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))
        else:
            probs = torch.softmax(logits, dim=-1,
                                  dtype=torch.promote_types(logits.dtype, torch.float32))
        weights, bias_e = (weights[:-1], weights[-1]) if correction else (weights, None)
        weight, choice, order, counts, routed = routing(probs, top, limit, normalize, router,
                                                        groups, top_groups, group_score, scale,
                                                        bias_e, eps)
        loss = balance * probs.size(1) * torch.sum(routed * probs.mean(dim=0)) if balance else probs.new_zeros(())
        token = order // top
        # index_select: a third of x[token]'s time on the CPU, the same rows; the experts' op
        # weights each row (N * k, C) by its router weight, dropped rows zero
        ew, h = experts(x.index_select(0, token), counts, weights, bias, weight.reshape(-1)[order])
        # in the wider dtype under autocast, as the gather path's
        y = x.new_zeros(x.shape, dtype=torch.promote_types(ew.dtype, weight.dtype))
        y = y.index_add_(0, token, ew.to(y.dtype))
        return y, loss, probs, routed, h, order, counts, choice, weight

    @run.register_fake
    def _(x, logits, weights, bias, top, limit, normalize, balance, *, router="softmax", groups=1,
          top_groups=1, group_score="top2", scale=1.0, correction=False, eps=1e-20):
        (N, E), n = logits.shape, logits.size(0) * top
        p = torch.promote_types(logits.dtype, torch.float32)
        index = logits.new_empty((n,), dtype=torch.int64)
        return (x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, p)), logits.new_empty(
            (), dtype=p), logits.new_empty(N, E, dtype=p),
                logits.new_empty(E, dtype=torch.float32), x.new_empty(n, weights[0].size(0)), index,
                index.new_empty(E + 1),
                index.new_empty(N, top), logits.new_empty(N, top, dtype=p))

    @torch.library.custom_op("cyclelang::" + name + "_backward", mutates_args=(), tags=unsafe)
    def run_backward(
        grad: torch.Tensor, g_loss: torch.Tensor, x: torch.Tensor, saved: list[torch.Tensor], weights: list[torch.Tensor],
        bias: bool, top: int, normalize: bool, balance: float, weight_grads: bool, router: str = "softmax", scale: float = 1.0,
        eps: float = 1e-20
    ) -> list[torch.Tensor]:
        probs, routed, h, order, counts, choice, weight = saved
        token = order // top
        g = grad.index_select(0, token).to(h.dtype)  # (N * k, C): each assignment's share of its token's gradient
        # the experts' backward gives the gradient at each assignment's weight too
        gx_a, g_rows, *gw = experts_backward(g, x.index_select(0, token), h, counts, weights, bias, weight_grads,
                                             weight.reshape(-1)[order])
        g_weight = torch.empty_like(weight)
        g_weight.view(-1)[order] = g_rows.to(weight.dtype)
        # W = s p / D: dp = (s dW - sum(dW * W)) / D, D = sum(p) (+ eps for sigmoid)
        if scale != 1.0 and normalize:
            inner = (g_weight * weight).sum(dim=-1, keepdim=True)
            total = probs.gather(-1, choice).sum(dim=-1, keepdim=True)
            g_weight = (g_weight * scale
                        - inner) / (total + eps if router == "sigmoid" else total)
        elif scale != 1.0:
            g_weight = g_weight * scale
        elif normalize and router == "sigmoid":
            g_weight = (g_weight - (g_weight * weight).sum(dim=-1, keepdim=True)) / (
                probs.gather(-1, choice).sum(dim=-1, keepdim=True) + eps)
        elif normalize:  # w = p / sum(p) over the chosen: dp = (dw - sum(dw * w)) / sum(p)
            g_weight = (g_weight - (g_weight * weight).sum(dim=-1, keepdim=True)) / probs.gather(
                -1, choice).sum(dim=-1, keepdim=True)
        # a token's choices are distinct
        g_probs = torch.zeros_like(probs).scatter_(-1, choice, g_weight)
        # the loss reads probs through their mean over tokens (rounded as autograd rounds it)
        if balance:
            g_probs += (g_loss * (balance * probs.size(1))) * routed.to(probs.dtype) / probs.size(0)
        if router == "sigmoid":
            # autograd's kernel for the sigmoid
            g_logits = torch.ops.aten.sigmoid_backward(g_probs, probs)
        else:
            # autograd's kernel for the softmax
            g_logits = torch._softmax_backward_data(g_probs, probs, -1, probs.dtype)
        return [torch.zeros_like(x).index_add_(0, token, gx_a), g_logits] + gw

    @run_backward.register_fake
    def _(grad, g_loss, x, saved, weights, bias, top, normalize, balance, weight_grads,
          router="softmax", scale=1.0, eps=1e-20):
        return [torch.empty_like(x), torch.empty_like(saved[0])] + ([torch.empty_like(w) for w in weights] if weight_grads else [])

    def setup_context(ctx, inputs, keyword_only_inputs, output):
        x, logits, weights, ctx.bias, ctx.top, _, ctx.normalize, ctx.balance = inputs
        ctx.router, ctx.scale, ctx.correction, ctx.eps = (keyword_only_inputs[k] for k in (
            "router", "scale", "correction", "eps"))
        ctx.logits_dtype = logits.dtype
        # the selection bias is not saved: the trim may move it before the backward
        weights = weights[:-1] if ctx.correction else weights
        ctx.weight_grads = any(w.requires_grad for w in weights)
        ctx.saved = len(output) - 2  # what the backward reads, after y and the loss
        ctx.save_for_backward(x, *output[2:], *weights)
        ctx.mark_non_differentiable(*output[2:])

    def backward(ctx, grad, g_loss, *_):
        x, *rest = ctx.saved_tensors
        saved, weights = rest[: ctx.saved], rest[ctx.saved :]
        g_loss = torch.zeros((), dtype=saved[0].dtype,
                             device=x.device) if g_loss is None else g_loss
        gx, g_logits, *gw = run_backward(grad.contiguous(), g_loss, x, saved, weights, ctx.bias, ctx.top, ctx.normalize, ctx.balance, ctx.weight_grads,
                                         ctx.router, ctx.scale, ctx.eps)
        # none for the selection bias
        gw = (gw if ctx.weight_grads else [None] * len(weights)) + ([None] if ctx.correction else [])
        return gx, g_logits.to(ctx.logits_dtype), gw, None, None, None, None, None

    run.register_autograd(backward, setup_context=setup_context)
    return getattr(torch.ops.cyclelang, name)
