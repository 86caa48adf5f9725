"""One record per kind of part: every fact about a kind lives here, once.

The reviewer's report, the size limit, the diagrams, the torch back-end and the
test stand ask this table; none of them works a fact out again. A kind is keyed
by its IR class (`KINDS[ir.Attention]`, or `kind_of(node)`); a test walks the
IR's unions and fails, naming the kind, when a record is missing, and each
back-end's own table (emitters, diagram colours) is held to the same list.

Counting conventions
--------------------
- Parameters follow the usual layouts (nanoGPT, Llama): q/k/v/o projections, a
  gated MLP with three matrices, a bias-free router, a tied head that owns nothing
  but its bias.
- FLOPs are per token, forward, matrix products and convolutions only (2 per
  multiply-add), as `torch.utils.flop_counter.FlopCounterMode` counts them: norms,
  activations, rotary and pooling are elementwise and left out. `flops` returns (projections,
  mixing): mixing is what grows with the context (attention's scores and weighted
  sum, 4 x heads x head_dim x attended positions), counted dense over the attended
  positions, which is what a fused kernel executes for a causal mask too.
- Activations: values kept for the backward pass per token, (a, b) in a + b*n for a
  sequence of n tokens (b: the attention weights a plain kernel keeps, heads x n).
- Buffers: values a part holds beside its parameters and saves with them: an MoE's
  correction bias (one per expert), which no optimizer moves; parameters do not count it.
  A router's sigmoid, its groups' top-2 and the correction are elementwise: no FLOPs.
- State: what decoding keeps per sequence of n tokens (values, not bytes): a KV
  cache grows with n (up to a window); a pool keeps its last size - 1 inputs; a
  recurrent mixer (ssm, linear_attention) keeps a state of fixed size, whatever n.
- A chunked scan (ssm, linear_attention) works on chunks of `chunk` positions: inside a
  chunk it multiplies like attention (2 x chunk x ... per token), between chunks it
  carries the state (a fixed cost per token), so its mixing FLOPs per token stop
  growing once n passes the chunk: the exponent of a sequence's cost is 1, not 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from . import nodes as ir

ROLES = ("feed", "mixer", "reactor", "valve", "projection", "merge", "nozzle")
# How summaries name each role's parts, and the one-line account of what it holds.
ROLE_WORDS = {
    "feed": ("feed", "token and position embeddings"),
    "mixer": ("mixers", "attention, linear attention, ssm, pool and conv, the only operators that mix positions; qk-norms included"),
    "reactor": ("reactors", "mlp and moe, router included: position-wise work"),
    "valve": ("valves", "norms"),
    "projection": ("projections", "linear turbines"),
    "merge": ("merges", "rezero, layerscale and gate parameters"),
    "nozzle": ("nozzle", "the head; 0 when tied to the feed"),
}

GATED = ("swiglu", "geglu", "geglu_tanh")  # a gated unit: act(gate) * up, with a fused [gate | up] projection
GATE_OF = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def is_gated(act: str) -> bool:
    return act in GATED


def _zero2(node, n: int = 0, w: int = 0) -> tuple[int, int]:
    return 0, 0


def _zero(node, n: int = 0) -> int:
    return 0


def _out_width(node, w: int) -> int:
    return ir.out_width(node, w)  # the one formula: the IR's own, which its validators use too


@dataclass(frozen=True)
class Kind:
    """Everything cyclelang knows about one kind of part."""

    cls: type
    keyword: str  # the spec's word after turbine / norm / merge (norm: its types, "layernorm|rmsnorm")
    attr: str  # the module attribute it gets in the built model ("attn"); "" for what has no module
    role: str  # one of ROLES
    rocket: str  # the engine word ("injector")
    ml: str  # the network word ("attention")
    phrase: str  # what it does, in a few words, rocket first ("injector: mixes positions")
    params: Callable[[object, int], int]  # trainable numbers, given the width where the part sits
    flops: Callable[[object, int, int], tuple[int, int]] = _zero2  # per token at context n, width w: (projections, mixing)
    activations: Callable[[object, int], tuple[int, int]] = _zero2  # values kept per token: (a, b) in a + b*n
    state: Callable[[object, int], int] = _zero  # values decoding keeps per sequence of n tokens
    buffers: Callable[[object], int] = _zero  # values it holds beside its parameters, saved with them (an MoE's correction bias)
    out_width: Callable[[object, int], int] = _out_width
    mixes_positions: bool = False  # lets positions interact (the injector's job)
    # ends in a learned output projection: the weights a cooled merge re-initialises at init
    # sigma and DeepNorm's beta scales (`output_projection(ops)`); a pool and a norm have none
    out_proj: bool = False
    masked: bool = False  # reads other positions, so the causal throat must mask it
    state_kind: str | None = None  # "kv" (grows with n), "window" (bounded), "recurrent" (fixed), None (nothing kept)
    # merges only: how the junction combines the chamber x and the branch's f(x)
    formula: str = ""  # for legends: "x + s·f(x)"
    cooled: bool = False  # starts the branch small (a rich, cool preburner)
    inits_output: bool = False  # its init rule acts on the branch's output projection (cooling's sigma, DeepNorm's beta)
    fields: tuple[str, ...] = field(default_factory=tuple)  # parameter names the part owns under its path
    mup: str | None = None  # μP rule for its matrices when its role's (ir.mup.ROLE_RULE) does not fit
    mup_sub: tuple[tuple[str, str], ...] = ()  # (module under the part, μP rule) where a piece differs
    # how tensor parallelism splits it (backends/torch/runtime/parallel.py): "heads" (q/k/v
    # column-wise by whole heads, output row-wise), "hidden" (up/gate column-wise, down
    # row-wise; an MoE's every expert), "replicate" (computed whole on every rank)
    tp: str = "replicate"
    ml_phrase: str = ""  # what it does in the ML reader's words ("attention: the only place positions mix"); "": the ml word

    @property
    def ml_words(self) -> str:
        return self.ml_phrase or self.ml

    def describe(self, node) -> tuple[str, str]:
        """(rocket word, network word) for one node: a narrow linear is a throat, not a duct."""
        if isinstance(node, ir.Linear) and node.out < node.width:
            return "narrow throat", self.ml
        return self.rocket, self.ml


# --- the formulas -------------------------------------------------------------------------


def _norm_params(n: ir.Norm, w: int) -> int:
    return 0 if not n.affine else n.width * (2 if n.bias else 1)


def _qkv(a: ir.Attention) -> tuple[int, int]:
    return a.heads * a.head_dim, a.kv_heads * a.head_dim


def _kv_rows(a: ir.Attention, kv: int) -> int:
    """The key and value projections' rows: one set where the values are the keys' projection (Gemma 4's k_eq_v)."""
    return 0 if a.kv_reuse is not None else kv if a.k_eq_v else 2 * kv


def _attention_params(a: ir.Attention, w: int) -> int:
    q, kv = _qkv(a)
    if a.kv_reuse is not None:  # KV sharing: q and the output projection, q's norm; the keys and values are another layer's
        per = (1 + a.qk_norm_bias) * a.qk_norm_affine * a.qk_norm
        norm = per * (q if a.qk_norm_across or a.qk_norm_head_gains else a.head_dim)
        return 2 * a.width * q + (q if a.bias else 0) + (a.width if a.out_bias else 0) + norm
    n = a.width * (q + _kv_rows(a, kv)) + q * a.width
    if a.bias:
        n += q + _kv_rows(a, kv)
    if a.out_bias:
        n += a.width
    per = (1 + a.qk_norm_bias) * a.qk_norm_affine  # a gain (and Persimmon's bias) per channel; none without a learned gain (nanochat)
    if a.qk_norm and a.qk_norm_across:
        n += per * (q + kv)  # one qk-norm over all q heads' channels, one over all k heads' (OLMo-2)
    elif a.qk_norm and a.qk_norm_head_gains:
        n += per * (q + kv)  # each head its own gain (and bias): StableLM, Cohere
    elif a.qk_norm:
        n += per * 2 * a.head_dim  # one qk-norm per head dim, shared by the heads, for q and for k
    return n


def attended(a, n: int) -> int:
    """Positions each query attends to at context length n."""
    window = getattr(a, "window", None)
    return min(n, window) if window is not None else n


def _attention_flops(a: ir.Attention, n: int, w: int = 0) -> tuple[int, int]:
    q, kv = _qkv(a)
    return 2 * (a.width * (q + _kv_rows(a, kv)) + q * a.width), 4 * q * attended(a, n)


def _attention_activations(a: ir.Attention, n: int = 0) -> tuple[int, int]:
    q, kv = _qkv(a)
    return a.width + 2 * q + 2 * kv, a.heads


def _attention_state(a: ir.Attention, n: int) -> int:
    if a.kv_reuse is not None:  # reads the storing layer's cache: none of its own
        return 0
    return 2 * a.kv_heads * a.head_dim * attended(a, n)  # K and V of every attended position


def _mla_projections(a: ir.LatentAttention) -> tuple[int, int]:
    """(weights, biases) of latent attention's projections."""
    qk = a.heads * (a.head_dim + a.rotary_dims)
    q = a.width * qk if a.q_latent is None else a.width * a.q_latent + a.q_latent * qk
    w = q + a.width * (a.latent + a.rotary_dims) + a.latent * a.heads * (a.head_dim + a.v_dim) + a.heads * a.v_dim * a.width
    b = (a.q_latent or 0) + a.latent + a.rotary_dims + a.width  # down projections and the output
    return w, b


def _mla_params(a: ir.LatentAttention, w: int) -> int:
    weights, biases = _mla_projections(a)
    return weights + (biases if a.bias else 0) + a.latent + (a.q_latent or 0)  # the latents' RMSNorm gains


def _mla_flops(a: ir.LatentAttention, n: int, w: int = 0) -> tuple[int, int]:
    # the latent is expanded to keys and values once per position (kv_b_proj), then attention as usual
    return 2 * _mla_projections(a)[0], 2 * a.heads * (a.head_dim + a.rotary_dims + a.v_dim) * attended(a, n)


def _mla_state(a: ir.LatentAttention, n: int) -> int:
    return (a.latent + a.rotary_dims) * attended(a, n)  # the latent and the shared rotary key of every position


def mlp_params(width: int, hidden: int, act: str, bias: bool) -> int:
    ins = 2 if is_gated(act) else 1  # a gated unit has a gate and an up projection
    return ins * width * hidden + hidden * width + ((ins * hidden + width) if bias else 0)


def _mlp_activations(width: int, hidden: int, act: str) -> int:
    return width + hidden * (3 if is_gated(act) else 2)


def _moe_params(m: ir.Moe, w: int) -> int:
    n = m.width * m.experts + m.experts * mlp_params(m.width, m.hidden, m.act, m.bias)  # router: no bias
    if m.shared:  # the shared expert every token visits, and its gate (one bias-free row)
        n += mlp_params(m.width, m.shared, m.act, m.bias) + (m.width if m.shared_gate else 0)
    return n


def _moe_flops(m: ir.Moe, n: int, w: int = 0) -> tuple[int, int]:
    shared = 2 * mlp_params(m.width, m.shared, m.act, False) + (2 * m.width if m.shared_gate else 0) if m.shared else 0
    return 2 * m.width * m.experts + m.top * 2 * mlp_params(m.width, m.hidden, m.act, False) + shared, 0


def _per_layer_params(f: ir.Feed) -> int:
    """Gemma 4's per-layer inputs: their table, the embedding's projection to them and their shared norm's gain."""
    return (f.per_layer_vocab + f.width) * f.per_layer_layers * f.per_layer + f.per_layer


def _pool_state(p: ir.Pool, n: int) -> int:
    return p.width * min(n, p.size - 1) if p.causal else 0


def _ssm_params(s: ir.Ssm, w: int) -> int:
    proj = s.width * (s.inner + s.conv_dim + s.heads) + s.inner * s.width  # in_proj [z | x B C | dt], out_proj
    if s.bias:
        proj += s.inner + s.conv_dim + s.heads + s.width
    conv = s.conv_dim * s.conv + (s.conv_dim if s.conv_bias else 0)
    return proj + conv + 3 * s.heads + s.inner  # dt_bias, A_log, D per head; the gated norm's gain


def _ssm_flops(s: ir.Ssm, n: int, w: int = 0) -> tuple[int, int]:
    proj = 2 * (s.width * (s.inner + s.conv_dim + s.heads) + s.inner * s.width) + 2 * s.conv_dim * s.conv
    gn, hp = s.heads * s.state, s.heads * s.head_dim  # scores C.B and their sum over x in the chunk; state in and out
    return proj, 2 * min(n, s.chunk) * (gn + hp) + 4 * s.heads * s.head_dim * s.state


def _ssm_state(s: ir.Ssm, n: int) -> int:
    return s.conv_dim * (s.conv - 1) + s.heads * s.head_dim * s.state  # the conv window and the scan's state


def _mamba1_params(s: ir.Mamba1, w: int) -> int:
    proj = s.width * 2 * s.inner + s.inner * (s.dt_rank + 2 * s.state) + s.dt_rank * s.inner + s.inner * s.width
    proj += s.inner  # dt_proj's bias: always there, it holds the step size's init
    if s.bias:
        proj += 2 * s.inner + s.width  # in_proj, out_proj
    conv = s.inner * s.conv + (s.inner if s.conv_bias else 0)
    norms = s.dt_rank + 2 * s.state if s.norms and s.norms_affine else 0
    return proj + conv + s.inner * s.state + s.inner + norms  # A_log (inner x state), D per channel


def _mamba1_flops(s: ir.Mamba1, n: int, w: int = 0) -> tuple[int, int]:
    # in_proj, conv, x_proj, dt_proj, out_proj; mixing: the state read by C (inner x state per
    # token). The scan's update is elementwise (not a matrix product), so it is not counted.
    proj = 2 * (s.width * 2 * s.inner + s.inner * (s.dt_rank + 2 * s.state) + s.dt_rank * s.inner + s.inner * s.width) + 2 * s.inner * s.conv
    return proj, 2 * s.inner * s.state


def _mamba1_state(s: ir.Mamba1, n: int) -> int:
    return s.inner * (s.conv - 1) + s.inner * s.state  # the conv window and the scan's state


def _la_values(a: ir.LinearAttention) -> int:
    return a.head_dim + (1 if a.normalize else 0)  # v with a column of ones: the normaliser rides in the same sums


def _la_params(a: ir.LinearAttention, w: int) -> int:
    q = a.heads * a.head_dim
    return 4 * a.width * q + ((3 * q + a.width) if a.bias else 0)


def _la_flops(a: ir.LinearAttention, n: int, w: int = 0) -> tuple[int, int]:
    q, e = a.heads * a.head_dim, a.heads * _la_values(a)
    inside = 2 * min(n, a.chunk) * (q + e) if a.causal else 0  # the chunk's own scores and sums
    return 8 * a.width * q, inside + 4 * a.head_dim * e  # the state read by q, and written by k, v


def _la_state(a: ir.LinearAttention, n: int) -> int:
    return a.heads * a.head_dim * _la_values(a) if a.causal else 0


def _gate_params(m: ir.GateMerge, w: int) -> int:
    return w * w + w  # g = sigmoid(W x + b), one gate per channel


# --- the table -----------------------------------------------------------------------------

OPS: tuple[Kind, ...] = (
    Kind(ir.Norm, "layernorm|rmsnorm", "norm", "valve", "valve", "norm", "valve",
         params=_norm_params, activations=lambda x, n=0: (x.width, 0), ml_phrase='norm',
         buffers=lambda x: 1 if x.type == "scalar" else 0),  # Gemma 4's layer_scalar: a fixed gain the weights bring
    Kind(ir.Attention, "attention", "attn", "mixer", "injector", "attention", "injector: mixes positions",
         out_proj=True, params=_attention_params, flops=_attention_flops, activations=_attention_activations, state=_attention_state,
         mixes_positions=True, masked=True, state_kind="kv", tp="heads", ml_phrase='attention: the only place positions mix'),
    Kind(ir.LatentAttention, "attention", "attn", "mixer", "latent injector", "latent attention",
         "latent injector: mixes positions through a compressed KV latent",
         out_proj=True, params=_mla_params, flops=_mla_flops, state=_mla_state,
         activations=lambda x, n=0: (x.width + x.latent + (x.q_latent or 0) + x.heads * (2 * (x.head_dim + x.rotary_dims) + 2 * x.v_dim), x.heads),
         mixes_positions=True, masked=True, state_kind="kv", ml_phrase='latent attention: positions mix through a compressed key/value latent'),
    Kind(ir.Mlp, "mlp", "mlp", "reactor", "combustor", "MLP", "combustion: reacts at each position",
         out_proj=True, params=lambda x, w: mlp_params(x.width, x.hidden, x.act, x.bias),
         flops=lambda x, n, w=0: (2 * mlp_params(x.width, x.hidden, x.act, False), 0),
         activations=lambda x, n=0: (_mlp_activations(x.width, x.hidden, x.act), 0), tp="hidden", ml_phrase='MLP: applied at each position on its own'),
    Kind(ir.Moe, "moe", "moe", "reactor", "liquid-liquid injector", "MoE", "liquid-liquid injection: routed experts",
         out_proj=True, params=_moe_params, flops=_moe_flops, mup_sub=(("router", "output"),),  # width -> experts: a fixed fan-out
         buffers=lambda x: x.experts if x.correction else 0,  # the selection bias: moved by its load rule (or held), never by the optimizer
         activations=lambda x, n=0: (x.width + x.top * x.hidden * (3 if is_gated(x.act) else 2), 0), tp="hidden", ml_phrase='mixture of experts: each token goes to its top experts'),
    Kind(ir.Pool, "pool", "pool", "mixer", "passive mixer", "pool", "injector: pooling mixer",
         params=lambda x, w: 0, state=_pool_state, mixes_positions=True, masked=True, state_kind="window", ml_phrase='pooling: the mean over nearby positions'),
    Kind(ir.Conv, "conv", "conv", "mixer", "swirl injector", "conv", "swirl injector: mixes a few neighbouring positions",
         out_proj=True, params=lambda x, w: x.width * x.size + (x.width if x.bias else 0), flops=lambda x, n, w=0: (2 * x.width * x.size, 0),
         activations=lambda x, n=0: (x.width, 0), state=lambda x, n: x.width * min(n, x.size - 1) if x.causal else 0,
         mixes_positions=True, masked=True, state_kind="window",
         mup="vector", ml_phrase='depthwise convolution: mixes a few neighbouring positions'),  # depthwise filters: the fan-in is the kernel size, which no width changes
    Kind(ir.Ssm, "ssm", "ssm", "mixer", "regenerative jacket", "SSM", "regenerative jacket: a selective state carries the flow along",
         out_proj=True, params=_ssm_params, flops=_ssm_flops, state=_ssm_state,
         activations=lambda x, n=0: (x.width + 2 * (x.inner + x.conv_dim + x.heads) + 2 * x.inner + x.heads * x.state, 0),
         mixes_positions=True, masked=True, state_kind="recurrent",
         mup_sub=(("conv1d", "vector"),), ml_phrase='selective state-space mixer: a fixed-size state carries the past'),  # depthwise filters, as conv's: the fan-in is the kernel size
    Kind(ir.Mamba1, "ssm", "ssm", "mixer", "regenerative jacket", "SSM (Mamba-1)",
         "regenerative jacket: a selective state per channel carries the flow along",
         out_proj=True, params=_mamba1_params, flops=_mamba1_flops, state=_mamba1_state,
         activations=lambda x, n=0: (x.width + 4 * x.inner + 2 * (x.dt_rank + 2 * x.state) + x.inner * x.state, 0),
         mixes_positions=True, masked=True, state_kind="recurrent",
         mup_sub=(("conv1d", "vector"),), ml_phrase='selective state-space mixer (Mamba-1): a fixed-size state per channel carries the past'),
    Kind(ir.LinearAttention, "linear_attention", "attn", "mixer", "expander injector", "linear attention",
         "expander injector: mixes positions through a fixed-size state",
         out_proj=True, params=_la_params, flops=_la_flops, state=_la_state,
         activations=lambda x, n=0: (x.width + 5 * x.heads * x.head_dim, 0),
         mixes_positions=True, masked=True, state_kind="recurrent", ml_phrase='linear attention: positions mix through a fixed-size state'),
    Kind(ir.Linear, "linear", "linear", "projection", "duct", "linear", "a single projection",
         out_proj=True, params=lambda x, w: x.width * x.out + (x.out if x.bias else 0), flops=lambda x, n, w=0: (2 * x.width * x.out, 0),
         activations=lambda x, n=0: (x.width, 0), ml_phrase='a linear projection'),
)

MERGES: tuple[Kind, ...] = (
    Kind(ir.PlainMerge, "plain", "", "merge", "closed cycle", "residual add", "closed cycle: the exhaust returns",
         params=_zero, formula="x + f(x)", ml_phrase='residual add'),
    Kind(ir.ScaleMerge, "scale", "", "merge", "throttled return", "scaled residual", "the exhaust returns, throttled",
         params=_zero, formula="x + s\u00b7f(x)", ml_phrase='scaled residual add'),
    Kind(ir.CoolingMerge, "cooling", "", "merge", "cooling", "scaled init", "closed cycle, cooled: output projection starts small",
         inits_output=True, params=_zero, formula="x + f(x), f's output init \u03c3", cooled=True, ml_phrase="residual add; the output projection starts small (GPT-2's scaled init)"),
    Kind(ir.RezeroMerge, "rezero", "scale", "merge", "rezero", "ReZero", "starts closed (ReZero)",
         params=lambda m, w: 1, formula="x + \u03b1\u00b7f(x), \u03b1 learned", cooled=True, fields=("scale",), ml_phrase='residual add through a learned scalar that starts at zero (ReZero)'),
    Kind(ir.LayerscaleMerge, "layerscale", "scale", "merge", "layerscale", "LayerScale", "lean start, per channel (LayerScale)",
         params=lambda m, w: w, formula="x + \u03b3\u2299f(x), \u03b3 per channel", cooled=True, fields=("scale",), ml_phrase='residual add through a learned per-channel gain (LayerScale)'),
    Kind(ir.DeepnormMerge, "deepnorm", "", "merge", "deepnorm", "DeepNorm", "DeepNorm: the main line is scaled by alpha",
         inits_output=True, params=_zero, formula="\u03b1\u00b7x + f(x), f's init gain \u03b2", cooled=True, ml_phrase='DeepNorm: the residual stream is scaled by alpha'),
    Kind(ir.GateMerge, "gate", "gate", "merge", "gate", "highway gate", "a gated return (highway)",
         params=_gate_params, flops=lambda m, n, w: (2 * w * w, 0), formula="x + g\u00b7(f(x) \u2212 x), g = \u03c3(Wx + b)",
         cooled=True, fields=("gate",), ml_phrase='highway gate: a learned mix of the stream and the branch'),
)

ENDS: tuple[Kind, ...] = (
    Kind(ir.Feed, "tokens", "feed", "feed", "tanks and pumps", "token embedding", "tanks and pumps",
         params=lambda f, w: f.vocab * f.width + (f.context * f.width if f.position == "learned" else 0) + _per_layer_params(f), ml_phrase='token embedding',
         flops=lambda f, n, w=0: (2 * f.width * f.per_layer_layers * f.per_layer, 0)),  # Gemma 4: the embedding projected to every layer's input
    Kind(ir.Nozzle, "head", "head", "nozzle", "nozzle", "LM head", "the nozzle",
         params=lambda z, w: (0 if z.tied else z.width * z.vocab) + (z.vocab if z.bias else 0),
         flops=lambda z, n, w=0: (2 * z.width * z.vocab, 0), activations=lambda z, n=0: (z.width + z.vocab, 0), ml_phrase='LM head'),
)

KINDS: dict[type, Kind] = {k.cls: k for k in (*OPS, *MERGES, *ENDS)}
# turbine keywords; latent attention is `turbine attention latent=`, so the first record of a keyword is its home
BY_KEYWORD: dict[str, Kind] = {}
for _k in OPS:
    if _k.cls is not ir.Norm:
        BY_KEYWORD.setdefault(_k.keyword, _k)
MERGE_BY_KEYWORD: dict[str, Kind] = {k.keyword: k for k in MERGES}


def kind_of(node) -> Kind:
    """The record of a node's kind; a node with none fails with its class's name."""
    try:
        return KINDS[type(node)]
    except KeyError:
        raise KeyError(f"no kinds record for IR class {type(node).__name__}: add one to cyclelang/ir/kinds.py") from None


def params(node, width: int = 0) -> int:
    """Trainable parameters of one part; `width` is where it sits (a merge's branch width)."""
    return kind_of(node).params(node, width)


def mixes_positions(node) -> bool:
    return kind_of(node).mixes_positions


def output_projection(ops):
    """The op whose output projection a cooled merge re-initialises: the branch's last op
    whose kind has one (`Kind.out_proj`), or None where none has (a pool, a norm)."""
    return next((op for op in reversed(ops) if kind_of(op).out_proj), None)


# --- what a merge multiplies ------------------------------------------------------------------


@dataclass(frozen=True)
class Gain:
    """What a junction multiplies the branch's output by: a fixed number, or a learned
    parameter the part owns (`learned` names it); `main` multiplies the chamber's x."""

    value: float = 1.0
    learned: str | None = None
    main: float = 1.0


def gain(m) -> Gain:
    if isinstance(m, ir.ScaleMerge):
        return Gain(value=m.value)
    if isinstance(m, (ir.RezeroMerge, ir.LayerscaleMerge)):
        return Gain(learned=kind_of(m).fields[0])
    if isinstance(m, ir.DeepnormMerge):
        return Gain(main=m.alpha)
    return Gain()  # plain, cooling; a gate's g*(f(x) - x) is no fixed gain: it is measured as it merges
