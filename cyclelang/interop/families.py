"""transformers model families: a checkpoint's config as the spec it implies, and back.

Each family reads its `config.json` by its `model_type` (never by guessing from the
weights' key names) into an `Arch`, the few numbers a decoder of that family is made
of, and `spec_text(arch)` writes the spec those numbers imply. The IR a checkpoint
implies is therefore `parse(spec_text(read_config(config)))`: one home for the
mapping, used by `cyclec import`, by the check before weights load, and by
`cyclec export` (which writes a config and checks that importing it gives back the
spec it came from).

A config field the language cannot express is refused by name (`Unsupported`),
never approximated: a llama3 rotary scaling, GPT-2's layer-index attention scaling,
a per-layer pattern of sliding windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .. import ir
from ..ir.kinds import is_gated
from .closed import CLASSES, INERT, Config, Keys, Unsupported, fields_of, remap
from .hf_fields import TRANSFORMERS_VERSION

# transformers activations -> the language's. A gated MLP (Llama's gate/up/down)
# takes the gated form of its activation.
_PLAIN_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": None,
               "relu": "relu", "silu": "silu", "swish": "silu", "relu2": "relu2"}
_GATED_ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu"}
_HF_PLAIN = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu", "relu2": "relu2"}
_HF_GATED = {"swiglu": "silu", "geglu": "gelu"}


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
    router: str = "softmax"  # DeepSeek-V3's router (families_routed.py): softmax | sigmoid scores
    groups: int = 1  # ... n_group
    top_groups: int = 1  # ... topk_group
    route_scale: float = 1.0  # ... routed_scaling_factor
    correction: bool = False  # ... a selection-only bias per expert (e_score_correction_bias)
    sinks: bool = False  # gpt-oss (families_sinks.py): a learned logit per head in every softmax
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
    return out


# --- Mamba-2: a stack of ssm mixers, each with an RMSNorm in front ---------------------------


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 checkpoint (Mamba2ForCausalLM), in the language's terms: each layer is
    one `turbine ssm` with an RMSNorm in front. Import and loading only (export: not yet)."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    head_dim: int
    state: int
    groups: int
    conv: int
    chunk: int
    bias: bool
    conv_bias: bool
    eps: float
    dt_min: float
    dt_max: float
    dt_lo: float
    dt_hi: float | None  # None: no upper limit
    tied: bool
    sources: dict = field(default_factory=dict, compare=False)


def _mamba2_text(a: Mamba2, source: str) -> str:
    src = a.sources
    ssm = (f"turbine ssm heads={a.heads} head_dim={a.head_dim} state={a.state} groups={a.groups} conv={a.conv} chunk={a.chunk} "
           f"bias={_num(a.bias)} conv_bias={_num(a.conv_bias)} eps={_num(a.eps)} dt_min={_num(a.dt_min)} dt_max={_num(a.dt_max)}")
    if a.dt_lo:
        ssm += f" dt_lo={_num(a.dt_lo)}"
    if a.dt_hi is not None:
        ssm += f" dt_hi={_num(a.dt_hi)}"
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    return "\n".join([
        f"# A {a.family} checkpoint, imported from {source} by `cyclec import`.",
        "# Every value comes from the config field named beside it; the weights load with",
        "# cyclelang.interop.load_transformers(model, checkpoint).",
        "",
        f"let depth = {a.layers}  # {src['layers']}",
        f"let d_model = {a.width}  # {src['width']}",
        "",
        "# one mamba2 layer: the ssm mixer with its RMSNorm in front (the layers repeat it)",
        "stage mamba2_block {",
        "  prechamber mix {",
        f"    {norm}{_comment(src, 'eps')}",
        f"    {ssm}{_comment(src, 'heads', 'state', 'groups', 'conv', 'chunk', 'dt')}",
        "  }",
        "}",
        "",
        *_engine_lines(a, src, f"feed tokens vocab={a.vocab} context={a.context} position=none{_comment(src, 'vocab')}",
                       ["  stage mamba2_block x depth"], norm)])


def _engine_lines(a, src: dict, feed: str, body: list[str], norm: str) -> list[str]:
    """The engine block of an expander family's spec: causal, its feed line, its stages, the final norm
    and the head (tied where the checkpoint ties it)."""
    return [f"engine {a.family} {{", "  chamber width=d_model", "  throat causal", f"  {feed}", "", *body, "",
            f"  {norm}  # the final norm", "  nozzle head" + (" tied" if a.tied else "") + _comment(src, "tied"), "}", ""]


# --- Mamba-1, Jamba and DeepSeek-V2: the expander families ------------------------------------


@dataclass(frozen=True)
class Mamba1Mixer:
    """The numbers of one Mamba-1 mixer (`turbine ssm version=1`), as a config gives them."""

    inner: int
    state: int
    dt_rank: int
    conv: int
    bias: bool
    conv_bias: bool
    norms: bool  # Jamba's dt/B/C RMSNorms
    eps: float  # their eps
    dt_min: float = 0.001
    dt_max: float = 0.1
    affine: bool = True  # false: the norms have no weight (Falcon-Mamba's)

    def text(self, width: int) -> str:
        expand = self.inner / width
        t = (f"turbine ssm version=1 state={self.state} expand={_num(expand)} dt_rank={self.dt_rank} conv={self.conv} "
             f"bias={_num(self.bias)} conv_bias={_num(self.conv_bias)}")
        if self.norms:
            t += f" norms eps={_num(self.eps)}" + ("" if self.affine else " norms_affine=false")
        if (self.dt_min, self.dt_max) != (0.001, 0.1):
            t += f" dt_min={_num(self.dt_min)} dt_max={_num(self.dt_max)}"
        return t


@dataclass(frozen=True)
class MambaFamily:
    """A Mamba-1 checkpoint (MambaForCausalLM): each layer one `turbine ssm version=1` with an RMSNorm in front."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    mixer: Mamba1Mixer
    eps: float
    tied: bool
    sources: dict = field(default_factory=dict, compare=False)


def _header(family: str, source: str) -> list[str]:
    return [f"# A {family} checkpoint, imported from {source} by `cyclec import`.",
            "# Every value comes from the config field named beside it; the weights load with",
            "# cyclelang.interop.load_transformers(model, checkpoint).", ""]


def _mamba_text(a: MambaFamily, source: str) -> str:
    src = a.sources
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    return "\n".join([
        *_header(a.family, source),
        f"let depth = {a.layers}  # {src['layers']}",
        f"let d_model = {a.width}  # {src['width']}",
        "",
        "# one mamba layer: the Mamba-1 mixer with its RMSNorm in front, no MLP (the layers repeat it)",
        "stage mamba_block {",
        "  prechamber mix {",
        f"    {norm}{_comment(src, 'eps')}",
        f"    {a.mixer.text(a.width)}{_comment(src, 'mixer')}",
        "  }",
        "}",
        "",
        *_engine_lines(a, src, f"feed tokens vocab={a.vocab} context={a.context} position=none{_comment(src, 'vocab')}",
                       ["  stage mamba_block x depth"], norm)])


@dataclass(frozen=True)
class JambaFamily:
    """A Jamba checkpoint (JambaForCausalLM): layer i mixes with attention where i % attn_layer_period ==
    attn_layer_offset and with a Mamba-1 mixer (with its dt/B/C norms) elsewhere; its MLP is routed
    experts where i % expert_layer_period == expert_layer_offset, a dense swiglu MLP elsewhere."""

    family: str
    vocab: int
    context: int
    width: int
    pattern: tuple  # per layer (mixer, reactor): ("attention" | "mamba", "mlp" | "moe")
    heads: int
    kv_heads: int
    hidden: int
    experts: int
    top: int
    mixer: Mamba1Mixer
    eps: float
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)


def _fold(pattern, first: int, pad: str) -> list[str]:
    """Stage lines for consecutive layers pattern[0:], numbered from `first`: a run of one
    layer kind is one stage `x N`; a run of two kinds in turn (MLP, experts) a nested stage."""
    out, i = [], 0
    while i < len(pattern):
        run = 1
        while i + run < len(pattern) and pattern[i + run] == pattern[i]:
            run += 1
        pairs = 0
        while i + 2 * pairs + 1 < len(pattern) and pattern[i + 2 * pairs : i + 2 * pairs + 2] == pattern[i : i + 2] and pattern[i] != pattern[i + 1]:
            pairs += 1
        lo = first + i
        if pairs >= 2 and 2 * pairs > run:
            (m1, r1), (m2, r2) = pattern[i], pattern[i + 1]
            out += [f"{pad}stage layers{lo}_{lo + 2 * pairs - 1} x {pairs} {{  # {m1} + {r1}, then {m2} + {r2}",
                    f"{pad}  stage first = {m1}_{r1}", f"{pad}  stage second = {m2}_{r2}", f"{pad}}}"]
            i += 2 * pairs
            continue
        name = f"layer{lo}" if run == 1 else f"layers{lo}_{lo + run - 1}"
        out.append(f"{pad}stage {name} = {pattern[i][0]}_{pattern[i][1]}" + (f" x {run}" if run > 1 else ""))
        i += run
    return out


def _jamba_body(a: "JambaFamily") -> list[str]:
    """The engine's stages: a nested stage of the pattern's period (the two periods' lcm) repeated,
    then the layers left over; each period's layers folded (`_fold`)."""
    L = len(a.pattern)
    period = next((p for p in range(1, L // 2 + 1) if all(a.pattern[i] == a.pattern[i % p] for i in range(L))), L)
    blocks = L // period
    if blocks < 2 or period == 1:
        return _fold(a.pattern, 0, "  ")
    lines = [f"  stage jamba_block x {blocks} {{  # layers 0-{blocks * period - 1}: {period} layers, {blocks} times",
             *_fold(a.pattern[:period], 0, "    "), "  }"]
    return lines + _fold(a.pattern[blocks * period:], blocks * period, "  ")


def _jamba_text(a: JambaFamily, source: str) -> str:
    src = a.sources
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    mixers = {"attention": f"turbine attention heads={a.heads}{kv} bias=false  # no positions: the Mamba layers carry them",
              "mamba": f"{a.mixer.text(a.width)}{_comment(src, 'mixer')}"}
    reactors = {"mlp": f"turbine mlp hidden={a.hidden} act=swiglu bias=false{_comment(src, 'hidden')}",
                "moe": f"turbine moe experts={a.experts} top={a.top} hidden={a.hidden} act=swiglu bias=false normalize=false"
                       f"  # {src['experts']}; the top-k weights are not renormalised"}
    templates: list[str] = []
    for m, r in dict.fromkeys(a.pattern):
        templates += [f"stage {m}_{r} {{", "  prechamber mix {", f"    {norm}", f"    {mixers[m]}", "  }",
                      "  prechamber burn {", f"    {norm}", f"    {reactors[r]}", "  }", "}", ""]
    body = _jamba_body(a)
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *_header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: each a mixer (attention or",
        "# Mamba-1 with its dt/B/C norms), then an MLP or routed experts, each with its RMSNorm in front",
        *templates,
        *_engine_lines(a, src, f"{feed}{_comment(src, 'vocab', 'padding')}", body, norm)])


@dataclass(frozen=True)
class DeepseekV2Family:
    """A DeepSeek-V2 checkpoint (DeepseekV2ForCausalLM): latent attention in every layer; a dense
    swiglu MLP in the first `dense` layers (first_k_dense_replace), then DeepSeekMoE: routed experts
    (raw softmax weights) beside a shared expert every token visits."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    dense: int
    heads: int
    head_dim: int
    rotary_dims: int
    v_dim: int
    latent: int
    q_latent: int | None
    rotary_base: float
    hidden: int
    moe_hidden: int
    experts: int
    top: int
    shared: int
    eps: float
    bias: bool
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)
    routing: tuple = ()  # the moe's router options beyond Mixtral's, as (option, value) (DeepSeek-V3's router; V2's groups and scale)
    post_moe_norm: bool = False  # an RMSNorm on the MoE block's output, before the residual (A.X-K1's post_mlp_layernorm)


def _deepseek_v2_text(a: DeepseekV2Family, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    q = f" q_latent={a.q_latent}" if a.q_latent is not None else ""
    base = f" rotary_base={_num(a.rotary_base)}" if a.rotary_base != 10000.0 else ""
    attn = (f"turbine attention heads={a.heads} latent={a.latent}{q} head_dim={a.head_dim} rotary_dims={a.rotary_dims} v_dim={a.v_dim}"
            f"{base} bias={_num(a.bias)}{_comment(src, 'attn', 'rotary_base' if base else '')}")
    mix = ["  prechamber mix {", f"    {norm}{_comment(src, 'eps')}", f"    {attn}", "  }"]
    stages = []
    if a.dense:
        stages += [f"# the first {a.dense} layers ({src['dense']}): latent attention, then a dense swiglu MLP", "stage dense_block {", *mix,
                   "  prechamber burn {", f"    {norm}", f"    turbine mlp hidden={a.hidden} act=swiglu bias=false{_comment(src, 'hidden')}",
                   "  }", "}", ""]
    if a.layers > a.dense:
        routing = dict(a.routing)
        normalize = "" if routing.pop("normalize", False) else " normalize=false"
        route = "".join(f" {k}={_num(v) if not isinstance(v, str) else v}" for k, v in routing.items())
        words = ("routed experts (DeepSeek-V3's router: sigmoid scores, a selection-only correction bias, group-limited top-k)"
                 if routing.get("router") == "sigmoid" else "routed experts (their raw softmax weights)")
        stages += [f"# then DeepSeekMoE: {words} beside a shared expert every token visits",
                   "stage moe_block {", *mix, "  prechamber burn {", f"    {norm}",
                   f"    turbine moe experts={a.experts} top={a.top} hidden={a.moe_hidden} act=swiglu bias=false{normalize}{route} "
                   f"shared={a.shared}{_comment(src, 'moe', 'routing' if route else '')}",
                   *([f"    {norm}  # post_mlp_layernorm: on the MoE block's output"] if a.post_moe_norm else []), "  }", "}", ""]
    body = ([f"  stage dense_block x {a.dense}"] if a.dense else []) + ([f"  stage moe_block x {a.layers - a.dense}"] if a.layers > a.dense else [])
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *_header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}; {a.layers} layers ({src['layers']})",
        "",
        *stages,
        *_engine_lines(a, src, f"{feed}{_comment(src, 'vocab', 'padding')}", body, norm)])


_SCALINGS = ("linear", "dynamic", "llama3", "yarn")


def _rope_kind(c: Config) -> tuple[dict, str, str]:
    """(rope parameters, where they came from, rope_type), refusing a rotary scaling the language does not have (longrope, ...)."""
    rope, where = c.rope()
    kind = rope.get("rope_type")
    if kind not in ("default", *_SCALINGS):
        raise Unsupported(f"{where}.rope_type", f"rotary scaling {kind!r} is not in the language; it has {', '.join(_SCALINGS)} "
                          "(and plain rotary, rope_type=default)")
    beta = rope.get("llama_4_scaling_beta")
    if beta:
        raise Unsupported(f"{where}.llama_4_scaling_beta", "queries scaled by 1 + beta log(1 + floor(position / original context)) "
                          "(Llama 4's attention temperature) are not in the language")
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
    return ir.RotaryScaling(type=kind, factor=float(factor), original=None if kind == "linear" else int(original),
                            low=float(rope.get("low_freq_factor", 1.0)), high=float(rope.get("high_freq_factor", 4.0)),
                            beta_fast=float(rope.get("beta_fast") or 32.0), beta_slow=float(rope.get("beta_slow") or 1.0),
                            attention_factor=None if gain is None else float(gain), truncate=kind != "yarn" or truncate)
# --- the readers: one per family, each reading only the keys its Keys declare (closed.py) ------------

_GPT2_HEADS = "GPT2DoubleHeadsModel's multiple-choice head; the causal LM has none"
KEYS: dict[str, Keys] = {
    "gpt2": Keys(frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "layer_norm_epsilon",
                            "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "tie_word_embeddings"}),
                 {"summary_type": _GPT2_HEADS, "summary_use_proj": _GPT2_HEADS, "summary_activation": _GPT2_HEADS,
                  "summary_proj_to_labels": _GPT2_HEADS, "summary_first_dropout": _GPT2_HEADS,
                  "pad_token_id": "GPT-2's embedding has no padding row: the forward does not read it",
                  "reorder_and_upcast_attn": "computes the attention scores in float32 for half-precision training: the same function",
                  "n_ctx": "an older copy of the context length; transformers 5's GPT-2 reads n_positions"}),
}


def _gpt2(c: Config) -> Arch:
    if not c["scale_attn_weights"]:
        raise Unsupported("scale_attn_weights", "attention without the 1/sqrt(head_dim) scale is not in the language")
    if c["scale_attn_by_inverse_layer_idx"]:
        raise Unsupported("scale_attn_by_inverse_layer_idx", "a per-layer attention scale 1/(layer + 1) is not in the language")
    width, heads = c["n_embd"], c["n_head"]
    _divides(width, heads, "n_head", "n_embd")
    act_name = c["activation_function"]
    act = _PLAIN_ACTS.get(act_name)
    if act is None:
        raise Unsupported("activation_function", f"{act_name!r} has no counterpart among the language's activations")
    return Arch("gpt2", vocab=c["vocab_size"], context=c["n_positions"], width=width, layers=c["n_layer"],
                heads=heads, kv_heads=heads, head_dim=width // heads, hidden=c["n_inner"] or 4 * width, act=act,
                norm="layernorm", eps=_eps(c, "layer_norm_epsilon"), position="learned", norm_bias=True, qkv_bias=True,
                out_bias=True, mlp_bias=True, tied=c["tie_word_embeddings"],
                sources={"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                         "hidden": "n_inner", "act": "activation_function", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"})


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
_WINDOW_KEYS = frozenset({"layer_types", "max_window_layers", "use_sliding_window", "sliding_window"})
_MOE_KEYS = frozenset({"decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob", "num_experts", "num_experts_per_tok",
                       "qkv_bias", "shared_expert_intermediate_size"})
_DECODERS = {
    "llama": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}, _TP),
    "internlm3": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
    "iquestcoder": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
    "seed_oss": Keys(_LLAMA | {"head_dim", "attention_bias", "attention_out_bias", "mlp_bias"}, _TP),
    "mistral": Keys(_LLAMA | {"head_dim", "sliding_window"}),
    "ministral": Keys(_LLAMA | {"head_dim", "sliding_window", "layer_types"}),
    "ministral3": Keys(_LLAMA | {"head_dim", "sliding_window"}),
    "mixtral": Keys(_LLAMA | {"head_dim", "sliding_window", "num_local_experts", "num_experts_per_tok", "router_jitter_noise"}),
    "qwen2": Keys(_LLAMA | _WINDOW_KEYS),
    "qwen3": Keys(_LLAMA | _WINDOW_KEYS | {"head_dim", "attention_bias"}),
    "qwen2_moe": Keys(_LLAMA | _WINDOW_KEYS | _MOE_KEYS),
    "phi3": Keys(_LLAMA | {"original_max_position_embeddings", "sliding_window"}),
    "olmo": Keys(_LLAMA - {"rms_norm_eps"} | {"attention_bias", "clip_qkv"}),
    "olmo2": Keys(_LLAMA | {"attention_bias"}),
    "gemma": Keys(_LLAMA | {"head_dim", "attention_bias", "use_bidirectional_attention"},
                  {"hidden_activation": "Gemma's forward reads hidden_act; the hidden_activation some of its configs also write is ignored"}),
    "gemma2": Keys(_LLAMA - {"hidden_act"} | {"head_dim", "attention_bias", "use_bidirectional_attention", "hidden_activation",
                                               "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "layer_types",
                                               "sliding_window"},
                   {"hidden_act": "Gemma 2's forward reads hidden_activation; the hidden_act its released configs also write is ignored"}),
    "granite": Keys(_LLAMA | {"attention_bias", "mlp_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"}),
}
KEYS.update(_DECODERS)
_GATED_ACTS.update({"gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh"})
_HF_GATED["geglu_tanh"] = "gelu_pytorch_tanh"
_WINDOWED = ("mistral", "ministral3", "mixtral", "phi3")  # one sliding window for every layer
_LAYER_TYPES = ("qwen2", "qwen3", "qwen2_moe")  # use_sliding_window, from max_window_layers on: a per-layer pattern
_LLAMA_LIKE = ("llama", "internlm3", "iquestcoder", "seed_oss")  # LlamaForCausalLM's function (Seed-OSS: its output bias apart)


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


def _layer_windows(c: Config, family: str, layers: int) -> tuple[int | None, tuple]:
    """The windows of the families that say them per layer, as each class's __post_init__ fills layer_types in:
    Qwen2 and Qwen3 from max_window_layers on, Qwen2-MoE every other layer below it, Ministral every layer."""
    if family == "ministral":
        sw = _sliding(c)
        types = _types(c, layers, lambda: ["sliding_attention" if sw is not None else "full_attention"] * layers)
        if "sliding_attention" in types and sw is None:
            raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
        return _windows(types, sw)
    on = c["use_sliding_window"]
    sw = _sliding(c) if on else None
    mwl = c["max_window_layers"]
    if family == "qwen2_moe":
        default = lambda: ["sliding_attention" if (i + 1) % 2 and i < mwl and on else "full_attention" for i in range(layers)]  # noqa: E731
    else:
        default = lambda: ["sliding_attention" if sw is not None and i >= mwl else "full_attention" for i in range(layers)]  # noqa: E731
    types = _types(c, layers, default)
    if "sliding_attention" in types and sw is None:
        raise Unsupported("use_sliding_window", "layer_types has sliding layers, but use_sliding_window is off (transformers gives them no window)")
    return _windows(types, sw)


def _decoder(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = _kv(c, heads)
        act_name = c["hidden_activation"] if family == "gemma2" else c["hidden_act"]
        if family == "gemma" and act_name == "gelu":  # GemmaConfig.__post_init__: Gemma's "gelu" is the tanh GELU
            act_name = "gelu_pytorch_tanh"
        act = (_PLAIN_ACTS if family in _UNGATED else _GATED_ACTS).get(act_name)
        if act is None and family in _UNGATED:
            raise Unsupported("hidden_act", f"{act_name!r} has no counterpart among the language's activations (an ungated MLP)")
        if act is None:
            raise Unsupported("hidden_activation" if family == "gemma2" else "hidden_act",
                              f"a gated MLP with {act_name!r} has no counterpart (the language has swiglu = silu, geglu = gelu, "
                              "geglu_tanh = the tanh GELU)")
        window = _sliding(c) if family in _WINDOWED else None
        windows: tuple = ()
        if family in _LAYER_TYPES or family == "ministral":  # local and global layers
            window, windows = _layer_windows(c, family, layers)
        if family == "olmo" and c["clip_qkv"] is not None:
            raise Unsupported("clip_qkv", "clamping q, k and v to a range is not in the language")
        if family in ("gemma", "gemma2") and c["use_bidirectional_attention"]:
            raise Unsupported("use_bidirectional_attention", "a bidirectional Gemma is an encoder, not a causal LM")
        if family == "internlm3" and bool(c["attention_bias"]) != bool(c["mlp_bias"]):
            raise Unsupported("mlp_bias", "transformers refuses an InternLM3 whose attention_bias and mlp_bias differ")
        if family == "mixtral" and c["router_jitter_noise"]:
            raise Unsupported("router_jitter_noise", "multiplicative noise on the router's input while training is not in the language")
        experts = top = shared = 0
        normalize = True
        hidden = c["intermediate_size"]
        if family == "mixtral":
            experts, top = c["num_local_experts"], c["num_experts_per_tok"]
        pattern: dict = {}  # a per-layer pattern of dense and routed layers
        if family == "qwen2_moe":
            step, only = c["decoder_sparse_step"], c["mlp_only_layers"]
            only = set(only or ())
            dense = tuple(i in only or not (c["num_experts"] > 0 and (i + 1) % step == 0) for i in range(layers))
            if all(dense):
                raise Unsupported("mlp_only_layers" if only else "decoder_sparse_step", "every layer is dense: write the checkpoint as a qwen2 (no experts)")
            if any(dense):
                pattern.update(layer_dense=dense, dense_hidden=c["intermediate_size"])
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
            shared, normalize = c["shared_expert_intermediate_size"], bool(c["norm_topk_prob"])
        if experts and not 1 <= top <= experts:
            raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
        attention_bias = bool(c["attention_bias"]) if "attention_bias" in c.keys.maps else False
        qkv_bias = True if family == "qwen2" else bool(c["qkv_bias"]) if family == "qwen2_moe" else attention_bias
        out_bias = bool(c["attention_out_bias"]) if family == "seed_oss" else False if family in ("qwen2", "qwen2_moe") else attention_bias
        mlp_bias = bool(c["mlp_bias"]) if "mlp_bias" in c.keys.maps else False
        head_dim = (c["head_dim"] if "head_dim" in c.keys.maps else None) or width // heads
        if "head_dim" not in c.keys.maps or not c["head_dim"]:
            _divides(width, heads, "num_attention_heads", "hidden_size")
        sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size",
                   "act": "hidden_act", "eps": "rms_norm_eps", "rotary_base": "rope_theta", "window": "sliding_window",
                   "experts": "num_local_experts", "top": "num_experts_per_tok", "tied": "tie_word_embeddings"}
        extra: dict = dict(pattern)
        if windows:
            if pattern:
                raise Unsupported("layer_types", "sliding and global layers together with dense and routed ones: two per-layer patterns at once are not mapped")
            extra["layer_windows"] = windows
        if family == "olmo":
            extra.update(norm="layernorm", eps=1e-5, norm_affine=False, norm_bias=False)
            sources["eps"] = "OLMo's fixed 1e-5, no weight or bias"
        else:
            extra.update(norm="rmsnorm", eps=_eps(c, "rms_norm_eps"))
        if family == "olmo2":
            extra.update(post_norms=True, qk_norm="all", qk_eps=_eps(c, "rms_norm_eps"))
        if family == "qwen3":
            extra.update(qk_norm="head", qk_eps=_eps(c, "rms_norm_eps"))
        if family == "gemma":
            extra.update(norm_offset=1.0, embed_scale=float(width) ** 0.5)
            sources["embed_scale"] = "Gemma's sqrt(hidden_size)"
        if family == "gemma2":
            sw = _sliding(c)
            types = _types(c, layers, lambda: ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)])
            if sw is None:  # Gemma2Model builds the sliding mask whatever layer_types say
                raise Unsupported("sliding_window", "null: transformers' Gemma 2 cannot build its sliding-window mask without one "
                                  "(a model with only global layers still names a window)")
            window, extra["layer_windows"] = _windows(types, sw)
            if not extra["layer_windows"]:
                del extra["layer_windows"]
            scalar = c["query_pre_attn_scalar"]
            if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or not scalar > 0:
                raise Unsupported("query_pre_attn_scalar", f"{scalar!r} is not a positive number")
            extra.update(norm_offset=1.0, embed_scale=float(width) ** 0.5, sandwich=True, attn_scale=float(scalar) ** -0.5,
                         softcap=_cap(c, "attn_logit_softcapping"), logit_softcap=_cap(c, "final_logit_softcapping"))
            sources.update(embed_scale="Gemma's sqrt(hidden_size)", attn_scale="query_pre_attn_scalar", softcap="attn_logit_softcapping",
                           logit_softcap="final_logit_softcapping", window="sliding_window, layer_types", act="hidden_activation")
        if family == "granite":
            for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
                if not c[k]:
                    raise Unsupported(k, f"{c[k]!r}: Granite's multipliers are non-zero numbers")
            extra.update(embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                         attn_scale=float(c["attention_multiplier"]), logit_scale=1.0 / float(c["logits_scaling"]))
            sources.update(embed_scale="embedding_multiplier", residual_scale="residual_multiplier", attn_scale="attention_multiplier",
                           logit_scale="logits_scaling")
        context = c["max_position_embeddings"]
        scaling = _rope_scaling(c, context)
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, scaling), width=width, layers=layers,
                    heads=heads, kv_heads=kv, head_dim=head_dim, hidden=hidden, act=act, **extra,
                    qkv_bias=qkv_bias, out_bias=out_bias, mlp_bias=mlp_bias, rotary=_rotary(_whole_heads(c, family), head_dim), rotary_base=_rope(c),
                    rotary_scaling=scaling,
                    window=window, experts=experts, top=top, normalize=normalize, shared=shared, shared_gate=bool(shared),
                    tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources)
    return read


# The Llama-shaped families whose rope reads partial_rotary_factor; the others' default rope turns whole heads
# whatever it says (and a scaled rope then fails on a factor), so a factor other than 1 is refused for them.
_PARTIAL_READ = ("phi3", "nemotron")


def _whole_heads(c: Config, family: str) -> float:
    """The rotary fraction of a Llama-shaped family: the config's where its rope reads it, else 1 (any other value refused)."""
    partial = _partial(c)
    if family not in _PARTIAL_READ and partial != 1.0:
        raise Unsupported(f"{_rope_kind(c)[1]}.partial_rotary_factor", f"{partial}: transformers' {family} rotates whole heads whatever this "
                          "says (its default rope reads no partial factor; a scaled one fails on it)")
    return partial


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


# Layernorm decoders with an ungated MLP, biases, partial rotary, parallel blocks.
_PLAIN_KEYS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act",
                         "max_position_embeddings", "tie_word_embeddings", "rope_parameters"})
