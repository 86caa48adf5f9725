"""The words editors colour, from the compiler's own tables: the parser's keywords, the
kinds table's turbine, norm and merge keywords, the kinds each directive names, and the
option table. The playground's highlighter, the Pygments lexer and the TextMate grammar of
the VS Code package all read this, so a new kind or option is coloured everywhere at once."""

from __future__ import annotations

from ..ir.kinds import BY_KEYWORD, MERGE_BY_KEYWORD
from ..semantics.options import TABLE
from ..semantics.resolve import NORMS
from ..syntax.parser import KEYWORD_MEANINGS

# Directives whose next word is their kind (`turbine attention`), and merge, whose first
# option is: keyword -> the kinds it takes.


def kinds_of() -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for key in TABLE:
        kw, _, kind = key.partition(" ")
        if kind and kw != "prechamber":
            out.setdefault(kw, []).append(kind)
    out["turbine"] = list(BY_KEYWORD)
    out["norm"] = list(NORMS)
    out["merge"] = list(MERGE_BY_KEYWORD)
    return {k: tuple(v) for k, v in sorted(out.items())}


def words() -> dict[str, list[str]]:
    kinds = sorted({k for ks in kinds_of().values() for k in ks})
    flags = sorted({o.name for opts in TABLE.values() for o in opts if o.bare})
    return {"keywords": sorted(KEYWORD_MEANINGS), "kinds": kinds, "options": sorted({o.name for opts in TABLE.values() for o in opts}),
            "flags": flags, "constants": ["false", "true"]}
