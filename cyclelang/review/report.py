"""Static analyses of an engine, from the IR alone (no torch).

- parameters per stage and per role, and the mixer/reactor split;
- FLOPs per token, forward and training (3x forward: the backward pass costs
  two forwards, one for the inputs' gradients and one for the weights');
- gradient reachability: which parameter groups a loss reaches, given detach
  and overboard;
- the scaling report, the expander cycle's lesson: how attention FLOPs,
  activation memory and the KV cache grow with the context length.

FLOPs count matrix products only (2 per multiply-add), as
`torch.utils.flop_counter.FlopCounterMode` does: norms, activations, rotary
and pooling are elementwise and left out. Attention's scores and weighted sum
are counted dense over the attended positions (4 x heads x head_dim x n per
token), which is what a fused kernel executes for a causal mask too.

`analyze(spec)` returns a plain dict (the `--json` form); `render_text` lays it
out for a terminal. Both are deterministic.
"""

from __future__ import annotations

import math

from .. import ir
from ..ir.layout import Part
from .walk import ROLES, parts

DTYPE_BYTES = 2  # bf16/fp16 activations and KV cache


def attention_params(a: ir.Attention) -> int:
    return ir.kinds.params(a)


mlp_params = ir.kinds.mlp_params


# --- per part: asked of the kinds table -------------------------------------------------------


def part_params(p: Part) -> int:
    return p.params


def part_flops(p: Part, n: int) -> tuple[int, int]:
    """Forward FLOPs per token at context length n: (projections, mixing), one instance."""
    return p.flops(n)


def forward_flops_per_token(e: ir.Engine, n: int) -> int:
    """Forward FLOPs per token when a sequence of n tokens is processed."""
    return sum(sum(part_flops(p, n)) * p.repeat for p in parts(e))


# --- gradient reachability ------------------------------------------------------------------


def _losses(engine: ir.Engine) -> list[tuple[str, Part | None]]:
    """The losses of the engine: the nozzle's, then each weighted overboard head."""
    out: list[tuple[str, Part | None]] = [("nozzle", None)]
    seen = set()
    for p in parts(engine):
        b = p.branch
        if b is not None and b.overboard and b.loss and p.group not in seen:
            seen.add(p.group)
            out.append((p.group, p))
    return out


def reachability(engine: ir.Engine) -> list[dict]:
    """For each parameter group, the losses whose gradient reaches it.

    The main line is never cut, so the nozzle's loss reaches every part on it and
    every branch that merges back. An overboard head's loss reaches its own branch
    and, unless the branch is detached, everything upstream of where it splits off
    (in a repeated stage: every instance up to the last one). A dead branch (overboard,
    no loss) is reached by nothing.
    """
    ps = list(parts(engine))
    groups: dict[str, dict] = {}
    for p in ps:
        g = groups.setdefault(p.group, {"group": p.group, "repeat": p.repeat, "params": 0, "_parts": []})
        g["params"] += part_params(p) * p.repeat
        g["_parts"].append(p)
    losses = _losses(engine)
    order = {g: i for i, g in enumerate(groups)}
    out = []
    for name, g in groups.items():
        first = g["_parts"][0]
        reached = []
        b = first.branch
        for loss, head in losses:
            if loss == "nozzle":
                if b is None or not b.overboard:
                    reached.append(loss)
                continue
            hb = head.branch
            if name == head.group:
                reached.append(loss)
            elif not hb.detach and _upstream(first, head, order):
                reached.append(loss)
        out.append({"group": name, "repeat": g["repeat"], "params": g["params"], "losses": reached})
    return out


def _upstream(p: Part, head: Part, order: dict[str, int]) -> bool:
    """Whether part p lies upstream of where the overboard head splits off."""
    if p.branch is not None and p.branch.overboard:
        return False  # another overboard branch: its exhaust never reaches the head
    if p.stage_index < head.stage_index:
        return True
    if p.stage_index > head.stage_index:
        return False
    if head.repeat > 1:
        return True  # earlier instances of the same stage feed the last instance's head
    if head.fullflow is not None and p.fullflow is head.fullflow:
        return p.branch is None  # the shared valve; parallel branches read the same state
    return order[p.group] < order[head.group]


# --- the analysis --------------------------------------------------------------------------


def analyze(spec: ir.Spec, dtype_bytes: int = DTYPE_BYTES) -> dict | None:
    """The full static report of a spec as plain data; None for a file of templates only."""
    e = spec.engine
    if e is None:
        return None
    with ir.layout.held(e):  # the analyses walk the same parts many times
        return _analyze(e, dtype_bytes)


