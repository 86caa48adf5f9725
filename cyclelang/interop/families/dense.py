"""The dense Llama-shaped decoders of 2025-26 (issue 33): OLMo 3, SmolLM3, EXAONE 4 and 3, ERNIE 4.5, Helium, CWM,
VaultGemma, HyperCLOVA X: their readers (per-layer rotary, NoPE layers), attention templates and configs."""

from __future__ import annotations

from dataclasses import replace

from ... import ir
from ..closed import Config, Keys, Unsupported, fields_of
from .core import (CAUSAL_LM, KEYS, _GATED_ACTS, _HF_GATED, _LLAMA, _TP, Arch, _cap, _divides, _dynamic_context, _eps, _kv, _max_positions, _num, _ops,
                   _padding, _partial, _rope, _rope_config, _rope_scaling, _scaling_text, _sliding, _types, _whole)

# --- dense Llama-shaped decoders of 2025-26 (issue 33): OLMo 3, SmolLM3, EXAONE 4 and 3, ERNIE 4.5, Helium, CWM, VaultGemma, HyperCLOVA X ---

_DENSE_H2 = {
    "olmo3": Keys(_LLAMA | {"attention_bias", "sliding_window", "layer_types", "head_dim"}),
    "smollm3": Keys(_LLAMA | {"attention_bias", "mlp_bias", "use_sliding_window", "sliding_window", "no_rope_layers", "no_rope_layer_interval",
                              "layer_types", "head_dim"}),
    "exaone4": Keys(_LLAMA | {"sliding_window", "sliding_window_pattern", "layer_types", "head_dim"}),
    "ernie4_5": Keys(_LLAMA | {"use_bias", "head_dim"}),
    "helium": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"}),
    "cwm": Keys(_LLAMA | {"head_dim", "mlp_bias", "sliding_window", "layer_types"}, _TP),
    "exaone": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias"},
                   {"embed_dropout": "a dropout EXAONE 3's released configs write; transformers' Llama does not read it (and dropout is off in evaluation)",
                    **_TP}),
    "vaultgemma": Keys(_LLAMA - {"hidden_act"} | {"head_dim", "attention_bias", "hidden_activation", "attn_logit_softcapping",
                                                   "final_logit_softcapping", "query_pre_attn_scalar", "layer_types", "sliding_window"},
                       {"hidden_act": "VaultGemma's forward reads hidden_activation; a hidden_act beside it is not read"}),
    "hyperclovax": Keys(_LLAMA | {"head_dim", "attention_bias", "mlp_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                  "logits_scaling", "use_post_norm"}),
}
KEYS.update(_DENSE_H2)
# head_dim is no field of these classes, but transformers keeps a config.json's as an attribute and their attention reads it
_HEAD_DIM_ATTRIBUTE = ("olmo3", "smollm3", "exaone4")
# CWM's __post_init__ writes this rope when config.json gives none (its rope_theta, rope_scaling are then not read)
_CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
             "original_max_position_embeddings": 8192}


def _sub_rope(c: Config, rope: dict, where: str) -> tuple[float, ir.RotaryScaling | None]:
    """(rotary base, scaling) of one rope dict (OLMo 3's per layer type, CWM's default), read as Config.rope reads a file's."""
    try:
        sub = Config({"rope_parameters": rope}, c.family, Keys(frozenset({"rope_parameters"})))
        partial = _partial(sub)
        if float(partial) != 1.0:
            raise Unsupported("rope_parameters.partial_rotary_factor", f"{partial}: {c.family}'s rotary turns every dim of a head")
        return _rope(sub), _rope_scaling(sub, c["max_position_embeddings"])
    except Unsupported as e:
        raise Unsupported(where + e.field[len("rope_parameters"):], str(e).split(": ", 1)[1]) from None


def _whole_rope(c: Config) -> None:
    """ERNIE 4.5, Helium and the rest turn every dim of each head: a partial factor crashes or is ignored there."""
    partial = _partial(c)
    if float(partial) != 1.0:
        raise Unsupported("rope_parameters.partial_rotary_factor", f"{partial}: {c.family}'s rotary turns every dim of a head "
                          "(transformers ignores the factor, or fails on it, depending on the rope type)")


