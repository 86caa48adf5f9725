"""Code generation stays linear in the number of distinct stages.

Issue "Hardening, round three", defect 2: the generated source indexed stage k of
`model.stages` as `self.stages[1 + 1 + ... + 1]` and built the ModuleList as
`[A(config)] + [B(config)] + ...`, so the source grew with the square of the number of
distinct stages (2,000: 79 s and 2 GB) and 3,000 sent the compiler into a
RecursionError. A run of stages of one instance each is now one integer in an index and
one list display in the ModuleList. No timing here: the checks are on the text.
"""

from __future__ import annotations

import re

import pytest

import cyclelang


def _spec(n: int, repeat=lambda k: "") -> str:
    lines = ["engine e {", "  chamber width=8", "  throat causal", "  feed tokens vocab=16 context=8"]
    lines += [f"  stage s{k} {repeat(k)} {{ prechamber p {{ turbine linear }} }}" for k in range(n)]
    return "\n".join(lines + ["  nozzle head", "}"]) + "\n"


def _source(n: int, **kw) -> str:
    return cyclelang.codegen(cyclelang.parse(_spec(n, **kw)))


def test_codegen_scale_indices_are_plain_integers():
    src = _source(60)
    assert "1 + 1" not in src
    (stages,) = [ln for ln in src.splitlines() if "self.stages = nn.ModuleList(" in ln]
    assert "] + [" not in stages  # one list display, not a chain of one-element lists
    for k in (0, 1, 2, 59):
        assert f"x = self.stages[{k}](x)" in src
    assert "self.stages = nn.ModuleList([S0(config), S1(config), S2(config)," in src


def test_codegen_scale_source_grows_linearly():
    a, b, c = (len(_source(n)) for n in (100, 200, 400))
    # linear: the next 200 stages cost twice what the 100 before them did (quadratic: 3 times)
    assert (c - b) < 2.2 * (b - a), (a, b, c)
    assert (c - b) / 200 < 1500  # a stage's classes, its call and its entries: a constant
    longest = max(map(len, _source(400).splitlines()))
    assert longest < 20 * 400, longest  # the longest line is the ModuleList's display: about 15 characters per stage


def test_codegen_scale_runs_of_single_stages_collapse_between_repeated_ones():
    src = _source(7, repeat=lambda k: "x 2" if k in (0, 4) else "")
    assert "nn.ModuleList([S0(config) for _ in range(config.n_s0)] + [S1(config), S2(config), S3(config)]"\
           " + [S4(config) for _ in range(config.n_s4)] + [S5(config), S6(config)])" in " ".join(src.split())  # wrapped
    assert "x = self.stages[self.config.n_s0 + 2](x)" in src
    assert "self.stages[self.config.n_s0 + 3 : self.config.n_s0 + 3 + self.config.n_s4]" in src
    assert "x = self.stages[self.config.n_s0 + 3 + self.config.n_s4 + 1](x)" in src
    assert not re.search(r"\+ 1 \+ 1\b", src)


@pytest.mark.slow  # 4 to 8 s: 3,000 stage classes compiled and built
def test_codegen_scale_three_thousand_distinct_stages_build():
    spec = cyclelang.parse(_spec(3000))
    src = cyclelang.codegen(spec)
    assert len(src) < 3000 * 1500
    from cyclelang.backends.torch.build import build_source, summary_text

    model = build_source(spec, src, seed=0)  # compiles the text: a RecursionError before the fix
    assert len(model.stages) == 3000
    text = summary_text(spec, model)  # what `cyclec build` prints: a lookup per parameter, not a scan of every stage
    assert "stage s2999 x1: 72" in text


def test_codegen_scale_repeated_stages_are_capped_with_a_diagnostic():
    """Stages that repeat (`x N`) each index by the sum of the counts before them: a quadratic the source cannot
    escape without giving up readable indices, so their number is capped (E0238) instead of exhausting memory or
    the compiler's recursion (1,000 of them wrote 21 MB; about 3,000 ended in a RecursionError, exit 123)."""
    from cyclelang import ir
    from cyclelang.diagnostics import CycleError

    limit = ir.MAX_REPEATED_STAGES
    cyclelang.parse(_spec(limit, repeat=lambda k: "x 2"))  # at the limit: accepted
    with pytest.raises(CycleError) as e:
        cyclelang.parse(_spec(limit + 1, repeat=lambda k: "x 2"))
    (d,) = e.value.diagnostics
    assert d.code == "E0238" and f"s{limit}" in d.message and d.span.line == 4 + limit + 1
    cyclelang.parse(_spec(2 * limit))  # stages used once are not counted
