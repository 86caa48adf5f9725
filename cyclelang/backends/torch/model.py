"""The engine's own code: the learning-rate schedule and the `Model` class (init, forward,
the optimizer, sampling)."""

from __future__ import annotations

from ... import ir
from .emitters import emitter
from .merges import merge_emitter
from .plan import OpPlan, Plan, StagePlan
from contextlib import ExitStack

from .stages import instances, module_list, stage_call
from .writer import Writer, comment, doc_tag, num


def uses_math(p: Plan) -> bool:
    """Whether the code written here reads `math` (a cosine schedule does)."""
    return "steps" in p.schedule and p.engine.startup.schedule.kind == "cosine"


def learning_rate(out: Writer, p: Plan) -> None:
    """`learning_rate(step, config)`: the startup block's schedule over the Config's fields."""
    s = p.engine.startup
    sch, w, t = s.schedule, out.line, p.schedule
    w("def learning_rate(step, config=None):")
    with out.indent():
        constant = "steps" not in t
        desc = "linear warmup, then " if s.warmup else ""
        desc += "constant" if constant else f"{sch.kind} decay to config.min_lr at config.lr_steps"
        w(f'"""The learning rate at `step`: {desc}."""')
        w("config = config or Config()")
        lr = str(t["lr"])
        if s.warmup:
            warm = str(t["warmup"])
            w(f"if step < {warm}:  # linear warmup")
            with out.indent():
                w(f"return {lr} * (step + 1) / ({warm} + 1)")
        if constant:
            w(f"return {lr}")
        else:
            lo, steps = str(t["min_lr"]), str(t["steps"])
            w(f"if step >= {steps}:")
            with out.indent():
                w(f"return {lo}")
            start = str(t["warmup"]) if s.warmup else "0"
            w(f"ratio = (step - {start}) / max({steps} - {start}, 1)" if s.warmup else f"ratio = step / {steps}")
            if sch.kind == "cosine":
                w(f"return {lo} + 0.5 * (1.0 + math.cos(math.pi * ratio)) * ({lr} - {lo})")
            else:
                w(f"return {lr} + ratio * ({lo} - {lr})")
    out.blank(2)


def overboard(p: Plan) -> list[tuple[str, float | None]]:
    """(instance path, loss weight or None) of every overboard branch, instance by instance."""
    return [(f"{inst}.{b.attr}", b.br.loss) for sp in p.stages for inst in sp.layout.instances()
            for b in sp.branches() if b.br.overboard]


def instance_paths(sp: StagePlan) -> tuple[str, str]:
    """Every instance's path of a stage, over the config's counts: an f-string's text and the
    comprehension's loops (`stages.{i}.stages.{j}`, `for i in range(config.n_group) for j in ...`)."""
    path, loops = [], []
    for level, s in zip("ijklm", sp.chain()):
        start = str(s.start)
        if s.n is None:  # one instance: its index
            path.append(f"stages.{start}" if start.isdigit() else f"stages.{{{start}}}")
            continue
        loops.append(f"for {level} in " + (f"range({s.n})" if start == "0" else f"range({start}, {start} + {s.n})"))
        path.append(f"stages.{{{level}}}")
    return ".".join(path), " ".join(loops)


