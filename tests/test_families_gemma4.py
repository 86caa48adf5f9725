"""Gemma 4's text decoder (gemma4_text, families_gemma4.py): its round trip at tiny configs where every
option of its own changes the output, the language's Gemma 4 options (rotary_spread, v_norm, k_eq_v,
per-layer inputs) against float64 references written here from the equations, each quirk shown to
matter, and what is refused by name."""

from __future__ import annotations


import re

import pytest

from .conftest import need
from .roundtrip import V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")

import cyclelang  # noqa: E402
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402

F = torch.nn.functional


def gemma4(**o):
    """A tiny gemma4_text: 5 layers, local local global local global; the global layers' heads twice as wide, with
    their own KV heads and keys for values (K = V) and a proportional rope on half their pairs; a window of 5 < 12
    tokens; per-layer inputs 8 wide from a table of its own size."""
    c = dict(vocab_size=V, hidden_size=48, intermediate_size=40, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True, max_position_embeddings=64,
             sliding_window=5, layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             hidden_size_per_layer_input=8, vocab_size_per_layer_input=V, rms_norm_eps=1e-5, tie_word_embeddings=False,
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                              "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000.0}})
    c.update(o)
    return transformers.Gemma4TextConfig(**c)


def gemma4_plain():
    """Without per-layer inputs or K = V, tied, a final soft-cap, the default pattern (one global layer in six, the last forced
    global), the global layers' proportional rope over every pair (the plain rotary), eps 1e-6, biased projections."""
    return gemma4(num_hidden_layers=7, layer_types=None, attention_bias=True, hidden_size_per_layer_input=0, attention_k_eq_v=False, tie_word_embeddings=True,
                  final_logit_softcapping=5.0, rms_norm_eps=1e-6, global_head_dim=12, num_global_key_value_heads=None,
                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 1.0, "rope_theta": 500.0}})


def gemma4_shared():
    """KV sharing over the last 3 of 7 layers (local global local local | global local global): each reads the keys and values
    of the last earlier layer of its type (layer 3's, layer 1's, K = V), its MLP twice as wide (use_double_wide_mlp)."""
    return gemma4(num_hidden_layers=7, num_kv_shared_layers=3, use_double_wide_mlp=True,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention",
                               "sliding_attention", "full_attention"])


def gemma4_unified(**o):
    """Gemma 4 unified's text decoder: Gemma 4's layers without per-layer inputs; K = V global layers with their own head
    size and KV heads, KV sharing over the last 2 of 6 layers, a window of 4."""
    c = dict(vocab_size=V, hidden_size=48, intermediate_size=40, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True, max_position_embeddings=64,
             sliding_window=4, num_kv_shared_layers=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                              "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000.0}})
    c.update(o)
    return transformers.Gemma4UnifiedTextConfig(**c)


CONFIGS = {"gemma4_text": gemma4, "gemma4_text_plain": gemma4_plain, "gemma4_text_shared": gemma4_shared,
           "gemma4_unified_text": gemma4_unified}  # tests/test_closed_world.py's property runs over them too


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, CONFIGS[name]())


def test_the_default_config_imports_as_the_library_spec():
    from .conftest import ROOT

    text = import_config(transformers.Gemma4TextConfig().to_dict())
    assert "per_layer=256" in text and "head_dim=512 rotary=0.25 rotary_spread rotary_base=1000000" in text and " v_norm " in text
    lib = (ROOT / "specs" / "families" / "gemma4_text.cycle").read_text()
    assert lib == text.replace("imported from config.json", "imported from transformers' default gemma4_text config", 1)


# --- the quirks: each edited out, the same weights compute something else ----------------------------


QUIRKS = {  # config, the spec's words for the quirk, the words without it
    "proportional rope": (gemma4, " rotary_spread", ""),
    "values normed": (gemma4, " v_norm", ""),
    "unscaled logits": (gemma4, " scale=1 ", " "),
    "sliding window": (gemma4, " window=5", ""),
    "the global layers' rotary base": (gemma4, " rotary_base=1000 ", " "),
    "per-layer inputs' norm eps": (lambda: gemma4(rms_norm_eps=0.5), " per_layer_eps=0.5", " per_layer_eps=1e-06"),
    "final soft-cap": (gemma4_plain, " softcap=5", ""),
}


