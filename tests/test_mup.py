"""μP as a start sequence (issue 17): `startup { param mup base_width=N }`.

The expected values are computed here from Tensor Programs V, Table 3 (Adam), with
m = width / base_width, for every parameter of the built model, classified in this
file from the parameter's place and shape alone:
    embeddings (feed.*)            init sigma           lr eta
    biases, gains (< 2 dims)       as standard          lr eta
    hidden matrices                init sigma/sqrt(m)   lr eta/m, decay lambda*m
    the readout                    logits x 1/m         lr eta
and attention scores x 1/head_dim, normalised to 1/sqrt(head_dim) at base_width.
Then against microsoft/mup itself: `set_base_shapes` + `MuAdamW`, `MuReadout`.
"""

from __future__ import annotations

import math

import pytest

from .conftest import ROOT, need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang import ir  # noqa: E402
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.stand import shrink  # noqa: E402

from .test_stand import invoke, one_thread  # noqa: E402,F401

LR, DECAY, STD = 3e-3, 0.1, 0.02


def gpt(param="", width=32, tied=True, extra=""):
    return f"""engine g {{
  chamber width={width}
  throat causal
  feed tokens vocab=64 context=32 position=learned
  stage block x 2 {{
    prechamber mix {{ norm layernorm turbine attention heads=4 merge cooling }}
    prechamber burn {{ norm layernorm turbine mlp ratio=4 merge cooling }}
  }}
  {extra}
  norm layernorm
  nozzle head{" tied" if tied else ""}
  startup {{ schedule constant lr={LR} decay {DECAY} init normal std={STD} {param} }}
}}
"""


def load(text, tmp_path, name="g.cycle"):
    p = tmp_path / name
    p.write_text(text)
    return cyclelang.load(str(p))


def table3(name: str, p) -> str:
    """The rule of Table 3 a parameter falls under, from its place and shape."""
    if p.dim() < 2:
        return "vector"
    if name.startswith("feed."):
        return "input"
    if name.startswith("head."):
        return "readout"
    return "hidden"


def group_of(opt, p):
    (g,) = [g for g in opt.param_groups if any(q is p for q in g["params"])]
    return g


# --- the spelling -------------------------------------------------------------------------


def test_spelling_defaults_and_errors(tmp_path):
    s = load(gpt("param mup"), tmp_path)
    assert (s.engine.startup.param.kind, s.engine.startup.param.base_width) == ("mup", 32)  # base: the spec's own width
    r = invoke(["fmt", str(tmp_path / "g.cycle")])
    assert r.exit_code == 0 and "param mup\n" in r.output
    assert load(gpt(), tmp_path).engine.startup.param.kind == "standard"
    (tmp_path / "x.cycle").write_text(gpt("param mup init xavier").replace("init normal std=0.02 ", ""))
    r = invoke(["check", str(tmp_path / "x.cycle")])
    assert r.exit_code == 1 and "E0260" in r.output
    (tmp_path / "y.cycle").write_text(gpt("param mupp"))
    r = invoke(["check", str(tmp_path / "y.cycle")])
    assert r.exit_code == 1 and "E0204" in r.output and "mup" in r.output
    (tmp_path / "z.cycle").write_text(gpt("param mup base_width=0"))
    assert invoke(["check", str(tmp_path / "z.cycle")]).exit_code == 1
    # shrink keeps the base width as written: the scale model is mup relative to it
    small = shrink(load(gpt("param mup", width=128), tmp_path), width=64)
    assert small.engine.startup.param.base_width == 128 and ir.mup.width_mult(small.engine) == 0.5


