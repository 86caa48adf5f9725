"""The design rules: each a pure function from an engine to diagnostics.

A spec can be valid and still unwise. These rules come from the article behind
cyclelang (each rule's rationale is the explanation on its decorator): keep the main line
unobstructed, cool the preburners of a deep engine, recover every exhaust, trim
the injection of a mixture of experts, and know where the throat is.

Every rule returns warnings or notes with a stable code, except a dead branch,
which is an error (its parameters can never learn). `review(spec)` runs them all
and returns the diagnostics sorted by position.

A rule is registered by its decorator, `@rule(code, title, explanation, example)` (registry.py), one per
code it may emit: the code, its title and what `cyclec explain` prints live on the rule and
go into `cyclelang.codes.CODES` from there.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Diagnostic
from .registry import REVIEW_CODES, RULES, ReviewConfig  # noqa: F401 (REVIEW_CODES: the review package's name)

# Importing a theme registers its rules, in this order (RULES, and so the order they run in).
from . import rules_topology  # noqa: E402,F401,I001
from . import rules_options  # noqa: E402,F401,I001
from . import rules_init  # noqa: E402,F401,I001
from . import rules_pipeline  # noqa: E402,F401,I001
from .rules_init import f32  # noqa: E402,F401 (read as rules.f32)


def review(spec: ir.Spec, config: ReviewConfig = ReviewConfig()) -> list[Diagnostic]:
    """Every design-rule diagnostic of a spec, sorted by position."""
    if spec.engine is None:
        return []
    out: list[Diagnostic] = []
    with ir.layout.held(spec.engine):  # every rule walks the same parts
        for rule in RULES:
            out.extend(rule(spec.engine, config))
    return sorted(out, key=Diagnostic.sort_key)
