"""Hyper-connections: a chamber of n residual streams, and how each branch reads and writes them.

The streams are x of shape (B, T, n, C). Each branch's junction holds the weights of one
hyper-connection, laid out as DeepSeek-V4 lays out its own: `base` is [pre (n) | post (n) |
res (n x n, row j: what stream j gives each stream)], and a dynamic connection adds, per
position, `fn` (a projection of the streams onto the same (2 + n) numbers per stream, or onto
all (2 + n) x n at once) times its `scale`. For both kinds:

    h = sum_j pre_j x_j                   what the branch reads (the width connection)
    x'_k = post_k y + sum_j res_jk x_j    its output y written into each stream, the streams mixed

`HyperConnection` is Zhu et al. 2024 ("Hyper-Connections"), static (pre, post, res learned
numbers, starting at pre = e_k, post = 1, res = I: the plain residual, k the branch's place mod n) or dynamic (each
stream, layer-normalised, adds tanh(norm(x_j) W) times a scale that starts at 0.01, W at 0).
`ManifoldConnection` is the manifold-constrained form (mHC, Xie et al. 2026, DeepSeek-V4): the
weights come from the RMS-normalised streams through one projection; pre is a sigmoid, post
twice one, and res a softmax made doubly stochastic by Sinkhorn's iterations, so that mixing the
streams never grows them.
"""

import torch
from torch.nn import functional as F


class HyperConnection(torch.nn.Module):
    """A hyper-connection (Zhu et al. 2024) of `streams` streams of `width` channels: static, or
    `dynamic` (weights that depend on each position's streams). `start`: the stream the branch
    reads at init (the paper's layer index mod n)."""

    def __init__(self, width, streams, start=0, dynamic=False, eps=1e-5):
        super().__init__()
        n = streams
        self.streams, self.dynamic = n, dynamic
        self.base = torch.nn.Parameter(torch.zeros((2 + n) * n))  # [pre | post | res]
        self.reset(start)
        if dynamic:
            self.norm = torch.nn.LayerNorm(width, eps=eps)  # each stream normalised on its own
            self.fn = torch.nn.Parameter(torch.zeros(2 + n, width))  # rows: pre, post, res_1 .. res_n
            self.scale = torch.nn.Parameter(torch.full((2,), 0.01))  # s_alpha (pre and res), s_beta (post)

    @torch.no_grad()
    def reset(self, start):
        """The plain residual: read stream start mod n, write every stream, no mixing (pre = e_start, post = 1, res = I)."""
        n = self.streams
        pre = torch.zeros(n)
        pre[start % n] = 1.0
        self.base.copy_(torch.cat([pre, torch.ones(n), torch.eye(n).flatten()]))

    def forward(self, x):
        """x: (B, T, n, C). Returns what the branch reads (B, T, C), and the (post, res) that `write` takes."""
        n = self.streams
        pre, post, res = self.base.to(x.dtype).split([n, n, n * n])
        res = res.view(n, n)
        if self.dynamic:
            w = torch.tanh(F.linear(self.norm(x), self.fn.to(x.dtype)))  # (B, T, n, 2 + n): per stream
            s_alpha, s_beta = self.scale.to(x.dtype).unbind(0)
            pre = pre + s_alpha * w[..., 0]  # (B, T, n)
            post = post + s_beta * w[..., 1]  # (B, T, n)
            res = res + s_alpha * w[..., 2:]  # (B, T, n, n)
        h = torch.einsum("...j,...jc->...c", pre, x)  # the width connection: a mix of the streams
        return h, post, res

    def write(self, x, y, post, res):
        """The depth connection: y (B, T, C) into each stream through post, the streams mixed by res."""
        return post.unsqueeze(-1) * y.unsqueeze(-2) + torch.einsum("...jk,...jc->...kc", res, x)


class ManifoldConnection(torch.nn.Module):
    """A manifold-constrained hyper-connection (mHC; DeepSeek-V4's `HyperConnection`): the weights
    from the RMS-normalised streams, res kept doubly stochastic by `iters` Sinkhorn iterations."""

    def __init__(self, width, streams, iters=20, eps=1e-6, std=0.02):
        super().__init__()
        n = streams
        self.streams, self.iters, self.eps = n, iters, eps
        self.fn = torch.nn.Parameter(torch.randn((2 + n) * n, n * width) * std)  # [pre | post | res] from all streams
        self.base = torch.nn.Parameter(torch.zeros((2 + n) * n))
        self.scale = torch.nn.Parameter(torch.ones(3))  # pre, post, res

    def forward(self, x):
        """x: (B, T, n, C). Returns what the branch reads (B, T, C), and the (post, res) that `write` takes."""
        n, eps = self.streams, self.eps
        f = torch.promote_types(x.dtype, torch.float32)  # the weights in float32 or wider, as DeepSeek-V4 computes them
        flat = F.rms_norm(x.flatten(-2).to(f), (x.size(-1) * n,), None, eps)  # (B, T, n * C)
        w_pre, w_post, w_res = F.linear(flat, self.fn.to(f)).split([n, n, n * n], dim=-1)
        b_pre, b_post, b_res = self.base.to(f).split([n, n, n * n])
        s_pre, s_post, s_res = self.scale.to(f).unbind(0)
        pre = torch.sigmoid(w_pre * s_pre + b_pre) + eps  # (B, T, n)
        post = 2 * torch.sigmoid(w_post * s_post + b_post)  # (B, T, n)
        res = torch.softmax((w_res * s_res + b_res).unflatten(-1, (n, n)), dim=-1) + eps  # (B, T, n, n)
        res = res / (res.sum(-2, keepdim=True) + eps)  # Sinkhorn: columns, then rows and columns in turn
        for _ in range(self.iters - 1):
            res = res / (res.sum(-1, keepdim=True) + eps)
            res = res / (res.sum(-2, keepdim=True) + eps)
        h = torch.einsum("...j,...jc->...c", pre.to(x.dtype), x)
        return h, post.to(x.dtype), res.to(x.dtype)

    def write(self, x, y, post, res):
        """The depth connection: y (B, T, C) into each stream through post, the streams mixed by res."""
        return post.unsqueeze(-1) * y.unsqueeze(-2) + torch.einsum("...jk,...jc->...kc", res, x)