def _analyze(e: ir.Engine, dtype_bytes: int) -> dict:
    ps = list(parts(e))
    n = e.feed.context

    by_role = {r: 0 for r in ROLES}
    stages: list[dict] = []
    by_path = {sl.path: sl for sl in ir.layout.layout(e).all_stages()}
    nested = any(sl.children for sl in by_path.values())
    groups: dict[str, dict] = {}
    for p in ps:
        c = part_params(p)
        by_role[p.role] += c * p.repeat
        key = (p.stage_index, p.spath)
        if not stages or stages[-1]["_index"] != key:
            sl = by_path.get(p.spath)
            for g in (sl.chain()[:-1] if sl is not None else []):  # a nested stage's groups: a row each, before their first stage
                if g.path not in groups:
                    groups[g.path] = {"name": g.stage.name, "path": g.path, "_index": None, "repeat": g.count, "per_instance": 0, "params": 0,
                                      "by_role": {}, "depth": g.depth, "group": True}
                    stages.append(groups[g.path])
            name, path = _stage_of(p)
            stages.append({"name": name, "path": path, "_index": key, "repeat": p.repeat, "per_instance": 0, "params": 0, "by_role": {}})
            if nested:
                stages[-1]["depth"] = sl.depth if sl is not None else 0
        s = stages[-1]
        s["per_instance"] += c
        s["params"] += c * p.repeat
        if c:
            s["by_role"][p.role] = s["by_role"].get(p.role, 0) + c * p.repeat
        for g in (by_path[p.spath].chain()[:-1] if p.spath in by_path else []):
            row = groups[g.path]
            row["params"] += c * p.repeat
            row["per_instance"] += c * p.repeat // g.count
            if c:
                row["by_role"][p.role] = row["by_role"].get(p.role, 0) + c * p.repeat
    for s in stages:
        del s["_index"]
    total = sum(by_role.values())
    work = by_role["mixer"] + by_role["reactor"]

    flops_role = {r: 0 for r in ROLES}
    fwd = 0
    attn_fwd = 0
    for p in ps:
        proj, att = part_flops(p, n)
        flops_role[p.role] += (proj + att) * p.repeat
        fwd += (proj + att) * p.repeat
        attn_fwd += att * p.repeat

    rep = {
        "engine": e.name,
        "params": {
            "total": total,
            "non_embedding": total - by_role["feed"],
            "by_role": by_role,
            "by_stage": stages,
            "mixer_share": round(by_role["mixer"] / work, 4) if work else 0.0,
            "reactor_share": round(by_role["reactor"] / work, 4) if work else 0.0,
        },
        "flops_per_token": {
            "context": n,
            "forward": fwd,
            "training": 3 * fwd,
            "attention": attn_fwd,
            "by_role": {r: v for r, v in flops_role.items() if v},
        },
        "gradient": _gradient(e),
        "scaling": scaling(e, dtype_bytes),
    }
    if ir.mup.is_mup(e):  # the standard parametrisation adds nothing: every group keeps the spec's numbers
        rep["parametrization"] = {"kind": "mup", "width": e.width, "base_width": e.startup.param.base_width,
                                  "width_mult": ir.mup.width_mult(e), "readout_mult": ir.mup.readout_mult(e),
                                  "groups": ir.mup.table(e)}
    return rep


def _stage_of(p: Part) -> tuple[str, str]:
    """(the stage's name, its path) for the stage table: a stage's folded path; the
    feed, the nozzle and an engine-level op stand for themselves."""
    if p.stage is not None:
        return p.stage.name, p.spath
    return {"feed": "feed", "head": "nozzle"}.get(p.path, "main"), p.path


def _gradient(e: ir.Engine) -> dict:
    groups = reachability(e)
    dead = [g["group"] for g in groups if not g["losses"]]
    return {
        "losses": [name for name, _ in _losses(e)],
        "groups": groups,
        "unreached": dead,
        "unreached_params": sum(g["params"] for g in groups if not g["losses"]),
    }


def kv_bytes_per_token(e: ir.Engine, dtype_bytes: int = DTYPE_BYTES) -> int:
    """What decoding keeps per token, in bytes (a KV cache: layers x kv_heads x head_dim x 2
    x dtype bytes); 0 without a causal throat."""
    return _state_bytes(e, 1, dtype_bytes)


def _state_bytes(e: ir.Engine, n: int, dtype_bytes: int) -> int:
    """The KV cache of a sequence of n tokens, in bytes: the state that grows with n
    (a pool's few remembered inputs are left out)."""
    if e.throat != "causal":
        return 0
    return sum(p.kind.state(p.node, n) * p.repeat for p in parts(e) if p.kind.state_kind == "kv") * dtype_bytes


def decode_state_bytes(e: ir.Engine, n: int, dtype_bytes: int = DTYPE_BYTES) -> int:
    """Everything decoding keeps after n tokens, in bytes: KV caches (growing with n, up to a
    window), the windows of pools and convs, and the fixed-size states of recurrent mixers
    (ssm, linear_attention), which do not grow at all; 0 without a causal throat."""
    if e.throat != "causal":
        return 0
    return sum(p.kind.state(p.node, n) * p.repeat for p in parts(e) if p.kind.state_kind is not None) * dtype_bytes


