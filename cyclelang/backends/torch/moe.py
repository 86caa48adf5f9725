"""The MoE emitter: routed experts, their class, and the custom op torch.compile runs them in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ... import ir
from .ops import MlpVariant, OpEmitter, call_args, hidden_size, if_set
from .records import OpPlan, Plan
from .runtime import definition, digest
from .writer import Writer, doc_tag, num


@dataclass(frozen=True)
class MoeVariant:
    kind: ClassVar[type] = ir.Moe
    base: ClassVar[str] = "Moe"
    act: str
    capacity: bool  # training drops assignments past each expert's capacity
    balance: bool  # returns a load-balancing loss beside its output
    normalize: bool  # the chosen weights are renormalised to sum to 1 (for every top, as Mixtral)
    shared: bool = False  # a shared expert every token visits (Qwen2-MoE)
    shared_gate: bool = False  # ... scaled by sigmoid(w . x)
    router: str = "softmax"  # the scores: softmax, or sigmoid (DeepSeek-V3)
    groups: str = ""  # group-limited top-k, each group scored by "top2" or "max"; "": none
    scale: bool = False  # the chosen weights x routed_scaling_factor
    correction: bool = False  # a selection-only bias per expert (a buffer)
    trim: bool = False  # ... moved toward an even load each training forward
    router_bias: bool = False  # the router's linear has a bias (gpt-oss)
    eps: bool = False  # the sigmoid renormalisation adds normalize_eps, not DeepSeek-V3's 1e-20 (LFM2-MoE's 1e-6)

    @classmethod
    def of(cls, m: ir.Moe, causal: bool) -> "MoeVariant":
        return cls(m.act, m.capacity is not None, m.balance > 0, m.normalize, m.shared > 0, m.shared_gate, m.router,
                   m.group_score if m.groups > 1 else "", m.scale != 1.0, m.correction, m.correction_rate > 0, m.router_bias,
                   m.normalize_eps != 1e-20)

    @property
    def clamped(self) -> bool:
        """Its experts are gpt-oss's clamped SwiGLU (their bound a constructor argument; no custom op: eager gather)."""
        return self.act == "swiglu_clamp"

    @property
    def deepseek(self) -> bool:
        """Routes otherwise than Mixtral's softmax top-k (`ir.Moe.deepseek`)."""
        return self.router != "softmax" or bool(self.groups) or self.scale or self.correction

    @property
    def expert(self) -> MlpVariant:
        """Its experts are mlps of the same activation, without dropout."""
        return MlpVariant(self.act, False)

    inputs: ClassVar[tuple[str, ...]] = ()

    @property
    def aux(self) -> bool:
        """Its forward returns (y, its balance loss)."""
        return self.balance



def expert_ops(out: Writer, acts: list[str]) -> None:
    """For torch.compile: per MoE activation, the experts' custom op and the routed op
    around it (runtime/experts.py).

    An op's name carries a digest of its source, so two builds in one process share an
    op only when its code is the same."""
    if not acts:
        return
    grads = [definition(f"{act}_grad") for act in acts]
    op, choice, routed = definition("expert_mlps"), definition("expert_choice"), definition("routed_experts")
    for text in grads + [op, choice, routed]:
        out.block(text)
        out.blank(2)
    for act, grad in zip(acts, grads):
        experts = f"experts_{act}_{digest(grad, op)}"
        out.line(f'experts_{act} = expert_mlps("{experts}", {act}_grad)')
        out.line(f'routed_{act} = routed_experts("routed_{act}_{digest(grad, op, choice, routed)}", "{experts}", expert_choice)')
    out.blank(2)


