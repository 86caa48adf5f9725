"""The short-convolution families (interop/families/conv.py): LFM2 (lfm2), LFM2-MoE (lfm2_moe) and LFM3 (lfm3).

Each family's round trip (tests/roundtrip.py) at a tiny config where the short conv's taps matter (conv_L_cache > 1
over 12 tokens), conv layers among attention layers, GQA, a non-default eps and rotary base, conv_bias on and off;
LFM2's adjusted MLP width (2/3, the multiplier, the rounding); LFM2-MoE's sigmoid router with its selection-only
expert bias, its scale and its first dense layers; LFM3's sandwich norms, biased Qwen3 attention, sliding layers with a
window below 12 tokens and a rotary base per layer type. Then each quirk is shown to matter (the spec with it edited out
computes other logits), and each option the language cannot say is refused by name.
"""

from __future__ import annotations

import pytest

import cyclelang

from .conftest import need
from .roundtrip import V, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402

_TYPES = ["conv", "full_attention", "conv", "conv", "full_attention"]


def _lfm2(**kw):
    base = dict(vocab_size=V, hidden_size=48, intermediate_size=72, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
                conv_L_cache=3, conv_bias=True, layer_types=_TYPES, max_position_embeddings=40, norm_eps=1e-5,
                block_multiple_of=16, block_ffn_dim_multiplier=1.5, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Lfm2Config(**{**base, **kw})


def _lfm2_moe(**kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=40, moe_intermediate_size=12, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=1, conv_L_cache=4, conv_bias=False, layer_types=["conv", "conv", "full_attention", "conv"],
                max_position_embeddings=40, norm_eps=1e-5, num_dense_layers=1, num_experts=8, num_experts_per_tok=2,
                use_expert_bias=True, routed_scaling_factor=2.5, norm_topk_prob=False,
                rope_parameters={"rope_type": "default", "rope_theta": 8000.0}, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Lfm2MoeConfig(**{**base, **kw})


_LFM3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 7000.0}, "full_attention": {"rope_type": "default", "rope_theta": 90000.0}}


