"""Reading a statement's options against what that statement accepts.

Each statement kind reads its options through `Options`: typed getters with
defaults and ranges. At the end, `finish()` reports whatever was not read as an
unknown option, with a suggestion from the options that statement does accept.
Duplicates are reported once. Nothing raises: problems go to the collector and
the getter returns the default so that checking can go on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, get_args

from ..diagnostics import Collector, did_you_mean
from ..ir import Span
from ..ir import nodes as irn
from ..ir.nodes import GROUP_SCORES, ROUTERS
from ..syntax import ast
from .values import MAX_INT, EvalError, Keyword, Scope, evaluate, let_ref, unknown_name

_MISSING = object()


class Options:
    def __init__(self, what: str, options: Sequence[ast.Option], scope: Scope, out: Collector, span: Span, key: str | None = None):
        self.what = what  # "turbine attention", used in messages
        self.key = key or what  # the statement's entry in TABLE
        self.scope = scope
        self.out = out
        self.span = span
        self.by_name: dict[str, ast.Option] = {}
        self.known: list[str] = []
        self.missing: list[str] = []
        for o in options:
            if o.name.name in self.by_name:
                out.error("E0202", f"option '{o.name.name}' is given twice", o.name.span, "keep one of them")
            else:
                self.by_name[o.name.name] = o

    def lets(self) -> tuple[tuple[str, str], ...]:
        """(option, let) for each option written as a let's bare name (`ir.Node.let_names`)."""
        return tuple((n, let) for n, o in self.by_name.items() if (let := let_ref(o.value, self.scope)) is not None)

    def has(self, name: str) -> bool:
        return name in self.by_name

    def span_of(self, name: str) -> Span:
        o = self.by_name.get(name)
        return o.span if o is not None else self.span

    def get(self, name: str, default=_MISSING):
        """Read an option as the table declares it; `default` overrides a contextual default."""
        spec = option(self.key, name)
        if spec is None:
            return self._raw(name, False)  # raises, naming the missing row
        d = spec.default if default is _MISSING else default
        if spec.type == "int":
            return self.int(name, d, required=spec.required, min=spec.min, max=spec.max)
        if spec.type == "float":
            return self.float(name, d, required=spec.required, lo=spec.lo, hi=spec.hi, lo_open=spec.lo_open, hi_open=spec.hi_open, flag=spec.flag)
        if spec.type == "bool":
            return self.bool(name, d)
        return self.choice(name, spec.choices, d, required=spec.required)

    def read(self, cls, where: dict | None = None, **given) -> dict:
        """The node's fields from this statement's rows, {field: value}: every row naming a field of
        `cls` (`Opt.field`, else its name), read once through `get`. Rows a hook reads (`Opt.hook`) and
        rows of another kind of the statement (`Opt.only`) are left alone. A row's default comes from
        `given` (by option name), else from `where` (`Opt.context`: {"width": ..., "throat": ...}),
        else from the table."""
        fields, op = cls.model_fields, cls.model_fields["op"].default
        out = {}
        for row in TABLE[self.key]:
            field = row.field or row.name
            if row.hook or field not in fields or (row.only and op not in row.only):
                continue
            default = given.get(row.name, (where or {}).get(row.context, _MISSING) if row.context else _MISSING)
            out[field] = self.get(row.name, default)
        return out

    def _raw(self, name: str, required: bool):
        if option(self.key, name) is None:  # every option read is a row of TABLE: hover and completion show them
            raise KeyError(f"option {name!r} of {self.key!r} is not in the table: add it to cyclelang/semantics/options.py")
        self.known.append(name)
        o = self.by_name.get(name)
        if o is None:
            if required:
                self.missing.append(name)  # reported by finish(), unless a misspelling explains it
            return _MISSING, None
        if o.value is None:
            return None, o  # a bare flag
        try:
            return evaluate(o.value, self.scope), o
        except EvalError as e:
            self.out.error(e.code, e.message, e.span, e.help)
            return _MISSING, None

    def _bad_keyword(self, v: Keyword) -> None:
        e = unknown_name(v, self.scope)
        self.out.error(e.code, e.message, e.span, e.help)

    def int(self, name: str, default=None, *, required=False, min: int | None = 1, max: int | None = None):
        v, o = self._raw(name, required)
        if v is _MISSING:
            return default
        if v is None:
            self.out.error("E0203", f"option '{name}' needs a value", o.span, f"write {name}=N")
            return default
        if isinstance(v, Keyword):
            self._bad_keyword(v)
            return default
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            self.out.error("E0203", f"'{name}' must be a whole number, found {_show(v)}", o.value.span)
            return default
        v = int(v)
        if max is None:
            max = MAX_INT  # steps=1e30 is a float that passes as whole: a count past 2**62 is nonsense
        if min is not None and v < min:
            self.out.error("E0205", f"'{name}' must be at least {min}, found {v}", o.value.span)
            return default
        if max is not None and v > max:
            self.out.error("E0205", f"'{name}' must be at most {max}, found {v}", o.value.span)
            return default
        return v

    def float(self, name: str, default=None, *, required=False, lo: float | None = None, hi: float | None = None,
              lo_open=False, hi_open=False, flag=_MISSING):
        v, o = self._raw(name, required)
        if v is _MISSING:
            return default
        if v is None:
            if flag is not _MISSING:
                return flag
            self.out.error("E0203", f"option '{name}' needs a value", o.span, f"write {name}=X")
            return default
        if isinstance(v, Keyword):
            self._bad_keyword(v)
            return default
        if isinstance(v, bool):
            self.out.error("E0203", f"'{name}' must be a number, found {_show(v)}", o.value.span)
            return default
        v = float(v)
        if not math.isfinite(v):
            self.out.error("E0205", f"'{name}' must be finite", o.value.span)
            return default
        bad = (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and (v > hi or (hi_open and v == hi)))
        if bad:
            left = "(" if lo_open else "["
            right = ")" if hi_open else "]"
            rng = f"{left}{_fmt(lo) if lo is not None else '-inf'}, {_fmt(hi) if hi is not None else 'inf'}{right}"
            self.out.error("E0205", f"'{name}' must be in {rng}, found {_fmt(v)}", o.value.span)
            return default
        return v

    def bool(self, name: str, default: bool) -> bool:
        v, o = self._raw(name, False)
        if v is _MISSING:
            return default
        if v is None:
            return True
        if isinstance(v, bool):
            return v
        if isinstance(v, Keyword):
            self.out.error("E0203", f"'{name}' must be true or false, found '{v.name}'", o.value.span, did_you_mean(v.name, ["true", "false"]))
        else:
            self.out.error("E0203", f"'{name}' must be true or false, found {_show(v)}", o.value.span)
        return default

    def choice(self, name: str, choices: Sequence[str], default=None, *, required=False):
        v, o = self._raw(name, required)
        if v is _MISSING:
            return default
        if v is None:
            self.out.error("E0203", f"option '{name}' needs a value", o.span, f"one of: {', '.join(choices)}")
            return default
        if isinstance(v, Keyword) and v.name in choices:
            return v.name
        shown = v.name if isinstance(v, Keyword) else _show(v)
        hint = did_you_mean(shown, choices) or f"one of: {', '.join(choices)}"
        self.out.error("E0203", f"'{name}' must be one of {', '.join(choices)}; found '{shown}'", o.value.span, hint)
        return default

    def finish(self) -> None:
        from ..syntax.parser import KEYWORD_HOMES

        explained = set()
        misspelled = False  # a statement keyword misspelled: the options after it are its own, not ours
        for name, o in self.by_name.items():
            if name not in self.known:
                if misspelled:
                    continue
                keyword = did_you_mean(name, KEYWORD_HOMES) if o.value is None else None
                if keyword is not None and did_you_mean(name, self.known) is None:
                    # newlines carry no meaning, so `turbin attention heads=4` on the next line reads as
                    # options of the statement before it: say what it is, once
                    self.out.error("E0006", f"unknown statement '{name}'", o.name.span, keyword)
                    misspelled = True
                    continue
                hint = did_you_mean(name, self.known)
                if hint is not None:
                    explained.add(hint.split("'")[1])
                if hint is None and self.known:
                    hint = f"{self.what} takes: {', '.join(sorted(set(self.known)))}"
                elif hint is None:
                    hint = f"{self.what} takes no options"
                self.out.error("E0201", f"unknown option '{name}' for {self.what}", o.name.span, hint)
        for name in self.missing:
            if name not in explained:
                self.out.error("E0206", f"{self.what} needs '{name}='", self.span, f"add {name}=VALUE")


