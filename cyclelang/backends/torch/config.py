"""The generated file's `Config`: every size, count and ratio of the spec as a field.

Each op's emitter asks for the config fields its constructor reads (`OpEmitter.sizes`),
by a base name (`n_head`, `mlp_ratio`, `window`) and the IR's value, inside the scope
of its stage and branch. Requests for one base name that all carry the same value
share one field (every block's `n_head`); where they differ, the field takes the
stage's name in front (`lower_n_head`), then the branch's too. What the IR derived
from other sizes (head_dim = width // heads, cooling's std from the number of merges,
DeepNet's alpha and beta from the depth) becomes a `Config` property whose formula is
the IR's own (`ir.passes`), so `Model(Config(width=256, n_layer=2))` is a consistent
model; `Config.__post_init__` refuses, naming the constraint, where the spec's own
constraints (heads divide the width, kv heads divide heads, ...) no longer hold.

Where the spec wrote a size as a `let`'s name (`let depth = 12` ... `stage block x depth`;
the IR keeps it, `ir.Node.let_names`), the field takes the let's name (`Config.depth`);
a let computed from others (`let hidden = 4 * d`) is a property with the spec's own
formula (`4 * self.width` where `chamber width=d`), so changing `width` changes `hidden`.

A request's value is exactly the IR's, so `Config()` rebuilds the spec bit for bit.
"""

from __future__ import annotations

import ast as pyast
import keyword
from collections import defaultdict
from typing import Callable

from ... import ir
from .writer import num


class Ref:
    """A config value a part reads: a field (or, for `Prop`, a property) of `Config`."""

    def __init__(self, base: str, value, scope: tuple[str, ...], doc: str, typ: str = "int"):
        self.base, self.value, self.scope, self.doc, self.typ = base, value, scope, doc, typ
        self.name = ""
        self.fixed = False  # named `base` whatever the value (a let's name, a stage's depth, the init std)

    def __str__(self) -> str:  # as the modules read it
        assert self.name, f"config value {self.base} asked for after the names were given"
        return f"config.{self.name}"

    @property
    def own(self) -> str:  # as Config itself reads it
        return f"self.{self.name}"

    def key(self):
        return self.value


class Fixed(Ref):
    """One of the outer fields every Config has (width, vocab_size, context)."""

    def __init__(self, name: str):
        super().__init__(name, None, (), "")
        self.name = name


class Prop(Ref):
    """A derived value: a Config property, `formula()` over Config's own fields."""

    def __init__(self, base: str, value, scope, doc: str, formula: Callable[[], str]):
        super().__init__(base, value, scope, doc, "prop")
        self.formula = formula

    def key(self):
        return (self.value, self.formula())


class Expr:
    """A constructor argument computed from config values, written when the text is."""

    def __init__(self, fn: Callable[[], str]):
        self.fn = fn

    def __str__(self) -> str:
        return self.fn()


WIDTH, VOCAB, CONTEXT = Fixed("width"), Fixed("vocab_size"), Fixed("context")


