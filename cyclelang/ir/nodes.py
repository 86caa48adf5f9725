"""The IR's nodes: frozen models, the contract between the front end and every back-end.

By the time a back-end sees these models, everything is resolved: `let` constants
are numbers, templates are expanded, includes are read, and every default is
explicit (an attention's mask follows the engine's throat, a cooling merge knows
its std, a deepnorm merge knows its alpha and beta). Back-ends never guess.

What the user asked for and what was derived are separate fields: a cooling
merge's `base_asked` is the `std=` the spec wrote (None: none was written), its
`base`, `merges` and `std` are derived by `passes.finalize_merges` from the whole
engine. A derived field is None only before that pass has run; an `Engine` refuses
to be built with one missing, or with one that disagrees with its formula.

Every invariant the resolver checks holds for any IR, however it was made: each
model validates itself on construction (names are identifiers, numbers are finite
and in range, kv_heads divides heads, widths meet at every merge, ...), so
`Spec.model_validate` of hostile JSON is refused, and `validate(spec)` re-checks a
tree that passes edited with `model_copy` (which skips validation).

All models are frozen and reject unknown fields. Node variants are discriminated
unions on `op` (main-line and branch operations) or `kind` (merges). Every node
carries its source span, which is left out of the JSON dump so that dumps are
stable across file locations.

Repeated stages stay folded (`Stage.repeat`): the diagram draws one block with a
xN badge and the PyTorch back-end builds one class with N instances. A stage may
hold stages instead of ops (a nested stage, `stage group x 4 { stage ssm x 3 {...}
stage attn {...} }`): a group is a pure container, its instances are its children's
instances in order, and `leaf_stages` lists the stages that hold ops with how many
times each runs in all.
"""

from __future__ import annotations

import ast as pyast
import math
import re
from typing import Annotated, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.json_schema import SkipJsonSchema

IR_VERSION = 2  # 2: merges keep what was asked (`*_asked`) apart from what was derived

__all__ = [
    "IR_VERSION", "IRError", "Span", "Node", "NormType", "Norm", "Activation", "Mask", "Attention", "Mlp", "Moe", "Pool", "Linear", "Conv",
    "Ssm", "Mamba1", "LinearAttention", "FeatureMap", "LatentAttention", "RotaryScaling", "GatedDelta", "ShortConv",
    "Turbine", "TURBINE_TYPES", "OP_TYPES", "BranchOp", "PlainMerge", "ScaleMerge", "CoolingMerge", "RezeroMerge", "LayerscaleMerge",
    "DeepnormMerge", "GateMerge", "HyperMerge", "Connections", "chamber_streams", "Merge", "MERGE_TYPES", "Prechamber", "Fullflow", "StageOp", "Stage", "MainOp", "Position", "Feed",
    "Nozzle", "Schedule", "Init", "Param", "Router", "GroupScore", "ROUTERS", "GROUP_SCORES", "STANDARD", "Startup", "Let", "formula_names", "Engine", "Spec", "out_width", "validate",
    "MAX_STAGE_DEPTH", "MAX_LAYERS", "MAX_REPEATED_STAGES", "leaf_stages", "repeated_stages",
]

MAX_STAGE_DEPTH = 4  # stages nest at most 4 deep: engine > stage > stage > stage > stage
MAX_LAYERS = 100_000  # stage instances in all, nested repeats multiplied out (a built model's layer count)
# stages with a repeat count of their own (a Config field each): the generated source indexes a stage by the sum of
# the counts before it, so its size grows with their square; 256 is far past any published architecture
MAX_REPEATED_STAGES = 256

# Every name in the IR is a Python identifier in ASCII, as the grammar's NAME is:
# nothing a name holds can close a string, start a line or reach a path.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")

Count = Annotated[int, Field(ge=1, le=2**62)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]  # a dropout probability


class IRError(ValueError):
    """An IR that breaks an invariant; `where` names the node."""

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


def _name(value: str | None, what: str) -> None:
    if value is not None and not NAME.match(value):
        raise ValueError(f"{what} {value!r} is not an identifier (letters, digits and _, not starting with a digit)")


