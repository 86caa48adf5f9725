"""Mamba-2 inside attention hybrids (interop/families/hybrid.py) against transformers: Falcon-H1's round trip
(tests/roundtrip.py) at tiny configs where each of its options changes the output, each quirk checked to matter
(the spec with it edited out computes something else), its unexpressible options refused by name; and the
language options it needed (`turbine ssm out_norm=`, `z_scale= ... dt_scale=`, `turbine mlp gate_scale=`) held to
a float64 reference written here from the equations."""

from __future__ import annotations

import math

import pytest

import cyclelang

from .conftest import need
from .roundtrip import V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
F = torch.nn.functional
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, convert_state_dict, export_config, import_config  # noqa: E402


def falcon_h1(**over):
    kw = dict(vocab_size=V, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, mamba_d_ssm=36, mamba_n_heads=6, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=3,
              mamba_chunk_size=4, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
              embedding_multiplier=1.7, lm_head_multiplier=0.6, mlp_multipliers=[0.7, 1.3], key_multiplier=1.4,
              attention_in_multiplier=0.8, attention_out_multiplier=1.2, ssm_multipliers=[0.5, 3.0, 4.0, 3.5, -6.0],
              ssm_in_multiplier=1.1, ssm_out_multiplier=0.75, tie_word_embeddings=False, pad_token_id=0, bos_token_id=None,
              eos_token_id=None)
    return transformers.FalconH1Config(**{**kw, **over})


