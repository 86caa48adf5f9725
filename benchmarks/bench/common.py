"""What every benchmark shares: the specs under test, the three sides at the same weights, the
alternating timer and its ratios, the FLOP and peak figures behind tokens/s and MFU."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))  # reference.py

DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = BENCH / "results.json"  # the figures in DOC, as data
START, END = "<!-- results:start -->", "<!-- results:end -->"
# A run on an accelerator keeps its own figures and its own section of the doc.
GPU_RESULTS = BENCH / "results_gpu.json"
GPU_START, GPU_END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"

# --- the specs under test, shrunk to fit two CPU cores (`ir.passes.shrink`'s sizes) ------------

SHRINK = {
    # GPT-2 small's cycle at width 256, 4 blocks, 4 heads of 64
    "gpt2": dict(width=256, heads=4, depth=4, vocab=8192, context=256),
    # the Llama cycle at width 256: 8 query heads over 2 KV heads of 32, SwiGLU 704, 4 blocks
    "llama": dict(width=256, depth=4, vocab=8192, context=256),
    # the MoE cycle as written (width 256, 4 blocks, 8 experts top-2), a shorter context
    "moe": dict(context=256),
}
# the expander cycle: Mamba-2 at width 256 (8 heads of 64, 4 blocks; state 64 and chunk 128: MAMBA2_STATE);
# decoding engines at width 128
MAMBA2 = dict(width=256, heads=8, depth=4, vocab=8192, context=256)
MAMBA2_STATE = ("state=128 groups=1 expand=2 conv=4 chunk=256", "state=64 groups=1 expand=2 conv=4 chunk=128")
FLAT = dict(width=128, heads=4, depth=2, vocab=2048, context=4160)
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
# llama at width 128: 4 heads of 32 over 2 KV heads, SwiGLU 352, 2 blocks
DECODE = dict(width=128, heads=4, depth=2, vocab=2048, context=1280)


def spec_text(name: str) -> str:
    """A library spec's text, as written."""
    return (ROOT / "specs" / f"{name}.cycle").read_text("utf-8")


def shrunk(name: str, sizes: dict, text: str | None = None):
    """A library spec (or `text`, a variant of it) at a scale model: `ir.passes.shrink(spec, **sizes)`."""
    import cyclelang
    from cyclelang import ir

    return ir.passes.shrink(cyclelang.parse(spec_text(name) if text is None else text), **sizes)


def sizes_of(spec) -> dict:
    """The sizes a reference and a transformers model are built at, read from a (shrunk) spec's IR: the
    width, the layers, the first attention's heads and kv heads, the first MLP's or MoE's hidden width, and
    the MoE's experts, top, capacity and balance (0 without one)."""
    from cyclelang import ir

    e = spec.engine
    leaves = ir.leaf_stages(e.body)
    ops = [o for st, _ in leaves for b in st.branch_list() for o in b.ops]
    att = next(o for o in ops if isinstance(o, ir.Attention))
    ff = next(o for o in ops if isinstance(o, (ir.Mlp, ir.Moe)))
    moe = isinstance(ff, ir.Moe)
    return dict(width=e.width, layers=sum(n for _, n in leaves), heads=att.heads, kv=att.kv_heads, hidden=ff.hidden,
                experts=ff.experts if moe else 0, top=ff.top if moe else 0, capacity=(ff.capacity or 0.0) if moe else 0.0,
                balance=ff.balance if moe else 0.0)


def median(xs):
    return statistics.median(xs)


def synchronize(torch, device):
    """Wait for the device's queued work, so a host clock reads the time it took."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# --- the sides, timed alike -------------------------------------------------------------------


def models(name, torch):
    """(ours, reference, transformers) at the same config and the same weights."""
    import reference as R
    import transformers

    import cyclelang
    from cyclelang.interop import load_transformers

    spec = shrunk(name, SHRINK[name])
    ours = cyclelang.build(spec, seed=0, fast=True)
    c, d = ours.config, sizes_of(spec)
    if name == "gpt2":
        ref = R.GPT(R.GPTConfig(vocab_size=c.vocab_size, block_size=c.context, n_layer=d["layers"], n_head=d["heads"], n_embd=d["width"]))
        hf_cfg = transformers.GPT2Config(vocab_size=c.vocab_size, n_positions=c.context, n_embd=d["width"], n_layer=d["layers"], n_head=d["heads"],
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        hf = transformers.GPT2LMHeadModel(hf_cfg)
    else:
        moe = d["experts"] > 0
        ref = R.Llama(R.LlamaConfig(vocab_size=c.vocab_size, max_seq_len=c.context, dim=d["width"], n_layers=d["layers"], n_heads=d["heads"],
                                    n_kv_heads=d["kv"], hidden=d["hidden"], n_experts=d["experts"], top_k=d["top"] or 2, capacity=d["capacity"],
                                    balance=d["balance"]))
        kw = dict(vocab_size=c.vocab_size, hidden_size=d["width"], intermediate_size=d["hidden"], num_hidden_layers=d["layers"],
                  num_attention_heads=d["heads"], num_key_value_heads=d["kv"], max_position_embeddings=c.context, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        hf_cfg = transformers.MixtralConfig(num_local_experts=d["experts"], num_experts_per_tok=d["top"], **kw) if moe else transformers.LlamaConfig(**kw)
        hf = (transformers.MixtralForCausalLM if moe else transformers.LlamaForCausalLM)(hf_cfg)
    load_transformers(ours, hf)  # the configs line up (else InteropError); all three share weights
    R.copy_weights(ref, ours)
    return ours, ref, hf


def compile_regions(model):
    """`model` compiled in place by regions through its generated file's `compile_model` (what
    `cyclec train --compile` runs: each distinct stage once); the model needs `parallel=True`."""
    sys.modules[type(model).__module__].compile_model(model)
    return model


def adamw(model, torch):
    """The optimizer every side steps with: AdamW, fused (one kernel for every tensor), as the
    generated `configure_optimizer` and transformers' Trainer (its default on torch >= 2.8) give
    their users."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


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
    """The first and third quartiles of the per-round ratios a / b: the spread behind `ratio` (one
    round, `--rounds 1`: its ratio, twice)."""
    rs = [x / y for x, y in zip(times[a], times[b])]
    if len(rs) < 2:
        return rs * 2
    q = statistics.quantiles(rs, n=4, method="inclusive")
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
    from cyclelang.review.report import forward_flops_per_token

    return 3 * forward_flops_per_token(shrunk(name, SHRINK[name]).engine, seq) * batch * seq


def throughput(times, name, args, torch) -> dict:
    """Tokens per second and model FLOPs utilisation of each side (same model FLOPs for every
    side: they compute the same function)."""
    f, peak = step_flops(name, args.batch, args.seq), peak_flops(args, torch)
    med = {k: median(v) for k, v in times.items()}
    return {"tok_s": {k: args.batch * args.seq / t for k, t in med.items()}, "gflop_step": f / 1e9, "peak_tflops": peak and peak / 1e12,
            "mfu": {k: f / t / peak for k, t in med.items()} if peak else None}
