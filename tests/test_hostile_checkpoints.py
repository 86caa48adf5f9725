"""Hostile checkpoints, weights and config.json files end in diagnostics, never a crash or a hang.

`cyclec import` and `cyclec export` answer every crafted input with a diagnostic and a
non-zero exit other than 123 (no traceback); `cyclelang.interop.load_transformers`
raises InteropError. What could block (a FIFO) or read forever (/dev/zero) runs in a
child process under a memory limit, so a regression fails the test instead of hanging
or exhausting the machine. The fuzz tests are bounded and seeded: the same cases every
run. Each test is named after the defect it pins ("Hardening, round three").
"""

from __future__ import annotations

import json
import os
import random
import re
import struct
import subprocess
import sys

import pytest
from click.testing import CliRunner

import cyclelang

from .conftest import ROOT, need

torch = need("torch")
need("safetensors")
from safetensors.torch import save as st_save, save_file  # noqa: E402

from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.cli import main  # noqa: E402
from cyclelang.interop import FAMILIES, InteropError, import_config, load_transformers  # noqa: E402

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32}


def clean(res, codes=(1, 2)) -> None:
    """A diagnostic: one of `codes`, no traceback, and something said on stderr."""
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output[-3000:]
    assert res.exit_code in codes, f"exit {res.exit_code}\n{res.output[-2000:]}"
    if res.exit_code:
        assert res.output.strip(), "refused without a word"


def child(args, cwd, timeout=60):
    """`cyclec ARGS` in a child process with at most 4 GiB of address space: a hang or a
    runaway read fails the test (TimeoutExpired, or a non-diagnostic exit)."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
            "from cyclelang.cli import main; main(sys.argv[1:], prog_name='cyclec')")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama: its spec file, the compiled module's weights file, and a valid transformers checkpoint folder."""
    from cyclelang.interop.load import export_state_dict

    root = tmp_path_factory.mktemp("tiny")
    text = import_config(LLAMA)
    (root / "s.cycle").write_text(text)
    spec = cyclelang.parse(text)
    model = build(spec, seed=0)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(root / "w.safetensors"))
    hf = export_state_dict(state, spec, "llama")
    ck = root / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps(LLAMA))
    save_file({k: v.contiguous() for k, v in hf.items()}, str(ck / "model.safetensors"))
    load_transformers(build(spec, seed=1), ck)  # the valid one loads
    return {"root": root, "spec": spec, "state": state, "hf": hf}


# --- safetensors files, crafted and mutated -------------------------------------------------------


def raw(header, data: bytes = b"", n: int | None = None) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def hostile_safetensors(state: dict) -> dict[str, bytes]:
    """Named malformed or unfitting safetensors files, for a module whose state dict is `state`."""
    good = st_save(state)
    one = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    f4 = b"\0" * 4
    cases = {
        "empty": b"",
        "three_bytes": b"\x01\x02\x03",
        "header_length_2_63": raw(b"{}", n=2 ** 63),
        "header_length_past_the_end": raw(b"{}", n=1000),
        "header_length_zero": raw(b"", n=0),
        "header_not_json": raw(b"not json at all"),
        "header_json_list": raw(b"[1, 2, 3]"),
        "header_json_string": raw(b'"x"'),
        "header_not_utf8": raw(b'{"\xff\xfe": 1}'),
        "header_entry_not_an_object": raw({"x": 5}),
        "header_nested_deep": raw(b'{"x": ' + b"[" * 20000 + b"]" * 20000 + b"}"),
        "unknown_dtype": raw({"x": {**one, "dtype": "Q99"}}, f4),
        "negative_shape": raw({"x": {**one, "shape": [-1]}}, f4),
        "huge_shape": raw({"x": {**one, "shape": [2 ** 40, 2 ** 40]}}, f4),
        "offsets_past_the_end": raw({"x": {**one, "data_offsets": [0, 10 ** 9]}}, f4),
        "offsets_reversed": raw({"x": {**one, "data_offsets": [4, 0]}}, f4),
        "offsets_not_the_size": raw({"x": {**one, "data_offsets": [0, 3]}}, f4),
        "offsets_overlap": raw({"x": one, "y": one}, f4),
        "metadata_not_strings": raw({"__metadata__": {"a": 1}, "x": one}, f4),
        "no_tensors": raw({}),
        "truncated_data": good[:-10],
        "truncated_header": good[:20],
        "keys_right_shapes_transposed": st_save({k: (v.t().contiguous() if v.dim() == 2 and v.shape[0] != v.shape[1] else v[..., :1].contiguous())
                                                 for k, v in state.items()}),
        "keys_right_dtype_int64": st_save({k: v.to(torch.int64) for k, v in state.items()}),
        "keys_right_dtype_bool": st_save({k: v > 0 for k, v in state.items()}),
        "keys_right_scalars": st_save({k: v.flatten()[0].clone() for k, v in state.items()}),
        "one_key_missing": st_save(dict(list(state.items())[1:])),
        "one_key_extra": st_save({**state, "stages.99.extra": torch.zeros(2)}),
        "other_keys": st_save({f"x{i}": v for i, v in enumerate(state.values())}),
    }
    return cases


