"""Lower the IR to one standalone PyTorch source file.

`codegen(spec) -> str` is the only lowering in the torch back-end: `build()`
compiles and executes exactly this text, so the in-process module and the file
`cyclec build -o model.py` writes cannot drift apart. The generated file imports
only torch and the standard library and reads like nanoGPT's model.py: a config
dataclass, one class per stage (and per branch of a stage), specialised turbine
classes, shape comments, and a straight-line forward pass; nothing interprets
the IR at run time. The output is a pure function of the IR (no timestamps, no
absolute paths, no hash-order iteration), so golden files hold.

Parameter names (stable: the interop loaders and the test stand rely on them)
-----------------------------------------------------------------------------
    feed.tok.weight                      token embedding (vocab, width)
    feed.pos.weight                      learned positions (context, width);
                                         sinusoidal tables are non-persistent buffers
    stages.{i}                           one entry per stage *instance*, in source order
                                         (`stage block x 12` then `stage tap` gives 0..11, 12)
    stages.{i}.{branch}                  a prechamber, named as in the spec (fullflow
                                         branches sit directly on the stage too)
    stages.{i}.{branch}.{op}             the ops of a branch, named by kind: norm, attn,
                                         mlp, moe, pool, linear; a kind that occurs more
                                         than once in one place is numbered from 1
                                         (norm1, norm2), as in nn.TransformerEncoderLayer
    stages.{i}.{op}                      stage-level ops (Post-LN valves, pressure-fed
                                         turbines, a fullflow's shared norm), same scheme
    {op}                                 engine-level ops (the final valve: `norm`)
    head.weight / head.bias              an untied nozzle; a tied nozzle reuses
                                         feed.tok.weight (bias, if any: head_bias)

    attn.qkv.{weight,bias}               fused projection, rows [q | k | v]:
                                         heads*head_dim, kv_heads*head_dim, kv_heads*head_dim
    attn.proj                            output projection
    attn.q_norm / attn.k_norm            qk-norm: RMSNorm over head_dim (eps 1e-6)
    mlp.fc / mlp.proj                    up and down projections; for swiglu/geglu fc is
                                         fused, rows [gate | up], act(gate) * up
    moe.router                           (experts, width), no bias
    moe.experts.{e}.fc / .proj           each expert is an mlp
    {branch}.scale                       rezero (a scalar) or layerscale (per channel)
    {branch}.gate                        the gate merge's Linear(width, width)

Names from the spec are Python identifiers but may be keywords or clash with
nn.Module attributes (`forward`, `train`, `_modules`): they are mangled by
appending `_` (a leading `_` gets an `x` in front), and made unique in their
scope the same way, so no spec name can change what the code does.

Semantics the generated code fixes (documented where they are chosen)
-----------------------------------------------------------------------
- Rotary positions use the rotate-half layout (GPT-NeoX, Llama) on the first
  rotary_dims of each head; tables are computed once per (dims, base).
- MoE routes with softmax then top-k (weights renormalised over the chosen
  experts when top > 1). Capacity is a training-time restrictor orifice:
  assignments beyond ceil(capacity * tokens * top / experts) per expert are
  dropped, first choices before second choices (GShard). In eval mode routing
  is dropless, so the causal throat holds and the KV cache is exact. The
  balance loss is the Switch Transformer's: balance * experts * sum_e f_e * P_e.
  Eager mode gathers each expert's tokens exactly (one host sync for the counts).
  Under torch.compile the routing is traced with fixed shapes and the experts run
  in a custom op (EXPERTS_OP) that reads the counts itself and has a hand-written
  backward: the model is one graph (fullgraph=True) and computes no padding.
- The next-token loss is scored in float32 whatever the logits' dtype (as autocast
  and transformers do); its gradient returns in the logits' dtype.
- The KV cache reserves the whole context per attention once and is written in
  place; grouped-query attention uses SDPA's enable_gqa (no copies of K and V).
- Overboard exhaust is collected in `model.exhaust`; with a loss it is an
  auxiliary next-token head whose weighted cross-entropy joins the total.
- Init: normal(std) for Linear and Embedding weights, zero biases (GPT-2); or
  xavier_uniform for Linear weights with embeddings at normal(width**-0.5).
  Cooling re-initialises each cooled branch's output projection at the IR's
  std; deepnorm multiplies v, the output projection and the reactor weights
  by beta (DeepNet, Wang et al. 2022).
"""

from __future__ import annotations

import builtins
import hashlib
import keyword
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import PurePath

from ... import ir

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

# Module-level names of the generated file that no class may shadow.
_GLOBALS = frozenset({
    "math", "dataclass", "torch", "nn", "F", "Config", "Feed", "Model", "Cache", "Startup",
    "learning_rate", "causal_mask", "sliding_mask", "rotary_tables", "apply_rotary",
    "apply_rotary_partial", "sinusoids", "OVERBOARD", "OVERBOARD_LOSS", "Optional",
}) | frozenset(dir(builtins))

_KIND_NAME = {"norm": "norm", "attention": "attn", "mlp": "mlp", "moe": "moe", "pool": "pool", "linear": "linear"}


# --- the emitter -----------------------------------------------------------------------------


class Emitter:
    """A tiny line writer (after Jinja2's CodeGenerator): `line`, `indent`, `blank`.

    Each output line may name the span that produced it; `source_map` keeps
    (output line number, span) pairs for tools that want to point back at the spec."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0
        self.source_map: list[tuple[int, ir.Span]] = []

    def line(self, text: str = "", span: ir.Span | None = None) -> None:
        if span is not None:
            self.source_map.append((len(self.lines) + 1, span))
        self.lines.append(("    " * self.level + text) if text else "")

    def blank(self, n: int = 1) -> None:
        for _ in range(n):
            self.lines.append("")

    @contextmanager
    def indent(self):
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def drop(self, text: str) -> None:
        """Remove the first line that reads `text`, and shift the source map past it."""
        i = self.lines.index(text)
        del self.lines[i]
        self.source_map = [(n - 1 if n > i else n, span) for n, span in self.source_map]

    def text(self) -> str:
        out = "\n".join(self.lines).rstrip("\n") + "\n"
        return re.sub(r"\n{4,}", "\n\n\n", out)


# --- literals and names ---------------------------------------------------------------------


def num(x: float | int | bool | None) -> str:
    """A Python literal for a number from the IR (repr is exact and deterministic)."""
    if x is None or isinstance(x, bool):
        return repr(x)
    if isinstance(x, int):
        return str(int(x))
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"non-finite number {x!r} in the IR")
    return repr(x)


def where(span: ir.Span | None) -> str:
    """`file.cycle:LINE` with the base name only; nothing from a path can leave a comment."""
    if span is None:
        return ""
    name = PurePath(span.file.replace("\\", "/")).name or "spec"
    name = re.sub(r"[^A-Za-z0-9._<>+-]", "_", name)[:80]
    return f"{name}:{int(span.line)}"


def camel(name: str) -> str:
    parts = [p for p in name.split("_") if p]
    return "".join(p[:1].upper() + p[1:] for p in parts)


class Names:
    """One attribute namespace: hands out safe, unique names in allocation order."""

    def __init__(self, reserved: frozenset[str] = NN_MODULE_ATTRS):
        self.reserved = reserved
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        name = base
        if not name.isidentifier() or not name.isascii():  # the front end guarantees this; be safe anyway
            name = "x_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
        if name.startswith("_"):
            name = "x" + name
        while keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in self.reserved or name in self.used:
            name += "_"
        self.used.add(name)
        return name


def numbered(kinds: list[str]) -> list[str]:
    """norm, attn, ... ; a kind that occurs more than once is numbered from 1."""
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for k in kinds:
        if counts[k] == 1:
            out.append(k)
        else:
            seen[k] = seen.get(k, 0) + 1
            out.append(f"{k}{seen[k]}")
    return out


# --- the plan: every name decided before a line is written ---------------------------------


@dataclass
class OpPlan:
    op: object  # ir.Norm or a turbine
    attr: str
    cls: str = ""  # turbine class name (norms and linears use torch's)
    rope: int | None = None  # index into the model's rotary tables


@dataclass
class BranchPlan:
    br: ir.Prechamber
    attr: str
    cls: str
    ops: list[OpPlan]
    fullflow: bool = False

    @property
    def needs_rope(self) -> bool:
        return any(o.rope is not None for o in self.ops)

    def needs_cache(self, causal: bool) -> bool:
        return causal and any(isinstance(o.op, (ir.Attention, ir.Pool)) for o in self.ops)

    @property
    def needs_aux(self) -> bool:
        return self.br.overboard or any(isinstance(o.op, ir.Moe) and o.op.balance > 0 for o in self.ops)


@dataclass
class FullflowPlan:
    ff: ir.Fullflow
    norm: OpPlan | None
    branches: list[BranchPlan]


@dataclass
class StagePlan:
    stage: ir.Stage
    cls: str
    first: int  # index of the first instance in model.stages
    items: list  # OpPlan | BranchPlan | FullflowPlan, in source order

    def branches(self) -> list[BranchPlan]:
        out = []
        for it in self.items:
            if isinstance(it, BranchPlan):
                out.append(it)
            elif isinstance(it, FullflowPlan):
                out.extend(it.branches)
        return out


@dataclass
class Plan:
    engine: ir.Engine
    file: str
    stages: list[StagePlan] = field(default_factory=list)
    main: list = field(default_factory=list)  # StagePlan | OpPlan in body order
    ropes: list[tuple[int, float]] = field(default_factory=list)
    turbine_classes: dict[tuple, str] = field(default_factory=dict)  # variant key -> class name
    turbine_order: list[tuple] = field(default_factory=list)

    @property
    def causal(self) -> bool:
        return self.engine.throat == "causal"


def _variant(op, causal: bool) -> tuple:
    """What decides the *text* of a turbine's class; sizes are constructor arguments."""
    if isinstance(op, ir.Attention):
        rot = "none" if op.rotary_dims == 0 else ("full" if op.rotary_dims == op.head_dim else "partial")
        return ("attention", op.mask, op.window is not None, rot, op.qk_norm, op.kv_heads != op.heads, op.dropout > 0, causal)
    if isinstance(op, ir.Mlp):
        return ("mlp", op.act, op.dropout > 0)
    if isinstance(op, ir.Moe):
        return ("moe", op.act, op.capacity is not None, op.balance > 0, op.top > 1)
    if isinstance(op, ir.Pool):
        return ("pool", op.causal, causal)
    return ()


