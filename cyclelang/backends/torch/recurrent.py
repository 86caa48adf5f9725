"""The recurrent mixers: `turbine ssm` (Mamba-2) and `turbine linear_attention`, their
variants and emitters. Both scan a state of fixed size (runtime/scan.py): chunk by chunk
for a sequence, one step at a time when decoding, with the state kept in the Cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import math

from ... import ir
from .config import Expr, Sizes
from .ops import OpEmitter, call_args, head_sizes
from .records import OpPlan, Plan
from .writer import Writer, num


@dataclass(frozen=True)
class SsmVariant:
    kind: ClassVar[type] = ir.Ssm
    base: ClassVar[str] = "Ssm"
    causal: bool  # the engine's throat: the forward takes a cache
    out_norm: str = "gated"  # gated: rmsnorm(y * silu(z)); before_gate: rmsnorm(y) * silu(z); none: y * silu(z)
    scales: tuple = ()  # in_proj's rows z, x, B, C, dt times these (Falcon-H1's ssm_multipliers); (): none

    @classmethod
    def of(cls, s: ir.Ssm, causal: bool) -> "SsmVariant":
        return cls(causal, s.out_norm, () if s.scales == (1.0,) * 5 else tuple(s.scales))

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.causal else ()


class SsmEmitter(OpEmitter):
    variant = SsmVariant

    def sizes(self, s: ir.Ssm, c: Sizes, scope) -> dict:
        width = c.width(s.width, scope)
        heads = c.field("ssm_heads", s.heads, scope, "the scan's heads (Mamba-2's num_heads)", let=s.let_of("heads"))
        out = {"width": width, "heads": heads}
        if s.inner % s.width == 0 and s.let_of("head_dim") is None:  # Mamba's expand: the inner width is expand x width
            expand = c.field("ssm_expand", s.inner // s.width, scope, "the scan's inner width = ssm_expand x width (Mamba's expand)", let=s.let_of("expand"))
            out["head_dim"] = c.prop("ssm_head_dim", s.head_dim, scope, "channels per scan head",
                                     lambda: f"{expand.own} * {width.own} // {heads.own}")
            c.check(lambda: f"({expand.own} * {width.own}) % {heads.own} == 0",
                    lambda: f"{heads.name} ({{{heads.own}}}) must divide {expand.name} x {width.name} ({{{expand.own} * {width.own}}}): the heads split the inner width evenly")
        else:
            out["head_dim"] = c.field("ssm_head_dim", s.head_dim, scope, "channels per scan head", let=s.let_of("head_dim"))
        groups = c.field("ssm_groups", s.groups, scope, "groups of heads sharing B and C (Mamba-2's n_groups)", let=s.let_of("groups"))
        c.divides(groups, heads, "each group of scan heads shares one B and one C")
        out.update(state=c.field("ssm_state", s.state, scope, "the state size N of each scan head (d_state)", let=s.let_of("state")), groups=groups,
                   conv=c.field("ssm_conv", s.conv, scope, "the depthwise causal conv's kernel (d_conv)", let=s.let_of("conv")),
                   chunk=c.field("ssm_chunk", s.chunk, scope, "positions per chunk of the training scan", let=s.let_of("chunk")),
                   eps=c.field("norm_eps", s.eps, scope, "the norms' epsilon", "float", let=s.let_of("eps")))
        for name, value, doc in (("dt_min", s.dt_min, "the step size's init range, log-uniform: lower end"),
                                 ("dt_max", s.dt_max, "the step size's init range: upper end"),
                                 ("dt_lo", s.dt_lo, "the step size is clamped to [dt_lo, dt_hi]"),
                                 ("dt_hi", s.dt_hi, "the step size's upper clamp")):
            out[name] = "None" if value is None else c.field(name, value, scope, doc, "float", let=s.let_of(name))
        c.check(lambda: f"{out['dt_min'].own} <= {out['dt_max'].own}",
                lambda: f"dt_min ({{{out['dt_min'].own}}}) must be at most dt_max ({{{out['dt_max'].own}}})")
        return out

    def ctor(self, o: OpPlan) -> str:
        s, a = o.op, o.args
        return f"{o.cls}({call_args(str(a['width']), **{k: str(a[k]) for k in ('heads', 'head_dim', 'state', 'groups', 'conv', 'chunk')}, bias=num(s.bias), conv_bias=num(s.conv_bias), **{k: str(a[k]) for k in ('eps', 'dt_min', 'dt_max', 'dt_lo', 'dt_hi')})})"

    def runtime(self, op, causal: bool) -> tuple[str, ...]:
        return ("ssd_scan", "gated_rms_norm")

    def cache_states(self, op) -> tuple[str, ...]:
        return ("window", "recurrent")  # the conv's last inputs, then the scan's state

    def needs_math(self, op) -> bool:
        return True  # the dt bias's log-uniform init

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.out_proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.out_proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: SsmVariant, plan: Plan) -> None:
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            out.block('''"""Selective state-space mixer (Mamba-2, Dao & Gu 2024): a regenerative jacket.

