"""`cyclec train --ep N`: expert parallelism (training/expert.py) on CPU with gloo, against one
process on the whole batch; and the refusals of --ep and --cp.

Each distributed case trains the same tiny engine from the same seed on the same global
batches (a rank takes its rows of each), so after 3 optimizer steps the loss of every step,
the held-out loss of the final evaluation (dropless) and every parameter (the correction
bias included) must agree within 1e-6. lr 1e-4, as in test_train_distributed's MoE case:
AdamW's first steps move a weight by about lr whatever its gradient, so an expert that got
few tokens turns a reduction's rounding into a difference proportional to lr.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from cyclelang import to_spec as load_string
from cyclelang.diagnostics import CycleError
from cyclelang.training import context, expert
from cyclelang.training.loop import Settings, run

from .conftest import ROOT
from .test_train_distributed import CORPUS, assert_same_parameters, env, losses
from .train_jobs import Launches

COMMON = ["--steps", "3", "--seq", "16", "--eval-every", "0", "--eval-batches", "2", "--ckpt-every", "0", "--lr", "1e-4",
          "--no-progress"]


def shrink(text: str, swaps: list[tuple[str, str]]) -> str:
    for a, b in swaps:
        assert a in text, a
        text = text.replace(a, b)
    return text


def moe_spec() -> str:
    """The library's MoE spec (Mixtral-style: top 2 of 8, capacity, balance loss), tiny, its
    capacity tightened to 0.5 so that training drops assignments (the queue is the global batch's)."""
    return shrink((ROOT / "specs" / "moe.cycle").read_text("utf-8"), [
        ("width=256", "width=32"), ("vocab=8192 context=512", "vocab=256 context=64"), ("stage block x 4", "stage block x 2"),
        ("capacity=1.25", "capacity=0.5"), ("hidden=512", "hidden=16")])


def deepseek_spec() -> str:
    """The deepseek_v3 family spec, tiny: latent attention, a dense first block, then DeepSeekMoE
    (sigmoid scores, group-limited top-k, the correction bias, x 2.5, a shared expert), with
    the auxiliary-loss-free trim switched on (correction_rate) so the bias moves too."""
    return shrink((ROOT / "specs" / "families" / "deepseek_v3.cycle").read_text("utf-8"), [
        ("d_model = 7168", "d_model = 32"), ("heads=128 latent=512 q_latent=1536 head_dim=128 rotary_dims=64 v_dim=128",
                                               "heads=4 latent=16 q_latent=24 head_dim=8 rotary_dims=4 v_dim=8"),
        ("hidden=18432", "hidden=48"), ("experts=256 top=8 hidden=2048", "experts=8 top=2 hidden=16"),
        ("groups=8 top_groups=4", "groups=4 top_groups=2"), ("correction=true shared=2048", "correction=true correction_rate=0.001 shared=16"),
        ("vocab=129280 context=4096", "vocab=256 context=64"), ("stage dense_block x 3", "stage dense_block x 1"),
        ("stage moe_block x 58", "stage moe_block x 2")])


def deepseek_eps_spec() -> str:
    """deepseek_spec with LFM2-MoE's renormalisation (the chosen scores over their sum + 1e-6,
    `normalize_eps`): the option reaches the expert-parallel dispatch."""
    return shrink(deepseek_spec(), [("correction=true correction_rate", "normalize=true normalize_eps=1e-6 correction=true correction_rate")])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    p = tmp_path_factory.mktemp("ep") / "corpus.txt"
    p.write_text(CORPUS, "utf-8")
    return p


def same_run(a, b, tol=1e-6):
    """Every train record's loss and the final evaluation's held-out loss, and every parameter."""
    ra, rb = losses(a), losses(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [1, 2, 3, 3]
    for x, y in zip(ra, rb):
        for k in ("loss", "val_loss"):
            if k in y:
                assert abs(x[k] - y[k]) < tol, (k, x, y)
    assert_same_parameters(a, b, tol)


def jamba_spec() -> str:
    """The library's jamba, tiny: nested stages, Mamba-1 mixers, attention, MoE every other layer.
    (At the library's state=16 the worst parameter, an ssm out_proj's, was 7.2e-07 off: AdamW's
    rounding amplification at lr 1e-4 again, outside the experts.)"""
    return shrink((ROOT / "specs" / "jamba.cycle").read_text("utf-8"), [
        ("let hidden = 1024", "let hidden = 16"), ("width=512", "width=32"), ("vocab=16384 context=2048", "vocab=256 context=64"),
        ("stage jamba_block x 2", "stage jamba_block x 1"), ("state=16", "state=4")])


SPECS = {"moe": moe_spec, "deepseek_v3": deepseek_spec, "jamba": jamba_spec, "deepseek_eps": deepseek_eps_spec}
TWO_STEPS = [a if a != "3" else "2" for a in COMMON]
# test_ep2_equals_one_process's cases: (spec, flags of the EP run)
EP2 = {"moe": ("moe", []), "deepseek_v3": ("deepseek_v3", []), "deepseek_eps": ("deepseek_eps", []), "jamba-fsdp": ("jamba", ["--fsdp"]),
       "moe-fsdp-ckpt": ("moe", ["--fsdp", "--checkpointing", "stage"]), "moe-accumulate": ("moe", ["--batch-tokens", "128"])}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """Every run of the distributed tests below, in three launches (tests/train_jobs.py): the
    two-process runs, the four-process ones, then the one-process references and the resumes of
    the EP checkpoints. Each test checks its runs against their reference."""
    tmp = tmp_path_factory.mktemp("ep-runs")
    specs = {}
    for which, text in SPECS.items():
        specs[which] = tmp / f"{which}.cycle"
        specs[which].write_text(text(), "utf-8")
    data = ["--data", corpus]
    jobs = Launches(tmp)
    for case, (which, flags) in EP2.items():
        jobs.add(2, f"ep2-{case}", specs[which], *data, "--out", tmp / f"ep2-{case}", "--micro-batch", "2", "--ep", "2", *flags, *COMMON)
    for case, flags in (("fsdp", ["--fsdp"]), ("ddp", [])):  # 2 of the 3 steps at EP=2 (resumed in one process below)
        jobs.add(2, f"ckpt-ep2-{case}", specs["moe"], *data, "--out", tmp / f"ckpt-ep2-{case}", "--micro-batch", "2", "--ep", "2", *flags,
                 *TWO_STEPS)
    jobs.add(2, "ckpt-fsdp", specs["deepseek_v3"], *data, "--out", tmp / "ckpt-fsdp", "--micro-batch", "2", "--fsdp", *TWO_STEPS)
    jobs.add(2, "resume-at-ep2", "--resume", tmp / "ckpt-fsdp", "--steps", "3", "--ep", "2", "--no-progress")
    for tp in (1, 2):
        jobs.add(4, f"four-tp{tp}", specs["moe"], *data, "--out", tmp / f"four-tp{tp}", "--micro-batch", str(tp), "--ep", "2", "--tp", str(tp),
                 "--fsdp", *COMMON)
    for which in SPECS:  # the references: one process on the whole batch
        jobs.add(1, f"one-{which}", specs[which], *data, "--out", tmp / f"one-{which}", "--micro-batch", "4", *COMMON)
    jobs.add(1, "one-moe-accumulate", specs["moe"], *data, "--out", tmp / "one-moe-accumulate", "--micro-batch", "4", "--batch-tokens", "128",
             *COMMON)
    for case in ("fsdp", "ddp"):
        jobs.add(1, f"resume-ckpt-ep2-{case}", "--resume", tmp / f"ckpt-ep2-{case}", "--steps", "3", "--no-progress")
    return tmp, jobs.run()


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EP2))
def test_ep2_equals_one_process(runs, case):
    """moe-accumulate: 2 micro-steps a step (the capacity is each micro-step's global batch's; the
    experts' gradients reduced once, after the last)."""
    tmp, jobs = runs
    which, flags = EP2[case]
    assert "expert parallel 2" + ("" if "--fsdp" in flags else ", DDP") in jobs[f"ep2-{case}"].stderr
    ref = "one-moe-accumulate" if "--batch-tokens" in flags else f"one-{which}"
    jobs[ref]
    same_run(tmp / f"ep2-{case}", tmp / ref)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2], ids=["fsdp-ep2", "fsdp-ep2-tp2"])
