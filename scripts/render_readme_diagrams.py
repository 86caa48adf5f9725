"""Regenerate the README's diagrams: `python scripts/render_readme_diagrams.py`.

Each SVG under docs/img/ is the cycle view of one spec, rendered by Graphviz and
stamped with the SHA-256 of the DOT it was drawn from. `--check` (and the test
suite) recompute the DOT and report pictures whose stamp no longer matches, so a
change to a spec or to the drawing code that is not re-rendered fails CI, while
a different Graphviz version (which shifts SVG bytes) does not.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img"
PICTURES = ("gpt2", "gas_generator", "full_flow")  # specs/<stem>.cycle -> docs/img/<stem>.svg


def dot_source(stem: str) -> str:
    from cyclelang.backends.graphviz import to_dot
    from cyclelang.semantics.resolve import parse

    path = ROOT / "specs" / f"{stem}.cycle"
    return to_dot(parse(path.read_text("utf-8"), f"specs/{stem}.cycle"), view="cycle")


def stamped_svg(stem: str) -> bytes:
    from cyclelang.backends.graphviz import stamped_svg as stamp

    return stamp(dot_source(stem), "python scripts/render_readme_diagrams.py")


def stale() -> list[str]:
    """Pictures that are missing or were drawn from a different DOT."""
    from cyclelang.backends.graphviz import svg_is_current

    out = []
    for stem in PICTURES:
        path = OUT / f"{stem}.svg"
        if not svg_is_current(path.read_text("utf-8") if path.exists() else None, dot_source(stem)):
            out.append(str(path.relative_to(ROOT)))
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for p in bad:
            print(f"out of date: {p}", file=sys.stderr)
        return 1 if bad else 0
    from cyclelang.io import atomic_write

    OUT.mkdir(parents=True, exist_ok=True)
    for stem in PICTURES:
        atomic_write(OUT / f"{stem}.svg", stamped_svg(stem))
        print(f"wrote docs/img/{stem}.svg")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