def _olmo3_ropes(c: Config) -> dict:
    """OLMo 3's rope per layer type, as Olmo3Config.convert_rope_params_to_dict builds it: rope_scaling goes to the full-attention
    layers alone, a legacy rope_theta too (the sliding layers keep the class's 500000); a top-level key is read by no layer."""
    rope = c.raw.get("rope_parameters")
    if rope is None:
        rope = {}
    if not isinstance(rope, dict):
        raise Unsupported("rope_parameters", "is not an object")
    flat = sorted(k for k in rope if k not in ("full_attention", "sliding_attention"))
    if flat:
        raise Unsupported(f"rope_parameters.{flat[0]}", "OLMo 3 reads its rope per layer type (full_attention, sliding_attention); "
                          "transformers' layers never read a top-level one")
    out = {}
    for t in ("full_attention", "sliding_attention"):
        one = rope.get(t)
        if one is not None and not isinstance(one, dict):
            raise Unsupported(f"rope_parameters.{t}", "is not an object")
        out[t] = dict(one or {"rope_type": "default"})
    old = c.raw.get("rope_scaling")
    if old:
        if not isinstance(old, dict):
            raise Unsupported("rope_scaling", "is not an object")
        if c.raw.get("rope_parameters") is not None and "full_attention" not in rope:
            raise Unsupported("rope_scaling", "beside a rope_parameters without full_attention: Olmo3Config fails to place it")
        out["full_attention"].update(old)
    out["full_attention"].setdefault("rope_theta", c.raw.get("rope_theta", 500000.0))
    out["sliding_attention"].setdefault("rope_theta", 500000.0)
    if c.raw.get("partial_rotary_factor") is not None:
        raise Unsupported("partial_rotary_factor", "OLMo 3's rotary turns every dim of a head")
    ropes = {t: _sub_rope(c, r, f"rope_parameters.{t}") for t, r in out.items()}
    for t, (_, sc) in ropes.items():
        if sc is not None and sc.type == "dynamic" and ropes["full_attention"] != ropes["sliding_attention"]:
            raise Unsupported(f"rope_parameters.{t}.rope_type", "dynamic NTK on one layer type alone is not mapped (the feed's context "
                              "follows one dynamic rope)")
    return ropes


def _window_types(c: Config, layers: int, default) -> tuple[list, int | None]:
    """(layer_types, sliding_window), refusing sliding layers without a window (transformers cannot build their mask)."""
    sw = _sliding(c)
    types = _types(c, layers, default)
    if "sliding_attention" in types and sw is None:
        raise Unsupported("sliding_window", "layer_types has sliding layers, but sliding_window is null")
    return types, sw


