"""`cyclec train`: a real training run of a spec (imports torch).

    data.py         text / folders / .bin / .npy, memory-mapped; tokenizers; the held-out
                    split; stateless seeded batches
    loop.py         the run: startup overrides, accumulation, dtype, compile, eval,
                    metrics, Ctrl-C, resume; `run(spec, settings, run_dir, spec_text=...)`
    checkpoint.py   atomic checkpoints (safetensors + JSON; DCP when distributed), each
                    with a sha256 manifest; LATEST and the checkpoints verified on reading
    progress.py     metrics.jsonl, the Ctrl-C / SIGTERM stop flag, the progress bar
    grads.py        gradient norms and clipping over plain and DTensor gradients
    distributed.py  torchrun's process group, the ("pp", "dp", "tp") / ("edp", "ep", "tp") mesh, DCP
    pipeline.py     pipeline parallelism (--pp): the split by FLOPs, torch's schedules
    expert.py       expert parallelism (--ep): experts spread over ranks, all-to-all routing
    context.py      context parallelism (--cp): refused per mixer, with the reason
    flameout.py     the per-step flameout and spike check
    plot.py         the run's curves as a PNG

The parallelism plan itself belongs to the generated model (`parallelize`, from
`cyclelang/backends/torch/runtime/parallel.py`), so a standalone model file keeps it.
This package sits beside the stand: it takes an `ir.Spec` and uses the torch back-end;
the façade (`cyclelang.train`) and the command line call it.
"""
