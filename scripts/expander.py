"""Measure the expander argument: `python scripts/expander.py` (writes docs/expander.md's table and plot).

Engines at the same width and depth differ only in their mixer: multi-head
attention (gpt2-style), grouped-query attention with one KV head (MQA), latent
attention (MLA), linear attention with retention, Mamba-2 and Mamba-1 SSMs, gated
DeltaNet and LFM2's short convolution. For each context
length n it measures, on the built modules (CPU, float32):

- forward FLOPs per token, counted by torch.utils.flop_counter.FlopCounterMode over a
  forward pass of n tokens (divided by n), with SDPA's math kernel so that attention's
  matrix products are counted (the fused CPU kernel is not, on some torch builds);
- the decoding state after n tokens: Cache.nbytes() after a prefill of n tokens into a
  cache reserved for exactly n positions (so a KV cache counts what it holds).

Nothing here is taken from the kinds table: these are the modules' own numbers, which
the static report (`cyclec check --report`) predicts.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cyclelang  # noqa: E402

LENGTHS = (256, 512, 1024, 2048, 4096)
MIXERS = {
    "attention (gpt2-style)": "turbine attention heads=4 rotary bias=false",
    "MQA (kv_heads=1)": "turbine attention heads=4 kv_heads=1 rotary bias=false",
    "latent attention (MLA)": "turbine attention heads=4 latent=64 head_dim=64 rotary_dims=16 bias=false",
    "linear attention": "turbine linear_attention heads=4 retention chunk=64 bias=false",
    "SSM (Mamba-2)": "turbine ssm heads=8 state=64 chunk=256",
    "SSM (Mamba-1)": "turbine ssm version=1 state=16 expand=2 conv=4",
    "gated DeltaNet": "turbine delta heads=4 chunk=64",
    "short conv (LFM2)": "turbine short_conv size=3",
}
SPEC = """
engine cmp {{
  chamber width=256
  throat causal
  feed tokens vocab=512 context=4096 position=none
  stage block x 4 {{
    prechamber mix {{ norm rmsnorm  {mixer}  merge cooling }}
    prechamber burn {{ norm rmsnorm  turbine mlp ratio=4 act=swiglu bias=false  merge cooling }}
  }}
  norm rmsnorm
  nozzle head tied
}}
"""


def measure() -> dict[str, list[tuple[int, float, int]]]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    out = {}
    for name, mixer in MIXERS.items():
        model = cyclelang.build(cyclelang.parse(SPEC.format(mixer=mixer))).eval()
        Cache = sys.modules[type(model).__module__].Cache
        rows = []
        for n in LENGTHS:
            idx = torch.randint(0, 512, (1, n))
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):  # the math kernel's matmuls are counted on every build
                model(idx)
            cache = Cache(n)
            with torch.no_grad():
                model(idx, cache=cache)
            rows.append((n, counter.get_total_flops() / n, cache.nbytes()))
        out[name] = rows
    return out


def table(data) -> str:
    head = "| mixer | " + " | ".join(f"n={n}" for n in LENGTHS) + " |"
    lines = [head, "|---|" + "---|" * len(LENGTHS)]
    for name, rows in data.items():
        lines.append(f"| {name}: MFLOPs/token | " + " | ".join(f"{f / 1e6:.2f}" for _, f, _ in rows) + " |")
    for name, rows in data.items():
        lines.append(f"| {name}: state KiB | " + " | ".join(f"{b / 1024:,.0f}" for _, _, b in rows) + " |")
    return "\n".join(lines)


def plot(data, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in data.items():
        ns = [n for n, _, _ in rows]
        a.plot(ns, [f / 1e6 for _, f, _ in rows], marker="o", label=name)
        b.plot(ns, [x / 2**20 for _, _, x in rows], marker="o", label=name)
    for ax, title, unit in ((a, "forward FLOPs per token", "MFLOPs"), (b, "decoding state after n tokens", "MiB (float32)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length n")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=8)
    fig.suptitle("width 256, 4 layers, the same MLP: only the mixer differs (measured)")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)


if __name__ == "__main__":
    data = measure()
    print(table(data))
    plot(data, ROOT / "docs" / "img" / "expander.png")
    print("wrote docs/img/expander.png")