def _dense_h2(family: str):
    def read(c: Config) -> Arch:
        width, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
        kv = _kv(c, heads)
        act_key = "hidden_activation" if family == "vaultgemma" else "hidden_act"
        act = _GATED_ACTS.get(c[act_key])
        if act is None:
            raise Unsupported(act_key, f"a gated MLP with {c[act_key]!r} has no counterpart (the language has swiglu = silu, geglu = gelu, "
                              "geglu_tanh = the tanh GELU)")
        if family in _HEAD_DIM_ATTRIBUTE and c.given("head_dim") and c["head_dim"] is None:
            raise Unsupported("head_dim", f"null: {family}'s attention reads the attribute as it is (no fallback to hidden_size / heads)")
        head_dim = (c["head_dim"] if "head_dim" in c.keys.maps else None) or width // heads
        if family in ("vaultgemma", "hyperclovax") or not ("head_dim" in c.keys.maps and c["head_dim"]):
            _divides(width, heads, "num_attention_heads", "hidden_size")  # VaultGemma, HyperCLOVA X: their validate_architecture
        if family == "helium" and heads * head_dim != width:
            raise Unsupported("head_dim", f"Helium's o_proj takes hidden_size ({width}) inputs: heads x head_dim = {heads * head_dim} "
                              "does not build in transformers")
        sources = {"vocab": "vocab_size", "context": "max_position_embeddings", "width": "hidden_size", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "hidden": "intermediate_size", "act": act_key,
                   "eps": "rms_norm_eps", "rotary_base": "rope_theta", "window": "sliding_window, layer_types", "tied": "tie_word_embeddings"}
        eps = _eps(c, "rms_norm_eps")
        extra: dict = {}
        context = c["max_position_embeddings"]
        # rotary per layer: (rotary fraction, base, scaling) for each layer type
        if family == "olmo3":
            ropes = {t: (1.0, *r) for t, r in _olmo3_ropes(c).items()}
        elif family == "cwm" and not c.given("rope_parameters"):
            for k in ("rope_scaling", "rope_theta", "partial_rotary_factor"):
                if c.given(k):
                    raise Unsupported(k, "CWM writes its own llama3 rope when config.json has no rope_parameters, and does not read this")
            ropes = {t: (1.0, *_sub_rope(c, dict(_CWM_ROPE), "rope_parameters")) for t in ("full_attention", "sliding_attention")}
        else:
            _whole_rope(c)
            one = (1.0, _rope(c), _rope_scaling(c, context))
            ropes = {"full_attention": one, "sliding_attention": one}
        types = ["full_attention"] * layers
        sw = None
        nope = [False] * layers  # a layer without rotary (SmolLM3's NoPE layers, EXAONE 4's global ones)
        if family == "olmo3":
            types, sw = _window_types(c, layers, lambda: ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)])
        elif family == "cwm":
            types, sw = _window_types(c, layers, lambda: ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(layers)])
        elif family == "vaultgemma":
            types, sw = _window_types(c, layers, lambda: ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)])
            if sw is None:  # its model builds the sliding mask whatever layer_types say
                raise Unsupported("sliding_window", "null: transformers' VaultGemma cannot build its sliding-window mask without one")
        elif family == "exaone4":
            sw = _sliding(c)
            pattern = c["sliding_window_pattern"]
            if not c.given("layer_types") or c["layer_types"] is None:
                if sw is None:
                    raise Unsupported("sliding_window", "null without layer_types: Exaone4Config's pattern of layers divides by zero")
                if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
                    raise Unsupported("sliding_window_pattern", f"{pattern!r}: without layer_types, the pattern is a whole number of layers from 1")
            types, sw = _window_types(c, layers, lambda: ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)])
            nope = [sw is not None and t != "sliding_attention" for t in types]  # rotary only on sliding layers, when the model has a window
        elif family == "smollm3":
            interval, on = c["no_rope_layer_interval"], bool(c["use_sliding_window"])
            rope_layers = c["no_rope_layers"]
            if rope_layers is None:
                if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
                    raise Unsupported("no_rope_layer_interval", f"{interval!r}: a NoPE layer every k layers, k a whole number from 1")
                rope_layers = [int((i + 1) % interval != 0) for i in range(layers)]
            if not isinstance(rope_layers, list) or len(rope_layers) < layers or any(v not in (0, 1) or isinstance(v, float) for v in rope_layers):
                raise Unsupported("no_rope_layers", f"no_rope_layers holds 1 (rotary) or 0 (NoPE) for each of the {layers} layers")
            nope = [not rope_layers[i] for i in range(layers)]
            sw0 = _sliding(c)
            types = _types(c, layers, lambda: ["sliding_attention" if on and sw0 is not None and nope[i] else "full_attention"
                                                for i in range(layers)])
            if "sliding_attention" in types and not (on and sw0 is not None):
                raise Unsupported("use_sliding_window" if not on else "sliding_window",
                                  "layer_types has sliding layers, but transformers' kernels disagree on them without use_sliding_window "
                                  "and a sliding_window (eager masks them, flash attention does not)")
            sw = sw0
            sources["rotary"] = "no_rope_layers"
        per = [(sw if t == "sliding_attention" else None, *((0.0, ropes[t][1], None) if nope[i] else ropes[t])) for i, t in enumerate(types)]
        first = per[0]
        window, rotary, base, scaling = first
        windows = tuple(p[0] for p in per)
        if len({p[1:] for p in per}) > 1:
            extra["layer_attn"] = tuple(per)
        elif len(set(windows)) > 1:
            extra["layer_windows"] = windows
            window = None
        if rotary == 0.0:
            base, scaling = 10000.0, None
        qkv_bias = out_bias = mlp_bias = False
        if family in ("olmo3", "smollm3", "exaone", "vaultgemma", "hyperclovax"):
            qkv_bias = out_bias = bool(c["attention_bias"])
        if family == "helium":
            qkv_bias = bool(c["attention_bias"])
        if family == "ernie4_5":
            qkv_bias = out_bias = mlp_bias = bool(c["use_bias"])
        if family in ("smollm3", "helium", "cwm", "exaone", "hyperclovax"):
            mlp_bias = bool(c["mlp_bias"])
        if family == "olmo3":
            extra.update(post_norms=True, qk_norm="all", qk_eps=eps)
        if family == "exaone4":
            extra.update(post_norms=True, qk_norm="head", qk_eps=eps)
        if family in ("ernie4_5", "helium"):
            extra.update(rotary_interleaved=True)  # rotate_half on pairs (0, 1), (2, 3), ...
        if family == "vaultgemma":
            scalar = c["query_pre_attn_scalar"]
            if not isinstance(scalar, (int, float)) or isinstance(scalar, bool) or not scalar > 0:
                raise Unsupported("query_pre_attn_scalar", f"{scalar!r} is not a positive number")
            extra.update(norm_offset=1.0, embed_scale=float(width) ** 0.5, attn_scale=float(scalar) ** -0.5,
                         softcap=_cap(c, "attn_logit_softcapping"), logit_softcap=_cap(c, "final_logit_softcapping"))
            sources.update(embed_scale="Gemma's sqrt(hidden_size)", attn_scale="query_pre_attn_scalar", softcap="attn_logit_softcapping",
                           logit_softcap="final_logit_softcapping")
        if family == "hyperclovax":
            for k in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
                if not c[k]:
                    raise Unsupported(k, f"{c[k]!r}: HyperCLOVA X's multipliers are non-zero numbers")
            am = c["attention_multiplier"]
            if am is not None and not am > 0:
                raise Unsupported("attention_multiplier", f"{am!r} is not a positive number (null: 1 / sqrt(head_dim))")
            extra.update(embed_scale=float(c["embedding_multiplier"]), residual_scale=float(c["residual_multiplier"]),
                         attn_scale=None if am is None else float(am), logit_scale=float(c["logits_scaling"]), sandwich=bool(c["use_post_norm"]))
            sources.update(embed_scale="embedding_multiplier", residual_scale="residual_multiplier", attn_scale="attention_multiplier",
                           logit_scale="logits_scaling")
        roped = next((p[3] for p in per if p[1]), None)  # the rope of the first layer with one (a NoPE layer has none)
        return Arch(family, vocab=c["vocab_size"], context=_dynamic_context(context, roped), width=width, layers=layers, heads=heads,
                    kv_heads=kv, head_dim=head_dim, hidden=c["intermediate_size"], act=act, norm="rmsnorm", eps=eps, qkv_bias=qkv_bias,
                    out_bias=out_bias, mlp_bias=mlp_bias, rotary=rotary, rotary_base=base, rotary_scaling=scaling, window=window,
                    tied=bool(c["tie_word_embeddings"]), padding=_padding(c), sources=sources, **extra)
    return read


