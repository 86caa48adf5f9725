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

A nested stage (a stage of stages, a group) numbers its stages' instances the same
way inside each of its own instances: in `stage group x 4 { stage ssm x 3 {...}
stage attn {...} }`, `stages.0-3` is the group, `stages.0-3.stages.0-2.mix.ssm` the
ssm layers' mixers and `stages.0-3.stages.3.mix.attn` the attention layers';
`stages.2.stages.1.mix.ssm` is the second ssm layer of the third group. `Layout.layers()`
lists every stage instance that holds ops in the order they run (the flattened layer
index of a nested engine is its position there).

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


_RANGE = re.compile(r"(?:^|(?<=\.))stages\.(\d+)-(\d+)(?=\.|$)")
_INDEX = re.compile(r"stages\.(\d+)(?=\.|$)")


def instances(path: str) -> list[str]:
    """The instance paths a (possibly folded) path stands for; a nested path unfolds every
    range in turn (`stages.0-1.stages.0-2` is six paths, the outer index slowest)."""
    m = _RANGE.search(path)
    if not m:
        return [path]
    head, rest = path[: m.start()], path[m.end():]
    return [f"{head}stages.{i}{r}" for i in range(int(m.group(1)), int(m.group(2)) + 1) for r in instances(rest)]


def fold(name: str, layout: "Layout") -> str:
    """The folded path of an instance name: `stages.3.mix.attn.qkv.weight` ->
    `stages.0-11.mix.attn.qkv.weight` in a 12-instance stage; in a nested stage every
    level folds (`stages.2.stages.1.mix` -> `stages.0-3.stages.0-2.mix`)."""
    m = _INDEX.match(name)
    if not m:
        return name
    sl = layout.stage_of_instance(int(m.group(1)))
    if sl is None:
        return name
    out, pos = sl.path, m.end()
    while sl.children:
        m = _INDEX.match(name, pos + 1) if name.startswith(".stages.", pos) else None
        if m is None:
            break
        sl = sl.child_of_instance(int(m.group(1)))
        if sl is None:
            return name
        out, pos = sl.path, m.end()
    return out + name[pos:]


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
    first: int  # the stage's first instance in model.stages, nested: in its group's `stages` (-1 outside stages)
    repeat: int  # how many times it runs in all: its stage's repeat times the repeats of the groups around it
    width: int  # the width where the part sits (a merge: its branch's)
    branch: ir.Prechamber | None = None
    fullflow: ir.Fullflow | None = None
    spath: str = ""  # the folded path of its stage ("stages.0-3.stages.0-2"); "" outside stages

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
    first: int  # first instance in model.stages (nested: in its group's `stages`)
    path: str  # "stages.0-11"; nested: "stages.0-3.stages.0-2"
    items: list  # Part | BranchLayout | FullflowLayout, in source order; a group's: its stages' StageLayouts
    parent: "StageLayout | None" = None  # the group it is nested in
    count: int = 0  # instances that run in all: its repeat times its groups' repeats

    @property
    def children(self) -> list["StageLayout"]:
        """A group's stages (nested stages), in source order; [] for a stage of ops."""
        return [it for it in self.items if isinstance(it, StageLayout)]

    @property
    def depth(self) -> int:
        """1 on the main line, 2 nested in a stage, ..."""
        return 1 if self.parent is None else self.parent.depth + 1

    def chain(self) -> list["StageLayout"]:
        """Its groups from the outermost, then itself."""
        return ([] if self.parent is None else self.parent.chain()) + [self]

    def child_of_instance(self, i: int) -> "StageLayout | None":
        """The child stage whose instances hold index i of this group's `stages`."""
        for c in self.children:
            if c.first <= i < c.first + c.stage.repeat:
                return c
        return None

    def branches(self) -> list[BranchLayout]:
        out = []
        for it in self.items:
            if isinstance(it, BranchLayout):
                out.append(it)
            elif isinstance(it, FullflowLayout):
                out.extend(it.branches)
        return out

    def instance(self, r: int) -> str:
        """The path of its r-th instance in the order they run (0 <= r < count)."""
        if self.parent is None:
            return f"stages.{self.first + r}"
        rep = self.stage.repeat
        return f"{self.parent.instance(r // rep)}.stages.{self.first + r % rep}"

    def instances(self) -> list[str]:
        return [self.instance(r) for r in range(self.count)]


