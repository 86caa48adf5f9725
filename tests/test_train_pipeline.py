"""Pipeline parallelism: the split of an engine into pieces (from the IR, balanced by the kinds
table's FLOPs), `cyclec check --report --pp N`, and `cyclec train --pp N` under torchrun on CPU
with gloo against one process on the same global batch.

A pipelined step runs its micro-steps as the pipeline's microbatches, so the reference is one
process with `--batch-tokens` of as many micro-steps (the same rows per forward: the MoE's
capacity and balance loss see the same tokens). After 3 steps every parameter and every loss
must agree within 1e-6. The models are tiny; the multi-process cases are slow.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

import cyclelang
from cyclelang.cli import main
from cyclelang.diagnostics import CycleError
from cyclelang.review import report, split
from cyclelang.training import checkpoint, pipeline
from cyclelang.training.loop import Settings

from .conftest import ROOT
from .test_train_distributed import CORPUS, env
from .train_jobs import Launches

COMMON = ["--steps", "3", "--seq", "16", "--eval-every", "0", "--eval-batches", "2", "--ckpt-every", "0", "--no-progress"]
MICRO = 4  # microbatches (micro-steps) per step

LLAMA_BLOCK = """\
stage llama_block(heads, kv, hidden) {
  prechamber mix {
    norm rmsnorm
    turbine attention heads=heads kv_heads=kv rotary bias=false
  }
  prechamber burn {
    norm rmsnorm
    turbine mlp hidden=hidden act=swiglu bias=false
  }
}
"""


def llama(blocks: int, width: int = 512, vocab: int = 32000, context: int = 2048, heads: int = 8, kv: int = 2,
          hidden: int = 1408) -> str:
    """The llama spec's shape (specs/llama.cycle) at another depth and size."""
    return LLAMA_BLOCK + f"""
engine llama {{
  chamber width={width}
  throat causal
  feed tokens vocab={vocab} context={context} position=none
  stage llama_block(heads={heads}, kv={kv}, hidden={hidden}) x {blocks}
  norm rmsnorm
  nozzle head
  startup {{ warmup 2  schedule constant lr=1e-3  clip 1.0 }}
}}
"""


def tiny_jamba() -> str:
    """specs/jamba.cycle (nested stages, Mamba, attention, MoE with a balance loss) at width 32."""
    text = (ROOT / "specs" / "jamba.cycle").read_text("utf-8")
    for old, new in (("let heads = 8", "let heads = 4"), ("let hidden = 1024", "let hidden = 32"), ("width=512", "width=32"),
                     ("vocab=16384 context=2048", "vocab=256 context=64"), ("state=16", "state=4"), ("experts=8", "experts=4"),
                     ("  nozzle head\n}", "  nozzle head\n  startup { warmup 2  schedule constant lr=1e-4  clip 1.0 }\n}")):
        assert old in text, old  # the spec changed: update the shrinking here
        text = text.replace(old, new)
    return text


TAP = """\
engine tap {
  chamber width=32
  throat causal
  feed tokens vocab=256 context=64
  stage block x 2 {
    prechamber mix { norm layernorm  turbine attention heads=4  merge cooling }
    prechamber burn { norm layernorm  turbine mlp ratio=2  merge cooling }
  }
  stage tap {
    prechamber critic detach { norm layernorm  turbine mlp ratio=2  merge cooling }
    prechamber probe overboard loss=0.1 { norm layernorm  turbine linear out=vocab }
  }
  stage late x 2 {
    prechamber mix { norm layernorm  turbine attention heads=4  merge cooling }
    prechamber burn { norm layernorm  turbine mlp ratio=2  merge cooling }
  }
  norm layernorm
  nozzle head
  startup { warmup 2  schedule constant lr=1e-3  clip 1.0 }
}
"""


def engine(text: str):
    return cyclelang.parse(text, "<test>").engine


