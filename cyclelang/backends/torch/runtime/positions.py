"""Positions: the original Transformer's sinusoids and RoFormer's rotary tables.

Inlined into the generated file (only the helpers a spec uses); the rotate-half
layout is GPT-NeoX's and Llama's: a head's dims [x1 | x2] rotate as pairs (x1_i, x2_i).
"""

import math

import torch


def sinusoids(length, width):
    """The original Transformer's fixed positions: sin on even channels, cos on odd."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (length, 1)
    # (width/2,)
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: width // 2])
    return table  # (length, width)


def rotary_tables(length, dims, base):
    """Rotary positions (RoFormer), computed once: cos and sin tables, each (length, dims)."""
    # (dims/2,)
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
    # (length, dims/2)
    freqs = torch.outer(torch.arange(length, dtype=torch.int64).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # (length, dims)
    return emb.cos(), emb.sin()


def scaled_rotary_tables(length, dims, base, scaling, seq_len=None):
    """rotary_tables stretched past the pretraining context, each kind as transformers'
    rope_utils computes it: {"type": "linear", "factor"}; {"type": "dynamic", "factor",
    "original"} (NTK: the base grows once seq_len, the sequence's length, passes original);
    {"type": "llama3", "factor", "original", "low", "high"}; {"type": "yarn", "factor",
    "original", "beta_fast", "beta_slow", "gain"(, "truncate")} (cos and sin are multiplied by gain)."""
    kind = scaling["type"]
    if kind == "dynamic" and seq_len is not None and seq_len > scaling["original"] and dims > 2:
        # over 2 dims the one pair turns at base**0 = 1 whatever the base: NTK's exponent
        # dims / (dims - 2) is unbounded there, and the limit is the plain tables
        n = torch.tensor(seq_len)  # transformers computes the grown base in float32
        base = base * ((scaling["factor"] * n / scaling["original"])
                       - (scaling["factor"] - 1)) ** (dims / (dims - 2))
    # (dims/2,)
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
    gain = 1.0
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    # keep the short wavelengths, divide the long ones by factor, blend between
    elif kind == "llama3":
        factor, original, low, high = (scaling["factor"], scaling["original"], scaling["low"],
                                       scaling["high"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original / high) * ~(wavelen > original / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    # interpolate the frequencies that turn few times over the original context, keep the fast ones
    elif kind == "yarn":
        factor, original = scaling["factor"], scaling["original"]

        # the dim at which a frequency turns `rotations` times over the original context
        def turns_at(rotations):
            return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = turns_at(scaling["beta_fast"]), turns_at(scaling["beta_slow"])
        if scaling.get("truncate", True):  # rounded out to whole dims; gpt-oss keeps them as computed (truncate: false)
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dims - 1)
        if low == high:
            high += 0.001  # no empty ramp
        ramp = ((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        pos_freqs = base ** (torch.arange(0, dims, 2).float() / dims)
        # 1: extrapolate (the frequency as it is), 0: interpolate (divided by factor)
        keep = 1 - ramp
        inv_freq = 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep
        gain = scaling["gain"]
    # (length, dims/2)
    freqs = torch.outer(torch.arange(length, dtype=torch.int64).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # (length, dims)
    return emb.cos() * gain, emb.sin() * gain


def query_temperature(length, original, t):
    """Llama 4's attention temperature as Ministral 3 computes it: each position's factor on the
    rotated queries, 1 + t ln(1 + floor(position / original)), (length, 1)."""
    pos = torch.arange(length)
    return (1 + t * torch.log(1 + torch.floor(pos / original)))[:, None]


def apply_rotary(x, cos, sin):
    """Rotate every dim of each head (the rotate-half layout of GPT-NeoX and Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def apply_rotary_partial(x, cos, sin):
    """Rotate the first cos.size(-1) dims of each head; the rest pass through unrotated."""
    d = cos.size(-1)
    x1, x2, rest = x[..., : d // 2], x[..., d // 2 : d], x[..., d:]
    return torch.cat((x[..., :d] * cos + torch.cat((-x2, x1), dim=-1) * sin, rest), dim=-1)


def apply_rotary_spread(x, cos, sin):
    """Rotate pairs (i, i + head_dim/2) for i < cos.size(-1)/2 (Gemma 4's proportional rope: the rotated
    pairs spread over both halves of the head); the other dims pass through unrotated."""
    d, h = cos.size(-1) // 2, x.size(-1) // 2
    c, s = cos[..., :d], sin[..., :d]
    x1, x2 = x[..., :d], x[..., h : h + d]
    return torch.cat((x1 * c - x2 * s, x[..., d:h], x2 * c + x1 * s, x[..., h + d :]), dim=-1)


def apply_rotary_interleaved(x, cos, sin):
    """Rotate the first cos.size(-1) dims of each head in adjacent pairs (0, 1), (2, 3), ...
    (GPT-J's rotate-every-two); the tables are the rotate-half ones, each frequency twice."""
    d = cos.size(-1)
    c, s = cos[..., : d // 2], sin[..., : d // 2]
    x1, x2 = x[..., 0:d:2], x[..., 1:d:2]
    rot = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    return torch.cat((rot, x[..., d:]), dim=-1)



def alibi_slopes(heads):
    """ALiBi's slope per head (Press et al.), as BLOOM and Falcon build them: a geometric
    series from 2^(-8/n) for the nearest power of two n, the odd powers of the next one's
    base for the heads beyond it."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = torch.pow(torch.tensor(2 ** (-(2 ** -(math.log2(n) - 3)))),
                       torch.arange(1, 1 + n, dtype=torch.int32))
    if n != heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * n) - 3))))
        slopes = torch.cat([
            slopes,
            torch.pow(extra, torch.arange(1, 1 + 2 * min(n, heads - n), 2, dtype=torch.int32))])
    return slopes  # (heads,)
