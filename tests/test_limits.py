"""Every limit gives one clear, located error, just past the limit and not at it.

The limits: file size 1 MiB (E0010), nesting 32 (E0011), name length 128 (E0012),
include depth 16 (E0111), repeat 10,000 (E0216), stages nested 4 deep (E0235) and
100,000 stage instances in all (E0237), sizes and numbers in range
(E0205, E0210), and the parameter estimate that `build` checks (E0219, lifted by
--allow-large). Zero, negative, 1e30 and not-a-number values are refused where a
size is expected.
"""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang.cli import main
from cyclelang.diagnostics import CycleError
from cyclelang.limits import MAX_PARAMETERS, check_parameters, estimate_parameters
from cyclelang.semantics.resolve import MAX_INCLUDE_DEPTH, MAX_REPEAT, MAX_WIDTH
from cyclelang.syntax.parser import MAX_IDENTIFIER, MAX_NESTING, MAX_SOURCE_BYTES

from .conftest import ROOT, SPECS, need, rotated, swept


def engine(body: str = "", width: str = "64", feed: str = "vocab=256 context=64") -> str:
    return f"engine e {{\n  chamber width={width}\n  feed tokens {feed}\n{body}\n  nozzle head\n}}\n"


def stage(turbine: str, repeat: str = "1") -> str:
    return f"  stage s x {repeat} {{\n    prechamber p {{\n      norm layernorm\n      turbine {turbine}\n    }}\n  }}"


def codes_of(text: str) -> list[str]:
    try:
        cyclelang.parse(text)
    except CycleError as e:
        for d in e.diagnostics:
            assert d.span is not None and d.span.line >= 1 and d.span.column >= 1, d
        assert "Traceback" not in e.render()
        return [d.code for d in e.diagnostics]
    return []


def message_of(text: str, code: str) -> str:
    with pytest.raises(CycleError) as e:
        cyclelang.parse(text)
    return next(d.message + " " + (d.help or "") for d in e.value.diagnostics if d.code == code)


# --- syntax limits -------------------------------------------------------------------------------


def test_file_size_limit_in_memory():
    ok = "#" + "a" * (MAX_SOURCE_BYTES - 2) + "\n"
    assert "E0010" not in codes_of(ok)
    assert codes_of(ok + "#") == ["E0010"]
    assert "1024 KiB" in message_of(ok + "#", "E0010")


def test_file_size_limit_on_disk_and_in_an_include(tmp_path):
    big = tmp_path / "big.cycle"
    big.write_bytes(b"#" * (MAX_SOURCE_BYTES + 1))
    r = CliRunner().invoke(main, ["check", str(big)])
    assert r.exit_code == 1 and f"{big}:1:1: error[E0010]" in r.stderr
    main_spec = tmp_path / "main.cycle"
    main_spec.write_text('include "big.cycle"\n' + engine())
    r = CliRunner().invoke(main, ["check", str(main_spec)])
    assert r.exit_code == 1 and f"{main_spec}:1:1: error[E0010]" in r.stderr


@pytest.mark.parametrize("open_, close", [("(", ")"), ("sqrt(", ")")])
def test_nesting_limit_in_expressions(open_, close):
    at = f"let a = {open_ * (MAX_NESTING - 1)}1{close * (MAX_NESTING - 1)}\n"
    assert codes_of(at) == []
    past = f"let a = {open_ * (MAX_NESTING + 1)}1{close * (MAX_NESTING + 1)}\n"
    assert codes_of(past) == ["E0011"]
    assert str(MAX_NESTING) in message_of(past, "E0011")


def test_nesting_limit_in_braces():
    assert codes_of("engine e " + "{" * (MAX_NESTING + 1) + "}" * (MAX_NESTING + 1)) == ["E0011"]


