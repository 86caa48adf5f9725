"""The families that route the DeepSeek-V3 way (interop/families/routed_v3.py): GLM-4.5 (glm4_moe), dots.llm1 (dots1).

Each family's round trip (tests/roundtrip.py) at a tiny config whose routing options matter: sigmoid scores, a
nonzero selection-only correction bias that changes which experts are chosen, n_group > 1 with topk_group < n_group,
routed_scaling_factor != 1, shared experts and first dense layers; then what makes each family itself (GLM-4.5's
half rotary, its q/k/v biases without o's, its optional qk-norm; dots1's qk-norm and sliding layers). Each option
the language lacks is refused by name, and the correction bias is shown to matter.
"""

from __future__ import annotations

import pytest

import cyclelang

from . import roundtrip
from .conftest import need
from .roundtrip import V, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import InteropError, Unsupported, import_config, load_transformers  # noqa: E402
from cyclelang.interop.families import read_config  # noqa: E402

_ROUTER = dict(n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5, n_shared_experts=1,
               moe_intermediate_size=12)

FAMILIES = {
    "glm4_moe": lambda: transformers.Glm4MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                                   num_key_value_heads=2, max_position_embeddings=40, rms_norm_eps=1e-5, first_k_dense_replace=1,
                                                   norm_topk_prob=True, use_qk_norm=True, attention_bias=True, num_mtp_layers=0,
                                                   rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5},
                                                   pad_token_id=0, bos_token_id=0, eos_token_id=1, **_ROUTER),
    "glm4_moe_raw_tied": lambda: transformers.Glm4MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=2,
                                                            num_attention_heads=2, num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
                                                            first_k_dense_replace=0,
                                                            norm_topk_prob=False, tie_word_embeddings=True, pad_token_id=None, bos_token_id=0,
                                                            eos_token_id=1, **{**_ROUTER, "n_group": 1, "topk_group": 1, "n_shared_experts": 2}),
    "dots1": lambda: transformers.Dots1Config(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                              num_key_value_heads=2, max_position_embeddings=40, rms_norm_eps=1e-5, first_k_dense_replace=1,
                                              norm_topk_prob=True, attention_bias=True, sliding_window=None,
                                              rope_parameters={"rope_type": "default", "rope_theta": 3000.0}, pad_token_id=0,
                                              bos_token_id=0, eos_token_id=1, **_ROUTER),
    "dots1_sliding": lambda: transformers.Dots1Config(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
                                                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=40, first_k_dense_replace=0, sliding_window=5,
                                                      max_window_layers=1, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
                                                      **{**_ROUTER, "n_group": 2, "topk_group": 1}),
    "ernie4_5_moe": lambda: transformers.Ernie4_5_MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
                                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                                           rms_norm_eps=1e-5, moe_intermediate_size=12, moe_num_experts=8, moe_k=2,
                                                           moe_num_shared_experts=1, moe_layer_start_index=1,
                                                           rope_parameters={"rope_type": "default", "rope_theta": 7000.0}, pad_token_id=0,
                                                           bos_token_id=0, eos_token_id=1),
    "ernie4_5_moe_interval": lambda: transformers.Ernie4_5_MoeConfig(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=4,
                                                                    num_attention_heads=2, num_key_value_heads=1, head_dim=12,
                                                                    max_position_embeddings=40, moe_intermediate_size=8, moe_num_experts=6,
                                                                    moe_k=3, moe_num_shared_experts=0, moe_layer_start_index=0,
                                                                    moe_layer_end_index=2, moe_layer_interval=2, tie_word_embeddings=False,
                                                                    pad_token_id=None, bos_token_id=0, eos_token_id=1),
    "minimax_m2": lambda: transformers.MiniMaxM2Config(vocab_size=V, hidden_size=32, intermediate_size=12, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
                                                       rms_norm_eps=1e-5, num_local_experts=6, num_experts_per_tok=2,
                                                       rope_parameters={"rope_type": "default", "rope_theta": 9000.0, "partial_rotary_factor": 0.5},
                                                       pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "exaone_moe": lambda: transformers.ExaoneMoeConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=4,
                                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                                       rms_norm_eps=1e-5, sliding_window=5, sliding_window_pattern=2, first_k_dense_replace=1,
                                                       moe_intermediate_size=12, num_experts=8, num_experts_per_tok=2, num_shared_experts=1,
                                                       n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                                       rope_parameters={"rope_type": "default", "rope_theta": 6000.0}, pad_token_id=0,
                                                       bos_token_id=0, eos_token_id=1),
    "exaone_moe_nope": lambda: transformers.ExaoneMoeConfig(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=3,
                                                              num_attention_heads=2, num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
                                                              sliding_window=4, layer_types=["full_attention"] * 3,
                                                              mlp_layer_types=["sparse", "dense", "sparse"],
                                                              moe_intermediate_size=8, num_experts=6, num_experts_per_tok=2, num_shared_experts=2,
                                                              n_group=2, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=False,
                                                              tie_word_embeddings=True, pad_token_id=None, bos_token_id=0, eos_token_id=1),
    "solar_open": lambda: transformers.SolarOpenConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                       num_key_value_heads=2, head_dim=12, max_position_embeddings=40, rms_norm_eps=1e-5,
                                                       attention_bias=True, norm_topk_prob=True, pad_token_id=0, bos_token_id=0,
                                                       eos_token_id=1, **_ROUTER),
    "sarvam_moe": lambda: transformers.SarvamMoEConfig(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
                                                       num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=40,
                                                       first_k_dense_replace=1, attention_bias=True, norm_topk_prob=True, pad_token_id=0,
                                                       bos_token_id=0, eos_token_id=1, **_ROUTER),
    "hy_v3": lambda: transformers.HYV3Config(vocab_size=V, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=12, max_position_embeddings=40, attention_bias=True,
                                             num_experts=6, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=12,
                                             router_scaling_factor=2.826, rope_parameters={"rope_type": "default", "rope_theta": 8000.0},
                                             pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "hy_v3_no_shared": lambda: transformers.HYV3Config(vocab_size=V, hidden_size=32, intermediate_size=20, num_hidden_layers=2,
                                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=40,
                                                       num_experts=4, num_experts_per_tok=3, num_shared_experts=0, moe_intermediate_size=8,
                                                       router_scaling_factor=0.7, mlp_layer_types=["sparse", "sparse"], tie_word_embeddings=True,
                                                       pad_token_id=None, bos_token_id=0, eos_token_id=1),
}