_PLAIN = {
    "phi": Keys(_PLAIN_KEYS | {"num_key_value_heads", "layer_norm_eps", "qk_layernorm", "pad_token_id"}),
    "starcoder2": Keys(_PLAIN_KEYS | {"num_key_value_heads", "norm_epsilon", "use_bias", "sliding_window", "pad_token_id"}),
    "gpt_neox": Keys(_PLAIN_KEYS | {"layer_norm_eps", "use_parallel_residual", "attention_bias"},
                     {"is_decoder": "marks the model for use as an encoder-decoder's decoder; GPT-NeoX's causal LM does not read it",
                      "pad_token_id": "GPT-NeoX's embedding has no padding row: the forward does not read it"},
                     {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"}),
    "gptj": Keys(frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "rotary_dim", "activation_function",
                            "layer_norm_epsilon", "tie_word_embeddings"}),
                 {"pad_token_id": "GPT-J's embedding has no padding row: the forward does not read it"}),
    "falcon": Keys(frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_kv_heads", "multi_query",
                              "new_decoder_architecture", "num_ln_in_parallel_attn", "parallel_attn", "bias", "ffn_hidden_size", "activation",
                              "max_position_embeddings", "layer_norm_epsilon", "tie_word_embeddings", "alibi", "rope_parameters"}),
                   {"pad_token_id": "Falcon's embedding has no padding row: the forward does not read it"}),
}
KEYS.update(_PLAIN)


def _plain(family: str):
    def read(c: Config) -> Arch:
        pad = None
        if family == "gptj":
            width, heads, layers, context = c["n_embd"], c["n_head"], c["n_layer"], c["n_positions"]
            _divides(width, heads, "n_head", "n_embd")
            rd = c["rotary_dim"] or width // heads
            if rd > width // heads:
                raise Unsupported("rotary_dim", f"{rd} rotated dims exceed head_dim {width // heads}")
            partial, kv, hidden, act_key, eps_key = rd / (width // heads), heads, c["n_inner"] or 4 * width, "activation_function", "layer_norm_epsilon"
        elif family == "falcon":
            width, heads, layers, context = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["max_position_embeddings"]
            _divides(width, heads, "num_attention_heads", "hidden_size")
            new = bool(c["new_decoder_architecture"])  # grouped query attention, always parallel, one or two norms
            n_ln = c["num_ln_in_parallel_attn"]
            n_ln = 2 if n_ln is None else n_ln
            if new and n_ln not in (1, 2):
                raise Unsupported("num_ln_in_parallel_attn", "Falcon's new decoder has one norm (shared) or two (ln_attn, ln_mlp) per block")
            if new:
                kv = _kv(c, heads, "num_kv_heads")
            else:
                kv = 1 if c["multi_query"] else _kv(c, heads, "num_kv_heads")
            parallel = ("separate" if n_ln == 2 else "shared") if new else ("shared" if c["parallel_attn"] else "none")
            partial, hidden, act_key, eps_key = _partial(c), c["ffn_hidden_size"] or 4 * width, "activation", "layer_norm_epsilon"
        else:
            width, heads, layers, context = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"], c["max_position_embeddings"]
            _divides(width, heads, "num_attention_heads", "hidden_size")
            kv = _kv(c, heads) if "num_key_value_heads" in c.keys.maps else heads
            partial, hidden, act_key = _partial(c), c["intermediate_size"], "hidden_act"
            eps_key = {"starcoder2": "norm_epsilon"}.get(family, "layer_norm_eps")
            pad = _padding(c) if "pad_token_id" in c.keys.maps else None
        act_name = c[act_key]
        act = _PLAIN_ACTS.get(act_name)
        if act is None:
            raise Unsupported(act_key, f"{act_name!r} has no counterpart among the language's activations")
        bias = bool(c["use_bias"]) if family == "starcoder2" else bool(c["bias"]) if family == "falcon" else False if family == "gptj" \
            else bool(c["attention_bias"]) if family == "gpt_neox" else True
        if family in ("phi", "gptj"):
            parallel = "shared"
        elif family == "gpt_neox":
            parallel = "separate" if c["use_parallel_residual"] else "none"
        elif family != "falcon":
            parallel = "none"
        alibi = family == "falcon" and bool(c["alibi"])  # ALiBi in place of rotary
        scaling = _rope_scaling(c, context) if family != "gptj" and not alibi else None
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, scaling), width=width, layers=layers,
                    heads=heads, kv_heads=kv, head_dim=width // heads, hidden=hidden, act=act, norm="layernorm",
                    rotary_scaling=scaling, eps=_eps(c, eps_key), norm_bias=True, qkv_bias=bias, out_bias=bias,
                    mlp_bias=bias if family in ("starcoder2", "falcon") else True, rotary=0.0 if alibi else _rotary(partial, width // heads),
                    rotary_base=_rope(c) if family != "gptj" else 10000.0,
                    window=_sliding(c) if family == "starcoder2" else None, tied=bool(c["tie_word_embeddings"]),
                    padding=pad, parallel=parallel, head_bias=family in ("phi", "gptj"), rotary_interleaved=family == "gptj", alibi=alibi,
                    sources={"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                             "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size",
                             "act": act_key, "eps": eps_key, "rotary_base": "rope_theta", "window": "sliding_window",
                             "tied": "tie_word_embeddings",
                             **({"kv_heads": "num_kv_heads, multi_query", "hidden": "ffn_hidden_size"} if family == "falcon" else {})}
                    if family != "gptj" else
                    {"vocab": "vocab_size", "context": "n_positions", "width": "n_embd", "layers": "n_layer", "heads": "n_head",
                     "hidden": "n_inner", "act": "activation_function", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"})
    return read


_SSM_INIT = "the initialisation of dt's bias and of the output projections; an import loads every weight"
_SSM_PATH = "which implementation (CUDA kernels, mambapy, an associative scan) computes the mixer: the same function"
_FP32 = "keeps the residual in float32 under half precision: the same function in float32"
KEYS["mamba2"] = Keys(frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "state_size", "expand", "conv_kernel",
                                 "n_groups", "use_bias", "use_conv_bias", "hidden_act", "layer_norm_epsilon", "chunk_size", "time_step_min",
                                 "time_step_max", "time_step_limit", "tie_word_embeddings", "max_position_embeddings",
                                 "rescale_prenorm_residual"}),
                      {"time_step_floor": _SSM_INIT, "time_step_rank": "Mamba-2's step size is one per head: the forward does not read a rank", "residual_in_fp32": _FP32,
                       "pad_token_id": "Mamba-2's embedding has no padding row: the forward does not read it",
                       "rms_norm": "transformers 5's Mamba-2 always gates its RMSNorm; the older key is not read"})


def _rescaled(c: Config) -> None:
    if c["rescale_prenorm_residual"]:
        raise Unsupported("rescale_prenorm_residual", "transformers divides the loaded out_proj weights by sqrt(num_hidden_layers) when "
                          "this is set (its init runs on loaded weights): what the checkpoint computes depends on the transformers release")


def _mamba2(c: Config) -> Mamba2:
    _rescaled(c)
    width, heads, head_dim = c["hidden_size"], c["num_heads"], c["head_dim"]
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the ssm's conv and gate use silu; {c['hidden_act']!r} has no counterpart")
    if heads * head_dim != int(c["expand"] * width):
        raise Unsupported("head_dim", f"num_heads x head_dim = {heads * head_dim}, but expand x hidden_size = {int(c['expand'] * width)}: "
                          "transformers' mixer assumes they agree")
    if heads % c["n_groups"]:
        raise Unsupported("n_groups", f"{c['n_groups']} groups do not divide {heads} heads")
    limit = c["time_step_limit"]
    if not isinstance(limit, list) or len(limit) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in limit) \
            or not 0 <= limit[0] < limit[1]:
        raise Unsupported("time_step_limit", f"{limit!r} is not a range [low, high] of step sizes (high may be Infinity)")
    lo, hi = float(limit[0]), float(limit[1])
    src = {"layers": "num_hidden_layers", "width": "hidden_size", "vocab": "vocab_size", "heads": "num_heads", "state": "state_size",
           "groups": "n_groups", "conv": "conv_kernel", "chunk": "chunk_size", "eps": "layer_norm_epsilon", "dt": "time_step_limit",
           "tied": "tie_word_embeddings"}
    # Mamba2ForCausalLM has no position table and no context limit: max_position_embeddings, where a config writes
    # one, or 2048 is only the feed's (a decoding cache's) length
    return Mamba2("mamba2", c["vocab_size"], c["max_position_embeddings"] or 2048, width, c["num_hidden_layers"], heads, head_dim,
                  c["state_size"], c["n_groups"], c["conv_kernel"], c["chunk_size"], bool(c["use_bias"]),
                  bool(c["use_conv_bias"]), _eps(c, "layer_norm_epsilon"), float(c["time_step_min"]),
                  float(c["time_step_max"]), lo, None if math.isinf(hi) else hi, bool(c["tie_word_embeddings"]), src)


def _mamba1_mixer(c: Config, width: int, keys: dict, norms: bool = False, eps: float = 1e-6) -> Mamba1Mixer:
    """keys: the mixer's config field names (state, expand, conv, dt_rank, bias, conv_bias)."""
    act = c["hidden_act"]
    if act not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the Mamba-1 mixer's conv and gate use silu; {act!r} has no counterpart")
    expand = c[keys["expand"]]
    inner = int(expand * width)
    if inner != expand * width or inner < 1:
        raise Unsupported(keys["expand"], f"{expand} x hidden_size {width} is not a whole width")
    rank = c[keys["dt_rank"]]
    if rank == "auto":
        rank = -(-width // 16)
    elif not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise Unsupported(keys["dt_rank"], f"{rank!r}: dt's rank is a whole number or \"auto\"")
    dt = (float(c["time_step_min"]), float(c["time_step_max"])) if "time_step_min" in c.keys.maps else (0.001, 0.1)
    return Mamba1Mixer(inner, c[keys["state"]], rank, c[keys["conv"]], bool(c[keys["bias"]]), bool(c[keys["conv_bias"]]), norms, float(eps), *dt)


KEYS["mamba"] = Keys(frozenset({"vocab_size", "hidden_size", "state_size", "num_hidden_layers", "layer_norm_epsilon", "expand", "conv_kernel",
                                "use_bias", "use_conv_bias", "hidden_act", "time_step_rank", "tie_word_embeddings", "time_step_min",
                                "time_step_max", "intermediate_size", "max_position_embeddings", "rescale_prenorm_residual"}),
                     {"time_step_floor": _SSM_INIT, "time_step_scale": _SSM_INIT, "time_step_init_scheme": _SSM_INIT,
                      "residual_in_fp32": _FP32, "use_mambapy": _SSM_PATH,
                      "use_associative_scan": _SSM_PATH, "pad_token_id": "Mamba's embedding has no padding row: the forward does not read it"})


def _mamba(c: Config) -> MambaFamily:
    _rescaled(c)
    width = c["hidden_size"]
    mixer = _mamba1_mixer(c, width, {"state": "state_size", "expand": "expand", "conv": "conv_kernel", "dt_rank": "time_step_rank",
                                     "bias": "use_bias", "conv_bias": "use_conv_bias"})
    if c.given("intermediate_size") and c["intermediate_size"] != mixer.inner:  # transformers sets it after deriving it: the file's wins
        raise Unsupported("intermediate_size", f"{c['intermediate_size']}, not expand x hidden_size = {mixer.inner}: the mixer's width "
                          "and its expand disagree")
    src = {"layers": "num_hidden_layers", "width": "hidden_size", "vocab": "vocab_size", "mixer": "state_size, expand, time_step_rank, conv_kernel",
           "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"}
    # MambaForCausalLM has no position table and no context limit; 2048 is the feed's (a decoding cache's) length
    return MambaFamily("mamba", c["vocab_size"], c["max_position_embeddings"] or 2048, width, c["num_hidden_layers"], mixer,
                       _eps(c, "layer_norm_epsilon"), bool(c["tie_word_embeddings"]), src)


KEYS["falcon_mamba"] = Keys(KEYS["mamba"].maps | {"mixer_rms_eps"},
                            {**KEYS["mamba"].inert, "use_falcon_mambapy": "the older name of use_mambapy: " + _SSM_PATH})


def _falcon_mamba(c: Config) -> MambaFamily:
    """Falcon-Mamba: Mamba-1 with RMSNorms without a weight on dt, B and C (their eps mixer_rms_eps)."""
    from dataclasses import replace

    a = _mamba(c)
    mixer = replace(a.mixer, norms=True, eps=_eps(c, "mixer_rms_eps"), affine=False)
    return replace(a, family="falcon_mamba", mixer=mixer,
                   sources={**a.sources, "mixer": a.sources["mixer"] + "; mixer_rms_eps: the dt/B/C norms' eps (no weight)"})


KEYS["jamba"] = Keys(frozenset({"vocab_size", "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps", "max_position_embeddings",
                                "num_experts_per_tok", "num_experts", "expert_layer_period", "expert_layer_offset", "attn_layer_period",
                                "attn_layer_offset", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank", "mamba_conv_bias",
                                "mamba_proj_bias", "pad_token_id"}),
                     {"use_mamba_kernels": _SSM_PATH, "use_mambapy": _SSM_PATH, "use_associative_scan": _SSM_PATH})


def _jamba(c: Config) -> JambaFamily:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    eps = _eps(c, "rms_norm_eps")
    mixer = _mamba1_mixer(c, width, {"state": "mamba_d_state", "expand": "mamba_expand", "conv": "mamba_d_conv", "dt_rank": "mamba_dt_rank",
                                     "bias": "mamba_proj_bias", "conv_bias": "mamba_conv_bias"}, norms=True, eps=eps)
    ap, ao, ep, eo = (c[k] for k in ("attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset"))
    for k, v in (("attn_layer_offset", ao), ("expert_layer_offset", eo)):
        if not isinstance(v, int) or v < 0:
            raise Unsupported(k, f"{v!r}: an offset is a whole number from 0")
    experts = c["num_experts"]
    pattern = tuple(("attention" if i % ap == ao else "mamba", "moe" if i % ep == eo and experts > 1 else "mlp") for i in range(layers))
    top = c["num_experts_per_tok"]
    if any(r == "moe" for _, r in pattern) and top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
           "kv_heads": "num_key_value_heads", "hidden": "intermediate_size", "experts": "num_experts, num_experts_per_tok",
           "eps": "rms_norm_eps", "mixer": "mamba_d_state, mamba_expand, mamba_dt_rank, mamba_d_conv", "tied": "tie_word_embeddings",
           "pattern": "attn_layer_period/offset, expert_layer_period/offset", "padding": "pad_token_id"}
    return JambaFamily("jamba", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, _kv(c, heads), c["intermediate_size"],
                       experts, top, mixer, eps, bool(c["tie_word_embeddings"]), _padding(c), src)


KEYS["deepseek_v2"] = Keys(frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                      "attention_bias", "mlp_bias", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "n_routed_experts",
                                      "n_shared_experts", "qk_nope_head_dim", "qk_rope_head_dim", "routed_scaling_factor", "topk_method",
                                      "norm_topk_prob", "v_head_dim", "moe_intermediate_size", "rope_parameters", "num_experts_per_tok",
                                      "pad_token_id", "head_dim", "qk_head_dim", "n_group", "topk_group", "moe_layer_freq"}), _TP)


def _deepseek_v2(c: Config) -> DeepseekV2Family:
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"DeepSeek-V2's MLPs are silu-gated (swiglu); {c['hidden_act']!r} is not mapped")
    if c["mlp_bias"]:
        raise Unsupported("mlp_bias", "transformers' DeepseekV2 biases the dense and shared MLPs but never the routed experts; "
                          "the language's moe bias= covers all of them")
    if c["topk_method"] not in ("greedy", "group_limited_greedy"):
        raise Unsupported("topk_method", f"{c['topk_method']!r} is not one of transformers' DeepseekV2 routers (greedy, group_limited_greedy)")
    if c["norm_topk_prob"]:
        raise Unsupported("norm_topk_prob", "transformers' DeepseekV2 router never renormalises the top-k weights, whatever this says: "
                          "which one the checkpoint was trained with is not known")
    if c.given("moe_layer_freq") and c["moe_layer_freq"] != 1:
        raise Unsupported("moe_layer_freq", "transformers' DeepseekV2 puts experts in every layer from first_k_dense_replace on: "
                          "a checkpoint with experts in every other layer does not load there either")
    for k in ("n_group", "topk_group"):  # read by the group-limited router only
        if c[k] is not None and not (isinstance(c[k], int) and c[k] >= 1):
            raise Unsupported(k, f"{c[k]!r} is not a number of groups")
    routing = _scaled(c)
    if c["topk_method"] == "group_limited_greedy" and _any_routed(c):  # a group scored by its best probability; the others' masked to 0 (-inf here: the same
        routing += _groups(c, "max")  # choice, as a probability of a kept expert is never below 0)
    return _deepseek("deepseek_v2", c, routing)


def _any_routed(c: Config) -> bool:
    """Whether any layer routes (transformers builds no router in the first first_k_dense_replace layers)."""
    return c["num_hidden_layers"] > (c["first_k_dense_replace"] or 0)


def _scaled(c: Config) -> tuple:
    scale = c["routed_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1e3:
        raise Unsupported("routed_scaling_factor", f"{scale!r}: the routed weights' factor is a number in (0, 1000]")
    return (("scale", float(scale)),) if scale != 1.0 else ()


def _groups(c: Config, score: str) -> tuple:
    """(option, value) of group-limited top-k, n_group groups of which topk_group are kept; refused where transformers would
    fail or pick a masked expert (more experts asked than the kept groups hold)."""
    experts, groups, kept, top = c["n_routed_experts"], c["n_group"], c["topk_group"], c["num_experts_per_tok"]
    for k, v in (("n_group", groups), ("topk_group", kept)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise Unsupported(k, f"{v!r} is not a number of groups (the group-limited router reads it)")
    if experts % groups:
        raise Unsupported("n_group", f"{experts} experts do not split into {groups} equal groups")
    if kept > groups:
        raise Unsupported("topk_group", f"{kept} groups kept of {groups}")
    if score == "top2" and groups > 1 and experts // groups < 2:
        raise Unsupported("n_group", f"a group is scored by its two best experts, and {groups} groups of {experts} hold one each")
    if isinstance(top, int) and top > kept * (experts // groups):
        raise Unsupported("num_experts_per_tok", f"top-{top} from {kept} groups of {experts // groups} experts: transformers would pick "
                          "experts of the masked groups")
    if groups == 1:
        return ()
    return (("groups", groups), ("top_groups", kept), ("group_score", score))


def _deepseek(family: str, c: Config, routing: tuple, dense: int | None = None) -> DeepseekV2Family:
    """What DeepSeek-V2 and V3 share: latent attention, dense layers first, DeepSeekMoE."""
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling of latent attention's rotary key is not mapped (turbine attention "
                          "latent= takes no rotary_scaling yet)")
    shared = c["n_shared_experts"] or 0
    if shared < 1:
        raise Unsupported("n_shared_experts", "transformers' DeepSeekMoE always has its shared expert (0 gives it no width)")
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"]
    kv = heads if kv is None else kv
    if kv != heads:
        raise Unsupported("num_key_value_heads", f"latent attention expands every head's key and value from the latent; {kv} key/value "
                          f"heads for {heads} query heads would make transformers' DeepseekV2 repeat them past the heads it has")
    nope, rope_dims = c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    if c.given("qk_head_dim") and c["qk_head_dim"] != nope + rope_dims:  # derived in __post_init__, then the file's overrides it
        raise Unsupported("qk_head_dim", f"{c['qk_head_dim']}, not qk_nope_head_dim + qk_rope_head_dim = {nope + rope_dims}")
    if c.given("head_dim") and c["head_dim"] not in (None, rope_dims):  # __post_init__ sets it to qk_rope_head_dim
        raise Unsupported("head_dim", f"{c['head_dim']}, not qk_rope_head_dim = {rope_dims} (DeepseekV2's rotary reads head_dim)")
    dense = min(c["first_k_dense_replace"] or 0, layers) if dense is None else dense
    moe_hidden = c["moe_intermediate_size"]
    experts = c["n_routed_experts"]
    top = c["num_experts_per_tok"] if layers > dense else 1
    if layers > dense and (top is None or not 1 <= top <= experts):
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "dense": "first_k_dense_replace",
           "attn": "num_attention_heads, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
           "hidden": "intermediate_size", "moe": "n_routed_experts, num_experts_per_tok, moe_intermediate_size x n_shared_experts",
           "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "rotary_base": "rope_theta", "padding": "pad_token_id"}
    q = c["q_lora_rank"]  # null: a full-rank query projection
    if routing:
        src["routing"] = "routed_scaling_factor" + (", n_group, topk_group" if any(k == "groups" for k, _ in routing) else "")
    if family in _V3_LATENT:
        src["routing"] = "norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias: loaded"
    return DeepseekV2Family(family, c["vocab_size"], c["max_position_embeddings"], width, layers, dense, heads,
                            nope, rope_dims, c["v_head_dim"], c["kv_lora_rank"], q, _rope(c), c["intermediate_size"], moe_hidden,
                            experts, top, moe_hidden * shared, _eps(c, "rms_norm_eps"), bool(c["attention_bias"]),
                            bool(c["tie_word_embeddings"]), _padding(c), src, routing)


KEYS["deepseek_v3"] = Keys(frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                      "attention_bias", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "n_routed_experts",
                                      "n_shared_experts", "qk_nope_head_dim", "qk_rope_head_dim", "routed_scaling_factor", "norm_topk_prob",
                                      "v_head_dim", "moe_intermediate_size", "rope_parameters", "num_experts_per_tok", "pad_token_id",
                                      "head_dim", "qk_head_dim", "n_group", "topk_group", "rope_interleave", "num_mtp_layers"}),
                           {**_TP, "output_router_logits": "what forward returns besides the logits: transformers' DeepseekV3 adds no "
                                   "auxiliary loss from them"})


