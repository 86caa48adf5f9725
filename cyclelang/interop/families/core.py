"""What every family module shares: the `Arch` record, the activation tables, the rotary and config-key readers,
the Keys and transformers-class tables each family fills, and the helpers that write a spec's lines."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ... import ir
from ..closed import Config, Keys, Unsupported

# transformers activations -> the language's. A gated MLP (Llama's gate/up/down)
# takes the gated form of its activation.
_PLAIN_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": None,
               "relu": "relu", "silu": "silu", "swish": "silu", "relu2": "relu2"}
_GATED_ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh"}
_HF_PLAIN = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu", "relu2": "relu2"}
_HF_GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh"}


@dataclass(frozen=True)
class Arch:
    """One decoder-only transformer of a family: what its config says, in the language's terms."""

    family: str  # the config's model_type
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    act: str  # the language's activation (swiglu for Llama's silu-gated MLP)
    norm: str  # layernorm | rmsnorm
    eps: float
    position: str = "none"  # learned | none
    norm_bias: bool = False
    norm_affine: bool = True  # false: OLMo's norms without weight or bias
    norm_offset: float = 0.0  # Gemma: the gain is 1 + w
    post_norms: bool = False  # OLMo-2: each branch's norm sits after its turbine, none before
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: str = "none"  # none | head (Qwen3) | all (OLMo-2: across the heads)
    qk_eps: float = 1e-6
    attn_scale: float | None = None  # None: 1 / sqrt(head_dim)
    embed_scale: float = 1.0  # Gemma: sqrt(width); Granite: embedding_multiplier
    residual_scale: float = 1.0  # Granite: residual_multiplier
    logit_scale: float = 1.0  # Granite: 1 / logits_scaling
    rotary: float = 0.0  # fraction of each head rotated
    rotary_base: float = 10000.0
    window: int | None = None
    experts: int = 0  # 0: a dense MLP
    top: int = 0
    normalize: bool = True
    shared: int = 0  # a shared expert's hidden width (Qwen2-MoE)
    shared_gate: bool = False
    tied: bool = False
    padding: int | None = None  # the embedding's padding_idx (pad_token_id)
    parallel: str = "none"  # none | shared: attention and MLP read one norm (Phi) | separate: each its own (GPT-NeoX)
    head_bias: bool = False
    rotary_interleaved: bool = False  # GPT-J's rotate-every-two
    rotary_scaling: ir.RotaryScaling | None = None  # linear, dynamic NTK, llama3 or YaRN (rope_parameters.rope_type)
    softcap: float | None = None  # Gemma 2's attn_logit_softcapping
    logit_softcap: float | None = None  # Gemma 2's final_logit_softcapping
    alibi: bool = False  # Falcon's alibi (its bias scaled with the logits)
    alibi_scaled: bool = True  # ... as Falcon's is; BLOOM adds its bias after the scale
    embed_norm: bool = False  # BLOOM: a LayerNorm right after the token embedding
    sandwich: bool = False  # Gemma 2: a norm before and after each turbine
    layer_windows: tuple = ()  # Gemma 2: each layer's sliding window (None: global attention); empty: every layer's is `window`
    layer_dense: tuple = ()  # Qwen2-MoE: whether each layer is a dense MLP (mlp_only_layers, decoder_sparse_step); empty: every layer routes
    dense_hidden: int = 0  # ... the dense layers' intermediate_size
    layer_attn: tuple = ()  # SmolLM3, EXAONE 4, OLMo 3: each layer's (window, rotary, rotary_base, rotary_scaling) where rotary differs by layer
    qk_type: str = "rmsnorm"  # the qk-norms' kind (Persimmon: layernorm)
    qk_bias: bool = False  # Persimmon's qk layernorms have a bias
    qk_offset: float = 0.0  # Gemma 3: the qk-norms' gain is 1 + w
    qk_affine: bool = True  # nanochat: weightless qk-norms
    qk_late: bool = False  # nanochat: the qk-norms act after rotary
    qk_heads: bool = False  # StableLM, Cohere: each head its own qk-norm gain
    local_rotary: tuple = ()  # Gemma 3: (rotary base, rotary scaling) of the sliding layers where they differ from the global layers'
    router: str = "softmax"  # DeepSeek-V3's router (families/routed_v3.py): softmax | sigmoid scores
    groups: int = 1  # ... n_group
    top_groups: int = 1  # ... topk_group
    route_scale: float = 1.0  # ... routed_scaling_factor
    correction: bool = False  # ... a selection-only bias per expert (e_score_correction_bias)
    sinks: bool = False  # gpt-oss (families/sinks.py): a learned logit per head in every softmax
    router_bias: bool = False  # gpt-oss: the router's linear has a bias
    clamp: float = 7.0  # gpt-oss: the experts' swiglu_clamp bound (swiglu_limit)
    sources: dict = field(default_factory=dict, compare=False)  # Arch field -> the config field it came from


