"""Attention masks for queries that follow S - T cached positions (inlined as used)."""

import torch


def causal_mask(T, S, device):
    """(T, S) True where query i, at position S - T + i, may see key j: j <= S - T + i."""
    i = torch.arange(S - T, S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return j <= i


def sliding_mask(T, S, window, device):
    """causal_mask limited to the latest `window` positions (sliding-window attention)."""
    i = torch.arange(S - T, S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return (j <= i) & (i - j < window)
