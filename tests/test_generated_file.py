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
    assert "[Pair(config) for _ in range(config.n_pairs)] + [AttentionBlock(config), Routed(config), Pair(config)]" in src


def test_a_stage_named_like_a_turbine_class_never_shadows_it():
    text = (ROOT / "specs" / "llama.cycle").read_text().replace("llama_block", "attention")
    src = cyclelang.codegen(cyclelang.parse(text))
    names = re.findall(r"^class (\w+)", src, re.M)
    assert "Attention" in names and "AttentionBlock" in names and len(names) == len(set(names))
    assert "self.stages = nn.ModuleList([AttentionBlock(config) for _ in range(config.n_layer)])" in src