def test_four_processes_equal_one(runs, tp):
    """4 ranks. fsdp-ep2: the experts split in 2 ("ep"), each half FSDP2-sharded over its 2 copies
    ("edp"), the rest FSDP2 over all 4, each rank one sequence of the global batch of 4.
    fsdp-ep2-tp2: 2 data-parallel ranks of 2 tensor-parallel ones, the experts split in 2 over
    "ep" and each local expert's MLP split in 2 over "tp" (its fused [gate | up] rows regrouped,
    and put back in order in the full weights of every expert)."""
    tmp, jobs = runs
    assert "4 processes, FSDP, " + ("tensor parallel 2, " if tp > 1 else "") + "expert parallel 2" in jobs[f"four-tp{tp}"].stderr
    jobs["one-moe"]
    same_run(tmp / f"four-tp{tp}", tmp / "one-moe")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["fsdp", "ddp"])
def test_an_ep2_checkpoint_resumes_in_one_process(runs, case):
    """DCP written at EP=2 (each rank its experts, as FSDP2 shards or whole tensors DCP writes
    from the one rank that has them; the optimizer state flattened per parameter) reloads at
    one process: the records equal the uninterrupted run's."""
    tmp, jobs = runs
    jobs[f"resume-ckpt-ep2-{case}"], jobs["one-moe"]
    resumed_equal(tmp / f"ckpt-ep2-{case}", tmp / "one-moe")