# --- Table 3, group by group -----------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_init_and_lr_follow_table3(tmp_path, tied):
    width, base = 128, 32
    m = width / base
    mup_model = build(load(gpt(f"param mup base_width={base}", width=width, tied=tied), tmp_path), seed=5)
    sp_model = build(load(gpt("", width=width, tied=tied), tmp_path, "sp.cycle"), seed=5)
    sp = dict(sp_model.named_parameters())
    opt, _ = mup_model.configure_optimizer()
    seen = set()
    for name, p in mup_model.named_parameters():
        rule = table3(name, p)
        seen.add(rule)
        init = {"input": 1.0, "vector": 1.0, "hidden": m ** -0.5, "readout": 1.0}[rule]
        # the same draws (same seed) times the rule's factor: the standard init at base width, scaled
        torch.testing.assert_close(p.detach(), sp[name].detach() * init, rtol=1e-6, atol=0)
        g = group_of(opt, p)
        lr = {"input": LR, "vector": LR, "hidden": LR / m, "readout": LR}[rule]
        assert math.isclose(g["lr"], lr, rel_tol=1e-12), name
        decay = 0.0 if p.dim() < 2 else DECAY * (m if rule == "hidden" else 1.0)
        assert math.isclose(g["weight_decay"], decay, rel_tol=1e-12), name
    assert seen == {"input", "vector", "hidden"} | (set() if tied else {"readout"})
    # absolute stds: hidden weights at sigma/sqrt(m); cooled output projections at sigma/sqrt(2N)/sqrt(m)
    qkv = mup_model.stages[0].mix.attn.qkv.weight
    proj = mup_model.stages[0].mix.attn.proj.weight
    assert abs(float(qkv.detach().std()) / (STD / math.sqrt(m)) - 1) < 0.02
    assert abs(float(proj.detach().std()) / (STD / math.sqrt(4) / math.sqrt(m)) - 1) < 0.03
    assert abs(float(mup_model.feed.tok.weight.detach().std()) / STD - 1) < 0.03


def test_attention_and_readout_multipliers(tmp_path):
    width, base = 128, 32
    m = width / base
    model = build(load(gpt(f"param mup base_width={base}", width=width), tmp_path), seed=1)
    attn = model.stages[0].mix.attn
    hd = attn.head_dim
    assert math.isclose(attn.scale, math.sqrt(hd / m) / hd)  # sqrt(d0)/d: 1/head_dim, standard at base
    # the attention's output against the formula written out
    x = torch.randn(2, 7, width, generator=torch.Generator().manual_seed(0))
    q, k, v = attn.qkv(x).split(width, dim=2)
    q, k, v = (t.view(2, 7, attn.heads, hd).transpose(1, 2) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * (math.sqrt(hd / m) / hd)
    s = s.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    y = (s.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, width)
    torch.testing.assert_close(attn(x, None), attn.proj(y), rtol=1e-5, atol=1e-6)
    # the readout: logits = (final hidden @ E^T) / m
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    got = {}
    h = model.norm.register_forward_hook(lambda mod, a, out: got.setdefault("x", out))
    logits = model(idx)
    h.remove()
    torch.testing.assert_close(logits, got["x"] @ model.feed.tok.weight.T / m, rtol=1e-5, atol=1e-6)


def test_mup_at_its_base_width_is_the_standard_model(tmp_path):
    a = build(load(gpt("param mup"), tmp_path), seed=3)
    b = build(load(gpt(""), tmp_path, "sp.cycle"), seed=3)
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a(idx), b(idx), rtol=1e-6, atol=1e-7)
    oa, _ = a.configure_optimizer()
    assert {g["lr"] for g in oa.param_groups} == {LR}


def test_every_kind_gets_a_rule_from_its_role():
    from cyclelang.ir.kinds import KINDS, ROLES

    assert set(ir.mup.ROLE_RULE) == set(ROLES)
    rs = ir.mup.rules(2.0)
    for kind in KINDS.values():
        assert ir.mup.rule_name(kind, None, 0) in rs, kind.keyword


