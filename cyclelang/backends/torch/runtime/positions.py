"""Positions: the original Transformer's sinusoids and RoFormer's rotary tables.

Inlined into the generated file (only the helpers a spec uses); the rotate-half
layout is GPT-NeoX's and Llama's: a head's dims [x1 | x2] rotate as pairs (x1_i, x2_i).
"""

import math

import torch


def sinusoids(length, width):
    """The original Transformer's fixed positions: sin on even channels, cos on odd."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (length, 1)
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))  # (width/2,)
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: width // 2])
    return table  # (length, width)


def rotary_tables(length, dims, base):
    """Rotary positions (RoFormer), computed once: cos and sin tables, each (length, dims)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))  # (dims/2,)
    freqs = torch.outer(torch.arange(length, dtype=torch.int64).float(), inv_freq)  # (length, dims/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (length, dims)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    """Rotate every dim of each head (the rotate-half layout of GPT-NeoX and Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def apply_rotary_partial(x, cos, sin):
    """Rotate the first cos.size(-1) dims of each head; the rest pass through unrotated."""
    d = cos.size(-1)
    x1, x2, rest = x[..., : d // 2], x[..., d // 2 : d], x[..., d:]
    return torch.cat((x[..., :d] * cos + torch.cat((-x2, x1), dim=-1) * sin, rest), dim=-1)


def apply_rotary_interleaved(x, cos, sin):
    """Rotate the first cos.size(-1) dims of each head in adjacent pairs (0, 1), (2, 3), ...
    (GPT-J's rotate-every-two); the tables are the rotate-half ones, each frequency twice."""
    d = cos.size(-1)
    c, s = cos[..., : d // 2], sin[..., : d // 2]
    x1, x2 = x[..., 0:d:2], x[..., 1:d:2]
    rot = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    return torch.cat((rot, x[..., d:]), dim=-1)

