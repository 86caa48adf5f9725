"""The expander cycle: an SSM and the imported families against transformers, a flat decoding cost."""

from __future__ import annotations

import copy
import gc
import sys

from .common import _loss, adamw, compile_regions, FLAT, MAMBA2, MAMBA2_STATE, median, quartiles, ratio, SHORT_CONV, shrunk, spec_text, time_sides


def _train_against_hf(name, ours, hf, args, torch, c):
    """One training step (forward, backward, AdamW) of ours and transformers' model at the same
    weights, eager and both compiled: {"eager"|"compiled": {"ms": {...}, "vs_hf": ratio}}.
    Compiled, ours is timed twice in the same rounds: whole (`torch.compile(model)`, as
    transformers is) and by regions (a copy through the generated file's `compile_model`, what
    `cyclec train --compile` runs): "regional_vs_hf" and "regional_vs_whole" beside "vs_hf"."""
    B, T = args.batch, args.seq
    idx = torch.randint(0, c.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
    with torch.no_grad():
        ours.eval(), hf.eval()
        a, b = float(ours(idx, tgt)[1]), float(hf(input_ids=idx, labels=idx).loss)
    assert abs(a - b) < 1e-4, f"{name}: compiled {a} vs transformers {b}"
    res = {}
    for compiled in (False, True):
        sides = {}
        runs = (("cyclec", ours, False), ("transformers", hf, True))
        if compiled:  # a copy of ours as the eager rounds left it, compiled in place, each distinct stage once
            regional = compile_regions(copy.deepcopy(ours))
            runs += (("regional", regional, False),)
        for label, model, is_hf in runs:
            model.train()
            opt = adamw(model, torch)
            fwd = torch.compile(model) if compiled and label != "regional" else model

            def step(fwd=fwd, opt=opt, is_hf=is_hf):
                opt.zero_grad(set_to_none=True)
                _loss(fwd, idx, tgt, hf=is_hf).backward()
                opt.step()

            for _ in range(2):  # warm-up (and, compiled, the compilation)
                step()
            sides[label] = step
        cpu = {}
        times = time_sides(sides, args.rounds, args.steps, cpu=cpu)
        key = "compiled" if compiled else "eager"
        res[key] = {"ms": {k: 1000 * median(v) for k, v in times.items()}, "vs_hf": ratio(times, "cyclec", "transformers")}
        # by this process's CPU time, the per-round ratios' quartiles beside their median: the
        # machine's load moves it less than the wall clock
        res[key]["cpu"] = {label: [ratio(cpu, label, "transformers"), *quartiles(cpu, label, "transformers")]
                           for label in sides if label != "transformers"}
        if compiled:
            res[key].update(regional_vs_hf=ratio(times, "regional", "transformers"), regional_vs_whole=ratio(times, "regional", "cyclec"))
        print(f"  {name} {key}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in res[key]["ms"].items()) + f"; cyclec/transformers {res[key]['vs_hf']:.3f}"
              + (f", regional/transformers {res[key]['regional_vs_hf']:.3f}, regional/whole {res[key]['regional_vs_whole']:.3f}" if compiled else "")
              + "; by CPU time " + ", ".join(f"{k}/transformers {m:.3f} ({lo:.3f}-{hi:.3f})" for k, (m, lo, hi) in res[key]["cpu"].items()),
              flush=True)
    return res


# DeepSeek-V2 at width 256: 4 heads, a 64-wide KV latent, nope 32 + rope 16, values 32; a dense
# first layer (SwiGLU 704), then 3 layers of 8 routed experts (top 2, 128 wide) beside one shared
DEEPSEEK_V2 = dict(hidden_size=256, intermediate_size=704, moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8,
                   n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, max_position_embeddings=256, tie_word_embeddings=False)


# DeepSeek-V3 at the same size: its router (sigmoid scores, a selection-only correction bias, 4 groups of 2 experts, the
# best 2 groups kept, the weights renormalised and scaled by 2.5) on the same latent attention; Qwen3-MoE at width 256:
# 4 heads of 64 (2 kv heads), a qk-norm per head, 8 experts (top 2, 128 wide), renormalised, in all 4 layers
DEEPSEEK_V3 = dict(DEEPSEEK_V2, num_key_value_heads=4, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)
QWEN3_MOE = dict(hidden_size=256, intermediate_size=704, moe_intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                 max_position_embeddings=256, tie_word_embeddings=False)
# Qwen3-Next at width 256: 3 gated DeltaNet layers (8 value heads over 4 key heads, 64 wide, conv 4) then 1 attention layer
# (4 heads of 64 over 2, the output gate, quarter rotary), 8 experts (top 2, 128 wide) beside a gated shared one (256)
QWEN3_NEXT = dict(hidden_size=256, intermediate_size=704, moe_intermediate_size=128, shared_expert_intermediate_size=256,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_value_heads=8,
                  linear_num_key_heads=4, linear_key_head_dim=64, linear_value_head_dim=64, num_experts=8, num_experts_per_tok=2,
                  max_position_embeddings=256, tie_word_embeddings=False)
IMPORTED = (("deepseek_v2", "DeepseekV2", DEEPSEEK_V2), ("deepseek_v3", "DeepseekV3", DEEPSEEK_V3), ("qwen3_moe", "Qwen3Moe", QWEN3_MOE),
            ("qwen3_next", "Qwen3Next", QWEN3_NEXT))


def imported_models(name, torch):
    """(spec text, ours, transformers' model) for one of IMPORTED: the model at its config
    (eager attention, random weights) and the spec `cyclec import` writes for it, built fast and
    loaded with the same weights."""
    import transformers

    import cyclelang
    from cyclelang.interop import import_config, load_transformers

    prefix, config = next((p, c) for n, p, c in IMPORTED if n == name)
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{prefix}Config")(vocab_size=8192, attn_implementation="eager", **config)
    hf = getattr(transformers, f"{prefix}ForCausalLM")(cfg)
    if name == "deepseek_v3":  # the correction bias away from its zero init, so the choice it biases is the one timed
        with torch.no_grad():
            for m in hf.modules():
                if hasattr(m, "e_score_correction_bias"):
                    m.e_score_correction_bias.normal_(0, 0.05)
    text = import_config(hf.config)  # the spec its config implies
    return text, load_transformers(cyclelang.build(cyclelang.parse(text), seed=0, fast=True, parallel=True), hf), hf


def _imported_against_hf(name, args, torch):
    """The training step of the spec `cyclec import` writes for a transformers model, loaded with its weights,
    against that model (eager attention): {"eager"|"compiled": ...} as _train_against_hf."""
    _, ours, hf = imported_models(name, torch)
    try:
        return _train_against_hf(name, ours, hf, args, torch, ours.config)
    finally:
        del ours, hf
        gc.collect()


def bench_expander(args, torch):
    """Mamba-2's, DeepSeek-V2's, DeepSeek-V3's and Qwen3-MoE's training steps against transformers'
    Mamba2ForCausalLM (its torch path: no mamba_ssm kernels), DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
    and Qwen3MoeForCausalLM (eager attention), eager and both compiled, at the same config and weights; then the per-token decoding time of linear
    attention (expander.cycle), of attention (gpt2.cycle) and of the short gated conv (SHORT_CONV) at the same width, around
    token 64 and around token 4,096."""
    import transformers

    import cyclelang
    from cyclelang import ir
    from cyclelang.interop import load_transformers

    spec = shrunk("mamba2", MAMBA2, spec_text("mamba2").replace(*MAMBA2_STATE))
    ours = cyclelang.build(spec, seed=0, fast=True, parallel=True)  # parallel: the file holds compile_model
    c, e = ours.config, spec.engine
    ssm = next(o for st, _ in ir.leaf_stages(e.body) for b in st.branch_list() for o in b.ops if isinstance(o, ir.Ssm))
    hf = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
        vocab_size=c.vocab_size, hidden_size=e.width, num_heads=ssm.heads, head_dim=ssm.head_dim, state_size=ssm.state, n_groups=ssm.groups,
        expand=ssm.inner // e.width, conv_kernel=ssm.conv, chunk_size=ssm.chunk, num_hidden_layers=sum(n for _, n in ir.leaf_stages(e.body)),
        use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5, tie_word_embeddings=True))
    load_transformers(ours, hf)
    res = _train_against_hf("mamba2", ours, hf, args, torch, c)
    del ours, hf
    gc.collect()
    for name, _, _ in IMPORTED:
        if args.families and name not in args.families.split(","):
            continue
        res[name] = _imported_against_hf(name, args, torch)
    # gated DeltaNet: expander.cycle's engine with the linear attention swapped for `turbine delta` (at FLAT: 4 heads of 32)
    delta = spec_text("expander").replace("turbine linear_attention heads=12 retention chunk=64", "turbine delta heads=12 chunk=64")
    for name in ("expander", "gpt2", "gated_delta", "short_conv"):
        spec = cyclelang.parse(SHORT_CONV) if name == "short_conv" else shrunk(name, FLAT, delta if name == "gated_delta" else None)
        res[name] = decode_growth(name, cyclelang.build(spec, seed=0, fast=True).eval(), args, torch)
        d = res[name]
        print(f"  decode {name}: {d['ms_first']:.3f} ms per token around token 64, {d['ms_last']:.3f} ms around 4096 (x{d['growth']:.2f})", flush=True)
    return res


