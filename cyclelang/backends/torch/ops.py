"""The op emitters' interface, and the emitters of the small kinds (norm, linear, mlp, pool).

An emitter writes the class of a variant (norms and linears use torch's modules and
write none), the constructor expression and the call expression of one op, and says
what else the op needs: runtime definitions (`runtime/`), `math`, and how the merges'
init rules reach its weights (cooling re-initialises the output projection, deepnorm
scales v, the output projection and the reactor by beta). `emitters.EMITTERS` is the
table, keyed by IR class; attention and moe have modules of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from ...ir.kinds import GATE_OF, is_gated, kind_of
from .records import OpPlan, Plan
from .config import Expr, Sizes
from .writer import Writer, doc_tag, num


@dataclass(frozen=True)
class MlpVariant:
    kind: ClassVar[type] = ir.Mlp
    base: ClassVar[str] = "Mlp"
    act: str
    dropout: bool
    gate_scale: float = 1.0  # the gate's pre-activation times this (Falcon-H1's mlp_multipliers)
    per_layer: bool = False  # Gemma 4: act(gate x) times this layer's per-layer input

    @classmethod
    def of(cls, m: ir.Mlp, causal: bool) -> "MlpVariant":
        return cls(m.act, m.dropout > 0, gate_scale=m.gate_scale, per_layer=m.per_layer)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("ple",) if self.per_layer else ()


@dataclass(frozen=True)
class PoolVariant:
    kind: ClassVar[type] = ir.Pool
    base: ClassVar[str] = "Pool"
    causal: bool  # only past positions are pooled
    engine_causal: bool  # the forward takes a cache

    @classmethod
    def of(cls, p: ir.Pool, causal: bool) -> "PoolVariant":
        return cls(p.causal, causal)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.engine_causal else ()


# Each activation as generated code, a format string over its input; a gated one is
# gate(first half) * second half, with the gate from ir.kinds.GATE_OF.
ACTIVATIONS = {"gelu": "F.gelu({})", "gelu_tanh": 'F.gelu({}, approximate="tanh")', "relu": "F.relu({})", "relu2": "F.relu({}).square()", "silu": "F.silu({})"}
GLU_NAMES = {"swiglu": "SwiGLU", "geglu": "GeGLU", "geglu_tanh": "GeGLU (tanh GELU)"}
CLAMPED = "swiglu_clamp"  # gpt-oss's clamped SwiGLU: its own lines (`clamped_glu`), its bound a constructor argument


def call_args(*positional: str, **keywords: str | None) -> str:
    """`a, key=value, ...` for a constructor call; a keyword whose value is None is left out."""
    return ", ".join([*positional, *(f"{k}={v}" for k, v in keywords.items() if v is not None)])


def if_set(value, keep: bool) -> str | None:
    """The literal of an optional constructor argument, or None to leave it out."""
    return num(value) if keep else None


class OpEmitter:
    """The defaults: a torch module, no class text, no runtime, untouched by the merges' init."""

    variant: type | None = None  # the plan's record of what decides this kind's class text; None: a torch module

    def class_text(self, out: Writer, name: str, v, plan: Plan) -> None:
        raise NotImplementedError(f"{type(self).__name__} writes no class: its ops use a torch module")

    def sizes(self, op, c: Sizes, scope: tuple[str, ...]) -> dict:
        """The constructor's sizes as config values (`config.Sizes`): {argument: Ref or Expr}.
        A kind that asks for none keeps the IR's literals in its constructor."""
        return {}

    def ctor(self, o: OpPlan) -> str:
        raise NotImplementedError

    def module(self, o: OpPlan) -> str:
        """The class that builds the op: generated (`Attention2`) or torch's (`nn.Linear`)."""
        return o.cls

    def call(self, o: OpPlan, owner: str, x: str) -> str:
        """The expression applying the op to `x`: x, then rope, cache, mask as its variant takes them."""
        extra = {"rope": f"rope[{o.rope}]", "ple": "ple", "shared": "shared", "cache": "cache", "mask": "mask"}
        return f"{owner}.{o.attr}({', '.join([x] + [extra[i] for i in o.inputs])})"

    def phrase(self, op, place: str) -> tuple[str, str]:
        """What the op does where it sits, (ML words, engine word): place is "branch", "stage" or "engine"."""
        k = kind_of(op)
        if place == "branch":
            return k.ml_words, k.rocket
        return k.ml_words + ", on the residual stream itself (x = f(x))", k.rocket + ", pressure-fed"

    def runtime(self, op, causal: bool) -> tuple[str, ...]:
        return ()

    def cache_states(self, op) -> tuple[str, ...]:
        """The kinds of decoding state the op keeps in the Cache (runtime/cache.py's STATES):
        its kind's `state_kind`; a mixer that keeps more says so (an ssm's conv window)."""
        k = kind_of(op).state_kind
        return (k,) if k else ()

    def needs_math(self, op) -> bool:
        return False

    def output_init(self, a: str, op, std: str) -> list[str] | None:
        """Cooling: re-initialise the output projection of the op at `a`; None: it has none."""
        return None

    def deepnorm_init(self, a: str, op, beta: str) -> list[str]:
        return []


