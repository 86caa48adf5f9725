"""Lower the IR to one standalone PyTorch source file.

`codegen(spec) -> str` (and `lower(spec)`, which also returns the source map and the
name map) is the only lowering in the torch back-end: `build()` compiles and
executes exactly this text, so the in-process module and the file
`cyclec build -o model.py` writes cannot drift apart. The generated file imports
only torch and the standard library and reads like nanoGPT's model.py: a config
dataclass that holds every size (`config.py`: each module is built from it), one
class per stage (a branch gets a class only where it is more than a short chain of
ops and a merge; otherwise its ops sit in an nn.ModuleDict and the stage's residual
line calls them), specialised turbine classes, shape comments, and a straight-line
forward pass; nothing interprets the IR at run time. By default the file is the model
only (the config, the blocks, the model, `generate`); `fast` adds the fused loss, the
token lookup's and the MoE's custom ops in a runtime section at the end, `parallel`
the tensor-parallel plan and `parallelize`; `comments` picks the comments. The output
is a pure function of the IR (no timestamps, no absolute paths, no hash-order
iteration), so golden files hold. It takes an
`ir.Spec` only (`cyclelang.codegen` is the façade that accepts paths and text).

The lowering, by concern
------------------------
    plan.py        every name and variant decided before a line is written
    config.py      the Config: every size a field, derived values as properties, checks
    emitters.py    the op emitters' table, keyed by IR class: ops.py (norm, linear,
                   mlp, pool), attention.py, moe.py (and the experts' custom op)
    merges.py      the merge emitters' table: own parameters, junction, init rule
    stages.py      branch and stage classes;  model.py: the schedule and `Model`
    runtime/       what the file runs besides its classes (loss, positions, masks,
                   the KV cache, the experts' op), real modules inlined as text
    writer.py      the line writer and the literals

Parameter names (stable: the interop loaders and the test stand rely on them)
-----------------------------------------------------------------------------
Every module path is its part's path in `cyclelang/ir/layout.py`, the one naming
authority (the plan takes each attribute from there); the scheme, in short:

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
nn.Module attributes (`forward`, `train`, `_modules`): `ir.layout` mangles them by
appending `_` (a leading `_` gets an `x` in front), and makes them unique in their
scope the same way, so no spec name can change what the code does.

Semantics the generated code fixes (documented where they are chosen)
-----------------------------------------------------------------------
- Rotary positions use the rotate-half layout (GPT-NeoX, Llama) on the first
  rotary_dims of each head; tables are computed once per (dims, base).
- MoE routes with softmax (in float32 at least, as Mixtral does) then top-k
  (weights renormalised over the chosen experts when top > 1). Capacity is a training-time restrictor orifice:
  assignments beyond ceil(capacity * tokens * top / experts) per expert are
  dropped, first choices before second choices (GShard). In eval mode routing
  is dropless, so the causal throat holds and the KV cache is exact. The
  balance loss is the Switch Transformer's: balance * experts * sum_e f_e * P_e.
  Eager mode gathers each expert's tokens exactly (one host sync for the counts).
  Under torch.compile the router's softmax, the routing, the experts, their
  weighted sum and the balance loss run in one custom op (`routed_experts` around
  the experts' `expert_mlps`, runtime/experts.py) that reads the counts itself and
  has a hand-written backward: the model is one graph (fullgraph=True), inductor
  generates no kernels for the routing, and no expert computes padding.
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

from dataclasses import dataclass

from ... import ir
from ...diagnostics import CycleError, Diagnostic
from .emitters import emitter, emitter_for
from .merges import merge_emitter
from .model import learning_rate, model_class, uses_math
from .moe import expert_ops
from .plan import Plan, make_plan
from .runtime import cache_class, definition, digest, reads
from .stages import classes, inline
from .config import literal
from .writer import COMMENT_MODES, COMMENTS, Writer, doc_tag, num

__all__ = ["Lowered", "codegen", "engine_spec", "lower", "make_plan"]

# The runtime definitions the file may inline before its classes, in the order they appear.
HELPERS = ("sinusoids", "rotary_tables", "scaled_rotary_tables", "query_temperature", "alibi_slopes", "apply_rotary", "apply_rotary_partial", "apply_rotary_interleaved", "apply_rotary_spread",
           "causal_mask", "sliding_mask", "padded_mask", "OffsetRMSNorm", "OffsetLayerNorm", "ScalarGain", "HeadNorm", "ssd_scan", "gated_rms_norm", "linear_scan",
           "selective_scan", "gated_delta_scan", "HyperConnection", "ManifoldConnection")
# The runtime definitions of the parallel section (`cyclec build --parallel`), inlined together:
# one may call another (compile_model calls start_cpu_probe).
PARALLEL = ("unshard_rows", "apply_parallel_plan", "compile_model", "start_cpu_probe", "compiled_graphs")


@dataclass(frozen=True)
class Lowered:
    """What `lower` returns.

    source: the generated file. source_map: (output line, spec span) pairs, for tools that
    point back at the spec. names: layout part path -> the class that builds that part in
    the generated file, for every part that is a module or a parameter of the model:
    a generated class (`"stages.0-11": "Block"`, a branch's class where it has one,
    `"stages.0-11.mix.attn": "Attention"`, `"feed": "Feed"`) or torch's (`"nn.LayerNorm"`,
    `"nn.Linear"`, `"nn.Parameter"` for a rezero or layerscale merge's scale). A merge
    without parameters shares its branch's path and is not listed; nor is a tied head,
    which reuses the feed's embedding (its bias, if any, is the model's `head_bias`)."""

    source: str
    source_map: list[tuple[int, ir.Span]]
    names: dict[str, str]


class Lowering:
    """One file for one engine: the plan first, then what the file needs (runtime helpers,
    the experts' ops, `math`), then the text, section by section."""

    def __init__(self, spec: ir.Spec, fast: bool = False, comments: str = "ml", parallel: bool = False):
        if comments not in COMMENT_MODES:
            raise ValueError(f"comments must be one of {', '.join(COMMENT_MODES)}, not {comments!r}")
        self.e, self.fast, self.comments, self.parallel = spec.engine, fast, comments, parallel
        self.p: Plan = make_plan(spec)
        self.p.fast = fast
        self.out = Writer()
        ops = list(self.p.ops())
        self.helpers = self.runtime(ops)
        self.acts = sorted({o.op.act for o in ops if isinstance(o.op, ir.Moe)} - {"swiglu_clamp"}) if fast else []  # gpt-oss's: no custom op
        # decided before the header is written: every piece says whether it reads `math`
        self.math = (any(reads(h, "math") for h in self.helpers) or any(emitter(o.op).needs_math(o.op) for o in ops)
                     or uses_math(self.p) or any("math." in r.formula() for r in self.p.sizes.props()))

    def runtime(self, ops) -> list[str]:
        """The helper definitions the file needs, in file order (the fast ones go in `fast_runtime`)."""
        want = {"sinusoids"} if self.e.feed.position == "sinusoidal" else set()
        for o in ops:
            want.update(emitter(o.op).runtime(o.op, self.p.causal))
        hyper = ir.chamber_streams(self.e.body)  # hyper-connections: their junction's class
        if hyper is not None:
            want.add("ManifoldConnection" if hyper.connections == "manifold" else "HyperConnection")
        return [h for h in HELPERS if h in want]

    def source(self) -> str:
        token = COMMENTS.set(self.comments)
        try:
            return self._source()
        finally:
            COMMENTS.reset(token)

    def _source(self) -> str:
        p, out = self.p, self.out
        self.header()
        for name in self.helpers:
            out.block(definition(name))
            out.blank(2)
        self.config()
        self.feed()
        for v, name in p.turbine_classes.items():
            emitter_for(v.kind).class_text(out, name, v, p)
            out.blank(2)
        if p.causal:
            out.block(cache_class({k for o in p.ops() for k in emitter(o.op).cache_states(o.op)}))
            out.blank(2)
        classes(out, p)
        learning_rate(out, p)
        model_class(out, p)
        if self.parallel:
            self.parallel_plan()
        if self.fast:
            self.fast_runtime()
        return out.text()

    def parallel_plan(self) -> None:
        """TP_PLAN from the kinds' records (`tp`), the runtime that applies it, and `parallelize`
        (`cyclec build --parallel`; `cyclec train` asks for it)."""
        out, w = self.out, self.out.line
        out.blank(2)
        w("# How tensor parallelism splits each part (the kinds' `tp`, cyclelang/ir/kinds.py); every")
        w("# part not listed is replicated. See `parallelize`.")
        plan = [(part.path, rule) for part in self.p.layout.parts() if (rule := part.kind.tp_of(part.node)) != "replicate"]
        if plan:
            w("TP_PLAN = {")
            with out.indent():
                for path, rule in plan:
                    w(f'"{path}": "{rule}",')  # layout paths and rule words: plain identifiers, dots and digits
            w("}")
        else:
            w("TP_PLAN = {}")
        out.blank(2)
        for name in PARALLEL:
            out.block(definition(name))
            out.blank(2)
        out.block('''
def parallelize(model, mesh, *, fsdp=True, tp=False, checkpointing="none", compile=False):
    """Shard a Model over a DeviceMesh with torch.distributed: FSDP2 per stage instance and on
    the root, tensor parallelism by TP_PLAN, activation checkpointing per stage ("none",
    "stage", "selective"); then compile ("regional" or True: each kind of stage once, "whole":
    one graph) in place, after fully_shard. See apply_parallel_plan and compile_model."""
    apply_parallel_plan(model, mesh, TP_PLAN, fsdp=fsdp, tp=tp, checkpointing=checkpointing, compile=bool(compile))
    if compile:
        compile_model(model, "regional" if compile is True else compile)
    return model''')

    def token_op(self) -> bool:
        """Whether the Feed's token lookup is the runtime's `lookup` (a custom op under
        torch.compile): in the fast form, with an untied head. The op saves inductor two C++
        kernels; a tied head's gradient (the sum of the two) would cost one back."""
        return self.p.fast and not self.e.nozzle.tied

    def fast_runtime(self) -> None:
        """The performance pieces of `--fast`, after everything a reader needs: the model reads
        them only when it runs (the loss, and the MoE's experts under torch.compile)."""
        out = self.out
        out.blank(2)
        out.block("""
# ====================================================================================
# Runtime: performance pieces (cyclec build --fast; cyclec train asks for them).
# next_token_loss is F.cross_entropy(logits.float(), targets, ignore_index=-1)
# through the softmax, with a one-pass backward; lookup (with an untied head) is an
# nn.Embedding's lookup, a custom op under torch.compile; the MoE's custom ops run its
# routing and experts as one opaque op under torch.compile. Nothing above needs reading
# them to follow the model.
# ====================================================================================""")
        out.blank(2)
        out.block(definition("next_token_loss_op"))
        out.blank(2)
        out.line('next_token_loss = next_token_loss_op("next_token_loss")')
        out.blank(2)
        if self.token_op():
            out.block(definition("table_lookup"))
            out.blank(2)
            out.line(f'lookup = table_lookup("lookup_{digest(definition("table_lookup"))}")')
            out.blank(2)
        expert_ops(out, self.acts)

    def header(self) -> None:
        e, p, w = self.e, self.p, self.out.line
        w(f'"""{e.name}: a PyTorch model generated by cyclec from {p.file}.')
        w()
        w("Every size is a field of `Config`: change it there, or edit this file freely. It")
        w("imports only torch and the standard library; `Model` is the model, `Model.generate`")
        w("samples from it" + (" with a KV cache (valid because attention is causal)." if p.causal else " (only for causal models; this one is bidirectional)."))
        w("Parameter names: stages.{i}.{branch}.{op}.{param} (cyclelang/backends/torch/codegen.py).")
        w('"""')
        w()
        if self.math:
            w("import math")
        self.out.block("""
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F""")
        self.out.blank(2)

    def config(self) -> None:
        e, w, sz = self.e, self.out.line, self.p.sizes
        w("@dataclass")
        w("class Config:")
        with self.out.indent():
            w('"""Every size of the model: each module is built from these, so a smaller or larger')
            depth = next((f", {sp.n.name}=2" for sp in self.p.all_stages() if sp.n is not None), "")
            w(f"model is a different Config (`Model(Config(width={e.width // 2}{depth}))`). Defaults are the")
            w('spec\'s; __post_init__ refuses sizes that break the spec\'s own constraints."""')
            w()
            w(f"vocab_size: int = {num(e.feed.vocab)}  # tokens in the vocabulary")
            w(f"context: int = {num(e.feed.context)}  # the longest sequence (positions, rotary tables, the KV cache)")
            w(f"width: int = {num(e.width)}  # residual-stream width (d_model)")
            for r in sz.fields():
                typ = "float" if r.typ == "float" else "int"
                w(f"{r.name}: {typ} = {literal(r)}  # {r.doc}")
            schedule = {r.name for r in self.p.schedule.values()}  # warmup_steps may be 0
            counts = ["vocab_size", "context", "width"] + [r.name for r in sz.fields() if r.typ == "int" and r.name not in schedule]
            w()
            w("def __post_init__(self):")
            with self.out.indent():
                w('"""The spec\'s constraints, checked for these sizes."""')
                w(f"for name in {tuple(counts)!r}:")
                with self.out.indent():
                    self.out.nested("if getattr(self, name) < 1:", 'raise ValueError(f"Config: {name} ({getattr(self, name)}) must be at least 1")')
                for cond, msg in sz.check_lines():
                    self.out.nested(f"if not ({cond}):", f'raise ValueError(f"Config: {msg}")')
            for r in sz.props():
                w()
                w("@property")
                w(f"def {r.name}(self):")
                with self.out.indent():
                    w(f'"""{r.doc[:1].upper() + r.doc[1:]} (the spec: {num(r.value)})."""')
                    w(f"return {r.formula()}")
        self.out.blank(2)

    def feed(self) -> None:
        f, w, out = self.e.feed, self.out.line, self.out
        w("class Feed(nn.Module):")
        with out.indent():
            pos = {"learned": "learned positions", "sinusoidal": "sinusoidal positions", "none": "no positions (they come from rotary, or not at all)"}[f.position]
            w(f'"""Token embedding plus {pos}{doc_tag(f.span, "tanks and pumps")}."""')
            w()
            with out.constructor("config"):
                if f.padding is not None:
                    w(f"self.tok = nn.Embedding(config.vocab_size, config.width, padding_idx={num(f.padding)})  # the padding token gets no gradient")
                else:
                    w("self.tok = nn.Embedding(config.vocab_size, config.width)")
                if f.position == "learned":
                    w("self.pos = nn.Embedding(config.context, config.width)")
                elif f.position == "sinusoidal":
                    w('self.register_buffer("pos", sinusoids(config.context, config.width), persistent=False)')
                if f.scale != 1.0:
                    w(f"self.scale = {self.p.feed_args['scale']}")
                if f.dropout > 0:
                    w(f"self.drop = nn.Dropout({self.p.feed_args['dropout']})")
                if f.per_layer:  # Gemma 4: each layer's own small input
                    pad = f", padding_idx={num(f.padding)}" if f.padding is not None else ""
                    w(f"self.per_layer_tok = nn.Embedding({num(f.per_layer_vocab)}, {num(f.per_layer_layers)} * {num(f.per_layer)}{pad})  # every layer's per-layer table, side by side")
                    w(f"self.per_layer_proj = nn.Linear(config.width, {num(f.per_layer_layers)} * {num(f.per_layer)}, bias=False)  # the embedding, projected to every layer's")
                    w(f"self.per_layer_norm = nn.RMSNorm({num(f.per_layer)}, eps={num(f.per_layer_eps)})  # one norm, shared by the layers")
            w()
            w("def forward(self, idx):" if f.position == "none" else "def forward(self, idx, past, pos=None):")
            with out.indent():
                opaque = self.token_op()
                tok = "lookup(self.tok, idx)" if opaque else "self.tok(idx)"
                tok = tok if f.scale == 1.0 else f"{tok} * self.scale"
                shape = "# (B, T, C): the token lookup, a custom op under torch.compile (runtime section)" if opaque else "# (B, T, C)"
                if f.position == "none" and not f.dropout and not f.per_layer:
                    w(f"return {tok}  {shape}")
                    return out.blank(2)
                if f.position == "none":
                    w(f"x = {tok}  {shape}")
                else:
                    w("T = idx.size(1)")
                    if f.position == "learned":
                        w("if pos is None:  # else (B, T): each row's own positions (a padded batch)")
                        with out.indent():
                            w("pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device)  # (T,)")
                        w(f"x = {tok} + self.pos(pos)  {shape}")
                    else:
                        w(f"x = {tok} + (self.pos[past : past + T] if pos is None else self.pos[pos])  {shape}")
                if f.dropout > 0:
                    w("x = self.drop(x)")
                if f.per_layer:
                    L, P = num(f.per_layer_layers), num(f.per_layer)
                    w(f"proj = self.per_layer_norm((self.per_layer_proj(x) * {num(f.width ** -0.5)}).view(*idx.shape, {L}, {P}))  # (B, T, layers, {P})")
                    w(f"tok = self.per_layer_tok(idx).view(*idx.shape, {L}, {P}) * {num(f.per_layer ** 0.5)}")
                    w(f"return x, (proj + tok) * {num(2 ** -0.5)}  # the per-layer inputs, (B, T, layers, {P})")
                else:
                    w("return x")
        out.blank(2)

    def names(self) -> dict[str, str]:
        p = self.p
        out = {"feed": "Feed"}
        for sp in p.groups:
            out[sp.path] = sp.cls
        for sp in p.stages:
            out[sp.path] = sp.cls
            for b in sp.branches():
                out[b.path] = "nn.ModuleDict" if inline(b) else b.cls
                m = b.br.merge
                if m is not None and merge_emitter(m).module:
                    out[b.merge.path] = merge_emitter(m).module_of(m)
        for o in p.ops():
            out[o.path] = emitter(o.op).module(o)
        if not self.e.nozzle.tied:
            out[p.layout.nozzle.path] = "nn.Linear"
        return out


# --- entry points ----------------------------------------------------------------------------


def engine_spec(spec) -> ir.Spec:
    """The spec, checked: an `ir.Spec` (TypeError otherwise) with an engine (E0213 otherwise)."""
    if not isinstance(spec, ir.Spec):
        raise TypeError(f"the torch back-end takes an ir.Spec, not {type(spec).__name__} "
                        "(cyclelang.codegen and cyclelang.build accept paths and spec text)")
    if spec.engine is None:
        raise CycleError([Diagnostic("E0213", "error", "this spec defines no engine to build (only templates)", spec.span,
                                     "add an engine, or include this file from a spec that has one")])
    return ir.validate(spec)  # an IR edited with model_copy skipped its models' checks: nothing unchecked is lowered


def lower(spec: ir.Spec, fast: bool = False, comments: str = "ml", parallel: bool = False) -> Lowered:
    """The generated source, its source map and its name map (see `Lowered`)."""
    lw = Lowering(engine_spec(spec), fast=fast, comments=comments, parallel=parallel)
    text = lw.source()
    return Lowered(text, lw.out.source_map, lw.names())


def codegen(spec: ir.Spec, fast: bool = False, comments: str = "ml", parallel: bool = False) -> str:
    """Standalone PyTorch source for an `ir.Spec`: by default the model only. `fast` adds the
    fused loss and the custom ops of the token lookup and the MoE in a runtime section at the
    end (benchmarks/run.py measures it faster: `cyclec train`, the stand and the benchmarks
    ask for it); `parallel` adds TP_PLAN and `parallelize` (`cyclec train` asks for it);
    `comments` is "ml" (ML words), "both" (and a spec tag) or "none"."""
    return lower(spec, fast=fast, comments=comments, parallel=parallel).source
