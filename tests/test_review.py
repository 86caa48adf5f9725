"""The design reviewer and the static analyses.

Each rule has a triggering case and a non-triggering case in tests/review_cases/
(`CODE_trigger.cycle`, `CODE_ok*.cycle`; a case may test several codes, named
`W103_W104_trigger.cycle`), each with its rendered diagnostics as a golden
`.out` beside it. The analyses' closed forms are checked by hand here; the
cross-checks against built torch modules live in test_review_torch.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang.cli import main
from cyclelang.codes import CODES
from cyclelang.diagnostics import render
from cyclelang.review import REVIEW_CODES, ReviewConfig, allowed_codes, analyze, apply_allows, render_text, review, strict
from cyclelang.review.report import attention_params, mlp_params

from .conftest import ROOT, SPECS, spec_id

CASES_DIR = ROOT / "tests" / "review_cases"
CASES = sorted(CASES_DIR.glob("*.cycle"))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def reviewed(path: Path) -> tuple[list, dict]:
    name = rel(path)
    text = path.read_text("utf-8")
    pp = text.split("\n", 1)[0].removeprefix("# check --pp ")  # a case of the pipeline split (W161) names its degree
    diags = apply_allows(review(cyclelang.parse(text, name), ReviewConfig(pp=int(pp) if pp.isdigit() else 1)), {name: text})
    return diags, {name: text}


def codes_in(path: Path) -> set[str]:
    return {d.code for d in reviewed(path)[0]}


@pytest.mark.parametrize("case", CASES, ids=spec_id)
def test_case_golden(case, golden, monkeypatch):
    monkeypatch.chdir(ROOT)
    diags, sources = reviewed(case)
    golden.check(case.with_suffix(".out"), render(diags, sources) if diags else "")


@pytest.mark.parametrize("code", REVIEW_CODES)
def test_every_rule_has_a_triggering_and_a_quiet_case(code):
    triggers = [c for c in CASES if c.stem.endswith("_trigger") and code in c.stem.split("_")]
    quiet = [c for c in CASES if "_ok" in c.stem and code in c.stem.split("_")]
    assert triggers and quiet, f"add tests/review_cases/{code}_trigger.cycle and {code}_ok.cycle"
    for c in triggers:
        assert code in codes_in(c), c.name
    for c in quiet:
        assert code not in codes_in(c), c.name


def test_every_review_code_is_documented():
    for code in REVIEW_CODES:
        assert code in CODES and CODES[code].explanation and CODES[code].example, code
    assert {c for c in CODES if c[0] in "WN"} == {c for c in REVIEW_CODES if c[0] in "WN"}


# --- the specs of the library: clean, or exactly the notes they should show --------------------

EXPECTED_ON_SPECS = {
    "gas_generator": {"N101"},  # the detached critic
    "throat": {"N102"},  # the bottleneck stage
    "gpt2_medium": {"N103"},  # 24 layers x 16 full heads: 96 KiB of KV cache per token
}


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_specs_review(spec, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert codes_in(spec) == EXPECTED_ON_SPECS.get(spec.stem, set())


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_spec_report_golden(spec, golden):
    rep = analyze(cyclelang.load(spec))
    golden.check(CASES_DIR / "reports" / f"{spec.stem}.txt", render_text(rep))
    json.dumps(rep)  # plain data


# --- allow comments and --strict --------------------------------------------------------------


def test_allowed_codes():
    assert allowed_codes("stage block x 12 {  # allow: W102") == {"W102"}
    assert allowed_codes("  # allow: W102, N101") == {"W102", "N101"}
    assert allowed_codes("stage block x 12 {  # W102") == set()


def test_allow_silences_warnings_but_never_errors():
    assert codes_in(CASES_DIR / "W102_allowed.cycle") == set()
    assert codes_in(CASES_DIR / "E0301_trigger.cycle") == {"E0301"}  # its line says '# allow: E0301'


def test_strict_raises_warnings_only():
    diags, _ = reviewed(CASES_DIR / "N101_trigger.cycle")
    assert {d.severity for d in strict(diags)} == {"note"}
    diags, _ = reviewed(CASES_DIR / "W102_trigger.cycle")
    assert {d.severity for d in strict(diags)} == {"error"}


# --- closed forms, by hand -----------------------------------------------------------------


def test_gpt2_parameters_and_flops():
    rep = analyze(cyclelang.load(ROOT / "specs" / "gpt2.cycle"))
    p = rep["params"]
    assert p["total"] == 124_439_808  # transformers' GPT2LMHeadModel: the tied head adds nothing
    d, L, V, n = 768, 12, 50257, 1024
    per_layer = (4 * d * d + 4 * d) + (8 * d * d + 5 * d) + 4 * d
    assert p["by_stage"][1] == {"name": "block", "path": "stages.0-11", "repeat": L, "per_instance": per_layer, "params": L * per_layer,
                                "by_role": {"valve": L * 4 * d, "mixer": L * (4 * d * d + 4 * d), "reactor": L * (8 * d * d + 5 * d)}}
    assert abs(p["mixer_share"] - 1 / 3) < 1e-3
    f = rep["flops_per_token"]
    assert f["forward"] == L * (2 * 12 * d * d + 4 * d * n) + 2 * d * V
    assert f["training"] == 3 * f["forward"]


def test_llama_parameters_and_kv_cache():
    rep = analyze(cyclelang.load(ROOT / "specs" / "llama.cycle"))
    d, L, V, hid, kv, hd = 512, 8, 32000, 1408, 2, 64
    layer = (2 * d * d + 2 * d * kv * hd) + 3 * d * hid + 2 * d
    assert rep["params"]["total"] == V * d + L * layer + d + d * V == 55_321_088
    s = rep["scaling"]
    assert s["kv_bytes_per_token"] == L * kv * hd * 2 * 2 == 4096
    assert s["exponents"]["attention_flops"] == 2 and s["exponents"]["kv_cache_bytes"] == 1
    row = next(r for r in s["rows"] if r["context"] == 2048)
    assert row["kv_cache_bytes"] == 4096 * 2048


def test_operator_closed_forms():
    a = cyclelang.parse("engine e { chamber width=64 throat causal feed tokens vocab=10 context=8\n"
                        "stage s { prechamber m { turbine attention heads=8 kv_heads=2 qk_norm } } nozzle head }").engine
    att = a.body[0].ops[0].ops[0]
    assert attention_params(att) == 64 * 64 * 2 + 2 * 64 * 16 + (64 + 2 * 16 + 64) + 2 * 8
    assert mlp_params(64, 256, "swiglu", False) == 3 * 64 * 256
    assert mlp_params(64, 256, "gelu", True) == 2 * 64 * 256 + 256 + 64


def test_moe_counts_every_expert_but_flops_only_the_routed():
    rep = analyze(cyclelang.load(ROOT / "specs" / "moe.cycle"))
    d, E, k, h = 256, 8, 2, 512
    reactor = 4 * (d * E + E * 3 * d * h)
    assert rep["params"]["by_role"]["reactor"] == reactor
    assert rep["flops_per_token"]["by_role"]["reactor"] == 4 * (2 * d * E + k * 2 * 3 * d * h)


def test_sliding_window_caps_attention_and_cache():
    s = analyze(cyclelang.load(CASES_DIR / "W106_ok.cycle"))["scaling"]
    assert s["exponents"]["attention_flops"] == 1 and s["exponents"]["kv_cache_bytes"] == 0


def test_open_throat_has_no_kv_cache():
    s = analyze(cyclelang.load(ROOT / "specs" / "post_ln.cycle"))["scaling"]
    assert not s["kv_cache"] and s["kv_bytes_per_token"] == 0


def test_reachability_follows_detach_and_overboard():
    g = analyze(cyclelang.load(ROOT / "specs" / "gas_generator.cycle"))["gradient"]
    losses = {x["group"]: x["losses"] for x in g["groups"]}
    assert losses["stages.4.probe"] == ["stages.4.probe"]  # an overboard head: only its own loss
    assert losses["stages.0-3.mix"] == ["nozzle", "stages.4.probe"]  # the probe is not detached
    assert losses["norm"] == ["nozzle"]  # downstream of the probe
    g = analyze(cyclelang.load(CASES_DIR / "N101_trigger.cycle"))["gradient"]
    losses = {x["group"]: x["losses"] for x in g["groups"]}
    assert losses["stages.0-1.mix"] == ["nozzle"] and losses["stages.2.probe"] == ["stages.2.probe"]  # a detached head
    g = analyze(cyclelang.load(CASES_DIR / "E0301_trigger.cycle"))["gradient"]
    assert g["unreached"] == ["stages.0-1.probe"] and g["unreached_params"] == 2 * (128 + 64 * 16 + 16)


def test_kv_cache_note_threshold():
    """N103 fires at 64 KiB per token from full-head attention, not below, and not for GQA's share."""
    from cyclelang.review import ReviewConfig

    gpt2 = cyclelang.load(ROOT / "specs" / "gpt2.cycle")  # 12 x 12 x 64 x 2 x 2 = 36 KiB
    assert "N103" not in {d.code for d in review(gpt2)}
    assert "N103" in {d.code for d in review(gpt2, ReviewConfig(kv_note_bytes=36 * 1024))}
    assert "N103" not in {d.code for d in review(gpt2, ReviewConfig(kv_note_bytes=36 * 1024 + 1))}
    llama = cyclelang.load(ROOT / "specs" / "llama.cycle")  # kv_heads=2 of 8: grouped, never noted
    assert "N103" not in {d.code for d in review(llama, ReviewConfig(kv_note_bytes=1))}


