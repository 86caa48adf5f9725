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
    return _png(fig)


# --- the coordinate check and the LR sweep ------------------------------------------------------


def coord_table(c) -> str:
    """The coordinate check as text: each layer type's fitted exponent per step, flagged if it grows."""
    out = [f"coordinate check of {c.name} ({c.file}), {c.param}: widths {', '.join(map(str, c.widths))}; "
           f"{c.steps} steps at lr {c.lr:g} (no warmup or decay), {c.batch} x {c.seq} tokens, seed {c.seed}",
           "  mean |activation| ~ width^exponent, per step (step 1: at initialisation); "
           f"flagged: an exponent above {c.flag_at:g} at the last step"]
    head = ["layer", "what"] + [f"step {t + 1}" for t in range(c.steps)] + [""]
    rows = [[l.name, l.what] + [f"{e:+.2f}" if math.isfinite(e) else "nan" for e in l.exponent] + ["GROWS" if l.flag else ""]
            for l in c.layers]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for row in [head] + rows:
        out.append("  " + "  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths))).rstrip())
    out.append("  loss at the last step per width: " + ", ".join(f"{w}: {_g(v)}" for w, v in zip(c.widths, c.loss[-1])))
    grown = [l.name for l in c.layers if l.flag]
    out.append("  grows with width: " + (", ".join(grown) if grown else "nothing"))
    return "\n".join(out) + "\n"


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def coord_plot(checks) -> bytes:
    """The standard coordinate-check figure: a row per check (SP, μP, ...), a panel per step,
    mean |activation| against width on log-log axes, one line per layer type."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = max(c.steps for c in checks)
    fig, axes = plt.subplots(len(checks), steps, figsize=(2.6 * steps + 1.5, 2.7 * len(checks)), squeeze=False, sharey="row")
    for i, c in enumerate(checks):
        for t in range(steps):
            a = axes[i][t]
            if t >= c.steps:
                a.axis("off")
                continue
            for k, l in enumerate(c.layers):
                a.plot(c.widths, l.size[t], marker="o", ms=3, lw=1.2, color=f"C{k % 10}", label=l.name)
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_title(f"{c.name}, {c.param.split(' (')[0]}: step {t + 1}", fontsize=9)
            a.set_xlabel("width")
            a.grid(alpha=0.3)
        axes[i][0].set_ylabel("mean |activation|")
        axes[i][min(c.steps, steps) - 1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return _png(fig)


def sweep_table(s) -> str:
    out = [f"LR sweep of {s.name} ({s.file}): widths {', '.join(map(str, s.widths))}; {s.steps} steps at a constant lr on {s.source}, "
           f"{s.batch} x {s.seq} tokens, seed {s.seed}; final loss = mean of the last 10% of steps"]
    for sw in s.sweeps:
        out.append(f"  {sw.param}:")
        head = ["lr"] + [f"width {w}" for w in s.widths]
        by = {(r.width, r.lr): r for r in sw.runs}
        rows = []
        for lr in s.lrs:
            cells = []
            for w in s.widths:
                r = by[(w, lr)]
                v = "flameout" if r.final_loss is None else f"{r.final_loss:.3f}"
                cells.append(v + ("*" if sw.best.get(w) == lr else " "))
            rows.append([f"{lr:g}"] + cells)
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]
        for row in [head] + rows:
            out.append("    " + "  ".join(x.rjust(w) for x, w in zip(row, widths)))
        out.append("    best lr per width (*): " + ", ".join(f"{w}: {_g(sw.best.get(w))}" for w in s.widths))
    return "\n".join(out) + "\n"


def sweep_plot(sweeps) -> bytes:
    """Loss against learning rate, one line per width (the best marked with a star): a row per
    spec, a panel per parametrisation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len(s.sweeps) for s in sweeps)
    fig, axes = plt.subplots(len(sweeps), cols, figsize=(5.2 * cols, 3.8 * len(sweeps)), squeeze=False, sharey="row")
    for row, s in zip(axes, sweeps):
        for a, sw in zip(row, s.sweeps):
            for k, w in enumerate(s.widths):
                pts = dict((r.lr, r.final_loss) for r in sw.runs if r.width == w and r.final_loss is not None)
                if pts:
                    a.plot(list(pts), list(pts.values()), marker="o", ms=3, color=f"C{k % 10}", label=f"width {w}")
                best = sw.best.get(w)
                if best is not None:
                    a.plot([best], [pts[best]], "*", color=f"C{k % 10}", ms=10, mec="k")
            top = a.get_ylim()[1]
            for k, w in enumerate(s.widths):  # a flameout has no loss: an x on the top edge
                out = [r.lr for r in sw.runs if r.width == w and r.final_loss is None]
                if out:
                    a.plot(out, [top] * len(out), "x", color=f"C{k % 10}", ms=7, clip_on=False)
            a.set_xscale("log")
            a.set_title(f"{s.name}: {sw.param} (x: flameout)", fontsize=10)
            a.set_xlabel("learning rate")
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        row[0].set_ylabel(f"loss after {s.steps} steps (nats/token)")
    return _png(fig)
