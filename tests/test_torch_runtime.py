"""The runtime helpers every generated file inlines, tested as the modules they are.

`cyclelang/backends/torch/runtime/` holds them as real Python; codegen copies their text
into the file. Here each is imported and held to a reference written independently
(F.cross_entropy, the papers' equations, autograd, plain concatenation), and the text
codegen inlines is held to the modules: the same definitions, reading only the names the
generated file defines.
"""

from __future__ import annotations

import ast
import builtins
import math

import pytest

import cyclelang
from cyclelang.backends.torch import runtime
from cyclelang.backends.torch.codegen import PARALLEL, codegen

from .conftest import ROOT, need

torch = need("torch")
F = torch.nn.functional

from cyclelang.backends.torch.runtime import cache, embedding, experts, loss, masks, positions  # noqa: E402

ACTS = ["gelu", "gelu_tanh", "relu", "relu2", "silu", "swiglu", "geglu"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- the text codegen inlines -------------------------------------------------------------------


def test_runtime_modules_speak_the_generated_files_vocabulary():
    """Each module imports only what the generated file imports (torch, F, math), so a
    definition copied into the file finds every global it reads; besides those, only a
    definition codegen always inlines with it (the parallel section's, codegen.PARALLEL:
    compile_model calls start_cpu_probe)."""
    file_globals = {"torch", "F", "math", "nn"} | set(dir(builtins))
    siblings = {"parallel": set(PARALLEL)}
    for module in runtime.MODULES:
        tree = ast.parse((runtime.HERE / f"{module}.py").read_text("utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Import):
                assert [a.name for a in node.names] in (["torch"], ["math"]), (module, ast.unparse(node))
            elif isinstance(node, ast.ImportFrom):
                assert ast.unparse(node) == "from torch.nn import functional as F", (module, ast.unparse(node))
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                defined |= {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs + [n.vararg, n.kwarg] if a}
                defined |= {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                # an import inside a definition binds its name there (parallelize imports torch.distributed so)
                defined |= {a.asname or a.name.split(".")[0] for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))
                            for a in n.names}
                free = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - defined - file_globals - siblings.get(module, set())
                assert not free, f"runtime/{module}.py: {node.name} reads {sorted(free)}, which the generated file lacks"


def test_inlined_text_is_the_modules_text():
    """What a generated file holds is each definition exactly as its module has it."""
    src = "".join(codegen(cyclelang.load(ROOT / "specs" / f"{name}.cycle"), fast=True) for name in ("moe", "mistral", "jamba"))
    for name in ("next_token_loss_op", "table_lookup", "rotary_tables", "apply_rotary", "sliding_mask", "Cache", "expert_mlps", "swiglu_grad"):
        text = runtime.definition(name)
        assert text.startswith(("def ", "class ")) and text in src, name  # jamba's Cache keeps every kind of state
    assert runtime.definition("sinusoids").endswith("return table  # (length, width)")  # a closing comment stays
    assert runtime.reads("sinusoids", "math") and not runtime.reads("Cache", "math")
    with pytest.raises(KeyError, match="no runtime definition 'nope'"):
        runtime.definition("nope")


def test_the_cache_keeps_only_the_state_kinds_the_spec_uses():
    """An attention-only model's Cache has keys and values only; every kind of state has its
    methods in cache.STATES (the table codegen reads), and an unknown kind is named."""
    assert runtime.cache_class(set(cache.STATES)) == runtime.definition("Cache")
    llama = codegen(cyclelang.load(ROOT / "specs" / "llama.cycle"))
    assert runtime.cache_class({"kv"}) in llama
    assert "def extend(" in llama and "def extend_pool(" not in llama and "def recurrent(" not in llama and "def keep(" not in llama
    mamba = codegen(cyclelang.load(ROOT / "specs" / "mamba2.cycle"))  # the conv's window and the scan's state, no keys
    assert "def extend(" not in mamba and "def extend_pool(" in mamba and "def keep(" in mamba
    listed = {m for methods in cache.STATES.values() for m in methods}
    assert listed <= set(vars(cache.Cache)), "STATES names a method Cache lacks"
    with pytest.raises(KeyError, match="state kind.*delta"):
        runtime.cache_class({"kv", "delta"})


def test_reading_the_runtime_and_lowering_import_no_torch():
    import subprocess
    import sys

    prog = ("import sys; from cyclelang.backends.torch import runtime; runtime.definition('Cache'); "
            "import cyclelang.backends.torch.codegen, cyclelang.backends.torch.build; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- the next-token loss (a custom op) ----------------------------------------------------------

LOSS = loss.next_token_loss_op("test_runtime_next_token_loss")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_next_token_loss_equals_cross_entropy_forward_and_gradient(dtype):
    assert LOSS is loss.next_token_loss_op("test_runtime_next_token_loss")  # defined once
    g = gen()
    logits = torch.randn(24, 50, generator=g, dtype=dtype)
    targets = torch.randint(0, 50, (24,), generator=g)
    targets[[3, 7, 20]] = -1
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours, p = LOSS(a, targets)
    theirs = F.cross_entropy(b.float(), targets, ignore_index=-1)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert torch.equal(p, F.softmax(logits.float(), dim=-1)) and not p.requires_grad
    (3.0 * ours).backward()
    (3.0 * theirs).backward()
    assert a.grad.dtype == dtype
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)
    assert not a.grad[[3, 7, 20]].any()  # ignored targets get no gradient


def far_below(dtype=torch.float32):
    """Logits whose targets sit far below their rows' best tokens: 300 nats (the softmax entry
    is 0), 95 (a subnormal float) and 75 (normal, under the op's 1e-30 bound), beside ordinary
    rows and an ignored one whose every entry but one is 0."""
    logits = torch.randn(8, 40, generator=gen(5), dtype=dtype)
    targets = torch.randint(1, 40, (8,), generator=gen(6))
    for row, gap in ((0, 300.0), (2, 95.0), (5, 75.0)):
        logits[row, 0] = logits[row, targets[row]] + gap
    targets[6] = -1  # ignored, and its stand-in target (token 0) 300 nats down: an entry of 0 that must not score
    logits[6, 1] = logits[6, 0] + 300.0
    return logits, targets


def accelerator_form():
    """The op as it runs on an accelerator (every row scored from its largest entry, no check
    that would wait for the device), defined on the CPU from loss.py's own text."""
    import inspect

    text = inspect.getsource(loss).replace('if p.device.type == "cpu":', "if False:")
    assert text.count("if False:") == 1
    space = {}
    exec(compile(text, "loss_accelerator_form", "exec"), space)
    return space["next_token_loss_op"]("test_runtime_next_token_loss_accelerator")


@pytest.mark.parametrize("form", ["cpu", "accelerator"])
def test_next_token_loss_is_exact_for_targets_far_below_the_best_token(form):
    """log(softmax) would give inf (an entry of 0) or lose digits (a subnormal one) where the
    target sits tens of nats below its row's best token: the CPU form scores those rows again
    by log_softmax, the accelerator form scores every row from its largest entry."""
    op = LOSS if form == "cpu" else accelerator_form()
    logits, targets = far_below()
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours, theirs = op(a, targets)[0], F.cross_entropy(b, targets, ignore_index=-1)
    assert torch.isfinite(ours) and theirs.item() > 300.0 / 7
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    ours.backward(), theirs.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)
    x, t = torch.randn(24, 50, generator=gen(7)), torch.randint(0, 50, (24,), generator=gen(8))
    torch.testing.assert_close(op(x, t)[0], F.cross_entropy(x, t), rtol=1e-6, atol=0)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_next_token_loss_traced_backward_equals_cross_entropy(backend):
    """Under torch.compile the backward is traced in its other form (the one-hot part first,
    which needs no incoming gradient, so the partitioner runs it in the forward in place and
    the scaling reuses that buffer): the same loss and gradient as F.cross_entropy, through a
    head so that the (N, vocab) gradient flows on, with ignored targets and rows far below
    their best token, scaled by an outer factor."""
    logits, targets = far_below()
    w = torch.randn(40, 40, generator=gen(9))
    h = (logits @ torch.linalg.inv(w)).requires_grad_()  # h @ w gives the far-below logits back

    def ours(h):
        return 3.0 * LOSS(h @ w, targets)[0]

    torch._dynamo.reset()
    try:
        got = torch.compile(ours, fullgraph=True, backend=backend)(h)
        (grad,) = torch.autograd.grad(got, h)
    finally:
        torch._dynamo.reset()
    want = 3.0 * F.cross_entropy(h @ w, targets, ignore_index=-1)
    (grad_want,) = torch.autograd.grad(want, h)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad, grad_want, rtol=1e-4, atol=1e-6)


