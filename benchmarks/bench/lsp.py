"""The language server's answer to an edit."""

from __future__ import annotations

import sys
import time

from .common import median, ROOT
from .frontend import synthetic


def bench_lsp(args):
    """The language server's answer to an edit: a change to a 300-line spec, parsed, resolved,
    reviewed and turned into LSP diagnostics in-process (the parser warm, as in the server)."""
    from cyclelang.lsp import analysis as an

    text = synthetic(29)  # 29 templates of 10 lines and an engine: about 300 lines
    lines = text.count("\n")
    edits = [text.replace("turbine mlp ratio=4", "turbine mlp ratio=2", 1), text.replace("heads=h", "haeds=h", 1), text]
    prev = an.analyze(text, "synth.cycle")  # warm: the parser's tables, the first analysis
    ts, cs = [], []
    for _ in range(args.parse_reps * 4):
        for new in edits:
            t0, c0 = time.perf_counter(), time.process_time()
            prev = an.analyze(new, "synth.cycle", previous=prev)
            an.lsp_diagnostics(prev, "file:///synth.cycle")
            ts.append(time.perf_counter() - t0)
            cs.append(time.process_time() - c0)
    out = {"lines": lines, "ms": median(ts) * 1000, "max_ms": max(ts) * 1000, "cpu_ms": median(cs) * 1000, "target_ms": 50.0}
    print(f"  a change to a {lines}-line spec -> diagnostics: {out['ms']:.1f} ms median ({out['cpu_ms']:.1f} ms CPU), {out['max_ms']:.1f} ms worst; target 50 ms", flush=True)
    # completion and hover at the last stage of the engine, the most text before the cursor
    big = an.analyze(synthetic(999), "big.cycle")
    for label, a in (("300", prev), ("10k", big)):
        line = max(i for i, s in enumerate(a.lines) if s.startswith("  stage "))
        tc, th = [], []
        for _ in range(args.parse_reps * 2):
            t0 = time.perf_counter()
            an.complete(a, line, len(a.lines[line]))
            tc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            an.hover(a, line, 4)
            th.append(time.perf_counter() - t0)
        out[f"complete_{label}_ms"], out[f"hover_{label}_ms"] = median(tc) * 1000, median(th) * 1000
        out[f"lines_{label}"] = len(a.lines) - 1
        print(f"  {len(a.lines) - 1}-line spec: completion {median(tc) * 1000:.1f} ms, hover {median(th) * 1000:.1f} ms (medians)", flush=True)
    # the same change through the real server: didChange in, publishDiagnostics out, over stdio
    try:
        import pygls  # noqa: F401
    except ImportError:
        return out
    sys.path.insert(0, str(ROOT / "tests"))
    from lsp_client import Client

    c = Client()
    c.initialize()
    uri = "file:///bench/synth.cycle"
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "cycle", "version": 1, "text": text}})
    c.diagnostics(uri, 1)
    tw, version = [], 1
    for _ in range(args.parse_reps * 4):
        for new in edits:
            version += 1
            t0 = time.perf_counter()
            c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": new}]})
            c.diagnostics(uri, version)
            tw.append(time.perf_counter() - t0)
    c.close()
    out["stdio_ms"] = median(tw) * 1000
    print(f"  over stdio (didChange -> publishDiagnostics): {out['stdio_ms']:.1f} ms median", flush=True)
    return out