class Span(BaseModel):
    """Where a node came from: 1-based line and column, end exclusive."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    span: SkipJsonSchema[Span | None] = Field(default=None, exclude=True, repr=False)
    # Provenance like the span, and like it out of the dump: the options of this node that the
    # spec wrote as a `let`'s name, (option, let) pairs (`heads=heads`, a stage's `x depth` is
    # ("repeat", "depth")); back-ends name what they make after them (the torch Config's fields).
    let_names: SkipJsonSchema[tuple[tuple[str, str], ...]] = Field(default=(), exclude=True, repr=False)

    def let_of(self, option: str) -> str | None:
        """The let the spec wrote this option with, or None (a number, or an expression)."""
        return next((let for o, let in self.let_names if o == option), None)

    def check(self) -> None:
        """This node's own invariants (its children check theirs); raises ValueError. A class
        that has some says so with `_checked = checked()`, so the others pay nothing."""


def _run_check(cls, value, handler):
    if isinstance(value, cls):
        return value  # built (and checked) already: a parent does not check its children again
    node = handler(value)
    node.check()
    return node


def checked():
    """The model validator that runs `check` when a node is built from data."""
    return model_validator(mode="wrap")(classmethod(_run_check))


# --- valves ------------------------------------------------------------------

NormType = Literal["layernorm", "rmsnorm", "scalar"]  # scalar: no normalisation, a fixed gain held as a buffer (Gemma 4's layer_scalar)


class Norm(Node):
    """A normalisation: a valve. On a branch it is an injector pressure drop (Pre-LN);
    at stage or engine level it sits in series on the main line (Post-LN, final norm)."""

    op: Literal["norm"] = "norm"
    type: NormType
    width: Count
    eps: Positive
    bias: bool  # layernorm only; rmsnorm never has one
    affine: bool = True  # a learned gain (and bias); false: normalise only (OLMo's weightless layernorm)
    offset: Finite = 0.0  # the gain is offset + w (Gemma's rmsnorm, Nemotron's layernorm: 1, with w starting at 0)

    _checked = checked()

    def check(self) -> None:
        if self.type == "rmsnorm" and self.bias:
            raise ValueError("an rmsnorm has no bias")
        if self.type == "scalar" and (self.bias or self.affine or self.offset):
            raise ValueError("a scalar gain normalises nothing and learns nothing: no bias, affine or offset")
        if not self.affine and (self.bias or self.offset):
            raise ValueError("a norm without a learned gain has no bias and no offset")


# --- turbines: the work done on a split-off flow -------------------------------

Activation = Literal["gelu", "gelu_tanh", "relu", "relu2", "silu", "swiglu", "geglu", "geglu_tanh",
                     "swiglu_clamp"]  # relu2: relu(x)^2 (So et al. 2021, Primer); swiglu_clamp: gpt-oss's, gate·σ(1.702·gate)·(up + 1), clamped
Router = Literal["softmax", "sigmoid"]  # an MoE router's scores: softmax over the experts (Mixtral), or each expert's sigmoid (DeepSeek-V3)
GroupScore = Literal["top2", "max"]  # a group of experts' score: the sum of its two best (DeepSeek-V3), or its best (DeepSeek-V2)
ROUTERS, GROUP_SCORES = get_args(Router), get_args(GroupScore)  # the options' choice lists read these
Mask = Literal["causal", "open"]
GATED = ("swiglu", "geglu", "geglu_tanh", "swiglu_clamp")  # a gated unit: act(gate) * up, with a fused [gate | up] projection
GATE_SCALED = ("swiglu", "geglu", "geglu_tanh")  # the gated acts whose gate `gate_scale` multiplies (not swiglu_clamp's)
ScalingType = Literal["linear", "dynamic", "llama3", "yarn"]


class RotaryScaling(Node):
    """Rotary positions stretched past the pretraining context, as transformers' rope_utils
    computes them: `linear` divides every frequency by `factor` (position interpolation);
    `dynamic` (NTK) raises the base once a sequence passes `original` positions, by how far
    it passed; `llama3` divides the low frequencies by `factor`, keeps the high ones and
    blends between (`low`, `high`: low_freq_factor, high_freq_factor); `yarn` blends
    interpolated and extrapolated frequencies by each one's rotations over `original`
    positions (`beta_fast`, `beta_slow`) and scales cos and sin by `attention_factor`."""

    type: ScalingType
    factor: Positive
    original: Count | None = None  # the pretraining context (original_max_position_embeddings); linear: None
    low: Positive = 1.0  # llama3's low_freq_factor
    high: Positive = 4.0  # llama3's high_freq_factor
    beta_fast: Positive = 32.0  # yarn
    beta_slow: Positive = 1.0  # yarn
    attention_factor: Positive | None = None  # yarn: the cos/sin gain; None: 0.1 ln(factor) + 1
    truncate: bool = True  # yarn: the blend's dims rounded out to whole ones (floor, ceil); false: as computed (gpt-oss)

    _checked = checked()

    def check(self) -> None:
        if (self.type == "linear") != (self.original is None):
            raise ValueError("linear rotary scaling has no original context; dynamic, llama3 and yarn need one")
        if not self.truncate and self.type != "yarn":
            raise ValueError("truncate says how yarn rounds its blend's range; only yarn scaling has one")
        if self.type == "llama3" and self.high <= self.low:
            raise ValueError(f"llama3 rotary scaling needs high ({self.high:g}) above low ({self.low:g})")

    def gain(self) -> float:
        """The factor cos and sin are multiplied by (yarn's mscale; 1 for the others)."""
        if self.type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0


class Attention(Node):
    """The injector: the only operator that mixes positions."""

    op: Literal["attention"] = "attention"
    width: Count
    heads: Count
    kv_heads: Count  # == heads: multi-head; 1: MQA; in between: GQA (injector baffles)
    head_dim: Count
    mask: Mask  # follows the engine's throat unless the spec says otherwise
    window: Count | None  # sliding-window size in tokens, None for full attention
    rotary_dims: Annotated[int, Field(ge=0)]  # how many dims of each head are rotated (even); 0: no rotary
    rotary_base: Positive
    qk_norm: bool
    bias: bool  # the q, k, v projections' biases
    out_bias: bool  # the output projection's bias (Qwen2: q, k, v biased, the output not); omitted: as bias
    dropout: Rate
    qk_norm_eps: Positive = 1e-6  # the qk-norms' eps (Qwen3, OLMo-2: the config's rms_norm_eps)
    qk_norm_across: bool = False  # one qk-norm over all heads' q (and one over k), as OLMo-2; false: per head (Qwen3)
    qk_norm_type: NormType = "rmsnorm"  # layernorm: Persimmon's per-head LayerNorms
    qk_norm_bias: bool = False  # the qk layernorms' learned shift (Persimmon); layernorm only
    qk_norm_offset: Finite = 0.0  # the qk-norms' gain is offset + w (Gemma 3: 1, w starting at 0)
    qk_norm_affine: bool = True  # a learned gain; false: normalise only (nanochat)
    qk_norm_after_rotary: bool = False  # the qk-norms act on the rotated q and k (nanochat); false: before rotary (Qwen3)
    qk_norm_head_gains: bool = False  # each head its own qk-norm gain (and bias): StableLM, Cohere; false: one shared by the heads
    scale: Positive | None = None  # the attention logits' scale; None: 1 / sqrt(head_dim)
    rotary_interleaved: bool = False  # rotate pairs (0, 1), (2, 3), ... (GPT-J); false: the two halves (GPT-NeoX, Llama)
    rotary_scaling: RotaryScaling | None = None  # rotary stretched past the pretraining context; None: plain rotary
    softcap: Positive | None = None  # the logits pass through cap * tanh(s / cap) before the mask (Gemma 2); None: none
    alibi: bool = False  # ALiBi: each head's scores get -slope * distance (Press et al.; BLOOM, MPT, Falcon)
    alibi_scaled: bool = False  # the ALiBi bias is multiplied by the logits' scale too (Falcon); false: added after it (BLOOM, MPT)
    sinks: bool = False  # a learned logit per head joins every softmax's denominator (gpt-oss's attention sinks)
    # an output gate before the output projection, y * sigmoid(W_g x) (Qwen3-Next, Qwen3.5): one per channel of every head,
    # or one per head; "none": no gate
    gate: Literal["none", "channel", "head"] = Field("none", exclude_if=lambda v: v == "none")  # out of the dump when none: older IR stays as it was
    gate_act: Literal["sigmoid", "softplus"] = Field("sigmoid", exclude_if=lambda v: v == "sigmoid")  # the gate's function (Laguna: softplus)
    # Gemma 4's attention
    rotary_spread: bool = False  # rotated pairs (i, i + head_dim/2), i < rotary_dims/2, at base^(-2i/head_dim) (proportional rope); false: the first rotary_dims dims
    v_norm: bool = False  # a weightless RMSNorm over each head's values (eps qk_norm_eps)
    k_eq_v: bool = False  # the values are the key projection's output (before the k-norm and rotary): no value projection
    kv_store: Annotated[int, Field(ge=1)] | None = None  # KV sharing: its keys and values (the cached past included) go to this slot
    kv_reuse: Annotated[int, Field(ge=1)] | None = None  # KV sharing: it reads the slot's keys and values, no projections or cache of its own

    _checked = checked()

    @model_validator(mode="before")
    @classmethod
    def _out_bias_follows_bias(cls, data):
        if isinstance(data, dict) and "out_bias" not in data and "bias" in data:
            data = {**data, "out_bias": data["bias"]}
        return data

    def check(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} does not divide heads={self.heads}")
        if self.rotary_dims % 2 or self.rotary_dims > self.head_dim:
            raise ValueError(f"rotary_dims={self.rotary_dims} must be even and at most head_dim={self.head_dim}")
        if self.window is not None and self.mask != "causal":
            raise ValueError("a sliding window is defined for causal attention only")
        if self.rotary_scaling is not None and not self.rotary_dims:
            raise ValueError("rotary scaling needs rotary positions")
        if self.alibi_scaled and not self.alibi:
            raise ValueError("alibi_scaled says how ALiBi is scaled, but alibi is off")
        if self.gate_act != "sigmoid" and self.gate == "none":
            raise ValueError("gate_act is the output gate's function, but there is no gate")
        shaped = (self.qk_norm_across, self.qk_norm_type != "rmsnorm", self.qk_norm_bias, self.qk_norm_offset, not self.qk_norm_affine,
                  self.qk_norm_after_rotary, self.qk_norm_head_gains)
        if not self.qk_norm and any(shaped):
            raise ValueError("the qk-norm's options describe a qk-norm, but qk_norm is off")
        if self.qk_norm_bias and self.qk_norm_type != "layernorm":
            raise ValueError("a qk rmsnorm has no bias")
        if not self.qk_norm_affine and (self.qk_norm_bias or self.qk_norm_offset):
            raise ValueError("a qk-norm without a learned gain has no bias and no offset")
        if self.qk_norm_across and self.qk_norm_after_rotary:
            raise ValueError("a qk-norm across heads acts before the heads split, so before rotary")
        if self.qk_norm_head_gains and (self.qk_norm_across or not self.qk_norm_affine):
            raise ValueError("a gain per head needs a learned gain on each head's own norm (not across heads)")
        if self.kv_reuse is not None and (self.kv_store is not None or self.k_eq_v or self.v_norm):
            raise ValueError("an attention that reads another's keys and values stores none, and has no keys or values to tie or norm")
        if self.rotary_spread and (not self.rotary_dims or self.rotary_interleaved or self.head_dim % 2):
            raise ValueError("rotary_spread spreads rotary pairs over the two halves of an even head: it needs rotary, not interleaved")


class Mlp(Node):
    """Combustion: a position-wise reaction, no mixing between positions."""

    op: Literal["mlp"] = "mlp"
    width: Count
    hidden: Count
    act: Activation
    bias: bool
    dropout: Rate
    clamp: Positive = 7.0  # swiglu_clamp: gate <= clamp, |up| <= clamp (gpt-oss's swiglu_limit); other activations ignore it
    gate_scale: Finite = 1.0  # a gated MLP's gate is act(gate_scale * gate(x)) (Falcon-H1's mlp_multipliers[0]); 1: none
    per_layer: bool = False  # Gemma 4: act(gate x) times this layer's per-layer input (the feed's per_layer), then down; hidden = its width

    _checked = checked()

    def check(self) -> None:
        if self.clamp != 7.0 and self.act != "swiglu_clamp":
            raise ValueError("clamp bounds swiglu_clamp's gate and up, but the activation is another")
        if self.gate_scale != 1.0 and self.act not in GATE_SCALED:
            raise ValueError("gate_scale scales a gated MLP's gate; this MLP has none (act is not swiglu or geglu)")
        if self.per_layer and self.act in GATED:
            raise ValueError("a per-layer mlp is gated by the per-layer input: its act is a plain one")


class Moe(Node):
    """Hard-routed experts: liquid-liquid injection. `capacity` is the restrictor
    orifice (tokens per expert relative to an even share), `balance` the mixture trim
    (weight of the load-balancing auxiliary loss)."""

    op: Literal["moe"] = "moe"
    width: Count
    hidden: Count
    experts: Count
    top: Count
    capacity: Positive | None  # None: no token dropping
    balance: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]  # 0.0: no balancing loss
    act: Activation
    bias: bool
    normalize: bool = True  # the top-k routing weights are renormalised to sum to 1 (Mixtral, for every k)
    shared: Annotated[int, Field(ge=0)] = 0  # hidden width of a shared expert every token visits (Qwen2-MoE); 0: none
    shared_gate: bool = False  # the shared expert's output is scaled by sigmoid(w . x) (Qwen2-MoE)
    # DeepSeek-V3 routing (softmax, 1 group, scale 1, no correction: Mixtral's)
    router: Router = "softmax"  # the scores the top-k picks from, and the chosen weights come from
    groups: Count = 1  # the experts in this many equal groups (n_group) ...
    top_groups: Count = 1  # ... of which each token keeps its best (topk_group) and picks its top experts there
    group_score: GroupScore = "top2"  # how a group is scored, on the selection scores
    scale: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 1.0  # the chosen weights x this (routed_scaling_factor)
    correction: bool = False  # a per-expert bias added to the scores for the selection only (a buffer, e_score_correction_bias)
    correction_rate: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0  # each training forward: b += rate * sign(mean load - load)
    router_bias: bool = False  # the router's linear has a bias (gpt-oss), which, unlike correction, reaches the weights
    clamp: Positive = 7.0  # the experts' swiglu_clamp bound (gpt-oss's swiglu_limit); other activations ignore it

    _checked = checked()

    def check(self) -> None:
        if self.top > self.experts:
            raise ValueError(f"top={self.top} routes to more experts than the {self.experts} there are")
        if self.shared_gate and not self.shared:
            raise ValueError("a shared-expert gate needs a shared expert (shared=N)")
        if self.experts % self.groups:
            raise ValueError(f"{self.experts} experts do not split into {self.groups} equal groups")
        if self.top_groups > self.groups:
            raise ValueError(f"top_groups={self.top_groups} keeps more groups than the {self.groups} there are")
        if self.top > self.top_groups * (self.experts // self.groups):
            raise ValueError(f"top={self.top} routes to more experts than the {self.top_groups} kept groups of {self.experts // self.groups} hold")
        if self.group_score == "top2" and self.groups > 1 and self.experts // self.groups < 2:
            raise ValueError("group_score=top2 sums a group's two best scores: each group needs at least 2 experts")
        if self.correction_rate and not self.correction:
            raise ValueError("correction_rate updates the correction bias, but there is none (correction=true)")
        if self.router == "sigmoid" and self.balance:
            raise ValueError("balance= is the Switch loss over softmax probabilities; sigmoid scores do not sum to 1 (use correction_rate=)")
        if self.clamp != 7.0 and self.act != "swiglu_clamp":
            raise ValueError("clamp bounds swiglu_clamp's gate and up, but the experts' activation is another")

    @property
    def deepseek(self) -> bool:
        """Whether it routes otherwise than Mixtral's softmax top-k (the router's extra options)."""
        return self.router != "softmax" or self.groups > 1 or self.scale != 1.0 or self.correction


class Pool(Node):
    """MetaFormer's pooling mixer: average over a window of positions, minus the input."""

    op: Literal["pool"] = "pool"
    width: Count
    size: Count
    causal: bool  # only past positions are pooled


class Linear(Node):
    """A single projection; a narrow one is a throat that caps the flow."""

    op: Literal["linear"] = "linear"
    width: Count
    out: Count
    bias: bool


class Conv(Node):
    """A depthwise convolution over positions: each channel mixes its own last `size`
    positions (centred on each one with an open throat), as the short convolutions of
    H3, Hyena and Mamba do. A mixer with a bounded state: decoding keeps size - 1 inputs."""

    op: Literal["conv"] = "conv"
    width: Count
    size: Count
    bias: bool
    causal: bool  # follows the engine's throat: only the past is mixed


class ShortConv(Node):
    """A short gated convolution (LFM2's ShortConv; the order-2 gate of H3 and Hyena):
    in_proj to B, C and x (each `width` wide), the depthwise convolution of B * x over
    its own last `size` positions (centred on each one with an open throat), C times its
    output, out_proj. `bias` is on all three (LFM2's conv_bias). A mixer with a bounded
    state: decoding keeps the last size - 1 values of B * x."""

    op: Literal["short_conv"] = "short_conv"
    width: Count
    size: Count
    bias: bool
    causal: bool  # follows the engine's throat: only the past is mixed


class Ssm(Node):
    """A selective state-space mixer (Mamba-2, Dao & Gu 2024), as transformers' Mamba2Mixer:
    in_proj to a gate z, the conv input (x, B, C) and a step size dt per head; a depthwise
    causal conv with silu; the selective scan h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,
    y_t = h_t C_t + D x_t per head; a gated RMSNorm (of y * silu(z), per group); out_proj.
    Positions interact through the state only: a regenerative cooling jacket that carries
    heat along the chamber. Decoding keeps the conv window and the state, whatever the length."""

    op: Literal["ssm"] = "ssm"
    width: Count
    heads: Count
    head_dim: Count  # heads x head_dim is the inner width (Mamba's expand x width)
    state: Count  # N: the state size of each head
    groups: Count  # heads share B and C in groups (like GQA's kv_heads); the gated norm is per group
    conv: Count  # kernel of the depthwise causal convolution
    chunk: Count  # positions per chunk of the training scan
    bias: bool  # in_proj and out_proj
    conv_bias: bool
    eps: Positive  # of the gated RMSNorm
    dt_min: Positive  # the range dt's bias is initialised in (log-uniform)
    dt_max: Positive
    dt_lo: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]  # dt is clamped to [dt_lo, dt_hi]
    dt_hi: Positive | None  # None: no upper limit
    # how y meets the gate z: gated, rmsnorm(y * silu(z)) (Mamba-2); before_gate, rmsnorm(y) * silu(z); none, y * silu(z)
    # unnormalised, no gain (Falcon-H1's mamba_norm_before_gate, mamba_rms_norm false)
    out_norm: Literal["gated", "before_gate", "none"] = "gated"
    scales: tuple[Finite, Finite, Finite, Finite, Finite] = (1.0, 1.0, 1.0, 1.0, 1.0)  # in_proj's rows z, x, B, C, dt times these (Falcon-H1's ssm_multipliers)

    _checked = checked()

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state  # the channels the conv mixes: x, B, C

    def check(self) -> None:
        if self.heads % self.groups:
            raise ValueError(f"groups={self.groups} does not divide heads={self.heads}")
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min={self.dt_min} is above dt_max={self.dt_max}")
        if self.dt_hi is not None and self.dt_hi <= self.dt_lo:
            raise ValueError(f"dt_hi={self.dt_hi} must be above dt_lo={self.dt_lo}")