FAMILIES = {
    "falcon_h1": lambda: falcon_h1(),
    # the gated norm, normalised before the gate; biases everywhere (so no input multipliers); tied; the width from mamba_expand
    "falcon_h1_normed_biased_tied": lambda: falcon_h1(mamba_rms_norm=True, mamba_norm_before_gate=True, attention_bias=True, mlp_bias=True,
                                                      mamba_proj_bias=True, projectors_bias=True, attention_in_multiplier=1.0,
                                                      ssm_in_multiplier=1.0, tie_word_embeddings=True, mamba_d_ssm=None, mamba_expand=1,
                                                      mamba_n_heads=4, mamba_n_groups=1, time_step_limit=(0.01, 4.0)),
    # gated, then normalised (Mamba-2's own order), MHA, no padding row
    "falcon_h1_gate_then_norm": lambda: falcon_h1(mamba_rms_norm=True, mamba_norm_before_gate=False, num_key_value_heads=4,
                                                  pad_token_id=None, rms_norm_eps=1e-4),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def _logits(text: str, ckpt_model):
    """The logits of a spec text built with the weights of `ckpt_model`, mapped by the family's plan without the config check."""
    ours = build(cyclelang.parse(text), seed=0).eval()
    ours.load_state_dict(convert_state_dict(ckpt_model.state_dict(), ours.state_dict(), ckpt_model.config.to_dict(), spec=ours.spec))
    with torch.no_grad():
        out = ours(ids())
    return out[0] if isinstance(out, tuple) else out


def test_falcon_h1_multipliers_are_in_the_spec_and_matter():
    """Each multiplier is in the spec, and the spec with it edited out computes other logits."""
    import re

    ref = hf(falcon_h1())
    text = import_config(ref.config)
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    assert "fullflow {" in text and "out_norm=none" in text
    for option in ("z_scale", "x_scale", "b_scale", "c_scale", "dt_scale", "gate_scale", "scale=1.7", "head scale", "scale=0.36"):
        pattern = rf" {option}=?\S*" if "=" not in option else rf" {option}\S*"
        edited = re.sub(pattern, "" if option != "head scale" else " head", text, count=1)
        assert edited != text, option
        assert rel(_logits(edited, ref), want) > 1e-4, option
    for merge in ("merge scale=0.75", "merge scale=0.96", "merge scale=1.3"):  # ssm_out, attention_out x in, mlp down
        edited = "\n".join(ln for ln in text.splitlines() if merge not in ln)
        assert edited != text, merge
        assert rel(_logits(edited, ref), want) > 1e-4, merge


def test_falcon_h1_norm_order_matters():
    ref = hf(FAMILIES["falcon_h1_normed_biased_tied"]())
    text = import_config(ref.config)
    assert "out_norm=before_gate" in text
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    assert rel(_logits(text.replace(" out_norm=before_gate", ""), ref), want) > 1e-4  # Mamba-2's order: gate, then norm


def test_falcon_h1_default_config_imports_and_exports_back():
    """transformers' default FalconH1Config (mamba_d_ssm 1024 of 128 heads, no norm on the mixer's output) imports, and its
    spec exports to a config that imports back to the same spec."""
    text = import_config(transformers.FalconH1Config().to_dict())
    assert "out_norm=none" in text and "heads=128 head_dim=8 state=256" in text
    cyclelang.parse(text)
    config = export_config(cyclelang.parse(text))
    assert config["model_type"] == "falcon_h1" and config["mamba_rms_norm"] is False and config["mamba_d_ssm"] == 1024
    assert import_config(config) == text


def test_falcon_h1_input_multipliers_export_folded():
    """attention_in_multiplier and ssm_in_multiplier export as 1, their factors inside key_multiplier, attention_out_multiplier
    and ssm_multipliers: the same function, which imports back to the same spec."""
    text = import_config(falcon_h1().to_dict())
    config = export_config(cyclelang.parse(text))
    assert config["attention_in_multiplier"] == 1.0 and config["ssm_in_multiplier"] == 1.0
    assert math.isclose(config["key_multiplier"], 1.4 * 0.8 ** 2) and math.isclose(config["attention_out_multiplier"], 1.2 * 0.8)
    assert all(math.isclose(a, 1.1 * b) for a, b in zip(config["ssm_multipliers"], [0.5, 3.0, 4.0, 3.5, -6.0]))
    assert import_config(config) == text


UNEXPRESSIBLE = {
    "gelu": (dict(hidden_act="gelu"), "hidden_act"),
    "scaled rope": (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), "rope_parameters.rope_type"),
    "partial rotary": (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
                       "rope_parameters.partial_rotary_factor"),
    "in_proj biased, out_proj not": (dict(mamba_proj_bias=True, ssm_in_multiplier=1.0), "projectors_bias"),
    "input multiplier before a biased in_proj": (dict(mamba_proj_bias=True, projectors_bias=True), "ssm_in_multiplier"),
    "input multiplier before biased q, k, v": (dict(attention_bias=True), "attention_in_multiplier"),
    "negative key multiplier": (dict(key_multiplier=-1.0), "key_multiplier"),
    "three mlp multipliers": (dict(mlp_multipliers=[1.0, 1.0, 1.0]), "mlp_multipliers"),
    "four ssm multipliers": (dict(ssm_multipliers=[1.0, 1.0, 1.0, 1.0]), "ssm_multipliers"),
    "no step range": (dict(time_step_limit=None), "time_step_limit"),
    "head width off the inner width": (dict(mamba_d_head=5), "mamba_d_head"),
    "groups not dividing heads": (dict(mamba_n_groups=4), "mamba_n_groups"),
}


@pytest.mark.parametrize("case", list(UNEXPRESSIBLE))
def test_unexpressible_option_refused_by_name(case):
    over, key = UNEXPRESSIBLE[case]
    config = falcon_h1().to_dict()
    config.update(over)
    with pytest.raises(Unsupported) as info:
        import_config(config)
    assert info.value.field == key, str(info.value)


# --- the language options against float64 references written from the equations -------------------------


