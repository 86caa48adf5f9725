"""What the diagrams say about each IR node: the network words first, the rocket words second.

A part's title is its operation and key numbers (`Attention · 12 heads · causal`,
`MLP 768→3072→768 GELU`), its rocket role an italic caption (`turbine: injector`), both
from the kinds table (`cyclelang/ir/kinds.py`) plus the numbers below; `--labels`
chooses which are shown, never where anything sits.
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


def num(x: float) -> str:
    """Compact, stable formatting of a float: 0.00408, 2.83, 1e-05."""
    return f"{x:.3g}"


def shape(*dims: int | str) -> str:
    """A symbolic tensor shape: shape('B', 'T', 768) -> 'B×T×768'."""
    return TIMES.join(str(d) for d in dims)


def throat(mask: str) -> Words:
    """The throat is a property of every injector, not a component: the diagram writes it
    beside the logits, never as a box on the main line."""
    if mask == "causal":
        return Words("choked throat", f"no flow upstream {DASH} every injector masked",
                     "causal mask", "in every attention: no position sees ahead")
    return Words("open throat", f"flow both ways {DASH} no injector masked",
                 "no mask", "every position sees every other")


# --- the words of the pinned layout (scene.py) ------------------------------------------------

DOT = " \u00b7 "


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _attention_title(op: ir.Attention) -> tuple[str, str]:
    title = f"Attention{DOT}{op.heads} heads{DOT}{'causal' if op.mask == 'causal' else 'bidirectional'}"
    bits = []
    if op.kv_heads == 1 and op.heads > 1:
        bits.append("MQA: 1 KV head")
    elif op.kv_heads != op.heads:
        bits.append(f"GQA: {op.kv_heads} KV heads")
    if op.window is not None:
        bits.append(f"window {op.window}")
    if op.rotary_dims:
        bits.append(f"rotary {op.rotary_dims}/{op.head_dim}" + (" interleaved" if op.rotary_interleaved else "") + (" spread" if op.rotary_spread else ""))
    if op.qk_norm:
        shape = [w for w, on in (("layernorm", op.qk_norm_type == "layernorm"), ("bias", op.qk_norm_bias),
                                 (f"gain {num(op.qk_norm_offset)} + w", op.qk_norm_offset), ("no gain", not op.qk_norm_affine), ("gain per head", op.qk_norm_head_gains),
                                 ("after rotary", op.qk_norm_after_rotary)) if on]
        bits.append(("qk-norm across heads" if op.qk_norm_across else "qk-norm") + (f" ({', '.join(shape)})" if shape else ""))
    if op.scale is not None:
        bits.append(f"scale {num(op.scale)}")
    if op.sinks:  # gpt-oss: a learned logit per head in every softmax
        bits.append("sinks")
    if op.gate != "none":  # Qwen3-Next's output gate
        bits.append(f"output gate per {op.gate}" + (f" ({op.gate_act})" if op.gate_act != "sigmoid" else ""))
    bits += [w for w, on in (("v-norm", op.v_norm), ("K = V", op.k_eq_v), (f"KV to slot {op.kv_store}", op.kv_store is not None),
                             (f"KV from slot {op.kv_reuse}", op.kv_reuse is not None)) if on]  # Gemma 4
    return title, DOT.join(bits)


def _moe_title(op: ir.Moe) -> tuple[str, str]:
    bits = [f"{op.hidden} hidden", op.act]
    if op.capacity is not None:
        bits.append(f"capacity {num(op.capacity)}")
    if op.balance:
        bits.append(f"balance {num(op.balance)}")
    if not op.normalize:
        bits.append("not renormalised")
    elif op.normalize_eps != 1e-20:  # the sigmoid router's sum + eps (LFM2-MoE's 1e-6)
        bits.append(f"renormalised + {num(op.normalize_eps)}")
    if op.router != "softmax":
        bits.append(op.router)
    if op.groups > 1:
        bits.append(f"{op.top_groups} of {op.groups} groups")
    if op.scale != 1.0:
        bits.append(f"{TIMES}{num(op.scale)}")
    if op.correction:
        bits.append("bias-trimmed" if op.correction_rate else "bias for choice")
    if op.shared:
        bits.append(f"shared {op.shared}" + (" gated" if op.shared_gate else ""))
    if op.router_bias:  # gpt-oss's router and experts
        bits.append("router bias")
    if op.act == "swiglu_clamp":
        bits.append(f"clamp {num(op.clamp)}")
    return f"MoE{DOT}{op.experts} experts{DOT}top {op.top}", DOT.join(bits)


# The title (operation and its key numbers) and a second line, per kind; a kind missing here
# is titled by its kinds-table word alone (a new kind needs no entry to be drawn).
TITLES = {
    ir.Attention: _attention_title,
    ir.Mlp: lambda op: (f"MLP {op.width}{ARROW}{op.hidden}{ARROW}{op.width} {op.act.upper() if op.act in ('gelu', 'relu') else op.act}",
                        " · ".join(x for x in (f"clamp {num(op.clamp)}" if op.act == "swiglu_clamp" else "",
                                                f"gate {TIMES}{num(op.gate_scale)}" if op.gate_scale != 1.0 else "",
                                                f"{TIMES} the layer's per-layer input" if op.per_layer else "") if x)),
    ir.Moe: _moe_title,
    ir.Pool: lambda op: (f"Pool{DOT}size {op.size}" + (f"{DOT}causal" if op.causal else ""), ""),
    ir.Conv: lambda op: (f"Conv{DOT}depthwise {op.size}" + (f"{DOT}causal" if op.causal else ""), ""),
    ir.ShortConv: lambda op: (f"Short conv{DOT}{op.size} taps" + (f"{DOT}causal" if op.causal else ""), f"C{DOT}conv(B{DOT}x), gated"),
    ir.Linear: lambda op: (f"Linear {op.width}{ARROW}{op.out}", ""),
    ir.LatentAttention: lambda op: (f"Latent attention{DOT}{op.heads} heads{DOT}{'causal' if op.mask == 'causal' else 'bidirectional'}",
                                    DOT.join([f"latent {op.latent}"] + ([f"q latent {op.q_latent}"] if op.q_latent else []) + [f"rotary {op.rotary_dims}"])),
    ir.Ssm: lambda op: (f"SSM{DOT}{op.heads} heads{DOT}state {op.state}",
                        DOT.join(([f"{op.groups} groups"] if op.groups > 1 else []) + [f"conv {op.conv}", f"chunk {op.chunk}"]
                                 + ({"gated": [], "before_gate": ["norm, then gate"], "none": ["gate, no norm"]}[op.out_norm])
                                 + ([f"in_proj {TIMES}(" + ", ".join(num(x) for x in op.scales) + ")"] if op.scales != (1.0,) * 5 else []))),
    ir.Mamba1: lambda op: (f"SSM (Mamba-1){DOT}{op.inner} channels{DOT}state {op.state}",
                           DOT.join([f"dt rank {op.dt_rank}", f"conv {op.conv}"] + (["dt/B/C norms"] if op.norms else []))),
    ir.LinearAttention: lambda op: (f"Linear attention{DOT}{op.heads} heads{DOT}{'causal' if op.causal else 'bidirectional'}",
                                    DOT.join(["elu+1" if op.feature == "elu" else op.feature] + (["retention"] if op.decay else []))),
    ir.GatedDelta: lambda op: (f"Gated DeltaNet{DOT}{op.heads} heads{DOT}causal",
                               DOT.join(([f"{op.k_heads} key heads"] if op.k_heads != op.heads else []) + [f"conv {op.conv}", f"chunk {op.chunk}", "gated norm"]
                                        + (["\u03b2 in (0, 2)"] if op.negative_eigenvalues else []))),
    ir.Norm: lambda op: ({"layernorm": "LayerNorm", "scalar": "Scalar gain"}.get(op.type, "RMSNorm"), "fixed, loaded" if op.type == "scalar" else ""),
    ir.Feed: lambda f: (f"Embedding {f.vocab:,}{TIMES}{f.width}",
                        {"learned": f"+ learned positions {TIMES}{f.context}", "sinusoidal": "+ sinusoidal positions", "none": "no position table"}[f.position]
                        + (f"{DOT}{TIMES}{num(f.scale)}" if f.scale != 1.0 else "") + (f"{DOT}dropout {num(f.dropout)}" if f.dropout else "")
                        + (f"{DOT}per-layer inputs {f.per_layer_layers}{TIMES}{f.per_layer}" if f.per_layer else "")),
    ir.Nozzle: lambda z: (f"LM head {z.width}{ARROW}{z.vocab:,}", DOT.join((["tied to the embedding"] if z.tied else []) + (["bias"] if z.bias else []))),
}


def part_words(node, on_branch: bool) -> tuple[str, str, str, str]:
    """(ML title, ML detail, rocket title, rocket detail) of one part. The ML title is the
    operation and its key numbers; the rocket words come from the kinds table."""
    k = ir.kinds.kind_of(node)
    fn = TITLES.get(type(node))
    title, detail = fn(node) if fn is not None else (_cap(k.ml), "")
    rocket, _ = k.describe(node)
    if isinstance(node, ir.Norm):
        rocket = "valve on the branch" if on_branch else "valve in series"
    elif isinstance(node, ir.Feed):
        rocket = "tanks and pumps"
    elif ir.is_turbine(node):
        rocket = f"turbine: {rocket}"
    numbers = title.split(DOT, 1)[1] if DOT in title else (title.split(" ", 1)[1] if " " in title and not isinstance(node, ir.Norm) else "")
    r_detail = DOT.join(x for x in (numbers, detail) if x)
    if isinstance(node, ir.Norm):
        r_detail = title
    return title, detail, rocket, r_detail


def glyph(node, ink: dict, cells: int = 12, mask_cell: int = 6, terse: bool = False) -> tuple[str, float, float]:
    """An HTML row drawn under a part's words: an attention's mask and its query and KV heads
    (GQA and MQA share KV heads), a MoE's router and experts with the top k lit. `ink` is the
    theme's palette (its glyph colours), `cells` the most head or expert cells drawn (the rest
    are "+k"), `mask_cell` the side of one mask cell. Returns (html, width, height) in
    points; "" when the kind draws none. `terse`: no words the part's title already says
    (a MoE's "top k")."""
    if isinstance(node, ir.Attention):
        return _attention_glyph(node, ink, cells, mask_cell)
    if isinstance(node, ir.LatentAttention):  # every head's K and V from one latent: the KV row is the latent
        return _attention_glyph(node, ink, cells, mask_cell, kv_words=f"latent {node.latent}")
    if isinstance(node, ir.LinearAttention):  # no softmax, no K/V cache: the mask alone
        mask_t, side = mask_table(_mask_of(node), ink, mask_cell)
        return f'<table border="0" cellspacing="2" cellpadding="0"><tr><td>{mask_t}</td></tr></table>', float(side + 4), float(side + 4)
    if isinstance(node, ir.Moe):
        return _moe_glyph(node, ink, cells, terse)
    return "", 0.0, 0.0


def _mask_of(node):
    """(mask, window) of any attention-like kind, for its mask glyph and legend entry."""
    from types import SimpleNamespace

    if isinstance(node, ir.LinearAttention):
        return SimpleNamespace(mask="causal" if node.causal else "open", window=None)
    return SimpleNamespace(mask=node.mask, window=getattr(node, "window", None))


def _cells(colors: list[str], border: str, size: int = 7) -> str:
    return "".join(f'<td width="{size}" height="{size}" fixedsize="true" bgcolor="{c}" border="1" color="{border}"></td>' for c in colors)


def mask_rows(op: ir.Attention, n: int = 5) -> list[list[bool]]:
    """The mask glyph: which of n×n query/key cells are attended (causal: lower triangle;
    a window: a band; none: all)."""
    win = op.window if op.window is not None else n
    win = max(1, min(n, win if op.window is None else max(1, min(n - 1, 2))))
    rows = []
    for i in range(n):
        if op.mask == "causal":
            rows.append([j <= i and (op.window is None or i - j < win) for j in range(n)])
        else:
            rows.append([op.window is None or abs(i - j) < win for j in range(n)])
    return rows


def mask_table(op, ink: dict, cell: int) -> tuple[str, int]:
    """The mask glyph's HTML table and its side in points."""
    side = 5 * cell + 6
    rows = "".join("<tr>" + "".join(f'<td width="{cell}" height="{cell}" fixedsize="true" bgcolor="{ink["mask_on"] if on else ink["mask_off"]}"></td>'
                                    for on in row) + "</tr>" for row in mask_rows(op))
    return (f'<table border="0" cellspacing="1" cellpadding="0" bgcolor="{ink["mask_grid"]}" fixedsize="true" width="{side}" height="{side}">'
            f'{rows}</table>'), side


def _font(s: str, ink: dict) -> str:
    return f'<font point-size="12">{s}</font>'


def _attention_glyph(op, ink: dict, cells: int, mask_cell: int, kv_words: str = "") -> tuple[str, float, float]:
    heads = min(op.heads, cells)
    kv = 0 if kv_words else min(op.kv_heads, cells)
    mask_t, side = mask_table(_mask_of(op), ink, mask_cell)
    q = _cells([ink["q"]] * heads, ink["cell_border"])
    k = _cells([ink["kv"]] * kv, ink["cell_border"]) if not kv_words else f'<td colspan="{heads}" align="left">{_font(kv_words, ink)}</td>'
    more_q = f'<td>{_font(f"+{op.heads - heads}", ink)}</td>' if op.heads > heads else ""
    more_k = f'<td>{_font(f"+{op.kv_heads - kv}", ink)}</td>' if not kv_words and op.kv_heads > kv else ""
    heads_t = (f'<table border="0" cellspacing="1" cellpadding="0"><tr><td>{_font("Q", ink)}</td>{q}{more_q}</tr>'
               f'<tr><td>{_font("KV", ink)}</td>{k}{more_k}</tr></table>')
    html = f'<table border="0" cellspacing="2" cellpadding="0"><tr><td>{mask_t}</td><td>{heads_t}</td></tr></table>'
    w = side + 12 + 18 + max(heads, kv) * 8 + (24 if op.heads > heads else 0)
    return html, float(w), float(side + 4)  # the mask and the table's spacing


def _moe_glyph(op: ir.Moe, ink: dict, cells: int, terse: bool = False) -> tuple[str, float, float]:
    """The router and a row of expert cells, the chosen ones lit. A sigmoid router reads
    "router σ" (each expert scored on its own), a softmax one "router"; with groups the
    cells come in banks (a gap between groups), the first top_groups of them open."""
    shown = min(op.experts, cells)
    size = op.experts // op.groups
    if op.groups > 1:  # the lit cells spread over the open banks, as a token's top experts do
        lit = {(i % op.top_groups) * size + i // op.top_groups for i in range(op.top)}  # the i-th choice in open bank i mod top_groups
        fills = [ink["expert_on"] if i in lit else ink["expert_off"] for i in range(shown)]
    else:
        fills = [ink["expert_on"] if i < op.top else ink["expert_off"] for i in range(shown)]
    if op.groups > 1:
        banks = [fills[i:i + size] for i in range(0, shown, size)]
        row = '<td width="4"></td>'.join(_cells(b, ink["cell_border"], 10) for b in banks)
        gaps = 4 * (len(banks) - 1)
    else:
        row, gaps = _cells(fills, ink["cell_border"], 10), 0
    more = f'<td>{_font(f"+{op.experts - shown}", ink)}</td>' if op.experts > shown else ""
    top = "" if terse else f'<td>{_font(f" top {op.top}" + (f" in {op.top_groups}/{op.groups}" if op.groups > 1 else ""), ink)}</td>'
    word = "router \u03c3" if op.router == "sigmoid" else "router"
    html = (f'<table border="0" cellspacing="2" cellpadding="0"><tr><td>{_font(f"{word} {ARROW}", ink)}</td>{row}{more}'
            f'{top}</tr></table>')
    extra = (10 if op.router == "sigmoid" else 0) + gaps + (0 if terse or op.groups == 1 else 30)
    return html, float(58 + shown * 12 + (0 if terse else 44) + (24 if more else 0) + extra), 18.0


def glyph_keys(node) -> list[str]:
    """The legend entries a part's glyph needs."""
    if isinstance(node, (ir.Attention, ir.LatentAttention, ir.LinearAttention)):
        m = _mask_of(node)
        return ["mask_" + ("causal" if m.mask == "causal" else "none") + ("_window" if m.window is not None else "")] + \
            ([] if isinstance(node, ir.LinearAttention) else ["heads"] if isinstance(node, ir.LatentAttention) else ["heads", "kv_heads"])
    if isinstance(node, ir.Moe):
        return ["experts"]
    return []


def branch_titles(p: ir.Prechamber) -> dict[str, str]:
    flags_ml = [f for f, on in (("detached", p.detach), ("side output", p.overboard)) if on]
    flags_r = [f for f, on in (("detach", p.detach), ("overboard", p.overboard)) if on]
    ml = p.name + (f" ({', '.join(flags_ml)})" if flags_ml else "")
    r = f"prechamber {p.name}" + (f" ({', '.join(flags_r)})" if flags_r else "")
    return {"ml": ml, "both": r, "rocket": r}


def merge_note(m) -> str:
    """What a junction multiplies the returning branch by, written beside it ("" for a plain add)."""
    if m is None or isinstance(m, ir.PlainMerge):
        return ""
    if isinstance(m, ir.ScaleMerge):
        return f"{TIMES}{num(m.value)}"
    if isinstance(m, ir.CoolingMerge):
        return f"init \u03c3={num(m.std)}"
    if isinstance(m, ir.RezeroMerge):
        return f"{TIMES}\u03b1, \u03b1={num(m.init)} at init"
    if isinstance(m, ir.LayerscaleMerge):
        return f"{TIMES}\u03b3, \u03b3={num(m.init)} at init"
    if isinstance(m, ir.DeepnormMerge):
        return f"init \u03b2={num(m.beta)}"
    if isinstance(m, ir.GateMerge):
        return f"gate \u03c3(Wx+b), b={num(m.bias)}"
    if isinstance(m, ir.HyperMerge):  # reads a mix of the streams, writes into each, mixes them
        what = f"mHC, Sinkhorn {m.sinkhorn}" if m.connections == "manifold" else "dynamic" if m.dynamic else "static"
        return f"{m.streams} streams, {what}"
    return ir.kinds.kind_of(m).formula


def main_note(m) -> str:
    """What a junction does to the main line itself: DeepNorm's α·x."""
    if isinstance(m, ir.DeepnormMerge):
        return f"{TIMES}\u03b1={num(m.alpha)}"
    return ""
