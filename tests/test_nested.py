"""Nested stages: `stage group x 4 { stage ssm_layer x 3 {...}  stage attn_layer {...} }`.

A nested spec is the same model as the architecture written flat (the groups copied out
by hand, here in the test): after loading the same weights (state_dict names mapped by
layout path, the nested `stages.g.stages.k` to the flat `stages.i` in the order the layers
run) outputs, losses and gradients are equal bit for bit; parameter counts, FLOPs and
decoding state are equal; the depth rules (cooling's std, DeepNet's alpha and beta) count
the flattened layers. The generated file stays folded (a loop per repeat, never unrolled),
runs in a fresh interpreter and equals `build`; its Config holds both repeat counts.
Bad nesting is refused with located diagnostics, and `cyclec fmt` round-trips.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.diagnostics import CycleError
from cyclelang.syntax.fmt import format_text

from .conftest import need

torch = need("torch")
from cyclelang.backends.torch.build import build, load_source  # noqa: E402
from cyclelang.backends.torch.codegen import codegen  # noqa: E402

TEMPLATE = """
stage local_block(heads, window=8) {
  prechamber mix {
    norm rmsnorm
    turbine attention heads=heads window=window rotary bias=false
    merge cooling
  }
  prechamber burn {
    norm rmsnorm
    turbine mlp ratio=2 act=swiglu bias=false
    merge cooling
  }
}
"""

GLOBAL_BODY = """{
      prechamber mix {
        norm rmsnorm
        turbine attention heads=4 kv_heads=2 rotary bias=false
        merge cooling
      }
      prechamber burn {
        norm rmsnorm
        turbine moe experts=4 top=2 hidden=48 act=swiglu bias=false balance=0.01
        merge cooling
      }
    }"""

SSM_BODY = """{
      prechamber mix {
        norm rmsnorm
        turbine ssm heads=4 state=8 chunk=4
      }
    }"""


def engine(stages: str, width: int = 32) -> str:
    return f"""
engine nest {{
  chamber width={width}
  throat causal
  feed tokens vocab=97 context=32 position=none
{stages}
  norm rmsnorm
  nozzle head
}}
"""


def nested(groups: int = 2, local: int = 2) -> str:
    """Attention layers: `local` sliding-window layers then one global MoE layer, `groups` times."""
    return TEMPLATE + engine(f"""
  stage group x {groups} {{
    stage local = local_block(heads=4) x {local}
    stage global {GLOBAL_BODY}
  }}""")


def flat(groups: int = 2, local: int = 2) -> str:
    """The same architecture, its groups copied out."""
    body = "".join(f"""
  stage local{g} = local_block(heads=4) x {local}
  stage global{g} {GLOBAL_BODY}""" for g in range(groups))
    return TEMPLATE + engine(body)


def hybrid(nest: bool) -> str:
    """A hybrid: two ssm layers, then an attention layer, twice (the Jamba pattern, small)."""
    if nest:
        return TEMPLATE + engine(f"""
  stage group x 2 {{
    stage ssm_layer x 2 {SSM_BODY}
    stage attn_layer = local_block(heads=4, window=16)
  }}""")
    return TEMPLATE + engine("".join(f"""
  stage ssm{g} x 2 {SSM_BODY}
  stage attn{g} = local_block(heads=4, window=16)""" for g in range(2)))


def layer_map(a: ir.Spec, b: ir.Spec) -> dict[str, str]:
    """Instance path in a -> instance path in b, layer by layer in the order they run."""
    la, lb = ir.layout.layout(a.engine).layers(), ir.layout.layout(b.engine).layers()
    assert len(la) == len(lb)
    return {pa: pb for (pa, _), (pb, _) in zip(la, lb)}


def rename(key: str, m: dict[str, str]) -> str:
    for pa, pb in m.items():
        if key.startswith(pa + "."):
            return pb + key[len(pa):]
    return key


def perturbed(model, seed: int = 1):
    """Weights moved away from their init (a zero-init or constant parameter would hide a mix-up)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def tokens(B=2, T=24, seed=0):
    return torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(seed))


