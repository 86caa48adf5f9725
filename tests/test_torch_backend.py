"""The PyTorch back-end: codegen, build, the model interface, numerics of every construct.

Big specs are shrunk (`shrink`) to a few layers of width 96 so the suite runs on two
CPU cores; full-size specs are built on the meta device (shapes only, no memory).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest

import cyclelang
from cyclelang.backends.torch.codegen import codegen
from cyclelang.ir.layout import NN_MODULE_ATTRS

from .conftest import ROOT, SPECS, shrink as shrink_spec, spec_id, need, rotated

torch = need("torch")
from cyclelang.backends.torch.build import build  # noqa: E402

CAUSAL = [p for p in SPECS if "throat causal" in p.read_text()]
OPEN = [p for p in SPECS if p not in CAUSAL]

SIZES = dict(width=96, depth=2, vocab=128, context=32)


def shrink(path):
    """The spec at width 96, two layers a stage, vocab 128, context 32 (windows in proportion)."""
    return shrink_spec(path, **SIZES)


def small(path, seed=0):
    return build(shrink(path), seed=seed)


def tokens(model, B=2, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (B, T), generator=g)


# --- codegen: golden, deterministic, safe ------------------------------------------------


@pytest.mark.parametrize("path", SPECS, ids=spec_id)
def test_generated_source_golden(path, golden):
    golden.check(ROOT / "tests" / "goldens" / "specs" / f"{path.stem}.model.py", codegen(cyclelang.load(path)))


@pytest.mark.slow  # two fresh processes
def test_codegen_is_deterministic_across_hash_seeds():
    prog = "import cyclelang, hashlib, glob\nfor p in sorted(glob.glob('specs/*.cycle')): print(hashlib.sha256(cyclelang.codegen(p).encode()).hexdigest())"
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(subprocess.run([sys.executable, "-c", prog], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout)
    assert len(outs) == 1


def test_codegen_does_not_import_torch():
    prog = "import sys, cyclelang; cyclelang.codegen('specs/llama.cycle'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_source_has_no_absolute_paths_and_names_the_spec_line():
    src = codegen(cyclelang.load(ROOT / "specs" / "gpt2.cycle"), comments="both")
    assert str(ROOT) not in src
    assert "gpt2.cycle:16" in src  # the mix prechamber's line (the tags of --comments both)
    assert "import torch" in src and not re.search(r"^import (?!math|torch)|^from (?!dataclasses|torch)", src, re.M)


@pytest.mark.slow  # a fresh process that imports torch
def test_reserved_names_cover_nn_module():
    # nn.Module as torch ships it: in this process other libraries (transformers) may
    # already have patched methods onto it, and generated code must not depend on that
    probe = "import torch, json; print(json.dumps(sorted(dir(torch.nn.Module()))))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert set(json.loads(out.stdout)) <= NN_MODULE_ATTRS


HOSTILE = """
engine class {
  chamber width=32
  throat causal
  feed tokens vocab=50 context=16
  stage value_error x 2 {
    prechamber forward { norm layernorm  turbine attention heads=2 }
    prechamber lambda { turbine mlp ratio=2 }
    prechamber _modules { turbine mlp ratio=1 }
    prechamber train { turbine pool size=2 }
    prechamber key { turbine mlp ratio=1  merge rezero }
  }
  stage model {
    prechamber config { turbine mlp ratio=1 }
    prechamber None_ { turbine linear }
    norm layernorm
    norm rmsnorm
  }
  stage none { turbine mlp ratio=1 }
  norm layernorm
  nozzle head tied
}
"""


def test_hostile_names_are_mangled_not_executed():
    model = build(cyclelang.parse(HOSTILE), seed=0)
    names = set(dict(model.named_parameters()))
    assert {"stages.0.forward_.attn.qkv.weight", "stages.0.lambda_.mlp.fc.weight", "stages.0.x_modules.mlp.fc.weight",
            "stages.0.key_.scale", "stages.2.config.mlp.fc.weight", "stages.2.norm1.weight", "stages.2.norm2.weight"} <= names
    idx = tokens(model)
    logits, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(logits).all()
    assert model.train() is model  # `train` is still nn.Module.train
    src = codegen(cyclelang.parse(HOSTILE))
    compile(src, "hostile", "exec")
    assert "class None(" not in src and "class ValueError(" not in src


# --- every spec: builds, runs, the file equals build() ---------------------------------


@pytest.mark.parametrize("path", rotated(SPECS, 2, 0), ids=spec_id)  # half in the fast tier: the other half runs test_forward_backward_finite
def test_full_size_builds_on_meta(path):
    with torch.device("meta"):
        model = build(cyclelang.load(path))
    assert len(model.stages) == sum(op.repeat for op in cyclelang.load(path).engine.body if op.op == "stage")


@pytest.mark.parametrize("path", rotated(SPECS, 2, 1), ids=spec_id)
def test_forward_backward_finite(path):
    model = small(path).train()
    idx = tokens(model)
    logits, loss = model(idx, targets=idx)
    assert logits.shape == (*idx.shape, model.config.vocab_size)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_targets_may_be_a_non_contiguous_slice():
    # the usual next-token setup: inputs x[:, :-1], targets x[:, 1:] (a view, not contiguous)
    model = small(ROOT / "specs" / "gas_generator.cycle").train()
    x = tokens(model, T=13)
    idx, targets = x[:, :-1], x[:, 1:]
    assert not targets.is_contiguous()
    _, loss = model(idx, targets=targets)
    _, same = model(idx, targets=targets.contiguous())
    assert torch.equal(loss, same)



def test_next_token_loss_is_cross_entropy_with_a_leaner_backward():
    # the generated loss: F.cross_entropy's value to float32 rounding (scored through the
    # softmax); its own backward (softmax minus one-hot in one buffer) agrees with autograd's,
    # ignored targets (-1) included
    model = build(shrink(ROOT / "specs" / "llama.cycle"), seed=0, fast=True).train()
    loss_fn = sys.modules[type(model).__module__].next_token_loss
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(24, 50, generator=g)
    targets = torch.randint(0, 50, (24,), generator=g)
    targets[[3, 7, 20]] = -1
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours, theirs = loss_fn(a, targets)[0], torch.nn.functional.cross_entropy(b, targets, ignore_index=-1)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    (2.0 * ours).backward(), (2.0 * theirs).backward()
    assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)
    assert torch.equal(a.grad[[3, 7, 20]], torch.zeros(3, 50))

def test_written_source_matches_build_bit_for_bit(tmp_path):
    """The file `cyclec build` writes, imported from disk, computes what `cyclelang.build` does. Once:
    build executes the very text codegen returns (test_built_module_is_the_written_text holds that
    for every spec), so one spec shows that the text runs the same from a file."""
    path = ROOT / "specs" / "llama.cycle"
    small_spec = shrink(path)
    model = build(small_spec, seed=1).eval()
    file = tmp_path / f"{path.stem}_model.py"
    file.write_text(codegen(small_spec), "utf-8")
    spec = importlib.util.spec_from_file_location(f"gen_{path.stem}", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    other = mod.Model().eval()
    other.load_state_dict(model.state_dict())
    idx = tokens(model)
    with torch.no_grad():
        assert torch.equal(model(idx), other(idx))


@pytest.mark.parametrize("path", rotated(SPECS, 2, 0), ids=spec_id)
def test_built_module_is_the_written_text(path):
    """What `build` executes is, character for character, what `codegen` writes (so the file and the
    in-process module are one program: test_written_source_matches_build_bit_for_bit runs both once)."""
    import inspect

    spec = shrink(path)
    with torch.device("meta"):
        model = build(spec)
    assert inspect.getsource(sys.modules[type(model).__module__]) == codegen(shrink(path))


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = small(ROOT / "specs" / "llama.cycle", seed=5)
    after = torch.rand(1)
    b = small(ROOT / "specs" / "llama.cycle", seed=5)
    assert torch.equal(before, after)
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), n


def test_gpt2_parameter_count_and_names():
    with torch.device("meta"):
        model = build(cyclelang.load(ROOT / "specs" / "gpt2.cycle"))
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # GPT2LMHeadModel, tied
    names = list(dict(model.named_parameters()))
    assert names[:4] == ["feed.tok.weight", "feed.pos.weight", "stages.0.mix.norm.weight", "stages.0.mix.norm.bias"]
    assert "stages.11.burn.mlp.proj.weight" in names and "stages.0.mix.attn.qkv.weight" in names
    assert isinstance(model.stages, torch.nn.ModuleList) and len(model.stages) == 12


# --- causality and the KV cache ----------------------------------------------------------


@pytest.mark.parametrize("path", rotated(CAUSAL, 2, 1), ids=spec_id)
def test_causal_future_never_changes_the_past(path):
    model = small(path).eval()
    idx = tokens(model, T=16)
    t = 7
    other = idx.clone()
    other[:, t + 1 :] = (other[:, t + 1 :] + 1) % model.config.vocab_size
    with torch.no_grad():
        a, b = model(idx), model(other)
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


@pytest.mark.parametrize("path", OPEN, ids=spec_id)
def test_open_throat_sees_the_future(path):
    model = small(path).eval()
    idx = tokens(model, T=16)
    other = idx.clone()
    other[:, -1] = (other[:, -1] + 1) % model.config.vocab_size
    with torch.no_grad():
        assert not torch.allclose(model(idx)[:, 0], model(other)[:, 0])
    with pytest.raises(RuntimeError, match="causal"):
        model.generate(idx, 2)


@pytest.mark.parametrize("path", rotated(CAUSAL, 3, 1, slow={"jamba"}), ids=spec_id)  # a third (MLA, SSM and sink caches among them); jamba (about 2 s) in the full run
def test_kv_cache_greedy_equals_no_cache(path):
    model = small(path).eval()
    idx = tokens(model, B=2, T=5, seed=3)
    n = model.config.context - 5 + 3  # runs past the context: the cache restarts
    a = model.generate(idx, n, temperature=0, use_cache=True)
    b = model.generate(idx, n, temperature=0, use_cache=False)
    assert torch.equal(a, b)


def test_kv_cache_logits_match_full_forward():
    model = small(ROOT / "specs" / "mistral.cycle").eval()
    idx = tokens(model, B=1, T=20)
    mod = sys.modules[type(model).__module__]
    cache = mod.Cache()
    with torch.no_grad():
        full = model(idx)
        parts = [model(idx[:, :7], cache=cache), model(idx[:, 7:12], cache=cache)]
        parts += [model(idx[:, i : i + 1], cache=cache) for i in range(12, 20)]
    assert torch.allclose(full, torch.cat(parts, 1), atol=1e-5)


def test_sliding_window_limits_one_attention():
    model = small(ROOT / "specs" / "mistral.cycle").eval()
    attn = model.stages[0].mix.attn
    w = model.config.window  # the spec's 256 of 4,096 positions, in proportion at context 32
    x = torch.randn(1, 16, 96)
    y = x.clone()
    y[:, 0] += 1.0
    rope = (model.rope_cos[:16], model.rope_sin[:16])
    with torch.no_grad():
        a, b = attn(x, rope, None), attn(y, rope, None)
    assert torch.equal(a[:, w:], b[:, w:])  # position w no longer sees position 0
    assert not torch.allclose(a[:, w - 1], b[:, w - 1])


KITCHEN_SINK = """
engine sink {
  chamber width=48
  throat THROAT
  feed tokens vocab=40 context=24 position=sinusoidal scale=2 dropout=0.1
  turbine attention heads=4 kv_heads=2 rotary=0.5 qk_norm
  stage a x 2 {
    prechamber mix { norm rmsnorm  turbine attention heads=6 kv_heads=1 rotary rotary_base=500 qk_norm dropout=0.1  merge scale=0.5 }
    prechamber burn { norm layernorm bias=false  turbine moe experts=3 top=1 ratio=2 act=geglu  merge deepnorm }
    norm layernorm
    prechamber pl { turbine pool size=4  merge layerscale }
    prechamber scan { norm rmsnorm  turbine ssm heads=4 state=4 groups=2 chunk=4  merge cooling }
    prechamber la { turbine linear_attention heads=4 feature=relu chunk=3  merge deepnorm }
    fullflow {
      prechamber f1 { turbine mlp ratio=2 act=silu  merge gate }
      prechamber f2 { turbine linear  merge rezero }
      prechamber f3 overboard { turbine linear out=7 }
    }
  }
  stage b { turbine moe experts=4 top=2 capacity=1.0 balance=0.1 hidden=32 act=swiglu  turbine linear out=32  turbine linear out=48  turbine pool size=3 }
  norm rmsnorm
  nozzle head tied bias=true
  startup { warmup 10 schedule linear lr=1e-3 min=1e-4 steps=100 init xavier clip 0.5 }
}
"""


@pytest.mark.parametrize("throat", ["causal", "open"])
def test_kitchen_sink_every_construct(throat, tmp_path):
    """Every construct at once: engine-level and stage-level turbines, two rotary tables,
    partial rotary, qk-norm, MQA/GQA, every merge, pool, ssm, linear attention, fullflow with overboard, MoE
    with and without capacity, xavier init, a tied head with a bias."""
    text = KITCHEN_SINK.replace("THROAT", throat)
    model = build(cyclelang.parse(text), seed=0)
    idx = tokens(model, T=10)
    logits, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and list(model.aux_losses) == ["stages.2.moe"]
    assert list(model.exhaust) == ["stages.0.f3", "stages.1.f3"]
    model.eval()
    file = tmp_path / "sink.py"
    file.write_text(codegen(cyclelang.parse(text)))
    spec = importlib.util.spec_from_file_location("sink_" + throat, file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    other = mod.Model().eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model(idx), other(idx))
    if throat == "causal":
        a = model.generate(idx[:, :4], 25, temperature=0)
        assert torch.equal(a, model.generate(idx[:, :4], 25, temperature=0, use_cache=False))
        changed = idx.clone()
        changed[:, 6:] = 0
        with torch.no_grad():
            assert torch.equal(model(idx)[:, :6], model(changed)[:, :6])


# --- constructs ----------------------------------------------------------------------------


def test_detach_cuts_the_gradient_into_the_branch_input():
    model = small(ROOT / "specs" / "gas_generator.cycle")
    tap = model.stages[-1]
    x = torch.randn(2, 8, 96, requires_grad=True)
    y, aux = tap(x)  # a stage's forward takes only what it uses; it returns its auxiliary outputs by name
    assert list(aux) == ["probe"]  # the overboard head's output, under its branch's name
    g = torch.randn_like(y)
    y.backward(g)
    assert torch.equal(x.grad, g)  # only the main line carries gradient back
    assert all(p.grad is not None for p in tap.critic.parameters())  # the turbine itself still learns


def test_overboard_head_loss_joins_the_total():
    model = small(ROOT / "specs" / "gas_generator.cycle")
    idx = tokens(model)
    logits, loss = model(idx, idx)
    (name,) = model.aux_losses
    assert name == "stages.2.probe"
    head = model.exhaust[name]
    expect = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()) + 0.1 * torch.nn.functional.cross_entropy(head.flatten(0, 1), idx.flatten())
    assert torch.allclose(loss, expect)


def test_rezero_is_the_identity_at_init():
    model = small(ROOT / "specs" / "rezero.cycle")
    x = torch.randn(2, 8, 96)
    for stage in model.stages:
        assert torch.equal(stage(x, None), x)


def test_deepnorm_alpha_beta_and_init():
    spec = cyclelang.load(ROOT / "specs" / "deepnet.cycle")
    m = spec.engine.body[0].ops[0].merge
    assert m.layers == 36 and m.alpha == pytest.approx((2 * 36) ** 0.25) and m.beta == pytest.approx((8 * 36) ** -0.25)
    source = codegen(spec)
    assert "x = self.alpha * x + " in source and "return (2 * self.n_layer) ** 0.25" in source
    assert cyclelang.build(spec, seed=0).config.deepnorm_alpha == m.alpha  # the config's formula is the IR's, bit for bit
    model = small(ROOT / "specs" / "deepnet.cycle", seed=0)
    beta = shrink(ROOT / "specs" / "deepnet.cycle").engine.body[0].ops[0].merge.beta
    qkv = torch.cat([s.mix.attn.qkv.weight for s in model.stages], 1)
    ratio = qkv[192:].std() / qkv[:96].std()  # v over q
    assert ratio.item() == pytest.approx(beta, rel=0.05)
    # the stage computes norm1(alpha * x + mix(x))
    stage, alpha = model.stages[0], (2 * 2) ** 0.25
    x = torch.randn(1, 4, 96)
    with torch.no_grad():
        h = stage.norm1(alpha * x + stage.mix.attn(x, None))
        expect = stage.norm2(alpha * h + stage.burn.mlp(h))
        assert torch.allclose(stage(x, None), expect)


def test_cooling_std_matches_its_formula():
    spec = cyclelang.load(ROOT / "specs" / "gpt2.cycle")
    m = spec.engine.body[0].ops[0].merge
    assert m.merges == 24 and m.std == pytest.approx(0.02 / math.sqrt(24))
    model = build(cyclelang.parse(textwrap.dedent("""
        engine cool {
          chamber width=256
          feed tokens vocab=64 context=8
          stage block x 8 {
            prechamber mix { norm layernorm  turbine attention heads=4  merge cooling }
            prechamber burn { norm layernorm  turbine mlp ratio=4  merge cooling }
          }
          nozzle head
        }""")), seed=0)
    proj = torch.cat([s.burn.mlp.proj.weight.flatten() for s in model.stages])
    fc = torch.cat([s.burn.mlp.fc.weight.flatten() for s in model.stages])
    assert proj.std().item() == pytest.approx(0.02 / 4, rel=0.02)
    assert fc.std().item() == pytest.approx(0.02, rel=0.02)


def test_layerscale_and_gate_start_as_specified():
    ls = small(ROOT / "specs" / "layerscale.cycle")
    assert torch.equal(ls.stages[0].mix.scale, torch.full((96,), 0.1))
    hw = small(ROOT / "specs" / "highway.cycle")
    assert torch.equal(hw.stages[1].burn.gate.bias, torch.full((96,), -1.0))
    stage = hw.stages[0]
    x = torch.randn(1, 4, 96)
    with torch.no_grad():
        f = stage.mix(x, None)
        g = torch.sigmoid(stage.mix.gate(x))
        h = x + g * (f - x)
        assert torch.allclose(stage(x, None), h + torch.sigmoid(stage.burn.gate(h)) * (stage.burn(h) - h))


def test_fullflow_branches_share_one_input():
    model = small(ROOT / "specs" / "full_flow.cycle")
    stage = model.stages[0]
    x = torch.randn(1, 6, 96)
    rope = [(model.rope_cos[:6], model.rope_sin[:6])]
    with torch.no_grad():
        h = stage.norm(x)
        assert torch.allclose(stage(x, rope, None), x + stage.mix.attn(h, rope[0], None) + stage.burn.mlp(h))


def test_moe_balance_capacity_and_dropless_eval():
    model = small(ROOT / "specs" / "moe.cycle")
    moe = model.stages[0].burn.moe
    x = torch.randn(2, 16, 96)
    y_train, balance = moe.train()(x)
    probs = torch.softmax(moe.router(x.view(-1, 96)), -1)
    top = probs.topk(2, -1).indices
    frac = torch.nn.functional.one_hot(top, 8).float().sum(1).mean(0) / 2
    assert balance.item() == pytest.approx(0.01 * 8 * (frac * probs.mean(0)).sum().item(), rel=1e-5)
    y_eval, _ = moe.eval()(x)
    # dropless eval: every token gets its two experts, weights renormalised
    w = probs.gather(1, top)
    w = w / w.sum(-1, keepdim=True)
    expect = sum(w[:, k, None] * torch.stack([moe.experts[int(e)](t[None])[0] for t, e in zip(x.view(-1, 96), top[:, k])]) for k in range(2))
    assert torch.allclose(y_eval.view(-1, 96), expect, atol=1e-5)
    # capacity drops some assignments in training (32 tokens * 2 / 8 * 1.25 = 10 per expert)
    counts = torch.bincount(top.flatten(), minlength=8)
    if counts.max() > 10:
        assert not torch.allclose(y_train, y_eval)


@pytest.mark.slow  # aot_eager over the whole model; test_moe_op compiles the MoE layer fast
def test_moe_compiles_as_one_graph():
    model = build(shrink(ROOT / "specs" / "moe.cycle"), seed=0, fast=True).train()  # the experts' custom op: one graph
    idx = tokens(model, B=2, T=16, seed=1)
    torch._dynamo.reset()
    # aot_eager: the capture and AOTAutograd's joint graph (the custom op's autograd), no C++ build
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (compiled, model):
        model.zero_grad(set_to_none=True)
        loss = fn(idx, idx)[1]
        loss.backward()
        grads.append((loss.detach(), [p.grad for p in model.parameters()]))
    (la, ga), (lb, gb) = grads
    torch.testing.assert_close(la, lb)
    assert all(g is not None for g in ga)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_causal_pool_averages_the_latest_positions():
    model = small(ROOT / "specs" / "poolformer.cycle")
    pool = model.stages[0].mix.pool
    x = torch.randn(1, 6, 96)
    y = pool(x, None)
    for t in range(6):
        lo = max(0, t - 2)
        assert torch.allclose(y[0, t], x[0, lo : t + 1].mean(0) - x[0, t], atol=1e-6)


def test_startup_helper():
    model = small(ROOT / "specs" / "llama.cycle")
    mod = sys.modules[type(model).__module__]
    assert mod.learning_rate(0) == pytest.approx(3e-4 / 2001)
    assert mod.learning_rate(2000) == pytest.approx(3e-4)
    assert mod.learning_rate(51000) == pytest.approx(3e-5 + 0.5 * (3e-4 - 3e-5))
    assert mod.learning_rate(10**6) == pytest.approx(3e-5)
    opt, sched = model.configure_optimizer()
    assert opt.defaults["betas"] == (0.9, 0.95)
    assert opt.defaults["fused"] is True  # one kernel steps every tensor (transformers' Trainer's default)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert all(p.dim() < 2 for p in opt.param_groups[1]["params"])
    idx = tokens(model)
    model(idx, idx)[1].backward()
    assert model.clip_gradients() is not None
    # the fused step is AdamW's: the for-loop one from the same groups, on copies, lands on the same weights
    copies = [[p.detach().clone().requires_grad_() for p in g["params"]] for g in opt.param_groups]
    for c, g in zip(copies, opt.param_groups):
        for q, p in zip(c, g["params"]):
            q.grad = p.grad.clone()
    loop = torch.optim.AdamW([dict(g, params=c, fused=None, foreach=False) for c, g in zip(copies, opt.param_groups)])
    opt.step(), loop.step()
    for c, g in zip(copies, opt.param_groups):
        for q, p in zip(c, g["params"]):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(mod.learning_rate(1))


# --- against torch's own Post-LN encoder ---------------------------------------------------


def test_post_ln_matches_transformer_encoder_layers():
    model = small(ROOT / "specs" / "post_ln.cycle").eval()
    c = model.config
    layers = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(c.width, c.n_head, c.mlp_ratio * c.width, dropout=c.dropout, activation="relu", batch_first=True,
                                         norm_first=False) for _ in model.stages
    ).eval()
    with torch.no_grad():
        for ours, ref in zip(model.stages, layers):
            ref.self_attn.in_proj_weight.copy_(ours.mix.attn.qkv.weight)
            ref.self_attn.in_proj_bias.copy_(ours.mix.attn.qkv.bias)
            ref.self_attn.out_proj.weight.copy_(ours.mix.attn.proj.weight)
            ref.self_attn.out_proj.bias.copy_(ours.mix.attn.proj.bias)
            ref.linear1.load_state_dict(ours.burn.mlp.fc.state_dict())
            ref.linear2.load_state_dict(ours.burn.mlp.proj.state_dict())
            ref.norm1.load_state_dict(ours.norm1.state_dict())
            ref.norm2.load_state_dict(ours.norm2.state_dict())
        x = torch.randn(2, 10, 96)
        a = b = x
        for ours, ref in zip(model.stages, layers):
            a = ours(a)  # an open throat: no cache
            b = ref(b)
    assert torch.allclose(a, b, atol=1e-5)


# --- torch.compile and DDP ---------------------------------------------------------------


@pytest.mark.slow
def test_torch_compile_fullgraph_gpt2():
    model = small(ROOT / "specs" / "gpt2.cycle")
    idx = tokens(model, T=16)
    compiled = torch.compile(model, fullgraph=True)
    logits, loss = compiled(idx, idx)
    ref_logits, ref_loss = model(idx, idx)
    assert torch.allclose(logits, ref_logits, atol=1e-4)
    loss.backward()


DDP_WORKER = r'''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, sys.argv[1])
import cyclelang
from cyclelang.backends.torch.build import build

SPEC = open(sys.argv[2]).read()

def step(model, idx):
    opt, _ = model.configure_optimizer()
    _, loss = model(idx, idx)
    loss.backward()
    opt.step()

def worker(rank, world, rendezvous, out):
    # a file store, not a port: a free port found and released can be taken before the ranks bind it
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = build(cyclelang.parse(SPEC), seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    idx = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))
    opt, _ = model.configure_optimizer()
    _, loss = ddp(idx[rank * 2 : rank * 2 + 2], idx[rank * 2 : rank * 2 + 2])
    loss.backward()
    opt.step()
    if rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, out)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[3] + ".rendezvous", sys.argv[3]), nprocs=2)
    torch.set_num_threads(1)
    model = build(cyclelang.parse(SPEC), seed=0)
    idx = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(0))
    step(model, idx)
    ddp_state = torch.load(sys.argv[3])
    worst = max((model.state_dict()[k] - v).abs().max().item() for k, v in ddp_state.items())
    print("WORST", worst)
'''


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process(tmp_path):
    spec = tmp_path / "tiny.cycle"
    spec.write_text(textwrap.dedent("""
        engine tiny {
          chamber width=32
          feed tokens vocab=64 context=16
          stage block x 2 {
            prechamber mix { norm layernorm  turbine attention heads=2  merge cooling }
            prechamber burn { norm layernorm  turbine mlp ratio=2  merge cooling }
          }
          norm layernorm
          nozzle head tied
        }"""))
    script = tmp_path / "ddp.py"
    script.write_text(DDP_WORKER)
    out = subprocess.run([sys.executable, str(script), str(ROOT), str(spec), str(tmp_path / "state.pt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    worst = float(out.stdout.split("WORST")[1])
    assert worst < 1e-6


# --- the command line ----------------------------------------------------------------------


def test_cli_build_writes_source_weights_and_summary(tmp_path):
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from cyclelang.cli import main

    src, weights = tmp_path / "model.py", tmp_path / "model.safetensors"
    spec = ROOT / "specs" / "pressure_fed.cycle"
    r = CliRunner().invoke(main, ["build", str(spec), "-o", str(src), "--weights", str(weights), "--seed", "3"])
    assert r.exit_code == 0, r.output
    assert src.read_text() == codegen(cyclelang.load(spec))
    assert "engine pressure_fed: 5,322,240 parameters" in r.stderr
    assert "chamber: (B, T<=256, 256)" in r.stderr and "mixers:" in r.stderr and "reactors:" in r.stderr
    state = load_file(str(weights))
    model = build(cyclelang.load(spec), seed=3)
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_cli_build_errors(tmp_path):
    from click.testing import CliRunner

    from cyclelang.cli import main

    lib = tmp_path / "lib.cycle"
    lib.write_text("stage blk { prechamber p { turbine mlp } }\n")
    out = tmp_path / "out.py"
    out.write_text("old")
    r = CliRunner().invoke(main, ["build", str(lib), "-o", str(out)])
    assert r.exit_code == 1 and "E0213" in r.stderr
    assert out.read_text() == "old"
    r = CliRunner().invoke(main, ["build", str(ROOT / "specs" / "pressure_fed.cycle"), "-o", str(out), "--weights", str(tmp_path / "no" / "w.safetensors")])
    assert r.exit_code != 0 and r.exit_code != 123
    assert out.read_text() == "old"
    assert list(tmp_path.glob("*.tmp")) == []


def test_build_refuses_a_huge_engine_before_allocating(tmp_path):
    from click.testing import CliRunner

    from cyclelang.cli import main

    huge = "engine huge {\n  chamber width=65536\n  feed tokens vocab=65536 context=8\n  stage s x 64 { prechamber p { turbine mlp } }\n  nozzle head\n}\n"
    with pytest.raises(cyclelang.CycleError, match="E0219"):
        build(cyclelang.parse(huge))
    spec = tmp_path / "huge.cycle"
    spec.write_text(huge)
    r = CliRunner().invoke(main, ["build", str(spec), "-o", str(tmp_path / "m.py")])
    assert r.exit_code == 1 and "E0219" in r.stderr and not (tmp_path / "m.py").exists()


def test_the_loss_is_scored_in_float32_for_half_precision_logits():
    model = small(ROOT / "specs" / "gpt2.cycle").to(torch.bfloat16)
    idx = tokens(model)
    logits, loss = model(idx, idx)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    expect = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), idx.view(-1))
    torch.testing.assert_close(loss, expect)
    loss.backward()
    assert model.feed.tok.weight.grad.dtype == torch.bfloat16


def test_deepnorm_init_scales_a_moe_shared_expert_as_its_routed_ones():
    """DeepNet's beta scales every FFN's weights at init: the routed experts and the shared one (not the router or the gate)."""
    text = textwrap.dedent("""
        engine deep_moe {
          chamber width=64
          throat causal
          feed tokens vocab=64 context=16 position=none
          stage block x 4 {
            prechamber mix { turbine attention heads=4 rotary  merge deepnorm }
            norm layernorm
            prechamber burn { turbine moe experts=4 top=2 hidden=128 act=swiglu shared=128 shared_gate  merge deepnorm }
            norm layernorm
          }
          nozzle head
        }""")
    spec = cyclelang.parse(text)
    beta = spec.engine.body[0].ops[2].merge.beta
    scaled = build(spec, seed=0)
    plain = build(cyclelang.parse(text.replace("merge deepnorm }\n    norm layernorm\n  }", "merge plain }\n    norm layernorm\n  }")
                                  .replace("shared_gate  merge deepnorm", "shared_gate  merge plain")), seed=0)
    moe, ref = scaled.stages[0].burn.moe, plain.stages[0].burn.moe
    for name in ("shared.fc.weight", "shared.proj.weight", "experts.0.fc.weight", "experts.0.proj.weight"):
        ours, theirs = moe.get_parameter(name), ref.get_parameter(name)
        assert ours.std().item() == pytest.approx(beta * theirs.std().item(), rel=0.1), name
    assert moe.shared_gate.weight.std().item() == pytest.approx(ref.shared_gate.weight.std().item(), rel=0.1)
