"""Time to the first compiled step, cold and warm, every side in a fresh process."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import _loss, adamw, BENCH, compile_regions, median, models, ROOT, SHRINK, shrunk, synchronize


# cyclec: the spec compiled whole (one graph, fullgraph); regional: the generated file's
# compile_model, each distinct stage once (its instances share the graph), the ends eager
SIDES = ("cyclec", "regional", "reference", "transformers")
OURS = ("cyclec", "regional", "nested")  # nested (--first-nested): one graph, each stage a nested_compile_region


def our_model(name, depth, torch):
    """The spec alone (no reference or transformers model built beside it), at `depth` blocks
    if given: the first-step children of the depth rows and of our sides."""
    import cyclelang

    return cyclelang.build(shrunk(name, {**SHRINK[name], **({"depth": depth} if depth else {})}), seed=0, fast=True, parallel=True)


def compile_side(model, label, torch):
    """The model as the side `label` compiles it: (the callable to step, a context for its calls)."""
    import contextlib

    if label == "regional":
        return compile_regions(model), contextlib.nullcontext
    if label == "nested":
        # every stage class's forward one region inside the whole graph; donated buffers off for
        # the compiled calls only (torch 2.13 lowers a reused region's backward with the outer one's)
        for cls in {type(s) for s in model.stages}:
            cls.forward = torch.compiler.nested_compile_region(cls.forward)
        return torch.compile(model, fullgraph=True), lambda: torch._functorch.config.patch(donated_buffer=False)
    return torch.compile(model, fullgraph=label == "cyclec"), contextlib.nullcontext  # as in the compiled table


STEADY = 5  # steps timed after the second: the compiled step (their median), apart from the compile


def first_step_child(args, torch):
    """One side, in a process of its own: torch.compile and the first two training steps.

    Run by bench_first_step with TORCHINDUCTOR_CACHE_DIR set (a fresh folder: cold; the
    folder a cold run just filled: warm). Prints one JSON line: the seconds from
    torch.compile to the end of the first step (forward, backward, AdamW; the compilation
    happens inside it, forward and backward graphs alike), the second step's seconds, the
    compiled step (the median of the STEADY steps after the second, wall and this process's
    CPU time: one step's seconds right after a compile move by 10% and more), the graphs
    dynamo compiled in the first step and after it, graph breaks, and where the compilation went
    (torch._dynamo.utils.compile_times). The child's argument is SPEC[@DEPTH]:SIDE."""
    from torch._dynamo.utils import compile_times, compilation_time_metrics, counters

    target, label = args.child.split(":")
    name, _, depth = target.partition("@")
    if label in OURS:
        model, is_hf = our_model(name, int(depth or 0), torch), False
    else:
        sides = dict(zip(("cyclec", "reference", "transformers"), models(name, torch)))
        model, is_hf = sides.pop(label), label == "transformers"
        del sides
    gc.collect()
    B, T = args.batch, args.seq
    idx = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
    model.to(device=args.device, dtype=getattr(torch, args.dtype)).train()
    idx, tgt = idx.to(args.device), tgt.to(args.device)
    opt = adamw(model, torch)
    counters.clear()
    compilation_time_metrics.clear()
    t0 = time.perf_counter()
    fwd, scope = compile_side(model, label, torch)
    graphs, ts, cpu = [], [], []
    for i in range(2 + STEADY):
        opt.zero_grad(set_to_none=True)
        with scope():
            _loss(fwd, idx, tgt, hf=is_hf).backward()
        opt.step()
        synchronize(torch, args.device)
        ts.append(time.perf_counter())
        cpu.append(time.process_time())
        graphs.append(counters["stats"]["unique_graphs"])
    keys = {"dynamo": "bytecode_tracing", "aot": "create_aot_dispatcher_function", "inductor_fw": "compile_fx.<locals>.fw_compiler_base",
            "inductor_bw": "compile_fx.<locals>.bw_compiler", "codegen": "GraphLowering.codegen", "cpp_wait": "async_compile.wait"}
    phases = {k: sum(compilation_time_metrics.get(v, [])) for k, v in keys.items()}
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "."))
    out = {"first_s": ts[0] - t0, "second_s": ts[1] - ts[0], "step_s": median([b - a for a, b in zip(ts[1:], ts[2:])]),
           "step_cpu_s": median([b - a for a, b in zip(cpu[1:], cpu[2:])]), "graphs": graphs[0], "graphs_second": graphs[-1] - graphs[0],
           "breaks": sum(counters["graph_break"].values()), "aot_cache": {k: v for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache")},
           "kernels": len(list(cache.rglob("*.cpp"))) + len(list(cache.rglob("triton_*.py"))) if cache.is_dir() else None, "phases": phases}
    if label == "regional":
        out["regions"] = model.compiled_regions
    if args.verbose_child:
        print(compile_times(repr="str", aggregate=True), file=sys.stderr)
    print("FIRST-STEP " + json.dumps(out), flush=True)


def _child(args, target, label, cache):
    """One fresh process of first_step_child; its JSON line."""
    cmd = [sys.executable, str(BENCH / "run.py"), "--child", f"{target}:{label}", "--batch", str(args.batch), "--seq", str(args.seq),
           "--threads", str(args.threads), "--device", args.device, "--dtype", args.dtype]
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache), capture_output=True, text=True)
    line = [x for x in res.stdout.splitlines() if x.startswith("FIRST-STEP ")]
    if res.returncode or not line:
        raise RuntimeError(f"{target}/{label} failed:\n{res.stderr[-3000:]}")
    return json.loads(line[-1][len("FIRST-STEP "):])


