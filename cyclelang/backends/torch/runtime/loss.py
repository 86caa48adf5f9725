"""The next-token loss of every generated model (inlined into the file codegen writes).

Written in the generated file's vocabulary (`torch`, `F`), so its text can be copied
into the file as it stands here; `tests/test_torch_runtime.py` tests it directly.
"""

import torch
from torch.nn import functional as F


class NextTokenLoss(torch.autograd.Function):
    """F.cross_entropy(logits.float(), targets, ignore_index=-1): the same forward, a leaner backward.

    The gradient is (softmax(logits) - onehot(targets)) / tokens, built in one (N, vocab)
    buffer from the saved log-probabilities; autograd's own backward fills a zero one-hot
    gradient and allocates a third (N, vocab) tensor to combine them. Half-precision
    logits are scored in float32 (a no-op for float32 ones), as autocast would.
    """

    @staticmethod
    def forward(ctx, logits, targets):  # logits (N, vocab); targets (N,), -1: ignored
        logp = F.log_softmax(logits.float(), dim=-1)  # (N, vocab)
        ctx.save_for_backward(logp, targets)
        ctx.dtype = logits.dtype
        return F.nll_loss(logp, targets, ignore_index=-1)  # the mean over the kept targets

    @staticmethod
    def backward(ctx, grad):
        logp, targets = ctx.saved_tensors
        keep = targets >= 0  # (N,)
        g = logp.exp()  # (N, vocab): softmax
        g[torch.arange(g.size(0), device=g.device), torch.where(keep, targets, 0)] -= 1.0
        return g.mul_((keep * (grad / keep.sum()))[:, None]).to(ctx.dtype), None