def _deepseek_v3(c: Config) -> DeepseekV2Family:
    """DeepSeek-V3 (and Kimi K2, which writes model_type deepseek_v3): V2's layers with DeepSeek-V3's router: sigmoid
    scores, a selection-only correction bias (loaded from mlp.gate.e_score_correction_bias; transformers holds it fixed),
    group-limited top-k (a group scored by the sum of its two best), the chosen weights renormalised and scaled."""
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"DeepSeek-V3's MLPs are silu-gated (swiglu); {c['hidden_act']!r} is not mapped")
    if not c["rope_interleave"]:
        raise Unsupported("rope_interleave", "rotary on the two halves of the rotary dims (rope_interleave=false) is not what latent "
                          "attention computes here (adjacent pairs, as DeepSeek's weights are laid out)")
    mtp = c["num_mtp_layers"]
    if isinstance(mtp, bool) or not isinstance(mtp, int) or mtp < 0:
        raise Unsupported("num_nextn_predict_layers", f"{mtp!r} is not a number of multi-token-prediction layers")
    groups = _groups(c, "top2") if _any_routed(c) else ()
    routing = (("normalize", bool(c["norm_topk_prob"])), ("router", "sigmoid"), *_scaled(c), *groups, ("correction", True))
    return _deepseek("deepseek_v3", c, routing)


# --- SarvamMLA and GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's layers under another model_type -----
# transformers builds sarvam_mla as DeepseekV3ForCausalLM (its config DeepseekV3Config's with other defaults and
# aliases); Glm4MoeLite is DeepseekV3's latent attention and router with GLM-4.5's MoE block (the same function:
# sigmoid scores, selection-only correction bias, groups scored by their two best, renormalised and scaled), its
# dense layers said by mlp_layer_types instead of first_k_dense_replace, and no MTP key.

_V3_LATENT = ("deepseek_v3", "sarvam_mla", "glm4_moe_lite", "axk1")
KEYS["sarvam_mla"] = Keys(KEYS["deepseek_v3"].maps, KEYS["deepseek_v3"].inert)


def _sarvam_mla(c: Config) -> DeepseekV2Family:
    """Sarvam's 105B (sarvam_mla): DeepSeek-V3's model (DeepseekV3ForCausalLM), read as deepseek_v3 is."""
    a = _deepseek_v3(c)
    return replace(a, family="sarvam_mla")


KEYS["glm4_moe_lite"] = Keys(KEYS["deepseek_v3"].maps - {"first_k_dense_replace", "num_mtp_layers"} | {"mlp_layer_types"},
                             {**_TP, "output_router_logits": "what forward returns besides the logits: transformers' Glm4MoeLite adds no "
                                     "auxiliary loss from them",
                              "num_nextn_predict_layers": "not a field of the class (the released config.json writes it): kept as an "
                                                          "attribute that nothing reads, no MTP module is built; MTP weights in the file are "
                                                          "refused by name on load"})


def _glm4_moe_lite(c: Config, family: str = "glm4_moe_lite") -> DeepseekV2Family:
    """GLM-4.7-Flash (glm4_moe_lite): latent attention (DeepseekV3Attention), DeepSeek-V3's router, mlp_layer_types
    "dense" for the first layers then "sparse"; any other pattern, and a partial rotary factor, refused by name."""
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"GLM-4.7-Flash's MLPs are silu-gated (swiglu); {c['hidden_act']!r} is not mapped")
    if not c["rope_interleave"]:
        raise Unsupported("rope_interleave", "rotary on the two halves of the rotary dims (rope_interleave=false) is not what latent "
                          "attention computes here (adjacent pairs, as the weights are laid out)")
    if _partial(c) != 1.0:
        raise Unsupported("rope_parameters.partial_rotary_factor", "Glm4MoeLite's rotary then turns only part of qk_rope_head_dim; "
                          "latent attention's rotary_dims rotate whole")
    layers = c["num_hidden_layers"]
    kinds = c["mlp_layer_types"]
    kinds = ["dense"] + ["sparse"] * (layers - 1) if kinds is None else kinds  # __post_init__'s default
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("dense", "sparse") for k in kinds):
        raise Unsupported("mlp_layer_types", f"{kinds!r} is not 'dense' or 'sparse' for each of the {layers} layers")
    dense = kinds.count("dense")
    if kinds != ["dense"] * dense + ["sparse"] * (layers - dense):
        raise Unsupported("mlp_layer_types", "dense layers after sparse ones: the language's DeepSeek layers are dense first, then routed")
    groups = _groups(c, "top2") if layers > dense else ()
    routing = (("normalize", bool(c["norm_topk_prob"])), ("router", "sigmoid"), *_scaled(c), *groups, ("correction", True))
    a = _deepseek(family, c, routing, dense)
    a.sources["dense"] = "mlp_layer_types"
    return a


# A.X-K1 (axk1, AXK1ForCausalLM): DeepSeek-V3 with glm4_moe_lite's mlp_layer_types and one more RMSNorm, post_mlp_layernorm, on
# each MoE block's output (routed experts plus the shared expert) before the residual; dense layers have none. Its attention
# always has a query latent (q_lora_rank null cannot build).
KEYS["axk1"] = Keys(KEYS["glm4_moe_lite"].maps, {**_TP, "output_router_logits": "what forward returns besides the logits: transformers' "
                                                 "AXK1 adds no auxiliary loss from them",
                                                 "num_nextn_predict_layers": KEYS["glm4_moe_lite"].inert["num_nextn_predict_layers"]})


def _axk1(c: Config) -> DeepseekV2Family:
    """A.X-K1: glm4_moe_lite's reading (DeepSeek-V3's layers, mlp_layer_types), and an RMSNorm after each MoE block."""
    if c["q_lora_rank"] is None:
        raise Unsupported("q_lora_rank", "A.X-K1's attention always projects queries through a latent; null cannot build there")
    return replace(_glm4_moe_lite(c, "axk1"), post_moe_norm=True)


# --- MiniCPM3 and Youtu: latent attention with a dense MLP in every layer --------------------------


@dataclass(frozen=True)
class LatentDenseFamily:
    """A MiniCPM3 or Youtu checkpoint: latent attention (DeepSeek-V2's MLA) then a dense gated MLP in every
    layer. MiniCPM3 multiplies the embedding by scale_emb, each branch by scale_depth / sqrt(layers) and
    divides the final hidden state by hidden_size / dim_model_base; Youtu scales nothing."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    head_dim: int
    rotary_dims: int
    v_dim: int
    latent: int
    q_latent: int | None
    rotary_base: float
    hidden: int
    act: str
    eps: float
    bias: bool
    mlp_bias: bool
    tied: bool
    padding: int | None
    embed_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    sources: dict = field(default_factory=dict, compare=False)


def _latent_dense_text(a: LatentDenseFamily, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    q = f" q_latent={a.q_latent}" if a.q_latent is not None else ""
    base = f" rotary_base={_num(a.rotary_base)}" if a.rotary_base != 10000.0 else ""
    attn = (f"turbine attention heads={a.heads} latent={a.latent}{q} head_dim={a.head_dim} rotary_dims={a.rotary_dims} v_dim={a.v_dim}"
            f"{base} bias={_num(a.bias)}{_comment(src, 'attn', 'rotary_base' if base else '')}")
    merge = [f"    merge scale={_num(a.residual_scale)}{_comment(src, 'residual_scale')}"] if a.residual_scale != 1.0 else []
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none"
    feed += f" scale={_num(a.embed_scale)}" if a.embed_scale != 1.0 else ""
    feed += f" padding={a.padding}" if a.padding is not None else ""
    nozzle = "nozzle head" + (" tied" if a.tied else "") + (f" scale={_num(a.logit_scale)}" if a.logit_scale != 1.0 else "")
    block = f"{a.family}_block"
    return "\n".join([
        *_header(a.family, source),
        f"let depth = {a.layers}  # {src['layers']}",
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# one {a.family} layer: latent attention, then a gated MLP, each with its RMSNorm in front (the layers repeat it)",
        f"stage {block} {{",
        "  prechamber mix {", f"    {norm}{_comment(src, 'eps')}", f"    {attn}", *merge, "  }",
        "  prechamber burn {", f"    {norm}", f"    turbine mlp hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}{_comment(src, 'hidden')}",
        *merge, "  }",
        "}",
        "",
        f"engine {a.family} {{", "  chamber width=d_model", "  throat causal",
        f"  {feed}{_comment(src, 'vocab', 'embed_scale', 'padding')}", "",
        f"  stage {block} x depth", "",
        f"  {norm}  # the final norm", f"  {nozzle}{_comment(src, 'tied', 'logit_scale')}", "}", ""])


_LATENT_KEYS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "attention_bias", "kv_lora_rank",
                          "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_parameters", "pad_token_id",
                          "qk_head_dim"})
KEYS["minicpm3"] = Keys(_LATENT_KEYS | {"mlp_bias", "scale_emb", "scale_depth", "dim_model_base"},
                        {**_TP, "head_dim": "MiniCPM3Config.__post_init__ sets it to qk_rope_head_dim whatever the file says"})
KEYS["youtu"] = Keys(_LATENT_KEYS | {"rope_interleave", "head_dim"},
                     {"embedding_initializer_range": "the spread of freshly initialised embeddings; an import loads every weight"})


def _latent_dense(family: str):
    def read(c: Config) -> LatentDenseFamily:
        act = _GATED_ACTS.get(c["hidden_act"])
        if act is None:
            raise Unsupported("hidden_act", f"a gated MLP with {c['hidden_act']!r} has no counterpart (swiglu = silu, geglu = gelu)")
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = c["num_key_value_heads"]
        if kv is not None and kv != heads:
            raise Unsupported("num_key_value_heads", f"latent attention expands every head's key and value from the latent; {kv} key/value "
                              f"heads for {heads} query heads would make transformers repeat them past the heads it has")
        if _rope_kind(c)[2] != "default":
            raise Unsupported("rope_parameters.rope_type", "rotary scaling of latent attention's rotary key is not mapped (turbine attention "
                              "latent= takes no rotary_scaling yet)")
        v_dim = c["v_head_dim"]
        if v_dim is None:
            if family == "youtu":
                raise Unsupported("v_head_dim", "null is not a value width transformers' Youtu can build")
            _divides(width, heads, "num_attention_heads", "hidden_size")
            v_dim = width // heads  # MiniCPM3Config.__post_init__
        rope_dims, nope = c["qk_rope_head_dim"], c["qk_nope_head_dim"]
        if c.given("qk_head_dim") and c["qk_head_dim"] != nope + rope_dims:  # derived in __post_init__, then the file's overrides it
            raise Unsupported("qk_head_dim", f"{c['qk_head_dim']}, not qk_nope_head_dim + qk_rope_head_dim = {nope + rope_dims}")
        if family == "youtu" and c.given("head_dim") and c["head_dim"] not in (None, rope_dims):  # __post_init__ sets it, the file's overrides
            raise Unsupported("head_dim", f"{c['head_dim']}, not qk_rope_head_dim = {rope_dims} (the rotary reads head_dim)")
        if rope_dims % 2:
            raise Unsupported("qk_rope_head_dim", f"{rope_dims}: the rotary key's dims are rotated in pairs, an even number")
        extra: dict = {}
        src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers",
               "attn": "num_attention_heads, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim",
               "hidden": "intermediate_size, hidden_act", "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "rotary_base": "rope_theta",
               "padding": "pad_token_id"}
        if family == "minicpm3":
            emb, depth, base = c["scale_emb"], c["scale_depth"], c["dim_model_base"]
            depth = math.sqrt(layers) if depth is None else depth  # MiniCPM3Config.__post_init__: null is no scaling
            base = width if base is None else base
            for k, v in (("scale_emb", emb), ("scale_depth", depth), ("dim_model_base", base)):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v == 0:
                    raise Unsupported(k, f"{v!r}: MiniCPM3's scales are finite non-zero numbers")
            extra = dict(embed_scale=float(emb), residual_scale=float(depth) / math.sqrt(layers), logit_scale=float(base) / width)
            src.update(embed_scale="scale_emb", residual_scale="scale_depth / sqrt(num_hidden_layers)",
                       logit_scale="1 / (hidden_size / dim_model_base)")
        return LatentDenseFamily(family, c["vocab_size"], c["max_position_embeddings"], width, layers, heads, c["qk_nope_head_dim"],
                                 rope_dims, v_dim, c["kv_lora_rank"], c["q_lora_rank"], _rope(c), c["intermediate_size"], act,
                                 _eps(c, "rms_norm_eps"), bool(c["attention_bias"]), bool(c["mlp_bias"]) if family == "minicpm3" else False,
                                 bool(c["tie_word_embeddings"]), _padding(c), **extra, sources=src)
    return read


def _latent_dense_config(engine: ir.Engine, layers: list, base: dict) -> dict | None:
    """The minicpm3 or youtu config of an engine whose every layer is latent attention then a gated MLP, when it
    scales its feed, branches or logits (MiniCPM3) or is named after one of them; None otherwise (deepseek_v2's)."""
    if not all(len(ly) == 2 and isinstance(ly[0][1], ir.LatentAttention) and isinstance(ly[1][1], ir.Mlp) for ly in layers):
        return None
    merges = {b.merge.value if isinstance(b.merge, ir.ScaleMerge) else 1.0
              for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list()}
    scaled = engine.feed.scale != 1.0 or engine.nozzle.scale != 1.0 or merges != {1.0}
    family = engine.name if engine.name in ("minicpm3", "youtu") else "minicpm3" if scaled else None
    if family is None:
        return None
    a, m = layers[0][0][1], layers[0][1][1]
    act = _HF_GATED.get(m.act)
    if act is None:
        raise Unsupported("act", f"{family}'s gated MLP has no '{m.act}' form")
    cfg = {"model_type": family, "architectures": [CAUSAL_LM[family]], **base, "hidden_act": act, "rms_norm_eps": engine.body[-1].eps,
           "max_position_embeddings": engine.feed.context, "num_attention_heads": a.heads, "num_key_value_heads": a.heads,
           "q_lora_rank": a.q_latent, "kv_lora_rank": a.latent, "qk_nope_head_dim": a.head_dim, "qk_rope_head_dim": a.rotary_dims,
           "v_head_dim": a.v_dim, "attention_bias": a.bias, "intermediate_size": m.hidden,
           "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}}
    if family == "youtu":
        return {**cfg, "rope_interleave": True}
    scale = next(iter(merges)) if len(merges) == 1 else 1.0
    base_dim = _whole(engine.nozzle.scale * engine.width)
    if not isinstance(base_dim, int):
        raise Unsupported("nozzle scale", f"MiniCPM3 divides the logits by hidden_size / dim_model_base, a whole number: "
                          f"{engine.nozzle.scale} x {engine.width} is not one")
    return {**cfg, "mlp_bias": m.bias, "scale_emb": engine.feed.scale, "scale_depth": scale * math.sqrt(len(layers)),
            "dim_model_base": base_dim}


# --- Bamba: Mamba-2 mixers and attention layers, a gated MLP in each ---------------------------------


@dataclass(frozen=True)
class HybridFamily:
    """A Bamba checkpoint (BambaForCausalLM): layer i mixes with attention where i is in attn_layer_indices
    (rotary on a part of each head, 0.5 unless rope_parameters say otherwise) and with a Mamba-2 mixer
    elsewhere; then a gated MLP; each branch with its RMSNorm in front."""

    family: str
    vocab: int
    context: int
    width: int
    pattern: tuple  # per layer (mixer, reactor): ("attention" | "mamba", "mlp")
    heads: int
    kv_heads: int
    rotary: float
    rotary_base: float
    attn_bias: bool
    hidden: int
    act: str
    mlp_bias: bool
    ssm: str  # the `turbine ssm ...` options
    eps: float
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)
    # GraniteMoeHybrid: Granite's multipliers, routed experts beside the shared MLP (reactor "moe")
    attn_scale: float | None = None
    embed_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    experts: int = 0
    top: int = 0
    shared: int = 0


def _hybrid_text(a: HybridFamily, source: str) -> str:
    src = a.sources
    norm = "norm rmsnorm" + (f" eps={_num(a.eps)}" if a.eps != 1e-6 else "")
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    rot = "" if not a.rotary else " rotary" if a.rotary == 1.0 else f" rotary={_num(a.rotary)}"
    rot += f" rotary_base={_num(a.rotary_base)}" if a.rotary and a.rotary_base != 10000.0 else ""
    rot += f" scale={_num(a.attn_scale)}" if a.attn_scale is not None else ""
    mixers = {"attention": f"turbine attention heads={a.heads}{kv}{rot} bias={_num(a.attn_bias)}{_comment(src, 'attn')}",
              "mamba": f"turbine ssm {a.ssm}{_comment(src, 'ssm')}"}
    reactors = {"mlp": f"turbine mlp hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}{_comment(src, 'hidden')}",
                "moe": f"turbine moe experts={a.experts} top={a.top} hidden={a.hidden} act={a.act} bias=false shared={a.shared}"
                       f"{_comment(src, 'moe')}"}
    merge = [f"    merge scale={_num(a.residual_scale)}{_comment(src, 'residual_scale')}"] if a.residual_scale != 1.0 else []
    templates: list[str] = []
    for m, r in dict.fromkeys(a.pattern):
        templates += [f"stage {m}_{r} {{", "  prechamber mix {", f"    {norm}", f"    {mixers[m]}", *merge, "  }",
                      "  prechamber burn {", f"    {norm}", f"    {reactors[r]}", *merge, "  }", "}", ""]
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    feed += f" scale={_num(a.embed_scale)}" if a.embed_scale != 1.0 else ""
    lines = _engine_lines(a, src, f"{feed}{_comment(src, 'vocab', 'padding', 'embed_scale')}", _jamba_body(a), norm)
    if a.logit_scale != 1.0:  # Granite's logits_scaling
        at = next(i for i, ln in enumerate(lines) if ln.startswith("  nozzle head"))
        lines[at] = "  nozzle head" + (" tied" if a.tied else "") + f" scale={_num(a.logit_scale)}{_comment(src, 'tied', 'logit_scale')}"
    return "\n".join([
        *_header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: each a mixer (attention or",
        f"# a Mamba-2 ssm), then a gated MLP{' or routed experts beside one' if a.experts else ''}, each with its RMSNorm in front ({src['eps']})",
        *templates,
        *lines])


KEYS["bamba"] = Keys(frozenset({"vocab_size", "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps", "pad_token_id",
                                "max_position_embeddings", "attn_layer_indices", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                                "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias",
                                "time_step_limit", "z_loss_coefficient", "rope_parameters", "attention_bias", "mlp_bias"}),
                     {"num_logits_to_keep": "how many positions' logits generation computes (logits_to_keep); the forward's logits "
                                            "of those positions are the same"})


def _mamba2_options(c: Config, width: int, eps: float) -> str:
    """The `turbine ssm` options of a Bamba-style Mamba-2 mixer (mamba_* keys; its gated norm's eps is rms_norm_eps)."""
    heads, groups, expand = c["mamba_n_heads"], c["mamba_n_groups"], c["mamba_expand"]
    if isinstance(expand, bool) or not isinstance(expand, (int, float)) or not expand > 0:
        raise Unsupported("mamba_expand", f"{expand!r} is not a positive number")
    inner = int(expand * width)
    head_dim = c["mamba_d_head"]
    head_dim = inner // heads if head_dim == "auto" else head_dim
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1 or head_dim * heads != inner:
        raise Unsupported("mamba_d_head", f"{head_dim!r} x mamba_n_heads {heads} is not the mixer's inner width int(mamba_expand x hidden_size) = {inner}")
    if heads % groups:
        raise Unsupported("mamba_n_groups", f"{groups} groups do not divide {heads} heads")
    if inner % groups:
        raise Unsupported("mamba_n_groups", f"{groups} groups do not divide the inner width {inner} (the gated norm's groups)")
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the ssm's conv and gate use silu and the MLP is silu-gated; {c['hidden_act']!r} has no counterpart")
    limit = c["time_step_limit"]
    if limit is None:
        raise Unsupported("time_step_limit", "null: transformers' mixer clamps the step to this range and cannot run without one "
                          "(no clamp is [0.0, Infinity])")
    if not isinstance(limit, list) or len(limit) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in limit) \
            or not 0 <= limit[0] < limit[1]:
        raise Unsupported("time_step_limit", f"{limit!r} is not a range [low, high] of step sizes (high may be Infinity)")
    lo, hi = float(limit[0]), float(limit[1])
    t = (f"heads={heads} head_dim={head_dim} state={c['mamba_d_state']} groups={groups} conv={c['mamba_d_conv']} "
         f"chunk={c['mamba_chunk_size']} bias={_num(bool(c['mamba_proj_bias']))} conv_bias={_num(bool(c['mamba_conv_bias']))} eps={_num(eps)}")
    t += f" dt_lo={_num(lo)}" if lo else ""
    t += f" dt_hi={_num(hi)}" if not math.isinf(hi) else ""
    return t


def _bamba(c: Config) -> HybridFamily:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    if c["z_loss_coefficient"]:
        raise Unsupported("z_loss_coefficient", "a z-loss (the squared log-partition) added to the training loss is not in the language")
    if c.given("partial_rotary_factor"):
        raise Unsupported("partial_rotary_factor", "BambaConfig.__post_init__ replaces a top-level partial_rotary_factor with 0.5; "
                          "write it in rope_parameters")
    if _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling in Bamba's attention layers is not mapped")
    eps = _eps(c, "rms_norm_eps")
    ssm = _mamba2_options(c, width, eps)
    at = c["attn_layer_indices"]
    if at is not None and (not isinstance(at, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in at)):
        raise Unsupported("attn_layer_indices", f"{at!r} is not a list of layer numbers")
    at = set(at or ())
    if any(not 0 <= i < layers for i in at):
        raise Unsupported("attn_layer_indices", f"{sorted(at)}: layers are numbered 0 to {layers - 1}")
    pattern = tuple(("attention" if i in at else "mamba", "mlp") for i in range(layers))
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "pattern": "attn_layer_indices",
           "attn": "num_attention_heads, num_key_value_heads, rope_parameters (partial_rotary_factor 0.5 unless given), attention_bias",
           "ssm": "mamba_n_heads, mamba_d_head, mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, time_step_limit",
           "hidden": "intermediate_size, mlp_bias", "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "padding": "pad_token_id"}
    return HybridFamily("bamba", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, _kv(c, heads),
                        _rotary(_partial(c), width // heads), _rope(c), bool(c["attention_bias"]), c["intermediate_size"], "swiglu",
                        bool(c["mlp_bias"]), ssm, eps, bool(c["tie_word_embeddings"]), _padding(c), src)


KEYS["granitemoehybrid"] = Keys(frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "pad_token_id",
                                           "tie_word_embeddings", "rope_parameters", "attention_bias", "embedding_multiplier", "logits_scaling",
                                           "residual_multiplier", "attention_multiplier", "num_local_experts", "num_experts_per_tok",
                                           "shared_intermediate_size", "position_embedding_type", "layer_types", "mamba_n_heads",
                                           "mamba_n_groups", "mamba_d_state", "mamba_d_head", "mamba_d_conv", "mamba_expand", "mamba_chunk_size",
                                           "mamba_conv_bias", "mamba_proj_bias", "time_step_limit"}))