def _rotary(partial, head_dim: int) -> float:
    """The rotary fraction, refusing one that rotates an odd number of dims (transformers rounds it down, then pairs them unevenly)."""
    dims = int(head_dim * float(partial))
    if dims % 2:
        raise Unsupported("partial_rotary_factor", f"{partial} of head_dim {head_dim} rotates {dims} dims, an odd number: no pairing of them is exact")
    return float(partial)


def _dynamic_context(context: int, scaling: ir.RotaryScaling | None) -> int:
    """The spec's context: dynamic NTK runs past max_position_embeddings (its original), to factor times it."""
    return int(context * scaling.factor) if scaling is not None and scaling.type == "dynamic" else context


def _rope_config(a: Arch, rope: dict) -> dict:
    """rope_parameters with the Arch's rotary scaling written in, for export."""
    sc = a.rotary_scaling
    if sc is None:
        return rope
    rope = {**rope, "rope_type": sc.type, "factor": sc.factor}
    if sc.type in ("llama3", "yarn"):
        rope["original_max_position_embeddings"] = sc.original
    if sc.type == "llama3":
        rope.update(low_freq_factor=sc.low, high_freq_factor=sc.high)
    if sc.type == "yarn":
        rope.update(beta_fast=sc.beta_fast, beta_slow=sc.beta_slow, attention_factor=sc.gain())
        if not sc.truncate:
            rope["truncate"] = False
    if sc.temperature:
        if a.family not in QUERY_TEMPERATURE:
            raise Unsupported("rotary_temperature", f"{a.family}'s attention has no query temperature; {', '.join(sorted(QUERY_TEMPERATURE))} has")
        rope.update(llama_4_scaling_beta=sc.temperature, original_max_position_embeddings=sc.original)
    return rope


def _max_positions(a: "Arch") -> int:
    """max_position_embeddings for export: dynamic NTK's original context, else the spec's context."""
    return a.rotary_scaling.original if a.rotary_scaling is not None and a.rotary_scaling.type == "dynamic" else a.context


def _scaling_text(sc: ir.RotaryScaling | None) -> str:
    """The attention options that write a rotary scaling."""
    if sc is None:
        return ""
    out = f" rotary_scaling={sc.type} rotary_factor={_num(sc.factor)}"
    if sc.type != "linear":
        out += f" rotary_original={sc.original}"
    if sc.type == "llama3":
        out += f" rotary_low={_num(sc.low)} rotary_high={_num(sc.high)}"
    if sc.type == "yarn":
        out += "".join(f" rotary_{k}={_num(getattr(sc, k))}" for k, d in (("beta_fast", 32.0), ("beta_slow", 1.0)) if getattr(sc, k) != d)
        if sc.attention_factor is not None:
            out += f" rotary_attention_factor={_num(sc.attention_factor)}"
        if not sc.truncate:
            out += " rotary_truncate=false"
    if sc.temperature:
        out += f" rotary_temperature={_num(sc.temperature)}"
    return out


def _engine_lines(a, src: dict, feed: str, body: list[str], norm: str) -> list[str]:
    """The engine block of an expander family's spec: causal, its feed line, its stages, the final norm
    and the head (tied where the checkpoint ties it)."""
    return [f"engine {a.family} {{", "  chamber width=d_model", "  throat causal", f"  {feed}", "", *body, "",
            f"  {norm}  # the final norm", "  nozzle head" + (" tied" if a.tied else "") + _comment(src, "tied"), "}", ""]


def _header(family: str, source: str) -> list[str]:
    """The comment every imported spec opens with (and a blank line)."""
    return [f"# {'An' if family[0] in 'aeiou' else 'A'} {family} checkpoint, imported from {source} by `cyclec import`.",
            "# Every value comes from the config field named beside it; the weights load with",
            "# cyclelang.interop.load_transformers(model, checkpoint).", ""]


_SCALINGS = ("linear", "dynamic", "llama3", "yarn")
# The families whose attention multiplies its rotated queries by Llama 4's temperature,
# 1 + rope_parameters.llama_4_scaling_beta ln(1 + floor(position / original_max_position_embeddings)).
QUERY_TEMPERATURE = frozenset({"ministral3"})


