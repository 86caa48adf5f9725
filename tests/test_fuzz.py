"""Fuzzing the front end: no input crashes, hangs or balloons the compiler.

Hypothesis generates valid specs from the grammar's constructs, then breaks them:
deleted, duplicated, swapped and foreign tokens, random bytes, non-UTF-8 bytes,
Unicode look-alikes, huge numbers, very long lines and deep nesting. Every input
must either check clean or end in diagnostics that carry a line and a column,
with exit code 1: never a traceback (exit 123), never a hang.

The budget is fixed and derandomized (the same examples on every run), so CI
time is predictable: the whole file runs in well under two minutes on two cores.
Raise FUZZ_SCALE in the environment for a longer local run, e.g.
`FUZZ_SCALE=20 pytest tests/test_fuzz.py`. A crasher found that way becomes a
file in tests/hostile/ (a regression case) and an entry in docs/reliability.md.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cyclelang
from cyclelang.cli import main
from cyclelang.diagnostics import CycleError
from cyclelang.syntax.fmt import format_text
from cyclelang.syntax.parser import parse_module

from .conftest import ROOT, SPECS, need

SCALE = max(1, int(os.environ.get("FUZZ_SCALE", "1")))
EXAMPLE_TIMEOUT_S = 10  # one spec, one command: far above the slowest real case (~50 ms)


def fuzz_settings(n: int):
    return settings(max_examples=n * SCALE, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


# --- running one input --------------------------------------------------------------------------

DIAG_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<sev>error|warning|note)\[(?P<code>[EWN]\d{3,4})\]", re.M)


@contextmanager
def time_limit(seconds: int = EXAMPLE_TIMEOUT_S):
    """Fail instead of hanging (SIGALRM: the tests run in the main thread on Unix)."""
    if not hasattr(signal, "SIGALRM"):  # pragma: no cover
        yield
        return

    def expired(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def assert_clean_outcome(result, path: Path, command: str = "check") -> None:
    out = result.output
    assert "Traceback" not in out and "internal error" not in out, f"{command} crashed on:\n{path.read_bytes()[:2000]!r}\n{out[-3000:]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1), f"exit {result.exit_code}:\n{out[-3000:]}"
    if result.exit_code == 1 and command == "check":
        errors = [m for m in DIAG_LINE.finditer(result.stderr) if m["sev"] == "error"]
        assert errors, f"exit 1 without a located error:\n{result.stderr[-3000:]}"
        for m in errors:
            assert m["file"] == str(path) and int(m["line"]) >= 1 and int(m["col"]) >= 1, m.group(0)


def check_bytes(data: bytes, workdir: Path, name: str = "fuzz.cycle", fmt: bool = True):
    """`cyclec check` (and `cyclec fmt`) on `data`, in-process; returns the check result."""
    path = workdir / name
    path.write_bytes(data)
    runner = CliRunner()
    with time_limit():
        r = runner.invoke(main, ["check", str(path)], catch_exceptions=True)
    assert_clean_outcome(r, path)
    if fmt:
        with time_limit():
            f = runner.invoke(main, ["fmt", str(path)], catch_exceptions=True)
        assert_clean_outcome(f, path, "fmt")
        assert f.exit_code == 0 or r.exit_code == 1, "fmt refused a spec that checks clean"
    return r


def check_text(text: str, workdir: Path, **kw):
    return check_bytes(text.encode("utf-8", "surrogatepass"), workdir, **kw)


# --- valid specs from the grammar's constructs ----------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: s not in {"x", "sqrt", "let", "include", "stage", "engine", "chamber", "throat", "feed", "nozzle", "startup",
                        "prechamber", "fullflow", "norm", "turbine", "merge", "warmup", "schedule", "clip", "betas", "decay", "init",
                        "width", "vocab", "context", "true", "false"})


@st.composite
def turbines(draw, width: int, heads_opts: list[int]):
    kind = draw(st.sampled_from(["attention", "mlp", "moe", "pool"]))
    if kind == "attention":
        h = draw(st.sampled_from(heads_opts))
        parts = [f"heads={h}"]
        kv = draw(st.sampled_from([None] + [k for k in (1, 2, 4) if h % k == 0]))
        if kv:
            parts.append(f"kv_heads={kv}")
        parts += draw(st.lists(st.sampled_from(["rotary", "rotary=0.5", "bias=false", "qk_norm", "dropout=0.1"]), unique_by=lambda s: s.split("=")[0], max_size=3))
    elif kind == "mlp":
        parts = [draw(st.sampled_from(["ratio=4", "ratio=2", "hidden=width*2", f"hidden={width * 3}", "ratio=(1+1)*2"]))]
        parts += draw(st.lists(st.sampled_from(["act=gelu", "act=relu", "act=swiglu", "act=silu", "bias=false"]), unique_by=lambda s: s[:3], max_size=2))
    elif kind == "moe":
        e = draw(st.sampled_from([2, 4, 8]))
        parts = [f"experts={e}", f"top={draw(st.integers(1, e))}", "ratio=2"]
        parts += draw(st.lists(st.sampled_from(["capacity=1.25", "balance=0.01", "act=swiglu"]), unique_by=lambda s: s.split("=")[0], max_size=2))
    else:
        parts = draw(st.sampled_from([[], ["size=3"], ["size=5"]]))
    return ["turbine", kind, *parts]


@st.composite
def prechambers(draw, name: str, width: int, heads_opts: list[int], merge: bool = True):
    toks = ["prechamber", name, "{"]
    if draw(st.booleans()):
        toks += ["norm", draw(st.sampled_from(["layernorm", "rmsnorm"]))]
    toks += draw(turbines(width, heads_opts))
    if merge and draw(st.booleans()):
        toks += ["merge", draw(st.sampled_from(["plain", "cooling", "rezero", "layerscale", "gate", "scale=0.5", "deepnorm"]))]
    return toks + ["}"]


@st.composite
def stage_bodies(draw, width: int, heads_opts: list[int]):
    toks: list[str] = []
    used: set[str] = set()
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["pre", "pre", "fullflow", "norm", "turbine"]))
        name = draw(names.filter(lambda n: n not in used))
        used.add(name)
        if what == "pre":
            toks += draw(prechambers(name, width, heads_opts))
        elif what == "fullflow":
            a = draw(names.filter(lambda n: n not in used))
            used.add(a)
            b = draw(names.filter(lambda n: n not in used))
            used.add(b)
            toks += ["fullflow", name, "{"]
            if draw(st.booleans()):
                toks += ["norm", "layernorm"]
            toks += draw(prechambers(a, width, heads_opts, merge=False)) + draw(prechambers(b, width, heads_opts, merge=False)) + ["}"]
        elif what == "norm":
            toks += ["norm", draw(st.sampled_from(["layernorm", "rmsnorm"]))]
        else:
            toks += ["turbine", "mlp", "ratio=2"]
    return toks


@st.composite
def valid_token_lists(draw) -> list[str]:
    head = draw(st.sampled_from([8, 16, 32]))
    heads_opts = [1, 2, 4, 8]
    width = head * draw(st.sampled_from([4, 8]))
    toks: list[str] = []
    depth = draw(st.integers(1, 4))
    toks += ["let", "depth", "=", str(depth)]
    template = draw(st.booleans())
    if template:
        toks += ["stage", "blk", "(", "h", ",", "r", "=", "2", ")", "{",
                 "prechamber", "mix", "{", "norm", "rmsnorm", "turbine", "attention", "heads=h", "}",
                 "prechamber", "burn", "{", "turbine", "mlp", "ratio=r", "}", "}"]
    toks += ["engine", draw(names), "{", "chamber", f"width={width}", "throat", draw(st.sampled_from(["causal", "open"])),
             "feed", "tokens", f"vocab={draw(st.sampled_from([256, 1000, 4096]))}", "context=128",
             f"position={draw(st.sampled_from(['learned', 'sinusoidal', 'none']))}"]
    used: set[str] = {"blk"}
    for _ in range(draw(st.integers(1, 3))):
        name = draw(names.filter(lambda n: n not in used))
        used.add(name)
        if template and draw(st.booleans()):
            toks += ["stage", name, "=", "blk", "(", "h", "=", str(draw(st.sampled_from(heads_opts))), ")", "x", "depth"]
        else:
            rep = draw(st.sampled_from([[], ["x", "depth"], ["x", "2"], ["x", "depth", "*", "2"]]))
            toks += ["stage", name, *rep, "{", *draw(stage_bodies(width, heads_opts)), "}"]
    if draw(st.booleans()):
        toks += ["norm", "layernorm"]
    toks += ["nozzle", "head"] + (["tied"] if draw(st.booleans()) else [])
    if draw(st.booleans()):
        toks += ["startup", "{", "warmup", "100", "schedule", "cosine", "lr=3e-4", "min=3e-5", "steps=1000",
                 "clip", "1.0", "betas", "0.9", "0.95", "decay", "0.1", "}"]
    toks += ["}"]
    return toks


SEPARATORS = [" ", " ", " ", "\n", "\n  ", "\t", "\n\n", "  # a note\n", " #{ (\n", "\r\n", "\n# own line\n"]


@st.composite
def valid_specs(draw) -> str:
    """A valid spec, laid out at random: newlines and comments anywhere a space may go."""
    toks = draw(valid_token_lists())
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(toks), max_size=len(toks)))
    return "".join(t + s for t, s in zip(toks, seps))


# --- mutations ------------------------------------------------------------------------------------

TOKEN_RE = re.compile(r'#[^\n]*|"[^"\n]*"|\d[\d_.eE]*|[A-Za-z_]\w*|\*\*|//|\s+|.', re.S)
FOREIGN = ["{", "}", "(", ")", "=", ",", "x", "-", "**", "//", '"', '"a.cycle"', "#", "stage", "engine", "prechamber",
           "fullflow", "turbine", "norm", "merge", "let", "include", "startup", "chamber", "feed", "nozzle", "sqrt",
           "width", "vocab", "heads", "true", "false", "none", "_", "0", "-1", "1e308", "9" * 40, "\\", ";", "@", "$HOME"]
HUGE = ["0", "-0", "00", "1_000", "1__0", "1.", ".5", "1e", "1e+", "1e308", "1e309", "-1e309", "1e-400", "9" * 80, "2**62",
        "2**63", "-(2**62)", "10**10**10", "(2**31)**2", "2**2**2**2**2", "1/0", "1//0", "1%0", "0.0**-1", "sqrt(-1)",
        "(-8)**0.5", "2**-1080", "1e30", "-1e30", "4.5", "1e-30"]
LOOKALIKE = {"=": ["\uff1d", "\u2261", "\ua78a"], "{": ["\uff5b", "\u2774"], "}": ["\uff5d"], "(": ["\uff08"], ")": ["\uff09"],
             "-": ["\u2212", "\u2013", "\u2010"], "x": ["\u00d7", "\u0445"], " ": ["\u00a0", "\u3000", "\u200b", "\u2028", "\u0085", "\x0c", "\x0b"],
             "a": ["\u0430", "\u03b1"], "e": ["\u0435"], "o": ["\u043e", "\u03bf"], "1": ["\uff11", "\u0661", "\u00b9"],
             '"': ["\u201c", "\u201d"], "\n": ["\r", "\u2029"], ",": ["\uff0c"], "_": ["\uff3f"]}


def library_texts() -> list[str]:
    return [p.read_text("utf-8") for p in SPECS]


seed_texts = st.one_of(valid_specs(), st.sampled_from(library_texts()))


@st.composite
def token_mutants(draw) -> str:
    toks = TOKEN_RE.findall(draw(seed_texts))
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "replace"]))
        i = draw(st.integers(0, max(len(toks) - 1, 0)))
        if op == "delete" and toks:
            del toks[i]
        elif op == "duplicate" and toks:
            toks.insert(i, toks[i])
        elif op == "swap" and len(toks) > 1:
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        elif op == "insert":
            toks.insert(i, " " + draw(st.sampled_from(FOREIGN)) + " ")
        elif toks:
            toks[i] = draw(st.sampled_from(FOREIGN))
    return "".join(toks)


@st.composite
def number_mutants(draw) -> str:
    text = draw(seed_texts)
    spots = [m.span() for m in re.finditer(r"(?<![\w.])\d[\d_.eE]*", text)]
    assume(spots)
    for a, b in sorted(draw(st.lists(st.sampled_from(spots), min_size=1, max_size=3, unique=True)), reverse=True):
        text = text[:a] + draw(st.sampled_from(HUGE)) + text[b:]
    return text


@st.composite
def lookalike_mutants(draw) -> str:
    text = draw(seed_texts)
    spots = [i for i, ch in enumerate(text) if ch in LOOKALIKE]
    for i in sorted(draw(st.lists(st.sampled_from(spots), min_size=1, max_size=3, unique=True)), reverse=True):
        text = text[:i] + draw(st.sampled_from(LOOKALIKE[text[i]])) + text[i + 1:]
    return text


@st.composite
def byte_mutants(draw) -> bytes:
    data = bytearray(draw(seed_texts).encode("utf-8"))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.sampled_from([b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\x00", b"\xef\xbb\xbf", b"\x80"]))
    return bytes(data)


@st.composite
def long_lines(draw) -> str:
    n = draw(st.sampled_from([1_000, 20_000, 200_000]))
    filler = draw(st.sampled_from(["a", " ", "#", "x ", "{", "1", "9", "(", "\u00e9", "heads=1 "]))
    line = (filler * (n // len(filler)))[:n]
    text = draw(seed_texts)
    lines = text.split("\n")
    i = draw(st.integers(0, len(lines)))
    return "\n".join(lines[:i] + [line] + lines[i:])


@st.composite
def nested(draw) -> str:
    depth = draw(st.integers(1, 200))
    kind = draw(st.sampled_from(["braces", "parens", "mixed", "stages", "sqrt", "unary"]))
    if kind == "braces":
        return "engine e " + "{" * depth + "}" * draw(st.integers(0, depth))
    if kind == "parens":
        return "let a = " + "(" * depth + "1" + ")" * draw(st.integers(0, depth))
    if kind == "mixed":
        return "".join(draw(st.lists(st.sampled_from(["{", "(", ")", "}", "stage s ", "engine e ", " x "]), min_size=depth, max_size=depth)))
    if kind == "stages":
        return "engine e {" + " stage s {" * depth + " }" * depth + "}"
    if kind == "sqrt":
        return "let a = " + "sqrt(" * depth + "4" + ")" * depth
    return "let a = " + draw(st.sampled_from(["-", "+", "- +"])) * depth + "1"


# --- the properties -------------------------------------------------------------------------------
#
# The campaigns that take over half a second are marked slow: the fast tier keeps the cheap ones.


@pytest.mark.slow
@fuzz_settings(60)
@given(text=valid_specs())
def test_generated_specs_check_clean(text, workdir):
    r = check_text(text, workdir, fmt=False)
    assert r.exit_code == 0, f"a valid spec was refused:\n{text}\n{r.stderr}"


@pytest.mark.slow
@fuzz_settings(150)
@given(text=token_mutants())
def test_token_mutations_end_in_diagnostics(text, workdir):
    check_text(text, workdir)


@pytest.mark.slow
@fuzz_settings(60)
@given(text=number_mutants())
def test_huge_and_odd_numbers(text, workdir):
    check_text(text, workdir, fmt=False)


@pytest.mark.slow
@fuzz_settings(50)
@given(text=lookalike_mutants())
def test_unicode_lookalikes(text, workdir):
    check_text(text, workdir)


@pytest.mark.slow
@fuzz_settings(40)
@given(data=byte_mutants())
def test_non_utf8_bytes(data, workdir):
    r = check_bytes(data, workdir)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        assert "E0001" in r.stderr


@fuzz_settings(40)
@given(data=st.binary(max_size=400))
def test_random_bytes(data, workdir):
    check_bytes(data, workdir)


@fuzz_settings(40)
@given(text=st.text(max_size=300))
def test_random_unicode_text(text, workdir):
    check_text(text, workdir)


@pytest.mark.slow
@fuzz_settings(15)
@given(text=long_lines())
def test_very_long_lines(text, workdir):
    check_text(text, workdir, fmt=False)


@fuzz_settings(40)
@given(text=nested())
def test_deep_nesting(text, workdir):
    check_text(text, workdir)


# --- fmt: meaning and comments survive ----------------------------------------------------------


def _ir(text: str):
    return cyclelang.parse(text).model_dump()


@pytest.mark.slow
@fuzz_settings(60)
@given(text=valid_specs())
def test_fmt_preserves_meaning_and_every_comment(text):
    with time_limit():
        out = format_text(text)
    assert _ir(out) == _ir(text)
    before = sorted(c.text for c in parse_module(text).comments)
    after = sorted(c.text for c in parse_module(out).comments)
    assert before == after, "fmt lost or merged a comment"
    assert format_text(out) == out, "fmt is not stable"


@pytest.mark.slow
@fuzz_settings(60)
@given(text=token_mutants())
def test_fmt_on_mutants_keeps_meaning_when_it_parses(text):
    try:
        with time_limit():
            out = format_text(text)
    except CycleError:
        return
    assert format_text(out) == out
    try:
        before = _ir(text)
    except CycleError as e:
        with pytest.raises(CycleError) as after:
            _ir(out)
        assert [d.code for d in after.value.diagnostics] == [d.code for d in e.diagnostics]
        return
    assert _ir(out) == before


# --- draw: every valid spec has a diagram -------------------------------------------------------


def _graphviz():
    from cyclelang.backends import graphviz as gv

    return gv


@pytest.mark.slow
@fuzz_settings(25)
@given(text=valid_specs(), view=st.sampled_from(["cycle", "graph"]), expand=st.booleans())
def test_draw_on_generated_specs(text, view, expand):
    gv = _graphviz()
    spec = cyclelang.parse(text)
    with time_limit():
        dot = gv.to_dot(spec, view=view, expand=expand)
    assert dot.lstrip().startswith(("digraph", "strict digraph")) and dot.rstrip().endswith("}")
    assert gv.to_dot(spec, view=view, expand=expand) == dot, "DOT is not deterministic"


# --- a handful in real processes: exit codes, no traceback, bounded memory ------------------------

MEMORY_LIMIT = 1 << 30  # 1 GiB of address space for one check of a hostile spec


def _limit_memory():  # pragma: no cover - runs in the child
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


SUBPROCESS_CASES = {
    "valid": b"engine e { chamber width=8 throat causal feed tokens vocab=16 context=8 nozzle head }\n",
    "binary": bytes(range(256)) * 8,
    "nested_1mib": b"let a = " + b"(" * 1_000_000,
    "over_1mib": b"# " + b"a" * (1 << 20) + b"\n",
    "long_line": b"engine e { chamber " + b"width=8 " * 20_000 + b"}\n",
    "many_options": b"engine e { turbine mlp " + b" ".join(b"o%d=1" % i for i in range(20_000)) + b" }\n",
    "power_tower": b"let a = 9**9**9**9\nlet b = (2**62)*(2**62)\n",
    "repeat_huge": b"engine e { chamber width=8 feed tokens vocab=8 context=8 stage s x 10**18 { turbine mlp } nozzle head }\n",
}


# one valid and one refused in the fast tier; the hostile ones (up to two seconds each) in the full run
@pytest.mark.parametrize("name", [n if n in {"valid", "binary"} else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(SUBPROCESS_CASES)])
def test_real_process_ends_cleanly(name, tmp_path):
    path = tmp_path / f"{name}.cycle"
    path.write_bytes(SUBPROCESS_CASES[name])
    kw = {"preexec_fn": _limit_memory} if sys.platform.startswith("linux") else {}
    p = subprocess.run([sys.executable, "-m", "cyclelang", "check", str(path)], capture_output=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "NO_COLOR": "1"}, **kw)
    err = p.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err[-3000:]
    assert p.returncode == (0 if name == "valid" else 1), err[-3000:]
    if p.returncode:
        assert DIAG_LINE.search(err), err[-2000:]
