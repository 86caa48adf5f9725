"""`cyclec diff`: the four reviewed pairs (golden text and JSON), with the facts behind them
checked against formulas written here, and the exit status and drawing hook."""

from __future__ import annotations

import re

import json
import os
import subprocess
import sys

import pytest

import cyclelang
from cyclelang.review.diff import diff, marks, render_text

from .conftest import ROOT

PAIRS = {
    "pre_ln_vs_post_ln": ("specs/gpt2.cycle", "tests/diff_cases/gpt2_post_ln.cycle"),
    "gpt2_vs_gpt2_medium": ("specs/gpt2.cycle", "specs/gpt2_medium.cycle"),
    "llama_vs_mqa": ("specs/llama.cycle", "tests/diff_cases/llama_mqa.cycle"),
    "identical": ("specs/gpt2.cycle", "specs/gpt2.cycle"),
}
GOLDENS = ROOT / "tests" / "goldens" / "diff"


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "cyclelang.cli", "diff", *args], capture_output=True, text=True, cwd=ROOT, env=env)


# two cyclec processes a pair (about a second): one pair in the fast tier, the others in the full run
@pytest.mark.parametrize("name", [n if n == "llama_vs_mqa" else pytest.param(n, marks=pytest.mark.slow) for n in PAIRS])
def test_golden(name, golden):
    a, b = PAIRS[name]
    r = _cli(a, b)
    assert r.returncode == (0 if name == "identical" else 1), r.stderr
    golden.check(GOLDENS / f"{name}.txt", r.stdout)
    r = _cli(a, b, "--json")
    assert r.returncode == (0 if name == "identical" else 1)
    golden.check(GOLDENS / f"{name}.json", r.stdout)
    assert json.loads(r.stdout)["equal"] is (name == "identical")


def _diff(name):
    a, b = PAIRS[name]
    return diff(cyclelang.load(ROOT / a), cyclelang.load(ROOT / b))


def test_norm_moved_to_the_main_line():
    d = _diff("pre_ln_vs_post_ln")
    moved = d["parts"]["moved"]
    assert [(m["a"], m["b"]) for m in moved] == [("stages.0-11.mix.norm", "stages.0-11.norm1"), ("stages.0-11.burn.norm", "stages.0-11.norm2")]
    assert all(m["placement"] == {"a": "Pre-LN", "b": "Post-LN"} for m in moved)
    assert moved[0]["words"].startswith("norm moved from the branch (mix) to the main line: Pre-LN → Post-LN")
    assert not d["parts"]["added"] and not d["parts"]["removed"] and not d["parts"]["changed"]
    assert d["total"]["params"]["delta"] == 0  # a norm is a norm wherever it sits
    assert [s["setting"] for s in d["settings"]] == ["startup.warmup"]


def test_gpt2_medium_is_one_stage_repeated_twice_as_often():
    d = _diff("gpt2_vs_gpt2_medium")
    (block,) = [s for s in d["stages"] if s["name"] == "block"]
    assert (block["a"], block["b"]) == ("stages.0-11", "stages.0-23") and block["changes"] == ["repeated x12 → x24"]
    # GPT-2's parameter count, written out: 12 d^2 per block (+ biases and norms), embeddings tied
    def gpt2(d_model, layers, vocab=50257, ctx=1024):
        block = 12 * d_model * d_model + 13 * d_model
        return vocab * d_model + ctx * d_model + layers * block + 2 * d_model
    assert d["total"]["params"]["a"] == gpt2(768, 12) and d["total"]["params"]["b"] == gpt2(1024, 24)
    assert d["total"]["params"]["delta"] == gpt2(1024, 24) - gpt2(768, 12)
    # KV cache per token: layers x 2 (K and V) x d x 2 bytes
    assert d["total"]["kv_bytes"]["a"] == 12 * 2 * 768 * 2 and d["total"]["kv_bytes"]["b"] == 24 * 2 * 1024 * 2
    attn = next(c for c in d["parts"]["changed"] if c["b"].endswith("mix.attn"))
    assert {f["field"]: (f["a"], f["b"]) for f in attn["fields"]}["heads"] == (12, 16)


