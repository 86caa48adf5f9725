"""The run's curves as a PNG: train and held-out loss, learning rate, gradient norm against step."""

from __future__ import annotations

import io
import json
from pathlib import Path


def parse_metrics(raw: bytes, where: str = "metrics.jsonl", warn=None) -> list[dict]:
    """The records of metrics.jsonl's bytes. A line that is not a JSON object with a whole
    `step` (a run killed mid-write leaves a partial last line; a damaged file, garbage) is
    skipped, and `warn(message)` is told which lines were."""
    records, bad = [], []
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            record = None
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            records.append(record)
        else:
            bad.append(number)
    if bad and warn is not None:
        last = " (the last one partial: the run stopped while writing it)" if bad[-1] == len(lines) and raw.strip() else ""
        shown = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        warn(f"{where}: skipped {len(bad)} line{'s' if len(bad) > 1 else ''} that {'are' if len(bad) > 1 else 'is'} not a "
             f"metrics record (line {shown}){last}")
    return records


def read_metrics(run_dir, warn=None) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return parse_metrics(path.read_bytes(), str(path), warn)


def plot(records: list[dict], title: str = "") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def num(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    train = [r for r in records if num(r.get("loss")) and num(r.get("lr")) and num(r.get("grad_norm"))]
    val = [r for r in records if num(r.get("val_loss"))]
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
