"""The PyTorch back-end: `codegen(spec) -> str` and `build(spec, seed=None) -> nn.Module`.

`build` is `codegen` compiled and executed, so the in-process model and the file
`cyclec build -o model.py` writes are the same code. Both take an `ir.Spec` (the
façade, `cyclelang.codegen` / `cyclelang.build`, accepts paths and text). The
parameter naming scheme is `cyclelang/ir/layout.py`'s, summarised in `codegen`'s
module docstring. `codegen` itself needs no torch.
"""

from __future__ import annotations

from .codegen import Lowered, codegen, lower


def build(spec, seed=None, allow_large=False, fast=False, parallel=False):
    from .build import build as _build

    return _build(spec, seed=seed, allow_large=allow_large, fast=fast, parallel=parallel)


def build_source(spec, source, seed=None, allow_large=False):
    from .build import build_source as _build_source

    return _build_source(spec, source, seed=seed, allow_large=allow_large)


__all__ = ["Lowered", "build", "build_source", "codegen", "lower"]
