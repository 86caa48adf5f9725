"""Two engines compared for the function they compute, field by field.

`difference(spec, implied)` unfolds both engines into their stage instances (a stage
`x 12` and twelve stages of one layer compute the same thing) and walks them in
order; the first field whose value differs is returned as a `Difference` that says it
in both vocabularies (`attention rotary (turbine attention rotary=): spec 8 of 16
dims of each head, checkpoint all 16`).

What is compared is what changes the function in eval mode: widths, heads, norms and
their eps, activations, rotary, windows, biases, tying, merges that scale. What only
training sees is left out: dropout, an MoE's capacity and balance loss, the init
rules of cooling / layerscale / deepnorm merges (their learned gains are weights, and
weights are checked key by key), and the startup block. Names are left out too: the
spec's `mix` and `burn` are the checkpoint's attention and MLP wherever they sit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import ir

# Fields that do not change what the engine computes in eval mode.
_TRAINING_ONLY = {"dropout", "capacity", "balance", "span", "name", "template", "width_in", "width_out", "out_width", "context",
                  "chunk", "dt_min", "dt_max", "correction_rate"}  # chunk: how a scan is split, not what it computes; dt_min/max: dt's
# initialisation; correction_rate: an MoE's bias update, in training only

# field -> (the ML words, the spec's words)
WORDS: dict[str, tuple[str, str]] = {
    "op": ("block structure", "the statement"),
    "kind": ("residual merge", "merge"),
    "value": ("residual scale", "merge scale="),
    "alpha": ("DeepNet residual scale", "merge deepnorm alpha="),
    "type": ("norm type", "norm layernorm|rmsnorm"),
    "eps": ("norm epsilon", "norm eps="),
    "affine": ("learned norm gain", "norm affine="),
    "offset": ("norm gain offset", "norm offset="),
    "qk_norm_eps": ("qk-norm epsilon", "turbine attention qk_norm_eps="),
    "qk_norm_across": ("qk-norm across all heads", "turbine attention qk_norm_across"),
    "qk_norm_type": ("qk-norm type", "turbine attention qk_norm_type="),
    "qk_norm_bias": ("qk-norm bias", "turbine attention qk_norm_bias"),
    "qk_norm_offset": ("qk-norm gain offset", "turbine attention qk_norm_offset="),
    "qk_norm_affine": ("learned qk-norm gain", "turbine attention qk_norm_affine="),
    "qk_norm_after_rotary": ("qk-norm after rotary", "turbine attention qk_norm_after_rotary"),
    "qk_norm_head_gains": ("a qk-norm gain per head", "turbine attention qk_norm_head_gains"),
    "bias": ("bias", "bias="),
    "out_bias": ("output projection bias", "turbine attention out_bias="),
    "width": ("width", "chamber width="),
    "heads": ("attention heads", "turbine attention heads="),
    "kv_heads": ("key/value heads (GQA)", "turbine attention kv_heads="),
    "head_dim": ("head dimension", "turbine attention head_dim="),
    "mask": ("attention mask", "turbine attention mask="),
    "window": ("sliding window", "turbine attention window="),
    "rotary_dims": ("rotary positions", "turbine attention rotary="),
    "rotary_base": ("rotary base (rope_theta)", "turbine attention rotary_base="),
    "qk_norm": ("qk-norm", "turbine attention qk_norm"),
    "hidden": ("MLP hidden width", "turbine mlp|moe hidden="),
    "act": ("activation", "act="),
    "experts": ("experts", "turbine moe experts="),
    "top": ("experts per token (top-k)", "turbine moe top="),
    "normalize": ("top-k weight renormalisation", "turbine moe normalize="),
    "router": ("router scores (softmax or sigmoid)", "turbine moe router="),
    "top_groups": ("expert groups kept per token (topk_group)", "turbine moe top_groups="),
    "group_score": ("expert group score", "turbine moe group_score="),
    "correction": ("selection-only router bias (e_score_correction_bias)", "turbine moe correction="),
    "detach": ("stop-gradient on the branch (open cycle)", "prechamber detach"),
    "overboard": ("unmerged branch", "prechamber overboard"),
    "loss": ("auxiliary loss weight", "prechamber overboard loss="),
    "vocab": ("vocabulary size", "feed tokens vocab="),
    "position": ("positions", "feed tokens position="),
    "scale": ("scale", "scale="),
    "padding": ("padding token (padding_idx)", "feed tokens padding="),
    "tied": ("tied input/output embeddings", "nozzle head tied"),
    "throat": ("causal mask", "throat"),
    "norm": ("shared norm of the parallel block", "fullflow norm"),
    "ops": ("the branch's operators", "prechamber"),
    "branches": ("parallel branches", "fullflow"),
    "causal": ("causal mixing", "throat"),
    "size": ("window size", "size="),
    "out": ("output width", "turbine linear out="),
    "layers": ("layers (stage instances)", "stage ... x N"),
    "main": ("operators on the main line", "norm / turbine at engine level"),
    # the expander mixers' fields
    "inner": ("ssm inner width (channels)", "turbine ssm expand="),
    "state": ("ssm state size", "turbine ssm state="),
    "dt_rank": ("ssm step projection rank", "turbine ssm dt_rank="),
    "norms": ("ssm dt/B/C norms (Jamba)", "turbine ssm norms"),
    "conv": ("ssm conv kernel", "turbine ssm conv="),
    "conv_bias": ("ssm conv bias", "turbine ssm conv_bias="),
    "groups": ("ssm B/C groups", "turbine ssm groups="),
    "latent": ("KV latent width (kv_lora_rank)", "turbine attention latent="),
    "q_latent": ("query latent width (q_lora_rank)", "turbine attention q_latent="),
    "v_dim": ("value head dimension", "turbine attention v_dim="),
    "shared": ("shared expert width", "turbine moe shared="),
    "rotary_scaling": ("rotary scaling (rope_type)", "turbine attention rotary_scaling="),
    "rotary_factor": ("rotary scaling factor", "turbine attention rotary_factor="),
    "rotary_original": ("rotary scaling's original context (original_max_position_embeddings)", "turbine attention rotary_original="),
    "rotary_low": ("llama3 rotary low_freq_factor", "turbine attention rotary_low="),
    "rotary_high": ("llama3 rotary high_freq_factor", "turbine attention rotary_high="),
    "rotary_beta_fast": ("YaRN beta_fast", "turbine attention rotary_beta_fast="),
    "rotary_beta_slow": ("YaRN beta_slow", "turbine attention rotary_beta_slow="),
    "rotary_gain": ("YaRN attention_factor (cos/sin gain)", "turbine attention rotary_attention_factor="),
    "rotary_temperature": ("query temperature (llama_4_scaling_beta)", "turbine attention rotary_temperature="),
    "softcap": ("logit soft-cap", "softcap="),
    "alibi": ("ALiBi positions", "turbine attention alibi"),
    "alibi_scaled": ("ALiBi bias scaled with the logits (Falcon)", "turbine attention alibi_scaled"),
    "rotary_truncate": ("YaRN's correction range rounded out (truncate)", "turbine attention rotary_truncate="),
    "sinks": ("attention sinks (a learned logit per head)", "turbine attention sinks"),
    "router_bias": ("the router's bias", "turbine moe router_bias"),
    "normalize_eps": ("the sigmoid router's renormalisation epsilon (sum + eps)", "turbine moe normalize_eps="),
    "clamp": ("the clamped SwiGLU's bound (swiglu_limit)", "clamp="),
}

# what each rotary scaling reads (the rest of an ir.RotaryScaling is its defaults, never compared)
_SCALING_FIELDS = {"linear": ("factor",), "dynamic": ("factor", "original", "temperature"), "llama3": ("factor", "original", "low", "high", "temperature"),
                   "yarn": ("factor", "original", "beta_fast", "beta_slow", "gain", "truncate", "temperature")}


@dataclass(frozen=True)
class Difference:
    where: str  # the spec's layout path: "stages.3.mix.attn"
    field: str  # the IR field: "rotary_dims"
    spec: object
    checkpoint: object
    context: dict  # the node the field sits on (spec side), for the wording

    def __str__(self) -> str:
        return f"{self.where}: {self.text()}"

    def text(self) -> str:
        """What differs, without where: `rotary positions (turbine attention rotary=): spec ..., checkpoint ...`."""
        ml, ours = WORDS.get(self.field, (self.field.replace("_", " "), self.field + "="))
        if self.field == "scale":  # one IR field name, three places
            ml, ours = {"feed": ("embedding multiplier", "feed tokens scale="), "head": ("logit scale", "nozzle head scale=")}.get(
                self.where, ("routed weights' scale (routed_scaling_factor)", "turbine moe scale=") if self.where.endswith(".moe")
                else ("attention logit scale", "turbine attention scale="))
        if self.field == "groups" and self.where.endswith(".moe"):
            ml, ours = ("expert groups (n_group)", "turbine moe groups=")
        if self.field == "softcap":  # two places
            ml, ours = ("final-logit soft-cap", "nozzle head softcap=") if self.where == "head" else ("attention logit soft-cap", "turbine attention softcap=")
        return f"{ml} ({ours}): spec {self.show(self.spec)}, checkpoint {self.show(self.checkpoint)}"

    def show(self, v) -> str:
        if self.field == "rotary_dims":
            hd = self.context.get("head_dim")
            return "none" if v == 0 else f"all of each head ({v} dims)" if v == hd else f"{v} of each head's {hd} dims"
        if self.field == "scale" and v is None:
            return "1/sqrt(head_dim)"
        if self.field == "window":
            return "none (full attention)" if v is None else f"{v} tokens"
        if self.field == "tied":
            return "tied to the embedding" if v else "its own matrix"
        if isinstance(v, bool):
            return "on" if v else "off"
        if isinstance(v, float):
            return f"{v:g}"
        if isinstance(v, dict):
            return v.get("op") or v.get("kind") or "a block"
        if isinstance(v, list):
            return f"{len(v)}"
        return "none" if v is None else str(v)


def _merge(m) -> dict:
    """A merge by what it computes in eval mode (its init rule is training's business)."""
    if m is None:
        return {"kind": "none"}
    if isinstance(m, (ir.PlainMerge, ir.CoolingMerge)):
        return {"kind": "add"}  # x + f(x); cooling only sets the init std
    if isinstance(m, ir.ScaleMerge):
        return {"kind": "add"} if m.value == 1.0 else {"kind": "scale", "value": m.value}
    if isinstance(m, ir.DeepnormMerge):
        return {"kind": "deepnorm", "alpha": m.alpha}
    return {"kind": m.kind}  # rezero, layerscale, gate: learned gains, checked as weights


def _node(n) -> dict:
    d = {}
    for k, v in n.model_dump(exclude={"span"}).items():
        if k in _TRAINING_ONLY:
            continue
        d[k] = v
    if isinstance(n, ir.Moe):
        d["normalize_eps"] = n.normalize_eps  # out of the dump at its default: said out loud, so a difference names both sides
    if isinstance(n, ir.Attention) and n.scale is None:
        d["scale"] = n.head_dim ** -0.5  # the default, said out loud: Granite's attention_multiplier may equal it
    if isinstance(n, ir.Attention):  # the scaling by what it computes: its kind, then what that kind reads
        sc = d.pop("rotary_scaling", None) and n.rotary_scaling
        d["rotary_scaling"] = sc.type if sc else "none"
        for k in _SCALING_FIELDS.get(sc.type if sc else "", ()):
            d[f"rotary_{k}"] = sc.gain() if k == "gain" else getattr(sc, k)
    return d


def _branch(b: ir.Prechamber, bl, ops_paths: list[str]) -> dict:
    return {"op": "branch", "detach": b.detach, "overboard": b.overboard, "loss": b.loss,
            "ops": [(_node(o), p) for o, p in zip(b.ops, ops_paths)], "merge": _merge(b.merge)}


def normal_form(engine: ir.Engine) -> list[tuple[str, dict, str]]:
    """The engine as a flat list of (label, fields, spec path): the feed, each stage
    instance's items, the engine-level ops, the nozzle."""
    lay = ir.layout.layout(engine)
    f = engine.feed
    out: list[tuple[str, dict, str]] = [("feed", {"vocab": f.vocab, "position": f.position, "scale": f.scale, "width": engine.width,
                                                  "throat": engine.throat, "padding": f.padding}, "feed")]
    layers = []
    for it in lay.main:
        if isinstance(it, ir.layout.Part):
            out.append(("main", _node(it.node), it.path))
    for inst, it in lay.layers():  # every layer in the order it runs: a nested stage compares as its layers
        items = []
        for x in it.items:
            if isinstance(x, ir.layout.Part):
                items.append(({"op": "inline", "node": _node(x.node)}, f"{inst}.{x.local}"))
            elif isinstance(x, ir.layout.BranchLayout):
                items.append((_branch(x.branch, x, [f"{inst}.{p.local}" for p in x.ops]), f"{inst}.{x.attr}"))
            else:
                ff = x.fullflow
                items.append(({"op": "parallel", "norm": _node(ff.norm) if ff.norm else None,
                               "branches": [(_branch(b.branch, b, [f"{inst}.{p.local}" for p in b.ops]), f"{inst}.{b.attr}") for b in x.branches]},
                              inst))
        layers.append((inst, items))
    out.append(("layers", {"layers": layers}, "stages"))
    out.append(("nozzle", {"tied": engine.nozzle.tied, "bias": engine.nozzle.bias, "vocab": engine.nozzle.vocab, "scale": engine.nozzle.scale,
                           "softcap": engine.nozzle.softcap}, "head"))
    return out


def _equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)
    return a == b


