"""Proof against transformers: the compiled specs are the models people trust.

Small configs (width 64, two layers) keep this fast; full sizes are compared by
parameter count and key/shape mapping on the meta device (no memory). Every
transformers model here is built from a config with random weights: nothing is
downloaded.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import cyclelang
from cyclelang import ir

from .conftest import ROOT, need, shrink

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import InteropError, convert_state_dict, load_transformers  # noqa: E402

SPEC = {p.stem: p for p in (ROOT / "specs").glob("*.cycle")}
B, T = 2, 16


def tiny(name):
    """The spec as a scale model (`ir.passes.shrink`: width 64, 4 heads, two layers, vocab 128,
    context 32): every construct kept."""
    return shrink(SPEC[name], width=64, heads=4, depth=2, vocab=128, context=32)


def hf_config(name, **over):
    """transformers' config of `tiny(name)`, its sizes read from the scale model's IR."""
    e = tiny(name).engine
    leaves = ir.leaf_stages(e.body)
    ops = [o for st, _ in leaves for b in st.branch_list() for o in b.ops]
    att = next(o for o in ops if isinstance(o, ir.Attention))
    ff = next(o for o in ops if isinstance(o, (ir.Mlp, ir.Moe)))
    layers = sum(n for _, n in leaves)
    kw = dict(vocab_size=e.feed.vocab, hidden_size=e.width, num_hidden_layers=layers, num_attention_heads=att.heads, num_key_value_heads=att.kv_heads,
              intermediate_size=ff.hidden, max_position_embeddings=e.feed.context, tie_word_embeddings=False)
    if name == "gpt2":
        kw = dict(vocab_size=e.feed.vocab, n_positions=e.feed.context, n_embd=e.width, n_layer=layers, n_head=att.heads, resid_pdrop=0.0,
                  embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2Config(**{**kw, **over})
    if name == "llama":
        return transformers.LlamaConfig(**{**kw, **over})
    if name == "mistral":
        return transformers.MistralConfig(**{**kw, "sliding_window": att.window, **over})
    if name == "moe":
        return transformers.MixtralConfig(**{**kw, "num_local_experts": ff.experts, "num_experts_per_tok": ff.top, "rms_norm_eps": 1e-6,
                                             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **over})
    raise KeyError(name)


HF_CLASS = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "moe": "MixtralForCausalLM"}


def hf_model(name, seed=1, **over):
    torch.manual_seed(seed)
    return getattr(transformers, HF_CLASS[name])(hf_config(name, **over)).eval()


def saved(model, folder):
    """The model's weights spread away from their init (norm gains 1, biases 0), saved as users load it."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def n_params(model):
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def batch(vocab=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


# --- numerics: the same model, weight for weight -------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral", "moe"])
def test_logits_and_loss_match_transformers(tmp_path, name):
    ref = hf_model(name)
    ours = build(tiny(name), seed=0).eval()
    assert n_params(ours) == n_params(ref)
    load_transformers(ours, saved(ref, tmp_path / "ckpt"))  # the folder users load, JSON quirks and all
    idx = batch()
    with torch.no_grad():
        out = ref(idx, labels=idx)
        targets = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)  # transformers shifts labels itself
        logits, loss = ours(idx, targets)
    torch.testing.assert_close(logits, out.logits, rtol=0, atol=1e-5)
    ce = loss - sum(ours.aux_losses.values(), torch.zeros(()))  # the moe balance loss is ours alone
    torch.testing.assert_close(ce, out.loss, rtol=0, atol=1e-5)


def test_gradients_match_gpt2():
    ref = hf_model("gpt2").train()
    ours = load_transformers(build(tiny("gpt2"), seed=0).train(), ref)
    idx = batch()
    ref(idx, labels=idx).loss.backward()
    _, loss = ours(idx, torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1))
    loss.backward()
    # c_attn is a Conv1D: its weight is the transpose of our fused qkv
    torch.testing.assert_close(ours.stages[1].mix.attn.qkv.weight.grad, ref.transformer.h[1].attn.c_attn.weight.grad.t(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ours.feed.tok.weight.grad, ref.transformer.wte.weight.grad, rtol=1e-4, atol=1e-6)


def test_safetensors_checkpoint_folder(tmp_path):
    """save_pretrained's folder (a tied head is left out of the file) loads by path."""
    ref = hf_model("gpt2")
    ref.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    ours = load_transformers(build(tiny("gpt2"), seed=0).eval(), tmp_path)
    idx = batch()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), ref(idx).logits, rtol=0, atol=1e-5)


def test_mixtral_released_layout():
    """Mixtral's released files name experts w1/w2/w3 under block_sparse_moe."""
    ref = hf_model("moe")
    state = {}
    for k, v in ref.state_dict().items():
        m = re.match(r"model\.layers\.(\d+)\.mlp\.(experts\.gate_up_proj|experts\.down_proj|gate\.weight)$", k)
        if not m:
            state[k] = v
            continue
        h = f"model.layers.{m.group(1)}.block_sparse_moe."
        if m.group(2) == "gate.weight":
            state[h + "gate.weight"] = v
        elif m.group(2) == "experts.gate_up_proj":
            for e, w in enumerate(v):
                state[h + f"experts.{e}.w1.weight"], state[h + f"experts.{e}.w3.weight"] = w.chunk(2)
        else:
            for e, w in enumerate(v):
                state[h + f"experts.{e}.w2.weight"] = w
    ours = load_transformers(build(tiny("moe"), seed=0).eval(), state, config=ref.config)
    idx = batch()
    with torch.no_grad():
        torch.testing.assert_close(ours(idx), ref(idx).logits, rtol=0, atol=1e-5)


