"""Latent attention (`turbine attention latent=`) and a DeepSeek-V2-style engine against
transformers' DeepseekV2ForCausalLM (eager attention), built from a tiny random config
with perturbed weights: logits, loss, gradients, greedy decoding, parameters; the cache
keeps the latent and the shared rotary key, and its bytes are what the kinds record says.
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

ATTN = "turbine attention heads=4 latent=16 {q} head_dim=8 rotary_dims=4 v_dim=6 bias=false"
SPEC = """
engine ds {{
  chamber width=32
  throat causal
  feed tokens vocab=50 context=64 position=none
  stage dense {{
    prechamber mix {{ norm rmsnorm  {attn} }}
    prechamber burn {{ norm rmsnorm  turbine mlp hidden=48 act=swiglu bias=false }}
  }}
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  {attn} }}
    fullflow {{
      norm rmsnorm
      prechamber routed {{ turbine moe experts=4 top={top} hidden=16 act=swiglu bias=false normalize=false }}
      prechamber shared {{ turbine mlp hidden={shared} act=swiglu bias=false }}
    }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def _spec(q_latent=24, top=2, shared=1):
    attn = ATTN.format(q=f"q_latent={q_latent}" if q_latent else "")
    return cyclelang.parse(SPEC.format(attn=attn, top=top, shared=16 * shared))


def _hf(q_latent=24, top=2, shared=1):
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    cfg = DeepseekV2Config(vocab_size=50, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_latent, kv_lora_rank=16, qk_nope_head_dim=8,
                           qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=4, n_shared_experts=shared, num_experts_per_tok=top,
                           first_k_dense_replace=1, tie_word_embeddings=False, max_position_embeddings=64,
                           pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    torch.manual_seed(0)
    model = DeepseekV2ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


ATTN_NAMES = ("q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight", "q_proj.weight", "kv_a_proj_with_mqa.weight",
              "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight")


def _load(ours, hf):
    """DeepseekV2's names onto the engine's: the attention's own names are the same."""
    src = hf.state_dict()
    out = {"feed.tok.weight": src["model.embed_tokens.weight"], "norm.weight": src["model.norm.weight"], "head.weight": src["lm_head.weight"]}
    for i in range(3):
        h, s = f"model.layers.{i}.", f"stages.{i}."
        out[s + "mix.norm.weight"] = src[h + "input_layernorm.weight"]
        for n in ATTN_NAMES:
            if h + "self_attn." + n in src:
                out[s + "mix.attn." + n] = src[h + "self_attn." + n]
        cat = lambda m: torch.cat((src[m + "gate_proj.weight"], src[m + "up_proj.weight"]))  # noqa: E731  rows [gate | up]
        if i == 0:
            out[s + "burn.norm.weight"] = src[h + "post_attention_layernorm.weight"]
            out[s + "burn.mlp.fc.weight"], out[s + "burn.mlp.proj.weight"] = cat(h + "mlp."), src[h + "mlp.down_proj.weight"]
            continue
        out[s + "norm.weight"] = src[h + "post_attention_layernorm.weight"]  # the fullflow's one valve
        out[s + "routed.moe.router.weight"] = src[h + "mlp.gate.weight"]
        for e in range(4):
            out[s + f"routed.moe.experts.{e}.fc.weight"] = src[h + "mlp.experts.gate_up_proj"][e]
            out[s + f"routed.moe.experts.{e}.proj.weight"] = src[h + "mlp.experts.down_proj"][e]
        out[s + "shared.mlp.fc.weight"] = cat(h + "mlp.shared_experts.")
        out[s + "shared.mlp.proj.weight"] = src[h + "mlp.shared_experts.down_proj.weight"]
    ours.load_state_dict(out, strict=True)
    return ours


def _pair(**kw):
    hf = _hf(**kw)
    return _load(cyclelang.build(_spec(**kw)), hf).eval(), hf


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("kw", [{}, {"q_latent": None}, {"top": 1, "shared": 2}], ids=["q-latent", "full-rank-q", "top1-two-shared"])
def test_logits_loss_and_gradients_equal_deepseek_v2(kw):
    ours, hf = _pair(**kw)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) == analyze(_spec(**kw))["params"]["total"]
    idx = torch.randint(0, 50, (2, 17), generator=torch.Generator().manual_seed(2))
    want = hf(idx, labels=idx)
    logits, loss = ours(idx, targets=torch.cat([idx[:, 1:], torch.full((2, 1), -1)], dim=1))
    assert _rel(logits, want.logits) < 1e-5
    assert abs(loss.item() - want.loss.item()) < 1e-5 * want.loss.item()
    loss.backward()
    want.loss.backward()
    theirs = dict(hf.named_parameters())
    for n in ATTN_NAMES:
        if "model.layers.1.self_attn." + n in theirs:
            assert _rel(dict(ours.named_parameters())["stages.1.mix.attn." + n].grad, theirs["model.layers.1.self_attn." + n].grad) < 1e-5, n
    assert _rel(ours.stages[1].routed.moe.router.weight.grad, theirs["model.layers.1.mlp.gate.weight"].grad) < 1e-5
    assert _rel(ours.feed.tok.weight.grad, theirs["model.embed_tokens.weight"].grad) < 1e-5


def test_greedy_decoding_equals_deepseek_v2_and_recomputation():
    ours, hf = _pair()
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(3))
    mine = ours.generate(prompt, 20, temperature=0)
    assert torch.equal(mine, ours.generate(prompt, 20, temperature=0, use_cache=False))
    assert torch.equal(mine, hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False))


