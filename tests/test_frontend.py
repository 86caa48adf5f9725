"""The language core: grammar, resolution to the IR, diagnostics, goldens."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang import ir
from cyclelang.cli import main
from cyclelang.codes import CODES
from cyclelang.diagnostics import CycleError
from cyclelang.syntax import grammar

from .conftest import ROOT, SPECS, rotated

BAD = sorted((ROOT / "tests" / "bad").glob("*.cycle"))
GOLDENS = ROOT / "tests" / "goldens"


# --- the grammar -----------------------------------------------------------------------


def test_grammar_is_conflict_free_under_strict_mode():
    # strict=True refuses shift/reduce conflicts and terminal collisions
    grammar.build_from_grammar(strict=True)


def test_parse_tables_match_the_grammar():
    from cyclelang.syntax import _tables

    # LALR state numbers depend on set order, so the text differs between builds;
    # what must hold is that the tables come from this grammar (and parse alike, below).
    assert _tables.GRAMMAR_SHA256 == grammar.grammar_hash(), "run: python -m cyclelang.syntax.grammar"


@pytest.mark.parametrize("path", rotated(SPECS, 3, 0), ids=lambda p: p.stem)  # a third in the fast tier
def test_cached_tables_parse_like_the_grammar(path):
    fresh = grammar.build_from_grammar()
    text = path.read_text()
    assert fresh.parse(text) == grammar.parser().parse(text)


# --- the spec library: IR goldens ---------------------------------------------------------


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_ir_golden(path, golden):
    spec = cyclelang.load(path)
    text = json.dumps(spec.model_dump(mode="json"), indent=2) + "\n"
    golden.check(GOLDENS / "specs" / f"{path.stem}.ir.json", text)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_ir_round_trips_through_json(path):
    spec = cyclelang.load(path)
    again = ir.Spec.model_validate_json(spec.model_dump_json())
    assert again.model_dump() == spec.model_dump()


def test_ir_is_frozen_and_strict():
    spec = cyclelang.load(ROOT / "specs" / "gpt2.cycle")
    with pytest.raises(Exception):
        spec.engine.width = 3  # type: ignore[misc]
    bad = spec.model_dump(mode="json")
    bad["engine"]["surprise"] = 1
    with pytest.raises(Exception):
        ir.Spec.model_validate(bad)


def test_spans_are_kept_but_not_dumped():
    spec = cyclelang.load(ROOT / "specs" / "gpt2.cycle")
    stage = spec.engine.body[0]
    assert stage.span is not None and stage.span.line > 1
    assert "span" not in json.dumps(spec.model_dump(mode="json"))


def test_schema_is_json_schema_of_the_ir():
    schema = ir.json_schema()
    assert schema["title"] == "Spec"
    assert "Attention" in schema["$defs"] and "span" not in json.dumps(schema["$defs"]["Attention"])


# --- resolution ---------------------------------------------------------------------------

BASE = """
engine e {{
  chamber width=64
  throat {throat}
  feed tokens vocab=100 context=16
  {body}
  nozzle head
}}
"""


def resolve(body: str, throat: str = "causal", prefix: str = "") -> ir.Engine:
    return cyclelang.parse(prefix + BASE.format(body=body, throat=throat)).engine


def test_defaults_are_explicit_and_masks_follow_the_throat():
    e = resolve("stage s { prechamber m { turbine attention heads=4 } }", throat="open")
    att = e.body[0].ops[0].ops[0]
    assert (att.mask, att.kv_heads, att.head_dim, att.rotary_dims, att.bias) == ("open", 4, 16, 0, True)
    assert isinstance(e.body[0].ops[0].merge, ir.PlainMerge)
    assert e.startup.betas == (0.9, 0.999) and e.startup.init.std == 0.02


def test_let_arithmetic_and_builtins():
    e = resolve("stage s { prechamber m { turbine mlp hidden=width*3/2 } prechamber a { turbine attention heads=d//16 rotary=0.5 } }", prefix="let d = 8 * 8\n")
    assert e.body[0].ops[0].ops[0].hidden == 96
    att = e.body[0].ops[1].ops[0]
    assert att.heads == 4 and att.rotary_dims == 8


def test_templates_expand_with_named_positional_and_default_arguments():
    prefix = "stage blk(h, r=2) { prechamber m { turbine attention heads=h } prechamber f { turbine mlp ratio=r act=act } }\n"
    e = resolve("stage lower = blk(4, act=silu) x 2\n  stage upper = blk(h=8, r=4, act=relu)", prefix=prefix.replace("r=2)", "r=2, act=gelu)"))
    lower, upper = e.body
    assert (lower.name, lower.template, lower.repeat) == ("lower", "blk", 2)
    assert lower.ops[0].ops[0].heads == 4 and lower.ops[1].ops[0].hidden == 128 and lower.ops[1].ops[0].act == "silu"
    assert upper.ops[0].ops[0].heads == 8 and upper.ops[1].ops[0].hidden == 256 and upper.ops[1].ops[0].act == "relu"


def test_cooling_counts_every_merge_into_the_main_line():
    spec = cyclelang.load(ROOT / "specs" / "gpt2.cycle")
    merge = spec.engine.body[0].ops[0].merge
    assert merge.merges == 24 and merge.std == pytest.approx(0.02 / 24**0.5)


def test_deepnorm_alpha_beta_follow_the_depth():
    e = resolve("stage s x 6 { prechamber m { turbine mlp merge deepnorm } norm layernorm }")
    m = e.body[0].ops[0].merge
    assert m.layers == 6 and m.alpha == pytest.approx(12**0.25) and m.beta == pytest.approx(48**-0.25)


def test_errors_are_all_collected_and_sorted():
    with pytest.raises(CycleError) as info:
        resolve("stage s { prechamber m { turbine mlp hiden=3 } prechamber n { turbine attention heads=5 } }\n  stage t x zz { turbine linaer }")
    codes = [(d.code, d.span.line) for d in info.value.diagnostics]
    assert codes == sorted(codes, key=lambda c: c[1])
    assert {c for c, _ in codes} == {"E0201", "E0207", "E0101", "E0204"}


def test_include_brings_templates_and_lets(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "blocks.cycle").write_text("let heads = 4\nstage blk { prechamber m { turbine attention heads=heads } }\n")
    (tmp_path / "main.cycle").write_text('include "lib/blocks.cycle"\n' + BASE.format(body="stage blk x 2", throat="causal"))
    e = cyclelang.load(tmp_path / "main.cycle").engine
    assert e.body[0].repeat == 2 and e.body[0].ops[0].ops[0].heads == 4


def test_include_cannot_escape_through_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.cycle").write_text("let a = 1\n")
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "link.cycle").symlink_to(outside / "secret.cycle")
    (spec_dir / "main.cycle").write_text('include "link.cycle"\n')
    with pytest.raises(CycleError) as info:
        cyclelang.load(spec_dir / "main.cycle")
    assert info.value.diagnostics[0].code == "E0107"
    # ... unless the user allows that directory
    assert cyclelang.load(spec_dir / "main.cycle", include_path=(str(outside),)).engine is None


def test_an_included_engine_is_refused(tmp_path):
    (tmp_path / "other.cycle").write_text(BASE.format(body="", throat="causal"))
    (tmp_path / "main.cycle").write_text('include "other.cycle"\n')
    with pytest.raises(CycleError) as info:
        cyclelang.load(tmp_path / "main.cycle")
    assert info.value.diagnostics[0].code == "E0108"


# --- bad inputs: one clear diagnostic each, golden rendering, exit 1 ----------------------


def test_there_are_enough_bad_inputs():
    assert len(BAD) >= 25


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_input_gives_one_diagnostic(path, golden, monkeypatch):
    monkeypatch.chdir(ROOT)
    rel = path.relative_to(ROOT).as_posix()
    result = CliRunner().invoke(main, ["check", rel])
    assert result.exit_code == 1, result.output
    stderr = result.stderr
    assert "Traceback" not in stderr
    heads = re.findall(r"^(\S+):(\d+):(\d+): (error|warning)\[(E\d{4})\]", stderr, re.M)
    assert len(heads) == 1, stderr
    expected_code = path.stem.split("_")[0].upper()
    assert heads[0][4] == expected_code
    golden.check(path.with_suffix(".err"), stderr)


def test_every_code_used_is_documented():
    used = set()
    for f in (ROOT / "cyclelang").rglob("*.py"):
        used |= set(re.findall(r'"([EWN]\d{4})"', f.read_text()))
    assert used <= set(CODES), used - set(CODES)


def test_diagnostics_doc_is_generated_from_the_registry():
    from cyclelang.codes import markdown

    assert (ROOT / "docs" / "diagnostics.md").read_text() == markdown(), "run: cyclec explain --markdown > docs/diagnostics.md"
