"""The front end: CLI start-up over bare Python, parse + check rate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from .common import median, ROOT


def _cyclec():
    exe = Path(sysconfig.get_path("scripts")) / "cyclec"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "cyclelang"]


def _run_time(cmd, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        ts.append(time.perf_counter() - t0)
    return ts


def synthetic(n: int) -> str:
    """A spec of n stage definitions (10 lines each) and an engine using each once."""
    parts = []
    for i in range(n):
        parts.append(f"stage s{i}(h) {{\n  prechamber mix {{\n    norm layernorm\n    turbine attention heads=h\n  }}\n"
                     f"  prechamber burn {{\n    norm layernorm\n    turbine mlp ratio=4 act=gelu\n  }}\n}}\n")
    parts.append("engine synth {\n  chamber width=64\n  throat causal\n  feed tokens vocab=256 context=64 position=learned\n")
    parts += [f"  stage s{i}(h=4)\n" for i in range(n)]
    parts.append("  norm layernorm\n  nozzle head tied\n}\n")
    return "".join(parts)


def bench_frontend(args):
    import cyclelang
    from cyclelang import review

    reps = args.cli_reps
    gpt2 = "specs/gpt2.cycle"
    # Bytecode first, as `pip install` does: otherwise (PYTHONDONTWRITEBYTECODE, a read-only
    # tree) every start recompiles the sources, and the parse tables' literal most of all.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "cyclelang")], check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        sides = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "cyclec check": _cyclec() + ["check", gpt2],
            "cyclec draw -o x.dot": _cyclec() + ["draw", gpt2, "-o", os.path.join(tmp, "x.dot")],
        }
        times = {k: [] for k in sides}
        for _ in range(reps):  # interleaved, like the training rounds
            for k, cmd in sides.items():
                times[k] += _run_time(cmd, 1)
        env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
        imported = subprocess.run(_cyclec() + ["draw", gpt2, "-o", os.path.join(tmp, "y.dot")], cwd=ROOT, env=env, capture_output=True, text=True).stderr
        torch_free = not re.search(r"\|\s+torch$", imported, re.M)
    bare = median(times["python -c pass"])
    cli = {k: median(v) - bare for k, v in times.items() if k != "python -c pass"}
    print(f"  bare python {bare * 1000:.0f} ms; over it: " + ", ".join(f"{k} +{v * 1000:.0f} ms" for k, v in cli.items()) + f"; torch imported: {not torch_free}", flush=True)

    cyclelang.parse(synthetic(2))  # the parser is built once per process: not part of the rate
    scale = []
    texts = [(f"{n} stage definitions", synthetic(n)) for n in (10, 100, 1000)]
    texts.append(("10,000 lines", synthetic(999)))
    for label, text in texts:
        lines = text.count("\n")
        ts, cs = [], []
        for _ in range(args.parse_reps):
            t0, c0 = time.perf_counter(), time.process_time()
            review.review(cyclelang.parse(text))
            ts.append(time.perf_counter() - t0)
            cs.append(time.process_time() - c0)
        t, c = median(ts), median(cs)
        scale.append({"label": label, "lines": lines, "s": t, "rate": lines / t, "cpu_s": c, "cpu_rate": lines / c})
        print(f"  {label}: {lines} lines, {t * 1000:.1f} ms ({c * 1000:.1f} ms CPU), {lines / t:,.0f} lines/s ({lines / c:,.0f} per CPU second)", flush=True)
    return {"bare": bare, "cli": cli, "torch_free": torch_free, "scale": scale}