def model_class(out: Writer, p: Plan) -> None:
    e, w = p.engine, out.line
    dumped = overboard(p)
    if ir.mup.is_mup(e):
        mup_tables(out, p)
    w("class Model(nn.Module):")
    with out.indent():
        w(f'"""{e.name}: embeddings, blocks, LM head{doc_tag(e.span, "feed, stages, nozzle")}."""')
        w()
        with out.constructor("config=None"):
            w("self.config = config = config or Config()")
            w("self.feed = Feed(config)" + comment(e.feed.span, "token embedding", "tanks and pumps"), e.feed.span)
            w("self.stages = " + module_list(p.top))
            if e.feed.per_layer:
                w("for i, m in enumerate(m for m in self.stages.modules() if hasattr(m, \"per_layer_index\")):")
                w("    m.per_layer_index = i  # the per-layer mlps read the feed's per-layer inputs in the order the layers run")
            for it in p.main:
                if isinstance(it, OpPlan):
                    x = emitter(it.op)
                    w(f"self.{it.attr} = {x.ctor(it)}" + comment(it.op.span, *x.phrase(it.op, "engine")), it.op.span)
            for k, (dims, base) in enumerate(p.rope_args):
                pre = "rope" if len(p.ropes) == 1 else f"rope{k}"
                scaling = rotary_scaling(p.ropes[k][2])
                w(f"cos, sin = {'scaled_' if scaling else ''}rotary_tables(config.context, {dims}, {base}{', ' + scaling if scaling else ''})"
                  + (f"  # {p.ropes[k][2].type} rotary scaling" if scaling else ""))
                w(f'self.register_buffer("{pre}_cos", cos, persistent=False)  # (context, rotary dims)')
                w(f'self.register_buffer("{pre}_sin", sin, persistent=False)')
                if (sc := p.ropes[k][2]) is not None and sc.temperature:
                    w(f'self.register_buffer("{pre}_temp", query_temperature(config.context, {sc.original}, {sc.temperature!r}), persistent=False)'
                      "  # (context, 1): the queries' temperature")
            nz = e.nozzle
            if not nz.tied:
                w(f"self.head = nn.Linear({p.head_width}, config.vocab_size, bias={num(nz.bias)})" + comment(nz.span, "LM head", "nozzle"), nz.span)
            elif nz.bias:
                w("self.head_bias = nn.Parameter(torch.zeros(config.vocab_size))" + comment(nz.span, "LM head bias; its weight is the token embedding's", "nozzle, tied"), nz.span)
            if dumped:
                w("# auxiliary branches: their output leaves the model, never added back; name -> loss weight (None: discarded)")
                parts = [f'{{f"{instance_paths(sp)[0]}.{b.attr}": {b.cls}.loss_weight{" " * bool(instance_paths(sp)[1])}{instance_paths(sp)[1]}}}'
                         for sp in p.stages for b in sp.branches() if b.br.overboard]
                w("self.overboard = " + (parts[0] if len(parts) == 1 else "{" + ", ".join(f"**{x}" for x in parts) + "}"))
            w("self.aux_losses = {}")
            if dumped:
                w("self.exhaust = {}")
            w("self.reset_parameters()")
        w()
        reset_parameters(out, p)
        w()
        forward(out, p)
        w()
        if p.fast:
            loss_fn(out)
            w()
        optimizer(out, p)
        w()
        generate(out, p)


def mup_tables(out: Writer, p: Plan) -> None:
    """The rule of every part's matrices under μP (`ir.mup`), and what each rule multiplies."""
    e, w = p.engine, out.line
    m = ir.mup.width_mult(e)
    rs = ir.mup.rules(m)
    lay = ir.layout.layout(e)
    w(f"# μP (Tensor Programs V, Table 3, Adam) at width {num(e.width)} = {num(m)} x base width {num(e.startup.param.base_width)}:")
    w("# each part's rule for its matrices; every parameter with fewer than 2 dims is a vector (as standard).")
    w("MUP_PARTS = {")
    with out.indent():
        for row in ir.mup.table(e):
            w(f"{row['path']!r}: {row['rule']!r},")
    w("}")
    nested = bool(p.groups)
    if not nested:
        stages = " + ".join(f"({sl.path!r},) * {sl.stage.repeat}" for sl in lay.top) or "()"
        w(f"MUP_STAGES = {stages}  # instance i -> its stage's folded path")
    else:
        def table(sls) -> str:
            return " + ".join(f"(({sl.path!r}, {table(sl.children) if sl.children else None}),) * {sl.stage.repeat}" for sl in sls)
        w(f"MUP_STAGES = {table(lay.top)}  # instance i -> (its stage's folded path, its nested stages' table)")
    for what in ("init", "lr", "decay"):
        w(f"MUP_{what.upper()} = {{" + ", ".join(f"{r!r}: {num(getattr(rule, what))}" for r, rule in rs.items()) + "}")
    w(f"MUP_READOUT = {num(ir.mup.readout_mult(e))}  # logits x 1/m (MuReadout)")
    out.blank(2)
    w("def mup_rule(name, p):")
    with out.indent():
        fold = ("""
head, _, rest = name.partition(".")
if head == "stages":
    i, _, rest = rest.partition(".")
    name = f"{MUP_STAGES[int(i)]}.{rest}\"""" if not nested else """
table, prefix = MUP_STAGES, ""
while table is not None and name.startswith("stages."):  # fold each level of the nested stages
    i, _, name = name[len("stages.") :].partition(".")
    prefix, table = table[int(i)]
name = f"{prefix}.{name}" if prefix else name""")
        out.block('''
"""The μP rule of parameter `name`: its part's, or "vector" for biases and gains."""
if p.dim() < 2:
    return "vector"''' + fold + '''
while name not in MUP_PARTS:
    name = name.rpartition(".")[0]
return MUP_PARTS[name]''')
    out.blank(2)


