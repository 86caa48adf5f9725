"""The run's curves as a PNG: train and held-out loss, learning rate, gradient norm against step."""

from __future__ import annotations

import io
import json
from pathlib import Path


def read_metrics(run_dir) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def plot(records: list[dict], title: str = "") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "loss" in r and r["loss"] is not None]
    val = [r for r in records if r.get("val_loss") is not None]
    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True, constrained_layout=True)
    ax = axes[0]
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], lw=0.8, label="train loss")
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", ms=3, label="held-out loss")
    spikes = [r for r in train if r.get("spike")]
    if spikes:
        ax.plot([r["step"] for r in spikes], [r["loss"] for r in spikes], "rx", label="spike")
    ax.set_ylabel("loss (nats/token)")
    ax.legend()
    ax.set_title(f"{title}: training" if title else "training")
    axes[1].plot([r["step"] for r in train], [r["lr"] for r in train], color="tab:green")
    axes[1].set_ylabel("learning rate (throttle)")
    axes[2].plot([r["step"] for r in train], [r["grad_norm"] for r in train], color="tab:red", lw=0.8)
    axes[2].set_ylabel("gradient norm")
    axes[2].set_xlabel("step")
    for a in axes:
        a.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