def mutated_safetensors(state: dict, n: int, seed: int = 0) -> dict[str, bytes]:
    """`n` copies of a valid file with a few bytes of its header length or header changed (seeded)."""
    good = st_save(state)
    size = struct.unpack("<Q", good[:8])[0]
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(0, 8 + size)
            b[at] = rng.choice([0, 0xFF, ord('"'), ord("{"), ord("]"), ord("9"), ord("-"), rng.randrange(256)])
        out[f"mutation_{i}"] = bytes(b)
    return out



def _load_outcome(tiny, ck) -> str | None:
    """None where loading the folder is refused with InteropError; else what happened instead ("loaded", or the
    exception that escaped: the defect)."""
    try:
        load_transformers(build(tiny["spec"], seed=1), ck)
    except InteropError:
        return None
    except Exception as e:  # noqa: BLE001 - the defect: anything else escapes
        return f"{type(e).__name__}: {str(e)[:200]}"
    return "loaded"

def test_hostile_safetensors_through_export_are_diagnostics(tiny, tmp_path):
    spec = tiny["root"] / "s.cycle"
    cases = {**hostile_safetensors(tiny["state"]), **{k: (v, "mutated") for k, v in mutated_safetensors(tiny["state"], 25).items()}}
    assert len(cases) >= 50
    crashed = []
    for name, data in cases.items():
        mutated = isinstance(data, tuple)
        data = data[0] if mutated else data
        w = tmp_path / f"{name}.safetensors"
        w.write_bytes(data)
        res = CliRunner().invoke(main, ["export", str(spec), "--weights", str(w), "-o", str(tmp_path / f"out_{name}")])
        ok = "Traceback" not in res.output and "internal error" not in res.output and res.exit_code in ((0, 1, 2) if mutated else (1, 2))
        if not ok:
            crashed.append(f"{name}: exit {res.exit_code}: {res.output.strip().splitlines()[-1] if res.output.strip() else ''}")
        elif res.exit_code:
            assert not (tmp_path / f"out_{name}").exists(), name  # nothing is written unless everything fits
    assert not crashed, "\n".join(crashed)


def test_hostile_safetensors_through_load_transformers_raise_interop_error(tiny, tmp_path):
    """The same files as a checkpoint's model.safetensors (transformers' key names, a valid config.json)."""
    hf = tiny["hf"]
    cases = {**hostile_safetensors(hf), **mutated_safetensors(hf, 25, seed=1)}
    crashed = []
    for name, data in cases.items():
        ck = tmp_path / name
        ck.mkdir()
        (ck / "config.json").write_text(json.dumps(LLAMA))
        (ck / "model.safetensors").write_bytes(data)
        outcome = _load_outcome(tiny, ck)
        if outcome is not None and (outcome != "loaded" or not name.startswith("mutation_")):
            crashed.append(f"{name}: {outcome}")
    assert not crashed, "\n".join(crashed)


# --- checkpoint folders ----------------------------------------------------------------------------


