"""Colours, fonts and the one way text gets into a label.

Every piece of text in a diagram goes through `label()`, which escapes it for a
Graphviz HTML-like label; colours and sizes come only from the palettes below.
That is the whole escaping story: a spec's names cannot close the label, add
attributes or start a new statement, whatever characters they hold.
"""

from __future__ import annotations

from html import escape

from ... import ir
from ...ir.kinds import KINDS, registered

FONT = "Helvetica,Arial,sans-serif"

# The main chamber is the darkest, heaviest line; hot exhaust (branches) is orange,
# as on propulsion schematics where the hot-gas path is drawn in red/orange.
THEMES: dict[str, dict[str, str]] = {
    "light": {
        "bg": "white",
        "fg": "#1f2933",
        "muted": "#5b6876",
        "chamber": "#1f3a5f",
        "branch": "#c2571a",
        "cut": "#7b8794",
        "stage_fill": "#f4f7fb",
        "stage_border": "#9fb3c8",
        "branch_fill": "#fff7ef",
        "branch_border": "#e9b68c",
        "valve_main": "#1f3a5f",
        "valve_main_text": "white",
        "valve_branch": "#fffdf9",
        "attention": "#d6e6fb",
        "mlp": "#ffe0c2",
        "moe": "#fbd5d5",
        "pool": "#dcf1d8",
        "conv": "#e3f4ee",
        "short_conv": "#d3efe6",
        "ssm": "#e8e0f7",
        "linear": "#e6e9ee",
        "feed": "#dfe9f5",
        "nozzle": "#d5dbe3",
        "vent": "#9b1c1c",
        "vent_fill": "#fde8e8",
        "junction": "white",
    },
    "dark": {
        "bg": "#10161d",
        "fg": "#e6edf3",
        "muted": "#a3b1bf",
        "chamber": "#8cc4ff",
        "branch": "#ff9f5a",
        "cut": "#8f9ba8",
        "stage_fill": "#18222d",
        "stage_border": "#3f5468",
        "branch_fill": "#231c17",
        "branch_border": "#8a5a36",
        "valve_main": "#8cc4ff",
        "valve_main_text": "#10161d",
        "valve_branch": "#2a2119",
        "attention": "#1e3a5c",
        "mlp": "#5a3515",
        "moe": "#5c2020",
        "pool": "#1f4a2a",
        "conv": "#1d4a40",
        "short_conv": "#175c4c",
        "ssm": "#3a2d5c",
        "linear": "#2d3640",
        "feed": "#1d3047",
        "nozzle": "#2d3640",
        "vent": "#ff8080",
        "vent_fill": "#3a1818",
        "junction": "#10161d",
    },
}


def esc(text: object) -> str:
    """Escape text for a Graphviz HTML-like label (also drops control characters)."""
    s = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    return escape(s, quote=True).replace("&#x27;", "&#39;")


def label(title: str | None, detail: str | None = None, *, muted: str, size: int = 14, detail_size: int = 11, bold: bool = True, extra=None,
          align: str | None = None) -> str:
    """An HTML-like label: a bold title line, then smaller lines in the muted colour
    (`detail`, then `extra`: a string or a list of strings). `align="left"` ends every
    line with a left-aligned break, so a title's lines share one left edge (cluster
    titles); by default the lines are centred."""
    parts: list[str] = []
    if title:
        t = esc(title)
        parts.append(f'<font point-size="{size}">{"<b>" + t + "</b>" if bold else t}</font>')
    more = [extra] if isinstance(extra, str) else list(extra or [])
    for line in [detail, *more]:
        if line:
            parts.append(f'<font point-size="{detail_size}" color="{muted}">{esc(line)}</font>')
    if align and parts:
        br = f'<br align="{align}"/>'
        return "<" + br.join(parts) + br + ">"
    return "<" + ("<br/>".join(parts) or " ") + ">"


for _t, _extra in (("light", {"norm": "#fff4c2", "other": "#eee6f7", "head": "#d5dbe3", "text": "white", "spark": "#1f2933"}),
                   ("dark", {"norm": "#4a4015", "other": "#33284a", "head": "#2d3640", "text": "#10161d", "spark": "#e6edf3"})):
    THEMES[_t].update(_extra)

# The glyphs' ink (text.glyph): query and KV head cells, the mask's attended and masked cells
# and its grid, lit and idle experts. Every cell colour has a legend entry of its own (heads,
# kv_heads, experts): KV heads are teal, never the lit experts' orange, lighter than the query
# heads' blue so that the two rows also differ in greyscale.
for _t, _extra in (("light", {"q": "#3b6fb6", "kv": "#2a9d8f", "mask_on": "#1f2933", "mask_off": "#ffffff", "mask_grid": "#9aa5b1",
                              "cell_border": "#5b6876", "expert_on": "#c2571a", "expert_off": "#ffffff"}),
                   ("dark", {"q": "#6ea8fe", "kv": "#4fd1b5", "mask_on": "#e6edf3", "mask_off": "#1b2530", "mask_grid": "#5b6876",
                             "cell_border": "#a3b1bf", "expert_on": "#ff9f5a", "expert_off": "#1b2530"})):
    THEMES[_t].update(_extra)

# Each kind's fill, by its kinds-table attr, a colour of every theme; the legend names a kind by its
# kinds-table word (a new kind needs only this entry, and a kind without one fails at import).
KIND_FILL = {"attn": "attention", "mlp": "mlp", "moe": "moe", "pool": "pool", "conv": "conv", "ssm": "ssm", "linear": "linear", "norm": "norm"}
KIND_FILL["short_conv"] = "short_conv"  # LFM2's short gated conv
# gated DeltaNet (turbine delta): a rose, apart from the ssm's lavender and attention's blue
KIND_FILL["delta"] = "delta"
THEMES["light"]["delta"] = "#f7e1ec"
THEMES["dark"]["delta"] = "#52283f"
registered(lambda cls: KINDS[cls].attr in KIND_FILL, "cyclelang/backends/graphviz/style.py KIND_FILL", ir.OP_TYPES)
registered(lambda cls: all(KIND_FILL[KINDS[cls].attr] in th for th in THEMES.values()),
           "every theme of cyclelang/backends/graphviz/style.py THEMES", ir.OP_TYPES)


def kind_style(attr: str) -> tuple[str, str]:
    """(legend key, palette entry) of a kind of part."""
    fill = KIND_FILL.get(attr, "other")
    return f"kind_{attr or 'op'}", fill
