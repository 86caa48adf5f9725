"""Mamba-2, Mamba-1, Falcon-Mamba and Jamba: the state-space families' records, readers, spec
text, config parts and weight plans."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ... import ir
from ..closed import Config, Keys, Unsupported
from ..mapping import _Cat, _Plan, _parent, _put_experts, _put_gated
from .core import KEYS, _comment, _divides, _engine_lines, _eps, _header, _kv, _num, _padding

# --- Mamba-2: a stack of ssm mixers, each with an RMSNorm in front ---------------------------


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 checkpoint (Mamba2ForCausalLM), in the language's terms: each layer is
    one `turbine ssm` with an RMSNorm in front. Import and loading only (export: not yet)."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    head_dim: int
    state: int
    groups: int
    conv: int
    chunk: int
    bias: bool
    conv_bias: bool
    eps: float
    dt_min: float
    dt_max: float
    dt_lo: float
    dt_hi: float | None  # None: no upper limit
    tied: bool
    sources: dict = field(default_factory=dict, compare=False)


def _mamba2_text(a: Mamba2, source: str) -> str:
    src = a.sources
    ssm = (f"turbine ssm heads={a.heads} head_dim={a.head_dim} state={a.state} groups={a.groups} conv={a.conv} chunk={a.chunk} "
           f"bias={_num(a.bias)} conv_bias={_num(a.conv_bias)} eps={_num(a.eps)} dt_min={_num(a.dt_min)} dt_max={_num(a.dt_max)}")
    if a.dt_lo:
        ssm += f" dt_lo={_num(a.dt_lo)}"
    if a.dt_hi is not None:
        ssm += f" dt_hi={_num(a.dt_hi)}"
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    return "\n".join([
        *_header(a.family, source),
        f"let depth = {a.layers}  # {src['layers']}",
        f"let d_model = {a.width}  # {src['width']}",
        "",
        "# one mamba2 layer: the ssm mixer with its RMSNorm in front (the layers repeat it)",
        "stage mamba2_block {",
        "  prechamber mix {",
        f"    {norm}{_comment(src, 'eps')}",
        f"    {ssm}{_comment(src, 'heads', 'state', 'groups', 'conv', 'chunk', 'dt')}",
        "  }",
        "}",
        "",
        *_engine_lines(a, src, f"feed tokens vocab={a.vocab} context={a.context} position=none{_comment(src, 'vocab')}",
                       ["  stage mamba2_block x depth"], norm)])


# --- Mamba-1, Jamba and DeepSeek-V2: the expander families ------------------------------------


@dataclass(frozen=True)
class Mamba1Mixer:
    """The numbers of one Mamba-1 mixer (`turbine ssm version=1`), as a config gives them."""

    inner: int
    state: int
    dt_rank: int
    conv: int
    bias: bool
    conv_bias: bool
    norms: bool  # Jamba's dt/B/C RMSNorms
    eps: float  # their eps
    dt_min: float = 0.001
    dt_max: float = 0.1
    affine: bool = True  # false: the norms have no weight (Falcon-Mamba's)

    def text(self, width: int) -> str:
        expand = self.inner / width
        t = (f"turbine ssm version=1 state={self.state} expand={_num(expand)} dt_rank={self.dt_rank} conv={self.conv} "
             f"bias={_num(self.bias)} conv_bias={_num(self.conv_bias)}")
        if self.norms:
            t += f" norms eps={_num(self.eps)}" + ("" if self.affine else " norms_affine=false")
        if (self.dt_min, self.dt_max) != (0.001, 0.1):
            t += f" dt_min={_num(self.dt_min)} dt_max={_num(self.dt_max)}"
        return t


@dataclass(frozen=True)
class MambaFamily:
    """A Mamba-1 checkpoint (MambaForCausalLM): each layer one `turbine ssm version=1` with an RMSNorm in front."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    mixer: Mamba1Mixer
    eps: float
    tied: bool
    sources: dict = field(default_factory=dict, compare=False)