class Mamba1(Node):
    """A selective state-space mixer of the first kind (Mamba, Gu & Dao 2023), as transformers'
    MambaMixer and JambaMambaMixer: in_proj to the scan's input x and a gate z; a depthwise
    causal conv with silu; x_proj to a low-rank step dt and B, C (Jamba: each RMS-normalised);
    dt_proj to a step per channel; the selective scan h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T
    per channel (A: inner x state, so every channel decays each state dim at its own rate),
    y_t = h_t C_t + D x_t; y * silu(z); out_proj. `turbine ssm version=1`. Decoding keeps
    the conv window and the inner x state values of h, whatever the length."""

    op: Literal["mamba1"] = "mamba1"
    width: Count
    inner: Count  # expand x width: the channels the conv and the scan run over
    state: Count  # N: the state size of each channel
    dt_rank: Count  # the low-rank step projection's width (Mamba: ceil(width / 16))
    conv: Count  # kernel of the depthwise causal convolution
    chunk: Count  # positions per chunk of the training scan
    bias: bool  # in_proj and out_proj
    conv_bias: bool
    norms: bool  # RMSNorms on dt, B and C before they are used (Jamba)
    eps: Positive  # of those norms
    norms_affine: bool = True  # false: those norms have no weight (Falcon-Mamba's)
    dt_min: Positive  # the range dt's bias is initialised in (log-uniform)
    dt_max: Positive

    _checked = checked()

    def check(self) -> None:
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min={self.dt_min} is above dt_max={self.dt_max}")