# --- the split (no processes) -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama24", "jamba"])
def test_the_split_at_4_balances_flops_within_1_3x_and_keeps_everything_in_order(name):
    spec = cyclelang.parse(llama(24), "<test>") if name == "llama24" else cyclelang.load(ROOT / "specs" / "jamba.cycle")
    e = spec.engine
    pieces = split.split(e, 4)
    assert len(pieces) == 4 and pieces[0].feed and pieces[-1].nozzle and not any(p.feed for p in pieces[1:])
    mean = sum(p.flops for p in pieces) / 4
    assert all(p.flops <= 1.3 * mean for p in pieces), [p.flops / mean for p in pieces]
    # every stage instance once, in the order the model runs them (the layout's layers), none empty
    layers = [path for path, _ in cyclelang.ir.layout.layout(e).layers()]
    assert [u.path for p in pieces for u in p.units if u.stage is not None] == layers
    assert all(p.stage_units for p in pieces)
    # the pieces add up to the report's totals (the same kinds-table figures, summed another way)
    assert sum(p.flops for p in pieces) == report.forward_flops_per_token(e, e.feed.context)
    assert sum(p.params for p in pieces) == report.analyze(spec)["params"]["total"]


def test_a_nested_engine_splits_at_the_instances_inside_its_groups():
    e = cyclelang.load(ROOT / "specs" / "jamba.cycle").engine
    paths = [u.path for u in split.split(e, 4)[1].units]
    assert all(re.fullmatch(r"stages\.\d\.stages\.\d(\.stages\.\d)?", p) for p in paths), paths


def test_check_report_pp_prints_each_piece(tmp_path):
    spec = tmp_path / "llama24.cycle"
    spec.write_text(llama(24))
    r = CliRunner().invoke(main, ["check", "--report", "--pp", "4", str(spec)])
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "Pipeline split of llama into 4 pieces" in out
    rows = [line for line in out.splitlines() if re.match(r"  [0-3] ", line)]
    assert len(rows) == 4 and "feed, stages.0-" in rows[0] and "nozzle + loss" in rows[3]
    assert "W161" not in r.output
    j = CliRunner().invoke(main, ["check", "--json", "--pp", "4", str(spec)])
    pipe = json.loads(j.stdout)[0]["report"]["pipeline"]
    assert len(pipe["pieces"]) == 4 and pipe["worst_over_mean"] <= 1.3


def test_check_pp_warns_on_an_uneven_split(tmp_path):
    spec = tmp_path / "llama8.cycle"
    spec.write_text(llama(8))
    r = CliRunner().invoke(main, ["check", "--pp", "4", str(spec)])
    assert "warning[W161]" in r.output and "1.53x the mean" in r.output
    r = CliRunner().invoke(main, ["check", "--pp", "9", str(spec)])
    assert "warning[W161]" in r.output and "fewer than the 9 pipeline pieces" in r.output


def _refusal(e, world=4, **kw) -> str:
    with pytest.raises(CycleError) as info:
        pipeline.check(e, Settings(**kw), world)
    return info.value.diagnostics[0].message


def test_what_the_pipeline_cannot_run_is_refused_by_name():
    small = engine(llama(4, width=32, vocab=256, context=64, heads=4, hidden=64))
    assert "fewer than the 8 pipeline pieces" in _refusal(small, world=8, pp=8)
    assert "with 2 virtual pieces per rank" in _refusal(small, pp=4, pp_schedule="interleaved", microbatches=4)
    assert "needs 4 processes" in _refusal(small, world=2, pp=2, tp=2)
    assert "does not divide the 6 processes" in _refusal(small, world=6, pp=4)
    assert "--microbatches 2 is fewer than the 4 pipeline ranks" in _refusal(small, pp=4, microbatches=2)
    pipeline.check(small, Settings(pp=4, microbatches=2, pp_schedule="gpipe"), 4)  # GPipe takes any number
    assert "--compile" in _refusal(small, world=2, pp=2, compile=True)
    assert "--dtype fp16" in _refusal(small, world=2, pp=2, dtype="fp16")
    assert "--pp 2 x --ep 2 needs 4 processes" in _refusal(small, world=2, pp=2, ep=2)  # with --ep: tests/test_train_ep_pp.py
    hyper = cyclelang.load(ROOT / "specs" / "hyper.cycle").engine
    assert "several residual streams (hyper-connections)" in _refusal(hyper, world=2, pp=2)


