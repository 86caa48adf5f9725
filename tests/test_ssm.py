"""`turbine ssm` against transformers' Mamba2ForCausalLM (its torch path), and against itself.

The reference is transformers' model built from a tiny random config (nothing is
downloaded), its weights perturbed away from their init and copied into the compiled
engine: logits, loss, gradients and greedy decoding must agree, and the parameter
count and the FLOPs the kinds record claims must be what the modules hold and run.
"""

from __future__ import annotations

import sys

import pytest

import cyclelang
from cyclelang import ir
from cyclelang.review import analyze, review

from .conftest import ROOT, need

torch = need("torch")
transformers = need("transformers")  # in CI a missing reference fails, it does not skip

SPEC = """
engine mamba_toy {{
  chamber width=32
  throat causal
  feed tokens vocab=50 context=80 position=none
  stage block x {layers} {{
    prechamber mix {{ norm rmsnorm eps=1e-5  turbine ssm heads=4 state=8 groups={groups} conv=4 chunk={chunk} {extra} }}
  }}
  norm rmsnorm eps=1e-5
  nozzle head bias=false
}}
"""


def _spec(layers=2, groups=2, chunk=8, extra=""):
    return cyclelang.parse(SPEC.format(layers=layers, groups=groups, chunk=chunk, extra=extra))


def _perturb(model, seed=1, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def _hf(layers=2, groups=2, chunk=8, **kw):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    cfg = Mamba2Config(vocab_size=50, hidden_size=32, num_heads=4, head_dim=16, state_size=8, n_groups=groups, expand=2,
                       conv_kernel=4, chunk_size=chunk, num_hidden_layers=layers, use_bias=False, use_conv_bias=True,
                       layer_norm_epsilon=1e-5, tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None, **kw)
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(cfg).eval()
    _perturb(model)
    return model


def _load(ours, hf):
    """transformers' weights through cyclelang.interop (its mamba2 mapping: the mixer's names are the same)."""
    from cyclelang.interop import load_transformers

    return load_transformers(ours, hf)


def _pair(**kw):
    hf = _hf(**kw)
    ours = _load(cyclelang.build(_spec(**{k: v for k, v in kw.items() if k in ("layers", "groups", "chunk")})), hf).eval()
    return ours, hf


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("T,chunk", [(20, 8), (16, 8), (5, 8), (24, 32)])  # several chunks with a ragged end, exact chunks, one short chunk
def test_logits_loss_and_gradients_equal_mamba2(T, chunk):
    ours, hf = _pair(chunk=chunk)
    idx = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(2))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    assert analyze(_spec(chunk=chunk))["params"]["total"] == sum(p.numel() for p in hf.parameters())
    want = hf(idx, labels=idx)
    logits, loss = ours(idx, targets=torch.cat([idx[:, 1:], torch.full((2, 1), -1)], dim=1))  # transformers shifts the labels itself
    assert _rel(logits, want.logits) < 1e-5
    assert abs(loss.item() - want.loss.item()) < 1e-5 * abs(want.loss.item())
    loss.backward()
    want.loss.backward()
    theirs = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        if name.startswith("stages.0.mix.ssm."):
            q = theirs["backbone.layers.0.mixer." + ("norm.weight" if name.endswith(".norm") else name.split("ssm.", 1)[1])]
            assert _rel(p.grad, q.grad) < 1e-5, name
    assert _rel(ours.feed.tok.weight.grad, theirs["backbone.embeddings.weight"].grad) < 1e-5


def test_groups_of_one_and_a_dt_limit_equal_mamba2():
    ours, hf = _pair(groups=1)
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(3))
    assert _rel(ours(idx), hf(idx).logits) < 1e-5
    limited = _hf(time_step_limit=(0.05, 0.5))
    ours = _load(cyclelang.build(_spec(extra="dt_lo=0.05 dt_hi=0.5")), limited).eval()
    assert ours.stages[0].mix.ssm.dt_hi == 0.5
    assert _rel(ours(idx), limited(idx).logits) < 1e-5  # the chunked path clamps dt as transformers does


def test_greedy_decoding_equals_mamba2_and_recomputation():
    ours, hf = _pair()
    prompt = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(4))
    mine = ours.generate(prompt, 24, temperature=0)
    assert torch.equal(mine, ours.generate(prompt, 24, temperature=0, use_cache=False))
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    assert torch.equal(mine, theirs)


