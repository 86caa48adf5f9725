"""The GPT-2 lineage (interop/lineage.py): gpt_bigcode, gpt_neo, opt, biogpt, openai-gpt, gpt-sw3.

Each family's round trip with a tiny config that sets what makes the family itself (a window under
the 12 tokens, multi-query attention, Post-LN, the offset position table, scaled embeddings), the
options the language cannot say refused by name, and a check that each quirk matters: the spec
with it edited out computes other logits."""

from __future__ import annotations

import json

import pytest

import cyclelang
from cyclelang.interop import Unsupported, import_config

from .conftest import need
from .roundtrip import V, hf, ids, rel, round_trip

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import load_transformers  # noqa: E402

FAMILIES = {
    "gpt_bigcode_mqa": lambda: transformers.GPTBigCodeConfig(vocab_size=V, n_positions=40, n_embd=48, n_layer=3, n_head=6, n_inner=72,
                                                             layer_norm_epsilon=1e-4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_bigcode_mha_relu_untied": lambda: transformers.GPTBigCodeConfig(vocab_size=V, n_positions=40, n_embd=40, n_layer=2, n_head=5, n_inner=56,
                                                                         multi_query=False, activation_function="relu", tie_word_embeddings=False,
                                                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_neo": lambda: transformers.GPTNeoConfig(vocab_size=V, max_position_embeddings=40, hidden_size=48, num_layers=4, num_heads=4,
                                                 attention_types=[[["global", "local"], 2]], window_size=5, intermediate_size=72,
                                                 layer_norm_epsilon=1e-4),
    "gpt_neo_local_first_untied": lambda: transformers.GPTNeoConfig(vocab_size=V, max_position_embeddings=40, hidden_size=36, num_layers=3,
                                                                    num_heads=3, attention_types=[[["local"], 2], [["global"], 1]], window_size=3,
                                                                    activation_function="relu", tie_word_embeddings=False),
    "opt": lambda: transformers.OPTConfig(vocab_size=V, hidden_size=48, num_hidden_layers=3, ffn_dim=72, max_position_embeddings=40,
                                          num_attention_heads=4, dropout=0.0),
    "opt_post_ln_no_bias_untied": lambda: transformers.OPTConfig(vocab_size=V, hidden_size=40, num_hidden_layers=2, ffn_dim=56,
                                                                 max_position_embeddings=40, num_attention_heads=5, do_layer_norm_before=False,
                                                                 enable_bias=False, tie_word_embeddings=False, activation_function="gelu",
                                                                 pad_token_id=3, dropout=0.0),
    "opt_no_affine": lambda: transformers.OPTConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, ffn_dim=40, max_position_embeddings=40,
                                                    num_attention_heads=4, layer_norm_elementwise_affine=False, dropout=0.0),
    "biogpt": lambda: transformers.BioGptConfig(vocab_size=V, hidden_size=48, num_hidden_layers=3, intermediate_size=72,
                                                max_position_embeddings=40, num_attention_heads=4, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0),
    "biogpt_unscaled_untied": lambda: transformers.BioGptConfig(vocab_size=V, hidden_size=40, num_hidden_layers=2, intermediate_size=56,
                                                                max_position_embeddings=40, num_attention_heads=5, scale_embedding=False,
                                                                tie_word_embeddings=False, hidden_act="relu", pad_token_id=None,
                                                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "openai-gpt": lambda: transformers.OpenAIGPTConfig(vocab_size=V, n_positions=40, n_embd=48, n_layer=3, n_head=4, layer_norm_epsilon=1e-4,
                                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "openai-gpt_relu_untied": lambda: transformers.OpenAIGPTConfig(vocab_size=V, n_positions=40, n_embd=40, n_layer=2, n_head=5, afn="relu",
                                                                   tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_neox_japanese": lambda: transformers.GPTNeoXJapaneseConfig(vocab_size=V, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                                                    intermediate_multiple_size=3, max_position_embeddings=40, layer_norm_eps=1e-4,
                                                                    attention_dropout=0.0,
                                                                    rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                                                     "partial_rotary_factor": 0.5}),
    "gpt_neox_japanese_one_layer_untied": lambda: transformers.GPTNeoXJapaneseConfig(vocab_size=V, hidden_size=40, num_hidden_layers=1,
                                                                                     num_attention_heads=5, intermediate_multiple_size=2,
                                                                                     max_position_embeddings=40, hidden_act="relu",
                                                                                     tie_word_embeddings=False, attention_dropout=0.0),
    "ctrl": lambda: transformers.CTRLConfig(vocab_size=V, n_positions=40, n_embd=48, dff=72, n_layer=3, n_head=4, layer_norm_epsilon=1e-4,
                                            resid_pdrop=0.0, embd_pdrop=0.0),
    "ctrl_untied": lambda: transformers.CTRLConfig(vocab_size=V, n_positions=40, n_embd=40, dff=56, n_layer=2, n_head=5, tie_word_embeddings=False,
                                                   resid_pdrop=0.0, embd_pdrop=0.0),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_round_trip(tmp_path, name):
    round_trip(tmp_path, FAMILIES[name]())


def _edited(tmp_path, config, old: str, new: str):
    """(our logits with the spec's `old` text replaced by `new`, transformers' logits): the quirk must matter."""
    ref = hf(config)
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    text = import_config(ckpt)
    assert old in text, text
    spec = cyclelang.parse(text.replace(old, new))
    ours = build(spec, seed=0).eval()
    from cyclelang.interop import convert_state_dict

    state = convert_state_dict(ref.state_dict(), ours.state_dict(), ref.config.to_dict(), spec=ours.spec)
    ours.load_state_dict(state)
    idx = ids()
    with torch.no_grad():
        return ours(idx) if isinstance(ours(idx), tuple) else ours(idx), ref(idx).logits


@pytest.mark.parametrize("name, old, new", [
    ("gpt_neo", "window=5 ", ""),  # GPT-Neo's local layers: the window under the 12 tokens
    ("gpt_neo", "scale=1 ", ""),  # GPT-Neo's attention is unscaled
    ("gpt_bigcode_mqa", "kv_heads=1 ", ""),  # multi-query: one key/value head (the weights do not even fit)
    ("biogpt", " scale=sqrt(width)", ""),  # BioGPT's embeddings times sqrt(hidden_size)
])
def test_each_quirk_matters(tmp_path, name, old, new):
    if name == "gpt_bigcode_mqa":  # the edited spec's module does not even take the weights (multi-query's narrower qkv)
        from cyclelang.interop import InteropError

        with pytest.raises(InteropError, match="qkv"):
            _edited(tmp_path, FAMILIES[name](), old, new)
        return
    logits, want = _edited(tmp_path, FAMILIES[name](), old, new)
    assert rel(logits, want) > 1e-3


def test_opt_offset_table_reads_position_p_from_row_p_plus_2(tmp_path):
    """OPT's table is read at p + 2: mapped unrolled (row p from their row p), the logits differ."""
    from cyclelang.interop import lineage

    ref = hf(FAMILIES["opt"]())
    ours, ckpt, _ = __import__("tests.roundtrip", fromlist=["imported"]).imported(tmp_path, ref)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), ref(idx).logits) < 1e-5
        table = ref.model.decoder.embed_positions.weight
        assert torch.equal(ours.feed.pos.weight, lineage.Roll(2)(table))
        ours.feed.pos.weight.copy_(table)  # unrolled
        assert rel(ours(idx), ref(idx).logits) > 1e-3