def hostile_folders(hf: dict) -> dict:
    """name -> how to fill a checkpoint folder (a function of the folder)."""
    good = st_save(hf)
    config = json.dumps(LLAMA).encode()
    keys = sorted(hf)
    half = len(keys) // 2
    shard1 = st_save({k: hf[k] for k in keys[:half]})
    shard2 = st_save({k: hf[k] for k in keys[half:]})
    wm = {k: ("model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors") for i, k in enumerate(keys)}

    def files(**named):
        def fill(d):
            for name, data in named.items():
                name = name.replace("__", ".").replace("_DASH_", "-")
                if data is None:
                    (d / name).mkdir()
                elif callable(data):
                    data(d / name)
                else:
                    (d / name).write_bytes(data)
        return fill

    def sharded(index, s1=shard1, s2=shard2, **more):
        return files(config__json=config, model__safetensors__index__json=index if isinstance(index, bytes) else json.dumps(index).encode(),
                     **{"model_DASH_00001_DASH_of_DASH_00002__safetensors": s1, "model_DASH_00002_DASH_of_DASH_00002__safetensors": s2}, **more)

    def link_outside(p):
        outside = p.parent.parent / f"outside_{p.parent.name}.safetensors"
        outside.write_bytes(shard1)
        p.symlink_to(outside)

    return {
        "empty_folder": files(),
        "config_only": files(config__json=config),
        "weights_only": files(model__safetensors=good),
        "config_bad_json": files(config__json=b'{"model_type": "llama",', model__safetensors=good),
        "config_not_utf8": files(config__json=b'{"model_type": "ll\xffama"}', model__safetensors=good),
        "config_a_list": files(config__json=b"[1, 2]", model__safetensors=good),
        "config_empty": files(config__json=b"", model__safetensors=good),
        "config_a_directory": files(config__json=None, model__safetensors=good),
        "config_nested_100000_deep": files(config__json=b"[" * 100000 + b"]" * 100000, model__safetensors=good),
        "config_huge_integer": files(config__json=b'{"model_type": "llama", "vocab_size": ' + b"9" * 5000 + b"}", model__safetensors=good),
        "config_model_type_a_number": files(config__json=b'{"model_type": 5}', model__safetensors=good),
        "config_unknown_model_type": files(config__json=b'{"model_type": "gemma3"}', model__safetensors=good),
        "config_another_family": files(config__json=json.dumps({**LLAMA, "model_type": "gpt2"}).encode(), model__safetensors=good),
        "config_nan_eps": files(config__json=json.dumps({**LLAMA, "rms_norm_eps": {"__float__": "NaN"}}).encode(), model__safetensors=good),
        "config_absurd_width": files(config__json=json.dumps({**LLAMA, "hidden_size": 10 ** 12}).encode(), model__safetensors=good),
        "config_other_sizes": files(config__json=json.dumps({**LLAMA, "hidden_size": 32}).encode(), model__safetensors=good),
        "weights_empty": files(config__json=config, model__safetensors=b""),
        "weights_truncated_header": files(config__json=config, model__safetensors=good[:30]),
        "weights_a_directory": files(config__json=config, model__safetensors=None),
        "weights_dangling_symlink": files(config__json=config, model__safetensors=lambda p: p.symlink_to(p.parent / "nowhere")),
        "weights_int64": files(config__json=config, model__safetensors=st_save({k: v.to(torch.int64) for k, v in hf.items()})),
        "weights_complex": files(config__json=config, model__safetensors=st_save({k: v.to(torch.complex64) for k, v in hf.items()})),
        "weights_q_with_k_shape": files(config__json=config, model__safetensors=st_save(
            {k: (v[:, :4].contiguous() if "q_proj" in k else v) for k, v in hf.items()})),
        "weights_one_dimensional": files(config__json=config, model__safetensors=st_save({k: v.flatten().contiguous() for k, v in hf.items()})),
        "weights_missing_a_key": files(config__json=config, model__safetensors=st_save(dict(list(hf.items())[1:]))),
        "weights_extra_key": files(config__json=config, model__safetensors=st_save({**hf, "model.layers.9.x.weight": torch.zeros(2)})),
        "pickle_only": files(config__json=config, pytorch_model__bin=b"\x80\x04K\x01."),
        "index_bad_json": sharded(b'{"weight_map": '),
        "index_a_list": sharded(b"[]"),
        "index_without_weight_map": sharded({"metadata": {}}),
        "index_weight_map_a_list": sharded({"weight_map": ["a"]}),
        "index_weight_map_mixed_values": sharded({"weight_map": {"a": 1, "b": "model-00001-of-00002.safetensors"}}),
        "index_weight_map_unhashable_values": sharded({"weight_map": {"a": ["x"]}}),
        "index_weight_map_empty": sharded({"weight_map": {}}),
        "index_points_outside": sharded({"weight_map": {k: "../outside.safetensors" for k in keys}}),
        "index_points_absolute": sharded({"weight_map": {k: "/etc/passwd" for k in keys}}),
        "index_points_to_a_missing_shard": sharded({"weight_map": {k: "missing.safetensors" for k in keys}}),
        "index_points_to_a_directory": sharded({"weight_map": {k: "sub" for k in keys}}, sub=None),
        "index_empty_shard": sharded({"weight_map": wm}, s2=b""),
        "index_truncated_shard": sharded({"weight_map": wm}, s1=shard1[:40]),
        "index_shard_symlink_outside": sharded({"weight_map": wm}, s1=link_outside),
        "index_key_in_two_shards": sharded({"weight_map": wm}, s2=good),
        "index_nested_deep": sharded(b'{"weight_map": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
    }


def test_hostile_checkpoint_folders_raise_interop_error(tiny, tmp_path):
    cases = hostile_folders(tiny["hf"])
    assert len(cases) >= 31
    crashed = []
    for name, fill in cases.items():
        ck = tmp_path / name
        ck.mkdir()
        fill(ck)
        outcome = _load_outcome(tiny, ck)
        if outcome is not None:
            crashed.append(f"{name}: {outcome}")
    assert not crashed, "\n".join(crashed)


# --- what blocks or reads forever ------------------------------------------------------------------


@pytest.mark.slow  # child processes that import torch and transformers: the full run
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_import_of_a_fifo_or_dev_zero_config_is_refused_not_read(tmp_path):
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "config.json")
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "config.json").symlink_to("/dev/zero")
    for src in ("fifo", "fifo/config.json", "zero", "zero/config.json"):
        r = child(["import", src], tmp_path)
        assert r.returncode == 1 and "E0403" in r.stderr and "Traceback" not in r.stderr, (src, r.returncode, r.stderr[-2000:])
        assert "not a regular file" in r.stderr, r.stderr


