"""Try every decoder-only family of the installed transformers the way a user would: a tiny model
of the family (its default config, sizes shrunk), random weights spread away from their init,
saved with save_pretrained; then `cyclec import` of the folder, build, load, and the logits
against transformers' own.

    python scripts/family_sweep.py                  # every model type of the causal-LM mapping
    python scripts/family_sweep.py qwen3_moe olmoe  # some

Each family ends in one of: exact (imports, loads, logits within 1e-4 relative), refused (E0401 /
E0402 with the reason), no tiny model (transformers cannot build the shrunk config: not counted),
and the two that must never happen: WRONG (imports and loads, but computes another function) and
CRASH (anything but a clean refusal). Exit 1 when any family is WRONG or CRASH.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# A key's shrunk value, where the default config holds a number there.
SMALL = {
    "vocab_size": 128, "hidden_size": 64, "n_embd": 64, "d_model": 64, "intermediate_size": 96, "n_inner": 96, "ffn_hidden_size": 96,
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "head_dim": 16, "max_position_embeddings": 64, "n_positions": 64,
    "seq_length": 64, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 4, "n_routed_experts": 4,
    "num_local_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "kv_lora_rank": 16, "q_lora_rank": 24,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "qk_head_dim": 24, "state_size": 8, "mamba_d_state": 8,
    "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_expand": 2, "expand": 2, "n_groups": 1, "mamba_n_groups": 1, "chunk_size": 8,
    "mamba_chunk_size": 8, "sliding_window": 6, "window_size": 6, "rotary_dim": 8, "first_k_dense_replace": 1, "n_shared_experts": 1,
    "dim_model_base": 32, "time_step_rank": 8, "mamba_dt_rank": 8, "word_embed_proj_dim": 64, "n_ctx": 64,
}
MAX_PARAMS = 20_000_000
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
KV = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")


def _set(config, key, value) -> None:
    with contextlib.suppress(AttributeError, TypeError, ValueError):  # a derived property has no setter
        setattr(config, key, value)


def shrink(config):
    d = config.to_dict()
    for k, v in SMALL.items():
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            _set(config, k, v)
    for k in LAYERS:
        if isinstance(d.get(k), int):
            n = min(d[k], 4)
            _set(config, k, n)
            for lk in ("layer_types", "mlp_layer_types", "attention_types_per_layer", "no_rope_layers", "hybrid_override_pattern"):
                lst = d.get(lk)
                if isinstance(lst, (list, tuple)) and len(lst) >= n:
                    _set(config, lk, list(lst)[:n])
                elif isinstance(lst, str) and len(lst) >= n:
                    _set(config, lk, lst[:n])
    for k in KV:
        if isinstance(d.get(k), int):
            _set(config, k, 2 if d[k] > 1 else 1)
    n = getattr(config, "num_hidden_layers", None)
    if isinstance(d.get("kv_lora_rank"), int):  # latent attention expands a key and value per query head
        _set(config, "num_key_value_heads", config.num_attention_heads)
        if "head_dim" in d and "qk_rope_head_dim" in d:  # DeepSeek's rotary reads head_dim: the rotary part's
            _set(config, "head_dim", config.qk_rope_head_dim)
    if isinstance(d.get("expand"), (int, float)) and isinstance(d.get("hidden_size"), int):  # a Mamba mixer's width is expand x width
        inner = int(config.expand * config.hidden_size)
        if "intermediate_size" in d:
            _set(config, "intermediate_size", inner)
        if isinstance(d.get("num_heads"), int) and "head_dim" in d:  # Mamba-2: heads x head_dim is the inner width
            _set(config, "head_dim", inner // config.num_heads)
    if "attention_types" in d and isinstance(n, int):  # GPT-Neo: global and local in turn, one per layer
        _set(config, "attention_types", [[["global", "local"], n // 2]])
        _set(config, "attention_layers", ["global", "local"] * (n // 2))
    if "attn_layer_period" in d:  # Jamba: an attention layer among the first few (transformers' own forward needs one)
        _set(config, "attn_layer_period", 2), _set(config, "attn_layer_offset", 1)
        _set(config, "expert_layer_period", 2), _set(config, "expert_layer_offset", 1)
    if "attn_layer_indices" in d:  # Bamba
        _set(config, "attn_layer_indices", [1])
    for i, k in enumerate(("pad_token_id", "bos_token_id", "eos_token_id")):  # special tokens within the shrunk vocabulary
        if isinstance(d.get(k), int) and d[k] >= SMALL["vocab_size"]:
            _set(config, k, i)
    text = getattr(config, "text_config", None)  # a multimodal config whose causal LM is its text model (Emu3's)
    if text is not None and hasattr(text, "to_dict"):
        shrink(text)
    return config


def check(model_type: str) -> tuple[str, str]:
    import torch
    import transformers

    import cyclelang
    from cyclelang.backends.torch.build import build
    from cyclelang.interop import InteropError, Unsupported, import_config, load_transformers

    try:
        config = shrink(transformers.AutoConfig.for_model(model_type))
        with torch.device("meta"):  # the size first: a nested config the shrinking missed stays out of memory
            n = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
        if n > MAX_PARAMS:
            return "no tiny model", f"{n / 1e6:.0f}M parameters after shrinking"
        torch.manual_seed(0)
        ref = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn_like(p))
    except Exception as e:  # noqa: BLE001 (transformers cannot build the shrunk config)
        return "no tiny model", f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ref.save_pretrained(tmp)
        except Exception as e:  # noqa: BLE001
            return "no tiny model", f"save_pretrained: {type(e).__name__}"
        try:
            text = import_config(tmp)
        except Unsupported as e:
            return "refused", str(e)[:160]
        except InteropError as e:
            return "refused", str(e)[:160]
        except Exception:  # noqa: BLE001
            return "CRASH", "import: " + traceback.format_exc().strip().splitlines()[-1][:160]
        try:
            ours = build(cyclelang.parse(text), seed=0).eval()
            load_transformers(ours, tmp)
        except InteropError as e:
            return "refused", "load: " + str(e)[:160]
        except Exception:  # noqa: BLE001
            return "CRASH", "load: " + traceback.format_exc().strip().splitlines()[-1][:160]
        ids = torch.randint(0, config.get_text_config().vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            try:
                want = ref(ids).logits
            except Exception as e:  # noqa: BLE001 (transformers cannot run its own shrunk model)
                return "no tiny model", f"transformers' forward: {type(e).__name__}"
            try:
                got = ours(ids)
            except Exception:  # noqa: BLE001
                return "CRASH", "forward: " + traceback.format_exc().strip().splitlines()[-1][:160]
        err = ((got - want).abs().max() / want.abs().max()).item()
        return ("exact", f"{err:.1e}") if err < 1e-4 else ("WRONG", f"logits {err:.2e} off")


def main(argv: list[str]) -> int:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from cyclelang.interop.unclaimed import LEFT_OUT

    types = argv or sorted(m for m in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if m not in LEFT_OUT)
    counts: dict[str, int] = {}
    for mt in types:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            status, why = check(mt)
        counts[status] = counts.get(status, 0) + 1
        print(f"{mt:28} {status:13} {why}", flush=True)
    print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 1 if counts.get("WRONG") or counts.get("CRASH") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