_GRANITE_LAYERS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def _granitemoehybrid(c: Config) -> HybridFamily:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the ssm's conv and gate use silu and the MLPs are silu-gated; {c['hidden_act']!r} has no counterpart")
    for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v == 0:
            raise Unsupported(k, f"{v!r}: Granite's multipliers are finite non-zero numbers")
    pos = c["position_embedding_type"]
    if pos not in (None, "rope"):
        raise Unsupported("position_embedding_type", f"{pos!r}: transformers' GraniteMoeHybrid has rotary (\"rope\") or no positions (null)")
    if pos == "rope" and _rope_kind(c)[2] != "default":
        raise Unsupported("rope_parameters.rope_type", "rotary scaling in GraniteMoeHybrid's attention layers is not mapped")
    types = c["layer_types"]
    types = ["linear_attention"] * layers if types is None else types
    if not isinstance(types, list) or len(types) != layers or any(t not in _GRANITE_LAYERS for t in types):
        raise Unsupported("layer_types", f"layer_types are mamba (linear_attention) or attention (full_attention), one per layer ({layers})")
    experts, top = c["num_local_experts"], c["num_experts_per_tok"]
    if isinstance(c["shared_intermediate_size"], bool) or not isinstance(c["shared_intermediate_size"], int) or c["shared_intermediate_size"] < 1:
        raise Unsupported("shared_intermediate_size", f"{c['shared_intermediate_size']!r}: the shared MLP's width is a whole number from 1")
    if experts and not 1 <= top <= experts:  # no experts (0): every layer is the shared MLP alone
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    eps = _eps(c, "rms_norm_eps")
    ssm = _mamba2_options(c, width, eps)
    pattern = tuple((_GRANITE_LAYERS[t], "moe" if experts else "mlp") for t in types)
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "pattern": "layer_types",
           "attn": "num_attention_heads, num_key_value_heads, position_embedding_type, rope_parameters, attention_multiplier, attention_bias",
           "ssm": "mamba_n_heads, mamba_d_head, mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, time_step_limit",
           "moe": "num_local_experts, num_experts_per_tok, intermediate_size; shared_intermediate_size: the shared MLP beside them",
           "hidden": "num_local_experts 0: the shared MLP alone, shared_intermediate_size wide",
           "eps": "rms_norm_eps", "tied": "tie_word_embeddings", "padding": "pad_token_id", "embed_scale": "embedding_multiplier",
           "residual_scale": "residual_multiplier", "logit_scale": "1 / logits_scaling"}
    return HybridFamily("granitemoehybrid", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, _kv(c, heads),
                        1.0 if pos == "rope" else 0.0, _rope(c), bool(c["attention_bias"]),
                        c["intermediate_size"] if experts else c["shared_intermediate_size"], "swiglu", False, ssm, eps,
                        bool(c["tie_word_embeddings"]), _padding(c), src, attn_scale=float(c["attention_multiplier"]),
                        embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                        logit_scale=1.0 / float(c["logits_scaling"]), experts=experts, top=top, shared=c["shared_intermediate_size"])


def _hybrid_config(engine: ir.Engine, layers: list, base: dict, common: dict) -> dict:
    """The bamba config of an engine whose layers are a Mamba-2 ssm or attention, then a gated MLP."""
    mixers, reactors = [ly[0][1] for ly in layers], [ly[1][1] for ly in layers]
    if not all(isinstance(r, (ir.Mlp, ir.Moe)) for r in reactors) or not all(isinstance(m, (ir.Ssm, ir.Attention)) for m in mixers):
        raise Unsupported("stages", "a Bamba or GraniteMoeHybrid layer is a Mamba-2 ssm or attention, then an MLP or routed experts")
    s = next(m for m in mixers if isinstance(m, ir.Ssm))
    attn = next((m for m in mixers if isinstance(m, ir.Attention)), None)
    moe = next((r for r in reactors if isinstance(r, ir.Moe)), None)
    merges = {b.merge.value if isinstance(b.merge, ir.ScaleMerge) else 1.0 for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list()}
    if (engine.name == "granitemoehybrid" or moe is not None or engine.feed.scale != 1.0 or engine.nozzle.scale != 1.0 or merges != {1.0}
            or attn is not None and (attn.scale is not None or not attn.rotary_dims)):
        return _granite_hybrid_config(engine, layers, base, common, s, attn, moe, merges)
    mlp = reactors[0]
    if s.inner % engine.width:
        raise Unsupported("expand", f"Bamba's config says mamba_expand as a whole number; the inner width {s.inner} is not a multiple of {engine.width}")
    rope = {"rope_type": "default", "rope_theta": attn.rotary_base if attn else 10000.0,
            "partial_rotary_factor": attn.rotary_dims / attn.head_dim if attn else 0.5}
    return {"model_type": "bamba", "architectures": [CAUSAL_LM["bamba"]], **base, **common, "hidden_act": _HF_GATED.get(mlp.act, mlp.act),
            "num_attention_heads": attn.heads if attn else 1, "num_key_value_heads": attn.kv_heads if attn else 1,
            "attention_bias": attn.bias if attn else False, "rope_parameters": rope, "intermediate_size": mlp.hidden, "mlp_bias": mlp.bias,
            "attn_layer_indices": [i for i, m in enumerate(mixers) if isinstance(m, ir.Attention)], "mamba_n_heads": s.heads,
            "mamba_d_head": s.head_dim, "mamba_n_groups": s.groups, "mamba_d_state": s.state, "mamba_d_conv": s.conv,
            "mamba_expand": s.inner // engine.width, "mamba_chunk_size": s.chunk, "mamba_conv_bias": s.conv_bias, "mamba_proj_bias": s.bias,
            "time_step_limit": [s.dt_lo, s.dt_hi if s.dt_hi is not None else float("inf")], "rms_norm_eps": s.eps, "z_loss_coefficient": 0.0}


def _granite_hybrid_config(engine: ir.Engine, layers: list, base: dict, common: dict, s, attn, moe, merges: set) -> dict:
    """The granitemoehybrid config of a hybrid engine with Granite's multipliers or routed experts beside a shared MLP."""
    mlps = [ly[1][1] for ly in layers if isinstance(ly[1][1], ir.Mlp)]
    if moe is None and mlps and not mlps[0].bias:  # no experts: the shared MLP alone
        return _granite_fields(engine, layers, base, common, s, attn, merges, {"num_local_experts": 0, "num_experts_per_tok": 0,
                               "intermediate_size": mlps[0].hidden, "shared_intermediate_size": mlps[0].hidden, "hidden_act": _HF_GATED.get(mlps[0].act, mlps[0].act)})
    if moe is None or not moe.shared or moe.shared_gate or not moe.normalize or moe.bias:
        raise Unsupported("turbine moe", "GraniteMoeHybrid's layers hold routed experts (renormalised top-k, no biases) beside an "
                          "ungated shared MLP (shared=), or the shared MLP alone")
    return _granite_fields(engine, layers, base, common, s, attn, merges, {"num_local_experts": moe.experts, "num_experts_per_tok": moe.top,
                           "intermediate_size": moe.hidden, "shared_intermediate_size": moe.shared, "hidden_act": _HF_GATED.get(moe.act, moe.act)})


def _granite_fields(engine: ir.Engine, layers: list, base: dict, common: dict, s, attn, merges: set, reactor: dict) -> dict:
    if s.inner % engine.width:
        raise Unsupported("expand", f"the config says mamba_expand as a whole number; the inner width {s.inner} is not a multiple of {engine.width}")
    types = ["attention" if isinstance(ly[0][1], ir.Attention) else "mamba" for ly in layers]
    scale = next(iter(merges)) if len(merges) == 1 else 1.0
    attn_scale = (attn.scale if attn.scale is not None else attn.head_dim ** -0.5) if attn else 1.0
    return {"model_type": "granitemoehybrid", "architectures": [CAUSAL_LM["granitemoehybrid"]], **base, **common, **reactor,
            "num_attention_heads": attn.heads if attn else 1,
            "num_key_value_heads": attn.kv_heads if attn else 1, "attention_bias": attn.bias if attn else False,
            "position_embedding_type": "rope" if attn is not None and attn.rotary_dims else None,
            "rope_parameters": {"rope_type": "default", "rope_theta": attn.rotary_base if attn else 10000.0},
            "embedding_multiplier": engine.feed.scale, "residual_multiplier": scale, "attention_multiplier": attn_scale,
            "logits_scaling": 1.0 / engine.nozzle.scale, "layer_types": types, "mamba_n_heads": s.heads,
            "mamba_d_head": s.head_dim, "mamba_n_groups": s.groups, "mamba_d_state": s.state, "mamba_d_conv": s.conv,
            "mamba_expand": s.inner // engine.width, "mamba_chunk_size": s.chunk, "mamba_conv_bias": s.conv_bias, "mamba_proj_bias": s.bias,
            "time_step_limit": [s.dt_lo, s.dt_hi if s.dt_hi is not None else float("inf")], "rms_norm_eps": s.eps}


KEYS["bloom"] = Keys(frozenset({"vocab_size", "hidden_size", "n_layer", "n_head", "layer_norm_epsilon", "apply_residual_connection_post_layernorm",
                                "tie_word_embeddings", "seq_length"}),
                     {"pretraining_tp": "with slow_but_exact, slices a matmul and sums the pieces: the same function, rounded otherwise",
                      "slow_but_exact": "slices a matmul and sums the pieces: the same function, rounded otherwise",
                      "pad_token_id": "BLOOM's embedding has no padding row: the forward does not read it",
                      "n_inner": "BLOOM's MLP is 4 x hidden_size whatever this says: transformers does not read it",
                      "unk_token_id": "the tokenizer's unknown token; the forward does not read it",
                      **{k: "a Megatron-DeepSpeed training switch (fused kernels, fp32 softmax); transformers' Bloom does not read it"
                         for k in ("masked_softmax_fusion", "bias_dropout_fusion", "skip_bias_add", "skip_bias_add_qkv",
                                   "attention_softmax_in_fp32", "offset_alibi")}})


def _bloom(c: Config) -> Arch:
    """BLOOM: ALiBi (added after the scale), a LayerNorm after the embedding, biased LayerNorm
    blocks with a 4x tanh-GELU MLP, per-head fused q, k, v, a tied head."""
    if c["apply_residual_connection_post_layernorm"]:
        raise Unsupported("apply_residual_connection_post_layernorm", "a residual taken after the norm (the branch's normed input) is not in the language")
    width, heads = c["hidden_size"], c["n_head"]
    _divides(width, heads, "n_head", "hidden_size")
    return Arch("bloom", vocab=c["vocab_size"], context=c["seq_length"] or 2048, width=width,
                layers=c["n_layer"], heads=heads, kv_heads=heads, head_dim=width // heads, hidden=4 * width,
                act="gelu_tanh", norm="layernorm", eps=_eps(c, "layer_norm_epsilon"), norm_bias=True, qkv_bias=True, out_bias=True,
                mlp_bias=True, tied=bool(c["tie_word_embeddings"]), alibi=True, alibi_scaled=False, embed_norm=True,
                sources={"vocab": "vocab_size", "context": "BLOOM has no context field (ALiBi has no table): the spec's own", "width": "hidden_size",
                         "layers": "n_layer", "heads": "n_head", "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"})


# --- Llama-shaped decoders with routed experts (issue 33): Qwen3-MoE, OLMoE, FlexOlmo, GraniteMoE(-Shared), Aria's text model ---
# Every one routes by softmax then top-k; GraniteMoE and Aria take the top-k logits first and softmax those, which is the
# same function as renormalising the top-k of the softmax (normalize=true). What distinguishes each:
#   qwen3_moe: qk RMSNorm per head, norm_topk_prob, dense layers (mlp_only_layers, decoder_sparse_step), one window for all layers
#   olmoe: qk RMSNorm across the heads, norm_topk_prob; flex_olmo: OLMo-2's norms after each turbine and its qk-norm across heads
#   granitemoe: Granite's four multipliers; granitemoeshared: ... and an ungated shared expert beside the routed ones
#   aria_text: a shared expert moe_num_shared_experts x intermediate_size wide; routed experts always silu-gated
_ROUTER = "the router's top-k renormalised softmax (a softmax over the top-k logits): the same function"
_ROUTED = {
    "qwen3_moe": Keys(_LLAMA | {"head_dim", "attention_bias", "use_sliding_window", "sliding_window", "decoder_sparse_step", "mlp_only_layers",
                                "moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob", "max_window_layers"}),
    "olmoe": Keys(_LLAMA | {"attention_bias", "clip_qkv", "num_experts", "num_experts_per_tok", "norm_topk_prob"}),
    "flex_olmo": Keys(_LLAMA | {"attention_bias", "num_experts", "num_experts_per_tok", "norm_topk_prob"}),
    "granitemoe": Keys(_LLAMA | {"attention_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
                                 "num_local_experts", "num_experts_per_tok"}),
    "granitemoeshared": Keys(_LLAMA | {"attention_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
                                       "num_local_experts", "num_experts_per_tok", "shared_intermediate_size"}),
    "aria_text": Keys(_LLAMA | {"attention_bias", "mlp_bias", "head_dim", "moe_num_experts", "moe_topk", "moe_num_shared_experts"}, _TP),
    "mellum": Keys(_LLAMA | {"head_dim", "attention_bias", "sliding_window", "layer_types", "mlp_layer_types", "moe_intermediate_size", "num_experts",
                             "num_experts_per_tok", "norm_topk_prob"},
                   {k: "multi-token prediction layers: transformers' MellumForCausalLM does not build them (it ignores their weights on load)"
                    for k in ("num_mtp_layers", "mtp_layer_types", "mtp_mlp_layer_types")}),
}
KEYS.update(_ROUTED)


def _count(c: Config, key: str, least: int = 1) -> int:
    """A whole number of at least `least` (null and floats refused: transformers' layers take it as a size)."""
    v = c[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise Unsupported(key, f"{v!r} is not a whole number from {least}")
    return v


def _routed(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = _kv(c, heads)
        act_name = c["hidden_act"]
        act = _GATED_ACTS.get(act_name)
        if act is None:
            raise Unsupported("hidden_act", f"a gated MLP with {act_name!r} has no counterpart (the language has swiglu = silu, geglu = gelu, "
                              "geglu_tanh = the tanh GELU)")
        sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "moe_intermediate_size", "act": "hidden_act",
                   "eps": "rms_norm_eps", "rotary_base": "rope_theta", "window": "sliding_window", "experts": "num_experts",
                   "top": "num_experts_per_tok", "tied": "tie_word_embeddings"}
        extra: dict = {}
        head_dim = width // heads
        bias = bool(c["attention_bias"])
        shared, normalize, window = 0, True, None
        if family == "qwen3_moe":
            if c.given("head_dim"):  # not a field of Qwen3MoeConfig, but its attention reads it where config.json writes it
                head_dim = c["head_dim"]
                if head_dim is None:
                    raise Unsupported("head_dim", "null: Qwen3-MoE's attention reads head_dim wherever config.json writes it, and cannot use null")
            else:
                _divides(width, heads, "num_attention_heads", "hidden_size")
            if c["use_sliding_window"]:  # every layer's window (Qwen3MoeConfig has no max_window_layers or layer_types)
                window = _sliding(c)
            # not a field of Qwen3MoeConfig, but its released configs write it: transformers 5 reads nothing of it; transformers 4
            # gave the window only to the layers from it on. Without a window (or from layer 0) both compute the same.
            mwl = c["max_window_layers"]
            if mwl is not None and (isinstance(mwl, bool) or not isinstance(mwl, int)):
                raise Unsupported("max_window_layers", f"{mwl!r} is not a layer number")
            if window is not None and mwl:
                raise Unsupported("max_window_layers", f"{mwl}: transformers 5 gives every layer of a Qwen3-MoE the window and ignores this, "
                                  "transformers 4 gave it to the layers from max_window_layers on: which one the checkpoint was trained "
                                  "with is not known")
            step, only = _count(c, "decoder_sparse_step"), c["mlp_only_layers"]
            if only is not None and (not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only)):
                raise Unsupported("mlp_only_layers", f"{only!r} is not a list of layer numbers")
            dense = tuple(i in set(only or ()) or (i + 1) % step != 0 for i in range(layers))
            if all(dense):
                raise Unsupported("mlp_only_layers" if only else "decoder_sparse_step", "every layer is dense: write the checkpoint as a qwen3 (no experts)")
            if any(dense):
                extra.update(layer_dense=dense, dense_hidden=c["intermediate_size"])
                sources["dense_hidden"] = "intermediate_size"
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
            normalize = bool(c["norm_topk_prob"])
            extra.update(qk_norm="head", qk_eps=_eps(c, "rms_norm_eps"))
        elif family in ("olmoe", "flex_olmo"):
            _divides(width, heads, "num_attention_heads", "hidden_size")
            if family == "olmoe" and c["clip_qkv"] is not None:
                raise Unsupported("clip_qkv", "clamping q, k and v to a range is not in the language")
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["intermediate_size"]
            normalize = bool(c["norm_topk_prob"])
            extra.update(qk_norm="all", qk_eps=_eps(c, "rms_norm_eps"), post_norms=family == "flex_olmo")
            sources["hidden"] = "intermediate_size"
        elif family in ("granitemoe", "granitemoeshared"):
            _divides(width, heads, "num_attention_heads", "hidden_size")
            experts, top, hidden = _count(c, "num_local_experts"), _count(c, "num_experts_per_tok"), c["intermediate_size"]
            for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
                if isinstance(c[k], bool) or not isinstance(c[k], (int, float)) or not c[k]:
                    raise Unsupported(k, f"{c[k]!r}: Granite's multipliers are non-zero numbers")
            extra.update(embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                         attn_scale=float(c["attention_multiplier"]), logit_scale=1.0 / float(c["logits_scaling"]))
            sources.update(hidden="intermediate_size", experts="num_local_experts", embed_scale="embedding_multiplier",
                           residual_scale="residual_multiplier", attn_scale="attention_multiplier", logit_scale="logits_scaling")
            if family == "granitemoeshared":
                shared = _count(c, "shared_intermediate_size", 0)  # 0: no shared expert
        elif family == "mellum":
            head_dim = c["head_dim"]
            window, windows, rope = _mellum_layers(c, layers)
            if windows:
                extra["layer_windows"] = windows
            kinds = c["mlp_layer_types"]
            kinds = ["sparse"] * layers if kinds is None else kinds
            if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("dense", "sparse") for k in kinds):
                raise Unsupported("mlp_layer_types", f"mlp_layer_types are dense or sparse, one per layer ({layers})")
            dense = tuple(k == "dense" for k in kinds)
            if all(dense):
                raise Unsupported("mlp_layer_types", "every layer is dense: no experts to route")
            if any(dense):
                if windows:
                    raise Unsupported("mlp_layer_types", "sliding and global layers together with dense and routed ones: two per-layer "
                                      "patterns at once are not mapped")
                extra.update(layer_dense=dense, dense_hidden=c["intermediate_size"])
            experts, top, hidden = c["num_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"]
            normalize = bool(c["norm_topk_prob"])
            extra.update(qk_norm="head", qk_eps=_eps(c, "rms_norm_eps"))
            sources.update(window="sliding_window, layer_types", rotary_base="rope_parameters")
            context = c["max_position_embeddings"]
            return Arch(family, vocab=c["vocab_size"], context=context, width=width, layers=layers, heads=heads, kv_heads=kv,
                        head_dim=head_dim, hidden=hidden, act=act, norm="rmsnorm", eps=_eps(c, "rms_norm_eps"), qkv_bias=bias, out_bias=bias,
                        rotary=1.0, rotary_base=rope["rope_theta"], window=window,
                        experts=_top_ok(top, experts, "num_experts_per_tok"), top=top, normalize=normalize, tied=bool(c["tie_word_embeddings"]),
                        padding=_padding(c), sources=sources, **extra)
        else:  # aria_text
            _divides(width, heads, "num_attention_heads", "hidden_size")  # AriaTextConfig.validate_architecture refuses the rest
            head_dim = c["head_dim"] or head_dim
            if act_name not in ("silu", "swish"):
                raise Unsupported("hidden_act", f"Aria's routed experts are silu-gated whatever hidden_act says, its shared expert follows "
                                  f"{act_name!r}: one moe turbine has one activation")
            if c["mlp_bias"]:
                raise Unsupported("mlp_bias", "Aria biases its shared expert but never the routed ones; the language's moe bias= covers all of them")
            experts, top, hidden = _count(c, "moe_num_experts"), _count(c, "moe_topk"), c["intermediate_size"]
            shared = hidden * _count(c, "moe_num_shared_experts")
            sources.update(hidden="intermediate_size", experts="moe_num_experts", top="moe_topk")
        if not 1 <= top <= experts:
            raise Unsupported(sources["top"], f"top-{top} of {experts} experts")
        if _partial(c) != 1.0:  # their rotary embedding never reads it: the default rope turns the whole head, the others fail
            raise Unsupported("partial_rotary_factor", f"{_partial(c)}: transformers' {family} rotates every dim of each head whatever "
                              "this says (and cannot run it with a rotary scaling)")
        context = c["max_position_embeddings"]
        scaling = _rope_scaling(c, context)
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, scaling), width=width, layers=layers, heads=heads,
                    kv_heads=kv, head_dim=head_dim, hidden=hidden, act=act, norm="rmsnorm", eps=_eps(c, "rms_norm_eps"), qkv_bias=bias,
                    out_bias=bias, rotary=_rotary(_partial(c), head_dim), rotary_base=_rope(c), rotary_scaling=scaling, window=window,
                    experts=experts, top=top, normalize=normalize, shared=shared, tied=bool(c["tie_word_embeddings"]), padding=_padding(c),
                    sources=sources, **extra)
    return read


def _top_ok(top: int, experts: int, key: str) -> int:
    if not 1 <= top <= experts:
        raise Unsupported(key, f"top-{top} of {experts} experts")
    return experts


def _mellum_layers(c: Config, layers: int) -> tuple:
    """Mellum's windows and its rotary parameters: rope_parameters hold one entry per layer type (a base for the
    sliding layers, another for the global ones), which the spec says only where every layer present has the same."""
    from .closed import LEGACY_ROPE

    for k in LEGACY_ROPE:
        if c.given(k):
            raise Unsupported(k, "MellumConfig does not read it: its rope_parameters, one entry per layer type, hold the rotary base")
    types = _types(c, layers, lambda: ["full_attention"] * layers)
    sw = _sliding(c)
    if "sliding_attention" in types and sw is None:
        raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
    window, windows = _windows(types, sw)
    per = c["rope_parameters"]
    if per is None:  # MellumConfig.__post_init__'s default
        per = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    if not isinstance(per, dict) or any(not isinstance(per.get(t), dict) for t in set(types)):
        raise Unsupported("rope_parameters", "Mellum's rope_parameters hold one object per layer type (full_attention, sliding_attention) "
                          "for each type its layers use")
    ropes = []
    for t in sorted(set(types)):
        rope = per[t]
        if rope.get("rope_type", "default") != "default":
            raise Unsupported(f"rope_parameters.{t}.rope_type", f"{rope.get('rope_type')!r}: rotary scaling per layer type is not mapped")
        for k in rope:
            if k not in ("rope_type", "rope_theta", "partial_rotary_factor"):
                raise Unsupported(f"rope_parameters.{t}.{k}", "not a parameter of plain rotary, the only kind mapped for Mellum")
        theta = rope.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
            raise Unsupported(f"rope_parameters.{t}.rope_theta", f"{theta!r} is not a positive number")
        if rope.get("partial_rotary_factor", 1.0) != 1.0:  # its rotary computes fewer frequencies, its attention rotates the whole head
            raise Unsupported(f"rope_parameters.{t}.partial_rotary_factor", "transformers' Mellum cannot run a partial rotary (its cos and sin "
                              "no longer match the head)")
        ropes.append(float(theta))
    if any(r != ropes[0] for r in ropes):
        raise Unsupported("rope_parameters", f"its sliding and global layers rotate with different bases ({sorted(set(ropes))}): one rotary "
                          "base per layer type is not mapped yet")
    return window, windows, {"rope_theta": ropes[0]}