def test_the_cache_keeps_the_latent():
    ours, _ = _pair()
    Cache = sys.modules[type(ours).__module__].Cache
    idx = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(4))
    full = ours(idx)
    cache = Cache()
    parts = [ours(idx[:, :9], cache=cache), ours(idx[:, 9:20], cache=cache)] + [ours(idx[:, t : t + 1], cache=cache) for t in range(20, 30)]
    assert _rel(torch.cat(parts, dim=1), full) < 1e-5
    held = cache.state[ours.stages[1].mix.attn]
    assert [tuple(t.shape) for t in held] == [(2, 1, 64, 16), (2, 1, 64, 4)]  # the latent and the shared rotary key, the whole context reserved
    part = ir.layout.layout(_spec()).part_of("stages.1.mix.attn.kv_b_proj.weight")
    assert part.kind.state(part.node, 64) == 64 * (16 + 4)  # per token: latent + rotary, not heads x head_dim x 2 = 64
    assert cache.nbytes() == 3 * 2 * 4 * part.kind.state(part.node, 64)  # 3 layers, batch 2, float32


def test_the_kinds_record_is_what_the_model_holds_and_runs():
    from torch.utils.flop_counter import FlopCounterMode

    for q_latent in (24, None):
        spec = _spec(q_latent=q_latent)
        model = cyclelang.build(spec)
        part = ir.layout.layout(spec).part_of("stages.0.mix.attn.o_proj.weight")
        assert part.role == "mixer" and part.kind.keyword == "attention" and part.kind.state_kind == "kv"
        attn = model.stages[0].mix.attn
        assert part.params == sum(p.numel() for p in attn.parameters())
        T = 9
        rope = (model.rope_cos[:T], model.rope_sin[:T])
        counter = FlopCounterMode(display=False)
        with counter:
            attn(torch.randn(1, T, 32), rope, None)
        assert counter.get_total_flops() == T * sum(part.kind.flops(part.node, T))


def test_the_library_spec_and_its_report():
    spec = cyclelang.load(ROOT / "specs" / "deepseek_v2.cycle")
    rep = analyze(spec)
    mla = ir.layout.layout(spec).part_of("stages.1.mix.attn.kv_b_proj.weight").node
    assert isinstance(mla, ir.LatentAttention)
    per_token = rep["scaling"]["kv_bytes_per_token"]
    assert per_token == 6 * (mla.latent + mla.rotary_dims) * 2 == 1920  # 6 layers x (128 + 32) values x 2 bytes
    assert per_token * 6.4 == 6 * 2 * mla.heads * 64 * 2  # multi-head attention of the same heads would keep 6.4x more
    assert "N103" not in {d.code for d in review(spec)}  # the latent is the answer N103 asks for
    assert "latent injector" in cyclelang.draw(spec).source


def test_bad_latent_options_are_diagnostics():
    for text, code in [(ATTN.format(q="").replace("rotary_dims=4", "rotary_dims=3"), "E0233"),
                       (ATTN.format(q="kv_heads=2"), "E0201")]:
        with pytest.raises(cyclelang.CycleError) as err:
            cyclelang.parse(SPEC.format(attn=text, top=2, shared=16))
        assert code in {d.code for d in err.value.diagnostics}


def test_the_stand_fires_a_scale_model_and_decodes_through_the_latent_cache():
    spec = cyclelang.load(ROOT / "specs" / "deepseek_v2.cycle")
    small = ir.passes.shrink(spec, width=64, depth=2)
    mla = ir.layout.layout(small).part_of("stages.1.mix.attn.kv_b_proj.weight").node
    assert (mla.width, mla.heads, mla.head_dim, mla.rotary_dims, mla.latent) == (64, 8, 8, 4, 16)
    report = cyclelang.fire(spec, width=64, depth=2, seq=16, batch=2)
    checks = {c.name: c.status for c in report.runs[0].checks}
    assert not report.failed and checks["causal"] == checks["kv_cache"] == "pass"


@pytest.mark.parametrize("q_latent", [24, None])
def test_absorbed_decoding_equals_the_expanded_path(q_latent):
    """Decoding one token, the query absorbs kv_b_proj's key half and the output its value half,
    so the latent past is read as it is: the same numbers as expanding it to keys and values
    (exactly so in float64, to rounding in float32), and never an expansion of the past."""
    ours, _ = _pair(q_latent=q_latent)
    Cache = sys.modules[type(ours).__module__].Cache
    attn = ours.stages[1].mix.attn
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        attn.to(dtype)
        x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(7), dtype=dtype)
        rope = lambda a, b: (ours.rope_cos[a:b].to(dtype), ours.rope_sin[a:b].to(dtype))  # noqa: E731
        absorbed, expanded = Cache(length=13), Cache(length=13)
        with torch.no_grad():
            attn(x[:, :11], rope(0, 11), absorbed)
            absorbed.pos = 11
            one = attn(x[:, 11:12], rope(11, 12), absorbed)  # T == 1 after a cache: the absorbed form
            attn(x[:, :10], rope(0, 10), expanded)
            expanded.pos = 10
            two = attn(x[:, 10:12], rope(10, 12), expanded)  # T == 2 after a cache: the latent expanded, a causal mask
        assert ((one[:, 0] - two[:, 1]).abs().max() / two[:, 1].abs().max()).item() < tol, dtype
    attn.to(torch.float32)
    calls = []
    hook = attn.kv_b_proj.register_forward_hook(lambda m, a, out: calls.append(a[0].shape) and None)
    with torch.no_grad():
        ours.generate(torch.zeros(1, 3, dtype=torch.long), 4, temperature=0)
    hook.remove()
    assert calls == [torch.Size([1, 3, 16])]  # kv_b_proj runs on the prompt only: decoding steps never expand the past