_CLASS_BASE = {"attention": "Attention", "mlp": "Mlp", "moe": "Moe", "pool": "Pool"}


def make_plan(spec: ir.Spec) -> Plan:
    e = spec.engine
    assert e is not None
    file = where(e.span).rsplit(":", 1)[0] if e.span else "spec"
    p = Plan(engine=e, file=file)
    causal = e.throat == "causal"

    def turbine_class(op) -> str:
        key = _variant(op, causal)
        if not key:
            return ""
        if key[0] == "moe":  # its experts are mlps of the same activation
            turbine_class(ir.Mlp(width=op.width, hidden=op.hidden, act=op.act, bias=op.bias, dropout=0.0))
        if key not in p.turbine_classes:
            base = _CLASS_BASE[key[0]]
            n = sum(1 for k in p.turbine_classes if k[0] == key[0])
            p.turbine_classes[key] = base if n == 0 else f"{base}{n + 1}"
            p.turbine_order.append(key)
        return p.turbine_classes[key]

    def rope_index(op) -> int | None:
        if not isinstance(op, ir.Attention) or op.rotary_dims == 0:
            return None
        k = (op.rotary_dims, op.rotary_base)
        if k not in p.ropes:
            p.ropes.append(k)
        return p.ropes.index(k)

    def plan_ops(ops, names: Names) -> list[OpPlan]:
        attrs = numbered([_KIND_NAME[o.op] for o in ops])
        return [OpPlan(o, names.fresh(a), turbine_class(o), rope_index(o)) for o, a in zip(ops, attrs)]

    class_names = Names(frozenset(_GLOBALS) | {c for c in ("Attention", "Mlp", "Moe", "Pool")})
    # turbine class names are numbered variants of fixed bases; reserve a generous set
    class_names.reserved = class_names.reserved | {f"{b}{i}" for b in _CLASS_BASE.values() for i in range(2, 64)}
    index = 0
    for op in e.body:
        if not isinstance(op, ir.Stage):
            continue
        cls = class_names.fresh(camel(op.name) or "Stage")
        attrs = Names()
        # the spec's own branch names first, so they keep their spelling
        branch_attr = {id(b): attrs.fresh(b.name) for b in ir.stage_branches(op)}
        kinds = []
        for s in op.ops:
            if isinstance(s, ir.Fullflow):
                if s.norm is not None:
                    kinds.append("norm")
            elif not isinstance(s, ir.Prechamber):
                kinds.append(_KIND_NAME[s.op])
        op_attrs = iter(numbered(kinds))
        items = []
        for s in op.ops:
            if isinstance(s, (ir.Prechamber, ir.Fullflow)):
                brs = [s] if isinstance(s, ir.Prechamber) else s.branches
                plans = []
                for b in brs:
                    bcls = class_names.fresh(cls + (camel(b.name) or "Branch"))
                    plans.append(BranchPlan(b, branch_attr[id(b)], bcls, plan_ops(b.ops, Names()), isinstance(s, ir.Fullflow)))
                if isinstance(s, ir.Prechamber):
                    items.append(plans[0])
                else:
                    norm = OpPlan(s.norm, attrs.fresh(next(op_attrs))) if s.norm is not None else None
                    items.append(FullflowPlan(s, norm, plans))
            else:
                o = OpPlan(s, attrs.fresh(next(op_attrs)), turbine_class(s), rope_index(s))
                items.append(o)
        sp = StagePlan(op, cls, index, items)
        index += op.repeat
        p.stages.append(sp)
    model_names = Names(NN_MODULE_ATTRS | {"feed", "stages", "head", "head_bias", "config", "aux_losses", "exhaust", "rope_cos", "rope_sin"}
                        | {f"rope{i}_{t}" for i in range(len(p.ropes)) for t in ("cos", "sin")})
    stage_iter = iter(p.stages)
    main_ops = [op for op in e.body if not isinstance(op, ir.Stage)]
    main_attrs = iter(numbered([_KIND_NAME[o.op] for o in main_ops]))
    for op in e.body:
        if isinstance(op, ir.Stage):
            p.main.append(next(stage_iter))
        else:
            p.main.append(OpPlan(op, model_names.fresh(next(main_attrs)), turbine_class(op), rope_index(op)))
    return p


# --- roles: for summaries and the test stand -----------------------------------------------

ROLE_OF_KIND = {"attention": "mixers", "pool": "mixers", "mlp": "reactors", "moe": "reactors", "linear": "throats", "norm": "valves"}
ROLE_DOC = """Roles: feed (token and position embeddings); mixers (attention and pool: the only
operators that mix positions; qk-norms included); reactors (mlp and moe, router included:
position-wise work); throats (linear turbines); valves (norms); merges (rezero, layerscale and
gate parameters); nozzle (the head; 0 when tied to the feed)."""


def module_roles(spec) -> list[tuple[str, str, str]]:
    """(module name prefix, role, stage label) for every parameter-holding part of the model,
    derived from the same naming pass as the code. The stage label is '' outside stages."""
    from ... import to_spec

    p = make_plan(to_spec(spec))
    out: list[tuple[str, str, str]] = [("feed.", "feed", ""), ("head.", "nozzle", ""), ("head_bias", "nozzle", "")]
    for item in p.main:
        if isinstance(item, OpPlan):
            out.append((item.attr + ".", ROLE_OF_KIND[item.op.op], ""))
            continue
        sp = item
        for i in range(sp.first, sp.first + sp.stage.repeat):
            pre = f"stages.{i}."
            for it in sp.items:
                if isinstance(it, OpPlan):
                    out.append((pre + it.attr + ".", ROLE_OF_KIND[it.op.op], sp.stage.name))
                    continue
                brs = [it] if isinstance(it, BranchPlan) else it.branches
                if isinstance(it, FullflowPlan) and it.norm is not None:
                    out.append((pre + it.norm.attr + ".", "valves", sp.stage.name))
                for b in brs:
                    for o in b.ops:
                        out.append((pre + b.attr + "." + o.attr + ".", ROLE_OF_KIND[o.op.op], sp.stage.name))
                    out.append((pre + b.attr + ".", "merges", sp.stage.name))
    return out


# --- phrases: the power-cycle role of each construct, in a few words -------------------------

_TURBINE_ROLE = {
    "attention": "injector: mixes positions",
    "mlp": "combustion: reacts at each position",
    "moe": "liquid-liquid injection: routed experts",
    "pool": "injector: pooling mixer",
    "linear": "a single projection",
}

_MERGE_ROLE = {
    "plain": "closed cycle: the exhaust returns",
    "scale": "the exhaust returns, throttled",
    "cooling": "closed cycle, cooled: output projection starts small",
    "rezero": "starts closed (ReZero)",
    "layerscale": "lean start, per channel (LayerScale)",
    "deepnorm": "DeepNorm: the main line is scaled by alpha",
    "gate": "a gated return (highway)",
}


def branch_role(b: ir.Prechamber) -> str:
    turbines = [o.op for o in b.ops if ir.is_turbine(o)]
    work = _TURBINE_ROLE[turbines[-1]] if turbines else "work"
    if b.overboard:
        ret = "overboard: an auxiliary head, weighted" if b.loss is not None else "overboard: the exhaust is dumped"
    else:
        ret = _MERGE_ROLE[b.merge.kind]
    if b.detach:
        ret = "open cycle, detached input; " + ret
    return f"{work}; {ret}"


def merge_phrase(b: ir.Prechamber) -> str:
    if b.overboard:
        ret = "overboard, an auxiliary head" if b.loss is not None else "overboard, dumped"
    else:
        ret = _MERGE_ROLE[b.merge.kind]
    return ("open cycle (detached); " if b.detach else "") + ret


def _comment(span, phrase: str) -> str:
    w = where(span)
    return f"  # {w} {phrase}" if w else f"  # {phrase}"


# --- the code itself -------------------------------------------------------------------------

# Each activation as generated code, a format string over its input; a gated one is
# gate(first half) * second half, with the gate named here.
ACTIVATIONS = {"gelu": "F.gelu({})", "gelu_tanh": 'F.gelu({}, approximate="tanh")', "relu": "F.relu({})", "silu": "F.silu({})"}
GATES = {"swiglu": "silu", "geglu": "gelu"}
# Each plain activation's gradient at its input h, given its output a and the output's
# gradient g, with torch's own backward kernels (the ones autograd runs).
ACT_BACKWARD = {
    "gelu": "torch.ops.aten.gelu_backward(g, h)",
    "gelu_tanh": 'torch.ops.aten.gelu_backward(g, h, approximate="tanh")',
    "relu": "torch.ops.aten.threshold_backward(g, a, 0)",
    "silu": "torch.ops.aten.silu_backward(g, h)",
}