def spread_bias(model):
    """The selection-only bias spread (it is a buffer the reference's perturbation leaves at zero): it then changes the choice."""
    with torch.no_grad():
        for name, b in [*model.named_buffers(), *model.named_parameters()]:  # ERNIE 4.5 MoE's is a frozen parameter
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.linspace(-0.3, 0.25, b.numel()).roll(3).reshape(b.shape))
    return model


@pytest.fixture(autouse=True)
def _spread(monkeypatch):
    plain = roundtrip.hf
    monkeypatch.setattr(roundtrip, "hf", lambda config, seed=1: spread_bias(plain(config, seed)))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def test_the_router_options_are_in_the_spec():
    text = import_config(FAMILIES["glm4_moe"]().to_dict())
    assert "router=sigmoid groups=4 top_groups=2 scale=2.5 correction=true" in text
    assert "rotary=0.5" in text and "qk_norm" in text and "out_bias=false" in text


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_correction_bias_changes_the_choice(name):
    ref = spread_bias(roundtrip.hf(FAMILIES[name]()))
    idx = ids()
    with torch.no_grad():
        want = ref(idx).logits
        for key, b in [*ref.named_buffers(), *ref.named_parameters()]:
            if key.endswith("e_score_correction_bias"):
                b.zero_()
        assert rel(ref(idx).logits, want) > 1e-3


def test_the_group_limit_changes_the_output(tmp_path):
    """The same weights in the spec with every group kept compute other logits: topk_group < n_group matters."""
    ref = spread_bias(roundtrip.hf(FAMILIES["glm4_moe"]()))
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    spec = _spec(tmp_path, ref.config)
    ours = load_transformers(build(spec, seed=0).eval(), ckpt)
    edited = tmp_path / "edited.cycle"
    edited.write_text((tmp_path / "s.cycle").read_text().replace("groups=4 top_groups=2", "groups=4 top_groups=4"))
    other = build(cyclelang.load(edited), seed=0).eval()
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert rel(ours(ids()), ref(ids()).logits) < 1e-5
        assert rel(other(ids()), ref(ids()).logits) > 1e-3