def test_template_file_has_no_report():
    spec = cyclelang.parse("stage s(h) { prechamber m { turbine attention heads=h } }")
    assert review(spec) == [] and analyze(spec) is None


# --- the command line ------------------------------------------------------------------------


def test_check_cli(monkeypatch):
    monkeypatch.chdir(ROOT)
    r = CliRunner()
    warn = "tests/review_cases/W102_trigger.cycle"
    res = r.invoke(main, ["check", warn])
    assert res.exit_code == 0 and "warning[W102]" in res.stderr and res.stdout == ""
    res = r.invoke(main, ["check", "--strict", warn])
    assert res.exit_code == 1 and "error[W102]" in res.stderr
    assert r.invoke(main, ["check", "--strict", "tests/review_cases/W102_allowed.cycle"]).exit_code == 0
    assert r.invoke(main, ["check", "--strict", "specs/gas_generator.cycle"]).exit_code == 0  # notes never fail
    assert r.invoke(main, ["check", "tests/review_cases/E0301_trigger.cycle"]).exit_code == 1
    res = r.invoke(main, ["check", "--report", "specs/gpt2.cycle"])
    assert res.exit_code == 0 and res.stdout.startswith("engine gpt2\n") and "124,439,808" in res.stdout
    res = r.invoke(main, ["check", "--json", "specs/gpt2.cycle", "tests/review_cases/W102_trigger.cycle"])
    data = json.loads(res.stdout)
    assert [d["file"] for d in data] == ["specs/gpt2.cycle", warn]
    assert data[0]["report"]["params"]["total"] == 124_439_808 and data[1]["diagnostics"][0]["code"] == "W102"


