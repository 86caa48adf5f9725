"""Every shell example in README.md and docs/*.md runs, so that a documented command cannot
drift from what `cyclec` does (docs/test_stand.md once showed a `fire --width --depth` report
given to `draw --annotate`, which `draw` refuses: E0276).

The convention, for whoever writes the docs:

- ```sh fences hold commands a reader may paste. Every `cyclec` command in them is run, in
  order, from a temporary folder holding a copy of specs/, examples/ and tests/diff_cases/
  (the paths the examples name), with `cyclec` on PATH; each must exit 0, or the code its
  line's trailing comment gives (`# exit 1`: a finding the docs show on purpose). A line may chain
  commands with `&&` or `;` and continue with a trailing backslash. A command that is not
  `cyclec` (pip, bash, torchrun), or a `cyclec` command that cannot run here, is listed in
  NOT_RUN below with the reason.
- ```console fences show a session: each `$ cyclec ...` line is run and its output must begin
  with the lines shown under it (a `...` line stands for the rest).
- ```text fences are synopses and output: never run.
- Any other fence that holds a `cyclec` command fails `test_every_shell_example_is_run_or_listed`:
  tag it. docs/diagnostics.md is generated (GENERATED below) and exempt.

A path an example names and the repository does not ship is made here (FIXTURES: a tiny
transformers config at `path/to/ckpt`). Examples that take more than a few seconds (a full
GPT-2 build, training sweeps) run with the slow tests (SLOW); the fast tier runs the rest
in well under 20 seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COPIED = ("specs", "examples", "tests/diff_cases")  # what the examples read, copied into each run's folder
MADE = ("docs/img",)  # folders the examples write into

# Commands in ```sh fences that are not run, by (file, the command's start): why.
NOT_RUN = {
    ("README.md", "pip install"): "installs the package: the environment these tests run in",
    ("README.md", "bash .ci/run"): "runs the whole test suite, this file included",
    ("docs/editors.md", "cyclec serve"): "a server that runs until it is stopped; tests/test_serve.py drives it",
    ("docs/training.md", "cyclec train"): "real training runs: minutes (300 steps of a tiny GPT) to hours or a GPU (GPT-2 small), and "
                                          "resuming them; tests/test_train.py runs `cyclec train` for a few steps",
    ("docs/test_stand.md", "cyclec fire examples/mup/"): "the LR-transfer sweeps: 4,800 training steps, 11 to 13 minutes on two CPU cores "
                                                         "(measured); tests/test_coord_check.py runs --lr-sweep through the CLI "
                                                         "at two widths",
    **{("docs/test_stand.md", f"cyclec fire specs/{m}.cycle examples/mup/{m}_mup.cycle --coord-check"):
       "the coordinate check with the full vocabularies at 4 widths: 40 s of the suite's CPU for two figures; "
       "tests/test_coord_check.py runs the same command (SP beside muP, --depth, --lr, --plot, exit 1) at two small widths"
       for m in ("gpt2", "llama")},
    ("docs/training.md", "torchrun"): "8 GPUs a node (two nodes for the second); tests/test_train_distributed.py runs FSDP2 and tensor "
                                      "parallel in CPU processes",
}

# Files whose fences are not examples to run, and why.
GENERATED = {
    "docs/diagnostics.md": "generated from cyclelang/codes.py and the reviewer's rules (cyclec explain --markdown): each code's example is what triggers it, "
                           "failing by design, on files it names but does not ship; tests/bad and tests/test_hardening.py trigger "
                           "every code",
}

# Fences that run with the slow tests, by (file, their first command's start): why.
SLOW = {
    ("README.md", "cyclec build specs/gpt2.cycle"): "builds full GPT-2 small (124M parameters) and sums up its weights: about 6 s",
    ("README.md", "cyclec fire specs/gpt2.cycle specs/post_ln.cycle"): "fires two engines and plots them: about 10 s",
    ("docs/test_stand.md", "cyclec fire examples/xiong/"): "fires both of Xiong et al.'s engines at batch 8: about 6 s",
}


# A tiny transformers checkpoint where docs/families.md writes `path/to/ckpt`.
FIXTURES = {
    "path/to/ckpt/config.json": json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "hidden_act": "silu"}),
}

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
COMMAND = re.compile(r"^\s*(\$\s+)?cyclec\s", re.M)


@dataclass
class Command:
    line: int  # in the file
    text: str
    output: list[str] = field(default_factory=list)  # console: the output shown
    exit: int = 0  # what it must exit with: 0, or its line's `# exit N`


@dataclass
class Fence:
    file: str  # relative to the repository
    line: int  # of the opening ```
    info: str
    body: str
    commands: list[Command] = field(default_factory=list)  # the cyclec commands to run, in order
    skipped: list[tuple[Command, str]] = field(default_factory=list)  # (command, why) not run

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def slow(self) -> bool:
        return any(self.file == f and self.commands and self.commands[0].text.startswith(start) for f, start in SLOW)


def _not_run(file: str, text: str) -> str | None:
    for (f, start), why in NOT_RUN.items():
        if f == file and text.startswith(start):
            return why
    return None


def _logical_lines(body: str, first: int):
    """(line number, text) of each line of a shell fence, backslash continuations joined."""
    out, cur, start = [], "", None
    for i, raw in enumerate(body.split("\n")):
        if start is None:
            start = first + i
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        out.append((start, cur + raw))
        cur, start = "", None
    return out


def fences() -> list[Fence]:
    found = []
    for path in DOCS:
        text = path.read_text("utf-8")
        rel = path.relative_to(ROOT).as_posix()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            f = Fence(rel, line, m.group(1).strip(), m.group(2))
            if f.info == "sh":
                for n, logical in _logical_lines(f.body, line + 1):
                    stripped = logical.strip()
                    if not stripped or stripped.startswith("#"):
                        continue
                    expect = re.search(r"#\s*exit\s+(\d+)\b", stripped)
                    parts = re.split(r"\s*(?:&&|;)\s*", stripped)
                    for k, part in enumerate(parts):
                        cmd = Command(n, part.strip(), exit=int(expect.group(1)) if expect and k == len(parts) - 1 else 0)
                        why = _not_run(rel, cmd.text)
                        if why is not None:
                            f.skipped.append((cmd, why))
                        elif cmd.text.startswith("cyclec "):
                            f.commands.append(cmd)
                        else:
                            f.skipped.append((cmd, ""))  # not cyclec and not listed: test_every_... says so
            elif f.info == "console":
                for i, raw in enumerate(f.body.split("\n")):
                    if raw.startswith("$ "):
                        f.commands.append(Command(line + 1 + i, raw[2:].strip()))
                    elif f.commands and raw.strip() == "...":
                        f.commands[-1].output.append("...")
                    elif f.commands and (not f.commands[-1].output or f.commands[-1].output[-1] != "..."):
                        f.commands[-1].output.append(raw)
            found.append(f)
    return found


FENCES = fences()
RUN = [f for f in FENCES if f.commands]


def test_the_docs_have_examples_to_run():
    assert len(RUN) >= 6 and sum(len(f.commands) for f in RUN) >= 8


def test_every_shell_example_is_run_or_listed():
    problems = []
    for f in FENCES:
        if f.file in GENERATED or f.info in ("sh", "console", "text"):
            continue
        if COMMAND.search(f.body):
            problems.append(f"{f.id}: a fence holding a cyclec command is tagged '{f.info}': tag it sh (run), console "
                            f"(run, output compared) or text (never run)")
    for f in FENCES:
        for cmd, why in f.skipped:
            if not why:
                problems.append(f"{f.file}:{cmd.line}: '{cmd.text}' is not a cyclec command: list it in NOT_RUN with the reason")
    assert problems == [], "\n".join(problems)


def test_the_lists_name_only_what_the_docs_hold():
    """A stale entry would exempt nothing and hide that an example moved."""
    skipped = {(f.file, c.text) for f in FENCES for c, _ in f.skipped}
    for (file, start) in NOT_RUN:
        assert any(fl == file and t.startswith(start) for fl, t in skipped), f"NOT_RUN names no command: {file}: {start}"
    for (file, start) in SLOW:
        assert any(f.file == file and f.commands[0].text.startswith(start) for f in RUN), f"SLOW names no fence: {file}: {start}"
    assert set(GENERATED) <= {p.relative_to(ROOT).as_posix() for p in DOCS}


@pytest.fixture
def stand(tmp_path):
    """A folder to run the examples from: copies of what they read, a `cyclec` on PATH."""
    work = tmp_path / "work"
    work.mkdir()
    for rel in COPIED:
        shutil.copytree(ROOT / rel, work / rel, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in MADE:
        (work / rel).mkdir(parents=True, exist_ok=True)
    for rel, text in FIXTURES.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text, "utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "cyclec"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cyclelang "$@"\n', "utf-8")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT), "NO_COLOR": "1",
           "COLUMNS": "200"}
    env.pop("CI", None)
    return work, env


def _run(cmd: Command, work: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd.text], cwd=work, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.skipif(shutil.which("bash") is None, reason="the examples are shell commands")
# every fence runs `cyclec` in child processes: the full run (the commands' own tests are in-process)
@pytest.mark.parametrize("fence", [pytest.param(f, marks=pytest.mark.slow) for f in RUN], ids=lambda f: f.id)
def test_documented_example_runs(fence: Fence, stand):
    work, env = stand
    if any(c.text.startswith("cyclec draw") for c in fence.commands) and shutil.which("neato") is None:
        pytest.skip("the Graphviz 'neato' program is not installed (CI installs it)")
    for cmd in fence.commands:
        r = _run(cmd, work, env, timeout=1800 if fence.slow else 120)
        where = f"{fence.file}:{cmd.line}: {cmd.text}"
        assert "Traceback" not in r.stderr, f"{where}\n{r.stderr[-3000:]}"
        if fence.info == "console":
            shown = [ln.rstrip() for ln in cmd.output if ln != "..."]
            while shown and not shown[-1]:
                shown.pop()
            got = [ln.rstrip() for ln in r.stdout.split("\n")][: len(shown)]
            assert got == shown, f"{where}: the output differs from the docs'\n" + "\n".join(
                f"{'  ' if a == b else '! '}docs: {a!r}\n{'  ' if a == b else '! '}got:  {b!r}" for a, b in zip(shown, got + [""] * len(shown)))
        else:
            assert r.returncode == cmd.exit, f"{where}: exit {r.returncode}, the docs say {cmd.exit}\n{r.stderr[-3000:]}"
