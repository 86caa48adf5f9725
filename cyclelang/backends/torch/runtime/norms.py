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