def act_grad_source(act: str) -> str:
    """The generated `{act}_grad(h, g=None)`: the activation, and with g its gradient at h."""
    if act in GATES:
        gate = GATES[act]
        fwd = ["gate, up = h.chunk(2, dim=-1)", f"s = {ACTIVATIONS[gate].format('gate')}", "a = s * up"]
        bwd = ["gh = torch.empty_like(h)  # [d gate | d up], both halves written in place (no cat)",
               "d_gate, d_up = gh.chunk(2, dim=-1)",
               "torch.mul(g, s, out=d_up)",
               f"torch.ops.aten.{gate}_backward.grad_input(g * up, gate, grad_input=d_gate)",
               "return a, gh"]
    else:
        fwd, bwd = [f"a = {ACTIVATIONS[act].format('h')}"], [f"return a, {ACT_BACKWARD[act]}"]
    body = "\n".join("    " + ln for ln in [*fwd, "if g is None:", "    return a, None", *bwd])
    return f'''
def {act}_grad(h, g=None):
    """{act}(h) and, given g (the gradient of its output), the gradient at h."""
{body}
'''


EXPERTS_OP = '''
def expert_mlps(name, act_grad):
    """The custom op `cyclelang::{name}`: every expert's MLP on the assignments sorted by expert.

    torch.compile traces the routing (fixed shapes) and calls this op, which it cannot see
    into, for the experts: inside, the exact row counts may steer Python (one host sync),
    so no expert computes padding and the model stays one graph (fullgraph=True).
    xs: (A, C) assignments sorted by expert, the dropped ones first; counts: (E + 1,)
    [dropped, then per expert]; weights: per expert fc.weight, (fc.bias,) proj.weight,
    (proj.bias). Returns the (A, C) outputs (zero for dropped rows) and the (A, fc rows)
    pre-activations the hand-written backward reads. Defined once per process.
    """
    try:
        return getattr(torch.ops.cyclelang, name)
    except AttributeError:
        pass

    def unpack(weights, e, bias):
        if bias:
            return weights[4 * e : 4 * e + 4]
        fc, proj = weights[2 * e : 2 * e + 2]
        return fc, None, proj, None

    def linear_into(out, x, w, b):
        return torch.mm(x, w.t(), out=out) if b is None else torch.addmm(b, x, w.t(), out=out)

    unsafe = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()  # a host sync inside

    @torch.library.custom_op("cyclelang::" + name, mutates_args=(), tags=unsafe)
    def run(xs: torch.Tensor, counts: torch.Tensor, weights: list[torch.Tensor], bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = counts.tolist()  # [dropped, then per expert]: the one host sync
        out, h = torch.empty_like(xs), xs.new_empty(xs.size(0), weights[0].size(0))
        start = sizes[0]
        out[:start].zero_(), h[:start].zero_()
        for e, n in enumerate(sizes[1:]):
            fc, fc_b, proj, proj_b = unpack(weights, e, bias)
            rows = slice(start, start + n)
            a, _ = act_grad(linear_into(h[rows], xs[rows], fc, fc_b))
            linear_into(out[rows], a, proj, proj_b)
            start += n
        return out, h

    @run.register_fake
    def _(xs, counts, weights, bias):
        return torch.empty_like(xs), xs.new_empty(xs.size(0), weights[0].size(0))

    @torch.library.custom_op("cyclelang::" + name + "_backward", mutates_args=(), tags=unsafe)
    def run_backward(
        grad: torch.Tensor, xs: torch.Tensor, h: torch.Tensor, counts: torch.Tensor, weights: list[torch.Tensor], bias: bool, weight_grads: bool
    ) -> list[torch.Tensor]:
        sizes = counts.tolist()
        gx = torch.empty_like(xs)
        start = sizes[0]
        gx[:start].zero_()
        grads = []
        for e, n in enumerate(sizes[1:]):
            fc, fc_b, proj, proj_b = unpack(weights, e, bias)
            rows = slice(start, start + n)
            g = grad[rows]  # (n, C)
            a, gh = act_grad(h[rows], g @ proj)  # (n, hidden), (n, fc rows)
            if weight_grads:  # frozen experts skip two of the three matmuls
                grads += [gh.t() @ xs[rows]] + ([gh.sum(dim=0)] if bias else []) + [g.t() @ a] + ([g.sum(dim=0)] if bias else [])
            torch.mm(gh, fc, out=gx[rows])
            start += n
        return [gx] + grads

    @run_backward.register_fake
    def _(grad, xs, h, counts, weights, bias, weight_grads):
        return [torch.empty_like(xs)] + ([torch.empty_like(w) for w in weights] if weight_grads else [])

    def setup_context(ctx, inputs, output):
        xs, counts, weights, ctx.bias = inputs
        ctx.weight_grads = any(w.requires_grad for w in weights)
        ctx.save_for_backward(xs, output[1], counts, *weights)
        ctx.mark_non_differentiable(output[1])

    def backward(ctx, grad, _):
        xs, h, counts, *weights = ctx.saved_tensors
        gx, *gw = run_backward(grad.contiguous(), xs, h, counts, weights, ctx.bias, ctx.weight_grads)
        return gx, None, gw if ctx.weight_grads else [None] * len(weights), None

    run.register_autograd(backward, setup_context=setup_context)
    return getattr(torch.ops.cyclelang, name)
'''


HEADER_IMPORTS = """import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F"""