def _layer_attn(stages: list, windows: list) -> tuple:
    """Each layer's (window, rotary, rotary_base, rotary_scaling) where rotary differs by layer, else ()."""
    per = []
    for st, w in zip(stages, windows):
        a = next((op for op in _ops(st) if isinstance(op, ir.Attention)), None)
        if a is None:
            return ()
        rot = a.rotary_dims / a.head_dim
        per.append((w, rot, a.rotary_base if rot else 10000.0, a.rotary_scaling))
    return tuple(per) if len({p[1:] for p in per}) > 1 else ()


def _attn_templates(a: Arch, att: list, mk, where: str) -> tuple[list, list]:
    """(templates, each layer's kind) for layers whose attention differs in window and rotary (a.layer_attn);
    mk(words): a layer's ops with those attention words."""
    plain = [x for x in att if not x.startswith(("rotary", "window="))]
    kinds, blocks, names = [], [], {}
    for w, rot, base, sc in a.layer_attn:
        variant = (w, rot, base, sc)
        if variant not in names:
            words = []
            if rot:
                words.append("rotary" if rot == 1.0 else f"rotary={_num(rot)}")
                if a.rotary_interleaved:
                    words.append("rotary_interleaved")
                if base != 10000.0:
                    words.append(f"rotary_base={_num(base)}")
                if sc is not None:
                    words.append(_scaling_text(sc).strip())
            if w is not None:
                words.append(f"window={w}")
            name = ("local" if w is not None else "global") + ("" if rot else "_nope")
            while name in names.values():
                name += "_b"
            names[variant] = name
            what = (f"sliding-window attention ({w} tokens)" if w is not None else "global attention") + \
                ("" if rot else ", no rotary (NoPE)") + (f", rotary base {_num(base)}" if rot else "")
            at = sum(1 for x in plain if x.startswith(("heads=", "kv_heads=", "head_dim=")))  # the words after the heads'
            ops = mk(plain[:at] + words + plain[at:])
            blocks.append((f"# a {a.family} layer with {what}, {where}", f"{a.family}_{name}", ops))
        kinds.append(names[variant])
    return blocks, kinds