@pytest.mark.parametrize("limit", [None, 20_000])
def test_long_unary_chains_are_not_a_recursion_bomb(limit):
    # '-' does not nest with brackets, so the bracket count cannot catch it; nor a long sum. Whatever
    # the process's recursion limit (torch's compilers raise it to thousands: a parse then built a
    # tree of 1,000 signs that the evaluator's recursion could not walk)
    from cyclelang.syntax import parser

    parser._kept.cache_clear()  # each limit parses anew (a tree kept from the other would skip the parse)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit or old)
    try:
        for n in (10, 1_000, 100_000):
            assert set(codes_of("let a = " + "-" * n + "1\n")) <= {"E0011"}
            if n <= 1_000:  # a sum past the limit is refused at 201 terms as at 100,000 (its parse is the slow part)
                assert set(codes_of("let a = " + "+".join(["1"] * n) + "\n")) <= {"E0011"}
        assert codes_of("let a = " + "-" * 200 + "1\n") == []
        assert codes_of("let a = " + "-" * 201 + "1\n") == ["E0011"]
    finally:
        sys.setrecursionlimit(old)


def test_identifier_length_limit():
    assert codes_of(f"let {'a' * MAX_IDENTIFIER} = 1\n") == []
    assert codes_of(f"let {'a' * (MAX_IDENTIFIER + 1)} = 1\n") == ["E0012"]
    assert codes_of(engine().replace("engine e", "engine " + "e" * 10_000)) == ["E0012"]


# --- includes ------------------------------------------------------------------------------------


def test_include_depth_limit(tmp_path):
    n = MAX_INCLUDE_DEPTH + 2
    for i in range(n):
        nxt = f'include "f{i + 1}.cycle"\n' if i + 1 < n else ""
        (tmp_path / f"f{i}.cycle").write_text(nxt + f"let v{i} = {i}\n")
    spec = tmp_path / "main.cycle"
    spec.write_text('include "f0.cycle"\n' + engine())
    with pytest.raises(CycleError) as e:
        cyclelang.load(spec)
    assert [d.code for d in e.value.diagnostics] == ["E0111"]
    assert str(MAX_INCLUDE_DEPTH) in e.value.diagnostics[0].message


def test_include_depth_at_the_limit_is_fine(tmp_path):
    n = MAX_INCLUDE_DEPTH - 1
    for i in range(n):
        nxt = f'include "f{i + 1}.cycle"\n' if i + 1 < n else ""
        (tmp_path / f"f{i}.cycle").write_text(nxt + f"let v{i} = {i}\n")
    spec = tmp_path / "main.cycle"
    spec.write_text('include "f0.cycle"\n' + engine())
    cyclelang.load(spec)


# --- repeat counts -------------------------------------------------------------------------------


@pytest.mark.parametrize("repeat, code", [
    (str(MAX_REPEAT), None),
    (str(MAX_REPEAT + 1), "E0216"),
    ("10**18", "E0216"),
    ("0", "E0205"),
    ("-1", "E0205"),
    ("2.5", "E0205"),
    ("1e30", "E0216"),
    ("1e309", "E0210"),
    ("1/0", "E0210"),
    ("0/0", "E0210"),
    ("sqrt(-1)", "E0210"),
    ("2**62", "E0216"),
    ("2**63", "E0210"),
    ("9" * 40, "E0210"),
    ("nan", "E0101"),
    ("inf", "E0101"),
])
def test_repeat_counts(repeat, code):
    codes = codes_of(engine(stage("mlp ratio=1", repeat), width="8"))
    if code is None:
        assert codes == []
    else:
        assert code in codes, codes


def test_repeat_limit_message_names_the_limit():
    assert f"{MAX_REPEAT}" in message_of(engine(stage("mlp", str(MAX_REPEAT + 1))), "E0216")


# --- nested stages: depth and instances in all -----------------------------------------------------


def nest(depth: int, repeats: list[str] | None = None) -> str:
    """`depth` stages, each inside the one before, the innermost holding a prechamber."""
    repeats = repeats or ["1"] * depth
    text = "prechamber p { turbine mlp ratio=1 }"
    for d in reversed(range(depth)):
        text = f"stage s{d} x {repeats[d]} {{ {text} }}"
    return "  " + text


