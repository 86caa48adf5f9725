"""The config an engine implies (export): `arch_of` and `config_of` for the decoders an `Arch` records,
`expander_config` for the engines with an ssm, latent attention, short convs or DeltaNet layers."""

from __future__ import annotations

from ... import ir
from ...ir.kinds import is_gated
from ..closed import Unsupported
from . import conv as _conv
from . import delta as _delta
from . import afmoe as _afmoe
from . import gemma4 as _gemma4
from . import laguna as _laguna
from . import hybrid as _hybrid
from . import parallel as _parallel
from . import routed_v3 as _routed_v3
from . import sinks as _sinks
from .bamba import _hybrid_config
from .core import CAUSAL_LM, _HF_PLAIN, _PER_LAYER, Arch, _dump, _ops, _reactor, _run_order, _window
from .dense import _DENSE_H2, _dense_h2_config, _layer_attn
from .latent import _latent_dense_config, _shared_experts, _v3_named
from .llama import _decoder_config
from .plain import _PLAIN, _persimmon_config, _plain_config
from .ssm import _mamba1_config, _period

# --- the config an engine implies (export) ----------------------------------------------------


def _branch_shape(b: ir.Prechamber, want) -> tuple[ir.Norm, object, bool]:
    """(norm, turbine, post) of a family's branch: a norm then its turbine, or (OLMo-2) the reverse."""
    ops = b.ops
    if len(ops) == 2 and isinstance(ops[0], ir.Norm) and isinstance(ops[1], want):
        return ops[0], ops[1], False
    if len(ops) == 2 and isinstance(ops[1], ir.Norm) and isinstance(ops[0], want):
        return ops[1], ops[0], True
    if len(ops) == 3 and isinstance(ops[0], ir.Norm) and isinstance(ops[1], want) and ops[2].model_dump() == ops[0].model_dump():  # Gemma 2's sandwich
        return ops[0], ops[1], False
    raise Unsupported(f"prechamber {b.name}", "a family's branch is a norm and its turbine, nothing else")


