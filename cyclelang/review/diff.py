"""What changed between two designs, in the IR's terms: `cyclec diff A B`.

Parts are named by their canonical layout paths (`ir.layout`) and matched stage by
stage: stages by name along the main line, parts inside a stage by their path within
one instance (`mix.attn`), so GPT-2 against GPT-2 medium is one stage repeated 24
times instead of 12, not twelve stages added. A part of one kind that leaves one place
of a stage and appears at another is a move, and a moved norm is named by what it
changes: "norm moved from the branch to the main line: Pre-LN → Post-LN".

Numbers (parameters, forward FLOPs per token at each design's own context, KV-cache
bytes per token) are asked of the kinds table through the layout, per stage and in
total, as `cyclec check --report` counts them. `diff(a, b)` returns plain data (the
`--json` form); `render_text` lays it out. Both are deterministic.
"""

from __future__ import annotations

import difflib

from .. import ir
from ..ir.kinds import KINDS
from ..ir.layout import Part
from .report import DTYPE_BYTES, analyze, kv_bytes_per_token

# --- where a part sits, and what a stage's norms make it -------------------------------------


def where(p: Part) -> tuple[str, str]:
    """(network words, engine words) for the place of a part inside its stage."""
    if p.fullflow is not None and p.branch is None:
        return "the shared input of the parallel branches", "the full-flow split"
    if p.branch is not None:
        return f"the branch ({p.branch.name})", f"prechamber {p.branch.name}"
    return "the main line", "in series on the main line"


def norm_placement(parts: list[Part]) -> str:
    """Pre-LN, Post-LN, Sandwich-LN, Pre-LN + Post-LN or no norm, for one stage's parts."""
    pre = post_in_branch = series = False
    seen_turbine: dict[str, bool] = {}
    for p in parts:
        branch = p.branch.name if p.branch is not None else None
        if isinstance(p.node, ir.Norm):
            if p.branch is None and p.fullflow is not None:
                pre = True  # a fullflow's shared valve feeds every branch
            elif branch is None:
                series = True
            elif seen_turbine.get(branch):
                post_in_branch = True
            else:
                pre = True
        elif branch is not None and p.kind.role not in ("merge", "valve"):
            seen_turbine[branch] = True
    if pre and post_in_branch:
        return "Sandwich-LN"
    if pre and series:
        return "Pre-LN + Post-LN"
    return "Pre-LN" if pre else "Post-LN" if series else "no norm"


def _kv_words(a: ir.Attention) -> str:
    if a.kv_heads == a.heads:
        return "multi-head"
    if a.kv_heads == 1:
        return "MQA"
    return f"GQA ({a.heads // a.kv_heads} query heads per KV head)"


def _part_words(p: Part) -> str:
    k = p.kind
    name = f"{'norm ' + p.node.type if isinstance(p.node, ir.Norm) else k.keyword}"
    return f"{name} ({k.ml}, {k.describe(p.node)[0]})"


