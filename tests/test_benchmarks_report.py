"""The benchmark script's arithmetic and its report: tokens/s and MFU from the IR's FLOPs."""

import importlib.util
import types
from pathlib import Path

import pytest

import cyclelang
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
    text = bench.spec_text("gpt2", bench.SHRINK["gpt2"])
    rep = analyze(cyclelang.parse(text))
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
