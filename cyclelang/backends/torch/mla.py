"""Multi-head latent attention (`turbine attention latent=`, DeepSeek-V2): its variant and emitter.

Kept apart from attention.py: its projections, its rotary layout (adjacent pairs, on a
decoupled part of each head) and its cache (the latent, not keys and values) are its own.
Parameter names follow transformers' DeepseekV2Attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from .config import Sizes
from .ops import OpEmitter, call_args, if_set
from .records import OpPlan, Plan
from .writer import Writer, num


@dataclass(frozen=True)
class LatentAttentionVariant:
    kind: ClassVar[type] = ir.LatentAttention
    base: ClassVar[str] = "LatentAttention"
    mask: str  # "causal" | "open"
    q_latent: bool  # queries through a latent of their own
    causal: bool  # the engine's throat: the forward takes a cache
    scaled: bool = False  # the scores take the constructor's scale (μP's sqrt(d0)/d), not the kernel's 1/sqrt(d)

    @classmethod
    def of(cls, a: ir.LatentAttention, causal: bool) -> "LatentAttentionVariant":
        return cls(a.mask, a.q_latent is not None, causal)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("rope", "cache") if self.causal else ("rope",)


class LatentAttentionEmitter(OpEmitter):
    variant = LatentAttentionVariant

    def sizes(self, a: ir.LatentAttention, c: Sizes, scope) -> dict:
        # the heads do not split the width here: each head's size is its own field (DeepSeek-V2: 128 heads of 128 in 5120)
        out = {"width": c.width(a.width, scope), "heads": c.field("n_head", a.heads, scope, "attention heads", let=a.let_of("heads")),
               "head_dim": c.field("head_dim", a.head_dim, scope, "each head's unrotated query/key channels (qk_nope_head_dim)", let=a.let_of("head_dim"))}
        hd = out["head_dim"]
        out["rotary_dims"] = rd = c.field("rotary_dims", a.rotary_dims, scope, "each head's decoupled rotary channels (qk_rope_head_dim)", let=a.let_of("rotary_dims"))
        c.check(lambda: f"{rd.own} % 2 == 0 and {rd.own} >= 2",
                lambda: f"{rd.name} ({{{rd.own}}}) must be even and at least 2: rotary turns channel pairs")
        out["v_dim"] = hd if a.v_dim == a.head_dim else c.field("v_dim", a.v_dim, scope, "each head's value width", let=a.let_of("v_dim"))
        out["latent"] = c.field("kv_latent", a.latent, scope, "the key/value latent's width (kv_lora_rank): what the cache keeps", let=a.let_of("latent"))
        if a.q_latent is not None:
            out["q_latent"] = c.field("q_latent", a.q_latent, scope, "the query latent's width (q_lora_rank)", let=a.let_of("q_latent"))
        out["rotary_base"] = c.field("rotary_base", a.rotary_base, scope, "rotary frequency base", "float", let=a.let_of("rotary_base"))
        out["eps"] = c.field("norm_eps", a.eps, scope, "the norms' epsilon", "float", let=a.let_of("eps"))
        return out

    def ctor(self, o: OpPlan) -> str:
        s = o.args
        return (f"{o.cls}({call_args(str(s['width']), heads=str(s['heads']), head_dim=str(s['head_dim']), rotary_dims=str(s['rotary_dims']), v_dim=str(s['v_dim']), latent=str(s['latent']), q_latent=str(s['q_latent']) if 'q_latent' in s else None, eps=str(s['eps']), bias=num(o.op.bias), scale=if_set(o.scale, o.scale is not None))})")

    def runtime(self, a: ir.LatentAttention, causal: bool) -> tuple[str, ...]:
        return ("rotary_tables", "apply_rotary_interleaved") + (("causal_mask",) if a.mask == "causal" and causal else ())

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.o_proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.kv_b_proj.weight.view({a}.heads, {a}.head_dim + {a}.v_dim, -1)[:, {a}.head_dim :].mul_({beta})  # v",
                f"{a}.o_proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: LatentAttentionVariant, plan: Plan) -> None:
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            kind = "Causal" if v.mask == "causal" else "Bidirectional"
            out.block(f'''"""{kind} multi-head latent attention (DeepSeek-V2): keys and values through a compressed latent.