FeatureMap = Literal["elu", "relu"]  # elu: elu(x) + 1 (Katharopoulos et al. 2020); relu


class LinearAttention(Node):
    """Linear attention (Katharopoulos et al. 2020): softmax(q k^T) replaced by a positive
    feature map phi, so y_t = phi(q_t) S_t / phi(q_t) z_t with S_t = g S_{t-1} + phi(k_t)^T v_t
    and z_t = g z_{t-1} + phi(k_t). g = 1 is the paper; `decay` gives each head RetNet's
    g = 1 - 2^(-5 - h). The state S is heads x head_dim x head_dim: it stops growing."""

    op: Literal["linear_attention"] = "linear_attention"
    width: Count
    heads: Count
    head_dim: Count
    feature: FeatureMap
    normalize: bool  # divide by phi(q) z (the paper); off: the plain sum, as retention does
    decay: bool  # RetNet's fixed per-head decay (causal only)
    chunk: Count  # positions per chunk of the training form
    bias: bool
    causal: bool  # follows the engine's throat

    _checked = checked()

    def check(self) -> None:
        if self.decay and not self.causal:
            raise ValueError("a decay is defined for causal linear attention only")


class LatentAttention(Node):
    """Multi-head latent attention (MLA, DeepSeek-V2 2024): keys and values come from one
    low-rank latent per position (`latent` wide, RMS-normalised), so decoding caches the
    latent and one shared rotary key (latent + rotary_dims values per token), not
    heads x head_dim x 2. Queries may pass through a latent of their own (`q_latent`).
    Positions are decoupled: each head's key is [k_nope from the latent | a rotary key of
    rotary_dims shared by all heads], its query [q_nope | q_rope]; rotary in adjacent pairs."""

    op: Literal["latent_attention"] = "latent_attention"
    width: Count
    heads: Count
    head_dim: Count  # the unrotated part of each head's query and key (qk_nope_head_dim)
    rotary_dims: Annotated[int, Field(ge=2)]  # the decoupled rotary part (qk_rope_head_dim), even
    v_dim: Count  # each head's value width
    latent: Count  # the KV latent's width (kv_lora_rank): what the cache keeps
    q_latent: Count | None  # the query latent's width (q_lora_rank); None: a full-rank query projection
    rotary_base: Positive
    eps: Positive  # of the latents' RMSNorms
    bias: bool  # on the down projections and the output (attention_bias); the up projections have none
    mask: Mask

    _checked = checked()

    def check(self) -> None:
        if self.rotary_dims % 2:
            raise ValueError(f"rotary_dims={self.rotary_dims} must be even")