def test_next_token_loss_scores_half_precision_in_float32():
    g = gen(1)
    logits = torch.randn(16, 40, generator=g).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 40, (16,), generator=g)
    out = LOSS(logits, targets)[0]
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.cross_entropy(logits.detach().float(), targets))
    out.backward()
    assert logits.grad.dtype == torch.bfloat16


def test_next_token_loss_backward_allocates_one_vocab_sized_tensor():
    """The backward's only (N, vocab) allocation is the gradient itself, the saved
    probabilities scaled: no `exp` pass, no zero-filled gradient for the probabilities (which
    take none; autograd materialises one unless told not to) and no one-hot. Counted on the
    dispatched ops, so it holds at any load."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Fresh(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
            for o in torch.utils._pytree.tree_leaves(out):
                if isinstance(o, torch.Tensor) and o.numel() >= 24 * 50 and o.untyped_storage().data_ptr() not in seen:
                    self.made.append(str(func))
            return out

    logits = torch.randn(24, 50, generator=gen(3), requires_grad=True)
    targets = torch.randint(0, 50, (24,), generator=gen(4))
    out = LOSS(logits, targets)[0]
    with Fresh() as mode:
        out.backward()
    assert mode.made == ["aten.mul.Tensor"], mode.made
    assert torch.allclose(logits.grad.sum(-1), torch.zeros(24), atol=1e-6)  # softmax minus one-hot, per row


def test_an_edited_loss_op_is_a_new_op():
    """The caches know the op by its name and hold its traced backward, so an edit to the
    definition (a generated file is the user's to edit) must give the op another name."""
    from cyclelang.backends.torch.build import load_source

    src = codegen(cyclelang.load(ROOT / "specs" / "gpt2.cycle"), fast=True)
    edited = src.replace("g = p * scale[:, None]", "g = p * scale[:, None]  # edited", 1)
    assert edited != src
    a, b = (load_source(s, "loss_edit").next_token_loss for s in (src, edited))
    assert str(a) != str(b) and str(a).startswith("cyclelang.next_token_loss_")
    x, t = torch.randn(4, 5, requires_grad=True), torch.tensor([0, 1, -1, 4])
    assert torch.equal(a(x, t)[0], b(x, t)[0])


def test_next_token_loss_op_passes_opcheck():
    """The op's schema, fake kernel, autograd registration and AOT dispatch (opcheck). (No
    gradcheck: the op scores in float32 as F.cross_entropy(logits.float()) does, too coarse
    for finite differences; the gradient is held to autograd's above.)"""
    g = gen(2)
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(6, 9, generator=g).to(dtype).requires_grad_()
        torch.library.opcheck(LOSS, (logits, torch.tensor([1, -1, 8, 0, 4, -1])))


def test_next_token_loss_compiles_into_one_graph_that_aotautograds_cache_accepts():
    """Under torch.compile the loss is one op in the graph (no higher-order op), so
    AOTAutograd's cache can hold a model that uses it: an autograd.Function would be
    traced as `autograd_function_apply`, which the cache refuses (a cold joint graph on
    every compile). Checked on the captured graph, with the cache's own test."""
    from torch._functorch._aot_autograd.autograd_cache import check_cacheable

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x, t):
        return LOSS(x * 2.0, t)[0]

    x = torch.randn(5, 7, requires_grad=True)
    t = torch.tensor([0, 6, -1, 2, 3])
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, backend=backend)(x, t)
    torch._dynamo.reset()
    assert len(graphs) == 1 and torch.equal(out, F.cross_entropy(x.detach() * 2.0, t, ignore_index=-1))
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert any(x.startswith("cyclelang.test_runtime_next_token_loss_") for x in targets), targets
    assert not any("autograd_function" in x for x in targets)
    check_cacheable(graphs[0])  # raises BypassAOTAutogradCache for a graph the cache refuses