class NormEmitter(OpEmitter):
    PLACES = {"branch": ("Pre-LN: the norm is on the branch", "valve"),
              "stage": ("Post-LN: the norm is on the residual stream", "valve in series"),
              "engine": ("final norm", "valve on the main line")}

    def sizes(self, op, c, scope):
        if op.type == "scalar":  # a fixed gain: no sizes
            return {}
        out = {"width": c.width(op.width, scope), "eps": c.field("norm_eps", op.eps, scope, "the norms' epsilon", "float", let=op.let_of("eps"))}
        if op.offset:
            out["offset"] = c.field("norm_offset", op.offset, scope, "the norms' gain is norm_offset + w (Gemma, Nemotron: 1, w starting at 0)", "float", let=op.let_of("offset"))
        return out

    def ctor(self, o: OpPlan) -> str:
        op, s = o.op, o.args
        if op.type == "scalar":
            return "ScalarGain()"
        if op.offset and op.type == "layernorm":
            return f"OffsetLayerNorm({s['width']}, eps={s['eps']}, offset={s['offset']}{'' if op.bias else ', bias=False'})"
        if op.offset:
            return f"OffsetRMSNorm({s['width']}, eps={s['eps']}, offset={s['offset']})"
        if not op.affine:
            return f"{self.module(o)}({s['width']}, eps={s['eps']}, elementwise_affine=False)"
        if op.type == "layernorm":
            return f"nn.LayerNorm({s['width']}, eps={s['eps']}{'' if op.bias else ', bias=False'})"
        return f"nn.RMSNorm({s['width']}, eps={s['eps']})"

    def module(self, o: OpPlan) -> str:
        if o.op.type == "scalar":
            return "ScalarGain"
        if o.op.offset:
            return "OffsetLayerNorm" if o.op.type == "layernorm" else "OffsetRMSNorm"
        return "nn.LayerNorm" if o.op.type == "layernorm" else "nn.RMSNorm"

    def runtime(self, op, causal: bool) -> tuple[str, ...]:
        if op.type == "scalar":
            return ("ScalarGain",)
        return (("OffsetLayerNorm" if op.type == "layernorm" else "OffsetRMSNorm"),) if op.offset else ()

    def phrase(self, op, place: str) -> str:
        if op.type == "scalar":
            return ("a fixed gain on the stream (a buffer the weights bring)", "a throttle valve in series")
        return self.PLACES[place]


class LinearEmitter(OpEmitter):
    def sizes(self, op, c, scope):
        return {"width": c.width(op.width, scope), "out": c.width(op.out, scope, let=op.let_of("out"))}

    def ctor(self, o: OpPlan) -> str:
        return f"nn.Linear({o.args['width']}, {o.args['out']}, bias={num(o.op.bias)})"

    def module(self, o: OpPlan) -> str:
        return "nn.Linear"

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.weight.mul_({beta})"]