def recurrent_kinds(e: ir.Engine) -> list[str]:
    """The keywords of the engine's mixers whose decoding state has a fixed size."""
    return sorted({p.kind.keyword for p in parts(e) if p.kind.state_kind == "recurrent"})


def _activation_terms(e: ir.Engine, dtype_bytes: int) -> tuple[int, int]:
    """Bytes kept for the backward pass per sequence of n tokens: (a, b) in a*n + b*n^2.

    A rough account: the input of every matrix product and norm, the hidden units
    of the reactors, q/k/v and the attention output; b is the attention weights a
    plain (math) kernel keeps, heads x n^2. A fused kernel keeps none of them, so
    with it activation memory is linear in n.
    """
    lin = quad = 0
    for p in parts(e):
        a, b = p.kind.activations(p.node, 0)
        lin, quad = lin + a * p.repeat, quad + b * p.repeat
    return lin * dtype_bytes, quad * dtype_bytes


def _mixing_by_kind(ps, n: int) -> dict[str, int]:
    """Mixing FLOPs per token at context n, summed over the engine's parts of each kind."""
    out: dict[str, int] = {}
    for p in ps:
        mix = part_flops(p, n)[1] * p.repeat
        if mix:
            out[p.kind.keyword] = out.get(p.kind.keyword, 0) + mix
    return out


