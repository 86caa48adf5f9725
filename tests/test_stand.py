"""The test stand (`cyclec fire`, `cyclelang.fire`): shrink, readings, checks, training, CLI.

Everything fires scale models (width 16-64, a few stages, a few tokens) on one
thread, so the whole module stays within seconds of CPU.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from .conftest import ROOT, need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang import ir  # noqa: E402
from cyclelang.cli import main  # noqa: E402
from cyclelang.stand import StandReport, shrink  # noqa: E402
from cyclelang.stand.train import find_spikes  # noqa: E402

SPEC = lambda name: str(ROOT / "specs" / f"{name}.cycle")  # noqa: E731
XIONG = [str(ROOT / "examples/xiong/post_ln.cycle"), str(ROOT / "examples/xiong/pre_ln.cycle")]
GOLDEN = ROOT / "tests/goldens/stand"
TINY = dict(width=32, depth=2, seq=8, batch=2)


@pytest.fixture(autouse=True)
def one_thread():
    """Scale models are bound by per-op overhead; one thread is faster and does not contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def invoke(args):
    from click.testing import CliRunner

    return CliRunner().invoke(main, args, catch_exceptions=False)


# --- shrink: a pure IR transformation ------------------------------------------------------


def test_shrink_rescales_widths_and_rederives_merges():
    big = cyclelang.load(SPEC("gpt2"))
    small = shrink(big, width=64, depth=2)
    e = small.engine
    assert (e.width, e.feed.width, e.nozzle.width) == (64, 64, 64)
    (stage,) = [op for op in e.body if isinstance(op, ir.Stage)]
    assert stage.repeat == 2
    mix, burn = ir.stage_branches(stage)
    attn, mlp = mix.ops[1], burn.ops[1]
    assert (attn.heads, attn.head_dim, attn.kv_heads) == (8, 8, 8)  # 12 heads no longer divide 64
    assert mlp.hidden == 256  # ratio 4 kept
    assert mix.merge.merges == 4 and math.isclose(mix.merge.std, 0.02 / 2)  # cooled for 2 x 2 merges
    assert shrink(big) is big
    assert big.engine.width == 768  # the input is untouched
    # still a valid IR
    assert ir.Spec.model_validate(small.model_dump()).model_dump() == small.model_dump()


def test_shrink_rederives_deepnorm_and_embedding_scale():
    deep = shrink(cyclelang.load(SPEC("deepnet")), depth=4)
    m = ir.stage_branches([op for op in deep.engine.body if isinstance(op, ir.Stage)][0])[0].merge
    assert (m.layers, m.alpha, m.beta) == (4, 8 ** 0.25, 32 ** -0.25)
    post = shrink(cyclelang.load(SPEC("post_ln")), width=64)
    assert post.engine.feed.scale == 8.0  # sqrt(width) follows the width


def test_shrink_keeps_gqa_groups_and_rejects_bad_sizes():
    small = shrink(cyclelang.load(SPEC("llama")), width=64)
    attn = [o for b in ir.stage_branches(small.engine.body[0]) for o in b.ops if isinstance(o, ir.Attention)][0]
    assert attn.heads % attn.kv_heads == 0 and attn.heads * attn.head_dim == 64
    with pytest.raises(cyclelang.CycleError):
        shrink(cyclelang.load(SPEC("gpt2")), width=2)
    r = invoke(["fire", SPEC("gpt2"), "--width", "32", "--depth", "1", "--seq", "5000"])
    assert r.exit_code == 1 and "context" in r.output


# --- readings ------------------------------------------------------------------------------