def _fmt(x: float) -> str:
    return f"{x:g}"


def _show(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _fmt(v)
    return str(v)


# --- the table: every option of every statement, once -------------------------------------
# The resolver reads options through it (`Options.read` fills a node's fields from its kind's rows,
# `Options.get` reads one), and the language server's hover and completion read it too: an
# option's type, range, default and meaning in both vocabularies live here and nowhere else.
# Limits that are not a spec's business (MAX_WIDTH, ...) too.

MAX_WIDTH = 1 << 20
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 24
MAX_EXPERTS = 4096
ACTIVATIONS = get_args(irn.Activation)  # every choice list below is the IR type's own


def _choices(cls, field: str) -> tuple[str, ...]:
    """The values a node's Literal field admits: an option's choice list, read from the IR."""
    return get_args(cls.model_fields[field].annotation)


@dataclass(frozen=True)
class Opt:
    """One option: `type` is int, float, bool or choice; `default` is a value, or a phrase
    when it depends on the rest of the spec (`default_text`); ranges as the getters take them."""

    name: str
    type: str
    ml: str  # what it means for the network
    rocket: str = ""  # the engine word, where the analogy has one
    default: object = None
    default_text: str = ""  # how docs and hover show a contextual default ("the throat's")
    required: bool = False
    min: int | None = 1  # ints
    max: int | None = None
    lo: float | None = None  # floats
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    flag: object = _MISSING  # a float option's value when written bare (`rotary`)
    choices: tuple[str, ...] = ()
    # How `Options.read` fills the kind's node: into its field of the option's name, or `field` where
    # the names differ; `hook`: no field of its own, the kind's rules hook (`readers.t_<keyword>`) reads
    # it and derives what it fills; `only`: the kinds (IR `op` names) it is read for, where kinds that
    # share a statement both have the field; `context`: a default from where the op sits ("width":
    # the width there, "throat": the engine's)
    field: str = ""
    hook: bool = False
    only: tuple[str, ...] = ()
    context: str = ""

    @property
    def bare(self) -> bool:
        """May be written as a bare name (`tied`, `rotary`)."""
        return self.type == "bool" or self.flag is not _MISSING

    def shown_default(self) -> str:
        if self.required:
            return "required"
        if self.default_text:
            return self.default_text
        if self.default is None:
            return "none"
        return _show(self.default)

    def shown_range(self) -> str:
        if self.type == "choice":
            return " | ".join(self.choices)
        if self.type == "bool":
            return "true | false (a bare name is true)"
        if self.type == "int":
            return f"whole number, {self.min if self.min is not None else '-inf'} to {self.max if self.max is not None else MAX_INT}"
        left, right = ("(" if self.lo_open else "["), (")" if self.hi_open else "]")
        rng = f"{left}{_fmt(self.lo) if self.lo is not None else '-inf'}, {_fmt(self.hi) if self.hi is not None else 'inf'}{right}"
        return f"number in {rng}" + (f"; bare: {_show(self.flag)}" if self.flag is not _MISSING else "")


_DROPOUT = dict(type="float", default=0.0, lo=0.0, hi=1.0, hi_open=True)
_RATIO = Opt("ratio", "float", "hidden width = ratio x width (must come out whole); not with hidden=", "the reactor's size", default=None, default_text="4", lo=0.0, lo_open=True, hook=True)
_HIDDEN = Opt("hidden", "int", "the hidden width, directly (not with ratio=)", "the reactor's size", max=MAX_WIDTH * 64)
_ACT = Opt("act", "choice", "the activation: gelu, gelu_tanh (GPT-2's), relu, relu2 (squared: relu(x)^2, Primer's), silu; swiglu, geglu and geglu_tanh (Gemma's) are gated; swiglu_clamp is gpt-oss's, gate·σ(1.702·gate)·(up + 1) with gate and up clamped", "", default="gelu", choices=ACTIVATIONS)
_CLAMP = Opt("clamp", "float", "with act=swiglu_clamp: gate <= clamp and |up| <= clamp before they meet (gpt-oss's swiglu_limit)", "a pressure limiter on the gate", default=7.0,
             lo=0.0, lo_open=True, hi=1e6)
_BIAS = Opt("bias", "bool", "biases on the projections", "", default=True)

TABLE: dict[str, tuple[Opt, ...]] = {
    "chamber": (Opt("width", "int", "the residual stream's width d", "the chamber's pressure vessel", required=True, max=MAX_WIDTH),
                # hyper-connections (Zhu et al. 2024; mHC, DeepSeek-V4): several residual streams
                Opt("streams", "int", "residual streams the chamber holds (hyper-connections: each branch reads a learned mix of them and writes into each)", "several chambers side by side, fed by one manifold", default=1, max=64),
                Opt("connections", "choice", "how branches join the streams: hyper (Zhu et al. 2024) or manifold (mHC: the streams' mixing kept doubly stochastic, DeepSeek-V4)", "the manifold between the chambers", default_text="hyper where streams > 1, else none", choices=get_args(irn.Connections)),
                Opt("dynamic", "bool", "hyper: the weights also depend on each position's streams (tanh of a projection, a small learned scale); manifold: always", "", default=False),
                Opt("sinkhorn", "int", "manifold: Sinkhorn iterations that make the streams' mixing doubly stochastic", "", default=20, max=1000)),
    "throat causal": (),
    "throat open": (),
    "feed tokens": (
        Opt("vocab", "int", "vocabulary size: rows of the token embedding", "the tanks", required=True, max=MAX_VOCAB),
        Opt("context", "int", "the longest sequence (learned positions have this many rows)", "", required=True, max=MAX_CONTEXT),
        Opt("position", "choice", "how positions enter: a learned table, fixed sinusoids, or none (rotary attention)", "", default="learned", choices=get_args(irn.Position)),
        Opt("scale", "float", "multiplies the embedding (sqrt(width) in the original Transformer)", "the feed pumps' head", default=1.0, lo=0.0, lo_open=True, hi=1e4),
        Opt("dropout", ml="dropout on the embedding", **_DROPOUT),
        Opt("padding", "int", "the padding token (padding_idx): its embedding starts at 0 and gets no gradient", "a bleed line that carries no propellant", min=0, max=MAX_VOCAB),
        Opt("per_layer", "int", "Gemma 4's per-layer inputs: each layer's width of a second token table plus a normed projection of the embedding, read by the per-layer mlps; 0: none", "a preburner line to every stage", default=0, min=0, max=MAX_WIDTH),
        Opt("per_layer_vocab", "int", "with per_layer: rows of the per-layer table", "", default=0, default_text="vocab", min=0, max=MAX_VOCAB),
        Opt("per_layer_eps", "float", "with per_layer: the per-layer projection's RMSNorm eps", "", default=1e-6, lo=0.0, lo_open=True, hi=1.0),
    ),
    "nozzle head": (
        Opt("tied", "bool", "the head reuses the token embedding's matrix (weight tying)", "", default=False),
        Opt("bias", "bool", "a bias on the logits", "", default=False),
        Opt("scale", "float", "multiplies the logits (Granite: 1/logits_scaling)", "the nozzle's expansion ratio", default=1.0, lo=0.0, lo_open=True),
        Opt("softcap", "float", "final-logit soft-cap: logits become cap * tanh(logits / cap) (Gemma 2's final_logit_softcapping)", "the nozzle's pressure-relief valve", lo=0.0, lo_open=True, hi=1e6),
    ),
    "prechamber": (
        Opt("detach", "bool", "the branch reads x.detach(): no gradient flows back into its input", "an open cycle: exhaust decoupled from the chamber", default=False),
        Opt("overboard", "bool", "the branch's output is not added back to the stream (an auxiliary head)", "exhaust dumped overboard", default=False),
        Opt("loss", "float", "with overboard: weight of the branch's auxiliary next-token loss", "", lo=0.0, hi=1e3),
    ),
    "turbine attention": (
        Opt("heads", "int", "query heads", "injector baffles", required=True, max=MAX_WIDTH),
        Opt("kv_heads", "int", "key/value heads: heads is multi-head, 1 is MQA, between is GQA; must divide heads", "baffles shared by the injector's elements", default_text="heads", max=MAX_WIDTH),
        Opt("head_dim", "int", "per-head width", "", default_text="width/heads", max=MAX_WIDTH),
        Opt("mask", "choice", "causal or bidirectional", "the throat", default_text="the throat's", context="throat", choices=get_args(irn.Mask)),
        Opt("window", "int", "sliding window: attend to the last N positions only (causal only)", "", max=MAX_CONTEXT),
        Opt("rotary", "float", "rotary positions on this fraction of each head's dims (bare: all)", "", default=0.0, lo=0.0, hi=1.0, flag=1.0, hook=True),
        Opt("rotary_base", "float", "rotary frequency base", "", default=10000.0, lo=1.0, lo_open=True, hi=1e12),
        Opt("rotary_interleaved", "bool", "rotate dims in adjacent pairs (GPT-J), not the two halves (GPT-NeoX, Llama)", "", default=False),
        Opt("qk_norm", "bool", "normalise queries and keys per head (RMSNorm), before rotary (Qwen3)", "", default=False),
        Opt("qk_norm_across", "bool", "with qk_norm: one norm over all heads' queries, one over all keys (OLMo-2)", "", default=False),
        Opt("qk_norm_eps", "float", "the qk-norms' eps", "", default=1e-6, lo=0.0, lo_open=True, hi=1.0),
        Opt("qk_norm_type", "choice", "with qk_norm: the qk-norms' kind, rmsnorm or layernorm (Persimmon)", "", default="rmsnorm", choices=get_args(irn.NormType)),
        Opt("qk_norm_bias", "bool", "with qk_norm_type=layernorm: a learned shift next to the gain (Persimmon)", "", default=False),
        Opt("qk_norm_offset", "float", "with qk_norm: the gain is offset + w, w starting at 1 - offset (Gemma 3: 1)", "", default=0.0, lo=-1e6, hi=1e6),
        Opt("qk_norm_affine", "bool", "with qk_norm: a learned gain; false normalises only (nanochat)", "", default=True),
        Opt("qk_norm_after_rotary", "bool", "with qk_norm: normalise the rotated queries and keys (nanochat), not the ones rotary turns", "", default=False),
        Opt("qk_norm_head_gains", "bool", "with qk_norm: each head its own gain (and bias), as StableLM and Cohere; false: one shared by the heads", "", default=False),
        Opt("scale", "float", "the attention logits' scale (Granite's attention_multiplier)", "", default=None, default_text="1/sqrt(head_dim)", lo=0.0, lo_open=True, hi=1e3),
        Opt("bias", "bool", "biases on the q, k, v projections (and the output's, unless out_bias says otherwise)", "", default=True),
        Opt("out_bias", "bool", "the output projection's bias (Qwen2: q, k, v biased, the output not)", "", default_text="bias"),
        Opt("dropout", ml="attention and output dropout", **_DROPOUT),
        Opt("latent", "int", "latent attention (MLA): the KV latent's width, what the cache keeps", "a latent injector", max=MAX_WIDTH),
        Opt("q_latent", "int", "latent attention: a latent for the queries too (q_lora_rank)", "", max=MAX_WIDTH),
        Opt("rotary_dims", "int", "latent attention: the decoupled rotary key's dims (even, at least 2)", "", default_text="head_dim/2, made even", max=MAX_WIDTH, only=("latent_attention",)),
        Opt("v_dim", "int", "latent attention: each head's value width", "", default_text="head_dim", max=MAX_WIDTH),
        Opt("eps", "float", "latent attention: the latents' RMSNorm epsilon", "", default=1e-6, lo=0.0, lo_open=True),
        Opt("rotary_scaling", "choice", "rotary stretched past the pretraining context: linear (position interpolation), dynamic (NTK), llama3, yarn", "the injector re-orificed for a longer burn", default="none", choices=("none",) + get_args(irn.ScalingType), hook=True),
        Opt("rotary_factor", "float", "with rotary_scaling: how many times the pretraining context the positions stretch over", "", lo=0.0, lo_open=True, hi=1e4, hook=True),
        Opt("rotary_original", "int", "with rotary_scaling dynamic, llama3 or yarn: the pretraining context (original_max_position_embeddings)", "", default_text="the feed's context", max=MAX_CONTEXT, hook=True),
        Opt("rotary_low", "float", "llama3 scaling: low_freq_factor (wavelengths past original/low are divided by the factor)", "", default=1.0, lo=0.0, lo_open=True, hi=1e4, hook=True),
        Opt("rotary_high", "float", "llama3 scaling: high_freq_factor (wavelengths under original/high are kept)", "", default=4.0, lo=0.0, lo_open=True, hi=1e4, hook=True),
        Opt("rotary_beta_fast", "float", "yarn scaling: rotations over the original context above which a frequency is kept (beta_fast)", "", default=32.0, lo=0.0, lo_open=True, hi=1e4, hook=True),
        Opt("rotary_beta_slow", "float", "yarn scaling: rotations below which a frequency is divided by the factor (beta_slow)", "", default=1.0, lo=0.0, lo_open=True, hi=1e4, hook=True),
        Opt("rotary_attention_factor", "float", "yarn scaling: the gain on cos and sin (attention_factor)", "", default_text="0.1 ln(factor) + 1", lo=0.0, lo_open=True, hi=1e2, hook=True),
        Opt("softcap", "float", "logit soft-cap: scores become cap * tanh(scores / cap) before the mask (Gemma 2's attn_logit_softcapping)", "a pressure-relief valve on the injector", lo=0.0, lo_open=True, hi=1e6),
        Opt("alibi", "bool", "ALiBi positions: each head's scores fall linearly with the distance to the key (BLOOM, Falcon, MPT)", "", default=False),
        Opt("gate", "choice", "an output gate before the output projection, y * sigmoid(W x): one per channel of every head (Qwen3-Next) or one per head", "a throttle valve on each injector element", default="none", choices=_choices(irn.Attention, "gate")),
        Opt("gate_act", "choice", "the output gate's function: sigmoid, y * sigmoid(W x) (Qwen3-Next, AFMoE), or softplus, y * softplus(W x), unbounded above (Laguna)", "the throttle valve's characteristic: one that only closes, or one that may also open past full", default="sigmoid", choices=_choices(irn.Attention, "gate_act")),
        Opt("alibi_scaled", "bool", "with alibi: the bias is multiplied by the logits' scale too, as Falcon does (BLOOM and MPT add it after)", "", default=False),
        Opt("rotary_truncate", "bool", "yarn scaling: round the blend's range out to whole dims (false: as computed, gpt-oss)", "", default=True, hook=True),
        Opt("rotary_temperature", "float", "with rotary_scaling dynamic, llama3 or yarn: the rotated queries times 1 + t ln(1 + floor(position / rotary_original)), sharper past each original context (Llama 4's attention temperature; Ministral 3's llama_4_scaling_beta)",
            "", default=0.0, lo=0.0, hi=irn.MAX_TEMPERATURE, hook=True),
        Opt("sinks", "bool", "attention sinks: a learned logit per head joins every softmax's denominator, so a query may attend to nothing (gpt-oss)",
            "a bleed valve on the injector: some flow vents, unburnt, and the rest is thinned", default=False),
        Opt("rotary_spread", "bool", "with rotary: the rotated pairs are (i, i + head_dim/2) at base^(-2i/head_dim), spread over the whole head (Gemma 4's proportional rope)", "the injector's swirl spread over every element", default=False),
        Opt("v_norm", "bool", "with qk_norm: a weightless RMSNorm on each head's values (Gemma 4)", "a damper on the injector's second propellant", default=False),
        Opt("k_eq_v", "bool", "the values are the keys' projection, before the k-norm and rotary (Gemma 4's attention_k_eq_v): no value rows", "one propellant line feeds both injector elements", default=False),
        Opt("kv_store", "int", "KV sharing: this attention's keys and values (its cached past included) go to slot N for later layers (Gemma 4)", "a tap-off line from this injector's manifold", max=1 << 16),
        Opt("kv_reuse", "int", "KV sharing: read slot N's keys and values (stored by an earlier layer) instead of computing any: no k, v projections, no cache of its own (Gemma 4's num_kv_shared_layers)", "an injector fed from another's manifold", max=1 << 16),
    ),
    "turbine ssm": (
        Opt("heads", "int", "heads, each with its own A, D and step size", "", required=True, max=MAX_WIDTH),
        Opt("state", "int", "the state size N of each head", "the jacket's channels", default=128, default_text="128 (version=1: 16)", max=MAX_WIDTH),
        Opt("groups", "int", "heads share B and C in groups; must divide heads", "", default=1, max=MAX_WIDTH),
        Opt("expand", "float", "inner width = expand x width (not with head_dim)", "", default=2.0, lo=0.0, lo_open=True, hi=64.0, hook=True),
        Opt("head_dim", "int", "per-head width instead of expand", "", default_text="expand x width / heads", max=MAX_WIDTH),
        Opt("conv", "int", "kernel of the causal depthwise conv", "", default=4, max=MAX_CONTEXT),
        Opt("chunk", "int", "positions per chunk of the training scan", "", default=256, default_text="256 (version=1: 32)", max=MAX_CONTEXT),
        Opt("bias", "bool", "biases on in_proj and out_proj", "", default=False),
        Opt("conv_bias", "bool", "a bias on the conv", "", default=True),
        Opt("eps", "float", "the gated RMSNorm's epsilon (version=1: the dt/B/C norms')", "", default=1e-5, default_text="1e-5 (version=1: 1e-6)", lo=0.0, lo_open=True),
        Opt("dt_min", "float", "the step size starts log-uniform in [dt_min, dt_max]", "", default=0.001, lo=0.0, lo_open=True),
        Opt("dt_max", "float", "the step size starts log-uniform in [dt_min, dt_max]", "", default=0.1, lo=0.0, lo_open=True),
        Opt("dt_lo", "float", "the step size is clamped from below", "", default=0.0, lo=0.0),
        Opt("dt_hi", "float", "the step size is clamped from above", "", lo=0.0, lo_open=True),
        Opt("version", "int", "1: Mamba-1's mixer (a state per channel, low-rank dt; Jamba's); 2: Mamba-2's (heads)", "", default=2, min=1, max=2, hook=True),
        Opt("dt_rank", "int", "version=1: the low-rank step projection's width", "", default_text="ceil(width/16)", max=MAX_WIDTH),
        Opt("norms", "bool", "version=1: RMSNorms on dt, B and C (Jamba); their eps is eps=", "", default=False),
        Opt("norms_affine", "bool", "version=1, with norms: false gives those norms no weight (Falcon-Mamba)", "", default=True),
        Opt("out_norm", "choice", "how the scan's output y meets the gate z: gated, rmsnorm(y x silu(z)) per group (Mamba-2); before_gate, rmsnorm(y) x silu(z); none, y x silu(z) unnormalised (Falcon-H1)", "", default="gated", choices=_choices(irn.Ssm, "out_norm")),
        *(Opt(f"{part}_scale", "float", f"in_proj's {what} rows' output times this (Falcon-H1's ssm_multipliers)", "", default=1.0, lo=-1e6, hi=1e6, hook=True)
          for part, what in (("z", "gate z"), ("x", "scan input x"), ("b", "B"), ("c", "C"), ("dt", "step dt"))),
    ),
    "turbine linear_attention": (
        Opt("heads", "int", "heads, each with its own state", "", required=True, max=MAX_WIDTH),
        Opt("head_dim", "int", "per-head width", "", default_text="width/heads", max=MAX_WIDTH),
        Opt("feature", "choice", "the feature map: elu is elu(x) + 1, relu", "", default="elu", choices=get_args(irn.FeatureMap)),
        Opt("normalize", "bool", "divide by phi(q) z (the paper); off: the plain sum", "", default=True),
        Opt("retention", "bool", "a fixed decay per head, 1 - 2^(-5 - head) (RetNet); causal only", "the state cools", default=False, field="decay"),
        Opt("chunk", "int", "positions per chunk of the training form", "", default=64, max=MAX_CONTEXT),
        _BIAS,
    ),
    "turbine delta": (
        Opt("heads", "int", "value heads, each with its own state, decay and write strength (num_v_heads)", "the pintle's sleeves", required=True, max=MAX_WIDTH),
        Opt("k_heads", "int", "query/key heads, each read by heads/k_heads value heads (num_k_heads); must divide heads", "", default_text="heads", max=MAX_WIDTH),
        Opt("head_dim", "int", "each query/key head's width", "", default_text="width/heads", max=MAX_WIDTH),
        Opt("v_dim", "int", "each value head's width", "", default_text="head_dim", max=MAX_WIDTH),
        Opt("conv", "int", "kernel of the short causal depthwise conv on q, k and v", "", default=4, min=1, max=MAX_CONTEXT),
        Opt("chunk", "int", "positions per chunk of the training form", "", default=64, max=MAX_CONTEXT),
        Opt("eps", "float", "the output's gated RMSNorm epsilon", "", default=1e-6, lo=0.0, lo_open=True, hi=1.0),
        Opt("negative_eigenvalues", "bool", "beta = 2 sigmoid(b), in (0, 2): a write may overshoot, so I - beta k k^T may turn a direction over (OLMo Hybrid's allow_neg_eigval)", "", default=False),
    ),
    "turbine mlp": (_RATIO, _HIDDEN, _ACT, _BIAS, Opt("dropout", ml="output dropout", **_DROPOUT), _CLAMP,
                    Opt("gate_scale", "float", "a gated MLP's gate pre-activation times this: act(gate_scale x gate(x)) x up(x) (Falcon-H1's mlp_multipliers)", "", default=1.0, lo=-1e6, hi=1e6),
                    Opt("per_layer", "bool", "Gemma 4's per-layer input gate: act(gate x) times this layer's per-layer input (the feed's per_layer, = hidden), then down", "a preburner's line into this stage", default=False)),

    "turbine moe": (
        Opt("experts", "int", "number of experts", "injector elements", required=True, max=MAX_EXPERTS),
        Opt("top", "int", "experts each token is routed to", "", default_text="2 (1 with one expert)"),
        Opt("capacity", "float", "capacity factor: tokens an expert takes, relative to an even share", "restrictor orifices", lo=0.0, lo_open=True, hi=1e3),
        Opt("balance", "float", "weight of the load-balancing loss", "mixture trim", default=0.0, lo=0.0, hi=1e3),
        Opt("normalize", "bool", "renormalise the chosen experts' weights to sum to 1, for every top (Mixtral); false: the raw probabilities", "", default=True),
        Opt("normalize_eps", "float", "with router=sigmoid and normalize: the chosen scores are divided by their sum + this (DeepSeek-V3's 1e-20; LFM2-MoE's 1e-6)", "", default=1e-20, lo=0.0, lo_open=True, hi=1.0),
        Opt("shared", "int", "hidden width of a shared expert every token visits (Qwen2-MoE); 0: none", "an injector element that always flows", default=0, min=0, max=MAX_WIDTH * 64),
        Opt("shared_gate", "bool", "scale the shared expert's output by sigmoid(w . x) (Qwen2-MoE)", "a throttle on that element", default=False),
        Opt("router", "choice", "the router's scores: softmax over the experts (Mixtral), or each expert's sigmoid (DeepSeek-V3); the chosen weights are these scores", "the injector's metering", default="softmax", choices=ROUTERS),
        Opt("groups", "int", "the experts in this many equal groups (n_group); a token picks its top experts in its top_groups best groups only", "injector elements manifolded in banks", default=1, max=MAX_EXPERTS),
        Opt("top_groups", "int", "with groups: the groups each token keeps (topk_group)", "banks opened per token", default_text="groups", max=MAX_EXPERTS),
        Opt("group_score", "choice", "with groups: a group's score, on the selection scores: top2, the sum of its two best (DeepSeek-V3); max, its best (DeepSeek-V2)", "", default="top2", choices=GROUP_SCORES),
        Opt("scale", "float", "the chosen weights x this, after any normalize (routed_scaling_factor)", "the routed flow's orifice gain", default=1.0, lo=0.0, lo_open=True, hi=1e3),
        Opt("correction", "bool", "a per-expert bias added to the scores for the selection only; the weights come from the unbiased scores (DeepSeek-V3's e_score_correction_bias, a buffer)", "trim orifices on the injector elements", default=False),
        Opt("correction_rate", "float", "with correction: each training forward, b_i += rate * sign(mean load - load_i) (auxiliary-loss-free balancing); 0: the bias is held", "the trim turned each firing, toward an even flow", default=0.0, lo=0.0, hi=1.0),
        _RATIO, _HIDDEN, _ACT, _BIAS,
        Opt("router_bias", "bool", "a bias on the router's linear, in the logits the top-k picks from and the weights come from (gpt-oss)", "", default=False),
        _CLAMP,
    ),
    "turbine pool": (Opt("size", "int", "pooling window, at least 2: size 1 averages a position alone, and pool(x) - x is zero (causal engines pool only the past)", "", default=3, min=2, max=MAX_CONTEXT),),
    "turbine conv": (
        Opt("size", "int", "kernel size: how many neighbouring positions mix", "", default=4, max=MAX_CONTEXT),
        _BIAS,
    ),
    "turbine short_conv": (
        Opt("size", "int", "kernel size: how many of its latest positions each channel of B·x mixes (LFM2's conv_L_cache); 1 mixes none", "the pintle's stroke", default=3, max=MAX_CONTEXT),
        Opt("bias", "bool", "biases on in_proj, the conv and out_proj (LFM2's conv_bias)", "", default=False),
    ),
    "turbine linear": (
        Opt("out", "int", "output width; narrower than the stream is a bottleneck", "a narrow duct is a throat", default_text="the width where it sits", context="width", max=MAX_VOCAB),
        _BIAS,
    ),
    "norm layernorm": (
        Opt("eps", "float", "added to the variance", "", default=1e-5, lo=0.0, lo_open=True, hi=1.0),
        Opt("bias", "bool", "a learned shift next to the gain", "", default_text="affine"),
        Opt("affine", "bool", "a learned gain (and bias); false normalises only (OLMo)", "an adjustable valve, not a fixed orifice", default=True),
        Opt("offset", "float", "the gain is offset + w, w starting at 1 - offset (Nemotron: 1)", "", default=0.0, lo=-1e6, hi=1e6),
    ),
    "norm rmsnorm": (
        Opt("eps", "float", "added to the mean square", "", default=1e-6, lo=0.0, lo_open=True, hi=1.0),
        Opt("affine", "bool", "a learned gain; false normalises only", "an adjustable valve, not a fixed orifice", default=True),
        Opt("offset", "float", "the gain is offset + w, w starting at 1 - offset (Gemma: 1)", "", default=0.0, lo=-1e6, hi=1e6),
    ),
    "norm scalar": (),  # Gemma 4's layer_scalar: a fixed gain on the stream, a buffer the weights bring
    "merge plain": (),
    "merge scale": (Opt("scale", "float", "x + scale * f(x): a fixed factor on the branch", "a fixed orifice", required=True, lo=-1e3, hi=1e3),),
    "merge cooling": (Opt("std", "float", "base std of the branch's output projection, divided by sqrt(merges into the main line)", "a rich, cool preburner", default_text="the init std", lo=0.0, lo_open=True, hi=10.0),),
    "merge rezero": (Opt("init", "float", "the learned scalar's start (ReZero: 0)", "the preburner starts unlit", default=0.0, lo=-1e3, hi=1e3),),
    "merge layerscale": (Opt("init", "float", "the per-channel scale's start", "a lean start", default_text="by depth (CaiT: 0.1, 1e-5, 1e-6)", lo=0.0, lo_open=True, hi=1e3),),
    "merge deepnorm": (
        Opt("alpha", "float", "DeepNet's main-line scale", "", default_text="(2N)^(1/4)", lo=0.0, lo_open=True, hi=1e3),
        Opt("beta", "float", "DeepNet's init gain of the branch's projections", "", default_text="(8N)^(-1/4)", lo=0.0, lo_open=True, hi=1e3),
    ),
    "merge gate": (Opt("bias", "float", "highway gate's starting bias: g = sigmoid(Wx + b)", "a throttle valve", default=-1.0, lo=-100.0, hi=100.0),),
    "merge hyper": (),
    "param standard": (),
    "param mup": (
        Opt("base_width", "int", "the width whose learning rates and init std are the spec's own (Tensor Programs V)", "the reference engine a bigger one is scaled from", default_text="the chamber's width", max=MAX_WIDTH),
    ),
    "schedule constant": (
        Opt("lr", "float", "the learning rate", "", default=1e-3, lo=0.0, lo_open=True, hi=10.0),
        Opt("steps", "int", "steps to train (the stand's --train may say)", ""),
    ),
    "schedule cosine": (
        Opt("lr", "float", "the peak learning rate", "", default=1e-3, lo=0.0, lo_open=True, hi=10.0),
        Opt("min", "float", "the learning rate at the end", "", default=0.0, lo=0.0),
        Opt("steps", "int", "steps the schedule runs", "", required=True),
    ),
    "schedule linear": (
        Opt("lr", "float", "the peak learning rate", "", default=1e-3, lo=0.0, lo_open=True, hi=10.0),
        Opt("min", "float", "the learning rate at the end", "", default=0.0, lo=0.0),
        Opt("steps", "int", "steps the schedule runs", "", required=True),
    ),
    "init normal": (Opt("std", "float", "std of the weights' normal init", "the chill-down", default=0.02, lo=0.0, lo_open=True, hi=10.0),),
    "init xavier": (),
}


def options_for(key: str) -> tuple[Opt, ...]:
    """The options a statement accepts (key: 'turbine attention', 'prechamber', ...)."""
    return TABLE.get(key, ())


def option(key: str, name: str) -> Opt | None:
    return next((o for o in TABLE.get(key, ()) if o.name == name), None)
