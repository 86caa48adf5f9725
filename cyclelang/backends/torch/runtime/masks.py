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


def padded_mask(keys, T, window=None):
    """(B, 1, T, S) for a padded batch: causal (within `window` when set), no padded key
    (keys: (B, S), True for real tokens); each query still sees itself, so a padded query's
    row is never empty (its output is ignored)."""
    S = keys.size(1)
    i = torch.arange(S - T, S, device=keys.device)[:, None]
    j = torch.arange(S, device=keys.device)[None, :]
    seen = j <= i
    if window is not None:
        seen = seen & (i - j < window)
    return (seen & keys[:, None, None, :]) | (i == j)