def test_mqa_shares_one_kv_head():
    d = _diff("llama_vs_mqa")
    (attn,) = d["parts"]["changed"]
    assert attn["fields"] == [{"field": "kv_heads", "a": 2, "b": 1}] and attn["words"].startswith("GQA (4 query heads per KV head) → MQA")
    layers, width, head_dim = 8, 512, 64
    assert d["total"]["params"]["delta"] == -layers * 2 * width * head_dim  # one fewer K and V projection head per layer
    assert d["total"]["kv_bytes"]["a"] == layers * 2 * 2 * head_dim * 2 and d["total"]["kv_bytes"]["b"] == layers * 2 * 1 * head_dim * 2
    assert d["total"]["flops"]["delta"] == -2 * layers * 2 * width * head_dim


def test_identical_and_renamed():
    assert _diff("identical")["equal"]
    text = (ROOT / "specs" / "gpt2.cycle").read_text("utf-8")
    a = cyclelang.parse(text)
    b = cyclelang.parse(text.replace("engine gpt2", "engine gpt2b") + "\n# a comment changes nothing\n")
    d = diff(a, b)
    assert not d["equal"] and d["settings"] == [{"setting": "name", "ml": "engine name", "rocket": "", "a": "gpt2", "b": "gpt2b"}]
    assert diff(a, cyclelang.parse("# reformatted\n" + text.replace("  ", "    ")))["equal"]


def test_added_and_removed_stage():
    text = (ROOT / "specs" / "gpt2.cycle").read_text("utf-8")
    extra = text.replace("  norm layernorm  # the one valve", "  stage tap { prechamber probe { norm layernorm  turbine mlp } }\n  norm layernorm  # the one valve")
    assert extra != text
    d = diff(cyclelang.parse(text), cyclelang.parse(extra))
    (tap,) = [s for s in d["stages"] if s["name"] == "tap"]
    assert tap["status"] == "added" and tap["b"] == "stages.12"
    assert {e["path"] for e in d["parts"]["added"]} == {"stages.12.probe.norm", "stages.12.probe.mlp", "stages.12.probe"}
    assert d["total"]["params"]["delta"] == tap["numbers"]["params"]["delta"] > 0
    back = diff(cyclelang.parse(extra), cyclelang.parse(text))
    assert [s["status"] for s in back["stages"] if s["name"] == "tap"] == ["removed"]
    assert "- stage tap (stages.12)" in render_text(back)


def test_draw_highlights_b(tmp_path):
    out = tmp_path / "d.dot"
    r = _cli(*PAIRS["pre_ln_vs_post_ln"], "--draw", str(out))
    assert r.returncode == 1, r.stderr
    dot = out.read_text("utf-8")
    b = cyclelang.load(ROOT / PAIRS["pre_ln_vs_post_ln"][1])
    lines = marks(_diff("pre_ln_vs_post_ln"), b)
    assert lines == {16: "moved", 21: "moved"}  # the two series valves of the Post-LN spec
    highlighted = [l for l in dot.splitlines() if 'class="diff-moved"' in l]
    assert len(highlighted) == 2 and all(re.search(r'tooltip="[^"]* line (16|21)"', l) for l in highlighted)
    assert all('color="#9467bd"' in l and 'penwidth="4"' in l for l in highlighted)
    assert "against A: green added, orange changed, purple moved" in dot


@pytest.mark.slow  # two cyclec processes
def test_bad_spec_is_exit_2(tmp_path):
    bad = tmp_path / "bad.cycle"
    bad.write_text("engine e {", "utf-8")
    r = _cli("specs/gpt2.cycle", str(bad))
    assert r.returncode == 2 and "error[E0003]" in r.stderr and "Traceback" not in r.stderr
    r = _cli("specs/gpt2.cycle", str(tmp_path / "missing.cycle"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_a_merge_that_returns_another_way():
    text = (ROOT / "specs" / "gpt2.cycle").read_text("utf-8")
    b = text.replace("merge cooling", "merge rezero", 1)
    d = diff(cyclelang.parse(text), cyclelang.parse(b))
    merges = [c for c in d["parts"]["changed"] if any(f["field"] == "merge" for f in c["fields"])]
    assert [(c["a"], c["b"]) for c in merges] == [("stages.0-11.mix", "stages.0-11.mix.scale")]
    assert merges[0]["fields"] == [{"field": "merge", "a": "cooling", "b": "rezero"}] and "ReZero" in merges[0]["words"]
    assert not d["parts"]["added"] and not d["parts"]["removed"]
    assert d["total"]["params"]["delta"] == 12  # one learned scalar per instance
