"""`import`, `export` and `diff` write over nothing they did not create.

An output that resolves to an input (by its path, through a symlink, or as a hard
link to the same inode) is refused; `export -o` into a folder that holds anything is
refused unless --force, which then removes the weight files that would contradict the
new ones (and says which); the two files of a checkpoint land together or not at all.
Each test is named after the defect it pins ("Hardening, round three").
"""

from __future__ import annotations

import errno
import os

import pytest
from click.testing import CliRunner

import cyclelang

from .conftest import ROOT, need

torch = need("torch")
need("safetensors")
from safetensors.torch import save_file  # noqa: E402

from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.cli import main  # noqa: E402
from cyclelang.interop import import_config  # noqa: E402

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 32}


@pytest.fixture()
def spec_and_weights(tmp_path):
    """A tiny llama spec and its compiled module's weights (what `cyclec build --weights` writes)."""
    text = import_config(LLAMA)
    spec = tmp_path / "s.cycle"
    spec.write_text(text)
    model = build(cyclelang.parse(text), seed=0)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    return spec, weights


def snapshot(folder):
    """Every entry under `folder`: relative path -> bytes (a folder: None; a symlink: its target)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = os.path.join(root, name)
            rel = os.path.relpath(p, folder)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = None
            else:
                with open(p, "rb") as f:
                    out[rel] = f.read()
    return out


def export(*args):
    return CliRunner().invoke(main, ["export", *map(str, args)])


def clean(res, codes):
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output[-3000:]
    assert res.exit_code in codes, f"exit {res.exit_code}\n{res.output[-2000:]}"


# --- 1. export over its own input weights --------------------------------------------------------


@pytest.mark.parametrize("how", ["same_path", "symlink", "hard_link"])
def test_export_over_its_own_input_weights_is_refused(tmp_path, spec_and_weights, how):
    spec, weights = spec_and_weights
    out = tmp_path / "ck"
    out.mkdir()
    given = out / "model.safetensors"
    if how == "same_path":
        os.replace(weights, given)
        weights = given
    elif how == "symlink":
        given.symlink_to(weights)
    else:
        os.link(weights, given)
    before = weights.read_bytes()
    for extra in ([], ["--force"]):
        res = export(spec, "--weights", given, "-o", out, *extra)
        clean(res, (2,))
        assert weights.read_bytes() == before and given.read_bytes() == before
        assert not (out / "config.json").exists()
    assert "input" in res.output and "model.safetensors" in res.output, res.output


def test_export_over_its_own_spec_is_refused(tmp_path, spec_and_weights):
    spec, weights = spec_and_weights
    out = tmp_path / "ck"
    out.mkdir()
    (out / "config.json").symlink_to(spec)
    before = spec.read_bytes()
    res = export(spec, "--weights", weights, "-o", out, "--force")
    clean(res, (2,))
    assert spec.read_bytes() == before and "input" in res.output


# --- 2. export into a folder holding another checkpoint ------------------------------------------


def another_checkpoint(folder):
    folder.mkdir()
    files = {"config.json": b'{"model_type": "gpt2"}', "model.safetensors.index.json": b'{"weight_map": {"a": "model-00001-of-00002.safetensors"}}',
             "model-00001-of-00002.safetensors": b"old shard 1", "model-00002-of-00002.safetensors": b"old shard 2",
             "pytorch_model.bin": b"old pickle", "tokenizer.json": b"{}", "tokenizer_config.json": b"{}"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def test_export_into_another_checkpoint_is_refused_without_force(tmp_path, spec_and_weights):
    spec, weights = spec_and_weights
    out = tmp_path / "ck"
    another_checkpoint(out)
    before = snapshot(out)
    res = export(spec, "--weights", weights, "-o", out)
    clean(res, (2,))
    assert "--force" in res.output and "not empty" in res.output, res.output
    assert snapshot(out) == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    res = export(spec, "--weights", weights, "-o", tmp_path / "other")
    clean(res, (2,))
    assert snapshot(tmp_path / "other") == {"notes.txt": b"mine"}


def test_export_force_removes_the_stale_index_and_shards_and_says_which(tmp_path, spec_and_weights):
    spec, weights = spec_and_weights
    out = tmp_path / "ck"
    another_checkpoint(out)
    res = export(spec, "--weights", weights, "-o", out, "--force")
    clean(res, (0,))
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for name in ("model.safetensors.index.json", "model-00001-of-00002.safetensors", "pytorch_model.bin"):
        assert name in res.output, res.output
    model = build(cyclelang.load(spec), seed=1)
    cyclelang.interop.load_transformers(model, out)  # the folder reads as the new checkpoint only


def test_export_into_an_empty_folder_needs_no_force(tmp_path, spec_and_weights):
    spec, weights = spec_and_weights
    (tmp_path / "ck").mkdir()
    res = export(spec, "--weights", weights, "-o", tmp_path / "ck")
    clean(res, (0,))
    assert sorted(os.listdir(tmp_path / "ck")) == ["config.json", "model.safetensors"]
    res = export(spec, "--weights", weights, "-o", tmp_path / "ck")  # now it holds a checkpoint: not again without --force
    clean(res, (2,))


# --- 3. a full disk between the two files --------------------------------------------------------


def fail_second(monkeypatch, name):
    real = getattr(os, name)
    calls = []

    def failing(*a, **k):
        calls.append(a)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(os, name, failing)
    return calls


@pytest.mark.parametrize("where,fails", [("fresh", "fsync"), ("empty", "fsync"), ("empty", "replace"),
                                         ("checkpoint", "fsync"), ("checkpoint", "replace")])
def test_export_on_a_full_disk_leaves_the_folder_as_it_was(tmp_path, spec_and_weights, monkeypatch, where, fails):
    spec, weights = spec_and_weights
    parent = tmp_path / "parent"
    parent.mkdir()
    out = parent / "ck"
    extra = []
    if where == "empty":
        out.mkdir()
    elif where == "checkpoint":
        another_checkpoint(out)
        (out / "model.safetensors").write_bytes(b"old weights")
        extra = ["--force"]
    before = snapshot(parent)
    calls = fail_second(monkeypatch, fails)
    res = export(spec, "--weights", weights, "-o", out, *extra)
    monkeypatch.undo()
    assert len(calls) >= 2, "the second write did not happen"
    clean(res, (3,))
    assert snapshot(parent) == before  # nothing new, nothing lost, no temporary left behind


# --- 4. diff --draw over an input spec -----------------------------------------------------------


@pytest.mark.parametrize("how", ["symlink", "hard_link", "other_name"])
@pytest.mark.parametrize("which", ["a", "b"])
def test_diff_draw_over_an_input_spec_is_refused(tmp_path, how, which):
    src = (ROOT / "specs" / "gpt2.cycle").read_text()
    (tmp_path / "a.cycle").write_text(src)
    (tmp_path / "b.cycle").write_text(src.replace("x 12", "x 11", 1))
    target = tmp_path / f"{which}.cycle"
    draw = tmp_path / "drawn.dot"
    if how == "symlink":
        draw.symlink_to(target)
    elif how == "hard_link":
        os.link(target, draw)
    else:  # the spec itself named .dot, reached by another spelling of its path
        os.replace(target, tmp_path / f"{which}.dot")
        target = tmp_path / f"{which}.dot"
        draw = tmp_path / "sub" / ".." / f"{which}.dot"
        (tmp_path / "sub").mkdir()
    before = snapshot(tmp_path)
    a = target if which == "a" else tmp_path / "a.cycle"
    b = target if which == "b" else tmp_path / "b.cycle"
    res = CliRunner().invoke(main, ["diff", str(a), str(b), "--draw", str(draw)])
    clean(res, (2,))
    assert "input" in res.output, res.output
    assert snapshot(tmp_path) == before


def test_diff_draw_to_a_new_file_still_works(tmp_path):
    spec = ROOT / "specs" / "gpt2.cycle"
    res = CliRunner().invoke(main, ["diff", str(spec), str(spec), "--draw", str(tmp_path / "d.dot")])
    clean(res, (0,))
    assert (tmp_path / "d.dot").read_text().startswith("digraph")


# --- the other commands of the kinds ------------------------------------------------------


def test_import_over_its_own_config_is_refused(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "link.cycle").symlink_to(tmp_path / "config.json")
    for out in (tmp_path / "config.json", tmp_path / "link.cycle", tmp_path / "sub" / ".." / "config.json"):
        res = CliRunner().invoke(main, ["import", str(tmp_path), "-o", str(out)])
        clean(res, (2,))
        assert json.loads((tmp_path / "config.json").read_text()) == LLAMA


def test_refuse_output_over_input_follows_links_and_inodes(tmp_path):
    from cyclelang.cli import UsageProblem, refuse_output_over_input

    (tmp_path / "in.cycle").write_text("x")
    (tmp_path / "sym").symlink_to(tmp_path / "in.cycle")
    os.link(tmp_path / "in.cycle", tmp_path / "hard")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dirlink").symlink_to(tmp_path / "dir")
    (tmp_path / "dir" / "f").write_text("y")
    cases = [(tmp_path / "in.cycle", tmp_path / "in.cycle"), (tmp_path / "sym", tmp_path / "in.cycle"), (tmp_path / "hard", tmp_path / "in.cycle"),
             (tmp_path / "in.cycle", tmp_path / "sym"), (tmp_path / "dirlink" / "f", tmp_path / "dir" / "f"),
             (tmp_path / "dir" / ".." / "in.cycle", tmp_path / "in.cycle")]
    for out, inp in cases:
        with pytest.raises(UsageProblem):
            refuse_output_over_input(str(out), [None, str(inp)])
    refuse_output_over_input(str(tmp_path / "new.svg"), [str(tmp_path / "in.cycle")])
    refuse_output_over_input("-", [str(tmp_path / "in.cycle")])
