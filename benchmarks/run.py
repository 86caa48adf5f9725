"""Benchmarks of the compiled models and of the compiler, side by side, in one run.

    python benchmarks/run.py                   # everything (a few minutes on 2 cores)
    python benchmarks/run.py --only train,frontend
    python benchmarks/run.py --only train-loop     # `cyclec train`'s overhead and checkpointing's memory
    python benchmarks/run.py --only ops            # what a step dispatches: op counts, fresh MiB (load-independent)
    python benchmarks/run.py --write           # also refresh the figures in docs/benchmarks.md
    python benchmarks/run.py --device cuda --dtype bfloat16 --write   # the GPU section of the doc (train, compiled, decode)

Every figure that matters is a ratio measured in the same run, against a side
timed in the same rounds: sides alternate within each round (so load from other
processes hits all of them), and the ratio reported is the median over rounds.
On the CPU the training step is also timed by the process's CPU time, with the
quartiles of the per-round ratios and the page faults per step beside it. Before timing, each pair is shown to compute the same function (same loss after
copying weights), so the ratio compares implementations, not architectures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = Path(__file__).resolve().parent / "results.json"  # the figures in DOC, as data
START, END = "<!-- results:start -->", "<!-- results:end -->"
# A run on an accelerator keeps its own figures and its own section of the doc.
GPU_RESULTS = Path(__file__).resolve().parent / "results_gpu.json"
GPU_START, GPU_END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"

# --- the specs under test, shrunk to fit two CPU cores -------------------------------------

SHRINK = {
    # GPT-2 small's cycle at width 256, 4 blocks, 4 heads of 64
    "gpt2": {r"width=\d+": "width=256", r"heads=12": "heads=4", r"let depth = \d+": "let depth = 4", r"vocab=\d+": "vocab=8192", r"context=\d+": "context=256"},
    # the Llama cycle at width 256: 8 query heads over 2 KV heads of 32, SwiGLU 704, 4 blocks
    "llama": {r"width=\d+": "width=256", r"hidden=\d+": "hidden=704", r"\) x 8": ") x 4", r"vocab=\d+": "vocab=8192", r"context=\d+": "context=256"},
    # the MoE cycle as written (width 256, 4 blocks, 8 experts top-2), a shorter context
    "moe": {r"context=\d+": "context=256"},
}
# the expander cycle: Mamba-2 at width 256 (8 heads of 64, state 64, 4 blocks); decoding engines at width 128
MAMBA2 = {r"width=\d+": "width=256", r"heads=24": "heads=8", r"state=128": "state=64", r"chunk=256": "chunk=128",
          r"let depth = \d+": "let depth = 4", r"vocab=\d+": "vocab=8192", r"context=\d+": "context=256"}
FLAT = {r"width=\d+": "width=128", r"heads=12": "heads=4", r"let depth = \d+": "let depth = 2", r"vocab=\d+": "vocab=2048", r"context=\d+": "context=4160"}
# the short conv's decoding engine: specs/short_conv.cycle's conv layer alone, at FLAT's width, depth, vocab and context
SHORT_CONV = """
engine short_conv {
  chamber width=128
  throat causal
  feed tokens vocab=2048 context=4160 position=none
  stage block x 2 {
    prechamber mix { norm rmsnorm eps=1e-5  turbine short_conv size=3 bias=false  merge cooling }
    prechamber burn { norm rmsnorm eps=1e-5  turbine mlp hidden=352 act=swiglu bias=false  merge cooling }
  }
  norm rmsnorm eps=1e-5
  nozzle head tied
}
"""
DECODE = {r"width=\d+": "width=128", r"heads=8": "heads=4", r"hidden=\d+": "hidden=352", r"\) x 8": ") x 2", r"vocab=\d+": "vocab=2048", r"context=\d+": "context=1280"}


def spec_text(name: str, subs: dict) -> str:
    text = (ROOT / "specs" / f"{name}.cycle").read_text("utf-8")
    for pat, rep in subs.items():
        text = re.sub(pat, rep, text)
    return text


def median(xs):
    return statistics.median(xs)


def synchronize(torch, device):
    """Wait for the device's queued work, so a host clock reads the time it took."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# --- training step --------------------------------------------------------------------------


