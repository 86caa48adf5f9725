"""Training readings that cannot flatter (issue 17): flameouts, spikes from step 1, the
masked-token objective behind an open throat and its exact floor, start-sequence notes.

Each test here failed on the stand before: a diverging run exited 0 with "spikes: none",
a NaN ended the run silently, an open-throat engine was trained on next tokens it could
read off its own input, and a warmup longer than the run went unmentioned.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest

from .conftest import need

torch = need("torch")

import cyclelang  # noqa: E402
from cyclelang.stand.data import Markov  # noqa: E402
from cyclelang.stand.train import Objective, diverged, find_spikes, mask_positions  # noqa: E402

from .test_stand import invoke, one_thread  # noqa: E402,F401  (one_thread: an autouse fixture)


def spec(throat="causal", lr="3e-3", extra="", vocab=64):
    return f"""engine tiny {{
  chamber width=32
  throat {throat}
  feed tokens vocab={vocab} context=32 position=learned
  stage block x 2 {{
    prechamber mix {{ norm layernorm turbine attention heads=2 merge cooling }}
    prechamber burn {{ norm layernorm turbine mlp ratio=4 merge cooling }}
  }}
  norm layernorm
  nozzle head tied
  startup {{ schedule constant lr={lr} {extra} }}
}}
"""


def write(tmp_path, text, name="tiny.cycle"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# --- divergence and NaN: a flameout, from step 1, exit 1 -------------------------------------


def test_divergence_is_a_flameout_with_the_group_that_blew_up(tmp_path):
    path = write(tmp_path, spec(lr="10"))
    t = cyclelang.fire(path, seq=16, batch=4, train=30).runs[0].training
    f = t.flameout
    assert f is not None and f.step < 5 and t.done == f.step + 1  # the run stops at the flameout
    assert f.loss > t.loss[0] + 1 and "above the initial" in f.reason
    assert f.group is not None and f.update_ratio > 1  # an update larger than the weights themselves
    r = invoke(["fire", path, "--seq", "16", "--train", "30", "--json", str(tmp_path / "o.json")])
    assert r.exit_code == 1
    assert "FLAMEOUT at step" in r.output and f.group in r.output
    assert json.loads((tmp_path / "o.json").read_text())["runs"][0]["training"]["flameout"]["group"] == f.group


def test_a_nan_is_a_flameout_and_says_why(tmp_path):
    """A NaN mid-run (made in the feed's output at the 4th forward pass) stops the run at
    that step, named, with the group of the update before it."""
    import cyclelang.stand.run as run_mod

    calls = {"n": 0}

    def poison(mod, args, out):
        calls["n"] += mod.training  # training passes only (the static fire runs in eval mode)
        return out * float("nan") if mod.training and calls["n"] >= 4 else out

    from cyclelang.backends.torch import build as build_mod

    real_build = build_mod.build

    def build(s, seed=0, **kw):
        m = real_build(s, seed=seed, **kw)
        m.feed.register_forward_hook(poison)
        return m

    mp = pytest.MonkeyPatch()
    mp.setattr(build_mod, "build", build)
    try:
        t = run_mod.fire(cyclelang.load(write(tmp_path, spec())), seq=16, batch=4, train=20).runs[0].training
    finally:
        mp.undo()
    assert t.flameout is not None and math.isnan(t.flameout.loss) and t.flameout.reason == "the loss is NaN"
    assert t.flameout.step == 3 and t.done == 4 and t.flameout.group is not None


def test_divergence_line():
    assert diverged(5.0, 5.0) is None and diverged(5.9, 5.0) is None  # within 1 nat
    assert diverged(6.1, 5.0) is not None and diverged(float("inf"), 5.0) == "the loss is infinite"
    assert diverged(11.5, 10.0) is None and diverged(12.1, 10.0) is not None  # 20% of a large initial loss


def test_a_healthy_run_has_no_flameout_and_prints_floor_and_objective(tmp_path):
    path = write(tmp_path, spec())
    r = invoke(["fire", path, "--seq", "16", "--train", "20"])
    assert r.exit_code == 0, r.output
    assert "objective next-token" in r.output and "floor 1.723 nats/token" in r.output and "FLAMEOUT" not in r.output
    text = tmp_path / "t.txt"
    text.write_text("the turbine spins. " * 40)
    r = invoke(["fire", path, "--seq", "16", "--train", "3", "--data", str(text)])
    assert r.exit_code == 1 and "vocab" in r.output  # 64 tokens cannot hold bytes
    r = invoke(["fire", write(tmp_path, spec(vocab=300), "big.cycle"), "--seq", "16", "--train", "3", "--data", str(text)])
    assert r.exit_code == 0 and "floor unknown" in r.output


# --- spikes: a robust running baseline from the first steps ---------------------------------


def test_spikes_are_seen_from_the_first_steps():
    losses = [4.0, 3.9, 3.85, 3.8, 6.0, 3.75, 3.7]
    (s,) = find_spikes(losses)
    assert s.step == 4 and math.isclose(s.baseline, 3.875) and math.isclose(s.size, 6.0 - 3.875)
    # a fast fall is not a spike; a jump after a plateau is measured against the plateau
    falling = [10.0 * 0.8 ** i for i in range(40)]
    assert find_spikes(falling) == []
    plateau = [2.0] * 10 + [3.0] * 5 + [2.0] * 5
    (s,) = find_spikes(plateau)
    assert s.step == 10 and s.baseline == 2.0  # the baseline kept the level before the jump
    assert find_spikes([2.0] * 5 + [float("nan")])[0].size == math.inf


# --- the open throat: masked tokens, and that objective's own floor --------------------------


def test_masked_floor_equals_enumeration():
    """The forward-backward posterior against brute force over every hidden assignment."""
    m = Markov(alphabet=3, seed=4, concentration=0.5)
    gen = torch.Generator().manual_seed(0)
    tokens = m.batch(6, 5, gen)[:, :-1]
    masked = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 0, 0, 1], [1, 1, 1, 1, 1], [0, 0, 1, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 0, 1]], dtype=torch.bool)
    post = m.posterior(tokens, masked)
    P, pi = m.P, m.pi
    for b in range(6):
        hidden = [t for t in range(5) if masked[b, t]]
        joint = {}
        for vals in itertools.product(range(3), repeat=len(hidden)):
            x = tokens[b].tolist()
            for t, v in zip(hidden, vals):
                x[t] = v
            p = float(pi[x[0]]) * math.prod(float(P[x[t - 1], x[t]]) for t in range(1, 5))
            joint[vals] = p
        z = sum(joint.values())
        for j, t in enumerate(hidden):
            for k in range(3):
                want = sum(p for vals, p in joint.items() if vals[j] == k) / z
                assert math.isclose(float(post[b, t, k]), want, rel_tol=1e-9, abs_tol=1e-12)


def test_open_throat_trains_on_masked_tokens_above_its_floor(tmp_path):
    path = write(tmp_path, spec(throat="open", lr="1e-2"))
    t = cyclelang.fire(path, seq=16, batch=8, train=60).runs[0].training
    assert t.objective.startswith("masked-token") and t.flameout is None
    # the floor is that objective's: below the next-token entropy rate (both neighbours are seen),
    # above zero; the engine ends above it (it cannot read the answer off its input)
    rate = Markov(31, seed=0).entropy_rate
    assert 0.3 < t.floor < rate and t.final_loss > t.floor
    # what the engine is given: every scored position is the mask token in its input
    obj = Objective(mask=31)
    tokens = Markov(31, seed=0).batch(8, 16, torch.Generator().manual_seed(1))
    idx, targets = obj.inputs(tokens, torch.Generator().manual_seed(2))
    scored = targets != -1
    assert scored.any(dim=1).all() and (idx[scored] == 31).all() and (targets[scored] == tokens[:, :-1][scored]).all()
    assert (idx[~scored] == tokens[:, :-1][~scored]).all()
    # an engine with no room for a mask token is refused, with the reason
    r = invoke(["fire", write(tmp_path, spec(throat="open", vocab=2), "two.cycle"), "--seq", "8", "--train", "3"])
    assert r.exit_code == 1 and "mask token" in r.output


def test_mask_sampler_rate_and_determinism():
    a = mask_positions((400, 64), 0.15, torch.Generator().manual_seed(3))
    b = mask_positions((400, 64), 0.15, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.any(dim=1).all()
    assert abs(float(a.double().mean()) - (0.15 + 0.85 / 64)) < 0.01


# --- a start sequence longer than the run ----------------------------------------------------


def test_warmup_or_schedule_longer_than_the_run_is_noted(tmp_path):
    t = cyclelang.fire(write(tmp_path, spec(extra="warmup 2000")), seq=8, batch=2, train=5).runs[0].training
    (note,) = t.notes
    assert "warmup of 2000 steps outlasts --train 5" in note and "ends at 7.5e-06, 0.2% of its peak" in note
    r = invoke(["fire", write(tmp_path, spec(lr="3e-3 ", extra="").replace("constant lr=3e-3", "cosine lr=3e-3 steps=1000"), "cos.cycle"),
                "--seq", "8", "--batch", "2", "--train", "5"])
    assert r.exit_code == 0 and "note: the cosine schedule runs to step 1000, past --train 5" in r.output
    assert cyclelang.fire(write(tmp_path, spec(), "plain.cycle"), seq=8, batch=2, train=5).runs[0].training.notes == []