def reset_parameters(out: Writer, p: Plan) -> None:
    e, w = p.engine, out.line
    init = e.startup.init
    normal = init.kind == "normal"
    w("@torch.no_grad()")
    w("def reset_parameters(self):")
    with out.indent():
        if normal:
            w(f'"""Weights normal(0, {p.sizes.init_std()}), biases zero (GPT-2); then the residual adds\' rules{doc_tag(None, "chill-down")}."""')
        else:
            w('"""Initialisation: xavier_uniform weights, biases zero, embeddings normal(0, width**-0.5);')
            w(f'then the residual adds\' own rules{doc_tag(None, "chill-down")}."""')
        w("config = self.config")
        out.block(f"""
for module in self.modules():
    if isinstance(module, nn.Linear):
        {f"nn.init.normal_(module.weight, mean=0.0, std={p.sizes.init_std()})" if normal else "nn.init.xavier_uniform_(module.weight)"}
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std={p.sizes.init_std() if normal else "module.embedding_dim**-0.5"})""")
        if e.nozzle.tied and e.nozzle.bias:
            w("nn.init.zeros_(self.head_bias)")
        if e.feed.padding is not None:
            w(f"self.feed.tok.weight[{num(e.feed.padding)}].zero_()  # the padding token's embedding")
        for sp in p.stages:
            merge_init(out, p, sp)
        hyper = ir.chamber_streams(e.body)
        if hyper is not None and hyper.connections == "hyper":
            w("for k, hyper in enumerate(m for m in self.modules() if isinstance(m, HyperConnection)):")
            w("    hyper.reset(k)  # hyper-connections: branch k reads stream k mod streams at init (Zhu et al. 2024)")
        if ir.mup.is_mup(e):
            w("for name, p in self.named_parameters():  # μP: the standard init, scaled per rule")
            with out.indent():
                w("p.mul_(MUP_INIT[mup_rule(name, p)])")


def merge_init(out: Writer, p: Plan, sp: StagePlan) -> None:
    """The merges' own init rules for every instance of one stage (of every group it is nested in)."""
    lines: list[str] = []
    for b in sp.branches():
        if b.br.merge is not None:
            lines += merge_emitter(b.br.merge).init(b.br.merge, b, f"stage.{b.attr}")
    if all(ln.lstrip().startswith("#") for ln in lines):  # nothing to run: no loop whose body would be a comment
        return
    container = "self.stages"
    with ExitStack() as loops:
        for k, c in enumerate(sp.chain()):
            var = "stage" if c is sp else "group" if k == 0 else f"group{k + 1}"
            st = c.stage
            if c.n is not None:
                out.line(f"for {var} in {instances(p, c, 'config', container)}:" + comment(st.span, f"block {st.name}", "stage"))
                loops.enter_context(out.indent())
            else:
                out.line(f"{var} = {container}[{c.start}]" + comment(st.span, f"block {st.name}", "stage"))
            container = f"{var}.stages"
        for ln in lines:
            out.line(ln)


def rotary_scaling(sc) -> str:
    """The `scaling` dict literal scaled_rotary_tables takes for an ir.RotaryScaling ('' for plain rotary)."""
    if sc is None:
        return ""
    d = {"type": sc.type, "factor": sc.factor}
    if sc.type != "linear":
        d["original"] = sc.original
    if sc.type == "llama3":
        d.update(low=sc.low, high=sc.high)
    if sc.type == "yarn":
        d.update(beta_fast=sc.beta_fast, beta_slow=sc.beta_slow, gain=sc.gain())
        if not sc.truncate:
            d["truncate"] = False
    return "{" + ", ".join(f'"{k}": {v!r}' for k, v in d.items()) + "}"


