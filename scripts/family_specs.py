"""Write specs/families/{family}.cycle: `cyclec import` of each supported family's
transformers default config (transformers' own defaults, the sizes its docs describe).

    python scripts/family_specs.py          # rewrite the files
    python scripts/family_specs.py --check  # exit 1 if any file is out of date

tests/test_families.py runs the check, so the library follows the importer.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cyclelang.interop import FAMILIES, import_config  # noqa: E402


# Where transformers' default config cannot build a model, the released checkpoint's value:
# DeepseekV2Config leaves num_experts_per_tok unset (DeepSeek-V2 routes each token to 6).
OVERRIDES = {"deepseek_v2": {"num_experts_per_tok": 6}}
# Glm4MoeConfig has no head_dim (its attention falls back on 4096 // 96 = 42, whose half rotates an odd 21 dims): GLM-4.5-Air's
# config.json writes 128. Dots1Config leaves its experts unset: dots.llm1's config.json writes these.
OVERRIDES["glm4_moe"] = {"head_dim": 128}
OVERRIDES["dots1"] = {"n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
                      "norm_topk_prob": True, "routed_scaling_factor": 2.5}


# Lfm2Config's default makes every layer attention (no full_attn_idxs, no layer_types): the library shows the pattern of
# LFM2's released checkpoints instead, 16 layers with attention at layers 2, 5, 8, 10, 12 and 14, short convs elsewhere.
_LFM2_ATTN = (2, 5, 8, 10, 12, 14)
OVERRIDES["lfm2"] = {"num_hidden_layers": 16, "full_attn_idxs": list(_LFM2_ATTN),
                     "layer_types": ["full_attention" if i in _LFM2_ATTN else "conv" for i in range(16)]}


def default_config(family: str) -> dict:
    import transformers

    return {**transformers.AutoConfig.for_model(family).to_dict(), **OVERRIDES.get(family, {})}


# Families whose transformers default config the importer refuses, and why (they still import where a checkpoint's
# config avoids it).
SKIP = {"cohere_compass_text": "its default rope_parameters name no layer type, and transformers cannot build the model without them",
        "hunyuan_v1_moe": "its default head_dim is null, and transformers' HunYuan MoE attention cannot build without one",
        "lfm2_moe": "its default layer_types is null (transformers cannot build it), and its norm_topk_prob renormalises by the sum + 1e-6, "
                    "which the language's sigmoid router does not say",
        "lfm3": "its default gates each attention head's output (use_attention_gate) and turns its global layers by a proportional "
                "rotary, neither of which the language says"}


def texts() -> dict[str, str]:
    out = {}
    for family in (f for f in FAMILIES if f not in SKIP):
        config = default_config(family)
        out[family] = import_config(config).replace("imported from config.json", f"imported from transformers' default {family} config", 1)
    return out


def main(argv: list[str]) -> int:
    stale = []
    for family, text in texts().items():
        path = ROOT / "specs" / "families" / f"{family}.cycle"
        if "--check" in argv:
            if not path.is_file() or path.read_text("utf-8") != text:
                stale.append(path.name)
        else:
            path.write_text(text, "utf-8")
    if stale:
        print("out of date (run python scripts/family_specs.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
