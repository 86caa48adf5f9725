"""What the diagrams say about each IR node, in rocket terms, network terms, or both.

Each describer returns a `Words`: a short rocket name with an optional rocket
detail, and a network name with its numbers. `pick` chooses for the label mode,
so "both" reads `prechamber mix — attention, 12 heads, causal`.
"""

from __future__ import annotations

from typing import NamedTuple

from ... import ir

DASH = "\u2014"
TIMES = "\u00d7"
ARROW = "\u2192"


class Words(NamedTuple):
    rocket: str
    rocket_detail: str
    ml: str
    ml_detail: str


def pick(w: Words, mode: str) -> tuple[str, str]:
    """(title, detail) for one label mode."""
    if mode == "rocket":
        return w.rocket, w.rocket_detail
    if mode == "ml":
        return w.ml, w.ml_detail
    return w.rocket, ", ".join(p for p in (w.ml, w.ml_detail) if p)


def num(x: float) -> str:
    """Compact, stable formatting of a float: 0.00408, 2.83, 1e-05."""
    return f"{x:.3g}"


def shape(*dims: int | str) -> str:
    """A symbolic tensor shape: shape('B', 'T', 768) -> 'B×T×768'."""
    return TIMES.join(str(d) for d in dims)


def turbine(op) -> Words:
    if isinstance(op, ir.Attention):
        bits = [f"{op.heads} heads"]
        if op.kv_heads == 1 and op.heads > 1:
            bits.append("MQA")
        elif op.kv_heads != op.heads:
            bits.append(f"{op.kv_heads} kv heads")
        bits.append(op.mask)
        if op.window is not None:
            bits.append(f"window {op.window}")
        if op.rotary_dims:
            bits.append(f"rotary {op.rotary_dims}/{op.head_dim}")
        if op.qk_norm:
            bits.append("qk-norm")
        return Words("turbine", "injector", "attention", ", ".join(bits))
    if isinstance(op, ir.Mlp):
        return Words("turbine", "combustor", "MLP", f"{op.width}{ARROW}{op.hidden}, {op.act}")
    if isinstance(op, ir.Moe):
        bits = [f"{op.experts} experts", f"top {op.top}", f"{op.hidden} hidden", op.act]
        if op.capacity is not None:
            bits.append(f"capacity {num(op.capacity)}")
        if op.balance:
            bits.append(f"balance {num(op.balance)}")
        return Words("turbine", "liquid-liquid injector", "MoE", ", ".join(bits))
    if isinstance(op, ir.Pool):
        return Words("turbine", "passive mixer", "pool", f"size {op.size}" + (", causal" if op.causal else ""))
    if isinstance(op, ir.Linear):
        narrow = op.out < op.width
        return Words("turbine", "narrow throat" if narrow else "duct", "linear", f"{op.width}{ARROW}{op.out}")
    raise TypeError(type(op).__name__)  # pragma: no cover


def norm(op: ir.Norm, on_branch: bool) -> Words:
    name = "LayerNorm" if op.type == "layernorm" else "RMSNorm"
    where = "on the branch" if on_branch else "in series"
    return Words("valve", where, name, f"{op.width}")


def merge(m) -> str:
    """The junction's annotation: how the exhaust returns."""
    if m is None or isinstance(m, ir.PlainMerge):
        return ""
    if isinstance(m, ir.ScaleMerge):
        return f"scale {num(m.value)}"
    if isinstance(m, ir.CoolingMerge):
        return f"cooling \u03c3={num(m.std)}"
    if isinstance(m, ir.RezeroMerge):
        return f"rezero \u03b1\u2080={num(m.init)}"
    if isinstance(m, ir.LayerscaleMerge):
        return f"layerscale {num(m.init)}"
    if isinstance(m, ir.DeepnormMerge):
        return f"deepnorm \u03b1={num(m.alpha)}"
    if isinstance(m, ir.GateMerge):
        return f"gate b={num(m.bias)}"
    raise TypeError(type(m).__name__)  # pragma: no cover


def summary(p: ir.Prechamber) -> str:
    """The network words for a branch: its turbines' names and numbers."""
    parts = []
    for op in p.ops:
        if ir.is_turbine(op):
            w = turbine(op)
            parts.append(", ".join(x for x in (w.ml, w.ml_detail) if x))
    return "; ".join(parts)


def prechamber(p: ir.Prechamber, mode: str) -> str:
    flags = [f for f, on in (("detach", p.detach), ("overboard", p.overboard)) if on]
    tail = f" ({', '.join(flags)})" if flags else ""
    if mode == "rocket":
        return f"prechamber {p.name}{tail}"
    if mode == "ml":
        return f"branch {p.name}{tail}: {summary(p)}"
    return f"prechamber {p.name}{tail} {DASH} {summary(p)}"


def feed(f: ir.Feed) -> Words:
    pos = {"learned": f"learned positions {TIMES}{f.context}", "sinusoidal": "sinusoidal positions", "none": "no position table"}[f.position]
    return Words("tanks and pumps", f"vocab {f.vocab:,}", "token embedding", f"{f.vocab:,}{TIMES}{f.width}, {pos}")


def nozzle(n: ir.Nozzle) -> Words:
    bits = [f"{n.width}{ARROW}{n.vocab:,}"] + (["tied"] if n.tied else []) + (["bias"] if n.bias else [])
    return Words("nozzle", "", "LM head", ", ".join(bits))


def throat(mask: str) -> Words:
    if mask == "causal":
        return Words("throat", "choked", "causal mask", "")
    return Words("open throat", "", "no mask", "")


def stage(s: ir.Stage, rep: int | None) -> str:
    if rep is None:
        return f"stage {s.name}" + (f"  {TIMES}{s.repeat}" if s.repeat > 1 else "")
    return f"stage {s.name}  {rep + 1}/{s.repeat}"


def wrap(line: str, width: int) -> list[str]:
    """Break a label at ', ' or ' — ' so that no line runs much past `width`."""
    out, cur = [], ""
    for part in line.replace(f" {DASH} ", f" {DASH}\0").replace(", ", ",\0").split("\0"):
        if cur and len(cur) + 1 + len(part) > width:
            out.append(cur)
            cur = part
        else:
            cur = f"{cur} {part}" if cur else part
    return out + [cur]
