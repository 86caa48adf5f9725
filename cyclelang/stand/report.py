"""Show a stand report: a table for the terminal, plots for the page.

`table` is torch-free and deterministic; `plot` imports matplotlib (Agg) only
when called and overlays every run, so Pre-LN and Post-LN share one set of axes.
"""

from __future__ import annotations

import io
import math

from .result import Firing, StandReport

_MARK = {"pass": "ok  ", "fail": "FAIL", "skip": "--  "}


def _g(v: float | None) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if v != 0 else "0"


def _ffn_out(stage) -> float | None:
    """The gradient norm of a stage's MLP output weights (Xiong et al.'s W2), if it has one MLP."""
    keys = [k for k in stage.params if k.endswith("mlp.proj.weight")]
    return stage.params[keys[0]] if len(keys) == 1 else None


def run_table(r: Firing) -> str:
    s = r.settings
    out = [f"{r.name} ({r.file}): width {s.width}, {s.depth} stages, {s.params:,} parameters; "
           f"{s.batch} x {s.seq} tokens ({s.data}), seed {s.seed}",
           f"  loss at ignition {_g(r.loss)} nats/token; feed pressure (RMS) {_g(r.feed_pressure)}"]
    names = []
    for st in r.stages:
        for b in st.branches:
            if b.name not in names:
                names.append(b.name)
    head = ["depth", "stage", "pressure", "grad in", "grad W2"] + [f"{n} f/x" for n in names] + [f"{n} grad" for n in names]
    rows = []
    for st in r.stages:
        by = {b.name: b for b in st.branches}
        rows.append([str(st.depth), st.stage, _g(st.pressure), _g(st.grad_in), _g(_ffn_out(st))]
                    + [_g(by[n].intensity) if n in by else "" for n in names]
                    + [_g(by[n].grad_norm) if n in by else "" for n in names])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for row in [head] + rows:
        out.append("  " + "  ".join(c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    for c in r.checks:
        out.append(f"  {_MARK[c.status]} {c.name}: {c.detail}")
    t = r.training
    if t is not None:
        first = t.loss[0] if t.loss else None
        out.append(f"  trained {t.done}/{t.steps} steps on {t.source}, objective {t.objective}: "
                   f"loss {_g(first)} -> {_g(t.final_loss)} (mean of the last 10%)" + (" [interrupted]" if t.interrupted else ""))
        if t.floor is not None:
            out.append(f"  floor {t.floor:.3f} nats/token (the best any model can do on this source and objective), "
                       f"unigram {t.unigram:.3f} (what ignoring context reaches)")
        else:
            out.append("  floor unknown (a file's bytes have no known entropy rate): compare runs with each other, not with a floor")
        f = t.flameout
        if f is not None:
            blame = "" if f.group is None else (f"; the largest update ratio ||dp||/||p|| before it: {f.group} "
                                                f"{_g(f.update_ratio)} (first step {_g(f.first_ratio)})")
            out.append(f"  FLAMEOUT at step {f.step + 1}: {f.reason}{blame}")
        if t.spikes:
            out.append("  loss spikes: " + ", ".join(f"step {k.step + 1} +{_g(k.size)} nats" for k in t.spikes))
        else:
            out.append("  loss spikes: none")
        for note in t.notes:
            out.append(f"  note: {note}")
    return "\n".join(out) + "\n"


def table(report: StandReport) -> str:
    return "\n".join(run_table(r) for r in report.runs) + ("(interrupted)\n" if report.interrupted else "")


def plot(report: StandReport) -> bytes:
    """PNG bytes: chamber pressure, the pressure chain, burn intensity and the FFN weights'
    gradient per depth, every run overlaid; with training, the loss and gradient-norm curves too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = any(r.training is not None for r in report.runs)
    nrows = 3 if trained else 2
    fig, axes = plt.subplots(nrows, 2, figsize=(11, 3.4 * nrows))
    ax = axes.flatten()
    styles = ["-", "--", ":", "-."]
    for k, r in enumerate(report.runs):
        label = f"{r.name} (w{r.settings.width})"
        color = f"C{k % 10}"  # one colour per engine on every panel; branches differ by line style
        depths = [0] + [s.depth for s in r.stages]
        ax[0].plot(depths, [r.feed_pressure] + [s.pressure for s in r.stages], marker="o", ms=3, color=color, label=label)
        ax[1].plot([s.depth for s in r.stages], [s.grad_in for s in r.stages], marker="o", ms=3, color=color, label=label)
        names = []
        for st in r.stages:
            names += [b.name for b in st.branches if b.name not in names and not b.overboard]
        for j, n in enumerate(names):
            pts = [(st.depth, b.intensity) for st in r.stages for b in st.branches if b.name == n]
            ax[2].plot(*zip(*pts), marker="o", ms=3, color=color, ls=styles[j % len(styles)], label=f"{r.name}: {n}")
        w2 = [(s.depth, _ffn_out(s)) for s in r.stages if _ffn_out(s) is not None]
        if w2:
            ax[3].plot(*zip(*w2), marker="o", ms=3, color=color, label=label)
        if r.training is not None and r.training.loss:
            steps = range(1, len(r.training.loss) + 1)
            ax[4].plot(steps, r.training.loss, lw=1, color=color, label=label)
            ax[5].plot(steps, r.training.grad_norm, lw=1, color=color, label=label)
            for k in r.training.spikes:
                ax[4].plot([k.step + 1], [k.loss], "kx", ms=6)
    titles = ["chamber pressure: RMS of the residual stream", "pressure chain: ||dL/dx|| entering each stage",
              "burn intensity: ||f(x)|| / ||x|| per branch", "FFN output weights (W2): gradient norm"]
    ylabels = ["RMS", "gradient norm", "ratio", "gradient norm"]
    from matplotlib.ticker import MaxNLocator

    for a, t, y in zip(ax[:4], titles, ylabels):
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.set_title(t, fontsize=10)
        a.set_xlabel("depth (stage)")
        a.set_ylabel(y)
    for a in (ax[1], ax[2], ax[3]):
        if any(line.get_ydata().size and min(line.get_ydata()) > 0 for line in a.get_lines()):
            a.set_yscale("log")
    if trained:
        floors = {r.training.floor for r in report.runs if r.training is not None and r.training.floor is not None}
        for f in floors:
            ax[4].axhline(f, color="k", ls="--", lw=0.8, label="floor (best possible loss)")
        ax[4].set_title("loss during training (x: spikes)", fontsize=10)
        ax[4].set_xlabel("step")
        ax[4].set_ylabel("nats/token")
        ax[5].set_title("gradient norm before clipping", fontsize=10)
        ax[5].set_xlabel("step")
        ax[5].set_yscale("log")
    for a in ax:
        if a.get_lines():
            a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