@pytest.mark.parametrize("name", ["openai-gpt", "opt_post_ln_no_bias_untied"])
def test_post_ln_matters(name):
    """GPT-1's and OPT-350m's Post-LN: the same weights with each norm moved in front of its turbine compute other logits."""
    from dataclasses import replace

    from cyclelang.interop import convert_state_dict, lineage
    from cyclelang.interop.families import read_config

    ref = hf(FAMILIES[name]())
    g = read_config(ref.config.to_dict())
    assert g.post_ln and not g.final_norm
    logits = {}
    for post in (True, False):
        ours = build(cyclelang.parse(lineage.spec_text(replace(g, post_ln=post), "x")), seed=0).eval()
        ours.load_state_dict(convert_state_dict(ref.state_dict(), ours.state_dict(), ref.config.to_dict(), spec=ours.spec))
        with torch.no_grad():
            logits[post] = ours(ids())
    with torch.no_grad():
        want = ref(ids()).logits
    assert rel(logits[True], want) < 1e-5 and rel(logits[False], want) > 1e-3


def _config(**over):
    """A family's config.json with keys replaced; attention_types alone says GPT-Neo's layers (to_dict also writes
    the attention_layers it expands to, which would win)."""
    base = FAMILIES[over.pop("family")]().to_dict()
    if "attention_types" in over:
        base.pop("attention_layers")
    return {**base, **over}


