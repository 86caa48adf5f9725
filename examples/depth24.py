"""Depth 24: Pre-LN, Post-LN, Post-LN with warmup, DeepNet and ReZero, trained side by side.

Five engines of 24 stages at chamber width 64 (specs in examples/depth24/), each
trained with its own startup block for STEPS steps (default 200) on the stand's
synthetic source: a seeded first-order Markov chain over 32 symbols whose
entropy rate (the floor under every loss curve) is known exactly. Same seed,
same batches, same learning rate (1e-3, Adam betas 0.9/0.98); they differ only
in where the valves sit, how the exhaust merges, and warmup.

    python examples/depth24.py                     # under 2 minutes on 2 cores
    DEPTH24_STEPS=20 python examples/depth24.py out.png   # a smoke run

Writes docs/img/depth24.png (or the path given) and prints the stand's table.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cyclelang  # noqa: E402
from cyclelang.io import atomic_write  # noqa: E402
from cyclelang.stand.report import plot, table  # noqa: E402

NAMES = ["pre_ln", "post_ln", "post_ln_warmup", "deepnet", "rezero"]
STEPS = int(os.environ.get("DEPTH24_STEPS", "200"))


def main(out: str | os.PathLike = ROOT / "docs/img/depth24.png", steps: int = STEPS):
    specs = [str(ROOT / "examples/depth24" / f"{n}.cycle") for n in NAMES]
    import torch

    torch.set_num_threads(1)  # engines this small are bound by per-op overhead; more threads only contend
    report = cyclelang.fire(specs, seq=32, batch=8, seed=0, train=steps)
    atomic_write(out, plot(report))
    return report


if __name__ == "__main__":
    r = main(*(sys.argv[1:2]))
    print(table(r), end="")