def _dump(node) -> dict:
    return node.model_dump(mode="json") if hasattr(node, "model_dump") else {}


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _show(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return " ".join(_show(x) for x in v)
    return str(v)


def _field_changes(a, b) -> list[dict]:
    fa, fb = _flat(_dump(a)), _flat(_dump(b))
    return [{"field": k, "a": fa.get(k), "b": fb.get(k)} for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


# --- the units of the main line -------------------------------------------------------------


def _units(e: ir.Engine, lay) -> list[tuple[tuple, object]]:
    """The main line as (key, StageLayout | Part); a stage's key is its name and its
    occurrence among stages of that name, an engine-level op's its path."""
    out, seen = [], {}
    for item in lay.main:
        if isinstance(item, Part):
            out.append((("op", item.path), item))
        else:
            n = seen.get(item.stage.name, 0)
            seen[item.stage.name] = n + 1
            out.append((("stage", item.stage.name, n), item))
    return out


def _stage_parts(lay, sl) -> list[Part]:
    """A stage's parts; a group's: every part of the stages nested in it."""
    return [p for p in lay.parts() if p.stage_index == sl.index and (p.spath == sl.path or p.spath.startswith(sl.path + "."))]


def _numbers(parts: list[Part], e: ir.Engine) -> dict:
    n = e.feed.context
    kv = sum(p.kind.state(p.node, 1) * p.repeat for p in parts if p.kind.state_kind == "kv") * DTYPE_BYTES if e.throat == "causal" else 0
    return {"params": sum(p.params * p.repeat for p in parts), "flops": sum(sum(p.flops(n)) * p.repeat for p in parts), "kv_bytes": kv}


def _delta(a: dict, b: dict) -> dict:
    return {k: {"a": a[k], "b": b[k], "delta": b[k] - a[k]} for k in a}


# --- the diff ---------------------------------------------------------------------------------


def diff(a: ir.Spec, b: ir.Spec) -> dict:
    """Everything that differs between two resolved specs, as plain data."""
    if a.engine is None or b.engine is None:
        raise ValueError("cyclec diff compares two engines; a file of templates only has none")
    ea, eb = a.engine, b.engine
    with ir.layout.held(ea), ir.layout.held(eb):
        la, lb = ir.layout.layout(ea), ir.layout.layout(eb)
        settings = _settings(ea, eb)
        ua, ub = _units(ea, la), _units(eb, lb)
        sm = difflib.SequenceMatcher(a=[k for k, _ in ua], b=[k for k, _ in ub], autojunk=False)
        stages, parts = [], {"added": [], "removed": [], "changed": [], "moved": []}
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                for (_, x), (_, y) in zip(ua[i1:i2], ub[j1:j2]):
                    _unit_pair(la, lb, ea, eb, x, y, stages, parts)
                continue
            for _, x in ua[i1:i2]:
                _unit_alone(la, ea, x, "removed", stages, parts)
            for _, y in ub[j1:j2]:
                _unit_alone(lb, eb, y, "added", stages, parts)
        for end_a, end_b in ((la.feed, lb.feed), (la.nozzle, lb.nozzle)):
            ch = _field_changes(end_a.node, end_b.node)
            if ch:
                parts["changed"].append(_changed(end_a, end_b, ch))
        ra, rb = analyze(a), analyze(b)
        total = _delta({"params": ra["params"]["total"], "flops": ra["flops_per_token"]["forward"], "kv_bytes": kv_bytes_per_token(ea)},
                       {"params": rb["params"]["total"], "flops": rb["flops_per_token"]["forward"], "kv_bytes": kv_bytes_per_token(eb)})
    same_ir = ir_dump(a) == ir_dump(b)
    found = bool(settings or any(parts.values()) or any(s["changes"] for s in stages))
    out = {"equal": same_ir, "a": ea.name, "b": eb.name, "settings": settings, "stages": stages, "parts": parts, "total": total}
    if not same_ir and not found:  # a difference none of the above names: say so rather than call them equal
        out["other"] = [c["field"] for c in _field_changes(ea, eb)]
    return out


def ir_dump(spec: ir.Spec) -> dict:
    return spec.model_dump(mode="json")


_SETTING_WORDS = {
    "name": ("engine name", ""),
    "width": ("residual width d", "chamber"),
    "throat": ("mask", "throat"),
}


def _settings(ea: ir.Engine, eb: ir.Engine) -> list[dict]:
    out = []
    for key, (ml, rocket) in _SETTING_WORDS.items():
        va, vb = getattr(ea, key), getattr(eb, key)
        if va != vb:
            out.append({"setting": key, "ml": ml, "rocket": rocket, "a": va, "b": vb})
    for c in _field_changes(ea.startup, eb.startup):
        out.append({"setting": f"startup.{c['field']}", "ml": f"startup {c['field']}", "rocket": "start sequence", "a": c["a"], "b": c["b"]})
    return out


def _changed(pa: Part, pb: Part, fields: list[dict]) -> dict:
    out = {"a": pa.path, "b": pb.path, "kind": _part_words(pb), "fields": fields}
    if isinstance(pa.node, ir.Attention) and isinstance(pb.node, ir.Attention) and _kv_words(pa.node) != _kv_words(pb.node):
        out["words"] = f"{_kv_words(pa.node)} → {_kv_words(pb.node)} (injector baffles: {pa.node.kv_heads} → {pb.node.kv_heads} KV heads)"
    return out


def _entry(p: Part) -> dict:
    ml, rocket = where(p)
    return {"path": p.path, "kind": _part_words(p), "where": ml, "where_rocket": rocket}


def _unit_alone(lay, e, u, status: str, stages: list, parts: dict) -> None:
    if isinstance(u, Part):
        parts[status].append(_entry(u))
        return
    ps = _stage_parts(lay, u)
    nums = _numbers(ps, e)
    zero = {k: 0 for k in nums}
    stages.append({"name": u.stage.name, "a": u.path if status == "removed" else None, "b": u.path if status == "added" else None,
                   "status": status, "changes": [f"stage {status}"],
                   "numbers": _delta(nums, zero) if status == "removed" else _delta(zero, nums)})
    parts[status] += [_entry(p) for p in ps]


def _key(p: Part, lay) -> str:
    """How a part is matched inside a stage: its path in one instance; a merge by its branch
    (a merge with parameters is named `mix.scale`, one without takes the branch's `mix`). In a
    group, the names of the stages it is nested in come first (`ssm_layer/mix.ssm`), so a
    change of an inner repeat does not rename every part."""
    local = f"{p.local.split('.')[0]} merge" if p.kind.role == "merge" and p.branch is not None else p.local
    sl = next((sl for sl in lay.stages if sl.path == p.spath), None)
    inner = "/".join(c.stage.name for c in sl.chain()[1:]) if sl is not None else ""
    return f"{inner}/{local}" if inner else local


def _same_kind(p: Part, q: Part) -> bool:
    return type(p.node) is type(q.node) or (p.kind.role == "merge" and q.kind.role == "merge")


def _unit_pair(la, lb, ea, eb, x, y, stages: list, parts: dict) -> None:
    if isinstance(x, Part):
        ch = _field_changes(x.node, y.node)
        if type(x.node) is not type(y.node) or ch:
            parts["changed"].append(_changed(x, y, ch))
        return
    pa, pb = _stage_parts(la, x), _stage_parts(lb, y)
    changes: list[str] = []
    if x.stage.repeat != y.stage.repeat:
        changes.append(f"repeated x{x.stage.repeat} → x{y.stage.repeat}")

    def nested(lay, top) -> dict[str, int]:  # the stages nested in a group, by their names below it: their repeats
        return {"/".join(c.stage.name for c in sl.chain()[1:]): sl.stage.repeat for sl in lay.all_stages() if sl.parent is not None and sl.chain()[0] is top}

    ra, rb = nested(la, x), nested(lb, y)
    for name in [n for n in ra if n in rb and ra[n] != rb[n]]:
        changes.append(f"stage {name} repeated x{ra[name]} → x{rb[name]}")
    ka, kb = {id(p): _key(p, la) for p in pa}, {id(p): _key(p, lb) for p in pb}
    by_a = {ka[id(p)]: p for p in pa}
    by_b = {kb[id(p)]: p for p in pb}
    gone = [p for p in pa if ka[id(p)] not in by_b or not _same_kind(p, by_b[ka[id(p)]])]
    new = [p for p in pb if kb[id(p)] not in by_a or not _same_kind(by_a[kb[id(p)]], p)]
    for p in pa:
        q = by_b.get(ka[id(p)])
        if q is None:
            continue
        if type(q.node) is type(p.node):
            ch = _field_changes(p.node, q.node)
            if ch:
                parts["changed"].append(_changed(p, q, ch))
        elif p.kind.role == "merge" and q.kind.role == "merge":  # a branch returns another way
            parts["changed"].append(_changed(p, q, [{"field": "merge", "a": p.kind.keyword, "b": q.kind.keyword}]))
            parts["changed"][-1]["words"] = f"{p.kind.ml} → {q.kind.ml} ({p.kind.rocket} → {q.kind.rocket}): {p.kind.formula} → {q.kind.formula}"
    # a part of one kind leaving one place and arriving at another is a move
    moved = []
    for p in list(gone):
        q = next((q for q in new if type(q.node) is type(p.node) and where(q) != where(p)), None)
        if q is not None:
            gone.remove(p)
            new.remove(q)
            moved.append((p, q))
    place_a, place_b = norm_placement(pa), norm_placement(pb)
    for p, q in moved:
        (wa, ra), (wb, rb) = where(p), where(q)
        word = p.kind.keyword if not isinstance(p.node, ir.Norm) else "norm"
        rocket = KINDS[type(p.node)].rocket
        entry = {"a": p.path, "b": q.path, "kind": _part_words(q), "from": wa, "to": wb, "from_rocket": ra, "to_rocket": rb}
        line = f"{word} moved from {wa} to {wb}"
        if isinstance(p.node, ir.Norm) and place_a != place_b:
            line += f": {place_a} → {place_b}"
            entry["placement"] = {"a": place_a, "b": place_b}
        entry["words"] = f"{line} ({rocket}: {ra} → {rb})"
        parts["moved"].append(entry)
    parts["removed"] += [_entry(p) for p in gone]
    parts["added"] += [_entry(p) for p in new]
    if place_a != place_b and not any("placement" in m for m in parts["moved"] if m["a"].startswith(x.path)):
        changes.append(f"norm placement {place_a} → {place_b}")
    nums = _delta(_numbers(pa, ea), _numbers(pb, eb))
    stages.append({"name": x.stage.name, "a": x.path, "b": y.path, "status": "matched", "changes": changes, "numbers": nums})


# --- text -------------------------------------------------------------------------------------


def _si(x: float) -> str:
    s = "-" if x < 0 else ""
    x = abs(x)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{s}{x / scale:.2f}{unit}"
    return f"{s}{x:g}"


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + _si(x) if x else "0"


def _field_text(c: dict) -> str:
    return f"{c['field']} {_show(c['a'])} → {_show(c['b'])}"


def render_text(d: dict, file_a: str = "A", file_b: str = "B") -> str:
    lines = [f"--- {file_a} (engine {d['a']})", f"+++ {file_b} (engine {d['b']})"]
    if d["equal"]:
        return "\n".join(lines + ["no differences: the two specs resolve to the same IR"]) + "\n"
    if d["settings"]:
        lines += ["", "settings"]
        for s in d["settings"]:
            what = s["ml"] + (f" ({s['rocket']})" if s["rocket"] else "")
            lines.append(f"  ~ {what}: {_show(s['a'])} → {_show(s['b'])}")
    p = d["parts"]
    if any(p.values()):
        lines += ["", "parts"]
        for m in p["moved"]:
            lines.append(f"  > {m['words']}")
            lines.append(f"      {m['a']} → {m['b']}")
        for c in p["changed"]:
            lines.append(f"  ~ {c['b']}: {c['kind']}: " + ", ".join(_field_text(f) for f in c["fields"]))
            if c.get("words"):
                lines.append(f"      {c['words']}")
        for e in p["removed"]:
            lines.append(f"  - {e['path']}: {e['kind']}, on {e['where']}")
        for e in p["added"]:
            lines.append(f"  + {e['path']}: {e['kind']}, on {e['where']}")
    for k in d.get("other", []):
        lines.append(f"  ~ {k}")
    lines += ["", "numbers (forward FLOPs per token at each design's context; KV cache in bf16)"]

    def block(head: str, nums: dict) -> None:
        lines.append(head)
        for key, label in (("params", "params"), ("flops", "FLOPs/token"), ("kv_bytes", "KV bytes/token")):
            v = nums[key]
            shown = f"{_si(v['a'])} → {_si(v['b'])}  ({_signed(v['delta'])})" if v["delta"] else f"{_si(v['b'])}  (same)"
            lines.append(f"    {label:<15} {shown}")

    for s in d["stages"]:
        moved = s["status"] == "matched" and (s["changes"] or any(v["delta"] for v in s["numbers"].values()))
        mark = {"added": "+", "removed": "-"}.get(s["status"], "~" if moved else " ")
        where = s["a"] if s["a"] == s["b"] or not s["b"] else s["b"] if not s["a"] else f"{s['a']} → {s['b']}"
        block(f"  {mark} stage {s['name']} ({where})" + "".join(f"; {c}" for c in s["changes"]), s["numbers"])
    block("    total", d["total"])
    return "\n".join(lines) + "\n"


def marks(d: dict, b: ir.Spec) -> dict[int, str]:
    """Source lines of B's parts that the diff names, for drawing B with them highlighted:
    {line: "added" | "changed" | "moved"}."""
    paths: dict[str, str] = {}
    for status in ("added", "changed", "moved"):
        for e in d["parts"][status]:
            paths[e.get("path") or e["b"]] = status
    out: dict[int, str] = {}
    main = b.engine.span.file if b.engine.span is not None else None
    with ir.layout.held(b.engine):
        for p in ir.layout.layout(b.engine).parts():
            span = getattr(p.node, "span", None)
            if p.path in paths and span is not None and span.file == main:  # a line of an included file is another file's
                out[span.line] = paths[p.path]
    return out
