"""The GPT-2 lineage: learned positions, LayerNorm, an ungated MLP, biases (issue 33).

gpt_bigcode (multi-query attention, one fused c_attn), gpt_neo (local and global layers in a
pattern, no 1/sqrt(d) scaling, no q/k/v bias), opt (a position table offset by 2 rows, Pre-LN
or Post-LN, ReLU), biogpt (the same offset table, embeddings scaled by sqrt(d)), openai-gpt
(GPT-1: Post-LN, no final norm), ctrl (sinusoids [sines | cosines]: loaded with the residual channels
permuted into the feed's interleaved order), gpt_neox_japanese (rotary, no biases but the last layer's attention
output bias) and gpt-sw3 (GPT2Config under another model_type: read as GPT-2 in families/__init__.py).

Each reader is closed-world (`closed.Config`): it reads only the keys its `Keys` map. A
`Gpt` is what a config says in the language's terms; `spec_text` writes its spec,
`engine_config` writes the config of a spec (export), `plan` maps the weights (plans.py).

OPT's and BioGPT's position tables have 2 rows more than max_position_embeddings: position p
reads row p + 2 (row 1 only by a padded token, whose position is -1; row 0 never). The
spec's table is the same table rolled by 2 rows (its row p is theirs p + 2; their rows 0
and 1 sit at its end), so its context is max_position_embeddings + 2: every sequence
transformers runs reads the same rows; the two last positions of the spec's context are
past what transformers allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import ir
from .closed import Config, Keys, Unsupported, _show

# transformers activation -> the language's (an ungated MLP)
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
_HF_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
OFFSET = 2  # OPT's and BioGPT's position tables: position p reads row p + 2


@dataclass(frozen=True)
class Gpt:
    """One checkpoint of the GPT-2 lineage, in the language's terms."""

    family: str
    vocab: int
    context: int  # the spec's context (OPT, BioGPT: max_position_embeddings + 2)
    width: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    act: str
    eps: float
    post_ln: bool = False  # a LayerNorm after each residual add (GPT-1, OPT's do_layer_norm_before=false)
    final_norm: bool = True
    norm_affine: bool = True  # OPT's layer_norm_elementwise_affine
    offset: int = 0  # rows of the position table before position 0 (OPT, BioGPT: 2)
    embed_scale: float = 1.0  # BioGPT's sqrt(hidden_size)
    attn_scale: float | None = None  # None: 1 / sqrt(head_dim); GPT-Neo: 1
    windows: tuple = ()  # each layer's window (None: global); (): every layer global
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    tied: bool = True
    padding: int | None = None  # the token embedding's padding_idx
    position: str = "learned"  # learned | none (GPT-NeoX-Japanese: rotary)
    rotary: float = 0.0  # the fraction of each head rotated (GPT-NeoX's halves)
    rotary_base: float = 10000.0
    last_out_bias: bool = False  # GPT-NeoX-Japanese: the last layer's attention alone has an output bias
    final_eps: float | None = None  # the final norm's eps where it differs from the layers' (CTRL)
    head_bias: bool = False  # CTRL's lm_head has a bias
    halves: bool = False  # CTRL: the sinusoids laid out [all sines | all cosines]; the residual channels are permuted on load
    sources: dict = field(default_factory=dict, compare=False)


_DROP = "dropout: inactive in evaluation, and cyclelang trains without it"
_LAYERDROP = "LayerDrop skips whole layers at random while training only: inactive in evaluation, and cyclelang trains without it"
_NO_PAD = "the embedding has no padding row: the forward does not read it"
_HEADS = "the double-heads model's multiple-choice head; the causal LM has none"
_FP32 = ("a precision switch for half-precision softmax; transformers 5's attention takes the softmax in float32 whatever it says "
         "(the module stores it and never reads it)")