def _lfm3(**kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                head_dim=12, conv_L_cache=3, max_position_embeddings=40, sliding_window=5, use_attention_gate=False, attention_bias=True,
                norm_eps=1e-5, rope_parameters=_LFM3_ROPE, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.Lfm3Config(**{**base, **kw})


def _spread_expert_bias(model, seed=8):
    """transformers leaves expert_bias zero: spread it, so that it changes which experts are chosen."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=gen))
    return model


@pytest.fixture
def spread_expert_bias(monkeypatch):
    from . import roundtrip

    plain = roundtrip._HF
    monkeypatch.setattr(roundtrip, "hf", lambda config, seed=1: _spread_expert_bias(plain(config, seed)))


FAMILIES = {
    "lfm2": lambda: _lfm2(),
    "lfm2_idxs_untied_plain_width": lambda: _lfm2(layer_types=None, full_attn_idxs=[1, 3], num_hidden_layers=4, conv_L_cache=5,
                                                  conv_bias=False, block_auto_adjust_ff_dim=False, intermediate_size=44,
                                                  tie_word_embeddings=False, num_key_value_heads=4, pad_token_id=None),
    "lfm2_rounded": lambda: _lfm2(block_ffn_dim_multiplier=1.0, intermediate_size=70, conv_L_cache=2, block_multiple_of=5),
    "lfm2_moe": lambda: _lfm2_moe(),
    "lfm2_moe_unbiased_tied": lambda: _lfm2_moe(use_expert_bias=False, routed_scaling_factor=1.0, num_dense_layers=2, tie_word_embeddings=True,
                                                num_key_value_heads=2, conv_bias=True),
    "lfm3": lambda: _lfm3(),
    "lfm3_plain_untied": lambda: _lfm3(use_sandwich_norm=False, attention_bias=False, tie_word_embeddings=False, conv_L_cache=4,
                                       conv_bias=True, layer_types=["conv", "sliding_attention", "conv", "full_attention"], num_hidden_layers=4,
                                       head_dim=8, sliding_window=3),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_round_trip(tmp_path, name, spread_expert_bias):
    ours, ref, spec_file = round_trip(tmp_path, FAMILIES[name]())
    text = spec_file.read_text()
    assert "turbine short_conv" in text and "turbine attention" in text


def test_the_mlp_width_follows_lfm2s_adjustment():
    # 72 -> int(2 x 72 / 3) = 48 -> int(1.5 x 48) = 72 -> a multiple of 16: 80
    assert read_config(_lfm2().to_dict()).hidden == 80 == transformers.Lfm2ForCausalLM(_lfm2()).model.layers[0].feed_forward.w1.out_features
    assert read_config(_lfm2(block_ffn_dim_multiplier=1.0, intermediate_size=70, block_multiple_of=5).to_dict()).hidden == 50  # 46 rounded up
    assert read_config(_lfm2(block_auto_adjust_ff_dim=False).to_dict()).hidden == 72
    legacy = {**_lfm2().to_dict(), "block_ff_dim": 60}
    legacy.pop("intermediate_size")
    assert read_config(legacy).hidden == 16 * -(-int(1.5 * 40) // 16)  # block_ff_dim is intermediate_size's older name


def _logits(text, ckpt, idx):
    ours = build(cyclelang.parse(text), seed=0).eval()
    load_transformers(ours, ckpt)
    with torch.no_grad():
        return ours(idx)


@pytest.mark.parametrize("edit", ["taps", "gate order", "layer pattern", "qk_norm", "mlp width"])
def test_each_quirk_matters(tmp_path, edit):
    """The imported spec with one of LFM2's quirks edited out computes other logits (or cannot load the weights)."""
    from .roundtrip import hf

    ref = hf(_lfm2())
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    text = import_config(ckpt)
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
    assert rel(_logits(text, ckpt, idx), want) < 1e-5
    if edit == "taps":  # a 2-tap conv of the same checkpoint's first two taps: the weights no longer fit
        text2 = text.replace("short_conv size=3", "short_conv size=2")
        with pytest.raises(Exception):
            _logits(text2, ckpt, idx)
        return
    if edit == "gate order":  # [B | C | x] read as [C | B | x]: the same weights, another function
        ours = build(cyclelang.parse(text), seed=0).eval()
        load_transformers(ours, ckpt)
        with torch.no_grad():
            for mod in ours.modules():
                if type(mod).__name__.startswith("ShortConv"):
                    for p in (mod.in_proj.weight, mod.in_proj.bias):
                        b, c, x = p.chunk(3, 0)
                        p.copy_(torch.cat((c, b, x), 0))
            assert rel(ours(idx), want) > 1e-3
        return
    if edit == "layer pattern":
        text2 = text.replace("stage layer1 = attention_mlp", "stage layer1 = conv_mlp")
    elif edit == "qk_norm":
        text2 = text.replace(" qk_norm qk_norm_eps=1e-05", "")
    else:
        text2 = text.replace("hidden=80", "hidden=72")
    assert text2 != text
    try:
        got = _logits(text2, ckpt, idx)
    except Exception:
        return  # the weights no longer fit: as good a failure
    assert rel(got, want) > 1e-3


@pytest.mark.parametrize("edit", ["local rotary base", "window", "sandwich"])
def test_each_lfm3_quirk_matters(tmp_path, edit):
    from .roundtrip import hf

    ref = hf(_lfm3())
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    text = import_config(ckpt)
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
    assert rel(_logits(text, ckpt, idx), want) < 1e-5
    if edit == "local rotary base":
        text2 = text.replace("rotary_base=7000 window=5", "rotary_base=90000 window=5")
    elif edit == "window":
        text2 = text.replace(" window=5", "")
    else:
        text2 = text.replace("turbine mlp hidden=40 act=swiglu bias=false  # intermediate_size\n    norm rmsnorm eps=1e-05",
                             "turbine mlp hidden=40 act=swiglu bias=false  # intermediate_size")
    assert text2 != text
    try:
        got = _logits(text2, ckpt, idx)
    except Exception:
        return  # the weights no longer fit
    assert rel(got, want) > 1e-3


def test_the_expert_bias_matters(tmp_path):
    """LFM2-MoE's selection-only bias changes which experts are chosen: a spec without correction= gives other logits."""
    from .roundtrip import hf

    ref = _spread_expert_bias(hf(_lfm2_moe()))
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    text = import_config(ckpt)
    assert "correction=true" in text and "router=sigmoid" in text and "scale=2.5" in text
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
    assert rel(_logits(text, ckpt, idx), want) < 1e-5
    ours = build(cyclelang.parse(text), seed=0).eval()
    load_transformers(ours, ckpt)
    with torch.no_grad():
        for name, buf in ours.named_buffers():
            if name.endswith("correction"):
                buf.zero_()
        assert rel(ours(idx), want) > 1e-4


@pytest.mark.parametrize("family,kw,key", [
    ("lfm2_moe", dict(layer_types=None), "layer_types"),
    ("lfm2", dict(layer_types=["conv", "sliding_attention", "conv", "conv", "full_attention"]), "layer_types"),
    ("lfm2", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}), "rope_parameters.rope_type"),
    ("lfm2", dict(num_attention_heads=8), "num_attention_heads"),  # heads of 6 dims: fine; 48 / 8 = 6 is even, so use 16 heads below
    ("lfm2_moe", dict(num_dense_layers=4), "num_dense_layers"),
    ("lfm3", dict(use_attention_gate=True), "use_attention_gate"),
    ("lfm3", dict(rope_parameters=None), "rope_parameters.full_attention.rope_type"),  # the class's default: proportional
    ("lfm3", dict(sliding_window=None), "sliding_window"),
])
def test_unexpressible_options_are_refused_by_name(family, kw, key):
    make = {"lfm2": _lfm2, "lfm2_moe": _lfm2_moe, "lfm3": _lfm3}[family]
    if key == "num_attention_heads":
        kw = dict(num_attention_heads=16, num_key_value_heads=16)  # 48 / 16 = 3 dims a head: rotary pairs an even number
    cfg = make(**kw).to_dict()
    if key == "layer_types" and kw.get("layer_types") is None:
        cfg["layer_types"] = None
    with pytest.raises(Unsupported) as e:
        read_config(cfg)
    assert e.value.field == key


def test_an_unknown_key_is_refused_by_name():
    cfg = {**_lfm2().to_dict(), "head_dim": 16}  # not a field of Lfm2Config: refused, not guessed
    with pytest.raises(Unsupported) as e:
        read_config(cfg)
    assert e.value.field == "head_dim"