def test_train_pp_on_one_process_says_how_to_launch(tmp_path):
    spec = tmp_path / "llama.cycle"
    spec.write_text(llama(4, width=32, vocab=256, context=64, heads=4, hidden=64))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS[:4000])
    p = subprocess.run([sys.executable, "-m", "cyclelang", "train", str(spec), "--data", str(corpus), "--out", str(tmp_path / "run"),
                        "--pp", "2", *COMMON], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=120)
    assert p.returncode != 0 and "error[E0513]" in p.stderr and "--pp 2 needs 2 processes" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "run").exists()


# --- training under torchrun ------------------------------------------------------------------


def records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_equal_parameters(a, b, tol=1e-6):
    wa, wb = load_file(checkpoint.weights(a)), load_file(checkpoint.weights(b))
    assert wa.keys() == wb.keys()
    worst = max((float((wa[k] - wb[k]).abs().max()), k) for k in wa)
    assert worst[0] <= tol, worst


def assert_equal_runs(a, b, tol=1e-6):
    assert_equal_parameters(a, b, tol)
    ra, rb = records(a), records(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        for k in ("loss", "val_loss"):
            if k in y:
                assert abs(x[k] - y[k]) <= tol, (k, x, y)


SPECS = {"llama": lambda: llama(8, width=32, vocab=256, context=64, heads=4, hidden=64), "jamba": tiny_jamba, "tap": lambda: TAP,
         "tied": lambda: TAP.replace("  nozzle head\n", "  nozzle head tied\n")}


PP = [(2, "gpipe"), (2, "1f1b"), (2, "interleaved"), (4, "gpipe"), (4, "1f1b"), (4, "interleaved")]
# test_pp_equals_one_process's: llama at every degree and schedule; the nested hybrid (jamba) at every schedule on 2
# ranks, and on 4 interleaved (8 pieces: its groups split the finest)
PIPED = [("llama", pp, schedule) for pp, schedule in PP] + [("jamba", pp, schedule) for pp, schedule in PP if pp == 2 or schedule == "interleaved"]
FOUR = {"tp2xpp2": ["--tp", "2"], "fsdp2xpp2": ["--fsdp"]}  # test_pp_composes_with_tp_and_fsdp_on_four_processes's
TIED = {"interleaved": (2, ["--pp-schedule", "interleaved"]), "fsdp2xpp2": (4, ["--fsdp", "--micro-batch", "1"])}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every training run of the tests below, in three launches (tests/train_jobs.py): the
    two-process runs, the four-process ones (the resume at --pp 4 after the run it resumes), then
    one process per spec, MICRO micro-steps of 2 sequences a step (the references), and the
    resume in one process."""
    tmp = tmp_path_factory.mktemp("pipe")
    corpus = tmp / "corpus.txt"
    corpus.write_text(CORPUS, "utf-8")
    specs = {}
    for name, text in SPECS.items():
        specs[name] = tmp / f"{name}.cycle"
        specs[name].write_text(text())
    jobs = Launches(tmp)

    def piped(nproc, job, name, *flags, common=COMMON):
        jobs.add(nproc, job, specs[name], "--data", corpus, "--out", tmp / job, "--micro-batch", 2, "--pp", 2, "--microbatches", MICRO,
                 *flags, *common)

    two_steps = [a if a != "3" else "2" for a in COMMON]
    for nproc in (2, 4):
        for name, pp, schedule in PIPED:
            if pp == nproc:
                jobs.add(nproc, f"{name}-pp{pp}-{schedule}", specs[name], "--data", corpus, "--out", tmp / f"{name}-pp{pp}-{schedule}",
                         "--micro-batch", 2, "--pp", pp, "--microbatches", MICRO, "--pp-schedule", schedule, *COMMON)
        for case, (n, flags) in TIED.items():
            if n == nproc:
                piped(nproc, f"tied-{case}", "tied", *flags)
        if nproc == 2:
            piped(2, "tap-pp2", "tap")
            piped(2, "jamba-ckpt", "jamba", "--pp-schedule", "interleaved", "--checkpointing", "stage")
            for at in (1, 4):  # saved at --pp 2 after 2 steps, resumed below
                piped(2, f"llama-resume-{at}", "llama", common=two_steps)
        else:
            for case, flags in FOUR.items():
                micro = 1 if "--fsdp" in flags else 2  # two data-parallel replicas take a row each
                jobs.add(4, f"llama-4-{case}", specs["llama"], "--data", corpus, "--out", tmp / f"llama-4-{case}", "--micro-batch", micro,
                         "--pp", 2, "--microbatches", MICRO, *flags, *COMMON)
            jobs.add(4, "resumed-4", "--resume", tmp / "llama-resume-4", "--steps", "3", "--no-progress", "--pp", 4)
    for name in SPECS:
        jobs.add(1, f"{name}-one", specs[name], "--data", corpus, "--out", tmp / f"{name}-one", "--micro-batch", 2, "--batch-tokens",
                 2 * 16 * MICRO, *COMMON)
    jobs.add(1, "resumed-1", "--resume", tmp / "llama-resume-1", "--steps", "3", "--no-progress")
    return tmp, jobs.run()


def against(runs, job, name):
    """The run `job` (finished) and the one-process reference of spec `name`."""
    tmp, jobs = runs
    jobs[f"{name}-one"]
    return jobs[job], tmp / job, tmp / f"{name}-one"


@pytest.mark.slow
@pytest.mark.parametrize("name,pp,schedule", PIPED, ids=[f"{pp}-{schedule}-{name}" for name, pp, schedule in PIPED])
def test_pp_equals_one_process(runs, name, pp, schedule):
    job, out, one = against(runs, f"{name}-pp{pp}-{schedule}", name)
    assert f"pipeline {pp} ({schedule}, {MICRO} microbatches)" in job.stderr
    assert job.stderr.count("step 3/3 | train") == 1
    assert_equal_runs(out, one)


@pytest.mark.slow
def test_an_overboard_head_in_an_early_piece_carries_its_loss(runs):
    """The tap's weighted next-token loss is computed in piece 0 and carried to the last."""
    assert "stages.2" in [u.path for u in split.split(engine(TAP), 2)[0].units]
    _, out, one = against(runs, "tap-pp2", "tap")
    assert_equal_runs(out, one)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FOUR))