@pytest.mark.slow  # child processes that import torch and transformers: the full run
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_export_of_fifo_or_dev_zero_weights_is_refused_not_read(tiny, tmp_path):
    os.mkfifo(tmp_path / "w.safetensors")
    (tmp_path / "z.safetensors").symlink_to("/dev/zero")
    for w in ("w.safetensors", "z.safetensors"):
        r = child(["export", tiny["root"] / "s.cycle", "--weights", w, "-o", "out"], tmp_path)
        assert r.returncode in (1, 2) and "not a regular file" in r.stderr and "Traceback" not in r.stderr, (w, r.returncode, r.stderr[-2000:])
        assert not (tmp_path / "out").exists()


@pytest.mark.slow  # child processes that import torch and transformers: the full run
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_load_transformers_of_fifo_or_dev_zero_files_is_refused_not_read(tiny, tmp_path):
    """The API in a child process: config.json, model.safetensors, the index or a shard that is a FIFO or /dev/zero."""
    script = tmp_path / "load.py"
    script.write_text(
        "import resource, sys, json\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "import cyclelang\n"
        "from cyclelang.interop import InteropError, import_config, load_transformers\n"
        f"spec = cyclelang.parse(import_config({LLAMA!r}))\n"
        "for ck in sys.argv[1:]:\n"
        "    try:\n"
        "        load_transformers(cyclelang.build(spec), ck)\n"
        "    except InteropError as e:\n"
        "        print('refused', ck, e)\n")
    good = (tiny["root"] / "ck" / "model.safetensors").read_bytes()
    folders = []
    for special in ("fifo", "zero"):
        for name in ("config.json", "model.safetensors", "model.safetensors.index.json", "shard.safetensors"):
            d = tmp_path / f"{special}_{name}"
            d.mkdir()
            folders.append(d)
            (d / "config.json").write_text(json.dumps(LLAMA))
            if name == "shard.safetensors":
                (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: name for k in tiny["hf"]}}))
            elif name != "model.safetensors":
                (d / "model.safetensors").write_bytes(good) if name == "config.json" else None
            target = d / name
            target.unlink(missing_ok=True)
            os.mkfifo(target) if special == "fifo" else target.symlink_to("/dev/zero")
    r = subprocess.run([sys.executable, str(script), *map(str, folders)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.count("refused") == len(folders), r.stdout
    for line in r.stdout.splitlines():  # a shard linked to /dev/zero is also outside the folder
        assert "not a regular file" in line or "not a file in the checkpoint's folder" in line, line


def test_import_of_an_oversized_config_is_refused(tmp_path):
    (tmp_path / "config.json").write_bytes(json.dumps(LLAMA).encode() + b" " * (16 << 20))
    res = CliRunner().invoke(main, ["import", str(tmp_path)])
    clean(res, (1,))
    assert "E0403" in res.output and "limit" in res.output, res.output


# --- absurd sizes: the language's limits at import ------------------------------------------------


@pytest.mark.parametrize("key,value", [("hidden_size", 10 ** 12), ("vocab_size", 10 ** 9), ("max_position_embeddings", 10 ** 11),
                                       ("intermediate_size", 10 ** 12), ("num_hidden_layers", 10 ** 7), ("num_hidden_layers", 20_000)])
def test_import_of_absurd_sizes_is_refused_naming_the_key(tmp_path, key, value):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, key: value}))
    res = CliRunner().invoke(main, ["import", str(tmp_path)])
    clean(res, (1,))
    assert re.search(rf"error\[E0401\]: {key}: ", res.output), res.output


