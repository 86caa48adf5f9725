"""Laguna (laguna), read closed-world (closed.py) into a `Laguna` record and written as the spec it implies; its weight
plan (import and export) and the config an engine implies (export).

What makes it (transformers 5.24's modeling_laguna.py, LagunaModel):
- Llama's pre-norm layer (input_layernorm before attention, post_attention_layernorm before the MLP), RMSNorms;
- attention with per-head q and k RMSNorms (eps rms_norm_eps), each layer its own number of query heads
  (num_attention_heads_per_layer) over num_key_value_heads, and an output gate from the attention's input,
  y * softplus(g_proj(x)), one per head (gating true or "per-head") or one per channel of every head (false or
  "per-element") -> `gate=head|channel gate_act=softplus`;
- layer_types: sliding layers (sliding_window) and full ones, each type its own rope (rope_parameters per layer type:
  rope_theta, and partial_rotary_factor: the first dims of each head rotated by halves at base^(-2i/dims));
- mlp_layer_types: dense layers a swiglu MLP of intermediate_size; sparse ones routed experts: sigmoid scores, the top
  num_experts_per_tok chosen by score + e_score_correction_bias (selection only), the chosen unbiased scores divided by
  their sum, the routed sum times moe_routed_scaling_factor, beside a swiglu shared expert (shared_expert_intermediate_size).
  The language's DeepSeek-V3 router divides by the sum + 1e-20: the same number wherever the sum of the chosen sigmoid
  scores is above 1e-13 (float32's rounding of sum + 1e-20 is sum itself), i.e. unless every chosen logit is below -30.

Refused by name: attention_bias (q, k, v, o biased but the gate never), moe_router_logit_softcapping (a tanh cap on
the router's logits), moe_apply_router_weight_on_input (transformers refuses it too), a gating string other than
"per-head" or "per-element", rope types other than default, a partial rotary of an odd or no dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ... import ir
from ..closed import Config, Keys, Unsupported, _show
from .gemma4 import _int, _num

FAMILY = "laguna"
_MAPS = frozenset({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters", "sliding_window",
                   "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts_per_tok", "num_experts", "layer_types",
                   "pad_token_id", "head_dim", "attention_bias", "gating", "num_attention_heads_per_layer", "mlp_layer_types",
                   "moe_routed_scaling_factor", "moe_apply_router_weight_on_input", "moe_router_logit_softcapping"})
KEYS = {FAMILY: Keys(_MAPS)}
CAUSAL_LM = {FAMILY: "LagunaForCausalLM"}
_TYPES = {"sliding_attention": "local", "full_attention": "global"}
_DEFAULT_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}


@dataclass(frozen=True)
class Laguna:
    """A laguna checkpoint (LagunaForCausalLM), in the language's terms."""

    family: str
    vocab: int
    context: int
    width: int
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    act: str
    moe_hidden: int
    experts: int
    top: int
    shared: int  # the shared expert's width
    route_scale: float
    eps: float
    window: int | None
    gate: str  # head | channel
    ropes: dict  # "local" | "global" -> (rotary dims, base)
    kinds: tuple  # each layer's (attention type, dense | moe, heads)
    padding: int | None
    tied: bool
    sources: dict = field(default_factory=dict, compare=False)

    def spec_text(self, source: str) -> str:
        return _text(self, source)


def _list(c: Config, key: str, layers: int, ok, default) -> list:
    v = c[key]
    v = default() if v is None else v
    if not isinstance(v, list) or len(v) != layers or not all(ok(x) for x in v):
        raise Unsupported(key, f"{_show(v)}: one entry per layer ({layers})")
    return v


