"""The KV cache of a causal engine (inlined into the generated file when the throat is causal)."""

import torch


class Cache:
    """What generation remembers: each mixer's own decoding state, keyed by the mixer.

    Keys and values per attention; recent inputs per pool and conv (and the conv of an
    ssm); a fixed-size recurrent state per ssm and linear attention. Valid because the
    model is causal: no position reads a later one, so the past's state never changes when a
    token is appended. Keys and values go into buffers reserved once for the whole
    context and written in place: a step copies its own token, never the past. A window
    keeps only its last size - 1 inputs and a recurrent state is replaced by the next,
    so neither grows with the length."""

    def __init__(self, length=None):
        self.pos = 0  # positions already processed
        self.length = length  # positions reserved per attention; None: the model's context
        self.state = {}

    def extend(self, layer, k, v):
        """Write k, v (B, nkv, T, hd) at positions pos .. pos + T; return the keys and values so far.
        (Latent attention writes its latent and its rotary key: two widths.)"""
        if layer not in self.state:
            B, nkv = k.shape[:2]
            self.state[layer] = (k.new_empty(B, nkv, self.length, k.size(-1)), v.new_empty(B, nkv, self.length, v.size(-1)))
        past_k, past_v = self.state[layer]  # (B, nkv, length, hd)
        end = self.pos + k.size(2)
        past_k[:, :, self.pos : end] = k
        past_v[:, :, self.pos : end] = v
        return past_k[:, :, :end], past_v[:, :, :end]  # (B, nkv, S, hd): views, no copy

    def extend_pool(self, layer, x, keep):
        h = torch.cat((self.state[layer], x), dim=1) if layer in self.state else x
        self.state[layer] = h[:, max(h.size(1) - keep, 0) :]
        return h

    def recurrent(self, layer):
        """The state a recurrent mixer left after the positions so far, or None before the first."""
        return self.state.get(layer)

    def keep(self, layer, state):
        self.state[layer] = state

    def nbytes(self):
        """Bytes of every tensor the cache holds (keys and values count their reserved buffers)."""
        held = [t for v in self.state.values() for t in (v if isinstance(v, tuple) else (v,))]
        return sum(t.numel() * t.element_size() for t in held)