def test_import_of_absurd_layer_counts_allocates_nothing_per_layer():
    """1e8 layers cost 1.7 GB in the readers that list each layer's type: refused before any list is made."""
    import tracemalloc

    from cyclelang.interop import Unsupported

    for family in ("llama", "qwen2", "gemma2", "jamba"):
        config = {"model_type": family, "num_hidden_layers": 10 ** 7}
        tracemalloc.start()
        try:
            with pytest.raises(Unsupported, match="num_hidden_layers"):
                import_config(config)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 32 << 20, f"{family}: {peak:,} bytes"


# --- config.json through `cyclec import`: a seeded fuzz -------------------------------------------


def default_configs() -> dict:
    transformers = need("transformers")
    out = {}
    for family in FAMILIES:
        c = transformers.AutoConfig.for_model(family).to_dict()
        out[family] = json.loads(json.dumps(c, default=str))
    return out


HOSTILE_SIZES = [0, -1, -(2 ** 40), 1.5, True, "8", {"__float__": "NaN"}, {"__float__": "Infinity"}, 2 ** 41, 10 ** 30, [4], {"a": 4}]
HOSTILE_ANY = [{"__float__": "NaN"}, {"__float__": "-Infinity"}, "x", "", [], {}, None, -1, 0, 10 ** 12, 1e308, True, [[[[1]]]]]


