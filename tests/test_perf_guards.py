"""Performance guards that time nothing: an accidental extra matmul, a graph break or
torch creeping into the front end fails here, whatever the machine's load.

The expected matmul count and FLOPs of one forward pass come from a closed form
over the IR written here (not from the code generator), per construct:

    attention  qkv 2N·C·(h+2kv)·d, proj 2N·h·d·C, scores and mix 4·B·h·T·T·d
    mlp        fc 2N·C·H (×2 for swiglu/geglu), proj 2N·H·C
    moe        router 2N·C·E, experts 2N·top·(C·H·g + H·C) in eval (dropless routing)
    linear     2N·in·out;  gate merge 2N·C·C;  nozzle 2N·C·V
    latent attention  q 2N·C·h·(d+r) (or through the q latent), kv down 2N·C·(L+r), kv up
               2N·L·h·(d+v), out 2N·h·v·C; scores 2·B·h·T·T·(d+r), mix 2·B·h·T·T·v
               (two bmm: a value width unlike the key's takes SDPA's math kernel on the CPU)
    ssm        in_proj 2N·C·(2i+2gn+h), depthwise conv 2·B·(i+2gn)·T·K, out_proj 2N·i·C;
               per chunk of l: scores 2Bh·l²·n, their sum 2Bh·l²·p, state in and out 4Bh·l·p·n
    linear attention  qkv 2N·C·3hd, proj 2N·hd·C; per chunk of l: scores 2Bh·l²·d,
               sums 2Bh·l²·e, state in and out 4Bh·l·d·e (e = d + 1 when normalised)

with N = B·T tokens. Matmuls are counted as they reach the ATen dispatcher (mm,
addmm, bmm, baddbmm, convolution; attention as one fused kernel); torch's FlopCounterMode
checks the dense FLOPs independently.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import cyclelang
from cyclelang import ir

from .conftest import ROOT, SPECS, shrink as shrink_spec, need, rotated

torch = need("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from cyclelang.backends.torch.build import build  # noqa: E402

B, T = 2, 8

def shrink(path):
    """The spec at width 96, two layers a stage, vocab 96, context 16 (windows in proportion)."""
    return shrink_spec(path, width=96, depth=2, vocab=96, context=16)


# --- the closed form ----------------------------------------------------------------------


def chunks(T: int, chunk: int) -> list[int]:
    """The lengths of the chunks a scan cuts T positions into."""
    return [min(chunk, T - s) for s in range(0, T, chunk)]


def expected(spec: ir.Spec, B: int, T: int) -> tuple[int, int]:
    """(matmuls, FLOPs) of one eval-mode forward pass on (B, T) tokens."""
    e = spec.engine
    N = B * T
    count = flops = 0

    def turbine(op):
        nonlocal count, flops
        if isinstance(op, ir.Attention):
            h, kv, d, C = op.heads, op.kv_heads, op.head_dim, op.width
            count += 3  # qkv, the fused attention kernel, proj
            count += 1 if op.sinks else 0  # sinks: the scores and the weighted sum, two matmuls of the same FLOPs as the kernel
            flops += 2 * N * C * (h + 2 * kv) * d + 2 * N * h * d * C + 4 * B * h * T * T * d
            if op.gate != "none":  # the output gate's projection (Qwen3-Next)
                count += 1
                flops += 2 * N * C * (h * d if op.gate == "channel" else h)
        elif isinstance(op, ir.Mlp):
            g = 2 if op.act in ("swiglu", "geglu", "swiglu_clamp") else 1
            count += 2
            flops += 2 * N * op.width * op.hidden * g + 2 * N * op.hidden * op.width
        elif isinstance(op, ir.Moe):
            g = 2 if op.act in ("swiglu", "geglu", "swiglu_clamp") else 1
            count += 1 + 2 * op.experts
            flops += 2 * N * op.width * op.experts + 2 * N * op.top * (op.width * op.hidden * g + op.hidden * op.width)
            if op.shared:  # the shared expert every token visits (and its gate)
                count += 2 + (1 if op.shared_gate else 0)
                flops += 2 * N * (op.width * op.shared * g + op.shared * op.width) + (2 * N * op.width if op.shared_gate else 0)
        elif isinstance(op, ir.Linear):
            count += 1
            flops += 2 * N * op.width * op.out
        elif isinstance(op, ir.LatentAttention):
            h, d, r, v, L, C = op.heads, op.head_dim, op.rotary_dims, op.v_dim, op.latent, op.width
            q = op.q_latent
            count += (2 if q else 1) + 3 + 2
            flops += (2 * N * C * q + 2 * N * q * h * (d + r)) if q else 2 * N * C * h * (d + r)
            flops += 2 * N * C * (L + r) + 2 * N * L * h * (d + v) + 2 * N * h * v * C + 2 * B * h * T * T * (d + r + v)
        elif isinstance(op, ir.Ssm):
            h, p, n, g, C = op.heads, op.head_dim, op.state, op.groups, op.width
            i = h * p
            count += 3
            flops += 2 * N * C * (2 * i + 2 * g * n + h) + 2 * B * (i + 2 * g * n) * T * op.conv + 2 * N * i * C
            for l in chunks(T, op.chunk):
                count += 4
                flops += 2 * B * h * l * l * (n + p) + 4 * B * h * l * p * n
        elif isinstance(op, ir.GatedDelta):
            h, dk, dv, C = op.heads, op.head_dim, op.v_dim, op.width
            count += 6  # in_proj_qkv, the conv, in_proj_b, in_proj_a, in_proj_z, out_proj
            flops += 2 * N * C * (op.conv_dim + 2 * h + h * dv) + 2 * B * op.conv_dim * T * op.conv + 2 * N * h * dv * C
            for l in chunks(T, op.chunk):
                count += 6  # k.k and q.k scores, the state read twice, the scores' sum, the state written
                flops += B * h * (4 * l * l * dk + 2 * l * l * dv + 6 * l * dk * dv)
        elif isinstance(op, ir.Mamba1):
            i, n, R, C = op.inner, op.state, op.dt_rank, op.width
            count += 5  # in_proj, the conv, x_proj, the step's projection, out_proj
            flops += 2 * N * C * 2 * i + 2 * B * i * T * op.conv + 2 * N * i * (R + 2 * n) + 2 * N * R * i + 2 * N * i * C
            for l in chunks(T, op.chunk):
                count += 1  # the state read by C
                flops += 2 * B * l * i * n
        elif isinstance(op, ir.ShortConv):
            C = op.width
            count += 3  # in_proj, the depthwise conv, out_proj
            flops += 2 * N * C * 3 * C + 2 * B * C * T * op.size + 2 * N * C * C
        elif isinstance(op, ir.LinearAttention):
            h, d, C = op.heads, op.head_dim, op.width
            e = d + (1 if op.normalize else 0)
            count += 2
            flops += 2 * N * C * 3 * h * d + 2 * N * h * d * C
            for l in chunks(T, op.chunk):
                count += 4
                flops += 2 * B * h * l * l * (d + e) + 4 * B * h * l * d * e

    def branch(p: ir.Prechamber):
        nonlocal count, flops
        for op in p.ops:
            turbine(op)
        if isinstance(p.merge, ir.GateMerge):
            count += 1
            flops += 2 * N * p.width * p.width
        if isinstance(p.merge, ir.HyperMerge):  # the read (pre) and the streams' mixing (res); dynamic: the projection onto them
            n, C = p.merge.streams, p.width
            count += 3 if p.merge.dynamic else 2
            flops += 2 * N * n * C + 2 * N * n * n * C
            if p.merge.dynamic:
                flops += 2 * N * (2 + n) * n * n * C if p.merge.connections == "manifold" else 2 * N * n * (2 + n) * C

    def stage(st: ir.Stage):  # every instance, and a nested stage's in every instance of its group
        for _ in range(st.repeat):
            for op in st.ops:
                if isinstance(op, ir.Stage):
                    stage(op)
                elif isinstance(op, ir.Prechamber):
                    branch(op)
                elif isinstance(op, ir.Fullflow):
                    for p in op.branches:
                        branch(p)
                else:
                    turbine(op)

    for top in e.body:
        if isinstance(top, ir.Stage):
            stage(top)
        else:
            turbine(top)
    count += 1
    flops += 2 * N * e.nozzle.width * e.nozzle.vocab
    return count, flops


# --- counting -----------------------------------------------------------------------------


class MatmulCounter(TorchDispatchMode):
    """Counts matmul kernels and their FLOPs as they reach ATen (attention and convolutions included)."""

    ATTENTION = re.compile(r"aten\._scaled_dot_product_\w*attention\w*")

    def __init__(self):
        super().__init__()
        self.count = 0
        self.flops = 0
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in ("aten.mm", "aten.addmm"):
            a, b = (args[0], args[1]) if name == "aten.mm" else (args[1], args[2])
            self._add(name, 2 * a.shape[0] * a.shape[1] * b.shape[1])
        elif name in ("aten.bmm", "aten.baddbmm"):
            a, b = (args[0], args[1]) if name == "aten.bmm" else (args[1], args[2])
            self._add(name, 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2])
        elif name == "aten.convolution":  # flops: 2 x the output's numel x the kernel's inputs per output (depthwise: K)
            out = func(*args, **(kwargs or {}))
            self._add(name, 2 * out.numel() * args[1].shape[1] * args[1].shape[2])
            return out
        elif self.ATTENTION.fullmatch(name):
            q, k, v = args[:3]
            Bq, H, L, E = q.shape
            S = k.shape[-2]
            self._add(name, 2 * Bq * H * L * S * E + 2 * Bq * H * L * S * v.shape[-1])
        return func(*args, **(kwargs or {}))

    def _add(self, name, flops):
        self.count += 1
        self.flops += flops
        self.seen.append(name)


def small(path):
    """The fast form, as `cyclec train` and the benchmarks run it."""
    return build(shrink(path), seed=0, fast=True).eval()


@pytest.mark.parametrize("path", rotated(SPECS, 2, 0), ids=lambda p: p.stem)  # half in the fast tier (test_review_torch's FLOP sweep takes others)
def test_matmuls_and_flops_per_forward(path):
    spec = shrink(path)
    model = build(spec, seed=0).eval()
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    want_count, want_flops = expected(spec, B, T)
    with torch.no_grad(), MatmulCounter() as mc:
        model(idx)
    assert (mc.count, mc.flops) == (want_count, want_flops), f"{path.stem}: {mc.seen}"
    # torch's own counter agrees on the dense part (it cannot see the fused CPU attention kernel)
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(idx)
    attention = sum(4 * B * a.heads * T * T * a.head_dim for a in _attentions(spec))
    assert fc.get_total_flops() in (want_flops - attention, want_flops)


def _attentions(spec):
    out = []

    def visit(node):
        if isinstance(node, ir.Attention):
            out.append(node)
        elif isinstance(node, ir.Stage):
            for _ in range(node.repeat):
                for op in node.ops:
                    visit(op)
        elif isinstance(node, ir.Prechamber):
            for op in node.ops:
                visit(op)
        elif isinstance(node, ir.Fullflow):
            for p in node.branches:
                visit(p)

    for op in spec.engine.body:
        visit(op)
    return out


def test_closed_form_gpt2_small():
    """The closed form at full size: GPT-2 small's well-known forward cost per token."""
    spec = cyclelang.load(ROOT / "specs" / "gpt2.cycle")
    _, flops = expected(spec, 1, 1)
    # 12 layers x (qkv 3C^2 + proj C^2 + mlp 8C^2) x 2 + attention 4Cd... + head 2CV
    C, V = 768, 50257
    assert flops == 12 * (2 * 12 * C * C + 4 * 12 * 64) + 2 * C * V


