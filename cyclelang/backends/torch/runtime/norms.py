"""Norms torch does not have as a module."""

import torch
from torch.nn import functional as F


class OffsetRMSNorm(torch.nn.Module):
    """RMSNorm whose gain is offset + weight (Gemma: offset 1, the weight starting at 0),
    so a checkpoint's weight is stored as it was trained. The weight starts at 1 - offset:
    an identity gain, as nn.RMSNorm's ones."""

    def __init__(self, width, eps, offset):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = torch.nn.Parameter(torch.full((width,), 1.0 - offset))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), None, self.eps) * (self.offset + self.weight)


class ScalarGain(torch.nn.Module):
    """A fixed gain on the stream (Gemma 4's layer_scalar): one number, a buffer the weights bring, never
    trained; 1 until loaded."""

    def __init__(self):
        super().__init__()
        self.register_buffer("gain", torch.ones(1))

    def forward(self, x):
        return x * self.gain


class OffsetLayerNorm(torch.nn.Module):
    """LayerNorm whose gain is offset + weight (Nemotron's LayerNorm1P: offset 1, the weight
    starting at 0), a learned shift beside it unless bias is false. The weight starts at
    1 - offset: an identity gain, as nn.LayerNorm's ones."""

    def __init__(self, width, eps, offset, bias=True):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = torch.nn.Parameter(torch.full((width,), 1.0 - offset))
        self.bias = torch.nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, (x.size(-1),), self.offset + self.weight, self.bias, self.eps)


class HeadNorm(torch.nn.Module):
    """A qk-norm with each head's own gain (and bias): q (or k) as (B, heads, T, head_dim), each
    head
    normalised over its channels, a LayerNorm or (rms) an RMSNorm, then gain offset + weight of
    head h
    (StableLM's per-head LayerNorms, Cohere's (heads, head_dim) gain). The gains are one vector of
    heads * head_dim, head by head, so that they stay vectors to weight decay and μP (a gain is not
    a
    matrix); the weight starts at 1 - offset."""

    def __init__(self, heads, head_dim, eps, rms=False, bias=False, offset=0.0):
        super().__init__()
        self.heads, self.eps, self.rms, self.offset = heads, eps, rms, offset
        self.weight = torch.nn.Parameter(torch.full((heads * head_dim,), 1.0 - offset))
        self.bias = torch.nn.Parameter(torch.zeros(heads * head_dim)) if bias else None

    def forward(self, x):
        d = (x.size(-1),)
        x = F.rms_norm(x, d, None,
                       self.eps) if self.rms else F.layer_norm(x, d, None, None, self.eps)
        # (B, heads, T, head_dim): head h's gain on head h
        x = x * (self.offset + self.weight).view(self.heads, 1, -1)
        return x if self.bias is None else x + self.bias.view(self.heads, 1, -1)