class MoeEmitter(OpEmitter):
    variant = MoeVariant

    def sizes(self, m, c, scope):
        width = c.width(m.width, scope)
        experts = c.field("n_expert", m.experts, scope, "experts per MoE layer", let=m.let_of("experts"))
        top = c.field("top_k", m.top, scope, "experts each token is routed to", let=m.let_of("top"))
        c.check(lambda: f"{top.own} <= {experts.own}", lambda: f"{top.name} ({{{top.own}}}) must be at most {experts.name} ({{{experts.own}}}): a token's experts are distinct")
        out = {"width": width, "hidden": hidden_size(c, width, m.width, m.hidden, scope, "expert", "each expert's", m), "experts": experts, "top": top}
        if m.capacity is not None:
            out["capacity"] = c.field("capacity", m.capacity, scope, "training: each expert takes at most capacity x its even share of assignments", "float", let=m.let_of("capacity"))
        if m.shared > 0:
            out["shared"] = c.field("shared_hidden", m.shared, scope, "the shared expert's hidden width (every token visits it)", let=m.let_of("shared"))
        if m.balance > 0:
            out["balance"] = c.field("balance", m.balance, scope, "weight of the load-balancing loss (Switch Transformer)", "float", let=m.let_of("balance"))
        return out

    def ctor(self, o: OpPlan) -> str:
        m, s = o.op, o.args
        opt = {k: str(s[k]) if k in s else None for k in ("capacity", "balance", "shared")}
        route = {"groups": if_set(m.groups, m.groups > 1), "top_groups": if_set(m.top_groups, m.groups > 1), "scale": if_set(m.scale, m.scale != 1.0),
                 "correction_rate": if_set(m.correction_rate, m.correction_rate > 0), "clamp": if_set(m.clamp, m.act == "swiglu_clamp"),
                 "normalize_eps": if_set(m.normalize_eps, m.normalize_eps != 1e-20)}
        return f"{o.cls}({call_args(str(s['width']), hidden=str(s['hidden']), experts=str(s['experts']), top=str(s['top']), bias=num(m.bias), **opt, **route)})"

    def needs_math(self, op) -> bool:
        return op.capacity is not None  # math.ceil of the capacity

    def output_init(self, a, op, std):
        lines = [f"for expert in {a}.experts:", f"    nn.init.normal_(expert.proj.weight, mean=0.0, std={std})"]
        return lines + ([f"nn.init.normal_({a}.shared.proj.weight, mean=0.0, std={std})"] if op.shared else [])

    def deepnorm_init(self, a, op, beta):
        out = [f"for expert in {a}.experts:", f"    expert.fc.weight.mul_({beta})", f"    expert.proj.weight.mul_({beta})"]
        if op.shared:  # the shared expert is an FFN too (its gate, like the router, is not)
            out += [f"{a}.shared.fc.weight.mul_({beta})", f"{a}.shared.proj.weight.mul_({beta})"]
        return out

    def class_text(self, out: Writer, name: str, v: MoeVariant, plan: Plan) -> None:
        w = out.line
        expert = plan.turbine_classes[v.expert]
        w(f"class {name}(nn.Module):")
        with out.indent():
            w(f'"""Mixture of experts, top-k routed{doc_tag(None, "liquid-liquid injector")}.')
            w()
            if v.deepseek:
                self.routing_doc(out, v)
            else:
                w("Each token goes to its top experts (softmax, then top-k" + (", renormalised)." if v.normalize else ")."))
            if v.router_bias or v.clamped:  # gpt-oss
                w("gpt-oss's:" + (" the router's logits are biased (the softmax of the top-k logits is these weights);" if v.router_bias else "")
                  + (" the experts are the clamped SwiGLU." if v.clamped else ""))
            if v.shared:
                w("Every token also visits the shared expert" + (", throttled by sigmoid(w . x)." if v.shared_gate else "."))
            if v.capacity:
                out.block("""
In training, capacity caps each expert at ceil(capacity * tokens * top /
experts) assignments; the overflow is dropped (first choices before second
choices) and the residual line carries those tokens. Eval is dropless, so the
model stays causal and a KV cache is exact.""")
            if v.balance:
                out.block("""
Returns (y, the load-balancing loss), the Switch Transformer's:
balance * experts * sum_e(fraction routed to e * mean router probability of e).""")
            w('"""')
            w()
            optional = [name for name, on in (("capacity", v.capacity), ("balance", v.balance), ("shared", v.shared), ("groups", v.groups),
                                              ("top_groups", v.groups), ("scale", v.scale), ("correction_rate", v.trim), ("clamp", v.clamped),
                                              ("normalize_eps", v.eps)) if on]
            with out.constructor("width", "hidden", "experts", "top", "bias", *optional):
                w("self.top = top")
                for name in optional:
                    if name not in ("shared", "clamp"):
                        w(f"self.{name} = {name}")
                w(f"self.router = nn.Linear(width, experts, bias={v.router_bias})" + ("  # gpt-oss's router has a bias" if v.router_bias else ""))
                if v.correction:
                    w("# per expert, added to the scores for the choice only (DeepSeek-V3's e_score_correction_bias): a buffer, saved")
                    w("# with the weights, that no optimizer moves" + (" (the load rule does: trim)" if v.trim else ""))
                    w('self.register_buffer("correction", torch.zeros(experts, dtype=torch.float32))  # (E,)')
                c = ", clamp" if v.clamped else ""  # gpt-oss's experts: the clamped SwiGLU's bound
                w(f"self.experts = nn.ModuleList([{expert}(width, hidden, bias{c}) for _ in range(experts)])")
                if v.shared:
                    w(f"self.shared = {expert}(width, shared, bias{c})  # the shared expert: every token visits it")
                if v.shared_gate:
                    w("self.shared_gate = nn.Linear(width, 1, bias=False)  # its throttle: sigmoid(w . x)")
            w()
            w(f"def forward(self, {', '.join(['x', *v.inputs])}):")
            with out.indent():
                self.forward(out, v, plan.fast and not v.clamped)  # the clamped SwiGLU has no custom op: the gather, eager
            if v.trim:
                w()
                self.trim_text(out)
            if plan.fast and not v.clamped:
                w()
                self.compiled(out, v, expert)

    def forward(self, out: Writer, v: MoeVariant, fast: bool = True) -> None:
        w = out.line
        out.block("""
B, T, C = x.size()
x = x.reshape(B * T, C)  # (N, C): every token of the batch
E = len(self.experts)
logits = self.router(x)  # (N, E)""")
        if fast:
            w("if torch.compiler.is_compiling() and self.plain_experts():  # one graph: no shape may depend on the routing")
            with out.indent():
                if v.balance:
                    w("y, balance_loss = self.compiled_experts(x, logits)  # (N, C), (): routing, experts and balance loss in a custom op (runtime section)")
                else:
                    w("y = self.compiled_experts(x, logits)[0]  # (N, C): routing and experts in a custom op (runtime section)")
            w("else:")
            with out.indent():
                self.gather(out, v)
        else:
            self.gather(out, v)
        if v.shared:
            w("shared = self.shared(x)  # (N, C): the shared expert, for every token")
            if v.shared_gate:
                w("shared = torch.sigmoid(self.shared_gate(x)) * shared")
            w("y = (y + shared).view(B, T, C)")
        else:
            w("y = y.view(B, T, C)")
        w("return y, balance_loss" if v.balance else "return y")

    def routing_doc(self, out: Writer, v: MoeVariant) -> None:
        w = out.line
        score = "each expert's sigmoid score" if v.router == "sigmoid" else "its softmax probabilities"
        w(f"Each token goes to its top experts (DeepSeek-V3's router): from {score},")
        if v.correction:
            w("plus a per-expert correction bias that steers the choice only,")
        if v.groups:
            part = "the sum of its two best" if v.groups == "top2" else "its best"
            w(f"it keeps its top_groups best groups of experts (a group scored by {part})")
            w("and picks its top experts inside them;")
        else:
            w("it picks its top experts;")
        w("their weights are the unbiased scores" + (", renormalised" if v.normalize else "") + (" (over sum + normalize_eps)" if v.eps else "")
          + (", x scale." if v.scale else "."))
        if v.trim:
            w("In training each forward moves the correction toward an even load (trim).")

    def select(self, out: Writer, v: MoeVariant) -> None:
        """DeepSeek-V3's choice and weights, eager: the custom op's routing computes the same, op for op."""
        w = out.line
        if v.router == "sigmoid":
            w("probs = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))  # (N, E): each expert's own score, in float32 at least")
        else:
            w("probs = F.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))  # (N, E), in float32 at least (as Mixtral routes)")
        w("pick = probs + self.correction  # (N, E): the choice's scores; the bias never reaches a weight" if v.correction else "pick = probs  # (N, E): the choice's scores")
        if v.groups:
            w("banks = pick.view(-1, self.groups, E // self.groups)  # (N, G, E/G): the experts in their groups")
            if v.groups == "top2":
                w("group = banks.topk(2, dim=-1).values.sum(dim=-1)  # (N, G): a group's two best scores, added")
            else:
                w("group = banks.amax(dim=-1)  # (N, G): a group's best score")
            w("kept = torch.zeros_like(group, dtype=torch.bool).scatter_(1, torch.topk(group, self.top_groups, dim=-1).indices, True)  # (N, G)")
            w('pick = pick.masked_fill(~kept.repeat_interleave(E // self.groups, dim=1), float("-inf"))  # the other groups\' experts are out')
        w("choice = torch.topk(pick, self.top, dim=-1).indices  # (N, k)")
        w("weight = probs.gather(-1, choice)  # (N, k): the unbiased scores")
        if v.normalize and v.eps:
            w("weight = weight / (weight.sum(dim=-1, keepdim=True) + self.normalize_eps)  # the renormalisation, over sum + normalize_eps")
        elif v.normalize:
            w("weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)  # DeepSeek-V3's renormalisation" if v.router == "sigmoid"
              else "weight = weight / weight.sum(dim=-1, keepdim=True)")
        if v.scale:
            w("weight = weight * self.scale  # routed_scaling_factor")
        if v.trim:
            w("if self.training and self.correction_rate:")
            w("    self.trim(choice)")

    def trim_text(self, out: Writer) -> None:
        out.block('''
@torch.no_grad()
def trim(self, choice):
    """Auxiliary-loss-free balancing (DeepSeek-V3): called by each training forward, it moves
    every expert's correction bias by correction_rate toward an even load, up for an expert
    below the mean load and down for one above it: b_i += rate * sign(mean load - load_i).
    The loads count the assignments of this forward (before any capacity drops) in integers,
    so the step is exact and deterministic; under torch.distributed they are summed over every
    rank first, and every rank takes the same step. Eval leaves the bias alone."""
    E = self.correction.numel()
    flat = choice.reshape(-1)
    load = torch.zeros(E, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))  # (E,) assignments per expert
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(load)
    self.correction.add_(torch.sign(load.sum() - E * load).to(self.correction.dtype), alpha=self.correction_rate)  # sign(mean - load_i), mean = sum / E''')

    def gather(self, out: Writer, v: MoeVariant) -> None:
        """Eager routing: each expert runs on exactly its tokens (one host sync for the
        counts); y (N, C) is every token's experts' weighted outputs added up."""
        w = out.line
        if v.deepseek:
            self.select(out, v)
        else:
            w("probs = F.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))  # (N, E), in float32 at least (as Mixtral routes)")
            w("weight, choice = torch.topk(probs, self.top, dim=-1)  # (N, k)")
            if v.normalize:
                w("weight = weight / weight.sum(dim=-1, keepdim=True)")
        if v.capacity or v.balance:
            w("onehot = choice.t().reshape(-1, 1) == torch.arange(E, device=x.device)  # (k * N, E) one-hot, first choices first")
        if v.balance:
            w("routed = onehot.float().mean(dim=0)  # (E,) fraction of assignments per expert")
        if v.capacity:
            w("if self.training:  # eval is dropless: every expert may take every token")
            with out.indent():
                w("limit = min(math.ceil(self.capacity * B * T * self.top / E), B * T)")
                w("rank = (torch.cumsum(onehot, dim=0) * onehot).sum(dim=-1)  # (k * N,) place in its expert's queue")
                w("keep = (rank <= limit).view(self.top, B * T).t()  # (N, k)")
                w("choice = torch.where(keep, choice, -1)  # dropped: no expert takes it")
        out.block("""
flat = choice.reshape(-1)  # (N * k,) each assignment's expert, token by token; -1: dropped
order = torch.argsort(flat, stable=True)  # the assignments grouped by expert, dropped ones first
counts = torch.bincount(flat + 1, minlength=E + 1).tolist()  # [dropped, then per expert]: one host sync
order = order[counts[0] :]  # (A,) the assignments the experts take
token = order // self.top  # (A,) each one's token
y = torch.cat([expert(xe) for expert, xe in zip(self.experts, x[token].split(counts[1:]))])  # (A, C)
y = y * weight.reshape(-1)[order, None]  # each assignment, weighted
y = y.new_zeros(B * T, C).index_add_(0, token, y)  # a token's experts add in expert order; y's dtype (autocast)""")
        if v.balance:
            w("balance_loss = self.balance * E * torch.sum(routed * probs.mean(dim=0))")

    def compiled(self, out: Writer, v: MoeVariant, expert: str) -> None:
        limit = "min(math.ceil(self.capacity * N * self.top / E), N) if self.training else -1" if v.capacity else "-1"
        drops = "\n    In training it drops the assignments past an expert's capacity." if v.capacity else ""
        args = f"x, logits, weights{' + [self.correction]' if v.correction else ''}, bias, self.top, limit, {v.normalize}, {'self.balance' if v.balance else '0.0'}"
        if v.deepseek:  # the router's options, then the choice back out for the trim
            groups = f", groups=self.groups, top_groups=self.top_groups, group_score=\"{v.groups}\"" if v.groups else ""
            args += f", router=\"{v.router}\"{groups}{', scale=self.scale' if v.scale else ''}{', correction=True' if v.correction else ''}"
            args += ", eps=self.normalize_eps" if v.eps else ""
        if v.trim:
            call = (f"out = routed_{v.act}({args})\n    if self.training and self.correction_rate:\n        self.trim(out[7])  # out[7]: the choice (N, k)"
                    "\n    return out[:2]")
        else:
            call = f"return routed_{v.act}({args})[:2]"
        out.block(f'''
def compiled_experts(self, x, logits):
    """The routing and the experts under torch.compile, in the custom op routed_{v.act},
    opaque to the trace: from the router's logits it picks each token's top experts,
    sorts the assignments by expert, runs them through the experts' op (which reads the
    exact counts, one host sync, and so computes no padding) and adds each token's
    weighted outputs up; the gradients come from its hand-written backward.{drops}
    Returns (y (N, C), the load-balancing loss ())."""
    N, E = logits.shape
    limit = {limit}  # the most assignments an expert takes; -1: no limit
    bias = self.experts[0].fc.bias is not None
    weights = [w for ex in self.experts for w in (ex.fc.weight, ex.fc.bias, ex.proj.weight, ex.proj.bias) if w is not None]
    if torch.is_autocast_enabled(x.device.type) and x.dtype != torch.float64:  # autocast cannot see into the op: cast as F.linear would
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weights = x.to(dtype), [w.to(dtype) for w in weights]
    {call}

def plain_experts(self):
    """Whether every expert is still this file's {expert} of two plain nn.Linear, whose weights the
    custom op can read. A replaced layer (LoRA, quantised) takes the gather instead, which under
    torch.compile costs a graph break. Forward hooks on the experts run on the gather path only.
    """
    return all(type(ex) is {expert} and type(ex.fc) is nn.Linear and type(ex.proj) is nn.Linear for ex in self.experts)''')
