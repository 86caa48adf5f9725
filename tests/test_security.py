"""Nothing a spec says escapes the compiler, and no output is ever half-written.

- includes read only inside the spec's directory tree (or an --include-path):
  no '..' climbing out, no absolute paths, no symlinks out, no '~' or '$HOME'
  expansion, no URLs, no network;
- no injection: names are the only free text that reaches generated Python and
  DOT, and payloads in every name position (Python keywords, dunders, nn.Module
  attributes, DOT keywords) neither break nor add to the output;
- atomic writes: an error or Ctrl-C at any point of a write leaves the old file
  as it was, with no temporary left behind;
- determinism: IR JSON, DOT and generated source are byte-identical across runs,
  hash seeds and working directories.
"""

from __future__ import annotations

import ast as pyast
import keyword
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import cyclelang
from cyclelang import io as cio
from cyclelang.cli import main
from cyclelang.diagnostics import CycleError

from .conftest import ROOT, SPECS, need

ENGINE = "engine e {\n  chamber width=8\n  feed tokens vocab=16 context=8\n  nozzle head\n}\n"


def codes(path: Path, *include_path: str) -> list[str]:
    try:
        cyclelang.load(path, include_path=tuple(include_path))
    except CycleError as e:
        return [d.code for d in e.diagnostics]
    return []


