"""The benchmark script's arithmetic and its report: tokens/s and MFU from the IR's FLOPs."""

import importlib.util
import types
from pathlib import Path

import pytest

from cyclelang.review import analyze

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeCuda:
    def __init__(self, name):
        self.name = name

    def get_device_name(self, device):
        return self.name


def test_step_flops_is_the_reports_training_count(bench):
    # at the spec's own context the report's training FLOPs per token, times the tokens
    rep = analyze(bench.shrunk("gpt2", bench.SHRINK["gpt2"]))
    n = rep["flops_per_token"]["context"]
    assert bench.step_flops("gpt2", 2, n) == 2 * n * rep["flops_per_token"]["training"]
    # shorter sequences attend to fewer positions: fewer FLOPs per token
    assert bench.step_flops("gpt2", 1, 64) / 64 < bench.step_flops("gpt2", 1, 128) / 128


def test_peak_table_picks_the_most_specific_name(bench):
    args = types.SimpleNamespace(peak_tflops=None, device="cuda", dtype="bfloat16")
    for name, peak in (("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H200", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0)):
        assert bench.peak_flops(args, types.SimpleNamespace(cuda=FakeCuda(name))) == pytest.approx(peak * 1e12)
    assert bench.peak_flops(args, types.SimpleNamespace(cuda=FakeCuda("Some Unknown GPU"))) is None
    assert bench.peak_flops(types.SimpleNamespace(peak_tflops=None, device="cpu", dtype="float32"), None) is None
    assert bench.peak_flops(types.SimpleNamespace(peak_tflops=2.0, device="cpu", dtype="float32"), None) == 2e12


def test_throughput_and_its_table(bench):
    args = types.SimpleNamespace(peak_tflops=10.0, device="cpu", dtype="float32", batch=2, seq=64)
    times = {"cyclec": [0.5, 0.4, 0.6], "readable": [0.5], "reference": [1.0, 1.0], "transformers": [0.25]}
    t = bench.throughput(times, "llama", args, None)
    f = bench.step_flops("llama", 2, 64)
    assert t["tok_s"] == {"cyclec": 128 / 0.5, "readable": 128 / 0.5, "reference": 128.0, "transformers": 512.0}
    assert t["mfu"]["transformers"] == pytest.approx(f / 0.25 / 10e12)
    assert t["gflop_step"] == pytest.approx(f / 1e9)
    meta = {"date": "d", "cpu": "x", "threads": 1, "dtype": "float32", "gpu": None, "torch": "t", "transformers": "h", "python": "p",
            "batch": 2, "seq": 64, "rounds": 3, "steps": 1, "command": "c"}
    row = {"name": "llama", "ms": {k: 1000 * bench.median(v) for k, v in times.items()}, "vs_ref": 0.5, "vs_hf": 2.0,
           "readable_vs_fast": 1.0, "readable_vs_ref": 0.5, "note": "", **t}
    text = bench.render({"train": {"meta": meta, "data": [row]}})
    line = next(ln for ln in text.splitlines() if ln.startswith("| llama |") and "%" in ln)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:6] == ["256", "256", "128", "512"]
    assert cells[8] == f"{100 * f / 0.25 / 10e12:.1f}%"
    assert "10 TFLOP/s" in text
    # a row recorded before these columns existed renders without them
    old = {k: v for k, v in row.items() if k not in t}
    assert "Throughput" not in bench.render({"train": {"meta": meta, "data": [old]}})


def test_time_sides_counts_cpu_time_and_page_faults_per_step(bench):
    import time

    import mmap

    def busy():  # CPU work
        t = time.process_time()
        while time.process_time() - t < 0.004:
            pass

    def sleepy():  # wall time, no CPU: a stand-in for the core being held by another process
        time.sleep(0.02)

    def fresh():  # touches fresh pages (an anonymous map is new memory every time; malloc may reuse)
        with mmap.mmap(-1, 4 << 20) as m:
            for i in range(0, len(m), mmap.PAGESIZE):
                m[i] = 1

    cpu, faults = {}, {}
    times = bench.time_sides({"busy": busy, "sleepy": sleepy, "fresh": fresh}, 4, 2, cpu=cpu, faults=faults)
    assert all(len(v) == 4 for d in (times, cpu, faults) for v in d.values())
    assert bench.median(times["sleepy"]) > 0.015 and bench.median(cpu["sleepy"]) < 0.005
    assert bench.median(cpu["busy"]) >= 0.004
    if bench.minor_faults():  # a platform that counts them
        assert bench.median(faults["fresh"]) > bench.median(faults["busy"])
    lo, hi = bench.quartiles({"a": [1.0, 2.0, 3.0, 4.0], "b": [1.0, 1.0, 1.0, 1.0]}, "a", "b")
    assert lo <= bench.ratio({"a": [1.0, 2.0, 3.0, 4.0], "b": [1.0] * 4}, "a", "b") <= hi and lo < hi


