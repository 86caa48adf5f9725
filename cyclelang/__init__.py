"""cyclelang: split-work-merge topologies of neural-network blocks, in the vocabulary
of rocket-engine power cycles.

The pipeline, one direction, one module each:

    text --syntax.parser--> syntax tree --semantics.resolve--> IR (ir.py)
         --review--> design-rule diagnostics and reports
         --backends.torch--> nn.Module and standalone Python source
         --backends.graphviz--> power-cycle diagrams
         --stand--> measurements on the test stand

Importing this package is cheap: torch and graphviz are imported only by the
functions that need them.
"""

from __future__ import annotations

from .diagnostics import CycleError, Diagnostic
from .ir import Spec
from .semantics.resolve import load, parse

__version__ = "0.1.0"

__all__ = ["CycleError", "Diagnostic", "Spec", "parse", "load", "to_spec", "draw", "build", "codegen", "fire", "__version__"]


def to_spec(spec) -> Spec:
    """Accept a path, spec text or a resolved IR; return the IR."""
    import os
    from pathlib import Path

    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, Path):
        return load(spec)
    if isinstance(spec, str):
        if "\n" not in spec and spec.endswith(".cycle") and os.path.exists(spec):
            return load(spec)
        return parse(spec)
    raise TypeError(f"expected a path, spec text or a cyclelang.Spec, got {type(spec).__name__}")


def draw(spec, **kwargs):
    """Draw a spec as a `graphviz.Digraph`: see `cyclelang.backends.graphviz.draw`."""
    from .backends.graphviz import draw as _draw

    return _draw(spec, **kwargs)


def build(spec, seed=None, allow_large=False, weights=None):
    """The spec as a torch.nn.Module: see `cyclelang.backends.torch.build` (imports torch).

    `weights`: a .safetensors file to load, checked name by name and shape by shape."""
    from .backends.torch.build import build as _build, load_weights

    model = _build(spec, seed=seed, allow_large=allow_large)
    return load_weights(model, weights) if weights is not None else model


def __getattr__(name):
    # `cyclelang.interop` on first use; it imports torch only inside its functions.
    if name == "interop":
        import importlib

        return importlib.import_module(".interop", __name__)
    raise AttributeError(f"module 'cyclelang' has no attribute {name!r}")


def codegen(spec) -> str:
    """Standalone PyTorch source for a spec: see `cyclelang.backends.torch.codegen`."""
    from .backends.torch.codegen import codegen as _codegen

    return _codegen(spec)


def fire(specs, **kwargs):
    """Fire specs on the test stand: see `cyclelang.stand.run.fire` (imports torch)."""
    from .stand.run import fire as _fire

    return _fire(specs, **kwargs)
