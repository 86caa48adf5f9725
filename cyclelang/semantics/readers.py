"""The resolver's op readers: a norm, and each turbine kind's `t_<keyword>`, which reads the
kind's options (`options.TABLE`) into its IR node. `resolve._Resolver` inherits them; a kind
without its reader stops the resolver from importing (`ir.kinds.registered`).
"""

from __future__ import annotations

import math
import typing

from .. import ir
from ..diagnostics import did_you_mean
from ..syntax import ast
from .options import MAX_WIDTH, Options

NORMS = typing.get_args(ir.NormType)


class OpReaders:
    """norm and each turbine's `t_<keyword>` (`resolve.TURBINES`): mixed into `resolve._Resolver` (self.out, self.missing_kind, ...)."""

    def norm(self, d: ast.Directive, scope, w) -> ir.Norm | None:
        kind = d.kind.name
        if self.missing_kind(d, NORMS):
            return None
        if kind not in NORMS:
            self.out.error("E0204", f"unknown norm '{kind}'", d.kind.span, did_you_mean(kind, NORMS) or "layernorm or rmsnorm")
            return None
        o = Options(f"norm {kind}", d.options, scope, self.out, d.span)
        if kind == "scalar":  # Gemma 4's layer_scalar: no options
            o.finish()
            return None if w is None else ir.Norm(type=kind, width=w, eps=1e-6, bias=False, affine=False, span=d.span, let_names=o.lets())
        eps = o.get("eps")
        affine = o.get("affine")
        bias = o.get("bias", affine) if kind == "layernorm" else False
        offset = o.get("offset")
        o.finish()
        if w is None or eps is None or offset is None:
            return None
        if not affine and (bias or offset):
            what = "bias" if bias else "offset"
            self.out.error("E0211", f"a norm with affine=false learns no gain, so it has no {what}", o.span_of(what), f"drop {what}=, or the affine=false")
            return None
        return ir.Norm(type=kind, width=w, eps=eps, bias=bias, affine=affine, offset=offset, span=d.span, let_names=o.lets())

    def t_attention(self, o: Options, ctx, w, d):
        if o.has("latent"):  # multi-head latent attention: a kind of its own
            return self.t_latent_attention(o, ctx, w, d)
        heads = o.get("heads")
        kv = o.get("kv_heads")
        head_dim = o.get("head_dim")
        mask = o.get("mask", ctx.throat)
        window = o.get("window")
        rotary = o.get("rotary")
        base = o.get("rotary_base")
        qk_norm = o.get("qk_norm")
        qk_eps = o.get("qk_norm_eps")
        qk_across = o.get("qk_norm_across")
        qk_shape = {k: o.get(k) for k in ("qk_norm_type", "qk_norm_bias", "qk_norm_offset", "qk_norm_affine", "qk_norm_after_rotary", "qk_norm_head_gains")}
        scale = o.get("scale")
        interleaved = o.get("rotary_interleaved")
        bias = o.get("bias")
        out_bias = o.get("out_bias", bias)
        dropout = o.get("dropout")
        softcap = o.get("softcap")
        alibi = o.get("alibi")
        alibi_scaled = o.get("alibi_scaled")
        gate = o.get("gate")
        if alibi_scaled and not alibi:
            self.out.error("E0211", "alibi_scaled says how ALiBi positions are scaled, but alibi is off", o.span_of("alibi_scaled"), "add alibi")
            return None
        gate_act = o.get("gate_act") or "sigmoid"
        if gate_act != "sigmoid" and (gate or "none") == "none":
            self.out.error("E0211", f"gate_act={gate_act} is the output gate's function, but there is no gate", o.span_of("gate_act"), "add gate=channel or gate=head")
            return None
        scaling = self._rotary_scaling(o, ctx, rotary)
        if None in (heads, w, mask, rotary, base, dropout, qk_eps) or scaling is False:
            return None
        if interleaved and not rotary:
            self.out.error("E0211", "rotary_interleaved says how rotary positions pair the dims, but rotary is off", o.span_of("rotary_interleaved"), "add rotary")
            return None
        if (o.has("qk_norm_eps") or qk_across) and not qk_norm:
            self.out.error("E0211", "qk_norm_eps= and qk_norm_across set a qk-norm, but qk_norm is off", o.span_of("qk_norm_eps" if o.has("qk_norm_eps") else "qk_norm_across"), "add qk_norm")
            return None
        said = next((k for k in ("qk_norm_type", "qk_norm_bias", "qk_norm_offset", "qk_norm_affine", "qk_norm_after_rotary", "qk_norm_head_gains") if o.has(k)), None)
        if said and not qk_norm:
            self.out.error("E0211", f"{said} shapes a qk-norm, but qk_norm is off", o.span_of(said), "add qk_norm")
            return None
        if None in qk_shape.values():
            return None
        if qk_across and qk_shape["qk_norm_after_rotary"]:
            self.out.error("E0211", "a qk-norm across heads acts before the heads split, so before rotary", o.span_of("qk_norm_after_rotary"),
                           "drop qk_norm_across or qk_norm_after_rotary")
            return None
        if qk_shape["qk_norm_head_gains"] and (qk_across or not qk_shape["qk_norm_affine"]):
            self.out.error("E0211", "a gain per head needs a learned gain on each head's own norm", o.span_of("qk_norm_head_gains"),
                           "drop qk_norm_head_gains, or the qk_norm_across / qk_norm_affine=false")
            return None
        if qk_shape["qk_norm_bias"] and qk_shape["qk_norm_type"] != "layernorm":
            self.out.error("E0211", "a qk rmsnorm has no bias", o.span_of("qk_norm_bias"), "add qk_norm_type=layernorm, or drop qk_norm_bias")
            return None
        if not qk_shape["qk_norm_affine"] and (qk_shape["qk_norm_bias"] or qk_shape["qk_norm_offset"]):
            what = "qk_norm_bias" if qk_shape["qk_norm_bias"] else "qk_norm_offset"
            self.out.error("E0211", f"a qk-norm with qk_norm_affine=false learns no gain, so it has no {what.removeprefix('qk_norm_')}", o.span_of(what),
                           f"drop {what}, or the qk_norm_affine=false")
            return None
        if kv is None:
            kv = heads
        if heads % kv:
            self.out.error("E0208", f"kv_heads={kv} does not divide heads={heads}", o.span_of("kv_heads"), "each group of query heads shares one KV head; pick a divisor of heads")
            return None
        head_dim = self._head_dim(o, w, heads, head_dim)
        if head_dim is None:
            return None
        if self._leaks(o, ctx, mask):
            return None
        if window is not None and mask == "open":
            self.out.error("E0211", "a sliding window is defined for causal attention only", o.span_of("window"))
            return None
        rotary_dims = int(head_dim * rotary) // 2 * 2
        if rotary > 0 and rotary_dims == 0:
            self.out.error("E0205", f"rotary={rotary:g} of head_dim {head_dim} rotates no pair of dimensions", o.span_of("rotary"), "raise the fraction")
            return None
        gemma4 = self._gemma4_attention(o, rotary_dims, interleaved, head_dim, qk_norm)
        if gemma4 is None:
            return None
        return ir.Attention(**gemma4, width=w, heads=heads, kv_heads=kv, head_dim=head_dim, mask=mask, window=window, rotary_dims=rotary_dims,
                            rotary_base=base, qk_norm=qk_norm, bias=bias, out_bias=out_bias, dropout=dropout,
                            qk_norm_eps=qk_eps, qk_norm_across=qk_across, scale=scale, rotary_interleaved=interleaved,
                            rotary_scaling=scaling, softcap=softcap, alibi=alibi, alibi_scaled=alibi_scaled, **qk_shape,
                            sinks=bool(o.get("sinks")), gate=gate or "none", gate_act=gate_act, span=d.span)  # sinks: gpt-oss's learned logit per head in every softmax

    def _gemma4_attention(self, o: Options, rotary_dims: int, interleaved: bool, head_dim: int, qk_norm: bool) -> dict | None:
        """Gemma 4's attention options: rotary_spread, v_norm, k_eq_v (None after an error)."""
        out = {k: o.get(k) for k in ("rotary_spread", "v_norm", "k_eq_v")}
        if None in out.values():
            return None
        out.update({k: o.get(k) for k in ("kv_store", "kv_reuse")})
        if out["kv_reuse"] is not None and (out["kv_store"] is not None or out["k_eq_v"] or out["v_norm"]):
            what = next(k for k in ("kv_store", "k_eq_v", "v_norm") if out[k])
            self.out.error("E0211", f"kv_reuse reads another layer's keys and values: this attention has none to {'store' if what == 'kv_store' else what}",
                           o.span_of(what), f"drop {what}")
            return None
        if out["rotary_spread"] and (not rotary_dims or interleaved or head_dim % 2):
            self.out.error("E0211", "rotary_spread spreads the rotated pairs over the two halves of a head: it needs rotary, not interleaved, and an even head_dim",
                           o.span_of("rotary_spread"), "add rotary=FRACTION, or drop rotary_spread")
            return None
        if out["v_norm"] and not qk_norm:
            self.out.error("E0211", "v_norm normalises the values as the qk-norm does the keys (its eps is qk_norm_eps), but qk_norm is off",
                           o.span_of("v_norm"), "add qk_norm")
            return None
        return out

    _SCALING_OPTIONS = {"rotary_factor": ("linear", "dynamic", "llama3", "yarn"), "rotary_original": ("dynamic", "llama3", "yarn"),
                        "rotary_low": ("llama3",), "rotary_high": ("llama3",), "rotary_beta_fast": ("yarn",),
                        "rotary_beta_slow": ("yarn",), "rotary_attention_factor": ("yarn",), "rotary_truncate": ("yarn",)}

    def _rotary_scaling(self, o: Options, ctx, rotary):
        """The attention's RotaryScaling, None for plain rotary, False after an error."""
        before = len(self.out.diagnostics)
        kind = o.get("rotary_scaling")
        values = {name: o.get(name) for name in self._SCALING_OPTIONS}
        if kind is None or len(self.out.diagnostics) > before:  # a kind or a value already refused: nothing more to say
            return False
        for name, kinds in self._SCALING_OPTIONS.items():
            if o.has(name) and kind not in kinds:
                which = " or ".join(kinds)
                self.out.error("E0240", f"{name}= belongs to rotary_scaling={which}, but this attention's is {kind}", o.span_of(name),
                               f"set rotary_scaling={kinds[0]}, or drop {name}=" if kind == "none" else f"drop {name}=")
                return False
        if kind == "none":
            return None
        if not rotary:
            self.out.error("E0241", f"rotary_scaling={kind} stretches rotary positions, but rotary is off", o.span_of("rotary_scaling"), "add rotary")
            return False
        if values["rotary_factor"] is None:
            self.out.error("E0242", f"rotary_scaling={kind} needs rotary_factor=", o.span_of("rotary_scaling"),
                           "how many times the pretraining context the positions stretch over, e.g. rotary_factor=4")
            return False
        original = None if kind == "linear" else values["rotary_original"] or ctx.context
        if original is None and kind != "linear":  # no context to default to: the feed's own error says why
            return False
        if kind == "llama3" and values["rotary_high"] <= values["rotary_low"]:
            self.out.error("E0243", f"llama3 scaling needs rotary_high ({values['rotary_high']:g}) above rotary_low ({values['rotary_low']:g})",
                           o.span_of("rotary_high"), "transformers' defaults are rotary_low=1 rotary_high=4")
            return False
        return ir.RotaryScaling(type=kind, factor=values["rotary_factor"], original=original, low=values["rotary_low"], high=values["rotary_high"],
                                beta_fast=values["rotary_beta_fast"], beta_slow=values["rotary_beta_slow"],
                                attention_factor=values["rotary_attention_factor"], truncate=values["rotary_truncate"])

    def _head_dim(self, o: Options, w: int, heads: int, head_dim: int | None) -> int | None:
        """head_dim as given, or the width split into the heads (E0207 when they do not divide it)."""
        if head_dim is not None:
            return head_dim
        if w % heads:
            self.out.error("E0207", f"heads={heads} does not divide the width {w}", o.span_of("heads"), _divisor_hint(w, heads) + ", or set head_dim=")
            return None
        return w // heads

    def _leaks(self, o: Options, ctx, mask: str) -> bool:
        if ctx.throat == "causal" and mask == "open":
            self.out.error("E0218", "a bidirectional mixer inside a causal engine would leak the future", o.span_of("mask"), "drop mask=open, or make the engine 'throat open'")
            return True
        return False

    def t_latent_attention(self, o: Options, ctx, w, d):
        heads = o.get("heads")
        latent = o.get("latent")
        q_latent = o.get("q_latent")
        head_dim = o.get("head_dim")
        rotary_dims = o.get("rotary_dims")
        v_dim = o.get("v_dim")
        base = o.get("rotary_base")
        eps = o.get("eps")
        bias = o.get("bias")
        mask = o.get("mask", ctx.throat)
        if None in (heads, latent, base, eps, mask, w) or (q_latent is None and o.has("q_latent")):
            return None
        head_dim = self._head_dim(o, w, heads, head_dim)
        if head_dim is None:
            return None
        rotary_dims = head_dim // 2 // 2 * 2 if rotary_dims is None else rotary_dims
        if rotary_dims < 2 or rotary_dims % 2:
            self.out.error("E0233", f"rotary_dims={rotary_dims}: latent attention's decoupled rotary key needs an even number of dims, at least 2",
                           o.span_of("rotary_dims"), "set rotary_dims= to an even number (DeepSeek-V2: 64 beside head_dim=128)")
            return None
        if self._leaks(o, ctx, mask):
            return None
        return ir.LatentAttention(width=w, heads=heads, head_dim=head_dim, rotary_dims=rotary_dims, v_dim=v_dim or head_dim, latent=latent,
                                  q_latent=q_latent, rotary_base=base, eps=eps, bias=bias, mask=mask, span=d.span)

    def _hidden(self, o: Options, w: int | None):
        ratio_given, hidden_given = o.has("ratio"), o.has("hidden")
        ratio = o.get("ratio")
        hidden = o.get("hidden")
        if ratio_given and hidden_given:
            self.out.error("E0211", "give ratio= or hidden=, not both", o.span_of("hidden"))
            return None
        if w is None:
            return None
        if hidden is not None:
            return hidden
        if hidden_given or ratio_given and ratio is None:
            return None
        r = 4.0 if ratio is None else ratio
        h = r * w
        if not math.isfinite(h) or h > MAX_WIDTH * 64:  # ratio=1e308 overflows to inf
            self.out.error("E0205", f"ratio={r:g} of width {w} gives a hidden width above the limit of {MAX_WIDTH * 64}", o.span_of("ratio"))
            return None
        if abs(h - round(h)) > 1e-6:
            self.out.error("E0209", f"ratio={r:g} of width {w} is {h:g}, not a whole width", o.span_of("ratio"), f"set the hidden width directly, e.g. hidden={int(round(h))}")
            return None
        if round(h) < 1:
            self.out.error("E0205", "the hidden width is below 1", o.span_of("ratio"))
            return None
        return int(round(h))

    def t_mlp(self, o: Options, ctx, w, d):
        hidden = self._hidden(o, w)
        act = o.get("act")
        bias = o.get("bias")
        dropout = o.get("dropout")
        clamp = self._clamp(o, act)
        gate_scale = o.get("gate_scale")
        per_layer = o.get("per_layer")
        if None in (hidden, act, dropout, w, clamp, gate_scale, per_layer):
            return None
        if gate_scale != 1.0 and act not in ir.nodes.GATE_SCALED:  # the node's own rule
            self.out.error("E0211", f"gate_scale scales a gated MLP's gate; act={act} has none", o.span_of("gate_scale"),
                           "use a gated act (swiglu, geglu), or drop gate_scale=")
            return None
        if per_layer and act in ir.nodes.GATED:  # the node's own rule
            self.out.error("E0211", f"a per-layer mlp is gated by its per-layer input: act={act} is gated already", o.span_of("act"), "a plain act (gelu_tanh: Gemma 4's)")
            return None
        return ir.Mlp(width=w, hidden=hidden, act=act, bias=bias, dropout=dropout, clamp=clamp, gate_scale=gate_scale, per_layer=per_layer, span=d.span)

    def _clamp(self, o: Options, act):
        """swiglu_clamp's bound (clamp=), None after an error: it bounds that activation only."""
        clamp = o.get("clamp")
        if o.has("clamp") and act is not None and act != "swiglu_clamp":
            self.out.error("E0211", f"clamp= bounds swiglu_clamp's gate and up, but the activation is {act}", o.span_of("clamp"),
                           "add act=swiglu_clamp, or drop clamp=")
            return None
        return clamp

    def t_moe(self, o: Options, ctx, w, d):
        experts = o.get("experts")
        top = o.get("top", 2 if (experts or 0) >= 2 else 1)
        capacity = o.get("capacity")
        balance = o.get("balance")
        hidden = self._hidden(o, w)
        act = o.get("act")
        bias = o.get("bias")
        normalize = o.get("normalize")
        shared = o.get("shared")
        shared_gate = o.get("shared_gate")
        if None in (experts, top, balance, hidden, act, w, shared):
            return None
        if shared_gate and not shared:
            self.out.error("E0211", "shared_gate gates a shared expert, but there is none", o.span_of("shared_gate"), "add shared=N (its hidden width)")
            return None
        if top > experts:
            self.out.error("E0205", f"top={top} routes to more experts than the {experts} there are", o.span_of("top"))
            return None
        routing = self._routing(o, experts, top, balance)
        clamp = self._clamp(o, act)  # gpt-oss's experts (act=swiglu_clamp) and its biased router (router_bias)
        if routing is None or clamp is None:
            return None
        return ir.Moe(width=w, hidden=hidden, experts=experts, top=top, capacity=capacity, balance=balance, act=act, bias=bias, normalize=normalize, shared=shared,
                      shared_gate=shared_gate, **routing, router_bias=bool(o.get("router_bias")), clamp=clamp, span=d.span)

    def _routing(self, o: Options, experts: int, top: int, balance: float) -> dict | None:
        """The router's DeepSeek-V3 options (scores, groups, scale, correction bias), each checked
        against the others where it is written."""
        router, groups, group_score, scale = o.get("router"), o.get("groups"), o.get("group_score"), o.get("scale")
        correction, rate = o.get("correction"), o.get("correction_rate")
        top_groups = o.get("top_groups", groups)
        if None in (router, groups, top_groups, group_score, scale, rate):
            return None
        bad = None
        if experts % groups:
            bad = ("E0205", "groups", f"{experts} experts do not split into {groups} equal groups", "groups must divide experts")
        elif top_groups > groups:
            bad = ("E0205", "top_groups", f"top_groups={top_groups} keeps more groups than the {groups} there are", None)
        elif top > top_groups * (experts // groups):
            bad = ("E0205", "top", f"top={top} routes to more experts than the {top_groups} kept groups of {experts // groups} hold", None)
        elif group_score == "top2" and groups > 1 and experts // groups < 2:
            bad = ("E0211", "groups", "group_score=top2 sums a group's two best scores, but each group holds one expert", "use group_score=max, or fewer groups")
        elif rate and not correction:
            bad = ("E0211", "correction_rate", "correction_rate updates the correction bias, but there is none", "add correction=true")
        elif router == "sigmoid" and balance:
            bad = ("E0211", "balance", "balance= is the Switch loss over softmax probabilities, and sigmoid scores do not sum to 1",
                   "balance a sigmoid router with correction=true correction_rate=0.001 (auxiliary-loss-free)")
        if bad is not None:
            self.out.error(bad[0], bad[2], o.span_of(bad[1]), bad[3])
            return None
        return {"router": router, "groups": groups, "top_groups": top_groups, "group_score": group_score, "scale": scale,
                "correction": correction, "correction_rate": rate}

    def t_pool(self, o: Options, ctx, w, d):
        size = o.get("size")
        if size is None or w is None:
            return None
        return ir.Pool(width=w, size=size, causal=ctx.throat == "causal", span=d.span)

    def t_conv(self, o: Options, ctx, w, d):
        size = o.get("size")  # a kernel past the context is unwise, not wrong
        bias = o.get("bias")
        if size is None or w is None:
            return None
        return ir.Conv(width=w, size=size, bias=bias, causal=ctx.throat == "causal", span=d.span)

    def t_short_conv(self, o: Options, ctx, w, d):
        size = o.get("size")
        bias = o.get("bias")
        if size is None or w is None:
            return None
        return ir.ShortConv(width=w, size=size, bias=bias, causal=ctx.throat == "causal", span=d.span)

    def _inner_heads(self, o: Options, w, heads, inner_what: str, inner=None):
        """head_dim: given, or the inner width (`inner`, else the chamber's) split into heads (E0230)."""
        head_dim = o.get("head_dim")
        if heads is None or w is None or (head_dim is None and o.has("head_dim")):
            return None
        if head_dim is not None:
            return head_dim
        inner = w if inner is None else inner
        if inner % heads:
            self.out.error("E0230", f"heads={heads} do not divide the {inner_what} {inner}", o.span_of("heads"),
                           _divisor_hint(inner, heads) + ", or set head_dim=")
            return None
        return inner // heads

    def t_ssm(self, o: Options, ctx, w, d):
        if o.get("version") == 1:  # Mamba-1: a kind of its own
            return self.t_mamba1(o, ctx, w, d)
        for name in ("dt_rank", "norms", "norms_affine"):
            if o.has(name):
                o.known.append(name)
                self.out.error("E0280", f"{name}= belongs to Mamba-1's mixer, not Mamba-2's", o.span_of(name),
                               "add version=1 (Jamba's and Mamba's mixer), or drop it")
        heads = o.get("heads")
        state = o.get("state")
        groups = o.get("groups")
        expand_given = o.has("expand")
        expand = o.get("expand")
        conv = o.get("conv")
        chunk = o.get("chunk")
        bias = o.get("bias")
        conv_bias = o.get("conv_bias")
        eps = o.get("eps")
        dt_min = o.get("dt_min")
        dt_max = o.get("dt_max")
        dt_lo = o.get("dt_lo")
        dt_hi = o.get("dt_hi")
        out_norm = o.get("out_norm")
        scales = tuple(o.get(f"{p}_scale") for p in ("z", "x", "b", "c", "dt"))
        if None in (heads, state, groups, expand, conv, chunk, eps, dt_min, dt_max, dt_lo, w, out_norm, *scales):
            return None
        inner = expand * w
        if abs(inner - round(inner)) > 1e-6:
            self.out.error("E0209", f"expand={expand:g} of width {w} is {inner:g}, not a whole width", o.span_of("expand"),
                           "choose an expand that gives a whole inner width, or set head_dim=")
            return None
        if expand_given and o.has("head_dim"):
            self.out.error("E0211", "give expand= or head_dim=, not both (heads x head_dim is the inner width)", o.span_of("head_dim"))
            return None
        head_dim = self._inner_heads(o, w, heads, "inner width (expand x width)", int(round(inner)))
        if head_dim is None:
            return None
        if heads % groups:
            self.out.error("E0231", f"groups={groups} does not divide heads={heads}", o.span_of("groups"),
                           "each group of heads shares one B and one C; pick a divisor of heads")
            return None
        if dt_min > dt_max:
            self.out.error("E0211", f"dt_min={dt_min:g} is above dt_max={dt_max:g}", o.span_of("dt_min"))
            return None
        if dt_hi is not None and dt_hi <= dt_lo:
            self.out.error("E0211", f"dt_hi={dt_hi:g} must be above dt_lo={dt_lo:g}", o.span_of("dt_hi"))
            return None
        return ir.Ssm(width=w, heads=heads, head_dim=head_dim, state=state, groups=groups, conv=conv, chunk=chunk, bias=bias,
                      conv_bias=conv_bias, eps=eps, dt_min=dt_min, dt_max=dt_max, dt_lo=dt_lo, dt_hi=dt_hi, out_norm=out_norm,
                      scales=scales, span=d.span)

    def t_mamba1(self, o: Options, ctx, w, d):
        for name in ("heads", "head_dim", "groups", "dt_lo", "dt_hi", "out_norm", "z_scale", "x_scale", "b_scale", "c_scale", "dt_scale"):  # Mamba-2's: read, so they are refused once, here
            if o.has(name):
                o.known.append(name)
                self.out.error("E0280", f"{name}= belongs to Mamba-2's mixer; version=1 has one state per channel, no heads"
                               + (" and no clamp on the step" if name.startswith("dt_") else ""), o.span_of(name),
                               "drop it, or write version=2")
        state = o.get("state", 16)
        expand = o.get("expand")
        dt_rank = o.get("dt_rank")
        conv = o.get("conv")
        chunk = o.get("chunk", 32)
        bias = o.get("bias")
        conv_bias = o.get("conv_bias")
        norms = o.get("norms")
        norms_affine = o.get("norms_affine")
        eps = o.get("eps", 1e-6)
        dt_min = o.get("dt_min")
        dt_max = o.get("dt_max")
        if None in (state, expand, conv, chunk, eps, dt_min, dt_max, w) or (dt_rank is None and o.has("dt_rank")):
            return None
        inner = expand * w
        if abs(inner - round(inner)) > 1e-6 or round(inner) < 1:
            self.out.error("E0209", f"expand={expand:g} of width {w} is {inner:g}, not a whole width", o.span_of("expand"),
                           "choose an expand that gives a whole inner width")
            return None
        if dt_min > dt_max:
            self.out.error("E0211", f"dt_min={dt_min:g} is above dt_max={dt_max:g}", o.span_of("dt_min"))
            return None
        if norms_affine is False and not norms:
            self.out.error("E0211", "norms_affine=false takes the weight off the dt/B/C norms, which this mixer does not have",
                           o.span_of("norms_affine"), "add norms, or drop norms_affine=")
            return None
        return ir.Mamba1(width=w, inner=int(round(inner)), state=state, dt_rank=dt_rank or math.ceil(w / 16), conv=conv, chunk=chunk,
                         bias=bias, conv_bias=conv_bias, norms=norms, eps=eps, norms_affine=norms_affine is not False, dt_min=dt_min,
                         dt_max=dt_max, span=d.span)

    def t_linear_attention(self, o: Options, ctx, w, d):
        heads = o.get("heads")
        feature = o.get("feature")
        normalize = o.get("normalize")
        decay = o.get("retention")  # `decay` is the startup's word: RetNet's name for the decayed form
        chunk = o.get("chunk")
        bias = o.get("bias")
        head_dim = self._inner_heads(o, w, heads, "width")
        if None in (head_dim, feature, chunk, w):
            return None
        if decay and ctx.throat != "causal":
            self.out.error("E0232", "a decay is defined for causal linear attention only", o.span_of("retention"),
                           "drop retention, or make the engine 'throat causal'")
            return None
        return ir.LinearAttention(width=w, heads=heads, head_dim=head_dim, feature=feature, normalize=normalize, decay=decay,
                                  chunk=chunk, bias=bias, causal=ctx.throat == "causal", span=d.span)

    def t_delta(self, o: Options, ctx, w, d):
        heads = o.get("heads")
        k_heads = o.get("k_heads")
        v_dim = o.get("v_dim")
        conv = o.get("conv")
        chunk = o.get("chunk")
        eps = o.get("eps")
        negative = o.get("negative_eigenvalues")
        head_dim = self._inner_heads(o, w, heads, "width")
        if None in (head_dim, conv, chunk, eps, w) or (v_dim is None and o.has("v_dim")) or (k_heads is None and o.has("k_heads")):
            return None
        if ctx.throat != "causal":
            self.out.error("E0284", "the gated delta rule reads only the past: it has no bidirectional form", d.span,
                           "make the engine 'throat causal', or use attention in an open engine")
            return None
        k_heads = heads if k_heads is None else k_heads
        if heads % k_heads:
            self.out.error("E0285", f"k_heads={k_heads} does not divide heads={heads}", o.span_of("k_heads"),
                           "each group of value heads reads one query/key head; pick a divisor of heads")
            return None
        return ir.GatedDelta(width=w, heads=heads, k_heads=k_heads, head_dim=head_dim, v_dim=v_dim or head_dim, conv=conv,
                             chunk=chunk, eps=eps, negative_eigenvalues=bool(negative), span=d.span)

    def t_linear(self, o: Options, ctx, w, d):
        out = o.get("out", w)
        bias = o.get("bias")
        if out is None or w is None:
            return None
        return ir.Linear(width=w, out=out, bias=bias, span=d.span)


def _divisor_hint(w: int, heads: int) -> str:
    divs = [h for h in range(1, min(w, 4 * heads) + 1) if w % h == 0]
    near = sorted(divs, key=lambda h: (abs(h - heads), h))[:2]
    return "heads that divide it: " + " or ".join(str(h) for h in sorted(near))