def test_the_spread_table_renders_cpu_time_and_page_faults(bench):
    meta = {"date": "d", "cpu": "x", "threads": 1, "dtype": "float32", "gpu": None, "torch": "t", "transformers": "h", "python": "p",
            "batch": 2, "seq": 64, "rounds": 3, "steps": 1, "command": "c"}
    row = {"name": "llama", "ms": {"cyclec": 1.0, "reference": 2.0, "transformers": 4.0}, "vs_ref": 0.5, "vs_hf": 0.25, "note": "",
           "readable_vs_fast": 1.0, "readable_vs_ref": 1.0,
           "spread": {"vs_hf": [0.2, 0.3], "vs_ref": [0.4, 0.6]},
           "cpu": {"ms": {"cyclec": 0.9, "reference": 1.8, "transformers": 3.0}, "vs_hf": 0.3, "vs_hf_q": [0.29, 0.31], "vs_ref": 0.5, "vs_ref_q": [0.45, 0.55]},
           "faults": {"cyclec": 0.0, "reference": 10.0, "transformers": 4096.0}}
    text = bench.render({"train": {"meta": meta, "data": [row]}})
    line = next(ln for ln in text.splitlines() if ln.startswith("| llama |") and "0.200-0.300" in ln)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:] == ["0.200-0.300", "**0.300** (0.290-0.310)", "0.500 (0.450-0.550)", "0.9 / 1.8 / 3.0", "0 / 10 / 4,096"]
    old = {k: v for k, v in row.items() if k not in ("spread", "cpu", "faults")}
    assert "Spread and CPU time" not in bench.render({"train": {"meta": meta, "data": [old]}})


@pytest.mark.slow
def test_step_ops_counts_each_phases_ops_and_fresh_bytes(bench):
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(11, 6), torch.nn.Linear(6, 11, bias=False)

        def forward(self, idx, tgt):
            h = self.emb(idx)  # (2, 5, 6): one fresh (2, 5, 6) float tensor
            h = h.view(-1, 6)  # a view: no fresh storage
            logits = self.head(h)
            return logits, torch.nn.functional.cross_entropy(logits, tgt.view(-1))

    torch.manual_seed(0)
    m = Tiny()
    idx = torch.randint(0, 11, (2, 5))
    got = bench.step_ops(m, torch.optim.AdamW(m.parameters(), lr=1e-3), idx, idx, False, torch)
    assert set(got) == set(bench.PHASES)
    fwd, bwd, opt = (got[p] for p in bench.PHASES)
    assert fwd["embedding"] == [1, 2 * 5 * 6 * 4]
    assert fwd["view"][1] == 0  # views allocate nothing
    assert "embedding_dense_backward" in bwd and "embedding" not in bwd
    assert opt and "lerp_" in opt and opt["lerp_"][1] == 0  # AdamW's in-place updates allocate nothing
    assert not any(op.startswith("_record_function") for ops in got.values() for op in ops)  # profiler markers are not work

    meta = {"date": "d", "cpu": "x", "threads": 1, "dtype": "float32", "gpu": None, "torch": "t", "transformers": "h", "python": "p",
            "batch": 2, "seq": 5, "rounds": 3, "steps": 1, "command": "c"}
    total = {ph: [sum(v[0] for v in ops.values()), sum(v[1] for v in ops.values())] for ph, ops in got.items()}
    row = {"name": "tiny", "total": {"cyclec": total}, "diff": [{"phase": "backward", "op": "zeros", "cyclec": [1, 2**20], "transformers": [0, 0]}]}
    text = bench.render({"ops": {"meta": meta, "data": [row]}})
    assert "| tiny | backward | `zeros` | 1 x 1.00 | 0 x 0.00 |" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| tiny | cyclec |"))
    assert line.split("|")[-3].strip() == str(sum(n for n, _ in total.values()))

    # the profiled self CPU time lands in the phase each op ran in
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ms = bench.step_self_ms({"tiny": lambda mark: bench.training_step(m, opt, idx, idx, False, mark)}, 3, torch)["tiny"]
    assert "embedding" in ms["forward"] and "embedding" not in ms["backward"]
    assert "embedding_dense_backward" in ms["backward"] and "lerp_" in ms["optimizer"] and "lerp_" not in ms["backward"]
    assert all(v >= 0 for ph in ms.values() for v in ph.values()) and sum(ms["backward"].values()) > 0


