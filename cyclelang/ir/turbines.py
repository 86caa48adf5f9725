"""The IR's ops: the valve (`Norm`) and the turbines, the work done on a split-off flow;
`TURBINE_TYPES` is the one list of turbine kinds. See `nodes.py`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union, get_args

from pydantic import Field, model_validator

from .base import Count, Finite, Node, Positive, Rate, checked


__all__ = [  # what `ir.nodes` (and so `ir`) exports from here
    "NormType", "Norm", "Activation", "Mask", "Attention", "Mlp", "Moe", "Pool", "Linear", "Conv", "Ssm", "Mamba1",
    "LinearAttention", "FeatureMap", "LatentAttention", "RotaryScaling", "GatedDelta", "ShortConv", "Turbine",
    "TURBINE_TYPES", "OP_TYPES", "BranchOp", "Router", "GroupScore", "ROUTERS", "GROUP_SCORES",
]


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
MAX_TEMPERATURE = 1e3  # the largest query temperature the language takes (rotary_temperature=, llama_4_scaling_beta)


class RotaryScaling(Node):
    """Rotary positions stretched past the pretraining context, as transformers' rope_utils
    computes them: `linear` divides every frequency by `factor` (position interpolation);
    `dynamic` (NTK) raises the base once a sequence passes `original` positions, by how far
    it passed; `llama3` divides the low frequencies by `factor`, keeps the high ones and
    blends between (`low`, `high`: low_freq_factor, high_freq_factor); `yarn` blends
    interpolated and extrapolated frequencies by each one's rotations over `original`
    positions (`beta_fast`, `beta_slow`) and scales cos and sin by `attention_factor`.
    `temperature` t (Llama 4's attention temperature, as Ministral 3 reads it from
    llama_4_scaling_beta): the rotated queries are multiplied by 1 + t ln(1 + floor(position /
    original)), so past each multiple of the original context the softmax sharpens; 0: off."""

    type: ScalingType
    factor: Positive
    original: Count | None = None  # the pretraining context (original_max_position_embeddings); linear: None
    low: Positive = 1.0  # llama3's low_freq_factor
    high: Positive = 4.0  # llama3's high_freq_factor
    beta_fast: Positive = 32.0  # yarn
    beta_slow: Positive = 1.0  # yarn
    attention_factor: Positive | None = None  # yarn: the cos/sin gain; None: 0.1 ln(factor) + 1
    truncate: bool = True  # yarn: the blend's dims rounded out to whole ones (floor, ceil); false: as computed (gpt-oss)
    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)] = 0.0  # the queries' log-position scale; 0: none

    _checked = checked()

    def check(self) -> None:
        if (self.type == "linear") != (self.original is None):
            raise ValueError("linear rotary scaling has no original context; dynamic, llama3 and yarn need one")
        if not self.truncate and self.type != "yarn":
            raise ValueError("truncate says how yarn rounds its blend's range; only yarn scaling has one")
        if self.temperature and self.original is None:
            raise ValueError("the query temperature counts positions in original contexts; linear rotary scaling has none")
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
    rotary_spread: bool = Field(False, exclude_if=lambda v: not v)  # rotated pairs (i, i + head_dim/2), i < rotary_dims/2, at base^(-2i/head_dim) (proportional rope); false: the first rotary_dims dims
    v_norm: bool = Field(False, exclude_if=lambda v: not v)  # a weightless RMSNorm over each head's values (eps qk_norm_eps)
    k_eq_v: bool = Field(False, exclude_if=lambda v: not v)  # the values are the key projection's output (before the k-norm and rotary): no value projection
    kv_store: Annotated[int, Field(ge=1)] | None = Field(None, exclude_if=lambda v: v is None)  # KV sharing: its keys and values (the cached past included) go to this slot
    kv_reuse: Annotated[int, Field(ge=1)] | None = Field(None, exclude_if=lambda v: v is None)  # KV sharing: it reads the slot's keys and values, no projections or cache of its own

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
    per_layer: bool = Field(False, exclude_if=lambda v: not v)  # Gemma 4: act(gate x) times this layer's per-layer input (the feed's per_layer), then down; hidden = its width

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
    # the sigmoid router's renormalisation, w / (sum + normalize_eps): DeepSeek-V3's 1e-20, LFM2-MoE's 1e-6; out of the
    # dump at the default, so older IR stays as it was
    normalize_eps: Positive = Field(1e-20, exclude_if=lambda v: v == 1e-20)

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
        if self.normalize_eps != 1e-20 and not (self.router == "sigmoid" and self.normalize):
            raise ValueError("normalize_eps is the sigmoid router's renormalisation epsilon: it needs router=sigmoid and normalize")

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
