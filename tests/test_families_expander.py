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


FAMILIES = {
    "minicpm3": lambda: minicpm3(),
    "minicpm3_tied_biased_full_q": lambda: minicpm3(q_lora_rank=None, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                                    v_head_dim=None, scale_depth=None, dim_model_base=None, scale_emb=12),
    "youtu": lambda: youtu(),
    "falcon_mamba": lambda: falcon_mamba(),
    "falcon_mamba_tied_biased": lambda: falcon_mamba(tie_word_embeddings=True, use_bias=True, use_conv_bias=False, expand=1, time_step_rank="auto",
                                                     mixer_rms_eps=1e-6, hidden_size=32),
    "bamba": lambda: bamba(),
    "youtu_halves": lambda: youtu(rope_interleave=False, q_lora_rank=16, tie_word_embeddings=False, attention_bias=False),
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


UNEXPRESSIBLE = {
    "minicpm3 gqa": (minicpm3, dict(num_key_value_heads=2), "num_key_value_heads"),
    "minicpm3 yarn": (minicpm3, dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope_parameters.rope_type"),
    "minicpm3 relu": (minicpm3, dict(hidden_act="relu"), "hidden_act"),
    "minicpm3 zero depth": (minicpm3, dict(scale_depth=0.0), "scale_depth"),
    "falcon_mamba gelu": (falcon_mamba, dict(hidden_act="gelu"), "hidden_act"),
    "falcon_mamba rescaled": (falcon_mamba, dict(rescale_prenorm_residual=True), "rescale_prenorm_residual"),
    "youtu gqa": (youtu, dict(num_key_value_heads=2), "num_key_value_heads"),
    "youtu scaled rope": (youtu, dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), "rope_parameters.rope_type"),
}


@pytest.mark.parametrize("case", list(UNEXPRESSIBLE))
def test_unexpressible_option_refused_by_name(case):
    make, over, key = UNEXPRESSIBLE[case]
    with pytest.raises(Unsupported) as info:
        import_config(make(**over))
    assert info.value.field == key, str(info.value)
