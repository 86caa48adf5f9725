"""`cyclec train`, hardening round three: each test is named after the defect it holds fixed.

d1  optional packages are checked before anything is created; a run that fails before its
    first checkpoint leaves no folder behind; a folder without a checkpoint says what to do
d2  the documented first run is small; Ctrl-C is acknowledged at once, then a checkpoint
d3  a header (spec, parameters, tokens, devices) and a closing line (losses, run folder)
d4  checkpoints carry sha256 digests that resume verifies; LATEST stays inside the run folder
d5  a damaged run folder is a diagnostic (or a correct resume from an intact checkpoint),
    never an internal error: a bounded, fixed-seed fuzz of damage
d6  --tokenizer streams a file in bounded pieces; bad UTF-8 anywhere is a diagnostic with its
    byte offset, and the token folder is written whole or not at all
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import cyclelang
from cyclelang.cli import main
from cyclelang.diagnostics import CycleError
from cyclelang.training import checkpoint, data
from cyclelang.training.loop import Settings, run

from .conftest import ROOT
from .test_train import checkpoint_weights, corpus_file, env, fast, steady, tiny  # noqa: F401  (corpus_file: a fixture)


def cli(*args):
    """`cyclec ARGS` in this process: (exit code, stderr)."""
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stderr


def small_run_args(spec, corpus, *more):
    return ["train", spec, "--data", corpus, "--steps", "4", "--seq", "16", "--micro-batch", "2", "--eval-every", "0",
            "--eval-batches", "2", "--ckpt-every", "2", "--no-progress", *more]


# --- d1: optional packages, checked before anything is created --------------------------------


@pytest.mark.parametrize("module, extra", [("tqdm", ["--progress"]), ("matplotlib", []), ("safetensors", []),
                                           ("tokenizers", ["--tokenizer", "TOKENIZER"])])
def test_d1_a_missing_optional_package_is_a_usage_error_before_anything_is_created(tmp_path, corpus_file, monkeypatch, module, extra):
    tok = tmp_path / "tokenizer.json"
    tok.write_text("{}")
    monkeypatch.setitem(sys.modules, module, None)  # `import MODULE` now fails as if it were not installed
    args = small_run_args(tiny(tmp_path), corpus_file, "--out", tmp_path / "run", *[str(tok) if a == "TOKENIZER" else a for a in extra])
    code, err = cli(*args)
    assert code == 2, err
    assert f"'{module}'" in err and "pip install 'cyclelang[train]'" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_d1_a_new_run_that_fails_before_its_first_checkpoint_leaves_no_folder(tmp_path, corpus_file):
    spec = tiny(tmp_path)

    def fail(step):
        raise RuntimeError("the machine went away")

    with pytest.raises(RuntimeError):
        run(cyclelang.load(spec), fast(data=[str(corpus_file)], ckpt_every=0), tmp_path / "run", spec_text="", on_step=fail)
    assert not (tmp_path / "run").exists()  # nothing to resume, so nothing that blocks the rerun
    r = run(cyclelang.load(spec), fast(data=[str(corpus_file)], steps=2), tmp_path / "run", spec_text="")
    assert r.step == 2


def test_d1_a_run_folder_without_a_checkpoint_says_to_remove_it(tmp_path, corpus_file):
    spec = tiny(tmp_path)
    run(cyclelang.load(spec), fast(data=[str(corpus_file)], steps=2), tmp_path / "run", spec_text=spec.read_text())
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    (tmp_path / "run" / "LATEST").unlink()
    code, err = cli(*small_run_args(spec, corpus_file, "--out", tmp_path / "run"))
    assert code == 1 and "error[E0509]" in err and f"rm -r {tmp_path / 'run'}" in err, err
    code, err = cli("train", "--resume", tmp_path / "run", "--no-progress")
    assert code == 1 and "error[E0509]" in err and f"rm -r {tmp_path / 'run'}" in err, err


def test_d1_the_readme_lists_every_extra():
    toml = (ROOT / "pyproject.toml").read_text("utf-8")
    table = toml[toml.index("[project.optional-dependencies]"):]
    table = table[: table.index("\n[", 1)]
    extras = re.findall(r"^(\w+) = \[", table, re.M)  # (tomllib is 3.11's; the project runs on 3.10)
    assert {"torch", "train", "test"} <= set(extras)
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme[readme.index("### Extras"):]
    section = section[: section.index("\n#", 1)]
    for name in extras:
        assert f"`{name}`" in section, name


# --- d2: a first run that fits a laptop; Ctrl-C acknowledged at once ---------------------------


def test_d2_the_documented_first_run_is_a_small_spec():
    doc = (ROOT / "docs" / "training.md").read_text("utf-8")
    first = re.search(r"```sh\n(.*?)```", doc, re.S).group(1)
    spec = re.search(r"cyclec train (\S+\.cycle)", first).group(1)
    assert spec != "specs/gpt2.cycle"
    model = cyclelang.build(ROOT / spec)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # a laptop's CPU trains it in minutes
    assert cli("check", ROOT / spec)[0] == 0 and cli("fmt", "--check", ROOT / spec)[0] == 0
    assert "specs/gpt2.cycle" in doc[doc.index(first) + len(first):doc.index("### Other data")]  # what to run on a GPU instead


def test_d2_the_first_ctrl_c_is_acknowledged_at_once_and_a_second_stops_now(tmp_path, corpus_file, capfd):
    spec = tiny(tmp_path)
    seen = {}

    def interrupt(step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            seen["at once"] = capfd.readouterr().err  # the handler has run: what it wrote is there before step 3

    r = run(cyclelang.load(spec), fast(data=[str(corpus_file)], ckpt_every=0), tmp_path / "run", spec_text="", on_step=interrupt)
    assert "Ctrl-C" in seen["at once"] and "after step 2" in seen["at once"] and "again" in seen["at once"], seen
    assert r.interrupted and r.step == 2 and checkpoint.latest(tmp_path / "run").name == "step-000002"
    assert f"continue with --resume {tmp_path / 'run'}" in capfd.readouterr().err

    def twice(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        run(cyclelang.load(spec), fast(data=[str(corpus_file)], ckpt_every=2), tmp_path / "run2", spec_text="", on_step=twice)
    assert checkpoint.latest(tmp_path / "run2").name == "step-000002"  # the last checkpoint stays


@pytest.mark.slow  # a cyclec process (about 5 s)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_d2_a_signal_to_a_training_process_is_acknowledged_and_checkpointed(tmp_path, sig, code):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "cyclelang", "train", "specs/train/tiny_gpt.cycle", "--data", "docs/language.md",
                             "--out", str(out), "--steps", "500", "--seq", "64", "--micro-batch", "2", "--eval-every", "0",
                             "--ckpt-every", "0", "--no-progress"], env=env(), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == code, err
    assert "stopping after step" in err and "Traceback" not in err
    ck = checkpoint.latest(out)
    assert ck is not None and f"checkpoint {ck.name}" in err


# --- d3: a header and a closing line -----------------------------------------------------------


def test_d3_train_prints_a_header_and_a_closing_line(tmp_path, corpus_file):
    spec = tiny(tmp_path)
    code, err = cli(*small_run_args(spec, corpus_file, "--out", tmp_path / "run"))
    assert code == 0, err
    params = sum(p.numel() for p in cyclelang.build(spec).parameters())
    tokens = data.load([str(corpus_file)], 256).total
    header, tail = err.split("\nstep ")[0], err.strip().splitlines()[-1]
    first = header.splitlines()[0]
    assert first.startswith("cyclec train: ") and str(spec) in first and "tiny" in first and f"{params:,} parameters" in first, err
    assert f"{tokens:,} tokens" in header and "cpu" in header, header
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [x for x in recs if "loss" in x][-1]
    val = [x for x in recs if "val_loss" in x][-1]
    assert "done: step 4/4" in tail and f"train loss {last['loss']:.4f}" in tail and f"held-out {val['val_loss']:.4f}" in tail, tail
    assert str(tmp_path / "run") in tail and "step-000004" in tail


# --- d4: digests and LATEST --------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A 4-step run with checkpoints at 2 and 4, and the same run taken to 6 steps uninterrupted."""
    root = tmp_path_factory.mktemp("base")
    spec = tiny(root)
    corpus = root / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text("utf-8")[:30000], "utf-8")
    s = dict(data=[str(corpus)], steps=4, seq=16, micro_batch=2, eval_every=0, eval_batches=2, ckpt_every=2)
    run(cyclelang.load(spec), Settings(**s), root / "run", spec_text=spec.read_text())
    whole = run(cyclelang.load(spec), Settings(**{**s, "steps": 6}), root / "whole", spec_text=spec.read_text())
    return {"spec": spec, "run": root / "run", "whole": whole, "weights": checkpoint_weights(root / "whole")}