def head_sizes(op, c: Sizes, scope, heads_doc: str = "attention heads (query heads)") -> dict:
    """width, heads and head_dim of a multi-head mixer: head_dim is width // n_head where the
    spec's heads split the width, else a field of its own."""
    width = c.width(op.width, scope)
    heads = c.field("n_head", op.heads, scope, heads_doc, let=op.let_of("heads"))
    if op.heads * op.head_dim == op.width and op.let_of("head_dim") is None:
        hd = c.prop("head_dim", op.head_dim, scope, "channels per head", lambda: f"{width.own} // {heads.own}")
        c.divides(heads, width, "the heads split the width evenly")
    else:
        hd = c.field("head_dim", op.head_dim, scope, "channels per head", let=op.let_of("head_dim"))
    return {"width": width, "heads": heads, "head_dim": hd}


def hidden_size(c: Sizes, width, w: int, hidden: int, scope, base: str, what: str, op=None):
    """A hidden width: `ratio * width` where the spec's is a whole multiple of the width w, else a
    width of its own; the spec's let where it wrote `hidden=` or `ratio=` with one."""
    lets = {o: op.let_of(o) for o in ("hidden", "ratio")} if op is not None else {}
    if hidden % w == 0 and not lets.get("hidden"):
        r = c.field(f"{base}_ratio", hidden // w, scope, f"{what} hidden width = {base}_ratio x width", let=lets.get("ratio"))
        return Expr(lambda: f"{r} * {width}")
    return c.field(f"{base}_hidden", hidden, scope, f"{what} hidden width", let=lets.get("hidden"))


class MlpEmitter(OpEmitter):
    variant = MlpVariant

    def sizes(self, m, c, scope):
        width = c.width(m.width, scope)
        out = {"width": width, "hidden": hidden_size(c, width, m.width, m.hidden, scope, "mlp", "the MLP's", m)}
        if m.dropout > 0:
            out["dropout"] = c.field("dropout", m.dropout, scope, "dropout rate", "float", let=m.let_of("dropout"))
        return out

    def ctor(self, o: OpPlan) -> str:
        m, s = o.op, o.args
        return f"{o.cls}({call_args(str(s['width']), hidden=str(s['hidden']), bias=num(m.bias), dropout=str(s['dropout']) if 'dropout' in s else None, clamp=if_set(m.clamp, m.act == CLAMPED))})"

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.fc.weight.mul_({beta})", f"{a}.proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: MlpVariant, plan: Plan) -> None:
        w = out.line
        if v.per_layer:
            self.per_layer_text(out, name, v)
            return
        gated = is_gated(v.act)
        w(f"class {name}(nn.Module):")
        with out.indent():
            doc = "gpt-oss's clamped SwiGLU" if v.act == CLAMPED else f"{GLU_NAMES[v.act]}: {GATE_OF[v.act]}(gate) * up" if gated else v.act
            w(f'"""Position-wise MLP ({doc}): each position on its own{doc_tag(None, "combustor")}."""')
            w()
            with out.constructor("width", "hidden", "bias", *(["dropout"] if v.dropout else []), *(["clamp"] if v.act == CLAMPED else [])):
                if gated:
                    w("self.fc = nn.Linear(width, 2 * hidden, bias=bias)  # rows [gate | up]")
                else:
                    w("self.fc = nn.Linear(width, hidden, bias=bias)")
                w("self.proj = nn.Linear(hidden, width, bias=bias)")
                if v.dropout:
                    w("self.drop = nn.Dropout(dropout)")
                if v.act == CLAMPED:
                    w("self.clamp = clamp")
            w()
            w("def forward(self, x):")
            with out.indent():
                if v.act == CLAMPED:
                    clamped_glu(out)
                elif gated:
                    w("gate, up = self.fc(x).chunk(2, dim=-1)  # (B, T, hidden) each")
                    if v.gate_scale != 1.0:
                        w(f"gate = gate * {num(v.gate_scale)}  # the gate's multiplier (gate_scale)")
                    w(f"x = {ACTIVATIONS[GATE_OF[v.act]].format('gate')} * up")
                else:
                    w(f"x = {ACTIVATIONS[v.act].format('self.fc(x)')}  # (B, T, hidden)")
                w("return self.drop(self.proj(x))" if v.dropout else "return self.proj(x)")


    def per_layer_text(self, out: Writer, name: str, v: MlpVariant) -> None:
        """Gemma 4's per-layer input gate: the layer's own slice of the feed's per-layer inputs gates the hidden units."""
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            w(f'"""Per-layer input gate (Gemma 4): {v.act}(gate x) times this layer\'s per-layer input, then back to the width{doc_tag(None, "combustor")}."""')
            w()
            with out.constructor("width", "hidden", "bias", *(["dropout"] if v.dropout else [])):
                w("self.fc = nn.Linear(width, hidden, bias=bias)  # the gate")
                w("self.proj = nn.Linear(hidden, width, bias=bias)")
                w("self.per_layer_index = 0  # which layer's per-layer input it reads: Model numbers them in the order the layers run")
                if v.dropout:
                    w("self.drop = nn.Dropout(dropout)")
            w()
            w("def forward(self, x, ple):")
            with out.indent():
                w(f"x = {ACTIVATIONS[v.act].format('self.fc(x)')} * ple[:, :, self.per_layer_index]  # (B, T, hidden): ple is (B, T, layers, hidden)")
                w("return self.drop(self.proj(x))" if v.dropout else "return self.proj(x)")
