"""The option table (`semantics.options.TABLE`) is what the resolver reads: every option of
every statement is read through it, and nothing it lists goes unread. Hover and completion
in the language server and the playground show this table, so a row that the resolver
ignored would be documentation of an option that does nothing."""

from __future__ import annotations

import pytest

from cyclelang.semantics import options as opts
from cyclelang.semantics.resolve import parse

from .conftest import SPECS

ENGINE = "engine e {{\n  chamber width=64\n  throat {throat}\n  feed tokens vocab=64 context=16\n{body}\n  nozzle head\n{startup}}}\n"
CASES = [
    dict(throat="causal", body="  stage s { prechamber p { norm layernorm  turbine attention heads=4  merge plain } }", startup=""),
    dict(throat="open", body="  stage s { prechamber p { norm rmsnorm  turbine mlp  merge scale=0.5 } }", startup=""),
    dict(throat="causal", body="  stage s { prechamber p { turbine moe experts=2  merge cooling } }", startup=""),
    dict(throat="causal", body="  stage s { prechamber p { turbine pool  merge rezero } }", startup=""),
    dict(throat="causal", body="  stage s { prechamber p { turbine conv  merge layerscale } }", startup=""),
    dict(throat="causal", body="  stage s { prechamber p { turbine ssm version=1 dt_rank=2 norms } }", startup=""),
    dict(throat="causal", body="  stage s { prechamber p { turbine linear  merge gate } }", startup=""),
    dict(throat="causal", body="  stage s { prechamber p { turbine mlp  merge deepnorm }\n norm layernorm }", startup="  startup { schedule cosine steps=10  init xavier }\n"),
    dict(throat="causal", body="  turbine mlp", startup="  startup { schedule linear steps=10  init normal }\n"),
    dict(throat="causal", body="  turbine mlp", startup="  startup { schedule constant }\n"),
    dict(throat="causal", body="  turbine mlp", startup="  startup { schedule constant  param mup base_width=32 }\n"),
]


@pytest.fixture
def reads(monkeypatch):
    seen: dict[str, set[str]] = {}
    real = opts.Options._raw  # every getter reads through it

    def raw(self, name, *a, **k):
        seen.setdefault(self.key, set()).add(name)
        return real(self, name, *a, **k)

    monkeypatch.setattr(opts.Options, "_raw", raw)
    return seen


def test_every_row_is_read_and_every_read_is_a_row(reads):
    for case in CASES:
        parse(ENGINE.format(**case))
    for path in SPECS:
        parse(path.read_text("utf-8"), str(path))
    assert set(reads) | {k for k, v in opts.TABLE.items() if not v} == set(opts.TABLE)
    for key, names in reads.items():
        assert names == {o.name for o in opts.TABLE[key]}, key


def test_an_unknown_option_lists_the_table():
    from cyclelang.diagnostics import CycleError

    with pytest.raises(CycleError) as e:
        parse(ENGINE.format(throat="causal", body="  turbine pool sizee=3 qq=1", startup=""))
    msgs = {d.message: d.help for d in e.value.diagnostics}
    assert msgs["unknown option 'sizee' for turbine pool"] == "did you mean 'size'?"
    assert msgs["unknown option 'qq' for turbine pool"] == "turbine pool takes: " + ", ".join(sorted(o.name for o in opts.options_for("turbine pool")))


def test_reading_an_option_without_a_row_is_a_bug_not_a_silent_option():
    from cyclelang.diagnostics import Collector
    from cyclelang.ir import Span
    from cyclelang.semantics.values import Scope

    o = opts.Options("turbine pool", (), Scope(), Collector(), Span(file="x", line=1, column=1, end_line=1, end_column=2))
    with pytest.raises(KeyError, match="not in the table"):
        o.int("stride", 1)
    with pytest.raises(KeyError, match="not in the table"):
        o.get("stride")


def _literal_choices(annotation) -> tuple[str, ...] | None:
    """The values a field's Literal type admits ("none" standing for an optional's None); None when
    the field is no Literal of strings."""
    from typing import Literal, Union, get_args, get_origin

    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return args if all(isinstance(a, str) for a in args) else None
    if get_origin(annotation) is Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and (c := _literal_choices(inner[0])) is not None:
            return ("none",) + c
    return None


def test_every_choice_list_is_the_ir_types_own():
    """A choice option named after a field of its statement's IR class offers exactly the values
    the field's Literal admits: the lists are derived from the IR, and this holds them to it."""
    from cyclelang.ir import kinds, nodes

    classes = {f"turbine {k}": rec.cls for k, rec in kinds.BY_KEYWORD.items()}
    classes.update({f"norm {t}": nodes.Norm for t in ("layernorm", "rmsnorm")})
    classes.update({"feed tokens": nodes.Feed, "nozzle head": nodes.Nozzle})
    tied = 0
    for key, cls in classes.items():
        for o in opts.options_for(key):
            field = cls.model_fields.get(o.name)
            if o.type != "choice" or field is None:
                continue
            want = _literal_choices(field.annotation)
            if want is None:
                continue
            assert set(o.choices) == set(want), f"{key} {o.name}: the table offers {o.choices}, the IR admits {want}"
            tied += 1
    assert tied >= 6  # act, position, mask, router, group_score, feature, ... are all tied
