"""The generated file's Config is authoritative: every size comes from it.

A model built from a changed Config must be the model of the correspondingly changed
spec (bit for bit, same seed); the file must import with torch alone; no constructor
may carry a size literal that the config holds; sizes that break the spec's own
constraints are refused by name.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
import textwrap

import pytest

import cyclelang
from cyclelang.backends.torch.codegen import codegen, make_plan

from .conftest import ROOT, SPECS, need, rotated, spec_id, swept_except
from .test_torch_backend import shrink, tokens

torch = need("torch")
from cyclelang.backends.torch.build import build, load_source  # noqa: E402


# the library spec that takes about a second in the sweeps that build it: the full run keeps it
BIG = {"jamba"}


def module_of(path):
    return load_source(codegen(cyclelang.load(path)), path.stem)


def defaults(config) -> dict:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


@pytest.mark.parametrize("path", rotated(SPECS, 3, 0, slow=BIG), ids=spec_id)  # a third in the fast tier, each spec in one of the three Config sweeps
def test_a_changed_config_is_the_changed_spec_bit_for_bit(path):
    """Model(Config(**the shrunk spec's sizes)) from the full-size file == build(shrunk spec)."""
    full = module_of(path)
    small_spec = shrink(path)  # width 96, two layers: hidden widths in proportion
    small_sizes = defaults(load_source(codegen(small_spec), path.stem + "_small").Config())
    assert set(small_sizes) == {f.name for f in dataclasses.fields(full.Config)}  # the same fields, other values
    assert small_sizes != defaults(full.Config())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        ours = full.Model(full.Config(**small_sizes))
    ref = build(small_spec, seed=3)
    a, b = ours.state_dict(), ref.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k
    idx = tokens(ref)
    with torch.no_grad():
        assert torch.equal(ours.eval()(idx), ref.eval()(idx))


@pytest.mark.slow  # every spec in a fresh interpreter; the shapes at full size stay fast
def test_every_spec_imports_with_torch_alone_and_config_default_is_the_build(tmp_path):
    """Each library spec's file, in a fresh interpreter that cannot import cyclelang:
    Model(Config()) equals cyclelang.build bit for bit (shrunk specs: full size is checked
    on shapes below)."""
    files = {}
    for path in SPECS:
        f = tmp_path / f"{path.stem}_model.py"
        f.write_text(codegen(shrink(path)), "utf-8")
        files[path.stem] = str(f)
    script = textwrap.dedent("""
        import importlib.abc, importlib.util, json, sys
        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("cyclelang", "pydantic", "lark"):
                    raise ImportError("the generated file imported " + name)
        sys.meta_path.insert(0, Refuse())
        import torch
        files, out = json.loads(sys.argv[1]), sys.argv[2]
        states = {}
        for name, file in files.items():
            spec = importlib.util.spec_from_file_location("gen_" + name, file)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            torch.manual_seed(5)
            states[name] = mod.Model(mod.Config()).state_dict()
        torch.save(states, out)
    """)
    out = tmp_path / "states.pt"
    proc = subprocess.run([sys.executable, "-I", "-c", script, json.dumps(files), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = torch.load(out)
    for path in SPECS:
        ref = build(shrink(path), seed=5).state_dict()
        got = states[path.stem]
        assert list(got) == list(ref), path.stem
        assert all(torch.equal(got[k], ref[k]) for k in ref), path.stem


@pytest.mark.parametrize("path", rotated(SPECS, 3, 1), ids=spec_id)
def test_full_size_config_default_has_the_builds_shapes(path):
    mod = module_of(path)
    with torch.device("meta"):
        ours = mod.Model(mod.Config())
        ref = build(cyclelang.load(path))
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("path", rotated(SPECS, 3, 2, slow=BIG), ids=spec_id)
def test_half_width_two_layers_builds_and_trains_a_step(path):
    mod = module_of(path)
    base = mod.Config()
    plan = make_plan(cyclelang.load(path))
    depth = {sp.n.name: 2 for sp in [*plan.groups, *plan.stages] if sp.n is not None}  # n_layer, n_<stage>, or the spec's let (`depth`)
    assert depth, "every library spec repeats a stage"
    # a hidden width a let names (gated_delta's, jamba's, short_conv's mlps) halves with the width: jamba's 63M
    # parameters at its own (1.1 GB with their gradients and AdamW's state, the suite's largest allocation) become 35M
    hidden = {"hidden": base.hidden // 2} if hasattr(base, "hidden") else {}
    half = dict(width=base.width // 2, vocab_size=256, context=16, **depth)
    config = mod.Config(**half, **hidden)
    torch.manual_seed(0)
    model = mod.Model(config).train()
    assert model.feed.tok.weight.shape == (256, base.width // 2)
    if hidden:  # the Config's hidden width is the one built: fewer parameters than at the spec's own
        with torch.device("meta"):
            own = mod.Model(mod.Config(**half))
        assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in own.parameters())
    def count(sps):  # the instances of these stages in the changed config
        return sum(depth[sp.n.name] if sp.n is not None else 1 for sp in sps)

    assert len(model.stages) == count(plan.top)
    for sp in (g for g in plan.groups if g.parent is None):  # a nested stage (striped): each group instance holds its stages'
        groups = [m for m in model.stages if type(m).__name__ == sp.cls]
        assert groups and all(len(g.stages) == count(sp.children) for g in groups)
    opt, sched = model.configure_optimizer()
    idx = torch.randint(0, 256, (2, 12))
    before = [p.detach().clone() for p in model.parameters()]
    _, loss = model(idx, targets=idx)
    loss.backward()
    opt.step()
    sched.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if hasattr(model, "generate") and "throat causal" in path.read_text():
        assert model.eval().generate(idx[:, :3], 3, temperature=0).shape == (2, 6)


def test_derived_values_follow_the_config():
    gpt2 = module_of(ROOT / "specs" / "gpt2.cycle")
    c = gpt2.Config(depth=3, width=384)  # `let depth = 12`: the spec's name
    assert c.head_dim == 32
    assert c.cooling_std == 0.02 / (6 ** 0.5)  # GPT-2's scaled init over 2 merges per layer
    deep = module_of(ROOT / "specs" / "deepnet.cycle")
    c = deep.Config(n_layer=6)
    spec = cyclelang.parse((ROOT / "specs" / "deepnet.cycle").read_text().replace("x 36", "x 6"))
    m = spec.engine.body[0].ops[0].merge
    assert (c.deepnorm_alpha, c.deepnorm_beta) == (m.alpha, m.beta)  # the IR's formulas, bit for bit
    ls = module_of(ROOT / "specs" / "layerscale.cycle")
    assert ls.Config().layerscale_init == 1e-5 and ls.Config(n_layer=12).layerscale_init == 0.1  # CaiT's depth rule


@pytest.mark.parametrize("spec, change, words", [
    ("gpt2", dict(width=100), "width (100) must be divisible by n_head (12)"),
    ("llama", dict(n_kv_head=3), "n_head (8) must be divisible by n_kv_head (3)"),
    ("moe", dict(top_k=9), "top_k (9) must be at most n_expert (8)"),
    ("full_flow", dict(rotary_dims=100), "rotary_dims (100) must be even and at most head_dim (64)"),
    ("gpt2", dict(depth=0), "depth (0) must be at least 1"),
])
def test_sizes_that_break_the_specs_constraints_are_refused_by_name(spec, change, words):
    mod = module_of(ROOT / "specs" / f"{spec}.cycle")
    with pytest.raises(ValueError) as err:
        mod.Config(**change)
    assert words in str(err.value)


def constructor_literals(source: str) -> list[tuple[int, int]]:
    """(line, value) of every int literal passed straight to a call in an __init__ or reset_parameters
    (an argument, a keyword's value, an element of a shape tuple), whose value a Config field holds;
    and of every float literal anywhere in an __init__, reset_parameters or forward whose value a
    Config float field holds (an eps, an init value, a gate's bias; 0.0 is every init's mean)."""
    tree = ast.parse(source)
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    fields = [n.value.value for n in config.body if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Constant)]
    held = {v for v in fields if type(v) is int}
    held_floats = {v for v in fields if type(v) is float and v != 0.0}
    found = []
    from cyclelang.backends.torch.codegen import HELPERS  # the runtime's classes, inlined verbatim: their constants are the method's

    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name != "Config" and n.name not in HELPERS):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in ("__init__", "reset_parameters", "forward")):
            found += [(n.lineno, n.value) for n in ast.walk(fn) if isinstance(n, ast.Constant) and type(n.value) is float and n.value in held_floats]
            if fn.name == "forward":
                continue
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                args = list(call.args) + [k.value for k in call.keywords]
                args += [e for a in args if isinstance(a, ast.Tuple) for e in a.elts]
                found += [(a.lineno, a.value) for a in args if isinstance(a, ast.Constant) and type(a.value) is int and a.value in held]
    return sorted(found)


@pytest.mark.parametrize("path", swept_except(SPECS, {"expander"}), ids=spec_id)  # expander: about a second here, in the full run
def test_no_constructor_carries_a_size_the_config_holds(path):
    assert constructor_literals(codegen(cyclelang.load(path))) == []


def test_the_literal_check_can_fail():
    bad = "class Config:\n    width: int = 768\n\nclass Block:\n    def __init__(self, config):\n        self.norm = nn.LayerNorm(768)\n"
    assert constructor_literals(bad) == [(6, 768)]
    bad = "class Config:\n    eps: float = 1e-6\n\nclass Block:\n    def forward(self, x):\n        return x / (x.sum() + 1e-6)\n"
    assert constructor_literals(bad) == [(6, 1e-6)]


FLOATS = """
engine floats {
  chamber width=64
  throat causal
  feed tokens vocab=96 context=16
  stage block x 2 {
    prechamber mix { norm rmsnorm offset=0.75  turbine attention heads=4 qk_norm qk_norm_eps=1e-5 scale=0.2  merge gate bias=-2.0 }
    prechamber burn { norm rmsnorm offset=0.75  turbine mlp ratio=2 act=gelu  merge rezero init=0.25 }
  }
  norm rmsnorm
  nozzle head scale=0.5
}
"""


def test_non_size_floats_are_config_fields_and_a_changed_one_is_the_changed_spec():
    src = codegen(cyclelang.parse(FLOATS))
    assert constructor_literals(src) == []
    mod = load_source(src, "floats")
    c = mod.Config()
    assert (c.qk_norm_eps, c.attn_scale, c.gate_bias, c.rezero_init, c.norm_offset, c.logit_scale) == (1e-5, 0.2, -2.0, 0.25, 0.75, 0.5)
    changed = mod.Config(qk_norm_eps=1e-3, attn_scale=0.3, gate_bias=-1.0, rezero_init=0.5, norm_offset=0.5, logit_scale=0.25)
    text = (FLOATS.replace("qk_norm_eps=1e-5", "qk_norm_eps=1e-3").replace("scale=0.2", "scale=0.3").replace("bias=-2.0", "bias=-1.0")
            .replace("init=0.25", "init=0.5").replace("offset=0.75", "offset=0.5").replace("scale=0.5", "scale=0.25"))
    torch.manual_seed(4)
    ours = mod.Model(changed)
    ref = build(cyclelang.parse(text), seed=4)
    a, b = ours.state_dict(), ref.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    idx = tokens(ref)
    with torch.no_grad():
        assert torch.equal(ours.eval()(idx), ref.eval()(idx))


def test_blocks_read_like_the_architecture():
    src = codegen(cyclelang.load(ROOT / "specs" / "gpt2.cycle"))
    assert "x = x + self.mix.attn(self.mix.norm(x), cache, mask)" in src
    assert "x = x + self.burn.mlp(self.burn.norm(x))" in src
    assert "class BlockMix" not in src and "class BlockBurn" not in src  # no class for norm + op + merge
    assert "rope = None" not in src


@pytest.mark.parametrize("path", SPECS, ids=spec_id)
def test_stage_forwards_take_only_what_they_use(path):
    tree = ast.parse(codegen(cyclelang.load(path)))
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"):
            used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
            unused = [a.arg for a in fn.args.args[1:] if a.arg not in used]
            assert unused == [] or cls.name == "Model", (cls.name, unused)


# --- the readable and the fast form; the comment modes ------------------------------------

ROCKET_WORDS = ("injector", "combust", "prechamber", "valve", "nozzle", "orifice", "throat", "chill", "throttle",
                "pogo", "tanks", "pumps", "turbine", "overboard", "cooling", "liquid", "baffle", "exhaust", "engine")


@pytest.mark.parametrize("path", rotated(SPECS, 2, 1, slow=BIG), ids=spec_id)  # half (the MoE and sink specs among them)
def test_readable_and_fast_forms_are_the_same_model(path):
    spec = shrink(path)
    fast, readable = build(spec, seed=2, fast=True).train(), build(spec, seed=2, fast=False).train()
    assert type(fast).__module__ != type(readable).__module__
    a, b = fast.state_dict(), readable.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    idx = tokens(fast)
    torch.manual_seed(0)
    la, lb = fast(idx, targets=idx), None
    torch.manual_seed(0)  # dropout draws the same masks in both
    lb = readable(idx, targets=idx)
    assert torch.equal(la[0], lb[0])  # the logits bit for bit
    torch.testing.assert_close(la[1], lb[1], rtol=1e-6, atol=0)  # the fast loss scores through the softmax: F.cross_entropy's to rounding
    la[1].backward(), lb[1].backward()
    for (n, p), q in zip(fast.named_parameters(), readable.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)  # the fused backward rounds differently


def test_the_readable_form_has_no_performance_machinery_and_the_fast_one_keeps_it_at_the_end():
    spec = cyclelang.load(ROOT / "specs" / "moe.cycle")
    readable, fast = codegen(spec), codegen(spec, fast=True)  # readable: the default
    for piece in ("next_token_loss", "custom_op", "compiled_experts", "is_compiling", "plain_experts"):
        assert piece not in readable and piece in fast
    assert "F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)" in " ".join(readable.split())
    runtime = fast.index("# Runtime: performance pieces")
    assert fast.index("class Model(") < runtime < fast.index("def next_token_loss_op") < fast.index("experts_swiglu = expert_mlps(")
    assert fast[:runtime].count("torch.library") == 0  # nothing of the op between the blocks


def comments_and_docstrings(source: str) -> str:
    import io
    import tokenize

    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT or tok.type == tokenize.STRING and tok.string.startswith('"""'):
            out.append(tok.string)
    return "\n".join(out)


@pytest.mark.parametrize("path", SPECS, ids=spec_id)
def test_ml_comments_carry_no_engine_words_and_none_carries_no_tags(path):
    spec = cyclelang.load(path)
    ml = comments_and_docstrings(codegen(spec, comments="ml")).lower()
    assert not re.search(r"\.cycle:\d", ml)  # no spec-line tags
    ml = ml.replace(f"{path.stem}.cycle", "").replace(spec.engine.name.lower(), "")  # the spec's own names may be anything
    assert "generated by cyclec from" in ml  # only the header names the file
    found = [w for w in ROCKET_WORDS if w in ml]
    assert found == [], found
    none = codegen(spec, comments="none")
    assert f"{path.stem}.cycle:" not in none and " · " not in none
    both = codegen(spec, comments="both")
    assert f" · {path.stem}.cycle:" in both


def test_both_tags_each_line_with_the_spec_line_and_the_engine_word():
    both = codegen(cyclelang.load(ROOT / "specs" / "gpt2.cycle"), comments="both")
    assert "attn=Attention(" in both and "  # attention: the only place positions mix · gpt2.cycle:18 · injector" in both
    assert "  # Pre-LN: the norm is on the branch · gpt2.cycle:17 · valve" in both


def test_comment_modes_build_the_same_model():
    spec = shrink(ROOT / "specs" / "gas_generator.cycle")
    states = []
    for mode in ("ml", "both", "none"):
        mod = load_source(codegen(spec, comments=mode), f"gas_{mode}")
        torch.manual_seed(0)
        states.append(mod.Model().state_dict())
    assert all(list(s) == list(states[0]) and all(torch.equal(s[k], states[0][k]) for k in s) for s in states)
    with pytest.raises(ValueError, match="comments must be one of"):
        codegen(spec, comments="rocket")


@pytest.mark.slow  # two cyclec processes; the readable form's model stays fast
def test_cli_build_readable_and_comments(tmp_path):
    out = tmp_path / "model.py"
    proc = subprocess.run([sys.executable, "-m", "cyclelang.cli", "build", str(ROOT / "specs" / "moe.cycle"),
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "next_token_loss" not in text and "moe.cycle:" not in text and "F.cross_entropy(" in text
    bad = subprocess.run([sys.executable, "-m", "cyclelang.cli", "build", str(ROOT / "specs" / "moe.cycle"), "--comments", "rocket"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "rocket" in bad.stderr


def test_an_untied_head_after_a_narrowing_linear_reads_the_inner_width():
    text = textwrap.dedent("""
        engine fz {
          chamber width=8
          throat causal
          feed tokens vocab=64 context=16
          stage b0 x 2 { prechamber p0 { turbine attention heads=1 } }
          turbine linear out=4 bias=false
          nozzle head
        }""")
    mod = load_source(codegen(cyclelang.parse(text)), "narrow_head")
    assert "self.head = nn.Linear(config.inner_width, config.vocab_size" in codegen(cyclelang.parse(text))
    model = mod.Model(mod.Config(inner_width=6))
    assert model.head.in_features == 6 and model.linear.out_features == 6


# --- the spec's let names are the config's field names -------------------------------------

LETS = """
let width = 96
let heads = 4
let hidden = 8 * width / 3 + 16
let depth = 3
let std = 0.02
engine lets {
  chamber width=width
  throat causal
  feed tokens vocab=96 context=16
  stage block x depth {
    prechamber mix { norm layernorm  turbine attention heads=heads }
    prechamber burn { norm layernorm  turbine mlp hidden=hidden act=gelu }
  }
  norm layernorm
  nozzle head tied
  startup { init normal std=std }
}
"""


def test_let_names_are_the_config_fields_and_derived_lets_keep_the_specs_formula():
    src = codegen(cyclelang.parse(LETS))
    mod = load_source(src, "lets")
    names = {f.name for f in dataclasses.fields(mod.Config)}
    assert {"width", "heads", "depth", "std"} <= names and "n_layer" not in names and "n_head" not in names
    assert "hidden" not in names and "def hidden(self):" in src  # a derived let: a property over the others
    assert "return int(8 * self.width / 3 + 16)" in src  # the spec's own formula
    c = mod.Config(width=192, depth=2, heads=6)
    assert c.hidden == 8 * 192 // 3 + 16
    changed = LETS.replace("let width = 96", "let width = 192").replace("let depth = 3", "let depth = 2").replace("let heads = 4", "let heads = 6")
    torch.manual_seed(1)
    ours = mod.Model(c)
    ref = build(cyclelang.parse(changed), seed=1)
    a, b = ours.state_dict(), ref.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("change, words", [
    (dict(width=100), "hidden = 8 * width / 3 + 16 (282.6666666666667) must be a whole number"),
    (dict(heads=5), "width (96) must be divisible by heads (5)"),
    (dict(depth=0), "depth (0) must be at least 1"),
])
def test_a_let_changed_past_the_specs_constraints_is_refused_by_name(change, words):
    mod = load_source(codegen(cyclelang.parse(LETS)), "lets_refused")
    with pytest.raises(ValueError) as err:
        mod.Config(**change)
    assert words in str(err.value)


def test_let_names_that_python_reserves_or_the_config_holds_are_made_safe():
    text = LETS.replace("let heads = 4", "let lambda = 4").replace("heads=heads", "heads=lambda").replace("let depth = 3", "let self = 3").replace(
        "x depth", "x self")
    src = codegen(cyclelang.parse(text))
    mod = load_source(src, "lets_safe")
    names = {f.name for f in dataclasses.fields(mod.Config)}
    assert {"lambda_", "self_"} <= names
    assert len(mod.Model(mod.Config(self_=1)).stages) == 1


def test_a_let_a_size_no_longer_holds_names_nothing():
    """A pass that changes a size keeps the node's let_names: the field must not take the let's name."""
    spec = cyclelang.parse(LETS)
    e = spec.engine
    st = e.body[0]
    st2 = st.model_copy(update=dict(repeat=5))
    spec2 = spec.model_copy(update=dict(engine=e.model_copy(update=dict(body=[st2, *e.body[1:]]))))
    names = {f.name for f in dataclasses.fields(load_source(codegen(spec2), "lets_stale").Config)}
    assert "depth" not in names and "n_layer" in names


def test_nested_stages_counts_are_config_fields_named_by_the_specs_lets():
    """A stage of stages: each level's repeat count is a field (here the spec's lets), a changed
    count is the changed spec bit for bit, and each MoE's balance loss is filed under its
    instance's nested path, level by level."""
    from .test_nested import GLOBAL_BODY, TEMPLATE, engine

    def spec(groups: int, local: int) -> str:
        return f"let groups = {groups}\nlet local_layers = {local}\n" + TEMPLATE + engine("""
  stage group x groups {
    stage local = local_block(heads=4) x local_layers
    stage global """ + GLOBAL_BODY + """
  }""")

    src = codegen(cyclelang.parse(spec(3, 2)))
    mod = load_source(src, "nest_lets")
    names = {f.name for f in dataclasses.fields(mod.Config)}
    assert {"groups", "local_layers"} <= names and not {"n_group", "n_local"} & names
    assert "self.stages = nn.ModuleList([Group(config) for _ in range(config.groups)])" in src
    assert "return self.init_std / math.sqrt(2 * self.groups * self.local_layers + 2 * self.groups)" in src  # cooling over every layer
    torch.manual_seed(2)
    ours = mod.Model(mod.Config(groups=2, local_layers=1)).train()
    ref = build(cyclelang.parse(spec(2, 1)), seed=2).train()
    a, b = ours.state_dict(), ref.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    idx = tokens(ref)
    torch.manual_seed(0)
    la = ours(idx, targets=idx)
    torch.manual_seed(0)
    lb = ref(idx, targets=idx)
    assert torch.equal(la[1], lb[1])
    assert list(ours.aux_losses) == ["stages.0.stages.1.burn.moe", "stages.1.stages.1.burn.moe"]
    for name, loss in ours.aux_losses.items():  # the name is the MoE's own path
        moe = ours.get_submodule(name)
        assert type(moe).__name__.startswith("Moe") and loss.ndim == 0 and loss > 0
