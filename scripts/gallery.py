"""Regenerate the gallery: `python scripts/gallery.py` (`--check` only reports what is stale).

docs/gallery.md shows every spec of the library: its cycle diagram, its parameters
per stage and per role (from the reviewer's static report), what `cyclec check`
says about it, a few lines on the concept it shows, and the spec itself. The
diagrams are docs/img/gallery/<stem>.svg, each stamped with the SHA-256 of the DOT
it was drawn from, as the README's are (scripts/render_readme_diagrams.py): the
test suite compares the markdown exactly and the SVGs by their stamps, so a
different Graphviz version, which shifts SVG bytes, does not fail it.

Everything here is deterministic and torch-free.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKDOWN = ROOT / "docs" / "gallery.md"
IMAGES = ROOT / "docs" / "img" / "gallery"
COMMAND = "python scripts/gallery.py"

# Sections, in reading order; every spec of specs/ appears in exactly one.
SECTIONS: list[tuple[str, str, list[str]]] = [
    ("Open, closed and full-flow cycles",
     "How the flow is split off the main line and whether it comes back: the residual connection is the closed cycle.",
     ["pressure_fed", "gas_generator", "gpt2", "gpt2_medium", "full_flow"]),
    ("Where the valves sit",
     "The same turbines with the norms moved: on the branch, in series on the main line, or on both sides of the turbine.",
     ["post_ln", "sandwich", "deepnet"]),
    ("Lean starts: what each merge lets back in",
     "Pre-LN with cooling (gpt2 above) shrinks the turbines' output projections at initialisation; these engines scale or gate the exhaust at the merge itself.",
     ["rezero", "layerscale", "highway"]),
    ("Injectors: how positions mix",
     "Attention is the injector, the one place where positions meet; its baffles (heads, KV heads), its reach (a window) and its very form can change.",
     ["llama", "mqa", "mistral", "moe", "poolformer"]),
    ("The expander cycle: changing the exponent",
     "Attention's cost grows as n squared and its KV cache with n; linear attention and the SSM carry the past in a state of fixed size, so a sequence costs n and decoding keeps the same few bytes at any length. Latent attention keeps the n-squared injector and shrinks what its cache keeps per token.",
     ["expander", "mamba2", "deepseek_v2", "jamba"]),
    ("A throat on the main line",
     "The narrowest width on the main path caps what the engine can carry past it.",
     ["throat"]),
    ("Per-layer patterns: stages of stages",
     "A pattern of layers that repeats (local and global attention in turn, a layer type every k-th layer) is written once, as a nested stage, and stays folded in the IR, the diagram and the generated model.",
     ["striped"]),
]

# Each spec's concept: (the engine reading, the network reading), in the project's words.
CONCEPTS: dict[str, tuple[str, str]] = {
    "pressure_fed": (
        "No turbomachinery and no split flow: the tanks push propellant straight through every component in series. "
        "Each stage's pressure drop falls on the whole flow, so a pressure-fed engine is simple and reliable when short, "
        "and cannot be stacked tall.",
        "A plain stack, `x = mlp(ln(attn(ln(x))))`, with no residual connection. There is no identity path, so the "
        "gradient reaching the feed is a product of every operator's Jacobian; four layers train, forty would "
        "hardly start (the reviewer warns, W107, when a plain stack gets deep). Everything downstream of here is about giving the flow a way around the turbines.",
    ),
    "gas_generator": (
        "An open cycle: some flow drives a turbine and is then dumped rather than returned to the chamber. Here the "
        "last stage taps the chamber twice. The critic is detached, like a gas generator's turbine exhausting to "
        "ambient: it draws on the chamber but pushes nothing back upstream. The probe goes overboard: its exhaust never "
        "rejoins the main line at all.",
        "`detach` makes the critic `x + f(x.detach())`: the branch learns, through its merge, to use the features it "
        "reads, but cannot reshape them (the reviewer's note N101 says exactly which groups its gradient no longer "
        "reaches). `overboard loss=0.1` makes the probe an auxiliary next-token head on an intermediate layer whose "
        "loss, weighted 0.1, joins the total: deep supervision, or a trained linear probe.",
    ),
    "gpt2": (
        "The closed, staged-combustion cycle: every prechamber's exhaust returns to the chamber, nothing is dumped. "
        "Each block splits the flow twice, once through the injector and once through the combustor, with a valve at "
        "each prechamber's inlet; the main line itself is unobstructed from the feed pumps to the last valve before the "
        "nozzle. The prechambers run cool at ignition: their output projections start at 0.02/sqrt(24).",
        "GPT-2 small exactly: Pre-LN blocks `x = x + attn(ln(x)); x = x + mlp(ln(x))`, learned positions, a final "
        "LayerNorm and an LM head tied to the token embedding, 124,439,808 parameters as Hugging Face counts them. "
        "The clean residual path is why Pre-LN trains without a long warmup.",
    ),
    "gpt2_medium": (
        "The same cycle at the next size: 24 stages of width 1024. Twice the stages means twice the merges into the "
        "chamber (48), so each prechamber starts leaner, 0.02/sqrt(48), to keep the chamber pressure at ignition where "
        "it was.",
        "GPT-2 medium (354,823,168 parameters). The block is written once as a stage template, `stage block(heads)`, "
        "and instanced `x 24`: a spec can name a block and reuse it, and the diagram still draws one block with a x24 badge. "
        "`cyclec check` notes (N103) that with 16 KV heads of 64 dims in 24 layers the KV cache holds 96 KiB per token: "
        "at this size grouped-query attention starts to pay.",
    ),
    "full_flow": (
        "Full-flow staged combustion: two preburners fed from the same state, all the flow passing through turbines, "
        "both exhausts returning at one junction. One valve serves both prechambers, and both run cool at ignition.",
        "The parallel block of GPT-J and PaLM: `x = x + attn(ln(x)) + mlp(ln(x))`. Attention and MLP read the same "
        "normalised input, so their input projections can be fused into one matrix product and a block needs one norm "
        "instead of two. Rotary positions turn 16 of each head's 64 dimensions, and the head is untied with a bias, as "
        "in GPT-J; the count equals `GPTJForCausalLM` of the same config. Unlike GPT-J, which starts every projection at "
        "0.02, both exhausts are cooled here (0.02/sqrt(24): 24 merges into the chamber); without that the reviewer "
        "warns (W102) that 24 full-strength updates land on the chamber at initialisation.",
    ),
    "post_ln": (
        "The valves sit in series on the main line: after each prechamber returns its exhaust, the whole chamber flow "
        "passes a valve. The turbines are fed straight from the chamber, and every stage adds a pressure drop that the "
        "return stroke must climb.",
        "The original Transformer encoder (base size): `x = ln(x + attn(x)); x = ln(x + mlp(x))`. The gradient into "
        "the first layer passes through all twelve LayerNorms, which is why Post-LN wants a learning-rate warmup "
        "(here 4000 steps). The throat is open, so every position sees every other and there is no KV cache; positions "
        "are sinusoidal and the embedding is scaled by sqrt(512). The count equals six of torch's "
        "`nn.TransformerEncoderLayer` plus the embedding.",
    ),
    "sandwich": (
        "A valve on both sides of each turbine. The inlet valve isolates the turbine from the chamber pressure, as in "
        "Pre-LN; the outlet valve bounds how hard the exhaust can hit the chamber. Both sit on the branch, so the main "
        "line stays clear.",
        "Sandwich-LN from CogView: `x = x + ln(f(ln(x)))`. Normalising each branch's output caps the size of every "
        "update to the residual stream, which CogView used to keep deep fp16 training from overflowing. It costs two "
        "LayerNorms per branch, four per block.",
    ),
    "deepnet": (
        "Post-LN's valves stay in series, but the chamber flow is up-weighted before each valve (alpha = (2N)^(1/4) = 2.91 "
        "for N = 36 blocks) and the turbines are built small (the value and output projections and the MLP weights start scaled "
        "by beta = (8N)^(-1/4) = 0.24). The main line dominates every junction, so the pressure drops stop compounding.",
        "DeepNet's DeepNorm: `x = ln(alpha * x + f(x))`. Alpha and beta are constants fixed by the depth, not "
        "parameters: the count is exactly a Post-LN stack's. With them, a 36-layer Post-LN engine trains where a plain "
        "one would need great care.",
    ),
    "rezero": (
        "Every preburner starts unlit: each merge multiplies the exhaust by a throttle that starts at zero, so at "
        "ignition the engine is the bare main line from the feed pumps to the nozzle, and each stage lights as training opens its throttle. "
        "There are no valves at all.",
        "ReZero: `x = x + alpha * f(x)` with a learned scalar alpha per branch, initialised to 0, and no LayerNorm "
        "anywhere. At initialisation the network is the identity (the embedding straight into the head), so signals and "
        "gradients pass every layer unchanged. The 24 alphas are the only parameters the merges add.",
    ),
    "layerscale": (
        "A lean mixture per channel: each prechamber's exhaust is scaled, channel by channel, by a learned trim that "
        "starts very small, so each preburner runs lean at first and richens as training asks.",
        "LayerScale from CaiT: `x = x + diag(lambda) * f(ln(x))` with lambda a learned vector per branch. CaiT's rule sets "
        "its start by depth: 0.1 up to 18 layers, 1e-5 up to 24, 1e-6 beyond; this engine has 24. It adds one "
        "width-sized vector per merge (18,432 parameters in all).",
    ),
    "highway": (
        "A throttle valve at each junction: a learned gate decides, channel by channel and position by position, how "
        "much of the turbine's exhaust replaces the chamber flow. The gate starts mostly shut (bias -1), so the main line "
        "carries the flow at first.",
        "Highway-gated merges: `x = x + g * (f(x) - x)` with `g = sigmoid(W x + b)`, the carry gate of Highway Networks "
        "(which inspired the residual connection: a residual is a gate held open with carry 1). Each gate is a full "
        "width x width matrix: 789,504 parameters, a tenth of the engine, go into deciding how much to merge.",
    ),
    "llama": (
        "RMSNorm valves on the branches, SwiGLU combustors, rotary positions and a baffled injector: 8 query heads "
        "share 2 key/value heads. The baffles cut what the injector must remember per token by 4x.",
        "A small Llama: `x = x + attn(rms(x)); x = x + swiglu(rms(x))`, grouped-query attention (GQA), no biases, "
        "positions only from rotary (the feed has none), an untied head. The block is a stage template with three "
        "parameters; the `startup` block carries the training recipe (warmup, cosine schedule, clipping, AdamW "
        "betas and decay) into the generated `configure_optimizer`. The KV cache holds 4 KiB per token in 16-bit values.",
    ),
    "mqa": (
        "The most baffled injector: sixteen query heads share one key/value head. The injector's memory per token "
        "shrinks to a sixteenth of what a plain multi-head injector needs.",
        "Multi-query attention: `kv_heads=1`. The KV cache holds layers x 1 x head_dim x 2 values per token (2 KiB "
        "here, against 32 KiB with 16 KV heads), which is what makes long-context decoding cheap; the K and V "
        "projections shrink to 1024 x 64. The count equals transformers' `LlamaForCausalLM` with "
        "`num_key_value_heads=1`.",
    ),
    "mistral": (
        "A window on the injector: each position sees only the last 256 positions, so the injector's memory stops "
        "growing at the window whatever the context. Stacked stages still pass information further back, one window "
        "per stage.",
        "Mistral-style sliding-window attention with GQA: attention per token costs at most 256 keys at any context, "
        "the KV cache need hold only the window, and eight layers reach 8 x 256 = 2048 positions back. The static "
        "report shows attention FLOPs growing linearly past the window instead of quadratically.",
    ),
    "moe": (
        "The combustor becomes a liquid-liquid injector: each token is routed to 2 of 8 experts. Restrictor orifices "
        "(`capacity=1.25`) cap how many tokens one expert takes, spilling the overflow back to the main line, and a "
        "mixture trim (`balance=0.01`) keeps the injection even so that no expert runs hot.",
        "A Mixtral-style sparse MoE: top-2 routing over 8 SwiGLU experts, with the Switch Transformer's load-balancing "
        "loss added to the total. Every expert holds parameters but each token runs only two: the reactors hold 72% of "
        "the parameters while a token's forward pass touches a quarter of them. The parameter table counts every expert.",
    ),
    "poolformer": (
        "The injector replaced by the simplest thing that still mixes: an average over the last three positions. "
        "It has no parameters at all; the combustor does the work.",
        "MetaFormer's PoolFormer block, made causal for a language model: the token mixer is `avgpool(x) - x` over the "
        "past 3 positions. MetaFormer's point is that the block's general shape (norm, mixer, residual, MLP, residual) "
        "carries much of the performance; the table shows every turbine parameter in the reactors.",
    ),
    "expander": (
        "An expander cycle's ceiling is set by how heat grows with size; here the injector's n-squared mixing is swapped "
        "for one that folds the past into a fixed-size state. Each head keeps one head_dim x (head_dim + 1) state and, "
        "with retention, lets it cool at its own fixed rate.",
        "GPT-2 small with its softmax attention replaced by causal linear attention (Katharopoulos et al. 2020): "
        "phi(x) = elu(x) + 1 on queries and keys, y_t = phi(q_t) S_t / phi(q_t) z_t, with RetNet's per-head decay. "
        "Training runs in chunks of 64 positions (attention-like inside a chunk, the state carried between chunks), "
        "so mixing FLOPs per token are flat in the context; decoding keeps 1.14 MiB per sequence (2-byte values) at "
        "any length, where gpt2 keeps 36 MiB at its 1,024 tokens and grows linearly.",
    ),
    "mamba2": (
        "No injector at all: every stage's mixer is a regenerative jacket, a selective state that carries the flow "
        "along the chamber and decides, token by token, how much of it to keep (the step size dt) and what to read "
        "out of it (C).",
        "Mamba-2 at mamba2-130m's shape (24 layers, width 768, 24 heads of 64, state 128), equal to transformers' "
        "Mamba2ForCausalLM in logits, gradients and greedy decoding. The SSD scan trains in chunks of 256; decoding "
        "keeps each layer's conv window and its 24 x 64 x 128 state: 9.25 MiB per sequence whatever its length, and "
        "the report's exponents read n^1 for the FLOPs and n^0 for the decoding state.",
    ),
    "deepseek_v2": (
        "The injector keeps its full reach but feeds from a compressed manifold: every position leaves one small latent "
        "behind, from which each head's keys and values are expanded when they are needed. The combustor is a bank of "
        "16 narrow liquid-liquid injectors (4 per token) beside 2 shared ones every token burns in, behind one valve: "
        "the moe's shared element, as DeepSeekMoE writes it.",
        "DeepSeek-V2's multi-head latent attention (MLA) and DeepSeekMoE at a small size, equal to transformers' "
        "DeepseekV2ForCausalLM in logits, gradients and greedy decoding at a tiny config. The cache keeps the 128-wide "
        "latent and one 32-dim rotary key per layer and token: 1,920 bytes per token (2-byte values) where 8 heads of "
        "64 would keep 12,288, 6.4x less, still growing as n. The routed weights are the raw softmax (normalize=false), "
        "as in DeepSeek-V2; the spec is what `cyclec import` reads a DeepSeek-V2 config of this shape as, so its "
        "checkpoints load and export.",
    ),
    "jamba": (
        "A hybrid engine: seven of every eight stages run on regenerative jackets (Mamba-1's selective state, one per "
        "channel), the eighth keeps an injector that mixes every position with every other, and every other combustor is "
        "a bank of liquid-liquid injectors. The jackets carry the order of the flow, so there is no positions table.",
        "Jamba's layer pattern (attention at layer 4 of each 8, experts at every odd layer; 16 layers, width 512), its "
        "Mamba-1 mixer with the dt/B/C RMSNorms Jamba adds, equal to transformers' JambaForCausalLM in logits, gradients "
        "and greedy decoding at a tiny config (and loaded from, and exported to, its checkpoints). Decoding keeps 14 "
        "fixed states of 1,024 channels x (16 + a conv window of 3), 532 KiB per sequence (2-byte values) at any "
        "length, beside the two attention layers' keys and values: 1,024 bytes per token, where sixteen such "
        "attention layers would keep 8,192.",
    ),
    "throat": (
        "A choked throat fixes the mass flow whatever lies downstream: the main line narrows from 256 to 64 and widens "
        "back. (The engine's `throat causal` line is the other throat of the analogy, supersonic flow past which "
        "nothing travels upstream: the causal mask.)",
        "Two Pre-LN blocks, then `Linear(256, 64)` and `Linear(64, 256)` in series with no residual around them, then "
        "two more blocks: whatever the later blocks do, they see at most 64 numbers per position of what came before, "
        "as with an autoencoder's latent or a LoRA rank. The reviewer reports the narrowest width on the main path (N102).",
    ),
    "striped": (
        "A stage of stages: the engine repeats a set of stages, as a multistage turbopump repeats its rotor and stator set. "
        "Each set is three short-reach injectors and one full injector whose combustor splits the flow among four expert "
        "chambers; six sets make the engine. The diagram draws the set once, a frame inside a frame, each with its badge "
        "(x6 around it, x3 on the local stage). Every merge starts cool at 0.02/sqrt(48): the count is over all 24 layers.",
        "Three sliding-window layers (each query sees the last 128 tokens) then one global layer with a top-2 MoE, six times: "
        "`stage stripe x 6 { stage local = local_layer(window=128) x 3  stage global {...} }`. The generated model has a "
        "`Stripe` class whose `stages` hold three `Local` and one `Global`, a loop over `config.n_stripe` in the model and "
        "over `config.n_local` in the stripe; parameters are named `stages.5.stages.3.burn.moe...`. The static report counts "
        "the KV cache each layer needs: the last 128 positions in the 18 local layers, the whole context in the 6 global ones.",
    ),
}

ROLE_HEADS = {  # table columns: the role and its engine part
    "feed": "feed (pumps)",
    "mixer": "mixer (injector)",
    "reactor": "reactor (combustor)",
    "valve": "valve (norm)",
    "projection": "projection (duct)",
    "merge": "merge",
    "nozzle": "nozzle (head)",
}


def title(stem: str) -> str:
    """The header comment's first paragraph: what the spec is."""
    words = []
    for line in spec_path(stem).read_text("utf-8").splitlines():
        line = line.strip()
        if not line.startswith("#") or not line.lstrip("# "):
            break
        words.append(line.lstrip("# ").strip())
    return " ".join(words)