def decode_growth(name, model, args, torch, near=64, far=4096, steps=16):
    """Per-token decoding time with the cache around token `near` and around token `far`.

    Two caches are prefilled (in chunks of 512), one to `near` tokens and one to `far`; then
    rounds alternate `steps` single-token steps on each (each round from the same cached
    state: tokens near .. near + steps, far .. far + steps), so a change of the machine's load
    during the run falls on both sides alike (timing token 64 early and token 4,096 minutes
    later would measure the load as much as the model). growth: the median of the rounds'
    ratios (far / near)."""
    Cache = sys.modules[type(model).__module__].Cache
    g = torch.Generator().manual_seed(0)
    caches = {}
    with torch.no_grad():
        for n in (near, far):
            cache, idx = Cache(), torch.randint(0, model.config.vocab_size, (1, n), generator=g)
            for s in range(0, n, 512):
                model(idx[:, s : s + 512], cache=cache)
            caches[n] = cache
        nxt = torch.zeros(1, 1, dtype=torch.long)
        saved = {n: (c.pos, dict(c.state)) for n, c in caches.items()}

        def run(n):
            cache = caches[n]
            cache.pos, cache.state = saved[n][0], dict(saved[n][1])  # back to `n` tokens: a KV buffer is rewritten in place, a state replaced
            for _ in range(steps):
                model(nxt, cache=cache)

        for n in (near, far):  # a warm-up round on each
            run(n)
        rounds = max(args.rounds, 5) * 4
        times = time_sides({"near": lambda: run(near), "far": lambda: run(far)}, rounds, 1)
    first, last = median(times["near"]) / steps, median(times["far"]) / steps
    return {"ms_first": 1000 * first, "ms_last": 1000 * last, "growth": ratio(times, "far", "near"), "state_bytes": caches[far].nbytes()}