def test_mtp_weights_are_refused_by_name(tmp_path):
    """A checkpoint that carries GLM-4.5's multi-token prediction layer: its weights are named, never dropped."""
    cfg = FAMILIES["glm4_moe"]()
    ref = roundtrip.hf(cfg)
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    from safetensors.torch import load_file, save_file

    f = ckpt / "model.safetensors"
    sd = load_file(str(f))
    sd["model.layers.3.eh_proj.weight"] = torch.zeros(32, 64)
    save_file(sd, str(f), metadata={"format": "pt"})
    ours = build(_spec(tmp_path, cfg), seed=0)
    with pytest.raises(InteropError, match=r"layers\.3\.eh_proj"):
        load_transformers(ours, ckpt)


def _spec(tmp_path, cfg):
    p = tmp_path / "s.cycle"
    p.write_text(import_config(cfg.to_dict()))
    return cyclelang.load(p)


def _cfg(name, **kw):
    d = FAMILIES[name]().to_dict()
    d.update(kw)
    return d


@pytest.mark.parametrize("name,kw,key", [
    ("glm4_moe", {"n_group": 3}, "n_group"),  # 8 experts in 3 groups
    ("glm4_moe", {"n_group": 8, "topk_group": 2}, "n_group"),  # groups of one expert: scored by their two best
    ("glm4_moe", {"topk_group": 5}, "topk_group"),
    ("glm4_moe", {"num_experts_per_tok": 5}, "num_experts_per_tok"),  # more than the 2 kept groups of 2 hold
    ("glm4_moe", {"routed_scaling_factor": 0.0}, "routed_scaling_factor"),
    ("glm4_moe", {"n_shared_experts": 0}, "n_shared_experts"),
    ("glm4_moe", {"first_k_dense_replace": 3}, "first_k_dense_replace"),
    ("glm4_moe", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0, "partial_rotary_factor": 0.5}},
     "rope_parameters.rope_type"),
    ("glm4_moe", {"hidden_act": "relu"}, "hidden_act"),
    ("dots1", {"n_shared_experts": None}, "n_shared_experts"),
    ("dots1", {"max_window_layers": None, "sliding_window": 4, "layer_types": None}, "max_window_layers"),
    ("ernie4_5_moe", {"use_bias": True}, "use_bias"),
    ("minimax_m2", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ("hy_v3", {"mlp_bias": True}, "mlp_bias"),
    ("hy_v3", {"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types"),
    ("solar_open", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ("exaone_moe", {"mlp_layer_types": ["dense"] * 4}, "mlp_layer_types"),
    ("exaone_moe", {"layer_types": None, "sliding_window_pattern": "LLLG"}, "sliding_window_pattern"),
    ("minimax_m2", {"rotary_dim": 8}, "rotary_dim"),  # 8 of 12 dims beside a factor of 0.5
    ("ernie4_5_moe", {"moe_norm_min": 0.5}, "moe_norm_min"),
    ("ernie4_5_moe", {"moe_layer_start_index": 5}, "moe_layer_start_index"),
    ("ernie4_5_moe", {"hidden_act": "gelu"}, "hidden_act"),
    ("dots1", {"sliding_window": 4, "layer_types": ["full_attention", "full_attention", "sliding_attention"]}, "layer_types"),  # windows beside the first dense layer
    ("dots1", {"rope_parameters": {"rope_type": "default", "rope_theta": 3000.0, "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
])
def test_unexpressible_options_are_refused_by_name(name, kw, key):
    with pytest.raises(Unsupported) as e:
        read_config(_cfg(name, **kw))
    assert e.value.field == key, str(e.value)


@pytest.mark.parametrize("edit", [("correction=true", "correction=true group_score=max"),  # no family scores a group by its best
                                  ("router=sigmoid groups=4 top_groups=2 scale=2.5 correction=true", "scale=2.5")])  # softmax, no bias
def test_router_options_no_family_has_are_refused_on_export(tmp_path, edit):
    from cyclelang.interop import export_config

    p = tmp_path / "s.cycle"
    p.write_text(import_config(FAMILIES["glm4_moe"]().to_dict()).replace(*edit))
    with pytest.raises(Unsupported):
        export_config(cyclelang.load(p))
