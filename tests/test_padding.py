"""Padded batches: `forward(idx, targets, cache, attention_mask)` equals each sequence alone.

Rows of different lengths, padded on the left (as generation pads) or on the right: the
logits at every real position, the loss over the real targets, and greedy decoding with
the KV cache are those of the unpadded sequences run one by one. Engines with learned
positions (GPT-2), rotary (Llama-style, GQA), a sliding window (Mistral-style) and
per-row positions for both. And the same against transformers with its own mask.
"""

from __future__ import annotations

import pytest

from .conftest import need

import cyclelang

torch = need("torch")
from cyclelang.backends.torch.build import build  # noqa: E402

SPEC = """
engine e {{
  chamber width=32
  throat causal
  feed tokens vocab=50 context=24 position={position}
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  turbine attention heads=4 kv_heads=2 {attn} bias=false }}
    prechamber burn {{ norm rmsnorm  turbine mlp hidden=48 act=swiglu bias=false }}
  }}
  norm rmsnorm
  nozzle head
}}
"""

ENGINES = {
    "learned": dict(position="learned", attn=""),
    "rotary": dict(position="none", attn="rotary"),
    "window": dict(position="none", attn="rotary=0.5 window=3"),
    "alibi": dict(position="none", attn="alibi"),  # the bias is linear in the key's index: a padded row's shift cancels in the softmax
    "softcap_window": dict(position="none", attn="rotary softcap=3 window=3"),  # the scores computed outside the kernel
    "yarn": dict(position="none", attn="rotary rotary_scaling=yarn rotary_factor=4 rotary_original=4"),
}
LENGTHS = (7, 4, 1)


def model(name):
    m = build(cyclelang.parse(SPEC.format(**ENGINES[name])), seed=0).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def seqs():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(1, 50, (n,), generator=g) for n in LENGTHS]


def padded(rows, left: bool):
    T = max(len(r) for r in rows)
    idx = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        sl = slice(T - len(r), T) if left else slice(0, len(r))
        idx[b, sl], mask[b, sl] = r, 1
    return idx, mask


@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
@pytest.mark.parametrize("name", sorted(ENGINES))
def test_padded_batch_equals_each_sequence_alone(name, left):
    m, rows = model(name), seqs()
    idx, mask = padded(rows, left)
    targets = torch.where(mask.bool(), torch.roll(idx, -1, 1), -1)
    for b, r in enumerate(rows):  # the last real token of each row has no target
        targets[b, (idx.size(1) - 1) if left else (len(r) - 1)] = -1
    with torch.no_grad():
        logits, loss = m(idx, targets, attention_mask=mask)
        total, count = 0.0, 0
        for b, r in enumerate(rows):
            alone = m(r[None])
            real = logits[b, mask[b].bool()]
            torch.testing.assert_close(real, alone[0], rtol=1e-5, atol=1e-5)
            if len(r) > 1:
                _, l1 = m(r[None], torch.cat((r[1:], torch.tensor([-1])))[None])
                total, count = total + l1.item() * (len(r) - 1), count + len(r) - 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_left_padded_generation_with_the_cache_equals_each_alone(name):
    m, rows = model(name), seqs()
    idx, mask = padded(rows, left=True)
    out = m.generate(idx, 6, temperature=0, attention_mask=mask)
    again = m.generate(idx, 6, temperature=0, attention_mask=mask, use_cache=False)
    assert torch.equal(out, again)
    for b, r in enumerate(rows):
        assert torch.equal(out[b, idx.size(1):], m.generate(r[None], 6, temperature=0)[0, len(r):]), b


def test_a_mask_of_the_wrong_shape_and_a_pool_engine_are_refused():
    m = model("rotary")
    with pytest.raises(ValueError, match=r"not \(B, past \+ T\)"):
        m(torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4))
    pool = build(cyclelang.parse(SPEC.format(**ENGINES["rotary"]).replace("turbine attention heads=4 kv_heads=2 rotary bias=false", "turbine pool size=3")))
    with pytest.raises(ValueError, match="covers attention only: this engine's pool"):
        pool(torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 5))


@pytest.mark.parametrize("turbine,word", [("turbine ssm heads=4 state=8 chunk=4", "ssm"), ("turbine linear_attention heads=4", "linear_attention"),
                                          ("turbine attention heads=4 latent=16", "latent attention")])
def test_engines_whose_mixers_read_padded_positions_refuse_a_mask(turbine, word):
    """The recurrent mixers' states and MLA's latents take no padding mask: a padded batch is refused, not mixed silently."""
    m = build(cyclelang.parse(SPEC.format(**ENGINES["rotary"]).replace("turbine attention heads=4 kv_heads=2 rotary bias=false", turbine)))
    idx = torch.zeros(1, 5, dtype=torch.long)
    m(idx)  # unpadded: fine
    with pytest.raises(ValueError, match=f"covers attention only: this engine's {word} would mix padded positions"):
        m(idx, attention_mask=torch.ones(1, 5))


def test_padded_batch_matches_transformers_with_its_mask():
    transformers = need("transformers")
    from cyclelang.interop import import_config, load_transformers

    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=24)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config).eval()
    ours = load_transformers(build(cyclelang.parse(import_config(config)), seed=0).eval(), ref)
    idx, mask = padded(seqs(), left=True)
    with torch.no_grad():
        want = ref(idx, attention_mask=mask).logits
        got = ours(idx, attention_mask=mask)
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)
