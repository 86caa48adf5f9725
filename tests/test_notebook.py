"""Notebooks: a Spec (what cyclelang.load and cyclelang.parse return) shows in Jupyter as its
power-cycle diagram, and as HTML the diagram above the parameter/FLOP table per stage."""

from __future__ import annotations

import shutil

import pytest

import cyclelang
from cyclelang.review import analyze

from .conftest import ROOT, require

HAS_DOT = shutil.which("dot") is not None


def test_html_is_the_diagram_and_the_report():
    spec = cyclelang.load(ROOT / "specs" / "llama.cycle")
    html = spec._repr_html_()
    rep = analyze(spec)
    for s in rep["params"]["by_stage"]:
        assert f"<code>{s['path']}</code>" in html and f"{s['params']:,}" in html
    assert f"{rep['params']['total']:,}" in html and f"{rep['flops_per_token']['forward']:,} FLOPs per token" in html
    assert f"KV cache {rep['scaling']['kv_bytes_per_token']:,} bytes per token" in html
    if HAS_DOT:
        assert "<svg" in html and "<?xml" not in html and spec._repr_svg_().startswith("<svg")


def test_without_dot_the_table_still_shows(monkeypatch):
    import cyclelang.backends.graphviz as gv

    monkeypatch.setattr(gv.shutil, "which", lambda name: None)
    spec = cyclelang.parse((ROOT / "specs" / "gpt2.cycle").read_text("utf-8"))
    assert spec._repr_svg_() is None
    html = spec._repr_html_()
    assert "needs Graphviz" in html and "124,439,808" in html


def test_templates_only():
    spec = cyclelang.parse("stage b(h) { prechamber p { turbine attention heads=h } }\n")
    assert spec._repr_svg_() is None and "no engine" in spec._repr_html_()


@pytest.mark.slow  # imports IPython
def test_ipython_formats_a_spec():
    formatters = require("IPython.core.formatters", "pip install ipython")
    data, _ = formatters.DisplayFormatter().format(cyclelang.load(ROOT / "specs" / "gpt2.cycle"))
    assert "text/html" in data and "124,439,808" in data["text/html"]
    if HAS_DOT:
        assert data["image/svg+xml"].startswith("<svg")