def _per_layer(a: Arch) -> list:
    """Each layer's (window, rotary, rotary_base, rotary_scaling), however the Arch says them."""
    if a.layer_attn:
        return list(a.layer_attn)
    windows = a.layer_windows or (a.window,) * a.layers
    return [(w, a.rotary, a.rotary_base, a.rotary_scaling) for w in windows]


def _one_window(a: Arch, per: list) -> int | None:
    local = {p[0] for p in per if p[0] is not None}
    if len(local) > 1:
        raise Unsupported("window", f"{a.family} has one sliding_window; the spec's layers have {sorted(local)}")
    return local.pop() if local else None


def _rope_dict(a: Arch, base: float, sc) -> dict:
    return _rope_config(replace(a, rotary_scaling=sc), {"rope_type": "default", "rope_theta": base})


def _dense_h2_config(a: Arch) -> dict:
    """The config.json of a spec read as one of the _DENSE_H2 families (export); what it cannot say is refused
    when importing it back differs from the spec (interop.export_config)."""
    f = a.family
    act = _HF_GATED.get(a.act)
    if act is None:
        raise Unsupported("act", f"{f}'s gated MLP has no '{a.act}' form (swiglu, geglu or geglu_tanh)")
    per = _per_layer(a)
    sw = _one_window(a, per)
    types = ["sliding_attention" if p[0] is not None else "full_attention" for p in per]
    roped = [p for p in per if p[1]]
    first = roped[0] if roped else (None, 1.0, 10000.0, None)
    cfg = {"model_type": f, "architectures": [CAUSAL_LM[f]], "vocab_size": a.vocab, "hidden_size": a.width, "intermediate_size": a.hidden,
           "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "hidden_act": act,
           "max_position_embeddings": _max_positions(replace(a, rotary_scaling=first[3])), "rms_norm_eps": a.eps,
           "tie_word_embeddings": a.tied, "pad_token_id": a.padding, "rope_parameters": _rope_dict(a, first[2], first[3])}
    if "head_dim" in fields_of(f) or f in _HEAD_DIM_ATTRIBUTE:
        cfg["head_dim"] = a.head_dim
    if f in ("olmo3", "smollm3", "exaone", "vaultgemma", "hyperclovax", "helium"):
        cfg["attention_bias"] = a.qkv_bias
    if f in ("smollm3", "helium", "cwm", "exaone", "hyperclovax"):
        cfg["mlp_bias"] = a.mlp_bias
    if f == "ernie4_5":
        cfg["use_bias"] = a.qkv_bias
    if f == "olmo3":
        ropes = {}
        for t, p in zip(types, per):
            ropes.setdefault(t, _rope_dict(a, p[2], p[3]))
        for t in ("full_attention", "sliding_attention"):
            ropes.setdefault(t, ropes.get("full_attention") or ropes.get("sliding_attention"))
        cfg.update(rope_parameters=ropes, sliding_window=sw, layer_types=types)
    if f == "cwm":
        cfg.update(sliding_window=sw or 8192, layer_types=types)
    if f == "smollm3":
        cfg.update(use_sliding_window=sw is not None, sliding_window=sw, layer_types=types, no_rope_layers=[int(bool(p[1])) for p in per])
    if f == "exaone4":
        cfg.update(sliding_window=sw, layer_types=types)
    if f == "vaultgemma":
        del cfg["hidden_act"]
        cfg.update(hidden_activation=act, sliding_window=sw or a.context, layer_types=types,
                   query_pre_attn_scalar=_whole((a.attn_scale if a.attn_scale is not None else a.head_dim ** -0.5) ** -2),
                   attn_logit_softcapping=a.softcap, final_logit_softcapping=a.logit_softcap)
    if f == "hyperclovax":
        cfg.update(embedding_multiplier=a.embed_scale, residual_multiplier=a.residual_scale, attention_multiplier=a.attn_scale,
                   logits_scaling=a.logit_scale, use_post_norm=a.sandwich)
    return cfg


CAUSAL_LM_H2 = {"olmo3": "Olmo3ForCausalLM", "smollm3": "SmolLM3ForCausalLM", "exaone4": "Exaone4ForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
                "helium": "HeliumForCausalLM", "cwm": "CwmForCausalLM", "exaone": "LlamaForCausalLM", "vaultgemma": "VaultGemmaForCausalLM",
                "hyperclovax": "HyperCLOVAXForCausalLM"}
