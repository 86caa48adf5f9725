"""The spec an Arch implies: `spec_text`, each family's writer chosen by its record's type."""

from __future__ import annotations

from .. import lineage
from . import conv as _conv
from . import delta as _delta
from . import afmoe as _afmoe
from . import gemma4 as _gemma4
from . import laguna as _laguna
from . import hybrid as _hybrid
from .bamba import HybridFamily, _hybrid_text
from .core import Arch, _comment, _header, _layer_runs, _num, _scaling_text
from .dense import _attn_templates
from .latent import DeepseekV2Family, LatentDenseFamily, _deepseek_v2_text, _latent_dense_text
from .ssm import JambaFamily, Mamba2, MambaFamily, _jamba_text, _mamba2_text, _mamba_text


def spec_text(a: Arch, source: str = "config.json") -> str:
    """A formatted, commented spec that builds to the architecture `a` describes."""
    if isinstance(a, _delta.DeltaHybrid):
        return _delta.spec_text(a, source)
    if isinstance(a, _gemma4.Gemma4):
        return a.spec_text(source)
    if isinstance(a, (_afmoe.Afmoe, _laguna.Laguna)):
        return a.spec_text(source)
    if isinstance(a, Mamba2):
        return _mamba2_text(a, source)
    if isinstance(a, lineage.Gpt):
        return lineage.spec_text(a, source)
    if isinstance(a, LatentDenseFamily):
        return _latent_dense_text(a, source)
    if isinstance(a, HybridFamily):
        return _hybrid_text(a, source)
    if isinstance(a, _conv.ConvFamily):
        return _conv.spec_text(a, source)
    if isinstance(a, _hybrid.ParallelHybrid):
        return _hybrid.spec_text(a, source)
    if isinstance(a, _hybrid.SingleMixerHybrid):
        return _hybrid.single_mixer_text(a, source)
    if isinstance(a, (MambaFamily, JambaFamily, DeepseekV2Family)):
        return {MambaFamily: _mamba_text, JambaFamily: _jamba_text, DeepseekV2Family: _deepseek_v2_text}[type(a)](a, source)
    src = a.sources
    att = [f"heads={a.heads}"]
    keys = ["heads"]
    if a.kv_heads != a.heads:
        att.append(f"kv_heads={a.kv_heads}")
        keys.append("kv_heads")
    if a.head_dim * a.heads != a.width:
        att.append(f"head_dim={a.head_dim}")
    if a.rotary:
        att.append("rotary" if a.rotary == 1.0 else f"rotary={_num(a.rotary)}")
        if a.rotary_interleaved:
            att.append("rotary_interleaved")
        if a.rotary_base != 10000.0:
            att.append(f"rotary_base={_num(a.rotary_base)}")
            keys.append("rotary_base")
        if a.rotary_scaling is not None:
            att.append(_scaling_text(a.rotary_scaling).strip())
            src["rotary_scaling"] = "rope_parameters"
            keys.append("rotary_scaling")
    if a.alibi:
        att.append("alibi alibi_scaled" if a.alibi_scaled else "alibi")  # Falcon's bias is scaled with the logits, BLOOM's is not
        keys.append("alibi")
        src["alibi"] = "alibi"
    if a.window is not None:
        att.append(f"window={a.window}")
        keys.append("window")
    if a.softcap is not None:
        att.append(f"softcap={_num(float(a.softcap))}")
        keys.append("softcap")
    if a.sinks:  # gpt-oss's learned sink per head
        att.append("sinks")
        keys.append("sinks")
    if a.qk_norm != "none":
        att.append("qk_norm" + (" qk_norm_across" if a.qk_norm == "all" else "") + (f" qk_norm_eps={_num(a.qk_eps)}" if a.qk_eps != 1e-6 else "")
                   + _qk_shape_text(a))
    if a.attn_scale is not None:
        att.append(f"scale={_num(a.attn_scale)}")
        keys.append("attn_scale")
    att.append(f"bias={_num(a.qkv_bias)}")
    if a.out_bias != a.qkv_bias:
        att.append(f"out_bias={_num(a.out_bias)}")
    norm = f"norm {a.norm}" + (f" eps={_num(a.eps)}" if a.eps != (1e-5 if a.norm == "layernorm" else 1e-6) else "")
    if not a.norm_affine:
        norm += " affine=false"
    elif a.norm == "layernorm" and not a.norm_bias:
        norm += " bias=false"
    if a.norm_offset:
        norm += f" offset={_num(a.norm_offset)}"
    if a.experts:
        work = f"turbine moe experts={a.experts} top={a.top} hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}"
        if not a.normalize:
            work += " normalize=false"
        if a.shared:
            work += f" shared={a.shared}" + (" shared_gate" if a.shared_gate else "")
        work += _router_words(a)
        wkeys = ("experts", "top", "hidden", "act", "router")
    else:
        work = f"turbine mlp hidden={a.hidden} act={a.act} bias={_num(a.mlp_bias)}"
        wkeys = ("hidden", "act")
    merge = [f"    merge scale={_num(a.residual_scale)}{_comment(src, 'residual_scale')}"] if a.residual_scale != 1.0 else []

    def branch(name: str, turbine: str, tkeys, pad: str = "") -> list[str]:
        t = f"{pad}    {turbine}{_comment(src, *tkeys)}"
        n = f"{pad}    {norm}{_comment(src, 'eps') if name == 'mix' else ''}"
        ops = [t] if a.parallel == "shared" else [n, t, f"{pad}    {norm}"] if a.sandwich else [t, n] if a.post_norms else [n, t]
        return [f"{pad}  prechamber {name} {{", *ops, *[pad + m for m in merge], f"{pad}  }}"]

    def parallel(words, akeys=keys) -> list[str]:  # a parallel block of attention (these words) and the MLP
        shared = [f"    {norm}  # one norm for both branches ({src.get('eps')})"] if a.parallel == "shared" else []
        return ["  fullflow {  # attention and MLP read the same state: x + attn(.) + mlp(.)", *shared,
                *branch("mix", "turbine attention " + " ".join(words), akeys, "  "), *branch("burn", work, wkeys, "  "), "  }"]

    def mk(words) -> list[str]:  # one layer's ops, its attention said by these words
        if a.parallel != "none":
            return parallel(words)
        return [*branch("mix", "turbine attention " + " ".join(words), keys), *branch("burn", work, wkeys)]

    layer = mk(att)

    normed = "before and after" if a.sandwich else "after" if a.post_norms else "in front"
    where = "attention and the MLP in parallel" if a.parallel != "none" else f"each turbine with its norm {normed}"
    block = f"{a.family}_block"
    one = "attention and the MLP in parallel" if a.parallel != "none" else f"attention then the MLP, each with its norm {normed}"
    blocks = [(f"# one {a.family} layer: {one} (the layers repeat it)", block, layer)]
    body = [f"  stage {block} x depth"]
    if a.layer_windows:  # a per-layer pattern of windows: one template per kind of layer, the layers in order
        att_global = [x for x in att if not x.startswith("window=")]
        local = next(w for w in a.layer_windows if w is not None)
        att_local = att_global[:1] + [f"window={local}"] + att_global[1:]
        if a.local_rotary:  # Gemma 3: the sliding layers turn by their own base (rope_local_base_freq)
            att_local = _local_rotary_words(att_local, *a.local_rotary)
        blocks = [(f"# a {a.family} layer with sliding-window attention ({local} tokens), {where}", f"{a.family}_local", mk(att_local)),
                  (f"# a {a.family} layer with global attention", f"{a.family}_global", mk(att_global))]
        body = _layer_runs(a.family, ["local" if w is not None else "global" for w in a.layer_windows])
    if a.layer_attn:  # rotary differs by layer (NoPE layers, a rope per layer type): one template per kind of attention
        blocks, kinds = _attn_templates(a, att, mk, where)
        body = _layer_runs(a.family, kinds)
    if a.layer_dense:  # Qwen2-MoE's dense layers among the MoE ones (mlp_only_layers, decoder_sparse_step)
        dense = f"turbine mlp hidden={a.dense_hidden} act={a.act} bias={_num(a.mlp_bias)}"
        mk = lambda w, k: [*branch("mix", "turbine attention " + " ".join(att), keys), *branch("burn", w, k)]
        blocks = [(f"# a {a.family} layer with routed experts, {where}", f"{a.family}_moe", mk(work, wkeys)),
                  (f"# a dense {a.family} layer (mlp_only_layers, decoder_sparse_step): a gated MLP of intermediate_size", f"{a.family}_dense",
                   mk(dense, ()))]
        body = _layer_runs(a.family, ["dense" if d else "moe" for d in a.layer_dense])
        if a.layer_attn:  # both patterns (EXAONE-MoE): each kind of attention, with routed experts or a dense MLP
            blocks, kinds = [], []
            for tag, r, rk in (("moe", work, wkeys), ("dense", dense, ())):
                bl, kinds = _attn_templates(a, att, lambda w, r=r, rk=rk: [*branch("mix", "turbine attention " + " ".join(w), keys),
                                                                           *branch("burn", r, rk)], where)
                blocks += [(f"{c}, {'routed experts' if tag == 'moe' else 'a dense MLP'}", f"{n}_{tag}", ops) for c, n, ops in bl]
            kinds = [f"{k}_{'dense' if d else 'moe'}" for k, d in zip(kinds, a.layer_dense)]
            blocks = [b for b in blocks if b[1][len(a.family) + 1:] in kinds]
            body = _layer_runs(a.family, kinds)
    feed = f"feed tokens vocab={a.vocab} context={a.context} position={a.position}"
    if a.embed_scale != 1.0:
        feed += " scale=sqrt(width)" if a.family in ("gemma", "gemma2", "gemma3_text") else f" scale={_num(a.embed_scale)}"
    if a.padding is not None:
        feed += f" padding={a.padding}"
        src["padding"] = "pad_token_id"
    nozzle = "nozzle head" + (" tied" if a.tied else "") + (f" scale={_num(a.logit_scale)}" if a.logit_scale != 1.0 else "")
    nozzle += f" softcap={_num(float(a.logit_softcap))}" if a.logit_softcap is not None else ""
    nozzle += " bias=true" if a.head_bias else ""
    lines = [*_header(a.family, source),
             *([] if a.layer_windows or a.layer_dense or a.layer_attn else [f"let depth = {a.layers}  # {src.get('layers', 'layers')}"]),  # a pattern counts its own layers
             f"let d_model = {a.width}  # {src.get('width', 'width')}",
             "",
             *[ln for comment, name, ops in blocks for ln in (comment, f"stage {name} {{", *ops, "}", "")],
             f"engine {a.family} {{",
             "  chamber width=d_model",
             "  throat causal",
             f"  {feed}{_comment(src, 'vocab', 'context', 'embed_scale', 'padding')}",
             "",
             *([f"  {norm}  # " + ("the final norm, applied to the embedding too" if a.family == "nanochat"
                                   else "word_embeddings_layernorm: BLOOM's norm after the embedding"), ""] if a.embed_norm else []),
             *body,
             "",
             f"  {norm}  # the final norm",
             f"  {nozzle}{_comment(src, 'tied', 'logit_scale', 'logit_softcap')}",
             "}",
             ""]
    return "\n".join(lines)