# --- the IR and the layout -----------------------------------------------------------------


def test_a_nested_stage_is_folded_in_the_ir_and_its_paths():
    spec = cyclelang.parse(nested(4, 3))
    (group,) = [op for op in spec.engine.body if isinstance(op, ir.Stage)]
    assert group.is_group and group.repeat == 4 and [s.name for s in group.ops] == ["local", "global"]
    assert [s.repeat for s in group.ops] == [3, 1] and group.ops[0].template == "local_block"
    lay = ir.layout.layout(spec.engine)
    assert [sl.path for sl in lay.all_stages()] == ["stages.0-3", "stages.0-3.stages.0-2", "stages.0-3.stages.3"]
    assert [sl.count for sl in lay.stages] == [12, 4] and lay.instance_count() == 16
    paths = [p.path for p in lay.parts()]
    assert "stages.0-3.stages.0-2.mix.attn" in paths and "stages.0-3.stages.3.burn.moe" in paths
    assert [path for path, _ in lay.layers()][:5] == ["stages.0.stages.0", "stages.0.stages.1", "stages.0.stages.2", "stages.0.stages.3", "stages.1.stages.0"]
    assert ir.layout.instances("stages.0-1.stages.2-3.mix") == ["stages.0.stages.2.mix", "stages.0.stages.3.mix", "stages.1.stages.2.mix", "stages.1.stages.3.mix"]
    assert ir.layout.fold("stages.2.stages.1.mix.attn.qkv.weight", lay) == "stages.0-3.stages.0-2.mix.attn.qkv.weight"
    assert lay.part_of("stages.3.stages.3.burn.moe.router.weight").path == "stages.0-3.stages.3.burn.moe"
    assert lay.group_of("stages.1.stages.0.mix.norm.weight") == "stages.0-3.stages.0-2.mix"
    # the JSON round trip keeps the nesting
    assert ir.Spec.model_validate(spec.model_dump()).model_dump() == spec.model_dump()


def test_depth_rules_count_the_flattened_layers():
    n, f = cyclelang.parse(nested(4, 3)), cyclelang.parse(flat(4, 3))
    merges = lambda s: [b.merge for st, _ in ir.leaf_stages(s.engine.body) for b in st.branch_list()]
    assert {m.merges for m in merges(n)} == {32} == {m.merges for m in merges(f)}  # 16 layers x 2 branches
    assert {m.std for m in merges(n)} == {0.02 / 32 ** 0.5}
    deep = lambda s: cyclelang.parse(s.replace("merge cooling", "merge deepnorm").replace("norm rmsnorm\n        turbine", "turbine")
                                     .replace("norm rmsnorm\n    turbine", "turbine"))
    dn, df = deep(nested(4, 3)), deep(flat(4, 3))
    (alpha,) = {(m.alpha, m.beta, m.layers) for m in merges(dn)}
    assert alpha == (32 ** 0.25, 128 ** -0.25, 16) and {(m.alpha, m.beta, m.layers) for m in merges(df)} == {alpha}


def test_params_flops_and_state_equal_the_flat_spec():
    from cyclelang.review.report import analyze, decode_state_bytes, kv_bytes_per_token
    from cyclelang.limits import estimate_parameters

    n, f = cyclelang.parse(nested(3, 2)), cyclelang.parse(flat(3, 2))
    rn, rf = analyze(n), analyze(f)
    assert rn["params"]["total"] == rf["params"]["total"] == estimate_parameters(n)
    assert rn["params"]["by_role"] == rf["params"]["by_role"]
    assert rn["flops_per_token"] == rf["flops_per_token"] and rn["scaling"] == rf["scaling"]
    assert kv_bytes_per_token(n.engine) == kv_bytes_per_token(f.engine) > 0
    for length in (16, 256):
        assert decode_state_bytes(n.engine, length) == decode_state_bytes(f.engine, length) > 0
    model = build(n, seed=0)
    assert sum(p.numel() for p in model.parameters()) == rn["params"]["total"]


