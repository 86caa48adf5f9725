"""The Markdown tables of docs/benchmarks.md from the results."""

from __future__ import annotations

import json

from .first_step import KINDS
from .ops import PHASES


def _kinds(row) -> list[str]:
    """A first-step row's cache kinds in KINDS' order (results from before "new" have none)."""
    return [k for k in KINDS if k in row["s"]]


def render(results) -> str:
    out = []
    for m in sorted({json.dumps(r["meta"], sort_keys=True) for r in results.values()}):
        m = json.loads(m)
        names = ", ".join(k for k, r in results.items() if r["meta"] == m)
        on = f"{m['gpu']}, {m['dtype']}" if m.get("gpu") else f"{m['cpu']}, {m['threads']} torch thread(s)"
        on += f", {m['dtype']}" if not m.get("gpu") and m.get("dtype", "float32") != "float32" else ""
        out += [f"Measured {m['date']} ({names}) on {on}, torch {m['torch']}, "
                f"transformers {m['transformers']}, Python {m['python']}; batch {m['batch']} x {m['seq']} tokens, "
                f"{m['rounds']} rounds x {m['steps']} steps per side (medians)"
                + (f"; load average {m['load'][0]:.1f} at the start, {m['load'][1]:.1f} at the end" if m.get("load") else "")
                + f". Command: `{m['command']}`", ""]
    results = {k: r["data"] for k, r in results.items()}
    for key, title in (("train", "Training step (forward, backward, AdamW), eager"), ("compiled", "Training step, each side torch.compile'd")):
        if key not in results:
            continue
        out += [f"### {title}", "", "cyclec is the `--fast` form (what `cyclec train` runs); readable is the default `cyclec build` (F.cross_entropy, one plain MoE path), the same weights.", "",
                "| spec | cyclec ms | readable ms | reference ms | transformers ms | cyclec / reference | cyclec / transformers | readable / cyclec | readable / reference |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in results[key]:
            ms = r["ms"]
            rd = (f"{ms['readable']:.1f}", f"{r['readable_vs_fast']:.3f}", f"{r['readable_vs_ref']:.3f}") if "readable" in ms else ("-", "-", "-")
            out.append(f"| {r['name']} | {ms['cyclec']:.1f} | {rd[0]} | {ms['reference']:.1f} | {ms['transformers']:.1f} | **{r['vs_ref']:.3f}** | **{r['vs_hf']:.3f}** | {rd[1]} | {rd[2]} |")
        rows = [r for r in results[key] if "regional_vs_whole" in r]
        if rows:
            out += ["", "Regional: the fast model compiled by regions (`compile_model`, what `cyclec train --compile` runs), the same weights, "
                    "against the spec compiled whole (cyclec) and the others in the same rounds.", "",
                    "| spec | regional ms | regional / whole | regional / reference | regional / transformers |", "|---|---|---|---|---|"]
            out += [f"| {r['name']} | {r['ms']['regional']:.1f} | **{r['regional_vs_whole']:.3f}** | {r['regional_vs_ref']:.3f} | "
                    f"**{r['regional_vs_hf']:.3f}** |" for r in rows]
        notes = [r["note"] for r in results[key] if r["note"]]
        out += [""] + ([f"Note: {'; '.join(notes)}.", ""] if notes else [])
        rows = [r for r in results[key] if "cpu" in r]
        if rows:
            out += ["Spread and CPU time: the per-round ratios' quartiles behind the medians above; the same rounds timed by this process's "
                    "CPU time (what other processes take from the core does not count); minor page faults per step (fresh memory the allocator "
                    "took from the system and touched), medians over rounds.", "",
                    "| spec | cyclec / transformers, wall, p25-p75 | cyclec / transformers, CPU | cyclec / reference, CPU | "
                    "CPU ms: cyclec / readable / reference / transformers | page faults per step: cyclec / readable / reference / transformers |",
                    "|---|---|---|---|---|---|"]
            for r in rows:
                c, sp, f = r["cpu"], r["spread"]["vs_hf"], r["faults"]
                sides = [k for k in ("cyclec", "readable", "reference", "transformers") if k in c["ms"]]
                out.append(f"| {r['name']} | {sp[0]:.3f}-{sp[1]:.3f} | **{c['vs_hf']:.3f}** ({c['vs_hf_q'][0]:.3f}-{c['vs_hf_q'][1]:.3f}) | "
                           f"{c['vs_ref']:.3f} ({c['vs_ref_q'][0]:.3f}-{c['vs_ref_q'][1]:.3f}) | " + " / ".join(f"{c['ms'][k]:.1f}" for k in sides)
                           + " | " + " / ".join(f"{f[k]:,.0f}" for k in sides) + " |")
            out.append("")
        rows = [r for r in results[key] if "tok_s" in r]
        if rows:
            peaks = {r["peak_tflops"] for r in rows if r.get("peak_tflops")}
            out += ["Throughput: tokens per second per side, and model FLOPs utilisation (MFU: the step's model FLOPs, three times the "
                    "forward's as the IR counts them per token at this context, over the step's time and the device's peak"
                    + (f", {', '.join(f'{p:g}' for p in sorted(peaks))} TFLOP/s)." if peaks else "; no peak is known for this device, so no MFU)."), "",
                    "| spec | model GFLOP per step | cyclec tok/s | readable tok/s | reference tok/s | transformers tok/s | cyclec MFU | reference MFU | transformers MFU |",
                    "|---|---|---|---|---|---|---|---|---|"]
            for r in rows:
                tk, mfu = r["tok_s"], r.get("mfu")
                pct = (lambda k: f"{100 * mfu[k]:.1f}%" if mfu and k in mfu else "-")
                out.append(f"| {r['name']} | {r['gflop_step']:.1f} | {tk['cyclec']:,.0f} | " + (f"{tk['readable']:,.0f}" if "readable" in tk else "-")
                           + f" | {tk['reference']:,.0f} | {tk['transformers']:,.0f} | {pct('cyclec')} | {pct('reference')} | {pct('transformers')} |")
            out.append("")
    if "first-step" in results:
        depth_rows = [r for r in results["first-step"] if "depths" in r]
        results = dict(results, **{"first-step": [r for r in results["first-step"] if "depths" not in r]})
    if results.get("first-step"):
        n = results["first-step"][0].get("rounds", 0)
        out += ["### Time to the first compiled step", "",
                "torch.compile, then the first training step (forward, backward, AdamW), each side in a fresh process; cold: an empty inductor cache "
                "(the first compile a machine makes: inductor's one-offs, its vector-ISA probe among them, run too); new: a cache that has seen one "
                "tiny unrelated compile and nothing of the model (a model this machine has not compiled before); "
                f"warm: the cache the cold run filled. Medians over {n} round{'s' if n != 1 else ''}; the ratios are medians of the per-round ratios. "
                "After two steps: to the end of the second step (compile and two warm-up steps, as the issue timed it), which holds the recompiles "
                "a second step triggers (the reference's MoE recompiles its experts for dynamic token counts there).", "",
                "| spec | cache | cyclec s | reference s | transformers s | cyclec / reference | cyclec / transformers | after two steps: cyclec / reference | cyclec / transformers |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in results["first-step"]:
            for kind in _kinds(r):
                t, q = r["s"][kind], r["ratio"][kind]
                q2 = r.get("ready_ratio", {}).get(kind)
                two = f"**{q2['vs_ref']:.3f}** | **{q2['vs_hf']:.3f}**" if q2 else "- | -"
                out.append(f"| {r['name']} | {kind} | {t['cyclec']:.1f} | {t['reference']:.1f} | {t['transformers']:.1f} | **{q['vs_ref']:.3f}** | **{q['vs_hf']:.3f}** | {two} |")
        out += ["", "Where a cold compile goes (the last round): graphs dynamo compiled in the first step (and after it), graph breaks, "
                "C++ kernels inductor built, seconds in dynamo's tracing, AOTAutograd (which includes inductor), inductor's code generation "
                "and the wait for the C++ builds, and whether the warm run found AOTAutograd's cache (hit) or could not use it (bypass).", "",
                "| spec | side | graphs | breaks | kernels | dynamo s | AOTAutograd s | codegen s | C++ wait s | warm AOTAutograd cache |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["first-step"]:
            for label, d in r["detail"].items():
                ph, aot = d["phases"], d["aot_cache_warm"]
                state = ", ".join(f"{k.removeprefix('autograd_cache_')} {v}" for k, v in sorted(aot.items())) or "-"
                out.append(f"| {r['name']} | {label} | {d['graphs']} (+{d['graphs_second']}) | {d['breaks']} | {d['kernels']} | {ph['dynamo']:.1f} | "
                           f"{ph['aot']:.1f} | {ph['codegen']:.1f} | {ph['cpp_wait']:.1f} | {state} |")
        out.append("")
        rows = [r for r in results["first-step"] if r.get("regional")]
        if rows:
            out += ["Regional compilation (the generated file's `compile_model`, what `cyclec train --compile` runs: each distinct stage "
                    "compiled once, its instances sharing the graph; the feed, the final norm, the head and the loss eager) against "
                    "the same spec compiled whole (cyclec above, one graph). Compiled step: the median of the five steps after the second, "
                    "regional / whole and regional / transformers, by the wall clock and by the process's CPU time (which other processes do not move; "
                    "runs from before it: the second step alone, regional / whole). "
                    "Spread: the fastest and slowest round.", "",
                    "| spec | cache | regional s (spread) | whole s (spread) | regional / whole | regional / reference | regional / transformers | "
                    "compiled step: regional / whole, / transformers | regions (instances) |", "|---|---|---|---|---|---|---|---|---|"]
            for r in rows:
                regions = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in (r.get("regions") or {}).items()) or "-"
                for kind in _kinds(r):
                    t, g, sp = r["s"][kind], r["regional"][kind], r["spread"][kind]
                    nested = f" (nested / whole {g['nested_vs_whole']:.3f})" if "nested_vs_whole" in g else ""
                    step = (f"**{g['step_vs_whole']:.3f}**, **{g['step_vs_hf']:.3f}** (CPU {g['step_cpu_vs_whole']:.3f}, "
                            f"{g['step_cpu_vs_hf']:.3f})" if "step_vs_whole" in g else f"{g['second_vs_whole']:.3f} (second step)")
                    out.append(f"| {r['name']} | {kind} | {t['regional']:.1f} ({sp['regional'][0]:.1f}-{sp['regional'][1]:.1f}) | "
                               f"{t['cyclec']:.1f} ({sp['cyclec'][0]:.1f}-{sp['cyclec'][1]:.1f}) | **{g['vs_whole']:.3f}**{nested} | "
                               f"**{g['vs_ref']:.3f}** | **{g['vs_hf']:.3f}** | {step} | {regions} |")
            out.append("")
    if "first-step" in results and depth_rows:
        for r in depth_rows:
            base = r["depths"][0]["depth"]
            out += [f"Deeper: the {r['name']} spec at {', '.join(str(d['depth']) for d in r['depths'])} blocks, cold (an empty inductor cache), "
                    f"medians over {r['rounds']} rounds; growth: the per-round ratio to {base} blocks.", "",
                    "| blocks | regional s | whole s | regional / whole | regional growth | whole growth | graphs: regional / whole |",
                    "|---|---|---|---|---|---|---|"]
            for d in r["depths"]:
                c = d["s"]["cold"]
                out.append(f"| {d['depth']} | {c['regional']:.1f} | {c['cyclec']:.1f} | {d['vs_whole']['cold']:.3f} | **x{d['growth']['regional']:.2f}** | "
                           f"x{d['growth']['cyclec']:.2f} | {d['graphs']['regional']} / {d['graphs']['cyclec']} |")
            out.append("")
    if "decode" in results:
        d = results["decode"]
        out += ["### Decoding (greedy, batch 1, Llama-style spec at width 128)", "",
                "| figure | value |", "|---|---|",
                f"| per-token time with the cache, around token 64 | {d['ms_first']:.2f} ms |",
                f"| per-token time with the cache, tokens 960-1024 | {d['ms_last']:.2f} ms (x{d['flat']:.2f}) |",
                f"| tokens per second with the cache, around token 64 | {1000 / d['ms_first']:,.0f} |",
                f"| speed-up of the cache over recomputing, 256 tokens | **x{d['x256']:.1f}** |",
                f"| speed-up of the cache over recomputing, 1024 tokens | **x{d['x1024']:.1f}** |"]
        if not d.get("same", True):
            out.append("| tokens: cache and recompute | differ (half precision rounds a near-tie apart) |")
        out.append("")
    if "expander" in results:
        x = results["expander"]
        out += ["### The expander cycle: Mamba-2, DeepSeek-V2/V3 and Qwen3-MoE against transformers, and a decoding cost that stays flat", "",
                "| figure | cyclec | transformers | cyclec / transformers | by CPU time (quartiles) |", "|---|---|---|---|---|"]

        def by_cpu(r, side):
            m = r.get("cpu", {}).get(side)  # absent from runs before the CPU time was kept
            return f"{m[0]:.3f} ({m[1]:.3f}-{m[2]:.3f})" if m else "-"

        def steps(label, r):
            for key, how in (("eager", "eager"), ("compiled", "both torch.compile'd")):
                ms = r[key]["ms"]
                out.append(f"| {label} training step, {how} | {ms['cyclec']:.1f} ms | {ms['transformers']:.1f} ms | **{r[key]['vs_hf']:.3f}** "
                           f"| {by_cpu(r[key], 'cyclec')} |")
            if "regional_vs_hf" in r["compiled"]:  # ours by regions (`cyclec train --compile`), transformers torch.compile'd
                ms = r["compiled"]["ms"]
                out.append(f"| {label} training step, compiled by regions (`cyclec train --compile`; {r['compiled']['regional_vs_whole']:.3f}x whole) "
                           f"| {ms['regional']:.1f} ms | {ms['transformers']:.1f} ms | **{r['compiled']['regional_vs_hf']:.3f}** "
                           f"| {by_cpu(r['compiled'], 'regional')} |")

        steps("Mamba-2", x)
        for name, label in (("deepseek_v2", "DeepSeek-V2"), ("deepseek_v3", "DeepSeek-V3 (its router)"), ("qwen3_moe", "Qwen3-MoE"),
                            ("qwen3_next", "Qwen3-Next (gated DeltaNet, transformers' torch path)")):
            if name in x:
                steps(label, x[name])
        out += ["", "| decoding, width 128, 2 blocks, batch 1 | around token 64 | around token 4,096 | growth |", "|---|---|---|---|"]
        for key, label in (("expander", "linear attention (expander.cycle)"), ("gpt2", "attention (gpt2.cycle)"),
                           ("gated_delta", "gated DeltaNet (expander.cycle's engine)"),
                           ("short_conv", "short gated conv (LFM2's, size 3)")):
            if key not in x:
                continue
            d = x[key]
            out.append(f"| {label} | {d['ms_first']:.3f} ms | {d['ms_last']:.3f} ms | **x{d['growth']:.2f}** |")
        out.append("")
    if "memory" in results:
        out += ["### Peak memory of a training step", "", "| spec | cyclec MiB | reference MiB | ratio | ratio above weights + AdamW state |", "|---|---|---|---|---|"]
        for r in results["memory"]:
            out.append(f"| {r['name']} | {r['cyclec'] / 2**20:.1f} | {r['reference'] / 2**20:.1f} | **{r['ratio']:.3f}** | {r['act_ratio']:.3f} |")
        out.append("")
    if "ops" in results:
        out += ["### What a training step dispatches", "",
                "One eager step (forward, backward, AdamW) after a warm-up step: aten ops dispatched and MiB of fresh tensor storage "
                "(outputs that hold none of their inputs' storage) per phase. Counted, not timed, so the same at any load; ops a "
                "custom op runs inside count as that one op (the run also prints each op's self CPU time, profiled, which moves "
                "with the load).", "",
                "| spec | side | forward ops | forward MiB | backward ops | backward MiB | AdamW ops | AdamW MiB | step ops | step MiB |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["ops"]:
            for label, t in r["total"].items():
                cells = [f"{t[ph][0]} | {t[ph][1] / 2**20:.1f}" for ph in PHASES]
                out.append(f"| {r['name']} | {label} | " + " | ".join(cells)
                           + f" | {sum(t[ph][0] for ph in PHASES)} | {sum(t[ph][1] for ph in PHASES) / 2**20:.1f} |")
        out += ["", "Where cyclec and transformers differ most (calls x fresh MiB in one step):", "",
                "| spec | phase | op | cyclec | transformers |", "|---|---|---|---|---|"]
        for r in results["ops"]:
            for d in r["diff"][:6]:
                out.append(f"| {r['name']} | {d['phase']} | `{d['op']}` | {d['cyclec'][0]} x {d['cyclec'][1] / 2**20:.2f} | "
                           f"{d['transformers'][0]} x {d['transformers'][1] / 2**20:.2f} |")
        out.append("")
    if "train-loop" in results:
        t = results["train-loop"]
        out += ["### The training loop (`cyclec train`) against its bare step", "",
                "gpt2 shrunk (width 256, 4 blocks), byte-level data from docs/*.md.", "",
                "| figure | value |", "|---|---|",
                f"| bare step (forward, backward, norm and clip, AdamW, schedule) | {t['bare_ms']:.1f} ms |",
                f"| loop step (+ reading the batch, flameout watch, metrics.jsonl, progress) | {t['loop_ms']:.1f} ms |",
                f"| loop / bare, in the same steps | **{t['ratio']:.4f}** |",
                f"| one checkpoint (weights, optimizer, state; fsync'd) | {t['ckpt_s']:.2f} s |",
                f"| loop / bare with a checkpoint every {t['ckpt_every']} steps | **{t['ratio'] + t['ckpt_share']:.4f}** |", ""]
        m = t["memory"]
        out += ["| activation checkpointing | peak MiB | above weights + AdamW state, MiB | saving |", "|---|---|---|---|"]
        act0 = m["none"]["peak"] - m["none"]["base"]
        for mode in ("none", "stage", "selective"):
            act = m[mode]["peak"] - m[mode]["base"]
            out.append(f"| {mode} | {m[mode]['peak'] / 2**20:.1f} | {act / 2**20:.1f} | **x{act0 / act:.2f}** |")
        out.append("")
    if "frontend" in results:
        f = results["frontend"]
        out += ["### The front end", "", f"Bare `python -c pass`: {f['bare'] * 1000:.0f} ms (median).", "",
                "| command (gpt2.cycle) | over bare Python |", "|---|---|"]
        out += [f"| `{k}` | **+{v * 1000:.0f} ms** |" for k, v in f["cli"].items()]
        out += ["", f"torch imported by `cyclec draw`: {'no' if f['torch_free'] else 'YES'}.", "",
                "| synthetic spec | lines | parse + check, wall | lines/s, wall | CPU time | lines per CPU second |", "|---|---|---|---|---|---|"]
        out += [f"| {s['label']} | {s['lines']:,} | {s['s'] * 1000:.1f} ms | {s['rate']:,.0f} | {s.get('cpu_s', float('nan')) * 1000:.1f} ms | "
                f"**{s.get('cpu_rate', float('nan')):,.0f}** |" for s in f["scale"]]
        out.append("")
    if "lsp" in results:
        r = results["lsp"]
        out += ["### The language server", "", "| figure | value |", "|---|---|",
                f"| a change to a {r['lines']}-line spec, to LSP diagnostics (in-process, median) | **{r['ms']:.1f} ms** (target ≤ {r['target_ms']:.0f} ms) |",
                f"| the same, CPU time | {r['cpu_ms']:.1f} ms |", f"| the same, worst of the run | {r['max_ms']:.1f} ms |"]
        if "stdio_ms" in r:
            out.append(f"| the same through `cyclec lsp` over stdio (didChange → publishDiagnostics, median) | {r['stdio_ms']:.1f} ms |")
        for k in ("300", "10k"):
            if f"complete_{k}_ms" in r:
                out.append(f"| completion / hover at the last stage of a {r[f'lines_{k}']:,}-line spec | {r[f'complete_{k}_ms']:.1f} ms / {r[f'hover_{k}_ms']:.1f} ms |")
        out.append("")
    return "\n".join(out)