KEYS: dict[str, Keys] = {
    "gpt_bigcode": Keys(frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
                                   "layer_norm_epsilon", "scale_attn_weights", "multi_query", "tie_word_embeddings",
                                   "num_key_value_heads"}),
                        {"pad_token_id": "GPTBigCode's embedding has no padding row: the forward does not read it",
                         "attention_softmax_in_fp32": _FP32, "scale_attention_softmax_in_fp32": _FP32}),
    "gpt_neo": Keys(frozenset({"vocab_size", "max_position_embeddings", "hidden_size", "num_layers", "attention_types", "attention_layers", "num_heads",
                               "intermediate_size", "window_size", "activation_function", "layer_norm_epsilon", "tie_word_embeddings"}),
                    {"resid_dropout": _DROP, "embed_dropout": _DROP, "pad_token_id": "GPT-Neo's " + _NO_PAD}),
    "opt": Keys(frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "ffn_dim", "max_position_embeddings", "do_layer_norm_before",
                           "_remove_final_layer_norm", "word_embed_proj_dim", "num_attention_heads", "activation_function",
                           "pad_token_id", "enable_bias", "layer_norm_elementwise_affine", "tie_word_embeddings"}),
                {"dropout": _DROP, "layerdrop": _LAYERDROP, "init_std": "the spread of freshly initialised weights; an import loads every weight"}),
    "biogpt": Keys(frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                              "max_position_embeddings", "scale_embedding", "pad_token_id", "tie_word_embeddings"}),
                   {"hidden_dropout_prob": _DROP, "attention_probs_dropout_prob": _DROP, "activation_dropout": _DROP, "layerdrop": _LAYERDROP,
                    "layer_norm_eps": "transformers' BioGPT builds every LayerNorm with PyTorch's default eps (1e-5): it never reads this"}),
    "openai-gpt": Keys(frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "afn", "layer_norm_epsilon", "tie_word_embeddings"}),
                       {"summary_type": _HEADS, "summary_use_proj": _HEADS, "summary_activation": _HEADS, "summary_proj_to_labels": _HEADS,
                        "summary_first_dropout": _HEADS, "pad_token_id": "GPT-1's " + _NO_PAD}),
    "ctrl": Keys(frozenset({"vocab_size", "n_positions", "n_embd", "dff", "n_layer", "n_head", "layer_norm_epsilon", "tie_word_embeddings"}),
                 {"pad_token_id": "CTRL's " + _NO_PAD}),
    "gpt_neox_japanese": Keys(frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_multiple_size",
                                         "hidden_act", "max_position_embeddings", "layer_norm_eps", "rope_parameters", "tie_word_embeddings"}),
                              {"is_decoder": "marks the model for use as an encoder-decoder's decoder; the causal LM does not read it",
                               "pad_token_id": "GPT-NeoX-Japanese's " + _NO_PAD},
                              {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"}),
}

CAUSAL_LM = {"gpt_bigcode": "GPTBigCodeForCausalLM", "gpt_neo": "GPTNeoForCausalLM", "opt": "OPTForCausalLM", "biogpt": "BioGptForCausalLM",
             "openai-gpt": "OpenAIGPTLMHeadModel", "gpt_neox_japanese": "GPTNeoXJapaneseForCausalLM", "ctrl": "CTRLLMHeadModel"}

# the engine name a spec of each family carries (a spec's names are identifiers), and back
ENGINE = {"gpt_bigcode": "gpt_bigcode", "gpt_neo": "gpt_neo", "opt": "opt", "biogpt": "biogpt", "openai-gpt": "openai_gpt",
          "gpt_neox_japanese": "gpt_neox_japanese", "ctrl": "ctrl"}
FAMILY_OF_ENGINE = {v: k for k, v in ENGINE.items()}

# the prefix of the base model's keys, and the embedding's and head's keys (without it / with it)
PREFIX = {"gpt_bigcode": "transformer.", "gpt_neo": "transformer.", "opt": "model.decoder.", "biogpt": "biogpt.", "openai-gpt": "transformer.",
          "gpt_neox_japanese": "gpt_neox_japanese.", "ctrl": "transformer."}
EMBED_HEAD = {"gpt_bigcode": ("wte.weight", "lm_head.weight"), "gpt_neo": ("wte.weight", "lm_head.weight"),
              "opt": ("embed_tokens.weight", "lm_head.weight"), "biogpt": ("embed_tokens.weight", "output_projection.weight"),
              "openai-gpt": ("tokens_embed.weight", "lm_head.weight"), "gpt_neox_japanese": ("embed_in.weight", "embed_out.weight"),
              "ctrl": ("w.weight", "lm_head.weight")}


def _eps(c: Config, key: str) -> float:
    v = float(c[key])
    if not v > 0:
        raise Unsupported(key, f"{v!r}: a norm's eps is a positive number")
    return v


def _act(c: Config, key: str) -> str:
    name = c[key]
    act = _ACTS.get(name) if isinstance(name, str) else None
    if act is None:
        raise Unsupported(key, f"{name!r} has no counterpart among the language's activations")
    return act


def _divides(width: int, heads: int, key: str, of: str) -> int:
    if width % heads:
        raise Unsupported(key, f"{heads} heads do not divide {of} {width}")
    return width // heads


def _padding(c: Config) -> int | None:
    pad, vocab = c["pad_token_id"], c["vocab_size"]
    if pad is None:
        return None
    if not -vocab <= pad < vocab:
        raise Unsupported("pad_token_id", f"{pad} is not a token of the vocabulary (0 to {vocab - 1})")
    return pad if pad >= 0 else vocab + pad


