"""The training step, eager and compiled: cyclec (fast and readable), the reference, transformers."""

from __future__ import annotations

import gc
import time

from .common import _loss, adamw, check_same, compile_regions, median, models, quartiles, ratio, SHRINK, shrunk, synchronize, throughput, time_sides


def bench_train(args, torch, compiled=False):
    rows = []
    for name in (args.compile_specs if compiled else args.specs).split(","):
        ours, ref, hf = models(name, torch)
        B, T = args.batch, args.seq
        g = torch.Generator().manual_seed(0)
        idx = torch.randint(0, ours.config.vocab_size, (B, T), generator=g)
        tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
        check_same(name, ours, ref, hf, torch, idx, tgt)  # float32 on the CPU, then to the device under test
        import cyclelang

        # the readable form (`cyclec build`'s default): the same model and weights, F.cross_entropy, one MoE path
        readable = cyclelang.build(shrunk(name, SHRINK[name]), seed=0, fast=False)
        readable.load_state_dict(ours.state_dict())
        # compiled: the same fast model again, compiled by regions (`compile_model`, what `cyclec train --compile` runs)
        regional = cyclelang.build(shrunk(name, SHRINK[name]), seed=0, fast=True, parallel=True) if compiled else None
        if regional is not None:
            regional.load_state_dict(ours.state_dict())
        dtype = getattr(torch, args.dtype)
        for m in (ours, readable, ref, hf) + ((regional,) if regional is not None else ()):
            m.to(device=args.device, dtype=dtype)
        idx, tgt = idx.to(args.device), tgt.to(args.device)
        sides = {}
        note = ""
        lineup = (("cyclec", ours, False),) + ((("regional", regional, False),) if regional is not None else ()) + (
            ("readable", readable, False), ("reference", ref, False), ("transformers", hf, True))
        for label, model, is_hf in lineup:
            model.train()
            opt = adamw(model, torch)
            fwd = model
            if label == "regional":
                compile_regions(model)
            elif compiled:
                # The spec is one graph (under compile its MoE experts run in one custom op);
                # the others take torch.compile's default, graph breaks allowed (the
                # reference's MoE dispatch has data-dependent shapes).
                fwd = torch.compile(model, fullgraph=label == "cyclec" or label == "readable" and name != "moe")

            def step(fwd=fwd, opt=opt, is_hf=is_hf):
                opt.zero_grad(set_to_none=True)
                _loss(fwd, idx, tgt, hf=is_hf).backward()
                opt.step()

            t0 = time.perf_counter()
            for _ in range(2):  # warm-up (and, compiled, the compilation itself)
                step()
            sides[label] = step
            if compiled:
                # in-process, after the sides before it: they share inductor's cache (see first-step for the fair figure)
                print(f"  compile+2 steps {name}/{label}: {time.perf_counter() - t0:.1f}s", flush=True)
        cpu, faults = {}, {}
        times = time_sides(sides, args.rounds, args.steps, sync=lambda: synchronize(torch, args.device), cpu=cpu, faults=faults)
        row = {"name": name, "ms": {k: 1000 * median(v) for k, v in times.items()},
               "vs_ref": ratio(times, "cyclec", "reference"), "vs_hf": ratio(times, "cyclec", "transformers"),
               "readable_vs_fast": ratio(times, "readable", "cyclec"), "readable_vs_ref": ratio(times, "readable", "reference"), "note": note,
               **({"regional_vs_whole": ratio(times, "regional", "cyclec"), "regional_vs_hf": ratio(times, "regional", "transformers"),
                   "regional_vs_ref": ratio(times, "regional", "reference")} if "regional" in times else {}),
               **throughput(times, name, args, torch)}
        if args.device == "cpu":  # on a GPU the host's CPU time is not the step's
            row["spread"] = {"vs_hf": quartiles(times, "cyclec", "transformers"), "vs_ref": quartiles(times, "cyclec", "reference")}
            row["cpu"] = {"ms": {k: 1000 * median(v) for k, v in cpu.items()},
                          "vs_hf": ratio(cpu, "cyclec", "transformers"), "vs_hf_q": quartiles(cpu, "cyclec", "transformers"),
                          "vs_ref": ratio(cpu, "cyclec", "reference"), "vs_ref_q": quartiles(cpu, "cyclec", "reference")}
            row["faults"] = {k: median(v) for k, v in faults.items()}
        rows.append(row)
        print(f"  {name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row["ms"].items()) + f"; cyclec/reference {row['vs_ref']:.3f}, cyclec/transformers {row['vs_hf']:.3f}"
              + (f"; regional/whole {row['regional_vs_whole']:.3f}, regional/transformers {row['regional_vs_hf']:.3f}" if "regional_vs_whole" in row else ""),
              flush=True)
        if "cpu" in row:
            c, sp = row["cpu"], row["spread"]["vs_hf"]
            print(f"    per-round cyclec/transformers {sp[0]:.3f}-{sp[1]:.3f} (quartiles); CPU time: " + ", ".join(f"{k} {v:.1f} ms" for k, v in c["ms"].items())
                  + f"; cyclec/transformers {c['vs_hf']:.3f} ({c['vs_hf_q'][0]:.3f}-{c['vs_hf_q'][1]:.3f}), cyclec/reference {c['vs_ref']:.3f}; page faults per step "
                  + ", ".join(f"{k} {v:.0f}" for k, v in row["faults"].items()), flush=True)
        del ours, readable, ref, hf, regional, sides
        gc.collect()
    return rows