def _mamba_text(a: MambaFamily, source: str) -> str:
    src = a.sources
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    return "\n".join([
        *_header(a.family, source),
        f"let depth = {a.layers}  # {src['layers']}",
        f"let d_model = {a.width}  # {src['width']}",
        "",
        "# one mamba layer: the Mamba-1 mixer with its RMSNorm in front, no MLP (the layers repeat it)",
        "stage mamba_block {",
        "  prechamber mix {",
        f"    {norm}{_comment(src, 'eps')}",
        f"    {a.mixer.text(a.width)}{_comment(src, 'mixer')}",
        "  }",
        "}",
        "",
        *_engine_lines(a, src, f"feed tokens vocab={a.vocab} context={a.context} position=none{_comment(src, 'vocab')}",
                       ["  stage mamba_block x depth"], norm)])


@dataclass(frozen=True)
class JambaFamily:
    """A Jamba checkpoint (JambaForCausalLM): layer i mixes with attention where i % attn_layer_period ==
    attn_layer_offset and with a Mamba-1 mixer (with its dt/B/C norms) elsewhere; its MLP is routed
    experts where i % expert_layer_period == expert_layer_offset, a dense swiglu MLP elsewhere."""

    family: str
    vocab: int
    context: int
    width: int
    pattern: tuple  # per layer (mixer, reactor): ("attention" | "mamba", "mlp" | "moe")
    heads: int
    kv_heads: int
    hidden: int
    experts: int
    top: int
    mixer: Mamba1Mixer
    eps: float
    tied: bool
    padding: int | None
    sources: dict = field(default_factory=dict, compare=False)


def _fold(pattern, first: int, pad: str) -> list[str]:
    """Stage lines for consecutive layers pattern[0:], numbered from `first`: a run of one
    layer kind is one stage `x N`; a run of two kinds in turn (MLP, experts) a nested stage."""
    out, i = [], 0
    while i < len(pattern):
        run = 1
        while i + run < len(pattern) and pattern[i + run] == pattern[i]:
            run += 1
        pairs = 0
        while i + 2 * pairs + 1 < len(pattern) and pattern[i + 2 * pairs : i + 2 * pairs + 2] == pattern[i : i + 2] and pattern[i] != pattern[i + 1]:
            pairs += 1
        lo = first + i
        if pairs >= 2 and 2 * pairs > run:
            (m1, r1), (m2, r2) = pattern[i], pattern[i + 1]
            out += [f"{pad}stage layers{lo}_{lo + 2 * pairs - 1} x {pairs} {{  # {m1} + {r1}, then {m2} + {r2}",
                    f"{pad}  stage first = {m1}_{r1}", f"{pad}  stage second = {m2}_{r2}", f"{pad}}}"]
            i += 2 * pairs
            continue
        name = f"layer{lo}" if run == 1 else f"layers{lo}_{lo + run - 1}"
        out.append(f"{pad}stage {name} = {pattern[i][0]}_{pattern[i][1]}" + (f" x {run}" if run > 1 else ""))
        i += run
    return out