def test_recurrent_step_equals_the_chunked_scan_and_the_state_stays_fixed():
    ours, _ = _pair()
    Cache = sys.modules[type(ours).__module__].Cache
    idx = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(5))
    full = ours(idx)
    cache = Cache()
    parts = [ours(idx[:, :11], cache=cache)]  # a ragged prefill, then chunks of several tokens, then single tokens
    parts.append(ours(idx[:, 11:27], cache=cache))
    sizes = []
    for t in range(27, 40):
        parts.append(ours(idx[:, t : t + 1], cache=cache))
        sizes.append(cache.nbytes())
    assert _rel(torch.cat(parts, dim=1), full) < 1e-5
    assert len(set(sizes)) == 1
    s = ir.layout.layout(_spec()).part_of("stages.0.mix.ssm.A_log")
    assert sizes[0] == 2 * 2 * 4 * s.kind.state(s.node, 40)  # batch x stages x float32 bytes x the record's values
    assert s.kind.state(s.node, 16) == s.kind.state(s.node, 256)


def test_state_bytes_do_not_grow_from_16_to_256_tokens():
    spec = cyclelang.parse(SPEC.format(layers=1, groups=1, chunk=16, extra="").replace("context=80", "context=300"))
    model = cyclelang.build(spec).eval()
    Cache = sys.modules[type(model).__module__].Cache
    seen = {}
    cache = Cache()
    idx = torch.randint(0, 50, (1, 256))
    model(idx[:, :1], cache=cache)
    for t in range(1, 256):
        model(idx[:, t : t + 1], cache=cache)
        if t + 1 in (16, 256):
            seen[t + 1] = cache.nbytes()
    assert seen[16] == seen[256] > 0


def test_the_kinds_record_is_what_the_model_holds_and_runs():
    from torch.utils.flop_counter import FlopCounterMode

    spec = _spec(chunk=8)
    model = cyclelang.build(spec)
    part = ir.layout.layout(spec).part_of("stages.0.mix.ssm.in_proj.weight")
    assert part.path == "stages.0-1.mix.ssm" and part.role == "mixer" and part.kind.mixes_positions and part.kind.state_kind == "recurrent"
    assert part.params == sum(p.numel() for p in model.stages[0].mix.ssm.parameters())
    for T in (8, 24, 5):  # one chunk, three whole chunks, one short chunk
        counter = FlopCounterMode(display=False)
        with counter:
            model.stages[0].mix.ssm(torch.randn(1, T, 32), None)
        proj, mixing = part.kind.flops(part.node, T)
        assert counter.get_total_flops() == T * (proj + mixing), T
    assert part.kind.flops(part.node, 4096) == part.kind.flops(part.node, 64)  # per token: flat past the chunk


def test_an_ssm_is_a_mixer_to_the_reviewer_the_diagram_and_the_stand():
    spec = _spec()
    assert "W109" not in {d.code for d in review(spec)}
    dot = cyclelang.draw(spec).source
    assert "jacket" in dot and "SSM · 4 heads · state 8" in dot  # the kind's words and text.TITLES
    report = cyclelang.fire(spec, seq=8, batch=2)
    assert not report.failed
    cooled = cyclelang.codegen(cyclelang.parse(SPEC.format(layers=2, groups=2, chunk=8, extra="  merge cooling")))
    assert "nn.init.normal_(stage.mix.ssm.out_proj.weight" in cooled


@pytest.mark.parametrize("option,code", [("heads=3", "E0230"), ("groups=3", "E0231"), ("expand=1.03", "E0209"),
                                         ("dt_lo=0.5 dt_hi=0.1", "E0211"), ("expand=2 head_dim=16", "E0211")])
def test_bad_options_are_diagnostics(option, code):
    text = SPEC.format(layers=1, groups=1, chunk=8, extra="").replace("heads=4", "heads=4 " + option if not option.startswith("heads") else option)
    with pytest.raises(cyclelang.CycleError) as err:
        cyclelang.parse(text)
    assert code in {d.code for d in err.value.diagnostics}


