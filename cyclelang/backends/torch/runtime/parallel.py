"""The parallelism plan of a generated model (inlined into the file codegen writes).

The generated file ends with its `TP_PLAN` (written by codegen from the IR kinds'
records, `cyclelang/ir/kinds.py`, field `tp`: folded part path -> rule) and
`parallelize(model, mesh, *, fsdp=True, tp=False, checkpointing="none", compile=False)`,
which calls `apply_parallel_plan` with it. In torchtitan's order it applies tensor
parallelism, activation checkpointing, compile and FSDP2, with torch.distributed only
(DTensor's parallel styles, `fully_shard`, torch.utils.checkpoint):

    heads      attention: q, k and v column-wise with whole heads per rank (the fused
               qkv rows are regrouped [q_r | k_r | v_r] per rank first, so each rank's
               contiguous shard holds its own heads), the output projection row-wise
    hidden     MLP: up (and gate) column-wise, down row-wise; MoE: every expert so,
               the router replicated (eager only: the experts' compiled op takes whole weights),
               and its correction bias with it: every rank routes the same tokens the same
               way, and the load rule sums the counts over all ranks, so the copies stay equal
    replicate  norms, embeddings, the head, linear turbines, pool/conv/short_conv mixers and the
               merges' parameters: computed whole on every rank of the TP group

A part that cannot be split at the degree asked (heads, kv_heads or a hidden width not
divisible by it) is refused with the reason before anything changes. The regrouping
depends on the TP degree; `model.tp_layout` records it (parameter name -> (block sizes,
degree)) and `unshard_rows` restores the file's own [q | k | v] order of a gathered
weight. Written in the generated file's vocabulary (torch, nn); torch.distributed is
imported inside the function.
"""

import torch


