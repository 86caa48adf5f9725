"""The KV cache of a causal engine (inlined into the generated file when the throat is causal)."""

import torch


class Cache:
    """What generation remembers: keys and values per attention, recent inputs per pool.

    Valid because attention is causal: no position reads a later one, so the past's keys
    and values never change when a token is appended. They go into buffers reserved
    once for the whole context and written in place: a step copies its own token,
    never the past. A pool keeps only its last size - 1 inputs, so its copy is bounded."""

    def __init__(self, length=None):
        self.pos = 0  # positions already processed
        self.length = length  # positions reserved per attention; None: the model's context
        self.state = {}

    def extend(self, layer, k, v):
        """Write k, v (B, nkv, T, hd) at positions pos .. pos + T; return the keys and values so far."""
        if layer not in self.state:
            B, nkv, _, hd = k.size()
            self.state[layer] = (k.new_empty(B, nkv, self.length, hd), v.new_empty(B, nkv, self.length, hd))
        past_k, past_v = self.state[layer]  # (B, nkv, length, hd)
        end = self.pos + k.size(2)
        past_k[:, :, self.pos : end] = k
        past_v[:, :, self.pos : end] = v
        return past_k[:, :, :end], past_v[:, :, :end]  # (B, nkv, S, hd): views, no copy

    def extend_pool(self, layer, x, keep):
        h = torch.cat((self.state[layer], x), dim=1) if layer in self.state else x
        self.state[layer] = h[:, max(h.size(1) - keep, 0) :]
        return h
