"""Loading weights: safetensors only, every name and shape checked before anything is copied."""

from __future__ import annotations

import pytest

from .conftest import need

torch = need("torch")
need("safetensors")

from click.testing import CliRunner  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import cyclelang  # noqa: E402
from cyclelang.backends.torch.build import WeightsError, load_weights  # noqa: E402
from cyclelang.cli import main  # noqa: E402

SPEC = """
engine tiny {
  chamber width=32
  feed tokens vocab=50 context=16
  stage block x 2 {
    prechamber mix { norm layernorm  turbine attention heads=4  merge cooling }
    prechamber burn { norm layernorm  turbine mlp ratio=2  merge cooling }
  }
  norm layernorm
  nozzle head
}
"""


@pytest.fixture
def saved(tmp_path):
    spec = tmp_path / "tiny.cycle"
    spec.write_text(SPEC)
    weights = tmp_path / "tiny.safetensors"
    r = CliRunner().invoke(main, ["build", str(spec), "-o", str(tmp_path / "tiny.py"), "--weights", str(weights), "--seed", "3"])
    assert r.exit_code == 0, r.stderr
    return spec, weights


def test_build_weights_round_trip(saved):
    spec, weights = saved
    model = cyclelang.build(str(spec), seed=99, weights=weights)
    reference = cyclelang.build(str(spec), seed=3)
    for (k, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), k


def _resave(weights, edit):
    from safetensors.torch import load_file

    state = load_file(str(weights))
    edit(state)
    save_file(state, str(weights))


@pytest.mark.parametrize(
    "edit, key, words",
    [
        (lambda s: s.pop("head.weight"), "head.weight", "missing"),
        (lambda s: s.__setitem__("stages.9.mix.norm.weight", torch.zeros(32)), "stages.9.mix.norm.weight", "not in this engine"),
        (lambda s: s.__setitem__("feed.tok.weight", torch.zeros(51, 32)), "feed.tok.weight", "shape (51, 32)"),
        (lambda s: s.__setitem__("norm.bias", torch.zeros(32, dtype=torch.float64)), "norm.bias", "dtype"),
    ],
    ids=["missing", "unexpected", "shape", "dtype"],
)
def test_mismatches_name_the_first_key_and_change_nothing(saved, edit, key, words):
    spec, weights = saved
    _resave(weights, edit)
    model = cyclelang.build(str(spec), seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(WeightsError) as info:
        load_weights(model, weights)
    assert info.value.key == key and words in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_pickles_are_refused_without_being_opened(saved, tmp_path):
    spec, _ = saved
    evil = tmp_path / "model.pt"
    evil.write_bytes(b"not even opened")
    with pytest.raises(WeightsError, match="safetensors files only"):
        load_weights(cyclelang.build(str(spec), seed=0), evil)


def test_garbage_is_a_clear_error(saved, tmp_path):
    spec, _ = saved
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 7)
    with pytest.raises(WeightsError, match="cannot read it as safetensors"):
        load_weights(cyclelang.build(str(spec), seed=0), junk)