def test_check_separates_files_with_a_blank_line(golden, monkeypatch):
    """Several files: each file's diagnostics form one block, a blank line between blocks
    (and none before the first, after the last, or for a clean file)."""
    monkeypatch.chdir(ROOT)
    files = ["specs/gas_generator.cycle", "specs/gpt2.cycle", "tests/review_cases/W103_W104_trigger.cycle",
             "tests/bad/e0002_bad_char.cycle", "tests/review_cases/E0301_trigger.cycle"]
    res = CliRunner().invoke(main, ["check", *files])
    assert res.exit_code == 1 and res.stdout == ""
    assert not res.stderr.startswith("\n") and "\n\n\n" not in res.stderr
    assert res.stderr.count("\n\nspecs/") + res.stderr.count("\n\ntests/") == 3 + 1  # 3 between files, 1 between W103 and W104
    golden.check(CASES_DIR / "check_several_files.txt", res.stderr + f"[exit {res.exit_code}]\n")


def test_check_json_on_a_broken_spec(tmp_path):
    bad = tmp_path / "bad.cycle"
    bad.write_text("engine e { chamber width=8 }\n")
    res = CliRunner().invoke(main, ["check", "--json", str(bad)])
    assert res.exit_code == 1 and json.loads(res.stdout)[0]["report"] is None


def test_explain():
    r = CliRunner()
    res = r.invoke(main, ["explain", "W101"])
    assert res.exit_code == 0 and res.stdout.startswith("W101: deep Post-LN without warmup\n") and "example:" in res.stdout
    assert r.invoke(main, ["explain", "e0101"]).exit_code == 0
    res = r.invoke(main, ["explain", "W1O1"])
    assert res.exit_code == 2 and "did you mean 'W101'?" in res.stderr


def test_review_never_imports_torch():
    probe = ("import sys, cyclelang\nfrom cyclelang.review import review, analyze\n"
             "s = cyclelang.load('specs/gpt2.cycle'); review(s); analyze(s)\n"
             "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "NO-TORCH", r.stderr