# --- graph capture ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama", pytest.param("moe", marks=pytest.mark.slow)])  # test_moe_op compiles a MoE fast
def test_compile_fullgraph(name):
    model = small(ROOT / "specs" / f"{name}.cycle")
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # graph capture is the guard; no C++ build
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx), model(idx))
    torch._dynamo.reset()


class GraphCounter:
    """A torch.compile backend that records every graph dynamo hands it, as (frame, compile
    of that frame) ids (a compile > 0 is a recompile), then runs it through AOTAutograd
    with eager kernels, so a training step traces its backward too (no C++ build)."""

    def __init__(self):
        self.compiles: list[tuple[int, int]] = []
        self.aot = torch._dynamo.lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        cid = torch._guards.CompileContext.current_compile_id()
        self.compiles.append((cid.frame_id, cid.frame_compile_id))
        return self.aot(gm, example_inputs)


@pytest.mark.slow  # two inductor compiles per spec (about 20 s on 2 cores): the full run keeps the guard
@pytest.mark.parametrize("name", ["gpt2", "moe"])
def test_compiled_training_is_one_graph_and_one_recompile_for_a_new_batch(name):
    """Counts, not times: training steps of the compiled spec are one graph (fullgraph: a
    graph break fails to compile), the same batch again compiles nothing, the first other
    batch size recompiles once (dynamo then marks the batch dynamic) and later ones never.
    A change that adds a graph, a break or a recompile per step or per batch fails here.
    The MoE trains with its capacity (dropping) and balance loss, the experts in their op."""
    model = small(ROOT / "specs" / f"{name}.cycle").train()
    twin = small(ROOT / "specs" / f"{name}.cycle").train()  # the same weights (seed 0), eager
    counter = GraphCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, twin)]
    seen = []
    for batch in (2, 2, 3, 5):
        idx = torch.randint(0, model.config.vocab_size, (batch, T), generator=torch.Generator().manual_seed(batch))
        tgt = torch.cat((idx[:, 1:], torch.full((batch, 1), -1)), dim=1)
        losses = []
        for fn, opt in ((compiled, opts[0]), (twin, opts[1])):
            opt.zero_grad(set_to_none=True)
            loss = fn(idx, tgt)[1]
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)  # the compiled step is the eager one
        seen.append(list(counter.compiles))
    torch._dynamo.reset()
    assert seen == [[(0, 0)], [(0, 0)], [(0, 0), (0, 1)], [(0, 0), (0, 1)]], seen