def models(name, torch):
    """(ours, reference, transformers) at the same config and the same weights."""
    import reference as R
    import transformers

    import cyclelang
    from cyclelang.interop import load_transformers

    ours = cyclelang.build(cyclelang.parse(spec_text(name, SHRINK[name])), seed=0, fast=True)
    c = ours.config
    if name == "gpt2":
        ref = R.GPT(R.GPTConfig(vocab_size=c.vocab_size, block_size=c.context, n_layer=4, n_head=4, n_embd=256))
        hf_cfg = transformers.GPT2Config(vocab_size=c.vocab_size, n_positions=c.context, n_embd=256, n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        hf = transformers.GPT2LMHeadModel(hf_cfg)
    else:
        moe = name == "moe"
        heads, kv, hidden = (8, 4, 512) if moe else (8, 2, 704)
        ref = R.Llama(R.LlamaConfig(vocab_size=c.vocab_size, max_seq_len=c.context, dim=256, n_layers=4, n_heads=heads, n_kv_heads=kv, hidden=hidden,
                                    n_experts=8 if moe else 0, top_k=2, capacity=1.25 if moe else 0.0, balance=0.01 if moe else 0.0))
        kw = dict(vocab_size=c.vocab_size, hidden_size=256, intermediate_size=hidden, num_hidden_layers=4, num_attention_heads=heads, num_key_value_heads=kv,
                  max_position_embeddings=c.context, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        hf_cfg = transformers.MixtralConfig(num_local_experts=8, num_experts_per_tok=2, **kw) if moe else transformers.LlamaConfig(**kw)
        hf = (transformers.MixtralForCausalLM if moe else transformers.LlamaForCausalLM)(hf_cfg)
    load_transformers(ours, hf)  # the configs line up (else InteropError); all three share weights
    R.copy_weights(ref, ours)
    return ours, ref, hf


def _loss(model, idx, tgt, hf=False):
    if hf:
        return model(input_ids=idx, labels=idx).loss
    return model(idx, tgt)[1]


def check_same(name, ours, ref, hf, torch, idx, tgt):
    """Same function: losses agree (train mode for capacity dropping; moe vs HF in eval)."""
    with torch.no_grad():
        a, b = _loss(ours, idx, tgt), _loss(ref, idx, tgt)
        assert abs(float(a) - float(b)) < 1e-4, f"{name}: compiled {float(a)} vs reference {float(b)}"
        ours.eval(), hf.eval()
        lo = ours(idx, tgt)[1] - sum(ours.aux_losses.values(), torch.zeros(()))
        lh = _loss(hf, idx, tgt, hf=True)
        ours.train(), hf.train()
        assert abs(float(lo) - float(lh)) < 1e-4, f"{name}: compiled {float(lo)} vs transformers {float(lh)}"


def time_sides(sides, rounds, steps, sync=lambda: None, cpu=None, faults=None):
    """sides: {label: step_fn}. Alternate sides each round; returns {label: [seconds per step]}.
    cpu, faults: dicts to fill likewise with this process's CPU seconds per step (time that
    other processes hold the core does not count, so it moves less with the machine's load)
    and minor page faults per step (first touches of memory the allocator took from the
    system: fresh large buffers)."""
    out = {k: [] for k in sides}
    for d in (cpu, faults):
        if d is not None:
            d.update({k: [] for k in sides})
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for k in order:
            sync()
            f0, c0, t0 = minor_faults(), time.process_time(), time.perf_counter()
            for _ in range(steps):
                sides[k]()
            sync()
            out[k].append((time.perf_counter() - t0) / steps)
            if cpu is not None:
                cpu[k].append((time.process_time() - c0) / steps)
            if faults is not None:
                faults[k].append((minor_faults() - f0) / steps)
    return out


def minor_faults() -> int:
    """This process's minor page faults so far (0 where the platform does not count them)."""
    try:
        import resource
    except ImportError:  # not on Unix
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def ratio(times, a, b):
    return median([x / y for x, y in zip(times[a], times[b])])


def quartiles(times, a, b) -> list[float]:
    """The first and third quartiles of the per-round ratios a / b: the spread behind `ratio`."""
    q = statistics.quantiles([x / y for x, y in zip(times[a], times[b])], n=4, method="inclusive")
    return [q[0], q[2]]


# Dense bf16 tensor-core peaks (TFLOP/s) by device name, from the vendors' data sheets; the
# first name contained in torch's device name wins (so "H100 PCIe" before "H100").
# `--peak-tflops` overrides it (any device, the CPU too).
PEAK_BF16_TFLOPS = (("GH200", 989.4), ("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0),
                    ("L40S", 362.1), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0))


def peak_flops(args, torch) -> float | None:
    """The device's peak FLOP/s for the run's dtype, or None where it is not known."""
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if args.device == "cpu" or args.dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(args.device)
    return next((t * 1e12 for key, t in PEAK_BF16_TFLOPS if key in name), None)


def step_flops(name: str, batch: int, seq: int) -> int:
    """A training step's model FLOPs: three times the forward's (forward, and the backward's two
    products per weight), from the IR's count per token at this context, as `cyclec info` gives it."""
    import cyclelang
    from cyclelang.review.report import forward_flops_per_token

    return 3 * forward_flops_per_token(cyclelang.parse(spec_text(name, SHRINK[name])).engine, seq) * batch * seq


def throughput(times, name, args, torch) -> dict:
    """Tokens per second and model FLOPs utilisation of each side (same model FLOPs for every
    side: they compute the same function)."""
    f, peak = step_flops(name, args.batch, args.seq), peak_flops(args, torch)
    med = {k: median(v) for k, v in times.items()}
    return {"tok_s": {k: args.batch * args.seq / t for k, t in med.items()}, "gflop_step": f / 1e9, "peak_tflops": peak and peak / 1e12,
            "mfu": {k: f / t / peak for k, t in med.items()} if peak else None}


def bench_train(args, torch, compiled=False):
    rows = []
    for name in (args.compile_specs if compiled else args.specs).split(","):
        ours, ref, hf = models(name, torch)
        B, T = args.batch, args.seq
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, ours.config.vocab_size, (B, T), generator=g)
        tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
        check_same(name, ours, ref, hf, torch, idx, tgt)  # float32 on the CPU, then to the device under test
        import cyclelang

        # the readable form (`cyclec build`'s default): the same model and weights, F.cross_entropy, one MoE path
        readable = cyclelang.build(cyclelang.parse(spec_text(name, SHRINK[name])), seed=0, fast=False)
        readable.load_state_dict(ours.state_dict())
        dtype = getattr(torch, args.dtype)
        for m in (ours, readable, ref, hf):
            m.to(device=args.device, dtype=dtype)
        idx, tgt = idx.to(args.device), tgt.to(args.device)
        sides = {}
        note = ""
        for label, model, is_hf in (("cyclec", ours, False), ("readable", readable, False), ("reference", ref, False), ("transformers", hf, True)):
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            fwd = model
            if compiled:
                # The spec is one graph (under compile its MoE experts run in one custom op);
                # the others take torch.compile's default, graph breaks allowed (the
                # reference's MoE dispatch has data-dependent shapes).
                fwd = torch.compile(model, fullgraph=label == "cyclec" or label == "readable" and name != "moe")

            def step(fwd=fwd, opt=opt, is_hf=is_hf):
                opt.zero_grad(set_to_none=True)
                _loss(fwd, idx, tgt, hf=is_hf).backward()
                opt.step()

            t0 = time.perf_counter()
            for _ in range(2):  # warm-up (and, compiled, the compilation itself)
                step()
            sides[label] = step
            if compiled:
                # in-process, after the sides before it: they share inductor's cache (see first-step for the fair figure)
                print(f"  compile+2 steps {name}/{label}: {time.perf_counter() - t0:.1f}s", flush=True)
        cpu, faults = {}, {}
        times = time_sides(sides, args.rounds, args.steps, sync=lambda: synchronize(torch, args.device), cpu=cpu, faults=faults)
        row = {"name": name, "ms": {k: 1000 * median(v) for k, v in times.items()},
               "vs_ref": ratio(times, "cyclec", "reference"), "vs_hf": ratio(times, "cyclec", "transformers"),
               "readable_vs_fast": ratio(times, "readable", "cyclec"), "readable_vs_ref": ratio(times, "readable", "reference"), "note": note,
               **throughput(times, name, args, torch)}
        if args.device == "cpu":  # on a GPU the host's CPU time is not the step's
            row["spread"] = {"vs_hf": quartiles(times, "cyclec", "transformers"), "vs_ref": quartiles(times, "cyclec", "reference")}
            row["cpu"] = {"ms": {k: 1000 * median(v) for k, v in cpu.items()},
                          "vs_hf": ratio(cpu, "cyclec", "transformers"), "vs_hf_q": quartiles(cpu, "cyclec", "transformers"),
                          "vs_ref": ratio(cpu, "cyclec", "reference"), "vs_ref_q": quartiles(cpu, "cyclec", "reference")}
            row["faults"] = {k: median(v) for k, v in faults.items()}
        rows.append(row)
        print(f"  {name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row["ms"].items()) + f"; cyclec/reference {row['vs_ref']:.3f}, cyclec/transformers {row['vs_hf']:.3f}", flush=True)
        if "cpu" in row:
            c, sp = row["cpu"], row["spread"]["vs_hf"]
            print(f"    per-round cyclec/transformers {sp[0]:.3f}-{sp[1]:.3f} (quartiles); CPU time: " + ", ".join(f"{k} {v:.1f} ms" for k, v in c["ms"].items())
                  + f"; cyclec/transformers {c['vs_hf']:.3f} ({c['vs_hf_q'][0]:.3f}-{c['vs_hf_q'][1]:.3f}), cyclec/reference {c['vs_ref']:.3f}; page faults per step "
                  + ", ".join(f"{k} {v:.0f}" for k, v in row["faults"].items()), flush=True)
        del ours, readable, ref, hf, sides
        gc.collect()
    return rows


# --- time to the first compiled step -----------------------------------------------------------

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
                        cmd = [sys.executable, __file__, "--child", f"{name}:{label}", "--batch", str(args.batch), "--seq", str(args.seq),
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


# --- decoding -------------------------------------------------------------------------------


def bench_decode(args, torch):
    import cyclelang

    model = cyclelang.build(cyclelang.parse(spec_text("llama", DECODE)), seed=0, fast=True).eval()
    model.to(device=args.device, dtype=getattr(torch, args.dtype))
    Cache = sys.modules[type(model).__module__].Cache
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)).to(args.device)
    sync = lambda: synchronize(torch, args.device)  # noqa: E731

    @torch.no_grad()
    def per_token(n):
        """Greedy decoding with the cache, timing each new token."""
        cache, idx, ts = Cache(), prompt, []
        logits = model(idx, cache=cache)
        for _ in range(n):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat((idx, nxt), dim=1)
            sync()
            t0 = time.perf_counter()
            logits = model(nxt, cache=cache)
            sync()
            ts.append(time.perf_counter() - t0)
        return ts

    def total(n, use_cache):
        sync()
        t0 = time.perf_counter()
        out = model.generate(prompt, n, temperature=0, use_cache=use_cache)
        sync()
        return time.perf_counter() - t0, out

    per_token(16)  # warm-up
    res = {}
    ts = per_token(1024)
    first, last = median(ts[32:96]), median(ts[-64:])
    res["ms_first"], res["ms_last"], res["flat"] = 1000 * first, 1000 * last, last / first
    res["same"] = True
    for n, reps in ((256, args.decode_reps), (1024, 1)):
        speed = []
        for _ in range(reps):
            tc, a = total(n, True)
            tn, b = total(n, False)
            if args.dtype == "float32":
                assert torch.equal(a, b), "cache and recompute disagree"
            else:  # in half precision the two orders of summation may round a near-tie apart
                res["same"] = res["same"] and torch.equal(a, b)
            speed.append(tn / tc)
        res[f"x{n}"] = median(speed)
    print(f"  per token (cache): {res['ms_first']:.2f} ms at ~64 tokens, {res['ms_last']:.2f} ms at ~1000 (x{res['flat']:.2f}); "
          f"speed-up over recompute: x{res['x256']:.1f} at 256, x{res['x1024']:.1f} at 1024", flush=True)
    return res


# --- the expander cycle: an ssm against transformers, a flat decoding cost ------------------


def _train_against_hf(name, ours, hf, args, torch, c):
    """One training step (forward, backward, AdamW) of ours and transformers' model at the same
    weights, eager and both compiled: {"eager"|"compiled": {"ms": {...}, "vs_hf": ratio}}."""
    B, T = args.batch, args.seq
    idx = torch.randint(0, c.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
    with torch.no_grad():
        ours.eval(), hf.eval()
        a, b = float(ours(idx, tgt)[1]), float(hf(input_ids=idx, labels=idx).loss)
    assert abs(a - b) < 1e-4, f"{name}: compiled {a} vs transformers {b}"
    res = {}
    for compiled in (False, True):
        sides = {}
        for label, model, is_hf in (("cyclec", ours, False), ("transformers", hf, True)):
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            fwd = torch.compile(model) if compiled else model

            def step(fwd=fwd, opt=opt, is_hf=is_hf):
                opt.zero_grad(set_to_none=True)
                _loss(fwd, idx, tgt, hf=is_hf).backward()
                opt.step()

            for _ in range(2):  # warm-up (and, compiled, the compilation)
                step()
            sides[label] = step
        times = time_sides(sides, args.rounds, args.steps)
        key = "compiled" if compiled else "eager"
        res[key] = {"ms": {k: 1000 * median(v) for k, v in times.items()}, "vs_hf": ratio(times, "cyclec", "transformers")}
        print(f"  {name} {key}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in res[key]["ms"].items()) + f"; cyclec/transformers {res[key]['vs_hf']:.3f}", flush=True)
    return res


# DeepSeek-V2 at width 256: 4 heads, a 64-wide KV latent, nope 32 + rope 16, values 32; a dense
# first layer (SwiGLU 704), then 3 layers of 8 routed experts (top 2, 128 wide) beside one shared
DEEPSEEK_V2 = dict(hidden_size=256, intermediate_size=704, moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8,
                   n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, max_position_embeddings=256, tie_word_embeddings=False)


# DeepSeek-V3 at the same size: its router (sigmoid scores, a selection-only correction bias, 4 groups of 2 experts, the
# best 2 groups kept, the weights renormalised and scaled by 2.5) on the same latent attention; Qwen3-MoE at width 256:
# 4 heads of 64 (2 kv heads), a qk-norm per head, 8 experts (top 2, 128 wide), renormalised, in all 4 layers
DEEPSEEK_V3 = dict(DEEPSEEK_V2, num_key_value_heads=4, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)
QWEN3_MOE = dict(hidden_size=256, intermediate_size=704, moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                 max_position_embeddings=256, tie_word_embeddings=False)
# Qwen3-Next at width 256: 3 gated DeltaNet layers (8 value heads over 4 key heads, 64 wide, conv 4) then 1 attention layer
# (4 heads of 64 over 2, the output gate, quarter rotary), 8 experts (top 2, 128 wide) beside a gated shared one (256)
QWEN3_NEXT = dict(hidden_size=256, intermediate_size=704, moe_intermediate_size=128, shared_expert_intermediate_size=256,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_value_heads=8,
                  linear_num_key_heads=4, linear_key_head_dim=64, linear_value_head_dim=64, num_experts=8, num_experts_per_tok=2,
                  max_position_embeddings=256, tie_word_embeddings=False)
IMPORTED = (("deepseek_v2", "DeepseekV2", DEEPSEEK_V2), ("deepseek_v3", "DeepseekV3", DEEPSEEK_V3), ("qwen3_moe", "Qwen3Moe", QWEN3_MOE),
            ("qwen3_next", "Qwen3Next", QWEN3_NEXT))


def _imported_against_hf(name, prefix, config, args, torch):
    """The training step of the spec `cyclec import` writes for a transformers model, loaded with its weights,
    against that model (eager attention): {"eager"|"compiled": ...} as _train_against_hf."""
    import transformers

    import cyclelang
    from cyclelang.interop import import_config, load_transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, f"{prefix}Config")(vocab_size=8192, attn_implementation="eager", **config)
    hf = getattr(transformers, f"{prefix}ForCausalLM")(cfg)
    if name == "deepseek_v3":  # the correction bias away from its zero init, so the choice it biases is the one timed
        with torch.no_grad():
            for m in hf.modules():
                if hasattr(m, "e_score_correction_bias"):
                    m.e_score_correction_bias.normal_(0, 0.05)
    ours = load_transformers(cyclelang.build(cyclelang.parse(import_config(hf.config)), seed=0, fast=True), hf)  # the spec its config implies
    try:
        return _train_against_hf(name, ours, hf, args, torch, ours.config)
    finally:
        del ours, hf
        gc.collect()


def bench_expander(args, torch):
    """Mamba-2's, DeepSeek-V2's, DeepSeek-V3's and Qwen3-MoE's training steps against transformers'
    Mamba2ForCausalLM (its torch path: no mamba_ssm kernels), DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
    and Qwen3MoeForCausalLM (eager attention), eager and both compiled, at the same config and weights; then the per-token decoding time of linear
    attention (expander.cycle), of attention (gpt2.cycle) and of the short gated conv (SHORT_CONV) at the same width, around
    token 64 and around token 4,096."""
    import transformers

    import cyclelang
    from cyclelang.interop import load_transformers

    ours = cyclelang.build(cyclelang.parse(spec_text("mamba2", MAMBA2)), seed=0, fast=True)
    c = ours.config
    hf = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=c.vocab_size, hidden_size=256, num_heads=8, head_dim=64, state_size=64, n_groups=1, expand=2, conv_kernel=4,
        chunk_size=128, num_hidden_layers=4, use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5, tie_word_embeddings=True))
    load_transformers(ours, hf)
    res = _train_against_hf("mamba2", ours, hf, args, torch, c)
    del ours, hf
    gc.collect()
    for name, prefix, config in IMPORTED:
        if args.families and name not in args.families.split(","):
            continue
        res[name] = _imported_against_hf(name, prefix, config, args, torch)
    # gated DeltaNet: expander.cycle's engine with the linear attention swapped for `turbine delta` (4 heads of 32)
    delta = spec_text("expander", FLAT).replace("turbine linear_attention heads=4 retention chunk=64", "turbine delta heads=4 chunk=64")
    for name in ("expander", "gpt2", "gated_delta", "short_conv"):
        text = {"gated_delta": delta, "short_conv": SHORT_CONV}.get(name) or spec_text(name, FLAT)
        res[name] = decode_growth(name, cyclelang.build(cyclelang.parse(text), seed=0, fast=True).eval(), args, torch)
        d = res[name]
        print(f"  decode {name}: {d['ms_first']:.3f} ms per token around token 64, {d['ms_last']:.3f} ms around 4096 (x{d['growth']:.2f})", flush=True)
    return res


