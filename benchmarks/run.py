"""Benchmarks of the compiled models and of the compiler, side by side, in one run.

    python benchmarks/run.py                   # everything (a few minutes on 2 cores)
    python benchmarks/run.py --only train,frontend
    python benchmarks/run.py --only train-loop     # `cyclec train`'s overhead and checkpointing's memory
    python benchmarks/run.py --only ops            # what a step dispatches: op counts, fresh MiB (load-independent)
    python benchmarks/run.py --write           # also refresh the figures in docs/benchmarks.md
    python benchmarks/run.py --only compiled --keep-heap   # the code's own step time: glibc keeps what is freed (printed only)
    python benchmarks/run.py --device cuda --dtype bfloat16 --write   # the GPU section of the doc (train, compiled, decode)

Every figure that matters is a ratio measured in the same run, against a side
timed in the same rounds: sides alternate within each round (so load from other
processes hits all of them), and the ratio reported is the median over rounds.
On the CPU the training step is also timed by the process's CPU time, with the
quartiles of the per-round ratios and the page faults per step beside it. Before timing, each pair is shown to compute the same function (same loss after
copying weights), so the ratio compares implementations, not architectures.

Each section lives in a module of its own under benchmarks/bench/ (common.py: what they share;
render.py: the tables); this file parses the command line, runs the sections and writes the doc.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.common import (DOC, END, GPU_END, GPU_RESULTS, GPU_START, PEAK_BF16_TFLOPS, RESULTS, ROOT, SHRINK, START,  # noqa: E402
                          _loss, check_same, median, minor_faults, models, peak_flops, quartiles, ratio, shrunk, spec_text, step_flops,
                          synchronize, throughput, time_sides)
from bench.decode import bench_decode  # noqa: E402
from bench.expander import bench_expander  # noqa: E402
from bench.first_step import bench_first_step, first_step_child  # noqa: E402
from bench.frontend import bench_frontend, synthetic  # noqa: E402
from bench.loop import bench_train_loop  # noqa: E402
from bench.lsp import bench_lsp  # noqa: E402
from bench.memory import bench_memory, peak_step_bytes  # noqa: E402
from bench.ops import PHASES, bench_ops, op_name, step_ops, step_self_ms, training_step  # noqa: E402
from bench.render import render  # noqa: E402
from bench.train import bench_train  # noqa: E402

# what ab.py and tests/test_benchmarks_report.py read from this module
__all__ = ["PEAK_BF16_TFLOPS", "PHASES", "SHRINK", "_loss", "check_same", "median", "minor_faults", "models", "op_name", "peak_flops",
           "peak_step_bytes", "quartiles", "ratio", "render", "shrunk", "spec_text", "step_flops", "step_ops", "step_self_ms", "synchronize",
           "synthetic", "throughput", "time_sides", "training_step", "main"]


def keep_heap():
    """glibc's mallopt: no trimming of the heap's top (M_TRIM_THRESHOLD 1 GiB), and blocks up to
    32 MiB from the heap rather than from mmap (M_MMAP_THRESHOLD), so freed memory is reused and
    a step does not fault its buffers in again."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not (libc.mallopt(-1, 1 << 30) and libc.mallopt(-3, 32 << 20)):
        raise SystemExit("--keep-heap: mallopt refused (not glibc?)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="sections, comma-separated (default: train,compiled,first-step,decode,memory,ops,frontend,lsp,expander; on cuda train,compiled,decode)")
    ap.add_argument("--families", help="with expander: only these imported families' training steps (deepseek_v2,deepseek_v3,qwen3_moe,qwen3_next)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--decode-reps", type=int, default=3)
    ap.add_argument("--cli-reps", type=int, default=9)
    ap.add_argument("--parse-reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: fair on a shared 2-core box; OpenMP spinning under contention swamps the figures)")
    ap.add_argument("--specs", default="gpt2,llama,moe", help="training-step and memory specs")
    ap.add_argument("--compile-specs", default="gpt2,llama,moe", help="torch.compile specs")
    ap.add_argument("--first-specs", default="gpt2,llama,moe", help="time-to-first-compiled-step specs")
    ap.add_argument("--first-rounds", type=int, default=3, help="rounds of the first-step section (each side cold then warm, in fresh processes)")
    ap.add_argument("--first-nested", action="store_true", help="first-step: also the nested-region route (one graph, each stage a nested_compile_region, donated buffers off)")
    ap.add_argument("--first-depths", default="4,12,24", help="first-step: the depth rows, regional against whole (empty: none)")
    ap.add_argument("--first-depth-spec", default="llama", help="first-step: the spec of the depth rows")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # SPEC:SIDE, run by the first-step section in a fresh process
    ap.add_argument("--verbose-child", action="store_true", help="with --child: also print compile_times() to stderr")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the models run (cuda: the GPU section of the doc)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the models' dtype, every side alike")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s for the MFU column (default: a data-sheet table of bf16 GPU peaks)")
    ap.add_argument("--keep-heap", action="store_true",
                    help="glibc keeps what is freed (no trim; mmap only above 32 MiB), so no side's step pays page faults that depend on "
                         "its process's allocation order: the code's own time, printed and not written (the doc's tables keep the heap as users have it)")
    ap.add_argument("--write", action="store_true", help=f"replace the figures in {DOC.relative_to(ROOT)} (and benchmarks/results.json)")
    args = ap.parse_args(argv)
    if args.keep_heap and args.write:
        ap.error("--keep-heap is for reading the code's own time; the written tables take the heap as it comes")
    if args.keep_heap:
        keep_heap()
    gpu = args.device != "cpu"
    only = (args.only or ("train,compiled,decode" if gpu else "train,compiled,first-step,decode,memory,ops,frontend,lsp,expander")).split(",")
    if gpu and {"memory", "ops", "frontend", "lsp", "expander"} & set(only):
        ap.error("--device cuda times the models (train, compiled, decode); memory and frontend are CPU figures")
    if args.write and not gpu and args.dtype != "float32":
        ap.error("--write records float32 on the CPU, or a --device cuda run; bfloat16 on the CPU is for trying the path")

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.child:
        return first_step_child(args, torch)
    import platform

    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "dtype": args.dtype,
            "gpu": torch.cuda.get_device_name(args.device) if gpu else None,
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "batch": args.batch, "seq": args.seq, "rounds": args.rounds, "steps": args.steps,
            "command": ("python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()}
    sections = {"frontend": lambda: bench_frontend(args), "train": lambda: bench_train(args, torch), "decode": lambda: bench_decode(args, torch),
                "memory": lambda: bench_memory(args, torch), "ops": lambda: bench_ops(args, torch), "compiled": lambda: bench_train(args, torch, compiled=True),
                "first-step": lambda: bench_first_step(args, torch),
                "lsp": lambda: bench_lsp(args),
                "train-loop": lambda: bench_train_loop(args, torch),
                "expander": lambda: bench_expander(args, torch)}
    results = {}
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    for key, fn in sections.items():
        if key in only:
            print(key, flush=True)
            results[key] = {"meta": meta, "data": fn()}
    meta["load"] = [load0, os.getloadavg()[0]]  # 1-minute load averages: the machine is shared
    store, (start, end) = (GPU_RESULTS, (GPU_START, GPU_END)) if gpu else (RESULTS, (START, END))
    if args.write:  # sections not run this time keep their last figures (with their own command line)
        old = json.loads(store.read_text("utf-8")) if store.is_file() else {}
        results = {k: results.get(k) or old[k] for k in sections if k in results or k in old}
        store.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", "utf-8")
    text = render(results)
    print(f"\n{text}\n(total {time.perf_counter() - t0:.0f} s)")
    if args.write:
        doc = DOC.read_text("utf-8")
        assert start in doc and end in doc, f"{DOC} lacks the markers {start} {end}"
        doc = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda m: f"{start}\n{text}\n{end}", doc, flags=re.S)
        DOC.write_text(doc, "utf-8")


if __name__ == "__main__":
    main()
