"""The resolver's op readers: a norm, the generic build of a turbine from its option rows
(`made`, after `Options.read`), and the rules hooks `t_<keyword>` of the kinds whose options
meet rules across options or derive a field: each starts from the same read and adds its
checks and derived values. `resolve._Resolver` inherits them; a kind without a hook is read
as `options.TABLE` declares it (`ir.kinds.registered` holds its rows to its node's fields).
"""

from __future__ import annotations

import math
import typing

from .. import ir
from ..diagnostics import did_you_mean
from ..syntax import ast
from .options import MAX_WIDTH, Options

NORMS = typing.get_args(ir.NormType)
QK_SHAPE = ("qk_norm_type", "qk_norm_bias", "qk_norm_offset", "qk_norm_affine", "qk_norm_after_rotary", "qk_norm_head_gains")


class OpReaders:
    """norm, `made` and the turbines' rules hooks (`resolve.TURBINES`): mixed into `resolve._Resolver` (self.out, self.missing_kind, ...)."""

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

    def made(self, cls, v: dict, ctx, w, d):
        """The node of kind `cls` from its fields' values (`Options.read`), the width where it sits and,
        for a field `causal`, the engine's throat; None where the width or a value the node needs is
        missing (its error is said already). A kind without a rules hook is built by this alone."""
        if w is None or any(x is None and not _may_be_none(cls, f) for f, x in v.items()):
            return None
        if "causal" in cls.model_fields:
            v = {**v, "causal": ctx.throat == "causal"}
        return cls(width=w, **v, span=d.span)

    # --- the rules hooks: a kind whose options meet cross-option rules or derive a field ---------------
    # `t_<keyword>` starts from the generic read (`Options.read`) and adds its checks and derived values.

    def t_attention(self, o: Options, ctx, w, d):
        if o.has("latent"):  # multi-head latent attention: a kind of its own
            return self.t_latent_attention(o, ctx, w, d)
        v = o.read(ir.Attention, where(ctx, w))
        if v["out_bias"] is None:
            v["out_bias"] = v["bias"]
        rotary = o.get("rotary")
        scaling = self._rotary_scaling(o, ctx, rotary)  # every row read before any rule refuses the op
        heads, kv, mask, qk_norm, qk_across = v["heads"], v["kv_heads"], v["mask"], v["qk_norm"], v["qk_norm_across"]
        if v["alibi_scaled"] and not v["alibi"]:
            self.out.error("E0211", "alibi_scaled says how ALiBi positions are scaled, but alibi is off", o.span_of("alibi_scaled"), "add alibi")
            return None
        if v["gate_act"] != "sigmoid" and v["gate"] == "none":
            self.out.error("E0211", f"gate_act={v['gate_act']} is the output gate's function, but there is no gate", o.span_of("gate_act"), "add gate=channel or gate=head")
            return None
        if None in (heads, w, mask, rotary, v["rotary_base"], v["dropout"], v["qk_norm_eps"]) or scaling is False:
            return None
        if v["rotary_interleaved"] and not rotary:
            self.out.error("E0211", "rotary_interleaved says how rotary positions pair the dims, but rotary is off", o.span_of("rotary_interleaved"), "add rotary")
            return None
        if (o.has("qk_norm_eps") or qk_across) and not qk_norm:
            self.out.error("E0211", "qk_norm_eps= and qk_norm_across set a qk-norm, but qk_norm is off", o.span_of("qk_norm_eps" if o.has("qk_norm_eps") else "qk_norm_across"), "add qk_norm")
            return None
        qk_shape = {k: v[k] for k in QK_SHAPE}
        said = next((k for k in QK_SHAPE if o.has(k)), None)
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
        head_dim = self._head_dim(o, w, heads, v["head_dim"])
        if head_dim is None:
            return None
        if self._leaks(o, ctx, mask):
            return None
        if v["window"] is not None and mask == "open":
            self.out.error("E0211", "a sliding window is defined for causal attention only", o.span_of("window"))
            return None
        rotary_dims = int(head_dim * rotary) // 2 * 2
        if rotary > 0 and rotary_dims == 0:
            self.out.error("E0205", f"rotary={rotary:g} of head_dim {head_dim} rotates no pair of dimensions", o.span_of("rotary"), "raise the fraction")
            return None
        if not self._gemma4_attention(o, v, rotary_dims, head_dim):
            return None
        v.update(kv_heads=kv, head_dim=head_dim, rotary_dims=rotary_dims, rotary_scaling=scaling)
        return ir.Attention(width=w, **v, span=d.span)  # sinks: gpt-oss's learned logit per head in every softmax

    def _gemma4_attention(self, o: Options, v: dict, rotary_dims: int, head_dim: int) -> bool:
        """Gemma 4's attention options (rotary_spread, v_norm, k_eq_v, kv_store, kv_reuse) against the rest: False after an error."""
        if None in (v["rotary_spread"], v["v_norm"], v["k_eq_v"]):
            return False
        if v["kv_reuse"] is not None and (v["kv_store"] is not None or v["k_eq_v"] or v["v_norm"]):
            what = next(k for k in ("kv_store", "k_eq_v", "v_norm") if v[k])
            self.out.error("E0211", f"kv_reuse reads another layer's keys and values: this attention has none to {'store' if what == 'kv_store' else what}",
                           o.span_of(what), f"drop {what}")
            return False
        if v["rotary_spread"] and (not rotary_dims or v["rotary_interleaved"] or head_dim % 2):
            self.out.error("E0211", "rotary_spread spreads the rotated pairs over the two halves of a head: it needs rotary, not interleaved, and an even head_dim",
                           o.span_of("rotary_spread"), "add rotary=FRACTION, or drop rotary_spread")
            return False
        if v["v_norm"] and not v["qk_norm"]:
            self.out.error("E0211", "v_norm normalises the values as the qk-norm does the keys (its eps is qk_norm_eps), but qk_norm is off",
                           o.span_of("v_norm"), "add qk_norm")
            return False
        return True

    _SCALING_OPTIONS = {"rotary_factor": ("linear", "dynamic", "llama3", "yarn"), "rotary_original": ("dynamic", "llama3", "yarn"),
                        "rotary_low": ("llama3",), "rotary_high": ("llama3",), "rotary_beta_fast": ("yarn",),
                        "rotary_beta_slow": ("yarn",), "rotary_attention_factor": ("yarn",), "rotary_truncate": ("yarn",),
                        "rotary_temperature": ("dynamic", "llama3", "yarn")}

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
                                attention_factor=values["rotary_attention_factor"], truncate=values["rotary_truncate"],
                                temperature=values["rotary_temperature"])

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
        v = o.read(ir.LatentAttention, where(ctx, w))
        heads, mask = v["heads"], v["mask"]
        if None in (heads, v["latent"], v["rotary_base"], v["eps"], mask, w) or (v["q_latent"] is None and o.has("q_latent")):
            return None
        head_dim = self._head_dim(o, w, heads, v["head_dim"])
        if head_dim is None:
            return None
        rotary_dims = head_dim // 2 // 2 * 2 if v["rotary_dims"] is None else v["rotary_dims"]
        if rotary_dims < 2 or rotary_dims % 2:
            self.out.error("E0233", f"rotary_dims={rotary_dims}: latent attention's decoupled rotary key needs an even number of dims, at least 2",
                           o.span_of("rotary_dims"), "set rotary_dims= to an even number (DeepSeek-V2: 64 beside head_dim=128)")
            return None
        if self._leaks(o, ctx, mask):
            return None
        v.update(head_dim=head_dim, rotary_dims=rotary_dims, v_dim=v["v_dim"] or head_dim)
        return ir.LatentAttention(width=w, **v, span=d.span)

    def _hidden(self, o: Options, w: int | None, hidden: int | None):
        """The hidden width: hidden= as given, or ratio= (hook-read) of the width."""
        ratio_given, hidden_given = o.has("ratio"), o.has("hidden")
        ratio = o.get("ratio")
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
        v = o.read(ir.Mlp)
        v["hidden"] = self._hidden(o, w, v["hidden"])
        act = v["act"]
        v["clamp"] = self._clamp(o, act, v["clamp"])
        if None in (*v.values(), w):
            return None
        if v["gate_scale"] != 1.0 and act not in ir.nodes.GATE_SCALED:  # the node's own rule
            self.out.error("E0211", f"gate_scale scales a gated MLP's gate; act={act} has none", o.span_of("gate_scale"),
                           "use a gated act (swiglu, geglu), or drop gate_scale=")
            return None
        if v["per_layer"] and act in ir.nodes.GATED:  # the node's own rule
            self.out.error("E0211", f"a per-layer mlp is gated by its per-layer input: act={act} is gated already", o.span_of("act"), "a plain act (gelu_tanh: Gemma 4's)")
            return None
        return ir.Mlp(width=w, **v, span=d.span)

    def _clamp(self, o: Options, act, clamp):
        """swiglu_clamp's bound (clamp=), None after an error: it bounds that activation only."""
        if o.has("clamp") and act is not None and act != "swiglu_clamp":
            self.out.error("E0211", f"clamp= bounds swiglu_clamp's gate and up, but the activation is {act}", o.span_of("clamp"),
                           "add act=swiglu_clamp, or drop clamp=")
            return None
        return clamp

    def t_moe(self, o: Options, ctx, w, d):
        v = o.read(ir.Moe)
        experts = v["experts"]
        if v["top"] is None:
            v["top"] = 2 if (experts or 0) >= 2 else 1
        top = v["top"]
        v["hidden"] = self._hidden(o, w, v["hidden"])
        if None in (experts, top, v["balance"], v["hidden"], v["act"], w, v["shared"]):
            return None
        if v["shared_gate"] and not v["shared"]:
            self.out.error("E0211", "shared_gate gates a shared expert, but there is none", o.span_of("shared_gate"), "add shared=N (its hidden width)")
            return None
        if top > experts:
            self.out.error("E0205", f"top={top} routes to more experts than the {experts} there are", o.span_of("top"))
            return None
        if v["top_groups"] is None:
            v["top_groups"] = v["groups"]
        routing = self._routing(o, v)
        v["clamp"] = self._clamp(o, v["act"], v["clamp"])  # gpt-oss's experts (act=swiglu_clamp) and its biased router (router_bias)
        if not routing or v["clamp"] is None:
            return None
        return ir.Moe(width=w, **v, span=d.span)

    def _routing(self, o: Options, v: dict) -> bool:
        """The router's DeepSeek-V3 options (scores, groups, scale, correction bias), each checked
        against the others where it is written; False after an error."""
        experts, top, groups, top_groups = v["experts"], v["top"], v["groups"], v["top_groups"]
        if None in (v["router"], groups, top_groups, v["group_score"], v["scale"], v["correction_rate"], v["normalize_eps"]):
            return False
        bad = None
        if experts % groups:
            bad = ("E0205", "groups", f"{experts} experts do not split into {groups} equal groups", "groups must divide experts")
        elif top_groups > groups:
            bad = ("E0205", "top_groups", f"top_groups={top_groups} keeps more groups than the {groups} there are", None)
        elif top > top_groups * (experts // groups):
            bad = ("E0205", "top", f"top={top} routes to more experts than the {top_groups} kept groups of {experts // groups} hold", None)
        elif v["group_score"] == "top2" and groups > 1 and experts // groups < 2:
            bad = ("E0211", "groups", "group_score=top2 sums a group's two best scores, but each group holds one expert", "use group_score=max, or fewer groups")
        elif v["correction_rate"] and not v["correction"]:
            bad = ("E0211", "correction_rate", "correction_rate updates the correction bias, but there is none", "add correction=true")
        elif v["router"] == "sigmoid" and v["balance"]:
            bad = ("E0211", "balance", "balance= is the Switch loss over softmax probabilities, and sigmoid scores do not sum to 1",
                   "balance a sigmoid router with correction=true correction_rate=0.001 (auxiliary-loss-free)")
        elif o.has("normalize_eps") and not (v["router"] == "sigmoid" and v["normalize"]):
            bad = ("E0211", "normalize_eps", "normalize_eps is added to the sum the sigmoid router renormalises by, but "
                   + ("normalize is false" if v["router"] == "sigmoid" else "the router is softmax, renormalised by the plain sum"),
                   "drop normalize_eps=, or write router=sigmoid normalize=true")
        if bad is not None:
            self.out.error(bad[0], bad[2], o.span_of(bad[1]), bad[3])
            return False
        return True

    def _inner_heads(self, o: Options, w, heads, head_dim, inner_what: str, inner=None):
        """head_dim: given, or the inner width (`inner`, else the chamber's) split into heads (E0230)."""
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
        v = o.read(ir.Ssm)
        expand_given = o.has("expand")
        expand = o.get("expand")
        scales = tuple(o.get(f"{p}_scale") for p in ("z", "x", "b", "c", "dt"))
        heads, groups, dt_min, dt_max, dt_lo, dt_hi = (v[k] for k in ("heads", "groups", "dt_min", "dt_max", "dt_lo", "dt_hi"))
        if None in (heads, v["state"], groups, expand, v["conv"], v["chunk"], v["eps"], dt_min, dt_max, dt_lo, w, v["out_norm"], *scales):
            return None
        inner = expand * w
        if abs(inner - round(inner)) > 1e-6:
            self.out.error("E0209", f"expand={expand:g} of width {w} is {inner:g}, not a whole width", o.span_of("expand"),
                           "choose an expand that gives a whole inner width, or set head_dim=")
            return None
        if expand_given and o.has("head_dim"):
            self.out.error("E0211", "give expand= or head_dim=, not both (heads x head_dim is the inner width)", o.span_of("head_dim"))
            return None
        v["head_dim"] = self._inner_heads(o, w, heads, v["head_dim"], "inner width (expand x width)", int(round(inner)))
        if v["head_dim"] is None:
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
        return ir.Ssm(width=w, **v, scales=scales, span=d.span)

    def t_mamba1(self, o: Options, ctx, w, d):
        for name in ("heads", "head_dim", "groups", "dt_lo", "dt_hi", "out_norm", "z_scale", "x_scale", "b_scale", "c_scale", "dt_scale"):  # Mamba-2's: read, so they are refused once, here
            if o.has(name):
                o.known.append(name)
                self.out.error("E0280", f"{name}= belongs to Mamba-2's mixer; version=1 has one state per channel, no heads"
                               + (" and no clamp on the step" if name.startswith("dt_") else ""), o.span_of(name),
                               "drop it, or write version=2")
        v = o.read(ir.Mamba1, state=16, chunk=32, eps=1e-6)
        expand = o.get("expand")
        if None in (v["state"], expand, v["conv"], v["chunk"], v["eps"], v["dt_min"], v["dt_max"], w) or (v["dt_rank"] is None and o.has("dt_rank")):
            return None
        inner = expand * w
        if abs(inner - round(inner)) > 1e-6 or round(inner) < 1:
            self.out.error("E0209", f"expand={expand:g} of width {w} is {inner:g}, not a whole width", o.span_of("expand"),
                           "choose an expand that gives a whole inner width")
            return None
        if v["dt_min"] > v["dt_max"]:
            self.out.error("E0211", f"dt_min={v['dt_min']:g} is above dt_max={v['dt_max']:g}", o.span_of("dt_min"))
            return None
        if v["norms_affine"] is False and not v["norms"]:
            self.out.error("E0211", "norms_affine=false takes the weight off the dt/B/C norms, which this mixer does not have",
                           o.span_of("norms_affine"), "add norms, or drop norms_affine=")
            return None
        v.update(inner=int(round(inner)), dt_rank=v["dt_rank"] or math.ceil(w / 16), norms_affine=v["norms_affine"] is not False)
        return ir.Mamba1(width=w, **v, span=d.span)

    def t_linear_attention(self, o: Options, ctx, w, d):
        v = o.read(ir.LinearAttention)
        v["head_dim"] = self._inner_heads(o, w, v["heads"], v["head_dim"], "width")
        if None in (v["head_dim"], v["feature"], v["chunk"], w):
            return None
        if v["decay"] and ctx.throat != "causal":  # `decay` is the startup's word: RetNet's name for the decayed form
            self.out.error("E0232", "a decay is defined for causal linear attention only", o.span_of("retention"),
                           "drop retention, or make the engine 'throat causal'")
            return None
        return self.made(ir.LinearAttention, v, ctx, w, d)

    def t_delta(self, o: Options, ctx, w, d):
        v = o.read(ir.GatedDelta)
        heads, k_heads = v["heads"], v["k_heads"]
        v["head_dim"] = self._inner_heads(o, w, heads, v["head_dim"], "width")
        if None in (v["head_dim"], v["conv"], v["chunk"], v["eps"], w) or (v["v_dim"] is None and o.has("v_dim")) or (k_heads is None and o.has("k_heads")):
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
        v.update(k_heads=k_heads, v_dim=v["v_dim"] or v["head_dim"], negative_eigenvalues=bool(v["negative_eigenvalues"]))
        return ir.GatedDelta(width=w, **v, span=d.span)


def where(ctx, w) -> dict:
    """What an option's contextual default reads (`Opt.context`): the width where the op sits, the engine's throat."""
    return {"width": w, "throat": ctx.throat}


def _may_be_none(cls, field: str) -> bool:
    return type(None) in typing.get_args(cls.model_fields[field].annotation)


def _divisor_hint(w: int, heads: int) -> str:
    divs = [h for h in range(1, min(w, 4 * heads) + 1) if w % h == 0]
    near = sorted(divs, key=lambda h: (abs(h - heads), h))[:2]
    return "heads that divide it: " + " or ".join(str(h) for h in sorted(near))
