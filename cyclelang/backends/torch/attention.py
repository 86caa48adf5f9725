"""The attention emitter (the injector): its class, constructor and call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from .ops import OpEmitter, call_args, head_sizes, if_set
from .records import OpPlan, Plan, signature
from .config import Sizes
from .writer import Writer, doc_tag, num


# --- the variant: one frozen record per kind, hashable, the key of a generated class


@dataclass(frozen=True)
class AttentionVariant:
    kind: ClassVar[type] = ir.Attention
    base: ClassVar[str] = "Attention"
    mask: str  # "causal" | "open"
    window: bool  # sliding-window attention
    rotary: str  # "none" | "full" | "partial" | "interleaved"
    qk_norm: bool
    gqa: bool  # kv_heads < heads
    dropout: bool
    causal: bool  # the engine's throat: the forward takes a KV cache
    split_bias: bool = False  # the output projection's bias differs from q, k, v's (out_bias)
    qk_across: bool = False  # the qk-norms span all heads (OLMo-2), not one head
    scaled: bool = False  # the scores take the constructor's scale: the spec's scale=, or μP's; not the kernel's 1/sqrt(head_dim)
    softcap: bool = False  # the scores pass through softcap * tanh(s / softcap): computed here, not in the fused kernel
    alibi: str = "none"  # "none" | "added" (after the scale: BLOOM, MPT) | "scaled" (with the logits: Falcon)
    qk_type: str = "rmsnorm"  # the qk-norms' kind: "rmsnorm" | "layernorm" (Persimmon)
    qk_bias: bool = False  # the qk layernorms have a bias
    qk_offset: bool = False  # the qk-norms' gain is qk_offset + w (Gemma 3)
    qk_affine: bool = True  # false: weightless qk-norms (nanochat)
    qk_late: bool = False  # the qk-norms act after rotary (nanochat)
    qk_heads: bool = False  # each head its own qk-norm gain (StableLM, Cohere)
    sinks: bool = False  # a learned logit per head in every softmax (gpt-oss): the scores computed here, not in the fused kernel
    gate: str = "none"  # an output gate, y * sigmoid(gate(x)): "channel" (Qwen3-Next), "head", or "none"
    gate_act: str = "sigmoid"  # ... its function: sigmoid, or softplus (Laguna)
    v_norm: bool = False  # a weightless RMSNorm on each head's values (Gemma 4)
    k_eq_v: bool = False  # the values are the keys' projection (Gemma 4): no value rows
    kv_store: bool = False  # KV sharing: its keys and values go to a slot of `shared`
    kv_reuse: bool = False  # KV sharing: it reads a slot's keys and values: q only, no cache of its own
    temperature: bool = False  # the rotated queries times the rope's third table (Llama 4's attention temperature)

    @classmethod
    def of(cls, a: ir.Attention, causal: bool) -> "AttentionVariant":
        rot = "none" if a.rotary_dims == 0 else "interleaved" if a.rotary_interleaved else ("full" if a.rotary_dims == a.head_dim else "partial")
        rot = "spread" if a.rotary_spread else rot
        return cls(a.mask, a.window is not None, rot, a.qk_norm, a.kv_heads != a.heads, a.dropout > 0, causal, a.out_bias != a.bias,
                   a.qk_norm and a.qk_norm_across, softcap=a.softcap is not None,
                   alibi="none" if not a.alibi else "scaled" if a.alibi_scaled else "added",
                   qk_type=a.qk_norm_type, qk_bias=a.qk_norm_bias, qk_offset=bool(a.qk_norm_offset), qk_affine=a.qk_norm_affine,
                   qk_late=a.qk_norm_after_rotary and a.rotary_dims > 0, qk_heads=a.qk_norm_head_gains, sinks=a.sinks, gate=a.gate, gate_act=a.gate_act,
                   v_norm=a.v_norm, k_eq_v=a.k_eq_v, kv_store=a.kv_store is not None, kv_reuse=a.kv_reuse is not None,
                   temperature=a.rotary_scaling is not None and a.rotary_scaling.temperature > 0)

    @property
    def inputs(self) -> tuple[str, ...]:
        shared = ("shared",) if self.kv_store or self.kv_reuse else ()
        return (("rope",) if self.rotary != "none" else ()) + shared + (("cache", "mask") if self.causal else ())



ROTARY_FN = {"full": "apply_rotary", "partial": "apply_rotary_partial", "interleaved": "apply_rotary_interleaved", "spread": "apply_rotary_spread"}

# The output gate (`gate=`, Qwen3-Next and Qwen3.5): its projection's rows, and the line that gates y (B, T, nh * hd).
GATE_ROWS = {"channel": "heads * head_dim", "head": "heads"}
GATE_LINE = {"channel": "y = y * {fn}  # the output gate, one per channel of every head",
             "head": "y = (y.view(B, T, self.heads, self.head_dim) * {fn}[..., None]).view(B, T, -1)  # one gate per head"}
# the gate's function (`gate_act=`): Laguna's softplus in float32 at least, as it computes it
GATE_FN = {"sigmoid": "torch.sigmoid(self.gate(x))", "softplus": "F.softplus(self.gate(x).to(torch.promote_types(y.dtype, torch.float32))).to(y.dtype)"}


def qk_module(v: AttentionVariant, dim: str) -> str:
    """The constructor of one qk-norm over `dim` channels, as the variant shapes it."""
    if v.qk_heads:  # `dim` is q's or k's heads' channels: each head its own gain
        heads = "kv_heads" if dim.startswith("kv") else "heads"
        return (f"HeadNorm({heads}, head_dim, eps=qk_eps{', rms=True' if v.qk_type == 'rmsnorm' else ''}{', bias=True' if v.qk_bias else ''}"
                f"{', offset=qk_offset' if v.qk_offset else ''})")
    if not v.qk_affine:
        return f"nn.{'LayerNorm' if v.qk_type == 'layernorm' else 'RMSNorm'}({dim}, eps=qk_eps, elementwise_affine=False)"
    bias = "" if v.qk_bias or v.qk_type != "layernorm" else ", bias=False"
    if v.qk_offset:
        return f"Offset{'LayerNorm' if v.qk_type == 'layernorm' else 'RMSNorm'}({dim}, eps=qk_eps, offset=qk_offset{bias})"
    return f"nn.{'LayerNorm' if v.qk_type == 'layernorm' else 'RMSNorm'}({dim}, eps=qk_eps{bias})"


def qk_phrase(v: AttentionVariant) -> str:
    """The qk-norm in words, for the class's docstring."""
    shape = [w for w, on in (("a LayerNorm", v.qk_type == "layernorm"), ("with a bias", v.qk_bias), ("gain qk_offset + w", v.qk_offset),
                             ("no learned gain", not v.qk_affine), ("a gain per head", v.qk_heads), ("after rotary", v.qk_late)) if on]
    return ("qk-norm across heads" if v.qk_across else "qk-norm") + (f" ({', '.join(shape)})" if shape else "")


