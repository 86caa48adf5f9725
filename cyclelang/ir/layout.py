"""The one walk of an engine: every part, with its canonical path.

A part's path is its name everywhere: in the built model (the module path, so
`dict(model.named_modules())[path]` is that part), in `cyclec check --report` and
its JSON, on the diagram's edges, in the test stand's readings and in interop.

Paths
-----
    feed                              token (and position) embedding
    stages.{i}                        stage instance i, in source order over all stages
                                      (`stage block x 12` then `stage tap`: 0..11, 12)
    stages.{i}.{branch}               a prechamber, named as in the spec (fullflow
                                      branches sit directly on the stage too)
    stages.{i}.{branch}.{op}          an op of a branch, named by its kind's attr: norm,
                                      attn, mlp, moe, pool, conv, linear; a kind that occurs more
                                      than once in one place is numbered from 1 (norm1,
                                      norm2), as in nn.TransformerEncoderLayer
    stages.{i}.{op}                   stage-level ops (Post-LN valves, pressure-fed
                                      turbines, a fullflow's shared norm), same scheme
    {op}                              engine-level ops (the final valve: `norm`)
    stages.{i}.{branch}.scale|gate    a merge's own parameters (rezero, layerscale, gate);
                                      a merge without parameters takes its branch's path
    head                              the nozzle (a tied one owns only `head_bias`)

A repeated stage stays folded: its parts are listed once, with the range of its
instances in the path, `stages.{first}-{last}` (inclusive; `stages.0-11.mix.attn`
stands for stages.0.mix.attn ... stages.11.mix.attn). `instances(path)` unfolds.

Names from the spec are Python identifiers but may be keywords or clash with
nn.Module attributes (`forward`, `train`, `_modules`): they are mangled by
appending `_` (a leading `_` gets an `x` in front), and made unique in their scope
the same way, so no spec name can change what the built code does.
"""

from __future__ import annotations

import keyword
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from . import nodes as ir
from .kinds import KINDS, Kind, kind_of

# Everything an nn.Module instance has (torch 2.x), plus names the generated classes
# use themselves. A test keeps this list a superset of dir(nn.Module()).
NN_MODULE_ATTRS = frozenset("""
T_destination __annotations__ __call__ __class__ __delattr__ __dict__ __dir__ __doc__ __eq__
__format__ __ge__ __getattr__ __getattribute__ __getstate__ __gt__ __hash__ __init__
__init_subclass__ __le__ __lt__ __module__ __ne__ __new__ __reduce__ __reduce_ex__ __repr__
__setattr__ __setstate__ __sizeof__ __str__ __subclasshook__ __weakref__ _apply
_backward_hooks _backward_pre_hooks _buffers _call_impl _compiled_call_impl _forward_hooks
_forward_hooks_always_called _forward_hooks_with_kwargs _forward_pre_hooks
_forward_pre_hooks_with_kwargs _get_backward_hooks _get_backward_pre_hooks _get_name
_is_full_backward_hook _load_from_state_dict _load_state_dict_post_hooks
_load_state_dict_pre_hooks _maybe_warn_non_full_backward_hook _modules _named_members
_non_persistent_buffers_set _parameters _register_load_state_dict_pre_hook
_register_state_dict_hook _replicate_for_data_parallel _save_to_state_dict _slow_forward
_state_dict_hooks _state_dict_pre_hooks _version _wrapped_call_impl add_module apply bfloat16
buffers call_super_init children compile cpu cuda double dump_patches eval extra_repr float
forward get_buffer get_extra_state get_parameter get_submodule half ipu load_state_dict
modules mtia named_buffers named_children named_modules named_parameters parameters
register_backward_hook register_buffer register_forward_hook register_forward_pre_hook
register_full_backward_hook register_full_backward_pre_hook register_load_state_dict_post_hook
register_load_state_dict_pre_hook register_module register_parameter
register_state_dict_post_hook register_state_dict_pre_hook requires_grad_ set_extra_state
set_submodule share_memory state_dict to to_empty train training type xpu zero_grad
key scale gate
""".split())