def stems() -> list[str]:
    return [s for _, _, group in SECTIONS for s in group]


def spec_path(stem: str) -> Path:
    return ROOT / "specs" / f"{stem}.cycle"


def load(stem: str):
    from cyclelang.semantics.resolve import parse

    return parse(spec_path(stem).read_text("utf-8"), f"specs/{stem}.cycle")


# --- diagrams -------------------------------------------------------------------------------


def dot_source(stem: str) -> str:
    from cyclelang.backends.graphviz import to_dot

    return to_dot(load(stem), view="cycle")


def stamped_svg(stem: str) -> bytes:
    from cyclelang.backends.graphviz import stamped_svg as stamp

    return stamp(dot_source(stem), COMMAND)


def stale_images() -> list[str]:
    """Diagrams that are missing, drawn from a different DOT, or left over from a removed spec."""
    from cyclelang.backends.graphviz import svg_is_current

    out = []
    for stem in stems():
        path = IMAGES / f"{stem}.svg"
        if not svg_is_current(path.read_text("utf-8") if path.exists() else None, dot_source(stem)):
            out.append(path.relative_to(ROOT).as_posix())
    extra = sorted(p for p in IMAGES.glob("*.svg") if p.stem not in stems()) if IMAGES.exists() else []
    return out + [p.relative_to(ROOT).as_posix() + " (no such spec)" for p in extra]