def test_the_expander_table_has_a_regional_row_where_one_was_timed(bench):
    """The imported families' compiled step, ours by regions (what `cyclec train --compile` runs)
    beside whole; results from before the regional side render without it."""
    meta = {"date": "d", "cpu": "x", "threads": 1, "dtype": "float32", "gpu": None, "torch": "t", "transformers": "h", "python": "p",
            "batch": 2, "seq": 64, "rounds": 3, "steps": 1, "command": "c"}
    step = lambda **more: {"eager": {"ms": {"cyclec": 10.0, "transformers": 11.0}, "vs_hf": 0.91},
                           "compiled": {"ms": {"cyclec": 9.0, "transformers": 9.5, **more.get("ms", {})}, "vs_hf": 0.947,
                                        **{k: v for k, v in more.items() if k != "ms"}}}
    data = {**step(), "deepseek_v3": step(ms={"regional": 8.5}, regional_vs_hf=0.894, regional_vs_whole=0.944)}
    # by CPU time: the median and quartiles of the per-round ratios, where the run kept them
    data["deepseek_v3"]["compiled"]["cpu"] = {"cyclec": [0.95, 0.93, 0.97], "regional": [0.9, 0.88, 0.92]}
    text = bench.render({"expander": {"meta": meta, "data": data}})
    rows = [line for line in text.splitlines() if "compiled by regions" in line]
    assert rows == ["| DeepSeek-V3 (its router) training step, compiled by regions (`cyclec train --compile`; 0.944x whole) | 8.5 ms | 9.5 ms | **0.894** "
                    "| 0.900 (0.880-0.920) |"]
    assert "| DeepSeek-V3 (its router) training step, both torch.compile'd | 9.0 ms | 9.5 ms | **0.947** | 0.950 (0.930-0.970) |" in text
    assert "| Mamba-2 training step, both torch.compile'd | 9.0 ms | 9.5 ms | **0.947** | - |" in text


def test_keep_heap_reuses_freed_memory_and_is_never_written(bench):
    """--keep-heap: blocks of a step's sizes, freed, come back from the heap rather than being
    given back to the system and faulted in again (glibc as it comes trims the top of the heap
    and faults every round here); a run that writes the doc's tables refuses the flag."""
    import subprocess
    import sys

    prog = f"""
import ctypes, importlib.util, resource, sys
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
if sys.argv[1] == "keep":
    spec = importlib.util.spec_from_file_location("bench_run", {str(ROOT / "benchmarks" / "run.py")!r})
    run = importlib.util.module_from_spec(spec); spec.loader.exec_module(run); run.keep_heap()
sizes = [n << 20 for n in (16, 24, 8, 16)]
def step():
    blocks = [libc.malloc(n) for n in sizes]
    for p, n in zip(blocks, sizes):
        ctypes.memset(p, 1, n)
    for p in blocks:
        libc.free(p)
step(); step()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""
    faults = {how: int(subprocess.run([sys.executable, "-c", prog, how], capture_output=True, text=True, check=True).stdout)
              for how in ("keep", "as-it-comes")}
    assert faults["keep"] < 64 and faults["as-it-comes"] > 4096, faults  # 64 MiB a round: 16,384 pages of 4 KiB
    with pytest.raises(SystemExit):
        bench.main(["--keep-heap", "--write", "--only", "compiled"])