def _routed_config(a: Arch, cfg: dict) -> dict:
    """The config fields of the routed-expert families (config_of's generic part is `cfg`)."""
    if a.experts == 0:
        raise Unsupported("turbine mlp", f"{a.family} routes its MLPs through experts; the spec's layers are all dense")
    if a.shared_gate:
        raise Unsupported("shared_gate", f"{a.family}'s shared expert is not gated (Qwen2-MoE's is)")
    if a.shared and a.family not in ("granitemoeshared", "aria_text"):
        raise Unsupported("shared", f"{a.family} has no shared expert")
    if a.layer_dense and a.family not in ("qwen3_moe", "mellum"):
        raise Unsupported("stages", f"{a.family} routes every layer; only qwen3_moe and mellum have dense layers among their routed ones")
    if not a.normalize and a.family in ("granitemoe", "granitemoeshared", "aria_text"):
        raise Unsupported("normalize", f"{a.family}'s router always renormalises its top-k weights (a softmax over the top-k logits)")
    if a.mlp_bias:
        raise Unsupported("bias", f"{a.family}'s experts have no biases")
    if a.qkv_bias != a.out_bias:
        raise Unsupported("out_bias", f"{a.family}'s attention_bias covers q, k, v and the output alike")
    want_qk = {"qwen3_moe": "head", "mellum": "head", "olmoe": "all", "flex_olmo": "all"}.get(a.family, "none")
    if a.qk_norm != want_qk or (a.qk_norm != "none" and a.qk_eps != a.eps):
        raise Unsupported("qk_norm", f"{a.family}'s qk-norm is {want_qk}" + (", with the norms' eps" if want_qk != "none" else ""))
    cfg = dict(cfg, attention_bias=a.qkv_bias)
    cfg.pop("head_dim", None)
    if a.family == "qwen3_moe":
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, moe_intermediate_size=a.hidden, head_dim=a.head_dim,
                   intermediate_size=a.dense_hidden if a.layer_dense else a.hidden, norm_topk_prob=a.normalize, decoder_sparse_step=1,
                   mlp_only_layers=[i for i, d in enumerate(a.layer_dense) if d], use_sliding_window=a.window is not None,
                   sliding_window=a.window)
    elif a.family == "mellum":
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"Mellum has one sliding_window; the spec's layers have {sorted(local)}")
        if a.rotary_scaling is not None:
            raise Unsupported("rotary_scaling", "rotary scaling per layer type is not mapped for Mellum")
        rope = {"rope_type": "default", "rope_theta": a.rotary_base}
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, moe_intermediate_size=a.hidden, head_dim=a.head_dim,
                   intermediate_size=a.dense_hidden if a.layer_dense else a.hidden, norm_topk_prob=a.normalize,
                   mlp_layer_types=["dense" if d else "sparse" for d in (a.layer_dense or (False,) * a.layers)],
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows],
                   sliding_window=local.pop() if local else None, rope_parameters={"full_attention": rope, "sliding_attention": dict(rope)})
    elif a.family in ("olmoe", "flex_olmo"):
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, norm_topk_prob=a.normalize)
    elif a.family in ("granitemoe", "granitemoeshared"):
        cfg.update(num_local_experts=a.experts, num_experts_per_tok=a.top, embedding_multiplier=a.embed_scale,
                   residual_multiplier=a.residual_scale, attention_multiplier=a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5,
                   logits_scaling=1.0 / a.logit_scale)
        if a.family == "granitemoeshared":
            cfg["shared_intermediate_size"] = a.shared
    else:  # aria_text
        if not a.shared or a.shared % a.hidden:
            raise Unsupported("shared", f"Aria's shared expert is a whole multiple (moe_num_shared_experts) of the experts' width {a.hidden}")
        cfg.update(moe_num_experts=a.experts, moe_topk=a.top, moe_num_shared_experts=a.shared // a.hidden, head_dim=a.head_dim, mlp_bias=False)
    return cfg


# --- dense Llama-shaped decoders of 2025-26 (issue 33): OLMo 3, SmolLM3, EXAONE 4 and 3, ERNIE 4.5, Helium, CWM, VaultGemma, HyperCLOVA X ---

_DENSE_H2 = {
    "olmo3": Keys(_LLAMA | {"attention_bias", "sliding_window", "layer_types", "head_dim"}),
    "smollm3": Keys(_LLAMA | {"attention_bias", "mlp_bias", "use_sliding_window", "sliding_window", "no_rope_layers", "no_rope_layer_interval",
                              "layer_types", "head_dim"}),
    "exaone4": Keys(_LLAMA | {"sliding_window", "sliding_window_pattern", "layer_types", "head_dim"}),
    "ernie4_5": Keys(_LLAMA | {"use_bias", "head_dim"}),
    "helium": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
    "cwm": Keys(_LLAMA | {"head_dim", "mlp_bias", "sliding_window", "layer_types"}, _TP),
    "exaone": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"},
                   {"embed_dropout": "a dropout EXAONE 3's released configs write; transformers' Llama does not read it (and dropout is off in evaluation)",
                    **_TP}),
    "vaultgemma": Keys(_LLAMA - {"hidden_act"} | {"head_dim", "attention_bias", "hidden_activation", "attn_logit_softcapping",
                                                   "final_logit_softcapping", "query_pre_attn_scalar", "layer_types", "sliding_window"},
                       {"hidden_act": "VaultGemma's forward reads hidden_activation; a hidden_act beside it is not read"}),
    "hyperclovax": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                  "logits_scaling", "use_post_norm"}),
}
KEYS.update(_DENSE_H2)
# head_dim is no field of these classes, but transformers keeps a config.json's as an attribute and their attention reads it
_HEAD_DIM_ATTRIBUTE = ("olmo3", "smollm3", "exaone4")
# CWM's __post_init__ writes this rope when config.json gives none (its rope_theta, rope_scaling are then not read)
_CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
             "original_max_position_embeddings": 8192}


def _sub_rope(c: Config, rope: dict, where: str) -> tuple[float, ir.RotaryScaling | None]:
    """(rotary base, scaling) of one rope dict (OLMo 3's per layer type, CWM's default), read as Config.rope reads a file's."""
    try:
        sub = Config({"rope_parameters": rope}, c.family, Keys(frozenset({"rope_parameters"})))
        partial = _partial(sub)
        if float(partial) != 1.0:
            raise Unsupported("rope_parameters.partial_rotary_factor", f"{partial}: {c.family}'s rotary turns every dim of a head")
        return _rope(sub), _rope_scaling(sub, c["max_position_embeddings"])
    except Unsupported as e:
        raise Unsupported(where + e.field[len("rope_parameters"):], str(e).split(": ", 1)[1]) from None


def _whole_rope(c: Config) -> None:
    """ERNIE 4.5, Helium and the rest turn every dim of each head: a partial factor crashes or is ignored there."""
    partial = _partial(c)
    if float(partial) != 1.0:
        raise Unsupported("rope_parameters.partial_rotary_factor", f"{partial}: {c.family}'s rotary turns every dim of a head "
                          "(transformers ignores the factor, or fails on it, depending on the rope type)")


def _olmo3_ropes(c: Config) -> dict:
    """OLMo 3's rope per layer type, as Olmo3Config.convert_rope_params_to_dict builds it: rope_scaling goes to the full-attention
    layers alone, a legacy rope_theta too (the sliding layers keep the class's 500000); a top-level key is read by no layer."""
    rope = c.raw.get("rope_parameters")
    if rope is None:
        rope = {}
    if not isinstance(rope, dict):
        raise Unsupported("rope_parameters", "is not an object")
    flat = sorted(k for k in rope if k not in ("full_attention", "sliding_attention"))
    if flat:
        raise Unsupported(f"rope_parameters.{flat[0]}", "OLMo 3 reads its rope per layer type (full_attention, sliding_attention); "
                          "transformers' layers never read a top-level one")
    out = {}
    for t in ("full_attention", "sliding_attention"):
        one = rope.get(t)
        if one is not None and not isinstance(one, dict):
            raise Unsupported(f"rope_parameters.{t}", "is not an object")
        out[t] = dict(one or {"rope_type": "default"})
    old = c.raw.get("rope_scaling")
    if old:
        if not isinstance(old, dict):
            raise Unsupported("rope_scaling", "is not an object")
        if c.raw.get("rope_parameters") is not None and "full_attention" not in rope:
            raise Unsupported("rope_scaling", "beside a rope_parameters without full_attention: Olmo3Config fails to place it")
        out["full_attention"].update(old)
    out["full_attention"].setdefault("rope_theta", c.raw.get("rope_theta", 500000.0))
    out["sliding_attention"].setdefault("rope_theta", 500000.0)
    if c.raw.get("partial_rotary_factor") is not None:
        raise Unsupported("partial_rotary_factor", "OLMo 3's rotary turns every dim of a head")
    ropes = {t: _sub_rope(c, r, f"rope_parameters.{t}") for t, r in out.items()}
    for t, (_, sc) in ropes.items():
        if sc is not None and sc.type == "dynamic" and ropes["full_attention"] != ropes["sliding_attention"]:
            raise Unsupported(f"rope_parameters.{t}.rope_type", "dynamic NTK on one layer type alone is not mapped (the feed's context "
                              "follows one dynamic rope)")
    return ropes


def _window_types(c: Config, layers: int, default) -> tuple[list, int | None]:
    """(layer_types, sliding_window), refusing sliding layers without a window (transformers cannot build their mask)."""
    sw = _sliding(c)
    types = _types(c, layers, default)
    if "sliding_attention" in types and sw is None:
        raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
    return types, sw


def _dense_h2(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = _kv(c, heads)
        act_key = "hidden_activation" if family == "vaultgemma" else "hidden_act"
        act = _GATED_ACTS.get(c[act_key])
        if act is None:
            raise Unsupported(act_key, f"a gated MLP with {c[act_key]!r} has no counterpart (the language has swiglu = silu, geglu = gelu, "
                              "geglu_tanh = the tanh GELU)")
        if family in _HEAD_DIM_ATTRIBUTE and c.given("head_dim") and c["head_dim"] is None:
            raise Unsupported("head_dim", f"null: {family}'s attention reads the attribute as it is (no fallback to hidden_size / heads)")
        head_dim = (c["head_dim"] if "head_dim" in c.keys.maps else None) or width // heads
        if family in ("vaultgemma", "hyperclovax") or not ("head_dim" in c.keys.maps and c["head_dim"]):
            _divides(width, heads, "num_attention_heads", "hidden_size")  # VaultGemma, HyperCLOVA X: their validate_architecture
        if family == "helium" and heads * head_dim != width:
            raise Unsupported("head_dim", f"Helium's o_proj takes hidden_size ({width}) inputs: heads x head_dim = {heads * head_dim} "
                              "does not build in transformers")
        sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size", "act": act_key,
                   "eps": "rms_norm_eps", "rotary_base": "rope_theta", "window": "sliding_window, layer_types", "tied": "tie_word_embeddings"}
        eps = _eps(c, "rms_norm_eps")
        extra: dict = {}
        context = c["max_position_embeddings"]
        # rotary per layer: (rotary fraction, base, scaling) for each layer type
        if family == "olmo3":
            ropes = {t: (1.0, *r) for t, r in _olmo3_ropes(c).items()}
        elif family == "cwm" and not c.given("rope_parameters"):
            for k in ("rope_scaling", "rope_theta", "partial_rotary_factor"):
                if c.given(k):
                    raise Unsupported(k, "CWM writes its own llama3 rope when config.json has no rope_parameters, and does not read this")
            ropes = {t: (1.0, *_sub_rope(c, dict(_CWM_ROPE), "rope_parameters")) for t in ("full_attention", "sliding_attention")}
        else:
            _whole_rope(c)
            one = (1.0, _rope(c), _rope_scaling(c, context))
            ropes = {"full_attention": one, "sliding_attention": one}
        types = ["full_attention"] * layers
        sw = None
        nope = [False] * layers  # a layer without rotary (SmolLM3's NoPE layers, EXAONE 4's global ones)
        if family == "olmo3":
            types, sw = _window_types(c, layers, lambda: ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)])
        elif family == "cwm":
            types, sw = _window_types(c, layers, lambda: ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)])
        elif family == "vaultgemma":
            types, sw = _window_types(c, layers, lambda: ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)])
            if sw is None:  # its model builds the sliding mask whatever layer_types say
                raise Unsupported("sliding_window", "null: transformers' VaultGemma cannot build its sliding-window mask without one")
        elif family == "exaone4":
            sw = _sliding(c)
            pattern = c["sliding_window_pattern"]
            if not c.given("layer_types") or c["layer_types"] is None:
                if sw is None:
                    raise Unsupported("sliding_window", "null without layer_types: Exaone4Config's pattern of layers divides by zero")
                if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
                    raise Unsupported("sliding_window_pattern", f"{pattern!r}: without layer_types, the pattern is a whole number of layers from 1")
            types, sw = _window_types(c, layers, lambda: ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)])
            nope = [sw is not None and t != "sliding_attention" for t in types]  # rotary only on sliding layers, when the model has a window
        elif family == "smollm3":
            interval, on = c["no_rope_layer_interval"], bool(c["use_sliding_window"])
            rope_layers = c["no_rope_layers"]
            if rope_layers is None:
                if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
                    raise Unsupported("no_rope_layer_interval", f"{interval!r}: a NoPE layer every k layers, k a whole number from 1")
                rope_layers = [int((i + 1) % interval != 0) for i in range(layers)]
            if not isinstance(rope_layers, list) or len(rope_layers) < layers or any(v not in (0, 1) or isinstance(v, float) for v in rope_layers):
                raise Unsupported("no_rope_layers", f"no_rope_layers holds 1 (rotary) or 0 (NoPE) for each of the {layers} layers")
            nope = [not rope_layers[i] for i in range(layers)]
            sw0 = _sliding(c)
            types = _types(c, layers, lambda: ["sliding_attention" if on and sw0 is not None and nope[i] else "full_attention"
                                                for i in range(layers)])
            if "sliding_attention" in types and not (on and sw0 is not None):
                raise Unsupported("use_sliding_window" if not on else "sliding_window",
                                  "layer_types has sliding layers, but transformers' kernels disagree on them without use_sliding_window "
                                  "and a sliding_window (eager masks them, flash attention does not)")
            sw = sw0
            sources["rotary"] = "no_rope_layers"
        per = [(sw if t == "sliding_attention" else None, *((0.0, ropes[t][1], None) if nope[i] else ropes[t])) for i, t in enumerate(types)]
        first = per[0]
        window, rotary, base, scaling = first
        windows = tuple(p[0] for p in per)
        if len({p[1:] for p in per}) > 1:
            extra["layer_attn"] = tuple(per)
        elif len(set(windows)) > 1:
            extra["layer_windows"] = windows
            window = None
        if rotary == 0.0:
            base, scaling = 10000.0, None
        qkv_bias = out_bias = mlp_bias = False
        if family in ("olmo3", "smollm3", "exaone", "vaultgemma", "hyperclovax"):
            qkv_bias = out_bias = bool(c["attention_bias"])
        if family == "helium":
            qkv_bias = bool(c["attention_bias"])
        if family == "ernie4_5":
            qkv_bias = out_bias = mlp_bias = bool(c["use_bias"])
        if family in ("smollm3", "helium", "cwm", "exaone", "hyperclovax"):
            mlp_bias = bool(c["mlp_bias"])
        if family == "olmo3":
            extra.update(post_norms=True, qk_norm="all", qk_eps=eps)
        if family == "exaone4":
            extra.update(post_norms=True, qk_norm="head", qk_eps=eps)
        if family in ("ernie4_5", "helium"):
            extra.update(rotary_interleaved=True)  # rotate_half on pairs (0, 1), (2, 3), ...
        if family == "vaultgemma":
            scalar = c["query_pre_attn_scalar"]
            if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or not scalar > 0:
                raise Unsupported("query_pre_attn_scalar", f"{scalar!r} is not a positive number")
            extra.update(norm_offset=1.0, embed_scale=float(width) ** 0.5, attn_scale=float(scalar) ** -0.5,
                         softcap=_cap(c, "attn_logit_softcapping"), logit_softcap=_cap(c, "final_logit_softcapping"))
            sources.update(embed_scale="Gemma's sqrt(hidden_size)", attn_scale="query_pre_attn_scalar", softcap="attn_logit_softcapping",
                           logit_softcap="final_logit_softcapping")
        if family == "hyperclovax":
            for k in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
                if not c[k]:
                    raise Unsupported(k, f"{c[k]!r}: HyperCLOVA X's multipliers are non-zero numbers")
            am = c["attention_multiplier"]
            if am is not None and not am > 0:
                raise Unsupported("attention_multiplier", f"{am!r} is not a positive number (null: 1 / sqrt(head_dim))")
            extra.update(embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                         attn_scale=None if am is None else float(am), logit_scale=float(c["logits_scaling"]), sandwich=bool(c["use_post_norm"]))
            sources.update(embed_scale="embedding_multiplier", residual_scale="residual_multiplier", attn_scale="attention_multiplier",
                           logit_scale="logits_scaling")
        roped = next((p[3] for p in per if p[1]), None)  # the rope of the first layer with one (a NoPE layer has none)
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, roped), width=width, layers=layers, heads=heads,
                    kv_heads=kv, head_dim=head_dim, hidden=c["intermediate_size"], act=act, norm="rmsnorm", eps=eps, qkv_bias=qkv_bias,
                    out_bias=out_bias, mlp_bias=mlp_bias, rotary=rotary, rotary_base=base, rotary_scaling=scaling, window=window,
                    tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources, **extra)
    return read


_PER_LAYER = ("window", "rotary_dims", "rotary_base", "rotary_scaling")  # what a family's layers may vary in (arch_of)


def _layer_attn(stages: list, windows: list) -> tuple:
    """Each layer's (window, rotary, rotary_base, rotary_scaling) where rotary differs by layer, else ()."""
    per = []
    for st, w in zip(stages, windows):
        a = next((op for op in _ops(st) if isinstance(op, ir.Attention)), None)
        if a is None:
            return ()
        rot = a.rotary_dims / a.head_dim
        per.append((w, rot, a.rotary_base if rot else 10000.0, a.rotary_scaling))
    return tuple(per) if len({p[1:] for p in per}) > 1 else ()


def _attn_templates(a: Arch, att: list, mk, where: str) -> tuple[list, list]:
    """(templates, each layer's kind) for layers whose attention differs in window and rotary (a.layer_attn);
    mk(words): a layer's ops with those attention words."""
    plain = [x for x in att if not x.startswith(("rotary", "window="))]
    kinds, blocks, names = [], [], {}
    for w, rot, base, sc in a.layer_attn:
        variant = (w, rot, base, sc)
        if variant not in names:
            words = []
            if rot:
                words.append("rotary" if rot == 1.0 else f"rotary={_num(rot)}")
                if a.rotary_interleaved:
                    words.append("rotary_interleaved")
                if base != 10000.0:
                    words.append(f"rotary_base={_num(base)}")
                if sc is not None:
                    words.append(_scaling_text(sc).strip())
            if w is not None:
                words.append(f"window={w}")
            name = ("local" if w is not None else "global") + ("" if rot else "_nope")
            while name in names.values():
                name += "_b"
            names[variant] = name
            what = (f"sliding-window attention ({w} tokens)" if w is not None else "global attention") + \
                ("" if rot else ", no rotary (NoPE)") + (f", rotary base {_num(base)}" if rot else "")
            at = sum(1 for x in plain if x.startswith(("heads=", "kv_heads=", "head_dim=")))  # the words after the heads'
            ops = mk(plain[:at] + words + plain[at:])
            blocks.append((f"# a {a.family} layer with {what}, {where}", f"{a.family}_{name}", ops))
        kinds.append(names[variant])
    return blocks, kinds


def _per_layer(a: Arch) -> list:
    """Each layer's (window, rotary, rotary_base, rotary_scaling), however the Arch says them."""
    if a.layer_attn:
        return list(a.layer_attn)
    windows = a.layer_windows or (a.window,) * a.layers
    return [(w, a.rotary, a.rotary_base, a.rotary_scaling) for w in windows]


def _one_window(a: Arch, per: list) -> int | None:
    local = {p[0] for p in per if p[0] is not None}
    if len(local) > 1:
        raise Unsupported("window", f"{a.family} has one sliding_window; the spec's layers have {sorted(local)}")
    return local.pop() if local else None


def _rope_dict(a: Arch, base: float, sc) -> dict:
    return _rope_config(replace(a, rotary_scaling=sc), {"rope_type": "default", "rope_theta": base})


def _dense_h2_config(a: Arch) -> dict:
    """The config.json of a spec read as one of the _DENSE_H2 families (export); what it cannot say is refused
    when importing it back differs from the spec (interop.export_config)."""
    f = a.family
    act = _HF_GATED.get(a.act)
    if act is None:
        raise Unsupported("act", f"{f}'s gated MLP has no '{a.act}' form (swiglu, geglu or geglu_tanh)")
    per = _per_layer(a)
    sw = _one_window(a, per)
    types = ["sliding_attention" if p[0] is not None else "full_attention" for p in per]
    roped = [p for p in per if p[1]]
    first = roped[0] if roped else (None, 1.0, 10000.0, None)
    cfg = {"model_type": f, "architectures": [CAUSAL_LM[f]], "vocab_size": a.vocab, "hidden_size": a.width, "intermediate_size": a.hidden,
           "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "hidden_act": act,
           "max_position_embeddings": _max_positions(replace(a, rotary_scaling=first[3])), "rms_norm_eps": a.eps,
           "tie_word_embeddings": a.tied, "pad_token_id": a.padding, "rope_parameters": _rope_dict(a, first[2], first[3])}
    if "head_dim" in fields_of(f) or f in _HEAD_DIM_ATTRIBUTE:
        cfg["head_dim"] = a.head_dim
    if f in ("olmo3", "smollm3", "exaone", "vaultgemma", "hyperclovax", "helium"):
        cfg["attention_bias"] = a.qkv_bias
    if f in ("smollm3", "helium", "cwm", "exaone", "hyperclovax"):
        cfg["mlp_bias"] = a.mlp_bias
    if f == "ernie4_5":
        cfg["use_bias"] = a.qkv_bias
    if f == "olmo3":
        ropes = {}
        for t, p in zip(types, per):
            ropes.setdefault(t, _rope_dict(a, p[2], p[3]))
        for t in ("full_attention", "sliding_attention"):
            ropes.setdefault(t, ropes.get("full_attention") or ropes.get("sliding_attention"))
        cfg.update(rope_parameters=ropes, sliding_window=sw, layer_types=types)
    if f == "cwm":
        cfg.update(sliding_window=sw or 8192, layer_types=types)
    if f == "smollm3":
        cfg.update(use_sliding_window=sw is not None, sliding_window=sw, layer_types=types, no_rope_layers=[int(bool(p[1])) for p in per])
    if f == "exaone4":
        cfg.update(sliding_window=sw, layer_types=types)
    if f == "vaultgemma":
        del cfg["hidden_act"]
        cfg.update(hidden_activation=act, sliding_window=sw or a.context, layer_types=types,
                   query_pre_attn_scalar=_whole((a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5) ** -2),
                   attn_logit_softcapping=a.softcap, final_logit_softcapping=a.logit_softcap)
    if f == "hyperclovax":
        cfg.update(embedding_multiplier=a.embed_scale, residual_multiplier=a.residual_scale, attention_multiplier=a.attn_scale,
                   logits_scaling=a.logit_scale, use_post_norm=a.sandwich)
    return cfg


CAUSAL_LM_H2 = {"olmo3": "Olmo3ForCausalLM", "smollm3": "SmolLM3ForCausalLM", "exaone4": "Exaone4ForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
                "helium": "HeliumForCausalLM", "cwm": "CwmForCausalLM", "exaone": "LlamaForCausalLM", "vaultgemma": "VaultGemmaForCausalLM",
                "hyperclovax": "HyperCLOVAXForCausalLM"}

# The GPT-2 lineage (lineage.py): gpt_bigcode, gpt_neo, opt, biogpt, openai-gpt; gpt-sw3 is GPT2Config under another name
from . import lineage  # noqa: E402

KEYS.update(lineage.KEYS)
KEYS["gpt-sw3"] = KEYS["gpt2"]
SAME_AS = {"gpt-sw3": "gpt2"}  # a model_type transformers reads with another's classes: its weights load by that family's plan

# --- squared ReLU, the qk-norm's shapes, per-layer rotary bases ---------------------------------

