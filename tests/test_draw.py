"""`cyclec draw`: golden DOT for every spec and view, determinism, escaping,
rendering smoke tests, the CLI's formats and errors, parameter counts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang import ir
from cyclelang.backends.graphviz import draw, params, render, to_dot
from cyclelang.backends.graphviz.style import esc
from cyclelang.cli import main

from .conftest import ROOT, SPECS, spec_id

HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="the Graphviz 'dot' program is not installed (CI installs it)")
GOLDENS = ROOT / "tests" / "goldens" / "specs"


def spec(stem: str) -> ir.Spec:
    return cyclelang.load(ROOT / "specs" / f"{stem}.cycle")


# --- goldens -------------------------------------------------------------------


@pytest.mark.parametrize("view", ["cycle", "graph"])
@pytest.mark.parametrize("path", SPECS, ids=spec_id)
def test_golden_dot(path, view, golden):
    golden.check(GOLDENS / f"{path.stem}.{view}.dot", to_dot(cyclelang.load(path), view=view))


def test_every_golden_has_a_spec():
    stems = {p.stem for p in SPECS}
    for g in GOLDENS.glob("*.dot"):
        stem, view, _ = g.name.rsplit(".", 2)
        assert stem in stems and view in ("cycle", "graph"), f"stale golden {g.name}"


# --- determinism ---------------------------------------------------------------

_DUMP = """
import sys, cyclelang
from cyclelang.backends.graphviz import to_dot
s = cyclelang.load(sys.argv[1])
for view in ("cycle", "graph"):
    for expand in (False, True):
        sys.stdout.write(to_dot(s, view=view, expand=expand, labels="both"))
