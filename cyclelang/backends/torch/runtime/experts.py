"""A MoE layer under torch.compile: the routing and the experts' matmuls in custom ops.

`expert_choice` picks each token's experts and weights from the router's scores;
`routed_experts(name, choose, act)` defines two custom ops and returns the layer that
runs them with the experts' activation `act` between them, where the trace sees it:

    cyclelang::{name}_in   routing, then every expert's first matmul on its rows
    act(h)                 traced: inductor fuses the activation, forward and backward
    cyclelang::{name}_out  every expert's second matmul, weighted, added up per token

Inside an op the exact row counts may steer Python (one host sync), so no expert
computes padding and the model stays one graph (fullgraph=True). The generated file
inlines `expert_choice` and `routed_experts`, and writes each activation's function.
"""

import torch


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


def routed_experts(name, choose, act):
    """A MoE layer's routing, experts and combination, for torch.compile: returns
    run(x, logits, weights, bias, top, limit, normalize, balance, **router options).

    The routing and the matmuls run in the custom ops `cyclelang::{name}_in` and
    `cyclelang::{name}_out` (defined once per process, shared by every activation),
    which torch.compile cannot see into; their eager kernels cost no cold compile (each
    C++ kernel inductor writes for the routing's softmax, top-k, sort, gathers and
    scatters would cost about a second). Between them the trace sees only the experts'
    activation, `act(h)`, which inductor fuses into one kernel each way. x: (N, C)
    tokens; logits: (N, E) router logits; weights: per expert fc.weight, (fc.bias,)
    proj.weight, (proj.bias), then, with correction, a bias (E,) added to the scores
    for the choice only (it gets no gradient); top: experts per token; limit: the most
    assignments an expert takes (training with a capacity), -1 for none; normalize: the
    chosen weights renormalised to sum to 1; balance: the weight of the load-balancing
    loss; the router's options are `choose`'s (`expert_choice`). The probabilities are
    softmax(logits) (or sigmoid) in float32 at least, as the eager path computes them.
    Returns (y (N, C), each token's experts' outputs, weighted, added in expert order;
    the balance loss, Switch Transformer's: balance * E * sum_e(fraction of assignments
    routed to e, before capacity, * mean probability of e); probs; routed; h; order;
    counts; choice (N, k); weight (N, k)). The logits' gradient flows through the chosen
    weights and the mean probabilities, as autograd's through softmax and top-k would.
    """
    # a host sync inside each op
    unsafe = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

    def matmuls(out, x, mats, biases, sizes):
        """out[rows of e] = x[rows of e] @ mats[e] (+ biases[e]) for each expert, in place; the
        dropped rows (the first sizes[0]) are zeroed. Returns out."""
        start = sizes[0]
        out[:start].zero_()
        for e, n in enumerate(sizes[1:]):
            rows = slice(start, start + n)
            if biases:
                torch.addmm(biases[e], x[rows], mats[e], out=out[rows])
            else:
                torch.mm(x[rows], mats[e], out=out[rows])
            start += n
        return out

    def weight_grads(g, x, biased, sizes):
        """[g_rows^T x_rows for each expert], then (biased) [g_rows summed for each]: its layer's
        weight (and bias) gradients."""
        starts = [sum(sizes[: e + 1]) for e in range(len(sizes) - 1)]
        pieces = [(g[s : s + n], x[s : s + n]) for s, n in zip(starts, sizes[1:])]
        grads = [gi.t() @ xi for gi, xi in pieces]
        return grads + [gi.sum(dim=0) for gi, _ in pieces] if biased else grads

    def routing(probs, top, limit, normalize, router, groups, top_groups, group_score, scale,
                correction, eps):
        """(weight, choice): each token's top experts and their weights, (N, k) each; then
        (order, counts, routed): the assignments sorted by expert (dropped ones first), the
        count of dropped assignments and of each expert's, and the fraction per expert."""
        N, E = probs.shape
        weight, choice = choose(probs, top, normalize, router, groups, top_groups, group_score,
                                scale, correction, eps)
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
        if limit < 0:  # nothing dropped: the fractions from the counts (the one-hot mean's floats)
            routed = counts[1:].float() / flat.numel()
        return weight, choice, order, counts, routed

    def define():
        @torch.library.custom_op(f"cyclelang::{name}_in", mutates_args=(), tags=unsafe)
        def run_in(
            x: torch.Tensor, logits: torch.Tensor, fc: list[torch.Tensor],
            fc_bias: list[torch.Tensor], correction: list[torch.Tensor], top: int, limit: int,
            normalize: bool, balance: float, router: str, groups: int, top_groups: int,
            group_score: str, scale: float, eps: float,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                   torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
            """The routing, then every expert's first layer on its rows: (h (N * k, fc rows),
            dropped rows zero; rows (N * k,), each row's router weight; the balance loss; probs;
            routed; order; counts; choice; weight), the rows sorted by expert, dropped first."""
            p = torch.promote_types(logits.dtype, torch.float32)
            if router == "sigmoid":
                probs = torch.sigmoid(logits.to(p))
            else:
                probs = torch.softmax(logits, dim=-1, dtype=p)
            weight, choice, order, counts, routed = routing(
                probs, top, limit, normalize, router, groups, top_groups, group_score, scale,
                correction[0] if correction else None, eps)
            loss = probs.new_zeros(())
            if balance:
                loss = balance * probs.size(1) * torch.sum(routed * probs.mean(dim=0))
            xs = x.index_select(0, order // top)  # x[token]'s rows, in a third of its CPU time
            h = xs.new_empty(xs.size(0), fc[0].size(0))
            h = matmuls(h, xs, [w.t() for w in fc], fc_bias, counts.tolist())  # the host sync
            return h, weight.reshape(-1)[order], loss, probs, routed, order, counts, choice, weight

        @run_in.register_fake
        def _(x, logits, fc, fc_bias, correction, top, limit, normalize, balance, router, groups,
              top_groups, group_score, scale, eps):
            (N, E), n = logits.shape, logits.size(0) * top
            p = torch.promote_types(logits.dtype, torch.float32)
            index = logits.new_empty((n,), dtype=torch.int64)
            return (x.new_empty(n, fc[0].size(0)), logits.new_empty(n, dtype=p),
                    logits.new_empty((), dtype=p), logits.new_empty(N, E, dtype=p),
                    logits.new_empty(E, dtype=torch.float32), index, index.new_empty(E + 1),
                    index.new_empty(N, top), logits.new_empty(N, top, dtype=p))

        @torch.library.custom_op(f"cyclelang::{name}_in_backward", mutates_args=(), tags=unsafe)
        def run_in_backward(
            g_h: torch.Tensor, g_rows: torch.Tensor, g_loss: torch.Tensor, x: torch.Tensor,
            saved: list[torch.Tensor], fc: list[torch.Tensor], biased: bool, top: int,
            normalize: bool, balance: float, grads: bool, router: str, scale: float, eps: float,
        ) -> list[torch.Tensor]:
            """[the gradient at x, at the logits, then (grads) at each fc weight, then bias]."""
            probs, routed, order, counts, choice, weight = saved
            token, sizes = order // top, counts.tolist()
            xs = x.index_select(0, token)  # the forward's rows again, not saved: (N * k, C)
            gxs = matmuls(torch.empty_like(xs), g_h, fc, [], sizes)
            g_weight = torch.empty_like(weight)
            g_weight.view(-1)[order] = g_rows.to(weight.dtype)
            # W = s p / D: dp = (s dW - sum(dW * W)) / D, D = sum(p) (+ eps for sigmoid)
            if normalize:
                total = probs.gather(-1, choice).sum(dim=-1, keepdim=True)
                total = total + eps if router == "sigmoid" else total
                inner = (g_weight * weight).sum(dim=-1, keepdim=True)
                g_weight = ((g_weight * scale if scale != 1.0 else g_weight) - inner) / total
            elif scale != 1.0:
                g_weight = g_weight * scale
            # a token's choices are distinct
            g_probs = torch.zeros_like(probs).scatter_(-1, choice, g_weight)
            # the loss reads probs through their mean over tokens (rounded as autograd rounds it)
            if balance:
                g_mean = (g_loss * (balance * probs.size(1))) * routed.to(probs.dtype)
                g_probs += g_mean / probs.size(0)
            if router == "sigmoid":
                g_logits = torch.ops.aten.sigmoid_backward(g_probs, probs)  # autograd's kernel
            else:
                g_logits = torch._softmax_backward_data(g_probs, probs, -1, probs.dtype)  # ditto
            gx = torch.zeros_like(x).index_add_(0, token, gxs)
            return [gx, g_logits] + (weight_grads(g_h, xs, biased, sizes) if grads else [])

        @run_in_backward.register_fake
        def _(g_h, g_rows, g_loss, x, saved, fc, biased, top, normalize, balance, grads, router,
              scale, eps):
            biases = [w.new_empty(w.size(0)) for w in fc] if biased else []
            grads = [torch.empty_like(w) for w in fc] + biases if grads else []
            return [torch.empty_like(x), torch.empty_like(saved[0])] + grads

        def setup_in(ctx, inputs, output):
            x, logits, fc, fc_bias, correction, ctx.top = inputs[:6]
            ctx.normalize, ctx.balance, ctx.router = inputs[7:10]
            ctx.scale, ctx.eps = inputs[13:]
            ctx.logits_dtype, ctx.experts = logits.dtype, len(fc)
            ctx.biased, ctx.correction = bool(fc_bias), len(correction)
            ctx.grads = any(w.requires_grad for w in fc + fc_bias)
            # what the backward reads, after h, the rows and the loss; the selection bias is not
            # saved (the trim may move it before the backward)
            ctx.saved = len(output) - 3
            ctx.save_for_backward(x, *output[3:], *fc)
            ctx.mark_non_differentiable(*output[3:])

        def backward_in(ctx, g_h, g_rows, g_loss, *_):
            x, *rest = ctx.saved_tensors
            saved, fc = rest[: ctx.saved], rest[ctx.saved :]
            gx, g_logits, *gw = run_in_backward(
                g_h.contiguous(), g_rows, g_loss, x, saved, fc, ctx.biased, ctx.top, ctx.normalize,
                ctx.balance, ctx.grads, ctx.router, ctx.scale, ctx.eps)
            E = ctx.experts
            if not ctx.grads:
                gw = [None] * (2 * E if ctx.biased else E)
            # none for the selection bias, nor for the options
            return (gx, g_logits.to(ctx.logits_dtype), gw[:E], gw[E:], [None] * ctx.correction,
                    *[None] * 10)

        run_in.register_autograd(backward_in, setup_context=setup_in)

        @torch.library.custom_op(f"cyclelang::{name}_out", mutates_args=(), tags=unsafe)
        def run_out(a: torch.Tensor, rows: torch.Tensor, order: torch.Tensor, counts: torch.Tensor,
                    proj: list[torch.Tensor], proj_bias: list[torch.Tensor], top: int,
                    tokens: int) -> torch.Tensor:
            """Every expert's second layer on its rows, each row times its router weight, added up
            per token in expert order: y (tokens, C), in the wider of the two dtypes (autocast)."""
            out = a.new_empty(a.size(0), proj[0].size(0))
            out = matmuls(out, a, [w.t() for w in proj], proj_bias, counts.tolist())  # host sync
            out = out.to(torch.promote_types(out.dtype, rows.dtype)).mul_(rows[:, None])
            return out.new_zeros(tokens, out.size(1)).index_add_(0, order // top, out)

        @run_out.register_fake
        def _(a, rows, order, counts, proj, proj_bias, top, tokens):
            dtype = torch.promote_types(a.dtype, rows.dtype)
            return a.new_empty(tokens, proj[0].size(0), dtype=dtype)

        @torch.library.custom_op(f"cyclelang::{name}_out_backward", mutates_args=(), tags=unsafe)
        def run_out_backward(
            g: torch.Tensor, a: torch.Tensor, rows: torch.Tensor, order: torch.Tensor,
            counts: torch.Tensor, proj: list[torch.Tensor], proj_bias: list[torch.Tensor],
            top: int, grads: bool,
        ) -> list[torch.Tensor]:
            """[the gradient at a, at the rows' weights, then (grads) at each proj weight, then
            bias]."""
            sizes = counts.tolist()
            # (N * k, C): each row's share of its token's gradient
            go = g.index_select(0, order // top).to(a.dtype)
            ga = matmuls(torch.empty_like(a), go, proj, [], sizes)
            # d row weight = g . (a W^T + b), the unweighted output: a's dot with ga, unweighted
            g_rows = torch.linalg.vecdot(ga, a).to(rows.dtype)
            start = sizes[0]
            for e, n in enumerate(sizes[1:] if proj_bias else []):
                g_rows[start : start + n] += (go[start : start + n] @ proj_bias[e]).to(rows.dtype)
                start += n
            g_rows[: sizes[0]] = 0.0  # dropped rows
            w = rows[:, None].to(a.dtype)
            grads = weight_grads(go.mul_(w), a, bool(proj_bias), sizes) if grads else []
            return [ga.mul_(w), g_rows] + grads

        @run_out_backward.register_fake
        def _(g, a, rows, order, counts, proj, proj_bias, top, grads):
            grads = [torch.empty_like(w) for w in proj + proj_bias] if grads else []
            return [torch.empty_like(a), torch.empty_like(rows)] + grads

        def setup_out(ctx, inputs, output):
            a, rows, order, counts, proj, proj_bias, ctx.top, _ = inputs
            ctx.grads, ctx.experts = any(w.requires_grad for w in proj + proj_bias), len(proj)
            ctx.save_for_backward(a, rows, order, counts, *proj, *proj_bias)

        def backward_out(ctx, g):
            a, rows, order, counts, *weights = ctx.saved_tensors
            E = ctx.experts
            ga, g_rows, *gw = run_out_backward(g.contiguous(), a, rows, order, counts, weights[:E],
                                               weights[E:], ctx.top, ctx.grads)
            gw = gw if ctx.grads else [None] * len(weights)
            return ga, g_rows, None, None, gw[:E], gw[E:], None, None

        run_out.register_autograd(backward_out, setup_context=setup_out)

    if not hasattr(torch.ops.cyclelang, f"{name}_in"):
        define()
    run_in = getattr(torch.ops.cyclelang, f"{name}_in")
    run_out = getattr(torch.ops.cyclelang, f"{name}_out")

    def run(x, logits, weights, bias, top, limit, normalize, balance, *, router="softmax",
            groups=1, top_groups=1, group_score="top2", scale=1.0, correction=False, eps=1e-20):
        weights, extra = (weights[:-1], weights[-1:]) if correction else (weights, [])
        per = 4 if bias else 2  # an expert's: fc.weight, (fc.bias,) proj.weight, (proj.bias)
        fc, proj = weights[0::per], weights[per // 2 :: per]
        fc_bias, proj_bias = (weights[1::per], weights[3::per]) if bias else ([], [])
        h, rows, loss, probs, routed, order, counts, choice, weight = run_in(
            x, logits, fc, fc_bias, extra, top, limit, normalize, balance, router, groups,
            top_groups, group_score, scale, eps)
        # act: traced, fused by inductor
        y = run_out(act(h), rows, order, counts, proj, proj_bias, top, x.size(0))
        return y, loss, probs, routed, h, order, counts, choice, weight

    return run
