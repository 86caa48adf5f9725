"""Gradient norms and clipping over plain and DTensor gradients (each mesh's norm gathered): what the
training loop, the pipeline and expert parallelism all measure the same way."""

from __future__ import annotations

import torch


def grad_norm(params) -> torch.Tensor:
    """The global gradient norm, over plain and DTensor gradients (each mesh's norm gathered)."""
    groups: dict = {}
    for p in params:
        if p.grad is not None:
            mesh = getattr(p.grad, "device_mesh", None)
            groups.setdefault(id(mesh) if mesh is not None else None, []).append(p.grad)
    sq = torch.zeros((), dtype=torch.float64)
    for grads in groups.values():
        n = torch.nn.utils.get_total_norm(grads, 2.0)
        if hasattr(n, "full_tensor"):
            n = n.full_tensor()
        sq = sq + n.detach().double().cpu() ** 2
    return sq.sqrt()


def clip_(params, clip: float, norm: torch.Tensor) -> None:
    grads = [p for p in params if p.grad is not None]
    by_mesh: dict = {}
    for p in grads:
        by_mesh.setdefault(id(getattr(p.grad, "device_mesh", None)), []).append(p)
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, clip, norm.to(group[0].grad.dtype))  # as clip_grad_norm_ computes it