# Attributes of the model itself; rotary tables are rope_{cos,sin} or rope{k}_{cos,sin}.
MODEL_ATTRS = NN_MODULE_ATTRS | {"feed", "stages", "head", "head_bias", "config", "aux_losses", "exhaust", "rope_cos", "rope_sin", "spec"} | {
    f"rope{i}_{t}" for i in range(64) for t in ("cos", "sin")}

TIED_BIAS = "head_bias"  # a tied nozzle's bias sits on the model, beside the feed it shares


class Names:
    """One attribute namespace: hands out safe, unique names in allocation order."""

    def __init__(self, reserved: frozenset[str] = NN_MODULE_ATTRS):
        self.reserved = reserved
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        name = base
        if not name.isidentifier() or not name.isascii():  # the IR guarantees this; be safe anyway
            name = "x_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
        if name.startswith("_"):
            name = "x" + name
        while keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in self.reserved or name in self.used:
            name += "_"
        self.used.add(name)
        return name


def numbered(kinds: list[str]) -> list[str]:
    """norm, attn, ... ; a kind that occurs more than once is numbered from 1."""
    counts = {k: kinds.count(k) for k in kinds}
    seen: dict[str, int] = {}
    out = []
    for k in kinds:
        if counts[k] == 1:
            out.append(k)
        else:
            seen[k] = seen.get(k, 0) + 1
            out.append(f"{k}{seen[k]}")
    return out


def stage_path(first: int, repeat: int) -> str:
    """`stages.3`, or the folded range `stages.0-11` of a repeated stage."""
    return f"stages.{first}" if repeat == 1 else f"stages.{first}-{first + repeat - 1}"


_RANGE = re.compile(r"^stages\.(\d+)-(\d+)(?=\.|$)")


def instances(path: str) -> list[str]:
    """The instance paths a (possibly folded) path stands for."""
    m = _RANGE.match(path)
    if not m:
        return [path]
    rest = path[m.end():]
    return [f"stages.{i}{rest}" for i in range(int(m.group(1)), int(m.group(2)) + 1)]


def fold(name: str, layout: "Layout") -> str:
    """The folded path of an instance name: `stages.3.mix.attn.qkv.weight` ->
    `stages.0-11.mix.attn.qkv.weight` in a 12-instance stage."""
    m = re.match(r"^stages\.(\d+)(?=\.|$)", name)
    if not m:
        return name
    sl = layout.stage_of_instance(int(m.group(1)))
    return sl.path + name[m.end():] if sl is not None else name


@dataclass(frozen=True)
class Part:
    """One operator (or merge, the feed, the nozzle) at one place in the engine."""

    path: str  # canonical and folded: "stages.0-11.mix.attn"
    local: str  # the path inside one stage instance ("mix.attn"); the path itself outside stages
    kind: Kind
    node: object  # the IR node
    group: str  # the parameter group: a branch's path for its ops and merge, else the part's own path
    stage: ir.Stage | None  # None for the feed, the nozzle and engine-level ops
    stage_index: int  # position on the main line (feed -1, nozzle len(body))
    first: int  # the stage's first instance in model.stages (-1 outside stages)
    repeat: int
    width: int  # the width where the part sits (a merge: its branch's)
    branch: ir.Prechamber | None = None
    fullflow: ir.Fullflow | None = None

    @property
    def role(self) -> str:
        return self.kind.role

    @property
    def params(self) -> int:
        """Trainable numbers of one instance."""
        return self.kind.params(self.node, self.width)

    def flops(self, n: int) -> tuple[int, int]:
        """Forward FLOPs per token of one instance at context length n: (projections, mixing)."""
        return self.kind.flops(self.node, n, self.width)

    def instances(self) -> list[str]:
        return instances(self.path)

    def owns(self) -> tuple[str, ...]:
        """Folded name prefixes of the model's parameters this part owns."""
        if isinstance(self.node, ir.Nozzle):
            if self.node.tied:
                return (TIED_BIAS,) if self.node.bias else ()
            return ("head",)
        if self.kind.role == "merge" and not self.kind.fields:
            return ()
        return (self.path,)


