"""`ir.passes.shrink`'s sizes beyond width and depth (vocab=, context=, heads=), and `ir.walk`.

The suite and the benchmarks make every small model of a library spec with `shrink`, so each
size it takes is checked here on the IR (what the kinds' rules make of it, and refusals), and
once on a built model.
"""

from __future__ import annotations

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.ir.kinds import ShrinkError

from .conftest import ROOT, need


def load(name):
    return cyclelang.load(ROOT / "specs" / f"{name}.cycle")


def ops(spec, kind):
    return [o for st, _ in ir.leaf_stages(spec.engine.body) for b in st.branch_list() for o in b.ops if isinstance(o, kind)]


# --- vocab, context -------------------------------------------------------------------------


def test_vocab_reaches_every_projection_to_it():
    big = load("gas_generator")  # an overboard loss head: `turbine linear out=vocab`
    small = ir.passes.shrink(big, width=64, vocab=100)
    e = small.engine
    assert (e.feed.vocab, e.nozzle.vocab) == (100, 100)
    (probe,) = [b for st, _ in ir.leaf_stages(e.body) for b in st.branch_list() if b.name == "probe"]
    assert probe.out_width == 100 and probe.ops[-1].out == 100 and probe.ops[-1].width == 64
    assert e.feed.context == big.engine.feed.context  # the context as written


def test_context_keeps_each_windows_share():
    big = load("mistral")  # window 256 of 4,096 positions
    assert ops(big, ir.Attention)[0].window == 256 and big.engine.feed.context == 4096
    small = ir.passes.shrink(big, context=512)
    assert small.engine.feed.context == 512
    assert {a.window for a in ops(small, ir.Attention)} == {32}
    assert [a.heads for a in ops(small, ir.Attention)] == [a.heads for a in ops(big, ir.Attention)]  # nothing else moves
    assert ir.passes.shrink(big, context=8).engine.body[0].ops[0].ops[1].window == 1  # never below one position
    full = load("gpt2")
    assert ops(ir.passes.shrink(full, context=64), ir.Attention)[0].window is None  # full attention stays full


def test_a_size_as_written_changes_nothing():
    big = load("llama")
    same = ir.passes.shrink(big, vocab=big.engine.feed.vocab, context=big.engine.feed.context)
    assert same.model_dump() == big.model_dump()


# --- heads ------------------------------------------------------------------------------------


def test_heads_cut_attentions_inner_width():
    gpt2 = ir.passes.shrink(load("gpt2"), width=256, heads=4)  # 12 heads would not divide 256
    assert {(a.heads, a.kv_heads, a.head_dim) for a in ops(gpt2, ir.Attention)} == {(4, 4, 64)}  # multi-head stays multi-head
    llama = ir.passes.shrink(load("llama"), width=128, heads=4)  # 8 query heads over 2 kv heads
    assert {(a.heads, a.kv_heads, a.head_dim, a.rotary_dims) for a in ops(llama, ir.Attention)} == {(4, 2, 32, 32)}  # 2 kv heads still divide 4
    mqa = ir.passes.shrink(load("mqa"), width=64, heads=2)
    assert {(a.heads, a.kv_heads) for a in ops(mqa, ir.Attention)} == {(2, 1)}
    assert {(a.heads, a.kv_heads) for a in ops(ir.passes.shrink(load("llama"), heads=16), ir.Attention)} == {(16, 2)}
    # fewer kv heads than asked would not divide: the largest count below that does
    assert {(a.heads, a.kv_heads) for a in ops(ir.passes.shrink(load("moe"), heads=6), ir.Attention)} == {(6, 3)}


