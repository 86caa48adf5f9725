"""The wording of diagnostics where it used to mislead: a template's typo reported once per
use, and a missing '}' blamed on the statement after it ("belongs inside a stage", said of a
statement inside a stage) instead of on the block left open."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang.cli import main
from cyclelang.diagnostics import CycleError

# --- a template's typo: once, at the template's line, naming the uses -----------------------

TEMPLATE_TYPOS = """\
stage block(heads) {
  prechamber mix  { norm rmsnrom  turbine attention haeds=heads rotary }
  prechamber burn { norm rmsnorm  turbine mlp raito=4 act=swiglu }
}

engine t {
  chamber width=64
  feed tokens vocab=100 context=32 position=none
  stage a = block(heads=4) x 2
  stage b = block(heads=8)
  stage c = block(4)
  norm rmsnorm
  nozzle head
}
"""


def _errors(text: str, name: str = "typo.cycle") -> list:
    with pytest.raises(CycleError) as e:
        cyclelang.parse(text, name)
    return e.value.diagnostics


def test_template_typo_is_reported_once_naming_its_uses(tmp_path, monkeypatch):
    diags = _errors(TEMPLATE_TYPOS)
    assert [(d.code, d.span.line) for d in diags] == [("E0204", 2), ("E0201", 2), ("E0201", 3)]
    for d in diags:
        assert d.notes == ("in template `block`, used at typo.cycle:9, typo.cycle:10 and typo.cycle:11",), d.notes
    # and the command line counts three problems, not nine
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo.cycle").write_text(TEMPLATE_TYPOS)
    r = CliRunner().invoke(main, ["check", "typo.cycle"])
    assert r.exit_code == 1
    assert "cyclec: 3 problems in 1 file" in r.stderr
    assert r.stderr.count("unknown option 'haeds'") == 1
    assert "= note: in template `block`, used at typo.cycle:9, typo.cycle:10 and typo.cycle:11" in r.stderr


def test_template_problem_that_differs_by_use_names_the_use_it_came_from():
    # heads=3 does not divide the width, heads=4 does: one error, naming the use that broke it
    text = TEMPLATE_TYPOS.replace("rmsnrom", "rmsnorm").replace("haeds", "heads").replace("raito", "ratio").replace("block(4)", "block(3)")
    diags = _errors(text)
    assert len(diags) == 1, [d.message for d in diags]
    assert diags[0].span.line == 2 and diags[0].notes == ("in template `block`, used at typo.cycle:11",)


def test_a_template_used_once_still_says_where():
    text = TEMPLATE_TYPOS.replace("  stage b = block(heads=8)\n  stage c = block(4)\n", "")
    diags = _errors(text)
    assert len(diags) == 3 and all(d.notes == ("in template `block`, used at typo.cycle:9",) for d in diags)


def test_a_typo_in_a_template_used_through_another_names_the_whole_chain():
    text = """\
stage inner(h) { prechamber p { turbine mlp raito=4 } }
stage outer(h) { stage i = inner(h=h) }
engine t {
  chamber width=64
  feed tokens vocab=100 context=32
  stage g1 = outer(h=1)
  stage g2 = outer(h=2)
  nozzle head
}
"""
    diags = _errors(text, "t.cycle")
    assert len(diags) == 1
    assert diags[0].notes == ("in template `inner`, used at t.cycle:2 (in `outer`, used at t.cycle:6) and t.cycle:2 (in `outer`, used at t.cycle:7)",)


def test_a_problem_at_the_use_site_is_not_folded():
    # arguments are the use's own: each wrong one is reported where it is written
    text = TEMPLATE_TYPOS.replace("rmsnrom", "rmsnorm").replace("haeds", "heads").replace("raito", "ratio")
    text = text.replace("block(heads=4)", "block(haeds=4)").replace("block(heads=8)", "block(haeds=8)")
    diags = _errors(text)
    # each use: no parameter 'haeds', and then no value for 'heads'
    assert [(d.code, d.span.line) for d in diags] == [("E0104", 9), ("E0104", 9), ("E0104", 10), ("E0104", 10)]
    assert all(not d.notes for d in diags)


# --- a missing '}': which block is left open ----------------------------------------------

SPEC = """\
engine t {
  chamber width=64
  feed tokens vocab=100 context=32
  stage block x 2 {
    prechamber mix {
      norm layernorm
      turbine attention heads=4
    }
    prechamber burn {
      norm layernorm
      turbine mlp
    }
    fullflow par {
      norm layernorm
      prechamber a { turbine mlp }
      prechamber b { turbine mlp }
    }
  }
  norm layernorm
  nozzle head
}
"""


def _without_line(n: int) -> str:
    lines = SPEC.split("\n")
    assert lines[n - 1].strip() == "}", lines[n - 1]
    del lines[n - 1]
    return "\n".join(lines)


def test_the_spec_without_a_missing_brace_is_fine():
    cyclelang.parse(SPEC, "t.cycle")


@pytest.mark.parametrize(("line", "block", "where"), [
    (8, "prechamber 'mix'", "5:20"),
    (12, "prechamber 'burn'", "9:21"),
    (17, "fullflow 'par'", "13:18"),
    (18, "stage 'block'", "4:19"),
    (21, "engine 't'", "1:10"),
], ids=["prechamber", "prechamber-before-fullflow", "fullflow", "stage", "engine"])
def test_missing_brace_names_the_block_left_open(line, block, where):
    (d,) = _errors(_without_line(line), "t.cycle")
    said = f"{d.span}: {d.message} | {d.help}"
    assert block in said and f"t.cycle:{where}" in said, said
    if d.code == "E0005":  # the statement after the gap: it is inside the open block, and says so
        assert re.search(r"cannot appear inside (prechamber|stage|fullflow) '", d.message), d.message


def test_a_statement_in_the_wrong_block_is_not_blamed_on_a_brace():
    # 'merge' belongs in a prechamber, and no block left open takes it: no brace is missing
    text = SPEC.replace("      turbine mlp\n    }\n    fullflow", "      turbine mlp\n    }\n    merge cooling\n    fullflow")
    (d,) = _errors(text, "t.cycle")
    assert d.message == "'merge' cannot appear inside stage 'block'"
    assert "missing" not in (d.help or "") and "inside a prechamber" in d.help


def test_a_one_line_prechamber_missing_its_brace():
    text = SPEC.replace("prechamber a { turbine mlp }", "prechamber a { turbine mlp")
    (d,) = _errors(text, "t.cycle")
    assert "prechamber 'a'" in f"{d.message} {d.help}" and "t.cycle:15:20" in d.help, (d.message, d.help)