def config_cases(seed: int = 0, n: int = 300) -> list[tuple[str, bytes, bool]]:
    """(name, config.json bytes, whether it must be refused), seeded: every claimed model_type, mutated."""
    from cyclelang.interop.closed import SIZES, SIZES_FROM_ZERO
    from cyclelang.interop.families import KEYS

    rng = random.Random(seed)
    configs = default_configs()
    cases: list[tuple[str, bytes, bool]] = [
        ("not_an_object_list", b"[1, 2, 3]", True), ("not_an_object_string", b'"llama"', True), ("not_an_object_null", b"null", True),
        ("not_an_object_number", b"12", True), ("empty", b"", True), ("not_utf8", b'{"model_type": "llama\xff"}', True),
        ("utf16", json.dumps(LLAMA).encode("utf-16"), True), ("nested_100000_deep", b"[" * 100000 + b"]" * 100000, True),
        ("nested_100000_deep_objects", b'{"a":' * 100000 + b"1" + b"}" * 100000, True),
        ("nested_in_a_key", b'{"model_type": "llama", "rope_parameters": ' + b"[" * 100000 + b"]" * 100000 + b"}", True),
        ("integer_5000_digits", b'{"model_type": "llama", "vocab_size": ' + b"9" * 5000 + b"}", True),
        ("nan_literal", json.dumps({**LLAMA, "rms_norm_eps": float("nan")}).encode(), True),
        ("float_1e400", b'{"model_type": "llama", "hidden_size": 1e400}', True),
        ("no_model_type", json.dumps({k: v for k, v in LLAMA.items() if k != "model_type"}).encode(), True),
        *[(f"model_type_{i}", json.dumps({**LLAMA, "model_type": mt}).encode(), True)
          for i, mt in enumerate([5, None, "", "llama\x00", "../llama", "LLAMA", ["llama"], {"a": 1}, "gemma3", "bert", "t5"])],
    ]
    for family, c in configs.items():
        cases.append((f"{family}_default", json.dumps(c).encode(), False))
        cases.append((f"{family}_unknown_key", json.dumps({**c, "surely_not_a_key": 1}).encode(), True))
        cases.append((f"{family}_alone", json.dumps({"model_type": family}).encode(), False))
        maps = KEYS[family].maps
        for key in sorted(k for k in c if k in SIZES and k in maps and isinstance(c[k], int) and not isinstance(c[k], bool)):
            value = HOSTILE_SIZES[len(cases) % len(HOSTILE_SIZES)]
            cases.append((f"{family}_{key}_{value!r}", json.dumps({**c, key: value}).encode(),
                          not (value == 0 and key in SIZES_FROM_ZERO.get(family, ()))))  # 0 experts: GraniteMoeHybrid's dense layers
    families = list(configs)
    while len(cases) < n:
        family = rng.choice(families)
        c = dict(configs[family])
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(sorted(c))
            c[key] = rng.choice(HOSTILE_ANY + HOSTILE_SIZES)
        cases.append((f"random_{len(cases)}_{family}", json.dumps(c).encode(), False))
    return cases


def test_hostile_configs_through_import_are_diagnostics(tmp_path):
    """Every case: exit 1 or 2 with a diagnostic (those that must be refused), or exit 0 with a spec that checks."""
    bad = []
    for name, data, refused in config_cases():
        d = tmp_path / "ck"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_bytes(data)
        res = CliRunner().invoke(main, ["import", str(d)])
        out = res.output.strip()
        if "Traceback" in res.output or "internal error" in res.output or res.exit_code not in ((1, 2) if refused else (0, 1, 2)):
            bad.append(f"{name}: exit {res.exit_code}: {out.splitlines()[-1] if out else ''}")
        elif res.exit_code:
            if not re.search(r"error\[E040[123]\]", res.stderr):
                bad.append(f"{name}: exit {res.exit_code} without a diagnostic: {res.stderr[-300:]}")
        else:
            try:
                cyclelang.parse(res.stdout)
            except cyclelang.CycleError as e:
                bad.append(f"{name}: exit 0 with a spec `check` refuses: {str(e)[:300]}")
    assert not bad, "\n".join(bad)


def test_import_never_writes_a_config_string_into_the_spec():
    """A string where a size belongs was written into the spec's text as it was: mamba's and mamba2's
    max_position_embeddings and BLOOM's seq_length of "2048 scale=3" imported (exit 0) as a feed scaled by 3.
    Every mapped key of every family, given that string: refused, or absent from the spec."""
    from cyclelang.interop import Unsupported
    from cyclelang.interop.families import KEYS

    injected = []
    for family, c in default_configs().items():
        for key in sorted(set(c) | set(KEYS[family].maps)):
            try:
                text = import_config({**c, key: "2048 scale=3"})
            except (Unsupported, InteropError):
                continue
            if "scale=3" in text:
                injected.append(f"{family}: {key}")
    assert not injected, injected
    with pytest.raises(Unsupported, match="max_position_embeddings: .2048 scale=3.: a size is a whole number"):
        import_config({"model_type": "mamba", "max_position_embeddings": "2048 scale=3"})