def _rope_kind(c: Config) -> tuple[dict, str, str]:
    """(rope parameters, where they came from, rope_type), refusing a rotary scaling the language does not have (longrope, ...)."""
    rope, where = c.rope()
    kind = rope.get("rope_type")
    if kind not in ("default", *_SCALINGS):
        raise Unsupported(f"{where}.rope_type", f"rotary scaling {kind!r} is not in the language; it has {', '.join(_SCALINGS)} "
                          "(and plain rotary, rope_type=default)")
    beta = rope.get("llama_4_scaling_beta")
    if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta <= ir.nodes.MAX_TEMPERATURE):
        raise Unsupported(f"{where}.llama_4_scaling_beta", f"{beta!r} is not a query temperature (a number in [0, {ir.nodes.MAX_TEMPERATURE:g}])")
    if beta is None and c.family in QUERY_TEMPERATURE:  # its attention multiplies by 1 + beta ...: no default to fall to
        raise Unsupported(f"{where}.llama_4_scaling_beta", f"{c.family}'s attention reads it (0 for none); these rope parameters lack it, "
                          "and transformers' model cannot run without it")
    if beta and c.family not in QUERY_TEMPERATURE:  # a key this family's attention never reads: refused rather than guessed inert
        raise Unsupported(f"{where}.llama_4_scaling_beta", f"{c.family}'s attention does not read Llama 4's query temperature "
                          f"(only the attention of {', '.join(sorted(QUERY_TEMPERATURE))} does)")
    if beta and kind in ("default", "linear"):  # transformers divides the positions by original_max_position_embeddings
        raise Unsupported(f"{where}.llama_4_scaling_beta", f"the query temperature counts positions in original contexts; rope_type "
                          f"{kind!r} has none (the language carries it on a dynamic, llama3 or yarn scaling)")
    return rope, where, kind


def _rope(c: Config) -> float:
    """rope_theta, as transformers standardises it (rope_parameters, rope_scaling, the legacy keys, the class's default)."""
    return float(_rope_kind(c)[0]["rope_theta"])


def _partial(c: Config) -> float:
    return _rope_kind(c)[0].get("partial_rotary_factor", 1.0)


def _rope_scaling(c: Config, context: int) -> ir.RotaryScaling | None:
    """The rotary scaling a config's rope parameters say, as transformers' rope_utils reads them."""
    rope, where, kind = _rope_kind(c)
    if kind == "default":
        return None
    f = f"{where}."
    # transformers gives a config's own original_max_position_embeddings (Phi-3 keeps it there) priority
    original = (c["original_max_position_embeddings"] if "original_max_position_embeddings" in c.keys.maps else None) \
        or rope.get("original_max_position_embeddings") or context
    factor = rope.get("factor")
    if kind == "dynamic":  # transformers' dynamic NTK grows the base past max_position_embeddings
        original = context
    if factor is None:
        if kind != "yarn":
            raise Unsupported(f + "factor", f"rotary scaling '{kind}' needs its factor")
        factor = context / original
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise Unsupported(f + "original_max_position_embeddings", f"{original!r} is not a context length")
    truncate = rope.get("truncate", True)
    if kind == "yarn" and not isinstance(truncate, bool):
        raise Unsupported(f + "truncate", f"{truncate!r} is not true or false")
    gain = None
    if kind == "yarn":
        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
        gain = rope.get("attention_factor")
        if gain is None and rope.get("mscale") and rope.get("mscale_all_dim"):
            gain = float(mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"]))
    temperature = float(rope.get("llama_4_scaling_beta") or 0.0)
    period = rope.get("original_max_position_embeddings")
    if temperature and period != original:  # the temperature counts in the rope's own original context
        raise Unsupported(f + "llama_4_scaling_beta", "the query temperature counts positions in original_max_position_embeddings, "
                          + ("which these rope parameters lack" if period is None else f"{period!r}")
                          + f", and the rotary scaling's original context is {original}: the language has one original context for both")
    return ir.RotaryScaling(type=kind, factor=float(factor), original=None if kind == "linear" else int(original),
                            low=float(rope.get("low_freq_factor", 1.0)), high=float(rope.get("high_freq_factor", 4.0)),
                            beta_fast=float(rope.get("beta_fast") or 32.0), beta_slow=float(rope.get("beta_slow") or 1.0),
                            attention_factor=None if gain is None else float(gain), truncate=kind != "yarn" or truncate,
                            temperature=temperature)


def _divides(n: int, heads: int, key: str, of: str) -> None:
    if n % heads:
        raise Unsupported(key, f"{heads} heads do not divide {of} {n}")


def _eps(c: Config, key: str) -> float:
    v = float(c[key])
    if not v > 0:
        raise Unsupported(key, f"{v!r}: a norm's eps is a positive number")
    return v


def _kv(c: Config, heads: int, key: str = "num_key_value_heads") -> int:
    """Key/value heads: null is all the query heads (every class's __post_init__ says so)."""
    kv = c[key]
    kv = heads if kv is None else kv
    if heads % kv:
        raise Unsupported(key, f"{kv} key/value heads do not divide {heads} query heads")
    return kv


# The Llama-shaped families: rotary, gated MLP (or routed experts), Pre-LN (OLMo-2: post-branch norms).
_LLAMA = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "hidden_act", "max_position_embeddings", "rms_norm_eps", "pad_token_id", "tie_word_embeddings", "rope_parameters"})
_TP = {"pretraining_tp": "how the matmuls were split at pretraining; transformers' forward no longer reads it"}


