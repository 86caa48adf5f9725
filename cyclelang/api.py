"""The façade: paths and spec text in, IR and artifacts out.

`to_spec` turns whatever a user holds (a path, spec text, an IR) into the IR, and
the functions below hand that IR to a back-end. This is the only module that
imports back-ends on the user's behalf, and it imports them inside the functions,
so `import cyclelang` pulls in neither torch nor graphviz. Nothing below it (the
IR, review, the back-ends, the stand) imports this module: they take an `ir.Spec`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .ir import Spec
from .semantics.resolve import load, parse

__all__ = ["parse", "load", "to_spec", "draw", "codegen", "lower", "build", "fire"]


def to_spec(spec) -> Spec:
    """Accept a path, spec text or a resolved IR; return the IR."""
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

    return _draw(to_spec(spec), **kwargs)


def codegen(spec) -> str:
    """Standalone PyTorch source for a spec: see `cyclelang.backends.torch.codegen`."""
    from .backends.torch.codegen import codegen as _codegen

    return _codegen(to_spec(spec))


def lower(spec):
    """The generated source with its source map and name map: see `cyclelang.backends.torch.codegen.lower`."""
    from .backends.torch.codegen import lower as _lower

    return _lower(to_spec(spec))


def build(spec, seed=None, allow_large=False, weights=None):
    """The spec as a torch.nn.Module: see `cyclelang.backends.torch.build` (imports torch).

    `weights`: a .safetensors file to load, checked name by name and shape by shape."""
    from .backends.torch.build import build as _build, load_weights

    model = _build(to_spec(spec), seed=seed, allow_large=allow_large)
    return load_weights(model, weights) if weights is not None else model


def fire(specs, **kwargs):
    """Fire one spec or several (paths, texts or IR) on the test stand and return its report:
    see `cyclelang.stand.run.fire` for the settings (imports torch)."""
    from .stand.run import file_label, fire as _fire

    if isinstance(specs, (str, os.PathLike, Spec)):
        specs = [specs]
    resolved = [to_spec(s) for s in specs]
    kwargs.setdefault("files", [file_label(given, s) for given, s in zip(specs, resolved)])
    return _fire(resolved, **kwargs)