"""


def test_dot_is_byte_identical_across_hash_seeds_and_directories(tmp_path):
    outs = set()
    for seed, cwd, path in (("0", ROOT, "specs/gas_generator.cycle"), ("1", tmp_path, str(ROOT / "specs/gas_generator.cycle")),
                            ("12345", ROOT / "tests", "../specs/gas_generator.cycle")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, "-c", _DUMP, path], cwd=cwd, env=env, capture_output=True, check=True)
        outs.add(r.stdout)
    assert len(outs) == 1
    text = outs.pop().decode("utf-8")
    assert str(ROOT) not in text and str(tmp_path) not in text


def test_attributes_are_sorted():
    for line in to_dot(spec("gpt2")).splitlines():
        m = re.search(r"\[(.*)\]$", line.strip())
        if not m or "<" in m.group(1):
            continue
        keys = [k for k in re.findall(r"(?:^| )(\w+)=", m.group(1)) if k != "label"]  # the label leads
        assert keys == sorted(keys), line


# --- the pictures say what the spec says -----------------------------------------


def test_cycle_view_structure():
    dot = to_dot(spec("gas_generator"))
    assert "stage block  ×4" in dot and "subgraph cluster_b0 {" in dot
    assert "prechamber critic (detach)" in dot and "style=dashed" in dot and "arrowtail=tee" in dot
    assert "overboard" in dot and "aux loss ×0.1" in dot
    assert "cooling σ=" in dot
    assert "main chamber = residual stream" in dot and "overboard vent" in dot  # the legend
    assert "throat" in dot and "tanks" in dot


def test_labels_modes():
    s = spec("gpt2")
    both = to_dot(s, labels="both")
    assert "prechamber mix</b>" in both and ">attention, 12 heads, causal<" in both  # the name, then the network words
    rocket = to_dot(s, labels="rocket")
    assert "prechamber mix" in rocket and "attention, 12 heads" not in rocket and "injector" in rocket
    ml = to_dot(s, labels="ml")
    assert "branch mix:</b>" in ml and ">attention, 12 heads, causal<" in ml and "injector" not in ml


ROCKET_WORDS = ("tank", "pump", "valve", "turbine", "prechamber", "chamber", "throat", "nozzle", "injector", "combustor",
                "overboard", "full flow", "power cycle", "exhaust", "vent", "duct", "cooling", "cut:", "preburner")


def visible_labels(dot: str) -> list[str]:
    """The text of every label and xlabel (not tooltips), HTML tags stripped."""
    found = re.findall(r'\b(?:x?label)=(<(?:[^<>]|<[^<>]*>)*>|"(?:[^"\\]|\\.)*")', dot)
    return [re.sub(r"<[^>]*>", " ", x) for x in found]


@pytest.mark.parametrize("view", ["cycle", "graph"])
@pytest.mark.parametrize("path", SPECS, ids=spec_id)
def test_ml_labels_use_no_rocket_words(path, view):
    s = cyclelang.load(path)
    for lbl in visible_labels(to_dot(s, view=view, labels="ml")):
        low = lbl.lower().replace(s.engine.name.lower(), "")  # the engine's own name may be anything
        assert not [w for w in ROCKET_WORDS if w in low], lbl


def test_overboard_branch_sits_above_the_line_like_the_others():
    dot = to_dot(spec("gas_generator"))
    # the probe follows the critic on its row, tied to it so Graphviz keeps it on the same side
    assert '"b1.o0.t1" -> "b1.o1.t0" [style=invis weight=0]' in dot


def test_rows_wrap_by_estimated_width():
    from cyclelang.backends.graphviz.cycle import rows

    assert rows([100.0] * 4) == set()
    assert rows([600.0] * 4) and all(0 < k < 4 for k in rows([600.0] * 4))
    assert 2 not in rows([600.0] * 4, keep={2})
    dot = to_dot(spec("highway"))  # one long stage breaks between its branches
    assert "stage block  ×6  (continued)" in dot and 'subgraph "cluster_b0.c1"' in dot


def test_post_ln_valves_sit_on_the_main_line():
    dot = to_dot(spec("post_ln"))
    assert "valve in series" in dot  # legend entry appears only when drawn
    assert "valve on a branch" not in dot
    pre = to_dot(spec("gpt2"))
    assert "valve on a branch" in pre


def test_fullflow_one_split_one_merge():
    dot = to_dot(spec("full_flow"))
    assert dot.count('"b0.o0.valve" -> ') == 2  # the shared valve feeds both branches
    assert dot.count('-> "b0.o0.merge"') == 3  # two exhausts and the main line return at one junction


def test_expand_unrolls_repeats():
    folded = to_dot(spec("gpt2"))
    assert "cluster_b0.r" not in folded and "×12" in folded
    expanded = to_dot(spec("gpt2"), expand=True)
    assert all(f'"cluster_b0.r{r}"' in expanded for r in range(12))
    assert "stage block  12/12" in expanded


def test_expand_has_a_cap(tmp_path):
    big = "engine e {\n  chamber width=16\n  feed tokens vocab=32 context=8\n  stage s x 10000 { prechamber p { turbine mlp } }\n  nozzle head\n}\n"
    assert "×10000" in to_dot(cyclelang.parse(big))  # folded, any repeat count draws
    with pytest.raises(cyclelang.CycleError) as e:
        to_dot(cyclelang.parse(big), expand=True)
    d = e.value.diagnostics[0]
    assert d.code == "E0220" and d.span is not None and d.span.line == 4 and "at most 64" in d.message
    (tmp_path / "big.cycle").write_text(big)
    r = CliRunner().invoke(main, ["draw", str(tmp_path / "big.cycle"), "--expand", "-o", "-"])
    assert r.exit_code == 1 and "E0220" in r.output and "digraph" not in r.output
    assert "stage block  24/24" in to_dot(spec("gpt2_medium"), expand=True)  # real engines still unroll


def test_graph_view_has_shapes_on_every_edge_and_params_on_nodes():
    dot = to_dot(spec("gpt2"), view="graph")
    edges = [line for line in dot.splitlines() if " -> " in line]
    assert edges and all("B×T" in e or "T×768" in e for e in edges)
    assert "124.4M params" in dot and "2.4M params" in dot and "B×T×50257" in dot


def test_theme_and_rankdir():
    dark = to_dot(spec("gpt2"), theme="dark", rankdir="TB")
    assert "bgcolor=\"#10161d\"" in dark and "rankdir=TB" in dark
    with pytest.raises(ValueError):
        draw(spec("gpt2"), view="nope")


def test_template_only_file_is_a_diagnostic():
    with pytest.raises(cyclelang.CycleError) as e:
        cyclelang.draw("stage s { prechamber p { turbine mlp } }\n")
    assert "no engine" in str(e.value)


# --- escaping ------------------------------------------------------------------

EVIL = ['x"] evil [color=red', "a>b<c&d", "}{ graph", "back\\slash\\", "line\nbreak", "</b></font>>];\ninjected -> x;"]


def _rename(s: ir.Spec, name: str) -> ir.Spec:
    eng = s.engine
    stage = eng.body[0]
    ops = [op.model_copy(update={"name": f"{name}{i}"}) if isinstance(op, ir.Prechamber) else op for i, op in enumerate(stage.ops)]
    stage = stage.model_copy(update={"name": name, "ops": ops})
    return s.model_copy(update={"engine": eng.model_copy(update={"name": name, "body": [stage, *eng.body[1:]]})})


@pytest.mark.parametrize("view", ["cycle", "graph"])
@pytest.mark.parametrize("name", EVIL)
def test_names_that_are_not_identifiers_never_reach_the_dot(name, view):
    """The IR's names are identifiers: an IR edited to hold another (model_copy skips the
    models' validation) is refused by the back-end before a line of DOT is written."""
    with pytest.raises(ir.IRError, match="identifier"):
        to_dot(_rename(spec("gas_generator"), name), view=view)


