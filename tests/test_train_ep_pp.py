"""`cyclec train --pp N --ep M`: expert parallelism inside pipeline pieces, on CPU with gloo
(4 processes: pp 2 x ep 2, FSDP2 over each pipeline rank's 2 data-parallel ranks), against
one process on the same global batch; and what the two together still refuse.

The mesh is ("pp", "edp", "ep", "tp"): each pipeline rank's MoE layers route their tokens
among the "ep" ranks of that pipeline rank, with the global micro-step's routing statistics
(capacity queue, balance loss's routed fractions, the correction bias's load). A pipelined
step runs its micro-steps as the pipeline's microbatches, so the reference is one process
with `--batch-tokens` of as many micro-steps of the whole global rows (what test_train_pipeline
does for jamba's MoE): the same tokens per forward. After 3 optimizer steps every loss, the
final held-out loss and every parameter (the correction bias included) agree within 1e-6;
lr 1e-4 as in test_train_expert (AdamW turns an expert's rounding into a difference
proportional to lr).
"""

from __future__ import annotations

import pytest

from cyclelang import to_spec as load_string
from cyclelang.diagnostics import CycleError
from cyclelang.training import pipeline
from cyclelang.training.loop import Settings, run

from .test_train_distributed import CORPUS, losses, weights
from .test_train_expert import COMMON, deepseek_spec, moe_spec, resumed_equal
from .train_jobs import Launches

MICRO = 2  # microbatches (micro-steps) a step
ROWS = 2  # sequences per micro-step on each of the 2 data-parallel ("ep") ranks
SEQ = 16  # COMMON's --seq


def moe4() -> str:
    """The moe spec at 4 blocks: 4 pieces for the interleaved schedule on 2 ranks, each with a MoE."""
    return moe_spec().replace("stage block x 2", "stage block x 4")


def deepseek_dense2() -> str:
    """DeepSeek-V3 with 2 dense blocks: the first piece holds no experts (its ranks are only
    data-parallel), the second both MoE layers."""
    return deepseek_spec().replace("stage dense_block x 1", "stage dense_block x 2")


SPECS = {"moe": moe_spec, "deepseek_v3": deepseek_spec, "deepseek_dense2": deepseek_dense2, "moe4": moe4}


# test_pp2_ep2_equals_one_process's cases: (spec, schedule, further flags)
PP2_EP2 = {"moe-gpipe": ("moe", "gpipe", []), "moe-1f1b": ("moe", "1f1b", []), "deepseek_v3-gpipe": ("deepseek_v3", "gpipe", []),
           "deepseek_v3-1f1b": ("deepseek_v3", "1f1b", []), "deepseek_dense2-1f1b": ("deepseek_dense2", "1f1b", []),
           "moe4-interleaved": ("moe4", "interleaved", []), "moe-1f1b-ckpt": ("moe", "1f1b", ["--checkpointing", "stage"])}
PP2_EP2_FLAGS = ["--micro-batch", ROWS, "--pp", 2, "--ep", 2, "--fsdp", "--microbatches", MICRO]
TWO_STEPS = [a if a != "3" else "2" for a in COMMON]
SAYS = f"4 processes, pipeline 2 (1f1b, {MICRO} microbatches), FSDP, expert parallel 2"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run of the tests below, in three launches (tests/train_jobs.py): the 2-process --ep 2
    run to resume from, the 4-process pp 2 x ep 2 runs (a resume after the run it resumes), then
    the one-process references (MICRO micro-steps of the global 2 x ROWS sequences a step) and
    the one-process resume."""
    tmp = tmp_path_factory.mktemp("eppp")
    corpus = tmp / "corpus.txt"
    corpus.write_text(CORPUS, "utf-8")
    spec = {}
    for name, text in SPECS.items():
        spec[name] = tmp / f"{name}.cycle"
        spec[name].write_text(text(), "utf-8")
    data = ["--data", corpus]
    jobs = Launches(tmp)
    jobs.add(2, "deepseek-from-ep2", spec["deepseek_v3"], *data, "--out", tmp / "deepseek-from-ep2", "--micro-batch", ROWS,
             "--batch-tokens", 2 * ROWS * SEQ * MICRO, "--ep", 2, "--fsdp", *TWO_STEPS)
    for case, (name, schedule, flags) in PP2_EP2.items():
        jobs.add(4, case, spec[name], *data, "--out", tmp / case, *PP2_EP2_FLAGS, "--pp-schedule", schedule, *flags, *COMMON)
    jobs.add(4, "moe-resume", spec["moe"], *data, "--out", tmp / "moe-resume", *PP2_EP2_FLAGS, *TWO_STEPS)
    jobs.add(4, "resume-at-pp2-ep2", "--resume", tmp / "deepseek-from-ep2", "--steps", "3", "--pp", 2, "--ep", 2, "--no-progress")
    for name in SPECS:
        jobs.add(1, f"one-{name}", spec[name], *data, "--out", tmp / f"one-{name}", "--micro-batch", 2 * ROWS,
                 "--batch-tokens", 2 * ROWS * SEQ * MICRO, *COMMON)
    jobs.add(1, "resume-at-1", "--resume", tmp / "moe-resume", "--steps", "3", "--no-progress")
    return tmp, jobs.run()


def worst(a, b) -> tuple[float, str]:
    """The largest difference of any parameter (or buffer) of the two runs' full weights."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max((float((wa[k] - wb[k]).abs().max()), k) for k in wa)