@pytest.mark.parametrize("over, key", [
    (dict(family="opt", word_embed_proj_dim=32), "word_embed_proj_dim"),
    (dict(family="opt", _remove_final_layer_norm=True), "_remove_final_layer_norm"),
    (dict(family="opt", activation_function="gelu_fast"), "activation_function"),
    (dict(family="gpt_bigcode_mqa", scale_attn_weights=False), "scale_attn_weights"),
    (dict(family="gpt_bigcode_mqa", num_key_value_heads=6), "num_key_value_heads"),
    (dict(family="gpt_bigcode_mqa", add_cross_attention=True), "add_cross_attention"),
    (dict(family="gpt_neo", attention_types=[[["global", "local"], 3]]), "attention_types"),
    (dict(family="gpt_neo", attention_types=[[["global", "sparse"], 2]]), "attention_types"),
    (dict(family="gpt_neo", attention_layers=["global", "local"]), "attention_layers"),
    (dict(family="gpt_neo", window_size=0), "window_size"),
    (dict(family="openai-gpt", afn="gelu_new"), "afn"),
    (dict(family="biogpt", hidden_act="tanh"), "hidden_act"),
    (dict(family="biogpt", some_new_key=1), "some_new_key"),
    (dict(family="ctrl", n_embd=45, n_head=5), "n_embd"),
    (dict(family="gpt_neox_japanese", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), "rope_parameters.rope_type"),
    (dict(family="gpt_neox_japanese", rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.1}),
     "rope_parameters.partial_rotary_factor"),
])
def test_unexpressible_options_are_refused_by_name(over, key):
    with pytest.raises(Unsupported) as e:
        import_config(_config(**over))
    assert e.value.field == key, str(e.value)


def test_gpt_neo_attention_layers_replace_attention_types():
    """transformers' GPTNeoConfig expands attention_types, then the file's attention_layers replace them."""
    text = import_config(_config(family="gpt_neo", attention_layers=["local"] * 4))
    assert text.count("window=5") == 1 and "gpt_neo_global" not in text and "let depth = 4" in text
    wide = import_config(_config(family="gpt_neo", window_size=40))  # a window of the whole table: transformers' local mask is causal
    assert "window=" not in wide and "gpt_neo_local" not in wide


def test_inert_keys_change_nothing():
    """BioGPT's layer_norm_eps is never read (its LayerNorms take PyTorch's 1e-5); GPTBigCode's fp32 switches neither."""
    assert import_config(_config(family="biogpt", layer_norm_eps=0.5)) == import_config(_config(family="biogpt"))
    same = import_config(_config(family="gpt_bigcode_mqa", attention_softmax_in_fp32=False, scale_attention_softmax_in_fp32=False))
    assert same == import_config(_config(family="gpt_bigcode_mqa"))


def test_gpt_sw3_is_gpt2(tmp_path):
    """model_type gpt-sw3 is GPT2Config read by GPT2LMHeadModel: it imports and loads as GPT-2."""
    config = transformers.GPT2Config(vocab_size=V, n_positions=40, n_embd=48, n_layer=2, n_head=4, n_inner=72, activation_function="relu",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    ref = hf(config)
    ckpt = tmp_path / "ckpt"
    ref.save_pretrained(ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "gpt-sw3"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    back = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    assert type(back).__name__ == "GPT2LMHeadModel"
    text = import_config(ckpt)
    assert text == import_config({**cfg, "model_type": "gpt2"})
    ours = load_transformers(build(cyclelang.parse(text), seed=0).eval(), ckpt)
    idx = ids()
    with torch.no_grad():
        assert rel(ours(idx), back(idx).logits) < 1e-5
    with pytest.raises(Unsupported) as e:
        import_config({**cfg, "scale_attn_by_inverse_layer_idx": True})
    assert e.value.field == "scale_attn_by_inverse_layer_idx"


def test_gpt_neox_japanese_reads_its_legacy_rotary_keys_and_its_last_layer_bias_matters(tmp_path):
    """rotary_pct and rotary_emb_base fill the rope parameters a file does not give; the last layer's dense_bias is a bias
    of that layer's attention output alone (a spec without it does not take the checkpoint)."""
    config = _config(family="gpt_neox_japanese", rotary_pct=0.5, rotary_emb_base=100)
    del config["rope_parameters"]
    text = import_config(config)
    assert "rotary=0.5 rotary_base=100 " in text and text.count("out_bias=true") == 1
    from cyclelang.interop import InteropError

    with pytest.raises(InteropError, match="layers.2.attention.dense_bias"):  # a spec without it has no place for it
        _edited(tmp_path, FAMILIES["gpt_neox_japanese"](), "bias=false out_bias=true", "bias=false")


def test_ctrl_sinusoids_are_the_feeds_with_the_channels_permuted(tmp_path):
    """CTRL's table is [sines | cosines]; the feed's interleaves them. Ours, read in CTRL's channel order, is CTRL's table,
    and it is not CTRL's as it stands: without the permutation of every residual weight the load would be wrong."""
    from cyclelang.interop import lineage

    ref = hf(FAMILIES["ctrl"]())
    ours, _, _ = __import__("tests.roundtrip", fromlist=["imported"]).imported(tmp_path, ref)
    theirs = ref.transformer.pos_encoding[:40]
    back = torch.argsort(torch.tensor(lineage.halves(48)))
    assert (ours.feed.pos[:, back] - theirs).abs().max() < 1e-5
    assert (ours.feed.pos - theirs).abs().max() > 0.5
    assert torch.equal(ours.feed.tok.weight, ref.transformer.w.weight[:, lineage.halves(48)])