def test_api_equals_cli_json(tmp_path):
    out = tmp_path / "fire.json"
    r = invoke(["fire", SPEC("gas_generator"), SPEC("post_ln"), "--width", "32", "--depth", "2", "--seq", "8", "--batch", "2",
                "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "pressure" in r.output and "ok   causal" in r.output
    report = cyclelang.fire([SPEC("gas_generator"), SPEC("post_ln")], **TINY)
    assert json.loads(out.read_text()) == json.loads(report.model_dump_json())
    assert StandReport.model_validate_json(out.read_text()) == report
    gas = report.runs[0]
    assert [s.stage for s in gas.stages] == ["block", "block", "tap"]
    assert [b.name for b in gas.stages[-1].branches] == ["critic", "probe"]
    assert {c.name: c.status for c in gas.checks} == {"detach": "pass", "causal": "pass", "kv_cache": "pass"}
    assert {c.name: c.status for c in report.runs[1].checks} == {"detach": "skip", "causal": "skip", "kv_cache": "skip"}


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_pressure_chain_equals_independent_autograd():
    """The stand's numbers against a second computation: full backward hooks and loss.backward()."""
    spec = shrink(cyclelang.load(SPEC("gpt2")), width=32, depth=3)
    report = cyclelang.fire(spec, seq=8, batch=2, seed=3)
    run = report.runs[0]
    model = cyclelang.build(spec, seed=3).eval()
    tokens = torch.randint(0, spec.engine.feed.vocab, (2, 9), generator=torch.Generator().manual_seed(3))
    grads = {}
    hooks = [model.feed.register_full_backward_hook(lambda m, gi, go: grads.__setitem__(0, go[0]))]
    for i, st in enumerate(model.stages):
        hooks.append(st.register_full_backward_hook(lambda m, gi, go, i=i: grads.__setitem__(i + 1, go[0])))
    _, loss = model(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    loss.backward()
    for h in hooks:
        h.remove()
    assert math.isclose(run.loss, loss.item(), rel_tol=1e-6)
    for k, s in enumerate(run.stages):
        assert math.isclose(s.grad_in, grads[k].norm().item(), rel_tol=1e-5)
        assert math.isclose(s.grad_out, grads[k + 1].norm().item(), rel_tol=1e-5)
        for name, value in s.params.items():
            assert math.isclose(value, model.get_parameter(f"stages.{k}.{name}").grad.norm().item(), rel_tol=1e-5, abs_tol=1e-12)
        mix = model.stages[k].mix
        assert math.isclose(s.branches[0].grad_norm, math.sqrt(sum(p.grad.norm().item() ** 2 for p in mix.parameters())), rel_tol=1e-5)


def test_rezero_starts_unlit_and_detach_gets_exact_zero():
    run = cyclelang.fire(SPEC("rezero"), **TINY).runs[0]
    assert all(b.intensity == 0.0 for s in run.stages for b in s.branches)
    assert all(s.grad_in == run.stages[0].grad_in for s in run.stages)  # identity engine: nothing changes the chain


def test_checks_fail_loudly():
    from cyclelang.stand.measure import check_causal, check_detach, check_kv_cache

    spec = shrink(cyclelang.load(SPEC("gas_generator")), width=32, depth=1)
    model = cyclelang.build(spec, seed=0)
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    assert check_causal(model, spec, idx).status == "pass"
    # a stage that lets the last position's state into every position: the future leaks
    h = model.stages[0].register_forward_hook(lambda m, a, out: out + out[:, -1:] * 1e-3)
    try:
        assert check_causal(model, spec, idx).status == "fail"
        assert check_kv_cache(model, spec, idx).status == "fail"
    finally:
        h.remove()
    # an IR that says 'detach' fired against a model built without it
    attached = spec.model_copy(update=dict(engine=spec.engine.model_copy(update=dict(body=[
        op.model_copy(update=dict(ops=[b.model_copy(update=dict(detach=False)) for b in op.ops])) if isinstance(op, ir.Stage) and op.name == "tap" else op
        for op in spec.engine.body]))))
    leaky = cyclelang.build(attached, seed=0)
    c = check_detach(leaky, spec, idx, idx)
    assert c.status == "fail" and "critic" in c.detail


# --- training ------------------------------------------------------------------------------


@pytest.mark.slow  # two training runs
def test_training_is_deterministic_learns_and_reports_the_floor():
    kw = dict(width=32, depth=1, seq=16, batch=4, seed=1, train=40)
    a = cyclelang.fire(SPEC("gpt2"), **kw).runs[0].training
    b = cyclelang.fire(SPEC("gpt2"), **kw).runs[0].training
    assert a == b
    assert a.done == 40 and not a.interrupted and a.source == "markov(alphabet=32, seed=1)"
    assert 0 < a.floor < a.unigram < math.log(32)
    assert a.final_loss < a.loss[0] - 2  # from log(50257) towards the alphabet
    assert len(a.lr) == len(a.grad_norm) == 40


def test_spike_detection():
    losses = [3.0 - 0.01 * i for i in range(40)]
    losses[30] += 1.5
    losses[31] += 0.8
    (spike,) = find_spikes(losses)
    assert spike.step == 30 and math.isclose(spike.size, 1.5 - 0.01 * 10.5, abs_tol=1e-9)
    assert find_spikes([2.0] * 30) == []
    assert find_spikes([2.0] * 25 + [float("nan")])[0].size == math.inf


@pytest.mark.slow  # a training run through the CLI
def test_ctrl_c_stops_cleanly_and_writes(tmp_path, monkeypatch):
    from cyclelang.cli import fire as fire_cli

    def interrupt(self, name, step, steps, loss):
        if step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(fire_cli.Progress, "__call__", interrupt)
    out = tmp_path / "fire.json"
    r = invoke(["fire", SPEC("gpt2"), SPEC("rezero"), "--width", "16", "--depth", "1", "--seq", "8", "--batch", "2",
                "--train", "50", "--json", str(out), "--plot", str(tmp_path / "f.png")])
    assert r.exit_code == 130
    data = json.loads(out.read_text())
    assert data["interrupted"] and len(data["runs"]) == 1
    assert data["runs"][0]["training"]["done"] == 3 and data["runs"][0]["training"]["interrupted"]
    assert (tmp_path / "f.png").read_bytes().startswith(b"\x89PNG")


def test_data_file(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the chamber pressure rises and the turbine spins. " * 20)
    run = cyclelang.fire(SPEC("gpt2"), width=16, depth=1, seq=16, batch=2, data=str(text), train=5).runs[0]
    assert run.settings.data == "file:text.txt" and run.training.floor is None and run.training.done == 5
    r = invoke(["fire", SPEC("deepnet"), "--width", "16", "--depth", "1", "--data", str(text)])
    assert r.exit_code == 0
    tiny = tmp_path / "tiny.cycle"
    tiny.write_text("engine t { chamber width=8 throat causal feed tokens vocab=16 context=8 stage s { prechamber m { turbine mlp } } nozzle head }\n")
    r = invoke(["fire", str(tiny), "--data", str(text)])
    assert r.exit_code == 1 and "vocab" in r.output


def test_import_stays_torch_free():
    code = "import cyclelang, cyclelang.stand, cyclelang.stand.result, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- the measured figures the docs quote -----------------------------------------------------


def _figures(report: StandReport) -> dict:
    out = {}
    for r in report.runs:
        out[r.name] = {
            "loss": round(r.loss, 4),
            "pressure": [float(f"{s.pressure:.4g}") for s in r.stages],
            "grad_in": [float(f"{s.grad_in:.4g}") for s in r.stages],
            "grad_w2": [float(f"{s.params['burn.mlp.proj.weight']:.4g}") for s in r.stages],
        }
    return out


@pytest.mark.slow  # fires two specs
def test_xiong_figures_golden(golden):
    """docs/test_stand.md: `cyclec fire examples/xiong/post_ln.cycle examples/xiong/pre_ln.cycle --batch 8`.

    Pins the numbers (4 significant digits, compared within 0.2%: float32 sums may round
    differently on another CPU), not the conclusion."""
    figures = _figures(cyclelang.fire(XIONG, batch=8, seed=0))
    path = GOLDEN / "xiong_seed0.json"
    text = json.dumps(figures, indent=2) + "\n"
    if golden.update or not path.exists():
        golden.check(path, text)
        return
    expected = json.loads(path.read_text())
    assert expected.keys() == figures.keys()
    for name, series in expected.items():
        for key, want in series.items():
            got = figures[name][key]
            assert got == pytest.approx(want, rel=2e-3), f"{name} {key}: {got} != {want}"


@pytest.mark.slow
def test_depth24_example_smoke(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import depth24
    finally:
        sys.path.remove(str(ROOT / "examples"))
    report = depth24.main(tmp_path / "d.png", steps=2)
    assert [r.name for r in report.runs] == depth24.NAMES
    assert all(r.training.done == 2 for r in report.runs)
    assert (tmp_path / "d.png").read_bytes().startswith(b"\x89PNG")


# --- measurements on the diagram -------------------------------------------------------------


def test_draw_annotate_golden(golden, tmp_path):
    """The report is a fixture (fired once, kept), so the DOT is a pure function of it."""
    from cyclelang.backends.graphviz import to_dot
    from cyclelang.stand.readings import pressure_readings

    report = GOLDEN / "gas_generator.fire.json"
    spec = cyclelang.load(SPEC("gas_generator"))
    readings = pressure_readings(spec, StandReport.model_validate_json(report.read_text("utf-8")).runs[0])
    assert readings["chain"]["stages.0-3"] > 0 and "stages.4.probe" in readings["branches"]  # folded and instance paths
    # by path only: a firing that lacks this spec's instances gives them no readings (matching by name gave every
    # stage of one name the same ones)
    firing = StandReport.model_validate_json(report.read_text("utf-8")).runs[0]
    part = pressure_readings(spec, firing.model_copy(update={"stages": firing.stages[:2] + firing.stages[4:]}))
    assert "stages.0-3" not in part["chain"] and part["chain"]["stages.4"] == readings["chain"]["stages.4"]
    dot = to_dot(spec, annotate=readings)
    # pin the annotated wires and the printed numbers (which wire got which value and colour), not the rest of the diagram
    edges = [line.strip() for line in dot.splitlines() if "value=" in line or 'class="value ' in line or "colourbar" in line]
    golden.check(GOLDEN / "gas_generator.annotated.txt", "\n".join(re.sub(r' pos="[^"]*"', "", e) for e in edges) + "\n")
    assert dot != to_dot(spec)
    assert "‖dL/dx‖ =" in dot and "gradient norm =" in dot
    # the detached read carries exactly zero gradient: drawn as zero, never as the hottest wire
    cut = [line for line in dot.splitlines() if 'class="cut stages.4.critic' in line]
    assert len(cut) == 1 and "value=0\"" in cut[0] and 'color="#b0b8c0"' in cut[0] and 'style="dashed"' in cut[0]
    assert "0 · no gradient" in dot
    # an absolute scale: whole decades around every value, with its numbers
    lo, hi = re.search(r'class="colourbar ([0-9.e+-]+) ([0-9.e+-]+)"', dot).groups()
    vals = [v for t in readings.values() for v in t.values() if v > 0]
    assert float(lo) <= min(vals) and max(vals) <= float(hi) and math.log10(float(hi) / float(lo)) % 1 == 0
    # one value per wire
    assert all(line.count("value=") <= 1 for line in dot.splitlines())
    # a folded stage carries a sparkline of the gradient entering each of its instances
    assert dot.count('class="spark"') == 1 and "legend spark" in dot
    expanded = to_dot(spec, annotate=readings, expand=True)
    assert expanded.count("‖dL/dx‖ =") > dot.count("‖dL/dx‖ =")
    # compare mode: one scale for every engine drawn, so the same value has the same colour
    louder = {t: {k: v * 20 for k, v in table.items()} for t, table in readings.items()}
    both = to_dot([spec, spec], annotate=[readings, louder])
    bars = re.findall(r'class="colourbar ([0-9.e+-]+) ([0-9.e+-]+)"', both)
    assert len(bars) == 1
    lo2, hi2 = (float(x) for x in bars[0])
    assert lo2 <= float(lo) and hi2 >= 20 * max(vals) and lo2 * 10 ** round(math.log10(hi2 / lo2)) == pytest.approx(hi2)

    def colour_of(dot, prefix, path):
        line = next(x for x in dot.splitlines() if f'"{prefix}' in x and f'class="main {path} value=' in x)
        return re.search(r'color="(#[0-9a-f]{6})"', line).group(1)

    first = colour_of(both, "e0.", "stages.0-3")
    assert first != colour_of(both, "e1.", "stages.0-3")  # twenty times the gradient: another colour on the shared scale
    from cyclelang.backends.graphviz.annotate import colour, log_pos

    v0 = readings["chain"]["stages.0-3"]
    assert first == colour(log_pos(v0, (lo2, hi2)))  # the colour is the shared scale's, not the engine's own
    same = to_dot([spec, spec], annotate=[readings, readings])
    assert colour_of(same, "e0.", "stages.0-3") == colour_of(same, "e1.", "stages.0-3")
    # a report fired at another depth or width is refused with the reason, never half-applied
    shrunk = json.loads(report.read_text("utf-8"))
    shrunk["runs"][0]["settings"].update(width=32, depth=3)
    (tmp_path / "shrunk.json").write_text(json.dumps(shrunk), "utf-8")
    r = invoke(["draw", SPEC("gas_generator"), "--annotate", str(tmp_path / "shrunk.json"), "-o", str(tmp_path / "x.dot")])
    assert r.exit_code == 1 and "E0276" in r.output and "depth 3" in r.output and "width 32" in r.output
    assert not (tmp_path / "x.dot").exists()
    r = invoke(["draw", SPEC("gpt2"), "--annotate", str(report), "-o", str(tmp_path / "x.dot")])
    assert r.exit_code == 1 and "no run of engine 'gpt2'" in r.output
    r = invoke(["draw", SPEC("gas_generator"), "--annotate", str(SPEC("gpt2")), "-o", str(tmp_path / "x.dot")])
    assert r.exit_code == 1 and "not a test-stand report" in r.output