@pytest.mark.parametrize("case", sorted(QUIRKS))
def test_the_quirk_matters(case):
    config, old, new = QUIRKS[case]
    ref = hf(config())
    text = import_config(ref.config.to_dict())
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        assert old in text, old
        wrong = build(cyclelang.parse(text.replace(old, new)), seed=0).eval()
        wrong.load_state_dict(ours.state_dict())
        assert rel(wrong(idx), ref(idx).logits) > 1e-3


def test_kv_sharing_reads_the_last_storing_layer():
    """The shared layers read the keys and values of the last earlier layer of their type: stored by layer 2 instead of
    layer 3, the same weights compute something else; a slot read before any layer stores it, or at another shape, is an error."""
    from cyclelang.diagnostics import CycleError

    ref = hf(gemma4_shared())
    text = import_config(ref.config.to_dict())
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    idx = ids()
    assert re.search(r"stage layers_2 = gemma4_text_local +#", text) and "stage layers_3 = gemma4_text_local_store" in text
    moved = re.sub(r"stage layers_2 = gemma4_text_local +#", "stage layers_2 = gemma4_text_local_store  #", text)
    moved = moved.replace("stage layers_3 = gemma4_text_local_store", "stage layers_3 = gemma4_text_local")
    wrong = build(cyclelang.parse(moved), seed=0).eval()
    wrong.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        assert rel(wrong(idx), ref(idx).logits) > 1e-3
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    for bad in (text.replace("kv_reuse=2", "kv_reuse=1"), text.replace(" kv_store=1", "")):
        with pytest.raises(CycleError) as e:
            cyclelang.parse(bad)
        assert "KV slot" in str(e.value)


def test_kv_sharing_with_biased_projections():
    """A shared layer keeps its q and o biases (its k and v are the storing layer's, biases and all)."""
    ref = hf(gemma4(num_hidden_layers=7, num_kv_shared_layers=3, attention_bias=True, layer_types=gemma4_shared().layer_types))
    ours = load_transformers(build(cyclelang.parse(import_config(ref.config.to_dict())), seed=0).eval(), ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())