# what any earlier compile on a machine leaves in inductor's cache, whatever the model: inductor's
# vector-ISA probe (it builds and runs a test program per ISA, about 8 s here) and its other one-offs
PRIME = "import torch; m = torch.nn.Linear(8, 8); torch.compile(m)(torch.randn(4, 8)).sum().backward()"
KINDS = ("cold", "new", "warm")


def _primed(folder):
    """Fill a cache folder with one tiny unrelated compile (PRIME) and nothing of any side."""
    res = subprocess.run([sys.executable, "-c", PRIME], cwd=ROOT, env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=folder), capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"priming inductor's cache failed:\n{res.stderr[-3000:]}")


def _rounds(args, target, sides, kinds=KINDS):
    """{side: {"cold": [...], "new": [...], "warm": [...]}}: each round runs every side cold, new
    (a copy of a cache primed once by PRIME: a model this machine has not compiled before) and
    warm (the cache its cold run filled), the sides alternating (reversed every other round);
    `kinds` may leave "new" out."""
    got = {label: {kind: [] for kind in kinds} for label in sides}
    with tempfile.TemporaryDirectory(prefix="cyclec-inductor-primed-") as primed:
        if "new" in kinds:
            _primed(primed)
        for r in range(args.first_rounds):
            for label in sides if r % 2 == 0 else tuple(reversed(sides)):
                with tempfile.TemporaryDirectory(prefix="cyclec-inductor-") as cache, tempfile.TemporaryDirectory(prefix="cyclec-inductor-") as new:
                    if "new" in kinds:
                        shutil.copytree(primed, new, dirs_exist_ok=True)
                    for kind, folder in [(k, f) for k, f in (("cold", cache), ("new", new), ("warm", cache)) if k in kinds]:
                        d = _child(args, target, label, folder)
                        got[label][kind].append(d)
                        print(f"  round {r} {target}/{label} {kind}: {d['first_s']:.1f} s to the first step, second step {d['second_s']:.2f} s, "
                              f"compiled step {d['step_s']:.3f} s (CPU {d['step_cpu_s']:.3f} s); "
                              f"graphs {d['graphs']}+{d['graphs_second']}, breaks {d['breaks']}, kernels {d['kernels']}, {d['aot_cache']}"
                              + (f", regions {d['regions']}" if "regions" in d else ""), flush=True)
    return got


def _ratio(got, kind, a, b, figure=lambda d: d["first_s"]):
    """The median over rounds of the per-round ratio a / b."""
    return median([figure(x) / figure(y) for x, y in zip(got[a][kind], got[b][kind])])


def _spread(got, kind, label):
    xs = [d["first_s"] for d in got[label][kind]]
    return [min(xs), max(xs)]