def says_pp2_ep2(job, schedule="1f1b"):
    assert "4 processes, pipeline 2 (" in job.stderr and f"{MICRO} microbatches), FSDP, expert parallel 2" in job.stderr, job.stderr[-2000:]
    assert f"pipeline 2 ({schedule}" in job.stderr, job.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PP2_EP2))
def test_pp2_ep2_equals_one_process(runs, case):
    """moe: Mixtral-style, capacity 0.5 (training drops assignments from the global micro-step's
    queue) and a balance loss carried along the pipeline; deepseek_v3: sigmoid group-limited
    routing, a shared expert, the correction bias trimmed by the load of the pipeline rank's
    data-parallel ranks; deepseek_dense2: a piece without experts; moe4: 4 pieces, 2 a rank;
    ckpt: each stage instance recomputed in the backward, its dispatch with it."""
    tmp, jobs = runs
    name, schedule, flags = PP2_EP2[case]
    says_pp2_ep2(jobs[case], schedule)
    jobs[f"one-{name}"]
    out, one = tmp / case, tmp / f"one-{name}"
    mine, theirs = losses(out), losses(one)
    assert [r["step"] for r in mine] == [r["step"] for r in theirs] == [1, 2, 3, 3]
    for a, b in zip(mine, theirs):
        for k in ("loss", "val_loss", "grad_norm"):
            if k in b:
                assert abs(a[k] - b[k]) <= 1e-6, (k, a, b)
    diff, key = worst(out, one)
    print(f"pp2 x ep2 {name} {schedule} {' '.join(flags)}: worst parameter difference {diff:.1e} ({key})")
    assert diff <= 1e-6, (diff, key)


@pytest.mark.slow
def test_a_dcp_checkpoint_of_pp2_ep2_resumes_in_one_process_record_for_record(runs):
    """2 steps at pp 2 x ep 2 (each rank writes its pieces' parameters, the experts from the
    "ep" rank that holds them; the optimizer state flattened per parameter), the third in one
    process: every record (loss, grad norm, held-out loss) and parameter equals the
    uninterrupted one-process run's."""
    tmp, jobs = runs
    says_pp2_ep2(jobs["moe-resume"])
    jobs["resume-at-1"], jobs["one-moe"]
    resumed_equal(tmp / "moe-resume", tmp / "one-moe")
    diff, key = worst(tmp / "moe-resume", tmp / "one-moe")
    print(f"pp2 x ep2 saved, resumed at 1: worst parameter difference {diff:.1e} ({key})")


@pytest.mark.slow
def test_an_ep2_checkpoint_resumes_at_pp2_ep2(runs):
    """The other way: 2 steps at --ep 2 (2 processes, no pipeline), the third at pp 2 x ep 2 (each
    rank loads its pieces' parameters and its own experts' weights and optimizer state from
    the DCP shards; the correction bias too)."""
    tmp, jobs = runs
    jobs["deepseek-from-ep2"], jobs["one-deepseek_v3"]
    assert SAYS in jobs["resume-at-pp2-ep2"].stderr
    resumed_equal(tmp / "deepseek-from-ep2", tmp / "one-deepseek_v3")
    diff, key = worst(tmp / "deepseek-from-ep2", tmp / "one-deepseek_v3")
    print(f"--ep 2 saved, resumed at pp2 x ep2: worst parameter difference {diff:.1e} ({key})")


# --- refusals (no processes) ------------------------------------------------------------


def _refusal(spec_text: str, world: int, **kw) -> str:
    with pytest.raises(CycleError) as info:
        pipeline.check(load_string(spec_text).engine, Settings(**kw), world)
    return info.value.diagnostics[0].message


def test_what_pp_with_ep_still_refuses_is_refused_by_name(tmp_path):
    assert "--pp 2 x --ep 2 needs 4 processes or more" in _refusal(moe_spec(), 2, pp=2, ep=2)
    assert "--pp 2 x --ep 2 does not divide the 6 processes" in _refusal(moe_spec(), 6, pp=2, ep=2)
    assert "--pp 2 on 4 processes leaves 2 data-parallel replicas: add --fsdp" in _refusal(moe_spec(), 4, pp=2, ep=2)  # no DDP in pieces
    pipeline.check(load_string(moe4()).engine, Settings(pp=2, ep=2, fsdp=True, pp_schedule="interleaved"), 8)  # 4 pieces on 2 ranks
    # through the run (one process): the experts' own refusals name the layer, the launch counts pp x ep
    for kw, says in (({"ep": 3}, "stages.0-1.burn.moe: 8 experts do not split over 3 ranks"),
                     ({"ep": 2}, "--pp 2 x --ep 2 needs a number of processes that it divides, not 1")):
        with pytest.raises(CycleError) as e:
            run(load_string(moe_spec()), Settings(data=[str(tmp_path / "none.txt")], pp=2, **kw), tmp_path / "run", spec_text=moe_spec())
        assert says in str(e.value)
        assert not (tmp_path / "run").exists()
