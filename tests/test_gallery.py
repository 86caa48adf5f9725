"""docs/gallery.md and its diagrams are up to date with the specs (`python scripts/gallery.py`).

The markdown is compared exactly; each SVG by the DOT hash stamped in it, so a
different Graphviz version, which shifts SVG bytes, does not fail the test.
"""

from __future__ import annotations

import re
import sys

import pytest

from .conftest import ROOT, SPECS


@pytest.fixture(scope="module")
def gallery():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gallery as g
    finally:
        sys.path.pop(0)
    return g


FAMILY_SPECS = sorted((ROOT / "specs" / "families").glob("*.cycle"))


def test_every_spec_has_a_place_and_a_concept(gallery):
    stems = gallery.stems()
    want = [p.stem for p in SPECS] + [f"families/{p.stem}" for p in FAMILY_SPECS]
    assert sorted(stems) == sorted(want) and len(set(stems)) == len(stems)
    assert set(gallery.CONCEPTS) == set(stems)
    assert all(engine and network for engine, network in gallery.CONCEPTS.values()), "a family without a note in FAMILY_NOTES"


def test_every_picture_and_link_resolves():
    text = (ROOT / "docs" / "gallery.md").read_text("utf-8")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    side = [i for i in images if i.startswith("img/side_by_side/")]
    assert sorted(set(images) - set(side)) == sorted([f"img/gallery/{p.stem}.svg" for p in SPECS] +
                                                     [f"img/gallery/families/{p.stem}.svg" for p in FAMILY_SPECS])
    assert side and all((ROOT / "docs" / i).is_file() for i in side)
    for target in re.findall(r"\]\((\.\./[^)#]+)\)", text):
        assert (ROOT / "docs" / target).resolve().is_file(), target
    anchors = set(re.findall(r"^### (\S+)$", text, re.M))
    assert set(re.findall(r"\]\(#([^)]+)\)", text)) == anchors


def test_check_mode_exit_code(gallery, capsys):
    """`--check` is 0 only when docs/gallery.md equals what the script writes and every diagram's stamped
    DOT hash is its spec's (`stale`: the markdown and `stale_images`), so this one run holds both up to date."""
    assert gallery.main(["--check"]) == 0, capsys.readouterr().err + "run: python scripts/gallery.py"


def test_check_mode_fails_on_a_stale_markdown_or_diagram(gallery, monkeypatch, capsys):
    """The two halves `--check` compares, each made stale alone (the comparisons themselves, not rerun)."""
    text = (ROOT / "docs" / "gallery.md").read_text("utf-8")
    monkeypatch.setattr(gallery, "stale_images", lambda: [])
    monkeypatch.setattr(gallery, "markdown", lambda: text + "\nedited")
    assert gallery.main(["--check"]) == 1 and "out of date: docs/gallery.md" in capsys.readouterr().err
    monkeypatch.setattr(gallery, "markdown", lambda: text)
    assert gallery.main(["--check"]) == 0
    monkeypatch.setattr(gallery, "stale_images", lambda: ["docs/img/gallery/gpt2.svg"])
    assert gallery.main(["--check"]) == 1 and "out of date: docs/img/gallery/gpt2.svg" in capsys.readouterr().err