def arch_of(engine: ir.Engine) -> Arch:
    """The Arch of a spec shaped like a family's decoder; Unsupported says where it is not.
    Only the shape is read here: export then checks, field by field, that importing the
    config it writes gives back this engine."""
    stages = [op for op in engine.body if isinstance(op, ir.Stage)]
    main = [op for op in engine.body if not isinstance(op, ir.Stage)]
    if not stages:
        raise Unsupported("stages", "the engine has no stages: no family is a plain stack")
    embed_norm = len(main) == 2 and isinstance(engine.body[0], ir.Norm)  # BLOOM's norm after the embedding
    if len(main) != 1 + embed_norm or not isinstance(engine.body[-1], ir.Norm):
        raise Unsupported("main line", "a family's decoder ends with exactly one norm on the main line, before the head "
                          "(BLOOM's also starts with one, after the embedding)")
    stages = _run_order(stages)  # one leaf stage per layer, in the order they run (a nested pattern unfolded)
    st = stages[0]
    windows = [_window(s) for s in stages]
    if len(set(windows)) > 1:  # a local layer's attention: Cohere 2's global layers have no rotary to read
        st = next(s for s, w in zip(stages, windows) if w is not None)
    for other in stages[1:]:
        if _unwindowed(other) != _unwindowed(st):
            raise Unsupported(f"stage {other.name}", "its layers differ from the first stage's; a family repeats one layer "
                              "(Gemma 2's alone in the window of its attention, Qwen2-MoE's in a dense MLP for its experts)")
    reactors = [_reactor(s) for s in stages]
    dense = tuple(isinstance(r, ir.Mlp) for r in reactors)
    if any(dense) and not all(dense):
        for kind in (ir.Mlp, ir.Moe):
            same = [r.model_dump(exclude={"name"}) for r in reactors if isinstance(r, kind)]
            if any(d != same[0] for d in same):
                raise Unsupported("stages", f"the layers' {kind.__name__.lower()} turbines differ; a family's dense layers share one MLP, its routed ones one MoE")
        st = next(s for s in stages if isinstance(_reactor(s), ir.Moe))
    parallel = "none"
    if len(st.ops) == 1 and isinstance(st.ops[0], ir.Fullflow) and len(st.ops[0].branches) == 2:
        ff = st.ops[0]
        mix, burn = ff.branches
        if ff.norm is not None:
            parallel = "shared"
            if len(mix.ops) != 1 or len(burn.ops) != 1 or not isinstance(mix.ops[0], ir.Attention):
                raise Unsupported(f"fullflow {ff.name}", "a parallel block with a shared norm holds attention and an MLP, one turbine each")
            n, attn, post, work = ff.norm, mix.ops[0], False, burn.ops[0]
        else:
            parallel = "separate"
    elif len(st.ops) != 2 or not all(isinstance(b, ir.Prechamber) for b in st.ops):
        raise Unsupported(f"stage {st.name}", "a family's layer is two prechambers (attention, then the MLP), or one parallel block")
    else:
        mix, burn = st.ops
    if parallel != "shared":
        n, attn, post = _branch_shape(mix, ir.Attention)
        _, work, _ = _branch_shape(burn, (ir.Mlp, ir.Moe))
    moe = isinstance(work, ir.Moe)
    sandwich = parallel == "none" and len(mix.ops) == 3
    scale = mix.merge.value if isinstance(mix.merge, ir.ScaleMerge) else 1.0
    qk = "none" if not attn.qk_norm else "all" if attn.qk_norm_across else "head"
    ropes = _layer_ropes(stages)
    if engine.feed.position == "learned" and n.type == "layernorm":
        family = "gpt2"
    elif attn.alibi and (embed_norm or not attn.alibi_scaled):
        family = "bloom"
    elif attn.alibi:
        family = "falcon"
    elif parallel == "shared":
        family = "gptj" if attn.rotary_interleaved else "phi" if engine.nozzle.bias else "falcon"
    elif parallel == "separate" and n.type == "layernorm" and (attn.kv_heads != attn.heads or not work.bias):
        family = "falcon"  # the new decoder: GPT-NeoX's block with grouped kv heads, or without biases
    elif n.type == "layernorm" and n.offset:
        family = "nemotron"
    elif n.type == "layernorm" and attn.qk_norm and attn.qk_norm_type == "layernorm":
        family = "persimmon"
    elif attn.qk_norm and attn.qk_norm_after_rotary:
        family = "nanochat"
    elif n.type == "layernorm" and n.affine and not is_gated(work.act):
        family = "gpt_neox" if parallel == "separate" or attn.rotary_dims != attn.head_dim else "starcoder2"
    elif moe:
        family = "qwen2_moe" if work.shared else "mixtral"
    elif n.type == "layernorm" and not n.affine:
        family = "olmo"
    elif n.offset and attn.qk_norm and attn.qk_norm_offset:
        family = "gemma3_text"
    elif n.offset and (sandwich or attn.softcap is not None or engine.nozzle.softcap is not None or len(set(windows)) > 1):
        family = "gemma2"
    elif post or qk == "all":
        family = "olmo2"
    elif n.offset:
        family = "gemma"
    elif scale != 1.0 or attn.scale is not None or engine.nozzle.scale != 1.0 or engine.feed.scale != 1.0:
        family = "granite"
    elif qk == "head":
        family = "qwen3"
    elif attn.bias and not attn.out_bias:
        family = "qwen2"
    elif attn.rotary_scaling is not None and attn.rotary_scaling.temperature:
        family = "ministral3"  # Mistral whose rotated queries take Llama 4's temperature
    elif attn.window is not None:
        family = "mistral"
    else:
        family = "llama"
    return Arch(family, vocab=engine.feed.vocab, context=engine.feed.context, width=engine.width,
                layers=len(stages), heads=attn.heads, kv_heads=attn.kv_heads, head_dim=attn.head_dim,
                hidden=work.hidden, act=work.act, norm=n.type, eps=n.eps, position=engine.feed.position, norm_bias=n.bias,
                norm_affine=n.affine, norm_offset=n.offset, post_norms=post, qkv_bias=attn.bias, out_bias=attn.out_bias,
                mlp_bias=work.bias, qk_norm=qk, qk_eps=attn.qk_norm_eps, attn_scale=attn.scale, embed_scale=engine.feed.scale,
                residual_scale=scale, logit_scale=engine.nozzle.scale, rotary=attn.rotary_dims / attn.head_dim,
                rotary_base=ropes.pop("rotary_base", attn.rotary_base), window=attn.window, experts=work.experts if moe else 0, top=work.top if moe else 0,
                normalize=work.normalize if moe else True, shared=work.shared if moe else 0,
                shared_gate=work.shared_gate if moe else False, tied=engine.nozzle.tied, padding=engine.feed.padding, parallel=parallel,
                head_bias=engine.nozzle.bias, rotary_interleaved=attn.rotary_interleaved, rotary_scaling=ropes.pop("rotary_scaling", attn.rotary_scaling),
                softcap=attn.softcap, logit_softcap=engine.nozzle.softcap, alibi=attn.alibi, alibi_scaled=attn.alibi_scaled,
                embed_norm=embed_norm, sandwich=sandwich,
                layer_windows=tuple(windows) if len(set(windows)) > 1 else (),
                layer_dense=dense if any(dense) and not all(dense) else (), layer_attn=_layer_attn(stages, windows),
                dense_hidden=next((r.hidden for r in reactors if isinstance(r, ir.Mlp)), 0) if any(dense) and not all(dense) else 0,
                qk_type=attn.qk_norm_type, qk_bias=attn.qk_norm_bias, qk_offset=attn.qk_norm_offset, qk_affine=attn.qk_norm_affine,
                qk_late=attn.qk_norm_after_rotary, qk_heads=attn.qk_norm_head_gains, **_router_of(work if moe else None), **ropes,
                sinks=attn.sinks)