def test_moe_conv_and_linear_rules(tmp_path):
    """MoE experts are hidden and its router an output layer; conv's depthwise filters are vector-like;
    a projection onto the vocabulary is an output layer."""
    extra = """stage tap {
    prechamber rx { norm rmsnorm turbine moe experts=4 top=2 hidden=64 merge cooling }
    prechamber cv { norm rmsnorm turbine conv size=3 merge cooling }
    prechamber probe overboard loss=0.1 { norm layernorm turbine linear out=vocab }
  }"""
    width, base = 64, 32
    spec = load(gpt(f"param mup base_width={base}", width=width, extra=extra), tmp_path)
    rows = {r["path"]: r["rule"] for r in ir.mup.table(spec.engine)}
    assert rows["stages.2.rx.moe"] == "hidden" and rows["stages.2.cv.conv"] == "vector" and rows["stages.2.probe.linear"] == "output"
    model = build(spec, seed=0)
    opt, _ = model.configure_optimizer()
    assert opt.defaults["fused"] is True
    named = dict(model.named_parameters())
    experts = [n for n, p in named.items() if n.startswith("stages.2.rx.moe.experts.") and p.dim() >= 2]
    assert len(experts) == 8  # fc and proj of 4 experts
    for n in experts:
        assert math.isclose(group_of(opt, named[n])["lr"], LR / 2)
    # the router maps the width onto 4 experts: Table 3's output weights (init sigma/m, lr eta/m)
    router = named["stages.2.rx.moe.router.weight"]
    assert math.isclose(group_of(opt, router)["lr"], LR / 2)
    sp = dict(build(load(gpt("", width=width, extra=extra), tmp_path, "sp.cycle"), seed=0).named_parameters())
    torch.testing.assert_close(router.detach(), sp["stages.2.rx.moe.router.weight"].detach() / 2, rtol=1e-6, atol=0)
    assert math.isclose(group_of(opt, named["stages.2.cv.conv.conv.weight"])["lr"], LR)
    assert math.isclose(group_of(opt, named["stages.2.probe.linear.weight"])["lr"], LR / 2)


def test_report_lists_the_rule_of_every_group(tmp_path):
    (tmp_path / "g.cycle").write_text(gpt("param mup base_width=32", width=128))
    r = invoke(["check", "--report", str(tmp_path / "g.cycle")])
    assert r.exit_code == 0, r.output
    assert "parametrisation: mup, width 128 = 4 x base width 32" in r.output
    rows = r.output.split("parametrisation:")[1].splitlines()
    attn = [ln for ln in rows if ln.split()[:1] == ["stages.0-1.mix.attn"]][0].split()
    # hidden: init x 4**-0.5, lr x 1/4, decay x 4; scores x sqrt(8/4)/8 (head_dim 8 at width 32... 32 at 128)
    assert attn[2:6] == ["hidden", "0.5", "0.25", "4"] and attn[-1] == f"{math.sqrt(32 / 4) / 32:.3g}"
    assert [ln.split()[-4] for ln in rows if ln.split()[:1] == ["feed"]] == ["input"]


# --- against microsoft/mup -------------------------------------------------------------------


def _mup():
    return need("mup")  # CI installs it (.ci/run): a missing package fails there


