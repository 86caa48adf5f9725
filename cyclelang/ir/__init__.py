"""The intermediate representation: the contract between the front end and every back-end.

    nodes    the frozen models, their invariants, `validate(spec)`
    kinds    one record per kind of part: role, parameters, FLOPs, state, words
    layout   the one walk of an engine: every part with its canonical path
    passes   IR -> IR passes (merge finalisation, the stand's scale model)
    mup      the maximal-update parametrisation's rule for every part (Tensor Programs V)

The node classes are re-exported here (`ir.Attention`, `ir.Spec`), so consumers
write `from cyclelang import ir` and ask `ir.kinds` and `ir.layout` for facts.
"""

from __future__ import annotations

from . import kinds, layout, mup, nodes, passes
from .nodes import *  # noqa: F401,F403 - the node classes are the package's vocabulary
from .nodes import Prechamber, Spec, Stage, TURBINE_TYPES, __all__ as _nodes
from .passes import map_branches


def is_turbine(op: object) -> bool:
    return isinstance(op, TURBINE_TYPES)


def stage_branches(stage: Stage) -> list[Prechamber]:
    """Every prechamber of a stage in source order, fullflow branches included."""
    return stage.branch_list()


def json_schema() -> dict:
    return Spec.model_json_schema()


__all__ = [*_nodes, "is_turbine", "stage_branches", "map_branches", "json_schema", "kinds", "layout", "mup", "nodes", "passes"]
