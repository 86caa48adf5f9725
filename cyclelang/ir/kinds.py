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

import math

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

GATED = ir.GATED
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
    # values it holds beside its parameters: an MoE's correction bias (saved with them), ALiBi's
    # slopes and a fixed decay per head (made at build); the rotary tables are counted apart (`rotary`)
    buffers: Callable[[object], int] = _zero
    # the rotary table it rotates by, as the model allocates one per distinct key: (dims, base,
    # scaling), or None; the planner shares a table between parts of one key, the size limit counts it
    rotary: Callable[[object], tuple | None] = lambda node: None
    # its scale model at another chamber width (ir.passes.shrink): (node, scaler) -> node, the scaler's
    # `dim(d)` scaling one width-like size; every op kind has one (held at import)
    shrink: Callable[[object, object], object] | None = None
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
    # the nodes of the kind that stay whole on every rank all the same, and why (tp_of): None when `tp` applies
    tp_whole: Callable[[object], str | None] = lambda node: None
    ml_phrase: str = ""  # what it does in the ML reader's words ("attention: the only place positions mix"); "": the ml word

    @property
    def ml_words(self) -> str:
        return self.ml_phrase or self.ml

    def tp_of(self, node) -> str:
        """How tensor parallelism splits this node: the kind's `tp`, unless `tp_whole` keeps it whole."""
        return "replicate" if self.tp_whole(node) else self.tp

    def describe(self, node) -> tuple[str, str]:
        """(rocket word, network word) for one node: a narrow linear is a throat, not a duct."""
        if isinstance(node, ir.Linear) and node.out < node.width:
            return "narrow throat", self.ml
        return self.rocket, self.ml


# --- how a scale model narrows each kind (`ir.passes.shrink`) -----------------------------------


class ShrinkError(ValueError):
    """A scale model that cannot be made; `code` is the diagnostic's."""

    def __init__(self, message: str, help: str | None = None, code: str = "E0205"):
        super().__init__(message)
        self.message, self.help, self.code = message, help, code


def _shrink_width(op, s):  # a kind whose only width-like field is its width (norm, pool, conv)
    return op.model_copy(update=dict(width=s.dim(op.width)))


def _shrink_hidden(op, s):  # an MLP, an MoE's experts (and its shared expert): the hidden width in proportion
    shared = dict(shared=s.dim(op.shared)) if getattr(op, "shared", 0) else {}
    return op.model_copy(update=dict(width=s.dim(op.width), hidden=s.dim(op.hidden), **shared))


def _shrink_heads(op, s):  # ssm, linear attention: heads (and groups, state) kept, each head narrower (heads=: the inner width cut anew)
    heads, head_dim = s.split(op.heads, op.head_dim, op.op.replace("_", " "))
    groups = dict(groups=s.divisor(op.groups, heads)) if isinstance(op, ir.Ssm) else {}
    return op.model_copy(update=dict(width=s.dim(op.width), heads=heads, head_dim=head_dim, **groups))


