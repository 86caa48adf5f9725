"""Hyper-connections: a chamber of several residual streams (`chamber streams=N connections=hyper|manifold`).

Held to a float64 reference written here from the papers' equations, stream by stream:

- HC (Zhu et al. 2024, "Hyper-Connections", eqs. 1-5 and the dynamic form's eqs. 11-13): the
  layer's input is h = sum_j A_m[j] H_j, its output y = T(h) is written as
  H'_k = B[k] y + sum_j A_r[j, k] H_j; static A_m, B, A_r are learned numbers; dynamic ones add
  s_alpha tanh(norm(H_j) W_m), s_beta tanh(norm(H_j) W_beta), s_alpha tanh(norm(H_j) W_r)[k] per
  stream j. The input is copied to every stream; the last layer's streams are summed.
- mHC (DeepSeek-V4's manifold-constrained form): from the RMS-normalised flattened streams z,
  pre = sigmoid(s_pre (W z)_pre + b_pre) + eps, post = 2 sigmoid(s_post (W z)_post + b_post),
  res = softmax over each row of s_res (W z)_res + b_res, + eps, then Sinkhorn: columns, then rows and
  columns in turn, K - 1 times.

Every mixing weight is perturbed, so each one matters; the reference calls the model's own
branches (attention, MLP) as black boxes and owns every junction.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang import ir  # noqa: E402
from cyclelang.diagnostics import CycleError  # noqa: E402
from cyclelang.review import analyze, review  # noqa: E402

F = torch.nn.functional

SPEC = """engine hc {{
  chamber width=16{chamber}
  throat causal
  feed tokens vocab=40 context=32
  stage block x 3 {{
    prechamber mix {{ norm rmsnorm  turbine attention heads=2 kv_heads=1 }}
    prechamber burn {{ norm rmsnorm  turbine mlp ratio=2 act=swiglu }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def _spec(chamber=" streams=4 connections=hyper"):
    return cyclelang.parse(SPEC.format(chamber=chamber), "hc.cycle")


def _model(spec, perturb=True, seed=0):
    torch.manual_seed(seed)
    model = cyclelang.build(spec, seed=seed).double().eval()
    if perturb:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                scale = 0.3 if (".hyper." in name and not name.endswith(".fn")) else 0.05
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _hyper_junction(H, hc, T, dynamic):
    """HC, stream by stream: H (B, T, n, C); hc the junction's parameters; T the branch."""
    n = H.size(2)
    base = hc.base
    A_m, Bw, A_r = base[:n], base[n : 2 * n], base[2 * n :].view(n, n)
    B_, T_ = H.shape[:2]
    pre = [A_m[j].expand(B_, T_) for j in range(n)]
    post = [Bw[k].expand(B_, T_) for k in range(n)]
    res = [[A_r[j, k].expand(B_, T_) for k in range(n)] for j in range(n)]
    if dynamic:
        s_alpha, s_beta = hc.scale[0], hc.scale[1]
        W_m, W_b, W_r = hc.fn[0], hc.fn[1], hc.fn[2:]
        for j in range(n):
            Hj = H[:, :, j]
            mu = Hj.mean(-1, keepdim=True)
            var = ((Hj - mu) ** 2).mean(-1, keepdim=True)
            Hbar = (Hj - mu) / torch.sqrt(var + hc.norm.eps) * hc.norm.weight + hc.norm.bias  # the paper's norm(H)
            pre[j] = pre[j] + s_alpha * torch.tanh(Hbar @ W_m)
            post[j] = post[j] + s_beta * torch.tanh(Hbar @ W_b)
            for k in range(n):
                res[j][k] = res[j][k] + s_alpha * torch.tanh(Hbar @ W_r[k])
    h = sum(pre[j][..., None] * H[:, :, j] for j in range(n))
    y = T(h)
    return torch.stack([post[k][..., None] * y + sum(res[j][k][..., None] * H[:, :, j] for j in range(n)) for k in range(n)], dim=2)


def _manifold_junction(H, hc, T, iters, eps):
    """mHC with Sinkhorn, from its equations."""
    B_, T_, n, C = H.shape
    z = H.reshape(B_, T_, n * C)
    z = z / torch.sqrt((z * z).mean(-1, keepdim=True) + eps)
    m = z @ hc.fn.t()  # (B, T, (2 + n) n)
    b, s = hc.base, hc.scale
    pre = torch.sigmoid(s[0] * m[..., :n] + b[:n]) + eps
    post = 2 * torch.sigmoid(s[1] * m[..., n : 2 * n] + b[n : 2 * n])
    logits = (s[2] * m[..., 2 * n :] + b[2 * n :]).view(B_, T_, n, n)
    e = torch.exp(logits - logits.max(-1, keepdim=True).values)
    R = e / e.sum(-1, keepdim=True) + eps  # a softmax over each row, floored
    R = R / (R.sum(-2, keepdim=True) + eps)  # columns sum to 1
    for _ in range(iters - 1):
        R = R / (R.sum(-1, keepdim=True) + eps)  # rows
        R = R / (R.sum(-2, keepdim=True) + eps)  # columns
    h = sum(pre[..., j, None] * H[:, :, j] for j in range(n))
    y = T(h)
    out = [post[..., k, None] * y + sum(R[..., j, k, None] * H[:, :, j] for j in range(n)) for k in range(n)]
    return torch.stack(out, dim=2), R


def _reference(model, idx, merge):
    """The whole model, its junctions from the equations above, its branches and ends its own."""
    x = model.feed(idx, 0)
    n = merge.streams
    H = torch.stack([x] * n, dim=2)  # the input copied to each stream
    for stage in model.stages:
        for name in ("mix", "burn"):
            br = getattr(stage, name)
            T = (lambda h, br=br: br(h, None)) if name == "mix" else br
            if merge.connections == "manifold":
                H, _ = _manifold_junction(H, br.hyper, T, merge.sinkhorn, merge.eps)
            else:
                H = _hyper_junction(H, br.hyper, T, merge.dynamic)
    x = H.sum(2)  # the streams summed, before the final norm
    return model.head(model.norm(x))


CHAMBERS = {
    "hyper": " streams=4 connections=hyper",
    "hyper_dynamic": " streams=3 connections=hyper dynamic",
    "manifold": " streams=4 connections=manifold sinkhorn=7",
}


@pytest.mark.parametrize("chamber", list(CHAMBERS))
def test_the_model_equals_the_papers_equations_and_so_do_its_gradients(chamber):
    spec = _spec(CHAMBERS[chamber])
    merge = ir.chamber_streams(spec.engine.body)
    model = _model(spec)
    idx = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(3))
    targets = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(4))
    got = model(idx)
    want = _reference(model, idx, merge)
    assert torch.allclose(got, want, atol=1e-10, rtol=1e-10), (got - want).abs().max()
    params = [p for p in model.parameters()]
    loss = F.cross_entropy(model(idx).view(-1, 40), targets.view(-1))  # in float64 (the model's own loss is scored in float32)
    g_model = torch.autograd.grad(loss, params, allow_unused=True)
    ref_loss = F.cross_entropy(_reference(model, idx, merge).view(-1, 40), targets.view(-1))
    g_ref = torch.autograd.grad(ref_loss, params, allow_unused=True)
    assert torch.allclose(loss, ref_loss, atol=1e-12)
    hyper = [(n, a, b) for (n, _), a, b in zip(model.named_parameters(), g_model, g_ref) if ".hyper." in n]
    assert hyper and all(a is not None and a.abs().max() > 0 for _, a, _ in hyper)  # every junction weight learns
    for (name, _), a, b in zip(model.named_parameters(), g_model, g_ref):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.allclose(a, b, atol=1e-10, rtol=1e-8), name


def test_sinkhorn_makes_the_streams_mixing_doubly_stochastic():
    model = _model(_spec(CHAMBERS["manifold"].replace("sinkhorn=7", "sinkhorn=60")))
    hc = model.stages[1].burn.hyper
    H = torch.randn(2, 5, 4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    _, post, res = hc(H)
    assert res.shape == (2, 5, 4, 4) and bool((res > 0).all())
    assert torch.allclose(res.sum(-1), torch.ones(2, 5, 4, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(res.sum(-2), torch.ones(2, 5, 4, dtype=torch.float64), atol=1e-6)
    assert bool(((post > 0) & (post < 2)).all())
    _, R = _manifold_junction(H, hc, lambda h: h, 60, hc.eps)
    assert torch.allclose(res, R, atol=1e-12)


def test_one_stream_with_identity_weights_is_the_plain_residual_model():
    """n = 1, pre = post = res = 1: every junction is x + f(x), exactly."""
    plain = _model(_spec(""), perturb=True)
    for chamber in (" streams=1 connections=hyper", " streams=1 connections=hyper dynamic"):
        hyper = cyclelang.build(_spec(chamber), seed=0).double().eval()
        missing, unexpected = hyper.load_state_dict(plain.state_dict(), strict=False)
        assert not unexpected and missing and all(".hyper." in k for k in missing)
        for k in missing:  # static [pre | post | res] = [1 | 1 | 1]; a dynamic one's projection stays at 0
            assert torch.equal(hyper.state_dict()[k], torch.ones(3, dtype=torch.float64)) if k.endswith("base") else True
        idx = torch.randint(0, 40, (2, 11), generator=torch.Generator().manual_seed(6))
        assert torch.equal(hyper(idx), plain(idx)), chamber


def test_static_reads_start_on_stream_k_mod_n_and_the_model_starts_as_the_plain_one():
    spec = _spec(" streams=4 connections=hyper")
    model = cyclelang.build(spec, seed=0).double()
    bases = [m.base for m in model.modules() if type(m).__name__ == "HyperConnection"]
    assert len(bases) == 6
    for k, b in enumerate(bases):
        assert torch.equal(b[:4], F.one_hot(torch.tensor(k % 4), 4).double())
        assert torch.equal(b[4:8], torch.ones(4, dtype=torch.float64)) and torch.equal(b[8:].view(4, 4), torch.eye(4, dtype=torch.float64))
    plain = cyclelang.build(_spec(""), seed=0).double()
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected
    idx = torch.randint(0, 40, (1, 7), generator=torch.Generator().manual_seed(7))
    x = plain.feed(idx, 0)
    H = x.unsqueeze(2).expand(-1, -1, 4, -1)
    for a, b in zip(model.stages, plain.stages):
        H, x = a(H, None), b(x, None)
        for k in range(4):  # every stream holds the plain residual at init
            assert torch.allclose(H[:, :, k], x, atol=1e-12)


@pytest.mark.parametrize("chamber", list(CHAMBERS))
def test_decoding_with_the_cache_equals_the_full_pass(chamber):
    model = _model(_spec(CHAMBERS[chamber]))
    idx = torch.randint(0, 40, (2, 14), generator=torch.Generator().manual_seed(8))
    full = model(idx)
    cache = sys.modules[type(model).__module__].Cache()
    parts = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 14)]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10)
    sample = model.generate(idx[:, :4], 6, temperature=0)
    assert torch.equal(sample, model.generate(idx[:, :4], 6, temperature=0, use_cache=False))


@pytest.mark.parametrize("chamber", list(CHAMBERS))
def test_the_kinds_record_counts_what_the_model_holds_and_runs(chamber):
    from torch.utils.flop_counter import FlopCounterMode

    spec = _spec(CHAMBERS[chamber])
    model = cyclelang.build(spec, seed=0)
    part = ir.layout.layout(spec).part_of("stages.0.mix.hyper.base")
    assert part.path == "stages.0-2.mix.hyper" and part.role == "merge"
    hc = model.stages[0].mix.hyper
    assert part.params == sum(p.numel() for p in hc.parameters())
    assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
    n = part.node.streams
    H = torch.randn(1, 7, n, 16)
    counter = FlopCounterMode(display=False)
    with counter:
        h, post, res = hc(H)
        hc.write(H, h, post, res)
    assert counter.get_total_flops() == 7 * part.kind.flops(part.node, 7, 16)[0]


def test_the_source_reads_and_runs_with_torch_alone(tmp_path):
    spec = _spec(CHAMBERS["manifold"])
    for fast in (True, False):
        source = cyclelang.codegen(spec, fast=fast)
        assert "h, post, res = self.mix.hyper(x)" in source and "x = self.mix.hyper.write(x, self.mix(h, cache, mask), post, res)" in source
        assert "x = x.unsqueeze(2).expand(-1, -1, self.config.streams, -1)" in source and "x = x.sum(2)" in source
        path = tmp_path / f"model_{fast}.py"
        path.write_text(source)
        name = f"hc_model_{fast}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = mod
        try:
            mod_spec.loader.exec_module(mod)
            m = mod.Model()
            assert sum(p.numel() for p in m.parameters()) == analyze(spec)["params"]["total"]
            assert m(torch.randint(0, 40, (1, 5))).shape == (1, 5, 40)
        finally:
            del sys.modules[name]


REFUSED = [
    ("streams=4", "  stage block x 3 {\n", "  stage block x 3 {\n    norm rmsnorm\n", "E0291"),
    ("streams=4", "prechamber burn { norm rmsnorm  turbine mlp ratio=2 act=swiglu }",
     "prechamber burn { norm rmsnorm  turbine mlp ratio=2 act=swiglu  merge cooling }", "E0290"),
    ("", "prechamber burn { norm rmsnorm  turbine mlp ratio=2 act=swiglu }",
     "prechamber burn { norm rmsnorm  turbine mlp ratio=2 act=swiglu  merge hyper }", "E0290"),
    ("streams=4", "prechamber burn {", "prechamber aux overboard { turbine linear }\n    prechamber burn {", "E0291"),
    ("streams=4", "prechamber mix { norm rmsnorm  turbine attention heads=2 kv_heads=1 }",
     "fullflow { prechamber mix { norm rmsnorm  turbine attention heads=2 kv_heads=1 } }", "E0291"),
    ("streams=4", "  norm rmsnorm\n  nozzle", "  norm rmsnorm\n  stage tail { prechamber p { turbine mlp } }\n  nozzle", "E0291"),
    ("streams=4 connections=hyper sinkhorn=3", "", "", "E0290"),
    ("dynamic", "", "", "E0290"),
    ("streams=4 connections=manifold dynamic=false", "", "", "E0290"),
]


@pytest.mark.parametrize("chamber,old,new,code", REFUSED)
def test_what_several_streams_cannot_say_is_refused_with_its_code(chamber, old, new, code):
    text = SPEC.format(chamber=" " + chamber if chamber else "").replace(old, new) if old else SPEC.format(chamber=" " + chamber)
    with pytest.raises(CycleError) as e:
        cyclelang.parse(text, "hc.cycle")
    assert code in {d.code for d in e.value.diagnostics} and all(d.span is not None for d in e.value.diagnostics)


def test_merge_hyper_may_be_written_and_is_the_chambers():
    text = SPEC.format(chamber=" streams=2 connections=manifold").replace("act=swiglu }", "act=swiglu  merge hyper }")
    m = cyclelang.parse(text).engine.body[0].ops[1].merge
    assert m.model_dump() == ir.HyperMerge(streams=2, connections="manifold", dynamic=True, sinkhorn=20, eps=1e-6).model_dump()


def test_the_ir_refuses_mixed_junctions():
    spec = _spec()
    st = spec.engine.body[0]
    bad = st.model_copy(update=dict(ops=[st.ops[0], st.ops[1].model_copy(update=dict(merge=ir.PlainMerge()))]))
    e = spec.engine.model_copy(update=dict(body=[bad, *spec.engine.body[1:]]))
    with pytest.raises(ir.IRError):
        ir.validate(spec.model_copy(update=dict(engine=e)))


def test_a_scale_model_keeps_the_streams_and_fires():
    spec = _spec(CHAMBERS["hyper_dynamic"])
    small = ir.passes.shrink(spec, width=8, depth=2)
    assert ir.chamber_streams(small.engine.body).streams == 3
    report = cyclelang.fire(spec, width=8, depth=2, seq=8, batch=2)
    assert not report.failed


def test_W160_streams_no_branch_reads_at_init():
    text = SPEC.format(chamber=" streams=8 connections=hyper")
    diags = [d for d in review(cyclelang.parse(text, "hc.cycle")) if d.code == "W160"]
    assert len(diags) == 1 and "streams 6 to 7 start unread" in diags[0].message and diags[0].span.line == 5
    for chamber in (" streams=6 connections=hyper", " streams=8 connections=manifold"):
        assert "W160" not in {d.code for d in review(cyclelang.parse(SPEC.format(chamber=chamber)))}


def test_the_diagram_draws_several_chambers():
    dot = cyclelang.draw(_spec(CHAMBERS["manifold"])).source
    assert "chambers side by side" in dot and "4 streams, mHC, Sinkhorn 7" in dot
    plain = cyclelang.draw(_spec("")).source
    lines = 'class="main stages.0-2'
    assert dot.count(lines) == 4 * plain.count(lines) > 0  # each wire of the stages' chamber drawn once per stream
    assert "chambers side by side" not in plain


def test_a_deep_chamber_of_streams_is_not_told_to_cool_what_it_cannot():
    """W102 asks for `merge cooling`, which a chamber of several streams refuses (E0290)."""
    def deep(chamber):
        return cyclelang.parse(SPEC.format(chamber=chamber).replace("x 3", "x 40"))

    assert "W102" in {d.code for d in review(deep(""))}
    assert "W102" not in {d.code for d in review(deep(" streams=4 connections=manifold"))}


def test_mup_rules_of_a_junction_and_the_streams_let():
    text = SPEC.format(chamber=" streams=4 connections=manifold").replace("  nozzle head\n", "  nozzle head\n  startup { param mup base_width=8 }\n")
    spec = cyclelang.parse(text)
    assert {r["path"]: r["rule"] for r in ir.mup.table(spec.engine) if ".hyper" in r["path"]} == {
        "stages.0-2.mix.hyper": "output", "stages.0-2.burn.hyper": "output"}  # width onto a fixed number of weights
    model = cyclelang.build(spec, seed=0)
    rule = sys.modules[type(model).__module__].mup_rule
    assert {n.rsplit(".", 1)[1]: rule(n, p) for n, p in model.named_parameters() if n.startswith("stages.0.mix.hyper")} == {
        "fn": "output", "base": "vector", "scale": "vector"}
    source = cyclelang.codegen(cyclelang.parse("let n = 3\n" + SPEC.format(chamber=" streams=n connections=hyper")))
    assert "    n: int = 3  # residual streams" in source and "HyperConnection(config.width, config.n)" in source
