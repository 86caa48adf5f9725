"""The examples run, as a user would run them (a subprocess each), and say what they promise.

Step counts are cut down for CI (`--steps`); everything else is what a user runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang.cli import main

from .conftest import ROOT, need

EXAMPLES = ROOT / "examples"
INCLUDE = EXAMPLES / "include"


def run(*args, cwd=None, timeout=120) -> str:
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def result(out: str) -> dict[str, str]:
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return dict(re.findall(r"(\w+)=(\S+)", line))


@pytest.mark.slow  # a training run in a subprocess
def test_train_markov_loss_falls():
    need("torch")
    r = result(run(EXAMPLES / "train_markov.py", "--steps", "60"))
    first, last, held_out = float(r["first"]), float(r["last"]), float(r["held_out"])
    assert first > 2.3  # about log(12) at the start: nothing learned
    assert last < first - 0.3 and held_out < first - 0.3
    assert float(r["rate"]) < float(r["one_token"]) < first  # the two floors, in order


@pytest.mark.slow  # loads two transformers models in a subprocess
def test_load_transformers_outputs_match(tmp_path):
    need("transformers")
    out = run(EXAMPLES / "load_transformers.py")
    assert "gpt2:" in out and "llama:" in out and out.count("greedy generations identical") == 2
    assert float(result(out)["max_logit_diff"]) < 1e-4


@pytest.mark.slow  # saves and loads a transformers checkpoint
def test_load_transformers_from_a_checkpoint_folder(tmp_path):
    """The folder path of the example: a saved transformers checkpoint and a spec file for it."""
    torch = need("torch")
    need("transformers")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import load_transformers as example
    finally:
        sys.path.pop(0)
    example.reference("gpt2").save_pretrained(tmp_path / "ckpt")
    (tmp_path / "tiny.cycle").write_text(example.GPT2_SPEC, "utf-8")
    threads = torch.get_num_threads()
    try:
        assert example.main([str(tmp_path / "ckpt"), "--spec", str(tmp_path / "tiny.cycle")]) == 0
    finally:
        torch.set_num_threads(threads)  # the example pins one thread; leave the test process as it was


@pytest.mark.slow
def test_draw_variants(tmp_path):
    out = run(EXAMPLES / "draw_variants.py", "--out", tmp_path)
    names = ["pre_ln", "post_ln", "sandwich", "rezero", "layerscale", "deepnorm", "parallel"]
    assert [line.split()[0] for line in out.splitlines()[1:8]] == names
    for name in names:
        assert (tmp_path / f"{name}.cycle").is_file()
        assert (tmp_path / f"{name}.svg").is_file() or (tmp_path / f"{name}.dot").is_file()
    # compare mode: one figure, one legend, what `cyclec draw a b c -o cmp.svg` draws
    from cyclelang.backends.graphviz import to_dot

    specs = [cyclelang.load(tmp_path / f"{n}.cycle") for n in names]
    if (tmp_path / "variants.svg").exists():
        svg = (tmp_path / "variants.svg").read_text("utf-8")
        assert svg.count("<svg") == 1 and svg.count('class="node legend_text main"') == 1
        assert all(f">{n} · " in svg for n in names)  # each engine's numbers over it
        r = CliRunner().invoke(main, ["draw", *[str(tmp_path / f"{n}.cycle") for n in names], "-o", "-"])
        assert r.exit_code == 0 and r.output == to_dot(specs)
    else:
        assert (tmp_path / "variants.dot").read_text("utf-8") == to_dot(specs)
    assert "cyclec draw " in out and "-o " in out


# --- the include demo -----------------------------------------------------------------------


def test_include_demo_checks_clean(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("engine.cycle", "blocks.cycle"):
        res = CliRunner().invoke(main, ["check", f"examples/include/{name}"])
        assert res.exit_code == 0 and res.stderr == "", res.stderr


def test_include_demo_expands_the_templates():
    spec = cyclelang.load(INCLUDE / "engine.cycle")
    stages = [op for op in spec.engine.body if op.op == "stage"]
    assert [(s.name, s.template, s.repeat) for s in stages] == [
        ("lower", "staged", 2), ("middle", "fullflow_block", 2), ("upper", "llama_block", 2)]
    assert cyclelang.load(INCLUDE / "blocks.cycle").engine is None  # templates only


def test_include_demo_builds_and_runs():
    torch = need("torch")
    model = cyclelang.build(INCLUDE / "engine.cycle", seed=0)
    idx = torch.randint(0, 4096, (1, 8))
    _, loss = model(idx, targets=idx)
    loss.backward()
    assert torch.isfinite(loss)
