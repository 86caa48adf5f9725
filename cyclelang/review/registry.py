"""The rules' registry: `@rule(code, title, explanation, example)` registers a design rule and
its code (`codes.CODES`, `cyclec explain`), in the order the rule modules define them; and
the helpers every rule uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import codes, ir
from ..diagnostics import Diagnostic
from .walk import stages


@dataclass(frozen=True)
class ReviewConfig:
    post_ln_depth: int = 12  # layers of Post-LN (or a plain stack) that count as deep
    deep_merges: int = 24  # merges into the main line that count as deep for cooling
    kv_note_bytes: int = 64 * 1024  # KV cache per token (2-byte values) from full multi-head attention worth a note
    pp: int = 1  # `cyclec check --pp N`: the pipeline split to weigh (W161)


Rule = Callable[["ir.Engine", ReviewConfig], list[Diagnostic]]
RULES: list[Rule] = []  # in the order they are defined
REVIEW_CODES: list[str] = []  # the codes the rules may emit, for the docs and `cyclec explain`


def rule(code: str, title: str, explanation: str, example: str = "") -> Callable[[Rule], Rule]:
    """Register the decorated function as a design rule that may emit `code`, explained once, here."""
    def register(fn: Rule) -> Rule:
        codes.add(code, title, explanation, example)
        REVIEW_CODES.append(code)
        if fn not in RULES:
            RULES.append(fn)
        return fn
    return register


def _w(code, message, span, help=None, notes=()) -> Diagnostic:
    return Diagnostic(code, "warning", message, span, help, tuple(notes))


def _n(code, message, span, help=None, notes=()) -> Diagnostic:
    return Diagnostic(code, "note", message, span, help, tuple(notes))


def _blocks(e: ir.Engine) -> list[ir.Stage]:
    return [s for s in stages(e) if ir.stage_branches(s)]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