# --- the torch back-end --------------------------------------------------------------------


def test_state_dict_names_are_the_layout_paths():
    spec = cyclelang.parse(nested(2, 3))
    lay = ir.layout.layout(spec.engine)
    model = build(spec, seed=0)
    names = list(model.state_dict())
    assert "stages.1.stages.2.mix.attn.qkv.weight" in names and "stages.1.stages.3.burn.moe.router.weight" in names
    owned = {prefix for p in lay.parts() for prefix in p.owns()}
    for name in names:
        part = lay.part_of(name)
        assert part is not None and ir.layout.fold(name, lay).startswith(part.path), name
    assert {ir.layout.fold(n, lay).rsplit(".", 1)[0] for n in names} - {"head"} <= {
        ir.layout.fold(n, lay).rsplit(".", 1)[0] for n in names}  # every name folds
    for path in owned:
        for inst in ir.layout.instances(path):
            assert any(n.startswith(inst + ".") for n in names), inst


@pytest.mark.parametrize("make", [lambda nest: nested(2, 2) if nest else flat(2, 2), hybrid], ids=["attention_moe", "hybrid_ssm"])
def test_nested_equals_flat_bit_for_bit_outputs_and_gradients(make):
    n, f = cyclelang.parse(make(True)), cyclelang.parse(make(False))
    mn, mf = perturbed(build(n, seed=0)), build(f, seed=1)
    m = layer_map(n, f)
    mf.load_state_dict({rename(k, m): v for k, v in mn.state_dict().items()}, strict=True)
    idx = tokens()
    ln, lossn = mn(idx, idx)
    lf, lossf = mf(idx, idx)
    assert torch.equal(ln, lf) and torch.equal(lossn, lossf)
    lossn.backward()
    lossf.backward()
    grads_f = dict(mf.named_parameters())
    for name, p in mn.named_parameters():
        q = grads_f[rename(name, m)]
        assert p.grad is not None and torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("make", [nested, lambda: hybrid(True)], ids=["attention_moe", "hybrid_ssm"])
def test_generate_equals_recomputation_with_a_cache_per_flattened_layer(make):
    spec = cyclelang.parse(make())
    model = perturbed(build(spec, seed=0)).eval()
    idx = tokens(B=2, T=5)
    with_cache = model.generate(idx, 20, temperature=0)
    assert torch.equal(with_cache, model.generate(idx, 20, temperature=0, use_cache=False))
    mod = sys.modules[type(model).__module__]
    cache = mod.Cache(32)
    model(idx, cache=cache)
    layers = ir.layout.layout(spec.engine).layers()
    owners = [(path, m) for path, _ in layers for _, m in model.get_submodule(path).named_modules() if m in cache.state]
    assert {path for path, _ in owners} == {path for path, _ in layers}  # every flattened layer keeps its own state
    assert len(owners) == len(cache.state)  # and every state belongs to one layer


def test_the_generated_file_is_folded_and_readable():
    src = codegen(cyclelang.parse(nested(4, 3)))
    assert "class Group(nn.Module):" in src and "class Local(nn.Module):" in src and "class Global(nn.Module):" in src
    assert "self.stages = nn.ModuleList([Group(config) for _ in range(config.n_group)])" in src
    assert "self.stages = nn.ModuleList([Local(config) for _ in range(config.n_local)] + [Global(config)])" in " ".join(src.split())
    assert "for stage in self.stages[:self.config.n_local]:" in src and "x, losses = self.stages[self.config.n_local](" in src
    # the global layer's MoE returns its balance loss; each level files it under its path, explicitly
    assert 'aux.update({f"stages.{self.config.n_local}.{name}": loss for name, loss in losses.items()})' in src
    assert 'aux.update({f"stages.{i}.{name}": loss for name, loss in losses.items()})' in src and "named_modules" not in src
    assert src.count("class Local(") == 1 and "stages.11" not in src  # folded: one class per stage, no unrolled layer
    assert "n_group: int = 4" in src and "n_local: int = 3" in src
    assert "return self.init_std / math.sqrt(2 * self.n_group * self.n_local + 2 * self.n_group)" in src