# Llama's layer with an ungated MLP (up, act, down): Arcee's relu2.
_UNGATED = ("arcee", "nemotron", "jais2", "nanochat")
_DECODERS_UNGATED = {
    "arcee": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
}
# Nemotron: Arcee's layer with (1 + w) LayerNorms (LayerNorm1P, biased) and partial rotary (half of each head by default).
# Jais 2: Arcee's layer with biased LayerNorms (eps layer_norm_eps).
KEYS["jais2"] = Keys(_LLAMA - {"rms_norm_eps"} | {"layer_norm_eps", "head_dim", "attention_bias", "mlp_bias"})
# nanochat: weightless RMSNorms (one more right after the embedding: the final norm, used twice), weightless qk RMSNorms
# after rotary, a relu2 MLP without biases, a final-logit soft-cap; its rotary turns the other way (the load plan's _Turned).
KEYS["nanochat"] = Keys(_LLAMA | {"attention_bias", "final_logit_softcapping"})
# Persimmon: a sequential GPT-NeoX layer (per-head fused q, k, v rows) with a relu2 MLP and per-head qk LayerNorms.
KEYS["persimmon"] = Keys(_PLAIN_KEYS | {"layer_norm_eps", "qk_layernorm", "pad_token_id"})
KEYS["nemotron"] = Keys(_LLAMA - {"rms_norm_eps"} | {"norm_eps", "head_dim", "attention_bias", "mlp_bias"})
KEYS.update(_DECODERS_UNGATED)

# Gemma 3 (text): Gemma 2's layer with (1 + w) qk RMSNorms, a layer pattern of one global layer in six, and
# rope parameters per layer type (sliding layers: rope_local_base_freq's 10000 by default; global: 1e6).
KEYS["gemma3_text"] = Keys(_DECODERS["gemma2"].maps - {"attn_logit_softcapping"},
                           {"hidden_act": "Gemma 3's forward reads hidden_activation; a hidden_act its configs also write is ignored",
                            "attn_logit_softcapping": "Gemma 3's attention keeps it but never hands it to the attention function: "
                                                      "its scores are not soft-capped",
                            "_sliding_window_pattern": "the copy of sliding_window_pattern to_dict writes; __post_init__ reads only "
                                                       "sliding_window_pattern (and only where layer_types is absent)"},
                           {"rope_local_base_freq": "rope_parameters.sliding_attention.rope_theta", "sliding_window_pattern": "layer_types"})
_GEMMA3_THETA = {"full_attention": ("rope_theta", 1_000_000.0), "sliding_attention": ("rope_local_base_freq", 10_000.0)}


class _View:
    """A family's config seen by another family's reader: its own layer types and one layer type's rope parameters."""

    def __init__(self, c: Config, rope: dict | None = None, where: str = "", types: list | None = None, renamed: dict | None = None,
                 fixed: dict | None = None):
        self._c, self._rope, self._where, self._types, self._renamed = c, rope, where, types, renamed or {}
        self._fixed = fixed or {}  # keys the other reader reads that this family's forward never reads: their value in effect
        self.keys, self.raw, self.family = c.keys, c.raw, c.family

    def __getitem__(self, key: str):
        if key == "layer_types" and self._types is not None:
            return self._types
        if key in self._fixed:
            return self._fixed[key]
        return self._c[self._renamed.get(key, key)]

    def __contains__(self, key: str) -> bool:
        return key in self._c.raw

    def given(self, key: str) -> bool:
        return self._c.given(key)

    def rope(self) -> tuple[dict, str]:
        return (self._rope, self._where) if self._rope is not None else self._c.rope()


def _gemma3_ropes(c: Config) -> dict:
    """Each layer type's rope parameters, as Gemma3TextConfig.convert_rope_params_to_dict fills them in."""
    from .closed import ROPE_KEYS

    rope = c["rope_parameters"]
    rope = {"sliding_attention": None, "full_attention": None} if rope is None else rope
    if not isinstance(rope, dict) or set(rope) - set(_GEMMA3_THETA):
        raise Unsupported("rope_parameters", "Gemma 3's rope parameters are one object per layer type (sliding_attention, full_attention)")
    old = c.raw.get("rope_scaling")
    out = {}
    for kind, (theta_key, theta) in _GEMMA3_THETA.items():
        where = f"rope_parameters.{kind}"
        p = rope.get(kind)
        if p is not None and not isinstance(p, dict):
            raise Unsupported(where, "is not an object")
        p = dict(p or {"rope_type": "default"})
        if kind == "full_attention" and old:  # rope_scaling: the global layers' (transformers' own conversion)
            if not isinstance(old, dict):
                raise Unsupported("rope_scaling", "is not an object")
            p.update(old)
        p.setdefault("rope_theta", c.raw.get(theta_key, theta))
        p.setdefault("rope_type", p.get("type", "default"))
        for k, v in p.items():
            if k not in ROPE_KEYS:
                raise Unsupported(f"{where}.{k}", "not a rope parameter the importer knows: it cannot tell whether it changes the function")
            if k in ("rope_theta", "factor", "partial_rotary_factor") and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                                          or not math.isfinite(v) or not v > 0):
                raise Unsupported(f"{where}.{k}", f"{v!r} is not a positive number")
        if p.get("partial_rotary_factor", 1.0) != 1.0:
            raise Unsupported(f"{where}.partial_rotary_factor", "Gemma 3's rotary turns every dim of a head (its default rope reads no partial factor)")
        if p["rope_type"] == "dynamic":
            raise Unsupported(f"{where}.rope_type", "dynamic NTK on one layer type of two is not mapped")
        out[kind] = (p, where)
    return out


def _gemma3(c: Config) -> Arch:
    """Gemma 2's reader over Gemma 3's config, then its own: (1 + w) qk-norms, each layer type's rotary."""
    layers = c["num_hidden_layers"]
    types = c["layer_types"]
    if types is None:  # __post_init__: every sliding_window_pattern-th layer global (6; older configs say it)
        pattern = c.raw.get("sliding_window_pattern", 6)
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise Unsupported("sliding_window_pattern", f"{pattern!r}: a pattern is a whole number of layers from 1")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    ropes = _gemma3_ropes(c)
    full = _View(c, *ropes["full_attention"], types, fixed={"attn_logit_softcapping": None})
    a = _decoder("gemma2")(full)
    eps = _eps(c, "rms_norm_eps")
    local = _View(c, *ropes["sliding_attention"], types)
    context = c["max_position_embeddings"]
    lb, ls = _rope(local), _rope_scaling(local, context)
    rotary: dict = {}
    if a.layer_windows:
        if (lb, ls) != (a.rotary_base, a.rotary_scaling):
            rotary["local_rotary"] = (lb, ls)
    elif a.window is not None:  # every layer slides: the sliding layers' rotary everywhere
        rotary.update(rotary_base=lb, rotary_scaling=ls)
    sources = {**a.sources, "rotary_base": "rope_parameters (per layer type)", "act": "hidden_activation"}
    return replace(a, family="gemma3_text", qk_norm="head", qk_eps=eps, qk_offset=1.0, sources=sources, **rotary)


def _jais2(c: Config) -> Arch:
    """Llama's reader with an ungated MLP, then Jais 2's norms: LayerNorms with a bias, eps layer_norm_eps."""
    a = _decoder("jais2")(_View(c, renamed={"rms_norm_eps": "layer_norm_eps"}))
    return replace(a, norm="layernorm", norm_bias=True, eps=_eps(c, "layer_norm_eps"), sources={**a.sources, "eps": "layer_norm_eps"})


def _nanochat(c: Config) -> Arch:
    """Llama's reader with an ungated MLP, then nanochat's weightless norms and qk-norms, its norm after the embedding, its soft-cap."""
    a = _decoder("nanochat")(c)
    return replace(a, norm_affine=False, qk_norm="head", qk_eps=a.eps, qk_affine=False, qk_late=True, embed_norm=True,
                   logit_softcap=_cap(c, "final_logit_softcapping"), sources={**a.sources, "logit_softcap": "final_logit_softcapping"})


def _persimmon(c: Config) -> Arch:
    """GPT-NeoX's sequential layer read as the plain decoders are, then Persimmon's per-head qk LayerNorms (with a bias)."""
    a = _plain("persimmon")(c)
    qk = dict(qk_norm="head", qk_eps=a.eps, qk_type="layernorm", qk_bias=True) if c["qk_layernorm"] else {}
    return replace(a, **qk, sources={**a.sources, "rotary": "partial_rotary_factor"})


def _phi(c: Config) -> Arch:
    """Phi's parallel block read as the plain decoders are, then its qk LayerNorms (qk_layernorm: one over each head's dims,
    shared by the heads, with a bias, before the partial rotary), Persimmon's."""
    a = _plain("phi")(c)
    return replace(a, qk_norm="head", qk_eps=a.eps, qk_type="layernorm", qk_bias=True) if c["qk_layernorm"] else a


def _nemotron(c: Config) -> Arch:
    """Llama's reader with an ungated MLP, then Nemotron's norms: LayerNorm1P, gain 1 + w, a bias, eps norm_eps."""
    a = _decoder("nemotron")(_View(c, renamed={"rms_norm_eps": "norm_eps"}))
    return replace(a, norm="layernorm", norm_bias=True, norm_offset=1.0, eps=_eps(c, "norm_eps"),
                   sources={**a.sources, "eps": "norm_eps", "rotary": "partial_rotary_factor"})


_DECODER_FAMILIES = tuple(_DECODERS)
_PLAIN_FAMILIES = tuple(_PLAIN)
READERS = {"gpt2": _gpt2, **{f: _decoder(f) for f in _DECODERS}, **{f: _plain(f) for f in _PLAIN}, "mamba2": _mamba2,
           "mamba": _mamba, "jamba": _jamba, "deepseek_v2": _deepseek_v2, "bloom": _bloom}
READERS.update({f: _dense_h2(f) for f in _DENSE_H2})
READERS.update({f: _routed(f) for f in _ROUTED})

from . import families_parallel as _parallel  # noqa: E402  (Cohere, Cohere 2, GLM, GLM-4, StableLM, CodeGen, MPT: it reads the helpers above)

KEYS.update(_parallel.KEYS)
READERS.update(_parallel.READERS)
from . import families_routed as _routed_v3  # noqa: E402  (GLM-4.5, dots.llm1, ERNIE 4.5 MoE, ...: DeepSeek-V3's router)

KEYS.update(_routed_v3.KEYS)
READERS.update(_routed_v3.READERS)
from . import families_conv as _conv  # noqa: E402  (LFM2, LFM2-MoE: the short gated convolution)

KEYS.update(_conv.KEYS)
READERS.update(_conv.READERS)
from . import families_hybrid as _hybrid  # noqa: E402  (Falcon-H1: Mamba-2 beside attention in one block)

KEYS.update(_hybrid.KEYS)
READERS.update(_hybrid.READERS)
READERS.update({**lineage.READERS, "gpt-sw3": _gpt2})
READERS.update({"minicpm3": _latent_dense("minicpm3"), "youtu": _latent_dense("youtu"), "falcon_mamba": _falcon_mamba, "bamba": _bamba,
                "granitemoehybrid": _granitemoehybrid})
READERS.update({f: _decoder(f) for f in _DECODERS_UNGATED})
READERS["gemma3_text"] = _gemma3
READERS["nemotron"] = _nemotron
READERS["persimmon"] = _persimmon
READERS["phi"] = _phi
READERS["jais2"] = _jais2
READERS["nanochat"] = _nanochat
READERS["deepseek_v3"] = _deepseek_v3
READERS["sarvam_mla"] = _sarvam_mla
READERS["glm4_moe_lite"] = _glm4_moe_lite
READERS["axk1"] = _axk1
from . import families_sinks as _sinks  # noqa: E402  (gpt-oss, ...: attention sinks)

KEYS.update(_sinks.KEYS)
READERS.update(_sinks.READERS)
from . import families_gemma4 as _gemma4  # noqa: E402  (Gemma 4's text decoder: per-layer inputs, K = V, values normed)

KEYS.update(_gemma4.KEYS)
READERS[_gemma4.FAMILY] = _gemma4.read
READERS[_gemma4.UNIFIED] = _gemma4.read
from . import families_afmoe as _afmoe  # noqa: E402  (Arcee's AFMoE: output-gated attention, sandwich norms, DeepSeek-V3's router)

KEYS.update(_afmoe.KEYS)
READERS[_afmoe.FAMILY] = _afmoe.read
from . import families_laguna as _laguna  # noqa: E402  (Laguna: a softplus output gate, heads per layer, DeepSeek-V3's router)

KEYS.update(_laguna.KEYS)
READERS[_laguna.FAMILY] = _laguna.read


# HunYuan's dense and MoE decoders (HunYuanDenseV1, HunYuanMoEV1): Llama's layer, its per-head qk RMSNorms (query_layernorm,
# key_layernorm, eps rms_norm_eps) acting on the rotated q and k; the MoE's layer a softmax top-k router (renormalised)
# and its fused experts beside one summed, ungated gated MLP (shared_mlp), all intermediate_size wide.
_HUNYUAN_KEYS = _LLAMA | {"head_dim", "attention_bias"}
_HUNYUAN_INERT = {**_TP, "eod_token_id": "a tokenizer's end-of-document token; the forward does not read it"}
KEYS["hunyuan_v1_dense"] = Keys(_HUNYUAN_KEYS, _HUNYUAN_INERT)
KEYS["hunyuan_v1_moe"] = Keys(_HUNYUAN_KEYS | {"num_experts", "moe_topk"}, _HUNYUAN_INERT)


def _hunyuan_rope(c: Config) -> dict | None:
    """HunYuan's rope read as its rotary embedding reads it: rope_type dynamic with an alpha is no dynamic NTK but a fixed base,
    rope_theta * alpha ** (head_dim / (head_dim - 2)) (ntk_alpha); None where the rope is read as Llama's."""
    rope, where = c.rope()
    alpha = rope.get("alpha")
    if rope.get("rope_type") != "dynamic" or not alpha:
        return None
    dim = c["head_dim"]
    if not dim:
        raise Unsupported(f"{where}.alpha", "with head_dim null: transformers' ntk_alpha rotary reads config.head_dim and fails without one")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 or dim < 4:
        raise Unsupported(f"{where}.alpha", f"{alpha!r} with head_dim {dim}: a positive number, on heads of 4 dims or more")
    base = float(rope["rope_theta"]) * float(alpha) ** (dim / (dim - 2))
    return {"rope_type": "default", "rope_theta": base}


def _hunyuan_count(c: Config, key: str, layers: int) -> int:
    """num_experts or moe_topk: a number, or one per layer (read here when every layer's is the same)."""
    v = c[key]
    if isinstance(v, list):
        if len(v) != layers or len(set(v)) != 1:
            raise Unsupported(key, f"{v!r}: a different count per layer is not mapped (one number, or the same one per layer, {layers})")
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise Unsupported(key, f"{v!r} is not a count from 1")
    return v


def _hunyuan(family: str):
    def read(c: Config) -> Arch:
        rope = _hunyuan_rope(c)
        a = _decoder(family)(_View(c, rope, c.rope()[1]) if rope is not None else c)
        qk = dict(qk_norm="head", qk_eps=a.eps, qk_late=True)
        if rope is not None:
            a = replace(a, rotary_base=rope["rope_theta"], sources={**a.sources, "rotary_base": "rope_theta * alpha ** (head_dim / (head_dim - 2))"})
        if family == "hunyuan_v1_dense":
            return replace(a, **qk)
        if not c["head_dim"]:
            raise Unsupported("head_dim", f"{c['head_dim']!r}: transformers' HunYuan MoE attention reads config.head_dim as it is and fails "
                              "without one")
        layers = c["num_hidden_layers"]
        experts, top = _hunyuan_count(c, "num_experts", layers), _hunyuan_count(c, "moe_topk", layers)
        if top > experts:
            raise Unsupported("moe_topk", f"top-{top} of {experts} experts")
        return replace(a, **qk, experts=experts, top=top, normalize=True, shared=a.hidden, shared_gate=False,
                       sources={**a.sources, "experts": "num_experts", "top": "moe_topk"})
    return read


def _hunyuan_config(a: Arch, cfg: dict) -> dict:
    """HunYuan's config over Llama's: its qk-norms per-head RMSNorms after rotary with the norms' eps; the MoE's experts and shared MLP
    as wide as intermediate_size, the router's top-k renormalised, the shared MLP summed."""
    if (a.qk_norm, a.qk_type, a.qk_offset, a.qk_affine, a.qk_late, a.qk_heads, a.qk_eps) != ("head", "rmsnorm", 0.0, True, True, False, a.eps):
        raise Unsupported("qk_norm", f"{a.family}'s qk-norms are per-head RMSNorms after rotary, with the norms' eps")
    cfg.update(attention_bias=a.qkv_bias)
    if a.family == "hunyuan_v1_moe":
        if a.shared != a.hidden or a.shared_gate or not a.normalize or a.layer_dense:
            raise Unsupported("shared", "HunYuan MoE's layers each route top-k renormalised experts beside one ungated shared MLP, both "
                              "intermediate_size wide")
        cfg.update(num_experts=a.experts, moe_topk=a.top)
    return cfg


_HUNYUAN = ("hunyuan_v1_dense", "hunyuan_v1_moe")
READERS.update({f: _hunyuan(f) for f in _HUNYUAN})
from . import families_delta as _delta  # noqa: E402  (Qwen3-Next, Qwen3.5: gated DeltaNet hybrids)

KEYS.update(_delta.KEYS)
READERS.update(_delta.READERS)
FAMILIES = tuple(READERS)
assert set(READERS) == set(KEYS) <= set(CLASSES), "every claimed family has a reader, its Keys and its transformers class"

# The transformers classes a family's weights come from (what export's config names).
CAUSAL_LM = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
             "qwen2": "Qwen2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "olmo": "OlmoForCausalLM",
             "olmo2": "Olmo2ForCausalLM", "gemma": "GemmaForCausalLM", "granite": "GraniteForCausalLM", "phi": "PhiForCausalLM",
             "starcoder2": "Starcoder2ForCausalLM", "gpt_neox": "GPTNeoXForCausalLM", "gptj": "GPTJForCausalLM", "falcon": "FalconForCausalLM",
             "mamba2": "Mamba2ForCausalLM", "mamba": "MambaForCausalLM", "jamba": "JambaForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
             "gemma2": "Gemma2ForCausalLM", "bloom": "BloomForCausalLM", "ministral": "MinistralForCausalLM", "ministral3": "Ministral3ForCausalLM",
             "seed_oss": "SeedOssForCausalLM", "internlm3": "LlamaForCausalLM", "iquestcoder": "LlamaForCausalLM",
             "qwen3_moe": "Qwen3MoeForCausalLM",
             "olmoe": "OlmoeForCausalLM",
             "flex_olmo": "FlexOlmoForCausalLM",
             "granitemoe": "GraniteMoeForCausalLM",
             "granitemoeshared": "GraniteMoeSharedForCausalLM",
             "aria_text": "AriaTextForCausalLM",
             "mellum": "MellumForCausalLM"}
CAUSAL_LM.update({"hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM", "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM"})
CAUSAL_LM.update(CAUSAL_LM_H2)
CAUSAL_LM.update(_parallel.CAUSAL_LM)
CAUSAL_LM.update(_routed_v3.CAUSAL_LM)
CAUSAL_LM.update(_sinks.CAUSAL_LM)
CAUSAL_LM.update(_delta.CAUSAL_LM)
CAUSAL_LM.update(_conv.CAUSAL_LM)
CAUSAL_LM.update(_hybrid.CAUSAL_LM)
CAUSAL_LM.update(lineage.CAUSAL_LM)
CAUSAL_LM["gpt-sw3"] = "GPT2LMHeadModel"
CAUSAL_LM.update({"minicpm3": "MiniCPM3ForCausalLM", "youtu": "YoutuForCausalLM", "falcon_mamba": "FalconMambaForCausalLM",
                  "bamba": "BambaForCausalLM", "granitemoehybrid": "GraniteMoeHybridForCausalLM"})
CAUSAL_LM.update({
    "arcee": "ArceeForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "persimmon": "PersimmonForCausalLM",
    "jais2": "Jais2ForCausalLM",
    "nanochat": "NanoChatForCausalLM",
})
CAUSAL_LM["deepseek_v3"] = "DeepseekV3ForCausalLM"
CAUSAL_LM["sarvam_mla"] = "DeepseekV3ForCausalLM"  # transformers builds sarvam_mla as DeepSeek-V3
CAUSAL_LM["glm4_moe_lite"] = "Glm4MoeLiteForCausalLM"
CAUSAL_LM["axk1"] = "AXK1ForCausalLM"
CAUSAL_LM.update(_gemma4.CAUSAL_LM)
CAUSAL_LM.update(_afmoe.CAUSAL_LM)
CAUSAL_LM.update(_laguna.CAUSAL_LM)


def refusal(model_type: str) -> str:
    """Why an unclaimed model_type does not import: the nearest claimed family and what the language lacks."""
    from .unclaimed import LEFT_OUT, UNCLAIMED

    if model_type in LEFT_OUT:
        return (f"{model_type!r} is not a decoder-only text model (an encoder, an encoder-decoder, or a speech, music or "
                "image-to-text generator): the importer reads causal decoders")
    near = UNCLAIMED.get(model_type)
    if near is None:
        return (f"unknown model type {model_type!r}: not a decoder-only family of transformers {TRANSFORMERS_VERSION} that the importer "
                "knows, so it cannot tell what the checkpoint computes")
    family, lacks = near
    if lacks is None:
        return (f"{model_type!r} is not imported yet, though the language can say the whole model (nearest claimed family: {family}): "
                "only an importer is missing")
    return f"{model_type!r} is not imported: the language lacks {lacks} (nearest claimed family: {family})"


def read_config(config: dict) -> Arch:
    """The Arch a config implies, by its model_type, read closed-world (closed.py); Unsupported names the first
    key that cannot be read, or that the importer cannot tell changes nothing."""
    mt = config.get("model_type")
    if mt is None:
        raise Unsupported("model_type", "the config does not say its model_type, and interop never guesses it from key names")
    if not isinstance(mt, str):
        raise Unsupported("model_type", f"{mt!r} is not a family's name")
    family = remap(config)
    if family not in READERS:
        raise Unsupported("model_type", refusal(mt))
    try:
        return READERS[family](Config(config, family, KEYS[family]))
    except RecursionError:
        raise Unsupported("config.json", "nests deeper than any config transformers writes") from None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
        if isinstance(e, Unsupported):
            raise
        raise Unsupported("config.json", f"a value the {family} reader cannot use ({type(e).__name__}: {e})") from None


def explain_tables(code: str) -> str:
    """The part of `cyclec explain E0401/E0402` that the importer's tables write."""
    import textwrap

    def para(title: str, items) -> str:
        return "\n" + textwrap.fill(f"{title}: {', '.join(items)}.", 84, break_on_hyphens=False, break_long_words=False) + "\n"

    if code == "E0401":
        gated = sorted({k for k, v in _GATED_ACTS.items() if v})
        plain = sorted({k for k, v in _PLAIN_ACTS.items() if v})
        return (para("Rotary scalings read (rope_type)", ("default", *_SCALINGS)) + para("Activations read for a gated MLP", gated)
                + para("Activations read for a plain MLP", plain)
                + para("Keys every family reads as changing nothing", sorted(k for k, why in INERT.items() if "generation setting" not in why)))
    from .unclaimed import UNCLAIMED

    only = sorted(mt for mt, (_, lacks) in UNCLAIMED.items() if lacks is None)
    return (para(f"Claimed families ({len(FAMILIES)}, transformers {TRANSFORMERS_VERSION})", FAMILIES)
            + para(f"Not claimed, though the language says them whole ({len(only)}; only an importer is missing)", only)
            + f"\n{len(UNCLAIMED) - len(only)} other decoder families are refused with what the language lacks for each.\n")


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


