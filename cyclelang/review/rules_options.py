"""Design rules on the parts' settings: the main line's throat, rotary and windows, positions,
mixers and final norms, the KV cache, attention scales, norm offsets, rotary scaling, soft-caps,
ALiBi, sinks, clamps, routing, short convs, and legal but unwise values.
"""

from __future__ import annotations


from .. import ir
from ..diagnostics import Diagnostic
from ..ir.kinds import OPS
from .registry import ReviewConfig, _n, _plural, _w, rule
from .report import DTYPE_BYTES, _bytes, _state_bytes, decode_state_bytes, recurrent_kinds
from .walk import parts, stages


# --- N102: the throat of the main line ---------------------------------------------------------


@rule("N102", "narrowest width on the main line", """
A linear at stage or engine level narrows the main line below the chamber's width.
Like a nozzle's throat, the narrowest section sets the flow: no more numbers per
position pass it than its width, whatever the widths after it. The note says where
the throat is; it is a fact about the design, not a fault.""", "stage squeeze { turbine linear out=64 }")
def narrowest_width(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    narrowest, where = e.width, None
    for p in parts(e):
        if p.branch is not None or p.role in ("feed", "nozzle", "merge"):
            continue  # a branch's width is its own; the main line's is what the ops on it leave
        w = p.kind.out_width(p.node, p.width)
        if w < narrowest:
            narrowest, where = w, p.node
    if where is None:
        return []
    return [_n("N102", f"the main line narrows to width {narrowest} here, from a chamber of {e.width}: the throat of this engine", where.span,
               None, [f"whatever comes after, no more than {narrowest} numbers per position pass this point"])]


# --- W105: rotary on an odd head ---------------------------------------------------------------


@rule("W105", "rotary positions on an odd head", """
Rotary embeddings turn the dimensions of a head in pairs. With an odd head_dim one
dimension is never turned, so it carries no position, and a fraction of the head
rounds down further than asked. Choose heads (or head_dim=) so each head has an
even number of dimensions.""", "chamber width=195 ... turbine attention heads=3 rotary")
def rotary_odd_head(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if isinstance(a, ir.Attention) and a.rotary_dims > 0 and a.head_dim % 2:
            out.append(_w("W105", f"rotary positions on an odd head_dim {a.head_dim}: only {a.rotary_dims} of its dimensions turn", a.span,
                          "choose heads (or head_dim=) so that each head has an even number of dimensions",
                          ["rotary turns dimensions in pairs, so the odd one out never carries position"]))
    return out


# --- W106: a window that never slides -----------------------------------------------------------


@rule("W106", "sliding window at least as long as the context", """
A sliding window of the context's length or more never slides: the attention is
full attention with the cost of a window mask. Drop `window=`, or make it shorter
than the context if the point was to bound the KV cache.""", "feed tokens vocab=32000 context=2048 ... turbine attention heads=8 window=4096")
def window_over_context(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if isinstance(a, ir.Attention) and a.window is not None and a.window >= e.feed.context:
            out.append(_w("W106", f"a sliding window of {a.window} tokens over a context of {e.feed.context}: it never slides", a.span,
                          f"drop window=, or make it smaller than the context ({e.feed.context})"))
    return out


# --- W107: a deep plain stack -------------------------------------------------------------------


@rule("W107", "deep plain stack", """
Turbines work in series on the main line with no prechamber around them, twelve
layers or more: a pressure-fed engine. With no residual path the gradient passes
through every turbine on its way up, and it fades or explodes with depth. Put the
turbines in prechambers (`x = x + f(x)`), so the main line runs straight through.""", "stage layer x 12 { norm layernorm  turbine attention heads=4  norm layernorm  turbine mlp }")
def deep_plain_stack(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    def working(op) -> bool:  # a turbine that does work: a mixer or a reactor, not a projection
        return ir.is_turbine(op) and ir.kinds.kind_of(op).role in ("mixer", "reactor")

    plain = [s for s in stages(e) if not ir.stage_branches(s) and any(working(op) for op in s.ops)]
    layers = sum(s.repeat for s in plain)
    if layers < cfg.post_ln_depth:
        return []
    first = next(op for op in plain[0].ops if working(op))
    return [_w("W107", f"{_plural(layers, 'layer')} of turbines in series on the main line, with no branch to carry the flow around them", first.span,
               "put the turbines in prechambers (x = x + f(x)) so the main line runs straight through",
               ["with no residual path the gradient must pass every turbine on its way up, and it fades or blows up with depth"])]


# --- W108: no positions in a bidirectional engine ----------------------------------------------


@rule("W108", "no positions in a bidirectional engine", """
With an open throat and `position=none` and no rotary, nothing tells a position
where it is: attention without a mask treats the sequence as a bag of tokens and
cannot tell 'a b' from 'b a'. (A causal mask leaks order by itself, which is why
the rule is about open throats only.) Give the feed learned or sinusoidal
positions, or add rotary to the attention.""", "throat open  feed tokens vocab=1000 context=128 position=none")
def open_without_positions(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    if e.throat != "open" or e.feed.position != "none":
        return []
    ps = list(parts(e))
    if any(isinstance(p.node, ir.Attention) and p.node.rotary_dims or p.kind.mixes_positions and not isinstance(p.node, ir.Attention) for p in ps):
        return []  # rotary carries positions; a mixer that is not attention (pool) sees order by construction
    return [_w("W108", "no position information in an engine with an open throat", e.feed.span,
               "give the feed position=learned or sinusoidal, or add rotary to the attention",
               ["attention without a mask or positions treats the sequence as a bag: it cannot tell 'a b' from 'b a'"])]


# --- W109: no mixer -------------------------------------------------------------------------------


@rule("W109", "no mixer", """
No turbine mixes positions: there is no mixer (""" + ", ".join(dict.fromkeys(k.keyword for k in OPS if k.mixes_positions)) + """), so every token
is processed alone and the prediction at a position ignores all the others. An
engine can use many kinds of injector, but it cannot go without one.""", "stage block x 4 { prechamber burn { norm layernorm  turbine mlp } }")
def no_mixer(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    if any(p.kind.mixes_positions for p in parts(e)):
        return []
    mixers = list(dict.fromkeys(k.keyword for k in ir.kinds.OPS if k.mixes_positions))  # latent attention is attention's
    return [_w("W109", "no turbine mixes positions: every token is processed alone", e.span,
               "add a mixer: " + ", ".join(f"'turbine {m}'" for m in mixers[:-1]) + f" or 'turbine {mixers[-1]}'",
               [f"an engine needs an injector; only the mixers ({', '.join(mixers)}) carry information between positions"])]


# --- W110: Pre-LN with no final valve ------------------------------------------------------------


@rule("W110", "Pre-LN without a final norm", """
The stages keep their norms on the branches (Pre-LN), so the main line is never
normalised, and its norm grows with every merge. Without a norm on the main line
before the nozzle the head reads that growing stream unregulated. Add a norm after
the last stage (GPT-2's ln_f).""", "stage block x 12 { prechamber mix { norm layernorm ... } ... }  nozzle head")
def pre_ln_without_final_norm(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    last = e.body[-1] if e.body else None
    if isinstance(last, ir.Stage) and last.is_group:
        last = stages(e)[-1]  # the last layer a nested stage runs
    if not isinstance(last, ir.Stage) or not ir.stage_branches(last):
        return []
    if isinstance(last.ops[-1], ir.Norm) and last.ops[-1].type != "scalar":
        return []  # Post-LN: the stage ends with its own valve
    branches = [b for b in ir.stage_branches(last) if not b.overboard]
    shared = any(isinstance(op, ir.Fullflow) and op.norm is not None for op in last.ops)
    if not branches or not (shared or all(isinstance(b.ops[0], ir.Norm) for b in branches)):
        return []
    if all(isinstance(b.merge, ir.DeepnormMerge) for b in branches):
        return []
    return [_w("W110", "the main line reaches the nozzle without a norm, after Pre-LN stages", e.nozzle.span,
               "add a norm on the main line before the nozzle (GPT-2's ln_f)",
               ["with the valves on the branches, the chamber's norm grows stage after stage and the head reads it unregulated"])]


# --- N103: every head keeps its own K and V, and the cache is large -----------------------------


@rule("N103", "large KV cache with every head keeping its own K and V", """
In a causal engine every attention layer caches the keys and values of each past
token for decoding: layers x kv_heads x head_dim x 2 x 2 bytes per token at 16-bit
values. With `kv_heads` equal to `heads` (plain multi-head attention) each head keeps
its own pair, and once that reaches 64 KiB per token (the threshold of this note:
GPT-2 medium's 96 KiB is above it, GPT-2 small's 36 KiB below) the cache, not the
weights, is what limits batch size and context at inference, and every decoding step
reads all of it. Grouped-query attention (`kv_heads=heads/4`, say) or multi-query
attention (`kv_heads=1`) lets several heads share one K and V: the baffled injector,
where baffles group the injector elements so fewer feed passages serve the same
chamber. Quality usually moves little, and the cache shrinks by heads/kv_heads. The
note is a fact about the design; silence it with `# allow: N103` where full heads are
meant.""", "stage block x 24 { prechamber mix { ... turbine attention heads=16 ... } }   # width 1024")
def full_kv_cache(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    if e.throat != "causal":
        return []  # an open throat caches nothing
    mha_parts = [p for p in parts(e) if isinstance(p.node, ir.Attention) and p.node.kv_heads == p.node.heads > 1]
    mha = [(p.node, p.repeat) for p in mha_parts]

    def cache(n: int) -> int:
        return sum(p.kind.state(p.node, n) * p.repeat for p in mha_parts) * DTYPE_BYTES

    per_token = cache(1)
    if not mha or per_token < cfg.kv_note_bytes:
        return []
    layers = sum(r for _, r in mha)
    a = mha[0][0]
    shape = (f"{layers} layers x {a.kv_heads} kv_heads x {a.head_dim} x 2 x {DTYPE_BYTES} bytes"
             if all(x.kv_heads == a.kv_heads and x.head_dim == a.head_dim for x, _ in mha) else f"{_plural(layers, 'attention layer')}")
    n = e.feed.context
    seq = cache(n)
    g = a.heads // 4 if a.heads % 4 == 0 and a.heads >= 8 else 1  # a quarter of the heads, Llama 2's 64 -> 8 in spirit
    return [_n("N103", f"every head keeps its own K and V: the KV cache takes {_bytes(per_token)} per token ({shape})", a.span,
               (f"share K and V between heads (the baffled injector): kv_heads={g} (GQA) cuts the cache {a.heads // g}x, kv_heads=1 (MQA) {a.heads}x"
                if g > 1 else f"share K and V between heads (the baffled injector): kv_heads=1 (MQA) cuts the cache {a.heads}x, or choose heads with a divisor for GQA"),
               [f"at the full context of {n} tokens that is {_bytes(seq)} per sequence, read in full at every decoding step"]
               + _fixed_state_note(e, n))]


def _fixed_state_note(e: ir.Engine, n: int) -> list[str]:
    """For a hybrid: what its recurrent mixers keep beside the cache, which does not grow."""
    rec = recurrent_kinds(e)
    if not rec:
        return []
    fixed = decode_state_bytes(e, n) - _state_bytes(e, n, DTYPE_BYTES)
    return [f"its {' and '.join(rec)} mixers keep a fixed state of {_bytes(fixed)} per sequence whatever its length: only attention's cache grows"]



# --- W125: an attention scale far from 1/sqrt(head_dim) --------------------------------------------


@rule("W125", "attention scale far from 1/sqrt(head_dim)", """
`turbine attention scale=` sets the factor the attention logits q.k are multiplied by
(Granite's attention_multiplier, Gemma 2's query_pre_attn_scalar**-0.5). The usual
1/sqrt(head_dim) keeps the logits' spread near 1 whatever the head size. A scale eight
times larger (or smaller) than that starts the softmax nearly one-hot (or nearly
uniform): in engine terms an injector that fires through a few elements, or one that
mixes every position evenly so that nothing is attended. The warning fires at a factor
of 8 either way; Granite's 1/64 at head_dim 128 (5.7 times smaller) stays quiet.""",
     "turbine attention heads=4 scale=1.0   # width 256: head_dim 64, usual scale 0.125")
def attention_scale_far_off(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if not isinstance(a, ir.Attention) or a.scale is None:
            continue
        usual = a.head_dim ** -0.5
        ratio = a.scale / usual
        if ratio >= 8 or ratio <= 1 / 8:
            out.append(_w("W125", f"attention scale={a.scale:g} is {ratio:.3g} times 1/sqrt(head_dim) = {usual:.3g}", a.span,
                          "drop scale= for the usual 1/sqrt(head_dim), or bring it within a factor of 8 of it",
                          ["the logits' spread sets how peaked the softmax starts: far above, the injector fires through a few "
                           "elements and their gradients vanish; far below, every position is mixed evenly and nothing is attended"]))
    return out


# --- W126: a norm gain offset other than 0 or 1 ------------------------------------------------------


@rule("W126", "norm gain offset other than 0 or 1", """
`norm rmsnorm offset=c` computes the gain as c + w (Gemma: c = 1, so a stored weight
of 0 is the identity gain, and whatever shrinks weights toward 0 (weight decay,
quantisation, pruning) pulls the valve toward the identity). The weight starts at
1 - c, so the gain starts at 1 for any c; but with c other than 0 or 1 a shrunk weight
moves the valve toward the arbitrary setting c, and no checkpoint family stores its
norms that way. The same holds for `norm layernorm offset=c` (Nemotron's LayerNorm1P:
c = 1) and for attention's `qk_norm_offset=c` (Gemma 3's qk-norms: c = 1).""", "norm rmsnorm offset=0.5")
def norm_offset_unusual(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        n = p.node
        if isinstance(n, ir.Norm) and n.offset not in (0.0, 1.0):
            out.append(_w("W126", f"a norm gain offset of {n.offset:g}: a stored weight of 0 means a gain of {n.offset:g}", n.span,
                          "use offset=1 (Gemma: the gain is 1 + w, so a weight of 0 is the identity) or no offset",
                          ["the weight starts at 1 - offset so the gain starts at 1; any shrinkage of the weight (weight decay, "
                           "quantisation, pruning) then moves the valve toward an arbitrary setting, and no checkpoint family stores it so"]))
        if isinstance(n, ir.Attention) and n.qk_norm_offset not in (0.0, 1.0):
            out.append(_w("W126", f"a qk-norm gain offset of {n.qk_norm_offset:g}: a stored weight of 0 means a gain of {n.qk_norm_offset:g}",
                          n.span, "use qk_norm_offset=1 (Gemma 3: the gain is 1 + w) or no offset",
                          ["the weight starts at 1 - offset so the gain starts at 1; any shrinkage of the weight then moves the qk-norm "
                           "toward an arbitrary setting, and no checkpoint family stores it so"]))
    return out


# --- W127: a rotary scaling that changes nothing (or squeezes) ---------------------------------------


@rule("W127", "rotary scaling that changes nothing, or shrinks", """
A rotary scaling stretches positions past the pretraining context. With
`rotary_factor` of 1 or less it stretches nothing (or squeezes the positions, so the
engine sees each position as further than it was trained for); a dynamic, llama3 or
yarn scaling whose `rotary_original=` is at or past the feed's context never reaches
the positions it rescales for (dynamic: never triggers at all). Dynamic (NTK) scaling
over 2 rotated dims changes nothing either: it raises the base, and the one pair of 2
dims turns at base**0 = 1 whatever the base (transformers' exponent dims / (dims - 2)
divides by zero there; the built model keeps the plain tables). In engine terms a
re-orificed injector that delivers the design flow: extra parts for nothing.""",
     "feed tokens vocab=256 context=64 ... turbine attention heads=4 rotary rotary_scaling=dynamic rotary_factor=2")
def rotary_scaling_idle(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        sc = getattr(a, "rotary_scaling", None)
        if sc is None:
            continue
        if sc.factor <= 1:
            what = "stretches nothing" if sc.factor == 1 else "squeezes positions: each looks further than it was trained for"
            out.append(_w("W127", f"rotary_scaling={sc.type} with rotary_factor={sc.factor:g} {what}", a.span,
                          "a factor above 1 stretches the positions; or drop rotary_scaling=",
                          ["the factor is how many times the pretraining context the positions stretch over"]))
        elif sc.type == "dynamic" and a.rotary_dims == 2:
            out.append(_w("W127", "rotary_scaling=dynamic over 2 rotated dims changes nothing: their one pair turns at base**0 = 1, whatever the base", a.span,
                          "rotate at least 4 dims (more heads' dims, or a larger rotary= fraction), or use rotary_scaling=linear",
                          ["dynamic NTK stretches positions by raising the base by (factor n / original - factor + 1) ** (dims / (dims - 2)); "
                           "over 2 dims the exponent is unbounded and the only frequency does not depend on the base"]))
        elif sc.original is not None and sc.original >= e.feed.context:
            what = "never triggers" if sc.type == "dynamic" else "rescales for positions the engine never reaches"
            out.append(_w("W127", f"rotary_scaling={sc.type} from rotary_original={sc.original} {what}: the context is {e.feed.context}", a.span,
                          "set rotary_original= to the pretraining context, below the feed's context",
                          ["the scaling stretches positions past the original context; at or past the feed's context there are none"]))
    return out


# --- W128: a soft-cap low enough to flatten the logits ----------------------------------------------


@rule("W128", "soft-cap so low it flattens the logits", """
A soft-cap computes cap * tanh(z / cap): values well under the cap pass unchanged, and
none exceeds it. Gemma 2 caps attention logits at 50 and the final logits at 30. A cap
under 5 on the attention logits (under 2 on the final logits) squashes ordinary values:
softmax over logits bounded by +-cap cannot be much sharper than e^(2 cap) to 1, so
the attention cannot focus (the model cannot be confident). A relief valve set below
the working pressure vents all the time.""", "turbine attention heads=4 softcap=1")
def softcap_too_low(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    caps = [(p.node.softcap, 5.0, "attention logits", p.node.span) for p in parts(e) if isinstance(p.node, ir.Attention) and p.node.softcap is not None]
    if e.nozzle.softcap is not None:
        caps.append((e.nozzle.softcap, 2.0, "final logits", e.nozzle.span))
    for cap, low, what, span in caps:
        if cap < low:
            out.append(_w("W128", f"softcap={cap:g} bounds the {what} to +-{cap:g}: the softmax over them cannot be sharp", span,
                          f"Gemma 2 caps attention logits at 50 and final logits at 30; keep the cap at {low:g} or more",
                          ["cap * tanh(z / cap) passes values well under the cap unchanged and squashes the rest: "
                           "a relief valve set below the working pressure vents all the time"]))
    return out


# --- W129: ALiBi with a second position scheme ----------------------------------------------------


@rule("W129", "ALiBi beside another position scheme", """
`turbine attention alibi` tells each head where the keys are by a bias linear in the
distance; BLOOM, Falcon and MPT use it instead of any other position signal (no
rotary, `feed tokens position=none`). With rotary on the same attention, or learned or
sinusoidal positions on the feed, the engine gets two position signals that agree
within the training length and disagree past it, which is where ALiBi's extrapolation
is the reason to use it. Two injectors timing one chamber.""", "turbine attention heads=4 rotary alibi")
def alibi_with_other_positions(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if not isinstance(a, ir.Attention) or not a.alibi:
            continue
        other = "rotary positions" if a.rotary_dims else f"{e.feed.position} positions on the feed" if e.feed.position != "none" else None
        if other:
            out.append(_w("W129", f"ALiBi and {other} both tell this attention where tokens are", a.span,
                          "keep one: ALiBi alone (BLOOM, Falcon, MPT: no rotary, position=none), or drop alibi",
                          ["ALiBi's bias is meant to be the only position signal; with a second one the engine learns two that "
                           "disagree past the training length, which is where ALiBi's extrapolation was the point"]))
    return out


# --- W138: attention sinks in an open throat; W139: a clamped SwiGLU clamped under 1 (gpt-oss's options) ---------


@rule("W138", "attention sinks on bidirectional attention", """
`turbine attention sinks` gives each head a learned logit that joins every softmax's
denominator, so a query may attend to nothing (gpt-oss). It answers a causal problem:
a query must spread all of its attention over the keys it sees, and what it has
nowhere to put lands on the first tokens, which every query sees (the attention-sink
effect). A bidirectional query sees every token, itself included; there the sink only
thins what each head reads. A bleed valve on an injector that is never starved.""", "throat open ... turbine attention heads=4 sinks")
def sinks_open(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        a = p.node
        if isinstance(a, ir.Attention) and a.sinks and a.mask == "open":
            out.append(_w("W138", "attention sinks on bidirectional attention", a.span, "drop sinks, or make this attention causal",
                          ["a sink is where a causal query puts the attention it has nowhere to put (gpt-oss; without one it "
                           "lands on the first tokens, which every query sees); a bidirectional query sees every token, "
                           "itself included, and the sink only thins what it reads"]))
    return out


@rule("W139", "clamped SwiGLU clamped under 1", """
`act=swiglu_clamp` (gpt-oss's experts) caps the gate at `clamp` and holds up within
+-clamp before they meet as gate·σ(1.702·gate)·(up + 1). gpt-oss clamps at 7, where
only outliers are cut. Under 1 every hidden unit is bounded by clamp·(clamp + 1), most
units are clamped, and a clamped unit passes no gradient: the reactor hardly reacts.
A pressure limiter set below the working pressure.""", "turbine moe experts=8 act=swiglu_clamp clamp=0.5")
def clamp_under_one(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        m = p.node
        if isinstance(m, (ir.Mlp, ir.Moe)) and m.act == "swiglu_clamp" and m.clamp < 1.0:
            out.append(_w("W139", f"clamp={m.clamp:g} bounds the clamped SwiGLU's gate and up under 1", m.span,
                          "gpt-oss clamps at 7 (swiglu_limit); raise clamp=",
                          [f"every hidden unit then lies under {m.clamp * (m.clamp + 1):g} in size: the reactor barely reacts, and "
                           "the gradient of every clamped unit is 0"]))
    return out


# --- W111: a mixture that routes every token to every expert ----------------------------------


@rule("W111", "mixture of experts with top equal to experts", """
A mixture of experts earns its keep by sparsity: each token visits a few experts,
so the engine holds many experts' parameters but pays for only `top` of them per
token. With `top` equal to `experts` every token runs through every expert: the
compute is that of one mlp `experts` times as wide, the router only reweighs outputs
that were all computed anyway, and the capacity and balance machinery guard against
an imbalance that cannot happen. In engine terms it is a multi-element injector whose
elements are all wide open on every cycle: the plumbing of a throttleable injector
with none of the throttling. Route each token to one or two experts (Switch,
Mixtral), or write one `turbine mlp` if the dense compute is what you want.""",
     "turbine moe experts=4 top=4 capacity=1.25 balance=0.01 hidden=512")
def moe_without_sparsity(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        m = p.node
        if isinstance(m, ir.Moe) and m.top >= m.experts:
            out.append(_w("W111", f"top={m.top} of {_plural(m.experts, 'expert')}: every token visits every expert, so nothing is sparse", m.span,
                          "route each token to a few experts (top=1 or top=2), or use one 'turbine mlp' if the dense compute is meant",
                          [f"each token pays for {_plural(m.experts, 'expert')} of compute, and the router only reweighs outputs that are all computed anyway"]))
    return out


# --- W140: a short conv of one tap ------------------------------------------------------------


@rule("W140", "short conv that mixes no positions", """
A short gated convolution (`turbine short_conv`) of size 1 convolves each channel of
B·x with its own position alone: the layer is C·(w·B·x), a gated unit at each
position, and no position reads another. It is built as written, but the mixer in
that prechamber mixes nothing; LFM2's layers use 3 taps (conv_L_cache). In engine
terms: a pintle injector with no stroke.""",
     "turbine short_conv size=1")
def short_conv_without_mixing(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    out = []
    for p in parts(e):
        c = p.node
        if isinstance(c, ir.ShortConv) and c.size == 1:
            out.append(_w("W140", "a short conv of size 1: each position is convolved with itself alone, so no positions mix", c.span,
                          "size=3 (LFM2's conv_L_cache) or more",
                          ["the layer is C·(w·B·x) at each position: a gated unit, not a mixer"]))
    return out


# --- W112: legal but unwise values -------------------------------------------------------------


@rule("W112", "unwise value", """
A value inside its range (outside it is E0205) that is still unlikely to be meant: a
learning rate of 1 or more, weight decay of 1 or more, dropout of one half or more, an
init std of 1 or more or below 1e-6 (the products of weights underflow), a merge scale above 1 (it heats the branch instead of cooling it),
a gate bias beyond 10 (the gate starts saturated and barely learns), a balance weight of 1
or more. Each is legal; each usually makes a model that diverges or learns nothing.""",
     "startup { schedule constant lr=3 }")
def unwise_values(e: ir.Engine, cfg: ReviewConfig) -> list[Diagnostic]:
    """Values inside their ranges (E0205 guards those) that are still unlikely to be meant."""
    out = []
    st = e.startup
    if st is not None:
        where = st.schedule.span or st.span or e.span
        if st.schedule.lr >= 1:
            out.append(_w("W112", f"a learning rate of {st.schedule.lr:g}: AdamW steps of that size throw the weights far from anything learned", where,
                          "transformers train at 1e-4 to 1e-3 (small models up to about 1e-2)"))
        if st.decay >= 1:
            out.append(_w("W112", f"weight decay {st.decay:g}: each step shrinks every weight by lr x {st.decay:g}, which outpulls the gradient", st.span or e.span,
                          "AdamW's decay is usually 0.01 to 0.1"))
        if st.init.kind == "normal" and st.init.std >= 1:
            out.append(_w("W112", f"init std {st.init.std:g}: weights this large saturate every activation and blow up the chamber's norm at the first stage", st.init.span or st.span or e.span,
                          "transformers start at std 0.02 (or 1/sqrt(width))"))
        if st.init.kind == "normal" and st.init.std < 1e-6:
            out.append(_w("W112", f"init std {st.init.std:g}: weights this small start every matrix at about zero, so the logits hardly depend on the "
                          "input and the products of weights (attention scores, gradients) underflow in fp32", st.init.span or st.span or e.span,
                          "transformers start at std 0.02 (or 1/sqrt(width))"))
    if e.feed.dropout >= 0.5:
        out.append(_w("W112", f"feed dropout {e.feed.dropout:g} drops most of every embedding", e.feed.span, "dropout is usually 0 to 0.3"))
    for p in parts(e):
        node = p.node
        rate = getattr(node, "dropout", None)
        if isinstance(rate, float) and rate >= 0.5 and node is not e.feed:
            out.append(_w("W112", f"dropout {rate:g} at {p.path}: most of the branch's output is thrown away on every training step", node.span,
                          "dropout is usually 0 to 0.3"))
        if isinstance(node, ir.ScaleMerge) and abs(node.value) > 1:
            out.append(_w("W112", f"merge scale={node.value:g} amplifies every branch it returns: the chamber's norm grows by that factor per merge", node.span,
                          "scale below 1 cools a branch; above 1 it heats it"))
        if isinstance(node, ir.GateMerge) and abs(node.bias) > 10:
            out.append(_w("W112", f"gate bias={node.bias:g}: the sigmoid starts saturated at {'1' if node.bias > 0 else '0'}, so the gate learns almost nothing", node.span,
                          "the highway default is -1; keep |bias| below about 5"))
        if isinstance(node, ir.Moe) and node.balance >= 1:
            out.append(_w("W112", f"balance={node.balance:g}: the load-balancing loss outweighs the language-modelling loss", node.span,
                          "the Switch Transformer uses 0.01"))
        if isinstance(node, ir.Moe) and node.correction_rate >= 0.1:
            out.append(_w("W112", f"correction_rate={node.correction_rate:g}: each step moves the selection bias by that much, and "
                          f"{node.router} scores lie in (0, 1): the choice follows the trim, not the router", node.span,
                          "DeepSeek-V3 uses 0.001"))
    return out