def test_stage_nesting_limit():
    from cyclelang.limits import MAX_STAGE_DEPTH

    assert codes_of(engine(nest(MAX_STAGE_DEPTH), width="8")) == []
    assert codes_of(engine(nest(MAX_STAGE_DEPTH + 1), width="8")) == ["E0235"]
    assert f"deeper than {MAX_STAGE_DEPTH} levels" in message_of(engine(nest(MAX_STAGE_DEPTH + 1), width="8"), "E0235")


def test_stage_instances_in_all_limit():
    from cyclelang.limits import MAX_LAYERS

    assert MAX_LAYERS == 100_000
    assert codes_of(engine(nest(2, ["100", "1000"]), width="8")) == []  # 100 x 1000: exactly the limit
    assert codes_of(engine(nest(2, ["101", "1000"]), width="8")) == ["E0237"]
    assert codes_of(engine(nest(3, ["10", "100", "101"]), width="8")) == ["E0237"]
    two = engine(nest(2, ["100", "600"]) + "\n" + nest(2, ["100", "401"]).replace("s0", "t0").replace("s1", "t1"), width="8")
    assert codes_of(two) == ["E0237"] and "by stage 't0'" in message_of(two, "E0237")  # counted over every stage of the engine


# --- sizes and numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "-64", "1e30", "-1e30", "1e309", "0/0", "sqrt(-1)", "2**2**2**2**2", "nan", "64.5", str(MAX_WIDTH + 1)])
def test_bad_chamber_width(value):
    codes = codes_of(engine(width=value))
    assert codes and set(codes) <= {"E0101", "E0203", "E0205", "E0210"}, codes


@pytest.mark.parametrize("turbine", [
    "attention heads=0", "attention heads=-8", "attention heads=1e30", "attention heads=64 kv_heads=0",
    "attention heads=8 dropout=1", "attention heads=8 dropout=-0.1", "attention heads=8 rotary=2", "attention heads=8 rotary_base=0",
    "mlp ratio=0", "mlp ratio=-4", "mlp ratio=1e30", "mlp ratio=1e308", "mlp ratio=1e-30", "mlp hidden=0", "mlp hidden=1e30",
    "moe experts=0", "moe experts=1e30", "moe experts=4 top=0", "moe experts=4 top=5", "moe experts=4 capacity=0",
    "moe experts=4 balance=-1", "pool size=0", "pool size=1e30", "linear out=0", "linear out=-1", "linear out=1e30",
])
def test_bad_turbine_values(turbine):
    codes = codes_of(engine(stage(turbine)))
    assert codes and set(codes) <= {"E0203", "E0205", "E0210", "E0212"}, codes


@pytest.mark.parametrize("feed", ["vocab=0 context=8", "vocab=-1 context=8", "vocab=1e30 context=8", "vocab=8 context=0",
                                  "vocab=8 context=1e30", "vocab=8 context=8 dropout=1", "vocab=8 context=8 scale=0"])
def test_bad_feed_values(feed):
    codes = codes_of(engine(feed=feed))
    assert codes and set(codes) <= {"E0203", "E0205", "E0210"}, codes


@pytest.mark.parametrize("line", ["warmup -1", "warmup 1e30", "clip -1", "clip 0/0", "betas 1 0.9", "betas (-0.1) 0.9", "schedule cosine lr=1e-3 steps=1e30",
                                  "decay -1", "schedule cosine lr=0 steps=10", "schedule cosine lr=1e-3 steps=0",
                                  "init normal std=0"])
def test_bad_startup_values(line):
    codes = codes_of(engine(f"  startup {{ {line} }}"))
    assert codes and set(codes) <= {"E0203", "E0205", "E0210", "E0216"}, codes