def test_heads_for_every_multi_head_kind():
    ssm = ops(ir.passes.shrink(load("mamba2"), width=256, heads=8), ir.Ssm)[0]  # 24 heads of 64 at width 768
    assert (ssm.heads, ssm.head_dim, ssm.groups, ssm.state) == (8, 64, 1, 128)  # expand 2 kept: 8 x 64 = 2 x 256
    lin = ops(ir.passes.shrink(load("expander"), width=128, heads=4), ir.LinearAttention)[0]
    assert (lin.heads, lin.head_dim) == (4, 32)
    delta = ops(ir.passes.shrink(load("gated_delta"), width=256, heads=2), ir.GatedDelta)[0]  # 8 value heads over 4 key heads of 64
    assert (delta.heads, delta.k_heads, delta.head_dim, delta.v_dim) == (2, 2, 64, 128)
    latent = ops(ir.passes.shrink(load("deepseek_v2"), width=256, heads=4), ir.LatentAttention)[0]  # 8 heads of 64 at width 512
    assert (latent.heads, latent.head_dim, latent.v_dim) == (4, 64, 64)


def test_mamba1_rank_follows_the_width_only_where_it_was_the_default():
    m = ops(ir.passes.shrink(load("jamba"), width=96), ir.Mamba1)[0]  # the default, ceil(512 / 16) = 32
    assert (m.inner, m.dt_rank, m.state) == (192, 6, 16)
    text = (ROOT / "specs" / "jamba.cycle").read_text("utf-8").replace("turbine ssm version=1 state=16", "turbine ssm version=1 dt_rank=8 state=16")
    assert {o.dt_rank for o in ops(ir.passes.shrink(cyclelang.parse(text), width=96), ir.Mamba1)} == {8}  # as the spec set it


def test_shared_expert_narrows_with_the_width():
    moe = ops(ir.passes.shrink(load("deepseek_v2"), width=256), ir.Moe)[0]  # shared=512, hidden=256 at width 512
    assert (moe.hidden, moe.shared) == (128, 256)


def test_lets_follow_the_sizes_they_named():
    """A scale model keeps the spec's names: each let moves with the nodes written with it (the torch
    Config names a field after a let only where the let holds the field's value)."""
    small = ir.passes.shrink(load("gated_delta"), width=128, depth=1)
    lets = {let.name: let.value for let in small.engine.lets}
    assert lets["hidden"] == ops(small, ir.Mlp)[0].hidden == 352 and lets["heads"] == 8  # 1408 in proportion; heads kept
    text = ("let d = 64\nlet hidden = 4 * d\nlet depth = 6\nengine e {\n  chamber width=d\n  throat causal\n  feed tokens vocab=64 context=16\n"
            "  stage block x depth { prechamber p { norm layernorm  turbine mlp hidden=hidden  merge plain } }\n  nozzle head tied\n}\n")
    small = ir.passes.shrink(cyclelang.parse(text), width=32, depth=2)
    assert {let.name: let.value for let in small.engine.lets} == {"d": 32, "hidden": 128, "depth": 2}  # the formula computed again
    from cyclelang.backends.torch.codegen import codegen

    src = codegen(small)
    assert "    depth: int = 2  #" in src and "let hidden = 4 * d (the spec: 128)" in src and "return 4 * self.width" in src


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes, message", [
    (dict(vocab=1), "--vocab must be at least 2, not 1"),
    (dict(context=0), "--context must be at least 1, not 0"),
    (dict(heads=0), "--heads must be at least 1, not 0"),
    (dict(heads=2.5), "--heads must be a whole number, not 2.5"),
    (dict(vocab=True), "--vocab must be a whole number, not True"),
    (dict(width=2), "--width must be at least 4, not 2"),
    (dict(depth=0), "--depth must be at least 1, not 0"),
    (dict(width=16, heads=16), "too narrow for 16 heads of even size"),
    (dict(width=8, heads=64), "too narrow for 64 heads"),
])
def test_nonsense_sizes_are_refused_by_name(sizes, message):
    spec = load("mamba2") if sizes.get("heads") == 64 else load("gpt2")
    with pytest.raises(ShrinkError, match=message.replace(".", r"\.")):
        ir.passes.shrink(spec, **sizes)