def test_a_changed_config_is_the_changed_spec_bit_for_bit():
    full = load_source(codegen(cyclelang.parse(nested(2, 2))), "nest_full")
    defaults = {f.name: getattr(full.Config(), f.name) for f in dataclasses.fields(full.Config)}
    assert defaults["n_group"] == 2 and defaults["n_local"] == 2
    for groups, local in ((3, 1), (1, 4)):
        small = cyclelang.parse(nested(groups, local))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(3)
            ours = full.Model(full.Config(n_group=groups, n_local=local))
        ref = build(small, seed=3)
        a, b = ours.state_dict(), ref.state_dict()
        assert list(a) == list(b)
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert ours.config.cooling_std == ref.config.cooling_std == 0.02 / (2 * groups * (local + 1)) ** 0.5
        idx = tokens()
        with torch.no_grad():
            assert torch.equal(ours.eval()(idx), ref.eval()(idx))
    with pytest.raises(ValueError, match="n_local"):
        full.Config(n_local=0)


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_the_file_runs_in_a_fresh_interpreter_and_equals_build(tmp_path):
    spec = cyclelang.parse(hybrid(True))
    f = tmp_path / "nest_model.py"
    f.write_text(codegen(spec), "utf-8")
    script = textwrap.dedent("""
        import importlib.abc, importlib.util, sys
        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("cyclelang", "pydantic", "lark"):
                    raise ImportError("the generated file imported " + name)
        sys.meta_path.insert(0, Refuse())
        import torch
        spec = importlib.util.spec_from_file_location("gen", sys.argv[1])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        torch.manual_seed(5)
        model = mod.Model(mod.Config())
        idx = torch.arange(20).reshape(2, 10) % 97
        torch.save({"state": model.state_dict(), "logits": model(idx), "gen": model.generate(idx[:, :3], 6, temperature=0)}, sys.argv[2])
    """)
    out = tmp_path / "out.pt"
    proc = subprocess.run([sys.executable, "-I", "-c", script, str(f), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(out)
    ref = build(spec, seed=5)
    assert list(got["state"]) == list(ref.state_dict())
    assert all(torch.equal(got["state"][k], v) for k, v in ref.state_dict().items())
    idx = torch.arange(20).reshape(2, 10) % 97
    with torch.no_grad():
        assert torch.equal(got["logits"], ref(idx))
    assert torch.equal(got["gen"], ref.generate(idx[:, :3], 6, temperature=0))


def one_step(fn, model, idx):
    """The logits, loss and every gradient of one training step through fn (model or its compiled form)."""
    model.zero_grad(set_to_none=True)
    logits, loss = fn(idx, idx)
    loss.backward()
    return logits.detach(), loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.slow  # aot_eager over the whole model (about 5 s)
def test_torch_compile_fullgraph_captures_a_nested_model_and_its_backward():
    spec = cyclelang.parse(nested(2, 2))
    model = perturbed(build(spec, seed=0, fast=True)).train()
    idx = tokens()
    torch._dynamo.reset()
    # aot_eager: dynamo's capture of the whole model (the group loop included) and AOTAutograd's joint graph, no C++ build
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    (la, ea, ga), (lb, eb, gb) = (one_step(fn, model, idx) for fn in (compiled, model))
    torch.testing.assert_close(la, lb)
    torch.testing.assert_close(ea, eb)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.slow  # inductor's C++ build of an ssm and a windowed attention (about 2 minutes on two cores)
def test_torch_compile_fullgraph_inductor_nested_hybrid():
    """The Jamba pattern nested (a group of ssm layers and a windowed attention, twice) is one
    inductor graph whose loss and every gradient equal eager's, and whose backward leaves the
    weights as they were (with the stages as nested compile regions, torch 2.13's inductor
    reused a saved A_log's buffer and overwrote it). Eight positions: two ssm chunks and a
    window of 4 that cuts (the compile's cost grows with the positions the scan unrolls)."""
    spec = cyclelang.parse(hybrid(True).replace("window=16", "window=4"))
    model = perturbed(build(spec, seed=0)).train()
    idx = tokens(T=8)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    got = []
    for fn in (compiled, model):
        got.append(one_step(fn, model, idx))
        assert [k for k, v in model.state_dict().items() if not torch.equal(v, state[k])] == []
    (la, ea, ga), (lb, eb, gb) = got
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ea, eb, rtol=1e-5, atol=1e-6)
    for (name, _), a, b in zip(model.named_parameters(), ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    torch._dynamo.reset()


def test_mup_rules_fold_every_level():
    mup = lambda t: cyclelang.parse(t.replace("  nozzle head\n}", "  nozzle head\n  startup {\n    init normal std=0.02\n    param mup base_width=16\n  }\n}"))
    n, f = mup(nested(2, 2)), mup(flat(2, 2))
    mn, mf = build(n, seed=0), build(f, seed=0)
    rn, rf = sys.modules[type(mn).__module__].mup_rule, sys.modules[type(mf).__module__].mup_rule
    m = layer_map(n, f)
    params = dict(mf.named_parameters())
    rules = {rn(name, p) for name, p in mn.named_parameters()}
    assert {"hidden", "output", "vector"} <= rules
    for name, p in mn.named_parameters():
        assert rn(name, p) == rf(rename(name, m), params[rename(name, m)]), name


# --- random patterns: any nesting equals its flattening ---------------------------------------

BODIES = {
    "attn": "prechamber mix { norm rmsnorm  turbine attention heads=2 rotary  merge cooling }",
    "window": "prechamber mix { norm layernorm  turbine attention heads=4 kv_heads=2 window=3 }",
    "mlp": "prechamber burn { norm rmsnorm  turbine mlp ratio=2 act=swiglu  merge layerscale }",
    "moe": "prechamber burn { norm rmsnorm  turbine moe experts=3 top=2 hidden=16  merge cooling }",
    "ssm": "prechamber mix { norm rmsnorm  turbine ssm heads=2 state=4 chunk=4 }",
    "conv": "prechamber mix { turbine conv size=3  merge rezero init=0.5 }",
    "post": "prechamber mix { turbine mlp ratio=1 }  norm layernorm",
    "deep": "prechamber mix { turbine attention heads=2  merge deepnorm }  norm layernorm",
}


def _pattern_text(tree, nest: bool) -> str:
    """tree: [(name, repeat, body-key or [subtree])]; nested as written, or flattened (groups copied out)."""
    out = []

    def emit(items, prefix, indent):
        for name, rep, body in items:
            if isinstance(body, list):
                if nest:
                    out.append(f"{indent}stage {name} x {rep} {{")
                    emit(body, prefix, indent + "  ")
                    out.append(f"{indent}}}")
                else:
                    for r in range(rep):
                        emit(body, f"{prefix}{name}{r}_", indent)
            else:
                out.append(f"{indent}stage {prefix if not nest else ''}{name} x {rep} {{ {BODIES[body]} }}")

    emit(tree, "", "  ")
    return "engine fz {\n  chamber width=16\n  throat causal\n  feed tokens vocab=31 context=16\n" + "\n".join(out) + "\n  norm rmsnorm\n  nozzle head\n}\n"


def _patterns():
    from hypothesis import strategies as st

    leaf = st.tuples(st.integers(1, 2), st.sampled_from(sorted(BODIES)))

    @st.composite
    def level(draw, depth):
        items = []
        for i in range(draw(st.integers(1, 2))):
            if depth < 3 and draw(st.booleans()):
                items.append((f"g{depth}{i}", draw(st.integers(1, 2)), draw(level(depth + 1))))
            else:
                rep, body = draw(leaf)
                items.append((f"s{depth}{i}", rep, body))
        return items

    @st.composite
    def tree(draw):
        return [("top", draw(st.integers(2, 3)), draw(level(2)))]

    return tree()


@pytest.mark.slow  # a hypothesis campaign; the fixed patterns above stay fast
def test_random_nested_patterns_equal_their_flattening_bit_for_bit():
    from hypothesis import given, settings

    @settings(max_examples=12, deadline=None, derandomize=True, database=None)
    @given(tree=_patterns())
    def check(tree):
        n, f = cyclelang.parse(_pattern_text(tree, True)), cyclelang.parse(_pattern_text(tree, False))
        assert ir.layout.layout(n.engine).instance_count() == ir.layout.layout(f.engine).instance_count()
        merges = lambda s: {json.dumps(b.merge.model_dump(), sort_keys=True) for st, _ in ir.leaf_stages(s.engine.body) for b in st.branch_list()}
        assert merges(n) == merges(f)  # the derived values (cooling's std, DeepNet's alpha and beta, LayerScale's start) count every layer
        mn, mf = perturbed(build(n, seed=0)), build(f, seed=1)
        m = layer_map(n, f)
        mf.load_state_dict({rename(k, m): v for k, v in mn.state_dict().items()}, strict=True)
        idx = torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(0))
        ln, lossn = mn(idx, idx)
        lf, lossf = mf(idx, idx)
        assert torch.equal(ln, lf) and torch.equal(lossn, lossf)
        mn.eval()
        assert torch.equal(mn.generate(idx[:, :3], 5, temperature=0), mn.generate(idx[:, :3], 5, temperature=0, use_cache=False))

    check()


# --- what reads the layout: interop, the stand, the report, the diff, the language server -----


def test_interop_sees_the_nested_spec_and_the_flat_one_as_the_same_function():
    from cyclelang.interop.compare import difference

    n, f = cyclelang.parse(nested(2, 2)), cyclelang.parse(flat(2, 2))
    assert difference(n.engine, f.engine) is None
    other = cyclelang.parse(nested(2, 2).replace("kv_heads=2", "kv_heads=1"))
    d = difference(other.engine, f.engine)
    assert d is not None and d.where.startswith("stages.0.stages.2") and d.field == "kv_heads"


def test_the_stand_fires_every_flattened_layer(tmp_path):
    from cyclelang.stand.measure import sites
    from cyclelang.stand.run import fire

    spec = cyclelang.parse(hybrid(True))
    assert [s.path for s in sites(spec)] == ["stages.0.stages.0", "stages.0.stages.1", "stages.0.stages.2",
                                             "stages.1.stages.0", "stages.1.stages.1", "stages.1.stages.2"]
    report = fire([spec], files=["hybrid"], seq=16, batch=2)
    run = report.runs[0]
    assert [r.path for r in run.stages] == [s.path for s in sites(spec)] and [r.depth for r in run.stages] == list(range(1, 7))
    assert all(r.grad_in > 0 for r in run.stages)
    assert {c.name: c.status for c in run.checks}["kv_cache"] == "pass" and {c.name: c.status for c in run.checks}["causal"] == "pass"
    from cyclelang.stand.readings import pressure_readings

    readings = pressure_readings(spec, run)
    assert readings["chain"]["stages.0-1.stages.0-1"] > 0 and "stages.1.stages.2.mix" in readings["branches"]


def test_the_report_shows_the_structure():
    from cyclelang.review.report import analyze, render_text

    rep = analyze(cyclelang.parse(nested(4, 3)))
    rows = [(r["name"], r["path"], r["repeat"], r.get("depth"), r.get("group", False)) for r in rep["params"]["by_stage"]]
    assert rows[1:4] == [("group", "stages.0-3", 4, 1, True), ("local", "stages.0-3.stages.0-2", 12, 2, False), ("global", "stages.0-3.stages.3", 4, 2, False)]
    group, local, glob = rep["params"]["by_stage"][1:4]
    assert group["params"] == local["params"] + glob["params"] and group["per_instance"] * 4 == group["params"]
    assert local["per_instance"] * 12 == local["params"]
    text = render_text(rep)
    assert "  group           stages.0-3" in text and "\n    local         stages.0-3.stages.0-2" in text
    flat_rep = analyze(cyclelang.parse(flat(4, 3)))
    assert all("depth" not in r and "group" not in r for r in flat_rep["params"]["by_stage"])  # a flat engine's rows are as they were


def test_the_build_summary_and_the_diff_name_the_nested_stages():
    from cyclelang.backends.torch.build import summary_text
    from cyclelang.review.diff import diff

    spec = cyclelang.parse(nested(2, 3))
    text = summary_text(spec, build(spec, seed=0))
    assert "\n  stage group x2: " in text and "\n    stage local x6: " in text and "\n    stage global x2: " in text
    d = diff(spec, cyclelang.parse(nested(2, 2)))
    (st,) = d["stages"]
    assert "stage local repeated x3 → x2" in st["changes"] and not d["parts"]["added"] and not d["parts"]["removed"]


def test_the_language_server_hovers_a_group_with_its_numbers():
    from cyclelang.lsp.analysis import analyze, hover

    text = nested(2, 3)
    a = analyze(text, "nest.cycle")
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if "stage group x 2" in line)
    h = hover(a, row, lines[row].index("group"))["contents"]["value"]
    rep = cyclelang.review.report.analyze(cyclelang.parse(text))
    group = next(r for r in rep["params"]["by_stage"] if r["name"] == "group")
    assert "`stages.0-1`" in h and f"{group['per_instance']:,} parameters per instance" in h and f"{group['params']:,} for all 2" in h
    row = next(i for i, line in enumerate(lines) if "stage local =" in line)
    h = hover(a, row, lines[row].index("local"))["contents"]["value"]
    assert "`stages.0-1.stages.0-2`" in h and "for all 6" in h