@dataclass(frozen=True)
class FullflowLayout:
    fullflow: ir.Fullflow
    norm: Part | None
    branches: list[BranchLayout]


class Layout:
    """The engine's parts in source order, and its stages with the names of their pieces."""

    def __init__(self, engine: ir.Engine):
        self.engine = engine
        self.stages: list[StageLayout] = []  # every stage that holds ops, nested ones included, in source order
        self.top: list[StageLayout] = []  # the stages on the main line (groups or not), in body order
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
                self.top.append(sl)
                self.main.append(sl)
                first += op.repeat
            else:
                path = model_names.fresh(next(main_attrs))
                self.main.append(Part(path, path, kind_of(op), op, path, None, i, -1, 1, w))
            w = ir.out_width(op, w)

    def _stage(self, st: ir.Stage, index: int, first: int, parent: StageLayout | None = None) -> StageLayout:
        spath = stage_path(first, st.repeat) if parent is None else f"{parent.path}.{stage_path(first, st.repeat)}"
        count = st.repeat * (parent.count if parent is not None else 1)
        if st.is_group:  # a group: its stages, numbered from 0 in each of its instances
            sl = StageLayout(st, index, first, spath, [], parent, count)
            k = 0
            for sub in st.ops:
                sl.items.append(self._stage(sub, index, k, sl))
                k += sub.repeat
            return sl
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
            return Part(path, local, kind_of(node), node, group, st, index, first, count, width, branch, ff, spath)

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
        sl = StageLayout(st, index, first, spath, items, parent, count)
        self.stages.append(sl)  # a stage of ops holds no stages: appended when made, it is in source order
        return sl

    # --- queries -------------------------------------------------------------------------

    def parts(self) -> Iterator[Part]:
        """Every part in source order: the feed, the main line (stages item by item, a
        branch's ops then its merge), the nozzle."""
        yield self.feed
        for it in self.main:
            if isinstance(it, Part):
                yield it
                continue
            yield from self._stage_parts(it)
        yield self.nozzle

    def _stage_parts(self, it: StageLayout) -> Iterator[Part]:
        for x in it.items:
            if isinstance(x, StageLayout):
                yield from self._stage_parts(x)
                continue
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

    def stage_of_instance(self, i: int) -> StageLayout | None:
        """The main-line stage (a group, or a stage of ops) whose instances hold model.stages[i]."""
        import bisect

        if "_firsts" not in self.__dict__:
            self._firsts = [sl.first for sl in self.top]
        k = bisect.bisect_right(self._firsts, i) - 1  # a lookup per name: linear in the folded IR, not in instances
        if k >= 0 and i < self.top[k].first + self.top[k].stage.repeat:
            return self.top[k]
        return None

    def all_stages(self) -> list[StageLayout]:
        """Every stage, groups included, each group before the stages nested in it."""
        out: list[StageLayout] = []

        def walk(sl: StageLayout) -> None:
            out.append(sl)
            for c in sl.children:
                walk(c)

        for sl in self.top:
            walk(sl)
        return out

    def layers(self) -> list[tuple[str, StageLayout]]:
        """(instance path, its stage) of every instance of a stage of ops, in the order they run:
        a flat engine's stages.0, stages.1, ...; a nested one's stages.0.stages.0, ... The
        flattened layer index of an instance is its position in this list."""
        out: list[tuple[str, StageLayout]] = []

        def walk(sl: StageLayout, prefix: str) -> None:
            for r in range(sl.stage.repeat):
                here = f"{prefix}stages.{sl.first + r}"
                if sl.children:
                    for c in sl.children:
                        walk(c, here + ".")
                else:
                    out.append((here, sl))

        for sl in self.top:
            walk(sl, "")
        return out

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
        """Instances of stages of ops that run, nested repeats multiplied out (the layer count)."""
        return sum(sl.count for sl in self.stages)


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