def _jamba_body(a: "JambaFamily") -> list[str]:
    """The engine's stages: a nested stage of the pattern's period (the two periods' lcm) repeated,
    then the layers left over; each period's layers folded (`_fold`)."""
    L = len(a.pattern)
    period = next((p for p in range(1, L // 2 + 1) if all(a.pattern[i] == a.pattern[i % p] for i in range(L))), L)
    blocks = L // period
    if blocks < 2 or period == 1:
        return _fold(a.pattern, 0, "  ")
    lines = [f"  stage jamba_block x {blocks} {{  # layers 0-{blocks * period - 1}: {period} layers, {blocks} times",
             *_fold(a.pattern[:period], 0, "    "), "  }"]
    return lines + _fold(a.pattern[blocks * period:], blocks * period, "  ")


def _jamba_text(a: JambaFamily, source: str) -> str:
    src = a.sources
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    kv = f" kv_heads={a.kv_heads}" if a.kv_heads != a.heads else ""
    mixers = {"attention": f"turbine attention heads={a.heads}{kv} bias=false  # no positions: the Mamba layers carry them",
              "mamba": f"{a.mixer.text(a.width)}{_comment(src, 'mixer')}"}
    reactors = {"mlp": f"turbine mlp hidden={a.hidden} act=swiglu bias=false{_comment(src, 'hidden')}",
                "moe": f"turbine moe experts={a.experts} top={a.top} hidden={a.hidden} act=swiglu bias=false normalize=false"
                       f"  # {src['experts']}; the top-k weights are not renormalised"}
    templates: list[str] = []
    for m, r in dict.fromkeys(a.pattern):
        templates += [f"stage {m}_{r} {{", "  prechamber mix {", f"    {norm}", f"    {mixers[m]}", "  }",
                      "  prechamber burn {", f"    {norm}", f"    {reactors[r]}", "  }", "}", ""]
    body = _jamba_body(a)
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    return "\n".join([
        *_header(a.family, source),
        f"let d_model = {a.width}  # {src['width']}",
        "",
        f"# the {len(a.pattern)} layers ({src['layers']}) follow {src['pattern']}: each a mixer (attention or",
        "# Mamba-1 with its dt/B/C norms), then an MLP or routed experts, each with its RMSNorm in front",
        *templates,
        *_engine_lines(a, src, f"{feed}{_comment(src, 'vocab', 'padding')}", body, norm)])


_SSM_INIT = "the initialisation of dt's bias and of the output projections; an import loads every weight"
_SSM_PATH = "which implementation (CUDA kernels, mambapy, an associative scan) computes the mixer: the same function"
_FP32 = "keeps the residual in float32 under half precision: the same function in float32"
KEYS["mamba2"] = Keys(frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "state_size", "expand", "conv_kernel",
                                 "n_groups", "use_bias", "use_conv_bias", "hidden_act", "layer_norm_epsilon", "chunk_size", "time_step_min",
                                 "time_step_max", "time_step_limit", "tie_word_embeddings", "max_position_embeddings",
                                 "rescale_prenorm_residual"}),
                      {"time_step_floor": _SSM_INIT, "time_step_rank": "Mamba-2's step size is one per head: the forward does not read a rank", "residual_in_fp32": _FP32,
                       "pad_token_id": "Mamba-2's embedding has no padding row: the forward does not read it",
                       "rms_norm": "transformers 5's Mamba-2 always gates its RMSNorm; the older key is not read"})


def _rescaled(c: Config) -> None:
    if c["rescale_prenorm_residual"]:
        raise Unsupported("rescale_prenorm_residual", "transformers divides the loaded out_proj weights by sqrt(num_hidden_layers) when "
                          "this is set (its init runs on loaded weights): what the checkpoint computes depends on the transformers release")


def _mamba2(c: Config) -> Mamba2:
    _rescaled(c)
    width, heads, head_dim = c["hidden_size"], c["num_heads"], c["head_dim"]
    if c["hidden_act"] not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the ssm's conv and gate use silu; {c['hidden_act']!r} has no counterpart")
    if heads * head_dim != int(c["expand"] * width):
        raise Unsupported("head_dim", f"num_heads x head_dim = {heads * head_dim}, but expand x hidden_size = {int(c['expand'] * width)}: "
                          "transformers' mixer assumes they agree")
    if heads % c["n_groups"]:
        raise Unsupported("n_groups", f"{c['n_groups']} groups do not divide {heads} heads")
    limit = c["time_step_limit"]
    if not isinstance(limit, list) or len(limit) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in limit) \
            or not 0 <= limit[0] < limit[1]:
        raise Unsupported("time_step_limit", f"{limit!r} is not a range [low, high] of step sizes (high may be Infinity)")
    lo, hi = float(limit[0]), float(limit[1])
    src = {"layers": "num_hidden_layers", "width": "hidden_size", "vocab": "vocab_size", "heads": "num_heads", "state": "state_size",
           "groups": "n_groups", "conv": "conv_kernel", "chunk": "chunk_size", "eps": "layer_norm_epsilon", "dt": "time_step_limit",
           "tied": "tie_word_embeddings"}
    # Mamba2ForCausalLM has no position table and no context limit: max_position_embeddings, where a config writes
    # one, or 2048 is only the feed's (a decoding cache's) length
    return Mamba2("mamba2", c["vocab_size"], c["max_position_embeddings"] or 2048, width, c["num_hidden_layers"], heads, head_dim,
                  c["state_size"], c["n_groups"], c["conv_kernel"], c["chunk_size"], bool(c["use_bias"]),
                  bool(c["use_conv_bias"]), _eps(c, "layer_norm_epsilon"), float(c["time_step_min"]),
                  float(c["time_step_max"]), lo, None if math.isinf(hi) else hi, bool(c["tie_word_embeddings"]), src)