class GatedDelta(Node):
    """Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024), as transformers' Qwen3NextGatedDeltaNet:
    projections to q, k (k_heads x head_dim), v (heads x v_dim), a gate z (heads x v_dim), and
    per value head b and a; a short depthwise causal conv with silu over [q | k | v]; q and k
    L2-normalised (q then scaled by head_dim^-1/2); per value head the gated delta rule
        S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t
    with g_t = -exp(A_log) softplus(a_t + dt_bias) and beta_t = sigmoid(b_t); each group of
    heads / k_heads value heads reads one key head; a gated RMSNorm per head, norm(o) * silu(z);
    out_proj. `turbine delta`. Causal only: decoding keeps the conv window and S (heads x
    head_dim x v_dim), whatever the length."""

    op: Literal["gated_delta"] = "gated_delta"
    width: Count
    heads: Count  # value heads (num_v_heads): each its own state, decay and write strength
    k_heads: Count  # query/key heads (num_k_heads); divides heads
    head_dim: Count  # each query/key head's width (linear_key_head_dim)
    v_dim: Count  # each value head's width (linear_value_head_dim)
    conv: Count  # kernel of the short depthwise causal conv
    chunk: Count  # positions per chunk of the training form
    eps: Positive  # of the gated RMSNorm
    negative_eigenvalues: bool = False  # beta = 2 sigmoid(b), in (0, 2) (OLMo Hybrid's allow_neg_eigval); false: sigmoid(b)

    _checked = checked()

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.heads * self.v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim  # the conv mixes q, k and v

    def check(self) -> None:
        if self.heads % self.k_heads:
            raise ValueError(f"k_heads={self.k_heads} does not divide heads={self.heads}")


# The one list of turbine kinds: every union below is built from it, so a new kind is
# added here (and given its record in kinds.py), nowhere else in the IR.
TURBINE_TYPES = (Attention, LatentAttention, Mlp, Moe, Pool, Conv, Ssm, LinearAttention, Linear, Mamba1, GatedDelta, ShortConv)
OP_TYPES = (Norm, *TURBINE_TYPES)

Turbine = Annotated[Union[TURBINE_TYPES], Field(discriminator="op")]
BranchOp = Annotated[Union[OP_TYPES], Field(discriminator="op")]


# --- merges: how a branch's exhaust returns to the chamber ---------------------


class PlainMerge(Node):
    kind: Literal["plain"] = "plain"


class ScaleMerge(Node):
    kind: Literal["scale"] = "scale"
    value: Finite


class CoolingMerge(Node):
    """Output projections start at std / sqrt(merges): a rich, cool preburner."""

    kind: Literal["cooling"] = "cooling"
    base_asked: Positive | None = None  # `merge cooling std=`; None: the startup's init std
    base: Positive | None = None  # derived: the std before cooling
    merges: Count | None = None  # derived: merges into the main line across the engine (GPT-2: 2 x layers)
    std: Positive | None = None  # derived: the init std of the branch's output projection


class RezeroMerge(Node):
    kind: Literal["rezero"] = "rezero"
    init: Finite


class LayerscaleMerge(Node):
    kind: Literal["layerscale"] = "layerscale"
    init_asked: Positive | None = None  # `merge layerscale init=`; None: CaiT's depth rule
    init: Positive | None = None  # derived


class DeepnormMerge(Node):
    """DeepNet: x_next = LN(alpha * x + f(x)), with f's projections initialised with gain beta."""

    kind: Literal["deepnorm"] = "deepnorm"
    alpha_asked: Positive | None = None  # `merge deepnorm alpha=`; None: (2N)^(1/4)
    beta_asked: Positive | None = None  # `merge deepnorm beta=`; None: (8N)^(-1/4)
    alpha: Positive | None = None  # derived
    beta: Positive | None = None  # derived
    layers: Count | None = None  # derived: the N the formulas are computed from


class GateMerge(Node):
    """Highway merge: x + g * (f(x) - x) with g = sigmoid(W x + b), b starts negative."""

    kind: Literal["gate"] = "gate"
    bias: Finite


# --- hyper-connections: a chamber of several streams (Zhu et al. 2024; mHC, DeepSeek-V4) ---------

Connections = Literal["hyper", "manifold"]


class HyperMerge(Node):
    """A branch's junction with a chamber of `streams` residual streams (`chamber streams=N
    connections=hyper|manifold`): the branch reads a learned mix of the streams (pre), its output
    is written into each stream (post) and the streams are mixed by an n x n matrix (res).
    `hyper`: Zhu et al. 2024, static or `dynamic`; `manifold`: mHC (DeepSeek-V4), always dynamic,
    res kept doubly stochastic by `sinkhorn` iterations. A static read starts on stream k mod n, k the
    branch's place among every branch that runs (the paper's layer index): the init, not the IR, says it."""

    kind: Literal["hyper"] = "hyper"
    streams: Count
    connections: Connections
    dynamic: bool  # hyper: weights computed per position from the normalised streams; manifold: always
    sinkhorn: Count = 20  # manifold: Sinkhorn iterations (DeepSeek-V4's hc_sinkhorn_iters)
    eps: Positive = 1e-6  # manifold: the streams' RMSNorm eps and the weights' floor (hc_eps); hyper dynamic: its LayerNorm's

    _checked = checked()

    def check(self) -> None:
        if self.connections == "manifold" and not self.dynamic:
            raise ValueError("a manifold-constrained connection is always dynamic")


def chamber_streams(body) -> HyperMerge | None:
    """The first hyper-connection of a main line (every returning branch has one, alike), or None:
    the chamber then holds one stream and every junction is an add."""
    for st, _ in leaf_stages(body):
        for b in st.branch_list():
            if isinstance(b.merge, HyperMerge):
                return b.merge
    return None


