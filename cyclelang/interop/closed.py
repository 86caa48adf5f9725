"""config.json read as transformers reads it, in a closed world.

A family's reader may only read the keys it declares (`Keys.maps`). Every other key of the
file must be one transformers' class for that model_type declares and that changes nothing
the model computes (`INERT`, `Keys.inert`, each with its reason), or hold exactly the class's
default; anything else is refused by name (`Unsupported`, its path in config.json): the
importer cannot tell whether it changes the function. `null` is never "absent": a key
written as `null` reaches the reader as None, exactly as transformers' `__init__` receives
it, and a key whose annotation has no None refuses it.

What transformers does to a config.json before its class sees it is done here too:
the `{"__float__": "Infinity"}` encoding of non-finite floats, the `model_type` remapping
(`mistral` with `layer_types` is Ministral), a class's `attribute_map` aliases (BLOOM's
`n_embed`), and its legacy rotary keys (`rope_scaling`, `rope_theta`, GPT-NeoX's
`rotary_pct`). The classes' fields and defaults come from `hf_fields.py`, generated
from transformers by scripts/hf_fields.py and checked against it by the tests, so an import
needs no transformers installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .hf_fields import BASE, FIELDS


class Unsupported(ValueError):
    """A config field (or a spec construct, on export) the other side cannot express."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


# transformers' class for each claimed model_type, and for those whose readers are being written
# (scripts/hf_fields.py reads these classes; families.READERS is the claimed part)
CLASSES = {
    "gpt2": "GPT2Config", "llama": "LlamaConfig", "mistral": "MistralConfig", "ministral": "MinistralConfig",
    "ministral3": "Ministral3Config", "mixtral": "MixtralConfig", "qwen2": "Qwen2Config", "qwen2_moe": "Qwen2MoeConfig",
    "qwen3": "Qwen3Config", "phi3": "Phi3Config", "olmo": "OlmoConfig", "olmo2": "Olmo2Config", "gemma": "GemmaConfig",
    "gemma2": "Gemma2Config", "granite": "GraniteConfig", "phi": "PhiConfig", "starcoder2": "Starcoder2Config",
    "gpt_neox": "GPTNeoXConfig", "gptj": "GPTJConfig", "falcon": "FalconConfig", "bloom": "BloomConfig",
    "mamba2": "Mamba2Config", "mamba": "MambaConfig", "jamba": "JambaConfig", "deepseek_v2": "DeepseekV2Config",
    "seed_oss": "SeedOssConfig", "internlm3": "InternLM3Config", "iquestcoder": "IQuestCoderConfig",
    # Emu3's text decoder: what AutoModelForCausalLM builds for an emu3 config, and saves under this model_type
    "emu3_text_model": "Emu3TextConfig",
    # the 2026 families (issue 33): their fields are in hf_fields.py so each reader is written closed-world against them
    "gemma3_text": "Gemma3TextConfig",
    "qwen3_moe": "Qwen3MoeConfig",
    "olmo3": "Olmo3Config",
    "olmoe": "OlmoeConfig",
    "smollm3": "SmolLM3Config",
    "exaone4": "Exaone4Config",
    "ernie4_5": "Ernie4_5Config",
    "helium": "HeliumConfig",
    "cwm": "CwmConfig",
    "granitemoe": "GraniteMoeConfig",
    "granitemoeshared": "GraniteMoeSharedConfig",
    "cohere": "CohereConfig",
    "cohere2": "Cohere2Config",
    "cohere2_moe": "Cohere2MoeConfig",
    "cohere_compass_text": "CohereCompassTextConfig",
    "glm": "GlmConfig",
    "glm4": "Glm4Config",
    "stablelm": "StableLmConfig",
    "mpt": "MptConfig",
    "codegen": "CodeGenConfig",
    "opt": "OPTConfig",
    "gpt_bigcode": "GPTBigCodeConfig",
    "gpt_neo": "GPTNeoConfig",
    "biogpt": "BioGptConfig",
    "openai-gpt": "OpenAIGPTConfig",
    "aria_text": "AriaTextConfig",
    "flex_olmo": "FlexOlmoConfig",
    "falcon_mamba": "FalconMambaConfig",
    "minicpm3": "MiniCPM3Config",
    "youtu": "YoutuConfig",
    "vaultgemma": "VaultGemmaConfig",
    "mellum": "MellumConfig",
    "exaone": "ExaoneConfig",
    "emu3": "Emu3Config",
    "gpt-sw3": "GPT2Config",
    "ctrl": "CTRLConfig",
    "gpt_neox_japanese": "GPTNeoXJapaneseConfig",
    "hyperclovax": "HyperCLOVAXConfig",
    "granitemoehybrid": "GraniteMoeHybridConfig",
    "bamba": "BambaConfig",
    "deepseek_v3": "DeepseekV3Config",
    "glm4_moe": "Glm4MoeConfig",
    "glm4_moe_lite": "Glm4MoeLiteConfig",
    "dots1": "Dots1Config",
    "ernie4_5_moe": "Ernie4_5_MoeConfig",
    "exaone_moe": "ExaoneMoeConfig",
    "minimax_m2": "MiniMaxM2Config",
    "sarvam_mla": "SarvamMLAConfig",
    "sarvam_moe": "SarvamMoEConfig",
    "hy_v3": "HYV3Config",
    "laguna": "LagunaConfig",
    "solar_open": "SolarOpenConfig",
    "axk1": "AXK1Config",
    "kolibri1": "Kolibri1Config",
    "arcee": "ArceeConfig",
    "nemotron": "NemotronConfig",
    "persimmon": "PersimmonConfig",
    "jais2": "Jais2Config",
    "nanochat": "NanoChatConfig",
    "hunyuan_v1_dense": "HunYuanDenseV1Config",
    "hunyuan_v1_moe": "HunYuanMoEV1Config",
    # issue 34's sinks (families/sinks.py)
    "gpt_oss": "GptOssConfig",
    "granite_swa": "GraniteSWAConfig",
    "granitemoe_swa": "GraniteMoeSWAConfig",
    "flint": "FlintConfig",
    # gated DeltaNet hybrids (issue 34: families/delta.py)
    "qwen3_next": "Qwen3NextConfig",
    "qwen3_5_text": "Qwen3_5TextConfig",
    "qwen3_5_moe_text": "Qwen3_5MoeTextConfig",
    "olmo_hybrid": "OlmoHybridConfig",
    "lara_mini": "LaraMiniConfig",
    "lfm2": "Lfm2Config",
    "lfm2_moe": "Lfm2MoeConfig",
    "lfm3": "Lfm3Config",
    "falcon_h1": "FalconH1Config",
    "nemotron_h": "NemotronHConfig",
    "gemma4_text": "Gemma4TextConfig",
    "gemma4_unified_text": "Gemma4UnifiedTextConfig",
    "afmoe": "AfmoeConfig",  # Arcee's AFMoE (families/afmoe.py)
}

