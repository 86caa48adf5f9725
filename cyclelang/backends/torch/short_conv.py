"""The short gated convolution mixer (`turbine short_conv`, LFM2's ShortConv): its variant and emitter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from .ops import OpEmitter, call_args
from .records import OpPlan, Plan
from .writer import Writer, num


@dataclass(frozen=True)
class ShortConvVariant:
    kind: ClassVar[type] = ir.ShortConv
    base: ClassVar[str] = "ShortConv"
    causal: bool  # only the past is mixed; the forward takes a cache

    @classmethod
    def of(cls, c: ir.ShortConv, causal: bool) -> "ShortConvVariant":
        return cls(c.causal)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.causal else ()


class ShortConvEmitter(OpEmitter):
    variant = ShortConvVariant

    def sizes(self, op, c, scope):
        return {"width": c.width(op.width, scope),
                "size": c.field("short_conv_size", op.size, scope, "positions each short gated convolution's filter spans (LFM2's conv_L_cache)", let=op.let_of("size"))}

    def ctor(self, o: OpPlan) -> str:
        return f"{o.cls}({call_args(str(o.args['width']), size=str(o.args['size']), bias=num(o.op.bias))})"

    def output_init(self, a, op, std):
        return [f"nn.init.normal_({a}.out_proj.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.out_proj.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: ShortConvVariant, plan: Plan) -> None:
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            where = "its latest `size` positions (this one included)" if v.causal else "a window of `size` positions around each one"
            w('"""Short gated convolution (LFM2\'s ShortConv).')
            w()
            w("in_proj gives B, C and x; each channel of B * x is convolved over")
            w(where + "; C gates the result; out_proj.")
            w("Parameter names follow transformers' Lfm2ShortConv. Decoding keeps size - 1 values of B * x.")
            w('"""')
            w()
            with out.constructor("width", "size", "bias"):
                w("self.size = size")
                w("self.in_proj = nn.Linear(width, 3 * width, bias=bias)  # rows [B | C | x]")
                w("self.conv = nn.Conv1d(width, width, size, groups=width, bias=bias)  # (width, 1, size): one filter per channel")
                w("self.out_proj = nn.Linear(width, width, bias=bias)")
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                w("T = x.size(1)")
                w("b, c, x = self.in_proj(x).chunk(3, dim=-1)  # (B, T, C) each")
                w("bx = b * x")
                if v.causal:
                    w("h = bx if cache is None else cache.extend_pool(self, bx, self.size - 1)  # (B, P + T, C): the remembered B * x first")
                    w("y = self.conv(F.pad(h.transpose(1, 2), (self.size - 1, 0)))[..., -T:]  # (B, C, T): zeros before the first position")
                else:
                    w("y = self.conv(F.pad(bx.transpose(1, 2), ((self.size - 1) // 2, self.size // 2)))  # (B, C, T)")
                w("return self.out_proj(c * y.transpose(1, 2))")
