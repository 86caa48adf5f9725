"""μP, the maximal-update parametrisation (Yang et al. 2022, "Tensor Programs V", Table 3, Adam).

A wider engine burns each part at a lower relative intensity: under μP every layer's
update moves its activations by the same amount at every width, so a learning rate
tuned on a narrow engine carries over to a wide one. With m = width / base_width
(at base_width every rule is the standard one), for Adam:

    rule     parameters (by the kinds table's role)          init std    Adam LR   decay
    input    the feed's embeddings                           sigma       eta       lambda
    vector   anything with fewer than 2 dims (biases, gains,  as SP       eta       as SP
             merge scales): Table 3's "all biases"
    hidden   matrices of mixers, reactors, projections and    x m^-1/2    eta / m   lambda x m
             merge gates: both dims grow with the width
    output   a projection onto the vocabulary (an auxiliary   x 1/m       eta / m   lambda x m
             head): fan-out fixed, fan-in grows
    readout  the nozzle: its logits are multiplied by 1/m     sigma       eta       lambda
             (mup's MuReadout; a tied head shares the feed's
             weight, so the multiplier is the only form both fit)

and attention scores are scaled by 1/head_dim instead of 1/sqrt(head_dim), written
sqrt(d0)/d with d0 the head size at base_width so that it is the standard scale there
(latent attention: d is its query/key width, head_dim + rotary_dims).
"hidden" and "output" keep lr x decay fixed (decoupled decay is multiplied by the lr),
as mup's MuAdamW does. "x m^-1/2" multiplies whatever the standard init gave: the
spec's std, or a merge's own (cooling's sigma/sqrt(2N)), i.e. the standard init at
base_width with variance 1/fan_in beyond it; readout and output (x 1/m, or the
multiplier) are Table 3's 1/fan_in^2 variance for weights whose fan-out is fixed.

A kind's rule comes from its role (`ROLE_RULE`); a kind whose matrices do not have
two width-like dimensions says so in its record (`Kind.mup`): conv's depthwise
filters have the kernel size as their fan-in, so they are vector-like; a piece that
differs is named in `Kind.mup_sub` (MoE's router maps the width onto a fixed number
of experts: an output layer). An MoE's correction bias (`correction=`) is a buffer, not
a parameter: no rule applies (it starts at zero, and its load rule moves it by
correction_rate per step whatever the width, as it moves scores that do not grow with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import nodes as ir
from .kinds import Kind

ROLE_RULE = {"feed": "input", "mixer": "hidden", "reactor": "hidden", "projection": "hidden", "merge": "hidden",
             "valve": "vector", "nozzle": "readout"}


@dataclass(frozen=True)
class Rule:
    name: str
    init: float  # multiplies the standard init's std
    lr: float  # multiplies the learning rate
    decay: float  # multiplies the weight decay
    text: str  # Table 3's entry, for the report


def rules(m: float) -> dict[str, Rule]:
    """Every rule at width multiplier m (width / base_width)."""
    return {
        "input": Rule("input", 1.0, 1.0, 1.0, "init sigma, lr eta (Table 3: input weights)"),
        "vector": Rule("vector", 1.0, 1.0, 1.0, "as standard (Table 3: biases and gains)"),
        "hidden": Rule("hidden", m ** -0.5, 1.0 / m, m, "init sigma/sqrt(m), lr eta/m (Table 3: hidden weights)"),
        "output": Rule("output", 1.0 / m, 1.0 / m, m, "init sigma/m, lr eta/m (Table 3: output weights)"),
        "readout": Rule("readout", 1.0, 1.0, 1.0, "logits x 1/m, init sigma, lr eta (MuReadout)"),
    }


def is_mup(engine: ir.Engine) -> bool:
    return engine.startup.param.kind == "mup"


def width_mult(engine: ir.Engine) -> float:
    """m = width / base_width; 1 under the standard parametrisation."""
    p = engine.startup.param
    return engine.width / p.base_width if p.kind == "mup" else 1.0


def rule_name(kind: Kind, node, vocab: int) -> str:
    """The rule for a part's matrices (its vectors take "vector")."""
    if kind.mup is not None:
        return kind.mup
    if isinstance(node, ir.Linear) and node.out == vocab:
        return "output"
    return ROLE_RULE[kind.role]


def score_dim(a) -> int:
    """The width of the dot product behind an attention's scores: head_dim, and for latent
    attention its query/key's [nope | rope] parts together (head_dim + rotary_dims)."""
    return a.head_dim + a.rotary_dims if isinstance(a, ir.LatentAttention) else a.head_dim


def attention_scale(engine: ir.Engine, a) -> float | None:
    """The score scale of one softmax attention (latent attention too) under mup, sqrt(d0)/d
    with d0 = d / m (the head size at base_width); None under the standard parametrisation
    (1/sqrt(d), the kernel's own). Linear attention has no softmax logits to rescale (its
    normalised form is unchanged by any factor on q or k), and an ssm none at all: they
    take no score rule."""
    if not is_mup(engine):
        return None
    d = score_dim(a)
    d0 = d / width_mult(engine)
    return math.sqrt(d0) / d


def readout_mult(engine: ir.Engine) -> float:
    """What the logits are multiplied by: 1/m under mup, 1 under the standard one."""
    return 1.0 / width_mult(engine)


def table(engine: ir.Engine) -> list[dict]:
    """The rule of every part that owns parameters, in layout order: what `check --report` lists."""
    from .layout import layout

    m = width_mult(engine)
    rs = rules(m)
    out = []
    for part in layout(engine).parts():
        if not part.params:
            continue
        r = rs[rule_name(part.kind, part.node, engine.feed.vocab)]
        row = {"path": part.path, "kind": part.kind.ml, "role": part.role, "rule": r.name, "init": r.init, "lr": r.lr,
               "decay": r.decay, "vectors": "as standard", "text": r.text}
        if isinstance(part.node, (ir.Attention, ir.LatentAttention)):
            row["attention_scale"] = attention_scale(engine, part.node)
        out.append(row)
        for sub, name in part.kind.mup_sub:
            r = rs[name]
            out.append({"path": f"{part.path}.{sub}", "kind": f"{part.kind.ml} {sub}", "role": part.role, "rule": r.name,
                        "init": r.init, "lr": r.lr, "decay": r.decay, "vectors": "as standard", "text": r.text})
    return out