def clamped_glu(out: Writer) -> None:
    """gpt-oss's clamped SwiGLU on self.fc(x), into x: the gate capped above, up clamped both ways, alpha 1.702."""
    out.block("""
gate, up = self.fc(x).chunk(2, dim=-1)  # (B, T, hidden) each
gate, up = gate.clamp(max=self.clamp), up.clamp(-self.clamp, self.clamp)  # swiglu_limit
x = gate * torch.sigmoid(1.702 * gate) * (up + 1)  # gpt-oss: glu = gate * sigmoid(alpha * gate), times (up + 1)""")


class PoolEmitter(OpEmitter):
    variant = PoolVariant

    def sizes(self, op, c, scope):
        return {"size": c.field("pool_size", op.size, scope, "positions each pool averages", let=op.let_of("size"))}

    def ctor(self, o: OpPlan) -> str:
        return f"{o.cls}(size={o.args['size']})"

    def class_text(self, out: Writer, name: str, v: PoolVariant, plan: Plan) -> None:
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            if v.causal:
                out.block('''"""PoolFormer's mixer, causal: the mean of the latest `size` positions (this one
included, fewer at the start), minus the position itself."""''')
            else:
                out.block('''"""PoolFormer's mixer: the mean over a window of `size` positions centred on each
one (padding not counted), minus the position itself."""''')
            w()
            with out.constructor("size"):
                w("self.size = size")
            w()
            if not v.causal:
                w("def forward(self, x):")
                with out.indent():
                    w("T = x.size(1)")
                    w("h = F.avg_pool1d(x.transpose(1, 2), self.size, stride=1, padding=self.size // 2, count_include_pad=False)")
                    w("return h[..., :T].transpose(1, 2) - x  # (B, T, C)")
                return
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                w("B, T, C = x.size()")
                if v.engine_causal:
                    w("past = 0 if cache is None else cache.pos")
                    w("h = x if cache is None else cache.extend_pool(self, x, self.size - 1)  # (B, P + T, C)")
                else:
                    w("past, h = 0, x")
                w("sums = F.avg_pool1d(F.pad(h.transpose(1, 2), (self.size - 1, 0)), self.size, stride=1)  # (B, C, P + T)")
                w("count = torch.arange(past + 1, past + T + 1, device=x.device).clamp(max=self.size).to(x.dtype)  # (T,)")
                w("return sums[..., -T:].transpose(1, 2) * (self.size / count)[:, None] - x  # (B, T, C)")