def test_against_microsoft_mup(tmp_path):
    """Our per-parameter lr and init scale against mup's `set_base_shapes` + `MuAdamW` on the
    same modules, and our readout against `MuReadout`."""
    mup = _mup()
    width, base = 128, 32
    text = gpt(f"param mup base_width={base}", width=width, tied=False)
    ours = build(load(text, tmp_path), seed=0)
    target = build(load(gpt("", width=width, tied=False), tmp_path, "t.cycle"), seed=0)
    base_model = build(load(gpt("", width=base, tied=False), tmp_path, "b.cycle"), seed=0)
    mup.set_base_shapes(target, base_model, rescale_params=False, do_assert=False)
    ref = mup.MuAdamW(target.parameters(), lr=LR, weight_decay=DECAY)
    opt, _ = ours.configure_optimizer()
    mine = dict(ours.named_parameters())
    for name, p in target.named_parameters():
        assert math.isclose(group_of(ref, p)["lr"], group_of(opt, mine[name])["lr"], rel_tol=1e-12), name
        if p.dim() >= 2:
            assert math.isclose(group_of(ref, p)["weight_decay"], group_of(opt, mine[name])["weight_decay"], rel_tol=1e-12), name
        # mup.init's rule: matrix-like (two infinite dims) x width_mult**-0.5, else unchanged
        factor = p.infshape.width_mult() ** -0.5 if p.infshape.ninf() == 2 else 1.0
        torch.testing.assert_close(mine[name].detach(), p.detach() * factor, rtol=1e-6, atol=0)
    readout = mup.MuReadout(width, 64, bias=False)
    with torch.no_grad():
        readout.weight.copy_(ours.head.weight)
    mup.set_base_shapes(readout, mup.MuReadout(base, 64, bias=False), rescale_params=False)
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(0))
    h = ours.head(x) * (base / width)  # what our forward does after the head
    torch.testing.assert_close(readout(x), h, rtol=1e-6, atol=1e-7)


def test_latent_attention_takes_the_score_rule_and_linear_attention_none(tmp_path):
    """MLA's softmax scores take sqrt(d0)/d of its query/key width d = head_dim + rotary_dims
    (the paper's rule); linear attention's normalised sums are unchanged by any factor on q
    or k, so there is no score rule for it (nor for an ssm)."""
    width, base = 64, 16
    m = width / base
    mla = "turbine attention heads=4 latent=8 head_dim=8 rotary_dims=4 v_dim=8 bias=false"
    text = gpt(f"param mup base_width={base}", width=width).replace("turbine attention heads=4", mla).replace("position=learned", "position=none")
    model = build(load(text, tmp_path), seed=1).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # away from the init, whose scores are all but uniform at any scale
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    attn = model.stages[0].mix.attn
    d = 8 + 4
    assert math.isclose(attn.scale, math.sqrt(d / m) / d)
    rows = {r["path"]: r for r in ir.mup.table(load(text, tmp_path).engine)}
    assert math.isclose(rows["stages.0-1.mix.attn"]["attention_scale"], attn.scale)
    # the same weights under the standard parametrisation, the queries multiplied by scale x sqrt(d): the same scores
    std = build(load(text.replace(f"param mup base_width={base}", ""), tmp_path, "s.cycle"), seed=1).eval()
    std.load_state_dict(model.state_dict())
    with torch.no_grad():
        std.stages[0].mix.attn.q_proj.weight.mul_(attn.scale * math.sqrt(d))
    idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(2))
    hooks = {}
    for name, mod in (("mup", model), ("std", std)):
        mod.stages[0].mix.attn.register_forward_hook(lambda mod_, a, out, name=name: hooks.setdefault(name, (a, out)) and None)
    with torch.no_grad():
        model(idx)
        std.stages[0].mix.attn(*hooks["mup"][0])  # the same inputs (x, rope, cache) through the rescaled standard attention
    torch.testing.assert_close(hooks["std"][1], hooks["mup"][1], rtol=1e-5, atol=1e-6)
    plain = build(load(text.replace(f"param mup base_width={base}", ""), tmp_path, "s.cycle"), seed=1).eval()
    plain.load_state_dict(model.state_dict())  # not rescaled: the kernel's 1/sqrt(d) gives other scores
    with torch.no_grad():
        assert not torch.allclose(plain.stages[0].mix.attn(*hooks["mup"][0]), hooks["mup"][1], atol=1e-4)
    linear = gpt(f"param mup base_width={base}", width=width).replace("turbine attention heads=4", "turbine linear_attention heads=4")
    rows = ir.mup.table(load(linear, tmp_path, "l.cycle").engine)
    assert all("attention_scale" not in r for r in rows if r["kind"] == "linear attention")
    assert build(load(linear, tmp_path, "l.cycle"), seed=1)(idx).shape == (2, 9, 64)