def _router_words(a: Arch) -> str:
    """DeepSeek-V3's router options of a moe turbine (families/routed_v3.py), where they differ from Mixtral's."""
    words = f" router={a.router}" if a.router != "softmax" else ""
    if a.groups > 1:
        words += f" groups={a.groups} top_groups={a.top_groups}"
    if a.route_scale != 1.0:
        words += f" scale={_num(a.route_scale)}"
    words += " router_bias" if a.router_bias else ""  # gpt-oss's biased router and clamped experts
    words += f" clamp={_num(a.clamp)}" if a.act == "swiglu_clamp" else ""
    return words + (" correction=true" if a.correction else "")


def _qk_shape_text(a: Arch) -> str:
    """The attention options that shape its qk-norms (Persimmon's layernorm, Gemma 3's 1 + w, nanochat's weightless, after rotary)."""
    return "".join(w for w, on in ((" qk_norm_type=layernorm", a.qk_type == "layernorm"), (" qk_norm_bias", a.qk_bias),
                                   (f" qk_norm_offset={_num(a.qk_offset)}", a.qk_offset), (" qk_norm_affine=false", not a.qk_affine),
                                   (" qk_norm_after_rotary", a.qk_late), (" qk_norm_head_gains", a.qk_heads)) if on)


def _local_rotary_words(att: list, base: float, scaling) -> list:
    """An attention's words with its rotary base and scaling replaced by the sliding layers' own."""
    out = [w for w in att if not w.startswith(("rotary_base=", "rotary_scaling="))]
    at = out.index("rotary") + 1
    own = ([f"rotary_base={_num(base)}"] if base != 10000.0 else []) + ([_scaling_text(scaling).strip()] if scaling is not None else [])
    return out[:at] + own + out[at:]
