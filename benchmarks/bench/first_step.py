"""Time to the first compiled step, cold and warm, every side in a fresh process."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import _loss, BENCH, median, models, ROOT, synchronize


SIDES = ("cyclec", "reference", "transformers")


def first_step_child(args, torch):
    """One side, in a process of its own: torch.compile and the first two training steps.

    Run by bench_first_step with TORCHINDUCTOR_CACHE_DIR set (a fresh folder: cold; the
    folder a cold run just filled: warm). Prints one JSON line: the seconds from
    torch.compile to the end of the first step (forward, backward, AdamW; the compilation
    happens inside it, forward and backward graphs alike), the second step's seconds, the
    graphs dynamo compiled in each step, graph breaks, and where the compilation went
    (torch._dynamo.utils.compile_times)."""
    from torch._dynamo.utils import compile_times, compilation_time_metrics, counters

    name, label = args.child.split(":")
    sides = dict(zip(SIDES, models(name, torch)))
    model, is_hf = sides.pop(label), label == "transformers"
    del sides
    gc.collect()
    B, T = args.batch, args.seq
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
    model.to(device=args.device, dtype=getattr(torch, args.dtype)).train()
    idx, tgt = idx.to(args.device), tgt.to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    counters.clear()
    compilation_time_metrics.clear()
    t0 = time.perf_counter()
    fwd = torch.compile(model, fullgraph=label == "cyclec")  # as in the compiled table
    graphs, ts = [], []
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        _loss(fwd, idx, tgt, hf=is_hf).backward()
        opt.step()
        synchronize(torch, args.device)
        ts.append(time.perf_counter())
        graphs.append(counters["stats"]["unique_graphs"])
    keys = {"dynamo": "bytecode_tracing", "aot": "create_aot_dispatcher_function", "inductor_fw": "compile_fx.<locals>.fw_compiler_base",
            "inductor_bw": "compile_fx.<locals>.bw_compiler", "codegen": "GraphLowering.codegen", "cpp_wait": "async_compile.wait"}
    phases = {k: sum(compilation_time_metrics.get(v, [])) for k, v in keys.items()}
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "."))
    out = {"first_s": ts[0] - t0, "second_s": ts[1] - ts[0], "graphs": graphs[0], "graphs_second": graphs[1] - graphs[0],
           "breaks": sum(counters["graph_break"].values()), "aot_cache": {k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")},
           "kernels": len(list(cache.rglob("*.cpp"))) + len(list(cache.rglob("triton_*.py"))) if cache.is_dir() else None, "phases": phases}
    if args.verbose_child:
        print(compile_times(repr="str", aggregate=True), file=sys.stderr)
    print("FIRST-STEP " + json.dumps(out), flush=True)


def bench_first_step(args, torch):
    """Time to the first compiled step, cold and warm, every side in a process of its own.

    A researcher who edits a spec waits for this each time: torch.compile, then the first
    training step, which is where dynamo traces the model and inductor compiles the forward
    and backward graphs. Cold: a fresh inductor cache (TORCHINDUCTOR_CACHE_DIR), so every
    kernel is generated and built; warm: the cache a cold run just filled, as on a second
    run of the same model (dynamo still traces: its caches are per process). Sides
    alternate within each round (reversed every other round); ratios are medians over
    rounds of the per-round ratios."""
    rows = []
    for name in args.first_specs.split(","):
        got = {label: {"cold": [], "warm": []} for label in SIDES}
        for r in range(args.first_rounds):
            for label in SIDES if r % 2 == 0 else reversed(SIDES):
                with tempfile.TemporaryDirectory(prefix="cyclec-inductor-") as cache:
                    for kind in ("cold", "warm"):
                        cmd = [sys.executable, str(BENCH / "run.py"), "--child", f"{name}:{label}", "--batch", str(args.batch), "--seq", str(args.seq),
                               "--threads", str(args.threads), "--device", args.device, "--dtype", args.dtype]
                        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
                        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
                        line = [x for x in res.stdout.splitlines() if x.startswith("FIRST-STEP ")]
                        if res.returncode or not line:
                            raise RuntimeError(f"{name}/{label} ({kind}) failed:\n{res.stderr[-3000:]}")
                        got[label][kind].append(json.loads(line[-1][len("FIRST-STEP "):]))
                        d = got[label][kind][-1]
                        print(f"  round {r} {name}/{label} {kind}: {d['first_s']:.1f} s to the first step, second step {d['second_s']:.2f} s; "
                              f"graphs {d['graphs']}+{d['graphs_second']}, breaks {d['breaks']}, kernels {d['kernels']}, {d['aot_cache']}", flush=True)
        row = {"name": name, "rounds": args.first_rounds, "s": {}, "ratio": {}, "ready_s": {}, "ready_ratio": {}, "runs": {}}
        ready = lambda d: d["first_s"] + d["second_s"]  # noqa: E731  compile and two steps: what the issue timed, recompiles included
        for kind in ("cold", "warm"):
            for key, figure in (("", lambda d: d["first_s"]), ("ready_", ready)):
                row[key + "s"][kind] = {label: median([figure(d) for d in got[label][kind]]) for label in SIDES}
                row[key + "ratio"][kind] = {k: median([figure(a) / figure(b) for a, b in zip(got["cyclec"][kind], got[other][kind])])
                                            for k, other in (("vs_ref", "reference"), ("vs_hf", "transformers"))}
        row["runs"] = {label: {kind: [round(d["first_s"], 2) for d in got[label][kind]] for kind in ("cold", "warm")} for label in SIDES}
        last = {label: got[label]["cold"][-1] for label in SIDES}  # what a cold compile is made of (the last round's)
        row["detail"] = {label: {k: last[label][k] for k in ("graphs", "graphs_second", "breaks", "kernels", "phases")}
                         | {"aot_cache_warm": got[label]["warm"][-1]["aot_cache"]} for label in SIDES}
        rows.append(row)
        print(f"  {name}: cold " + ", ".join(f"{k} {v:.1f} s" for k, v in row["s"]["cold"].items())
              + "; warm " + ", ".join(f"{k} {v:.1f} s" for k, v in row["s"]["warm"].items())
              + "; cyclec/reference cold {0[cold][vs_ref]:.3f} warm {0[warm][vs_ref]:.3f}, cyclec/transformers cold {0[cold][vs_hf]:.3f} warm {0[warm][vs_hf]:.3f}".format(row["ratio"])
              + "; after two steps, cyclec/reference cold {0[cold][vs_ref]:.3f} warm {0[warm][vs_ref]:.3f}".format(row["ready_ratio"]), flush=True)
    return rows