def forward(out: Writer, p: Plan) -> None:
    e, w = p.engine, out.line
    w("def forward(self, idx, targets=None" + (", cache=None, attention_mask=None" if p.causal else "") + "):")
    with out.indent():
        doc = '''
"""idx: (B, T) token ids; targets: (B, T) next tokens (-1: ignored).
Returns logits (B, T, vocab), or (logits, loss) with every auxiliary loss added.'''
        if p.causal:
            doc += '''

attention_mask: (B, past + T), 1 for real tokens, 0 for padding (left padding for
generation): no query attends to a padded key, and each row counts its positions
from its first real token, so each row computes what it would alone.'''
        out.block(doc + '''
"""
B, T = idx.size()''')
        w("past = 0 if cache is None else cache.pos" if p.causal else "past = 0")
        w("if past + T > self.config.context:")
        with out.indent():
            w('raise ValueError(f"{past + T} positions exceed the context of {self.config.context}")')
        # every mixer but attention reads padded positions (pool, conv, an ssm's or linear attention's state, MLA's latents)
        mixers = sorted({ir.kinds.kind_of(o.op).keyword if not isinstance(o.op, ir.LatentAttention) else "latent attention"
                         for o in p.ops() if ir.kinds.kind_of(o.op).mixes_positions and not isinstance(o.op, ir.Attention)})
        if p.causal:
            w("mask = pos = None")
            w("if attention_mask is not None:")
            with out.indent():
                w("if tuple(attention_mask.shape) != (B, past + T):")
                w('    raise ValueError(f"attention_mask is {tuple(attention_mask.shape)}, not (B, past + T) = {(B, past + T)}")')
                if mixers:
                    w(f'raise ValueError("attention_mask covers attention only: this engine\'s {" and ".join(mixers)} would mix padded positions")')
                else:
                    w("mask = attention_mask.bool()  # (B, S): True for real tokens")
                    w("pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)")
        if p.causal:
            w("if cache is not None and cache.length is None:")
            with out.indent():
                w("cache.length = self.config.context  # reserve the whole context once")
        else:
            w("cache = None  # bidirectional: nothing to cache")
        if e.feed.per_layer:
            w("x, ple = self.feed(idx" + ("" if e.feed.position == "none" else ", past" + (", pos" if p.causal else "")) + ")  # (B, T, C), (B, T, layers, per-layer width)")
        elif e.feed.position == "none":
            w("x = self.feed(idx)  # (B, T, C)")
        else:
            w("x = self.feed(idx, past" + (", pos" if p.causal else "") + ")  # (B, T, C)")
        if p.ropes:
            pres = ["rope"] if len(p.ropes) == 1 else [f"rope{k}" for k in range(len(p.ropes))]
            tables = [f"self.{pre}" for pre in pres]
            for k, pre in enumerate(pres):
                dims, base = (str(x).replace("config.", "self.config.") for x in p.rope_args[k])
                sc = p.ropes[k][2]
                if sc is not None and sc.type == "dynamic":  # the tables depend on the sequence's length
                    tables[k] = pre
                    n = "past + T if pos is None else int(pos.max()) + 1" if p.causal else "past + T"
                    w(f"n = {n}  # the sequence's length, as transformers' dynamic rope reads it")
                    w(f"{pre}_cos, {pre}_sin = self.{pre}_cos, self.{pre}_sin")
                    out.nested(f"if n > {sc.original}:  # dynamic NTK: past the original context the rotary base grows with n",
                               f"{pre}_cos, {pre}_sin = scaled_rotary_tables(past + T, {dims}, {base}, {rotary_scaling(sc)}, seq_len=n)")
            # a table with a query temperature carries it third, (T, 1)
            temps = [f"self.{pre}_temp" if (sc := p.ropes[k][2]) is not None and sc.temperature else None for k, pre in enumerate(pres)]
            pairs = [f"({t}_cos[past : past + T], {t}_sin[past : past + T]" + (f", {h}[past : past + T])" if h else ")") for t, h in zip(tables, temps)]
            w("rope = [" + ", ".join(pairs) + "]  # (T, dims) each")
            if p.causal:
                padded = [f"({t}_cos[pos][:, None], {t}_sin[pos][:, None]" + (f", {h}[pos][:, None])" if h else ")") for t, h in zip(tables, temps)]
                w("if pos is not None:  # a padded batch: (B, 1, T, dims) each, every row at its own positions")
                w("    rope = [" + ", ".join(padded) + "]")
        if any("shared" in o.inputs for o in p.ops()):
            w("shared = {}  # KV sharing: slot -> (k, v) a layer stored for later ones")
        has_aux = any(sp.aux for sp in p.stages) or any(it.aux for it in p.main if isinstance(it, OpPlan))
        w("aux = {}" + ("  # auxiliary losses and outputs by module path: MoE balance losses, auxiliary heads" if has_aux else ""))
        hyper = ir.chamber_streams(e.body)  # hyper-connections: a chamber of several streams, from the feed to the last stage
        if hyper is not None:
            n = str(next(b.margs["streams"] for sp in p.stages for b in sp.branches() if "streams" in b.margs)).replace("config.", "self.config.")
            w(f"x = x.unsqueeze(2).expand(-1, -1, {n}, -1)  # (B, T, streams, C): the input copied into each stream")
        for it in p.main:
            if hyper is not None and not isinstance(it, StagePlan):
                w("x = x.sum(2)  # (B, T, C): the streams summed")
                hyper = None
            if isinstance(it, StagePlan):
                stage_call(out, p, it)
            else:
                x = emitter(it.op)
                if it.aux:
                    w(f'x, aux["{it.attr}"] = {x.call(it, "self", "x")}' + comment(it.op.span, *x.phrase(it.op, "engine")), it.op.span)
                else:
                    w(f"x = {x.call(it, 'self', 'x')}" + comment(it.op.span, *x.phrase(it.op, "engine")), it.op.span)
        if hyper is not None:
            w("x = x.sum(2)  # (B, T, C): the streams summed")
        nz = e.nozzle
        if nz.tied:
            bias = ", self.head_bias" if nz.bias else ""
            w(f"logits = F.linear(x, self.feed.tok.weight{bias})  # (B, T, vocab): the LM head, tied to the token embedding", nz.span)
        else:
            w("logits = self.head(x)  # (B, T, vocab)", nz.span)
        if nz.scale != 1.0:
            w(f"logits = logits * {str(p.logit_scale).replace('config.', 'self.config.')}  # the LM head's logit scale")
        if ir.mup.is_mup(e):
            w("logits = logits * MUP_READOUT  # μP's readout multiplier, 1/m")
        if nz.softcap is not None:
            w(f"logits = {num(nz.softcap)} * torch.tanh(logits / {num(nz.softcap)})  # final-logit soft-cap (Gemma 2): |logits| < {num(nz.softcap)}")
        if p.causal:
            w("if cache is not None:")
            with out.indent():
                w("cache.pos += T")
        def loss(x: str) -> str:  # the next-token loss of logits x, scored in float32
            if p.fast:
                return f"self.loss_fn({x}, targets)"
            return f"F.cross_entropy({x}.reshape(-1, {x}.size(-1)).float(), targets.reshape(-1), ignore_index=-1)"

        if overboard(p):
            out.block(f'''
self.exhaust = {{name: aux.pop(name) for name in self.overboard}}
losses = aux  # MoE balance losses, already weighted
if targets is not None:
    for name, weight in self.overboard.items():  # auxiliary next-token heads
        if weight is not None:
            head = self.exhaust[name]
            losses[name] = weight * {loss("head")}
self.aux_losses = losses''')
        else:
            w("self.aux_losses = aux")
        out.block(f'''
if targets is None:
    return logits
loss = {loss("logits")}
for value in self.aux_losses.values():
    loss = loss + value
return logits, loss''')


