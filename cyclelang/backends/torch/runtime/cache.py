"""The decoding cache of a causal engine (inlined into the generated file when the throat is causal).

`Cache` holds every method any mixer calls; the generated file keeps only those of the
state kinds its spec uses (`STATES`: a kind of state -> its methods, read by codegen),
so an attention-only model gets keys and values and nothing else. A new kind of state
adds its methods here and one entry to `STATES`; a mixer says which kinds it keeps
(`state_kind` in ir/kinds.py, or its emitter's `cache_states`).
"""

import torch

# state kind -> the Cache methods that keep it (every other method is always written)
STATES = {
    "kv": ("extend",),
    "window": ("extend_pool",),
    "recurrent": ("recurrent", "keep"),
}


class Cache:
    """Each mixer's decoding state: valid as the model is causal (the past never changes)."""

    def __init__(self, length=None):
        self.pos = 0  # positions already processed
        self.length = length  # positions reserved per attention; None: the model's context
        self.state = {}

    def extend(self, layer, k, v):
        """Write k, v (B, nkv, T, hd) at pos .. pos + T in buffers reserved once for the context;
        return the keys and values so far (latent attention: its latent and rotary key)."""
        if layer not in self.state:
            B, nkv = k.shape[:2]
            shape = (B, nkv, self.length)
            self.state[layer] = (k.new_empty(*shape, k.size(-1)), v.new_empty(*shape, v.size(-1)))
        past_k, past_v = self.state[layer]  # (B, nkv, length, hd)
        end = self.pos + k.size(2)
        past_k[:, :, self.pos : end] = k
        past_v[:, :, self.pos : end] = v
        return past_k[:, :, :end], past_v[:, :, :end]  # (B, nkv, S, hd): views, no copy

    def extend_pool(self, layer, x, keep):
        """The remembered inputs then x (B, T, C), for a window over positions (pool, conv);
        only the last `keep` inputs are kept, so the state never grows with the length."""
        h = torch.cat((self.state[layer], x), dim=1) if layer in self.state else x
        self.state[layer] = h[:, max(h.size(1) - keep, 0) :]
        return h

    def recurrent(self, layer):
        """The state a recurrent mixer (ssm, linear attention) left after the positions so
        far, or None before the first: a fixed size, replaced by the next (`keep`)."""
        return self.state.get(layer)

    def keep(self, layer, state):
        self.state[layer] = state

    def nbytes(self):
        """Bytes of every tensor the cache holds (keys and values count their reserved buffers)."""
        held = [t for v in self.state.values() for t in (v if isinstance(v, tuple) else (v,))]
        return sum(t.numel() * t.element_size() for t in held)