in_proj gives a gate z, the conv input (x, B, C) and a step size per head; a depthwise
causal conv and silu; the selective scan h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,
y_t = h_t C_t + D x_t; a gated RMSNorm of y * silu(z) per group; out_proj. Parameter
names follow transformers' Mamba2Mixer. Decoding keeps the conv window and h only.
"""''')
            w()
            w("DT_FLOOR = 1e-4  # the smallest step size dt's bias starts at (mamba_ssm's dt_init_floor)")
            w()
            with out.constructor("width", "heads", "head_dim", "state", "groups", "conv", "chunk", "bias", "conv_bias", "eps",
                                 "dt_min", "dt_max", "dt_lo", "dt_hi"):
                out.block('''
self.heads, self.head_dim, self.state, self.groups, self.chunk = heads, head_dim, state, groups, chunk
self.eps, self.dt_lo, self.dt_hi = eps, dt_lo, dt_hi
self.inner = heads * head_dim
self.conv_dim = self.inner + 2 * groups * state  # the conv mixes x, B and C
self.in_proj = nn.Linear(width, self.inner + self.conv_dim + heads, bias=bias)  # rows [z | x B C | dt]
self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv, groups=self.conv_dim, bias=conv_bias)  # depthwise
dt = torch.exp(torch.rand(heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=self.DT_FLOOR)
self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt, log-uniform in [dt_min, dt_max]
self.A_log = nn.Parameter(torch.log(torch.arange(heads, dtype=torch.float32) + 1))  # A = -exp(A_log): -1 .. -heads (S4D real)
self.D = nn.Parameter(torch.ones(heads))  # the skip past the scan''')
                if v.out_norm != "none":
                    w("self.norm = nn.Parameter(torch.ones(self.inner))  # the gated RMSNorm's gain")
                w("self.out_proj = nn.Linear(self.inner, width, bias=bias)")
                if v.scales:
                    w(f"scales = ({', '.join(num(float(x)) for x in v.scales)})  # z, x, B, C, dt")
                    w("rows = (self.inner, self.inner, groups * state, groups * state, heads)")
                    w("self.register_buffer(\"scales\", torch.cat([torch.full((n,), s) for n, s in zip(rows, scales)]), persistent=False)  # in_proj's rows, section by section")
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                w("B, T, _ = x.size()")
                if v.scales:
                    w("z, xbc, dt = (self.in_proj(x) * self.scales).split([self.inner, self.conv_dim, self.heads], dim=-1)  # each section scaled")
                else:
                    w("z, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, self.heads], dim=-1)")
                w("K = self.conv1d.kernel_size[0]")
                if v.causal:
                    w("h = xbc if cache is None else cache.extend_pool(self.conv1d, xbc, K - 1)  # (B, P + T, conv_dim): the conv window first")
                else:
                    w("h = xbc")
                out.block('''
xbc = F.silu(self.conv1d(F.pad(h.transpose(1, 2), (K - 1, 0)))[..., -T:]).transpose(1, 2)  # (B, T, conv_dim)
u, b, c = xbc.split([self.inner, self.groups * self.state, self.groups * self.state], dim=-1)
u = u.view(B, T, self.heads, self.head_dim)  # (B, T, nh, hd)
b = b.view(B, T, self.groups, self.state).repeat_interleave(self.heads // self.groups, dim=2)  # (B, T, nh, N)
c = c.view(B, T, self.groups, self.state).repeat_interleave(self.heads // self.groups, dim=2)  # (B, T, nh, N)
dt = F.softplus(dt + self.dt_bias).clamp(min=self.dt_lo, max=self.dt_hi)  # (B, T, nh)''')
                if v.causal:
                    w("y, h = ssd_scan(u, dt, -torch.exp(self.A_log), b, c, self.chunk, None if cache is None else cache.recurrent(self))")
                    out.nested("if cache is not None:", "cache.keep(self, h)  # (B, nh, hd, N): all the scan remembers")
                else:
                    w("y, _ = ssd_scan(u, dt, -torch.exp(self.A_log), b, c, self.chunk)")
                out.block('''
y = y + u * self.D[:, None]  # (B, T, nh, hd)''')
                if v.out_norm == "gated":
                    w("y = gated_rms_norm(y.reshape(B, T, self.inner), z, self.norm, self.groups, self.eps)")
                elif v.out_norm == "before_gate":
                    out.block('''
work = torch.promote_types(y.dtype, torch.float32)  # float32 or wider
h = y.reshape(B, T, self.groups, -1).to(work)
h = self.norm * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(B, T, self.inner)  # rmsnorm(y) per group
y = h * F.silu(z.to(work))  # then the gate''')
                else:
                    w("y = y.reshape(B, T, self.inner) * F.silu(z)  # gated, not normalised")
                w("return self.out_proj(y.to(x.dtype))")


@dataclass(frozen=True)
class Mamba1Variant:
    kind: ClassVar[type] = ir.Mamba1
    base: ClassVar[str] = "MambaMixer"
    norms: bool  # Jamba's RMSNorms on dt, B and C
    causal: bool  # the engine's throat: the forward takes a cache
    norms_affine: bool = True  # false: those norms have no weight (Falcon-Mamba's)

    @classmethod
    def of(cls, s: ir.Mamba1, causal: bool) -> "Mamba1Variant":
        return cls(s.norms, causal, s.norms_affine)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.causal else ()


class Mamba1Emitter(OpEmitter):
    variant = Mamba1Variant

    def sizes(self, s: ir.Mamba1, c: Sizes, scope) -> dict:
        width = c.width(s.width, scope)
        if s.inner % s.width == 0 and s.let_of("inner") is None:  # Mamba's expand: the inner width is expand x width
            expand = c.field("ssm_expand", s.inner // s.width, scope, "the scan's inner width = ssm_expand x width (Mamba's expand)", let=s.let_of("expand"))
            inner = Expr(lambda: f"{expand} * {width}")
        else:
            inner = c.field("ssm_inner", s.inner, scope, "the scan's inner width (channels)", let=s.let_of("inner"))
        if s.dt_rank == math.ceil(s.width / 16) and s.let_of("dt_rank") is None:  # Mamba's default: ceil(width / 16)
            dt_rank = c.prop("dt_rank", s.dt_rank, scope, "the step's low-rank width: ceil(width / 16)", lambda: f"math.ceil({width.own} / 16)")
        else:
            dt_rank = c.field("dt_rank", s.dt_rank, scope, "the step's low-rank width", let=s.let_of("dt_rank"))
        out = {"width": width, "inner": inner, "dt_rank": dt_rank,
               "state": c.field("ssm_state", s.state, scope, "the state size N of each channel (d_state)", let=s.let_of("state")),
               "conv": c.field("ssm_conv", s.conv, scope, "the depthwise causal conv's kernel (d_conv)", let=s.let_of("conv")),
               "chunk": c.field("ssm_chunk", s.chunk, scope, "positions per chunk of the training scan", let=s.let_of("chunk")),
               "dt_min": c.field("dt_min", s.dt_min, scope, "the step size's init range, log-uniform: lower end", "float", let=s.let_of("dt_min")),
               "dt_max": c.field("dt_max", s.dt_max, scope, "the step size's init range: upper end", "float", let=s.let_of("dt_max"))}
        if s.norms:
            out["eps"] = c.field("norm_eps", s.eps, scope, "the norms' epsilon", "float", let=s.let_of("eps"))
        c.check(lambda: f"{out['dt_min'].own} <= {out['dt_max'].own}",
                lambda: f"{out['dt_min'].name} ({{{out['dt_min'].own}}}) must be at most {out['dt_max'].name} ({{{out['dt_max'].own}}})")
        return out

    def ctor(self, o: OpPlan) -> str:
        s, a = o.op, o.args
        return f"{o.cls}({call_args(str(a['width']), **{k: str(a[k]) for k in ('inner', 'state', 'dt_rank', 'conv', 'chunk')}, bias=num(s.bias), conv_bias=num(s.conv_bias), eps=str(a['eps']) if 'eps' in a else None, dt_min=str(a['dt_min']), dt_max=str(a['dt_max']))})"

    def runtime(self, op, causal: bool) -> tuple[str, ...]:
        return ("selective_scan",)

    def cache_states(self, op) -> tuple[str, ...]:
        return ("window", "recurrent")  # the conv's last inputs, then the scan's state

    def needs_math(self, op) -> bool:
        return True  # the step size's log-uniform init

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.out_proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.out_proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: Mamba1Variant, plan: Plan) -> None:
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            out.block('''"""Selective state-space mixer (Mamba-1, Gu & Dao 2023): a regenerative jacket, one state per channel.

