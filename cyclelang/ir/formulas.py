"""The merge values' formulas, written once: the engine's totals (`merge_totals`), each
formula as a Python expression (`Formula`: the IR evaluates it, the torch back-end prints it
into the generated Config), and the derived fields of a merge (`derived_values`). The engine
checks its merges against them; `passes.finalize_merges` fills them in.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .merges import CoolingMerge, DeepnormMerge, LayerscaleMerge
from .stages import leaf_stages

if TYPE_CHECKING:
    from .engine import Init


@dataclass(frozen=True)
class Totals:
    merges: int  # branches returning to the main line, across all stage instances
    layers: int  # stage instances with at least one returning branch
    deep_layers: int  # stage instances with a deepnorm merge


def merge_totals(body) -> Totals:
    """Counted over every instance that runs: a nested stage's repeats multiply out."""
    merges = layers = deep = 0
    for op, n in leaf_stages(body):
        returning = [b for b in op.branch_list() if not b.overboard]
        merges += n * len(returning)
        layers += n if returning else 0
        deep += n if any(isinstance(b.merge, DeepnormMerge) for b in returning) else 0
    return Totals(merges, layers, deep)


class Formula:
    """A merge value's formula, written once as a Python expression over named totals: the IR
    evaluates it, and the torch back-end prints it into the generated Config with each name
    replaced by the config's expression for it (`code`)."""

    def __init__(self, text: str):
        self.text = text
        self.names = sorted({n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)} - {"math"})
        self._code = compile(text, f"<formula {text}>", "eval")

    def __call__(self, **values) -> float:
        return eval(self._code, {"math": math, "__builtins__": {}}, values)

    def code(self, **exprs: str) -> str:
        """The formula's text with each name replaced by an expression (parenthesised unless it
        is a plain name, number or attribute, or already stands alone inside parentheses)."""
        def put(m: re.Match) -> str:
            e = exprs[m.group(0)]
            alone = self.text[m.start() - 1:m.start()] == "(" and self.text[m.end():m.end() + 1] == ")"
            return e if alone or re.fullmatch(r"[\w.]+", e) else f"({e})"
        return re.sub(r"\b(" + "|".join(self.names) + r")\b", put, self.text)


COOLING_STD = Formula("base / math.sqrt(merges)")  # GPT-2's scaled init: std / sqrt(merges into the main line)
DEEPNORM_ALPHA = Formula("(2 * layers) ** 0.25")  # DeepNet, decoder-only: alpha = (2N)^1/4
DEEPNORM_BETA = Formula("(8 * layers) ** -0.25")  # ... beta = (8N)^-1/4
LAYERSCALE_INIT = Formula("0.1 if layers <= 18 else 1e-05 if layers <= 24 else 1e-06")  # CaiT: leaner the deeper


def layerscale_init(layers: int) -> float:
    """CaiT's rule: the deeper the engine, the leaner each preburner starts."""
    return LAYERSCALE_INIT(layers=layers)


def derived_values(m, totals: Totals, init: Init) -> dict:
    """The derived fields of merge `m`, from its asked ones and the engine's totals."""
    if isinstance(m, CoolingMerge):
        base = m.base_asked if m.base_asked is not None else init.std
        merges = max(totals.merges, 1)
        return dict(base=base, merges=merges, std=COOLING_STD(base=base, merges=merges))
    if isinstance(m, DeepnormMerge):
        n = max(totals.deep_layers, 1)
        alpha = m.alpha_asked if m.alpha_asked is not None else DEEPNORM_ALPHA(layers=n)
        beta = m.beta_asked if m.beta_asked is not None else DEEPNORM_BETA(layers=n)
        return dict(alpha=alpha, beta=beta, layers=n)
    if isinstance(m, LayerscaleMerge):
        return dict(init=m.init_asked if m.init_asked is not None else layerscale_init(totals.layers))
    return {}


def derived_merge(m, totals: Totals, init: Init):
    """`m` with its derived fields computed from its asked ones and the engine's totals."""
    values = derived_values(m, totals, init)
    return m.model_copy(update=values) if values else m
