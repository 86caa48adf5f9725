"""What a training step dispatches: op counts, fresh bytes, self CPU time."""

from __future__ import annotations

import gc
import re

from .common import _loss, adamw, median, models


PHASES = ("forward", "backward", "optimizer")


def op_name(name: str) -> str:
    """An op's schema name as the profiler and the dispatcher both give it, shortened:
    aten::mm -> mm; the loss op without its source digest (cyclelang::next_token_loss_0d7b792e
    -> cyclelang::next_token_loss)."""
    return re.sub(r"^(cyclelang::\w+?)_[0-9a-f]{8}$", r"\1", name.removeprefix("aten::"))


def training_step(model, opt, idx, tgt, is_hf, mark=lambda phase: None):
    """One training step; mark(phase) is called as each phase begins."""
    mark("forward")
    opt.zero_grad(set_to_none=True)
    loss = _loss(model, idx, tgt, hf=is_hf)
    mark("backward")
    loss.backward()
    mark("optimizer")
    opt.step()


def step_ops(model, opt, idx, tgt, is_hf, torch) -> dict:
    """{phase: {op: [calls, fresh bytes]}} of one training step (after a warm-up step): every
    aten op the step dispatches, and the bytes of the storages it returns that none of its
    inputs held (fresh allocations; views and in-place results hold an input's). Counted,
    not timed, so it does not move with the machine's load."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase, self.got = None, {p: {} for p in PHASES}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace == "profiler":  # record_function's markers, not work
                return out
            held = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            fresh = sum(t.untyped_storage().nbytes() for t in tree_leaves(out)
                        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in held)
            row = self.got[self.phase].setdefault(op_name(func._schema.name), [0, 0])
            row[0] += 1
            row[1] += fresh
            return out

    model.train()
    training_step(model, opt, idx, tgt, is_hf)
    mode = Count()
    with mode:
        training_step(model, opt, idx, tgt, is_hf, mark=lambda phase: setattr(mode, "phase", phase))
    return mode.got


def step_self_ms(steps, rounds, torch) -> dict:
    """{label: {phase: {op: self CPU ms}}}, medians over `rounds` profiled steps per side
    (torch.profiler, the sides alternating as in time_sides; ops absent from a round count
    0 there). steps: {label: fn(mark)} running one training step. Timed, so it moves with
    the load, unlike step_ops's counts."""
    from torch.profiler import ProfilerActivity, profile

    got = {k: [] for k in steps}
    for r in range(rounds):
        for label in (list(steps) if r % 2 == 0 else list(reversed(steps))):
            open_ = []

            def mark(phase):  # a record_function range per phase, on the profiler's own clock
                if open_:
                    open_.pop().__exit__(None, None, None)
                open_.append(torch.autograd.profiler.record_function("phase:" + phase))
                open_[0].__enter__()

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                steps[label](mark)
                open_.pop().__exit__(None, None, None)
            events = prof.events()
            ranges = [(e.time_range.start, e.time_range.end, e.name.removeprefix("phase:")) for e in events if e.name.startswith("phase:")]
            one = {ph: {} for ph in PHASES}
            for e in events:
                if not (e.name.startswith("aten::") or e.name.startswith("cyclelang::")):
                    continue
                phase = next((ph for a, b, ph in ranges if a <= e.time_range.start <= b), None)
                if phase is None:  # outside the step's phases
                    continue
                op = op_name(e.name)
                one[phase][op] = one[phase].get(op, 0.0) + e.self_cpu_time_total / 1000
            got[label].append(one)
    return {label: {ph: {op: median([g[ph].get(op, 0.0) for g in runs]) for op in set().union(*(g[ph] for g in runs))}
                    for ph in PHASES} for label, runs in got.items()}


def bench_ops(args, torch):
    """Per spec and side: aten ops dispatched and bytes freshly allocated in each phase of a
    training step (counted), their self CPU time (profiled, alternating sides), and the ops
    where cyclec and transformers differ most."""
    rows = []
    for name in args.specs.split(","):
        ours, ref, hf = models(name, torch)
        B, T = args.batch, args.seq
        idx = torch.randint(0, ours.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
        tgt = torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1)
        sides = (("cyclec", ours), ("reference", ref), ("transformers", hf))
        opts = {label: adamw(m, torch) for label, m in sides}
        got = {label: step_ops(m, opts[label], idx, tgt, label == "transformers", torch) for label, m in sides}
        steps = {label: (lambda mark, m=m, label=label: training_step(m, opts[label], idx, tgt, label == "transformers", mark))
                 for label, m in sides if label != "reference"}
        ms = step_self_ms(steps, max(3, args.rounds // 2), torch)
        total = {label: {ph: [sum(v[0] for v in ops.values()), sum(v[1] for v in ops.values())] for ph, ops in g.items()} for label, g in got.items()}
        a, b = got["cyclec"], got["transformers"]
        diff = []
        for ph in PHASES:
            for op in set(a[ph]) | set(b[ph]):
                x, y = a[ph].get(op, [0, 0]), b[ph].get(op, [0, 0])
                if x != y:
                    diff.append({"phase": ph, "op": op, "cyclec": x, "transformers": y,
                                 "ms": {k: ms[k][ph].get(op, 0.0) for k in ms}})
        # the largest differences in bytes first, then in calls
        diff.sort(key=lambda d: (-abs(d["cyclec"][1] - d["transformers"][1]), -abs(d["cyclec"][0] - d["transformers"][0]), d["op"]))
        self_ms = {k: {ph: sum(v.values()) for ph, v in m.items()} for k, m in ms.items()}
        rows.append({"name": name, "total": total, "diff": diff[:10], "self_ms": self_ms})
        for label, t in total.items():
            print(f"  {name}/{label}: " + "; ".join(f"{ph} {n} ops, {by / 2**20:.1f} MiB fresh" + (f", {self_ms[label][ph]:.1f} ms self CPU" if label in self_ms else "")
                                                  for ph, (n, by) in t.items()), flush=True)
        print("    ops that differ (calls x MiB fresh, self CPU ms):", flush=True)
        for d in diff[:25]:
            print(f"    {d['phase']:9s} {d['op']:34s} cyclec {d['cyclec'][0]:4d} x {d['cyclec'][1] / 2**20:7.2f} MiB {d['ms']['cyclec']:7.2f} ms   "
                  f"transformers {d['transformers'][0]:4d} x {d['transformers'][1] / 2**20:7.2f} MiB {d['ms']['transformers']:7.2f} ms", flush=True)
        print("    largest self-CPU differences (ms, cyclec - transformers; load-dependent):", flush=True)
        gaps = sorted(((ph, op, ms["cyclec"][ph].get(op, 0.0), ms["transformers"][ph].get(op, 0.0)) for ph in PHASES
                       for op in set(ms["cyclec"][ph]) | set(ms["transformers"][ph])), key=lambda g: -abs(g[2] - g[3]))
        for ph, op, x, y in gaps[:15]:
            print(f"    {ph:9s} {op:34s} {x:8.2f} {y:8.2f} {x - y:+8.2f}   calls {a[ph].get(op, [0])[0]} / {b[ph].get(op, [0])[0]}", flush=True)
        del ours, ref, hf
        gc.collect()
    return rows