def unshard_rows(weight, blocks, degree):
    """A gathered weight whose rows are rank by rank [b0_r | b1_r | ...] -> [b0 | b1 | ...]."""
    per_rank = [c.split([b // degree for b in blocks], dim=0) for c in weight.chunk(degree, dim=0)]
    return torch.cat(
        [torch.cat([per_rank[r][i] for r in range(degree)], dim=0) for i in range(len(blocks))],
        dim=0)


def apply_parallel_plan(model, mesh, plan, *, fsdp=True, tp=False, checkpointing="none",
                        compile=False):
    """Shard `model` in place over `mesh` (a DeviceMesh; a 2-D mesh names its dims "dp" and
    "tp"; None for checkpointing or compile alone) by `plan` and return it. fsdp: FSDP2's
    fully_shard on every stage instance, then on the root, over the data-parallel dim. tp: tensor
    parallelism over the "tp" dim.
    checkpointing: "none", "stage" (recompute a whole stage in the backward pass) or
    "selective" (keep the matrix products' outputs, recompute the rest). compile:
    torch.compile each stage instance."""
    import functools

    import torch.distributed.fsdp
    import torch.distributed.tensor.parallel
    import torch.utils.checkpoint

    if checkpointing not in ("none", "stage", "selective"):
        raise ValueError(f"checkpointing must be none, stage or selective, not {checkpointing!r}")
    names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
    if (fsdp or tp) and mesh is None:
        raise ValueError("FSDP and tensor parallelism need a DeviceMesh")
    if fsdp and tp and not {"dp", "tp"} <= set(names):
        raise ValueError("FSDP with tensor parallelism needs a 2-D mesh with dims named 'dp' "
                         "and 'tp'")

    # stages.0-3.mix.attn -> stages.0.mix.attn ... stages.3.mix.attn (every range of a nested path)
    def instances(path):
        parts = path.split(".")
        for k, part in enumerate(parts):
            if k and parts[k - 1] == "stages" and "-" in part:
                first, last = (int(i) for i in part.split("-"))
                return [q for i in range(
                    first,
                    last + 1) for q in instances(".".join(parts[:k] + [str(i)] + parts[k + 1 :]))]
        return [path]

    def mlps_of(module, path):
        if hasattr(module, "experts"):
            return [(f"{path}.experts.{e}", m) for e, m in enumerate(module.experts)]
        return [(path, module)]

    if tp:
        tp_mesh = mesh["tp"] if "tp" in names else mesh
        degree = tp_mesh.size()
        why = []
        for path, rule in plan.items():
            module = model.get_submodule(instances(path)[0])
            if rule == "heads":
                why += [f"{path}: {n}={getattr(module, n)} is not divisible by the TP degree {degree}"
                        for n in ("heads", "kv_heads") if getattr(module, n) % degree]
            elif rule == "hidden":
                hidden = mlps_of(module, path)[0][1].proj.in_features
                if hidden % degree:
                    why.append(f"{path}: the hidden width {hidden} is not divisible by the TP "
                               f"degree {degree}")
                if compile and hasattr(module, "experts"):
                    why.append(f"{path}: under compile the experts run in one custom op that "
                               "takes whole weights")
        if why:
            raise ValueError("tensor parallelism cannot split this model:\n  " + "\n  ".join(why))
        par = torch.distributed.tensor.parallel
        model.tp_layout = {}

        def colwise(owner, attr, prefix, blocks):
            linear = getattr(owner, attr)
            # fused rows: regroup so rank r's contiguous chunk is [b0_r | b1_r | ...]
            if len(blocks) > 1:
                with torch.no_grad():
                    for pname in ("weight", "bias"):
                        p = getattr(linear, pname)
                        if p is not None:
                            parts = [b.chunk(degree, dim=0) for b in p.split(blocks, dim=0)]
                            p.copy_(torch.cat([q[r] for r in range(degree) for q in parts], dim=0))
                            model.tp_layout[f"{prefix}.{pname}"] = (list(blocks), degree)
            par.parallelize_module(owner, tp_mesh, {attr: par.ColwiseParallel()})

        for path, rule in plan.items():
            for inst in instances(path):
                module = model.get_submodule(inst)
                if rule == "heads":
                    q, kv = module.heads * module.head_dim, module.kv_heads * module.head_dim
                    rows = module.qkv.out_features  # [q | k | v]; [q | k] where the keys are the values; [q] reading another's
                    colwise(module, "qkv", f"{inst}.qkv", [q, kv, kv] if rows == q + 2 * kv else [q, kv] if rows == q + kv else [q])
                    par.parallelize_module(module, tp_mesh, {"proj": par.RowwiseParallel()})
                    # this rank's heads
                    module.heads, module.kv_heads = (module.heads // degree,
                                                     module.kv_heads // degree)
                elif rule == "hidden":
                    for prefix, mlp in mlps_of(module, inst):
                        hidden = mlp.proj.in_features
                        colwise(
                            mlp, "fc", f"{prefix}.fc",
                            [hidden, hidden] if mlp.fc.out_features == 2 * hidden else [hidden])
                        par.parallelize_module(mlp, tp_mesh, {"proj": par.RowwiseParallel()})

    if checkpointing != "none":
        ckpt = torch.utils.checkpoint
        keep = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
                torch.ops.aten._scaled_dot_product_flash_attention.default,
                torch.ops.aten._scaled_dot_product_efficient_attention.default}

        def policy(ctx, op, *args, **kwargs):
            return ckpt.CheckpointPolicy.MUST_SAVE if op in keep else ckpt.CheckpointPolicy.PREFER_RECOMPUTE

        for stage in model.stages:
            extra = {} if checkpointing == "stage" else {"context_fn": functools.partial(
                ckpt.create_selective_checkpoint_contexts, policy)}
            stage.forward = functools.partial(ckpt.checkpoint, stage.forward, use_reentrant=False,
                                              **extra)
    if compile:
        for stage in model.stages:
            stage.compile()
    if fsdp:
        dp_mesh = mesh["dp"] if "dp" in names else mesh
        for stage in model.stages:
            torch.distributed.fsdp.fully_shard(stage, mesh=dp_mesh)
        torch.distributed.fsdp.fully_shard(model, mesh=dp_mesh)
    return model