# --- the markdown ---------------------------------------------------------------------------


def _n(x: int) -> str:
    return f"{x:,}"


def _si(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:g}"


def _bytes(x: int) -> str:
    return f"{x // 1024} KiB" if x >= 1024 and x % 1024 == 0 else f"{x:,} B"


def checked(stem: str) -> str:
    """What `cyclec check` says, in a few words."""
    from cyclelang.review import apply_allows, review

    spec = load(stem)
    diags = apply_allows(review(spec), {f"specs/{stem}.cycle": spec_path(stem).read_text("utf-8")})
    if not diags:
        return "clean"
    return "; ".join(f"{d.severity} {d.code}: {d.message}" for d in diags)


PSEUDO_STAGES = {"feed": "feed", "main": "main line", "nozzle": "nozzle"}  # the report's names for what is not in a stage


def param_table(rep: dict, stage_names: set[str]) -> list[str]:
    p = rep["params"]
    roles = [r for r, v in p["by_role"].items() if v]
    head = ["stage", "×", "per instance"] + [ROLE_HEADS.get(r, r) for r in roles] + ["total"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([":--", "--:"] + ["--:"] * (len(head) - 2)) + "|"]
    for st in p["by_stage"]:
        if not st["params"]:
            continue
        name = st["name"]
        shown = f"`{name}`" if name in stage_names or name not in PSEUDO_STAGES else f"*{PSEUDO_STAGES[name]}*"
        shown = "↳ " * max(st.get("depth", 1) - 1, 0) + shown  # a nested stage, under its group
        cells = [shown, str(st["repeat"]), _n(st["per_instance"])]
        cells += [_n(st["by_role"].get(r, 0)) if st["by_role"].get(r, 0) else "" for r in roles]
        cells.append(_n(st["params"]))
        lines.append("| " + " | ".join(cells) + " |")
    total = ["**total**", "", ""] + [f"**{_n(p['by_role'][r])}**" for r in roles] + [f"**{_n(p['total'])}**"]
    lines.append("| " + " | ".join(total) + " |")
    return lines