# --- the Feed's embedding lookups (a custom op under torch.compile) ----------------------------

LOOKUP = embedding.table_lookup("test_runtime_lookup")


def lookup_graph(table, idx):
    """lookup(table, idx) under torch.compile (fullgraph, the eager backend): the output and
    the call targets of the graph dynamo captured."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        out = torch.compile(lambda i: LOOKUP(table, i), fullgraph=True, backend=backend)(idx)
    finally:
        torch._dynamo.reset()
    return out, {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("padding", [None, 3], ids=["plain", "padding"])
def test_lookup_is_the_embedding_and_its_gradient_under_compile(padding):
    """Held to nn.Embedding itself on perturbed weights: the same rows, the same gradient
    (a repeated id adds up, the padding row gets none), through the op."""
    table = torch.nn.Embedding(11, 6, padding_idx=padding, dtype=torch.float64)
    with torch.no_grad():
        table.weight.add_(torch.randn(table.weight.shape, generator=gen(5), dtype=torch.float64))
    idx = torch.tensor([[1, 3, 3, 10], [0, 3, 7, 1]])
    g = torch.randn(2, 4, 6, generator=gen(6), dtype=torch.float64)
    out, targets = lookup_graph(table, idx)
    assert any(t.startswith("cyclelang.test_runtime_lookup") for t in targets), targets
    (ours,) = torch.autograd.grad((out * g).sum(), [table.weight])
    (theirs,) = torch.autograd.grad((table(idx) * g).sum(), [table.weight])
    assert torch.equal(out, table(idx))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-15)
    if padding is not None:
        assert not ours[padding].any()
    assert LOOKUP(table, idx) is not None and torch.equal(LOOKUP(table, idx), table(idx))  # eager: the table itself


def test_lookup_calls_the_table_itself_when_it_is_not_plain():
    """A hooked or replaced table keeps its behaviour under torch.compile: the op reads only
    a plain nn.Embedding's weight, so anything else is called as a module."""
    seen = []
    table = torch.nn.Embedding(9, 4)
    handle = table.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    idx = torch.tensor([[1, 2, 8]])
    out, targets = lookup_graph(table, idx)
    assert seen and not any(t.startswith("cyclelang.test_runtime_lookup") for t in targets)
    handle.remove()
    normed = torch.nn.Embedding(9, 4, max_norm=0.5)
    out, targets = lookup_graph(normed, idx)
    assert not any(t.startswith("cyclelang.test_runtime_lookup") for t in targets)
    assert out.norm(dim=-1).max() <= 0.5 + 1e-6


