"""The IR's nodes: frozen models, the contract between the front end and every back-end.

By the time a back-end sees these models, everything is resolved: `let` constants
are numbers, templates are expanded, includes are read, and every default is
explicit (an attention's mask follows the engine's throat, a cooling merge knows
its std, a deepnorm merge knows its alpha and beta). Back-ends never guess.

What the user asked for and what was derived are separate fields: a cooling
merge's `base_asked` is the `std=` the spec wrote (None: none was written), its
`base`, `merges` and `std` are derived by `passes.finalize_merges` from the whole
engine. A derived field is None only before that pass has run; an `Engine` refuses
to be built with one missing, or with one that disagrees with its formula.

Every invariant the resolver checks holds for any IR, however it was made: each
model validates itself on construction (names are identifiers, numbers are finite
and in range, kv_heads divides heads, widths meet at every merge, ...), so
`Spec.model_validate` of hostile JSON is refused, and `validate(spec)` re-checks a
tree that passes edited with `model_copy` (which skips validation).

All models are frozen and reject unknown fields. Node variants are discriminated
unions on `op` (main-line and branch operations) or `kind` (merges). Every node
carries its source span, which is left out of the JSON dump so that dumps are
stable across file locations.

Repeated stages stay folded (`Stage.repeat`): the diagram draws one block with a
xN badge and the PyTorch back-end builds one class with N instances. A stage may
hold stages instead of ops (a nested stage, `stage group x 4 { stage ssm x 3 {...}
stage attn {...} }`): a group is a pure container, its instances are its children's
instances in order, and `leaf_stages` lists the stages that hold ops with how many
times each runs in all. `walk` is the one walk over stages that every other is written
on: each stage folded with its count, or each instance in the order they run.

The nodes live in five modules, each importing only those before it: `base` (Node, Span,
the limits), `turbines` (the valve and the turbines), `merges`, `stages` (branches and
stages) and `engine` (feed, nozzle, startup, Engine, Spec, validate); the merge values'
formulas the engine checks are in `formulas`. This module is their one import path.
"""

from __future__ import annotations

from . import base, engine, merges, stages, turbines
from .base import *  # noqa: F401,F403 - each module's __all__: a new node is declared in its own module only
from .turbines import *  # noqa: F401,F403
from .turbines import GATED, GATE_SCALED, MAX_TEMPERATURE, ScalingType  # noqa: F401 (read as ir.nodes.X, not star-exported)
from .merges import *  # noqa: F401,F403
from .stages import *  # noqa: F401,F403
from .engine import *  # noqa: F401,F403
from .engine import NOTEBOOK_DISPLAY, kv_slots, per_layer_mlps  # noqa: F401 (read as ir.nodes.X, not star-exported)

__all__ = [*base.__all__, *turbines.__all__, *merges.__all__, *stages.__all__, *engine.__all__]