def _rope(c: Config, kind: str, head_dim: int) -> tuple[int, float]:
    ropes = c["rope_parameters"]
    ropes = _DEFAULT_ROPE if ropes is None else ropes
    where = f"rope_parameters.{kind}"
    if not isinstance(ropes, dict) or set(ropes) - set(_TYPES) or not isinstance(ropes.get(kind), dict):
        raise Unsupported("rope_parameters" if not isinstance(ropes, dict) or set(ropes) - set(_TYPES) else where,
                          "Laguna's rope parameters are one object per layer type (sliding_attention, full_attention)")
    p = ropes[kind]
    typ = p.get("rope_type", p.get("type", "default"))
    if typ != "default":
        raise Unsupported(f"{where}.rope_type", f"{_show(typ)}: Laguna's default rope is mapped, no other")
    for k in p:
        if k not in ("rope_type", "type", "rope_theta", "partial_rotary_factor"):
            raise Unsupported(f"{where}.{k}", "not a rope parameter Laguna's default rope reads")
    base = p.get("rope_theta")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise Unsupported(f"{where}.rope_theta", f"{_show(base)}: a rotary base above 1")
    partial = p.get("partial_rotary_factor", 1.0)
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise Unsupported(f"{where}.partial_rotary_factor", f"{_show(partial)}: a fraction in (0, 1]")
    dims = int(head_dim * partial)
    if dims == 0 or dims % 2:
        raise Unsupported(f"{where}.partial_rotary_factor", f"{_show(partial)} of head_dim {head_dim} rotates {dims} dims: an even number "
                          "from 2 is mapped")
    return dims, float(base)