def _check_streams(body) -> None:
    """A chamber of several streams: every branch joins it through a hyper-connection of the same
    streams and kind; the stages come first on the main line and hold only prechambers that return."""
    first = chamber_streams(body)
    if first is None:
        return
    seen_op = False
    for op in body:
        if not isinstance(op, Stage):
            seen_op = True
            continue
        if seen_op:
            raise ValueError(f"stage '{op.name}' comes after an op on the main line, where the streams are already summed")
    for st, _ in leaf_stages(body):
        for op in st.ops:
            if not isinstance(op, Prechamber) or op.overboard:
                raise ValueError(f"stage '{st.name}': a chamber of {first.streams} streams holds only prechambers that return (not {op.op}"
                                 + (" overboard" if isinstance(op, Prechamber) else "") + ")")
            m = op.merge
            if not isinstance(m, HyperMerge) or (m.streams, m.connections, m.dynamic) != (first.streams, first.connections, first.dynamic):
                raise ValueError(f"prechamber '{op.name}': every branch joins the {first.streams} streams through the same kind of hyper-connection")


MERGE_TYPES = (PlainMerge, ScaleMerge, CoolingMerge, RezeroMerge, LayerscaleMerge, DeepnormMerge, GateMerge, HyperMerge)
Merge = Annotated[Union[MERGE_TYPES], Field(discriminator="kind")]


# --- branches and stages -------------------------------------------------------


def out_width(op, w: int) -> int:
    """The width of the main line (or a branch) after `op`, given the width before it."""
    if isinstance(op, Linear):
        return op.out
    if isinstance(op, Stage):
        return op.width_out
    return w


def _first_repeat(names: list[str]) -> str | None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            return n
        seen.add(n)
    return None


def _chain(ops, w: int, what: str, name: str | None = None) -> int:
    """Walk ops from width w, checking each reads the width it is given; the width after.
    (The message is formatted only when it is needed: this runs for every node built.)"""
    for k, op in enumerate(ops):
        got = op.width_in if isinstance(op, Stage) else op.width
        if got != w:
            where = what if name is None else f"{what} '{name}'"
            raise ValueError(f"{where} op {k} ({op.op}) reads width {got}, but the flow there is {w} wide")
        w = out_width(op, w)
    return w


class Prechamber(Node):
    """A residual branch: split off the chamber, do work, return the exhaust."""

    op: Literal["prechamber"] = "prechamber"
    name: str
    width: Count  # chamber width where the branch splits off
    out_width: Count  # width of the branch's exhaust
    detach: bool  # open cycle: the branch's input carries no gradient back
    overboard: bool  # the exhaust never returns to the chamber
    loss: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None  # overboard with a loss: an auxiliary head, weighted
    ops: list[BranchOp]
    merge: Merge | None  # None exactly when overboard

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "prechamber name")
        if not any(isinstance(op, TURBINE_TYPES) for op in self.ops):
            raise ValueError(f"prechamber '{self.name}' has no turbine")
        end = _chain(self.ops, self.width, "prechamber", self.name)
        if end != self.out_width:
            raise ValueError(f"prechamber '{self.name}' ends at width {end}, not its out_width {self.out_width}")
        if self.overboard != (self.merge is None):
            raise ValueError(f"prechamber '{self.name}': a merge exactly when the branch is not overboard")
        if self.loss is not None and not self.overboard:
            raise ValueError(f"prechamber '{self.name}': loss weighs an overboard branch only")
        if not self.overboard and self.out_width != self.width:
            raise ValueError(f"prechamber '{self.name}' returns width {self.out_width} to a chamber of width {self.width}")


class Fullflow(Node):
    """Full-flow staged combustion: parallel branches fed from the same state."""

    op: Literal["fullflow"] = "fullflow"
    name: str
    width: Count
    norm: Norm | None  # one shared valve in front of every branch
    branches: Annotated[list[Prechamber], Field(min_length=1)]

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "fullflow name")
        if self.norm is not None and self.norm.width != self.width:
            raise ValueError(f"fullflow '{self.name}': its valve is {self.norm.width} wide, the flow {self.width}")
        for b in self.branches:
            if b.width != self.width:
                raise ValueError(f"fullflow '{self.name}': branch '{b.name}' reads width {b.width}, the flow is {self.width}")


StageOp = Annotated[Union[(Prechamber, Fullflow, *OP_TYPES, "Stage")], Field(discriminator="op")]


class Stage(Node):
    op: Literal["stage"] = "stage"
    name: str
    template: str | None  # the template it was expanded from, if any
    repeat: Annotated[int, Field(ge=1, le=1 << 20)]
    width_in: Count
    width_out: Count
    ops: list[StageOp]  # branches and ops; or, for a group (a nested stage), stages only

    _checked = checked()

    @property
    def is_group(self) -> bool:
        """A stage that holds stages (and nothing else)."""
        return any(isinstance(op, Stage) for op in self.ops)

    def check(self) -> None:
        _name(self.name, "stage name")
        _name(self.template, "template name")
        if self.is_group:
            if not all(isinstance(op, Stage) for op in self.ops):
                raise ValueError(f"stage '{self.name}' holds stages and other ops: a stage of stages holds stages only")
            dup = _first_repeat([op.name for op in self.ops])
            if dup is not None:
                raise ValueError(f"stage '{self.name}' has two stages named '{dup}'")
        dup = _first_repeat([b.name for b in self.branch_list()] + [op.name for op in self.ops if isinstance(op, Fullflow)])
        if dup is not None:
            raise ValueError(f"stage '{self.name}' has two branches named '{dup}'")
        w = self.width_in
        for k, op in enumerate(self.ops):
            if isinstance(op, (Prechamber, Fullflow)):
                if op.width != w:
                    raise ValueError(f"stage '{self.name}' op {k} ({op.op} '{op.name}') reads width {op.width}, but the flow there is {w} wide")
            else:
                w = _chain([op], w, "stage", self.name)
        if w != self.width_out:
            raise ValueError(f"stage '{self.name}' ends at width {w}, not its width_out {self.width_out}")
        if self.repeat > 1 and self.width_in != self.width_out:
            raise ValueError(f"stage '{self.name}' repeats {self.repeat} times but changes the width")

    def branch_list(self) -> list[Prechamber]:
        """Every prechamber of this stage in source order, fullflow branches included (a group
        has none of its own: its stages' are theirs, see `leaf_stages`)."""
        out: list[Prechamber] = []
        for op in self.ops:
            if isinstance(op, Prechamber):
                out.append(op)
            elif isinstance(op, Fullflow):
                out.extend(op.branches)
        return out


Stage.model_rebuild()


def repeated_stages(body) -> int:
    """How many stages (groups included, at any depth) repeat: each has a count of its own."""
    return sum((op.repeat > 1) + (repeated_stages(op.ops) if op.is_group else 0) for op in body if isinstance(op, Stage))


def leaf_stages(body) -> list[tuple[Stage, int]]:
    """Every stage that holds ops (not stages) in source order, with the number of times it
    runs in all: its repeat times the repeats of the stages around it."""
    out: list[tuple[Stage, int]] = []

    def walk(st: Stage, mult: int) -> None:
        if st.is_group:
            for sub in st.ops:
                walk(sub, mult * st.repeat)
        else:
            out.append((st, mult * st.repeat))

    for op in body:
        if isinstance(op, Stage):
            walk(op, 1)
    return out


