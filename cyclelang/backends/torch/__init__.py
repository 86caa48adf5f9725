"""The PyTorch back-end: `codegen(spec) -> str` and `build(spec, seed=None) -> nn.Module`.

`build` is `codegen` compiled and executed, so the in-process model and the file
`cyclec build -o model.py` writes are the same code. The parameter naming scheme
is documented in `codegen`'s module docstring. `codegen` itself needs no torch.
"""

from __future__ import annotations

from .codegen import codegen, lower, module_roles


def build(spec, seed=None, allow_large=False):
    from .build import build as _build

    return _build(spec, seed=seed, allow_large=allow_large)


__all__ = ["build", "codegen", "lower", "module_roles"]