def entry(stem: str) -> list[str]:
    from cyclelang.review import analyze

    text = spec_path(stem).read_text("utf-8")
    spec = load(stem)
    rep = analyze(spec)
    stage_names = {op.name for op in spec.engine.body if op.op == "stage"}
    p, f, s = rep["params"], rep["flops_per_token"], rep["scaling"]
    engine, network = CONCEPTS[stem]
    if not s["kv_cache"]:
        kv = "no KV cache (open throat)"
    elif not s["kv_bytes_per_token"]:
        kv = "no KV cache (no attention)"
    else:
        kv = f"KV cache {_bytes(s['kv_bytes_per_token'])} per token"
    figures = (f"**{_si(p['total'])} parameters** ({_n(p['total'])}; {_si(p['non_embedding'])} without the feed) · "
               f"forward {_si(f['forward'])} FLOPs per token at context {f['context']} · {kv} · "
               f"mixers {p['mixer_share']:.0%} / reactors {p['reactor_share']:.0%} of the turbines · "
               f"`cyclec check`: {checked(stem)}")
    return [
        f"### {stem}",
        "",
        f"*{title(stem)}* — [`specs/{stem}.cycle`](../specs/{stem}.cycle)",
        "",
        f"![{stem}: power-cycle diagram](img/gallery/{stem}.svg)",
        "",
        figures,
        "",
        f"**Engine.** {engine}",
        "",
        f"**Network.** {network}",
        "",
        *param_table(rep, stage_names),
        "",
        "<details><summary>The spec</summary>",
        "",
        "```",
        text.rstrip("\n"),
        "```",
        "",
        "</details>",
        "",
    ]


