"""Gated DeltaNet (`turbine delta`): its variant and its emitter. The chunked scan and its
one-step form are runtime/scan.py's `gated_delta_scan`; decoding keeps the conv window and
the state S in the Cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from .config import Sizes
from .ops import OpEmitter, call_args
from .records import OpPlan, Plan
from .writer import Writer


@dataclass(frozen=True)
class GatedDeltaVariant:
    kind: ClassVar[type] = ir.GatedDelta
    base: ClassVar[str] = "GatedDeltaNet"
    causal: bool  # always, by the resolver (E0284): the forward takes a cache
    negative: bool = False  # beta = 2 sigmoid(b) (OLMo Hybrid's allow_neg_eigval)

    @classmethod
    def of(cls, d: ir.GatedDelta, causal: bool) -> "GatedDeltaVariant":
        return cls(causal, d.negative_eigenvalues)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.causal else ()


class GatedDeltaEmitter(OpEmitter):
    variant = GatedDeltaVariant

    def cache_states(self, op) -> tuple[str, ...]:
        return ("window", "recurrent")  # the short convs' last inputs, then the delta rule's state

    def sizes(self, d: ir.GatedDelta, c: Sizes, scope) -> dict:
        width = c.width(d.width, scope)
        heads = c.field("delta_heads", d.heads, scope, "the gated delta rule's value heads, each with its own state (num_v_heads)", let=d.let_of("heads"))
        k_heads = c.field("delta_k_heads", d.k_heads, scope, "its query/key heads, each read by delta_heads // delta_k_heads value heads", let=d.let_of("k_heads"))
        c.divides(k_heads, heads, "each group of value heads reads one query/key head")
        return {"width": width, "heads": heads, "k_heads": k_heads,
                "head_dim": c.field("delta_head_dim", d.head_dim, scope, "each query/key head's width", let=d.let_of("head_dim")),
                "v_dim": c.field("delta_v_dim", d.v_dim, scope, "each value head's width", let=d.let_of("v_dim")),
                "conv": c.field("delta_conv", d.conv, scope, "the short depthwise causal conv's kernel", let=d.let_of("conv")),
                "chunk": c.field("delta_chunk", d.chunk, scope, "positions per chunk of the training form", let=d.let_of("chunk")),
                "eps": c.field("delta_eps", d.eps, scope, "the gated RMSNorm's epsilon", "float", let=d.let_of("eps"))}

    def ctor(self, o: OpPlan) -> str:
        a = o.args
        return f"{o.cls}({call_args(str(a['width']), **{k: str(a[k]) for k in ('heads', 'k_heads', 'head_dim', 'v_dim', 'conv', 'chunk', 'eps')})})"

    def runtime(self, op, causal: bool) -> tuple[str, ...]:
        return ("gated_delta_scan",)

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.out_proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.in_proj_qkv.weight[2 * {a}.key_dim :].mul_({beta})  # v: the last rows", f"{a}.out_proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: GatedDeltaVariant, plan: Plan) -> None:
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            out.block('''"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024): positions mix through a decaying state written key by key.

Projections to q, k, v, an output gate z, and per value head b and a; a short depthwise causal
conv with silu over [q | k | v]; q and k L2-normalised; per value head the gated delta rule
S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t, with the decay
g_t = -exp(A_log) softplus(a_t + dt_bias) and the write strength beta_t = sigmoid(b_t); groups of
heads // k_heads value heads read one query/key head. A gated RMSNorm per head, norm(o) * silu(z),
then out_proj. Parameter names follow transformers' Qwen3_5GatedDeltaNet. Chunked for a sequence,
one step at a time when decoding; the Cache keeps the conv window and S only.
"""''')
            w()
            w("A_RANGE = (1.0, 16.0)  # exp(A_log), the decay's rate per head, starts uniform in this range")
            w()
            with out.constructor("width", "heads", "k_heads", "head_dim", "v_dim", "conv", "chunk", "eps"):
                out.block('''
self.heads, self.k_heads, self.head_dim, self.v_dim, self.chunk, self.eps = heads, k_heads, head_dim, v_dim, chunk, eps
self.key_dim, self.value_dim = k_heads * head_dim, heads * v_dim
conv_dim = 2 * self.key_dim + self.value_dim  # the conv mixes q, k and v
self.in_proj_qkv = nn.Linear(width, conv_dim, bias=False)  # rows [q | k | v]
self.in_proj_z = nn.Linear(width, self.value_dim, bias=False)  # the output gate
self.in_proj_b = nn.Linear(width, heads, bias=False)  # beta = sigmoid(b): how strongly each head writes
self.in_proj_a = nn.Linear(width, heads, bias=False)  # the decay's input
self.conv1d = nn.Conv1d(conv_dim, conv_dim, conv, groups=conv_dim, bias=False)  # depthwise
self.dt_bias = nn.Parameter(torch.ones(heads))
self.A_log = nn.Parameter(torch.log(torch.empty(heads).uniform_(*self.A_RANGE)))  # the decay's rate per head
self.norm = nn.Parameter(torch.ones(v_dim))  # the gated RMSNorm's gain, shared by the heads
self.out_proj = nn.Linear(self.value_dim, width, bias=False)''')
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                beta = ("beta = 2 * torch.sigmoid(self.in_proj_b(x)).transpose(1, 2)  # (B, nh, T): in (0, 2), negative eigenvalues allowed"
                        if v.negative else "beta = torch.sigmoid(self.in_proj_b(x)).transpose(1, 2)  # (B, nh, T)")
                out.block('''
B, T, _ = x.size()
qkv = self.in_proj_qkv(x)
K = self.conv1d.kernel_size[0]''')
                if v.causal:
                    w("h = qkv if cache is None else cache.extend_pool(self.conv1d, qkv, K - 1)  # (B, P + T, conv_dim): the conv window first")
                else:
                    w("h = qkv")
                out.block('''
qkv = F.silu(self.conv1d(F.pad(h.transpose(1, 2), (K - 1, 0)))[..., -T:]).transpose(1, 2)  # (B, T, conv_dim)
q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
group = self.heads // self.k_heads
q = q.view(B, T, self.k_heads, self.head_dim).transpose(1, 2).repeat_interleave(group, dim=1)  # (B, nh, T, hd)
k = k.view(B, T, self.k_heads, self.head_dim).transpose(1, 2).repeat_interleave(group, dim=1)  # (B, nh, T, hd)
v = v.view(B, T, self.heads, self.v_dim).transpose(1, 2)  # (B, nh, T, vd)
BETA
work = torch.promote_types(x.dtype, torch.float32)  # the decay in float32 at least (float64 stays)
g = (-self.A_log.to(work).exp() * F.softplus(self.in_proj_a(x).to(work) + self.dt_bias.to(work))).transpose(1, 2)  # (B, nh, T): log decay'''.replace("BETA", beta))
                if v.causal:
                    w("o, state = gated_delta_scan(q, k, v, g, beta, self.chunk, None if cache is None else cache.recurrent(self))")
                    out.nested("if cache is not None:", "cache.keep(self, state)  # (B, nh, hd, vd): all the rule remembers")
                else:
                    w("o, _ = gated_delta_scan(q, k, v, g, beta, self.chunk)")
                out.block('''
o = o.transpose(1, 2)  # (B, T, nh, vd)
o = o.to(work)
o = (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.norm  # the RMSNorm per head
o = o * F.silu(self.in_proj_z(x).view(B, T, self.heads, self.v_dim).to(work))  # the output gate
return self.out_proj(o.reshape(B, T, self.value_dim).to(x.dtype))''')