def _diff_fields(a: dict, b: dict, where: str) -> Difference | None:
    for k in list(a) + [k for k in b if k not in a]:
        va, vb = a.get(k), b.get(k)
        if k == "ops":
            d = _diff_list(va, vb, where, "ops")
        elif k == "branches":
            d = _diff_list(va, vb, where, "branches")
        elif k in ("merge", "node", "norm") and isinstance(va, dict) and isinstance(vb, dict):
            d = _diff_fields(va, vb, where)
        elif isinstance(va, dict) and isinstance(vb, dict) and "op" in va:
            d = _diff_fields(va, vb, where)
        else:
            d = None if _equal(va, vb) else Difference(where, k, va, vb, a)
        if d is not None:
            return d
    return None


def _diff_list(a: list, b: list, where: str, field: str) -> Difference | None:
    a, b = a or [], b or []
    for (na, pa), (nb, _) in zip(a, b):
        if na.get("op") != nb.get("op"):
            return Difference(pa, "op", na.get("op"), nb.get("op"), na)
        d = _diff_fields(na, nb, pa)
        if d is not None:
            return d
    if len(a) != len(b):
        return Difference(where, field, a, b, {})
    return None


def difference(spec: ir.Engine, implied: ir.Engine) -> Difference | None:
    """The first field where `spec` computes something other than `implied` (the IR a
    checkpoint's config implies), or None when they are the same function."""
    A, B = normal_form(spec), normal_form(implied)
    main_a = [x for x in A if x[0] == "main"]
    main_b = [x for x in B if x[0] == "main"]
    fa = {x[0]: x for x in A if x[0] != "main"}
    fb = {x[0]: x for x in B if x[0] != "main"}
    d = _diff_fields(fa["feed"][1], fb["feed"][1], "feed")
    if d:
        return d
    la, lb = fa["layers"][1]["layers"], fb["layers"][1]["layers"]
    for (ia, items_a), (_, items_b) in zip(la, lb):
        d = _diff_list(items_a, items_b, ia, "ops")
        if d:
            return d
    if len(la) != len(lb):
        return Difference("stages", "layers", len(la), len(lb), {})
    for (_, na, pa), (_, nb, _) in zip(main_a, main_b):
        if na.get("op") != nb.get("op"):
            return Difference(pa, "op", na.get("op"), nb.get("op"), na)
        d = _diff_fields(na, nb, pa)
        if d:
            return d
    if len(main_a) != len(main_b):
        return Difference("main line", "main", len(main_a), len(main_b), {})
    return _diff_fields(fa["nozzle"][1], fb["nozzle"][1], "head")
