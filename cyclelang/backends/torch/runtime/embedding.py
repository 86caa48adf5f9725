"""The embedding lookups of the generated Feed (inlined into the file codegen writes).

Written in the generated file's vocabulary (`torch`, `F`), so its text can be copied
into the file as it stands here; `tests/test_torch_runtime.py` tests it directly.
"""

import torch
from torch.nn import functional as F


def table_lookup(name):
    """`lookup(table, idx)`: table(idx) for the Feed's nn.Embedding tables; under
    torch.compile, for a plain table, the custom op `cyclelang::{name}` instead.

    The op runs F.embedding and its backward (aten's embedding_dense_backward, a custom
    op of its own) as eager kernels, opaque to the trace: a gather and a scatter-add, the
    same work inductor's code would do, but a cold compile builds no C++ kernel for them
    (each is about a second). Eager mode, and a table that is not a plain nn.Embedding
    (a subclass, a replaced or hooked layer, max_norm, sparse or frequency-scaled
    gradients), call the table itself. Defined once per process.
    """
    try:
        op = getattr(torch.ops.cyclelang, name)
    except AttributeError:

        @torch.library.custom_op("cyclelang::" + name, mutates_args=())
        def run(idx: torch.Tensor, weight: torch.Tensor, padding: int) -> torch.Tensor:
            return F.embedding(idx, weight, padding_idx=None if padding < 0 else padding)

        @run.register_fake
        def _(idx, weight, padding):
            return weight.new_empty((*idx.shape, weight.size(1)))

        @torch.library.custom_op("cyclelang::" + name + "_backward", mutates_args=())
        def run_backward(grad: torch.Tensor, idx: torch.Tensor, rows: int,
                         padding: int) -> torch.Tensor:
            # the padding row: zero
            return torch.ops.aten.embedding_dense_backward(grad, idx, rows, padding, False)

        @run_backward.register_fake
        def _(grad, idx, rows, padding):
            return grad.new_empty((rows, grad.size(-1)))

        def setup_context(ctx, inputs, output):
            idx, weight, ctx.padding = inputs
            ctx.rows = weight.size(0)
            ctx.save_for_backward(idx)

        def backward(ctx, grad):
            if not ctx.needs_input_grad[1]:  # a frozen table
                return None, None, None
            (idx,) = ctx.saved_tensors
            return None, run_backward(grad.contiguous(), idx, ctx.rows, ctx.padding), None

        run.register_autograd(backward, setup_context=setup_context)
        op = getattr(torch.ops.cyclelang, name)

    def lookup(table, idx):
        plain = (type(table) is torch.nn.Embedding and table.max_norm is None and not table.sparse
                 and not table.scale_grad_by_freq)
        if torch.compiler.is_compiling() and plain and not (
            table._forward_hooks or table._forward_pre_hooks):
            return op(idx, table.weight, -1 if table.padding_idx is None else table.padding_idx)
        return table(idx)

    return lookup