def _gpt_bigcode(c: Config) -> Gpt:
    if not c["scale_attn_weights"]:
        raise Unsupported("scale_attn_weights", "GPTBigCode without the 1/sqrt(head_dim) scale is not mapped")
    width, heads = c["n_embd"], c["n_head"]
    _divides(width, heads, "n_head", "n_embd")
    kv = 1 if c["multi_query"] else heads
    if c.given("num_key_value_heads") and c["num_key_value_heads"] != kv:  # __post_init__ derives it; the attention reads multi_query
        raise Unsupported("num_key_value_heads", f"{c['num_key_value_heads']!r}, but multi_query={_show(c['multi_query'])} gives {kv}: "
                          "which one the checkpoint means is not known")
    return Gpt("gpt_bigcode", c["vocab_size"], c["n_positions"], width, c["n_layer"], heads, kv,
               c["n_inner"] or 4 * width, _act(c, "activation_function"), _eps(c, "layer_norm_epsilon"), tied=bool(c["tie_word_embeddings"]),
               sources={"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                        "kv_heads": "multi_query", "hidden": "n_inner", "act": "activation_function", "eps": "layer_norm_epsilon",
                        "tied": "tie_word_embeddings"})


def _gpt_neo(c: Config) -> Gpt:
    width, heads, layers = c["hidden_size"], c["num_heads"], c["num_layers"]
    _divides(width, heads, "num_heads", "hidden_size")
    types = c["attention_types"]
    types = [[["global", "local"], 12]] if types is None else types
    kinds: list = []
    try:  # GPTNeoConfig.expand_attention_types_params: [[kinds, n], ...] -> kinds n times each
        for kinds_n in types:
            names, n = kinds_n
            if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(names, list):
                raise TypeError
            kinds.extend(list(names) * n)
            if len(kinds) > layers:
                break
    except (TypeError, ValueError):
        raise Unsupported("attention_types", "attention_types is a list of [[\"global\" | \"local\", ...], count]") from None
    if c.given("attention_layers"):  # __post_init__ expands attention_types into it, then the file's own value replaces it
        kinds = c["attention_layers"]
        if not isinstance(kinds, list):
            raise Unsupported("attention_layers", "attention_layers is a list, one \"global\" or \"local\" per layer")
        where = "attention_layers"
    else:
        where = "attention_types"
    if len(kinds) != layers:
        raise Unsupported(where, f"gives {len(kinds)} layers, not num_layers = {layers} (transformers refuses it too)")
    if any(k not in ("global", "local") for k in kinds):
        raise Unsupported(where, "each layer's attention is \"global\" or \"local\"")
    w = c["window_size"]
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise Unsupported("window_size", f"{w!r}: a window is a whole number of positions from 1")
    context = c["max_position_embeddings"]
    windows = tuple(w if k == "local" and w < context else None for k in kinds)  # a window past the context is global attention
    return Gpt("gpt_neo", c["vocab_size"], context, width, layers, heads, heads, c["intermediate_size"] or 4 * width,
               _act(c, "activation_function"), _eps(c, "layer_norm_epsilon"), attn_scale=1.0,
               windows=windows if any(x is not None for x in windows) else (), qkv_bias=False, tied=bool(c["tie_word_embeddings"]),
               sources={"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_layers",
                        "heads": "num_heads", "hidden": "intermediate_size", "act": "activation_function", "eps": "layer_norm_epsilon",
                        "window": "window_size, attention_types", "attn_scale": "GPT-Neo's unscaled attention logits",
                        "tied": "tie_word_embeddings"})