def _types(c: Config, layers: int, default) -> list:
    """layer_types (or the class's default pattern), each sliding_attention or full_attention."""
    types = c["layer_types"]
    types = default() if types is None else types
    if not isinstance(types, list) or len(types) != layers or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise Unsupported("layer_types", f"layer_types are sliding_attention or full_attention, one per layer ({layers})")
    return types


def _sliding(c: Config) -> int | None:
    """sliding_window where the family uses it: a number of positions, or null for none."""
    w = c["sliding_window"]
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 2 ** 40):
        raise Unsupported("sliding_window", f"{w!r}: a window is a whole number of positions from 1 (null: none)")
    return w


def _windows(types: list, window) -> tuple[int | None, tuple]:
    """(the window when every layer has the same, ()), or (None, each layer's window)."""
    per = tuple(window if t == "sliding_attention" else None for t in types)
    return (per[0], ()) if len(set(per)) == 1 else (None, per)


def _cap(c: Config, key: str) -> float | None:
    """A soft-cap: null (or 0) is none, as in transformers' `if softcap is not None`."""
    v = c[key]
    if v is not None and not v > 0:
        raise Unsupported(key, f"{v!r}: a soft-cap is a positive number (null: none)")
    return None if v is None else float(v)


def _padding(c: Config, key: str = "pad_token_id") -> int | None:
    """The embedding's padding row (pad_token_id), within the vocabulary as nn.Embedding needs it."""
    pad, vocab = c[key], c["vocab_size"]
    if pad is not None and not -vocab <= pad < vocab:
        raise Unsupported(key, f"{pad} is not a token of the vocabulary (0 to {vocab - 1})")
    return pad if pad is None or pad >= 0 else vocab + pad  # nn.Embedding counts a negative padding_idx from the end


def _count(c: Config, key: str, least: int = 1) -> int:
    """A whole number of at least `least` (null and floats refused: transformers' layers take it as a size)."""
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise Unsupported(key, f"{v!r} is not a whole number from {least}")
    return v


def _top_ok(top: int, experts: int, key: str) -> int:
    if not 1 <= top <= experts:
        raise Unsupported(key, f"top-{top} of {experts} experts")
    return experts


# Every claimed family's Keys (closed.py), filled in by the family modules as they are imported.
KEYS: dict[str, Keys] = {}

# The transformers classes a family's weights come from (what export's config names).
CAUSAL_LM = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
             "qwen2": "Qwen2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "olmo": "OlmoForCausalLM",
             "olmo2": "Olmo2ForCausalLM", "gemma": "GemmaForCausalLM", "granite": "GraniteForCausalLM", "phi": "PhiForCausalLM",
             "starcoder2": "Starcoder2ForCausalLM", "gpt_neox": "GPTNeoXForCausalLM", "gptj": "GPTJForCausalLM", "falcon": "FalconForCausalLM",
             "mamba2": "Mamba2ForCausalLM", "mamba": "MambaForCausalLM", "jamba": "JambaForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
             "gemma2": "Gemma2ForCausalLM", "bloom": "BloomForCausalLM", "ministral": "MinistralForCausalLM", "ministral3": "Ministral3ForCausalLM",
             "seed_oss": "SeedOssForCausalLM", "internlm3": "LlamaForCausalLM", "iquestcoder": "LlamaForCausalLM",
             "emu3_text_model": "Emu3ForCausalLM",
             "qwen3_moe": "Qwen3MoeForCausalLM",
             "olmoe": "OlmoeForCausalLM",
             "flex_olmo": "FlexOlmoForCausalLM",
             "granitemoe": "GraniteMoeForCausalLM",
             "granitemoeshared": "GraniteMoeSharedForCausalLM",
             "aria_text": "AriaTextForCausalLM",
             "mellum": "MellumForCausalLM"}