def resumed_equal(out, one):
    """The train records and the final evaluation (the 2-step run also evaluated at its end)
    equal the uninterrupted run's record for record, and so do the parameters."""
    mine = [r for r in losses(out) if "loss" in r] + [losses(out)[-1]]
    ref = [r for r in losses(one) if "loss" in r] + [losses(one)[-1]]
    assert [r["step"] for r in mine] == [r["step"] for r in ref] == [1, 2, 3, 3]
    for a, b in zip(mine, ref):
        for k in ("loss", "val_loss", "grad_norm"):
            if k in b:
                assert a[k] == pytest.approx(b[k], abs=1e-6), (k, a, b)
    assert_same_parameters(out, one)


@pytest.mark.slow
def test_an_fsdp_checkpoint_resumes_at_ep2(runs):
    """The other way: 2 steps with FSDP2 and every expert on every rank, then the third at
    --ep 2 (each rank loads its experts' weights and optimizer state from the DCP shards). On
    the DeepSeek-V3 spec: without --ep a rank's capacity queue and balance loss are its own
    rows' (so the Mixtral-style spec's FSDP run is not one process's), while DeepSeek-V3's
    routing has neither and its trim sums the load over every rank."""
    tmp, jobs = runs
    assert "expert parallel 2" in jobs["resume-at-ep2"].stderr
    jobs["one-deepseek_v3"]
    resumed_equal(tmp / "ckpt-fsdp", tmp / "one-deepseek_v3")


# --- refusals (one process: nothing is created) -----------------------------------------


DENSE = """\
engine dense {
  chamber width=32
  throat causal
  feed tokens vocab=256 context=64
  stage block x 2 {
    prechamber mix { norm rmsnorm  turbine attention heads=4 rotary bias=false }
    prechamber burn { norm rmsnorm  turbine mlp ratio=2 act=swiglu bias=false }
  }
  norm rmsnorm
  nozzle head
}
"""


def refused(spec_text: str, tmp_path, **kw) -> str:
    with pytest.raises(CycleError) as e:
        run(load_string(spec_text), Settings(data=[str(tmp_path / "none.txt")], **kw), tmp_path / "run", spec_text=spec_text)
    assert not (tmp_path / "run").exists()
    return str(e.value)