def bench_first_step(args, torch):
    """Time to the first compiled step, cold, new and warm, every side in a process of its own.

    A researcher who edits a spec waits for this each time: torch.compile, then the first
    training step, which is where dynamo traces the model and inductor compiles the forward
    and backward graphs. Cold: a fresh inductor cache (TORCHINDUCTOR_CACHE_DIR), so every
    kernel is generated and built, and inductor's one-offs run too (its vector-ISA probe builds
    test programs: about 8 s on two cores), as on the first compile a machine ever makes; new:
    a cache that holds those one-offs (PRIME) and nothing of the model, as when a researcher
    compiles an edited spec on a machine that has compiled anything before; warm: the cache a
    cold run just filled, as on a second run of the same model (dynamo still traces: its
    caches are per process). Sides
    alternate within each round (reversed every other round); ratios are medians over
    rounds of the per-round ratios. The spec is timed compiled whole (cyclec) and regional;
    with --first-nested also as one graph of nested regions. Then the depth rows: the
    --first-depth-spec at each of --first-depths blocks, regional against whole."""
    rows = []
    sides = SIDES + (("nested",) if args.first_nested else ())
    for name in [n for n in args.first_specs.split(",") if n]:
        got = _rounds(args, name, sides)
        row = {"name": name, "rounds": args.first_rounds, "s": {}, "ratio": {}, "ready_s": {}, "ready_ratio": {}, "runs": {},
               "regional": {}, "spread": {}}
        ready = lambda d: d["first_s"] + d["second_s"]  # noqa: E731  compile and two steps: what the issue timed, recompiles included
        for kind in KINDS:
            for key, figure in (("", lambda d: d["first_s"]), ("ready_", ready)):
                row[key + "s"][kind] = {label: median([figure(d) for d in got[label][kind]]) for label in sides}
                row[key + "ratio"][kind] = {k: _ratio(got, kind, "cyclec", other, figure) for k, other in (("vs_ref", "reference"), ("vs_hf", "transformers"))}
            row["regional"][kind] = {k: _ratio(got, kind, a, b) for k, a, b in (
                ("vs_ref", "regional", "reference"), ("vs_hf", "regional", "transformers"), ("vs_whole", "regional", "cyclec"))}
            row["regional"][kind]["second_vs_whole"] = _ratio(got, kind, "regional", "cyclec", lambda d: d["second_s"])
            for k, other in (("step_vs_whole", "cyclec"), ("step_vs_hf", "transformers")):
                row["regional"][kind][k] = _ratio(got, kind, "regional", other, lambda d: d["step_s"])
                row["regional"][kind][k.replace("step", "step_cpu")] = _ratio(got, kind, "regional", other, lambda d: d["step_cpu_s"])
            if "nested" in sides:
                row["regional"][kind]["nested_vs_whole"] = _ratio(got, kind, "nested", "cyclec")
            row["spread"][kind] = {label: _spread(got, kind, label) for label in sides}
        row["runs"] = {label: {kind: [round(d["first_s"], 2) for d in got[label][kind]] for kind in KINDS} for label in sides}
        last = {label: got[label]["cold"][-1] for label in sides}  # what a cold compile is made of (the last round's)
        row["detail"] = {label: {k: last[label][k] for k in ("graphs", "graphs_second", "breaks", "kernels", "phases")}
                         | {"aot_cache_warm": got[label]["warm"][-1]["aot_cache"]} for label in sides}
        row["regions"] = last["regional"].get("regions")
        rows.append(row)
        g = row["regional"]
        print(f"  {name}: " + "; ".join(f"{kind} " + ", ".join(f"{k} {v:.1f} s" for k, v in row["s"][kind].items()) for kind in KINDS)
              + "; cyclec/reference, cyclec/transformers, regional/whole, regional/reference, regional/transformers: "
              + "; ".join(f"{kind} {row['ratio'][kind]['vs_ref']:.3f}, {row['ratio'][kind]['vs_hf']:.3f}, {g[kind]['vs_whole']:.3f}, {g[kind]['vs_ref']:.3f}, "
                          f"{g[kind]['vs_hf']:.3f}" for kind in KINDS)
              + f"; compiled step regional/whole {g['cold']['step_vs_whole']:.3f} (CPU {g['cold']['step_cpu_vs_whole']:.3f}), regional/transformers "
              f"{g['cold']['step_vs_hf']:.3f} (CPU {g['cold']['step_cpu_vs_hf']:.3f}), cold runs", flush=True)
    depths = [int(d) for d in args.first_depths.split(",") if d]
    if depths:
        spec = args.first_depth_spec
        got = {d: _rounds(args, f"{spec}@{d}", ("regional", "cyclec"), ("cold", "warm")) for d in depths}
        growth = []
        for d in depths:
            g = got[d]
            one = {"depth": d, "s": {kind: {label: median([x["first_s"] for x in g[label][kind]]) for label in ("regional", "cyclec")} for kind in ("cold", "warm")},
                   "vs_whole": {kind: _ratio(g, kind, "regional", "cyclec") for kind in ("cold", "warm")},
                   "graphs": {label: g[label]["cold"][-1]["graphs"] for label in ("regional", "cyclec")},
                   "spread": {kind: {label: _spread(g, kind, label) for label in ("regional", "cyclec")} for kind in ("cold", "warm")}}
            for label in ("regional", "cyclec"):  # against the shallowest, round by round
                one.setdefault("growth", {})[label] = median([x["first_s"] / y["first_s"] for x, y in zip(g[label]["cold"], got[depths[0]][label]["cold"])])
            growth.append(one)
            print(f"  {spec} at {d} blocks, cold: regional {one['s']['cold']['regional']:.1f} s (x{one['growth']['regional']:.2f} of {depths[0]} blocks), "
                  f"whole {one['s']['cold']['cyclec']:.1f} s (x{one['growth']['cyclec']:.2f}); regional/whole {one['vs_whole']['cold']:.3f}", flush=True)
        rows.append({"name": spec, "depths": growth, "rounds": args.first_rounds})
    return rows