@dataclass(frozen=True)
class BranchLayout:
    branch: ir.Prechamber
    attr: str  # its attribute on the stage module
    ops: list[Part]
    merge: Part | None
    fullflow: ir.Fullflow | None


@dataclass(frozen=True)
class StageLayout:
    stage: ir.Stage
    index: int  # body index
    first: int  # first instance in model.stages
    path: str  # "stages.0-11"
    items: list  # Part | BranchLayout | FullflowLayout, in source order

    def branches(self) -> list[BranchLayout]:
        out = []
        for it in self.items:
            if isinstance(it, BranchLayout):
                out.append(it)
            elif isinstance(it, FullflowLayout):
                out.extend(it.branches)
        return out

    def instance(self, r: int) -> str:
        return f"stages.{self.first + r}"


@dataclass(frozen=True)
class FullflowLayout:
    fullflow: ir.Fullflow
    norm: Part | None
    branches: list[BranchLayout]


class Layout:
    """The engine's parts in source order, and its stages with the names of their pieces."""

    def __init__(self, engine: ir.Engine):
        self.engine = engine
        self.stages: list[StageLayout] = []
        self.main: list = []  # StageLayout | Part, in body order
        self.feed = Part("feed", "feed", KINDS[ir.Feed], engine.feed, "feed", None, -1, -1, 1, engine.width)
        self._build()
        self.nozzle = Part("head", "head", KINDS[ir.Nozzle], engine.nozzle, "head", None, len(engine.body), -1, 1, engine.nozzle.width)

    def _build(self) -> None:
        e = self.engine
        model_names = Names(MODEL_ATTRS)
        main_ops = [op for op in e.body if not isinstance(op, ir.Stage)]
        main_attrs = iter(numbered([kind_of(o).attr for o in main_ops]))
        first, w = 0, e.width
        for i, op in enumerate(e.body):
            if isinstance(op, ir.Stage):
                sl = self._stage(op, i, first)
                self.stages.append(sl)
                self.main.append(sl)
                first += op.repeat
            else:
                path = model_names.fresh(next(main_attrs))
                self.main.append(Part(path, path, kind_of(op), op, path, None, i, -1, 1, w))
            w = ir.out_width(op, w)

    def _stage(self, st: ir.Stage, index: int, first: int) -> StageLayout:
        spath = stage_path(first, st.repeat)
        attrs = Names()
        branch_attr = {id(b): attrs.fresh(b.name) for b in st.branch_list()}  # the spec's names first, as spelled
        kinds = []
        for s in st.ops:
            if isinstance(s, ir.Fullflow):
                kinds += ["norm"] if s.norm is not None else []
            elif not isinstance(s, ir.Prechamber):
                kinds.append(kind_of(s).attr)
        op_attrs = iter(numbered(kinds))

        def part(node, local: str, group: str, width: int, branch=None, ff=None) -> Part:
            path = f"{spath}.{local}"
            return Part(path, local, kind_of(node), node, group, st, index, first, st.repeat, width, branch, ff)

        def branch(b: ir.Prechamber, ff) -> BranchLayout:
            battr = branch_attr[id(b)]
            names = Names()
            ops, bw = [], b.width
            for o, a in zip(b.ops, numbered([kind_of(o).attr for o in b.ops])):
                ops.append(part(o, f"{battr}.{names.fresh(a)}", f"{spath}.{battr}", bw, b, ff))
                bw = ir.out_width(o, bw)
            merge = None
            if b.merge is not None:
                k = kind_of(b.merge)
                local = f"{battr}.{k.fields[0]}" if k.fields else battr
                merge = part(b.merge, local, f"{spath}.{battr}", b.out_width, b, ff)
            return BranchLayout(b, battr, ops, merge, ff)

        items: list = []
        w = st.width_in
        for s in st.ops:
            if isinstance(s, ir.Prechamber):
                items.append(branch(s, None))
            elif isinstance(s, ir.Fullflow):
                norm = None
                if s.norm is not None:
                    a = attrs.fresh(next(op_attrs))
                    norm = part(s.norm, a, f"{spath}.{a}", w, None, s)
                items.append(FullflowLayout(s, norm, [branch(b, s) for b in s.branches]))
            else:
                a = attrs.fresh(next(op_attrs))
                items.append(part(s, a, f"{spath}.{a}", w))
                w = ir.out_width(s, w)
        return StageLayout(st, index, first, spath, items)

    # --- queries -------------------------------------------------------------------------

    def parts(self) -> Iterator[Part]:
        """Every part in source order: the feed, the main line (stages item by item, a
        branch's ops then its merge), the nozzle."""
        yield self.feed
        for it in self.main:
            if isinstance(it, Part):
                yield it
                continue
            for x in it.items:
                if isinstance(x, Part):
                    yield x
                    continue
                if isinstance(x, FullflowLayout):
                    if x.norm is not None:
                        yield x.norm
                    brs = x.branches
                else:
                    brs = [x]
                for b in brs:
                    yield from b.ops
                    if b.merge is not None:
                        yield b.merge
        yield self.nozzle

    def stage_of_instance(self, i: int) -> StageLayout | None:
        import bisect

        if "_firsts" not in self.__dict__:
            self._firsts = [sl.first for sl in self.stages]
        k = bisect.bisect_right(self._firsts, i) - 1  # a lookup per name: linear in the folded IR, not in instances
        if k >= 0 and i < self.stages[k].first + self.stages[k].stage.repeat:
            return self.stages[k]
        return None

    def part_of(self, name: str) -> Part | None:
        """The part that owns a parameter of the built model (`stages.3.mix.attn.qkv.weight`):
        the one owning the longest prefix of its folded name (a dict lookup per prefix)."""
        if "_owners" not in self.__dict__:
            owners: dict[str, Part] = {}
            for p in self.parts():
                for prefix in p.owns():
                    owners.setdefault(prefix, p)  # the first in source order, as the scan did
            self._owners = owners
        folded = fold(name, self)
        while True:
            if folded in self._owners:
                return self._owners[folded]
            cut = folded.rfind(".")
            if cut < 0:
                return None
            folded = folded[:cut]

    def group_of(self, name: str) -> str | None:
        """The report's parameter group for any name in the built model: a branch's path for
        everything under it (its ops, its merge's parameters, the aux loss filed under it),
        else the owning part's path."""
        folded = fold(name, self)
        for sl in self.stages:
            for b in sl.branches():
                path = f"{sl.path}.{b.attr}"
                if folded == path or folded.startswith(path + "."):
                    return path
        part = self.part_of(name)
        return part.group if part is not None else None

    def instance_count(self) -> int:
        return sum(sl.stage.repeat for sl in self.stages)


_held: list[tuple[ir.Engine, Layout]] = []  # the layouts of `held` scopes, innermost last


@contextmanager
def held(engine: ir.Engine):
    """Within this block, `layout(engine)` hands out one Layout instead of building one per call
    (the reviewer's rules ask for it many times). Nothing outlives the block, so a finished
    review keeps no engine alive."""
    _held.append((engine, Layout(engine)))
    try:
        yield _held[-1][1]
    finally:
        _held.pop()


def layout(spec_or_engine) -> Layout:
    """The layout of an engine (or of a spec's engine)."""
    e = spec_or_engine.engine if isinstance(spec_or_engine, ir.Spec) else spec_or_engine
    if e is None:
        raise ValueError("a spec without an engine has no layout")
    for engine, lay in reversed(_held):
        if engine is e:
            return lay
    return Layout(e)