def test_ep_is_refused_by_name(tmp_path):
    assert "dense has no MoE layer" in refused(DENSE, tmp_path, ep=2)
    assert "stages.0-1.burn.moe: 8 experts do not split over 3 ranks" in refused(moe_spec(), tmp_path, ep=3)
    assert "--ep 2 needs a number of processes that it divides, not 1" in refused(moe_spec(), tmp_path, ep=2)
    assert "--ep 2 x --tp 2 needs a number of processes that it divides, not 1" in refused(moe_spec(), tmp_path, ep=2, compile=True, tp=2,
                                                                                           fsdp=True)  # --compile composes
    assert "--ep must be at least 1, not 0" in refused(moe_spec(), tmp_path, ep=0)
    assert "correction_rate), so the recomputed forward would route with another bias" in refused(
        deepseek_spec(), tmp_path, ep=2, checkpointing="stage")


def test_cp_is_refused_naming_each_mixer(tmp_path):
    msg = refused(DENSE, tmp_path, cp=2)
    assert "context parallelism --cp 2 is not available: stages.0-1.mix.attn (attention)" in msg
    assert "ring attention" in msg
    ssm = (ROOT / "specs" / "mamba2.cycle").read_text("utf-8")
    msg = refused(ssm, tmp_path, cp=2)
    assert "carries a recurrent state along the sequence" in msg and "state passing is not written" in msg
    hybrid = load_string((ROOT / "specs" / "jamba.cycle").read_text("utf-8"))
    with pytest.raises(CycleError) as e:
        context.check(hybrid, 4)
    assert "(attention)" in str(e.value) and "(ssm)" in str(e.value)


def test_the_cli_refuses_without_a_traceback(tmp_path):
    spec = tmp_path / "dense.cycle"
    spec.write_text(DENSE, "utf-8")
    (tmp_path / "c.txt").write_text(CORPUS[:3000], "utf-8")
    p = subprocess.run([sys.executable, "-m", "cyclelang", "train", str(spec), "--data", str(tmp_path / "c.txt"), "--out",
                        str(tmp_path / "run"), "--ep", "2", "--no-progress"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=120)
    assert p.returncode != 0 and "error[E0512]" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "has no MoE layer" in p.stderr


def test_moe_parts_finds_every_moe_layer():
    assert [p.path for p in expert.moe_parts(load_string(deepseek_spec()))] == ["stages.1-2.burn.moe"]


@pytest.mark.slow  # two compiles (about 1.3 s)
def test_the_dispatch_counts_trace_into_a_graph_the_compile_cache_keeps():
    """The dispatch reads its row counts as Python ints. Through `expert._ints` the traced graph
    passes AOT autograd's cache check, so a later `--ep --compile` start reuses the traced forward
    and backward (the 4-process moe --ep 2 --fsdp --tp 2 job: 27 s warm before, 13 s after).
    `tensor.tolist()` does not pass it: a method call on a node that is not a tensor."""
    import torch
    from torch._functorch._aot_autograd import autograd_cache

    def refusals(ints):
        seen = []

        def backend(gm, example_inputs):
            for node in gm.graph.nodes:
                try:
                    autograd_cache.check_node_safe(node)
                except autograd_cache.BypassAOTAutogradCache as e:
                    seen.append(str(e).split(".")[0])
            return gm

        def rows(x, counts):
            return x.split(ints(counts.sum(dim=1)))[1] * 2

        x, counts = torch.randn(6, 3), torch.tensor([[1, 2], [2, 1]])
        torch._dynamo.reset()
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            got = torch.compile(rows, backend=backend, fullgraph=True)(x, counts)
        torch._dynamo.reset()
        assert torch.equal(got, x[3:] * 2)
        return seen

    assert expert._ints(torch.tensor([3, 0, 5])) == [3, 0, 5]
    assert refusals(expert._ints) == []
    assert refusals(lambda t: t.tolist())  # what it replaces (when torch accepts this, `_ints` can go)