def decode_growth(name, model, args, torch, near=64, far=4096, steps=16):
    """Per-token decoding time with the cache around token `near` and around token `far`.

    Two caches are prefilled (in chunks of 512), one to `near` tokens and one to `far`; then
    rounds alternate `steps` single-token steps on each (each round from the same cached
    state: tokens near .. near + steps, far .. far + steps), so a change of the machine's load
    during the run falls on both sides alike (timing token 64 early and token 4,096 minutes
    later would measure the load as much as the model). growth: the median of the rounds'
    ratios (far / near)."""
    Cache = sys.modules[type(model).__module__].Cache
    g = torch.Generator().manual_seed(0)
    caches = {}
    with torch.no_grad():
        for n in (near, far):
            cache, idx = Cache(), torch.randint(0, model.config.vocab_size, (1, n), generator=g)
            for s in range(0, n, 512):
                model(idx[:, s : s + 512], cache=cache)
            caches[n] = cache
        nxt = torch.zeros(1, 1, dtype=torch.long)
        saved = {n: (c.pos, dict(c.state)) for n, c in caches.items()}

        def run(n):
            cache = caches[n]
            cache.pos, cache.state = saved[n][0], dict(saved[n][1])  # back to `n` tokens: a KV buffer is rewritten in place, a state replaced
            for _ in range(steps):
                model(nxt, cache=cache)

        for n in (near, far):  # a warm-up round on each
            run(n)
        rounds = max(args.rounds, 5) * 4
        times = time_sides({"near": lambda: run(near), "far": lambda: run(far)}, rounds, 1)
    first, last = median(times["near"]) / steps, median(times["far"]) / steps
    return {"ms_first": 1000 * first, "ms_last": 1000 * last, "growth": ratio(times, "far", "near"), "state_bytes": caches[far].nbytes()}


