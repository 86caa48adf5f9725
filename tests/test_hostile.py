"""Every crafted hostile input in tests/hostile/ ends in clean diagnostics.

Clean means: exit code 1, every error located (file:line:col), no traceback, an
answer within seconds, and output of bounded size however many problems the
input has. `fmt` on the same input must also answer without crashing.
"""

from __future__ import annotations

import re
import time

import pytest
from click.testing import CliRunner

from cyclelang.cli import main

from .conftest import ROOT, swept_except
from .test_fuzz import DIAG_LINE, time_limit

HOSTILE = sorted((ROOT / "tests" / "hostile").glob("*.cycle"))
MAX_OUTPUT = 512 * 1024  # diagnostics are capped and long lines windowed
# the inputs that take over half a second to check: the full run sweeps them too
HEAVY = {"many_unknown_options", "regression_long_line_many_diagnostics", "thousands_of_stages_one_error", "unary_chain"}


def test_there_are_at_least_fifty():
    assert len(HOSTILE) >= 50


@pytest.mark.parametrize("path", swept_except(HOSTILE, HEAVY), ids=lambda p: p.stem)
def test_hostile_input_ends_in_clean_diagnostics(path):
    runner = CliRunner()
    start = time.monotonic()
    with time_limit(20):
        r = runner.invoke(main, ["check", str(path)])
    assert time.monotonic() - start < 20
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output[-3000:]
    assert r.exit_code == 1, f"exit {r.exit_code}\n{r.output[-2000:]}"
    errors = [m for m in DIAG_LINE.finditer(r.stderr) if m["sev"] == "error"]
    assert errors, r.stderr[-2000:]
    for m in errors:
        assert m["file"] == str(path) and int(m["line"]) >= 1 and int(m["col"]) >= 1, m.group(0)
    assert len(r.stderr) < MAX_OUTPUT, f"{len(r.stderr)} bytes of diagnostics"
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", r.stderr.replace("\r\n", "\n")), "a control character reached the terminal"
    with time_limit(20):
        f = runner.invoke(main, ["fmt", str(path)])
    assert "Traceback" not in f.output and f.exit_code in (0, 1), f.output[-3000:]
