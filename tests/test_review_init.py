"""The reviewer follows the engine at initialisation: W130 (logits independent of the input)
and W131 (NaN or inf), each checked against the built model.

Issue "Hardening, round three", defect 4: valid specs whose logits ignore the tokens at
init, or are NaN there, passed `check` with no warning. The model runs in float32, so a
gain the spec writes as 1e-50 is 0 there and a logit scale of 1e39 is inf; a layernorm over
one channel outputs its bias whatever it reads. Each case below is built and run: the
warning is given exactly when the model shows it.
"""

from __future__ import annotations

import math

import pytest

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang.review import review  # noqa: E402


def _spec(body: str, feed: str = "", nozzle: str = "", chamber: int = 16) -> str:
    return (f"engine e {{ chamber width={chamber} throat causal feed tokens vocab=32 context=16 {feed} {body} "
            f"norm layernorm nozzle head {nozzle} }}")


ATTN = "stage s x 2 { prechamber p { norm layernorm turbine attention heads=2 } }"

# name: (spec, the code the reviewer must give, or None)
CASES = {
    # independent of the input at init
    "nozzle scale rounds to 0": (_spec(ATTN, nozzle="scale=1e-50"), "W130"),
    "feed scale rounds to 0": (_spec(ATTN, feed="scale=1e-50 position=none"), "W130"),
    "feed scale 0, learned positions": (_spec(ATTN, feed="scale=1e-50 position=learned"), "W130"),
    "deepnorm alpha and beta 0": (_spec("stage s x 2 { prechamber p { turbine mlp merge deepnorm alpha=1e-50 beta=1e-50 } }"), "W130"),
    "deepnorm alpha 0, a rezero branch beside": (_spec("stage s x 2 { fullflow f { prechamber p { turbine mlp merge deepnorm alpha=1e-50 beta=1e-50 } "
                                                      "prechamber q { turbine mlp merge rezero } } }"), "W130"),
    "a chamber of one channel under a layernorm": (_spec("stage s x 2 { prechamber p { turbine mlp } }", chamber=1), "W130"),
    # NaN at init
    "nozzle scale overflows": (_spec(ATTN, nozzle="scale=1e39"), "W131"),
    "layernorm over one channel, eps 0": (_spec("stage s { turbine linear out=1 norm layernorm eps=1e-50 } stage t { turbine linear out=16 }"), "W131"),
    "a zero feed under a norm with eps 0": (_spec("stage s x 2 { prechamber p { norm rmsnorm eps=1e-50 turbine mlp } }", feed="scale=1e-50 position=none"), "W131"),
    # quiet: the tokens get through, and nothing is NaN
    "rezero everywhere": (_spec("stage s x 2 { prechamber p { turbine attention heads=2 merge rezero } prechamber q { turbine mlp merge rezero } }"), None),
    "deepnorm alpha 0, the branch live": (_spec("stage s x 2 { prechamber p { turbine mlp merge deepnorm alpha=1e-50 } }"), None),
    "a one-channel layernorm inside a branch": (_spec("stage s x 2 { prechamber p { turbine linear out=1 norm layernorm turbine linear out=16 } }"), None),
    "an rmsnorm over one channel, eps 0": (_spec("stage s { turbine linear out=1 norm rmsnorm eps=1e-50 } stage t { turbine linear out=16 }"), None),
    "eps 0 on a live stream": (_spec("stage s x 2 { prechamber p { norm layernorm eps=1e-50 turbine mlp } }"), None),
    "small and large but representable scales": (_spec(ATTN, feed="scale=0.001", nozzle="scale=1e30"), None),
}


def _run(text: str):
    model = cyclelang.build(cyclelang.parse(text), seed=0)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 32, (2, 8), generator=g), torch.randint(0, 32, (2, 8), generator=g)
    la, loss = model(a, a)
    finite = bool(torch.isfinite(la).all()) and math.isfinite(float(loss.detach()))
    return finite, finite and torch.equal(la, model(b))


@pytest.mark.parametrize("name", sorted(CASES))
def test_review_init_warns_exactly_when_the_model_shows_it(name):
    text, code = CASES[name]
    codes = {d.code for d in review(cyclelang.parse(text)) if d.code in ("W130", "W131")}
    assert codes == ({code} if code else set()), name
    finite, independent = _run(text)
    assert finite == (code != "W131"), name
    assert independent == (code == "W130"), name


def test_review_init_names_the_cut():
    text, _ = CASES["deepnorm alpha and beta 0"]
    (d,) = [d for d in review(cyclelang.parse(text, "cut.cycle")) if d.code == "W130"]
    assert d.severity == "warning" and d.span.line == 1 and "alpha=1e-50" in d.message and "beta=1e-50" in d.message
    text, _ = CASES["layernorm over one channel, eps 0"]
    (d,) = [d for d in review(cyclelang.parse(text)) if d.code == "W131"]
    assert "layernorm over 1 channel" in d.message and "NaN" in d.message


def test_review_init_float32_rounding():
    from cyclelang.review.rules import f32

    assert f32(1e-50) == 0 and f32(-1e-50) == 0 and f32(1e-44) > 0
    assert math.isinf(f32(1e39)) and f32(3e38) == pytest.approx(3e38, rel=1e-6)