def _stage_depth(st: Stage) -> int:
    return 1 + max((_stage_depth(s) for s in st.ops if isinstance(s, Stage)), default=0)


MainOp = Annotated[Union[(Stage, *OP_TYPES)], Field(discriminator="op")]


# --- feed, nozzle, startup ----------------------------------------------------

Position = Literal["learned", "sinusoidal", "none"]


class Feed(Node):
    """Tanks and pumps: token embedding plus positions."""

    type: Literal["tokens"] = "tokens"
    vocab: Count
    context: Count
    position: Position
    width: Count
    scale: Finite  # embeddings are multiplied by this (the original Transformer: sqrt(width))
    dropout: Rate
    padding: Annotated[int, Field(ge=0)] | None = None  # the padding token: its embedding starts at 0 and gets no gradient
    # Gemma 4's per-layer inputs: a second table (per_layer_vocab x layers * per_layer) and a projection of the embedding
    per_layer: Annotated[int, Field(ge=0)] = 0  # each layer's per-layer input width; 0: none
    per_layer_vocab: Annotated[int, Field(ge=0)] = 0  # rows of the per-layer table
    per_layer_layers: Annotated[int, Field(ge=0)] = 0  # derived: the per-layer mlps' instances, in the order they run
    per_layer_eps: Positive = 1e-6  # the per-layer projection's RMSNorm eps

    _checked = checked()

    def check(self) -> None:
        if self.position == "sinusoidal" and self.width % 2:
            raise ValueError("sinusoidal positions need an even width")
        if self.padding is not None and self.padding >= self.vocab:
            raise ValueError(f"the padding token {self.padding} is outside the vocabulary of {self.vocab}")
        if bool(self.per_layer) != bool(self.per_layer_vocab) or (self.per_layer_layers and not self.per_layer):
            raise ValueError("per-layer inputs need their width and their table's rows")
        if self.per_layer and self.padding is not None and self.padding >= self.per_layer_vocab:
            raise ValueError(f"the padding token {self.padding} is outside the per-layer vocabulary of {self.per_layer_vocab}")


class Nozzle(Node):
    type: Literal["head"] = "head"
    width: Count
    vocab: Count
    tied: bool  # shares the feed's embedding matrix
    bias: bool
    scale: Finite = 1.0  # the logits are multiplied by this (Granite: 1 / logits_scaling)
    softcap: Positive | None = None  # the logits pass through cap * tanh(z / cap) (Gemma 2's final_logit_softcapping)


class Schedule(Node):
    kind: Literal["constant", "cosine", "linear"]
    lr: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    min_lr: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    steps: Count | None  # None: constant after warmup, whatever the kind


class Init(Node):
    """Chill-down: how weights start before the first step."""

    kind: Literal["normal", "xavier"]
    std: Positive  # normal only; xavier derives its own


class Param(Node):
    """The parametrisation: how init and learning rates scale with width. "standard" (SP)
    uses the spec's numbers at every width; "mup" (maximal update, Tensor Programs V)
    equals them at `base_width` and scales them per parameter group by `ir.mup`'s rules."""

    kind: Literal["standard", "mup"]
    base_width: Count | None = None  # mup: the width at which it equals the standard one

    _checked = checked()

    def check(self) -> None:
        if (self.kind == "mup") != (self.base_width is not None):
            raise ValueError("base_width is set for mup, and only for mup")


STANDARD = Param(kind="standard")


class Startup(Node):
    """The start sequence: warmup is the open-loop valve timetable, betas the POGO
    accumulator, clip the restrictor orifice."""

    warmup: Annotated[int, Field(ge=0)]
    schedule: Schedule
    clip: Positive | None
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)], Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]]
    decay: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    init: Init
    param: Param = STANDARD

    _checked = checked()

    def check(self) -> None:
        if self.param.kind == "mup" and self.init.kind != "normal":
            raise ValueError("mup scales a normal init: it needs 'init normal'")


# A let's formula is the spec's arithmetic in Python's syntax, over names only: nothing else
# may reach the text a back-end writes from it.
_FORMULA_NODES = (pyast.Expression, pyast.BinOp, pyast.UnaryOp, pyast.Constant, pyast.Name, pyast.Load, pyast.Call, pyast.Attribute,
                  pyast.Add, pyast.Sub, pyast.Mult, pyast.Div, pyast.FloorDiv, pyast.Mod, pyast.Pow, pyast.USub, pyast.UAdd)


def formula_names(formula: str) -> list[str]:
    """The names a let's formula reads, each once; ValueError if it is more than arithmetic over
    names and numbers (`math.sqrt(x)` is its one call)."""
    try:
        tree = pyast.parse(formula, mode="eval")
    except SyntaxError:
        raise ValueError(f"formula {formula!r} is not an expression") from None
    names: list[str] = []
    for n in pyast.walk(tree):
        if not isinstance(n, _FORMULA_NODES):
            raise ValueError(f"formula {formula!r} holds {type(n).__name__}: only arithmetic over names and numbers")
        if isinstance(n, pyast.Constant) and (type(n.value) not in (int, float)):
            raise ValueError(f"formula {formula!r} holds a {type(n.value).__name__} constant")
        if isinstance(n, pyast.Call) and not (pyast.unparse(n.func) == "math.sqrt" and len(n.args) == 1 and not n.keywords):
            raise ValueError(f"formula {formula!r}: math.sqrt(x) is the only call")
        if isinstance(n, pyast.Attribute) and pyast.unparse(n) != "math.sqrt":
            raise ValueError(f"formula {formula!r}: math.sqrt is the only attribute")
        if isinstance(n, pyast.Name) and n.id != "math":
            _name(n.id, "name")
            if n.id not in names:
                names.append(n.id)
    return names


class Let(Node):
    """A `let` of the spec, kept so that back-ends can name what they make after it (the torch
    Config's fields): its value, and the spec's formula where it was computed from other lets or
    the built-ins width, vocab and context (`let hidden = 4 * width` keeps "4 * width")."""

    name: str
    value: Union[bool, int, float]
    formula: str | None = None  # Python's syntax over names (`sqrt(x)` is `math.sqrt(x)`); None: a number

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "let name")
        if self.formula is not None:
            formula_names(self.formula)