def test_a_frozen_table_gets_no_gradient_through_the_lookup():
    table = torch.nn.Embedding(9, 4)
    table.weight.requires_grad_(False)
    x = torch.randn(1, 3, 4, requires_grad=True)
    out, _ = lookup_graph(table, torch.tensor([[1, 2, 8]]))
    (out * x).sum().backward()
    assert table.weight.grad is None and x.grad is not None


@pytest.mark.slow  # opcheck runs the op through several dispatch paths
def test_the_lookup_op_passes_opcheck():
    table = torch.nn.Embedding(9, 4, padding_idx=2)
    op = next(getattr(torch.ops.cyclelang, n) for n in dir(torch.ops.cyclelang) if n.startswith("test_runtime_lookup") and not n.endswith("_backward"))
    for padding in (-1, 2):
        weight = table.weight.detach().clone().requires_grad_(True)
        torch.library.opcheck(op, (torch.tensor([[1, 2, 8], [2, 2, 0]]), weight, padding))


# --- positions ------------------------------------------------------------------------------------


def test_sinusoids_are_the_transformers_formula():
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (Vaswani et al.)."""
    length, d = 9, 12
    table = positions.sinusoids(length, d)
    ref = torch.zeros(length, d, dtype=torch.float64)
    for pos in range(length):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            ref[pos, 2 * i], ref[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    torch.testing.assert_close(table.double(), ref, rtol=0, atol=1e-5)


def roformer(x: torch.Tensor, base: float) -> torch.Tensor:
    """RoFormer's rotation (Su et al., eq. 34), in the rotate-half pairing: dims i and i + d/2
    form the complex number z_i, rotated by m * theta_i with theta_i = base^(-2i/d) at position m."""
    T, d = x.size(-2), x.size(-1)
    theta = base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)  # (d/2,)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta  # (T, d/2)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double()) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag), dim=-1)


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rotary_is_roformers_rotation(base):
    x = torch.randn(2, 3, 7, 8, generator=gen(), dtype=torch.float64)
    cos, sin = positions.rotary_tables(7, 8, base)
    assert cos.shape == sin.shape == (7, 8)
    torch.testing.assert_close(positions.apply_rotary(x, cos.double(), sin.double()), roformer(x, base), rtol=1e-6, atol=1e-6)


def test_rotary_scores_depend_on_the_offset_only():
    """<R_m q, R_n k> = <R_(m+s) q, R_(n+s) k>: what makes rotary a relative position code."""
    cos, sin = (t.double() for t in positions.rotary_tables(16, 8, 10000.0))
    q, k = torch.randn(2, 8, generator=gen(2), dtype=torch.float64)

    def score(m, n):
        rq = positions.apply_rotary(q, cos[m], sin[m])
        rk = positions.apply_rotary(k, cos[n], sin[n])
        return (rq * rk).sum()

    torch.testing.assert_close(score(3, 1), score(12, 10))
    torch.testing.assert_close(score(5, 5), (q * k).sum())  # no offset: the plain dot product


def test_partial_rotary_rotates_the_first_dims_only():
    x = torch.randn(1, 2, 5, 12, generator=gen(3), dtype=torch.float64)
    cos, sin = (t.double() for t in positions.rotary_tables(5, 4, 10000.0))
    y = positions.apply_rotary_partial(x, cos, sin)
    torch.testing.assert_close(y[..., :4], positions.apply_rotary(x[..., :4], cos, sin))
    assert torch.equal(y[..., 4:], x[..., 4:])


# --- masks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("T, S", [(5, 5), (3, 8), (1, 6)])
def test_masks_let_a_query_see_its_past(T, S):
    for window in (1, 3, 100):
        m, s = masks.causal_mask(T, S, "cpu"), masks.sliding_mask(T, S, window, "cpu")
        assert m.shape == s.shape == (T, S)
        for i in range(T):
            pos = S - T + i  # the query's position after S - T cached ones
            for j in range(S):
                assert bool(m[i, j]) == (j <= pos)
                assert bool(s[i, j]) == (j <= pos and pos - j < window)


# --- the KV cache -----------------------------------------------------------------------------


def test_cache_extend_equals_concatenation():
    c = cache.Cache(length=10)
    layer = object()
    ks, vs = [], []
    for step, T in enumerate((4, 1, 3, 1)):
        k = torch.randn(2, 3, T, 5, generator=gen(step))
        v = torch.randn(2, 3, T, 5, generator=gen(step + 10))
        ks.append(k)
        vs.append(v)
        got_k, got_v = c.extend(layer, k, v)
        c.pos += T
        assert torch.equal(got_k, torch.cat(ks, 2)) and torch.equal(got_v, torch.cat(vs, 2))
    assert c.state[layer][0].shape == (2, 3, 10, 5)  # reserved once, for the whole length


def test_cache_keeps_a_pools_last_inputs():
    c = cache.Cache(length=10)
    layer = object()
    history = torch.empty(1, 0, 4)
    for T in (3, 1, 2):
        x = torch.randn(1, T, 4, generator=gen(T))
        h = c.extend_pool(layer, x, keep=2)
        assert torch.equal(h, torch.cat((history[:, -2:], x), 1))  # the kept inputs, then the new ones
        history = torch.cat((history, x), 1)
        assert torch.equal(c.state[layer], history[:, -2:])  # a bounded copy


# --- activations and their gradients ------------------------------------------------------------


def reference_act(act: str, h: torch.Tensor) -> torch.Tensor:
    plain = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu, "relu2": lambda x: F.relu(x) ** 2, "silu": F.silu}
    if act in plain:
        return plain[act](h)
    gate, up = h.chunk(2, dim=-1)
    return plain["silu" if act == "swiglu" else "gelu"](gate) * up


@pytest.mark.parametrize("act", ACTS)
def test_act_grad_matches_autograd(act):
    fn = getattr(experts, f"{act}_grad")
    h = torch.randn(7, 10, generator=gen(4), dtype=torch.float64)
    h = h + 0.01 * torch.sign(h)  # perturbed away from 0, where relu's derivative is a convention
    g = torch.randn(7, 5 if act in ("swiglu", "geglu") else 10, generator=gen(5), dtype=torch.float64)
    a, none = fn(h)
    assert none is None
    torch.testing.assert_close(a, reference_act(act, h), rtol=0, atol=0)
    hr = h.clone().requires_grad_()
    (ref,) = torch.autograd.grad((reference_act(act, hr) * g).sum(), hr)
    a2, gh = fn(h, g)
    assert torch.equal(a2, a)
    torch.testing.assert_close(gh, ref, rtol=1e-12, atol=1e-12)


def test_expert_mlps_runs_each_experts_rows():
    """The custom op on hand-made assignments: dropped rows are zeros, each expert's rows go
    through its own MLP, and its backward agrees with finite differences."""
    op = experts.expert_mlps("test_runtime_experts_silu", experts.silu_grad)
    assert op is experts.expert_mlps("test_runtime_experts_silu", experts.silu_grad)  # defined once
    g = gen(6)
    xs = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    counts = torch.tensor([1, 4, 0, 2])  # one dropped row, then experts 0, 1 (idle), 2
    weights = []
    for _ in range(3):
        weights += [torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64),
                    torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    weights = [w.requires_grad_() for w in weights]
    scale = torch.rand(7, generator=g, dtype=torch.float64).add_(0.5).requires_grad_()  # a router weight per row
    out, h = op(xs, counts, weights, True, None)
    weighted, _ = op(xs, counts, weights, True, scale)
    assert not out[0].any() and not weighted[0].any()
    rows = {0: slice(1, 5), 2: slice(5, 7)}
    for e, r in rows.items():
        fc, fc_b, proj, proj_b = weights[4 * e : 4 * e + 4]
        expect = F.linear(F.silu(F.linear(xs[r], fc, fc_b)), proj, proj_b)
        torch.testing.assert_close(out[r], expect)
        torch.testing.assert_close(weighted[r], scale[r, None] * expect)  # the weight scales the bias too
    assert torch.autograd.gradcheck(lambda x, *ws: op(x, counts, list(ws), True, None)[0], (xs, *weights))
    # the weighted rows: the gradient at each row's weight too (bias and no bias)
    assert torch.autograd.gradcheck(lambda x, s, *ws: op(x, counts, list(ws), True, s)[0], (xs, scale, *weights))
    plain = [w for i, w in enumerate(weights) if i % 2 == 0]  # fc.weight, proj.weight of each expert
    assert torch.autograd.gradcheck(lambda x, s, *ws: op(x, counts, list(ws), False, s)[0], (xs, scale, *plain))