def read(c: Config) -> Laguna:
    from .core import _GATED_ACTS, _eps, _padding

    layers, width = _int(c, "num_hidden_layers"), _int(c, "hidden_size")
    heads0, kv = _int(c, "num_attention_heads"), _int(c, "num_key_value_heads")
    head_dim = _int(c, "head_dim")
    act = _GATED_ACTS.get(c["hidden_act"])
    if act is None:
        raise Unsupported("hidden_act", f"{_show(c['hidden_act'])}: a gated MLP with it has no counterpart (swiglu = silu, geglu = gelu)")
    if c["attention_bias"] is not False:
        raise Unsupported("attention_bias", f"{_show(c['attention_bias'])}: Laguna biases q, k, v and o but never its output gate; the "
                          "language's gate takes the attention's bias")
    if c["moe_apply_router_weight_on_input"] is not False:
        raise Unsupported("moe_apply_router_weight_on_input", "the routing weights applied to the experts' input (transformers refuses it too)")
    cap = c["moe_router_logit_softcapping"]
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap != 0:
        raise Unsupported("moe_router_logit_softcapping", f"{_show(cap)}: a tanh cap on the router's logits is not in the language (0: none)")
    gating = c["gating"]
    if gating is True or gating == "per-head":
        gate = "head"
    elif gating is False or gating == "per-element":
        gate = "channel"
    else:
        raise Unsupported("gating", f"{_show(gating)}: true or 'per-head' (a gate per head), false or 'per-element' (per channel)")
    types = _list(c, "layer_types", layers, lambda t: t in _TYPES, lambda: ["full_attention"] * layers)
    mlps = _list(c, "mlp_layer_types", layers, lambda t: t in ("dense", "sparse"), lambda: ["dense"] + ["sparse"] * (layers - 1))
    heads = _list(c, "num_attention_heads_per_layer", layers, lambda h: isinstance(h, int) and not isinstance(h, bool) and h >= 1,
                  lambda: [heads0] * layers)
    for h in heads:
        if h % kv:
            raise Unsupported("num_attention_heads_per_layer", f"{kv} key/value heads do not divide {h} query heads")
    window = _int(c, "sliding_window") if "sliding_attention" in types else None
    ropes = {_TYPES[t]: _rope(c, t, head_dim) for t in set(types)}
    experts, top = _int(c, "num_experts"), _int(c, "num_experts_per_tok")
    if top > experts:
        raise Unsupported("num_experts_per_tok", f"top-{top} of {experts} experts")
    scale = c["moe_routed_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise Unsupported("moe_routed_scaling_factor", f"{_show(scale)} is not a positive number")
    kinds = tuple((_TYPES[t], "dense" if m == "dense" else "moe", h) for t, m, h in zip(types, mlps, heads))
    sources = {"attn": "num_attention_heads_per_layer, num_key_value_heads, head_dim, rms_norm_eps, gating",
               "moe": "num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size, moe_routed_scaling_factor",
               "mlp": "intermediate_size, hidden_act (mlp_layer_types)"}
    return Laguna(FAMILY, _int(c, "vocab_size"), _int(c, "max_position_embeddings"), width, layers, kv, head_dim, _int(c, "intermediate_size"),
                  act, _int(c, "moe_intermediate_size"), experts, top, _int(c, "shared_expert_intermediate_size"), float(scale),
                  _eps(c, "rms_norm_eps"), window, gate, ropes, kinds, _padding(c), bool(c["tie_word_embeddings"]), sources)


# --- the spec -------------------------------------------------------------------------------------


def _name(a: Laguna, kind: tuple) -> str:
    base, work, heads = kind
    varied = len({k[2] for k in a.kinds}) > 1
    return f"{base}_{work}" + (f"_h{heads}" if varied else "")


def _template(a: Laguna, kind: tuple) -> list[str]:
    base, work, heads = kind
    dims, rbase = a.ropes[base]
    norm = f"norm rmsnorm eps={_num(a.eps)}"
    att = f"turbine attention heads={heads} kv_heads={a.kv_heads} head_dim={a.head_dim}"
    if base == "local":
        att += f" window={a.window}"
    att += " rotary" + (f"={_num(dims / a.head_dim)}" if dims != a.head_dim else "") + (f" rotary_base={_num(rbase)}" if rbase != 10000.0 else "")
    att += f" qk_norm qk_norm_eps={_num(a.eps)} gate={a.gate} gate_act=softplus bias=false"
    if work == "moe":
        turb = (f"turbine moe experts={a.experts} top={a.top} hidden={a.moe_hidden} act={a.act} bias=false shared={a.shared} router=sigmoid"
                + (f" scale={_num(a.route_scale)}" if a.route_scale != 1.0 else "") + " correction=true")
    else:
        turb = f"turbine mlp hidden={a.hidden} act={a.act} bias=false"
    what = (f"sliding-window attention ({a.window} tokens)" if base == "local" else "global attention") + f" of {heads} heads"
    what += ", then routed experts" if work == "moe" else ", then a dense MLP"
    return [f"# a {a.family} layer with {what}; its attention output gated by a softplus per {a.gate}; each turbine with its norm in front",
            f"stage {a.family}_{_name(a, kind)} {{",
            "  prechamber mix {", f"    {norm}  # rms_norm_eps", f"    {att}  # {a.sources['attn']}, rope_parameters", "  }",
            "  prechamber burn {", f"    {norm}", f"    {turb}  # {a.sources['moe' if work == 'moe' else 'mlp']}", "  }",
            "}", ""]


def _text(a: Laguna, source: str) -> str:
    from .core import _header, _layer_runs

    lines = [*_header(a.family, source), f"let d_model = {a.width}  # hidden_size", ""]
    for kind in dict.fromkeys(a.kinds):
        lines += _template(a, kind)
    feed = f"feed tokens vocab={a.vocab} context={a.context} position=none" + (f" padding={a.padding}" if a.padding is not None else "")
    feed += "  # vocab_size, max_position_embeddings" + (", pad_token_id" if a.padding is not None else "")
    lines += [f"engine {a.family} {{", "  chamber width=d_model", "  throat causal", f"  {feed}", "",
              *_layer_runs(a.family, [_name(a, k) for k in a.kinds]), "", f"  norm rmsnorm eps={_num(a.eps)}  # the final norm",
              "  nozzle head" + (" tied" if a.tied else "") + "  # tie_word_embeddings", "}", ""]
    return "\n".join(lines)


# --- the weights ----------------------------------------------------------------------------------


def plan(plan, put, layout: dict, final: str, state, fused):
    """Laguna's weights onto the module (load._plan's contract). Its files keep the released names of the correction
    bias (mlp.experts.e_score_correction_bias) and the shared expert (mlp.shared_expert.), which transformers renames on
    load: either is read, and export writes the model's own."""
    from .afmoe import put_attention
    from ..mapping import _put_experts, _put_gated

    for i, st in sorted(layout.items()):
        reactor = st.moe or st.mlp
        if st.attn is None or reactor is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} lacks an attention or an mlp/moe turbine; transformers' laguna layer {i} has both"
            continue
        h = f"layers.{i}."
        put_attention(put, st, h, "g_proj")
        put(f"{st.valves[st.attn]}.weight", h + "input_layernorm.weight")
        put(f"{st.valves[reactor]}.weight", h + "post_attention_layernorm.weight")
        m = st.work_node
        if st.moe is not None:
            put(f"{st.moe}.router.weight", h + "mlp.gate.weight")
            saved = h + "mlp.experts.e_score_correction_bias"
            put(f"{st.moe}.correction", saved if saved in state else h + "mlp.gate.e_score_correction_bias")
            _put_experts(put, st.moe, h + "mlp.", m, state, fused)
            shared = "mlp.shared_expert." if h + "mlp.shared_expert.gate_proj.weight" in state else "mlp.shared_experts."
            _put_gated(put, f"{st.moe}.shared", h + shared, m.shared)
        else:
            _put_gated(put, st.mlp, h + "mlp.", m.hidden)
    put("feed.tok.weight", "embed_tokens.weight")
    put(f"{final}.weight", "norm.weight")
    put("head.weight", "lm_head.weight")
    return plan