def _shrink_delta(op, s):  # heads and key heads kept, each head (key and value) narrower (heads=: the value heads)
    heads, v_dim = s.split(op.heads, op.v_dim, "gated delta")
    k_heads = s.divisor(op.k_heads, heads)
    head_dim = s.dim(op.head_dim) if s.heads is None else max(1, s.dim(op.k_heads * op.head_dim) // k_heads)
    return op.model_copy(update=dict(width=s.dim(op.width), heads=heads, k_heads=k_heads, head_dim=head_dim, v_dim=v_dim))


def _shrink_mamba1(op, s):  # state kept, the channels narrower; the step's rank kept unless it is Mamba's default, ceil(width / 16)
    width = s.dim(op.width)
    rank = math.ceil(width / 16) if op.dt_rank == math.ceil(op.width / 16) else op.dt_rank
    return op.model_copy(update=dict(width=width, inner=s.dim(op.inner), dt_rank=rank))


def _shrink_linear(op, s):  # a projection to the vocabulary gives the new one
    return op.model_copy(update=dict(width=s.dim(op.width), out=s.out(op.out)))


def _shrink_latent(op, s):  # heads kept; each head, its rotary key and the latents narrower
    rot = max(2, s.dim(op.rotary_dims) // 2 * 2)
    heads, head_dim = s.split(op.heads, op.head_dim, "latent attention")
    _, v_dim = s.split(op.heads, op.v_dim, "latent attention")
    return op.model_copy(update=dict(width=s.dim(op.width), heads=heads, head_dim=head_dim, v_dim=v_dim, rotary_dims=rot,
                                     latent=s.dim(op.latent), q_latent=None if op.q_latent is None else s.dim(op.q_latent)))


def _shrink_attention(a, s):
    width = s.dim(a.width)
    inner = s.dim(a.heads * a.head_dim)
    if s.heads is not None:  # heads=: the inner width cut into that many heads, of even size
        heads, head_dim = s.heads, inner // s.heads // 2 * 2
        if not head_dim:
            raise ShrinkError(f"attention at --width {s.new} is {inner} wide inside: too narrow for {heads} heads of even size",
                              "choose fewer --heads or a larger --width", code="E0207")
        return a.model_copy(update=dict(width=width, heads=heads, kv_heads=s.divisor(a.kv_heads, heads), head_dim=head_dim,
                                        rotary_dims=_rotary(a, head_dim), window=s.window(a.window)))
    if s.new == s.old:  # the width as written: the heads too
        return a.model_copy(update=dict(window=s.window(a.window)))
    # keep the head count where it still divides the inner width into even heads; else fewer heads
    heads = next((h for h in range(min(a.heads, inner), 0, -1) if inner % h == 0 and (inner // h) % 2 == 0), None)
    if heads is None:
        raise ShrinkError(f"attention at width {width} cannot be split into heads of even size",
                          "choose a --width that is a multiple of the spec's head count times 2", code="E0207")
    group = a.heads // a.kv_heads
    kv = max(1, heads // group)
    while heads % kv:
        kv -= 1
    head_dim = inner // heads
    return a.model_copy(update=dict(width=width, heads=heads, kv_heads=kv, head_dim=head_dim, rotary_dims=_rotary(a, head_dim),
                                    window=s.window(a.window)))


def _rotary(a, head_dim: int) -> int:
    """An attention's rotary dimensions at a new head size: the same share of each head, even."""
    if not a.rotary_dims:
        return 0
    rotary = max(2, int(a.rotary_dims / a.head_dim * head_dim) // 2 * 2)
    return min(rotary, head_dim - head_dim % 2)


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
    if a.sinks:
        n += a.heads  # gpt-oss's sinks: one learned logit per head
    n += _gate_rows(a) * (a.width + a.bias)  # the output gate's projection (biased as q, k, v are)
    return n


def _gate_rows(a: ir.Attention) -> int:
    """The output gate's projection rows: one per channel of every head, one per head, or none."""
    return {"none": 0, "channel": a.heads * a.head_dim, "head": a.heads}[getattr(a, "gate", "none")]


def attended(a, n: int) -> int:
    """Positions each query attends to at context length n."""
    window = getattr(a, "window", None)
    return min(n, window) if window is not None else n


def _attention_flops(a: ir.Attention, n: int, w: int = 0) -> tuple[int, int]:
    q, kv = _qkv(a)
    return 2 * (a.width * (q + _kv_rows(a, kv) + _gate_rows(a)) + q * a.width), 4 * q * attended(a, n)


def _attention_activations(a: ir.Attention, n: int = 0) -> tuple[int, int]:
    q, kv = _qkv(a)
    return a.width + 2 * q + 2 * kv + 2 * _gate_rows(a), a.heads  # the gate's logits and the gated output


def _attention_state(a: ir.Attention, n: int) -> int:
    if a.kv_reuse is not None:  # reads the storing layer's cache: none of its own
        return 0
    return 2 * a.kv_heads * a.head_dim * attended(a, n)  # K and V of every attended position


def _attention_whole(a: ir.Attention) -> str | None:
    """Why an attention stays whole under tensor parallelism (the per-head sinks and the output gate are not split yet)."""
    return "its per-head sinks" if a.sinks else "its output gate" if a.gate != "none" else None


def _rotary_table(a) -> tuple | None:
    """The table's key: (dims, base, scaling), and the head width when the pairs spread over the head
    (Gemma 4's proportional rope: frequencies base^(-2i/head_dim), a table of its own)."""
    if not a.rotary_dims:
        return None
    k = (a.rotary_dims, a.rotary_base, getattr(a, "rotary_scaling", None))
    return k + (a.head_dim,) if getattr(a, "rotary_spread", False) else k


def rotary_tables(parts) -> list[tuple]:
    """The distinct rotary tables (dims, base, scaling) the parts rotate by, in order: the model
    allocates each once, 2 x context x dims values (cos and sin)."""
    return list(dict.fromkeys(k for p in parts if (k := kind_of(p).rotary(p)) is not None))


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
    n = m.width * m.experts + m.experts * mlp_params(m.width, m.hidden, m.act, m.bias)  # router: no bias ...
    n += m.experts if m.router_bias else 0  # ... but gpt-oss's
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
    return proj + conv + 3 * s.heads + (s.inner if s.out_norm != "none" else 0)  # dt_bias, A_log, D per head; the gated norm's gain


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


def _delta_in(d: ir.GatedDelta) -> int:
    return 2 * d.key_dim + 2 * d.value_dim + 2 * d.heads  # in_proj rows: q, k, v, the gate z, b and a


def _delta_params(d: ir.GatedDelta, w: int) -> int:
    # the projections (no biases, as Qwen3-Next), the depthwise conv (no bias), dt_bias and A_log
    # per value head, the gated norm's gain (v_dim, shared by the heads)
    return d.width * _delta_in(d) + d.value_dim * d.width + d.conv_dim * d.conv + 2 * d.heads + d.v_dim


def _delta_flops(d: ir.GatedDelta, n: int, w: int = 0) -> tuple[int, int]:
    # mixing per value head and token: inside a chunk the q.k and k.k scores (2 x chunk x 2 head_dim)
    # and the scores' weighted sum of the new values (2 x chunk x v_dim); across chunks the state read
    # by the decayed keys and by q and written by k (3 x 2 x head_dim x v_dim): a fixed cost once n
    # passes the chunk. The triangular solve for the new values is not a matrix product FlopCounterMode
    # counts (about chunk x (head_dim + v_dim) per token), so it is left out, as the counter leaves it.
    proj = 2 * (d.width * _delta_in(d) + d.value_dim * d.width) + 2 * d.conv_dim * d.conv
    inside = 2 * min(n, d.chunk) * d.heads * (2 * d.head_dim + d.v_dim)
    return proj, inside + 6 * d.heads * d.head_dim * d.v_dim


def _delta_state(d: ir.GatedDelta, n: int) -> int:
    return d.conv_dim * (d.conv - 1) + d.heads * d.head_dim * d.v_dim  # the conv window and S per value head
def _short_conv_params(c: ir.ShortConv, w: int) -> int:
    # in_proj to [B | C | x], the depthwise filters, out_proj; bias (LFM2's conv_bias) on all three
    return 4 * c.width * c.width + c.width * c.size + (5 * c.width if c.bias else 0)


def _short_conv_state(c: ir.ShortConv, n: int) -> int:
    return c.width * min(n, c.size - 1) if c.causal else 0  # the last size - 1 values of B * x


def _gate_params(m: ir.GateMerge, w: int) -> int:
    return w * w + w  # g = sigmoid(W x + b), one gate per channel


def _hyper_params(m: ir.HyperMerge, w: int) -> int:
    """[pre | post | res] (n + n + n x n); dynamic: the projection onto them and its scales (hyper:
    (2 + n) x width, 2 scales and the LayerNorm's gain and bias; manifold: (2 + n) n x n width, 3 scales)."""
    n = m.streams
    base = (2 + n) * n
    if m.connections == "manifold":
        return base + base * n * w + 3
    return base + ((2 + n) * w + 2 + 2 * w if m.dynamic else 0)


def _hyper_flops(m: ir.HyperMerge, t: int, w: int) -> tuple[int, int]:
    """Per token: the read (n x width) and the streams' mixing (n x n x width; writing the output into
    each stream is elementwise); dynamic: the projection onto the weights (hyper: per stream,
    (2 + n) x width; manifold: (2 + n) n x n width)."""
    n = m.streams
    mix = 2 * (n * w + n * n * w)
    if m.connections == "manifold":
        return mix + 2 * (2 + n) * n * n * w, 0
    return mix + (2 * n * (2 + n) * w if m.dynamic else 0), 0


# --- the table -----------------------------------------------------------------------------

OPS: tuple[Kind, ...] = (
    Kind(ir.Norm, "layernorm|rmsnorm", "norm", "valve", "valve", "norm", "valve",
         params=_norm_params, activations=lambda x, n=0: (x.width, 0), shrink=_shrink_width, ml_phrase='norm',
         buffers=lambda x: 1 if x.type == "scalar" else 0),  # Gemma 4's layer_scalar: a fixed gain the weights bring
    Kind(ir.Attention, "attention", "attn", "mixer", "injector", "attention", "injector: mixes positions",
         out_proj=True, params=_attention_params, flops=_attention_flops, activations=_attention_activations, state=_attention_state,
         mixes_positions=True, masked=True, state_kind="kv", tp="heads", tp_whole=_attention_whole, rotary=_rotary_table, buffers=lambda a: a.heads if a.alibi else 0,
         shrink=_shrink_attention, ml_phrase='attention: the only place positions mix'),
    Kind(ir.LatentAttention, "attention", "attn", "mixer", "latent injector", "latent attention",
         "latent injector: mixes positions through a compressed KV latent",
         out_proj=True, params=_mla_params, flops=_mla_flops, state=_mla_state,
         activations=lambda x, n=0: (x.width + x.latent + (x.q_latent or 0) + x.heads * (2 * (x.head_dim + x.rotary_dims) + 2 * x.v_dim), x.heads),
         mixes_positions=True, masked=True, state_kind="kv", rotary=_rotary_table, shrink=_shrink_latent, ml_phrase='latent attention: positions mix through a compressed key/value latent'),
    Kind(ir.Mlp, "mlp", "mlp", "reactor", "combustor", "MLP", "combustion: reacts at each position",
         out_proj=True, params=lambda x, w: mlp_params(x.width, x.hidden, x.act, x.bias),
         flops=lambda x, n, w=0: (2 * mlp_params(x.width, x.hidden, x.act, False), 0),
         activations=lambda x, n=0: (_mlp_activations(x.width, x.hidden, x.act), 0), tp="hidden", shrink=_shrink_hidden,
         tp_whole=lambda m: "Gemma 4's per-layer gate reads the whole per-layer input" if m.per_layer else None, ml_phrase='MLP: applied at each position on its own'),
    Kind(ir.Moe, "moe", "moe", "reactor", "liquid-liquid injector", "MoE", "liquid-liquid injection: routed experts",
         out_proj=True, params=_moe_params, flops=_moe_flops, mup_sub=(("router", "output"),),  # width -> experts: a fixed fan-out
         buffers=lambda x: x.experts if x.correction else 0,  # the selection bias: moved by its load rule (or held), never by the optimizer
         activations=lambda x, n=0: (x.width + x.top * x.hidden * (3 if is_gated(x.act) else 2), 0), tp="hidden", shrink=_shrink_hidden, ml_phrase='mixture of experts: each token goes to its top experts'),
    Kind(ir.Pool, "pool", "pool", "mixer", "passive mixer", "pool", "injector: pooling mixer",
         params=lambda x, w: 0, state=_pool_state, mixes_positions=True, masked=True, state_kind="window", shrink=_shrink_width, ml_phrase='pooling: the mean over nearby positions'),
    Kind(ir.Conv, "conv", "conv", "mixer", "swirl injector", "conv", "swirl injector: mixes a few neighbouring positions",
         out_proj=True, params=lambda x, w: x.width * x.size + (x.width if x.bias else 0), flops=lambda x, n, w=0: (2 * x.width * x.size, 0),
         activations=lambda x, n=0: (x.width, 0), state=lambda x, n: x.width * min(n, x.size - 1) if x.causal else 0,
         mixes_positions=True, masked=True, state_kind="window",
         mup="vector", shrink=_shrink_width, ml_phrase='depthwise convolution: mixes a few neighbouring positions'),  # depthwise filters: the fan-in is the kernel size, which no width changes
    Kind(ir.Ssm, "ssm", "ssm", "mixer", "regenerative jacket", "SSM", "regenerative jacket: a selective state carries the flow along",
         out_proj=True, params=_ssm_params, flops=_ssm_flops, state=_ssm_state,
         activations=lambda x, n=0: (x.width + 2 * (x.inner + x.conv_dim + x.heads) + 2 * x.inner + x.heads * x.state, 0),
         mixes_positions=True, masked=True, state_kind="recurrent",
         mup_sub=(("conv1d", "vector"),), shrink=_shrink_heads, ml_phrase='selective state-space mixer: a fixed-size state carries the past'),  # depthwise filters, as conv's: the fan-in is the kernel size
    Kind(ir.Mamba1, "ssm", "ssm", "mixer", "regenerative jacket", "SSM (Mamba-1)",
         "regenerative jacket: a selective state per channel carries the flow along",
         out_proj=True, params=_mamba1_params, flops=_mamba1_flops, state=_mamba1_state,
         activations=lambda x, n=0: (x.width + 4 * x.inner + 2 * (x.dt_rank + 2 * x.state) + x.inner * x.state, 0),
         mixes_positions=True, masked=True, state_kind="recurrent",
         mup_sub=(("conv1d", "vector"),), shrink=_shrink_mamba1, ml_phrase='selective state-space mixer (Mamba-1): a fixed-size state per channel carries the past'),
    Kind(ir.LinearAttention, "linear_attention", "attn", "mixer", "expander injector", "linear attention",
         "expander injector: mixes positions through a fixed-size state",
         out_proj=True, params=_la_params, flops=_la_flops, state=_la_state, buffers=lambda x: x.heads if x.decay else 0,
         activations=lambda x, n=0: (x.width + 5 * x.heads * x.head_dim, 0),
         mixes_positions=True, masked=True, state_kind="recurrent", shrink=_shrink_heads, ml_phrase='linear attention: positions mix through a fixed-size state'),
    Kind(ir.GatedDelta, "delta", "delta", "mixer", "pintle injector", "gated DeltaNet",
         "pintle injector: a metered, decaying state written key by key carries the flow along",
         out_proj=True, params=_delta_params, flops=_delta_flops, state=_delta_state,
         activations=lambda x, n=0: (x.width + 2 * _delta_in(x) + 2 * x.conv_dim + 4 * x.value_dim + 2 * x.heads, 0),
         mixes_positions=True, masked=True, state_kind="recurrent", shrink=_shrink_delta,
         # replicated under TP: q and k are shared by groups of value heads and the conv runs over the fused
         # [q | k | v] channels, so a split by heads needs its own row plan (not written yet)
         mup_sub=(("conv1d", "vector"),), ml_phrase='gated DeltaNet: the delta rule writes a decaying fixed-size state key by key'),
    Kind(ir.ShortConv, "short_conv", "short_conv", "mixer", "pintle injector", "short conv",
         "pintle injector: a gated swirl of a few neighbouring positions",
         out_proj=True, params=_short_conv_params, flops=lambda x, n, w=0: (2 * 4 * x.width * x.width + 2 * x.width * x.size, 0),
         activations=lambda x, n=0: (7 * x.width, 0), state=_short_conv_state,  # x, [B | C | x], B·x, the conv's output, C·y
         mixes_positions=True, masked=True, state_kind="window", shrink=_shrink_width, mup_sub=(("conv", "vector"),),  # depthwise filters, as conv's
         ml_phrase='short gated convolution: B·x convolved over a few neighbouring positions, times C'),
    Kind(ir.Linear, "linear", "linear", "projection", "duct", "linear", "a single projection",
         out_proj=True, params=lambda x, w: x.width * x.out + (x.out if x.bias else 0), flops=lambda x, n, w=0: (2 * x.width * x.out, 0),
         activations=lambda x, n=0: (x.width, 0), shrink=_shrink_linear, ml_phrase='a linear projection'),
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
    # hyper-connections: the branch reads a mix of the chamber's n streams and writes into each; its
    # projections map the width onto a fixed number of stream weights (μP: an output layer's rule, as
    # an MoE's router); the weights are computed whole on every rank (tp: replicate). Activations: none counted
    # (a merge's record is not told the width; the streams the junction keeps, n x width per token, are missing
    # from the report's activation figure)
    Kind(ir.HyperMerge, "hyper", "hyper", "merge", "chamber manifold", "hyper-connection", "chamber manifold: reads and feeds several chambers",
         params=_hyper_params, flops=_hyper_flops, formula="x\u2096 \u2190 post\u2096\u00b7f(\u03a3 pre\u2c7c x\u2c7c) + \u03a3 res\u2c7c\u2096 x\u2c7c",
         fields=("hyper",), mup="output",
         ml_phrase="hyper-connection: the branch reads a learned mix of the residual streams, writes into each, and the streams are mixed"),
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


class RegistryError(RuntimeError):
    """A kind missing from one of the tables that must list every kind: the contributor's error,
    raised when the module holding the table is imported, never a user's diagnostic."""


def registered(table, name: str, classes=None) -> None:
    """Every kind of `classes` (default: every op and merge kind) has an entry in `table` (keyed by IR
    class, or a callable answering whether a class has one); else a RegistryError naming both."""
    has = table if callable(table) else table.__contains__
    for cls in classes if classes is not None else (*ir.OP_TYPES, *ir.MERGE_TYPES):
        if not has(cls):
            raise RegistryError(f"internal error: kind {cls.__name__} has no entry in {name}")


registered(KINDS, "cyclelang/ir/kinds.py KINDS")
registered(lambda cls: KINDS[cls].shrink is not None, "cyclelang/ir/kinds.py (its record's shrink rule)", ir.OP_TYPES)
for _k in OPS:  # a record whose class the IR's unions do not admit would be refused as a missing turbine
    registered(lambda c: c in ir.OP_TYPES, "cyclelang/ir/turbines.py TURBINE_TYPES", (_k.cls,))
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
