"""`cyclec fmt`, the CLI's contract (exit codes, streams), and start-up hygiene."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang.cli import main
from cyclelang.syntax.fmt import format_text
from cyclelang.syntax.parser import parse_module

from .conftest import ROOT, SPECS

MESSY = """# a header comment
let   d=4*16    # trailing on a let
stage blk( h ,r=2 ){prechamber m detach{norm layernorm turbine attention heads=h} # after a one-line block
  # inside, before the close
}


engine e {   # on the engine line
  chamber  width = d
  feed tokens vocab=100 context=16
  # before a stage
  stage blk(4) x 2
  stage top { fullflow par { norm rmsnorm prechamber a { turbine mlp ratio=8/4 act=silu merge scale=0.5 } prechamber b { turbine pool size=2 } } }
  nozzle head tied
  startup { warmup 10 betas 0.9 0.95 }
}
# the last word
"""


def _ir(text: str) -> dict:
    return cyclelang.parse(text).model_dump()


@pytest.mark.parametrize("text", [MESSY, *[p.read_text() for p in SPECS]], ids=["messy", *[p.stem for p in SPECS]])
def test_fmt_is_stable_meaning_preserving_and_keeps_comments(text):
    once = format_text(text)
    assert format_text(once) == once
    assert _ir(once) == _ir(text)
    assert sorted(c.text for c in parse_module(once).comments) == sorted(c.text for c in parse_module(text).comments)


def test_fmt_output_shape():
    out = format_text(MESSY)
    # a trailing comment stays on the line of the statement that starts on its line (the block's
    # header, where a diagnostic points, not the `}` its expansion ends with); runs are aligned
    assert "let d = 4 * 16       # trailing on a let\nstage blk(h, r=2) {  # after a one-line block\n" in out
    assert "  stage blk(4) x 2\n" in out
    assert "\n\n\n" not in out
    assert "      prechamber a {\n        turbine mlp ratio=8/4 act=silu\n        merge scale=0.5\n      }" in out
    assert out.endswith("}\n# the last word\n")


def test_specs_are_formatted():
    result = CliRunner().invoke(main, ["fmt", "--check", *map(str, SPECS)])
    assert result.exit_code == 0, result.stderr


def test_fmt_check_and_write(tmp_path):
    f = tmp_path / "m.cycle"
    f.write_text(MESSY)
    r = CliRunner().invoke(main, ["fmt", "--check", str(f)])
    assert r.exit_code == 1 and "would reformat" in r.stderr
    assert f.read_text() == MESSY  # --check changes nothing
    r = CliRunner().invoke(main, ["fmt", "--write", str(f)])
    assert r.exit_code == 0
    assert f.read_text() == format_text(MESSY)
    assert [p.name for p in tmp_path.iterdir()] == ["m.cycle"]  # no temporary left behind


def test_fmt_write_leaves_a_broken_file_alone(tmp_path):
    f = tmp_path / "broken.cycle"
    f.write_text("engine e {\n  chamber width=\n")
    r = CliRunner().invoke(main, ["fmt", "--write", str(f)])
    assert r.exit_code == 1
    assert f.read_text() == "engine e {\n  chamber width=\n"


def test_check_exit_codes(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["check", *map(str, SPECS)]).exit_code == 0
    assert runner.invoke(main, ["check"]).exit_code == 2  # usage: no file
    assert runner.invoke(main, ["check", "--no-such-flag", str(SPECS[0])]).exit_code == 2
    missing = runner.invoke(main, ["check", str(tmp_path / "nope.cycle")])
    assert missing.exit_code == 1 and "E0105" in missing.stderr


def test_internal_errors_exit_123(monkeypatch):
    import cyclelang.cli.check as check_module

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(check_module, "load_spec", boom)
    r = CliRunner().invoke(main, ["check", str(SPECS[0])])
    assert r.exit_code == 123 and "internal error" in r.stderr


def test_ir_and_schema_go_to_stdout(tmp_path):
    r = CliRunner().invoke(main, ["ir", str(ROOT / "specs" / "gpt2.cycle")])
    assert r.exit_code == 0 and json.loads(r.stdout)["engine"]["name"] == "gpt2" and r.stderr == ""
    out = tmp_path / "ir.json"
    r = CliRunner().invoke(main, ["ir", str(ROOT / "specs" / "gpt2.cycle"), "-o", str(out)])
    assert r.exit_code == 0 and r.stdout == "" and json.loads(out.read_text())["version"] == 2
    r = CliRunner().invoke(main, ["schema"])
    assert r.exit_code == 0 and json.loads(r.stdout)["title"] == "Spec"


FRONT_END_COMMANDS = [
    ["check", "specs/gpt2.cycle"],
    ["ir", "specs/gpt2.cycle"],
    ["fmt", "specs/gpt2.cycle"],
    ["schema"],
    ["--help"],
]


# a process each: check and fmt in the fast tier, the others in the full run
@pytest.mark.parametrize("argv", [a if a[0] in ("check", "fmt") else pytest.param(a, marks=pytest.mark.slow) for a in FRONT_END_COMMANDS],
                         ids=lambda a: a[0])
def test_front_end_commands_never_import_torch(argv):
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['cyclec', *{argv!r}]\n"
        "try:\n"
        "    runpy.run_module('cyclelang', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "else:\n"
        "    code = 0\n"
        "sys.stdout.flush()\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', code, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stderr.strip().splitlines()[-1] == "NO-TORCH 0", r.stderr


def test_python_dash_m_runs_the_cli():
    r = subprocess.run([sys.executable, "-m", "cyclelang", "check", "specs/gpt2.cycle"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_no_traceback_on_a_directory_or_binary(tmp_path):
    (tmp_path / "bin.cycle").write_bytes(bytes(range(256)))
    for target in [str(tmp_path), str(tmp_path / "bin.cycle")]:
        r = CliRunner().invoke(main, ["check", target])
        assert r.exit_code in (1, 2) and "Traceback" not in (r.stderr + r.stdout)