# GPT-2 drawn by cyclec, the classic figure, torchview and the torch.fx drawer, made by
# scripts/gpt2_side_by_side.py. Those pictures depend on the installed drawers' versions, so
# they are regenerated by hand, not checked for freshness.
SIDE_BY_SIDE = [
    "## GPT-2 four ways",
    "",
    "The same engine drawn four ways; regenerate them with `python scripts/gpt2_side_by_side.py`.",
    "",
    "- **cyclec**: `cyclec draw specs/gpt2.cycle --size slide`. The 12 blocks are folded into one frame marked ×12, and the "
    "residual stream is one straight line, drawn as wide as the chamber. The norms sit on the branches, before attention and "
    "the MLP, which is GPT-2's Pre-LN block.",
    "- **The classic figure**: Vaswani et al. (2017), Figure 1, its decoder side without the cross-attention, which is how "
    "GPT draws its block. It is redrawn by hand in the script as pinned DOT. Its \"Add & Norm\" after each sub-layer is "
    "the original Post-LN block; GPT-2 moved the norms in front of the sub-layers. That move is the difference the cyclec "
    "figure draws, and the one `specs/post_ln.cycle` reverses.",
    "- **[torchview](https://github.com/mert-kurttutan/torchview) 0.2.7**: run on transformers' `GPT2LMHeadModel`, built "
    "from its config with random weights and no KV cache, at module depth 3 with `roll=True`. The picture is the top "
    "1,600 of 6,719 px. torchview unrolls all 12 blocks into one strip, with the mask's index arithmetic beside them.",
    "- **The torch.fx drawer** (`FxGraphDrawer`): run on the model `cyclelang.build` makes from the spec. `symbolic_trace` "
    "cannot trace the model as it is, because its forward branches on traced sizes: the context check "
    "`if past + T > context`, and the attention's choice of mask, `k.size(2) == T`. So the script traces a four-line "
    "module that calls the model's own embedding, blocks, final norm and tied head, in the model's order, with each "
    "attention kept as a leaf. It checks that the traced module's logits equal the model's. The result is 108 nodes, "
    "each a record of its op code and argument list, with every weight and bias a node of its own. The picture is the "
    "top left 2,600 × 1,600 of 9,088 × 21,761 px: the embeddings and the first norm.",
    "",
    "| cyclec, `--size slide` | the classic figure (Vaswani et al. 2017), redrawn |",
    "|:--:|:--:|",
    "| ![GPT-2 by cyclec](img/side_by_side/gpt2_cyclec.png) | ![The classic Transformer figure, decoder only](img/side_by_side/classic_transformer.png) |",
    "| **torchview** | **torch.fx `FxGraphDrawer`** |",
    "| ![GPT-2 by torchview](img/side_by_side/gpt2_torchview_top.png) | ![GPT-2 by the torch.fx drawer](img/side_by_side/gpt2_fx_top.png) |",
    "",
]


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9_ -]", "", title.lower()).replace(" ", "-")


