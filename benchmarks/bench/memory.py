"""Peak memory of a training step, counted exactly."""

from __future__ import annotations

from .common import adamw, models


def peak_step_bytes(model, opt, idx, tgt, torch):
    """Peak bytes of live tensor storage during one training step (after a warm-up step,
    so optimizer state exists), counted exactly by a dispatch mode that sees every
    allocation: storages are tracked by weak reference and dropped when freed."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def step():
        opt.zero_grad(set_to_none=True)
        model(idx, tgt)[1].backward()
        opt.step()

    step()
    live = {}

    def add(t):
        st = t.untyped_storage()
        ref = StorageWeakRef(st)
        if ref.cdata not in live:
            live[ref.cdata] = (ref, st.nbytes())

    for p in model.parameters():
        add(p)
    for s in opt.state.values():
        for v in s.values():
            if isinstance(v, torch.Tensor):
                add(v)
    base = sum(n for _, n in live.values())
    peak = [base]

    class Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    add(t)
            for k in [k for k, (r, _) in live.items() if r.expired()]:
                del live[k]
            peak[0] = max(peak[0], sum(n for _, n in live.values()))
            return out

    with Track():
        step()
    return base, peak[0]


def bench_memory(args, torch):
    rows = []
    for name in args.specs.split(","):
        ours, ref, hf = models(name, torch)
        del hf
        B, T = args.batch, args.seq
        idx = torch.randint(0, ours.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
        tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
        got = {}
        for label, m in (("cyclec", ours), ("reference", ref)):
            got[label] = peak_step_bytes(m.train(), adamw(m, torch), idx, tgt, torch)
        (b0, p0), (b1, p1) = got["cyclec"], got["reference"]
        rows.append({"name": name, "cyclec": p0, "reference": p1, "ratio": p0 / p1, "act_ratio": (p0 - b0) / (p1 - b1)})
        print(f"  {name}: peak {p0 / 2**20:.1f} MiB vs {p1 / 2**20:.1f} MiB (x{p0 / p1:.3f}); above weights+state x{(p0 - b0) / (p1 - b1):.3f}", flush=True)
    return rows