class GraphKeeper:
    """A torch.compile backend that keeps the graphs dynamo captures and runs them as they are."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def test_the_compiled_graph_has_no_nested_compile_region():
    """The stages are traced inline, not through `torch.compiler.nested_compile_region`: with
    torch 2.13's inductor a region's backward may reuse the buffer of a saved input that is
    really a parameter, and so overwrite the weight (found on the nested hybrid in
    tests/test_nested.py: an ssm's A_log changed by 2.7 in one compiled backward). Inductor
    still compiles each distinct loop once: identical kernels of repeated blocks share a build."""
    model = small(ROOT / "specs" / "gpt2.cycle").train()
    keeper = GraphKeeper()
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    torch.compile(model, fullgraph=True, backend=keeper)(idx, idx)
    torch._dynamo.reset()
    (gm,) = keeper.graphs
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.higher_order.invoke_subgraph not in targets
    assert any(t is torch._C._nn.scaled_dot_product_attention or "scaled_dot_product_attention" in str(t) for t in targets)  # the blocks are in it


@pytest.mark.slow
@pytest.mark.xfail(raises=AssertionError, strict=False,
                   reason="torch's inductor lowers a region's backward with the enclosing backward's donated-buffer indices "
                          "(pytorch/pytorch#193960, not in torch 2.13.0 or 2.14.1). Whether the reused buffer is still live "
                          "depends on the machine's kernel plan: 0.074 off on the earlier CI machines, exact on this session's "
                          "(XPASS, printed by -ra): an XPASS here is not the fix, so it does not fail the run")
def test_inductor_compiles_a_reused_nested_region_exactly():
    """Why the stages are inline, kept as a check on torch itself. Three pre-norm residual
    blocks through one `nested_compile_region`, compiled with inductor: the gradients must
    equal eager's and the weights stay. In torch 2.13 the region's backward subgraph takes the
    outer backward's donated-buffer indices by position, so inductor reuses buffers that
    are still live (0.074 off here; on the nested hybrid it overwrote an ssm's A_log);
    clearing them for the subgraph, as the upstream fix does, makes this exact (2e-8) and the
    nested hybrid's inductor test pass with the regions (checked by hand on 72715a6). A
    strict xfail: the day a torch release fixes it, this fails, and the stage regions
    (16 distinct C++ kernels for the MoE at the tests' config against 18) can come back."""

    @torch.compiler.nested_compile_region
    def block(x, w, v):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return x + torch.tanh(h @ v)

    g = torch.Generator().manual_seed(0)
    ws = [torch.nn.Parameter(1 + 0.1 * torch.randn(16, generator=g)) for _ in range(3)]
    vs = [torch.nn.Parameter(torch.randn(16, 16, generator=g) / 4) for _ in range(3)]
    x = torch.randn(4, 8, 16, generator=g)

    def loss(x):
        for w, v in zip(ws, vs):
            x = block(x, w, v)
        return x.pow(2).mean()

    def grads(fn):
        for p in ws + vs:
            p.grad = None
        fn(x).backward()
        return [p.grad.clone() for p in ws + vs]

    before = [p.detach().clone() for p in ws + vs]
    eager = grads(loss)
    torch._dynamo.reset()
    # caches off: their keys leave out a region's donated-buffer indices, so a hit can hand this test the
    # compile of tests/test_regional_compile.py's same blocks with donated buffers off, or that one this one's
    with torch._inductor.config.patch(force_disable_caches=True):
        compiled = grads(torch.compile(loss, fullgraph=True))
    torch._dynamo.reset()
    assert all(torch.equal(p.detach(), b) for p, b in zip(ws + vs, before))
    assert max((a - b).abs().max().item() for a, b in zip(compiled, eager)) < 1e-6


def _perturbed(name):
    model = small(ROOT / "specs" / f"{name}.cycle").train()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


# distinct C++ kernels inductor generates for one training step at the shrunk config (2 blocks),
# measured with the MoE's routed op (router softmax and balance loss inside) and the token
# lookup's op (untied heads), the stages traced inline; with the stages as nested compile
# regions (dropped: they let inductor overwrite a weight) they were gpt2 15, llama 14, moe 16.
# An upper bound: a change that makes inductor generate more distinct code (and so compile
# longer; each C++ kernel is about a second of a cold compile) fails here.
KERNELS = {"gpt2": 15, "llama": 19, "moe": 18}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_inductor_training_step_equals_eager_within_its_kernel_budget(name):
    """The step torch.compile's default backend (inductor) builds: loss and every gradient
    equal eager's within 1e-6 on perturbed weights, every parameter and buffer as it was
    (a backward that reuses a saved weight's buffer would overwrite it), and no more distinct
    C++ kernels than KERNELS. Every kernel's source passes through `cpp_pybinding`, built
    or, on a hit in inductor's caches, loaded (the same 15, 19 and 18 either way), so the
    caches stay on."""
    from unittest import mock

    import torch._inductor.async_compile as async_compile

    model = _perturbed(name)
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)

    def step(fn):
        model.zero_grad(set_to_none=True)
        loss = fn(idx, tgt)[1]
        loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}

    eager_loss, eager = step(model)
    sources = set()
    build = async_compile.AsyncCompile.cpp_pybinding

    def record(self, argtypes, source_code):
        sources.add(source_code)
        return build(self, argtypes, source_code)

    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch._dynamo.reset()
    with mock.patch.object(async_compile.AsyncCompile, "cpp_pybinding", record):
        loss, grads = step(torch.compile(model, fullgraph=True))
    torch._dynamo.reset()
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, state[k])] == []
    torch.testing.assert_close(loss, eager_loss, rtol=0, atol=1e-6)
    for k in eager:
        torch.testing.assert_close(grads[k], eager[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    assert 0 < len(sources) <= KERNELS[name], len(sources)


# --- the front end stays torch-free -------------------------------------------------------


# a process each; test_draw_does_not_import_torch keeps a draw in the fast tier
@pytest.mark.parametrize("args", [["check"], pytest.param(["draw", "-o", "{tmp}/x.dot"], marks=pytest.mark.slow),
                                  pytest.param(["draw", "--view", "graph", "-o", "{tmp}/y.dot"], marks=pytest.mark.slow), ["fmt", "--check"]])
def test_front_end_leaves_torch_unimported(args, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in args] + [str(ROOT / "specs" / "gpt2.cycle")]
    code = (
        "import sys\nfrom cyclelang.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code in (0, None, 1), e.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