def spec_text(a: Arch, source: str = "config.json") -> str:
    """A formatted, commented spec that builds to the architecture `a` describes."""
    if isinstance(a, _delta.DeltaHybrid):
        return _delta.spec_text(a, source)
    if isinstance(a, _gemma4.Gemma4):
        return a.spec_text(source)
    if isinstance(a, (_afmoe.Afmoe, _laguna.Laguna)):
        return a.spec_text(source)
    if isinstance(a, Mamba2):
        return _mamba2_text(a, source)
    if isinstance(a, lineage.Gpt):
        return lineage.spec_text(a, source)
    if isinstance(a, LatentDenseFamily):
        return _latent_dense_text(a, source)
    if isinstance(a, HybridFamily):
        return _hybrid_text(a, source)
    if isinstance(a, _conv.ConvFamily):
        return _conv.spec_text(a, source)
    if isinstance(a, _hybrid.ParallelHybrid):
        return _hybrid.spec_text(a, source)
    if isinstance(a, _hybrid.SingleMixerHybrid):
        return _hybrid.single_mixer_text(a, source)
    if isinstance(a, (MambaFamily, JambaFamily, DeepseekV2Family)):
        return {MambaFamily: _mamba_text, JambaFamily: _jamba_text, DeepseekV2Family: _deepseek_v2_text}[type(a)](a, source)
    src = a.sources
    att = [f"heads={a.heads}"]
    keys = ["heads"]
    if a.kv_heads != a.heads:
        att.append(f"kv_heads={a.kv_heads}")
        keys.append("kv_heads")
    if a.head_dim * a.heads != a.width:
        att.append(f"head_dim={a.head_dim}")
    if a.rotary:
        att.append("rotary" if a.rotary == 1.0 else f"rotary={_num(a.rotary)}")
        if a.rotary_interleaved:
            att.append("rotary_interleaved")
        if a.rotary_base != 10000.0:
            att.append(f"rotary_base={_num(a.rotary_base)}")
            keys.append("rotary_base")
        if a.rotary_scaling is not None:
            att.append(_scaling_text(a.rotary_scaling).strip())
            src["rotary_scaling"] = "rope_parameters"
            keys.append("rotary_scaling")
    if a.alibi:
        att.append("alibi alibi_scaled" if a.alibi_scaled else "alibi")  # Falcon's bias is scaled with the logits, BLOOM's is not
        keys.append("alibi")
        src["alibi"] = "alibi"
    if a.window is not None:
        att.append(f"window={a.window}")
        keys.append("window")
    if a.softcap is not None:
        att.append(f"softcap={_num(float(a.softcap))}")
        keys.append("softcap")
    if a.sinks:  # gpt-oss's learned sink per head
        att.append("sinks")
        keys.append("sinks")
    if a.qk_norm != "none":
        att.append("qk_norm" + (" qk_norm_across" if a.qk_norm == "all" else "") + (f" qk_norm_eps={_num(a.qk_eps)}" if a.qk_eps != 1e-6 else "")
                   + _qk_shape_text(a))
    if a.attn_scale is not None:
        att.append(f"scale={_num(a.attn_scale)}")
        keys.append("attn_scale")
    att.append(f"bias={_num(a.qkv_bias)}")
    if a.out_bias != a.qkv_bias:
        att.append(f"out_bias={_num(a.out_bias)}")
    norm = f"norm {a.norm}" + (f" eps={_num(a.eps)}" if a.eps != (1e-5 if a.norm == "layernorm" else 1e-6) else "")
    if not a.norm_affine:
        norm += " affine=false"
    elif a.norm == "layernorm" and not a.norm_bias:
        norm += " bias=false"
    if a.norm_offset:
        norm += f" offset={_num(a.norm_offset)}"
    if a.experts:
        work = f"turbine moe experts={a.experts} top={a.top} hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}"
        if not a.normalize:
            work += " normalize=false"
        if a.shared:
            work += f" shared={a.shared}" + (" shared_gate" if a.shared_gate else "")
        work += _router_words(a)
        wkeys = ("experts", "top", "hidden", "act", "router")
    else:
        work = f"turbine mlp hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}"
        wkeys = ("hidden", "act")
    merge = [f"    merge scale={_num(a.residual_scale)}{_comment(src, 'residual_scale')}"] if a.residual_scale != 1.0 else []

    def branch(name: str, turbine: str, tkeys, pad: str = "") -> list[str]:
        t = f"{pad}    {turbine}{_comment(src, *tkeys)}"
        n = f"{pad}    {norm}{_comment(src, 'eps') if name == 'mix' else ''}"
        ops = [t] if a.parallel == "shared" else [n, t, f"{pad}    {norm}"] if a.sandwich else [t, n] if a.post_norms else [n, t]
        return [f"{pad}  prechamber {name} {{", *ops, *[pad + m for m in merge], f"{pad}  }}"]

    def parallel(words, akeys=keys) -> list[str]:  # a parallel block of attention (these words) and the MLP
        shared = [f"    {norm}  # one norm for both branches ({src.get('eps')})"] if a.parallel == "shared" else []
        return ["  fullflow {  # attention and MLP read the same state: x + attn(.) + mlp(.)", *shared,
                *branch("mix", "turbine attention " + " ".join(words), akeys, "  "), *branch("burn", work, wkeys, "  "), "  }"]

    def mk(words) -> list[str]:  # one layer's ops, its attention said by these words
        if a.parallel != "none":
            return parallel(words)
        return [*branch("mix", "turbine attention " + " ".join(words), keys), *branch("burn", work, wkeys)]

    layer = mk(att)

    normed = "before and after" if a.sandwich else "after" if a.post_norms else "in front"
    where = "attention and the MLP in parallel" if a.parallel != "none" else f"each turbine with its norm {normed}"
    block = f"{a.family}_block"
    one = "attention and the MLP in parallel" if a.parallel != "none" else f"attention then the MLP, each with its norm {normed}"
    blocks = [(f"# one {a.family} layer: {one} (the layers repeat it)", block, layer)]
    body = [f"  stage {block} x depth"]
    if a.layer_windows:  # a per-layer pattern of windows: one template per kind of layer, the layers in order
        att_global = [x for x in att if not x.startswith("window=")]
        local = next(w for w in a.layer_windows if w is not None)
        att_local = att_global[:1] + [f"window={local}"] + att_global[1:]
        if a.local_rotary:  # Gemma 3: the sliding layers turn by their own base (rope_local_base_freq)
            att_local = _local_rotary_words(att_local, *a.local_rotary)
        blocks = [(f"# a {a.family} layer with sliding-window attention ({local} tokens), {where}", f"{a.family}_local", mk(att_local)),
                  (f"# a {a.family} layer with global attention", f"{a.family}_global", mk(att_global))]
        body = _layer_runs(a.family, ["local" if w is not None else "global" for w in a.layer_windows])
    if a.layer_attn:  # rotary differs by layer (NoPE layers, a rope per layer type): one template per kind of attention
        blocks, kinds = _attn_templates(a, att, mk, where)
        body = _layer_runs(a.family, kinds)
    if a.layer_dense:  # Qwen2-MoE's dense layers among the MoE ones (mlp_only_layers, decoder_sparse_step)
        dense = f"turbine mlp hidden={a.dense_hidden} act={a.act} bias={_num(a.mlp_bias)}"
        mk = lambda w, k: [*branch("mix", "turbine attention " + " ".join(att), keys), *branch("burn", w, k)]
        blocks = [(f"# a {a.family} layer with routed experts, {where}", f"{a.family}_moe", mk(work, wkeys)),
                  (f"# a dense {a.family} layer (mlp_only_layers, decoder_sparse_step): a gated MLP of intermediate_size", f"{a.family}_dense",
                   mk(dense, ()))]
        body = _layer_runs(a.family, ["dense" if d else "moe" for d in a.layer_dense])
        if a.layer_attn:  # both patterns (EXAONE-MoE): each kind of attention, with routed experts or a dense MLP
            blocks, kinds = [], []
            for tag, r, rk in (("moe", work, wkeys), ("dense", dense, ())):
                bl, kinds = _attn_templates(a, att, lambda w, r=r, rk=rk: [*branch("mix", "turbine attention " + " ".join(w), keys),
                                                                           *branch("burn", r, rk)], where)
                blocks += [(f"{c}, {'routed experts' if tag == 'moe' else 'a dense MLP'}", f"{n}_{tag}", ops) for c, n, ops in bl]
            kinds = [f"{k}_{'dense' if d else 'moe'}" for k, d in zip(kinds, a.layer_dense)]
            blocks = [b for b in blocks if b[1][len(a.family) + 1:] in kinds]
            body = _layer_runs(a.family, kinds)
    feed = f"feed tokens vocab={a.vocab} context={a.context} position={a.position}"
    if a.embed_scale != 1.0:
        feed += " scale=sqrt(width)" if a.family in ("gemma", "gemma2", "gemma3_text") else f" scale={_num(a.embed_scale)}"
    if a.padding is not None:
        feed += f" padding={a.padding}"
        src["padding"] = "pad_token_id"
    nozzle = "nozzle head" + (" tied" if a.tied else "") + (f" scale={_num(a.logit_scale)}" if a.logit_scale != 1.0 else "")
    nozzle += f" softcap={_num(float(a.logit_softcap))}" if a.logit_softcap is not None else ""
    nozzle += " bias=true" if a.head_bias else ""
    lines = [f"# A {a.family} checkpoint, imported from {source} by `cyclec import`.",
             "# Every value comes from the config field named beside it; the weights load with",
             "# cyclelang.interop.load_transformers(model, checkpoint).",
             "",
             *([] if a.layer_windows or a.layer_dense or a.layer_attn else [f"let depth = {a.layers}  # {src.get('layers', 'layers')}"]),  # a pattern counts its own layers
             f"let d_model = {a.width}  # {src.get('width', 'width')}",
             "",
             *[ln for comment, name, ops in blocks for ln in (comment, f"stage {name} {{", *ops, "}", "")],
             f"engine {a.family} {{",
             "  chamber width=d_model",
             "  throat causal",
             f"  {feed}{_comment(src, 'vocab', 'context', 'embed_scale', 'padding')}",
             "",
             *([f"  {norm}  # " + ("the final norm, applied to the embedding too" if a.family == "nanochat"
                                   else "word_embeddings_layernorm: BLOOM's norm after the embedding"), ""] if a.embed_norm else []),
             *body,
             "",
             f"  {norm}  # the final norm",
             f"  {nozzle}{_comment(src, 'tied', 'logit_scale', 'logit_softcap')}",
             "}",
             ""]
    return "\n".join(lines)


def _router_words(a: Arch) -> str:
    """DeepSeek-V3's router options of a moe turbine (families_routed.py), where they differ from Mixtral's."""
    words = f" router={a.router}" if a.router != "softmax" else ""
    if a.groups > 1:
        words += f" groups={a.groups} top_groups={a.top_groups}"
    if a.route_scale != 1.0:
        words += f" scale={_num(a.route_scale)}"
    words += " router_bias" if a.router_bias else ""  # gpt-oss's biased router and clamped experts
    words += f" clamp={_num(a.clamp)}" if a.act == "swiglu_clamp" else ""
    return words + (" correction=true" if a.correction else "")


def _qk_shape_text(a: Arch) -> str:
    """The attention options that shape its qk-norms (Persimmon's layernorm, Gemma 3's 1 + w, nanochat's weightless, after rotary)."""
    return "".join(w for w, on in ((" qk_norm_type=layernorm", a.qk_type == "layernorm"), (" qk_norm_bias", a.qk_bias),
                                   (f" qk_norm_offset={_num(a.qk_offset)}", a.qk_offset), (" qk_norm_affine=false", not a.qk_affine),
                                   (" qk_norm_after_rotary", a.qk_late), (" qk_norm_head_gains", a.qk_heads)) if on)


def _local_rotary_words(att: list, base: float, scaling) -> list:
    """An attention's words with its rotary base and scaling replaced by the sliding layers' own."""
    out = [w for w in att if not w.startswith(("rotary_base=", "rotary_scaling="))]
    at = out.index("rotary") + 1
    own = ([f"rotary_base={_num(base)}"] if base != 10000.0 else []) + ([_scaling_text(scaling).strip()] if scaling is not None else [])
    return out[:at] + own + out[at:]


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


# --- the config an engine implies (export) ----------------------------------------------------


def _branch_shape(b: ir.Prechamber, want) -> tuple[ir.Norm, object, bool]:
    """(norm, turbine, post) of a family's branch: a norm then its turbine, or (OLMo-2) the reverse."""
    ops = b.ops
    if len(ops) == 2 and isinstance(ops[0], ir.Norm) and isinstance(ops[1], want):
        return ops[0], ops[1], False
    if len(ops) == 2 and isinstance(ops[1], ir.Norm) and isinstance(ops[0], want):
        return ops[1], ops[0], True
    if len(ops) == 3 and isinstance(ops[0], ir.Norm) and isinstance(ops[1], want) and ops[2].model_dump() == ops[0].model_dump():  # Gemma 2's sandwich
        return ops[0], ops[1], False
    raise Unsupported(f"prechamber {b.name}", "a family's branch is a norm and its turbine, nothing else")


def arch_of(engine: ir.Engine) -> Arch:
    """The Arch of a spec shaped like a family's decoder; Unsupported says where it is not.
    Only the shape is read here: export then checks, field by field, that importing the
    config it writes gives back this engine."""
    stages = [op for op in engine.body if isinstance(op, ir.Stage)]
    main = [op for op in engine.body if not isinstance(op, ir.Stage)]
    if not stages:
        raise Unsupported("stages", "the engine has no stages: no family is a plain stack")
    embed_norm = len(main) == 2 and isinstance(engine.body[0], ir.Norm)  # BLOOM's norm after the embedding
    if len(main) != 1 + embed_norm or not isinstance(engine.body[-1], ir.Norm):
        raise Unsupported("main line", "a family's decoder ends with exactly one norm on the main line, before the head "
                          "(BLOOM's also starts with one, after the embedding)")
    stages = _run_order(stages)  # one leaf stage per layer, in the order they run (a nested pattern unfolded)
    st = stages[0]
    windows = [_window(s) for s in stages]
    if len(set(windows)) > 1:  # a local layer's attention: Cohere 2's global layers have no rotary to read
        st = next(s for s, w in zip(stages, windows) if w is not None)
    for other in stages[1:]:
        if _unwindowed(other) != _unwindowed(st):
            raise Unsupported(f"stage {other.name}", "its layers differ from the first stage's; a family repeats one layer "
                              "(Gemma 2's alone in the window of its attention, Qwen2-MoE's in a dense MLP for its experts)")
    reactors = [_reactor(s) for s in stages]
    dense = tuple(isinstance(r, ir.Mlp) for r in reactors)
    if any(dense) and not all(dense):
        for kind in (ir.Mlp, ir.Moe):
            same = [r.model_dump(exclude={"name"}) for r in reactors if isinstance(r, kind)]
            if any(d != same[0] for d in same):
                raise Unsupported("stages", f"the layers' {kind.__name__.lower()} turbines differ; a family's dense layers share one MLP, its routed ones one MoE")
        st = next(s for s in stages if isinstance(_reactor(s), ir.Moe))
    parallel = "none"
    if len(st.ops) == 1 and isinstance(st.ops[0], ir.Fullflow) and len(st.ops[0].branches) == 2:
        ff = st.ops[0]
        mix, burn = ff.branches
        if ff.norm is not None:
            parallel = "shared"
            if len(mix.ops) != 1 or len(burn.ops) != 1 or not isinstance(mix.ops[0], ir.Attention):
                raise Unsupported(f"fullflow {ff.name}", "a parallel block with a shared norm holds attention and an MLP, one turbine each")
            n, attn, post, work = ff.norm, mix.ops[0], False, burn.ops[0]
        else:
            parallel = "separate"
    elif len(st.ops) != 2 or not all(isinstance(b, ir.Prechamber) for b in st.ops):
        raise Unsupported(f"stage {st.name}", "a family's layer is two prechambers (attention, then the MLP), or one parallel block")
    else:
        mix, burn = st.ops
    if parallel != "shared":
        n, attn, post = _branch_shape(mix, ir.Attention)
        _, work, _ = _branch_shape(burn, (ir.Mlp, ir.Moe))
    moe = isinstance(work, ir.Moe)
    sandwich = parallel == "none" and len(mix.ops) == 3
    scale = mix.merge.value if isinstance(mix.merge, ir.ScaleMerge) else 1.0
    qk = "none" if not attn.qk_norm else "all" if attn.qk_norm_across else "head"
    ropes = _layer_ropes(stages)
    if engine.feed.position == "learned" and n.type == "layernorm":
        family = "gpt2"
    elif attn.alibi and (embed_norm or not attn.alibi_scaled):
        family = "bloom"
    elif attn.alibi:
        family = "falcon"
    elif parallel == "shared":
        family = "gptj" if attn.rotary_interleaved else "phi" if engine.nozzle.bias else "falcon"
    elif parallel == "separate" and n.type == "layernorm" and (attn.kv_heads != attn.heads or not work.bias):
        family = "falcon"  # the new decoder: GPT-NeoX's block with grouped kv heads, or without biases
    elif n.type == "layernorm" and n.offset:
        family = "nemotron"
    elif n.type == "layernorm" and attn.qk_norm and attn.qk_norm_type == "layernorm":
        family = "persimmon"
    elif attn.qk_norm and attn.qk_norm_after_rotary:
        family = "nanochat"
    elif n.type == "layernorm" and n.affine and not is_gated(work.act):
        family = "gpt_neox" if parallel == "separate" or attn.rotary_dims != attn.head_dim else "starcoder2"
    elif moe:
        family = "qwen2_moe" if work.shared else "mixtral"
    elif n.type == "layernorm" and not n.affine:
        family = "olmo"
    elif n.offset and attn.qk_norm and attn.qk_norm_offset:
        family = "gemma3_text"
    elif n.offset and (sandwich or attn.softcap is not None or engine.nozzle.softcap is not None or len(set(windows)) > 1):
        family = "gemma2"
    elif post or qk == "all":
        family = "olmo2"
    elif n.offset:
        family = "gemma"
    elif scale != 1.0 or attn.scale is not None or engine.nozzle.scale != 1.0 or engine.feed.scale != 1.0:
        family = "granite"
    elif qk == "head":
        family = "qwen3"
    elif attn.bias and not attn.out_bias:
        family = "qwen2"
    elif attn.window is not None:
        family = "mistral"
    else:
        family = "llama"
    return Arch(family, vocab=engine.feed.vocab, context=engine.feed.context, width=engine.width,
                layers=len(stages), heads=attn.heads, kv_heads=attn.kv_heads, head_dim=attn.head_dim,
                hidden=work.hidden, act=work.act, norm=n.type, eps=n.eps, position=engine.feed.position, norm_bias=n.bias,
                norm_affine=n.affine, norm_offset=n.offset, post_norms=post, qkv_bias=attn.bias, out_bias=attn.out_bias,
                mlp_bias=work.bias, qk_norm=qk, qk_eps=attn.qk_norm_eps, attn_scale=attn.scale, embed_scale=engine.feed.scale,
                residual_scale=scale, logit_scale=engine.nozzle.scale, rotary=attn.rotary_dims / attn.head_dim,
                rotary_base=ropes.pop("rotary_base", attn.rotary_base), window=attn.window, experts=work.experts if moe else 0, top=work.top if moe else 0,
                normalize=work.normalize if moe else True, shared=work.shared if moe else 0,
                shared_gate=work.shared_gate if moe else False, tied=engine.nozzle.tied, padding=engine.feed.padding, parallel=parallel,
                head_bias=engine.nozzle.bias, rotary_interleaved=attn.rotary_interleaved, rotary_scaling=ropes.pop("rotary_scaling", attn.rotary_scaling),
                softcap=attn.softcap, logit_softcap=engine.nozzle.softcap, alibi=attn.alibi, alibi_scaled=attn.alibi_scaled,
                embed_norm=embed_norm, sandwich=sandwich,
                layer_windows=tuple(windows) if len(set(windows)) > 1 else (),
                layer_dense=dense if any(dense) and not all(dense) else (), layer_attn=_layer_attn(stages, windows),
                dense_hidden=next((r.hidden for r in reactors if isinstance(r, ir.Mlp)), 0) if any(dense) and not all(dense) else 0,
                qk_type=attn.qk_norm_type, qk_bias=attn.qk_norm_bias, qk_offset=attn.qk_norm_offset, qk_affine=attn.qk_norm_affine,
                qk_late=attn.qk_norm_after_rotary, qk_heads=attn.qk_norm_head_gains, **_router_of(work if moe else None), **ropes,
                sinks=attn.sinks)


def _router_of(work) -> dict:
    """A moe turbine's DeepSeek-V3 router options as Arch fields (export refuses them for a family without them; group_score
    is left to export's check that the config written reads back as the spec)."""
    if work is None:
        return {}
    return {"router": work.router, "groups": work.groups, "top_groups": work.top_groups, "route_scale": work.scale,
            "correction": work.correction, "router_bias": work.router_bias, "clamp": work.clamp}


def _layer_ropes(stages: list) -> dict:
    """The Arch's rotary fields when the sliding layers turn by a base (or scaling) of their own (Gemma 3): the global
    layers' as the Arch's rotary, the sliding layers' as local_rotary; {} otherwise. Layers of one kind with different
    rotaries are left for export's check to refuse."""
    seen: dict = {}
    for st in stages:
        for op in _ops(st):
            if isinstance(op, ir.Attention):
                seen.setdefault(op.window is not None, {})[(op.rotary_base, _dump(op.rotary_scaling))] = (op.rotary_base, op.rotary_scaling)
    if len(seen) != 2 or any(len(v) != 1 for v in seen.values()) or seen[True].keys() == seen[False].keys():
        return {}
    (gb, gs), = seen[False].values()
    (local,) = seen[True].values()
    return {"rotary_base": gb, "rotary_scaling": gs, "local_rotary": local}


def _dump(node):
    return None if node is None else node.model_dump_json()


def _run_order(stages: list) -> list:
    """The leaf stage (a stage of ops) each layer runs, in order: repeats and groups unfolded."""
    out = []
    for st in stages:
        for _ in range(st.repeat):
            out += _run_order(st.ops) if st.is_group else [st]
    return out


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


def _unwindowed(stage: ir.Stage) -> list:
    """A stage's layer as data, its attention's window and rotary left out (Gemma 2 alternates the window, SmolLM3 the rotary)."""
    def strip(d):
        if isinstance(d, dict) and d.get("op") in ("mlp", "moe"):
            return {"op": "reactor"}  # compared apart: dense and routed layers may alternate (Qwen2-MoE)
        if isinstance(d, dict):  # the window, and the rotary Cohere 2's global layers lack (export checks the rest)
            return {k: strip(v) for k, v in d.items() if not (k in _PER_LAYER and d.get("op") == "attention")}
        if isinstance(d, list):
            return [strip(x) for x in d]
        return d
    return [strip(o.model_dump(exclude={"name"})) for o in stage.ops]