class Engine(Node):
    name: str
    width: Count
    throat: Mask
    feed: Feed
    body: list[MainOp]
    nozzle: Nozzle
    startup: Startup
    # the spec's lets, in definition order; out of the dump, as let_names are (see Node)
    lets: SkipJsonSchema[tuple[Let, ...]] = Field(default=(), exclude=True, repr=False)

    _checked = checked()

    def check(self) -> None:
        _name(self.name, "engine name")
        if self.feed.width != self.width:
            raise ValueError(f"the feed is {self.feed.width} wide, the chamber {self.width}")
        dup = _first_repeat([op.name for op in self.body if isinstance(op, Stage)])
        if dup is not None:
            raise ValueError(f"two stages named '{dup}'")
        depth = max((_stage_depth(op) for op in self.body if isinstance(op, Stage)), default=0)
        if depth > MAX_STAGE_DEPTH:
            raise ValueError(f"stages nest {depth} deep, above the limit of {MAX_STAGE_DEPTH}")
        leaves = leaf_stages(self.body)
        layers = sum(n for _, n in leaves)
        if layers > MAX_LAYERS:
            raise ValueError(f"{layers} stage instances in all, above the limit of {MAX_LAYERS}")
        if repeated_stages(self.body) > MAX_REPEATED_STAGES:
            raise ValueError(f"{repeated_stages(self.body)} stages repeat with counts of their own, above the limit of {MAX_REPEATED_STAGES}")
        w = _chain(self.body, self.width, "the main line")
        if self.nozzle.width != w:
            raise ValueError(f"the nozzle reads width {self.nozzle.width}, the main line ends at {w}")
        if self.nozzle.tied and self.nozzle.width != self.width:
            raise ValueError(f"a tied head reads the chamber's width {self.width}, not {self.nozzle.width}")
        if self.nozzle.vocab != self.feed.vocab:
            raise ValueError(f"the nozzle predicts {self.nozzle.vocab} tokens, the feed takes {self.feed.vocab}")
        causal = self.throat == "causal"
        for op in _all_ops(self.body):
            if isinstance(op, (Attention, LatentAttention)) and causal and op.mask == "open":
                raise ValueError("a bidirectional attention inside a causal engine would leak the future")
            if "causal" in type(op).model_fields and op.causal != causal:  # a kind with the flag follows the throat
                raise ValueError(f"a {op.op}'s causal flag follows the engine's throat")
        for b in (b for st, _ in leaves for b in st.branch_list()):
            if b.overboard and b.loss is not None and b.out_width != self.feed.vocab:
                raise ValueError(f"overboard branch '{b.name}' has a loss, so it must end at width vocab={self.feed.vocab}, not {b.out_width}")
        _check_streams(self.body)  # hyper-connections: a chamber of several streams
        kv_slots(self.body)
        per_layer = per_layer_mlps(self.body)
        if len(per_layer) != self.feed.per_layer_layers or any(m.hidden != self.feed.per_layer for m in per_layer):
            raise ValueError(f"the feed's per-layer inputs ({self.feed.per_layer_layers} of width {self.feed.per_layer}) must match "
                             f"the per-layer mlps ({len(per_layer)}, hidden {sorted({m.hidden for m in per_layer})})")
        from .passes import derived_values, merge_totals  # the formulas live with the pass that applies them

        totals = merge_totals(self.body)
        for b in (b for st, _ in leaves for b in st.branch_list()):
            if b.merge is None:
                continue
            for field, expect in derived_values(b.merge, totals, self.startup.init).items():
                got = getattr(b.merge, field)
                if got != expect and (got is None or not math.isclose(got, expect, rel_tol=1e-9, abs_tol=1e-12)):
                    raise ValueError(f"prechamber '{b.name}': merge {b.merge.kind} has {field}={got}, "
                                     f"but the engine gives {expect} (run ir.passes.finalize_merges)")


def kv_slots(body) -> dict:
    """KV sharing: each slot's (kv_heads, head_dim, window), checked in the order the layers run: a layer reads a slot a layer
    before it stored, of its own shape. ValueError otherwise."""
    slots: dict = {}

    def walk(ops) -> None:
        for op in ops:
            if isinstance(op, Stage):
                for _ in range(op.repeat if any(isinstance(a, Attention) and (a.kv_store or a.kv_reuse) for a in _all_ops([op])) else 1):
                    walk(op.ops if op.is_group else _all_ops([op]))
            elif isinstance(op, Attention) and (op.kv_store or op.kv_reuse):
                shape = (op.kv_heads, op.head_dim, op.window)
                if op.kv_store is not None and slots.setdefault(op.kv_store, shape) != shape:
                    raise ValueError(f"KV slot {op.kv_store} is stored by attentions of different shapes (kv_heads, head_dim, window)")
                if op.kv_reuse is not None:
                    if op.kv_reuse not in slots:
                        raise ValueError(f"an attention reads KV slot {op.kv_reuse} before any layer stores it")
                    if slots[op.kv_reuse] != shape:
                        raise ValueError(f"an attention reads KV slot {op.kv_reuse} with kv_heads, head_dim and window {shape}, "
                                         f"but it holds {slots[op.kv_reuse]}")

    walk(body)
    return slots


def per_layer_mlps(body) -> list:
    """Every per-layer mlp instance (Gemma 4), in the order the layers run: instance i reads per-layer input i."""
    ops = [op for st, n in leaf_stages(body) for op in _all_ops([st]) * n] + _all_ops([op for op in body if not isinstance(op, Stage)])
    return [op for op in ops if isinstance(op, Mlp) and op.per_layer]


def _all_ops(body) -> list:
    """Every norm and turbine in a main line: in stages, their branches and fullflows too."""
    out = []
    for op in body:
        if isinstance(op, Stage) and op.is_group:
            out += _all_ops(op.ops)
        elif isinstance(op, Stage):
            for s in op.ops:
                if isinstance(s, Fullflow):
                    out += ([s.norm] if s.norm else []) + [o for b in s.branches for o in b.ops]
                elif isinstance(s, Prechamber):
                    out += s.ops
                else:
                    out.append(s)
        else:
            out.append(op)
    return out


# How a notebook shows a Spec: set by the façade (cyclelang.api), which may import the
# back-ends; the IR imports none. (spec, "svg" | "html") -> text, or None for nothing.
NOTEBOOK_DISPLAY: list = []


class Spec(Node):
    """A resolved spec. A file of templates only (meant to be included) has no engine."""

    version: Literal[2] = IR_VERSION
    engine: Engine | None

    def _repr_svg_(self):  # Jupyter: the diagram
        return NOTEBOOK_DISPLAY[0](self, "svg") if NOTEBOOK_DISPLAY else None

    def _repr_html_(self):  # Jupyter: the diagram and the parameter/FLOP table
        return NOTEBOOK_DISPLAY[0](self, "html") if NOTEBOOK_DISPLAY else None


# --- re-checking a tree that was edited without validation ----------------------------


def validate(spec: Spec) -> Spec:
    """Check every invariant of the tree again; returns `spec` itself (spans and all).

    `model_copy(update=...)` skips validation, so every pass ends here. Raises
    IRError naming the first node that breaks one."""
    try:
        Spec.model_validate(spec.model_dump())
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-after", "tagged-union")))
        raise IRError(where or "spec", err["msg"].removeprefix("Value error, ")) from None
    return spec
