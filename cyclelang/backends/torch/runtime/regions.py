"""Regional compilation of a model's repeated stages (inlined into the file codegen writes).

Under torch.compile the model's forward calls each instance of a repeated stage through
`compiled_stage` (stage_region): dynamo traces the stage once,
inductor compiles it once (forward and backward), and every later instance with the
same structure reuses that code, so a 4-block MoE compiles one MoE block, not four
blocks each fused differently with its neighbours.

Written in the generated file's vocabulary (`torch`), so its text can be copied into the
file as it stands here; `tests/test_torch_runtime.py` tests it directly.
"""

import torch


def stage_input_op(name):
    """The custom op `cyclelang::{name}`: a copy of x; its gradient is the incoming one.

    A compiled region's first step. In torch 2.13, when a region saves its own input for
    the backward pass (a pre-norm saves x), inductor returns that input as one of the
    region's outputs without telling the enclosing graph that the output is the input's
    buffer; the enclosing graph then counts the input as dead after the call and reuses
    its buffer (for the final norm's output, say), so the backward reads overwritten
    activations and the gradients are wrong (the forward is right). The copy is opaque to
    the partitioner, which cannot recompute it and so saves the copy, a buffer of the
    region's own. It costs one copy of the residual stream per stage in the forward pass
    and nothing in the backward. Defined once per process.
    """
    try:
        return getattr(torch.ops.cyclelang, name)
    except AttributeError:
        pass

    @torch.library.custom_op("cyclelang::" + name, mutates_args=())
    def run(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @run.register_fake
    def _(x):
        return torch.empty_like(x)

    def backward(ctx, grad):
        return grad

    run.register_autograd(backward)
    return getattr(torch.ops.cyclelang, name)


def stage_region(stage_input):
    """`compiled_stage(stage, x, *args)`: stage(x, *args) as a nested compile region whose
    first step is the copy `stage_input` (an op of stage_input_op). The stage module is an
    argument, so its parameters are the region's inputs and every instance of the stage
    shares the one compiled region; torch compiles another for an instance whose structure
    differs (one entry each, up to 1024). Outside torch.compile it is the plain call."""

    def one_stage(stage, x, *args):
        return stage(stage_input(x), *args)

    return torch.compiler.nested_compile_region(one_stage, max_reuse_entries=1024)