# --- includes ------------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path):
    """tmp/outside/secret.cycle beside tmp/proj/main.cycle."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.cycle").write_text("let secret = 1\n")
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    (proj / "sub" / "ok.cycle").write_text("let ok = 1\n")
    return tmp_path


@pytest.mark.parametrize("target", [
    "../outside/secret.cycle", "sub/../../outside/secret.cycle", "./../outside/secret.cycle",
    "sub/../sub/../../outside/secret.cycle",
])
def test_dotdot_cannot_climb_out(tree, target):
    spec = tree / "proj" / "main.cycle"
    spec.write_text(f'include "{target}"\n' + ENGINE)
    assert codes(spec) == ["E0107"]


@pytest.mark.parametrize("target", ["/etc/passwd", "//etc/passwd", "C:/Windows/win.ini",
                                    "c:x.cycle", "~/x.cycle", "~root/.bashrc", "", "/dev/zero", "/proc/self/environ"])
def test_absolute_and_home_paths_are_refused(tree, target):
    spec = tree / "proj" / "main.cycle"
    spec.write_text(f'include "{target}"\n' + ENGINE)
    assert codes(spec) == ["E0107"]


def test_absolute_path_to_a_real_file_outside_is_refused(tree):
    spec = tree / "proj" / "main.cycle"
    spec.write_text(f'include "{tree / "outside" / "secret.cycle"}"\n' + ENGINE)
    assert codes(spec) == ["E0107"]


def test_symlinks_out_are_refused(tree):
    proj = tree / "proj"
    (proj / "link.cycle").symlink_to(tree / "outside" / "secret.cycle")
    (proj / "dirlink").symlink_to(tree / "outside", target_is_directory=True)
    for target in ("link.cycle", "dirlink/secret.cycle", "sub/../dirlink/secret.cycle"):
        spec = proj / "main.cycle"
        spec.write_text(f'include "{target}"\n' + ENGINE)
        assert codes(spec) == ["E0107"], target


def test_symlink_inside_the_tree_is_fine(tree):
    proj = tree / "proj"
    (proj / "alias.cycle").symlink_to(proj / "sub" / "ok.cycle")
    spec = proj / "main.cycle"
    spec.write_text('include "alias.cycle"\n' + ENGINE)
    assert codes(spec) == []


def test_include_path_allows_a_named_directory_only(tree):
    spec = tree / "proj" / "main.cycle"
    spec.write_text('include "../outside/secret.cycle"\n' + ENGINE)
    assert codes(spec, str(tree / "outside")) == []
    assert codes(spec, str(tree / "proj" / "sub")) == ["E0107"]
    r = CliRunner().invoke(main, ["check", "--include-path", str(tree / "outside"), str(spec)])
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("name", ["$HOME", "${HOME}", "%HOME%", "$(id)", "`id`", "~user"])
def test_environment_variables_and_shell_syntax_are_never_expanded(tree, monkeypatch, name):
    # a directory literally named "$HOME" is what the include reads, never $HOME itself
    proj = tree / "proj"
    monkeypatch.setenv("HOME", str(tree / "outside"))
    monkeypatch.setenv("USERPROFILE", str(tree / "outside"))
    (proj / name).mkdir()
    (proj / name / "secret.cycle").write_text("let mine = 2\n")
    spec = proj / "main.cycle"
    spec.write_text(f'include "{name}/secret.cycle"\n' + ENGINE)
    if name.startswith("~"):
        assert codes(spec) == ["E0107"]  # refused outright: a leading '~' reads as "home" to people
    else:
        assert codes(spec) == []
        (proj / name / "secret.cycle").unlink()
        assert codes(spec) == ["E0105"]  # not found: $HOME/secret.cycle exists, but is not read


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("cyclec tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.parametrize("url", ["http://example.com/x.cycle", "https://example.com/x.cycle", "file:///etc/passwd",
                                 "ftp://example.com/x", "//example.com/x.cycle", "\\\\example.com\\x"])
def test_urls_are_files_not_fetches(tree, no_network, url):
    spec = tree / "proj" / "main.cycle"
    spec.write_text(f'include "{url}"\n' + ENGINE)
    assert codes(spec) in (["E0105"], ["E0107"], ["E0009"])  # E0009: a backslash cannot be in a string


def test_the_front_end_never_touches_the_network(no_network):
    for path in SPECS:
        cyclelang.load(path)
    r = CliRunner().invoke(main, ["check", *map(str, SPECS)])
    assert r.exit_code == 0, r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_include_of_a_fifo_or_device_does_not_hang(tree):
    proj = tree / "proj"
    os.mkfifo(proj / "pipe.cycle")
    spec = proj / "main.cycle"
    spec.write_text('include "pipe.cycle"\n' + ENGINE)
    p = subprocess.run([sys.executable, "-m", "cyclelang", "check", str(spec)], capture_output=True, timeout=30, cwd=ROOT)
    assert p.returncode == 1 and b"Traceback" not in p.stderr


# --- injection -----------------------------------------------------------------------------------

# Names are [A-Za-z_][A-Za-z0-9_]*, so the payloads are the words that mean something
# to the targets: Python keywords and soft keywords, builtins, dunders, nn.Module's own
# attributes, the generated module's globals, DOT keywords and attribute names.
PY_PAYLOADS = sorted({*keyword.kwlist, "match", "case", "type", "_", "__import__", "__class__", "__init__", "__dict__",
                      "__builtins__", "exec", "eval", "open", "os", "sys", "torch", "nn", "F", "math", "self", "super",
                      "forward", "training", "parameters", "state_dict", "modules", "children", "to", "cuda", "half",
                      "register_buffer", "apply", "eval", "train", "_modules", "_parameters", "config", "Config", "x", "h"})
DOT_PAYLOADS = ["node", "edge", "graph", "digraph", "subgraph", "strict", "label", "URL", "href", "shape", "style", "color",
                "fontname", "image", "shapefile", "_background", "labelURL"]

POSITIONS = {
    "engine": lambda n: ENGINE_TMPL.format(engine=n, stage="s", branch="b", template="t", let="depth"),
    "stage": lambda n: ENGINE_TMPL.format(engine="e", stage=n, branch="b", template="t", let="depth"),
    "branch": lambda n: ENGINE_TMPL.format(engine="e", stage="s", branch=n, template="t", let="depth"),
    "template": lambda n: ENGINE_TMPL.format(engine="e", stage="s", branch="b", template=n, let="depth"),
    "let": lambda n: ENGINE_TMPL.format(engine="e", stage="s", branch="b", template="t", let=n),
}
ENGINE_TMPL = """let {let} = 2
stage {template}(h) {{
  prechamber mix {{ norm layernorm  turbine attention heads=h }}
}}
engine {engine} {{
  chamber width=16
  throat causal
  feed tokens vocab=32 context=8
  stage {stage} x {let} {{
    prechamber {branch} {{ norm layernorm  turbine mlp ratio=2 }}
    fullflow {branch}_ff {{ prechamber a {{ turbine mlp ratio=1 }} prechamber c {{ turbine attention heads=2 }} }}
  }}
  stage u = {template}(h=2)
  norm layernorm
  nozzle head
}}
"""


def positions(fast):
    """The positions for a payload sweep: those in `fast` in the fast tier (`-m "not slow"`),
    the others (about a second each) in the full run."""
    return [p if p in fast else pytest.param(p, marks=pytest.mark.slow) for p in sorted(POSITIONS)]


def _accepts(text: str):
    try:
        return cyclelang.parse(text)
    except CycleError:
        return None  # refusing a name with a diagnostic is a fine answer too


ALLOWED_IMPORTS = {"torch", "math", "dataclasses", "typing", "__future__", "torch.nn", "torch.nn.functional", "functools",
                   "hashlib", "inspect",  # the fused loss op's name carries a digest of its source (runtime/loss.py)
                   # parallelize (runtime/parallel.py), inside its function
                   "torch.distributed.fsdp", "torch.distributed.tensor.parallel", "torch.utils.checkpoint"}


def _check_python(source: str, payload: str) -> None:
    tree = pyast.parse(source)  # the payload did not break the syntax
    for node in pyast.walk(tree):
        if isinstance(node, pyast.Import):
            assert all(a.name in ALLOWED_IMPORTS for a in node.names), pyast.unparse(node)
        if isinstance(node, pyast.ImportFrom):
            assert node.module in ALLOWED_IMPORTS, pyast.unparse(node)
        if isinstance(node, pyast.Call) and isinstance(node.func, pyast.Name):
            assert node.func.id not in {"exec", "eval", "__import__", "compile", "open"}, pyast.unparse(node)


@pytest.mark.parametrize("position", positions({"template"}))
def test_python_payloads_in_names_cannot_inject_code(position):
    need("torch")
    broken, generated = [], 0
    for payload in PY_PAYLOADS:
        spec = _accepts(POSITIONS[position](payload))
        if spec is None:
            continue
        try:
            source = cyclelang.codegen(spec)
        except CycleError:
            continue
        generated += 1
        try:
            _check_python(source, payload)
        except SyntaxError as e:
            broken.append(f"{payload}: {e}")
    assert generated, f"no payload in position {position} got through to generated source: the loop tested nothing"
    assert not broken, f"names that break the generated Python in position {position}: {broken}"


@pytest.mark.parametrize("payload", ["forward", "training", "state_dict", "to", "type", "eval", "__class__", "_modules"])
def test_names_that_shadow_module_attributes_still_build(payload):
    torch = need("torch")
    built = 0
    for position in ("stage", "branch"):
        spec = _accepts(POSITIONS[position](payload))
        if spec is None:
            continue
        model = cyclelang.build(spec, seed=0)  # a name the front end accepts must build
        out = model(torch.zeros(1, 4, dtype=torch.long))
        assert out is not None
        built += 1
    assert built, f"'{payload}' was refused in every position: the test exercised nothing"


def test_spec_file_name_cannot_inject_into_generated_source(tmp_path):
    need("torch")
    name = 'x""" + __import__("os").system("id") + """ \'\'\' #.cycle'
    spec = tmp_path / name
    spec.write_text(ENGINE)
    r = CliRunner().invoke(main, ["build", str(spec), "-o", str(tmp_path / "m.py")])
    assert r.exit_code == 0, r.output
    source = (tmp_path / "m.py").read_text()
    _check_python(source, name)
    assert str(tmp_path) not in source, "an absolute path leaked into the generated source"


def _graphviz():
    from cyclelang.backends import graphviz as gv

    return gv


@pytest.mark.parametrize("position", positions({"branch"}))  # in both views
@pytest.mark.parametrize("view", ["cycle", "graph"])
def test_dot_payloads_in_names_cannot_add_attributes(position, view):
    gv = _graphviz()
    drawn = 0
    for payload in DOT_PAYLOADS + ["strict", "digraph", "class"]:
        spec = _accepts(POSITIONS[position](payload))
        if spec is None:
            continue
        drawn += 1
        # a placeholder of the same length: the payload may change the text where the name
        # is shown, and nothing else (no new statement, no new attribute)
        placeholder = ("Qj" * len(payload))[: len(payload)]
        base = gv.to_dot(cyclelang.parse(POSITIONS[position](placeholder)), view=view)
        dot = gv.to_dot(spec, view=view)
        # a class is a style key and a layout path, made of identifiers (a keyword name gets its `_`)
        assert all(re.fullmatch(r"[a-z_]+(?: [A-Za-z0-9_.=+-]+)*", c) for c in re.findall(r' class="([^"]*)"', dot)), payload

        # a tooltip names the part by its layout path (an identifier) and its line
        assert all(re.fullmatch(r"[A-Za-z0-9_.-]+(?: · line \d+|: .*)?", t) for t in re.findall(r' tooltip="([^"]*)"', dot)), payload

        def shape(d: str) -> str:  # the statements and attributes, not the geometry (a name's length moves boxes)
            d = re.sub(r' (class|tooltip)="[^"]*"', "", d)
            return re.sub(r'\b(pos|width|height|bb)="[^"]*"', r'\1=""', d)

        assert shape(dot) == shape(base).replace(placeholder, payload), payload
        if shutil.which("neato"):
            p = subprocess.run(["neato", "-n2", "-Tcanon"], input=dot.encode(), capture_output=True, timeout=30)
            assert p.returncode == 0, (payload, p.stderr.decode()[:500])
    assert drawn, f"no DOT payload was accepted in position {position}: the loop tested nothing"


def test_dot_quotes_every_label():
    gv = _graphviz()
    dot = gv.to_dot(cyclelang.parse(POSITIONS["branch"]("URL")))
    assert "URL=" not in dot and "href=" not in dot


# --- atomic writes -------------------------------------------------------------------------------

OLD = b"the old contents\n"


def _dir_listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("where", ["write", "fsync", "chmod", "replace"])
@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_atomic_write_failure_leaves_the_old_file(tmp_path, monkeypatch, where, exc):
    target = tmp_path / "out.txt"
    target.write_bytes(OLD)
    before = _dir_listing(tmp_path)

    def boom(*a, **k):
        raise exc

    if where == "write":
        real_fdopen = os.fdopen

        def fdopen(fd, *a, **k):
            f = real_fdopen(fd, *a, **k)

            class Half:
                def __enter__(self):
                    return self

                def __exit__(self, *e):
                    f.close()

                def write(self, data):
                    f.write(data[: len(data) // 2])  # half the bytes land, then the disk fills
                    raise exc

                def flush(self):
                    f.flush()

                def fileno(self):
                    return f.fileno()

            return Half()

        monkeypatch.setattr(cio.os, "fdopen", fdopen)
    else:
        monkeypatch.setattr(cio.os, where, boom)
    with pytest.raises(type(exc)):
        cio.atomic_write(target, b"new contents that never land\n" * 100)
    monkeypatch.undo()
    assert target.read_bytes() == OLD
    assert _dir_listing(tmp_path) == before, "a temporary file was left behind"


def test_atomic_write_keeps_permissions_and_replaces_whole(tmp_path):
    target = tmp_path / "out.txt"
    target.write_bytes(OLD)
    target.chmod(0o640)
    cio.atomic_write(target, "new\n")
    assert target.read_text() == "new\n" and (target.stat().st_mode & 0o777) == 0o640
    assert _dir_listing(tmp_path) == ["out.txt"]


def test_atomic_write_through_a_relative_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cio.atomic_write("plain.txt", b"x")
    assert (tmp_path / "plain.txt").read_bytes() == b"x"


UNFORMATTED = "engine e {   # keep me\n chamber   width=8\n  feed tokens vocab=16 context=8 # and me\n nozzle head }\n"


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_fmt_write_interrupted_leaves_the_spec(tmp_path, monkeypatch, exc):
    spec = tmp_path / "s.cycle"
    spec.write_text(UNFORMATTED)

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(cio.os, "replace", boom)
    r = CliRunner().invoke(main, ["fmt", "--write", str(spec)])
    monkeypatch.undo()
    # an interruption exits 130, a full disk 3 (the system refused the write), never 123
    assert r.exit_code == (130 if isinstance(exc, KeyboardInterrupt) else 3) and spec.read_text() == UNFORMATTED
    assert _dir_listing(tmp_path) == ["s.cycle"]
    if isinstance(exc, KeyboardInterrupt):
        assert r.exit_code == 130
    r = CliRunner().invoke(main, ["fmt", "--write", str(spec)])
    assert r.exit_code == 0 and "# keep me" in spec.read_text() and "# and me" in spec.read_text()


@pytest.mark.parametrize("argv", [["ir"], ["draw"], ["build"], ["fire", "--width", "16", "--depth", "1", "--seq", "8", "--batch", "1", "--json"]],
                         ids=lambda a: a[0])
def test_outputs_interrupted_mid_write_leave_the_old_file(tmp_path, monkeypatch, argv):
    if argv[0] in ("build", "fire"):
        need("torch")
    if argv[0] == "draw":
        _graphviz()
    spec = tmp_path / "s.cycle"
    spec.write_text(ENGINE)
    out = tmp_path / ("out.dot" if argv[0] == "draw" else "out.txt")
    out.write_bytes(OLD)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cio.os, "replace", boom)
    if argv[0] == "fire":
        r = CliRunner().invoke(main, [*argv, str(out), str(spec)])
    else:
        r = CliRunner().invoke(main, [*argv, str(spec), "-o", str(out)])
    monkeypatch.undo()
    assert r.exit_code == 130, r.output
    assert out.read_bytes() == OLD
    assert _dir_listing(tmp_path) == sorted(["s.cycle", out.name])


# --- determinism ---------------------------------------------------------------------------------


def _run(argv: list[str], cwd: Path, seed: str) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": seed, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cyclelang", *argv], capture_output=True, timeout=120, cwd=cwd, env=env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return p.stdout


# each case runs the command in two fresh processes (about a second); the fast tier keeps ir, the draws are in the full run
@pytest.mark.parametrize("argv", [["ir"], pytest.param(["draw", "-o", "-"], marks=pytest.mark.slow),
                                  pytest.param(["draw", "--view", "graph", "--expand", "-o", "-"], marks=pytest.mark.slow)],
                         ids=" ".join)
def test_outputs_are_byte_identical_across_hash_seeds_and_directories(tmp_path, argv):
    if argv[0] == "draw":
        _graphviz()
    spec = ROOT / "specs" / "gas_generator.cycle"
    a = _run([*argv, str(spec)], ROOT, "0")
    b = _run([*argv, str(spec)], tmp_path, "12345")
    assert a == b and a


def _two_builds(tmp_path) -> list[tuple[bytes, bytes]]:
    spec = tmp_path / "tiny.cycle"
    spec.write_text(ENGINE_TMPL.format(engine="e", stage="s", branch="b", template="t", let="depth"))
    outs = []
    for seed, cwd in (("0", ROOT), ("999", tmp_path)):
        d = tmp_path / f"run{seed}"
        d.mkdir()
        src = _run(["build", str(spec), "--seed", "7", "--weights", str(d / "w.safetensors")], cwd, seed)
        outs.append((src, (d / "w.safetensors").read_bytes()))
    assert str(tmp_path).encode() not in outs[0][0], "an absolute path leaked into the generated source"
    return outs


@pytest.mark.slow  # builds and saves a model twice in fresh processes
def test_generated_source_and_weights_are_identical(tmp_path):
    need("torch")
    need("safetensors")
    import json

    (src_a, w_a), (src_b, w_b) = _two_builds(tmp_path)
    assert src_a == src_b
    n_a, n_b = int.from_bytes(w_a[:8], "little"), int.from_bytes(w_b[:8], "little")
    assert json.loads(w_a[8:8 + n_a]) == json.loads(w_b[8:8 + n_b])  # the same names, shapes, offsets, metadata
    assert w_a[8 + n_a:] == w_b[8 + n_b:]  # the same tensor bytes


@pytest.mark.slow  # builds and saves a model twice in fresh processes
def test_weights_file_is_byte_identical(tmp_path):
    need("torch")
    need("safetensors")
    for _ in range(2):  # the order flips about half the time
        (_, w_a), (_, w_b) = _two_builds(tmp_path)
        assert w_a == w_b
        shutil.rmtree(tmp_path / "run0")
        shutil.rmtree(tmp_path / "run999")
