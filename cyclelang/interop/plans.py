"""A family's weight plan: which checkpoint keys (through which transform) fill each of the
module's tensors. `_plan` maps the Llama-shaped families layer by layer (their key names in
mapping.py's KEYS) and hands the others to their own plans (families/: ssm, latent, bamba,
sinks, hybrid, conv, gemma4, delta; lineage.py).
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..ir.kinds import is_gated
from . import families
from .families.bamba import _plan_bamba, _plan_granitemoehybrid
from .families.hybrid import _plan_falcon_h1, _plan_nemotron_h
from .families.latent import _plan_axk1, _plan_deepseek_v2, _plan_deepseek_v3, _plan_latent_dense
from .families.sinks import _plan_gpt_oss
from .families.ssm import _plan_jamba, _plan_mamba, _plan_mamba2
from .mapping import (KEYS, _SAME, _TRANSPOSE, _Cat, _GroupedQkv, _GroupedRows, _Index, _IndexT, _Keys, _layout, _NeoxQkv, _Plan, _Shaped, _Turned,
                      _final_valve, _parent, _put_experts, _put_gated)


def _plan(arch: str, spec, state: dict, fused: bool | None = None, halves: bool | None = None) -> _Plan:
    """fused: whether Mixtral's experts come as transformers 5's fused tensors (read from
    the state dict when None)."""
    plan = _Plan()
    e = plan.entries

    def put(ours, srcs, fn=_SAME):
        srcs = (srcs,) if isinstance(srcs, str) else tuple(srcs)
        e[ours] = (srcs, fn)

    gpt2, family_moe = arch == "gpt2", arch in ("mixtral", "qwen2_moe", "cohere2_moe", "hunyuan_v1_moe", "minimax_m2", "flint") or arch in ROUTED
    layout, final = _layout(spec), _final_valve(spec)
    if arch == "mamba2":
        return _plan_mamba2(plan, put, layout, final)
    if arch in ("minicpm3", "youtu"):
        return _plan_latent_dense(plan, put, layout, final, arch == "minicpm3" or bool(halves))
    if arch in _EXPANDER_PLANS:
        return _EXPANDER_PLANS[arch](plan, put, layout, final, state, fused)
    if arch in families._delta.READERS:  # the gated DeltaNet hybrids (families/delta.py)
        return families._delta.plan(arch, plan, put, spec, state, fused)
    if arch in families.lineage.READERS:  # the GPT-2 lineage's layers (lineage.py)
        return families.lineage.plan(arch, plan, put, spec, _SAME, _TRANSPOSE, _Cat, _NeoxQkv)
    for i, st in sorted(layout.items()):
        moe = family_moe and not ((arch in ("qwen2_moe", "qwen3_moe", "mellum", "flint") or arch in DENSE_AMONG) and st.moe is None and st.mlp is not None)  # their dense layers: a gated MLP
        if st.attn is None:
            plan.reasons[f"stages.{i}"] = f"stage {i} has no attention turbine; transformers' {arch} layer {i} has one"
            continue
        reactor = st.moe if moe else st.mlp
        if reactor is None:
            kind = "moe" if moe else "mlp"
            plan.reasons[f"stages.{i}"] = f"stage {i} has no {kind} turbine; transformers' {arch} layer {i} has one"
            continue
        # a turbine without a valve before it maps its checkpoint norm nowhere, which is then left over
        an, rn = st.valves.get(st.attn, _parent(st.attn) + "norm"), st.valves.get(reactor, _parent(reactor) + "norm")
        if gpt2:
            h = f"h.{i}."
            for p in ("weight", "bias"):
                fn = _TRANSPOSE if p == "weight" else _SAME
                put(f"{an}.{p}", h + f"ln_1.{p}")
                put(f"{rn}.{p}", h + f"ln_2.{p}")
                put(f"{st.attn}.qkv.{p}", h + f"attn.c_attn.{p}", fn)
                put(f"{st.attn}.proj.{p}", h + f"attn.c_proj.{p}", fn)
                put(f"{reactor}.fc.{p}", h + f"mlp.c_fc.{p}", fn)
                put(f"{reactor}.proj.{p}", h + f"mlp.c_proj.{p}", fn)
            continue
        a, ks = st.attn_node, KEYS.get(arch, _Keys())
        if arch == "falcon" and _separate_parallel(spec):  # the new decoder's two norms
            ks = replace(ks, attn_norm="ln_attn", mlp_norm="ln_mlp")
        h = f"{ks.layers}.{i}."
        if arch == "sarvam_moe" and h + "self_attn.query_key_value.weight" in state:  # as saved (see _RENAMES)
            ks = replace(ks, fused_qkv="self_attn.query_key_value")
        qkv = _Cat((a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim))
        gate_up = _Cat((st.work_node.hidden, st.work_node.hidden))
        for p in ("weight", "bias"):  # biases only where the spec (and the config) has them
            if st.attn in st.posts:  # OLMo-2: the norms follow the turbines; Gemma 2: on both sides
                put(f"{st.posts[st.attn]}.{p}", h + f"{ks.attn_post}.{p}")
            if st.attn not in st.posts or st.attn in st.valves:
                put(f"{an}.{p}", h + f"{ks.attn_norm}.{p}")
            if reactor in st.posts:
                put(f"{st.posts[reactor]}.{p}", h + f"{ks.mlp_post}.{p}")
            if (reactor not in st.posts or reactor in st.valves) and rn != an:  # a parallel block's shared norm (Phi) is the attention's
                put(f"{rn}.{p}", h + f"{ks.mlp_norm}.{p}")
        for p in ("weight", "bias"):  # qk-norms: Qwen3 per head, OLMo-2 across heads; Persimmon's layernorms have a bias
            if a.qk_norm_head_gains and arch in ("stablelm", "cohere"):  # each head's gain, ours one vector head by head
                for ours, theirs, n in (("q_norm", ks.qk_norms[0], a.heads), ("k_norm", ks.qk_norms[1], a.kv_heads)):
                    if arch == "stablelm":  # one LayerNorm per head: norms.{j}
                        put(f"{st.attn}.{ours}.{p}", [h + f"{theirs}.norms.{j}.{p}" for j in range(n)], _Cat((a.head_dim,) * n))
                    else:  # Cohere's one (heads, head_dim) weight
                        put(f"{st.attn}.{ours}.{p}", h + f"{theirs}.{p}", _Shaped((n, a.head_dim)))
                continue
            put(f"{st.attn}.q_norm.{p}", h + f"{ks.qk_norms[0]}.{p}")
            put(f"{st.attn}.k_norm.{p}", h + f"{ks.qk_norms[1]}.{p}")
        gated = is_gated(st.work_node.act)
        for p in ("weight", "bias"):
            if arch == "falcon" and 1 < a.kv_heads < a.heads:  # the new decoder's rows, group by group [q heads | k | v]
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}", _GroupedQkv(a.kv_heads, a.heads // a.kv_heads, a.head_dim))
            elif ks.neox_qkv and a.kv_heads == a.heads:  # Falcon's multi-query rows are [q heads | k | v], as ours
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}", _NeoxQkv(a.heads, a.head_dim))
            elif ks.mp_qkv:
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}", _GroupedRows(ks.mp_qkv))
            elif ks.fused_qkv:
                put(f"{st.attn}.qkv.{p}", h + f"{ks.fused_qkv}.{p}")
            else:
                put(f"{st.attn}.qkv.{p}", [h + f"{ks.q.format(n)}.{p}" for n in "qkv"], _Turned(qkv.sizes, a.head_dim) if ks.turned else qkv)
            put(f"{st.attn}.proj.{p}", h + f"{ks.o}.{p}")
            if a.sinks:  # a learned sink per head (granite_swa, flint; Flint's files name it softmax_offset)
                put(f"{st.attn}.sinks", h + ("self_attn.softmax_offset" if h + "self_attn.softmax_offset" in state else "self_attn.sinks"))
            if moe:
                continue
            if not gated:
                put(f"{reactor}.fc.{p}", h + f"{ks.plain[0]}.{p}")
                put(f"{reactor}.proj.{p}", h + f"{ks.plain[1]}.{p}")
                continue
            if ks.fused_gate_up:
                put(f"{reactor}.fc.{p}", h + f"{ks.fused_gate_up}.{p}")
            else:
                put(f"{reactor}.fc.{p}", [h + f"{ks.gated[0]}.{p}", h + f"{ks.gated[1]}.{p}"], gate_up)
            put(f"{reactor}.proj.{p}", h + f"{ks.gated[2]}.{p}")
        if not moe:
            continue
        if arch in ROUTED:
            _put_routed(put, arch, reactor, h, st.work_node, state, fused)
            continue
        if arch == "hunyuan_v1_moe":  # the router mlp.gate.wg, one summed shared MLP (shared_mlp), the experts fused
            put(f"{reactor}.router.weight", h + "mlp.gate.wg.weight")
            s = h + "mlp.shared_mlp."
            put(f"{reactor}.shared.fc.weight", [s + "gate_proj.weight", s + "up_proj.weight"], _Cat((st.work_node.shared, st.work_node.shared)))
            put(f"{reactor}.shared.proj.weight", s + "down_proj.weight")
            is_fused = (h + "mlp.experts.gate_up_proj" in state) if fused is None else fused  # saved files: mlp.experts.{e}.gate_proj ...
            for x in range(st.experts):
                if is_fused:
                    put(f"{reactor}.experts.{x}.fc.weight", h + "mlp.experts.gate_up_proj", _Index(x, st.experts))
                    put(f"{reactor}.experts.{x}.proj.weight", h + "mlp.experts.down_proj", _Index(x, st.experts))
                    continue
                b = h + f"mlp.experts.{x}."
                put(f"{reactor}.experts.{x}.fc.weight", [b + "gate_proj.weight", b + "up_proj.weight"], gate_up)
                put(f"{reactor}.experts.{x}.proj.weight", b + "down_proj.weight")
            continue
        is_fused = (h + "mlp.experts.gate_up_proj" in state) if fused is None else fused
        qwen = arch in ("qwen2_moe", "cohere2_moe", "flint")  # their saved files: mlp.experts.{e}.gate_proj/up_proj/down_proj, the router mlp.gate
        put(f"{reactor}.router.weight", h + ("mlp.gate.weight" if is_fused or qwen else "block_sparse_moe.gate.weight"))
        if arch == "minimax_m2" and st.work_node.correction:  # Mixtral's names, and the selection-only bias on the block
            put(f"{reactor}.correction", h + ("mlp." if is_fused else "block_sparse_moe.") + "e_score_correction_bias")
        if st.work_node.shared:  # Qwen2-MoE's shared expert and its gate
            s = h + ("mlp.shared_experts." if arch == "cohere2_moe" else "mlp.shared_expert.")  # Cohere 2 MoE's: ungated
            put(f"{reactor}.shared.fc.weight", [s + "gate_proj.weight", s + "up_proj.weight"], _Cat((st.work_node.shared, st.work_node.shared)))
            put(f"{reactor}.shared.proj.weight", s + "down_proj.weight")
            put(f"{reactor}.shared_gate.weight", h + "mlp.shared_expert_gate.weight")
        for x in range(st.experts):
            ours = f"{reactor}.experts.{x}"
            if is_fused:
                put(f"{ours}.fc.weight", h + "mlp.experts.gate_up_proj", _Index(x, st.experts))
                put(f"{ours}.proj.weight", h + "mlp.experts.down_proj", _Index(x, st.experts))
            elif qwen:
                b = h + f"mlp.experts.{x}."
                put(f"{ours}.fc.weight", [b + "gate_proj.weight", b + "up_proj.weight"], gate_up)
                put(f"{ours}.proj.weight", b + "down_proj.weight")
            else:
                b = h + f"block_sparse_moe.experts.{x}."
                put(f"{ours}.fc.weight", [b + "w1.weight", b + "w3.weight"], gate_up)
                put(f"{ours}.proj.weight", b + "w2.weight")
    if gpt2:
        put("feed.tok.weight", "wte.weight")
        put("feed.pos.weight", "wpe.weight")
        put(f"{final}.weight", "ln_f.weight")
        put(f"{final}.bias", "ln_f.bias")
        put("head.weight", "lm_head.weight")
        return plan
    ks = KEYS.get(arch, _Keys())
    put("feed.tok.weight", f"{ks.embed}.weight")
    if arch == "bloom":  # BLOOM's norm right after the embedding: the first valve on the main line
        first = [p.path for p in ir.layout.layout(spec).main if isinstance(p, ir.layout.Part) and p.role == "valve"][0]
        for p in ("weight", "bias"):
            put(f"{first}.{p}", f"word_embeddings_layernorm.{p}")
    for p in ("weight", "bias"):
        put(f"{final}.{p}", f"{ks.final}.{p}")
        put(f"head.{p}", f"{ks.head}.{p}")
    put("head_bias", f"{ks.head}.bias")  # a tied head's own bias (CodeGen's, GPT-J's): the weight is the embedding
    return plan


# The routed-expert families' names inside `layers.{i}.`: (the block, its router, the fused experts in memory,
# the experts as saved: "split" per expert gate/up/down_proj, or the fused tensors' saved names).
ROUTED = {
    "qwen3_moe": ("mlp.", "gate.weight", "split"),
    "olmoe": ("mlp.", "gate.weight", "split"),
    "flex_olmo": ("mlp.", "gate.weight", "split"),
    "granitemoe": ("block_sparse_moe.", "router.weight", ("input_linear.weight", "output_linear.weight", "router.layer.weight")),
    "granitemoeshared": ("block_sparse_moe.", "router.weight", ("input_linear.weight", "output_linear.weight", "router.layer.weight")),
    "aria_text": ("mlp.", "router.weight", ("experts.fc1.weight", "experts.fc2.weight", "router.weight")),
    "mellum": ("mlp.", "gate.weight", "split"),
    "glm4_moe": ("mlp.", "gate.weight", "split"),
    "dots1": ("mlp.", "gate.weight", "split"),
    "ernie4_5_moe": ("mlp.", "gate.weight", "split"),
    "exaone_moe": ("mlp.", "gate.weight", "split"),
    "solar_open": ("mlp.", "gate.weight", "split"),
    "sarvam_moe": ("mlp.", "gate.weight", "split"),
    "hy_v3": ("mlp.", "gate.weight", "split"),
    "granitemoe_swa": ("block_sparse_moe.", "router.weight", ("input_linear.weight", "output_linear.weight", "router.layer.weight")),
}
# DeepSeek-V3's routers (families/routed_v3.py): the selection-only bias's name inside the block; their dense layers
CORRECTION = {"glm4_moe": "gate.e_score_correction_bias", "dots1": "gate.e_score_correction_bias", "solar_open": "gate.e_score_correction_bias",
              "sarvam_moe": "gate.e_score_correction_bias", "hy_v3": "e_score_correction_bias",
              "ernie4_5_moe": "moe_statics.e_score_correction_bias", "exaone_moe": ("e_score_correction_bias", "gate.e_score_correction_bias")}  # (as saved, as in memory)
DENSE_AMONG = ("glm4_moe", "dots1", "ernie4_5_moe", "exaone_moe", "sarvam_moe", "hy_v3")


class _Row:
    """ERNIE 4.5's correction bias, stored as one row (1, experts): ours is (experts,)."""

    def __call__(self, t):
        return t.reshape(-1)

    def inverse(self, t):
        return [t.reshape(1, -1)]


