"""The next-token loss of every generated model (inlined into the file codegen writes).

Written in the generated file's vocabulary (`torch`, `F`), so its text can be copied
into the file as it stands here; `tests/test_torch_runtime.py` tests it directly.
"""

import torch
from torch.nn import functional as F


def next_token_loss_op(name):
    """The custom op `cyclelang::{name}`: F.cross_entropy(logits.float(), targets,
    ignore_index=-1) with the same forward and a leaner backward.

    op(logits (N, vocab), targets (N,), -1: ignored) returns (loss, log-probabilities).
    The gradient is (softmax(logits) - onehot(targets)) / tokens, built in one (N, vocab)
    buffer from the saved log-probabilities; autograd's own backward fills a zero one-hot
    gradient and allocates a third (N, vocab) tensor to combine them. Half-precision
    logits are scored in float32 (a no-op for float32 ones), as autocast would.
    The backward is plain torch ops, which torch.compile traces into the backward graph.
    A custom op rather than an autograd.Function: torch.compile traces a Function as a
    higher-order op that AOTAutograd's cache refuses, so every later compile of the model
    would redo the whole joint graph. The caches know the op by its name, and the backward
    below is traced into them, so the name carries a digest of this function's source as
    it stands (edit it and the name changes). Defined once per process.
    """
    import hashlib
    import inspect

    try:
        name += "_" + hashlib.sha256(inspect.getsource(next_token_loss_op).encode()).hexdigest()[:8]
    except (OSError, TypeError):  # no source to read (a frozen build): the name as given
        pass
    try:
        return getattr(torch.ops.cyclelang, name)
    except AttributeError:
        pass

    @torch.library.custom_op("cyclelang::" + name, mutates_args=())
    def run(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = F.log_softmax(logits.float(), dim=-1)  # (N, vocab)
        return F.nll_loss(logp, targets, ignore_index=-1), logp  # the mean over the kept targets

    @run.register_fake
    def _(logits, targets):
        return logits.new_empty(
            (), dtype=torch.float32), logits.new_empty(logits.shape, dtype=torch.float32)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output[1], inputs[1])
        ctx.dtype = inputs[0].dtype
        ctx.mark_non_differentiable(output[1])
        # else autograd zero-fills an (N, vocab) gradient for the log-probabilities, unused
        ctx.set_materialize_grads(False)

    def backward(ctx, grad, _):  # _: None, the log-probabilities take no gradient
        logp, targets = ctx.saved_tensors
        keep = targets >= 0  # (N,)
        g = logp.exp()  # (N, vocab): softmax
        g[torch.arange(g.size(0), device=g.device), torch.where(keep, targets, 0)] -= 1.0
        return g.mul_((keep * (grad / keep.sum()))[:, None]).to(ctx.dtype), None

    run.register_autograd(backward, setup_context=setup_context)
    return getattr(torch.ops.cyclelang, name)