def markdown() -> str:
    from cyclelang.review import analyze

    out = [
        "# Gallery",
        "",
        f"<!-- Generated by {COMMAND} from specs/*.cycle; edit the specs or the script, not this file. -->",
        "",
        "Every spec of the library (`specs/`), with its power-cycle diagram (`cyclec draw`), its parameters per "
        "stage and per role (`cyclec check --report`), what the reviewer says about it, and the concept it shows, read "
        "once as an engine and once as a network. Parameter counts are checked against transformers' models or "
        "hand-written closed forms in the test suite (tests/test_spec_library.py, tests/test_interop.py).",
        "",
        "Reading the diagrams (each carries its own legend): tokens at the bottom, logits at the top; the thick dark line is "
        "the residual stream (the main chamber), drawn as wide as the chamber is, so a throat pinches it; orange lines are "
        "residual branches (prechambers), each reading the stream at a dot and returning at a ⊕ junction; a dashed grey "
        "cut is a detached read (no gradient) and a red dump nozzle outside the frame a side output that never merges. "
        "A repeated block is one frame with a large ×N badge. Every box is titled with its operation and key numbers, "
        "its rocket role in italics beneath. Roles in the tables: the *mixer* is attention, "
        "pooling or a convolution (the injector, where positions meet), the *reactor* the MLP or MoE (combustion at each "
        "position), *valves* are norms, *projection* a plain linear layer, *merge* the parameters a merge adds (gates, scales).",
        "",
        "See also the examples: [`draw_variants.py`](../examples/draw_variants.py) draws one engine in seven block "
        "variants side by side, [`train_markov.py`](../examples/train_markov.py) compiles a spec and trains it, "
        "[`load_transformers.py`](../examples/load_transformers.py) loads transformers weights into compiled specs, and "
        "[`include/`](../examples/include/engine.cycle) builds an engine from a file of shared blocks.",
        "",
        "| spec | what it shows | parameters |",
        "|:--|:--|--:|",
    ]
    for _, _, group in SECTIONS:
        for stem in group:
            total = analyze(load(stem))["params"]["total"]
            out.append(f"| [{stem}](#{_anchor(stem)}) | {title(stem)} | {_si(total)} |")
    out.append("")
    out += SIDE_BY_SIDE
    for section, intro, group in SECTIONS:
        out += [f"## {section}", "", intro, ""]
        for stem in group:
            out += entry(stem)
    return "\n".join(out).rstrip("\n") + "\n"


