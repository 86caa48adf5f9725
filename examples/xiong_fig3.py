"""Xiong et al. (2020), Figure 3, on the test stand: FFN weight gradients at initialisation.

Fires the Post-LN and Pre-LN Transformers of examples/xiong/ (d=512, 8 heads,
FFN 2048, Xavier init, embeddings scaled by sqrt(d)) at initialisation and plots

  left:  the gradient norm of each layer's FFN output weights W2 (depth 6),
  right: the same for the last layer as the depth L grows.

Each point is the mean over SEEDS seeds (weights and tokens both change). Writes
docs/img/xiong_fig3.png and prints the numbers docs/test_stand.md quotes.

    python examples/xiong_fig3.py                  # a few minutes on 2 cores
    XIONG_SEEDS=1 XIONG_DEPTHS=6 python examples/xiong_fig3.py   # a smoke run
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cyclelang  # noqa: E402
from cyclelang.io import atomic_write  # noqa: E402

SPECS = {"Post-LN": ROOT / "examples/xiong/post_ln.cycle", "Pre-LN": ROOT / "examples/xiong/pre_ln.cycle"}
SEEDS = range(int(os.environ.get("XIONG_SEEDS", "3")))
DEPTHS = [int(d) for d in os.environ.get("XIONG_DEPTHS", "6,12,18").split(",")]
BATCH, SEQ = 8, 64


def w2(stage) -> float:
    return stage.params["burn.mlp.proj.weight"]


def main(out: Path = ROOT / "docs/img/xiong_fig3.png") -> dict:
    import torch

    torch.set_num_threads(1)  # see docs/test_stand.md, Limits
    per_layer, last = {}, {}
    for label, spec in SPECS.items():
        runs = [cyclelang.fire(str(spec), depth=DEPTHS[0], batch=BATCH, seq=SEQ, seed=s).runs[0] for s in SEEDS]
        per_layer[label] = [statistics.mean(w2(r.stages[k]) for r in runs) for k in range(DEPTHS[0])]
        last[label] = []
        for L in DEPTHS:
            rs = runs if L == DEPTHS[0] else [cyclelang.fire(str(spec), depth=L, batch=BATCH, seq=SEQ, seed=s).runs[0] for s in SEEDS]
            last[label].append(statistics.mean(w2(r.stages[-1]) for r in rs))
    for label in SPECS:
        print(f"{label:8s} W2 grad by layer (L={DEPTHS[0]}):", " ".join(f"{v:.3f}" for v in per_layer[label]))
        print(f"{label:8s} last-layer W2 grad by depth {DEPTHS}:", " ".join(f"{v:.3f}" for v in last[label]))

    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label in SPECS:
        a.plot(range(1, DEPTHS[0] + 1), per_layer[label], marker="o", label=label)
        b.plot(DEPTHS, last[label], marker="o", label=label)
    a.set_title(f"W2 gradient norm by layer, {DEPTHS[0]} layers", fontsize=10)
    a.set_xlabel("layer")
    b.set_title("last layer's W2 gradient norm by depth", fontsize=10)
    b.set_xlabel("layers L")
    for ax in (a, b):
        ax.set_ylabel("gradient norm")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"at initialisation, d=512, Xavier, mean of {len(SEEDS)} seeds, {BATCH}x{SEQ} random tokens", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    atomic_write(out, buf.getvalue())
    return {"per_layer": per_layer, "last": last}


if __name__ == "__main__":
    main()