def _ssm_reference(m, x, out_norm, scales, groups, eps):
    """Mamba-2 (Dao & Gu 2024) step by step in float64: [z | x B C | dt] = in_proj(x), each section times its scale; a depthwise
    causal conv and silu on (x, B, C); dt = softplus(dt + dt_bias); h_t = exp(dt A) h_{t-1} + dt x_t B_t^T, y_t = h_t C_t + D x_t;
    then y meets the gate z: gated rmsnorm(y silu(z)), before_gate rmsnorm(y) silu(z), none y silu(z); out_proj."""
    H, P, N = m.heads, m.head_dim, m.state
    inner = H * P
    Bn, T, _ = x.shape
    proj = x @ m.in_proj.weight.T.double() + (m.in_proj.bias.double() if m.in_proj.bias is not None else 0)
    sizes = [inner, inner, groups * N, groups * N, H]
    proj = proj * torch.cat([torch.full((n,), s, dtype=torch.float64) for n, s in zip(sizes, scales)])
    z, xbc, dt = proj.split([inner, inner + 2 * groups * N, H], -1)
    K = m.conv1d.kernel_size[0]
    w = m.conv1d.weight.double()[:, 0]  # (C, K)
    pad = torch.cat([torch.zeros(Bn, K - 1, xbc.shape[-1], dtype=torch.float64), xbc], 1)
    conv = torch.stack([sum(pad[:, t + k] * w[:, k] for k in range(K)) for t in range(T)], 1)
    conv = F.silu(conv + (m.conv1d.bias.double() if m.conv1d.bias is not None else 0))
    u, b, c = conv.split([inner, groups * N, groups * N], -1)
    u = u.reshape(Bn, T, H, P)
    b = b.reshape(Bn, T, groups, N).repeat_interleave(H // groups, 2)
    c = c.reshape(Bn, T, groups, N).repeat_interleave(H // groups, 2)
    dt = F.softplus(dt + m.dt_bias.double())
    A = -torch.exp(m.A_log.double())
    h = torch.zeros(Bn, H, P, N, dtype=torch.float64)
    ys = []
    for t in range(T):
        h = torch.exp(dt[:, t] * A)[..., None, None] * h + (dt[:, t, :, None, None] * u[:, t, :, :, None] * b[:, t, :, None, :])
        ys.append((h * c[:, t, :, None, :]).sum(-1) + m.D.double()[:, None] * u[:, t])
    y = torch.stack(ys, 1).reshape(Bn, T, inner)

    def norm(v):
        g = v.reshape(Bn, T, groups, -1)
        return (g / torch.sqrt(g.pow(2).mean(-1, keepdim=True) + eps)).reshape(Bn, T, inner) * m.norm.double()

    y = {"gated": lambda: norm(y * F.silu(z)), "before_gate": lambda: norm(y) * F.silu(z), "none": lambda: y * F.silu(z)}[out_norm]()
    return y @ m.out_proj.weight.T.double() + (m.out_proj.bias.double() if m.out_proj.bias is not None else 0)


def _mixer(text: str, kind):
    model = build(cyclelang.parse(text), seed=3).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    return next(mod for mod in model.modules() if type(mod).__name__.startswith(kind) and mod is not model)


@pytest.mark.parametrize("out_norm", ["gated", "before_gate", "none"])
def test_ssm_out_norm_and_scales_equal_a_float64_reference(out_norm):
    scales = (0.5, 1.5, 0.8, 1.2, 0.9)
    text = f"""
engine e {{
  chamber width=16
  throat causal
  feed tokens vocab=32 context=64 position=none
  stage s {{
    prechamber mix {{
      turbine ssm heads=4 head_dim=6 state=5 groups=2 conv=3 chunk=4 bias=true eps=1e-4 out_norm={out_norm} z_scale=0.5 x_scale=1.5 b_scale=0.8 c_scale=1.2 dt_scale=0.9
    }}
  }}
  norm rmsnorm
  nozzle head
}}"""
    m = _mixer(text, "Ssm")
    assert (out_norm == "none") == (not hasattr(m, "norm"))  # no gain where nothing is normalised
    x = torch.randn(2, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = m(x) if "cache" not in m.forward.__code__.co_varnames else m(x, None)
        want = _ssm_reference(m, x, out_norm, scales, 2, 1e-4)
    assert (ours - want).abs().max().item() < 1e-8 * max(1.0, want.abs().max().item())  # the chunked scan's rounding


def test_ssm_out_norm_none_decodes_as_it_trains_and_counts_its_parameters():
    """The chunked form equals decoding with the cache, a prefill then token by token, to 1e-6 in float64; the state's bytes
    stay flat; the kinds record counts no norm gain."""
    import sys

    from cyclelang.review import analyze

    text = """
engine e {
  chamber width=16
  throat causal
  feed tokens vocab=32 context=64 position=none
  stage s x 2 {
    prechamber mix {
      norm rmsnorm
      turbine ssm heads=4 head_dim=6 state=5 groups=2 conv=3 chunk=4 out_norm=none z_scale=0.5 dt_scale=1.3
    }
  }
  norm rmsnorm
  nozzle head
}"""
    spec = cyclelang.parse(text)
    model = build(spec, seed=1).double().eval()
    assert analyze(spec)["params"]["total"] == sum(p.numel() for p in model.parameters())
    Cache = sys.modules[type(model).__module__].Cache
    idx = torch.randint(0, 32, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = Cache()
        parts, sizes = [model(idx[:, :7], cache=cache)], []
        for t in range(7, 20):
            parts.append(model(idx[:, t : t + 1], cache=cache))
            sizes.append(cache.nbytes())
    full = full[0] if isinstance(full, tuple) else full
    steps = torch.cat([p[0] if isinstance(p, tuple) else p for p in parts], 1)
    assert rel(steps, full) < 1e-6 and len(set(sizes)) == 1


def test_mlp_gate_scale_equals_a_float64_reference():
    text = """
engine e {
  chamber width=12
  throat causal
  feed tokens vocab=32 context=16 position=none
  stage s {
    prechamber burn {
      turbine mlp hidden=20 act=swiglu bias=true gate_scale=0.4
    }
  }
  norm rmsnorm
  nozzle head
}"""
    m = _mixer(text, "Mlp")
    x = torch.randn(2, 5, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    fc, proj = m.fc.weight.double(), m.proj.weight.double()
    h = x @ fc.T + m.fc.bias.double()
    gate, up = h[..., :20], h[..., 20:]
    want = (F.silu(0.4 * gate) * up) @ proj.T + m.proj.bias.double()
    with torch.no_grad():
        assert (m(x) - want).abs().max().item() < 1e-12


def test_gate_scale_needs_a_gated_mlp():
    with pytest.raises(Exception) as info:
        cyclelang.parse("""
engine e {
  chamber width=12
  feed tokens vocab=32 context=16 position=none
  stage s {
    prechamber burn {
      turbine mlp hidden=20 act=gelu gate_scale=0.4
    }
  }
  norm layernorm
  nozzle head
}""")
    assert "gate_scale" in str(info.value)


# --- Nemotron-H: one mixer a layer -----------------------------------------------------------------------


def nemotron_h(**over):
    kw = dict(vocab_size=V, hidden_size=16, layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention", "mlp"],
              num_attention_heads=4, num_key_value_heads=2, head_dim=6, intermediate_size=20, mamba_num_heads=4, mamba_head_dim=6,
              n_groups=2, ssm_state_size=5, chunk_size=4, conv_kernel=3, time_step_min=0.3, use_bias=True, mlp_bias=True,
              layer_norm_epsilon=1e-4, max_position_embeddings=64, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return transformers.NemotronHConfig(**{**kw, **over})


NEMOTRON_H = {
    "nemotron_h": lambda: nemotron_h(),
    # MHA at the width's own head size, one group, a low step floor, gelu MLPs, a padding row; tie_word_embeddings, which ties
    # nothing in transformers' NemotronH; runs of one kind fold
    "nemotron_h_tied_gelu": lambda: nemotron_h(layers_block_type=["linear_attention", "linear_attention", "mlp", "full_attention"],
                                               num_key_value_heads=4, head_dim=4, n_groups=1, time_step_min=0.01, mlp_hidden_act="gelu",
                                               use_bias=False, mlp_bias=False, use_conv_bias=False, tie_word_embeddings=True,
                                               pad_token_id=3),
    # routed experts: DeepSeek-V3's sigmoid router (groups, top groups, the scale, renormalised) over ungated relu2 experts, a shared one
    "nemotron_h_moe": lambda: nemotron_h(layers_block_type=["linear_attention", "moe", "full_attention", "moe"], mlp_bias=False,
                                         n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=8,
                                         moe_shared_expert_intermediate_size=10, n_group=3, topk_group=2, routed_scaling_factor=1.7),
}


@pytest.mark.parametrize("name", list(NEMOTRON_H))
def test_nemotron_h_round_trip(tmp_path, name, spread_bias):
    round_trip(tmp_path, NEMOTRON_H[name]())


def test_nemotron_h_default_config_imports_and_exports_back():
    text = import_config(transformers.NemotronHConfig().to_dict())
    assert "stage layer1 = moe_layer" in text and "router=sigmoid" in text and "act=relu2" in text
    assert import_config(export_config(cyclelang.parse(text))) == text


def test_nemotron_h_pattern_step_floor_and_relu2_matter():
    ref = hf(nemotron_h())
    text = import_config(ref.config)
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(_logits(text, ref), want) < 1e-5
    assert "dt_lo=0.3" in text and "act=relu2" in text
    for old, new in ((" dt_lo=0.3", ""), ("act=relu2", "act=relu")):
        assert rel(_logits(text.replace(old, new), ref), want) > 1e-4, old
    rotary = text.replace("head_dim=6 bias=false", "head_dim=6 rotary bias=false")  # its attention has no positions
    assert rotary != text and rel(_logits(rotary, ref), want) > 1e-4


def test_nemotron_h_reads_hybrid_override_pattern_and_legacy_names():
    """A released config.json's hybrid_override_pattern (M, *, -) and mamba_* names, as NemotronHConfig.__post_init__ reads them."""
    config = nemotron_h().to_dict()
    del config["layers_block_type"]
    config.update(hybrid_override_pattern="M*-M-", mamba_n_groups=2, mamba_d_conv=3, mamba_chunk_size=4, num_hidden_layers=5)
    for k in ("n_groups", "conv_kernel", "chunk_size"):
        del config[k]
    assert import_config(config) == import_config(nemotron_h().to_dict())
    assert transformers.NemotronHConfig(**{k: v for k, v in config.items() if k != "model_type"}).layers_block_type == \
        nemotron_h().layers_block_type


NEMOTRON_H_REFUSED = {
    "moe layers reading a latent": (dict(layers_block_type=["linear_attention", "moe"], mlp_bias=False, moe_latent_size=8),
                                    "moe_latent_size"),
    "moe layers with mlp_bias": (dict(layers_block_type=["linear_attention", "moe"]), "mlp_bias"),
    "moe groups of one expert": (dict(layers_block_type=["linear_attention", "moe"], mlp_bias=False, n_group=8), "n_group"),
    "an unknown layer kind": (dict(layers_block_type=["linear_attention", "sliding_attention"]), "layers_block_type"),
    "mamba gelu": (dict(mamba_hidden_act="gelu"), "mamba_hidden_act"),
    "an unknown mlp act": (dict(mlp_hidden_act="tanh"), "mlp_hidden_act"),
    "multi-token prediction": (dict(num_nextn_predict_layers=1), "num_nextn_predict_layers"),
    "groups not dividing heads": (dict(n_groups=3), "n_groups"),
    "no step floor": (dict(time_step_min=0.0), "time_step_min"),
}


@pytest.mark.parametrize("case", list(NEMOTRON_H_REFUSED))
def test_nemotron_h_unexpressible_option_refused_by_name(case):
    over, key = NEMOTRON_H_REFUSED[case]
    config = nemotron_h().to_dict()
    config.update(over)
    with pytest.raises(Unsupported) as info:
        import_config(config)
    assert info.value.field == key, str(info.value)


CONFIGS = {**FAMILIES, **NEMOTRON_H}  # for tests/test_closed_world.py's property over every claimed family