# --- the front end -------------------------------------------------------------------------


def test_template_parameters_and_lets_are_scoped():
    # an inline nested body reads the enclosing template's parameters
    ok = """
stage pair(h) {
  stage a { prechamber p { norm rmsnorm  turbine attention heads=h } }
  stage b x 2 { prechamber p { norm rmsnorm  turbine mlp } }
}
""" + engine("  stage g = pair(h=4) x 2\n  let unused = 1")
    spec = cyclelang.parse(ok)
    (g,) = spec.engine.body[:1]
    assert g.template == "pair" and g.ops[0].ops[0].ops[1].heads == 4 and g.ops[1].repeat == 2
    # a template used inside another does not see the outer template's parameters
    leak = """
stage inner() { prechamber p { norm rmsnorm  turbine attention heads=h } }
stage outer(h) { stage i = inner() }
""" + engine("  stage g = outer(h=4)")
    with pytest.raises(CycleError) as e:
        cyclelang.parse(leak)
    (d,) = e.value.diagnostics
    assert d.code == "E0101" and "'h'" in d.message and d.span.line == 2
    # arguments are evaluated where the stage is written: the outer template's parameter is passed on
    passed = leak.replace("stage inner()", "stage inner(h)").replace("stage i = inner()", "stage i = inner(h=h * 2)")
    assert cyclelang.parse(passed).engine.body[0].ops[0].ops[0].ops[1].heads == 8


