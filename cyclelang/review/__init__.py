"""The design reviewer: rules over the IR, and static analyses. Pure: no torch, no I/O.

    review(spec)            -> design-rule diagnostics (warnings, notes, and the dead-branch error)
    apply_allows(d, sources) -> the diagnostics left after `# allow: CODE` comments
    strict(d)               -> warnings raised to errors (`cyclec check --strict`)
    analyze(spec)           -> the static report as plain data; render_text lays it out
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from ..diagnostics import Diagnostic
from .report import analyze, render_text
from .rules import REVIEW_CODES, RULES, ReviewConfig, review

__all__ = ["review", "apply_allows", "strict", "analyze", "render_text", "ReviewConfig", "RULES", "REVIEW_CODES", "allowed_codes"]

_ALLOW = re.compile(r"#.*?\ballow:\s*([A-Z]\d{3,4}(?:\s*,\s*[A-Z]\d{3,4})*)")


def allowed_codes(line: str) -> set[str]:
    """The codes a source line silences with a comment: `# allow: W102` or `# allow: W102, N101`."""
    m = _ALLOW.search(line)
    return {c.strip() for c in m.group(1).split(",")} if m else set()


def apply_allows(diagnostics: Iterable[Diagnostic], sources: dict[str, str]) -> list[Diagnostic]:
    """Drop the warnings and notes whose first source line carries `# allow: CODE`.

    Errors are never silenced: a spec cannot vote away a branch that cannot learn.
    """
    lines_of: dict[str, list[str]] = {}
    out = []
    for d in diagnostics:
        if d.severity != "error" and d.span is not None and d.span.file in sources:
            lines = lines_of.setdefault(d.span.file, sources[d.span.file].split("\n"))  # as the parser counts lines
            if 1 <= d.span.line <= len(lines) and d.code in allowed_codes(lines[d.span.line - 1]):
                continue
        out.append(d)
    return out


def strict(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """Warnings become errors; notes stay notes."""
    return [dataclasses.replace(d, severity="error") if d.severity == "warning" else d for d in diagnostics]
