"""The parallelism plan of a generated model (inlined into the file codegen writes).

The generated file ends with its `TP_PLAN` (written by codegen from the IR kinds'
records, `cyclelang/ir/kinds.py`, field `tp`: folded part path -> rule) and
`parallelize(model, mesh, *, fsdp=True, tp=False, checkpointing="none", compile=False)`,
which calls `apply_parallel_plan` with it: tensor parallelism, activation checkpointing and
FSDP2, with torch.distributed only (DTensor's parallel styles, `fully_shard`,
torch.utils.checkpoint); then `compile_model` compiles in place (regional compilation:
each kind of stage once, its instances sharing the graph; the ends eager):

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
    "selective" (keep the matrix products' outputs, recompute the rest). compile: whether
    the model will be compiled (`compile_model`, after this), which tensor parallelism checks."""
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
    if fsdp:
        dp_mesh = mesh["dp"] if "dp" in names else mesh
        for stage in model.stages:
            torch.distributed.fsdp.fully_shard(stage, mesh=dp_mesh)
        torch.distributed.fsdp.fully_shard(model, mesh=dp_mesh)
    return model


def compile_model(model, mode="regional", ends=(), **options):
    """torch.compile `model` in place, every graph whole (fullgraph=True); returns
    {region: instances}, also kept as `model.compiled_regions`.

    "regional" (the default): each distinct stage class is compiled once and every instance
    of it runs that one compiled forward, so they share its graph (parameters are the graph's
    inputs). The model's own forward around them (the feed, positions, the loop over the
    stages, the final norm, the head, the loss) stays eager: a cold compile then costs one
    stage per kind, not one per layer. `ends` names parts around the stages to compile as
    regions of their own: "feed", "norm" (the final norm), "head", and "loss" (the fast
    form's `loss_fn`: its backward then one fused kernel, a step 1 to 4% faster for a cold
    compile 4 to 20% longer; docs/benchmarks.md has the figures). "whole":
    the model's forward as one graph. In place either way: a region replaces its module's
    `forward` (the loss: the model's `loss_fn`) attribute with the compiled one, so parameter
    names, the state dict and FSDP2's hooks (which run around `forward`, outside the region)
    are untouched; call it after `fully_shard` and after activation checkpointing (which the
    region then traces). Each region has a code object of its own: dynamo keeps compiled
    graphs, and counts recompiles, per code object. `options` go to torch.compile as given;
    regional with inductor adds inductor's `aggressive_fusion` under the caller's own. With
    inductor on the CPU it starts inductor's instruction-set probe (`start_cpu_probe`) first."""
    import functools

    if mode not in ("regional", "whole"):
        raise ValueError(f"compile mode must be regional or whole, not {mode!r}")
    if getattr(model, "compiled_regions", None):
        raise ValueError("the model is compiled already (compile_model runs once per model)")
    known = {"feed", "norm", "head", "loss"}
    if not set(ends) <= known:
        raise ValueError(f"ends are feed, norm, head or loss, not {sorted(set(ends) - known)}")
    if mode == "whole":
        groups = {"model": [model]}
    else:
        groups = {"feed": [model.feed]} if "feed" in ends else {}
        for stage in model.stages:
            groups.setdefault(type(stage).__name__.removeprefix("FSDP"), []).append(stage)
        for name in ("norm", "head"):
            if name in ends and isinstance(getattr(model, name, None), torch.nn.Module):
                groups[name] = [getattr(model, name)]
        if "loss" in ends and hasattr(model, "loss_fn"):  # the readable form's loss is inline in its forward
            groups["loss"] = [model]
    inductor = options.get("backend", "inductor") == "inductor"
    if mode == "regional" and inductor:
        # inductor's aggressive fusion: fewer, larger kernels in a region (the llama spec's cold
        # compile about 6% less CPU, its step 3 to 5% faster; docs/benchmarks.md); the caller's
        # own inductor options win
        options = {**options, "options": {"aggressive_fusion": True, **(options.get("options") or {})}}
    if inductor and all(p.device.type == "cpu" for p in model.parameters()):
        start_cpu_probe()
    model.compiled_regions, model.region_code = {}, {}
    for name, modules in groups.items():
        def region(forward, *args, **kwargs):
            return forward(*args, **kwargs)

        region.__code__ = region.__code__.replace(co_name=f"region_{name}")
        compiled = torch.compile(region, fullgraph=True, **options)
        for module in modules:
            if name == "loss":
                module.loss_fn = functools.partial(compiled, module.loss_fn)
            else:
                module.forward = functools.partial(compiled, module.forward)
        model.compiled_regions[name] = len(modules)
        model.region_code[name] = region.__code__
    return model.compiled_regions


def start_cpu_probe():
    """Start inductor's once-per-cache probe of the vector instruction sets its C++ compiler can
    build for, one background thread per set the CPU reports. Inductor runs it when it first
    generates a CPU kernel, one set after the other (a test library built and loaded per set,
    seconds each in an empty cache); started here, the builds overlap dynamo's and AOTAutograd's
    tracing instead of following it. Inductor asks through `valid_vec_isa_list`, which waits for
    the threads until they are done (a set's check is not safe to run twice at once: it edits
    the set's compiler flags while it builds), then is torch's own again. A cache that has the
    libraries still loads each in a child process (0.6 s here in threads, 1.0 s in turn)."""
    import functools
    import importlib
    import platform
    import threading

    from torch._inductor import cpu_vec_isa

    for module in ("codecache", "cpp_builder"):  # what a check imports: the threads import nothing
        importlib.import_module("torch._inductor." + module)

    asked = cpu_vec_isa.valid_vec_isa_list
    if hasattr(asked, "probe") or not hasattr(asked, "cache_info") or asked.cache_info().currsize:
        return  # a probe is running, or inductor has its answer (or torch changed its probe)

    def quietly(job):
        try:
            job()  # builds, loads and remembers the answer where inductor looks for it
        except Exception:
            pass  # inductor's own probe meets the same failure and reports it

    jobs = [asked]  # other machines: one set to check at most
    if platform.machine() in ("x86_64", "AMD64"):
        flags = cpu_vec_isa.x86_isa_checker()
        jobs = [functools.partial(bool, isa) for isa in cpu_vec_isa.supported_vec_isa_list
                if all(f in flags for f in str(isa).split())]
    threads = [threading.Thread(target=quietly, args=(job,), name="cpu-probe", daemon=True) for job in jobs]

    def valid_vec_isa_list():
        for thread in threads:
            thread.join()
        cpu_vec_isa.valid_vec_isa_list = asked
        return asked()

    valid_vec_isa_list.probe = threads
    cpu_vec_isa.valid_vec_isa_list = valid_vec_isa_list
    for thread in threads:
        thread.start()


def compiled_graphs(model):
    """{region: graphs dynamo holds for it} of a model `compile_model` compiled: one per region
    once each has run, more where a region recompiled (new shapes, a decoding step's cache)."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    return {name: len(_debug_get_cache_entry_list(code)) for name, code in model.region_code.items()}