def test_huge_arithmetic_is_refused_not_computed():
    # 9**9**9 has 370 million digits: computing it would hang the compiler
    assert codes_of("let a = 9**9**9\n") == ["E0210"]
    assert codes_of("let a = (2**62) * (2**62)\n") == ["E0210"]
    assert codes_of("let a = 1e308 * 10\n") == ["E0210"]
    assert codes_of("let a = 2**-1080\n") == ["E0210"]  # underflow is refused too


# --- the parameter estimate ----------------------------------------------------------------------


def test_parameter_estimate_matches_gpt2():
    assert estimate_parameters(cyclelang.load(ROOT / "specs" / "gpt2.cycle")) == 124_439_808  # HF GPT-2 small


def test_parameter_estimate_counts_repeats_and_is_zero_for_templates():
    one = estimate_parameters(cyclelang.parse(engine(stage("mlp ratio=4", "1"))))
    two = estimate_parameters(cyclelang.parse(engine(stage("mlp ratio=4", "2"))))
    block = 64 * 2 + (64 * 256 + 256) + (256 * 64 + 64)
    assert two - one == block
    assert estimate_parameters(cyclelang.parse("stage t { turbine mlp }\n")) == 0


def test_parameter_limit_refuses_and_allow_large_lifts_it():
    huge = cyclelang.parse(engine(stage("mlp ratio=4", "10000"), width="65536", feed="vocab=256 context=8"))
    n = estimate_parameters(huge)
    assert n > MAX_PARAMETERS
    with pytest.raises(CycleError) as e:
        check_parameters(huge)
    d = e.value.diagnostics[0]
    assert d.code == "E0219" and d.span is not None and "--allow-large" in d.help and f"{MAX_PARAMETERS:,}" in d.message
    assert check_parameters(huge, allow_large=True) == n
    assert check_parameters(cyclelang.load(SPECS[0])) > 0


def test_parameter_estimate_is_computed_without_torch():
    import subprocess
    import sys

    code = ("import sys, cyclelang; from cyclelang.limits import estimate_parameters; "
            "estimate_parameters(cyclelang.load('specs/gpt2.cycle')); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


SMALL_SPECS = [p for p in SPECS if estimate_parameters(cyclelang.load(p)) <= 200_000_000][:4]  # small enough to allocate here


def test_some_specs_are_small_enough_to_build():
    assert len(SMALL_SPECS) == 4


# the first in the fast tier; the others take a second or more to build, and the full run builds them
@pytest.mark.parametrize("path", swept(SMALL_SPECS, {SMALL_SPECS[0].stem}), ids=lambda p: p.stem)
def test_parameter_estimate_matches_the_built_model(path):
    need("torch")
    spec = cyclelang.load(path)
    model = cyclelang.build(spec, seed=0)
    assert estimate_parameters(spec) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("path", rotated(SPECS, 2, 1), ids=lambda p: p.stem)  # half in the fast tier
def test_buffer_estimate_matches_the_built_model(path):
    """The size limit counts every table the model allocates (rotary tables per distinct key,
    sinusoids, ALiBi slopes, a fixed decay, an MoE's correction bias): it asks the kinds records
    the planner asks. A scale model has the same tables at its own sizes."""
    need("torch")
    from cyclelang.ir.passes import shrink
    from cyclelang.limits import estimate_buffers

    spec = shrink(cyclelang.load(path), width=64, depth=1)
    model = cyclelang.build(spec, seed=0)
    assert estimate_buffers(spec) == sum(b.numel() for b in model.buffers())


def test_build_refuses_a_huge_model_before_allocating(tmp_path):
    need("torch")
    spec = tmp_path / "huge.cycle"
    spec.write_text(engine(stage("mlp ratio=4", "10000"), width="65536", feed="vocab=256 context=8"))
    r = CliRunner().invoke(main, ["build", str(spec), "-o", str(tmp_path / "m.py")])
    assert r.exit_code == 1 and "E0219" in r.stderr and not (tmp_path / "m.py").exists()
