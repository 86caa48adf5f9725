"""The next-token loss of every generated model (inlined into the file codegen writes).

Written in the generated file's vocabulary (`torch`, `F`), so its text can be copied
into the file as it stands here; `tests/test_torch_runtime.py` tests it directly.
"""

import torch
from torch.nn import functional as F


def next_token_loss_op(name):
    """The custom op `cyclelang::{name}`: F.cross_entropy(logits.float(), targets,
    ignore_index=-1), scored through the softmax so that its backward is one pass.

    op(logits (N, vocab), targets (N,), -1: ignored) returns (loss, probabilities).
    The forward writes one (N, vocab) buffer, the softmax, and a target's log-probability
    is the log of its entry. That is exact while the entry is a normal float; a row whose
    target scores below -69 (e^-69 = 1e-30) is scored again by log_softmax (on an
    accelerator, where that check would wait for the device, every row is scored from its
    largest entry instead, 1 / the row's sum). The gradient,
    (softmax - onehot(targets)) / tokens, is then one scaled copy of the saved
    probabilities: through log_softmax it would cost an `exp` pass more, and autograd's own
    backward fills a zero one-hot gradient and allocates a third (N, vocab) tensor besides.
    Traced by torch.compile, the backward subtracts the one-hot first: that part needs no
    incoming gradient, so the partitioner moves it into the forward, in place, and the
    scaling reuses the buffer (no (N, vocab) allocation in the backward graph). Loss and
    gradient equal F.cross_entropy's to float32 rounding, not bit for bit. Half-precision
    logits are scored in float32 (a no-op for float32 ones), as autocast would.
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
        x = logits.float()
        p = F.softmax(x, dim=-1)  # (N, vocab)
        keep = targets >= 0  # (N,)
        rows, t = torch.arange(p.size(0), device=p.device), torch.where(keep, targets, 0)
        if p.device.type == "cpu":
            logp = p[rows, t].log()
            low = keep & (logp < -69.0)  # e^-69 = 1e-30: below, the entry loses digits
            if low.any():
                logp[low] = F.log_softmax(x[low], dim=-1).gather(-1, t[low, None])[:, 0]
        else:  # log p_t = x_t - max - log(sum), and the largest entry is 1 / sum
            top, at = x.max(dim=-1)
            logp = x[rows, t] - top + p[rows, at].log()
        logp = torch.where(keep, logp, 0.0)  # an ignored row's stand-in may be -inf: 0 instead
        return -logp.sum() / keep.sum(), p  # the mean over the kept targets

    @run.register_fake
    def _(logits, targets):
        return logits.new_empty(
            (), dtype=torch.float32), logits.new_empty(logits.shape, dtype=torch.float32)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output[1], inputs[1])
        ctx.dtype = inputs[0].dtype
        ctx.mark_non_differentiable(output[1])
        # else autograd zero-fills an (N, vocab) gradient for the probabilities, unused
        ctx.set_materialize_grads(False)

    def backward(ctx, grad, _):  # _: None, the probabilities take no gradient
        p, targets = ctx.saved_tensors
        keep = targets >= 0  # (N,)
        scale = keep * (grad / keep.sum())  # (N,): 0 for an ignored target
        at = torch.arange(p.size(0), device=p.device), torch.where(keep, targets, 0)
        if torch.compiler.is_compiling():  # traced: the one-hot part needs no `grad`, so the
            # partitioner moves it into the forward, in place, and the scaling reuses its buffer
            g = p.index_put(at, -keep.to(p.dtype), accumulate=True)
            return (g * scale[:, None]).to(ctx.dtype), None
        g = p * scale[:, None]  # (N, vocab)
        g[at] -= scale
        return g.to(ctx.dtype), None

    run.register_autograd(backward, setup_context=setup_context)
    return getattr(torch.ops.cyclelang, name)
