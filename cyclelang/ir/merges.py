"""The IR's merges: how a branch's exhaust returns to the chamber, hyper-connections'
streams included. See `nodes.py`.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from .base import Count, Finite, Node, Positive, checked


__all__ = [  # what `ir.nodes` (and so `ir`) exports from here
    "PlainMerge", "ScaleMerge", "CoolingMerge", "RezeroMerge", "LayerscaleMerge", "DeepnormMerge", "GateMerge",
    "HyperMerge", "Connections", "Merge", "MERGE_TYPES",
]


# --- merges: how a branch's exhaust returns to the chamber ---------------------


class PlainMerge(Node):
    kind: Literal["plain"] = "plain"


class ScaleMerge(Node):
    kind: Literal["scale"] = "scale"
    value: Finite


class CoolingMerge(Node):
    """Output projections start at std / sqrt(merges): a rich, cool preburner."""

    kind: Literal["cooling"] = "cooling"
    base_asked: Positive | None = None  # `merge cooling std=`; None: the startup's init std
    base: Positive | None = None  # derived: the std before cooling
    merges: Count | None = None  # derived: merges into the main line across the engine (GPT-2: 2 x layers)
    std: Positive | None = None  # derived: the init std of the branch's output projection


class RezeroMerge(Node):
    kind: Literal["rezero"] = "rezero"
    init: Finite


class LayerscaleMerge(Node):
    kind: Literal["layerscale"] = "layerscale"
    init_asked: Positive | None = None  # `merge layerscale init=`; None: CaiT's depth rule
    init: Positive | None = None  # derived


class DeepnormMerge(Node):
    """DeepNet: x_next = LN(alpha * x + f(x)), with f's projections initialised with gain beta."""

    kind: Literal["deepnorm"] = "deepnorm"
    alpha_asked: Positive | None = None  # `merge deepnorm alpha=`; None: (2N)^(1/4)
    beta_asked: Positive | None = None  # `merge deepnorm beta=`; None: (8N)^(-1/4)
    alpha: Positive | None = None  # derived
    beta: Positive | None = None  # derived
    layers: Count | None = None  # derived: the N the formulas are computed from


class GateMerge(Node):
    """Highway merge: x + g * (f(x) - x) with g = sigmoid(W x + b), b starts negative."""

    kind: Literal["gate"] = "gate"
    bias: Finite


# --- hyper-connections: a chamber of several streams (Zhu et al. 2024; mHC, DeepSeek-V4) ---------

Connections = Literal["hyper", "manifold"]


class HyperMerge(Node):
    """A branch's junction with a chamber of `streams` residual streams (`chamber streams=N
    connections=hyper|manifold`): the branch reads a learned mix of the streams (pre), its output
    is written into each stream (post) and the streams are mixed by an n x n matrix (res).
    `hyper`: Zhu et al. 2024, static or `dynamic`; `manifold`: mHC (DeepSeek-V4), always dynamic,
    res kept doubly stochastic by `sinkhorn` iterations. A static read starts on stream k mod n, k the
    branch's place among every branch that runs (the paper's layer index): the init, not the IR, says it."""

    kind: Literal["hyper"] = "hyper"
    streams: Count
    connections: Connections
    dynamic: bool  # hyper: weights computed per position from the normalised streams; manifold: always
    sinkhorn: Count = 20  # manifold: Sinkhorn iterations (DeepSeek-V4's hc_sinkhorn_iters)
    eps: Positive = 1e-6  # manifold: the streams' RMSNorm eps and the weights' floor (hc_eps); hyper dynamic: its LayerNorm's

    _checked = checked()

    def check(self) -> None:
        if self.connections == "manifold" and not self.dynamic:
            raise ValueError("a manifold-constrained connection is always dynamic")


MERGE_TYPES = (PlainMerge, ScaleMerge, CoolingMerge, RezeroMerge, LayerscaleMerge, DeepnormMerge, GateMerge, HyperMerge)
Merge = Annotated[Union[MERGE_TYPES], Field(discriminator="kind")]
