"""GPT-2 drawn four ways, for docs/gallery.md: `python scripts/gpt2_side_by_side.py`.

- cyclec: `cyclec draw specs/gpt2.cycle --size slide` (PNG at 100 dpi);
- torchview (`pip install torchview`), on transformers' GPT2LMHeadModel built from its
  config with random weights (nothing is downloaded, no KV cache), 12 layers, module depth 3
  (attention, MLP, norms) with the repeated blocks rolled up;
- the torch.fx drawer (`torch.fx.passes.graph_drawer.FxGraphDrawer`, needs pydot), on the
  model cyclelang builds from specs/gpt2.cycle. `symbolic_trace` cannot pass the model's own
  input checks (`if past + T > context`) nor the attention's mask choice (`k.size(2) == T`),
  which branch on traced sizes; so it traces a four-line module that calls the model's own
  embedding, blocks, final norm and tied head in the model's order, with each attention a leaf
  (one node). The traced module's logits are checked equal to the model's;
- the classic figure (Vaswani et al. 2017, Figure 1, the decoder side without the encoder's
  cross-attention, which is how GPT draws its block), redrawn by hand below as pinned DOT.

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
    import torch
    import torch.fx
    import torch.nn.functional as F
    from PIL import Image
    from torch.fx.passes.graph_drawer import FxGraphDrawer

    import cyclelang

    model = cyclelang.build(ROOT / "specs" / "gpt2.cycle").eval()
    attention = type(model.stages[0].mix.attn)

    class Blocks(torch.nn.Module):
        """The model's forward without its input checks and its cache: what fx can trace."""

        def __init__(self, m):
            super().__init__()
            self.feed, self.stages, self.norm = m.feed, m.stages, m.norm

        def forward(self, idx):
            x = self.feed(idx, 0, None)
            for stage in self.stages:
                x = stage(x, None, None)
            return F.linear(self.norm(x), self.feed.tok.weight)

    class AttentionLeaf(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, attention) or super().is_leaf_module(m, name)

    root = Blocks(model)
    traced = torch.fx.GraphModule(root, AttentionLeaf().trace(root))
    idx = torch.randint(0, model.config.vocab_size, (1, 8))
    with torch.no_grad():
        assert torch.equal(traced(idx), model(idx)), "the traced module computes something else"
    dot = FxGraphDrawer(traced, "gpt2").get_dot_graph().to_string()
    png = subprocess.run(["dot", "-Tpng", "-Gdpi=100"], input=dot.encode(), capture_output=True, check=True).stdout
    Image.MAX_IMAGE_PIXELS = None  # a strip of 12 blocks is taller than PIL's bomb limit
    import io

    im = Image.open(io.BytesIO(png))
    print(f"torch.fx: {len(traced.graph.nodes)} nodes, {im.size[0]}x{im.size[1]} px in all; the gallery shows its top left 2,600x1,600 px")
    top = OUT / "gpt2_fx_top.png"
    im.crop((0, 0, min(im.size[0], 2600), min(im.size[1], 1600))).save(top)
    return top


# The classic figure, by hand: (id, label, x, y, width, height, fill) in points, y up. Its
# colours and words follow Vaswani et al.'s Figure 1 (Add & Norm after each sub-layer: the
# Post-LN block of the original Transformer; GPT-2 moved the norms in front, which is what
# the cyclec figure beside it draws).
CLASSIC = [
    ("tokens", "Outputs\\n(shifted right)", 150, 30, 120, 30, ""),
    ("embed", "Output\\nEmbedding", 150, 85, 120, 36, "#f5c6c9"),
    ("attn", "Masked\\nMulti-Head\\nAttention", 150, 200, 130, 52, "#f7d7b5"),
    ("addnorm1", "Add & Norm", 150, 255, 130, 24, "#f3f0b8"),
    ("ff", "Feed\\nForward", 150, 320, 130, 40, "#c8e2f4"),
    ("addnorm2", "Add & Norm", 150, 380, 130, 24, "#f3f0b8"),
    ("linear", "Linear", 150, 455, 120, 26, "#dcd0ea"),
    ("softmax", "Softmax", 150, 500, 120, 26, "#c5e3bd"),
    ("probs", "Output\\nProbabilities", 150, 552, 110, 30, ""),
]
# Its wires, as polylines (the last point gets the arrowhead): the main path, the positional
# encoding's add, and the two residual connections round each sub-layer.
CLASSIC_WIRES = [
    [(150, 45), (150, 67)], [(150, 103), (150, 126)], [(150, 144), (150, 174)], [(150, 226), (150, 243)],
    [(150, 267), (150, 300)], [(150, 340), (150, 368)], [(150, 392), (150, 442)], [(150, 468), (150, 487)],
    [(150, 513), (150, 537)], [(99, 135), (141, 135)],
    [(150, 164), (70, 164), (70, 255), (85, 255)], [(150, 282), (70, 282), (70, 380), (85, 380)],
]


