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


def _attention(op: ir.Attention) -> str:
    bits = [f"{op.heads} heads"]
    if op.kv_heads == 1 and op.heads > 1:
        bits.append("MQA")
    elif op.kv_heads != op.heads:
        bits.append(f"{op.kv_heads} kv heads")
    bits.append(op.mask)
    if op.window is not None:
        bits.append(f"window {op.window}")
    if op.rotary_dims:
        bits.append(f"rotary {op.rotary_dims}/{op.head_dim}" + (" interleaved" if op.rotary_interleaved else ""))
    if op.qk_norm:
        bits.append("qk-norm across heads" if op.qk_norm_across else "qk-norm")
    if op.scale is not None:
        bits.append(f"scale {num(op.scale)}")
    return ", ".join(bits)


def _moe(op: ir.Moe) -> str:
    bits = [f"{op.experts} experts", f"top {op.top}", f"{op.hidden} hidden", op.act]
    if op.capacity is not None:
        bits.append(f"capacity {num(op.capacity)}")
    if op.balance:
        bits.append(f"balance {num(op.balance)}")
    if not op.normalize:
        bits.append("not renormalised")
    if op.shared:
        bits.append(f"shared {op.shared}" + (" gated" if op.shared_gate else ""))
    return ", ".join(bits)


# The numbers each turbine kind shows beside its name; the names come from ir.kinds.
DETAILS = {
    ir.Attention: _attention,
    ir.Mlp: lambda op: f"{op.width}{ARROW}{op.hidden}, {op.act}",
    ir.Moe: _moe,
    ir.Pool: lambda op: f"size {op.size}" + (", causal" if op.causal else ""),
    ir.Conv: lambda op: f"depthwise, size {op.size}" + (", causal" if op.causal else ""),
    ir.Linear: lambda op: f"{op.width}{ARROW}{op.out}",
}


def turbine(op) -> Words:
    detail = DETAILS.get(type(op))
    if detail is None:
        raise TypeError(f"no diagram words for IR class {type(op).__name__}: add them to DETAILS in graphviz/text.py")
    rocket, ml = ir.kinds.kind_of(op).describe(op)
    return Words("turbine", rocket, ml, detail(op))


def norm(op: ir.Norm, on_branch: bool) -> Words:
    name = "LayerNorm" if op.type == "layernorm" else "RMSNorm"
    where = "on the branch" if on_branch else "in series"
    return Words("valve", where, name, f"{op.width}")


def merge(m, n_params: int = 0, mode: str = "both") -> str:
    """The junction's annotation: how the exhaust returns, with the numbers that
    set it (and the merge's own parameters, when it has any). `cooling` is a rocket
    word: in ml mode it reads `scaled init`."""
    if m is None or isinstance(m, ir.PlainMerge):
        return ""
    if isinstance(m, ir.ScaleMerge):
        s = f"scale s={num(m.value)}"
    elif isinstance(m, ir.CoolingMerge):
        s = f"{'scaled init' if mode == 'ml' else 'cooling'} \u03c3={num(m.std)}"
    elif isinstance(m, ir.RezeroMerge):
        s = f"rezero \u03b1\u2080={num(m.init)}"
    elif isinstance(m, ir.LayerscaleMerge):
        s = f"layerscale \u03b3\u2080={num(m.init)}"
    elif isinstance(m, ir.DeepnormMerge):
        s = f"deepnorm \u03b1={num(m.alpha)} \u03b2={num(m.beta)}"
    elif isinstance(m, ir.GateMerge):
        s = f"gate g=\u03c3(Wx+b), b\u2080={num(m.bias)}"
    else:  # pragma: no cover
        raise TypeError(type(m).__name__)
    return s + (f", {human(n_params)} params" if n_params else "")


def human(n: int) -> str:
    from .params import human as h

    return h(n)


# What each merge kind computes, for the legend: x is the chamber, f the branch.
MERGE_LEGEND = {k.keyword: f"{k.keyword}: {k.formula}" if k.keyword != "plain" else f"merge: {k.formula}" for k in ir.kinds.MERGES}


def merge_legend(kind: str, mode: str) -> str:
    w = MERGE_LEGEND[kind]
    return "scaled init" + w[len("cooling"):] if mode == "ml" and kind == "cooling" else w


def summary(p: ir.Prechamber) -> str:
    """The network words for a branch: its turbines' names and numbers."""
    parts = []
    for op in p.ops:
        if ir.is_turbine(op):
            w = turbine(op)
            parts.append(", ".join(x for x in (w.ml, w.ml_detail) if x))
    return "; ".join(parts)


def prechamber(p: ir.Prechamber, mode: str) -> str:
    dump = "side output" if mode == "ml" else "overboard"
    flags = [f for f, on in (("detach", p.detach), (dump, p.overboard)) if on]
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
    """The throat is a property of every injector, not a component: the diagram
    writes it as an annotation on the nozzle, never as a box on the main line."""
    if mask == "causal":
        return Words("choked throat", f"no flow upstream {DASH} every injector masked",
                     "causal mask", "in every attention: no position sees ahead")
    return Words("open throat", f"flow both ways {DASH} no injector masked",
                 "no mask", "every position sees every other")


def stage(s: ir.Stage, rep: int | None) -> str:
    if rep is None:
        return f"stage {s.name}" + (f"  {TIMES}{s.repeat}" if s.repeat > 1 else "")
    return f"stage {s.name}  {rep + 1}/{s.repeat}"


def wrap(line: str, width: int) -> list[str]:
    """Break a label so that no line runs much past `width`: first after ` — ` or
    `: ` (the name stays on a line of its own), then at ', '. A comma where a line
    breaks is dropped, so no line ends dangling."""
    head, sep, rest = line.partition(f" {DASH} ")
    if not sep:
        head, sep, rest = line.partition(": ")
        head += sep.strip()
    if sep and len(line) > width:
        return [head] + wrap(rest, width)
    out, cur = [], ""
    for part in line.split(", "):
        if cur and len(cur) + 2 + len(part) > width:
            out.append(cur)
            cur = part
        else:
            cur = f"{cur}, {part}" if cur else part
    return out + [cur]