def config_of(a: Arch) -> dict:
    """The transformers config.json of an Arch of a supported family."""
    if a.family == "gpt2":
        act = _HF_PLAIN.get(a.act)
        if act is None:
            raise Unsupported("act", f"GPT-2 has no '{a.act}' activation")
        return {"model_type": "gpt2", "architectures": [CAUSAL_LM["gpt2"]], "vocab_size": a.vocab, "n_positions": a.context,
                "n_embd": a.width, "n_layer": a.layers, "n_head": a.heads, "n_inner": a.hidden, "activation_function": act,
                "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if a.family in _PLAIN:
        return _plain_config(a)
    if a.family in _DENSE_H2:
        return _dense_h2_config(a)
    if a.family in _parallel.READERS:
        return _parallel.config_of(a)
    if a.family in _routed_v3.READERS:
        return _routed_v3.config_of(a)
    if a.family in _sinks.READERS:
        return _sinks.config_of(a)
    if a.family == "persimmon":
        return _persimmon_config(a)
    if a.family == "bloom":
        if a.hidden != 4 * a.width or a.act != "gelu_tanh":
            raise Unsupported("hidden" if a.hidden != 4 * a.width else "act", "BLOOM's MLP is 4 x width wide with the tanh GELU")
        return {"model_type": "bloom", "architectures": [CAUSAL_LM["bloom"]], "vocab_size": a.vocab, "hidden_size": a.width, "n_layer": a.layers,
                "n_head": a.heads, "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied, "apply_residual_connection_post_layernorm": False,
                "hidden_dropout": 0.0, "attention_dropout": 0.0, "seq_length": a.context}
    act = (_HF_PLAIN if a.family in _UNGATED else _HF_GATED).get(a.act)
    if act is None and a.family in _UNGATED:
        raise Unsupported("act", f"{a.family}'s ungated MLP has no '{a.act}' activation")
    if act is None:
        raise Unsupported("act", f"{a.family}'s gated MLP has no '{a.act}' form (swiglu, geglu or geglu_tanh)")
    rope = {"rope_type": "default", "rope_theta": a.rotary_base}
    if a.rotary not in (0.0, 1.0):
        rope["partial_rotary_factor"] = a.rotary
    cfg = {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "hidden_size": a.width,
           "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "hidden_act": act,
           "max_position_embeddings": _max_positions(a),
           "tie_word_embeddings": a.tied, "rope_parameters": _rope_config(a, rope),
           "pad_token_id": a.padding}
    if "rms_norm_eps" in fields_of(a.family):
        cfg["rms_norm_eps"] = a.eps if a.norm == "rmsnorm" else a.qk_eps
    if "head_dim" in fields_of(a.family):
        cfg["head_dim"] = a.head_dim
    elif a.head_dim * a.heads != a.width and a.family != "qwen3_moe":  # Qwen3-MoE's attention reads a head_dim its class lacks
        raise Unsupported("head_dim", f"{a.family}'s head_dim is hidden_size / num_attention_heads")
    if a.family in ("llama", "granite", "qwen3", "olmo", "olmo2", "gemma", "internlm3", "iquestcoder", "arcee", "nemotron", "jais2"):
        cfg["attention_bias"] = a.qkv_bias
    if a.family in ("llama", "granite", "internlm3", "iquestcoder", "arcee", "nemotron", "jais2"):
        cfg["mlp_bias"] = a.mlp_bias
    if a.family == "jais2":
        cfg["layer_norm_eps"] = a.eps
    if a.family == "nanochat":
        cfg.update(attention_bias=a.qkv_bias, final_logit_softcapping=a.logit_softcap)
    if a.family == "nemotron":  # its eps is norm_eps; partial rotary always written (an absent factor is Nemotron's 0.5)
        cfg.update(norm_eps=a.eps, rope_parameters={**cfg["rope_parameters"], "partial_rotary_factor": a.rotary})
    if a.family in _WINDOWED:
        cfg["sliding_window"] = a.window
    if a.family == "ministral3":  # its rotary reads Llama 4's query scaling: none (beta 0) at the rope's original context
        cfg["rope_parameters"] = {**cfg["rope_parameters"], "llama_4_scaling_beta": 0.0}
        cfg["rope_parameters"].setdefault("original_max_position_embeddings", _max_positions(a))
    if a.family == "ministral":
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"Ministral has one sliding_window; the spec's layers have {sorted(local)}")
        cfg.update(sliding_window=local.pop() if local else None,
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])
    if a.family == "seed_oss":
        cfg.update(attention_bias=a.qkv_bias, attention_out_bias=a.out_bias, mlp_bias=a.mlp_bias, residual_dropout=0.0, attention_dropout=0.0)
    if a.family == "mixtral":
        cfg.update(num_local_experts=a.experts, num_experts_per_tok=a.top, router_jitter_noise=0.0)
    if a.family == "qwen2_moe":
        cfg.update(num_experts=a.experts, num_experts_per_tok=a.top, moe_intermediate_size=a.hidden,
                   intermediate_size=a.dense_hidden if a.layer_dense else a.hidden,
                   shared_expert_intermediate_size=a.shared, norm_topk_prob=a.normalize, decoder_sparse_step=1,
                   mlp_only_layers=[i for i, d in enumerate(a.layer_dense) if d],
                   qkv_bias=a.qkv_bias)
    if a.family in _LAYER_TYPES:
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"{a.family} has one sliding_window; the spec's layers have {sorted(local)}")
        cfg.update(use_sliding_window=bool(local), sliding_window=local.pop() if local else None,
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])
        if cfg["use_sliding_window"]:
            cfg["max_window_layers"] = next(i for i, w in enumerate(windows) if w is not None)
    if a.family in ("gemma2", "gemma3_text"):
        windows = a.layer_windows or (a.window,) * a.layers
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            raise Unsupported("window", f"Gemma 2 has one sliding_window; the spec's layers have {sorted(local)}")
        del cfg["hidden_act"]
        cfg.update(hidden_activation=act, attention_bias=a.qkv_bias, sliding_window=local.pop() if local else a.context,  # transformers wants one even when no layer slides
                   layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows],
                   query_pre_attn_scalar=_whole((a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5) ** -2),
                   attn_logit_softcapping=a.softcap, final_logit_softcapping=a.logit_softcap)
    if a.family == "gemma3_text":
        _gemma3_config(a, cfg)
    if a.family == "granite":
        cfg.update(embedding_multiplier=a.embed_scale, residual_multiplier=a.residual_scale,
                   attention_multiplier=a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5,
                   logits_scaling=1.0 / a.logit_scale)
    if a.family in _ROUTED:
        cfg = _routed_config(a, cfg)
    if a.family in _HUNYUAN:
        cfg = _hunyuan_config(a, cfg)
    return cfg


def _gemma3_config(a: Arch, cfg: dict) -> None:
    """Gemma 3's config over Gemma 2's: each layer type's rope parameters; its qk-norms are (1 + w) RMSNorms with the norms' eps."""
    if a.qk_norm != "head" or a.qk_offset != 1.0 or a.qk_eps != a.eps or a.qk_type != "rmsnorm" or not a.qk_affine or a.qk_late:
        raise Unsupported("qk_norm", "Gemma 3's qk-norms are per-head (1 + w) RMSNorms with the norms' eps, before rotary")
    windows = a.layer_windows or (a.window,) * a.layers
    full = _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base})
    base, scaling = a.local_rotary or (a.rotary_base, a.rotary_scaling)
    local = _rope_config(replace(a, rotary_scaling=scaling), {"rope_type": "default", "rope_theta": base})
    if all(w is not None for w in windows):  # every layer slides: the spec's rotary is the sliding layers'
        full = local
    cfg.update(rope_parameters={"full_attention": full, "sliding_attention": local}, use_bidirectional_attention=False)


def _persimmon_config(a: Arch) -> dict:
    """Persimmon's config: every projection biased, as many key/value heads as query heads, qk LayerNorms (with a bias) or none."""
    act = _HF_PLAIN.get(a.act)
    if act is None:
        raise Unsupported("act", f"persimmon has no '{a.act}' activation")
    if a.kv_heads != a.heads or a.head_dim * a.heads != a.width:
        raise Unsupported("kv_heads" if a.kv_heads != a.heads else "head_dim", "Persimmon's heads split the width, each with its own key and value")
    if a.qk_norm not in ("none", "head") or (a.qk_norm == "head" and (a.qk_type, a.qk_bias, a.qk_eps) != ("layernorm", True, a.eps)):
        raise Unsupported("qk_norm", "Persimmon's qk-norms are per-head LayerNorms with a bias and the norms' eps")
    return {"model_type": "persimmon", "architectures": [CAUSAL_LM["persimmon"]], "vocab_size": a.vocab, "hidden_size": a.width,
            "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "hidden_act": act,
            "max_position_embeddings": _max_positions(a), "layer_norm_eps": a.eps, "tie_word_embeddings": a.tied,
            "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base, "partial_rotary_factor": a.rotary}),
            "qk_layernorm": a.qk_norm == "head", "hidden_dropout": 0.0, "attention_dropout": 0.0, "pad_token_id": a.padding}


def _falcon_common(a: Arch, act: str) -> dict:
    return {"model_type": "falcon", "architectures": [CAUSAL_LM["falcon"]], "vocab_size": a.vocab, "hidden_size": a.width,
            "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "bias": a.qkv_bias, "ffn_hidden_size": a.hidden,
            "activation": act, "max_position_embeddings": _max_positions(a), "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied,
            "alibi": a.alibi, "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base}),
            "hidden_dropout": 0.0, "attention_dropout": 0.0}


def _whole(x: float):
    """x as an int when it is one but for rounding (query_pre_attn_scalar 24 from its scale 24**-0.5)."""
    return round(x) if abs(x - round(x)) < 1e-9 * max(1.0, abs(x)) else x


def _plain_config(a: Arch) -> dict:
    act = _HF_PLAIN.get(a.act)
    if act is None:
        raise Unsupported("act", f"{a.family} has no '{a.act}' activation")
    if a.family == "falcon":
        if a.head_dim * a.heads != a.width:
            raise Unsupported("head_dim", "Falcon's head_dim is width / heads")
        new = a.parallel == "separate" or a.kv_heads not in (1, a.heads)  # grouped kv heads or two norms: the new decoder
        if new and a.parallel == "none":
            raise Unsupported("kv_heads", "Falcon's sequential (old) decoder has multi-query (1) or full key/value heads")
        if new:
            return {**_falcon_common(a, act), "num_kv_heads": a.kv_heads, "new_decoder_architecture": True, "parallel_attn": True,
                    "num_ln_in_parallel_attn": 2 if a.parallel == "separate" else 1}
        return {"model_type": "falcon", "architectures": [CAUSAL_LM["falcon"]], "vocab_size": a.vocab, "hidden_size": a.width,
                "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_kv_heads": a.kv_heads,
                "multi_query": a.kv_heads == 1 and a.heads > 1, "parallel_attn": a.parallel == "shared", "bias": a.qkv_bias,
                "ffn_hidden_size": a.hidden, "activation": act, "max_position_embeddings": _max_positions(a), "layer_norm_epsilon": a.eps,
                "tie_word_embeddings": a.tied, "new_decoder_architecture": False, "alibi": a.alibi,
                "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base}), "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if a.family == "gptj":
        return {"model_type": "gptj", "architectures": [CAUSAL_LM["gptj"]], "vocab_size": a.vocab, "n_positions": a.context,
                "n_embd": a.width, "n_layer": a.layers, "n_head": a.heads, "n_inner": a.hidden, "rotary_dim": round(a.rotary * a.head_dim),
                "activation_function": act, "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied, "resid_pdrop": 0.0,
                "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if a.family == "starcoder2":
        act = {"gelu_new": "gelu_pytorch_tanh"}.get(act, act)
    cfg = {"model_type": a.family, "architectures": [CAUSAL_LM[a.family]], "vocab_size": a.vocab, "hidden_size": a.width,
           "intermediate_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "hidden_act": act,
           "max_position_embeddings": _max_positions(a),
           "tie_word_embeddings": a.tied,
           "rope_parameters": _rope_config(a, {"rope_type": "default", "rope_theta": a.rotary_base, "partial_rotary_factor": a.rotary})}
    if a.family in ("phi", "starcoder2"):
        cfg["num_key_value_heads"] = a.kv_heads
    elif a.kv_heads != a.heads:
        raise Unsupported("kv_heads", f"{a.family} has as many key/value heads as query heads")
    if a.family == "starcoder2":
        cfg.update(norm_epsilon=a.eps, use_bias=a.qkv_bias, sliding_window=a.window, pad_token_id=a.padding, residual_dropout=0.0,
                   embedding_dropout=0.0)
    else:
        cfg.update(layer_norm_eps=a.eps)
    if a.family == "phi":
        if a.qk_norm not in ("none", "head") or (a.qk_norm == "head" and (a.qk_type, a.qk_bias, a.qk_eps, a.qk_offset, a.qk_affine, a.qk_late,
                                                                          a.qk_heads) != ("layernorm", True, a.eps, 0.0, True, False, False)):
            raise Unsupported("qk_norm", "Phi's qk-norms (qk_layernorm) are LayerNorms with a bias over each head's dims, shared by the heads, "
                              "before rotary, with the norms' eps")
        cfg.update(qk_layernorm=a.qk_norm == "head", pad_token_id=a.padding, resid_pdrop=0.0, embd_pdrop=0.0)
    if a.family == "gpt_neox":
        cfg.update(use_parallel_residual=a.parallel == "separate", attention_bias=a.qkv_bias, hidden_dropout=0.0)
    return cfg


# --- the config an engine of the expander families implies (export) -------------------------------

_EXPANDER_KINDS = (ir.Ssm, ir.Mamba1, ir.LatentAttention, ir.ShortConv)


def _layer_list(engine: ir.Engine, merges: tuple = (ir.PlainMerge, ir.CoolingMerge), post: bool = False) -> list[list[tuple[ir.Norm, object]]]:
    """Every layer (stage instance) as its branches' (norm, turbine) pairs; Unsupported where a layer is not
    (a branch merged otherwise than by `merges`)."""
    main = [op for op in engine.body if not isinstance(op, ir.Stage)]
    if len(main) != 1 or not isinstance(engine.body[-1], ir.Norm) or engine.body[-1].type != "rmsnorm":
        raise Unsupported("main line", "these families' decoders end with one rmsnorm on the main line, before the head")
    layers = []

    def walk(st: ir.Stage) -> None:  # the layers in the order they run: a nested stage's, group by group
        if st.is_group:
            for _ in range(st.repeat):
                for inner in st.ops:
                    walk(inner)
            return
        pairs = []
        for b in st.ops:
            if not isinstance(b, ir.Prechamber) or b.detach or b.overboard or not isinstance(b.merge, merges):
                raise Unsupported(f"stage {st.name}", "a layer of these families is plain residual branches (norm, turbine), nothing else")
            # post: A.X-K1's post_mlp_layernorm, a trailing rmsnorm (export's check then holds it to the MoE branches)
            ops = b.ops[:2] if post and len(b.ops) == 3 and isinstance(b.ops[2], ir.Norm) and b.ops[2].type == "rmsnorm" else b.ops
            if len(ops) != 2 or not isinstance(b.ops[0], ir.Norm) or b.ops[0].type != "rmsnorm":
                raise Unsupported(f"prechamber {b.name}", "each branch of these families is an rmsnorm, then its turbine")
            pairs.append((b.ops[0], b.ops[1]))
        layers.extend([pairs] * st.repeat)

    for st in (op for op in engine.body if isinstance(op, ir.Stage)):
        walk(st)
    if not layers:
        raise Unsupported("stages", "the engine has no layers")
    return layers


def _period(hits: list[int], layers: int, what: str) -> tuple[int, int]:
    """(period, offset) with i % period == offset exactly at `hits` among range(layers); Unsupported otherwise."""
    if not hits:
        return layers + 1, layers  # never
    if len(hits) == 1:
        return max(layers, hits[0] + 1), hits[0]
    period = hits[1] - hits[0]
    if period < 1 or hits[0] >= period or hits != list(range(hits[0], layers, period)):
        raise Unsupported(what, f"layers {hits} are not every k-th layer from an offset below k, which is all Jamba's config can say")
    return period, hits[0]


def _v3_named(name: str, config: dict) -> dict:
    """A DeepSeek-V3-shaped config as the family the engine is named after (`cyclec import` names it so): sarvam_mla
    (DeepSeek-V3's model under its own model_type) or glm4_moe_lite (its dense layers said by mlp_layer_types)."""
    if name == "sarvam_mla":
        return {**config, "model_type": "sarvam_mla", "architectures": [CAUSAL_LM["sarvam_mla"]]}
    if name in ("glm4_moe_lite", "axk1"):
        out = {k: v for k, v in config.items() if k not in ("first_k_dense_replace", "num_nextn_predict_layers")}
        dense = config["first_k_dense_replace"]
        return {**out, "model_type": name, "architectures": [CAUSAL_LM[name]],
                "mlp_layer_types": ["dense"] * dense + ["sparse"] * (config["num_hidden_layers"] - dense)}
    return config


def expander_config(engine: ir.Engine) -> dict | None:
    """The transformers config of an engine with an ssm or latent attention (mamba2, mamba, jamba,
    deepseek_v2), or None when it has none of them. Only the shape is read; export then checks,
    field by field, that importing the config gives back the engine. Unsupported says why not."""
    if _gemma4.owns(engine):  # Gemma 4's values normed or per-layer inputs (families_gemma4.py)
        return _gemma4.engine_config(engine)
    if _afmoe.owns(engine):  # attention gated per channel without gated DeltaNet: AFMoE (families_afmoe.py)
        return _afmoe.engine_config(engine)
    if _laguna.owns(engine):  # attention gated by a softplus: Laguna (families_laguna.py)
        return _laguna.engine_config(engine)
    ops = [o for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list() for o in b.ops]
    if any(isinstance(o, ir.LinearAttention) for o in ops):
        raise Unsupported("turbine linear_attention", "no transformers model family computes linear attention "
                          "(Katharopoulos et al.): there is no config to write it as")
    if any(isinstance(o, ir.GatedDelta) for o in ops):  # Qwen3-Next, Qwen3.5 (families_delta.py)
        return _delta.engine_config(engine)
    if not any(isinstance(o, _EXPANDER_KINDS) for o in ops):
        return None
    if _hybrid.is_parallel_hybrid(engine):  # Falcon-H1's block: a Mamba-2 ssm beside attention (families_hybrid.py)
        return _hybrid.engine_config(engine)
    latent = any(isinstance(o, ir.LatentAttention) for o in ops)  # MiniCPM3 scales its branches
    granite = any(isinstance(o, ir.Ssm) for o in ops) and any(isinstance(o, (ir.Attention, ir.Mlp, ir.Moe)) for o in ops)  # ... and GraniteMoeHybrid
    layers = _layer_list(engine, (ir.PlainMerge, ir.CoolingMerge, ir.ScaleMerge) if latent or granite else (ir.PlainMerge, ir.CoolingMerge),
                         post=latent and engine.name == "axk1" or any(isinstance(o, ir.ShortConv) for o in ops))  # LFM3's sandwich
    turbines = [t for layer in layers for _, t in layer]
    final = engine.body[-1]
    base = {"vocab_size": engine.feed.vocab, "hidden_size": engine.width, "num_hidden_layers": len(layers),
            "tie_word_embeddings": engine.nozzle.tied, "pad_token_id": engine.feed.padding}
    latent_dense = None if engine.nozzle.bias or engine.feed.position != "none" else _latent_dense_config(engine, layers, base)
    if latent_dense is not None:  # MiniCPM3, Youtu
        return latent_dense
    if engine.nozzle.bias or (engine.nozzle.scale != 1.0 or engine.feed.scale != 1.0) and not granite or engine.feed.position != "none":
        raise Unsupported("feed / nozzle", "these families have no positions table, no embedding or logit multiplier and no head bias")
    first = turbines[0]
    if all(len(layer) == 1 for layer in layers) and any(isinstance(t, ir.Ssm) for t in turbines) \
            and any(isinstance(t, (ir.Attention, ir.Mlp, ir.Moe)) for t in turbines):  # Nemotron-H: one mixer a layer (families_hybrid.py)
        return _hybrid.single_mixer_config(engine, layers, base)
    if all(len(layer) == 1 for layer in layers) and isinstance(first, ir.Ssm):
        s = first
        lo_hi = {} if (s.dt_lo, s.dt_hi) == (0.0, None) else {"time_step_limit": [s.dt_lo, s.dt_hi if s.dt_hi is not None else float("inf")]}
        if s.inner % engine.width:
            raise Unsupported("expand", f"Mamba-2's config says expand as a whole number; the inner width {s.inner} is not a multiple of {engine.width}")
        return {"model_type": "mamba2", "architectures": [CAUSAL_LM["mamba2"]], **base, "num_heads": s.heads, "head_dim": s.head_dim,
                "expand": s.inner // engine.width, "state_size": s.state, "n_groups": s.groups, "conv_kernel": s.conv, "chunk_size": s.chunk,
                "use_bias": s.bias, "use_conv_bias": s.conv_bias, "layer_norm_epsilon": final.eps, "time_step_min": s.dt_min,
                "time_step_max": s.dt_max, "rms_norm": True, "hidden_act": "silu", "max_position_embeddings": engine.feed.context, **lo_hi}
    mixers = [layer[0][1] for layer in layers]
    if all(len(layer) == 1 for layer in layers) and isinstance(first, ir.Mamba1) and first.norms and not first.norms_affine:
        return {"model_type": "falcon_mamba", "architectures": [CAUSAL_LM["falcon_mamba"]], **_mamba1_config(first, engine.width, ""), **base,
                "layer_norm_epsilon": final.eps, "max_position_embeddings": engine.feed.context, "mixer_rms_eps": first.eps}
    if all(len(layer) == 1 for layer in layers) and isinstance(first, ir.Mamba1):
        return {"model_type": "mamba", "architectures": [CAUSAL_LM["mamba"]], **_mamba1_config(first, engine.width, ""), **base,
                "layer_norm_epsilon": final.eps, "max_position_embeddings": engine.feed.context}
    if not all(len(layer) == 2 for layer in layers):
        raise Unsupported("stages", "a Jamba or DeepSeek-V2 layer is a mixer branch, then an MLP branch")
    reactors = [layer[1][1] for layer in layers]
    moes = [r for r in reactors if isinstance(r, ir.Moe)]
    mlps = [r for r in reactors if isinstance(r, ir.Mlp)]
    moe, mlp = (moes or [None])[0], (mlps or [None])[0]
    common = {"hidden_act": "silu", "rms_norm_eps": final.eps, "max_position_embeddings": engine.feed.context}
    if any(isinstance(m, ir.ShortConv) for m in mixers):  # LFM2's short convs among attention layers
        return _conv.engine_config(engine, layers, base, common)
    if any(isinstance(m, ir.Ssm) for m in mixers):  # Mamba-2 mixers among attention layers
        return _hybrid_config(engine, layers, base, common)
    if isinstance(first, ir.LatentAttention):
        a = first
        dense = next((i for i, r in enumerate(reactors) if isinstance(r, ir.Moe)), len(layers))
        if moe is not None and moe.router == "sigmoid":  # DeepSeek-V3's router; export's check then holds every other option
            return _v3_named(engine.name, {"model_type": "deepseek_v3", "architectures": [CAUSAL_LM["deepseek_v3"]], **base, **common,
                    "num_attention_heads": a.heads, "num_key_value_heads": a.heads, "q_lora_rank": a.q_latent, "kv_lora_rank": a.latent,
                    "qk_nope_head_dim": a.head_dim, "qk_rope_head_dim": a.rotary_dims, "v_head_dim": a.v_dim, "attention_bias": a.bias,
                    "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}, "first_k_dense_replace": dense,
                    "intermediate_size": mlp.hidden if mlp else moe.hidden, "moe_intermediate_size": moe.hidden,
                    "n_routed_experts": moe.experts, "num_experts_per_tok": moe.top, "n_shared_experts": _shared_experts(moe),
                    "norm_topk_prob": moe.normalize, "routed_scaling_factor": moe.scale, "n_group": moe.groups, "topk_group": moe.top_groups,
                    "rope_interleave": True, "num_nextn_predict_layers": 0})
        grouped = moe is not None and moe.groups > 1
        return {"model_type": "deepseek_v2", "architectures": [CAUSAL_LM["deepseek_v2"]], **base, **common,
                "num_attention_heads": a.heads, "num_key_value_heads": a.heads, "q_lora_rank": a.q_latent, "kv_lora_rank": a.latent,
                "qk_nope_head_dim": a.head_dim, "qk_rope_head_dim": a.rotary_dims, "v_head_dim": a.v_dim, "attention_bias": a.bias,
                "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}, "first_k_dense_replace": dense,
                "intermediate_size": mlp.hidden if mlp else (moe.hidden if moe else 1), "moe_intermediate_size": moe.hidden if moe else 1,
                "n_routed_experts": moe.experts if moe else 1, "num_experts_per_tok": moe.top if moe else 1,
                "n_shared_experts": _shared_experts(moe) if moe else 1,
                "norm_topk_prob": False, "routed_scaling_factor": moe.scale if moe else 1.0, "mlp_bias": False,
                "topk_method": "group_limited_greedy" if grouped else "greedy", **({"n_group": moe.groups, "topk_group": moe.top_groups} if grouped else {})}
    ssm = next((m for m in mixers if isinstance(m, ir.Mamba1)), None)
    attn = next((m for m in mixers if isinstance(m, ir.Attention)), None)
    if ssm is None:
        raise Unsupported("stages", "an engine of attention and MLP layers is not one of these families")
    ap, ao = _period([i for i, m in enumerate(mixers) if isinstance(m, ir.Attention)], len(layers), "attention layers")
    ep, eo = _period([i for i, r in enumerate(reactors) if isinstance(r, ir.Moe)], len(layers), "expert layers")
    return {"model_type": "jamba", "architectures": [CAUSAL_LM["jamba"]], **base, **common, **_mamba1_config(ssm, engine.width, "mamba_"),
            "num_attention_heads": attn.heads if attn else 1, "num_key_value_heads": attn.kv_heads if attn else 1,
            "intermediate_size": (mlp or moe).hidden, "num_experts": moe.experts if moe else 1, "num_experts_per_tok": moe.top if moe else 1,
            "attn_layer_period": ap, "attn_layer_offset": ao, "expert_layer_period": ep, "expert_layer_offset": eo,
            "rms_norm_eps": ssm.eps if ssm.norms else final.eps, "use_mamba_kernels": False}


def _mamba1_config(s: ir.Mamba1, width: int, prefix: str) -> dict:
    if s.inner % width:
        raise Unsupported("expand", f"the config says expand as a whole number; the inner width {s.inner} is not a multiple of {width}")
    if prefix:  # Jamba's names
        return {"mamba_d_state": s.state, "mamba_d_conv": s.conv, "mamba_expand": s.inner // width, "mamba_dt_rank": s.dt_rank,
                "mamba_conv_bias": s.conv_bias, "mamba_proj_bias": s.bias}
    return {"state_size": s.state, "conv_kernel": s.conv, "expand": s.inner // width, "time_step_rank": s.dt_rank, "use_bias": s.bias,
            "use_conv_bias": s.conv_bias, "hidden_act": "silu", "time_step_min": s.dt_min, "time_step_max": s.dt_max}


def _shared_experts(m: ir.Moe) -> int:
    """DeepSeekMoE's shared expert is n_shared_experts x moe_intermediate_size wide."""
    if not m.shared or m.shared % m.hidden or m.shared_gate:
        raise Unsupported("shared", f"DeepSeek-V2's shared expert is an ungated whole multiple of the experts' width {m.hidden}, not "
                          + ("a gated one" if m.shared_gate else f"{m.shared} wide"))
    return m.shared // m.hidden