# --- the spec an Arch implies -----------------------------------------------------------------


def _num(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        if x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return repr(x)
    return str(x)


def _comment(src: dict, *keys: str) -> str:
    names = [src[k] for k in keys if src.get(k)]
    return f"  # {', '.join(dict.fromkeys(names))}" if names else ""


def _layer_runs(family: str, kinds: list) -> list[str]:
    """The engine's stage lines for a per-layer pattern (each layer's kind): the longest stretch that
    repeats a period of layers (twice or more) is one nested stage (`stage layers x 4 { stage local =
    gemma3_text_local x 5  stage global = gemma3_text_global }`), the layers before and after it each
    run of one kind in turn (first-k-dense: `stage layers_0 = ..._dense`, then the rest)."""
    n = len(kinds)
    best = None  # (layers covered, -stage lines, -start, start, period, repeats)
    for start in range(n):
        for period in range(2, (n - start) // 2 + 1):
            one = kinds[start : start + period]
            if len(set(one)) < 2:  # one kind repeated is a run, not a pattern
                continue
            repeats = 1
            while kinds[start + repeats * period : start + (repeats + 1) * period] == one:
                repeats += 1
            if repeats >= 2:  # the most layers covered, then the fewest stage lines
                end = start + repeats * period
                lines = _run_count(kinds[:start]) + _run_count(one) + _run_count(kinds[end:])
                key = (repeats * period, -lines, -start)
                if best is None or key > best[:3]:
                    best = (*key, start, period, repeats)
    if best is None:
        return _runs(family, kinds, 0)
    *_, start, period, repeats = best
    one = kinds[start : start + period]
    end = start + period * repeats
    name = "layers" if start == 0 and end == n else f"layers_{start}"
    inner, i = [], 0
    while i < period:  # each run of one kind in the period, one stage `x k`
        j = i
        while j < period and one[j] == one[i]:
            j += 1
        nm = one[i] if sum(1 for k in range(period) if (k == 0 or one[k] != one[k - 1]) and one[k] == one[i]) == 1 else f"{one[i]}_{i}"
        inner.append(f"    stage {nm} = {family}_{one[i]}" + (f" x {j - i}" if j - i > 1 else ""))
        i = j
    nested = [f"  stage {name} x {repeats} {{  # {' '.join(one)}: layers {start} to {end - 1}", *inner, "  }"]
    return _runs(family, kinds[:start], 0) + nested + _runs(family, kinds[end:], end)


def _run_count(kinds: list) -> int:
    """How many runs of one kind `kinds` falls into."""
    return sum(1 for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1])


def _runs(family: str, kinds: list, first: int) -> list[str]:
    """Stage lines for layers first, first + 1, ...: each run of one kind one stage `x N`."""
    out, i = [], 0
    while i < len(kinds):
        j = i
        while j < len(kinds) and kinds[j] == kinds[i]:
            j += 1
        lo, hi = first + i, first + j - 1
        out.append(f"  stage layers_{lo} = {family}_{kinds[i]}" + (f" x {j - i}" if j - i > 1 else "") + f"  # layer {lo}"
                   + (f" to {hi}" if hi > lo else ""))
        i = j
    return out


def _dump(node):
    return None if node is None else node.model_dump_json()


def _run_order(stages: list) -> list:
    """The leaf stage (a stage of ops) each layer runs, in order: repeats and groups unfolded."""
    return [v.stage for v in ir.walk(stages, unroll=True) if not v.stage.is_group]


def _reactor(stage: ir.Stage):
    """A stage's MLP or MoE turbine."""
    return next((op for op in _ops(stage) if isinstance(op, (ir.Mlp, ir.Moe))), None)


def _window(stage: ir.Stage):
    """The window of a stage's attention (None: global, or no attention)."""
    for op in _ops(stage):
        if isinstance(op, ir.Attention):
            return op.window
    return None


def _ops(node):
    for op in getattr(node, "ops", None) or getattr(node, "branches", None) or ():
        yield op
        yield from _ops(op)


_PER_LAYER = ("window", "rotary_dims", "rotary_base", "rotary_interleaved", "rotary_scaling")


def _whole(x: float):
    """x as an int when it is one but for rounding (query_pre_attn_scalar 24 from its scale 24**-0.5)."""
    return round(x) if abs(x - round(x)) < 1e-9 * max(1.0, abs(x)) else x