def classic_png() -> Path:
    """The classic Transformer figure's decoder-only block, laid out by hand (pinned DOT, drawn
    by neato -n2 as cyclec's own figures are)."""
    out = ["digraph classic {", '\tgraph [bgcolor="white" pad="0.2" bb="0,0,300,575"]',
           '\tnode [fontname="Helvetica" fontsize="14" fixedsize="true" penwidth="1.2"]',
           '\tedge [penwidth="1.4" arrowsize="0.7"]',
           '\tframe [label="" shape="box" style="rounded,filled" fillcolor="#efefef" color="#555555" penwidth="1.5" '
           'pos="150,290!" width="2.639" height="3.611"]',
           '\tnx [label="N×" shape="plaintext" pos="272,290!" width="0.5" height="0.3" fontsize="18"]',
           '\tplus [label="+" shape="circle" style="filled" fillcolor="white" pos="150,135!" width="0.25" height="0.25"]',
           '\tpe [label="~" shape="circle" style="filled" fillcolor="white" pos="90,135!" width="0.25" height="0.25" fontsize="16"]',
           '\tpelabel [label="Positional\\nEncoding" shape="plaintext" pos="42,135!" width="0.9" height="0.4" fontsize="12"]']
    for nid, label, x, y, w, h, fill in CLASSIC:
        look = f'shape="box" style="rounded,filled" fillcolor="{fill}"' if fill else 'shape="plaintext"'
        out.append(f'\t{nid} [label="{label}" {look} pos="{x},{y}!" width="{w / 72:.3f}" height="{h / 72:.3f}"]')
    for k, pts in enumerate(CLASSIC_WIRES):
        (ax, ay), (bx, by) = pts[-2], pts[-1]
        L = ((bx - ax) ** 2 + (by - ay) ** 2) ** 0.5
        line = pts[:-1] + [(bx - (bx - ax) * 6 / L, by - (by - ay) * 6 / L)]  # the arrowhead takes the last 6 pt
        bez = [line[0]]
        for (x0, y0), (x1, y1) in zip(line, line[1:]):
            bez += [(x0 + (x1 - x0) / 3, y0 + (y1 - y0) / 3), (x0 + 2 * (x1 - x0) / 3, y0 + 2 * (y1 - y0) / 3), (x1, y1)]
        out.append(f'\tw{k}a [shape="point" style="invis" width="0.01" height="0.01" label="" pos="{pts[0][0]},{pts[0][1]}!"]')
        out.append(f'\tw{k}b [shape="point" style="invis" width="0.01" height="0.01" label="" pos="{bx},{by}!"]')
        out.append(f'\tw{k}a -> w{k}b [pos="e,{bx},{by} ' + " ".join(f"{x:.1f},{y:.1f}" for x, y in bez) + '"]')
    out.append("}")
    dot = "\n".join(out) + "\n"
    path = OUT / "classic_transformer.png"
    path.write_bytes(subprocess.run(["neato", "-n2", "-Tpng", "-Gdpi=100"], input=dot.encode(), capture_output=True, check=True).stdout)
    return path


def main() -> int:
    from PIL import Image

    OUT.mkdir(parents=True, exist_ok=True)
    for make in (cyclec_png, torchview_png, fx_png, classic_png):
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