def _mamba1_mixer(c: Config, width: int, keys: dict, norms: bool = False, eps: float = 1e-6) -> Mamba1Mixer:
    """keys: the mixer's config field names (state, expand, conv, dt_rank, bias, conv_bias)."""
    act = c["hidden_act"]
    if act not in ("silu", "swish"):
        raise Unsupported("hidden_act", f"the Mamba-1 mixer's conv and gate use silu; {act!r} has no counterpart")
    expand = c[keys["expand"]]
    inner = int(expand * width)
    if inner != expand * width or inner < 1:
        raise Unsupported(keys["expand"], f"{expand} x hidden_size {width} is not a whole width")
    rank = c[keys["dt_rank"]]
    if rank == "auto":
        rank = -(-width // 16)
    elif not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise Unsupported(keys["dt_rank"], f"{rank!r}: dt's rank is a whole number or \"auto\"")
    dt = (float(c["time_step_min"]), float(c["time_step_max"])) if "time_step_min" in c.keys.maps else (0.001, 0.1)
    return Mamba1Mixer(inner, c[keys["state"]], rank, c[keys["conv"]], bool(c[keys["bias"]]), bool(c[keys["conv_bias"]]), norms, float(eps), *dt)


KEYS["mamba"] = Keys(frozenset({"vocab_size", "hidden_size", "state_size", "num_hidden_layers", "layer_norm_epsilon", "expand", "conv_kernel",
                                "use_bias", "use_conv_bias", "hidden_act", "time_step_rank", "tie_word_embeddings", "time_step_min",
                                "time_step_max", "intermediate_size", "max_position_embeddings", "rescale_prenorm_residual"}),
                     {"time_step_floor": _SSM_INIT, "time_step_scale": _SSM_INIT, "time_step_init_scheme": _SSM_INIT,
                      "residual_in_fp32": _FP32, "use_mambapy": _SSM_PATH,
                      "use_associative_scan": _SSM_PATH, "pad_token_id": "Mamba's embedding has no padding row: the forward does not read it"})


def _mamba(c: Config) -> MambaFamily:
    _rescaled(c)
    width = c["hidden_size"]
    mixer = _mamba1_mixer(c, width, {"state": "state_size", "expand": "expand", "conv": "conv_kernel", "dt_rank": "time_step_rank",
                                     "bias": "use_bias", "conv_bias": "use_conv_bias"})
    if c.given("intermediate_size") and c["intermediate_size"] != mixer.inner:  # transformers sets it after deriving it: the file's wins
        raise Unsupported("intermediate_size", f"{c['intermediate_size']}, not expand x hidden_size = {mixer.inner}: the mixer's width "
                          "and its expand disagree")
    src = {"layers": "num_hidden_layers", "width": "hidden_size", "vocab": "vocab_size", "mixer": "state_size, expand, time_step_rank, conv_kernel",
           "eps": "layer_norm_epsilon", "tied": "tie_word_embeddings"}
    # MambaForCausalLM has no position table and no context limit; 2048 is the feed's (a decoding cache's) length
    return MambaFamily("mamba", c["vocab_size"], c["max_position_embeddings"] or 2048, width, c["num_hidden_layers"], mixer,
                       _eps(c, "layer_norm_epsilon"), bool(c["tie_word_embeddings"]), src)


KEYS["falcon_mamba"] = Keys(KEYS["mamba"].maps | {"mixer_rms_eps"},
                            {**KEYS["mamba"].inert, "use_falcon_mambapy": "the older name of use_mambapy: " + _SSM_PATH})


def _falcon_mamba(c: Config) -> MambaFamily:
    """Falcon-Mamba: Mamba-1 with RMSNorms without a weight on dt, B and C (their eps mixer_rms_eps)."""
    from dataclasses import replace

    a = _mamba(c)
    mixer = replace(a.mixer, norms=True, eps=_eps(c, "mixer_rms_eps"), affine=False)
    return replace(a, family="falcon_mamba", mixer=mixer,
                   sources={**a.sources, "mixer": a.sources["mixer"] + "; mixer_rms_eps: the dt/B/C norms' eps (no weight)"})


KEYS["jamba"] = Keys(frozenset({"vocab_size", "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps", "max_position_embeddings",
                                "num_experts_per_tok", "num_experts", "expert_layer_period", "expert_layer_offset", "attn_layer_period",
                                "attn_layer_offset", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank", "mamba_conv_bias",
                                "mamba_proj_bias", "pad_token_id"}),
                     {"use_mamba_kernels": _SSM_PATH, "use_mambapy": _SSM_PATH, "use_associative_scan": _SSM_PATH})


def _jamba(c: Config) -> JambaFamily:
    width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    _divides(width, heads, "num_attention_heads", "hidden_size")
    eps = _eps(c, "rms_norm_eps")
    mixer = _mamba1_mixer(c, width, {"state": "mamba_d_state", "expand": "mamba_expand", "conv": "mamba_d_conv", "dt_rank": "mamba_dt_rank",
                                     "bias": "mamba_proj_bias", "conv_bias": "mamba_conv_bias"}, norms=True, eps=eps)
    ap, ao, ep, eo = (c[k] for k in ("attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset"))
    for k, v in (("attn_layer_offset", ao), ("expert_layer_offset", eo)):
        if not isinstance(v, int) or v < 0:
            raise Unsupported(k, f"{v!r}: an offset is a whole number from 0")
    experts = c["num_experts"]
    pattern = tuple(("attention" if i % ap == ao else "mamba", "moe" if i % ep == eo and experts > 1 else "mlp") for i in range(layers))
    top = c["num_experts_per_tok"]
    if any(r == "moe" for _, r in pattern) and top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    src = {"vocab": "vocab_size", "width": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
           "kv_heads": "num_key_value_heads", "hidden": "intermediate_size", "experts": "num_experts, num_experts_per_tok",
           "eps": "rms_norm_eps", "mixer": "mamba_d_state, mamba_expand, mamba_dt_rank, mamba_d_conv", "tied": "tie_word_embeddings",
           "pattern": "attn_layer_period/offset, expert_layer_period/offset", "padding": "pad_token_id"}
    return JambaFamily("jamba", c["vocab_size"], c["max_position_embeddings"], width, pattern, heads, _kv(c, heads), c["intermediate_size"],
                       experts, top, mixer, eps, bool(c["tie_word_embeddings"]), _padding(c), src)


def _period(hits: list[int], layers: int, what: str) -> tuple[int, int]:
    """(period, offset) with i % period == offset exactly at `hits` among range(layers); Unsupported otherwise."""
    if not hits:
        return layers + 1, layers  # never
    if len(hits) == 1:
        return max(layers, hits[0] + 1), hits[0]
    period = hits[1] - hits[0]
    if period < 1 or hits[0] >= period or hits != list(range(hits[0], layers, period)):
        raise Unsupported(what, f"layers {hits} are not every k-th layer from an offset below k, which is all Jamba's config can say")
    return period, hits[0]


def _mamba1_config(s: ir.Mamba1, width: int, prefix: str) -> dict:
    if s.inner % width:
        raise Unsupported("expand", f"the config says expand as a whole number; the inner width {s.inner} is not a multiple of {width}")
    if prefix:  # Jamba's names
        return {"mamba_d_state": s.state, "mamba_d_conv": s.conv, "mamba_expand": s.inner // width, "mamba_dt_rank": s.dt_rank,
                "mamba_conv_bias": s.conv_bias, "mamba_proj_bias": s.bias}
    return {"state_size": s.state, "conv_kernel": s.conv, "expand": s.inner // width, "time_step_rank": s.dt_rank, "use_bias": s.bias,
            "use_conv_bias": s.conv_bias, "hidden_act": "silu", "time_step_min": s.dt_min, "time_step_max": s.dt_max}


MAMBA2_MIXER = ("in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "out_proj.weight", "out_proj.bias")


def _plan_mamba2(plan: _Plan, put, layout: dict, final: str) -> _Plan:
    """Mamba-2: layer i is stage i's ssm (its names are transformers' own) and the valve before it."""
    for i, st in sorted(layout.items()):
        if st.ssm is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no ssm turbine; transformers' mamba2 layer {i} has one"
            continue
        h = f"layers.{i}."
        put(f"{st.valves.get(st.ssm, _parent(st.ssm) + 'norm')}.weight", h + "norm.weight")
        for name in MAMBA2_MIXER:  # biases only where the config has use_bias / use_conv_bias
            put(f"{st.ssm}.{name}", h + "mixer." + name)
        put(f"{st.ssm}.norm", h + "mixer.norm.weight")  # the gated RMSNorm's gain
    put("feed.tok.weight", "embeddings.weight")
    put(f"{final}.weight", "norm_f.weight")
    put("head.weight", "lm_head.weight")
    return plan


MAMBA1_MIXER = ("in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "x_proj.weight", "A_log", "D", "out_proj.weight",
                "out_proj.bias", "dt_layernorm.weight", "b_layernorm.weight", "c_layernorm.weight")


def _put_mamba1(put, ours: str, theirs: str) -> None:
    """A Mamba-1 mixer: transformers' names, but dt_proj's weight and bias are dt_weight and dt_bias."""
    for name in MAMBA1_MIXER:  # biases and Jamba's norms only where the spec (and the config) has them
        put(f"{ours}.{name}", theirs + name)
    put(f"{ours}.dt_weight", theirs + "dt_proj.weight")
    put(f"{ours}.dt_bias", theirs + "dt_proj.bias")


def _plan_mamba(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Mamba-1: layer i is stage i's ssm (version=1) and the valve before it."""
    for i, st in sorted(layout.items()):
        if st.mamba1 is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no ssm turbine (version=1); transformers' mamba layer {i} has one"
            continue
        put(f"{st.valves.get(st.mamba1, _parent(st.mamba1) + 'norm')}.weight", f"layers.{i}.norm.weight")
        _put_mamba1(put, st.mamba1, f"layers.{i}.mixer.")
    put("feed.tok.weight", "embeddings.weight")
    put(f"{final}.weight", "norm_f.weight")
    put("head.weight", "lm_head.weight")
    return plan


def _plan_jamba(plan: _Plan, put, layout: dict, final: str, state, fused) -> _Plan:
    """Jamba: layer i is stage i: attention (q, k, v, o) or a Mamba-1 mixer, then an MLP or routed experts, each with its valve."""
    for i, st in sorted(layout.items()):
        h = f"layers.{i}."
        mixer = st.attn or st.mamba1
        reactor = st.moe or st.mlp
        if mixer is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or ssm (version=1) mixer, or an mlp or moe; transformers' jamba layer {i} has both"
            continue
        put(f"{st.valves.get(mixer, _parent(mixer) + 'norm')}.weight", h + "input_layernorm.weight")
        put(f"{st.valves.get(reactor, _parent(reactor) + 'norm')}.weight", h + "pre_ff_layernorm.weight")
        if st.attn is not None:
            a = st.attn_node
            put(f"{st.attn}.qkv.weight", [h + f"self_attn.{n}_proj.weight" for n in "qkv"],
                _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim)))
            put(f"{st.attn}.proj.weight", h + "self_attn.o_proj.weight")
        else:
            _put_mamba1(put, st.mamba1, h + "mamba.")
        if st.moe is not None:
            put(f"{st.moe}.router.weight", h + "feed_forward.router.weight")
            _put_experts(put, st.moe, h + "feed_forward.", st.work_node, state, fused)
        else:
            _put_gated(put, st.mlp, h + "feed_forward.", st.work_node.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "final_layernorm.weight")
    put("head.weight", "lm_head.weight")
    return plan
