"""Draw a family of block variants side by side: where the valves sit, how the exhaust returns.

One engine (width 256, six blocks) in seven variants that differ only in their
norms and merges: Pre-LN, Post-LN, sandwich, ReZero, LayerScale, DeepNorm and the
parallel (full-flow) block. For each it writes the power-cycle diagram, then one
SVG with all of them stacked for comparison, and prints what the variants cost
and what the reviewer says about each.

    python examples/draw_variants.py                  # writes variants/ here, a few seconds
    python examples/draw_variants.py --out /tmp/v --labels ml

Without the Graphviz `dot` program it writes the DOT sources instead.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import cyclelang
from cyclelang.backends.graphviz import render, to_dot
from cyclelang.review import analyze, review

ATTN = "turbine attention heads=4"
MLP = "turbine mlp ratio=4"

# The blocks: the only thing that changes from one variant to the next.
BLOCKS = {
    "pre_ln": f"""
    prechamber mix  {{ norm layernorm  {ATTN}  merge cooling }}
    prechamber burn {{ norm layernorm  {MLP}  merge cooling }}""",
    "post_ln": f"""
    prechamber mix  {{ {ATTN} }}
    norm layernorm
    prechamber burn {{ {MLP} }}
    norm layernorm""",
    "sandwich": f"""
    prechamber mix  {{ norm layernorm  {ATTN}  norm layernorm }}
    prechamber burn {{ norm layernorm  {MLP}  norm layernorm }}""",
    "rezero": f"""
    prechamber mix  {{ {ATTN}  merge rezero }}
    prechamber burn {{ {MLP}  merge rezero }}""",
    "layerscale": f"""
    prechamber mix  {{ norm layernorm  {ATTN}  merge layerscale }}
    prechamber burn {{ norm layernorm  {MLP}  merge layerscale }}""",
    "deepnorm": f"""
    prechamber mix  {{ {ATTN}  merge deepnorm }}
    norm layernorm
    prechamber burn {{ {MLP}  merge deepnorm }}
    norm layernorm""",
    "parallel": f"""
    fullflow {{
      norm layernorm
      prechamber mix  {{ {ATTN}  merge cooling }}
      prechamber burn {{ {MLP}  merge cooling }}
    }}""",
}
# Pre-LN-style blocks leave the stream un-normalised: one valve before the nozzle.
FINAL_NORM = {"pre_ln", "sandwich", "layerscale", "parallel"}


def spec_text(name: str) -> str:
    final = "\n  norm layernorm" if name in FINAL_NORM else ""
    return f"""engine {name} {{
  chamber width=256
  throat causal
  feed tokens vocab=4096 context=256

  stage block x 6 {{{BLOCKS[name]}
  }}
{final}
  nozzle head tied
}}
"""


def stack_svgs(svgs: list[str]) -> str:
    """One SVG holding the given Graphviz SVGs one under the other, at their own sizes (pt)."""
    parts, y, width = [], 0.0, 0.0
    gap = 12.0
    for svg in svgs:
        body = svg[svg.index("<svg"):]
        m = re.match(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', body)
        w, h = float(m.group(1)), float(m.group(2))
        # nested <svg> at (0, y); unitless sizes are user units, which the outer viewBox makes points
        body = body.replace(m.group(0), f'<svg x="0" y="{y:g}" width="{w:g}" height="{h:g}"', 1)
        parts.append(body.strip())
        y += h + gap
        width = max(width, w)
    height = y - gap
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
            f'width="{width:g}pt" height="{height:g}pt" viewBox="0 0 {width:g} {height:g}">\n'
            f'<rect width="100%" height="100%" fill="white"/>\n')
    return '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + head + "\n".join(parts) + "\n</svg>\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("variants"), help="output folder [variants]")
    parser.add_argument("--labels", choices=("rocket", "ml", "both"), default="both")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    have_dot = shutil.which("dot") is not None

    print(f"{'variant':<12}{'parameters':>12}{'valves':>9}{'merges':>9}  reviewer")
    svgs = []
    for name in BLOCKS:
        text = spec_text(name)
        (args.out / f"{name}.cycle").write_text(text, "utf-8")
        spec = cyclelang.parse(text, f"{name}.cycle")
        p = analyze(spec)["params"]
        said = ", ".join(f"{d.code} {d.message}" for d in review(spec)) or "clean"
        print(f"{name:<12}{p['total']:>12,}{p['by_role']['valve']:>9,}{p['by_role']['merge']:>9,}  {said}")
        dot = to_dot(spec, view="cycle", labels=args.labels)
        if have_dot:
            svg = render(dot, "svg").decode("utf-8")
            (args.out / f"{name}.svg").write_text(svg, "utf-8")
            svgs.append(svg)
        else:
            (args.out / f"{name}.dot").write_text(dot, "utf-8")
    if have_dot:
        (args.out / "variants.svg").write_text(stack_svgs(svgs), "utf-8")
        print(f"wrote {len(svgs)} diagrams and {args.out / 'variants.svg'} (all of them, stacked)")
    else:
        print(f"Graphviz's dot is not installed: wrote the DOT sources to {args.out}/ (render them with dot -Tsvg)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