# A class's attribute_map: a name config.json may use for a field (transformers sets the field through it).
ALIASES = {
    "gpt2": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    "gptj": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    "mixtral": {"num_experts": "num_local_experts"},
    "gpt_oss": {"num_experts": "num_local_experts"},
    "hunyuan_v1_moe": {"num_local_experts": "num_experts", "num_experts_per_tok": "moe_topk"},
    "jamba": {"num_local_experts": "num_experts"},
    "deepseek_v2": {"num_experts": "n_routed_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts", "num_nextn_predict_layers": "num_mtp_layers"},  # the file writes num_nextn_predict_layers
    "sarvam_mla": {"num_local_experts": "n_routed_experts", "num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
                   "num_nextn_predict_layers": "num_mtp_layers"},  # the file writes num_nextn_predict_layers
    "glm4_moe_lite": {"num_local_experts": "n_routed_experts", "head_dim": "qk_rope_head_dim"},
    "axk1": {"num_local_experts": "n_routed_experts"},
    "bloom": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head", "n_embed": "hidden_size"},  # n_embed: __post_init__'s BC
    "falcon": {"n_embed": "hidden_size"},
    "internlm3": {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
    "qwen3_moe": {"num_local_experts": "num_experts"},
    "olmoe": {"num_local_experts": "num_experts"},
    "flex_olmo": {"num_local_experts": "num_experts"},
    "exaone": {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps", "activation_function": "hidden_act"},
    "codegen": {"max_position_embeddings": "n_positions", "hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    "mpt": {"num_attention_heads": "n_heads", "hidden_size": "d_model", "num_hidden_layers": "n_layers"},
    "gpt-sw3": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    "gpt_bigcode": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    "gpt_neo": {"num_attention_heads": "num_heads", "num_hidden_layers": "num_layers"},
    "openai-gpt": {"max_position_embeddings": "n_positions", "hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
    "mellum": {"num_local_experts": "num_experts", "num_nextn_predict_layers": "num_mtp_layers"},
    "glm4_moe": {"num_local_experts": "n_routed_experts", "num_nextn_predict_layers": "num_mtp_layers"},
    "dots1": {"num_local_experts": "n_routed_experts"},
    "solar_open": {"num_local_experts": "n_routed_experts"},
    "hy_v3": {"num_local_experts": "num_experts"},
    "nemotron_h": {"layer_types": "layers_block_type", "num_local_experts": "n_routed_experts"},
    "sarvam_moe": {"num_local_experts": "n_routed_experts", "num_nextn_predict_layers": "num_mtp_layers", "num_experts": "n_routed_experts",
                   "num_shared_experts": "n_shared_experts", "use_qkv_bias": "attention_bias"},
    "minimax_m2": {"num_experts": "num_local_experts"},
    "ernie4_5_moe": {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
    "granitemoehybrid": {"layers_block_type": "layer_types"},
    "lfm3": {"rms_norm_eps": "norm_eps"},
    "ctrl": {"max_position_embeddings": "n_positions", "hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
}
# Classes whose attribute_map points from the field to another name (Qwen3-MoE's num_experts is stored as
# num_local_experts, which save_pretrained writes): there the alias wins over the field's own name.
ALIAS_WINS = {"qwen3_moe": frozenset({"num_local_experts"}), "sarvam_mla": frozenset({"num_nextn_predict_layers"}), "glm4_moe": frozenset({"num_nextn_predict_layers"}), "sarvam_moe": frozenset({"num_nextn_predict_layers"}), "mellum": frozenset({"num_local_experts", "num_nextn_predict_layers"})}

# The rotary base a class falls back on when config.json names none (PreTrainedConfig.default_theta).
DEFAULT_THETA = {"mixtral": 1000000.0, "flex_olmo": 500000.0}
DEFAULT_THETA.update({"olmo3": 500000.0, "smollm3": 2000000.0, "ernie4_5": 500000.0, "helium": 100000.0, "cwm": 1000000.0, "exaone": 500000.0})
DEFAULT_THETA["cohere"] = 500000.0
DEFAULT_THETA["ernie4_5_moe"] = 500000.0
DEFAULT_THETA["minimax_m2"] = 5000000.0
DEFAULT_THETA["solar_open"] = 1000000.0
DEFAULT_THETA["sarvam_moe"] = 8000000.0
DEFAULT_THETA["hy_v3"] = 11158840.0
DEFAULT_THETA["gpt_oss"] = 150000.0  # GptOssConfig.default_theta
DEFAULT_THETA["lfm2"] = 1000000.0
DEFAULT_THETA["lfm2_moe"] = 1000000.0

_DROPOUT = "dropout: inactive in evaluation, and cyclelang trains without it"
_GENERATION = "a generation setting (transformers moves it to the generation config); the forward does not read it"

# Keys that change nothing the model computes, for every family, and why.
INERT: dict[str, str] = {
    "transformers_version": "the version of transformers that wrote the file",
    "architectures": "the head class's name; the model_type decides what is computed",
    "output_hidden_states": "what forward returns besides the logits, not what it computes",
    "output_attentions": "what forward returns besides the logits, not what it computes",
    "return_dict": "what forward returns besides the logits, not what it computes",
    "dtype": "the dtype the weights were saved in; they load into the model's own dtype",
    "torch_dtype": "the dtype the weights were saved in (the older name of dtype)",
    "chunk_size_feed_forward": "computes a feed-forward over positions in chunks: the same result",
    "id2label": "a classification head's labels; the causal LM has no such head",
    "label2id": "a classification head's labels; the causal LM has no such head",
    "num_labels": "a classification head's size; the causal LM has no such head",
    "problem_type": "a classification head's loss; the causal LM has no such head",
    "initializer_range": "the spread of freshly initialised weights; an import loads every weight",
    "use_cache": "whether decoding keeps a cache: the same logits",
    "bos_token_id": "generation's start token; the forward does not read it",
    "eos_token_id": "generation's stop token(s); the forward does not read them",
    "sep_token_id": "a tokenizer's separator token; the forward does not read it",
    "decoder_start_token_id": "an encoder-decoder's start token; the forward does not read it",
    "tokenizer_class": "which tokenizer to load with the checkpoint",
    "prefix": "a pipeline's prompt prefix",
    "task_specific_params": "pipelines' settings",
    "finetuning_task": "the name of the task it was fine-tuned on",
    "_name_or_path": "where the checkpoint was loaded from",
    "name_or_path": "where the checkpoint was loaded from",
    "_commit_hash": "the hub revision it was loaded from",
    "attn_implementation": "which kernel computes attention (eager, sdpa, flash): the same function",
    "_attn_implementation_autoset": "which kernel computes attention: the same function",
    "experts_implementation": "which kernel computes the experts: the same function",
    "attention_dropout": _DROPOUT, "attn_pdrop": _DROPOUT, "resid_pdrop": _DROPOUT, "embd_pdrop": _DROPOUT,
    "hidden_dropout": _DROPOUT, "embedding_dropout": _DROPOUT, "residual_dropout": _DROPOUT, "classifier_dropout": _DROPOUT,
    "output_router_logits": "whether forward also returns the router's logits (and adds their balance loss to the training loss)",
    "router_aux_loss_coef": "the balance loss's weight in transformers' training loss; the logits do not read it",
    "cache_implementation": "which cache class generation uses: the same logits",
    "auto_map": "the checkpoint's own code, run only with trust_remote_code=True; without it transformers loads its own class "
                "for this model_type, which is what is read here",
    **{k: _GENERATION for k in (
        "assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids", "begin_suppress_tokens", "diversity_penalty",
        "do_sample", "early_stopping", "encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff",
        "exponential_decay_length_penalty", "forced_bos_token_id", "forced_eos_token_id", "length_penalty", "max_length", "min_length",
        "no_repeat_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule", "num_beam_groups", "num_beams",
        "num_return_sequences", "output_scores", "remove_invalid_values", "repetition_penalty", "return_dict_in_generate",
        "suppress_tokens", "target_lookbehind", "temperature", "top_k", "top_p", "typical_p")},
}

# Keys every class knows whose value the language fixes: anything else is refused with the reason.
FIXED = {
    "is_encoder_decoder": (False, "an encoder-decoder is not a causal LM the language can say"),
    "add_cross_attention": (False, "cross-attention to an encoder is not in the language"),
    "per_layer_config": (None, "per-layer overrides of the config (transformers' heterogeneous layers) are not mapped"),
}

# Sizes: a whole number of at least 1 (a zero or negative size has no model).
SIZES = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions", "n_inner", "num_kv_heads", "ffn_hidden_size",
    "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok",
    "n_routed_experts", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_heads",
    "state_size", "conv_kernel", "chunk_size", "n_groups", "mamba_d_state", "mamba_d_conv", "rotary_dim", "seq_length",
    "attn_layer_period", "expert_layer_period", "decoder_sparse_step", "mamba_dt_rank", "time_step_rank",
})
MAX_SIZE = 2 ** 40  # past this no model is built: refused rather than allocated
# Sizes a family reads 0 of as "none": GraniteMoeHybrid without experts is its shared MLP alone.
SIZES_FROM_ZERO = {"granitemoehybrid": frozenset({"num_local_experts", "num_experts_per_tok"})}

# The rotary keys transformers moves into rope_parameters, and the keys a rope dict may hold.
LEGACY_ROPE = ("rope_scaling", "rope_theta", "partial_rotary_factor")
ROPE_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor", "original_max_position_embeddings",
                       "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
                       "truncate", "max_position_embeddings", "llama_4_scaling_beta",
                       "long_factor", "short_factor"})  # longrope's: refused by its rope_type
# rope parameters one family's own rotary reads (its reader reads them): HunYuan's alpha (ntk_alpha, a fixed base)
FAMILY_ROPE_KEYS = {"hunyuan_v1_dense": frozenset({"alpha"}), "hunyuan_v1_moe": frozenset({"alpha"})}


@dataclass(frozen=True)
class Keys:
    """What a family's reader reads (maps) and what else of its class changes nothing (inert: key -> why)."""

    maps: frozenset
    inert: dict = field(default_factory=dict)
    legacy: dict = field(default_factory=dict)  # a key transformers converts (GPT-NeoX's rotary_pct) -> where it goes


_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def decode(obj):
    """transformers' JSON encoding of non-finite floats: {"__float__": "Infinity"} is inf."""
    if isinstance(obj, dict):
        if set(obj) == {"__float__"} and obj["__float__"] in _FLOATS:
            return _FLOATS[obj["__float__"]]
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    return obj


def remap(config: dict) -> str:
    """The model_type transformers' AutoConfig reads a config.json as."""
    mt = config.get("model_type")
    if mt == "mistral" and "layer_types" in config:  # AutoConfig's heuristic: Mistral with layer_types is Ministral
        return "ministral"
    return mt


def fields_of(family: str) -> dict:
    """field -> (default, JSON types) of the family's transformers class."""
    return {**BASE, **FIELDS[family]}


def _type_ok(v, types: tuple) -> bool:
    if "any" in types:
        return True
    if v is None:
        return "None" in types
    if isinstance(v, bool):
        return "bool" in types
    if isinstance(v, int):
        return "int" in types or "float" in types
    if isinstance(v, float):
        return "float" in types
    return {str: "str", list: "list", dict: "dict"}.get(type(v)) in types


def _describe(types: tuple) -> str:
    names = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "a string", "list": "a list",
             "dict": "an object", "None": "null"}
    return " or ".join(names.get(t, t) for t in types)


class Config:
    """One config.json as its transformers class receives it, checked against the family's Keys.

    c[key] is the value the class's `__init__` gets: the file's (null included) or the class's
    default. Reading a key the family does not declare is an internal error."""

    def __init__(self, raw: dict, family: str, keys: Keys):
        self.family, self.keys = family, keys
        self.fields = fields_of(family)
        aliases = ALIASES.get(family, {})
        wins = ALIAS_WINS.get(family, frozenset())
        cfg: dict = {}
        decoded = decode(raw)
        for k, v in decoded.items():
            name = aliases.get(k, k)
            if name in cfg and k != name and k not in wins:
                continue  # the canonical name wins over its alias, as transformers' later setattr does
            if k == name and any(a in decoded and aliases[a] == name for a in wins):
                continue  # ... unless the class stores the field under the alias (ALIAS_WINS)
            cfg[name] = v
        self.raw = cfg
        self._check()

    # --- the closed world -------------------------------------------------------------------

    def _check(self) -> None:
        k = self.keys
        for key, value in self.raw.items():
            if key == "model_type":
                continue
            if key in FIXED and key not in k.maps:  # Gemma 4 reads its per_layer_config
                want, why = FIXED[key]
                if value != want:
                    raise Unsupported(key, f"{_show(value)}: {why}")
                continue
            if key in k.maps or key in k.legacy or (key in LEGACY_ROPE and "rope_parameters" in k.maps):
                self._value_ok(key, value)
                continue
            if key in k.inert or key in INERT:
                if key in self.fields and not _type_ok(value, self.fields[key][1]):
                    raise Unsupported(key, f"{_show(value)} is not {_describe(self.fields[key][1])}, which transformers' "
                                      f"{CLASSES[self.family]} takes here")
                continue
            if key in self.fields:
                if value == self.fields[key][0]:
                    continue
                raise Unsupported(key, f"{_show(value)}, not transformers' default {_show(self.fields[key][0])}: the importer does not "
                                  f"map this key of {CLASSES[self.family]}, so it cannot tell whether it changes the function")
            raise Unsupported(key, f"not a key of transformers' {CLASSES[self.family]} the importer knows: it cannot tell whether "
                              "it changes the function")

    def _value_ok(self, key: str, value) -> None:
        types = self.fields.get(key, (None, ("any",)))[1]
        if not _type_ok(value, types):
            if value is None:
                raise Unsupported(key, f"null is not a value of this key (transformers' {CLASSES[self.family]} takes {_describe(types)})")
            raise Unsupported(key, f"{_show(value)} is not {_describe(types)}, which transformers' {CLASSES[self.family]} takes here")
        if isinstance(value, float) and not math.isfinite(value) and key not in ("time_step_limit",):
            raise Unsupported(key, f"{_show(value)} is not a finite number")
        if key in SIZES and value is not None and not (isinstance(value, str) and "str" in types):  # "auto": a dt rank's
            lo = 0 if key in SIZES_FROM_ZERO.get(self.family, ()) else 1
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= MAX_SIZE:
                raise Unsupported(key, f"{_show(value)}: a size is a whole number from {lo} to {MAX_SIZE}")
        if isinstance(value, list):
            for v in value:
                if isinstance(v, float) and math.isnan(v):
                    raise Unsupported(key, "NaN is not a value here")

    # --- reading ------------------------------------------------------------------------------

    def __getitem__(self, key: str):
        if key not in self.keys.maps and key not in self.keys.legacy and key not in LEGACY_ROPE:
            raise AssertionError(f"the {self.family} reader reads '{key}' without declaring it in its Keys.maps")
        if key in self.raw:
            return self.raw[key]
        if key in self.fields:
            return self.fields[key][0]
        return None

    def given(self, key: str) -> bool:
        """Whether config.json writes the key (null included)."""
        return key in self.raw

    def rope(self) -> tuple[dict, str]:
        """(the rope parameters transformers standardises, the key they came from): rope_scaling replaces
        rope_parameters, then rope_theta and partial_rotary_factor (or the family's legacy names) fill in."""
        where = "rope_parameters"
        rope = self["rope_parameters"]
        old = self.raw.get("rope_scaling")
        if old:
            if not isinstance(old, dict):
                raise Unsupported("rope_scaling", f"{_show(old)} is not an object")
            rope, where = old, "rope_scaling"
        rope = dict(rope or {})
        if any(isinstance(v, dict) for v in rope.values()):
            raise Unsupported(where, "rope parameters per layer type are not mapped for this family")
        for k, v in rope.items():
            if k not in ROPE_KEYS and k not in FAMILY_ROPE_KEYS.get(self.family, ()):
                raise Unsupported(f"{where}.{k}", "not a rope parameter the importer knows: it cannot tell whether it changes the function")
            if isinstance(v, float) and not math.isfinite(v):
                raise Unsupported(f"{where}.{k}", f"{_show(v)} is not a finite number")
            if k in ("long_factor", "short_factor"):
                continue
            if k != "truncate" and isinstance(v, bool) or not isinstance(v, (int, float, str, bool, type(None))):
                raise Unsupported(f"{where}.{k}", f"{_show(v)} is not a value of a rope parameter")
        theta_key = next((k for k, to in self.keys.legacy.items() if to == "rope_theta"), "rope_theta")
        partial_key = next((k for k, to in self.keys.legacy.items() if to == "partial_rotary_factor"), "partial_rotary_factor")
        # a family with its own legacy name reads only that one (GPT-NeoX's rotary_pct, not partial_rotary_factor)
        theta = self.raw.get(theta_key, DEFAULT_THETA.get(self.family, 10000.0))
        rope.setdefault("rope_theta", theta)
        partial = self.raw.get(partial_key, PARTIAL_DEFAULT.get(self.family))
        if partial is not None:
            rope.setdefault("partial_rotary_factor", partial)
        rope.setdefault("rope_type", rope.get("type", "default"))
        for k in ("rope_theta", "partial_rotary_factor", "factor"):
            v = rope.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise Unsupported(f"{where}.{k}", f"{_show(v)} is not a positive number")
        return rope, where


# The partial rotary factor a class fills in when config.json gives none (Phi's 0.5, GPT-NeoX's rotary_pct 0.25).
PARTIAL_DEFAULT = {"phi": 0.5, "gpt_neox": 0.25, "glm": 0.5, "glm4": 0.5, "stablelm": 0.25}
PARTIAL_DEFAULT["bamba"] = 0.5  # BambaConfig.__post_init__ hard-codes it
PARTIAL_DEFAULT["glm4_moe"] = 0.5  # Glm4MoeConfig.__post_init__
PARTIAL_DEFAULT.update({"nemotron": 0.5, "persimmon": 0.5})


def _show(v) -> str:
    import json

    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
