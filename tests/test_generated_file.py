"""The file `cyclec build` writes is the model only, as nanoGPT's model.py is (issue 36):
the config, the blocks, the model, `generate`; the parallel plan and the fast runtime only
when asked; one class per distinct structure; short lines."""

from __future__ import annotations

import re

import cyclelang

from .conftest import ROOT


def class_texts(src: str) -> dict[str, str]:
    """Every top-level class's text with its own name blanked, by name."""
    blocks = re.split(r"\n(?=class )", src)
    return {re.match(r"class (\w+)", b).group(1): re.sub(r"^class \w+\(", "class (", b.split("\n\n\n")[0])
            for b in blocks if b.startswith("class ")}


def test_the_default_file_is_the_model_only():
    src = cyclelang.codegen(ROOT / "specs" / "moe.cycle")
    for piece in ("TP_PLAN", "parallelize", "unshard_rows", "custom_op", "next_token_loss", "lookup("):
        assert piece not in src, piece
    asked = cyclelang.codegen(ROOT / "specs" / "moe.cycle", fast=True, parallel=True)
    assert "def parallelize(" in asked and "next_token_loss = next_token_loss_op(" in asked
    assert asked.index("def parallelize(") < asked.index("# Runtime: performance pieces")  # the runtime stays last


def test_nested_specs_write_one_class_per_structure():
    src = cyclelang.codegen(ROOT / "specs" / "jamba.cycle")
    texts = class_texts(src)
    assert len(set(texts.values())) == len(texts), sorted(texts)
    assert {"Dense", "Routed", "Pair", "AttentionBlock", "JambaBlock"} <= set(texts)
    assert not any(name.endswith("_") for name in texts)
    # the three `routed` stages (two in pairs, one on its own) are one class
    flat = " ".join(src.split())  # long lines are wrapped
    assert "[Pair(config) for _ in range(config.n_pairs)] + [AttentionBlock(config), Routed(config), Pair(config)]" in flat


def test_a_stage_named_like_a_turbine_class_never_shadows_it():
    text = (ROOT / "specs" / "llama.cycle").read_text().replace("llama_block", "attention")
    src = cyclelang.codegen(cyclelang.parse(text))
    names = re.findall(r"^class (\w+)", src, re.M)
    assert "Attention" in names and "AttentionBlock" in names and len(names) == len(set(names))
    assert "self.stages = nn.ModuleList([AttentionBlock(config) for _ in range(config.n_layer)])" in " ".join(src.split())



def test_llamas_file_is_short_and_every_default_file_has_short_lines():
    """nanoGPT's model.py is about 300 lines, none over 100 characters: llama's default file
    is at most 350, and no default file has a line of 100 characters or more."""
    from .conftest import SPECS

    llama = cyclelang.codegen(ROOT / "specs" / "llama.cycle")
    assert len(llama.splitlines()) <= 350
    for path in SPECS:
        long = [ln for ln in cyclelang.codegen(path).splitlines() if len(ln) > 99]
        assert not long, (path.stem, long)


def test_the_schedule_is_read_from_the_config():
    src = cyclelang.codegen(ROOT / "specs" / "llama.cycle")
    assert src.count("0.0003") == 1 and "lr: float = 0.0003" in src  # the learning rate is written once
    assert "warmup_steps: int = 2000" in src and "lr_steps: int = 100000" in src and "grad_clip: float = 1.0" in src
    ns: dict = {}
    exec(compile(src, "llama_model.py", "exec"), ns)
    config = ns["Config"](lr=1e-3, warmup_steps=0, min_lr=0.0, lr_steps=10)
    assert ns["learning_rate"](0, config) == 1e-3 and ns["learning_rate"](10, config) == 0.0
    assert ns["learning_rate"](2000) == 3e-4  # the spec's schedule by default