def loss_fn(out: Writer) -> None:
    """The fast form's next-token loss, a method of its own so that `compile_model` can
    compile it as a region (torchtitan compiles its loss apart from the blocks likewise)."""
    out.block('''
def loss_fn(self, logits, targets):
    """The mean next-token loss of logits (..., vocab) against targets (...), -1 ignored:
    F.cross_entropy in float32, with a leaner backward (runtime section). A method, so that
    compile_model(model, ends=("loss",)) can compile it as a region of its own."""
    return next_token_loss(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))[0]''')


def optimizer(out: Writer, p: Plan) -> None:
    w = out.line
    if ir.mup.is_mup(p.engine):
        out.block('''
def configure_optimizer(self, fused=True):
    """AdamW from the startup block under μP: one group per rule (MUP_LR and MUP_DECAY multiply
    the spec's lr and decay), with a LambdaLR stepping `learning_rate` in every group.
    Matrices decay; biases, norms and gains do not. Fused (fused=False for FSDP2's and TP's
    DTensors). Returns (optimizer, scheduler).
    """
    config, groups = self.config, {}
    for name, p in self.named_parameters():
        if not p.requires_grad:
            continue
        rule, decays = mup_rule(name, p), p.dim() >= 2
        group = groups.setdefault((rule, decays), {
            "params": [], "rule": rule, "lr_mult": MUP_LR[rule], "lr": config.lr * MUP_LR[rule],
            "weight_decay": config.weight_decay * MUP_DECAY[rule] if decays else 0.0})
        group["params"].append(p)
    betas = (config.beta1, config.beta2)
    optimizer = torch.optim.AdamW(list(groups.values()), lr=config.lr, betas=betas, fused=fused)
    peak = config.lr if config.lr > 0 else 1.0
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate(step, config) / peak)
    return optimizer, scheduler
''')
        w()
        clip(out, p)
        return
    out.block('''
def configure_optimizer(self, fused=True):
    """Fused AdamW (fused=False for FSDP2's and TP's DTensors) from the startup block and a
    LambdaLR stepping `learning_rate`. Matrices decay; biases, norms and gains do not."""
    config = self.config
    params = [p for p in self.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    betas = (config.beta1, config.beta2)
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=betas, fused=fused)
    peak = config.lr if config.lr > 0 else 1.0
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate(step, config) / peak)
    return optimizer, scheduler
''')
    w()
    clip(out, p)


