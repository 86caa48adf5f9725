"""`cyclec train`'s loop against the bare step it runs; checkpointing's memory."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from .common import adamw, median, ROOT, SHRINK, shrunk, spec_text
from .memory import peak_step_bytes


def bench_train_loop(args, torch):
    """`cyclec train`'s loop against the bare step it runs, in the same steps.

    A run's clock (`run(..., clock=)`) splits each step's wall time into reading the
    batches from the memory-mapped corpus, the books (flameout watch, metrics.jsonl,
    progress) and the rest, which is the bare step: forward, backward, gradient norm and
    clip, AdamW, the schedule. Measured in the same steps, the ratio holds under load from
    other processes, which a separately timed bare loop on a shared machine does not. A
    checkpoint's cost is timed on its own and reported per step at the default cadence
    (--ckpt-every 500). Then the peak memory of one step with activation checkpointing
    none / stage / selective (`parallelize`), counted exactly by `peak_step_bytes`."""
    import cyclelang
    from cyclelang.backends.torch.build import load_source
    from cyclelang.training.loop import Settings, run

    text, spec = spec_text("gpt2"), shrunk("gpt2", SHRINK["gpt2"])  # the run folder keeps the spec as written; it trains the scale model
    B, T, n, ckpt = args.batch, args.seq, 30, 500
    tmp = Path(tempfile.mkdtemp(prefix="cyclec-bench-"))
    corpus = tmp / "corpus.txt"
    corpus.write_text("".join(p.read_text("utf-8") for p in sorted((ROOT / "docs").glob("*.md"))), "utf-8")
    settings = dict(data=[str(corpus)], seq=T, micro_batch=B, eval_every=0, eval_batches=1, ckpt_every=0, steps=n)
    ratios, loops, bares = [], [], []
    for k in range(max(3, args.rounds // 2)):
        clock = {}
        run(spec, Settings(**settings), tmp / f"run-{k}", spec_text=text, show_progress=False, clock=clock)
        loop, bare = clock["steps"] / n, (clock["steps"] - clock["data"] - clock["books"]) / n
        loops.append(loop)
        bares.append(bare)
        ratios.append(loop / bare)
        print(f"  round {k}: step {loop * 1000:.1f} ms, of which data {clock['data'] / n * 1000:.2f} ms, books "
              f"{clock['books'] / n * 1000:.2f} ms (x{loop / bare:.4f})", flush=True)
    out = {"loop_ms": median(loops) * 1000, "bare_ms": median(bares) * 1000, "ratio": median(ratios), "ckpt_every": ckpt, "steps": n}
    from cyclelang.training import checkpoint

    model = cyclelang.build(spec, seed=0, fast=True)
    opt, sched = model.configure_optimizer()
    b = torch.randint(0, 256, (B, T + 1), generator=torch.Generator().manual_seed(0))
    model(b[:, :-1], b[:, 1:])[1].backward()
    opt.step()  # the optimizer's state exists, as in a run
    saves = []
    for k in range(3):
        t = time.perf_counter()
        checkpoint.save(tmp / "ckpt", k + 1, model, opt, sched, None, {})
        saves.append(time.perf_counter() - t)
    out["ckpt_s"] = median(saves)
    out["ckpt_share"] = out["ckpt_s"] / (ckpt * out["bare_ms"] / 1000)
    print(f"  one checkpoint: {out['ckpt_s']:.2f} s, x{1 + out['ckpt_share']:.4f} per step at one every {ckpt} steps", flush=True)

    idx = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(0))
    tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
    source = cyclelang.codegen(spec, fast=True, parallel=True)  # as cyclec train writes it
    mem = {}
    for mode in ("none", "stage", "selective"):
        model = cyclelang.build(spec, seed=0, fast=True)
        load_source(source, spec.engine.name).parallelize(model, None, fsdp=False, checkpointing=mode)
        base, peak = peak_step_bytes(model.train(), adamw(model, torch), idx, tgt, torch)
        mem[mode] = {"base": base, "peak": peak}
        print(f"  checkpointing {mode}: peak {peak / 2**20:.1f} MiB, {(peak - base) / 2**20:.1f} MiB above weights + AdamW state", flush=True)
    out["memory"] = mem
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return out
