"""cyclelang: split-work-merge topologies of neural-network blocks, in the vocabulary
of rocket-engine power cycles.

The pipeline, one direction, one package each:

    text --syntax.parser--> syntax tree --semantics.resolve--> IR (ir/)
         --review--> design-rule diagnostics and reports
         --backends.torch--> nn.Module and standalone Python source
         --backends.graphviz--> power-cycle diagrams
         --stand--> measurements on the test stand
         --training--> a real training run (`cyclec train`, `cyclelang.train`)

`api` (re-exported here) and `cli` sit on top and import downward only.
Importing this package is cheap: torch and graphviz are imported only by the
functions that need them.
"""

from __future__ import annotations

from . import review as _review  # noqa: F401 - its rules register their codes in codes.CODES
from .api import build, codegen, draw, fire, load, lower, parse, to_spec, train
from .diagnostics import CycleError, Diagnostic
from .ir import Spec

__version__ = "0.1.0"

__all__ = ["CycleError", "Diagnostic", "Spec", "parse", "load", "to_spec", "draw", "build", "codegen", "lower", "fire", "train", "__version__"]


def __getattr__(name):
    # `cyclelang.interop` on first use; it imports torch only inside its functions.
    if name == "interop":
        import importlib

        return importlib.import_module(".interop", __name__)
    raise AttributeError(f"module 'cyclelang' has no attribute {name!r}")