def clip(out: Writer, p: Plan) -> None:
    s, w = p.engine.startup, out.line
    w("def clip_gradients(self):")
    with out.indent():
        if s.clip is not None:
            w('"""Clip the global gradient norm at config.grad_clip; returns the norm."""')
            w(f"return torch.nn.utils.clip_grad_norm_(self.parameters(), {str(p.schedule['clip']).replace('config.', 'self.config.')})")
        else:
            w('"""The spec sets no clip: nothing to do."""')
            w("return None")


def generate(out: Writer, p: Plan) -> None:
    w = out.line
    w("@torch.no_grad()")
    w("def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None" + (", use_cache=True, attention_mask=None" if p.causal else "") + "):")
    with out.indent():
        if not p.causal:
            out.block('''
"""Not available: attention is bidirectional, so every position sees the future."""
raise RuntimeError(
    "generate() needs a causal engine: this one has 'throat open', so each position "
    "depends on later ones and there is no next token to sample; use 'throat causal'"
)''')
            return
        out.block('''
"""Append max_new_tokens sampled tokens to idx (B, T). temperature=0 is greedy.

With the cache each step feeds only the new token. Past the context, the cache
restarts on the latest `context` tokens, so the result equals use_cache=False.
attention_mask: (B, T), 0 for left padding: within the context each row generates
what it would alone.
"""
context = self.config.context
cache = None
mask = attention_mask
for _ in range(max_new_tokens):
    if not use_cache or cache is None or cache.pos >= context:  # the whole window (a new cache)
        cache = Cache(context) if use_cache else None
        x, m = idx[:, -context:], None if mask is None else mask[:, -context:]
    else:  # the new token only
        x, m = idx[:, -1:], None if mask is None else mask[:, -(cache.pos + 1) :]
    logits = self(x, cache=cache, attention_mask=m)[:, -1, :]  # (B, vocab)
    if temperature == 0:
        nxt = logits.argmax(dim=-1, keepdim=True)
    else:
        logits = logits / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("inf")
        nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)  # (B, 1)
    idx = torch.cat((idx, nxt), dim=1)
    if mask is not None:
        mask = torch.cat((mask, mask.new_ones(mask.size(0), 1)), dim=1)
return idx''')