def test_a_padding_token_outside_the_new_vocabulary_is_refused():
    spec = cyclelang.parse("engine e {\n  chamber width=32\n  throat causal\n  feed tokens vocab=512 context=16 padding=300\n"
                           "  stage s { prechamber p { norm layernorm  turbine mlp  merge plain } }\n  nozzle head tied\n}\n")
    with pytest.raises(ShrinkError, match="padding token 300 is outside a vocabulary of 256") as e:
        ir.passes.shrink(spec, vocab=256)
    assert e.value.help == "--vocab 301 or more"
    from cyclelang.stand import shrink as stand_shrink

    with pytest.raises(cyclelang.CycleError, match="E0205"):  # the stand's diagnostic
        stand_shrink(spec, vocab=256)


def test_a_shrunk_model_runs_at_its_sizes():
    torch = need("torch")
    from cyclelang.backends.torch.build import build

    model = build(ir.passes.shrink(load("mistral"), width=32, heads=4, depth=1, vocab=50, context=16), seed=0).eval()
    c = model.config
    assert (c.vocab_size, c.context, c.width, c.n_head, c.n_kv_head, c.window) == (50, 16, 32, 4, 2, 1)
    idx = torch.randint(0, 50, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert model(idx).shape == (1, 16, 50)


# --- ir.walk ------------------------------------------------------------------------------------


def test_walk_folded_and_unrolled():
    body = load("jamba").engine.body  # stage jamba_block x 2 { stage pairs = pair x 2 ... }
    folded = list(ir.walk(body))
    assert [(v.stage.name, v.depth, v.times) for v in folded][:2] == [("jamba_block", 0, 2), ("pairs", 1, 4)]
    assert [(v.stage, v.times) for v in folded if not v.stage.is_group] == ir.leaf_stages(body)
    assert sum(v.stage.repeat > 1 for v in folded) == ir.repeated_stages(body)
    unrolled = [v for v in ir.walk(body, unroll=True)]
    assert all(v.times == 1 for v in unrolled)
    leaves = [v.stage.name for v in unrolled if not v.stage.is_group]
    assert len(leaves) == sum(n for _, n in ir.leaf_stages(body))  # one visit per layer that runs
    half = len(leaves) // 2
    assert leaves[:half] == leaves[half:]  # the group's two instances run alike, one after the other
    capped = [v.stage.name for v in ir.walk(body, unroll=True, cap=1) if not v.stage.is_group]
    assert capped == [st.name for st, _ in ir.leaf_stages(body)]  # one instance of each repeat: source order


# --- the stand's flags ----------------------------------------------------------------------------


def test_cyclec_fire_takes_each_size():
    torch = need("torch")
    import json

    from click.testing import CliRunner

    from cyclelang.backends.torch.build import build
    from cyclelang.cli import main

    path = str(ROOT / "specs" / "mistral.cycle")
    sizes = ["--width", "32", "--depth", "1", "--heads", "4", "--vocab", "50", "--context", "16"]
    r = CliRunner().invoke(main, ["fire", path, *sizes, "--seq", "8", "--batch", "1", "--json", "-"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (run,) = json.loads(r.output)["runs"]
    model = build(ir.passes.shrink(load("mistral"), width=32, depth=1, heads=4, vocab=50, context=16), seed=0)
    assert run["settings"]["params"] == sum(p.numel() for p in model.parameters()) and run["settings"]["width"] == 32
    assert abs(run["loss"] - torch.log(torch.tensor(50.0)).item()) < 0.5  # an untrained head over 50 tokens
    r = CliRunner().invoke(main, ["fire", path, "--heads", "4", "--coord-check"])
    assert r.exit_code == 2 and "--heads does not apply to --coord-check" in r.output
    r = CliRunner().invoke(main, ["fire", path, "--heads", "1000"])
    assert r.exit_code == 1 and "too narrow for 1000 heads" in r.output