# --- memory ---------------------------------------------------------------------------------


def peak_step_bytes(model, opt, idx, tgt, torch):
    """Peak bytes of live tensor storage during one training step (after a warm-up step,
    so optimizer state exists), counted exactly by a dispatch mode that sees every
    allocation: storages are tracked by weak reference and dropped when freed."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def step():
        opt.zero_grad(set_to_none=True)
        model(idx, tgt)[1].backward()
        opt.step()

    step()
    live = {}

    def add(t):
        st = t.untyped_storage()
        ref = StorageWeakRef(st)
        if ref.cdata not in live:
            live[ref.cdata] = (ref, st.nbytes())

    for p in model.parameters():
        add(p)
    for s in opt.state.values():
        for v in s.values():
            if isinstance(v, torch.Tensor):
                add(v)
    base = sum(n for _, n in live.values())
    peak = [base]

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    add(t)
            for k in [k for k, (r, _) in live.items() if r.expired()]:
                del live[k]
            peak[0] = max(peak[0], sum(n for _, n in live.values()))
            return out

    with Track():
        step()
    return base, peak[0]


def bench_memory(args, torch):
    rows = []
    for name in args.specs.split(","):
        ours, ref, hf = models(name, torch)
        del hf
        B, T = args.batch, args.seq
        idx = torch.randint(0, ours.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
        tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
        got = {}
        for label, m in (("cyclec", ours), ("reference", ref)):
            got[label] = peak_step_bytes(m.train(), torch.optim.AdamW(m.parameters(), lr=1e-4), idx, tgt, torch)
        (b0, p0), (b1, p1) = got["cyclec"], got["reference"]
        rows.append({"name": name, "cyclec": p0, "reference": p1, "ratio": p0 / p1, "act_ratio": (p0 - b0) / (p1 - b1)})
        print(f"  {name}: peak {p0 / 2**20:.1f} MiB vs {p1 / 2**20:.1f} MiB (x{p0 / p1:.3f}); above weights+state x{(p0 - b0) / (p1 - b1):.3f}", flush=True)
    return rows


# --- what a step dispatches: op counts and fresh allocations -------------------------------------

PHASES = ("forward", "backward", "optimizer")


def op_name(name: str) -> str:
    """An op's schema name as the profiler and the dispatcher both give it, shortened:
    aten::mm -> mm; the loss op without its source digest (cyclelang::next_token_loss_0d7b792e
    -> cyclelang::next_token_loss)."""
    return re.sub(r"^(cyclelang::\w+?)_[0-9a-f]{8}$", r"\1", name.removeprefix("aten::"))


def training_step(model, opt, idx, tgt, is_hf, mark=lambda phase: None):
    """One training step; mark(phase) is called as each phase begins."""
    mark("forward")
    opt.zero_grad(set_to_none=True)
    loss = _loss(model, idx, tgt, hf=is_hf)
    mark("backward")
    loss.backward()
    mark("optimizer")
    opt.step()


def step_ops(model, opt, idx, tgt, is_hf, torch) -> dict:
    """{phase: {op: [calls, fresh bytes]}} of one training step (after a warm-up step): every
    aten op the step dispatches, and the bytes of the storages it returns that none of its
    inputs held (fresh allocations; views and in-place results hold an input's). Counted,
    not timed, so it does not move with the machine's load."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase, self.got = None, {p: {} for p in PHASES}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace == "profiler":  # record_function's markers, not work
                return out
            held = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            fresh = sum(t.untyped_storage().nbytes() for t in tree_leaves(out)
                        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in held)
            row = self.got[self.phase].setdefault(op_name(func._schema.name), [0, 0])
            row[0] += 1
            row[1] += fresh
            return out

    model.train()
    training_step(model, opt, idx, tgt, is_hf)
    mode = Count()
    with mode:
        training_step(model, opt, idx, tgt, is_hf, mark=lambda phase: setattr(mode, "phase", phase))
    return mode.got


def step_self_ms(steps, rounds, torch) -> dict:
    """{label: {phase: {op: self CPU ms}}}, medians over `rounds` profiled steps per side
    (torch.profiler, the sides alternating as in time_sides; ops absent from a round count
    0 there). steps: {label: fn(mark)} running one training step. Timed, so it moves with
    the load, unlike step_ops's counts."""
    from torch.profiler import ProfilerActivity, profile

    got = {k: [] for k in steps}
    for r in range(rounds):
        for label in (list(steps) if r % 2 == 0 else list(reversed(steps))):
            open_ = []

            def mark(phase):  # a record_function range per phase, on the profiler's own clock
                if open_:
                    open_.pop().__exit__(None, None, None)
                open_.append(torch.autograd.profiler.record_function("phase:" + phase))
                open_[0].__enter__()

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                steps[label](mark)
                open_.pop().__exit__(None, None, None)
            events = prof.events()
            ranges = [(e.time_range.start, e.time_range.end, e.name.removeprefix("phase:")) for e in events if e.name.startswith("phase:")]
            one = {ph: {} for ph in PHASES}
            for e in events:
                if not (e.name.startswith("aten::") or e.name.startswith("cyclelang::")):
                    continue
                phase = next((ph for a, b, ph in ranges if a <= e.time_range.start <= b), None)
                if phase is None:  # outside the step's phases
                    continue
                op = op_name(e.name)
                one[phase][op] = one[phase].get(op, 0.0) + e.self_cpu_time_total / 1000
            got[label].append(one)
    return {label: {ph: {op: median([g[ph].get(op, 0.0) for g in runs]) for op in set().union(*(g[ph] for g in runs))}
                    for ph in PHASES} for label, runs in got.items()}


def bench_ops(args, torch):
    """Per spec and side: aten ops dispatched and bytes freshly allocated in each phase of a
    training step (counted), their self CPU time (profiled, alternating sides), and the ops
    where cyclec and transformers differ most."""
    rows = []
    for name in args.specs.split(","):
        ours, ref, hf = models(name, torch)
        B, T = args.batch, args.seq
        idx = torch.randint(0, ours.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
        tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
        sides = (("cyclec", ours), ("reference", ref), ("transformers", hf))
        opts = {label: torch.optim.AdamW(m.parameters(), lr=1e-4) for label, m in sides}
        got = {label: step_ops(m, opts[label], idx, tgt, label == "transformers", torch) for label, m in sides}
        steps = {label: (lambda mark, m=m, label=label: training_step(m, opts[label], idx, tgt, label == "transformers", mark))
                 for label, m in sides if label != "reference"}
        ms = step_self_ms(steps, max(3, args.rounds // 2), torch)
        total = {label: {ph: [sum(v[0] for v in ops.values()), sum(v[1] for v in ops.values())] for ph, ops in g.items()} for label, g in got.items()}
        a, b = got["cyclec"], got["transformers"]
        diff = []
        for ph in PHASES:
            for op in set(a[ph]) | set(b[ph]):
                x, y = a[ph].get(op, [0, 0]), b[ph].get(op, [0, 0])
                if x != y:
                    diff.append({"phase": ph, "op": op, "cyclec": x, "transformers": y,
                                 "ms": {k: ms[k][ph].get(op, 0.0) for k in ms}})
        # the largest differences in bytes first, then in calls
        diff.sort(key=lambda d: (-abs(d["cyclec"][1] - d["transformers"][1]), -abs(d["cyclec"][0] - d["transformers"][0]), d["op"]))
        self_ms = {k: {ph: sum(v.values()) for ph, v in m.items()} for k, m in ms.items()}
        rows.append({"name": name, "total": total, "diff": diff[:10], "self_ms": self_ms})
        for label, t in total.items():
            print(f"  {name}/{label}: " + "; ".join(f"{ph} {n} ops, {by / 2**20:.1f} MiB fresh" + (f", {self_ms[label][ph]:.1f} ms self CPU" if label in self_ms else "")
                                                  for ph, (n, by) in t.items()), flush=True)
        print("    ops that differ (calls x MiB fresh, self CPU ms):", flush=True)
        for d in diff[:25]:
            print(f"    {d['phase']:9s} {d['op']:34s} cyclec {d['cyclec'][0]:4d} x {d['cyclec'][1] / 2**20:7.2f} MiB {d['ms']['cyclec']:7.2f} ms   "
                  f"transformers {d['transformers'][0]:4d} x {d['transformers'][1] / 2**20:7.2f} MiB {d['ms']['transformers']:7.2f} ms", flush=True)
        print("    largest self-CPU differences (ms, cyclec - transformers; load-dependent):", flush=True)
        gaps = sorted(((ph, op, ms["cyclec"][ph].get(op, 0.0), ms["transformers"][ph].get(op, 0.0)) for ph in PHASES
                       for op in set(ms["cyclec"][ph]) | set(ms["transformers"][ph])), key=lambda g: -abs(g[2] - g[3]))
        for ph, op, x, y in gaps[:15]:
            print(f"    {ph:9s} {op:34s} {x:8.2f} {y:8.2f} {x - y:+8.2f}   calls {a[ph].get(op, [0])[0]} / {b[ph].get(op, [0])[0]}", flush=True)
        del ours, ref, hf
        gc.collect()
    return rows


# --- the training loop ------------------------------------------------------------------------


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

    text = spec_text("gpt2", SHRINK["gpt2"])
    spec = cyclelang.parse(text)
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
        base, peak = peak_step_bytes(model.train(), torch.optim.AdamW(model.parameters(), lr=1e-4), idx, tgt, torch)
        mem[mode] = {"base": base, "peak": peak}
        print(f"  checkpointing {mode}: peak {peak / 2**20:.1f} MiB, {(peak - base) / 2**20:.1f} MiB above weights + AdamW state", flush=True)
    out["memory"] = mem
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return out


# --- the front end --------------------------------------------------------------------------


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


def bench_lsp(args):
    """The language server's answer to an edit: a change to a 300-line spec, parsed, resolved,
    reviewed and turned into LSP diagnostics in-process (the parser warm, as in the server)."""
    from cyclelang.lsp import analysis as an

    text = synthetic(29)  # 29 templates of 10 lines and an engine: about 300 lines
    lines = text.count("\n")
    edits = [text.replace("turbine mlp ratio=4", "turbine mlp ratio=2", 1), text.replace("heads=h", "haeds=h", 1), text]
    prev = an.analyze(text, "synth.cycle")  # warm: the parser's tables, the first analysis
    ts, cs = [], []
    for _ in range(args.parse_reps * 4):
        for new in edits:
            t0, c0 = time.perf_counter(), time.process_time()
            prev = an.analyze(new, "synth.cycle", previous=prev)
            an.lsp_diagnostics(prev, "file:///synth.cycle")
            ts.append(time.perf_counter() - t0)
            cs.append(time.process_time() - c0)
    out = {"lines": lines, "ms": median(ts) * 1000, "max_ms": max(ts) * 1000, "cpu_ms": median(cs) * 1000, "target_ms": 50.0}
    print(f"  a change to a {lines}-line spec -> diagnostics: {out['ms']:.1f} ms median ({out['cpu_ms']:.1f} ms CPU), {out['max_ms']:.1f} ms worst; target 50 ms", flush=True)
    # completion and hover at the last stage of the engine, the most text before the cursor
    big = an.analyze(synthetic(999), "big.cycle")
    for label, a in (("300", prev), ("10k", big)):
        line = max(i for i, s in enumerate(a.lines) if s.startswith("  stage "))
        tc, th = [], []
        for _ in range(args.parse_reps * 2):
            t0 = time.perf_counter()
            an.complete(a, line, len(a.lines[line]))
            tc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            an.hover(a, line, 4)
            th.append(time.perf_counter() - t0)
        out[f"complete_{label}_ms"], out[f"hover_{label}_ms"] = median(tc) * 1000, median(th) * 1000
        out[f"lines_{label}"] = len(a.lines) - 1
        print(f"  {len(a.lines) - 1}-line spec: completion {median(tc) * 1000:.1f} ms, hover {median(th) * 1000:.1f} ms (medians)", flush=True)
    # the same change through the real server: didChange in, publishDiagnostics out, over stdio
    try:
        import pygls  # noqa: F401
    except ImportError:
        return out
    sys.path.insert(0, str(ROOT / "tests"))
    from lsp_client import Client

    c = Client()
    c.initialize()
    uri = "file:///bench/synth.cycle"
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cycle", "version": 1, "text": text}})
    c.diagnostics(uri, 1)
    tw, version = [], 1
    for _ in range(args.parse_reps * 4):
        for new in edits:
            version += 1
            t0 = time.perf_counter()
            c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": new}]})
            c.diagnostics(uri, version)
            tw.append(time.perf_counter() - t0)
    c.close()
    out["stdio_ms"] = median(tw) * 1000
    print(f"  over stdio (didChange -> publishDiagnostics): {out['stdio_ms']:.1f} ms median", flush=True)
    return out


# --- report ---------------------------------------------------------------------------------


def render(results) -> str:
    out = []
    for m in sorted({json.dumps(r["meta"], sort_keys=True) for r in results.values()}):
        m = json.loads(m)
        names = ", ".join(k for k, r in results.items() if r["meta"] == m)
        on = f"{m['gpu']}, {m['dtype']}" if m.get("gpu") else f"{m['cpu']}, {m['threads']} torch thread(s)"
        on += f", {m['dtype']}" if not m.get("gpu") and m.get("dtype", "float32") != "float32" else ""
        out += [f"Measured {m['date']} ({names}) on {on}, torch {m['torch']}, "
                f"transformers {m['transformers']}, Python {m['python']}; batch {m['batch']} x {m['seq']} tokens, "
                f"{m['rounds']} rounds x {m['steps']} steps per side (medians)"
                + (f"; load average {m['load'][0]:.1f} at the start, {m['load'][1]:.1f} at the end" if m.get("load") else "")
                + f". Command: `{m['command']}`", ""]
    results = {k: r["data"] for k, r in results.items()}
    for key, title in (("train", "Training step (forward, backward, AdamW), eager"), ("compiled", "Training step, each side torch.compile'd")):
        if key not in results:
            continue
        out += [f"### {title}", "", "cyclec is the `--fast` form (what `cyclec train` runs); readable is the default `cyclec build` (F.cross_entropy, one plain MoE path), the same weights.", "",
                "| spec | cyclec ms | readable ms | reference ms | transformers ms | cyclec / reference | cyclec / transformers | readable / cyclec | readable / reference |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in results[key]:
            ms = r["ms"]
            rd = (f"{ms['readable']:.1f}", f"{r['readable_vs_fast']:.3f}", f"{r['readable_vs_ref']:.3f}") if "readable" in ms else ("-", "-", "-")
            out.append(f"| {r['name']} | {ms['cyclec']:.1f} | {rd[0]} | {ms['reference']:.1f} | {ms['transformers']:.1f} | **{r['vs_ref']:.3f}** | **{r['vs_hf']:.3f}** | {rd[1]} | {rd[2]} |")
        notes = [r["note"] for r in results[key] if r["note"]]
        out += [""] + ([f"Note: {'; '.join(notes)}.", ""] if notes else [])
        rows = [r for r in results[key] if "cpu" in r]
        if rows:
            out += ["Spread and CPU time: the per-round ratios' quartiles behind the medians above; the same rounds timed by this process's "
                    "CPU time (what other processes take from the core does not count); minor page faults per step (fresh memory the allocator "
                    "took from the system and touched), medians over rounds.", "",
                    "| spec | cyclec / transformers, wall, p25-p75 | cyclec / transformers, CPU | cyclec / reference, CPU | "
                    "CPU ms: cyclec / readable / reference / transformers | page faults per step: cyclec / readable / reference / transformers |",
                    "|---|---|---|---|---|---|"]
            for r in rows:
                c, sp, f = r["cpu"], r["spread"]["vs_hf"], r["faults"]
                sides = [k for k in ("cyclec", "readable", "reference", "transformers") if k in c["ms"]]
                out.append(f"| {r['name']} | {sp[0]:.3f}-{sp[1]:.3f} | **{c['vs_hf']:.3f}** ({c['vs_hf_q'][0]:.3f}-{c['vs_hf_q'][1]:.3f}) | "
                           f"{c['vs_ref']:.3f} ({c['vs_ref_q'][0]:.3f}-{c['vs_ref_q'][1]:.3f}) | " + " / ".join(f"{c['ms'][k]:.1f}" for k in sides)
                           + " | " + " / ".join(f"{f[k]:,.0f}" for k in sides) + " |")
            out.append("")
        rows = [r for r in results[key] if "tok_s" in r]
        if rows:
            peaks = {r["peak_tflops"] for r in rows if r.get("peak_tflops")}
            out += ["Throughput: tokens per second per side, and model FLOPs utilisation (MFU: the step's model FLOPs, three times the "
                    "forward's as the IR counts them per token at this context, over the step's time and the device's peak"
                    + (f", {', '.join(f'{p:g}' for p in sorted(peaks))} TFLOP/s)." if peaks else "; no peak is known for this device, so no MFU)."), "",
                    "| spec | model GFLOP per step | cyclec tok/s | readable tok/s | reference tok/s | transformers tok/s | cyclec MFU | reference MFU | transformers MFU |",
                    "|---|---|---|---|---|---|---|---|---|"]
            for r in rows:
                tk, mfu = r["tok_s"], r.get("mfu")
                pct = (lambda k: f"{100 * mfu[k]:.1f}%" if mfu and k in mfu else "-")
                out.append(f"| {r['name']} | {r['gflop_step']:.1f} | {tk['cyclec']:,.0f} | " + (f"{tk['readable']:,.0f}" if "readable" in tk else "-")
                           + f" | {tk['reference']:,.0f} | {tk['transformers']:,.0f} | {pct('cyclec')} | {pct('reference')} | {pct('transformers')} |")
            out.append("")
    if "first-step" in results:
        n = results["first-step"][0].get("rounds", 0)
        out += ["### Time to the first compiled step", "",
                "torch.compile, then the first training step (forward, backward, AdamW), each side in a fresh process; cold: an empty inductor cache, "
                f"warm: the cache the cold run filled. Medians over {n} round{'s' if n != 1 else ''}; the ratios are medians of the per-round ratios. "
                "After two steps: to the end of the second step (compile and two warm-up steps, as the issue timed it), which holds the recompiles "
                "a second step triggers (the reference's MoE recompiles its experts for dynamic token counts there).", "",
                "| spec | cache | cyclec s | reference s | transformers s | cyclec / reference | cyclec / transformers | after two steps: cyclec / reference | cyclec / transformers |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in results["first-step"]:
            for kind in ("cold", "warm"):
                t, q = r["s"][kind], r["ratio"][kind]
                q2 = r.get("ready_ratio", {}).get(kind)
                two = f"**{q2['vs_ref']:.3f}** | **{q2['vs_hf']:.3f}**" if q2 else "- | -"
                out.append(f"| {r['name']} | {kind} | {t['cyclec']:.1f} | {t['reference']:.1f} | {t['transformers']:.1f} | **{q['vs_ref']:.3f}** | **{q['vs_hf']:.3f}** | {two} |")
        out += ["", "Where a cold compile goes (the last round): graphs dynamo compiled in the first step (and in the second), graph breaks, "
                "C++ kernels inductor built, seconds in dynamo's tracing, AOTAutograd (which includes inductor), inductor's code generation "
                "and the wait for the C++ builds, and whether the warm run found AOTAutograd's cache (hit) or could not use it (bypass).", "",
                "| spec | side | graphs | breaks | kernels | dynamo s | AOTAutograd s | codegen s | C++ wait s | warm AOTAutograd cache |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["first-step"]:
            for label, d in r["detail"].items():
                ph, aot = d["phases"], d["aot_cache_warm"]
                state = ", ".join(f"{k.removeprefix('autograd_cache_')} {v}" for k, v in sorted(aot.items())) or "-"
                out.append(f"| {r['name']} | {label} | {d['graphs']} (+{d['graphs_second']}) | {d['breaks']} | {d['kernels']} | {ph['dynamo']:.1f} | "
                           f"{ph['aot']:.1f} | {ph['codegen']:.1f} | {ph['cpp_wait']:.1f} | {state} |")
        out.append("")
    if "decode" in results:
        d = results["decode"]
        out += ["### Decoding (greedy, batch 1, Llama-style spec at width 128)", "",
                "| figure | value |", "|---|---|",
                f"| per-token time with the cache, around token 64 | {d['ms_first']:.2f} ms |",
                f"| per-token time with the cache, tokens 960-1024 | {d['ms_last']:.2f} ms (x{d['flat']:.2f}) |",
                f"| tokens per second with the cache, around token 64 | {1000 / d['ms_first']:,.0f} |",
                f"| speed-up of the cache over recomputing, 256 tokens | **x{d['x256']:.1f}** |",
                f"| speed-up of the cache over recomputing, 1024 tokens | **x{d['x1024']:.1f}** |"]
        if not d.get("same", True):
            out.append("| tokens: cache and recompute | differ (half precision rounds a near-tie apart) |")
        out.append("")
    if "expander" in results:
        x = results["expander"]
        out += ["### The expander cycle: Mamba-2, DeepSeek-V2/V3 and Qwen3-MoE against transformers, and a decoding cost that stays flat", "",
                "| figure | cyclec | transformers | cyclec / transformers |", "|---|---|---|---|"]
        for key, label in (("eager", "Mamba-2 training step, eager"), ("compiled", "Mamba-2 training step, both torch.compile'd")):
            ms = x[key]["ms"]
            out.append(f"| {label} | {ms['cyclec']:.1f} ms | {ms['transformers']:.1f} ms | **{x[key]['vs_hf']:.3f}** |")
        for name, label in (("deepseek_v2", "DeepSeek-V2"), ("deepseek_v3", "DeepSeek-V3 (its router)"), ("qwen3_moe", "Qwen3-MoE"),
                            ("qwen3_next", "Qwen3-Next (gated DeltaNet, transformers' torch path)")):
            for key, how in (("eager", "eager"), ("compiled", "both torch.compile'd")):
                if name in x:
                    ms = x[name][key]["ms"]
                    out.append(f"| {label} training step, {how} | {ms['cyclec']:.1f} ms | {ms['transformers']:.1f} ms | **{x[name][key]['vs_hf']:.3f}** |")
        out += ["", "| decoding, width 128, 2 blocks, batch 1 | around token 64 | around token 4,096 | growth |", "|---|---|---|---|"]
        for key, label in (("expander", "linear attention (expander.cycle)"), ("gpt2", "attention (gpt2.cycle)"),
                           ("gated_delta", "gated DeltaNet (expander.cycle's engine)"),
                           ("short_conv", "short gated conv (LFM2's, size 3)")):
            if key not in x:
                continue
            d = x[key]
            out.append(f"| {label} | {d['ms_first']:.3f} ms | {d['ms_last']:.3f} ms | **x{d['growth']:.2f}** |")
        out.append("")
    if "memory" in results:
        out += ["### Peak memory of a training step", "", "| spec | cyclec MiB | reference MiB | ratio | ratio above weights + AdamW state |", "|---|---|---|---|---|"]
        for r in results["memory"]:
            out.append(f"| {r['name']} | {r['cyclec'] / 2**20:.1f} | {r['reference'] / 2**20:.1f} | **{r['ratio']:.3f}** | {r['act_ratio']:.3f} |")
        out.append("")
    if "ops" in results:
        out += ["### What a training step dispatches", "",
                "One eager step (forward, backward, AdamW) after a warm-up step: aten ops dispatched and MiB of fresh tensor storage "
                "(outputs that hold none of their inputs' storage) per phase. Counted, not timed, so the same at any load; ops a "
                "custom op runs inside count as that one op (the run also prints each op's self CPU time, profiled, which moves "
                "with the load).", "",
                "| spec | side | forward ops | forward MiB | backward ops | backward MiB | AdamW ops | AdamW MiB | step ops | step MiB |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["ops"]:
            for label, t in r["total"].items():
                cells = [f"{t[ph][0]} | {t[ph][1] / 2**20:.1f}" for ph in PHASES]
                out.append(f"| {r['name']} | {label} | " + " | ".join(cells)
                           + f" | {sum(t[ph][0] for ph in PHASES)} | {sum(t[ph][1] for ph in PHASES) / 2**20:.1f} |")
        out += ["", "Where cyclec and transformers differ most (calls x fresh MiB in one step):", "",
                "| spec | phase | op | cyclec | transformers |", "|---|---|---|---|---|"]
        for r in results["ops"]:
            for d in r["diff"][:6]:
                out.append(f"| {r['name']} | {d['phase']} | `{d['op']}` | {d['cyclec'][0]} x {d['cyclec'][1] / 2**20:.2f} | "
                           f"{d['transformers'][0]} x {d['transformers'][1] / 2**20:.2f} |")
        out.append("")
    if "train-loop" in results:
        t = results["train-loop"]
        out += ["### The training loop (`cyclec train`) against its bare step", "",
                "gpt2 shrunk (width 256, 4 blocks), byte-level data from docs/*.md.", "",
                "| figure | value |", "|---|---|",
                f"| bare step (forward, backward, norm and clip, AdamW, schedule) | {t['bare_ms']:.1f} ms |",
                f"| loop step (+ reading the batch, flameout watch, metrics.jsonl, progress) | {t['loop_ms']:.1f} ms |",
                f"| loop / bare, in the same steps | **{t['ratio']:.4f}** |",
                f"| one checkpoint (weights, optimizer, state; fsync'd) | {t['ckpt_s']:.2f} s |",
                f"| loop / bare with a checkpoint every {t['ckpt_every']} steps | **{t['ratio'] + t['ckpt_share']:.4f}** |", ""]
        m = t["memory"]
        out += ["| activation checkpointing | peak MiB | above weights + AdamW state, MiB | saving |", "|---|---|---|---|"]
        act0 = m["none"]["peak"] - m["none"]["base"]
        for mode in ("none", "stage", "selective"):
            act = m[mode]["peak"] - m[mode]["base"]
            out.append(f"| {mode} | {m[mode]['peak'] / 2**20:.1f} | {act / 2**20:.1f} | **x{act0 / act:.2f}** |")
        out.append("")
    if "frontend" in results:
        f = results["frontend"]
        out += ["### The front end", "", f"Bare `python -c pass`: {f['bare'] * 1000:.0f} ms (median).", "",
                "| command (gpt2.cycle) | over bare Python |", "|---|---|"]
        out += [f"| `{k}` | **+{v * 1000:.0f} ms** |" for k, v in f["cli"].items()]
        out += ["", f"torch imported by `cyclec draw`: {'no' if f['torch_free'] else 'YES'}.", "",
                "| synthetic spec | lines | parse + check, wall | lines/s, wall | CPU time | lines per CPU second |", "|---|---|---|---|---|---|"]
        out += [f"| {s['label']} | {s['lines']:,} | {s['s'] * 1000:.1f} ms | {s['rate']:,.0f} | {s.get('cpu_s', float('nan')) * 1000:.1f} ms | "
                f"**{s.get('cpu_rate', float('nan')):,.0f}** |" for s in f["scale"]]
        out.append("")
    if "lsp" in results:
        r = results["lsp"]
        out += ["### The language server", "", "| figure | value |", "|---|---|",
                f"| a change to a {r['lines']}-line spec, to LSP diagnostics (in-process, median) | **{r['ms']:.1f} ms** (target ≤ {r['target_ms']:.0f} ms) |",
                f"| the same, CPU time | {r['cpu_ms']:.1f} ms |", f"| the same, worst of the run | {r['max_ms']:.1f} ms |"]
        if "stdio_ms" in r:
            out.append(f"| the same through `cyclec lsp` over stdio (didChange → publishDiagnostics, median) | {r['stdio_ms']:.1f} ms |")
        for k in ("300", "10k"):
            if f"complete_{k}_ms" in r:
                out.append(f"| completion / hover at the last stage of a {r[f'lines_{k}']:,}-line spec | {r[f'complete_{k}_ms']:.1f} ms / {r[f'hover_{k}_ms']:.1f} ms |")
        out.append("")
    return "\n".join(out)


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
    ap.add_argument("--child", help=argparse.SUPPRESS)  # SPEC:SIDE, run by the first-step section in a fresh process
    ap.add_argument("--verbose-child", action="store_true", help="with --child: also print compile_times() to stderr")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the models run (cuda: the GPU section of the doc)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the models' dtype, every side alike")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s for the MFU column (default: a data-sheet table of bf16 GPU peaks)")
    ap.add_argument("--write", action="store_true", help=f"replace the figures in {DOC.relative_to(ROOT)} (and benchmarks/results.json)")
    args = ap.parse_args(argv)
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