# --- full sizes: parameter counts and the whole mapping, on the meta device -----------------


FULL = {
    "gpt2": lambda: transformers.GPT2Config(),
    "gpt2_medium": lambda: transformers.GPT2Config(n_embd=1024, n_layer=24, n_head=16),
    "llama": lambda: transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048),
    "mqa": lambda: transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=1, max_position_embeddings=2048),
    "mistral": lambda: transformers.MistralConfig(vocab_size=32000, hidden_size=512, intermediate_size=1792, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096, sliding_window=256),
    # Mixtral is dropless and has no capacity; the spec's restrictor orifices and balance
    # loss change training, not the parameters or eval-mode numerics.
    "moe": lambda: transformers.MixtralConfig(vocab_size=8192, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
                                           rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


@pytest.mark.parametrize("name", sorted(FULL))
def test_full_size_matches_transformers(name):
    config = FULL[name]()
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(config)
        spec = cyclelang.load(SPEC[name])
        ours = build(spec)
    assert n_params(ours) == n_params(ref)
    if name == "gpt2":
        assert n_params(ours) == 124_439_808  # GPT-2 small, as released
    cyclelang.interop.check_config(spec, config.to_dict())
    converted = convert_state_dict(ref.state_dict(), ours.state_dict(), config.to_dict(), spec=spec)
    assert list(converted) == list(ours.state_dict())


# --- mismatches name the first key that differs --------------------------------------------


def _error(name, source, **kw):
    ours = build(tiny(name), seed=0)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(InteropError) as info:
        load_transformers(ours, source, **kw)
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items()), "nothing is copied on error"
    return info.value


def test_error_extra_layer():
    err = _error("gpt2", hf_model("gpt2", n_layer=3))
    assert err.key == "stages" and "layers (stage instances)" in str(err) and "spec 2, checkpoint 3" in str(err)


def test_error_missing_layer():
    err = _error("llama", hf_model("llama", num_hidden_layers=1))
    assert err.key == "stages" and "spec 2, checkpoint 1" in str(err)


def test_error_shape():
    err = _error("gpt2", hf_model("gpt2", n_embd=32))
    assert err.key == "feed" and "width (chamber width=): spec 64, checkpoint 32" in str(err)


def test_error_gqa_shape():
    err = _error("llama", hf_model("llama", num_key_value_heads=4))
    assert err.key == "stages.0.mix.attn" and "key/value heads (GQA) (turbine attention kv_heads=): spec 2, checkpoint 4" in str(err)


def test_error_missing_key():
    ref = hf_model("gpt2")
    state = dict(ref.state_dict())
    del state["transformer.h.0.attn.c_proj.bias"]
    err = _error("gpt2", state, config=ref.config)
    assert err.key == "stages.0.mix.attn.proj.bias" and "lacks h.0.attn.c_proj.bias" in str(err)


def test_error_extra_key():
    ref = hf_model("gpt2")
    state = dict(ref.state_dict())
    state["transformer.h.0.attn.extra.weight"] = state["transformer.wte.weight"]
    err = _error("gpt2", state, config=ref.config)
    assert err.key == "h.0.attn.extra.weight" and "no place for it" in str(err)


def test_error_wrong_architecture():
    err = _error("gpt2", hf_model("llama"))
    assert err.key == "feed" and "positions" in str(err)  # learned positions: Llama has none


def test_error_untied_head_into_tied_nozzle():
    ref = hf_model("gpt2")
    state = dict(ref.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    assert _error("gpt2", state, config=ref.config).key == "lm_head.weight"


def test_a_state_dict_needs_its_config():
    err = _error("gpt2", dict(hf_model("gpt2").state_dict()))
    assert err.key == "config" and "pass config=" in str(err)


def test_error_config_eps_rope_window():
    err = _error("llama", hf_model("llama", rms_norm_eps=1e-5))
    assert err.key == "stages.0.mix.norm" and "norm epsilon (norm eps=): spec 1e-06, checkpoint 1e-05" in str(err)
    err = _error("llama", hf_model("llama", rope_parameters={"rope_type": "default", "rope_theta": 500000.0}))
    assert err.key == "stages.0.mix.attn" and "rotary base (rope_theta) (turbine attention rotary_base=): spec 10000, checkpoint 500000" in str(err)
    err = _error("mistral", hf_model("mistral", sliding_window=8))
    w = hf_config("mistral").sliding_window  # the scale model's: 256 of 4,096 positions at context 32
    assert err.key == "stages.0.mix.attn" and f"sliding window (turbine attention window=): spec {w} tokens, checkpoint 8 tokens" in str(err)


def test_pickles_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    err = _error("gpt2", tmp_path)
    assert "pickled" in str(err)
    err = _error("gpt2", tmp_path / "pytorch_model.bin")
    assert "pickled" in str(err)


def test_interop_import_is_torch_free():
    code = ("import sys, cyclelang; t = cyclelang.interop.import_config({'model_type': 'llama', 'num_hidden_layers': 2}); "
            "cyclelang.parse(t); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