def _put_routed(put, arch: str, reactor: str, h: str, node, state, fused) -> None:
    """A routed-expert family's moe turbine: its router, experts and shared expert, from transformers 5's fused expert
    tensors (a model's own state dict; export writes these) or the names save_pretrained writes."""
    block, router, saved = ROUTED[arch]
    b = h + block
    if saved == "split":
        put(f"{reactor}.router.weight", b + router)
        _put_experts(put, reactor, b, node, state, fused)
    else:
        mem = (b + "experts.gate_up_proj" in state) if fused is None else fused
        gate_up, down, rkey = (b + "experts.gate_up_proj", b + "experts.down_proj", b + router) if mem else tuple(b + k for k in saved)
        index = _IndexT if arch == "aria_text" else _Index  # Aria stores each expert (in, out)
        put(f"{reactor}.router.weight", rkey)
        for x in range(node.experts):
            put(f"{reactor}.experts.{x}.fc.weight", gate_up, index(x, node.experts))
            put(f"{reactor}.experts.{x}.proj.weight", down, index(x, node.experts))
    if node.correction and arch in CORRECTION:
        names = CORRECTION[arch] if isinstance(CORRECTION[arch], tuple) else (CORRECTION[arch],)
        name = next((n for n in names if b + n in state), names[0])
        put(f"{reactor}.correction", b + name, _Row() if arch == "ernie4_5_moe" else _SAME)
    if node.shared and arch in ("granitemoeshared", "granitemoe_swa"):  # one fused [gate | up] matrix, as ours
        put(f"{reactor}.shared.fc.weight", h + "shared_mlp.input_linear.weight")
        put(f"{reactor}.shared.proj.weight", h + "shared_mlp.output_linear.weight")
    elif node.shared:
        _put_gated(put, f"{reactor}.shared", b + "shared_experts.", node.shared)


