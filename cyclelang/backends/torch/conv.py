"""The depthwise convolution mixer (`turbine conv`): its variant and its emitter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from .ops import OpEmitter, call_args
from .records import OpPlan, Plan
from .writer import Writer, num


@dataclass(frozen=True)
class ConvVariant:
    kind: ClassVar[type] = ir.Conv
    base: ClassVar[str] = "Conv"
    causal: bool  # only the past is mixed; the forward takes a cache

    @classmethod
    def of(cls, c: ir.Conv, causal: bool) -> "ConvVariant":
        return cls(c.causal)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("cache",) if self.causal else ()


class ConvEmitter(OpEmitter):
    variant = ConvVariant

    def sizes(self, op, c, scope):
        return {"width": c.width(op.width, scope), "size": c.field("conv_size", op.size, scope, "positions each convolution filter spans", let=op.let_of("size"))}

    def ctor(self, o: OpPlan) -> str:
        c = o.op
        return f"{o.cls}({call_args(str(o.args['width']), size=str(o.args['size']), bias=num(c.bias))})"

    def output_init(self, a, op, std):
        """Cooling: the convolution is the branch's output, so its filters start small."""
        return [f"nn.init.normal_({a}.conv.weight, mean=0.0, std={std})"]

    def deepnorm_init(self, a, op, beta):
        return [f"{a}.conv.weight.mul_({beta})"]

    def class_text(self, out: Writer, name: str, v: ConvVariant, plan: Plan) -> None:
        w = out.line
        w(f"class {name}(nn.Module):")
        with out.indent():
            where = "its latest `size` positions (this one included)" if v.causal else "a window of `size` positions around each one"
            w(f'"""Depthwise convolution over positions: each channel mixes {where}.')
            w("A short-range mixer (H3, Hyena, Mamba). Weights keep torch's Conv1d init.")
            w('"""')
            w()
            with out.constructor("width", "size", "bias"):
                w("self.size = size")
                w("self.conv = nn.Conv1d(width, width, size, groups=width, bias=bias)  # (width, 1, size): one filter per channel")
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                w("T = x.size(1)")
                if v.causal:
                    w("h = x if cache is None else cache.extend_pool(self, x, self.size - 1)  # (B, P + T, C): the remembered inputs first")
                    w("y = self.conv(F.pad(h.transpose(1, 2), (self.size - 1, 0)))  # (B, C, P + T): zeros before the first position")
                    w("return y[..., -T:].transpose(1, 2)  # (B, T, C)")
                else:
                    w("y = self.conv(F.pad(x.transpose(1, 2), ((self.size - 1) // 2, self.size // 2)))  # (B, C, T)")
                    w("return y.transpose(1, 2)  # (B, T, C)")