in_proj gives the scan's input x and a gate z; a depthwise causal conv and silu; x_proj gives
a low-rank step and B, C''' + ((" (each RMS-normalised, as Jamba's)" if v.norms_affine else " (each RMS-normalised without a weight, as Falcon-Mamba's)")
                                  if v.norms else "") + '''; the step is
projected up to one per channel; the selective scan h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t,
y_t = h_t C_t + D x_t, with A (inner x state) a rate per channel and state dim; y * silu(z);
out_proj. Parameter names follow transformers' MambaMixer (dt_proj's are dt_weight, dt_bias:
the model's init of linears would otherwise reset the step size's). Decoding keeps the conv
window and h only.
"""''')
            w()
            w("DT_FLOOR = 1e-4  # the smallest step size dt's bias starts at (mamba_ssm's dt_init_floor)")
            w()
            args = ["width", "inner", "state", "dt_rank", "conv", "chunk", "bias", "conv_bias"] + (["eps"] if v.norms else []) + ["dt_min", "dt_max"]
            with out.constructor(*args):
                out.block('''
self.inner, self.state, self.dt_rank, self.chunk = inner, state, dt_rank, chunk
self.in_proj = nn.Linear(width, 2 * inner, bias=bias)  # rows [x | z]
self.conv1d = nn.Conv1d(inner, inner, conv, groups=inner, bias=conv_bias)  # depthwise
self.x_proj = nn.Linear(inner, dt_rank + 2 * state, bias=False)  # rows [dt | B | C]
std = dt_rank**-0.5
self.dt_weight = nn.Parameter(torch.empty(inner, dt_rank).uniform_(-std, std))  # the step's projection up to one per channel
dt = torch.exp(torch.rand(inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=self.DT_FLOOR)
self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt, log-uniform in [dt_min, dt_max]
self.A_log = nn.Parameter(torch.log(torch.arange(state, dtype=torch.float32) + 1).repeat(inner, 1))  # A = -(1 .. state) per channel (S4D real)
self.D = nn.Parameter(torch.ones(inner))  # the skip past the scan''')
                if v.norms and v.norms_affine:
                    w("self.dt_layernorm = nn.RMSNorm(dt_rank, eps=eps)  # Jamba's norms on the step, B and C")
                    w("self.b_layernorm = nn.RMSNorm(state, eps=eps)")
                    w("self.c_layernorm = nn.RMSNorm(state, eps=eps)")
                elif v.norms:
                    w("self.dt_layernorm = nn.RMSNorm(dt_rank, eps=eps, elementwise_affine=False)  # Falcon-Mamba's norms on the step, B and C: no weight")
                    w("self.b_layernorm = nn.RMSNorm(state, eps=eps, elementwise_affine=False)")
                    w("self.c_layernorm = nn.RMSNorm(state, eps=eps, elementwise_affine=False)")
                w("self.out_proj = nn.Linear(inner, width, bias=bias)")
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                out.block('''
B, T, _ = x.size()
u, z = self.in_proj(x).chunk(2, dim=-1)  # (B, T, inner) each
K = self.conv1d.kernel_size[0]''')
                if v.causal:
                    w("h = u if cache is None else cache.extend_pool(self.conv1d, u, K - 1)  # (B, P + T, inner): the conv window first")
                else:
                    w("h = u")
                out.block('''
u = F.silu(self.conv1d(F.pad(h.transpose(1, 2), (K - 1, 0)))[..., -T:]).transpose(1, 2)  # (B, T, inner)
dt, b, c = self.x_proj(u).split([self.dt_rank, self.state, self.state], dim=-1)  # (B, T, dt_rank), (B, T, N), (B, T, N)''')
                if v.norms:
                    w("dt, b, c = self.dt_layernorm(dt), self.b_layernorm(b), self.c_layernorm(c)")
                w("dt = F.softplus(F.linear(dt, self.dt_weight, self.dt_bias))  # (B, T, inner): a step per channel")
                if v.causal:
                    w("y, h = selective_scan(u, dt, -torch.exp(self.A_log), b, c, self.chunk, None if cache is None else cache.recurrent(self))")
                    out.nested("if cache is not None:", "cache.keep(self, h)  # (B, inner, N): all the scan remembers")
                else:
                    w("y, _ = selective_scan(u, dt, -torch.exp(self.A_log), b, c, self.chunk)")
                w("y = (y + u * self.D) * F.silu(z)  # (B, T, inner)")
                w("return self.out_proj(y.to(x.dtype))")


@dataclass(frozen=True)
class LinearAttentionVariant:
    kind: ClassVar[type] = ir.LinearAttention
    base: ClassVar[str] = "LinearAttention"
    feature: str  # "elu" | "relu"
    normalize: bool
    decay: bool
    causal: bool  # only the past is mixed; the forward takes a cache

    @classmethod
    def of(cls, a: ir.LinearAttention, causal: bool) -> "LinearAttentionVariant":
        return cls(a.feature, a.normalize, a.decay, a.causal)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.causal else ()


FEATURES = {"elu": "F.elu({}) + 1", "relu": "F.relu({})"}


class LinearAttentionEmitter(OpEmitter):
    variant = LinearAttentionVariant

    def sizes(self, a: ir.LinearAttention, c: Sizes, scope) -> dict:
        out = head_sizes(a, c, scope)
        out["chunk"] = c.field("chunk", a.chunk, scope, "positions per chunk of the training scan", let=a.let_of("chunk"))
        return out

    def ctor(self, o: OpPlan) -> str:
        s = o.args
        return f"{o.cls}({call_args(str(s['width']), heads=str(s['heads']), head_dim=str(s['head_dim']), chunk=str(s['chunk']), bias=num(o.op.bias))})"

    def runtime(self, op, causal: bool) -> tuple[str, ...]:
        return ("linear_scan",) if op.causal else ()

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.qkv.weight[2 * {a}.heads * {a}.head_dim :].mul_({beta})  # v: the last rows", f"{a}.proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: LinearAttentionVariant, plan: Plan) -> None:
        w = out.line
        phi = "elu(x) + 1" if v.feature == "elu" else "relu(x)"
        w(f"class {name}(nn.Module):")
        with out.indent():
            kind = "Causal linear attention" if v.causal else "Linear attention"
            doc = [f'"""{kind} (Katharopoulos et al. 2020): positions mix through a fixed-size state.', "",
                   f"softmax(q k^T) is replaced by phi(q) phi(k)^T with phi(x) = {phi}, so the keys and values"]
            if v.causal:
                doc += ["fold into a state S_t = " + ("g S_{t-1}" if v.decay else "S_{t-1}") + " + phi(k_t)^T v_t of heads x head_dim x head_dim:",
                        "y_t = phi(q_t) S_t" + (" / phi(q_t) z_t (z: the sum of phi(k), carried as a column of ones in v)." if v.normalize else ".")]
                if v.decay:
                    doc.append("Each head decays its past by g = 1 - 2^(-5 - head) (RetNet's retention).")
                doc.append("Chunked for a sequence, one step at a time when decoding: the state does not grow.")
            else:
                doc += ["of every position fold into one sum that each query reads" + (", normalised by phi(q) sum phi(k)." if v.normalize else ".")]
            out.block("\n".join(doc) + '\n"""')
            w()
            if v.normalize:
                w("EPS = 1e-6  # keeps the normaliser phi(q) z away from zero")
                w()
            with out.constructor("width", "heads", "head_dim", "chunk", "bias"):
                w("self.heads, self.head_dim, self.chunk = heads, head_dim, chunk")
                w("self.qkv = nn.Linear(width, 3 * heads * head_dim, bias=bias)  # q, k, v fused")
                w("self.proj = nn.Linear(heads * head_dim, width, bias=bias)")
                if v.decay:
                    w('self.register_buffer("log_decay", torch.log(1 - 2.0 ** (-5.0 - torch.arange(heads))), persistent=False)  # (nh,)')
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                out.block(f'''
B, T, C = x.size()
q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, nh, T, hd) each
q, k = {FEATURES[v.feature].format("q")}, {FEATURES[v.feature].format("k")}  # the feature map phi: positive scores''')
                if v.normalize:
                    w("v = torch.cat((v, v.new_ones(B, self.heads, T, 1)), dim=-1)  # a column of ones: the same sums give phi(q) z")
                if v.causal:
                    decay = ", self.log_decay" if v.decay else ""
                    w(f"y, state = linear_scan(q, k, v, self.chunk, None if cache is None else cache.recurrent(self){decay})")
                    out.nested("if cache is not None:", "cache.keep(self, state)  # (B, nh, hd, hd): all it remembers")
                else:
                    w("y = q @ (k.transpose(-2, -1) @ v)  # (B, nh, T, hd): every position reads one sum over all")
                if v.normalize:
                    w("y = y[..., :-1] / (y[..., -1:] + self.EPS)  # divided by phi(q) z")
                w("y = y.transpose(1, 2).reshape(B, T, self.heads * self.head_dim)  # (B, T, nh * hd)")
                w("return self.proj(y)")