def test_per_layer_inputs_are_read_in_the_order_the_layers_run():
    """Each layer's gate reads its own slice: handing every layer the first one computes something else."""
    ref = hf(gemma4())
    ours = load_transformers(build(cyclelang.parse(import_config(ref.config.to_dict())), seed=0).eval(), ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        gates = [m for m in ours.modules() if hasattr(m, "per_layer_index")]
        assert [m.per_layer_index for m in gates] == list(range(5))
        for m in gates:
            m.per_layer_index = 0
        assert rel(ours(idx), ref(idx).logits) > 1e-3


def test_the_global_layers_keys_are_their_values():
    """K = V: the global layers have no value rows; their values are the keys' projection normed without a gain."""
    ref = hf(gemma4())
    assert not hasattr(ref.model.layers[2].self_attn, "v_proj") or ref.model.layers[2].self_attn.v_proj is None
    spec = cyclelang.parse(import_config(ref.config.to_dict()))
    ours = build(spec, seed=0)
    qkv = dict(ours.named_parameters())
    assert qkv["stages.1.stages.1.mix.attn.qkv.weight"].shape == ((4 + 1) * 16, 48)  # q (4 heads) and k (1 head), 16 wide
    assert qkv["stages.0.mix.attn.qkv.weight"].shape == ((4 + 2 + 2) * 8, 48)


# --- refused by name ----------------------------------------------------------------------------------


REFUSED = {
    "kv sharing without a storing layer": (dict(num_kv_shared_layers=3), "num_kv_shared_layers"),  # layers 2-4: a global among them, none before
    "moe block": (dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16), "enable_moe_block"),
    "bidirectional": (dict(use_bidirectional_attention="all"), "use_bidirectional_attention"),
    "yarn": (dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                   "full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1000.0}}), "rope_parameters.full_attention.rope_type"),
    "proportional factor": (dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                                  "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0,
                                                                     "rope_theta": 1000.0}}), "rope_parameters.full_attention.factor"),
    "default partial": (dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5},
                                              "full_attention": {"rope_type": "proportional", "rope_theta": 1000.0}}),
                        "rope_parameters.sliding_attention.partial_rotary_factor"),
    "flat rope": (dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0}), "rope_parameters"),
    "gelu_fast": (dict(hidden_activation="gelu_fast"), "hidden_activation"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_option_the_language_cannot_say_is_refused_by_name(case):
    over, key = REFUSED[case]
    config = {**gemma4().to_dict(), **over}
    if "rope_parameters" in over or "num_kv_shared_layers" in over:  # as a file written by hand: no per_layer_config computed for it
        config.pop("per_layer_config", None)
    with pytest.raises(Unsupported) as e:
        read_config(config)
    assert e.value.field == key, e.value


def test_per_layer_overrides_other_than_head_size_are_refused():
    config = {**gemma4().to_dict(), "per_layer_config": {"2": {"head_dim": 16, "sliding_window": 3}}}
    with pytest.raises(Unsupported) as e:
        read_config(config)
    assert e.value.field == "per_layer_config.2"


def test_each_layers_scalar_loads_and_matters(tmp_path):
    """layer_scalar (a buffer, 1 as initialised) multiplies the stream at each layer's end: a checkpoint's own values load into
    `norm scalar` and give transformers' logits; without the gains the same weights compute something else; export writes them."""
    ref = hf(gemma4())
    with torch.no_grad():
        for i, layer in enumerate(ref.model.layers):
            layer.layer_scalar.fill_(0.5 + 0.2 * i)
    text = import_config(ref.config.to_dict())
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        assert [round(m.gain.item(), 6) for m in ours.modules() if type(m).__name__ == "ScalarGain"] == [0.5, 0.7, 0.9, 1.1, 1.3]
        wrong = build(cyclelang.parse(text.replace("  norm scalar  # layer_scalar: the stream times a fixed number the weights bring\n", "")), seed=0).eval()
        wrong.load_state_dict(ours.state_dict(), strict=False)
        assert rel(wrong(idx), ref(idx).logits) > 1e-3
    from cyclelang.interop import export

    out = tmp_path / "out"
    export(ours.spec, ours.state_dict(), out)
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert rel(back(idx).logits, ref(idx).logits) < 1e-5


# --- the language's options against float64 references written from the equations ---------------------


SPEC = """
engine attn {
  chamber width=24
  throat causal
  feed tokens vocab=40 context=32 position=none
  stage block {
    prechamber mix {
      turbine attention heads=4 kv_heads=2 head_dim=OPTS bias=false
    }
  }
  nozzle head
}
"""


def _rms(x, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()


def _reference_attention(p, x, heads, kv, hd, rot, base, spread, k_eq_v, v_norm, scale):
    """Causal attention in float64 from the equations: q, k (and v) projections, per-head RMSNorms on q and k (gain w), on v
    without a gain, rotary on pairs (i, i + hd/2) for i < rot/2 at base^(-2i/hd) (spread) or on the first rot dims at
    base^(-2i/rot), softmax(scale q.k) v, the output projection."""
    T = x.size(0)
    W = p["qkv.weight"]
    q = (x @ W[: heads * hd].T).view(T, heads, hd)
    k = (x @ W[heads * hd : (heads + kv) * hd].T).view(T, kv, hd)
    v = k.clone() if k_eq_v else (x @ W[(heads + kv) * hd :].T).view(T, kv, hd)
    q, k = _rms(q, 1e-6) * p["q_norm.weight"], _rms(k, 1e-6) * p["k_norm.weight"]
    if v_norm:
        v = _rms(v, 1e-6)
    pos = torch.arange(T, dtype=torch.float64)[:, None, None]
    if spread:
        idx = [(i, i + hd // 2, base ** (-2 * i / hd)) for i in range(rot // 2)]
    else:
        idx = [(i, i + rot // 2, base ** (-2 * i / rot)) for i in range(rot // 2)]

    def turn(t):
        out = t.clone()
        for a, b, f in idx:
            c, s = torch.cos(pos[..., 0] * f), torch.sin(pos[..., 0] * f)
            out[..., a] = t[..., a] * c - t[..., b] * s
            out[..., b] = t[..., b] * c + t[..., a] * s
        return out

    q, k = turn(q), turn(k)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    s = torch.einsum("thd,shd->hts", q, k) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, heads * hd)
    return y @ p["proj.weight"].T


@pytest.mark.parametrize("opts", ["8 rotary=0.5 rotary_spread rotary_base=50 qk_norm v_norm k_eq_v scale=1",
                                  "8 rotary=0.5 rotary_spread rotary_base=50 qk_norm",
                                  "6 rotary rotary_base=50 qk_norm v_norm scale=0.3",
                                  "8 rotary=0.5 rotary_base=50 qk_norm k_eq_v"])
def test_gemma4_attention_against_its_equations(opts):
    spec = cyclelang.parse(SPEC.replace("OPTS", opts))
    model = build(spec, seed=0).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hd = int(opts.split()[0])
    rot = hd if " rotary " in opts + " " and "rotary=" not in opts else hd // 2
    scale = 1.0 if "scale=1" in opts else 0.3 if "scale=0.3" in opts else hd ** -0.5
    idx = torch.randint(0, 40, (1, 10), generator=torch.Generator().manual_seed(3))
    attn = {k.removeprefix("stages.0.mix.attn."): v for k, v in model.state_dict().items() if k.startswith("stages.0.mix.attn.")}
    x = model.state_dict()["feed.tok.weight"][idx[0]]
    y = x + _reference_attention(attn, x, 4, 2, hd, rot, 50.0, "rotary_spread" in opts, "k_eq_v" in opts, "v_norm" in opts, scale)
    want = y @ model.state_dict()["head.weight"].T
    with torch.no_grad():
        got = model(idx)[0]
        assert (got - want).abs().max().item() < 1e-6 * want.abs().max().item()  # the rotary tables are computed in float32
        step, cache = [], cyclelang_cache(model)  # decoding with the cache, token by token: the same
        for t in range(10):
            step.append(model(idx[:, t : t + 1], cache=cache)[0])
        assert (torch.cat(step) - want).abs().max().item() < 1e-6 * want.abs().max().item()  # the rotary tables are computed in float32


def cyclelang_cache(model):
    import sys

    return sys.modules[type(model).__module__].Cache(32)


PLE = """
engine ple {
  chamber width=12
  throat causal
  feed tokens vocab=30 context=16 position=none scale=3 per_layer=4 per_layer_vocab=20 per_layer_eps=0.01
  stage block x 3 {
    prechamber burn {
      norm rmsnorm
      turbine mlp hidden=10 act=geglu bias=false
    }
    prechamber ple {
      turbine mlp hidden=4 act=gelu_tanh per_layer bias=false
      norm rmsnorm eps=0.001
    }
  }
  nozzle head
}
"""


def test_per_layer_inputs_against_their_equations():
    """The feed: (norm(W_p e * d^-0.5)_l + E_l[t] * sqrt(P)) * 2^-0.5 per layer l; each layer after its MLP
    x + norm(W_up(gelu_tanh(W_gate x) * input_l))."""
    model = build(cyclelang.parse(PLE), seed=0).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    sd = model.state_dict()
    idx = torch.randint(0, 20, (1, 7), generator=torch.Generator().manual_seed(5))
    e = sd["feed.tok.weight"][idx[0]] * 3.0
    proj = (e @ sd["feed.per_layer_proj.weight"].T * 12 ** -0.5).view(7, 3, 4)
    proj = _rms(proj, 0.01) * sd["feed.per_layer_norm.weight"]
    tok = sd["feed.per_layer_tok.weight"][idx[0]].view(7, 3, 4) * 2.0
    ple = (proj + tok) * 2 ** -0.5
    x = e
    for i in range(3):
        s = f"stages.{i}."
        h = _rms(x, 1e-6) * sd[s + "burn.norm.weight"]
        gate, up = (h @ sd[s + "burn.mlp.fc.weight"].T).chunk(2, -1)
        x = x + (F.gelu(gate) * up) @ sd[s + "burn.mlp.proj.weight"].T
        g = F.gelu(x @ sd[s + "ple.mlp.fc.weight"].T, approximate="tanh") * ple[:, i]
        x = x + _rms(g @ sd[s + "ple.mlp.proj.weight"].T, 1e-3) * sd[s + "ple.norm.weight"]
    want = x @ sd["head.weight"].T
    with torch.no_grad():
        got = model(idx)[0]
    assert (got - want).abs().max().item() < 1e-6 * want.abs().max().item()  # the rotary tables are computed in float32


def test_the_report_counts_what_the_options_hold():
    """Parameters: K = V drops the value rows; the feed holds the per-layer table, projection and norm."""
    from cyclelang.ir.kinds import kind_of

    spec = cyclelang.parse(PLE)
    model = build(spec, seed=0)
    e = spec.engine
    assert kind_of(e.feed).params(e.feed, 12) == 30 * 12 + (20 + 12) * 3 * 4 + 4
    total = sum(p.numel() for p in model.parameters())
    from cyclelang.ir.layout import layout

    assert total == sum(p.params * p.repeat for p in layout(e).parts())
    for opts in ("8 rotary qk_norm v_norm k_eq_v", "8 rotary qk_norm v_norm"):
        s = cyclelang.parse(SPEC.replace("OPTS", opts))
        assert sum(p.numel() for p in build(s, seed=0).parameters()) == sum(p.params * p.repeat for p in layout(s.engine).parts())


@pytest.mark.parametrize("bad, code", [
    ("rotary_spread bias=false", "rotary_spread"),
    ("rotary rotary_interleaved rotary_spread bias=false", "rotary_spread"),
    ("rotary v_norm bias=false", "v_norm"),
])
def test_misused_options_are_refused(bad, code):
    from cyclelang.diagnostics import CycleError

    with pytest.raises(CycleError) as e:
        cyclelang.parse(SPEC.replace("OPTS", "8 " + bad.replace(" bias=false", "")))
    assert code in str(e.value)


def test_per_layer_width_must_match_the_mlps():
    from cyclelang.diagnostics import CycleError

    with pytest.raises(CycleError):
        cyclelang.parse(PLE.replace("per_layer=4", "per_layer=5"))
    with pytest.raises(CycleError):
        cyclelang.parse(PLE.replace(" per_layer=4 per_layer_vocab=20 per_layer_eps=0.01", ""))


SHARED = """
engine kv {
  chamber width=24
  throat causal
  feed tokens vocab=40 context=32 position=none
  stage own x 2 {
    prechamber mix {
      turbine attention heads=4 kv_heads=2 head_dim=8 WINDOW rotary rotary_base=50 qk_norm v_norm kv_store=1 bias=false
    }
  }
  stage reader x 2 {
    prechamber mix {
      turbine attention heads=4 kv_heads=2 head_dim=8 WINDOW rotary rotary_base=50 qk_norm kv_reuse=1 bias=false
    }
  }
  nozzle head
}
"""


@pytest.mark.parametrize("window", ["", "window=3"])
def test_kv_sharing_against_its_equations(window):
    """Each reader attends with its own queries over the keys and values the last storing layer computed (the second of
    `own`), in float64; decoding with the cache, token by token, gives the same; the readers hold no cache of their own."""
    spec = cyclelang.parse(SHARED.replace("WINDOW", window))
    model = build(spec, seed=0).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    sd = model.state_dict()
    T, W = 9, int(window.split("=")[1]) if window else None
    idx = torch.randint(0, 40, (1, T), generator=torch.Generator().manual_seed(4))
    x = sd["feed.tok.weight"][idx[0]]
    pos = torch.arange(T, dtype=torch.float64)[:, None, None]
    f = 50.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    c, s = torch.cos(pos * f).repeat(1, 1, 2), torch.sin(pos * f).repeat(1, 1, 2)

    def turn(t):
        return t * c + torch.cat((-t[..., 4:], t[..., :4]), -1) * s

    seen = torch.ones(T, T, dtype=torch.bool).tril()
    if W:
        seen &= ~torch.ones(T, T, dtype=torch.bool).tril(-W)

    def attend(p, q, k, v):
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        a = (torch.einsum("thd,shd->hts", q, k) * 8 ** -0.5).masked_fill(~seen, float("-inf")).softmax(-1)
        return torch.einsum("hts,shd->thd", a, v).reshape(T, 32) @ sd[p + "proj.weight"].T

    kv = None
    for i in range(4):
        p = f"stages.{i}.mix.attn."
        q = turn(_rms((x @ sd[p + "qkv.weight"][:32].T).view(T, 4, 8), 1e-6) * sd[p + "q_norm.weight"])
        if i < 2:
            k = turn(_rms((x @ sd[p + "qkv.weight"][32:48].T).view(T, 2, 8), 1e-6) * sd[p + "k_norm.weight"])
            kv = (k, _rms((x @ sd[p + "qkv.weight"][48:].T).view(T, 2, 8), 1e-6))
        x = x + attend(p, q, *kv)
    want = x @ sd["head.weight"].T
    with torch.no_grad():
        got = model(idx)[0]
        cache = cyclelang_cache(model)
        step = torch.cat([model(idx[:, t : t + 1], cache=cache)[0] for t in range(T)])
    for out in (got, step):
        assert (out - want).abs().max().item() < 1e-6 * want.abs().max().item()  # the rotary tables are computed in float32
    from cyclelang.ir.kinds import kind_of
    from cyclelang.ir.layout import layout

    attn = [p.node for p in layout(spec.engine).parts() if p.path.endswith("mix.attn")]
    assert [kind_of(a).state(a, 4096) for a in attn] == [2 * 2 * 8 * (W or 4096), 0]
    assert sum(p.numel() for p in model.parameters()) == sum(p.params * p.repeat for p in layout(spec.engine).parts())