def stale() -> list[str]:
    out = stale_images()
    if not MARKDOWN.exists() or MARKDOWN.read_text("utf-8") != markdown():
        out.insert(0, MARKDOWN.relative_to(ROOT).as_posix())
    return out


def main(argv: list[str]) -> int:
    specs = sorted(p.stem for p in (ROOT / "specs").glob("*.cycle"))
    if sorted(stems()) != specs:
        missing, extra = sorted(set(specs) - set(stems())), sorted(set(stems()) - set(specs))
        print(f"gallery sections out of step with specs/: missing {missing}, unknown {extra}", file=sys.stderr)
        return 1
    if "--check" in argv:
        bad = stale()
        for p in bad:
            print(f"out of date: {p}", file=sys.stderr)
        return 1 if bad else 0
    from cyclelang.io import atomic_write

    IMAGES.mkdir(parents=True, exist_ok=True)
    for stem in stems():
        atomic_write(IMAGES / f"{stem}.svg", stamped_svg(stem))
    for p in IMAGES.glob("*.svg"):
        if p.stem not in stems():
            p.unlink()
    atomic_write(MARKDOWN, markdown())
    print(f"wrote {MARKDOWN.relative_to(ROOT).as_posix()} and {len(stems())} diagrams in {IMAGES.relative_to(ROOT).as_posix()}/")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
