"""GPT-2 drawn three ways, for docs/gallery.md: `python scripts/gpt2_side_by_side.py`.

- cyclec: `cyclec draw specs/gpt2.cycle --size slide` (PNG at 100 dpi);
- torchview (`pip install torchview`), on transformers' GPT2LMHeadModel built from its
  config with random weights (nothing is downloaded, no KV cache), 12 layers, module depth 3
  (attention, MLP, norms) with the repeated blocks rolled up;
- the torch.fx drawer (`torch.fx.passes.graph_drawer.FxGraphDrawer`, needs pydot), on
  the model cyclelang builds from specs/gpt2.cycle, traced with torch.fx.

The PNGs land in docs/img/side_by_side/ with their pixel sizes printed; they depend on the
installed torch, transformers, torchview and Graphviz versions, so no test compares them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "side_by_side"


def cyclec_png() -> Path:
    from cyclelang.backends.graphviz import render, to_dot
    from cyclelang.semantics.resolve import parse

    spec = parse((ROOT / "specs" / "gpt2.cycle").read_text("utf-8"), "specs/gpt2.cycle")
    path = OUT / "gpt2_cyclec.png"
    dot = to_dot(spec, size="slide")
    path.write_bytes(render(dot, "png"))
    return path


def torchview_png() -> Path:
    import torch
    from torchview import draw_graph
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(use_cache=False)).eval()  # no KV-cache outputs to draw
    graph = draw_graph(model, input_data=torch.zeros(1, 8, dtype=torch.long), depth=3, roll=True, expand_nested=False,
                       graph_name="gpt2", save_graph=False)
    dot = graph.visual_graph.source
    path = OUT / "gpt2_torchview.png"
    path.write_bytes(subprocess.run(["dot", "-Tpng", "-Gdpi=100"], input=dot.encode(), capture_output=True, check=True).stdout)
    from PIL import Image

    im = Image.open(path)
    print(f"{path.relative_to(ROOT)}: {im.size[0]}x{im.size[1]} px in all; the gallery shows its top 1,600 px")
    im.crop((0, 0, im.size[0], min(im.size[1], 1600))).save(OUT / "gpt2_torchview_top.png")
    path.unlink()
    return OUT / "gpt2_torchview_top.png"


def fx_png() -> Path:
    import torch.fx
    from torch.fx.passes.graph_drawer import FxGraphDrawer

    import cyclelang

    model = cyclelang.build(ROOT / "specs" / "gpt2.cycle")
    traced = torch.fx.symbolic_trace(model)
    dot = FxGraphDrawer(traced, "gpt2").get_dot_graph().to_string()
    path = OUT / "gpt2_fx.png"
    path.write_bytes(subprocess.run(["dot", "-Tpng", "-Gdpi=100"], input=dot.encode(), capture_output=True, check=True).stdout)
    return path


def main() -> int:
    from PIL import Image

    OUT.mkdir(parents=True, exist_ok=True)
    for make in (cyclec_png, torchview_png, fx_png):
        try:
            path = make()
        except Exception as e:  # a drawer that is not installed or cannot trace: say so and go on
            print(f"{make.__name__}: not drawn ({type(e).__name__}: {str(e)[:200]})")
            continue
        w, h = Image.open(path).size
        print(f"{path.relative_to(ROOT)}: {w}x{h} px")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