class Sizes:
    """What the emitters ask of the config while the plan is made; `resolve` names it all."""

    def __init__(self, e: ir.Engine):
        self.e = e
        self.refs: list[Ref] = []
        self.checks: list[tuple[Callable[[], str], Callable[[], str]]] = []
        self.lets = {let.name: let for let in e.lets}
        self.let_refs: dict[str, Ref] = {}
        self._init_std: Ref | None = None
        # a let the chamber's width, the vocabulary or the context was written with is that field
        for node, option, ref, value in ((e, "width", WIDTH, e.width), (e.feed, "vocab", VOCAB, e.feed.vocab),
                                         (e.feed, "context", CONTEXT, e.feed.context)):
            let = node.let_of(option)
            if let in self.lets and self.lets[let].value == value:
                self.let_refs[let] = ref

    # --- requests --------------------------------------------------------------------------
    def field(self, base: str, value, scope: tuple[str, ...], doc: str, typ: str = "int", let: str | None = None) -> Ref:
        """A field for `value`, named `base` (shared by value); the let's name where the spec wrote one."""
        got = self.let(let, value, doc, typ)
        if got is not None:
            return got
        r = Ref(base, value, scope, doc, typ)
        self.refs.append(r)
        return r

    def let(self, name: str | None, value, doc: str, typ: str) -> Ref | None:
        """The config value of the spec's `let name`, if it holds `value` (a pass may have changed
        the size since): a field named after it, or, for a let computed from others, a property
        with the spec's formula; the lets that formula reads become fields too."""
        let = self.lets.get(name) if name is not None else None
        if let is None or isinstance(let.value, bool) or let.value != value:
            return None
        if name in self.let_refs:
            return self.let_refs[name]
        if let.formula is not None:
            formula = let.formula
            try:
                reads = ir.formula_names(formula)
            except ValueError:
                return None  # an IR edited past its checks: no formula reaches the file
            inputs = {n: self.let(n, self.lets[n].value, f"the spec's let {n}", _typ(self.lets[n].value)) if n in self.lets else BUILTIN.get(n)
                      for n in reads}
            if any(v is None for v in inputs.values()):
                return None
            whole = typ == "int" and isinstance(let.value, float)  # `let hidden = 8 * d / 3` where a whole number is needed
            r = Prop(name, value, (), doc + f"; the spec's let {name} = {formula}", lambda: _over(formula, inputs, whole))
            if whole:
                self.check(lambda: f"({_over(formula, inputs)}) % 1 == 0",
                           lambda: f"{r.name} = {_over(formula, inputs).replace('self.', '')} ({{{_over(formula, inputs)}}}) must be a whole number")
        else:
            r = Ref(name, value, (), doc, typ)
        r.fixed = True
        self.refs.append(r)
        self.let_refs[name] = r
        return r

    def init_std(self) -> Ref:
        """The init std (normal init's, and cooling's base): one field, asked for where read."""
        if self._init_std is None:
            self._init_std = self.named("init_std", self.e.startup.init.std, "weights start normal(0, init_std)", "float",
                                        let=self.e.startup.init.let_of("std"))
        return self._init_std

    def named(self, name: str, value, doc: str, typ: str = "int", let: str | None = None) -> Ref:
        """A field whose name is fixed (a stage's depth, the init std), never shared by value;
        the let's name where the spec wrote one."""
        got = self.let(let, value, doc, typ)
        if got is not None:
            return got
        r = Ref(name, value, (), doc, typ)
        r.fixed = True
        self.refs.append(r)
        return r

    def prop(self, base: str, value, scope, doc: str, formula: Callable[[], str], let: str | None = None) -> Ref:
        """A derived value, `formula()` over Config's fields; the let's field where the spec wrote one."""
        got = self.let(let, value, doc, "int" if isinstance(value, int) else "float")
        if got is not None:
            return got
        r = Prop(base, value, scope, doc, formula)
        self.refs.append(r)
        return r

    def width(self, value: int, scope: tuple[str, ...], let: str | None = None) -> Ref:
        """A width: the chamber's, the vocabulary's (an output head), or an inner one."""
        if value == self.e.width:
            return WIDTH
        if value == self.e.feed.vocab:
            return VOCAB
        return self.field("inner_width", value, scope, "a width inside a stage (a bottleneck)", let=let)

    def check(self, cond: Callable[[], str], message: Callable[[], str]) -> None:
        """`cond()`: a condition over `self.` fields that the spec's constraints require."""
        self.checks.append((cond, message))

    def divides(self, a: Ref, b: Ref, why: str) -> None:
        """b is a whole multiple of a."""
        self.check(lambda: f"{b.own} % {a.own} == 0",
                   lambda: f"{b.name} ({{{b.own}}}) must be divisible by {a.name} ({{{a.own}}}): {why}")

    def positive(self, r: Ref) -> None:
        self.check(lambda: f"{r.own} >= 1", lambda: f"{r.name} ({{{r.own}}}) must be at least 1")

    # --- naming ----------------------------------------------------------------------------
    def resolve(self) -> None:
        """Name every request: the lets' and the fixed names first, then one field per base name
        and value, the scope in front where values differ."""
        taken = {"width", "vocab_size", "context"} | {r.name for r in self.refs if r.name}
        for r in self.refs:  # lets first: the spec's own names win
            if r.fixed and not r.name and r in self.let_refs.values():
                self._name([r], r.base, taken)
        for r in self.refs:
            if r.fixed and not r.name:
                self._name([s for s in self.refs if s.fixed and not s.name and s.base == r.base], r.base, taken)
        for kind in ("fields", "props"):  # properties' formulas read the fields' names
            groups: dict[str, list[Ref]] = defaultdict(list)
            for r in self.refs:
                if r.name or (kind == "props") != isinstance(r, Prop):
                    continue
                groups[r.base].append(r)
            for base, rs in groups.items():
                if len({r.key() for r in rs}) == 1:
                    self._name(rs, base, taken)
                    continue
                by_stage: dict[tuple, list[Ref]] = defaultdict(list)
                for r in rs:
                    by_stage[r.scope[:1]].append(r)
                for scope, sub in by_stage.items():
                    if len({r.key() for r in sub}) == 1:
                        self._name(sub, "_".join([*scope, base]), taken)
                    else:
                        by_branch: dict[tuple, list[Ref]] = defaultdict(list)
                        for r in sub:  # one field per branch and value (two values in one branch: a number after the second)
                            by_branch[(r.scope, r.key())].append(r)
                        for (sc, _), rs2 in by_branch.items():
                            self._name(rs2, "_".join([*sc, base]), taken)

    @staticmethod
    def _name(rs: list[Ref], name: str, taken: set[str]) -> None:
        name = name.lstrip("_") or "size"  # a spec name like `__class__`: no dunder, no name mangling
        if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in CONFIG_ATTRS:
            name += "_"
        n, k = name, 2
        while n in taken:
            n, k = f"{name}{k}", k + 1
        taken.add(n)
        for r in rs:
            r.name = n

    def fields(self) -> list[Ref]:
        """One Ref per field, in order of first request."""
        seen, out = set(), []
        for r in self.refs:
            if not isinstance(r, (Fixed, Prop)) and r.name not in seen:
                seen.add(r.name)
                out.append(r)
        return out

    def props(self) -> list[Prop]:
        seen, out = set(), []
        for r in self.refs:
            if isinstance(r, Prop) and r.name not in seen:
                seen.add(r.name)
                out.append(r)
        return out

    def check_lines(self) -> list[tuple[str, str]]:
        seen, out = set(), []
        for cond, msg in self.checks:
            c = cond()
            if c not in seen:
                seen.add(c)
                out.append((c, msg()))
        return out


BUILTIN = {"width": WIDTH, "vocab": VOCAB, "context": CONTEXT}  # what a let's formula may read besides lets
CONFIG_ATTRS = frozenset({"self", "math", "config", "dataclass", "__post_init__"})  # names a Config field must not take


def _typ(value) -> str:
    return "int" if isinstance(value, int) else "float"


def _over(formula: str, inputs: dict[str, Ref], whole: bool = False) -> str:
    """A let's formula over Config's own attributes (`4 * d` -> `4 * self.width`)."""
    tree = pyast.parse(formula, mode="eval")

    class Swap(pyast.NodeTransformer):
        def visit_Name(self, n):
            if n.id == "math":
                return n
            return pyast.parse(inputs[n.id].own, mode="eval").body

    text = pyast.unparse(Swap().visit(tree))
    return f"int({text})" if whole else text


def literal(r: Ref) -> str:
    """The field's default, as the spec gave it."""
    return num(float(r.value)) if r.typ == "float" else num(r.value)