class AttentionEmitter(OpEmitter):
    variant = AttentionVariant

    def sizes(self, a: ir.Attention, c: Sizes, scope) -> dict:
        out = head_sizes(a, c, scope)
        heads, hd = out["heads"], out["head_dim"]
        if a.kv_heads == a.heads:
            out["kv_heads"] = heads
        else:
            out["kv_heads"] = kv = c.field("n_kv_head", a.kv_heads, scope, "key/value heads: grouped-query attention shares each among n_head // n_kv_head query heads", let=a.let_of("kv_heads"))
            c.divides(kv, heads, "each key/value head serves a whole group of query heads")
        if a.rotary_dims:
            if a.rotary_dims == a.head_dim:
                out["rotary_dims"] = hd
            else:
                out["rotary_dims"] = rd = c.field("rotary_dims", a.rotary_dims, scope, "rotated channels of each head (partial rotary)")
                c.check(lambda: f"{rd.own} % 2 == 0 and {rd.own} <= {hd.own}",
                        lambda: f"{rd.name} ({{{rd.own}}}) must be even and at most {hd.name} ({{{hd.own}}}): rotary turns channel pairs of a head")
            out["rotary_base"] = c.field("rotary_base", a.rotary_base, scope, "rotary frequency base", "float", let=a.let_of("rotary_base"))
        if a.scale is not None and not ir.mup.is_mup(c.e):  # under μP the scale is μP's, for the spec's width
            out["scale"] = c.field("attn_scale", a.scale, scope, "the attention scores' scale (not 1/sqrt(head_dim))", "float", let=a.let_of("scale"))
        if a.qk_norm:
            out["qk_eps"] = c.field("qk_norm_eps", a.qk_norm_eps, scope, "the qk-norms' epsilon", "float", let=a.let_of("qk_norm_eps"))
            if a.qk_norm_offset:
                out["qk_offset"] = c.field("qk_norm_offset", a.qk_norm_offset, scope, "the qk-norms' gain is qk_norm_offset + w (Gemma 3: 1)", "float",
                                           let=a.let_of("qk_norm_offset"))
        if a.window is not None:
            out["window"] = c.field("window", a.window, scope, "sliding-window attention: keys a query may see", let=a.let_of("window"))
        if a.dropout > 0:
            out["dropout"] = c.field("dropout", a.dropout, scope, "dropout rate", "float", let=a.let_of("dropout"))
        return out

    def ctor(self, o: OpPlan) -> str:
        a, s = o.op, o.args
        return f"{o.cls}({call_args(str(s['width']), heads=str(s['heads']), kv_heads=str(s['kv_heads']), head_dim=str(s['head_dim']), bias=num(a.bias), out_bias=if_set(a.out_bias, a.out_bias != a.bias), qk_eps=str(s['qk_eps']) if 'qk_eps' in s else None, qk_offset=str(s['qk_offset']) if 'qk_offset' in s else None, scale=str(s['scale']) if 'scale' in s else if_set(o.scale, o.scale is not None), softcap=if_set(a.softcap, a.softcap is not None), kv_slot=if_set(a.kv_store or a.kv_reuse, bool(a.kv_store or a.kv_reuse)), window=str(s['window']) if 'window' in s else None, dropout=str(s['dropout']) if 'dropout' in s else None)})"

    def runtime(self, a: ir.Attention, causal: bool) -> tuple[str, ...]:
        out, v = (), AttentionVariant.of(a, causal)
        if a.rotary_dims:
            out += ("scaled_rotary_tables" if a.rotary_scaling is not None else "rotary_tables", ROTARY_FN[v.rotary])
            out += ("query_temperature",) if v.temperature else ()
        if a.window is not None:
            out += ("sliding_mask",)
        elif causal:
            out += ("causal_mask",)
        if causal:
            out += ("padded_mask",)
        if v.alibi != "none":
            out += ("alibi_slopes",)
        if v.qk_norm and v.qk_heads:
            out += ("HeadNorm",)
        elif v.qk_norm and v.qk_offset:
            out += ("OffsetLayerNorm" if v.qk_type == "layernorm" else "OffsetRMSNorm",)
        return out

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        if op.k_eq_v or op.kv_reuse is not None:  # the values are the keys' rows: only the output projection is v's own
            return [f"{a}.proj.weight.mul_({beta})"]
        return [f"v_rows = {a}.kv_heads * {a}.head_dim  # v: the last rows of qkv",
                f"{a}.qkv.weight[-v_rows:].mul_({beta})", f"{a}.proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: AttentionVariant, plan: Plan) -> None:
        w = out.line
        kind = "sliding-window causal" if v.window else "causal" if v.mask == "causal" else "bidirectional"
        w(f"class {name}(nn.Module):")
        with out.indent():
            extra = []
            if v.gqa:
                extra.append("grouped-query attention (kv_heads < heads: query heads share keys and values)")
            if v.rotary != "none":
                extra.append({"full": "rotary", "partial": "partial rotary", "interleaved": "interleaved (GPT-J) rotary",
                              "spread": "proportional (Gemma 4) rotary"}[v.rotary] + " positions")
            if v.k_eq_v:
                extra.append("values that are the keys' projection (K = V)")
            if v.v_norm:
                extra.append("a weightless RMSNorm on the values")
            if v.kv_store:
                extra.append("its keys and values stored in slot kv_slot of `shared` for later layers (KV sharing)")
            if v.kv_reuse:
                extra.append("the keys and values of slot kv_slot of `shared`, stored by an earlier layer (KV sharing): no projections or cache of its own")
            if v.qk_norm:
                extra.append(qk_phrase(v))
            if v.scaled:
                extra.append("scores scaled by `scale`, not 1/sqrt(head_dim)")
            if v.softcap:
                extra.append("scores soft-capped: softcap * tanh(scores / softcap) (Gemma 2)")
            if v.gate != "none":
                extra.append(f"an output gate per {v.gate}, y * {v.gate_act}(W x) before the output projection (Qwen3-Next)")
            if v.alibi != "none":
                extra.append("ALiBi positions (a per-head bias linear in the key's position" + (", scaled with the logits as Falcon does)" if v.alibi == "scaled" else ")"))
            if v.sinks:  # gpt-oss
                extra.append("attention sinks (a learned logit per head joins every softmax's denominator: a query may attend to nothing)")
            head = f"{kind[0].upper() + kind[1:]} self-attention: the only place positions mix{doc_tag(None, 'injector')}."
            if extra:
                out.block(f'"""{head}\n\nWith {", ".join(extra)}.\n"""')
            else:
                w(f'"""{head}"""')
            w()
            optional = [name for name, on in (("window", v.window), ("dropout", v.dropout)) if on]
            ctor = ["width", "heads", "kv_heads", "head_dim", "bias", *(["out_bias"] if v.split_bias else []), *(["qk_eps"] if v.qk_norm else []), *(["qk_offset"] if v.qk_norm and v.qk_offset else []),
                    *(["scale"] if v.scaled else []), *(["softcap"] if v.softcap else []), *(["kv_slot"] if v.kv_store or v.kv_reuse else [])]
            with out.constructor(*ctor, *optional):
                w("self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim")
                if v.kv_reuse:
                    w("self.qkv = nn.Linear(width, heads * head_dim, bias=bias)  # q only: the keys and values are slot kv_slot's")
                elif v.k_eq_v:
                    w("self.qkv = nn.Linear(width, (heads + kv_heads) * head_dim, bias=bias)  # q, k fused: the values are the keys' projection")
                else:
                    w("self.qkv = nn.Linear(width, (heads + 2 * kv_heads) * head_dim, bias=bias)  # q, k, v fused")
                w(f"self.proj = nn.Linear(heads * head_dim, width, bias={'out_bias' if v.split_bias else 'bias'})")
                if v.gate != "none":
                    w(f"self.gate = nn.Linear(width, {GATE_ROWS[v.gate]}, bias=bias)  # the output gate's logits")
                if v.qk_across:
                    w(f"self.q_norm = {qk_module(v, 'heads * head_dim')}  # across all heads")
                    if not v.kv_reuse:
                        w(f"self.k_norm = {qk_module(v, 'kv_heads * head_dim')}")
                elif v.qk_heads:
                    w(f"self.q_norm = {qk_module(v, 'heads * head_dim')}  # a gain per head")
                    if not v.kv_reuse:
                        w(f"self.k_norm = {qk_module(v, 'kv_heads * head_dim')}")
                elif v.qk_norm:
                    w(f"self.q_norm = {qk_module(v, 'head_dim')}")
                    if not v.kv_reuse:
                        w(f"self.k_norm = {qk_module(v, 'head_dim')}")
                if v.kv_store or v.kv_reuse:
                    w("self.kv_slot = kv_slot")
                if v.v_norm:
                    w("self.qk_eps = qk_eps  # the values' RMSNorm too")
                if v.scaled:
                    w("self.scale = scale")
                if v.softcap:
                    w("self.softcap = softcap")
                if v.alibi != "none":
                    w('self.register_buffer("slopes", alibi_slopes(heads), persistent=False)  # (nh,): ALiBi\'s slope per head')
                if v.sinks:
                    w("self.sinks = nn.Parameter(torch.zeros(heads))  # (nh,): each head's sink logit (gpt-oss)")
                for name in optional:
                    w(f"self.{name} = {name}")
                if v.dropout:
                    w("self.drop = nn.Dropout(dropout)")
            w()
            w(f"def forward(self, {signature(['x', *v.inputs])}):")
            with out.indent():
                self.forward(out, v)

    def reuse_prelude(self, out: Writer, v: AttentionVariant) -> None:
        """KV sharing's reader: its queries only; the keys and values (the cached past included) are the storing layer's."""
        w = out.line
        w("B, T, C = x.size()")
        w("q = self.qkv(x)")
        if v.qk_across:
            w("q = self.q_norm(q)  # across all heads")
        w("q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)")
        if v.qk_norm and not v.qk_across and not v.qk_late:
            w("q = self.q_norm(q)")
        if v.rotary != "none":
            w(f"q = {ROTARY_FN[v.rotary]}(q, *rope{'[:2]' if v.temperature else ''})")
            if v.temperature:
                w("q = q * rope[2]  # Llama 4's temperature: 1 + t ln(1 + floor(position / original))")
        if v.qk_late:
            w("q = self.q_norm(q)  # after rotary")
        w("k, v = shared[self.kv_slot]  # (B, nkv, S, hd): an earlier layer's keys and values, its cached past included")

    def forward(self, out: Writer, v: AttentionVariant) -> None:
        w = out.line
        if v.kv_reuse:
            self.reuse_prelude(out, v)
        else:
            self.prelude(out, v)
        if v.causal and not v.kv_reuse:
            out.nested("if cache is not None:", "k, v = cache.extend(self, k, v)  # (B, nkv, S, hd): the cached past, then these T")
        if v.kv_store:
            w("shared[self.kv_slot] = k, v  # for the layers that reuse them (KV sharing)")
        self.attend(out, v)

    def prelude(self, out: Writer, v: AttentionVariant) -> None:
        w = out.line
        out.block("""
B, T, C = x.size()
QKV
QK_ACROSS
q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
k = k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)""".replace(
            "QK_ACROSS\n", "q, k = self.q_norm(q), self.k_norm(k)  # across all heads\n" if v.qk_across else "").replace(
            "QKV", "q, k = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim], dim=2)\n"
                   "v = k  # K = V: the values are the keys' projection (before the k-norm and rotary)" if v.k_eq_v else
                   "q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=2)"))
        if v.qk_norm and not v.qk_across and not v.qk_late:
            w("q, k = self.q_norm(q), self.k_norm(k)")
        if v.v_norm:
            w("v = F.rms_norm(v, (self.head_dim,), eps=self.qk_eps)  # the values normalised per head, no gain")
        if v.rotary != "none":
            fn, tables = ROTARY_FN[v.rotary], "*rope[:2]" if v.temperature else "*rope"
            w(f"q, k = {fn}(q, {tables}), {fn}(k, {tables})")
            if v.temperature:
                w("q = q * rope[2]  # Llama 4's temperature: 1 + t ln(1 + floor(position / original))")
        if v.qk_late:
            w("q, k = self.q_norm(q), self.k_norm(k)  # after rotary: the rotated q and k")

    def attend(self, out: Writer, v: AttentionVariant) -> None:
        w = out.line
        if v.softcap or v.alibi != "none" or v.sinks:
            self.scores(out, v)
            return
        dp = ", dropout_p=self.dropout if self.training else 0.0" if v.dropout else ""
        if v.gqa:  # each group of query heads reads one kv head, inside the kernel: no copies of k, v
            dp += ", enable_gqa=True"
        if v.scaled:  # the spec's scale=, or μP's sqrt(d0)/d, not the kernel's 1/sqrt(head_dim)
            dp += ", scale=self.scale"
        sdpa = "y = F.scaled_dot_product_attention"
        if v.causal:  # a padded batch: no query sees a padded key (mask: (B, S), True for real tokens)
            win = "self.window" if v.window else "None"
            out.nested("if mask is not None:", f"{sdpa}(q, k, v, attn_mask=padded_mask(mask, T, {win}){dp})")
        if v.mask == "open":
            w(f"{sdpa}(q, k, v{dp})  # (B, nh, T, hd)")
        elif v.window:
            out.nested(("elif" if v.causal else "if") + " T == 1:  # one query (after the cache) sees the latest `window` keys: no mask",
                       f"{sdpa}(q, k[:, :, -self.window :], v[:, :, -self.window :]{dp})  # (B, nh, 1, hd)")
            out.nested("else:", "near = sliding_mask(T, k.size(2), self.window, x.device)  # (T, S)",
                       f"{sdpa}(q, k, v, attn_mask=near{dp})  # (B, nh, T, hd)")
        else:
            out.nested(("elif" if v.causal else "if") + " k.size(2) == T:  # no cache: the plain causal mask", f"{sdpa}(q, k, v{dp}, is_causal=True)" + ("" if dp else "  # (B, nh, T, hd)"))
            if v.causal:
                out.nested("elif T == 1:  # one query after the cache may see every key: no mask", f"{sdpa}(q, k, v{dp})  # (B, nh, 1, hd)")
            out.nested("else:  # T new queries after S - T cached positions",
                       f"{sdpa}(q, k, v, attn_mask=causal_mask(T, k.size(2), x.device){dp})")
        w("y = y.transpose(1, 2).contiguous().view(B, T, self.heads * self.head_dim)  # (B, T, nh * hd)")
        if v.gate != "none":
            w(GATE_LINE[v.gate].format(fn=GATE_FN[v.gate_act]))
        w("return self.drop(self.proj(y))" if v.dropout else "return self.proj(y)")

    def scores(self, out: Writer, v: AttentionVariant) -> None:
        """The forward's end when the scores need more than the fused kernel gives: a soft-cap
        (computed here, as transformers' eager attention does), an ALiBi bias (a float mask), or
        sinks (an extra logit per head in the softmax, computed here)."""
        w = out.line
        scale = "self.scale" if v.scaled else "self.head_dim ** -0.5"
        w("S = k.size(2)")
        if v.mask == "open":
            w("seen = None  # bidirectional: every key")
        else:
            win = "self.window" if v.window else "None"
            near = "sliding_mask(T, S, self.window, x.device)" if v.window else "causal_mask(T, S, x.device)"
            w(f"seen = {near} if mask is None else padded_mask(mask, T, {win})  # (T, S) or (B, 1, T, S): True where a query may look"
              if v.causal else f"seen = {near}  # (T, S)")
        if v.alibi != "none":
            w("bias = self.slopes[:, None, None] * torch.arange(S, device=x.device)  # (nh, 1, S): ALiBi, linear in the key's position")
            if v.alibi == "scaled":
                w(f"bias = bias * {scale}  # Falcon scales the bias with the logits")
        if v.softcap or v.sinks:
            if v.gqa:
                w("k, v = k.repeat_interleave(self.heads // self.kv_heads, 1), v.repeat_interleave(self.heads // self.kv_heads, 1)  # (B, nh, S, hd)")
            w(f"s = (q @ k.transpose(-2, -1)) * {scale}  # (B, nh, T, S)")
            if v.softcap:
                w("s = self.softcap * torch.tanh(s / self.softcap)  # soft-capped: |s| < softcap")
            if v.alibi != "none":
                w("s = s + bias")
            if v.mask != "open":
                w('s = s.masked_fill(~seen, float("-inf"))')
            if v.sinks:  # gpt-oss's sinks: one more logit per head in each softmax, whose share is dropped
                w("sink = self.sinks.to(s.dtype).view(1, -1, 1, 1).expand(s.size(0), -1, T, 1)  # (B, nh, T, 1)")
                w("a = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1, dtype=torch.promote_types(s.dtype, torch.float32))[..., :-1].to(q.dtype)  # the sink's share vents")
            else:
                w("a = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)")
            if v.dropout:
                w("a = F.dropout(a, self.dropout, self.training)")
            w("y = a @ v  # (B, nh, T, hd)")
        else:
            dp = ", dropout_p=self.dropout if self.training else 0.0" if v.dropout else ""
            if v.gqa:
                dp += ", enable_gqa=True"
            if v.scaled:
                dp += ", scale=self.scale"
            if v.mask != "open":
                w('bias = bias.masked_fill(~seen, float("-inf"))  # (nh, T, S) or (B, nh, T, S)')
            w(f"y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias{dp})  # (B, nh, T, hd)")
        w("y = y.transpose(1, 2).contiguous().view(B, T, self.heads * self.head_dim)  # (B, T, nh * hd)")
        if v.gate != "none":
            w(GATE_LINE[v.gate].format(fn=GATE_FN[v.gate_act]))
        w("return self.drop(self.proj(y))" if v.dropout else "return self.proj(y)")