def test_the_stand_decodes_the_library_spec_through_its_cache():
    report = cyclelang.fire(cyclelang.load(ROOT / "specs" / "mamba2.cycle"), width=32, depth=2, seq=16, batch=2)
    kv = {c.name: c for c in report.runs[0].checks}["kv_cache"]
    assert kv.status == "pass" and "163,200 bytes after 4 positions and 163,200 after 12" in kv.detail


def test_the_report_shows_a_flat_state_against_a_growing_cache():
    ssm = analyze(cyclelang.load(ROOT / "specs" / "mamba2.cycle"))["scaling"]
    gpt = analyze(cyclelang.load(ROOT / "specs" / "gpt2.cycle"))["scaling"]
    assert ssm["recurrent"] == ["ssm"] and ssm["exponents"]["state_bytes"] == 0 and ssm["exponents"]["attention_flops"] == 1
    assert gpt["exponents"]["state_bytes"] == 1 and gpt["exponents"]["attention_flops"] == 2
    s = ir.layout.layout(cyclelang.load(ROOT / "specs" / "mamba2.cycle")).part_of("stages.0.mix.ssm.D")
    assert {r["state_bytes"] for r in ssm["rows"]} == {24 * 2 * s.kind.state(s.node, 1)}
    assert all(set(r["mixing_flops_per_token"]) == {"ssm"} for r in ssm["rows"])


def test_a_hybrids_kv_note_speaks_of_its_fixed_state():
    text = """
engine hyb {
  chamber width=1024
  throat causal
  feed tokens vocab=1000 context=2048 position=none
  stage a x 3 { prechamber mix { norm rmsnorm  turbine ssm heads=8 state=16  merge cooling } }
  stage b x 16 { prechamber mix { norm rmsnorm  turbine attention heads=16 rotary bias=false  merge cooling } }
  norm rmsnorm
  nozzle head
}
"""
    note = next(d for d in review(cyclelang.parse(text)) if d.code == "N103")
    assert any("ssm mixers keep a fixed state of" in n and "only attention's cache grows" in n for n in note.notes)


@pytest.mark.slow  # builds GPT-2 at full size
def test_interop_refuses_a_checkpoint_that_differs():
    """Loading is checked by construction: the config implies an engine, compared field by field with the spec's."""
    from cyclelang.interop import InteropError, convert_state_dict, load_transformers

    with pytest.raises(InteropError, match=r"stages\.0\.mix\.ssm: dt lo .*spec 0, checkpoint 0\.05"):
        load_transformers(cyclelang.build(_spec()), _hf(time_step_limit=(0.05, 0.5)))
    with pytest.raises(InteropError, match=r"stages\.0\.mix\.ssm: .*eps.*spec 1e-06, checkpoint 1e-05"):
        load_transformers(cyclelang.build(_spec(extra="eps=1e-6")), _hf())  # the gated norm's eps
    with pytest.raises(InteropError, match="layers.*spec 3, checkpoint 2"):
        load_transformers(cyclelang.build(_spec(layers=3)), _hf(layers=2))
    attention = cyclelang.build(cyclelang.load(ROOT / "specs" / "gpt2.cycle").model_copy())
    with pytest.raises(InteropError, match="implies another engine"):
        load_transformers(attention, _hf())
    hf = _hf()  # the weight mapping on its own (below the check) names the missing mixer
    with pytest.raises(InteropError, match="no ssm turbine"):
        convert_state_dict(hf.state_dict(), attention.state_dict(), hf.config.to_dict(), spec=attention.spec)


def test_import_writes_the_spec_a_mamba2_config_implies():
    from cyclelang.interop import implied_engine, import_config
    from cyclelang.interop.compare import difference

    hf = _hf(time_step_limit=(0.05, 0.5))
    text = import_config(hf.config)
    assert "turbine ssm heads=4 head_dim=16 state=8 groups=2" in text and "dt_lo=0.05 dt_hi=0.5" in text
    assert difference(_spec(extra="dt_lo=0.05 dt_hi=0.5").engine, implied_engine(hf.config.to_dict())) is None
    ours = cyclelang.interop.load_transformers(cyclelang.build(cyclelang.parse(text)), hf).eval()
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(5))
    assert _rel(ours(idx), hf(idx).logits) < 1e-5