def _router_of(work) -> dict:
    """A moe turbine's DeepSeek-V3 router options as Arch fields (export refuses them for a family without them; group_score
    is left to export's check that the config written reads back as the spec)."""
    if work is None:
        return {}
    return {"router": work.router, "groups": work.groups, "top_groups": work.top_groups, "route_scale": work.scale,
            "correction": work.correction, "router_bias": work.router_bias, "clamp": work.clamp}


def _layer_ropes(stages: list) -> dict:
    """The Arch's rotary fields when the sliding layers turn by a base (or scaling) of their own (Gemma 3): the global
    layers' as the Arch's rotary, the sliding layers' as local_rotary; {} otherwise. Layers of one kind with different
    rotaries are left for export's check to refuse."""
    seen: dict = {}
    for st in stages:
        for op in _ops(st):
            if isinstance(op, ir.Attention):
                seen.setdefault(op.window is not None, {})[(op.rotary_base, _dump(op.rotary_scaling))] = (op.rotary_base, op.rotary_scaling)
    if len(seen) != 2 or any(len(v) != 1 for v in seen.values()) or seen[True].keys() == seen[False].keys():
        return {}
    (gb, gs), = seen[False].values()
    (local,) = seen[True].values()
    return {"rotary_base": gb, "rotary_scaling": gs, "local_rotary": local}


def _unwindowed(stage: ir.Stage) -> list:
    """A stage's layer as data, its attention's window and rotary left out (Gemma 2 alternates the window, SmolLM3 the rotary)."""
    def strip(d):
        if isinstance(d, dict) and d.get("op") in ("mlp", "moe"):
            return {"op": "reactor"}  # compared apart: dense and routed layers may alternate (Qwen2-MoE)
        if isinstance(d, dict):  # the window, and the rotary Cohere 2's global layers lack (export checks the rest)
            return {k: strip(v) for k, v in d.items() if not (k in _PER_LAYER and d.get("op") == "attention")}
        if isinstance(d, list):
            return [strip(x) for x in d]
        return d
    return [strip(o.model_dump(exclude={"name"})) for o in stage.ops]