class Lowering:
    def __init__(self, spec: ir.Spec):
        self.spec = spec
        self.e = spec.engine
        self.p = make_plan(spec)
        self.out = Emitter()

    # small helpers
    def w(self, text: str = "", span=None) -> None:
        self.out.line(text, span)

    def block(self, text: str) -> None:
        """Several lines of fixed text at the current indent."""
        for ln in text.strip("\n").split("\n"):
            self.w(ln.rstrip())

    def source(self) -> str:
        self.header()
        self.helpers()
        self.expert_ops()
        self.config()
        self.feed()
        for key in self.p.turbine_order:
            self.turbine_class(key)
        if self.p.causal:
            self.cache_class()
        for sp in self.p.stages:
            for b in sp.branches():
                self.branch_class(sp, b)
            self.stage_class(sp)
        self.startup()
        self.model()
        if not any("math." in ln for ln in self.out.lines):  # only a few constructs need it
            self.out.drop("import math")
        return self.out.text()

    # --- file header -----------------------------------------------------------
    def header(self) -> None:
        e, p = self.e, self.p
        self.w(f'"""{e.name}: a PyTorch model generated by cyclec from {p.file}.')
        self.w()
        self.w("Edit the spec and rebuild rather than editing this file. It imports only torch")
        self.w("and the standard library; `Model` is the engine, `Model.generate` samples from")
        self.w("it" + (" with a KV cache (legal because the throat is causal)." if p.causal else " (only for a causal throat; this one is open)."))
        self.w("Parameter names follow the spec: stages.{i}.{branch}.{op}.{param}, see")
        self.w("cyclelang/backends/torch/codegen.py for the full scheme.")
        self.w('"""')
        self.blank_after_imports()

    def blank_after_imports(self) -> None:
        self.w()
        self.block(HEADER_IMPORTS)
        self.out.blank(2)

    # --- module-level helper functions ----------------------------------------
    def helpers(self) -> None:
        e, p = self.e, self.p
        atts = [o for o in self.all_turbines() if isinstance(o, ir.Attention)]
        self.block('''
class NextTokenLoss(torch.autograd.Function):
    """F.cross_entropy(logits.float(), targets, ignore_index=-1): the same forward, a leaner backward.

    The gradient is (softmax(logits) - onehot(targets)) / tokens, built in one (N, vocab)
    buffer from the saved log-probabilities; autograd's own backward fills a zero one-hot
    gradient and allocates a third (N, vocab) tensor to combine them. Half-precision
    logits are scored in float32 (a no-op for float32 ones), as autocast would.
    """

    @staticmethod
    def forward(ctx, logits, targets):  # logits (N, vocab); targets (N,), -1: ignored
        logp = F.log_softmax(logits.float(), dim=-1)  # (N, vocab)
        ctx.save_for_backward(logp, targets)
        ctx.dtype = logits.dtype
        return F.nll_loss(logp, targets, ignore_index=-1)  # the mean over the kept targets

    @staticmethod
    def backward(ctx, grad):
        logp, targets = ctx.saved_tensors
        keep = targets >= 0  # (N,)
        g = logp.exp()  # (N, vocab): softmax
        g[torch.arange(g.size(0), device=g.device), torch.where(keep, targets, 0)] -= 1.0
        return g.mul_((keep * (grad / keep.sum()))[:, None]).to(ctx.dtype), None
''')
        self.out.blank(2)
        if e.feed.position == "sinusoidal":
            self.block('''
def sinusoids(length, width):
    """The original Transformer's fixed positions: sin on even channels, cos on odd."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]  # (length, 1)
    freq = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))  # (width/2,)
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: width // 2])
    return table  # (length, width)
''')
            self.out.blank(2)
        if p.ropes:
            self.block('''
def rotary_tables(length, dims, base):
    """Rotary positions (RoFormer), computed once: cos and sin tables, each (length, dims)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))  # (dims/2,)
    freqs = torch.outer(torch.arange(length, dtype=torch.int64).float(), inv_freq)  # (length, dims/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (length, dims)
    return emb.cos(), emb.sin()
''')
            self.out.blank(2)
        if any(a.rotary_dims == a.head_dim for a in atts if a.rotary_dims):
            self.block('''
def apply_rotary(x, cos, sin):
    """Rotate every dim of each head (the rotate-half layout of GPT-NeoX and Llama)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
''')
            self.out.blank(2)
        if any(a.rotary_dims and a.rotary_dims != a.head_dim for a in atts):
            self.block('''
def apply_rotary_partial(x, cos, sin):
    """Rotate the first cos.size(-1) dims of each head; the rest pass through unrotated."""
    d = cos.size(-1)
    x1, x2, rest = x[..., : d // 2], x[..., d // 2 : d], x[..., d:]
    return torch.cat((x[..., :d] * cos + torch.cat((-x2, x1), dim=-1) * sin, rest), dim=-1)
''')
            self.out.blank(2)
        if p.causal and any(a.window is None for a in atts):
            self.block('''
def causal_mask(T, S, device):
    """(T, S) True where query i, at position S - T + i, may see key j: j <= S - T + i."""
    i = torch.arange(S - T, S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return j <= i
''')
            self.out.blank(2)
        if any(a.window is not None for a in atts):
            self.block('''
def sliding_mask(T, S, window, device):
    """causal_mask limited to the latest `window` positions (sliding-window attention)."""
    i = torch.arange(S - T, S, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return (j <= i) & (i - j < window)
''')
            self.out.blank(2)

    def expert_ops(self) -> None:
        """For torch.compile: one custom op per MoE activation (see EXPERTS_OP).

        The op's name carries a digest of its source, so two builds in one process share an
        op only when its code is the same.
        """
        acts = sorted({op.act for op in self.all_turbines() if isinstance(op, ir.Moe)})
        if not acts:
            return
        funcs = [act_grad_source(act) for act in acts]
        for text in funcs + [EXPERTS_OP]:
            self.block(text)
            self.out.blank(2)
        for act, text in zip(acts, funcs):
            digest = hashlib.sha256((text + EXPERTS_OP).encode()).hexdigest()[:8]
            self.w(f'experts_{act} = expert_mlps("experts_{act}_{digest}", {act}_grad)')
        self.out.blank(2)

    def all_turbines(self) -> list:
        """Every turbine of the engine: on the main line, bare in a stage, or in its branches."""
        out = [op for op in self.e.body if ir.is_turbine(op)]
        for st in self.e.body:
            if isinstance(st, ir.Stage):
                out += [op for op in st.ops if ir.is_turbine(op)]
                out += [op for b in ir.stage_branches(st) for op in b.ops if ir.is_turbine(op)]
        return out

    # --- config ----------------------------------------------------------------
    def config(self) -> None:
        e = self.e
        self.w("@dataclass")
        self.w("class Config:")
        with self.out.indent():
            self.w('"""The engine\'s outer dimensions. The blocks inside are fixed by the spec."""')
            self.w()
            self.w(f"vocab_size: int = {num(e.feed.vocab)}  # tokens the feed takes and the nozzle predicts")
            self.w(f"context: int = {num(e.feed.context)}  # the longest sequence (positions, rotary tables)")
            self.w(f"width: int = {num(e.width)}  # the main chamber: residual-stream width")
            self.w(f"feed_scale: float = {num(e.feed.scale)}  # token embeddings are multiplied by this")
            self.w(f"feed_dropout: float = {num(e.feed.dropout)}")
        self.out.blank(2)

    # --- feed ------------------------------------------------------------------
    def feed(self) -> None:
        f = self.e.feed
        self.w("class Feed(nn.Module):")
        with self.out.indent():
            pos = {"learned": "learned positions", "sinusoidal": "sinusoidal positions", "none": "no positions (they come from rotary, or not at all)"}[f.position]
            self.w(f'"""Tanks and pumps ({where(f.span)}): token embedding plus {pos}."""')
            self.w()
            self.w("def __init__(self, config):")
            with self.out.indent():
                self.w("super().__init__()")
                self.w("self.tok = nn.Embedding(config.vocab_size, config.width)")
                if f.position == "learned":
                    self.w("self.pos = nn.Embedding(config.context, config.width)")
                elif f.position == "sinusoidal":
                    self.w('self.register_buffer("pos", sinusoids(config.context, config.width), persistent=False)')
                if f.scale != 1.0:
                    self.w("self.scale = config.feed_scale")
                if f.dropout > 0:
                    self.w("self.drop = nn.Dropout(config.feed_dropout)")
            self.w()
            self.w("def forward(self, idx, past):")
            with self.out.indent():
                tok = "self.tok(idx)" if f.scale == 1.0 else "self.tok(idx) * self.scale"
                if f.position == "none":
                    self.w(f"x = {tok}  # (B, T, C)")
                else:
                    self.w("T = idx.size(1)")
                    if f.position == "learned":
                        self.w("pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device)  # (T,)")
                        self.w(f"x = {tok} + self.pos(pos)  # (B, T, C)")
                    else:
                        self.w(f"x = {tok} + self.pos[past : past + T]  # (B, T, C)")
                if f.dropout > 0:
                    self.w("x = self.drop(x)")
                self.w("return x")
        self.out.blank(2)

    # --- turbines ---------------------------------------------------------------
    def turbine_class(self, key: tuple) -> None:
        name = self.p.turbine_classes[key]
        getattr(self, "cls_" + key[0])(name, key)
        self.out.blank(2)

    def cls_attention(self, name: str, key: tuple) -> None:
        _, mask, window, rot, qk_norm, gqa, dropout, causal = key
        kind = "causal" if mask == "causal" else "bidirectional"
        if window:
            kind = "sliding-window causal"
        self.w(f"class {name}(nn.Module):")
        with self.out.indent():
            extra = []
            if gqa:
                extra.append("grouped-query (kv_heads < heads: baffles share keys and values)")
            if rot != "none":
                extra.append(("rotary" if rot == "full" else "partial rotary") + " positions")
            if qk_norm:
                extra.append("qk-norm")
            head = f"{kind[0].upper() + kind[1:]} self-attention: the injector, the only place positions mix."
            if extra:
                self.w(f'"""{head}')
                self.w()
                self.w("With " + ", ".join(extra) + ".")
                self.w('"""')
            else:
                self.w(f'"""{head}"""')
            self.w()
            args = "width, heads, kv_heads, head_dim, bias" + (", window" if window else "") + (", dropout" if dropout else "")
            self.w(f"def __init__(self, {args}):")
            with self.out.indent():
                self.w("super().__init__()")
                self.w("self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim")
                self.w("self.qkv = nn.Linear(width, (heads + 2 * kv_heads) * head_dim, bias=bias)  # q, k, v fused")
                self.w("self.proj = nn.Linear(heads * head_dim, width, bias=bias)")
                if qk_norm:
                    self.w("self.q_norm = nn.RMSNorm(head_dim, eps=1e-6)")
                    self.w("self.k_norm = nn.RMSNorm(head_dim, eps=1e-6)")
                if window:
                    self.w("self.window = window")
                if dropout:
                    self.w("self.dropout = dropout")
                    self.w("self.drop = nn.Dropout(dropout)")
            self.w()
            sig = "x" + (", rope" if rot != "none" else "") + (", cache" if causal else "")
            self.w(f"def forward(self, {sig}):")
            with self.out.indent():
                self.w("B, T, C = x.size()")
                self.w("q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=2)")
                self.w("q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)")
                self.w("k = k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)")
                self.w("v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)")
                if qk_norm:
                    self.w("q, k = self.q_norm(q), self.k_norm(k)")
                if rot == "full":
                    self.w("q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)")
                elif rot == "partial":
                    self.w("q, k = apply_rotary_partial(q, *rope), apply_rotary_partial(k, *rope)")
                if causal:
                    self.w("if cache is not None:")
                    with self.out.indent():
                        self.w("k, v = cache.extend(self, k, v)  # (B, nkv, S, hd): the cached past, then these T")
                dp = ", dropout_p=self.dropout if self.training else 0.0" if dropout else ""
                if gqa:  # each group of query heads reads one kv head, inside the kernel: no copies of k, v
                    dp += ", enable_gqa=True"
                if mask == "open":
                    self.w(f"y = F.scaled_dot_product_attention(q, k, v{dp})  # (B, nh, T, hd)")
                elif window:
                    self.w("if T == 1:  # one query (after the cache) sees the latest `window` keys: no mask")
                    with self.out.indent():
                        self.w(f"y = F.scaled_dot_product_attention(q, k[:, :, -self.window :], v[:, :, -self.window :]{dp})  # (B, nh, 1, hd)")
                    self.w("else:")
                    with self.out.indent():
                        self.w("mask = sliding_mask(T, k.size(2), self.window, x.device)  # (T, S)")
                        self.w(f"y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask{dp})  # (B, nh, T, hd)")
                else:
                    self.w("if k.size(2) == T:  # no cache: the plain causal mask")
                    with self.out.indent():
                        self.w(f"y = F.scaled_dot_product_attention(q, k, v{dp}, is_causal=True)  # (B, nh, T, hd)")
                    if causal:
                        self.w("elif T == 1:  # one query after the cache may see every key: no mask")
                        with self.out.indent():
                            self.w(f"y = F.scaled_dot_product_attention(q, k, v{dp})  # (B, nh, 1, hd)")
                    self.w("else:  # T new queries after S - T cached positions")
                    with self.out.indent():
                        self.w(f"y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, k.size(2), x.device){dp})")
                self.w("y = y.transpose(1, 2).contiguous().view(B, T, self.heads * self.head_dim)  # (B, T, nh * hd)")
                self.w("return self.drop(self.proj(y))" if dropout else "return self.proj(y)")

    def cls_mlp(self, name: str, key: tuple) -> None:
        _, act, dropout = key
        gated = act in GATES
        self.w(f"class {name}(nn.Module):")
        with self.out.indent():
            doc = {"swiglu": "SwiGLU: silu(gate) * up", "geglu": "GeGLU: gelu(gate) * up"}.get(act, act)
            self.w(f'"""Position-wise MLP ({doc}): combustion, a reaction at each position."""')
            self.w()
            self.w("def __init__(self, width, hidden, bias" + (", dropout" if dropout else "") + "):")
            with self.out.indent():
                self.w("super().__init__()")
                if gated:
                    self.w("self.fc = nn.Linear(width, 2 * hidden, bias=bias)  # rows [gate | up]")
                else:
                    self.w("self.fc = nn.Linear(width, hidden, bias=bias)")
                self.w("self.proj = nn.Linear(hidden, width, bias=bias)")
                if dropout:
                    self.w("self.drop = nn.Dropout(dropout)")
            self.w()
            self.w("def forward(self, x):")
            with self.out.indent():
                if gated:
                    self.w("gate, up = self.fc(x).chunk(2, dim=-1)  # (B, T, hidden) each")
                    self.w(f"x = {ACTIVATIONS[GATES[act]].format('gate')} * up")
                else:
                    self.w(f"x = {ACTIVATIONS[act].format('self.fc(x)')}  # (B, T, hidden)")
                self.w("return self.drop(self.proj(x))" if dropout else "return self.proj(x)")

    def cls_moe(self, name: str, key: tuple) -> None:
        _, act, capacity, balance, multi = key
        expert = self.p.turbine_classes[("mlp", act, False)]
        self.w(f"class {name}(nn.Module):")
        with self.out.indent():
            self.w('"""Mixture of experts, top-k routed: liquid-liquid injection.')
            self.w()
            self.w("Each token goes to its top experts (softmax, then top-k" + (", renormalised)." if multi else ")."))
            if capacity:
                self.w("In training, restrictor orifices cap each expert at ceil(capacity * tokens * top /")
                self.w("experts) assignments; the overflow is dropped (first choices before second")
                self.w("choices) and the residual line carries those tokens. Eval is dropless, so the")
                self.w("causal throat holds and a KV cache is exact.")
            if balance:
                self.w("The mixture trim is the Switch Transformer's balance loss,")
                self.w("balance * experts * sum_e(fraction routed to e * mean router probability of e),")
                self.w("filed in aux under this module's name.")
            self.w('"""')
            self.w()
            self.w("key = None  # this module's name in the model, set by Model")
            self.w()
            args = "width, hidden, experts, top, bias" + (", capacity" if capacity else "") + (", balance" if balance else "")
            self.w(f"def __init__(self, {args}):")
            with self.out.indent():
                self.w("super().__init__()")
                self.w("self.top = top")
                if capacity:
                    self.w("self.capacity = capacity")
                if balance:
                    self.w("self.balance = balance")
                self.w("self.router = nn.Linear(width, experts, bias=False)")
                self.w(f"self.experts = nn.ModuleList([{expert}(width, hidden, bias) for _ in range(experts)])")
            self.w()
            self.w("def forward(self, x" + (", aux" if balance else "") + "):")
            with self.out.indent():
                self.w("B, T, C = x.size()")
                self.w("x = x.view(B * T, C)  # (N, C): every token of the batch")
                self.w("E = len(self.experts)")
                self.w("probs = F.softmax(self.router(x), dim=-1)  # (N, E)")
                self.w("weight, choice = torch.topk(probs, self.top, dim=-1)  # (N, k)")
                if multi:
                    self.w("weight = weight / weight.sum(dim=-1, keepdim=True)")
                if capacity or balance:
                    self.w("onehot = F.one_hot(choice.t().reshape(-1), E)  # (k * N, E): first choices first")
                if capacity:
                    self.w("if self.training:  # eval is dropless: every expert may take every token")
                    with self.out.indent():
                        self.w("limit = min(math.ceil(self.capacity * B * T * self.top / E), B * T)")
                        self.w("rank = (torch.cumsum(onehot, dim=0) * onehot).sum(dim=-1)  # (k * N,) place in its expert's queue")
                        self.w("keep = (rank <= limit).view(self.top, B * T).t()  # (N, k)")
                        self.w("choice = torch.where(keep, choice, -1)  # dropped: no expert takes it")
                if balance:
                    self.w("routed = onehot.float().mean(dim=0)  # (E,) fraction of assignments per expert")
                    self.w("aux[self.key] = self.balance * E * torch.sum(routed * probs.mean(dim=0))")
                self.w("flat = choice.reshape(-1)  # (N * k,) each assignment's expert, token by token; -1: dropped")
                self.w("order = torch.argsort(flat, stable=True)  # the assignments grouped by expert, dropped ones first")
                self.w("if torch.compiler.is_compiling() and self.plain_experts():  # one graph: no shape may depend on the routing")
                with self.out.indent():
                    self.w("token = order // self.top  # (N * k,) each one's token")
                    self.w("y = self.compiled_experts(x[token], flat)  # (N * k, C); the dropped rows are zeros")
                self.w("else:")
                with self.out.indent():
                    self.w("counts = torch.bincount(flat + 1, minlength=E + 1).tolist()  # [dropped, then per expert]: one host sync")
                    self.w("order = order[counts[0] :]  # (A,) the assignments the experts take")
                    self.w("token = order // self.top  # (A,) each one's token")
                    self.w("y = torch.cat([expert(xe) for expert, xe in zip(self.experts, x[token].split(counts[1:]))])  # (A, C)")
                self.w("y = y * weight.reshape(-1)[order, None]  # each assignment, weighted")
                self.w("return y.new_zeros(B * T, C).index_add_(0, token, y).view(B, T, C)  # a token's experts add in expert order; y's dtype (autocast)")
            self.w()
            self.w("def compiled_experts(self, xs, flat):")
            with self.out.indent():
                self.w('"""The experts under torch.compile: xs (N * k, C) are the assignments sorted by expert,')
                self.w(f"the dropped ones first. They run in the custom op experts_{act}, opaque to the trace,")
                self.w("which reads the exact counts (one host sync) and so computes no padding; the")
                self.w('gradients come from its hand-written backward."""')
                self.w("E = len(self.experts)")
                self.w("counts = flat.new_zeros(E + 1).index_add_(0, flat + 1, torch.ones_like(flat))  # (E + 1,) [dropped, then per expert]")
                self.w("bias = self.experts[0].fc.bias is not None")
                self.w("weights = [w for ex in self.experts for w in (ex.fc.weight, ex.fc.bias, ex.proj.weight, ex.proj.bias) if w is not None]")
                self.w("if torch.is_autocast_enabled(xs.device.type) and xs.dtype != torch.float64:  # autocast cannot see into the op: cast as F.linear would")
                with self.out.indent():
                    self.w("dtype = torch.get_autocast_dtype(xs.device.type)")
                    self.w("xs, weights = xs.to(dtype), [w.to(dtype) for w in weights]")
                self.w(f"return experts_{act}(xs, counts, weights, bias)[0]")
            self.w()
            self.w("def plain_experts(self):")
            with self.out.indent():
                self.w(f'"""Whether every expert is still this file\'s {expert} of two plain nn.Linear, whose weights the')
                self.w("custom op can read. A replaced layer (LoRA, quantised) takes the gather instead, which under")
                self.w("torch.compile costs a graph break. Forward hooks on the experts run on the gather path only.")
                self.w('"""')
                self.w(f"return all(type(ex) is {expert} and type(ex.fc) is nn.Linear and type(ex.proj) is nn.Linear for ex in self.experts)")

    def cls_pool(self, name: str, key: tuple) -> None:
        _, causal, engine_causal = key
        self.w(f"class {name}(nn.Module):")
        with self.out.indent():
            if causal:
                self.w('"""PoolFormer\'s mixer, causal: the mean of the latest `size` positions (this one')
                self.w('included, fewer at the start), minus the position itself."""')
            else:
                self.w('"""PoolFormer\'s mixer: the mean over a window of `size` positions centred on each')
                self.w('one (padding not counted), minus the position itself."""')
            self.w()
            self.w("def __init__(self, size):")
            with self.out.indent():
                self.w("super().__init__()")
                self.w("self.size = size")
            self.w()
            if causal:
                self.w("def forward(self, x" + (", cache" if engine_causal else "") + "):")
                with self.out.indent():
                    self.w("B, T, C = x.size()")
                    if engine_causal:
                        self.w("past = 0 if cache is None else cache.pos")
                        self.w("h = x if cache is None else cache.extend_pool(self, x, self.size - 1)  # (B, P + T, C)")
                    else:
                        self.w("past, h = 0, x")
                    self.w("sums = F.avg_pool1d(F.pad(h.transpose(1, 2), (self.size - 1, 0)), self.size, stride=1)  # (B, C, P + T)")
                    self.w("count = torch.arange(past + 1, past + T + 1, device=x.device).clamp(max=self.size).to(x.dtype)  # (T,)")
                    self.w("return sums[..., -T:].transpose(1, 2) * (self.size / count)[:, None] - x  # (B, T, C)")
            else:
                self.w("def forward(self, x):")
                with self.out.indent():
                    self.w("T = x.size(1)")
                    self.w("h = F.avg_pool1d(x.transpose(1, 2), self.size, stride=1, padding=self.size // 2, count_include_pad=False)")
                    self.w("return h[..., :T].transpose(1, 2) - x  # (B, T, C)")

    # --- the KV cache -----------------------------------------------------------
    def cache_class(self) -> None:
        self.block('''
class Cache:
    """What generation remembers: keys and values per attention, recent inputs per pool.

    Legal because the throat is causal: nothing travels upstream, so the past's keys
    and values never change when a token is appended. They go into buffers reserved
    once for the whole context and written in place: a step copies its own token,
    never the past. A pool keeps only its last size - 1 inputs, so its copy is bounded."""

    def __init__(self, length=None):
        self.pos = 0  # positions already processed
        self.length = length  # positions reserved per attention; None: the model's context
        self.state = {}

    def extend(self, layer, k, v):
        """Write k, v (B, nkv, T, hd) at positions pos .. pos + T; return the keys and values so far."""
        if layer not in self.state:
            B, nkv, _, hd = k.size()
            self.state[layer] = (k.new_empty(B, nkv, self.length, hd), v.new_empty(B, nkv, self.length, hd))
        past_k, past_v = self.state[layer]  # (B, nkv, length, hd)
        end = self.pos + k.size(2)
        past_k[:, :, self.pos : end] = k
        past_v[:, :, self.pos : end] = v
        return past_k[:, :, :end], past_v[:, :, :end]  # (B, nkv, S, hd): views, no copy

    def extend_pool(self, layer, x, keep):
        h = torch.cat((self.state[layer], x), dim=1) if layer in self.state else x
        self.state[layer] = h[:, max(h.size(1) - keep, 0) :]
        return h
''')
        self.out.blank(2)

    # --- branches and stages ------------------------------------------------------
    def op_ctor(self, o: OpPlan) -> str:
        op = o.op
        if isinstance(op, ir.Norm):
            if op.type == "layernorm":
                b = "" if op.bias else ", bias=False"
                return f"nn.LayerNorm({num(op.width)}, eps={num(op.eps)}{b})"
            return f"nn.RMSNorm({num(op.width)}, eps={num(op.eps)})"
        if isinstance(op, ir.Linear):
            return f"nn.Linear({num(op.width)}, {num(op.out)}, bias={num(op.bias)})"
        if isinstance(op, ir.Attention):
            a = f"{o.cls}({num(op.width)}, heads={num(op.heads)}, kv_heads={num(op.kv_heads)}, head_dim={num(op.head_dim)}, bias={num(op.bias)}"
            if op.window is not None:
                a += f", window={num(op.window)}"
            if op.dropout > 0:
                a += f", dropout={num(op.dropout)}"
            return a + ")"
        if isinstance(op, ir.Mlp):
            a = f"{o.cls}({num(op.width)}, hidden={num(op.hidden)}, bias={num(op.bias)}"
            if op.dropout > 0:
                a += f", dropout={num(op.dropout)}"
            return a + ")"
        if isinstance(op, ir.Moe):
            a = f"{o.cls}({num(op.width)}, hidden={num(op.hidden)}, experts={num(op.experts)}, top={num(op.top)}, bias={num(op.bias)}"
            if op.capacity is not None:
                a += f", capacity={num(op.capacity)}"
            if op.balance > 0:
                a += f", balance={num(op.balance)}"
            return a + ")"
        if isinstance(op, ir.Pool):
            return f"{o.cls}(size={num(op.size)})"
        raise AssertionError(op)

    def op_call(self, o: OpPlan, owner: str, x: str) -> str:
        """The expression applying one op to `x`."""
        op = o.op
        args = [x]
        if isinstance(op, ir.Attention):
            if o.rope is not None:
                args.append(f"rope[{o.rope}]")
            if self.p.causal:
                args.append("cache")
        elif isinstance(op, ir.Pool) and self.p.causal:
            args.append("cache")
        elif isinstance(op, ir.Moe) and op.balance > 0:
            args.append("aux")
        return f"{owner}.{o.attr}({', '.join(args)})"

    @staticmethod
    def op_phrase(op, place: str) -> str:
        if isinstance(op, ir.Norm):
            return {"branch": "valve on the branch (Pre-LN)", "stage": "valve in series on the main line",
                    "shared": "one shared valve for every branch", "engine": "valve on the main line"}[place]
        if place == "branch":
            return _TURBINE_ROLE[op.op]
        return _TURBINE_ROLE[op.op] + ", in series on the main line (pressure-fed)"

    def branch_params(self, b: BranchPlan) -> list[str]:
        ps = ["x"]
        if b.needs_rope:
            ps.append("rope")
        if b.needs_cache(self.p.causal):
            ps.append("cache")
        if b.needs_aux:
            ps.append("aux")
        return ps

    def branch_class(self, sp: StagePlan, b: BranchPlan) -> None:
        br = b.br
        self.w(f"class {b.cls}(nn.Module):", br.span)
        with self.out.indent():
            self.w(f'"""{where(br.span)} prechamber {br.name}: {branch_role(br)}."""')
            self.w()
            if br.overboard:
                self.w("key = None  # this module's name in the model, set by Model")
                self.w()
            self.w("def __init__(self):")
            with self.out.indent():
                self.w("super().__init__()")
                for o in b.ops:
                    self.w(f"self.{o.attr} = {self.op_ctor(o)}" + _comment(o.op.span, self.op_phrase(o.op, "branch")), o.op.span)
                m = br.merge
                if isinstance(m, ir.RezeroMerge):
                    self.w(f"self.scale = nn.Parameter(torch.full((), {num(m.init)}))  # ReZero: the branch starts closed", m.span)
                elif isinstance(m, ir.LayerscaleMerge):
                    self.w(f"self.scale = nn.Parameter(torch.full(({num(br.width)},), {num(m.init)}))  # LayerScale: per channel", m.span)
                elif isinstance(m, ir.GateMerge):
                    self.w(f"self.gate = nn.Linear({num(br.width)}, {num(br.width)})  # highway gate; bias starts at {num(m.bias)}", m.span)
            self.w()
            self.w(f"def forward(self, {', '.join(self.branch_params(b))}):")
            with self.out.indent():
                for o in b.ops:
                    self.w(f"x = {self.op_call(o, 'self', 'x')}")
                if br.overboard:
                    self.w("aux[self.key] = x  # overboard: filed, never merged")
                else:
                    self.w("return x")
        self.out.blank(2)

    def branch_delta(self, b: BranchPlan, inp: str) -> tuple[str, str | None]:
        """(the branch's contribution to the chamber, alpha if deepnorm)."""
        args = ", ".join([inp + (".detach()" if b.br.detach else "")] + self.branch_params(b)[1:])
        f = f"self.{b.attr}({args})"
        m = b.br.merge
        if isinstance(m, ir.ScaleMerge):
            return f"{num(m.value)} * {f}", None
        if isinstance(m, (ir.RezeroMerge, ir.LayerscaleMerge)):
            return f"self.{b.attr}.scale * {f}", None
        if isinstance(m, ir.GateMerge):
            return f"torch.sigmoid(self.{b.attr}.gate(x)) * ({f} - x)", None
        if isinstance(m, ir.DeepnormMerge):
            return f, num(m.alpha)
        return f, None

    def merge_line(self, branches: list[BranchPlan], inp: str) -> str:
        deltas, alpha = [], None
        for b in branches:
            d, a = self.branch_delta(b, inp)
            deltas.append(d)
            alpha = alpha or a
        main = f"{alpha} * x" if alpha else "x"
        return f"x = {main} + " + " + ".join(deltas)

    def stage_class(self, sp: StagePlan) -> None:
        st = sp.stage
        rep = f", x{st.repeat}" if st.repeat > 1 else ""
        self.w(f"class {sp.cls}(nn.Module):", st.span)
        with self.out.indent():
            tmpl = f" (from template {st.template})" if st.template else ""
            self.w(f'"""{where(st.span)} stage {st.name}{rep}{tmpl}."""')
            self.w()
            self.w("def __init__(self):")
            with self.out.indent():
                self.w("super().__init__()")
                for it in sp.items:
                    if isinstance(it, OpPlan):
                        self.w(f"self.{it.attr} = {self.op_ctor(it)}" + _comment(it.op.span, self.op_phrase(it.op, "stage")), it.op.span)
                    elif isinstance(it, BranchPlan):
                        self.w(f"self.{it.attr} = {it.cls}()" + _comment(it.br.span, "prechamber " + it.br.name), it.br.span)
                    else:
                        if it.norm is not None:
                            self.w(f"self.{it.norm.attr} = {self.op_ctor(it.norm)}" + _comment(it.norm.op.span, "fullflow: one shared valve for every branch"), it.norm.op.span)
                        for b in it.branches:
                            self.w(f"self.{b.attr} = {b.cls}()" + _comment(b.br.span, ("fullflow" if it.ff.name == "fullflow" else f"fullflow {it.ff.name}") + f": prechamber {b.br.name}"), b.br.span)
            self.w()
            self.w("def forward(self, x, rope, cache, aux):")
            with self.out.indent():
                for it in sp.items:
                    if isinstance(it, OpPlan):
                        self.w(f"x = {self.op_call(it, 'self', 'x')}" + _comment(it.op.span, self.op_phrase(it.op, "stage")), it.op.span)
                    elif isinstance(it, BranchPlan):
                        self.branch_line([it], "x", it.br.span, f"{it.br.name}: {merge_phrase(it.br)}")
                    else:
                        inp = "x"
                        if it.norm is not None:
                            self.w(f"h = self.{it.norm.attr}(x)" + _comment(it.norm.op.span, "fullflow: one shared valve"), it.norm.op.span)
                            inp = "h"
                        self.branch_line(it.branches, inp, it.ff.span, "full flow: every branch reads the same state, one junction")
                self.w("return x")
        self.out.blank(2)

    def branch_line(self, branches: list[BranchPlan], inp: str, span, phrase: str) -> None:
        dumped = [b for b in branches if b.br.overboard]
        merged = [b for b in branches if not b.br.overboard]
        for b in dumped:
            args = ", ".join([inp + (".detach()" if b.br.detach else "")] + self.branch_params(b)[1:])
            self.w(f"self.{b.attr}({args})" + _comment(b.br.span, f"{b.br.name}: {merge_phrase(b.br)}"), b.br.span)
        if merged:
            self.w(self.merge_line(merged, inp) + _comment(span, phrase), span)

    # --- startup: the optimizer and the schedule ------------------------------------------
    def startup(self) -> None:
        s = self.e.startup
        sch = s.schedule
        self.w("def learning_rate(step):")
        with self.out.indent():
            desc = f"warmup for {s.warmup} steps, then " if s.warmup else ""
            if sch.steps is None or sch.kind == "constant":
                desc += f"constant at {num(sch.lr)}"
            else:
                desc += f"{sch.kind} from {num(sch.lr)} to {num(sch.min_lr)} by step {sch.steps}"
            self.w(f'"""The throttle: {desc}."""')
            if s.warmup:
                self.w(f"if step < {num(s.warmup)}:  # the open-loop start sequence")
                with self.out.indent():
                    self.w(f"return {num(sch.lr)} * (step + 1) / {num(s.warmup + 1)}")
            if sch.steps is None or sch.kind == "constant":
                self.w(f"return {num(sch.lr)}")
            else:
                self.w(f"if step >= {num(sch.steps)}:")
                with self.out.indent():
                    self.w(f"return {num(sch.min_lr)}")
                self.w(f"ratio = (step - {num(s.warmup)}) / {num(max(sch.steps - s.warmup, 1))}")
                if sch.kind == "cosine":
                    self.w(f"return {num(sch.min_lr)} + 0.5 * (1.0 + math.cos(math.pi * ratio)) * ({num(sch.lr)} - {num(sch.min_lr)})")
                else:
                    self.w(f"return {num(sch.lr)} + ratio * ({num(sch.min_lr)} - {num(sch.lr)})")
        self.out.blank(2)

    # --- the model ----------------------------------------------------------------------
    def model(self) -> None:
        e, p = self.e, self.p
        overboard: list[tuple[str, float | None]] = []
        for sp in p.stages:
            for i in range(sp.first, sp.first + sp.stage.repeat):
                for b in sp.branches():
                    if b.br.overboard:
                        overboard.append((f"stages.{i}.{b.attr}", b.br.loss))
        if overboard:
            self.w("# overboard branches: their exhaust leaves the engine and is never merged")
            self.w(f"OVERBOARD = {tuple(k for k, _ in overboard)!r}")
            losses = [(k, w) for k, w in overboard if w is not None]
            self.w("# those that are auxiliary next-token heads: name -> weight of their loss")
            self.w("OVERBOARD_LOSS = {" + ", ".join(f"{k!r}: {num(w)}" for k, w in losses) + "}")
            self.out.blank(2)
        keyed = sorted({p.turbine_classes[k] for k in p.turbine_order if k[0] == "moe" and k[3]})
        keyed += [b.cls for sp in p.stages for b in sp.branches() if b.br.overboard]

        self.w("class Model(nn.Module):")
        with self.out.indent():
            self.w(f'"""The engine {e.name} ({p.file}): feed, stages, nozzle."""')
            self.w()
            self.w("def __init__(self, config=None):")
            with self.out.indent():
                self.w("super().__init__()")
                self.w("self.config = config = config or Config()")
                self.w("self.feed = Feed(config)" + _comment(e.feed.span, "tanks and pumps"), e.feed.span)
                parts = []
                for sp in p.stages:
                    parts.append(f"[{sp.cls}() for _ in range({sp.stage.repeat})]" if sp.stage.repeat > 1 else f"[{sp.cls}()]")
                self.w("self.stages = nn.ModuleList(" + (" + ".join(parts) if parts else "") + ")  # one entry per stage instance")
                for it in p.main:
                    if isinstance(it, OpPlan):
                        self.w(f"self.{it.attr} = {self.op_ctor(it)}" + _comment(it.op.span, self.op_phrase(it.op, "engine")), it.op.span)
                for k, (dims, base) in enumerate(p.ropes):
                    pre = "rope" if len(p.ropes) == 1 else f"rope{k}"
                    self.w(f"cos, sin = rotary_tables(config.context, {num(dims)}, {num(base)})")
                    self.w(f'self.register_buffer("{pre}_cos", cos, persistent=False)  # (context, {dims})')
                    self.w(f'self.register_buffer("{pre}_sin", sin, persistent=False)')
                nz = e.nozzle
                if nz.tied:
                    if nz.bias:
                        self.w(f"self.head_bias = nn.Parameter(torch.zeros({num(nz.vocab)}))" + _comment(nz.span, "nozzle: tied to the feed"), nz.span)
                else:
                    self.w(f"self.head = nn.Linear({num(nz.width)}, config.vocab_size, bias={num(nz.bias)})" + _comment(nz.span, "the nozzle"), nz.span)
                if keyed:
                    self.w("for name, module in self.named_modules():  # auxiliary outputs are filed under their module's name")
                    with self.out.indent():
                        self.w(f"if isinstance(module, ({', '.join(keyed)},)):")
                        with self.out.indent():
                            self.w("module.key = name")
                self.w("self.aux_losses = {}")
                if overboard:
                    self.w("self.exhaust = {}")
                self.w("self.reset_parameters()")
            self.w()
            self.reset_parameters()
            self.w()
            self.forward()
            self.w()
            self.optimizer()
            self.w()
            self.generate()

    def reset_parameters(self) -> None:
        e, p = self.e, self.p
        init = e.startup.init
        self.w("@torch.no_grad()")
        self.w("def reset_parameters(self):")
        with self.out.indent():
            if init.kind == "normal":
                self.w(f'"""Chill-down: weights normal(0, {num(init.std)}), biases zero (GPT-2); then the merges\' own rules."""')
            else:
                self.w('"""Chill-down: xavier_uniform weights, biases zero, embeddings normal(0, width**-0.5);')
                self.w('then the merges\' own rules."""')
            self.w("for module in self.modules():")
            with self.out.indent():
                self.w("if isinstance(module, nn.Linear):")
                with self.out.indent():
                    if init.kind == "normal":
                        self.w(f"nn.init.normal_(module.weight, mean=0.0, std={num(init.std)})")
                    else:
                        self.w("nn.init.xavier_uniform_(module.weight)")
                    self.w("if module.bias is not None:")
                    with self.out.indent():
                        self.w("nn.init.zeros_(module.bias)")
                self.w("elif isinstance(module, nn.Embedding):")
                with self.out.indent():
                    if init.kind == "normal":
                        self.w(f"nn.init.normal_(module.weight, mean=0.0, std={num(init.std)})")
                    else:
                        self.w("nn.init.normal_(module.weight, mean=0.0, std=module.embedding_dim**-0.5)")
            if e.nozzle.tied and e.nozzle.bias:
                self.w("nn.init.zeros_(self.head_bias)")
            for sp in p.stages:
                lines: list[str] = []
                for b in sp.branches():
                    lines += self.branch_init(b)
                if not lines:
                    continue
                if sp.stage.repeat > 1:
                    self.w(f"for stage in self.stages[{sp.first}:{sp.first + sp.stage.repeat}]:" + _comment(sp.stage.span, f"stage {sp.stage.name}"))
                    with self.out.indent():
                        for ln in lines:
                            self.w(ln)
                else:
                    self.w(f"stage = self.stages[{sp.first}]" + _comment(sp.stage.span, f"stage {sp.stage.name}"))
                    for ln in lines:
                        self.w(ln)

    def branch_init(self, b: BranchPlan) -> list[str]:
        m = b.br.merge
        pre = f"stage.{b.attr}"
        out = []
        if isinstance(m, ir.CoolingMerge):
            last = [o for o in b.ops if isinstance(o.op, (ir.Attention, ir.Mlp, ir.Moe, ir.Linear))]
            if last:
                o = last[-1]
                std = num(m.std)
                out.append(f"# cooling: the output projection starts at {num(m.base)} / sqrt({m.merges}) (GPT-2's scaled init)")
                if isinstance(o.op, ir.Moe):
                    out.append(f"for expert in {pre}.{o.attr}.experts:")
                    out.append(f"    nn.init.normal_(expert.proj.weight, mean=0.0, std={std})")
                elif isinstance(o.op, ir.Linear):
                    out.append(f"nn.init.normal_({pre}.{o.attr}.weight, mean=0.0, std={std})")
                else:
                    out.append(f"nn.init.normal_({pre}.{o.attr}.proj.weight, mean=0.0, std={std})")
        elif isinstance(m, ir.DeepnormMerge):
            beta = num(m.beta)
            out.append(f"# deepnorm: v, the output projection and the reactor start with gain beta = (8N)^-1/4, N = {m.layers} (DeepNet)")
            for o in b.ops:
                a = f"{pre}.{o.attr}"
                if isinstance(o.op, ir.Attention):
                    q = o.op.heads * o.op.head_dim
                    kv = o.op.kv_heads * o.op.head_dim
                    out.append(f"{a}.qkv.weight[{q + kv}:].mul_({beta})  # v")
                    out.append(f"{a}.proj.weight.mul_({beta})")
                elif isinstance(o.op, ir.Mlp):
                    out.append(f"{a}.fc.weight.mul_({beta})")
                    out.append(f"{a}.proj.weight.mul_({beta})")
                elif isinstance(o.op, ir.Moe):
                    out.append(f"for expert in {a}.experts:")
                    out.append(f"    expert.fc.weight.mul_({beta})")
                    out.append(f"    expert.proj.weight.mul_({beta})")
                elif isinstance(o.op, ir.Linear):
                    out.append(f"{a}.weight.mul_({beta})")
        elif isinstance(m, ir.GateMerge):
            out.append(f"nn.init.constant_({pre}.gate.bias, {num(m.bias)})  # the gate starts mostly shut")
        return out

    def forward(self) -> None:
        e, p = self.e, self.p
        self.w("def forward(self, idx, targets=None" + (", cache=None" if p.causal else "") + "):")
        with self.out.indent():
            self.w('"""idx: (B, T) token ids; targets: (B, T) next tokens (-1: ignored).')
            self.w("Returns logits (B, T, vocab), or (logits, loss) with every auxiliary loss added.")
            self.w('"""')
            self.w("B, T = idx.size()")
            if p.causal:
                self.w("past = 0 if cache is None else cache.pos")
            else:
                self.w("past = 0")
            self.w("if past + T > self.config.context:")
            with self.out.indent():
                self.w('raise ValueError(f"{past + T} positions exceed the context of {self.config.context}")')
            if p.causal:
                self.w("if cache is not None and cache.length is None:")
                with self.out.indent():
                    self.w("cache.length = self.config.context  # reserve the whole context once")
            if not p.causal:
                self.w("cache = None  # the throat is open: nothing to cache")
            self.w("x = self.feed(idx, past)  # (B, T, C)")
            if p.ropes:
                pairs = []
                for k in range(len(p.ropes)):
                    pre = "rope" if len(p.ropes) == 1 else f"rope{k}"
                    pairs.append(f"(self.{pre}_cos[past : past + T], self.{pre}_sin[past : past + T])")
                self.w("rope = [" + ", ".join(pairs) + "]  # (T, dims) each")
            else:
                self.w("rope = None")
            self.w("aux = {}")
            for it in p.main:
                if isinstance(it, StagePlan):
                    st = it.stage
                    if st.repeat > 1:
                        self.w(f"for stage in self.stages[{it.first}:{it.first + st.repeat}]:" + _comment(st.span, f"stage {st.name} x{st.repeat}"), st.span)
                        with self.out.indent():
                            self.w("x = stage(x, rope, cache, aux)")
                    else:
                        self.w(f"x = self.stages[{it.first}](x, rope, cache, aux)" + _comment(st.span, f"stage {st.name}"), st.span)
                else:
                    self.w(f"x = {self.op_call(it, 'self', 'x')}" + _comment(it.op.span, self.op_phrase(it.op, "engine")), it.op.span)
            nz = e.nozzle
            if nz.tied:
                b = ", self.head_bias" if nz.bias else ""
                self.w(f"logits = F.linear(x, self.feed.tok.weight{b})  # (B, T, vocab): the nozzle, tied to the feed", nz.span)
            else:
                self.w("logits = self.head(x)  # (B, T, vocab)", nz.span)
            if p.causal:
                self.w("if cache is not None:")
                with self.out.indent():
                    self.w("cache.pos += T")
            has_overboard = any(b.br.overboard for sp in p.stages for b in sp.branches())
            if has_overboard:
                self.w("self.exhaust = {name: aux.pop(name) for name in OVERBOARD}")
                self.w("losses = aux  # MoE balance losses, already weighted")
                self.w("if targets is not None:")
                with self.out.indent():
                    self.w("for name, weight in OVERBOARD_LOSS.items():  # auxiliary next-token heads")
                    with self.out.indent():
                        self.w("head = self.exhaust[name]")
                        self.w("losses[name] = weight * NextTokenLoss.apply(head.view(-1, head.size(-1)), targets.reshape(-1))")
                self.w("self.aux_losses = losses")
            else:
                self.w("self.aux_losses = aux")
            self.w("if targets is None:")
            with self.out.indent():
                self.w("return logits")
            self.w("loss = NextTokenLoss.apply(logits.view(-1, logits.size(-1)), targets.reshape(-1))  # F.cross_entropy, ignore_index=-1")
            self.w("for value in self.aux_losses.values():")
            with self.out.indent():
                self.w("loss = loss + value")
            self.w("return logits, loss")

    def optimizer(self) -> None:
        s = self.e.startup
        self.w("def configure_optimizer(self):")
        with self.out.indent():
            self.w('"""AdamW from the startup block, with a LambdaLR stepping `learning_rate`.')
            self.w("Matrices decay; biases, norms and gains do not (nanoGPT). Returns (optimizer, scheduler).")
            self.w('"""')
            self.w("params = [p for p in self.parameters() if p.requires_grad]")
            self.w("groups = [")
            with self.out.indent():
                self.w(f'{{"params": [p for p in params if p.dim() >= 2], "weight_decay": {num(s.decay)}}},')
                self.w('{"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},')
            self.w("]")
            lr = s.schedule.lr
            self.w(f"optimizer = torch.optim.AdamW(groups, lr={num(lr)}, betas=({num(s.betas[0])}, {num(s.betas[1])}))  # betas: the POGO accumulator")
            self.w(f"scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate(step) / {num(lr if lr > 0 else 1.0)})")
            self.w("return optimizer, scheduler")
        self.w()
        self.w("def clip_gradients(self):")
        with self.out.indent():
            if s.clip is not None:
                self.w(f'"""The restrictor orifice: clip the global gradient norm at {num(s.clip)}; returns the norm."""')
                self.w(f"return torch.nn.utils.clip_grad_norm_(self.parameters(), {num(s.clip)})")
            else:
                self.w('"""The spec sets no clip: nothing to do."""')
                self.w("return None")

    def generate(self) -> None:
        p = self.p
        self.w("@torch.no_grad()")
        self.w("def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None" + (", use_cache=True" if p.causal else "") + "):")
        with self.out.indent():
            if not p.causal:
                self.w('"""Not available: the throat is open, so every position sees the future."""')
                self.w("raise RuntimeError(")
                with self.out.indent():
                    self.w('"generate() needs a causal engine: this one has \'throat open\', so each position "')
                    self.w('"depends on later ones and there is no next token to sample; use \'throat causal\'"')
                self.w(")")
                return
            self.w('"""Append max_new_tokens sampled tokens to idx (B, T). temperature=0 is greedy.')
            self.w()
            self.w("With the cache each step feeds only the new token. Past the context, the cache")
            self.w("restarts on the latest `context` tokens, so the result equals use_cache=False.")
            self.w('"""')
            self.w("context = self.config.context")
            self.w("cache = None")
            self.w("for _ in range(max_new_tokens):")
            with self.out.indent():
                self.w("if not use_cache:")
                with self.out.indent():
                    self.w("logits = self(idx[:, -context:])")
                self.w("elif cache is None or cache.pos >= context:")
                with self.out.indent():
                    self.w("cache = Cache(context)")
                    self.w("logits = self(idx[:, -context:], cache=cache)")
                self.w("else:")
                with self.out.indent():
                    self.w("logits = self(idx[:, -1:], cache=cache)")
                self.w("logits = logits[:, -1, :]  # (B, vocab)")
                self.w("if temperature == 0:")
                with self.out.indent():
                    self.w("nxt = logits.argmax(dim=-1, keepdim=True)")
                self.w("else:")
                with self.out.indent():
                    self.w("logits = logits / temperature")
                    self.w("if top_k is not None:")
                    with self.out.indent():
                        self.w("v, _ = torch.topk(logits, min(top_k, logits.size(-1)))")
                        self.w('logits[logits < v[:, [-1]]] = -float("inf")')
                    self.w("nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)  # (B, 1)")
                self.w("idx = torch.cat((idx, nxt), dim=1)")
            self.w("return idx")


# --- entry points ----------------------------------------------------------------------------


def _engine_spec(spec) -> ir.Spec:
    from ... import to_spec
    from ...diagnostics import CycleError, Diagnostic

    s = to_spec(spec)
    if s.engine is None:
        raise CycleError([Diagnostic("E0213", "error", "this spec defines no engine to build (only templates)", s.span,
                                     "add an engine, or include this file from a spec that has one")])
    return s


def lower(spec) -> tuple[str, list[tuple[int, ir.Span]]]:
    """The generated source and its source map: (output line, spec span) pairs."""
    lw = Lowering(_engine_spec(spec))
    text = lw.source()
    return text, lw.out.source_map


def codegen(spec) -> str:
    """Standalone PyTorch source for a spec (a path, spec text or a resolved IR)."""
    return lower(spec)[0]
