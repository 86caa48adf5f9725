"""Greedy decoding with the cache against recomputing."""

from __future__ import annotations

import sys
import time

from .common import DECODE, median, shrunk, synchronize


def bench_decode(args, torch):
    import cyclelang

    model = cyclelang.build(shrunk("llama", DECODE), seed=0, fast=True).eval()
    model.to(device=args.device, dtype=getattr(torch, args.dtype))
    Cache = sys.modules[type(model).__module__].Cache
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)).to(args.device)
    sync = lambda: synchronize(torch, args.device)  # noqa: E731

    @torch.no_grad()
    def per_token(n):
        """Greedy decoding with the cache, timing each new token."""
        cache, idx, ts = Cache(), prompt, []
        logits = model(idx, cache=cache)
        for _ in range(n):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat((idx, nxt), dim=1)
            sync()
            t0 = time.perf_counter()
            logits = model(nxt, cache=cache)
            sync()
            ts.append(time.perf_counter() - t0)
        return ts

    def total(n, use_cache):
        sync()
        t0 = time.perf_counter()
        out = model.generate(prompt, n, temperature=0, use_cache=use_cache)
        sync()
        return time.perf_counter() - t0, out

    per_token(16)  # warm-up
    res = {}
    ts = per_token(1024)
    first, last = median(ts[32:96]), median(ts[-64:])
    res["ms_first"], res["ms_last"], res["flat"] = 1000 * first, 1000 * last, last / first
    res["same"] = True
    for n, reps in ((256, args.decode_reps), (1024, 1)):
        speed = []
        for _ in range(reps):
            tc, a = total(n, True)
            tn, b = total(n, False)
            if args.dtype == "float32":
                assert torch.equal(a, b), "cache and recompute disagree"
            else:  # in half precision the two orders of summation may round a near-tie apart
                res["same"] = res["same"] and torch.equal(a, b)
            speed.append(tn / tc)
        res[f"x{n}"] = median(speed)
    print(f"  per token (cache): {res['ms_first']:.2f} ms at ~64 tokens, {res['ms_last']:.2f} ms at ~1000 (x{res['flat']:.2f}); "
          f"speed-up over recompute: x{res['x256']:.1f} at 256, x{res['x1024']:.1f} at 1024", flush=True)
    return res