def config_of(a: Arch) -> dict:
    """The transformers config.json of an Arch of a supported family."""
    if a.family == "gpt2":
        act = _HF_PLAIN.get(a.act)
        if act is None:
            raise Unsupported("act", f"GPT-2 has no '{a.act}' activation")
        return {"model_type": "gpt2", "architectures": [CAUSAL_LM["gpt2"]], "vocab_size": a.vocab, "n_positions": a.context,
                "n_embd": a.width, "n_layer": a.layers, "n_head": a.heads, "n_inner": a.hidden, "activation_function": act,
                "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied, "scale_attn_weights": True,
                "scale_attn_by_inverse_layer_idx": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if a.family in _PLAIN:
        return _plain_config(a)
    if a.family in _DENSE_H2:
        return _dense_h2_config(a)
    if a.family in _parallel.READERS:
        return _parallel.config_of(a)
    if a.family in _routed_v3.READERS:
        return _routed_v3.config_of(a)
    if a.family in _sinks.READERS:
        return _sinks.config_of(a)
    if a.family == "persimmon":
        return _persimmon_config(a)
    if a.family == "bloom":
        if a.hidden != 4 * a.width or a.act != "gelu_tanh":
            raise Unsupported("hidden" if a.hidden != 4 * a.width else "act", "BLOOM's MLP is 4 x width wide with the tanh GELU")
        return {"model_type": "bloom", "architectures": [CAUSAL_LM["bloom"]], "vocab_size": a.vocab, "hidden_size": a.width, "n_layer": a.layers,
                "n_head": a.heads, "layer_norm_epsilon": a.eps, "tie_word_embeddings": a.tied, "apply_residual_connection_post_layernorm": False,
                "hidden_dropout": 0.0, "attention_dropout": 0.0, "seq_length": a.context}
    return _decoder_config(a)


# --- the config an engine of the expander families implies (export) -------------------------------

_EXPANDER_KINDS = (ir.Ssm, ir.Mamba1, ir.LatentAttention, ir.ShortConv)


def _layer_list(engine: ir.Engine, merges: tuple = (ir.PlainMerge, ir.CoolingMerge), post: bool = False) -> list[list[tuple[ir.Norm, object]]]:
    """Every layer (stage instance) as its branches' (norm, turbine) pairs; Unsupported where a layer is not
    (a branch merged otherwise than by `merges`)."""
    main = [op for op in engine.body if not isinstance(op, ir.Stage)]
    if len(main) != 1 or not isinstance(engine.body[-1], ir.Norm) or engine.body[-1].type != "rmsnorm":
        raise Unsupported("main line", "these families' decoders end with one rmsnorm on the main line, before the head")
    layers = []

    def pairs_of(st: ir.Stage) -> list:
        pairs = []
        for b in st.ops:
            if not isinstance(b, ir.Prechamber) or b.detach or b.overboard or not isinstance(b.merge, merges):
                raise Unsupported(f"stage {st.name}", "a layer of these families is plain residual branches (norm, turbine), nothing else")
            # post: A.X-K1's post_mlp_layernorm, a trailing rmsnorm (export's check then holds it to the MoE branches)
            ops = b.ops[:2] if post and len(b.ops) == 3 and isinstance(b.ops[2], ir.Norm) and b.ops[2].type == "rmsnorm" else b.ops
            if len(ops) != 2 or not isinstance(b.ops[0], ir.Norm) or b.ops[0].type != "rmsnorm":
                raise Unsupported(f"prechamber {b.name}", "each branch of these families is an rmsnorm, then its turbine")
            pairs.append((b.ops[0], b.ops[1]))
        return pairs

    for v in ir.walk(engine.body, unroll=True):  # the layers in the order they run: a nested stage's, group by group
        if not v.stage.is_group:
            layers.append(pairs_of(v.stage))
    if not layers:
        raise Unsupported("stages", "the engine has no layers")
    return layers


def expander_config(engine: ir.Engine) -> dict | None:
    """The transformers config of an engine with an ssm or latent attention (mamba2, mamba, jamba,
    deepseek_v2), or None when it has none of them. Only the shape is read; export then checks,
    field by field, that importing the config gives back the engine. Unsupported says why not."""
    if _gemma4.owns(engine):  # Gemma 4's values normed or per-layer inputs (families/gemma4.py)
        return _gemma4.engine_config(engine)
    if _afmoe.owns(engine):  # attention gated per channel without gated DeltaNet: AFMoE (families/afmoe.py)
        return _afmoe.engine_config(engine)
    if _laguna.owns(engine):  # attention gated by a softplus: Laguna (families/laguna.py)
        return _laguna.engine_config(engine)
    ops = [o for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list() for o in b.ops]
    if any(isinstance(o, ir.LinearAttention) for o in ops):
        raise Unsupported("turbine linear_attention", "no transformers model family computes linear attention "
                          "(Katharopoulos et al.): there is no config to write it as")
    if any(isinstance(o, ir.GatedDelta) for o in ops):  # Qwen3-Next, Qwen3.5 (families/delta.py)
        return _delta.engine_config(engine)
    if not any(isinstance(o, _EXPANDER_KINDS) for o in ops):
        return None
    if _hybrid.is_parallel_hybrid(engine):  # Falcon-H1's block: a Mamba-2 ssm beside attention (families/hybrid.py)
        return _hybrid.engine_config(engine)
    latent = any(isinstance(o, ir.LatentAttention) for o in ops)  # MiniCPM3 scales its branches
    granite = any(isinstance(o, ir.Ssm) for o in ops) and any(isinstance(o, (ir.Attention, ir.Mlp, ir.Moe)) for o in ops)  # ... and GraniteMoeHybrid
    layers = _layer_list(engine, (ir.PlainMerge, ir.CoolingMerge, ir.ScaleMerge) if latent or granite else (ir.PlainMerge, ir.CoolingMerge),
                         post=latent and engine.name == "axk1" or any(isinstance(o, ir.ShortConv) for o in ops))  # LFM3's sandwich
    turbines = [t for layer in layers for _, t in layer]
    final = engine.body[-1]
    base = {"vocab_size": engine.feed.vocab, "hidden_size": engine.width, "num_hidden_layers": len(layers),
            "tie_word_embeddings": engine.nozzle.tied, "pad_token_id": engine.feed.padding}
    latent_dense = None if engine.nozzle.bias or engine.feed.position != "none" else _latent_dense_config(engine, layers, base)
    if latent_dense is not None:  # MiniCPM3, Youtu
        return latent_dense
    if engine.nozzle.bias or (engine.nozzle.scale != 1.0 or engine.feed.scale != 1.0) and not granite or engine.feed.position != "none":
        raise Unsupported("feed / nozzle", "these families have no positions table, no embedding or logit multiplier and no head bias")
    first = turbines[0]
    if all(len(layer) == 1 for layer in layers) and any(isinstance(t, ir.Ssm) for t in turbines) \
            and any(isinstance(t, (ir.Attention, ir.Mlp, ir.Moe)) for t in turbines):  # Nemotron-H: one mixer a layer (families/hybrid.py)
        return _hybrid.single_mixer_config(engine, layers, base)
    if all(len(layer) == 1 for layer in layers) and isinstance(first, ir.Ssm):
        s = first
        lo_hi = {} if (s.dt_lo, s.dt_hi) == (0.0, None) else {"time_step_limit": [s.dt_lo, s.dt_hi if s.dt_hi is not None else float("inf")]}
        if s.inner % engine.width:
            raise Unsupported("expand", f"Mamba-2's config says expand as a whole number; the inner width {s.inner} is not a multiple of {engine.width}")
        return {"model_type": "mamba2", "architectures": [CAUSAL_LM["mamba2"]], **base, "num_heads": s.heads, "head_dim": s.head_dim,
                "expand": s.inner // engine.width, "state_size": s.state, "n_groups": s.groups, "conv_kernel": s.conv, "chunk_size": s.chunk,
                "use_bias": s.bias, "use_conv_bias": s.conv_bias, "layer_norm_epsilon": final.eps, "time_step_min": s.dt_min,
                "time_step_max": s.dt_max, "rms_norm": True, "hidden_act": "silu", "max_position_embeddings": engine.feed.context, **lo_hi}
    mixers = [layer[0][1] for layer in layers]
    if all(len(layer) == 1 for layer in layers) and isinstance(first, ir.Mamba1) and first.norms and not first.norms_affine:
        return {"model_type": "falcon_mamba", "architectures": [CAUSAL_LM["falcon_mamba"]], **_mamba1_config(first, engine.width, ""), **base,
                "layer_norm_epsilon": final.eps, "max_position_embeddings": engine.feed.context, "mixer_rms_eps": first.eps}
    if all(len(layer) == 1 for layer in layers) and isinstance(first, ir.Mamba1):
        return {"model_type": "mamba", "architectures": [CAUSAL_LM["mamba"]], **_mamba1_config(first, engine.width, ""), **base,
                "layer_norm_epsilon": final.eps, "max_position_embeddings": engine.feed.context}
    if not all(len(layer) == 2 for layer in layers):
        raise Unsupported("stages", "a Jamba or DeepSeek-V2 layer is a mixer branch, then an MLP branch")
    reactors = [layer[1][1] for layer in layers]
    moes = [r for r in reactors if isinstance(r, ir.Moe)]
    mlps = [r for r in reactors if isinstance(r, ir.Mlp)]
    moe, mlp = (moes or [None])[0], (mlps or [None])[0]
    common = {"hidden_act": "silu", "rms_norm_eps": final.eps, "max_position_embeddings": engine.feed.context}
    if any(isinstance(m, ir.ShortConv) for m in mixers):  # LFM2's short convs among attention layers
        return _conv.engine_config(engine, layers, base, common)
    if any(isinstance(m, ir.Ssm) for m in mixers):  # Mamba-2 mixers among attention layers
        return _hybrid_config(engine, layers, base, common)
    if isinstance(first, ir.LatentAttention):
        a = first
        dense = next((i for i, r in enumerate(reactors) if isinstance(r, ir.Moe)), len(layers))
        if moe is not None and moe.router == "sigmoid":  # DeepSeek-V3's router; export's check then holds every other option
            return _v3_named(engine.name, {"model_type": "deepseek_v3", "architectures": [CAUSAL_LM["deepseek_v3"]], **base, **common,
                    "num_attention_heads": a.heads, "num_key_value_heads": a.heads, "q_lora_rank": a.q_latent, "kv_lora_rank": a.latent,
                    "qk_nope_head_dim": a.head_dim, "qk_rope_head_dim": a.rotary_dims, "v_head_dim": a.v_dim, "attention_bias": a.bias,
                    "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}, "first_k_dense_replace": dense,
                    "intermediate_size": mlp.hidden if mlp else moe.hidden, "moe_intermediate_size": moe.hidden,
                    "n_routed_experts": moe.experts, "num_experts_per_tok": moe.top, "n_shared_experts": _shared_experts(moe),
                    "norm_topk_prob": moe.normalize, "routed_scaling_factor": moe.scale, "n_group": moe.groups, "topk_group": moe.top_groups,
                    "rope_interleave": True, "num_nextn_predict_layers": 0})
        grouped = moe is not None and moe.groups > 1
        return {"model_type": "deepseek_v2", "architectures": [CAUSAL_LM["deepseek_v2"]], **base, **common,
                "num_attention_heads": a.heads, "num_key_value_heads": a.heads, "q_lora_rank": a.q_latent, "kv_lora_rank": a.latent,
                "qk_nope_head_dim": a.head_dim, "qk_rope_head_dim": a.rotary_dims, "v_head_dim": a.v_dim, "attention_bias": a.bias,
                "rope_parameters": {"rope_type": "default", "rope_theta": a.rotary_base}, "first_k_dense_replace": dense,
                "intermediate_size": mlp.hidden if mlp else (moe.hidden if moe else 1), "moe_intermediate_size": moe.hidden if moe else 1,
                "n_routed_experts": moe.experts if moe else 1, "num_experts_per_tok": moe.top if moe else 1,
                "n_shared_experts": _shared_experts(moe) if moe else 1,
                "norm_topk_prob": False, "routed_scaling_factor": moe.scale if moe else 1.0, "mlp_bias": False,
                "topk_method": "group_limited_greedy" if grouped else "greedy", **({"n_group": moe.groups, "topk_group": moe.top_groups} if grouped else {})}
    ssm = next((m for m in mixers if isinstance(m, ir.Mamba1)), None)
    attn = next((m for m in mixers if isinstance(m, ir.Attention)), None)
    if ssm is None:
        raise Unsupported("stages", "an engine of attention and MLP layers is not one of these families")
    ap, ao = _period([i for i, m in enumerate(mixers) if isinstance(m, ir.Attention)], len(layers), "attention layers")
    ep, eo = _period([i for i, r in enumerate(reactors) if isinstance(r, ir.Moe)], len(layers), "expert layers")
    return {"model_type": "jamba", "architectures": [CAUSAL_LM["jamba"]], **base, **common, **_mamba1_config(ssm, engine.width, "mamba_"),
            "num_attention_heads": attn.heads if attn else 1, "num_key_value_heads": attn.kv_heads if attn else 1,
            "intermediate_size": (mlp or moe).hidden, "num_experts": moe.experts if moe else 1, "num_experts_per_tok": moe.top if moe else 1,
            "attn_layer_period": ap, "attn_layer_offset": ao, "expert_layer_period": ep, "expert_layer_offset": eo,
            "rms_norm_eps": ssm.eps if ssm.norms else final.eps, "use_mamba_kernels": False}