def diagnostics(text: str):
    with pytest.raises(CycleError) as e:
        cyclelang.parse(text, filename="bad.cycle")
    for d in e.value.diagnostics:
        assert d.span is not None and d.span.file == "bad.cycle" and d.span.line >= 1 and d.span.column >= 1
    return e.value.diagnostics


def test_bad_nesting_is_refused_with_located_diagnostics():
    mixed = engine("""  stage g x 2 {
    stage a { prechamber p { turbine mlp } }
    prechamber q { turbine mlp }
  }""")
    (d,) = diagnostics(mixed)
    assert d.code == "E0234" and (d.span.line, d.span.column) == (8, 5) and "prechamber 'q'" in d.message

    deep = engine("  stage a { stage b { stage c { stage d { stage e { prechamber p { turbine mlp } } } } } }")
    (d,) = diagnostics(deep)
    assert d.code == "E0235" and d.span.line == 6 and d.span.column == deep.splitlines()[5].index("e {") + 1

    loop = "stage a() { stage b = c() }\nstage c() { stage d = a() }\n" + engine("  stage x = a()")
    (d,) = diagnostics(loop)
    assert d.code == "E0236" and "a -> c -> a" in d.message and d.span.line == 2

    many = engine("  stage a x 1000 { stage b x 101 { prechamber p { turbine mlp } } }")
    (d,) = diagnostics(many)
    assert d.code == "E0237" and "101,000" in d.message

    twice = engine("  stage g { stage a { prechamber p { turbine mlp } }  stage a { prechamber p { turbine mlp } } }")
    (d,) = diagnostics(twice)
    assert d.code == "E0102" and "'a'" in d.message and d.span.column == twice.splitlines()[5].rindex("a {") + 1

    widens = engine("  stage g x 2 { stage a { turbine linear out=16 } }")
    (d,) = diagnostics(widens)
    assert d.code == "E0212" and "'g'" in d.message

    # the IR refuses the same from JSON
    good = cyclelang.parse(nested(2, 2)).model_dump()
    group = good["engine"]["body"][0]
    bad = json.loads(json.dumps(good))
    bad["engine"]["body"][0]["ops"].append(group["ops"][0]["ops"][0])  # a prechamber beside the stages
    with pytest.raises(ValueError, match="holds stages and other ops"):
        ir.Spec.model_validate(bad)