# --- the config an engine implies (export) ---------------------------------------------------------


def owns(engine: ir.Engine) -> bool:
    """Whether an engine has attention gated by a softplus: export reads it as laguna."""
    ops = [o for st, _ in ir.nodes.leaf_stages(engine.body) for b in st.branch_list() for o in b.ops]
    return any(isinstance(o, ir.Attention) and o.gate != "none" and o.gate_act == "softplus" for o in ops)


def engine_config(engine: ir.Engine) -> dict:
    """The laguna config of an engine shaped like Laguna's decoder; export then checks, field by field, that importing it
    gives back the engine. Unsupported says why not."""
    from .core import _HF_GATED
    from .afmoe import layers_of

    attns, works = layers_of(engine, "a Laguna layer")
    moe = next((w for w in works if isinstance(w, ir.Moe)), None)
    mlp = next((w for w in works if isinstance(w, ir.Mlp)), None)
    act = (mlp or moe).act
    if act not in _HF_GATED:
        raise Unsupported("act", f"{act}: Laguna's MLP and experts are gated (swiglu or geglu)")
    ropes = {}
    for t in attns:
        typ = "sliding_attention" if t.window is not None else "full_attention"
        ropes.setdefault(typ, {"rope_type": "default", "rope_theta": t.rotary_base, "partial_rotary_factor": t.rotary_dims / t.head_dim})
    ropes = {**_DEFAULT_ROPE, **ropes}
    local = next((t for t in attns if t.window is not None), None)
    first = attns[0]
    return {"model_type": FAMILY, "architectures": [CAUSAL_LM[FAMILY]], "vocab_size": engine.feed.vocab, "hidden_size": engine.width,
            "intermediate_size": mlp.hidden if mlp else 8192, "num_hidden_layers": len(attns), "num_attention_heads": first.heads,
            "num_key_value_heads": first.kv_heads, "head_dim": first.head_dim, "hidden_act": _HF_GATED[act],
            "max_position_embeddings": engine.feed.context, "rms_norm_eps": getattr(engine.body[-1], "eps", 1e-6),
            "tie_word_embeddings": engine.nozzle.tied, "rope_parameters": ropes, "sliding_window": local.window if local is not None else 512,
            "moe_intermediate_size": moe.hidden if moe else 512, "shared_expert_intermediate_size": moe.shared if moe else 512,
            "num_experts_per_tok": moe.top if moe else 8, "num_experts": moe.experts if moe else 256,
            "layer_types": ["sliding_attention" if t.window is not None else "full_attention" for t in attns], "pad_token_id": engine.feed.padding,
            "attention_bias": False, "gating": "per-head" if first.gate == "head" else "per-element",
            "num_attention_heads_per_layer": [t.heads for t in attns],
            "mlp_layer_types": ["sparse" if isinstance(w, ir.Moe) else "dense" for w in works],
            "moe_routed_scaling_factor": moe.scale if moe else 1.0, "moe_apply_router_weight_on_input": False,
            "moe_router_logit_softcapping": 0.0}