def scaling(e: ir.Engine, dtype_bytes: int = DTYPE_BYTES) -> dict:
    """Costs per sequence at context lengths around the spec's, with local exponents."""
    ps = list(parts(e))
    lin, quad = _activation_terms(e, dtype_bytes)
    causal = e.throat == "causal"

    def attn_flops(n: int) -> int:
        return sum(part_flops(p, n)[1] * p.repeat for p in ps) * n

    def fwd_flops(n: int) -> int:
        return sum(sum(part_flops(p, n)) * p.repeat for p in ps) * n

    def act_bytes(n: int) -> int:
        return lin * n + quad * n * n

    def kv_bytes(n: int) -> int:
        return _state_bytes(e, n, dtype_bytes)

    def state_bytes(n: int) -> int:
        return decode_state_bytes(e, n, dtype_bytes)

    def exponent(f, n: int) -> float:
        lo, hi = f(n), f(2 * n)
        return round(math.log2(hi / lo), 3) if lo > 0 and hi > 0 else 0.0

    n0 = e.feed.context
    lengths = sorted({max(1, n0 // 4), max(1, n0 // 2), n0, 2 * n0, 4 * n0})
    rows = [{"context": n, "attention_flops": attn_flops(n), "forward_flops": fwd_flops(n),
             "activation_bytes": act_bytes(n), "kv_cache_bytes": kv_bytes(n), "state_bytes": state_bytes(n),
             "mixing_flops_per_token": {k: v for k, v in _mixing_by_kind(ps, n).items()}} for n in lengths]
    return {
        "dtype_bytes": dtype_bytes,
        "kv_cache": causal,
        "kv_bytes_per_token": kv_bytes_per_token(e, dtype_bytes),
        "recurrent": recurrent_kinds(e),  # mixers whose decoding state has a fixed size
        "latent": any(isinstance(p.node, ir.LatentAttention) for p in ps),  # a KV cache that keeps latents
        "activation_bytes_per_token": lin,
        "activation_bytes_per_token_squared": quad,
        "rows": rows,
        "exponents": {  # d log(cost) / d log(n) at the spec's context, per sequence
            "attention_flops": exponent(attn_flops, n0),
            "forward_flops": exponent(fwd_flops, n0),
            "activation_bytes": exponent(act_bytes, n0),
            "kv_cache_bytes": exponent(kv_bytes, n0),
            "state_bytes": exponent(state_bytes, n0),
        },
    }


# --- text ----------------------------------------------------------------------------------


def _si(x: float, unit: str = "") -> str:
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f} {suffix}{unit}".rstrip()
    return f"{x:g} {unit}".rstrip()


def _bytes(x: float) -> str:
    for div, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if x >= div:
            return f"{x / div:.2f} {suffix}"
    return f"{x:g} B"


def render_text(rep: dict) -> str:
    """A terminal report of `analyze`'s result."""
    p, f, g, s = rep["params"], rep["flops_per_token"], rep["gradient"], rep["scaling"]
    out = [f"engine {rep['engine']}", ""]
    out.append(f"parameters: {p['total']:,} ({_si(p['total'])}), {p['non_embedding']:,} without the feed")
    out.append(f"  {'stage':<16}{'path':<{max([16] + [len(st['path']) + 2 for st in p['by_stage']])}}{'repeat':>7}{'per instance':>16}{'total':>16}")
    wide = max([16] + [len(st["path"]) + 2 for st in p["by_stage"]])
    for st in p["by_stage"]:
        name = "  " * max(st.get("depth", 1) - 1, 0) + st["name"]  # a nested stage sits under its group
        out.append(f"  {name:<16}{st['path']:<{wide}}{'x' + str(st['repeat']):>7}{st['per_instance']:>16,}{st['params']:>16,}")
    out.append("  by role: " + ", ".join(f"{r} {v:,}" for r, v in p["by_role"].items() if v))
    out.append(f"  mixers {p['mixer_share']:.1%} / reactors {p['reactor_share']:.1%} of the turbines' parameters")
    out.append("")
    out.append(f"FLOPs per token at context {f['context']}: forward {_si(f['forward'])}, training {_si(f['training'])} (3x)")
    if s["recurrent"]:
        out.append(f"  position mixing (attention scores and sums, chunked scans): {_si(f['attention'])} of the forward")
    else:
        out.append(f"  attention scores and sums: {_si(f['attention'])} of the forward")
    out.append("  by role: " + ", ".join(f"{r} {_si(v)}" for r, v in f["by_role"].items()))
    out.append("")
    out.append("gradient: losses " + ", ".join(g["losses"]))
    for grp in g["groups"]:
        mark = ", ".join(grp["losses"]) if grp["losses"] else "NONE: no gradient"
        out.append(f"  {grp['group']:<28}{grp['params']:>14,}  <- {mark}")
    if g["unreached"]:
        out.append(f"  {g['unreached_params']:,} parameters receive no gradient: {', '.join(g['unreached'])}")
    out.append("")
    out.append(f"scaling with context length n (per sequence, {s['dtype_bytes']}-byte values):")
    if s["kv_cache"] and not s["kv_bytes_per_token"]:
        out.append("  KV cache: none (no mixer keeps keys and values)")
    elif s["kv_cache"] and s["latent"]:
        out.append(f"  KV cache: {s['kv_bytes_per_token']:,} bytes per token (layers x kv_heads x head_dim x 2, or for latent attention "
                   f"layers x (latent + rotary key), x {s['dtype_bytes']})")
    elif s["kv_cache"]:
        out.append(f"  KV cache: {s['kv_bytes_per_token']:,} bytes per token (layers x kv_heads x head_dim x 2 x {s['dtype_bytes']})")
    else:
        out.append("  KV cache: none (open throat: every position sees every other, nothing can be cached)")
    rec = s["recurrent"]
    if rec and s["kv_cache"]:
        fixed = s["rows"][0]["state_bytes"] - s["rows"][0]["kv_cache_bytes"]
        out.append(f"  recurrent state ({', '.join(rec)}): {_bytes(fixed)} per sequence, whatever its length"
                   + ("; decoding keeps the KV cache and it" if s["kv_bytes_per_token"] else ""))
    state_col = f"{'decode state':>14}" if rec else ""
    out.append(f"  {'n':>8}{'attention FLOPs':>18}{'forward FLOPs':>16}{'activations':>14}{'KV cache':>14}" + state_col)
    for r in s["rows"]:
        state = f"{_bytes(r['state_bytes']):>14}" if rec else ""
        out.append(f"  {r['context']:>8}{_si(r['attention_flops']):>18}{_si(r['forward_flops']):>16}{_bytes(r['activation_bytes']):>14}{_bytes(r['kv_cache_bytes']):>14}" + state)
    ex = s["exponents"]
    out.append(f"  exponents at n={f['context']}: attention FLOPs n^{ex['attention_flops']:g}, forward FLOPs n^{ex['forward_flops']:g}, "
               f"activations n^{ex['activation_bytes']:g} (plain kernel; a fused one keeps no n^2 term), KV cache n^{ex['kv_cache_bytes']:g}"
               + (f", decode state n^{ex['state_bytes']:g}" if rec else ""))
    mp = rep.get("parametrization")
    if mp is not None:
        out.append("")
        out.append(f"parametrisation: mup, width {mp['width']} = {mp['width_mult']:g} x base width {mp['base_width']} "
                   f"(Tensor Programs V, Table 3, Adam; vectors keep the standard rule; logits x {mp['readout_mult']:.4g})")
        out.append(f"  {'part':<28}{'kind':<16}{'rule':<9}{'init x':>9}{'lr x':>9}{'decay x':>9}")
        for grp in mp["groups"]:
            scale = f"  scores x {grp['attention_scale']:.3g}" if grp.get("attention_scale") is not None else ""
            out.append(f"  {grp['path']:<28}{grp['kind']:<16}{grp['rule']:<9}{grp['init']:>9.4g}{grp['lr']:>9.4g}{grp['decay']:>9.4g}{scale}")
    return "\n".join(out) + "\n"