def _opt(c: Config) -> Gpt:
    width, heads = c["hidden_size"], c["num_attention_heads"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    proj = c["word_embed_proj_dim"]
    if proj is not None and proj != width:
        raise Unsupported("word_embed_proj_dim", f"{proj}, not hidden_size {width}: embeddings projected in from a narrower width "
                          "(project_in) and the last hidden state projected out (project_out) are not in the language")
    pre = bool(c["do_layer_norm_before"])
    final = pre and not c["_remove_final_layer_norm"]
    if pre and not final:
        raise Unsupported("_remove_final_layer_norm", "a Pre-LN OPT without its final LayerNorm is not mapped")
    bias = bool(c["enable_bias"])
    return Gpt("opt", c["vocab_size"], c["max_position_embeddings"] + OFFSET, width, c["num_hidden_layers"], heads, heads, c["ffn_dim"],
               _act(c, "activation_function"), 1e-5, post_ln=not pre, final_norm=final, norm_affine=bool(c["layer_norm_elementwise_affine"]),
               offset=OFFSET, qkv_bias=bias, out_bias=bias, mlp_bias=bias, tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
               sources={"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size",
                        "layers": "num_hidden_layers", "heads": "num_attention_heads", "hidden": "ffn_dim", "act": "activation_function",
                        "eps": "OPT's LayerNorms: PyTorch's default eps", "tied": "tie_word_embeddings", "padding": "pad_token_id",
                        "post_ln": "do_layer_norm_before"})


def _biogpt(c: Config) -> Gpt:
    width, heads = c["hidden_size"], c["num_attention_heads"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    return Gpt("biogpt", c["vocab_size"], c["max_position_embeddings"] + OFFSET, width, c["num_hidden_layers"], heads, heads,
               c["intermediate_size"], _act(c, "hidden_act"), 1e-5, offset=OFFSET, embed_scale=math.sqrt(width) if c["scale_embedding"] else 1.0,
               tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
               sources={"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size",
                        "layers": "num_hidden_layers", "heads": "num_attention_heads", "hidden": "intermediate_size", "act": "hidden_act",
                        "eps": "BioGPT's LayerNorms: PyTorch's default eps (layer_norm_eps is not read)", "embed_scale": "scale_embedding",
                        "tied": "tie_word_embeddings", "padding": "pad_token_id"})


def _openai_gpt(c: Config) -> Gpt:
    width, heads = c["n_embd"], c["n_head"]
    _divides(width, heads, "n_head", "n_embd")
    afn = c["afn"]
    act = {"gelu": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}.get(afn) if isinstance(afn, str) else None  # GPT-1's "gelu" is the tanh GELU
    if act is None:
        raise Unsupported("afn", f"{afn!r} is not one of GPT-1's activations (gelu, relu, silu, swish)")
    return Gpt("openai-gpt", c["vocab_size"], c["n_positions"], width, c["n_layer"], heads, heads, 4 * width, act,
               _eps(c, "layer_norm_epsilon"), post_ln=True, final_norm=False, tied=bool(c["tie_word_embeddings"]),
               sources={"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                        "hidden": "GPT-1's 4 x n_embd", "act": "afn", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings",
                        "post_ln": "GPT-1's LayerNorm after each residual add"})


def _gpt_neox_japanese(c: Config) -> Gpt:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    head_dim = _divides(width, heads, "num_attention_heads", "hidden_size")
    rope, where = c.rope()
    if rope.get("rope_type") != "default":
        raise Unsupported(f"{where}.rope_type", f"{rope.get('rope_type')!r}: rotary scaling is not mapped for GPT-NeoX-Japanese")
    partial = float(rope.get("partial_rotary_factor", 1.0))
    dims = int(head_dim * partial)
    if not 0 < partial <= 1 or dims % 2 or dims == 0:
        raise Unsupported(f"{where}.partial_rotary_factor", f"{partial} of head_dim {head_dim} rotates {dims} dims: the language rotates "
                          "an even number of them, at least 2")
    m = c["intermediate_multiple_size"]
    return Gpt("gpt_neox_japanese", c["vocab_size"], c["max_position_embeddings"], width, layers, heads, heads, int(width * m),
               _act(c, "hidden_act"), _eps(c, "layer_norm_eps"), position="none", rotary=partial, rotary_base=float(rope["rope_theta"]),
               qkv_bias=False, out_bias=False, mlp_bias=False, last_out_bias=True, tied=bool(c["tie_word_embeddings"]),
               sources={"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                        "heads": "num_attention_heads", "hidden": "hidden_size x intermediate_multiple_size", "act": "hidden_act",
                        "eps": "layer_norm_eps", "rotary": "rope_parameters (rotary_pct, rotary_emb_base)", "tied": "tie_word_embeddings"})


def _ctrl(c: Config) -> Gpt:
    width, heads = c["n_embd"], c["n_head"]
    _divides(width, heads, "n_head", "n_embd")
    if width % 2:
        raise Unsupported("n_embd", f"{width}: CTRL's sinusoids with an odd width have one sine more than cosines; the feed's need an even width")
    return Gpt("ctrl", c["vocab_size"], c["n_positions"], width, c["n_layer"], heads, heads, c["dff"], "relu", 1e-6,
               final_eps=_eps(c, "layer_norm_epsilon"), position="sinusoidal", embed_scale=math.sqrt(width), head_bias=True, halves=True,
               tied=bool(c["tie_word_embeddings"]),
               sources={"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                        "hidden": "dff", "act": "CTRL's ReLU", "eps": "CTRL's layers: a fixed 1e-6", "final_eps": "layer_norm_epsilon",
                        "embed_scale": "CTRL's sqrt(n_embd)", "tied": "tie_word_embeddings"})


READERS = {"gpt_bigcode": _gpt_bigcode, "gpt_neo": _gpt_neo, "opt": _opt, "biogpt": _biogpt, "openai-gpt": _openai_gpt, "gpt_neox_japanese": _gpt_neox_japanese, "ctrl": _ctrl}
assert set(READERS) == set(KEYS) == set(CAUSAL_LM) == set(ENGINE) == set(PREFIX)


# --- the spec a Gpt implies ---------------------------------------------------------------------


def spec_text(g: Gpt, source: str) -> str:
    from .families.core import _comment, _header, _layer_runs, _num

    src = g.sources
    norm = f"norm layernorm eps={_num(g.eps)}" + ("" if g.norm_affine else " affine=false")

    def attention(window, out_bias=g.out_bias) -> str:
        words = [f"heads={g.heads}"] + ([f"kv_heads={g.kv_heads}"] if g.kv_heads != g.heads else [])
        words += ([("rotary" if g.rotary == 1.0 else f"rotary={_num(g.rotary)}")]
                  + ([f"rotary_base={_num(g.rotary_base)}"] if g.rotary_base != 10000.0 else [])) if g.rotary else []
        words += [f"window={window}"] if window is not None else []
        words += [f"scale={_num(g.attn_scale)}"] if g.attn_scale is not None else []
        words += [f"bias={_num(g.qkv_bias)}"] + ([f"out_bias={_num(out_bias)}"] if out_bias != g.qkv_bias else [])
        keys = ["heads", "kv_heads"] + (["rotary"] if g.rotary else []) + (["window"] if window is not None else []) \
            + (["attn_scale"] if g.attn_scale is not None else [])
        return "turbine attention " + " ".join(words) + _comment(src, *keys)

    mlp = f"turbine mlp hidden={g.hidden} act={g.act} bias={_num(g.mlp_bias)}{_comment(src, 'hidden', 'act')}"

    def layer(window, out_bias=g.out_bias) -> list[str]:
        if g.post_ln:  # valves in series on the main line, after each residual add
            return ["  prechamber mix {", f"    {attention(window, out_bias)}", "  }", f"  {norm}{_comment(src, 'eps', 'post_ln')}",
                    "  prechamber burn {", f"    {mlp}", "  }", f"  {norm}"]
        return ["  prechamber mix {", f"    {norm}{_comment(src, 'eps')}", f"    {attention(window, out_bias)}", "  }",
                "  prechamber burn {", f"    {norm}", f"    {mlp}", "  }"]

    name = ENGINE[g.family]
    where = "a LayerNorm after each residual add (Post-LN)" if g.post_ln else "each with its LayerNorm in front"
    if g.windows and len(set(g.windows)) > 1:
        local = next(w for w in g.windows if w is not None)
        blocks = [f"# a {g.family} layer with local attention (the last {local} positions), {where}", f"stage {name}_local {{", *layer(local), "}", "",
                  f"# a {g.family} layer with global attention", f"stage {name}_global {{", *layer(None), "}", ""]
        body = _layer_runs(name, ["local" if w is not None else "global" for w in g.windows])
        lets = []
    else:
        one = g.windows[0] if g.windows else None  # every layer local, or every layer global
        blocks = [f"# one {g.family} layer: attention, then the MLP, {where} (the layers repeat it)", f"stage {name}_block {{", *layer(one), "}", ""]
        body = [f"  stage {name}_block x depth"]
        lets = [f"let depth = {g.layers}  # {src.get('layers', 'layers')}"]
        if g.last_out_bias:  # GPT-NeoX-Japanese: the last layer's attention adds a bias (dense_bias) the others lack
            blocks += [f"# the last {g.family} layer: its attention's output alone has a bias", f"stage {name}_last {{", *layer(None, True), "}", ""]
            body = ([f"  stage {name}_block x {g.layers - 1}"] if g.layers > 1 else []) + [f"  stage {name}_last"]
            lets = [f"# {g.layers} layers ({src.get('layers', 'layers')})"]
    feed = f"feed tokens vocab={g.vocab} context={g.context} position={g.position}"
    if g.embed_scale != 1.0:
        feed += " scale=sqrt(width)" if g.embed_scale == math.sqrt(g.width) else f" scale={_num(g.embed_scale)}"
    if g.padding is not None:
        feed += f" padding={g.padding}"
    lines = [*_header(g.family, source)[:-1],
             *(["# CTRL's sinusoids are [all sines | all cosines]; the feed's interleave them (sin, cos, sin, ...): the weights",
                "# load with the residual channels permuted to match (channel 2k is CTRL's k, 2k + 1 is CTRL's n_embd/2 + k),",
                "# the same function, each hidden state's channels in that order."] if g.halves else []),
             *([f"# The position table is transformers' rolled by {g.offset} rows: its row p is their row p + {g.offset} (their",
                f"# rows 0 and 1, which only padding tokens read, sit at its end), so the context is {g.offset} past theirs."] if g.offset else []),
             "", *lets, f"let d_model = {g.width}  # {src.get('width', 'width')}", "", *blocks,
             f"engine {name} {{", "  chamber width=d_model", "  throat causal",
             f"  {feed}{_comment(src, 'vocab', 'context', 'embed_scale', 'padding')}", "", *body, ""]
    if g.final_norm:
        final = norm if g.final_eps is None else f"norm layernorm eps={_num(g.final_eps)}"
        lines.append(f"  {final}  # the final norm" + (f" ({src['final_eps']})" if g.final_eps is not None else ""))
    lines += ["  nozzle head" + (" tied" if g.tied else "") + (" bias=true" if g.head_bias else "") + _comment(src, "tied"), "}", ""]
    return "\n".join(lines)


# --- the config a spec implies (export) ---------------------------------------------------------


def _layers(engine: ir.Engine) -> list[tuple[list, object, object]]:
    """Each layer's (ops in order, attention, mlp): the stages unfolded in the order they run."""
    from .families.core import _run_order

    out = []
    for st in _run_order([op for op in engine.body if isinstance(op, ir.Stage)]):
        ops = []
        for op in st.ops:
            if isinstance(op, ir.Prechamber):
                if op.detach or op.overboard or type(op.merge) is not ir.PlainMerge:
                    raise Unsupported(f"prechamber {op.name}", "a layer of the GPT-2 lineage is plain residual branches")
                ops += [("branch", x) for x in op.ops] + [("add", None)]
            elif isinstance(op, ir.Norm):
                ops.append(("main", op))
            else:
                raise Unsupported(f"stage {st.name}", "a layer of the GPT-2 lineage is two prechambers, with norms in them or after them")
        attn = next((x for k, x in ops if isinstance(x, ir.Attention)), None)
        mlp = next((x for k, x in ops if isinstance(x, ir.Mlp)), None)
        if attn is None or mlp is None:
            raise Unsupported(f"stage {st.name}", "a layer of the GPT-2 lineage has attention and an MLP")
        out.append((ops, attn, mlp))
    if not out:
        raise Unsupported("stages", "the engine has no layers")
    return out


def engine_config(engine: ir.Engine, family: str) -> dict:
    """The transformers config of a spec of one of these families (read from its shape; export then checks,
    field by field, that importing it gives back the engine)."""
    layers = _layers(engine)
    ops, attn, mlp = layers[0]
    norms = [x for _, x in ops if isinstance(x, ir.Norm)]
    post = any(k == "main" for k, _ in ops)
    eps = norms[0].eps if norms else 1e-5
    act = _HF_ACTS.get(mlp.act)
    if act is None:
        raise Unsupported("act", f"{family} has no '{mlp.act}' activation")
    f, n = engine.feed, engine.nozzle
    base = {"model_type": family, "architectures": [CAUSAL_LM[family]], "vocab_size": f.vocab, "tie_word_embeddings": n.tied}
    L, W = len(layers), engine.width
    if family == "gpt_bigcode":
        return {**base, "n_positions": f.context, "n_embd": W, "n_layer": L, "n_head": attn.heads, "n_inner": mlp.hidden,
                "activation_function": {"gelu_new": "gelu_pytorch_tanh"}.get(act, act), "layer_norm_epsilon": eps,
                "multi_query": attn.kv_heads == 1 and attn.heads > 1, "scale_attn_weights": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                "attn_pdrop": 0.0}
    if family == "gpt_neo":
        wins = [a.window for _, a, _ in layers]
        local = {w for w in wins if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"GPT-Neo has one window_size; the spec's layers have {sorted(local)}")
        kinds = ["local" if w is not None else "global" for w in wins]
        return {**base, "max_position_embeddings": f.context, "hidden_size": W, "num_layers": L, "num_heads": attn.heads,
                "intermediate_size": mlp.hidden, "activation_function": act, "layer_norm_epsilon": eps,
                "window_size": local.pop() if local else 256, "attention_types": [[[k], 1] for k in kinds],
                "resid_dropout": 0.0, "embed_dropout": 0.0, "attention_dropout": 0.0}
    if family == "openai-gpt":
        return {**base, "n_positions": f.context, "n_embd": W, "n_layer": L, "n_head": attn.heads, "afn": {"gelu_new": "gelu"}.get(act, act),
                "layer_norm_epsilon": eps, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if family == "ctrl":
        final_norm = [op for op in engine.body if not isinstance(op, ir.Stage)]
        return {**base, "n_positions": f.context, "n_embd": W, "dff": mlp.hidden, "n_layer": L, "n_head": attn.heads,
                "layer_norm_epsilon": final_norm[-1].eps if final_norm and isinstance(final_norm[-1], ir.Norm) else 1e-6,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0}
    if family == "gpt_neox_japanese":
        if mlp.hidden % W:
            raise Unsupported("hidden", f"GPT-NeoX-Japanese's MLP is a whole multiple of the width: {mlp.hidden} is not one of {W}")
        return {**base, "max_position_embeddings": f.context, "hidden_size": W, "num_hidden_layers": L, "num_attention_heads": attn.heads,
                "intermediate_multiple_size": mlp.hidden // W, "hidden_act": act, "layer_norm_eps": eps,
                "rope_parameters": {"rope_type": "default", "rope_theta": attn.rotary_base, "partial_rotary_factor": attn.rotary_dims / attn.head_dim},
                "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if f.context <= OFFSET:
        raise Unsupported("context", f"{family}'s position table has {OFFSET} rows past max_position_embeddings: the context is above {OFFSET}")
    common = {"max_position_embeddings": f.context - OFFSET, "hidden_size": W, "num_hidden_layers": L, "num_attention_heads": attn.heads,
              "pad_token_id": f.padding}
    if family == "opt":
        return {**base, **common, "ffn_dim": mlp.hidden, "activation_function": act, "do_layer_norm_before": not post,
                "_remove_final_layer_norm": False, "word_embed_proj_dim": W, "enable_bias": attn.bias,
                "layer_norm_elementwise_affine": bool(norms) and norms[0].affine, "dropout": 0.0, "attention_dropout": 0.0}
    assert family == "biogpt", family
    return {**base, **common, "intermediate_size": mlp.hidden, "hidden_act": act, "scale_embedding": f.scale != 1.0,
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


# --- the weights (plans.py's plan) ---------------------------------------------------------------


def layer_parts(spec) -> list[list[tuple[str, object]]]:
    """Each layer's (path, node) of its valves and turbines in the order they run."""
    lay = ir.layout.layout(spec)
    flat = {path: i for i, (path, _) in enumerate(lay.layers())}
    out: dict[int, list] = {}
    for sl in lay.stages:
        parts = [p for p in lay.parts() if p.stage is sl.stage and p.spath == sl.path and p.role in ("valve", "mixer", "reactor")]
        for r, inst in enumerate(sl.instances()):
            out[flat[inst]] = [(p.instances()[r], p.node) for p in parts]
    return [out[i] for i in sorted(out)]


@dataclass(frozen=True)
class Roll:
    """OPT's and BioGPT's position table: our row p is their row p + 2 (theirs 0 and 1 at our end)."""

    rows: int

    def __call__(self, t):
        import torch

        return torch.roll(t, -self.rows, 0)

    def inverse(self, t):
        import torch

        return [torch.roll(t, self.rows, 0).contiguous()]


def halves(width: int) -> list[int]:
    """CTRL's channel for each of ours: ours 2k is its sine k, ours 2k + 1 its cosine k (at width/2 + k)."""
    return [k // 2 if k % 2 == 0 else width // 2 + k // 2 for k in range(width)]


@dataclass(frozen=True)
class Perm:
    """A tensor's residual-stream axis in our channel order: ours[..., j, ...] = theirs[..., order[j], ...]."""

    order: tuple
    axis: int

    def __call__(self, t):
        import torch

        return t.index_select(self.axis, torch.tensor(self.order, device=t.device))

    def inverse(self, t):
        import torch

        back = torch.argsort(torch.tensor(self.order))
        return [t.index_select(self.axis, back.to(t.device)).contiguous()]


@dataclass(frozen=True)
class Then:
    """Two transforms in turn (a fused q, k, v concatenation, then its columns permuted)."""

    first: object
    second: object

    def __call__(self, *ts):
        return self.second(self.first(*ts))

    def inverse(self, t):
        return self.first.inverse(self.second.inverse(t)[0])


def _plan_ctrl(plan, put, spec, cat):
    """CTRL: Pre-LN layers (layernorm1, Wq/Wk/Wv, dense; layernorm2, ffn.0, ffn.2), w, layernorm, a biased lm_head;
    every tensor on the residual stream permuted into the feed's sinusoid order (`halves`)."""
    from .mapping import _final_valve

    width = spec.engine.width if isinstance(spec, ir.Spec) else spec.width
    order = tuple(halves(width))
    rows, cols = Perm(order, 0), Perm(order, 1)
    for i, parts in enumerate(layer_parts(spec)):
        if [type(n) for _, n in parts] != [ir.Norm, ir.Attention, ir.Norm, ir.Mlp]:
            plan.reasons[f"stages.{i}"] = f"stage {i} is not a CTRL layer (attention and an MLP, each with one LayerNorm in front)"
            continue
        (an, _), (at, a), (mn, _), (ml, _) = parts
        h = f"h.{i}."
        qkv = cat((a.heads * a.head_dim,) * 3)
        for p in ("weight", "bias"):
            put(f"{an}.{p}", h + f"layernorm1.{p}", rows)
            put(f"{mn}.{p}", h + f"layernorm2.{p}", rows)
            put(f"{ml}.proj.{p}", h + f"ffn.2.{p}", rows)
            put(f"{at}.proj.{p}", h + f"multi_head_attention.dense.{p}", rows)
        put(f"{at}.qkv.weight", [h + f"multi_head_attention.W{x}.weight" for x in "qkv"], Then(qkv, cols))
        put(f"{at}.qkv.bias", [h + f"multi_head_attention.W{x}.bias" for x in "qkv"], qkv)
        put(f"{ml}.fc.weight", h + "ffn.0.weight", cols)
        put(f"{ml}.fc.bias", h + "ffn.0.bias")
    put("feed.tok.weight", "w.weight", cols)
    fv = _final_valve(spec)
    for p in ("weight", "bias"):
        put(f"{fv}.{p}", f"layernorm.{p}", rows)
    put("head.weight", "lm_head.weight", cols)
    put("head.bias", "lm_head.bias")
    put("head_bias", "lm_head.bias")
    return plan


def plan(family: str, plan, put, spec, same, transpose, cat, neox_qkv):
    """Fill plans.py's plan for one of these families: layer i is stage instance i, its valves and
    turbines in order (Pre-LN: norm, attention, norm, mlp; Post-LN: attention, norm, mlp, norm)."""
    from .mapping import _final_valve

    if family == "ctrl":
        return _plan_ctrl(plan, put, spec, cat)

    for i, parts in enumerate(layer_parts(spec)):
        kinds = [type(n) for _, n in parts]
        pre = kinds == [ir.Norm, ir.Attention, ir.Norm, ir.Mlp]
        if not pre and kinds != [ir.Attention, ir.Norm, ir.Mlp, ir.Norm]:
            plan.reasons[f"stages.{i}"] = f"stage {i} is not a {family} layer (attention and an MLP, each with one LayerNorm before or after it)"
            continue
        (p0, n0), (p1, n1), (p2, n2), (p3, n3) = parts
        (an, at), (mn, ml) = ((p0, p1), (p2, p3)) if pre else ((p1, p0), (p3, p2))
        a = n1 if pre else n0
        qkv = cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim))
        for p in ("weight", "bias"):
            if family in ("gpt_bigcode", "gpt_neo", "openai-gpt"):
                h = f"h.{i}."
                put(f"{an}.{p}", h + f"ln_1.{p}")
                put(f"{mn}.{p}", h + f"ln_2.{p}")
                put(f"{ml}.fc.{p}", h + f"mlp.c_fc.{p}", transpose if family == "openai-gpt" and p == "weight" else same)
                put(f"{ml}.proj.{p}", h + f"mlp.c_proj.{p}", transpose if family == "openai-gpt" and p == "weight" else same)
            if family == "gpt_bigcode":  # multi-query rows are [q | k | v]; multi-head ones head by head [q_h | k_h | v_h]
                put(f"{at}.qkv.{p}", h + f"attn.c_attn.{p}", neox_qkv(a.heads, a.head_dim) if a.kv_heads == a.heads and a.heads > 1 else same)
                put(f"{at}.proj.{p}", h + f"attn.c_proj.{p}")
            elif family == "gpt_neo":
                put(f"{at}.qkv.{p}", [h + f"attn.attention.{x}_proj.{p}" for x in "qkv"], qkv)
                put(f"{at}.proj.{p}", h + f"attn.attention.out_proj.{p}")
            elif family == "openai-gpt":
                put(f"{at}.qkv.{p}", h + f"attn.c_attn.{p}", transpose if p == "weight" else same)
                put(f"{at}.proj.{p}", h + f"attn.c_proj.{p}", transpose if p == "weight" else same)
            elif family == "gpt_neox_japanese":  # fused rows head by head [q_h | k_h | v_h]; the last layer's dense_bias
                h = f"layers.{i}."
                put(f"{an}.{p}", h + f"input_layernorm.{p}")
                put(f"{mn}.{p}", h + f"post_attention_layernorm.{p}")
                put(f"{at}.qkv.{p}", h + f"attention.query_key_value.{p}", neox_qkv(a.heads, a.head_dim))
                put(f"{at}.proj.{p}", h + ("attention.dense.weight" if p == "weight" else "attention.dense_bias"))
                put(f"{ml}.fc.{p}", h + f"mlp.dense_h_to_4h.{p}")
                put(f"{ml}.proj.{p}", h + f"mlp.dense_4h_to_h.{p}")
            else:  # opt, biogpt
                h = f"layers.{i}."
                put(f"{an}.{p}", h + f"self_attn_layer_norm.{p}")
                put(f"{mn}.{p}", h + f"final_layer_norm.{p}")
                put(f"{at}.qkv.{p}", [h + f"self_attn.{x}_proj.{p}" for x in "qkv"], qkv)
                put(f"{at}.proj.{p}", h + f"self_attn.out_proj.{p}")
                put(f"{ml}.fc.{p}", h + f"fc1.{p}")
                put(f"{ml}.proj.{p}", h + f"fc2.{p}")
    embed, head = EMBED_HEAD[family]
    put("feed.tok.weight", embed)
    positions = {"opt": "embed_positions.weight", "biogpt": "embed_positions.weight", "openai-gpt": "positions_embed.weight"}.get(family, "wpe.weight")
    put("feed.pos.weight", positions, Roll(OFFSET) if family in ("opt", "biogpt") else same)
    final = {"opt": "final_layer_norm", "biogpt": "layer_norm", "gpt_neox_japanese": "final_layer_norm"}.get(family, "ln_f")
    fv = _final_valve(spec)
    for p in ("weight", "bias"):
        put(f"{fv}.{p}", f"{final}.{p}")
    put("head.weight", head)
    return plan