def test_pp_composes_with_tp_and_fsdp_on_four_processes(runs, case):
    job, out, one = against(runs, f"llama-4-{case}", "llama")
    assert "pipeline 2" in job.stderr
    assert_equal_runs(out, one)


@pytest.mark.slow
@pytest.mark.parametrize("at", [1, 4], ids=["one-process", "pp4"])
def test_a_dcp_checkpoint_of_pp2_resumes_at_another_layout_record_for_record(runs, at):
    """Saved at --pp 2; resumed in one process (DCP gathers the pieces' names into one model)
    or at --pp 4 (the split moves: every piece reads its own names)."""
    tmp, jobs = runs
    _, out, one = against(runs, f"llama-resume-{at}", "llama")
    state = json.loads((out / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["pp"] == 2 and (out / "checkpoints" / "step-000002" / "dcp").is_dir()
    jobs[f"resumed-{at}"]
    mine = [r for r in records(out) if "loss" in r] + [records(out)[-1]]
    theirs = [r for r in records(one) if "loss" in r] + [records(one)[-1]]
    assert [r["step"] for r in mine] == [r["step"] for r in theirs] == [1, 2, 3, 3]
    for a, b in zip(mine, theirs):
        for k in ("loss", "val_loss", "grad_norm", "lr", "tokens"):
            if k in b:
                assert a[k] == pytest.approx(b[k], abs=1e-6), (k, a, b)
    assert_equal_parameters(out, one)


@pytest.mark.slow
def test_activation_checkpointing_recomputes_inside_the_pieces(runs):
    """Jamba's groups are split between pieces (interleaved: 4 pieces on 2 ranks); `stage`
    checkpointing wraps each top-level group, and its recomputation must run the piece's
    own units, with the balance losses' gradients kept."""
    _, out, one = against(runs, "jamba-ckpt", "jamba")
    assert_equal_runs(out, one)


# Every spec of the library, shrunk to width 32 and 4 instances a stage, as 2 pieces on
# one rank (the interleaved schedule over a process group of one): its loss and every gradient
# against the model itself on the same two micro-steps. Run in a child process (a process group).
EVERY_SPEC = r'''
import glob, json, os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
import cyclelang
from cyclelang import ir
from cyclelang.backends.torch.build import build_source, load_source
from cyclelang.backends.torch.codegen import codegen, engine_spec
from cyclelang.diagnostics import CycleError
from cyclelang.training import pipeline
from cyclelang.training.distributed import Distributed
from cyclelang.training.loop import Settings

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one process: no port to race for
mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("pp", "dp", "tp"))
one = Distributed(0, 1, 0, torch.device("cpu"), mesh, 1, 1)
out = {}


def dropout(x):
    """Whether an IR dump sets any dropout above 0."""
    if isinstance(x, dict):
        return any((k == "dropout" and v) or dropout(v) for k, v in x.items())
    return isinstance(x, list) and any(dropout(v) for v in x)


for f in sorted(glob.glob("specs/*.cycle")):
    spec = ir.passes.shrink(engine_spec(cyclelang.load(f)), width=32, depth=4)
    e = spec.engine
    if dropout(e.model_dump()):
        out[f] = "dropout"  # its masks are drawn in another order: equal in distribution only
        continue
    s = Settings(pp=2, pp_schedule="interleaved")
    try:
        pipeline.check(e, s, 2)
    except CycleError as err:
        out[f] = "refused: " + err.diagnostics[0].message
        continue
    source = codegen(spec, fast=True, parallel=True)
    ref, model = build_source(spec, source, seed=0), build_source(spec, source, seed=0)
    g = torch.Generator().manual_seed(1)
    T = min(16, e.feed.context)
    batches = [tuple(torch.randint(0, e.feed.vocab, (2, T), generator=g) for _ in range(2)) for _ in range(2)]
    total = 0.0
    for x, y in batches:
        loss = ref(x, y)[1]
        (loss / 2).backward()
        total += loss.item()
    pipe = pipeline.Pipeline(spec, model, load_source(source, e.name), one, s, 2)
    got = float(pipe.step(batches))
    mine = dict(pipe.model.named_parameters())
    grads = [(n, p.grad, mine[n].grad if n in mine else None) for n, p in ref.named_parameters() if p.grad is not None]
    assert all(b is not None for _, _, b in grads), f
    out[f] = {"loss": abs(got - total) / total, "grad": max(float((a - b).abs().max()) for _, a, b in grads)}
dist.destroy_process_group()
print(json.dumps(out))
'''


@pytest.mark.slow  # every library spec built, split and stepped in a child process (5 s); the fast tier keeps the split and the refusals above
def test_every_spec_pipelines_exactly_or_is_refused_by_name():
    p = subprocess.run([sys.executable, "-c", EVERY_SPEC], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    compared = {f: r for f, r in out.items() if isinstance(r, dict)}
    assert len(compared) >= 20, out
    for f, r in compared.items():
        assert r["loss"] <= 1e-6 and r["grad"] <= 1e-6, (f, r)  # the loss relative: float32 sums in another order
    others = {f: r for f, r in out.items() if not isinstance(r, dict)}
    assert others == {"specs/hyper.cycle": "refused: --pp 2: hyper carries several residual streams (hyper-connections) between "
                                           "stages; a piece sends one stream", "specs/post_ln.cycle": "dropout"}, others


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TIED))
def test_a_tied_nozzle_keeps_one_embedding_over_the_first_and_last_piece(runs, case):
    """The feed's embedding is also the head: the first and the last pipeline rank each hold it,
    their gradients are summed (and counted once in the norm), so both copies stay equal to the
    one process's weight."""
    tmp, _ = runs
    assert "nozzle head tied" in (tmp / "tied.cycle").read_text()
    _, out, one = against(runs, f"tied-{case}", "tied")
    assert_equal_runs(out, one)