_EXPANDER_PLANS = {"mamba": _plan_mamba, "jamba": _plan_jamba, "deepseek_v2": _plan_deepseek_v2, "deepseek_v3": _plan_deepseek_v3,
                   "falcon_mamba": _plan_mamba,
                   "sarvam_mla": _plan_deepseek_v3,
                   "glm4_moe_lite": _plan_deepseek_v3,
                   "axk1": _plan_axk1,
                   "bamba": _plan_bamba,
                   "granitemoehybrid": _plan_granitemoehybrid,
                   "gpt_oss": _plan_gpt_oss,
                   "falcon_h1": _plan_falcon_h1,
                   "nemotron_h": _plan_nemotron_h,
                   }
_EXPANDER_PLANS.update(families._conv.PLANS)  # LFM2, LFM2-MoE (families/conv.py)


_EXPANDER_PLANS[families._gemma4.FAMILY] = families._gemma4.plan  # Gemma 4's layers (families/gemma4.py)
_EXPANDER_PLANS[families._gemma4.UNIFIED] = families._gemma4.plan
_EXPANDER_PLANS[families._afmoe.FAMILY] = families._afmoe.plan  # AFMoE's layers (families/afmoe.py)
_EXPANDER_PLANS[families._laguna.FAMILY] = families._laguna.plan  # Laguna's layers (families/laguna.py)


def _separate_parallel(spec) -> bool:
    """Whether the spec's layers are parallel blocks with a norm in each branch (GPT-NeoX, Falcon's new decoder)."""
    for op in spec.body if isinstance(spec, ir.Engine) else spec.engine.body:
        if isinstance(op, ir.Stage):
            return len(op.ops) == 1 and isinstance(op.ops[0], ir.Fullflow) and op.ops[0].norm is None
    return False