def test_keyword_names_from_the_grammar():
    text = """
engine graph {
  chamber width=64
  feed tokens vocab=100 context=16
  stage node x 2 { prechamber edge { norm layernorm  turbine attention heads=4 } prechamber subgraph { turbine mlp } }
  nozzle head
}
"""
    dot = to_dot(cyclelang.parse(text))
    assert "stage node" in dot and "prechamber edge" in dot and "prechamber subgraph" in dot
    if HAS_DOT:
        render(dot, "svg")


# --- rendering -----------------------------------------------------------------


@needs_dot
@pytest.mark.parametrize("view", ["cycle", "graph"])
def test_svg_smoke(view):
    svg = render(to_dot(spec("gpt2"), view=view), "svg").decode("utf-8")
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    assert "stage block" in svg and "prechamber mix" in svg


@needs_dot
def test_png_and_pdf_smoke(tmp_path):
    png = tmp_path / "gpt2.png"
    r = CliRunner().invoke(main, ["draw", str(ROOT / "specs/gas_generator.cycle"), "-o", str(png), "--view", "graph"])
    assert r.exit_code == 0, r.output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    pdf = tmp_path / "gpt2.pdf"
    assert CliRunner().invoke(main, ["draw", str(ROOT / "specs/gpt2.cycle"), "-o", str(pdf)]).exit_code == 0
    assert pdf.read_bytes()[:5] == b"%PDF-"


# --- the command ----------------------------------------------------------------


def test_cli_dot_to_stdout_matches_api():
    r = CliRunner().invoke(main, ["draw", str(ROOT / "specs/moe.cycle"), "-o", "-", "--view", "graph", "--labels", "ml"])
    assert r.exit_code == 0
    assert r.output == to_dot(spec("moe"), view="graph", labels="ml")


def test_cli_writes_dot_file(tmp_path):
    out = tmp_path / "x.dot"
    r = CliRunner().invoke(main, ["draw", str(ROOT / "specs/llama.cycle"), "-o", str(out), "--expand", "--theme", "dark", "--rankdir", "TB"])
    assert r.exit_code == 0 and r.output == ""
    assert out.read_text("utf-8") == to_dot(spec("llama"), expand=True, theme="dark", rankdir="TB")
    assert [p.name for p in tmp_path.iterdir()] == ["x.dot"]  # no temporary left behind


def test_cli_unknown_extension_is_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["draw", str(ROOT / "specs/gpt2.cycle"), "-o", str(tmp_path / "x.jpg")])
    assert r.exit_code == 2 and ".svg" in r.output


def test_cli_bad_spec_exits_1(tmp_path):
    bad = tmp_path / "bad.cycle"
    bad.write_text("engine e { chamber width=8 }\n")
    r = CliRunner().invoke(main, ["draw", str(bad), "-o", "-"])
    assert r.exit_code == 1 and "E0213" in r.output


def test_without_graphviz_dot_still_works_and_svg_says_how_to_install(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path / "empty"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", "from cyclelang.cli import run; run()", "draw", str(ROOT / "specs/gpt2.cycle")]
    r = subprocess.run([*cmd, "-o", str(tmp_path / "x.svg")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "install Graphviz" in r.stderr
    assert not (tmp_path / "x.svg").exists()
    r = subprocess.run([*cmd, "-o", str(tmp_path / "x.dot")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "x.dot").read_text("utf-8").startswith("digraph cycle {")


def test_draw_does_not_import_torch(tmp_path):
    code = ("import sys; from cyclelang.cli import main\n"
            "try:\n    main(['draw', sys.argv[1], '-o', sys.argv[2]])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code, str(ROOT / "specs/gpt2.cycle"), str(tmp_path / "x.dot")], env=env, check=True)


# --- parameter counts -----------------------------------------------------------


def test_param_counts_match_known_models():
    assert params.count(spec("gpt2")) == 124_439_808  # GPT-2 small, as Hugging Face reports it
    llama = spec("llama").engine
    block = llama.body[0]
    # 512-wide, 8 heads x 64, 2 KV heads: q,o 512x512; k,v 512x128; SwiGLU 3 x 512 x 1408; two RMSNorm gains
    assert params.count(block) == 2 * 512 * 512 + 2 * 512 * 128 + 3 * 512 * 1408 + 2 * 512
    assert params.human(124_439_808) == "124.4M" and params.human(512) == "512"


# --- README pictures --------------------------------------------------------------


def test_readme_pictures_are_up_to_date():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import render_readme_diagrams as r
    finally:
        sys.path.pop(0)
    assert r.stale() == [], "run: python scripts/render_readme_diagrams.py"
