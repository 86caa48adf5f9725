"""μP's coordinate check with no set-up, and the LR-transfer sweep (issue 17).

Thresholds come from measured runs (widths 32, 64, 128; 5 steps at lr 1e-2; 8 x 16
tokens; seed 0): under the standard parametrisation the logits' fitted exponent at
step 5 measured +0.72 (branch outputs +1.4 to +1.8); under μP -0.02 (every layer type
between -0.43 and +0.21, no growth flagged).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang.stand.coord import coord_check, fit_exponent, lr_sweep  # noqa: E402
from cyclelang.stand.result import CoordCheck  # noqa: E402

from .test_stand import invoke, one_thread  # noqa: E402,F401

WIDTHS = [32, 64, 128]


def gpt(param=""):
    return f"""engine g {{
  chamber width=64
  throat causal
  feed tokens vocab=64 context=32 position=learned
  stage block x 2 {{
    prechamber mix {{ norm layernorm turbine attention heads=4 merge cooling }}
    prechamber burn {{ norm layernorm turbine mlp ratio=4 merge cooling }}
  }}
  norm layernorm
  nozzle head tied
  startup {{ warmup 100 schedule constant lr=1e-2 {param} }}
}}
"""


def load(tmp_path, text, name):
    p = tmp_path / name
    p.write_text(text)
    return cyclelang.load(str(p)), str(p)


def test_fit_exponent():
    assert math.isclose(fit_exponent([32, 64, 128], [1.0, 2.0, 4.0]), 1.0)
    assert math.isclose(fit_exponent([32, 64, 128], [3.0, 3.0, 3.0]), 0.0, abs_tol=1e-12)
    assert math.isclose(fit_exponent([10, 1000], [5.0, 0.5]), -0.5)
    assert math.isnan(fit_exponent([32, 64], [1.0, 0.0]))


def test_sp_logits_grow_with_width_and_mup_stays_flat(tmp_path):
    sp, _ = load(tmp_path, gpt(), "sp.cycle")
    mu, _ = load(tmp_path, gpt("param mup base_width=32"), "mup.cycle")
    kw = dict(widths=WIDTHS, steps=5, seq=16, batch=8)
    a = coord_check(sp, file="sp.cycle", **kw)
    b = coord_check(mu, file="mup.cycle", **kw)
    la = {l.name: l for l in a.layers}
    lb = {l.name: l for l in b.layers}
    assert set(la) == {"feed", "stages.0-1.mix", "stages.0-1.burn", "stages.0-1.mix.attn logits", "logits"} == set(lb)
    assert la["logits"].exponent[-1] > 0.45 and la["logits"].flag == "grows"
    assert abs(lb["logits"].exponent[-1]) < 0.15 and lb["logits"].flag is None
    assert not any(l.flag for l in b.layers)  # nothing grows under μP
    assert la["stages.0-1.burn"].exponent[-1] > 1.0  # SP's fixed std: the MLP's output grows like the width
    assert abs(la["feed"].exponent[-1]) < 0.15  # the embedding's coordinates do not depend on width in either
    # the start sequence's warmup is not used: a fixed lr, so the run moves at all in 5 steps
    assert a.lr == 1e-2 and a.loss[-1][0] < a.loss[0][0] - 0.3
    # seeded: the same numbers again
    assert coord_check(sp, file="sp.cycle", **kw) == a


@pytest.mark.slow  # fires through the CLI, plots, and starts a process
def test_cli_json_is_torch_free_and_the_plot_is_written(tmp_path):
    """The command docs/test_stand.md shows (SP beside μP, --depth, --lr, a plot, exit 1 for SP's
    growth), at two small widths: the doc's own run (4 widths, full vocabularies) is not repeated."""
    _, path = load(tmp_path, gpt(), "sp.cycle")
    _, mup = load(tmp_path, gpt("param mup base_width=32"), "mup.cycle")
    out, png = tmp_path / "cc.json", tmp_path / "cc.png"
    r = invoke(["fire", path, mup, "--coord-check", "--widths", "32,64", "--depth", "1", "--steps", "3", "--lr", "3e-2",
                "--seq", "8", "--batch", "2", "--json", str(out), "--plot", str(png)])
    assert r.exit_code == 1, r.output  # 1: SP's logits grow with width (a finding)
    assert "coordinate check of g" in r.output and "logits" in r.output
    assert png.read_bytes().startswith(b"\x89PNG")
    code = ("import json, sys; from cyclelang.stand.result import CoordCheck; "
            f"[CoordCheck.model_validate(x) for x in json.load(open({str(out)!r}))]; "
            "print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
    sp, mu = [CoordCheck.model_validate(x) for x in json.loads(out.read_text())]
    assert sp.widths == mu.widths == [32, 64] and len(sp.layers[0].size) == 3 and len(sp.layers[0].size[0]) == 2  # [step][width]
    assert sp.lr == mu.lr == 3e-2 and {l.name for l in sp.layers} >= {"stages.0.mix", "logits"}  # --depth 1: one block
    assert any(l.flag for l in sp.layers) and not any(l.flag for l in mu.layers)
    bad = invoke(["fire", path, "--coord-check", "--widths", "32", "--steps", "2"])
    assert bad.exit_code == 1 and "two --widths" in bad.output
    bad = invoke(["fire", path, "--coord-check", "--width", "32"])
    assert bad.exit_code == 2 and "--width does not apply" in bad.output


@pytest.mark.slow
def test_lr_sweep_compares_both_parametrisations(tmp_path):
    sp, path = load(tmp_path, gpt(), "sp.cycle")
    s = lr_sweep(sp, file="sp.cycle", widths=[32, 64], lrs=[1e-3, 1e-2, 10.0], steps=6, seq=8, batch=4)
    assert [sw.param for sw in s.sweeps] == ["standard", "mup (base width 32)"]
    for sw in s.sweeps:
        assert len(sw.runs) == 6
        big = [r for r in sw.runs if r.lr == 10.0]
        assert all(r.final_loss is None and r.flameout_step is not None for r in big)  # lr 10 flames out
        assert set(sw.best) == {32, 64} and all(v in (1e-3, 1e-2) for v in sw.best.values())
    r = invoke(["fire", path, "--lr-sweep", "--widths", "32", "--lrs", "1e-3,1e-2", "--steps", "3", "--seq", "8", "--batch", "2",
                "--plot", str(tmp_path / "s.png")])
    assert r.exit_code == 0, r.output
    assert "best lr per width" in r.output and (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")