def copy_run(base_run, tmp_path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(base_run["run"], d, symlinks=True)
    return d


def resumed_correctly(base_run, d) -> bool:
    w = checkpoint_weights(d)
    return w.keys() == base_run["weights"].keys() and all(torch.equal(w[k], base_run["weights"][k]) for k in w)


def test_d4_checkpoints_carry_a_sha256_manifest(base_run):
    ck = base_run["run"] / "checkpoints" / "step-000004"
    manifest = json.loads((ck / "manifest.json").read_text())
    files = sorted(p.relative_to(ck).as_posix() for p in ck.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert sorted(manifest["files"]) == files and {"model.safetensors", "state.safetensors", "state.json"} <= set(files)
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == hashlib.sha256((ck / name).read_bytes()).hexdigest() and entry["bytes"] == (ck / name).stat().st_size


@pytest.mark.parametrize("latest", ["ABSOLUTE", "../../outside/step-000004", "../outside", "step-000004/../../../outside/step-000004"])
def test_d4_latest_pointing_outside_the_run_folder_is_not_followed(base_run, tmp_path, latest):
    d = copy_run(base_run, tmp_path)
    evil = tmp_path / "outside" / "step-000004"
    shutil.copytree(d / "checkpoints" / "step-000004", evil)
    from safetensors.torch import load_file, save_file

    w = load_file(evil / "model.safetensors")
    save_file({k: torch.zeros_like(v) for k, v in w.items()}, evil / "model.safetensors")  # weights nobody trained
    (d / "LATEST").write_text((str(evil) if latest == "ABSOLUTE" else latest) + "\n")
    assert checkpoint.weights(d) == d / "checkpoints" / "step-000004" / "model.safetensors"
    code, err = cli("train", "--resume", d, "--steps", "6", "--no-progress")
    assert code == 0, err
    assert "LATEST" in err and "ignored" in err and resumed_correctly(base_run, d), err


def flip(path: Path, at: float = 0.7) -> None:
    b = bytearray(path.read_bytes())
    b[int(len(b) * at)] ^= 0x40
    path.write_bytes(bytes(b))


def test_d4_a_flipped_byte_in_the_newest_checkpoint_falls_back_to_the_older_one(base_run, tmp_path):
    d = copy_run(base_run, tmp_path)
    flip(d / "checkpoints" / "step-000004" / "model.safetensors")
    assert checkpoint.weights(d) == d / "checkpoints" / "step-000002" / "model.safetensors"
    code, err = cli("train", "--resume", d, "--steps", "6", "--no-progress")
    assert code == 0, err
    assert "step-000004 is damaged" in err and "model.safetensors does not match" in err and "resuming from step-000002" in err, err
    assert resumed_correctly(base_run, d)


def test_d4_when_no_checkpoint_is_intact_resume_is_refused(base_run, tmp_path):
    d = copy_run(base_run, tmp_path)
    flip(d / "checkpoints" / "step-000004" / "model.safetensors")
    flip(d / "checkpoints" / "step-000002" / "state.safetensors")
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    code, err = cli("train", "--resume", d, "--steps", "6", "--no-progress")
    assert code == 1 and "error[E0509]" in err and "no intact checkpoint" in err, err
    assert "step-000004" in err and "step-000002" in err and "state.safetensors" in err
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before  # refused: nothing written
    assert checkpoint.latest(d) is None
    assert checkpoint.weights(d) == d / "checkpoints" / "step-000002" / "model.safetensors"  # its weights are intact: fire may read them


# --- d5: damaged run folders, fuzzed -----------------------------------------------------------


def _files(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def _rewrite_manifest(ck: Path) -> None:
    """Make a checkpoint's manifest agree with its (damaged) files: damage the digests cannot see."""
    m = json.loads((ck / "manifest.json").read_text())
    for name in m["files"]:
        b = (ck / name).read_bytes()
        m["files"][name] = {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)}
    (ck / "manifest.json").write_text(json.dumps(m))


def _damage_cases() -> list[tuple[str, object]]:
    rng = random.Random(20261201)
    names = ["spec.cycle", "model.py", "engine.json", "run.json", "metrics.jsonl", "curves.png", "LATEST",
             *[f"checkpoints/step-{s:06d}/{f}" for s in (2, 4) for f in ("model.safetensors", "state.safetensors", "state.json",
                                                                        "manifest.json")]]
    cases: list[tuple[str, object]] = []
    for name in names:
        at = rng.random()
        cases.append((f"truncate-half:{name}", lambda d, n=name: (d / n).write_bytes((d / n).read_bytes()[: len((d / n).read_bytes()) // 2])))
        cases.append((f"flip:{name}", lambda d, n=name, at=at: flip(d / n, at)))
        cases.append((f"delete:{name}", lambda d, n=name: (d / n).unlink()))
    for name in ("engine.json", "run.json", "checkpoints/step-000004/state.json"):
        cases.append((f"bad-json:{name}", lambda d, n=name: (d / n).write_text("{\"step\": 4, ")))
    cases += [
        ("truncate-empty:run.json", lambda d: (d / "run.json").write_text("")),
        ("run.json-wrong-types", lambda d: (d / "run.json").write_text(json.dumps({**json.loads((d / "run.json").read_text()),
                                                                                   "steps": "six", "bin_dtype": "float7"}))),
        ("run.json-a-list", lambda d: (d / "run.json").write_text("[1, 2]")),
        ("engine.json-a-number", lambda d: (d / "engine.json").write_text("7")),
        ("metrics-partial-last-line", lambda d: (d / "metrics.jsonl").write_text((d / "metrics.jsonl").read_text() + '{"step": 5, "lo')),
        ("metrics-garbage-lines", lambda d: (d / "metrics.jsonl").write_bytes(b'[]\n7\n{"step": "x"}\n\xff\xfe\n' + (d / "metrics.jsonl").read_bytes())),
        ("metrics-is-a-folder", lambda d: ((d / "metrics.jsonl").unlink(), (d / "metrics.jsonl").mkdir())),
        ("LATEST-empty", lambda d: (d / "LATEST").write_text("")),
        ("LATEST-garbage", lambda d: (d / "LATEST").write_bytes(b"\x00\xff\xfe garbage \n\n")),
        ("LATEST-absolute", lambda d: (d / "LATEST").write_text(str(d / "checkpoints" / "step-000004"))),
        ("LATEST-dotdot", lambda d: (d / "LATEST").write_text("../checkpoints/step-000004")),
        ("LATEST-missing-step", lambda d: (d / "LATEST").write_text("step-000099\n")),
        ("LATEST-symlink-loop", lambda d: ((d / "LATEST").unlink(), os.symlink("LATEST", d / "LATEST"))),
        ("LATEST-a-folder", lambda d: ((d / "LATEST").unlink(), (d / "LATEST").mkdir())),
        ("checkpoint-replaced-by-a-file", lambda d: (shutil.rmtree(d / "checkpoints" / "step-000004"),
                                                     (d / "checkpoints" / "step-000004").write_text("x"))),
        ("checkpoint-a-symlink-outside", lambda d: (shutil.move(d / "checkpoints" / "step-000004", d.parent / "moved"),
                                                    os.symlink(d.parent / "moved", d / "checkpoints" / "step-000004"))),
        ("checkpoints-replaced-by-a-file", lambda d: (shutil.rmtree(d / "checkpoints"), (d / "checkpoints").write_text("x"))),
        ("checkpoints-empty", lambda d: [shutil.rmtree(p) for p in (d / "checkpoints").iterdir()]),
        ("both-checkpoints-flipped", lambda d: (flip(d / "checkpoints/step-000004/model.safetensors"),
                                                flip(d / "checkpoints/step-000002/model.safetensors"))),
        ("state.json-consistent-garbage", lambda d: ((d / "checkpoints/step-000004/state.json").write_text('{"step": "four"}'),
                                                     _rewrite_manifest(d / "checkpoints/step-000004"))),
        ("state.json-consistent-other-step", lambda d: ((d / "checkpoints/step-000004/state.json").write_text(
            (d / "checkpoints/step-000004/state.json").read_text().replace('"step": 4', '"step": 3')),
            _rewrite_manifest(d / "checkpoints/step-000004"))),
        ("state.safetensors-consistent-empty", lambda d: (_write_empty_safetensors(d / "checkpoints/step-000004/state.safetensors"),
                                                          _rewrite_manifest(d / "checkpoints/step-000004"))),
        ("manifest-lists-an-escaping-file", lambda d: _manifest_escape(d / "checkpoints/step-000004")),
    ]
    return cases


def _write_empty_safetensors(path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"nothing": torch.zeros(1)}, path)


def _manifest_escape(ck: Path) -> None:
    m = json.loads((ck / "manifest.json").read_text())
    m["files"]["../../run.json"] = {"sha256": "0" * 64, "bytes": 1}
    (ck / "manifest.json").write_text(json.dumps(m))


CASES = _damage_cases()


@pytest.mark.slow  # 71 resumes in this process (about a minute); test_d5_a_sample_of_damage is the fast tier's share
@pytest.mark.parametrize("name, damage", CASES, ids=[c[0] for c in CASES])
def test_d5_every_damaged_run_folder_is_a_diagnostic_or_a_correct_resume(base_run, tmp_path, name, damage):
    _check_damage(base_run, tmp_path, damage)


FAST_SAMPLE = {"flip:checkpoints/step-000004/model.safetensors", "bad-json:run.json", "metrics-partial-last-line",
               "LATEST-symlink-loop", "checkpoints-replaced-by-a-file", "state.json-consistent-garbage", "bad-json:engine.json"}


@pytest.mark.parametrize("name, damage", [c for c in CASES if c[0] in FAST_SAMPLE], ids=sorted(FAST_SAMPLE, key=[c[0] for c in CASES].index))
def test_d5_a_sample_of_damage(base_run, tmp_path, name, damage):
    _check_damage(base_run, tmp_path, damage)


def _check_damage(base_run, tmp_path, damage):
    d = copy_run(base_run, tmp_path)
    damage(d)
    r = CliRunner().invoke(main, ["train", "--resume", str(d), "--steps", "6", "--no-progress"])
    err = r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in err and r.exit_code != 123, err
    if r.exit_code == 0:
        assert resumed_correctly(base_run, d), err
    else:
        assert r.exit_code in (1, 2, 3) and ("error[E" in err or err.startswith("cyclec")), err


def test_d5_a_partial_last_line_in_metrics_is_skipped_with_a_warning(base_run, tmp_path):
    d = copy_run(base_run, tmp_path)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 2.')  # a run killed mid-write
    code, err = cli("train", "--plot", d, "-o", tmp_path / "c.png")
    assert code == 0 and "metrics.jsonl:" in err and "skipped" in err, err
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    code, err = cli("train", "--resume", d, "--steps", "6", "--no-progress")
    assert code == 0 and "skipped" in err, err
    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert steady(train) == steady(r for r in json.loads(json.dumps(base_run["whole"].metrics)) if "loss" in r)


# --- d6: the tokenizer's pieces, bad UTF-8, the token folder ------------------------------------


def _bpe(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([(ROOT / "README.md").read_text("utf-8")], trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return tok, path


def test_d6_a_file_without_newlines_is_encoded_in_bounded_pieces(tmp_path, monkeypatch):
    tok, path = _bpe(tmp_path)
    text = " ".join((ROOT / "README.md").read_text("utf-8").split())[:20000] + " ünïcødé ✓ 漢字漢字漢字 end"  # one line
    src = tmp_path / "one_line.txt"
    src.write_text(text, "utf-8")
    assert b"\n" not in src.read_bytes()
    sizes = []
    real = data.load_tokenizer

    def spy(p):
        t = real(p)
        inner = t.encode
        t.encode = lambda texts: (sizes.extend(len(x.encode("utf-8")) for x in texts), inner(texts))[1]
        return t

    monkeypatch.setattr(data, "load_tokenizer", spy)
    c = data.load([str(src)], 300, tokenizer=str(path), cache=tmp_path / "run" / "tokens", holdout=0.1, text_block=256)
    assert len(sizes) > 40 and max(sizes) <= 2 * 256, (len(sizes), max(sizes))
    assert c.total == len(tok.encode(text).ids)  # cut where the pre-tokenizer cuts: the same ids as the whole line
    assert list(c.read(0, c.total)) == tok.encode(text).ids
    src.write_text(text + " " + "漢字" * 200 + "\u00e9" * 100 + " tail", "utf-8")  # runs with no space: cut between characters
    with open(src, "rb") as f:
        pieces = list(data.text_pieces(f, 100))
    assert b"".join(p for _, p in pieces) == src.read_bytes() and all(len(p) <= 200 for _, p in pieces)
    assert [o for o, _ in pieces] == [sum(len(p) for _, p in pieces[:i]) for i in range(len(pieces))]
    for _, p in pieces:
        p.decode("utf-8")  # never a character cut in two


def test_d6_invalid_utf8_past_the_sniff_is_a_diagnostic_with_its_offset_and_leaves_no_tokens(tmp_path, corpus_file):
    _, path = _bpe(tmp_path)
    good = ((ROOT / "README.md").read_text("utf-8") * 8).encode("utf-8")[: 70_000]
    good = good[: good.rfind(b"\n") + 1]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(good + b"caf\xe9 au lait\n" + b"more text\n" * 10)
    offset = len(good) + 3
    assert offset > data.SNIFF
    with pytest.raises(CycleError) as e:
        data.load([str(bad)], 300, tokenizer=str(path), cache=tmp_path / "cache" / "tokens", text_block=4096)
    d = e.value.diagnostics[0]
    assert d.code == "E0503" and f"byte {offset}" in d.message and str(bad) in d.message
    assert not (tmp_path / "cache").exists()
    spec = tiny(tmp_path, vocab=300)
    code, err = cli(*small_run_args(spec, bad, "--out", tmp_path / "run", "--tokenizer", path))
    assert code == 1 and f"byte {offset}" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()  # the retry is not refused
    bad.write_bytes(good + b"cafe au lait\n" + b"more text\n" * 10)
    code, err = cli(*small_run_args(spec, bad, "--out", tmp_path / "run", "--tokenizer", path))
    assert code == 0, err
    assert [p.suffix for p in (tmp_path / "run" / "tokens").iterdir() if not p.name.endswith(".sha256")] == [".uint16"]


def test_skipped_binary_data_files_are_listed(tmp_path, corpus_file):
    """docs/training.md: a folder's empty or binary files are skipped and listed (the header said only how many)."""
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(corpus_file, folder / "a.txt")
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    (folder / "empty.txt").write_text("")
    code, err = cli(*small_run_args(tiny(tmp_path), folder, "--out", tmp_path / "run"))
    assert code == 0, err
    line = next(ln for ln in err.splitlines() if ln.strip().startswith("skipped:"))
    assert "logo.png (not text)" in line and "empty.txt (empty)" in line, err
