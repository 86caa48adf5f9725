"""Draw a family of block variants side by side: where the valves sit, how the exhaust returns.

One engine (width 256, six blocks) in seven variants that differ only in their
norms and merges: Pre-LN, Post-LN, sandwich, ReZero, LayerScale, DeepNorm and the
parallel (full-flow) block. For each it writes the spec and its power-cycle
diagram, then all of them in compare mode, as small multiples on one grid with
one legend (what `cyclec draw a.cycle b.cycle ... -o variants.svg` draws), and
prints what the variants cost and what the reviewer says about each.

    python examples/draw_variants.py                  # writes variants/ here, a few seconds
    python examples/draw_variants.py --out /tmp/v --labels ml

Without the Graphviz `neato` program it writes the DOT sources instead.
"""

from __future__ import annotations

import argparse
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("variants"), help="output folder [variants]")
    parser.add_argument("--labels", choices=("rocket", "ml", "both"), default="both")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    have_dot = shutil.which("neato") is not None

    print(f"{'variant':<12}{'parameters':>12}{'valves':>9}{'merges':>9}  reviewer")
    specs = []
    for name in BLOCKS:
        text = spec_text(name)
        (args.out / f"{name}.cycle").write_text(text, "utf-8")
        spec = cyclelang.parse(text, f"{name}.cycle")
        specs.append(spec)
        p = analyze(spec)["params"]
        said = ", ".join(f"{d.code} {d.message}" for d in review(spec)) or "clean"
        print(f"{name:<12}{p['total']:>12,}{p['by_role']['valve']:>9,}{p['by_role']['merge']:>9,}  {said}")
        dot = to_dot(spec, view="cycle", labels=args.labels)
        if have_dot:
            (args.out / f"{name}.svg").write_bytes(render(dot, "svg"))
        else:
            (args.out / f"{name}.dot").write_text(dot, "utf-8")
    # compare mode: every variant on one grid, one legend, the same scale for all
    both = to_dot(specs, view="cycle", labels=args.labels)
    if have_dot:
        (args.out / "variants.svg").write_bytes(render(both, "svg"))
        print(f"wrote {len(specs)} diagrams and {args.out / 'variants.svg'} (all of them side by side, one legend); the same as")
    else:
        (args.out / "variants.dot").write_text(both, "utf-8")
        print(f"Graphviz's neato is not installed: wrote the DOT sources to {args.out}/ (render them with neato -n2 -Tsvg); the compare figure is")
    print(f"  cyclec draw {' '.join(str(args.out / (n + '.cycle')) for n in BLOCKS)} -o {args.out / 'variants.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