Keys and values are expanded from one RMS-normalised latent per position (kv_a_proj,
kv_b_proj), so the cache keeps the latent and a rotary key shared by the heads, not
heads x head_dim x 2. Each head's query and key are [nope | rope]: positions reach only
the decoupled rotary part, rotated in adjacent pairs.{" Queries pass through a latent too." if v.q_latent else ""}{"""
Decoding one token reads the cache as it is: the query absorbs kv_b_proj's key half and
the output its value half (DeepSeek-V2's absorbed form), so the past is never expanded.""" if v.causal else ""}
"""''')
            w()
            params = ["width", "heads", "head_dim", "rotary_dims", "v_dim", "latent"] + (["q_latent"] if v.q_latent else []) + ["eps", "bias"] + (["scale"] if v.scaled else [])
            with out.constructor(*params):
                w("self.heads, self.head_dim, self.rotary_dims, self.v_dim, self.latent = heads, head_dim, rotary_dims, v_dim, latent")
                if v.scaled:
                    w("self.scale = scale  # μP: sqrt(d0)/d of the query/key width d, not 1/sqrt(d)")
                w("qk = heads * (head_dim + rotary_dims)")
                if v.q_latent:
                    w("self.q_a_proj = nn.Linear(width, q_latent, bias=bias)  # the query latent")
                    w("self.q_a_layernorm = nn.RMSNorm(q_latent, eps=eps)")
                    w("self.q_b_proj = nn.Linear(q_latent, qk, bias=False)")
                else:
                    w("self.q_proj = nn.Linear(width, qk, bias=False)")
                w("self.kv_a_proj_with_mqa = nn.Linear(width, latent + rotary_dims, bias=bias)  # [latent | the shared rotary key]")
                w("self.kv_a_layernorm = nn.RMSNorm(latent, eps=eps)")
                w("self.kv_b_proj = nn.Linear(latent, heads * (head_dim + v_dim), bias=False)  # per head [k_nope | v]")
                w("self.o_proj = nn.Linear(heads * v_dim, width, bias=bias)")
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                w("B, T, C = x.size()")
                q = "self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))" if v.q_latent else "self.q_proj(x)"
                out.block(f'''
q = {q}.view(B, T, self.heads, -1).transpose(1, 2)  # (B, nh, T, hd + rd)
q_nope, q_rope = q.split([self.head_dim, self.rotary_dims], dim=-1)
c, k_rope = self.kv_a_proj_with_mqa(x).split([self.latent, self.rotary_dims], dim=-1)
c = self.kv_a_layernorm(c)[:, None]  # (B, 1, T, latent): what the cache keeps
q_rope, k_rope = apply_rotary_interleaved(q_rope, *rope), apply_rotary_interleaved(k_rope[:, None], *rope)  # k_rope: (B, 1, T, rd)''')
                if v.causal:
                    out.nested("if cache is not None:", "c, k_rope = cache.extend(self, c, k_rope)  # (B, 1, S, latent), (B, 1, S, rd): the latent past, then these T")
                    scale = "self.scale" if v.scaled else "(self.head_dim + self.rotary_dims) ** -0.5"
                    w("if cache is not None and T == 1:  # decoding: absorbed, so the latent past is read as it is, never expanded")
                    with out.indent():
                        out.block(f'''
w_uk, w_uv = self.kv_b_proj.weight.view(self.heads, self.head_dim + self.v_dim, self.latent).split([self.head_dim, self.v_dim], dim=1)
q = torch.cat((q_nope @ w_uk, q_rope), dim=-1)  # (B, nh, 1, latent + rd): q_nope . (W_uk c) = (q_nope W_uk) . c
k = torch.cat((c, k_rope), dim=-1).expand(-1, self.heads, -1, -1)  # (B, nh, S, latent + rd): one key for every head
y = F.scaled_dot_product_attention(q, k, c.expand(-1, self.heads, -1, -1), scale={scale})  # (B, nh, 1, latent)
y = y @ w_uv.transpose(1, 2)  # (B, nh, 1, v_dim): W_uv applied after the weighted sum
return self.o_proj(y.transpose(1, 2).reshape(B, T, self.heads * self.v_dim))''')
                out.block('''
S = c.size(2)
k_nope, v = self.kv_b_proj(c[:, 0]).view(B, S, self.heads, -1).transpose(1, 2).split([self.head_dim, self.v_dim], dim=-1)
q = torch.cat((q_nope, q_rope), dim=-1)  # (B, nh, T, hd + rd)
k = torch.cat((k_nope, k_rope.expand(-1, self.heads, -1, -1)), dim=-1)  # (B, nh, S, hd + rd)''')
                sdpa = "y = F.scaled_dot_product_attention"
                sc = ", scale=self.scale" if v.scaled else ""
                if v.mask == "open":
                    w(f"{sdpa}(q, k, v{sc})  # (B, nh, T, v_dim)")
                else:
                    out.nested("if S == T:  # no cache: the plain causal mask", f"{sdpa}(q, k, v, is_causal=True{sc})  # (B, nh, T, v_dim)")
                    if v.causal:
                        out.nested("else:  # T new queries after S - T cached positions", f"{sdpa}(q, k, v, attn_mask=causal_mask(T, S, x.device){sc})")
                w("y = y.transpose(1, 2).reshape(B, T, self.heads * self.v_dim)  # (B, T, nh * v_dim)")
                w("return self.o_proj(y)")
