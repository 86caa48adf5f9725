"""The expander families (latent attention, Mamba mixers, hybrids) against transformers: each claimed
family's round trip (tests/roundtrip.py) with a tiny config that exercises what makes it itself, its
unexpressible options refused by name, and its quirks checked to matter (the spec with the quirk edited
out computes something else)."""

from __future__ import annotations

import pytest

import cyclelang

from .conftest import need
from .roundtrip import V, hf, ids, imported, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config  # noqa: E402


def minicpm3(**over):
    kw = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              kv_lora_rank=12, q_lora_rank=20, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, max_position_embeddings=40,
              rms_norm_eps=1e-5, scale_emb=3.0, scale_depth=1.4, dim_model_base=8, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, pad_token_id=None, bos_token_id=0, eos_token_id=1)
    return transformers.MiniCPM3Config(**{**kw, **over})


def youtu(**over):
    kw = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              kv_lora_rank=12, q_lora_rank=None, qk_nope_head_dim=6, qk_rope_head_dim=6, v_head_dim=7, max_position_embeddings=40,
              rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=True, bos_token_id=0, eos_token_id=1)
    return transformers.YoutuConfig(**{**kw, **over})


def falcon_mamba(**over):
    kw = dict(vocab_size=V, hidden_size=24, state_size=6, num_hidden_layers=2, expand=2, conv_kernel=3, time_step_rank=5, layer_norm_epsilon=1e-5,
              mixer_rms_eps=1e-3, tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return transformers.FalconMambaConfig(**{**kw, **over})


def bamba(**over):
    kw = dict(vocab_size=V, hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              attn_layer_indices=[1], mamba_n_heads=4, mamba_d_state=4, mamba_n_groups=2, mamba_d_conv=3, mamba_expand=2, mamba_chunk_size=4,
              time_step_limit=(0.01, 3.0), rms_norm_eps=1e-5, max_position_embeddings=40, attention_bias=True,
              rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return transformers.BambaConfig(**{**kw, **over})


def granitemoehybrid(**over):
    kw = dict(vocab_size=V, hidden_size=16, intermediate_size=8, shared_intermediate_size=12, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=3, num_experts_per_tok=2, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4,
              mamba_d_state=4, mamba_n_groups=1, mamba_d_conv=3, mamba_chunk_size=4, mamba_expand=2, rms_norm_eps=1e-5,
              embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=1.5, logits_scaling=4.0, position_embedding_type="rope",
              rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, max_position_embeddings=40, pad_token_id=None, bos_token_id=None,
              eos_token_id=None)
    return transformers.GraniteMoeHybridConfig(**{**kw, **over})


FAMILIES = {
    "minicpm3": lambda: minicpm3(),
    "minicpm3_tied_biased_full_q": lambda: minicpm3(q_lora_rank=None, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                                    v_head_dim=None, scale_depth=None, dim_model_base=None, scale_emb=12),
    "youtu": lambda: youtu(),
    "falcon_mamba": lambda: falcon_mamba(),
    "falcon_mamba_tied_biased": lambda: falcon_mamba(tie_word_embeddings=True, use_bias=True, use_conv_bias=False, expand=1, time_step_rank="auto",
                                                     mixer_rms_eps=1e-6, hidden_size=32),
    "bamba": lambda: bamba(),
    "granitemoehybrid": lambda: granitemoehybrid(),
    "granitemoehybrid_nope_tied": lambda: granitemoehybrid(position_embedding_type=None, tie_word_embeddings=True, attention_bias=True,
                                                           num_experts_per_tok=1, layer_types=["attention", "mamba"], num_hidden_layers=2,
                                                           time_step_limit=(0.0, 4.0)),
    "granitemoehybrid_dense": lambda: granitemoehybrid(num_local_experts=0, layer_types=["mamba", "mamba", "attention"], shared_intermediate_size=20),
    "granitemoehybrid_grouped_biased": lambda: granitemoehybrid(layer_types=["attention", "mamba"], num_hidden_layers=2, mamba_n_groups=2,
                                                                mamba_proj_bias=True),
    "youtu_halves": lambda: youtu(rope_interleave=None, q_lora_rank=16, tie_word_embeddings=False, attention_bias=False),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def _logits(text: str, ckpt_model):
    """The logits of a spec text built with the weights of `ckpt_model`, mapped by the family's plan without the config check."""
    from cyclelang.interop import convert_state_dict

    ours = build(cyclelang.parse(text), seed=0).eval()
    ours.load_state_dict(convert_state_dict(ckpt_model.state_dict(), ours.state_dict(), ckpt_model.config.to_dict(), spec=ours.spec))
    with torch.no_grad():
        out = ours(ids())
    return out[0] if isinstance(out, tuple) else out


def test_minicpm3_scales_are_in_the_spec_and_matter(tmp_path):
    ref = hf(minicpm3())
    ours, _, spec_file = imported(tmp_path, ref)
    text = spec_file.read_text()
    assert "scale=3" in text and "merge scale=0.98994949" in text and "nozzle head scale=0.25" in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    for edit in (("feed tokens vocab=96 context=40 position=none scale=3", "feed tokens vocab=96 context=40 position=none"),
                 ("nozzle head scale=0.25", "nozzle head")):
        assert edit[0] in text
        assert rel(_logits(text.replace(*edit), ref), want) > 1e-2
    no_merge = "\n".join(ln for ln in text.splitlines() if "merge scale=" not in ln)
    assert rel(_logits(no_merge, ref), want) > 1e-3


def test_falcon_mamba_weightless_norms_are_in_the_spec_and_matter():
    ref = hf(falcon_mamba())
    text = import_config(ref.config)
    assert "norms eps=0.001 norms_affine=false" in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    assert rel(_logits(text.replace(" norms eps=0.001 norms_affine=false", ""), ref), want) > 1e-3  # Mamba's mixer, no norms
    assert rel(_logits(text.replace("norms eps=0.001", "norms eps=1e-6"), ref), want) > 1e-4  # the norms' own eps


@pytest.mark.parametrize("spec, code", [
    ("turbine ssm version=1 norms_affine=false", "E0211"),  # no norms to take the weight off
    ("turbine ssm heads=2 norms_affine=false", "E0280"),  # Mamba-2's mixer has no dt/B/C norms
])
def test_weightless_norms_need_the_mamba1_norms(spec, code):
    from cyclelang.diagnostics import CycleError

    text = f"engine e {{ chamber width=32 throat causal feed tokens vocab=16 context=8 position=none stage s {{ prechamber m {{ norm rmsnorm {spec} }} }} nozzle head }}"
    with pytest.raises(CycleError) as info:
        cyclelang.parse(text)
    assert code in str(info.value)


def test_youtu_rotary_by_halves_is_permuted_on_load():
    """rope_interleave=false rotates the rotary key by halves: loaded without the permutation, the logits differ."""
    ref = hf(youtu(rope_interleave=False))
    text = import_config(ref.config)
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    as_pairs = hf(youtu(rope_interleave=True))
    as_pairs.load_state_dict(ref.state_dict())
    assert rel(_logits(text, as_pairs), want) > 1e-3  # the same weights read as adjacent pairs


def test_bamba_partial_rotary_and_pattern_matter():
    ref = hf(bamba())
    text = import_config(ref.config)
    assert "rotary=0.5" in text and "stage layer1 = attention_mlp" in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    assert rel(_logits(text.replace("rotary=0.5", "rotary"), ref), want) > 1e-4


def test_bamba_layers_repeating_fold_into_a_nested_stage():
    text = import_config(bamba(num_hidden_layers=6, attn_layer_indices=[1, 3, 5]))
    assert "x 3 {" in text and "stage layers0_5" not in text
    cyclelang.parse(text)


def test_granitemoehybrid_multipliers_are_in_the_spec_and_matter():
    ref = hf(granitemoehybrid())
    text = import_config(ref.config)
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    for edit in (("scale=1.5 ", ""), ("position=none scale=6", "position=none"), ("nozzle head scale=0.25", "nozzle head")):
        assert edit[0] in text
        assert rel(_logits(text.replace(*edit), ref), want) > 1e-3, edit
    no_merge = "\n".join(ln for ln in text.splitlines() if "merge scale=" not in ln)
    assert rel(_logits(no_merge, ref), want) > 1e-3


def test_granitemoehybrid_of_mamba_layers_alone_exports_with_its_multipliers():
    """Transformers' default GraniteMoeHybrid has no attention layer (and its forward with a cache then fails in transformers):
    the spec still exports, its multipliers included, and imports back to itself."""
    from cyclelang.interop import export_config

    text = import_config(granitemoehybrid(layer_types=None).to_dict())
    assert "turbine attention" not in text and "merge scale=0.3" in text
    config = export_config(cyclelang.parse(text))
    assert config["model_type"] == "granitemoehybrid" and config["residual_multiplier"] == 0.3 and config["embedding_multiplier"] == 6.0
    assert import_config(config) == text


UNEXPRESSIBLE = {
    "minicpm3 gqa": (minicpm3, dict(num_key_value_heads=2), "num_key_value_heads"),
    "minicpm3 yarn": (minicpm3, dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope_parameters.rope_type"),
    "minicpm3 relu": (minicpm3, dict(hidden_act="relu"), "hidden_act"),
    "minicpm3 zero depth": (minicpm3, dict(scale_depth=0.0), "scale_depth"),
    "falcon_mamba gelu": (falcon_mamba, dict(hidden_act="gelu"), "hidden_act"),
    "falcon_mamba rescaled": (falcon_mamba, dict(rescale_prenorm_residual=True), "rescale_prenorm_residual"),
    "bamba z-loss": (bamba, dict(z_loss_coefficient=0.1), "z_loss_coefficient"),
    "bamba scaled rope": (bamba, dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope_parameters.rope_type"),
    "bamba gelu": (bamba, dict(hidden_act="gelu"), "hidden_act"),
    "bamba no step range": (bamba, dict(time_step_limit=None), "time_step_limit"),
    "bamba layer past the end": (bamba, dict(attn_layer_indices=[3]), "attn_layer_indices"),
    "granitemoehybrid negative experts": (granitemoehybrid, dict(num_local_experts=-1), "num_local_experts"),
    "granitemoehybrid top past experts": (granitemoehybrid, dict(num_experts_per_tok=4), "num_experts_per_tok"),
    "granitemoehybrid layer kind": (granitemoehybrid, dict(layer_types=["mamba", "sliding_attention", "mamba"]), "layer_types"),
    "granitemoehybrid gelu": (granitemoehybrid, dict(hidden_act="gelu"), "hidden_act"),
    "granitemoehybrid scaled rope": (granitemoehybrid, dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
                                     "rope_parameters.rope_type"),
    "granitemoehybrid zero residual": (granitemoehybrid, dict(residual_multiplier=0.0), "residual_multiplier"),
    "youtu gqa": (youtu, dict(num_key_value_heads=2), "num_key_value_heads"),
    "youtu scaled rope": (youtu, dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), "rope_parameters.rope_type"),
}


@pytest.mark.parametrize("case", list(UNEXPRESSIBLE))
def test_unexpressible_option_refused_by_name(case):
    make, over, key = UNEXPRESSIBLE[case]
    with pytest.raises(Unsupported) as info:
        import_config(make(**over).to_dict())
    assert info.value.field == key, str(info.value)


def test_weightless_norms_mixer_equals_falcon_mambas_and_the_kinds_record_counts_no_weights():
    """`turbine ssm version=1 norms norms_affine=false` alone against FalconMambaMixer, weights copied by name; the
    kinds record's parameter count is the module's (the norms hold none), and the generated source says why."""
    from cyclelang.backends.torch.codegen import codegen, engine_spec
    from cyclelang.review import analyze
    from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer

    spec = cyclelang.parse("""
engine fm {
  chamber width=24
  throat causal
  feed tokens vocab=40 context=64 position=none
  stage block { prechamber mix { norm rmsnorm  turbine ssm version=1 state=6 expand=2 dt_rank=4 conv=3 chunk=4 norms eps=0.01 norms_affine=false } }
  norm rmsnorm
  nozzle head
}
""")
    model = build(spec, seed=0).eval()
    ours = model.stages[0].mix.ssm
    assert not any("layernorm" in n for n, _ in ours.named_parameters())
    assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
    assert "elementwise_affine=False" in codegen(engine_spec(spec))
    cfg = transformers.FalconMambaConfig(hidden_size=24, state_size=6, expand=2, time_step_rank=4, conv_kernel=3, mixer_rms_eps=0.01)
    theirs = FalconMambaMixer(cfg, layer_idx=0, initialize_mixer_weights=False).eval()  # its init reads the norms before it makes them
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
        mine = dict(ours.named_parameters())
        for name, p in theirs.named_parameters():
            p.copy_(mine[{"dt_proj.weight": "dt_weight", "dt_proj.bias": "dt_bias"}.get(name, name)])
        x = torch.randn(2, 13, 24, generator=torch.Generator().manual_seed(3))
        want, got = theirs(x), ours(x, None)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert rel(got, want) < 1e-5