def test_the_cli_reports_bad_nesting_without_a_traceback(tmp_path):
    from click.testing import CliRunner

    from cyclelang.cli import main

    f = tmp_path / "bad.cycle"
    f.write_text(engine("  stage g x 2 {\n    stage a { prechamber p { turbine mlp } }\n    norm rmsnorm\n  }"), "utf-8")
    r = CliRunner().invoke(main, ["check", str(f)])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert f"{f}:8:5" in r.output and "E0234" in r.output


def test_fmt_round_trips_nested_stages():
    messy = TEMPLATE + engine("""  stage group x 2 { stage local = local_block(heads=4) x 2
  stage global {prechamber mix { norm rmsnorm turbine attention heads=4 }}
  }""")
    once = format_text(messy)
    assert format_text(once) == once
    assert "  stage group x 2 {\n    stage local = local_block(heads=4) x 2\n    stage global {\n      prechamber mix {" in once
    assert cyclelang.parse(once).model_dump() == cyclelang.parse(messy).model_dump()
    tidy = format_text(nested(2, 2))
    assert format_text(tidy) == tidy and cyclelang.parse(tidy).model_dump() == cyclelang.parse(nested(2, 2)).model_dump()


def test_a_repeated_group_is_counted_by_its_own_name_not_n_layer():
    """`stage pair x 13 { stage local {...} stage global {...} }`: 13 pairs, 26 layers; the field says pairs."""
    text = TEMPLATE + engine(f"""
  stage pair x 3 {{
    stage local = local_block(heads=4)
    stage global {GLOBAL_BODY}
  }}""")
    src = codegen(cyclelang.parse(text))
    assert "n_pair: int = 3  # instances of stage pair" in src and "n_layer" not in src
    assert "self.stages = nn.ModuleList([Pair(config) for _ in range(config.n_pair)])" in src
    assert "x = self.stages[0](" in src and "x, losses = self.stages[1](" in src  # the pair's two layers, no count to read (the MoE one returns its loss)
    mod = load_source(src, "pairs")
    small = mod.Model(mod.Config(n_pair=2))
    assert len(small.stages) == 2 and all(len(p.stages) == 2 for p in small.stages)
    assert small.config.cooling_std == 0.02 / (2 * 2 * 2) ** 0.5
