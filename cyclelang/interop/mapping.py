"""How a compiled module's parts meet a transformers checkpoint's keys: the module's layout as
transformers layers (`_layout`: each stage instance's attention, reactor and valves), the
transforms from checkpoint tensors to the module's (each with its inverse, for export), and the
key names of the Llama-shaped families (`KEYS`). plans.py and the family modules' plans use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir

# --- the module's layout -----------------------------------------------------------------


@dataclass
class _Stage:
    attn: str | None = None  # "stages.0.mix.attn"
    mlp: str | None = None  # "stages.0.burn.mlp"
    moe: str | None = None  # "stages.0.burn.moe"
    ssm: str | None = None  # "stages.0.mix.ssm"
    mamba1: str | None = None  # "stages.0.mix.ssm" (version=1)
    latent: str | None = None  # "stages.0.mix.attn" (latent attention)
    short_conv: str | None = None  # "stages.0.mix.short_conv"
    attn_node: object = None
    work_node: object = None
    experts: int = 0
    valves: dict = field(default_factory=dict)  # a turbine's path -> the valve in front of it ("stages.0.mix.norm")
    posts: dict = field(default_factory=dict)  # a turbine's path -> the valve right after it in its branch (OLMo-2)


@dataclass
class _Plan:
    """Where each key of the module comes from: key -> (source keys, transform)."""

    entries: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)  # module keys with no source: why


def _layout(spec) -> dict[int, _Stage]:
    """Each stage instance's attention, reactor and their experts, by the IR's layout paths."""
    lay = ir.layout.layout(spec)
    stages: dict[int, _Stage] = {}
    flat = {path: i for i, (path, _) in enumerate(lay.layers())}  # a layer's index in the order the layers run
    for sl in lay.stages:
        parts = [p for p in lay.parts() if p.stage is sl.stage and p.spath == sl.path and p.role != "merge"]
        for r, inst in enumerate(sl.instances()):
            st = stages.setdefault(flat[inst], _Stage())
            valve = None  # the latest valve on the way to each turbine, in its branch (Pre-LN)
            last = None  # the latest turbine, and its branch
            for part in parts:
                path = part.instances()[r]
                if part.role == "valve":
                    if last is not None and last[1] is part.branch is not None:
                        st.posts[last[0]] = path
                    valve = (part.branch, part.fullflow, path)
                    last = None
                    continue
                last = (path, part.branch)
                if valve is not None and (valve[0] is part.branch or valve[0] is None and valve[1] is part.fullflow is not None):
                    st.valves[path] = valve[2]
                if isinstance(part.node, ir.Attention) and st.attn is None:
                    st.attn, st.attn_node = path, part.node
                elif isinstance(part.node, ir.Mlp) and st.mlp is None:
                    st.mlp, st.work_node = path, part.node
                elif isinstance(part.node, ir.Moe) and st.moe is None:
                    st.moe, st.experts, st.work_node = path, part.node.experts, part.node
                elif isinstance(part.node, ir.Ssm) and st.ssm is None:
                    st.ssm = path
                elif isinstance(part.node, ir.Mamba1) and st.mamba1 is None:
                    st.mamba1 = path
                elif isinstance(part.node, ir.LatentAttention) and st.latent is None:
                    st.latent, st.attn_node = path, part.node
                elif isinstance(part.node, ir.ShortConv) and st.short_conv is None:
                    st.short_conv = path
    return stages


def _final_valve(spec) -> str:
    """The engine-level valve before the nozzle (`norm`), by the layout."""
    valves = [p.path for p in ir.layout.layout(spec).main if isinstance(p, ir.layout.Part) and p.role == "valve"]
    return valves[-1] if valves else "norm"


def _parent(prefix: str) -> str:
    return prefix.rsplit(".", 1)[0] + "."


# Transforms from checkpoint tensors to the module's, each with its inverse (export).


class _Same:
    def __call__(self, t):
        return t

    def inverse(self, t):
        return [t]


class _T:
    """GPT-2's Conv1D stores the transpose of nn.Linear's weight."""

    def __call__(self, t):
        return t.t()

    def inverse(self, t):
        return [t.t().contiguous()]


@dataclass(frozen=True)
class _Cat:
    """Several checkpoint matrices fused along rows (q, k, v; gate, up)."""

    sizes: tuple

    def __call__(self, *ts):
        import torch

        return torch.cat(ts, dim=0)

    def inverse(self, t):
        return [x.contiguous() for x in t.split(list(self.sizes), dim=0)]


@dataclass(frozen=True)
class _Shaped:
    """A checkpoint tensor of this shape, ours the same numbers as one vector (Cohere's (heads, head_dim) qk-norm gains)."""

    shape: tuple

    def __call__(self, t):
        if tuple(t.shape) != self.shape:
            raise ValueError(f"not of shape {self.shape}")
        return t.reshape(-1)

    def inverse(self, t):
        return [t.reshape(self.shape).contiguous()]


@dataclass(frozen=True)
class _Index:
    """One expert's slice of transformers 5's fused expert tensors."""

    x: int
    count: int

    def __call__(self, t):
        return t[self.x]

    def inverse(self, t):
        return [t]


_SAME, _TRANSPOSE = _Same(), _T()


@dataclass(frozen=True)
class _IndexT(_Index):
    """One expert's slice of a fused tensor stored (in, out), transposed (Aria's experts)."""

    def __call__(self, t):
        return t[self.x].t()

    def inverse(self, t):
        return [t.t()]


def _put_experts(put, reactor: str, h: str, node, state, fused) -> None:
    """Routed experts: transformers 5's fused tensors (`{h}experts.gate_up_proj`, a model's own state dict) or
    one expert at a time (`{h}experts.{e}.gate_proj`, ..., as save_pretrained writes them); fused None: as `state` has them."""
    fused = (h + "experts.gate_up_proj" in state) if fused is None else fused
    for x in range(node.experts):
        if fused:
            put(f"{reactor}.experts.{x}.fc.weight", h + "experts.gate_up_proj", _Index(x, node.experts))
            put(f"{reactor}.experts.{x}.proj.weight", h + "experts.down_proj", _Index(x, node.experts))
        else:
            b = h + f"experts.{x}."
            put(f"{reactor}.experts.{x}.fc.weight", [b + "gate_proj.weight", b + "up_proj.weight"], _Cat((node.hidden, node.hidden)))
            put(f"{reactor}.experts.{x}.proj.weight", b + "down_proj.weight")


def _put_gated(put, reactor: str, h: str, hidden: int) -> None:
    """A swiglu MLP from gate_proj, up_proj, down_proj under `h`."""
    for p in ("weight", "bias"):
        put(f"{reactor}.fc.{p}", [h + f"gate_proj.{p}", h + f"up_proj.{p}"], _Cat((hidden, hidden)))
        put(f"{reactor}.proj.{p}", h + f"down_proj.{p}")


@dataclass(frozen=True)
class _Keys:
    """A Llama-shaped family's key names, inside `layers.{i}.` (and at the top: embed, final, head)."""

    attn_norm: str = "input_layernorm"
    mlp_norm: str = "post_attention_layernorm"
    q: str = "self_attn.{}_proj"  # q, k, v formatted in; None when fused
    fused_qkv: str | None = None  # one matrix: "self_attn.qkv_proj"
    neox_qkv: bool = False  # the fused matrix groups rows head by head, [q_h | k_h | v_h] (GPT-NeoX)
    o: str = "self_attn.o_proj"
    gated: tuple = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    fused_gate_up: str | None = None  # "mlp.gate_up_proj" (Phi-3)
    mp_qkv: int = 0  # the fused matrix's rows come in this many groups, each [q | v | k] (CodeGen's mp_num)
    plain: tuple = ("mlp.c_fc", "mlp.c_proj")  # an ungated MLP's (in, out)
    embed: str = "embed_tokens"
    final: str = "norm"
    head: str = "lm_head"
    layers: str = "layers"
    attn_post: str = "post_attention_layernorm"  # the norm after attention (OLMo-2, Gemma 2's sandwich)
    mlp_post: str = "post_feedforward_layernorm"  # the norm after the MLP
    qk_norms: tuple = ("self_attn.q_norm", "self_attn.k_norm")
    turned: bool = False  # the rotary turns the other way (nanochat): each head's second half of q and k rows negated


KEYS = {
    "phi3": _Keys(fused_qkv="self_attn.qkv_proj", fused_gate_up="mlp.gate_up_proj"),
    "phi": _Keys(o="self_attn.dense", plain=("mlp.fc1", "mlp.fc2"), final="final_layernorm", qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm")),
    "gpt_neox": _Keys(fused_qkv="attention.query_key_value", neox_qkv=True, o="attention.dense",
                      plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"), embed="embed_in", final="final_layer_norm"),
    "falcon": _Keys(fused_qkv="self_attention.query_key_value", neox_qkv=True, o="self_attention.dense",
                    plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"), embed="word_embeddings", final="ln_f", layers="h"),
    "mamba2": _Keys(embed="embeddings", final="norm_f"),
    "mamba": _Keys(embed="embeddings", final="norm_f"),
    "falcon_mamba": _Keys(embed="embeddings", final="norm_f"),
    "jamba": _Keys(final="final_layernorm"),
    "bamba": _Keys(final="final_layernorm"),
    "falcon_h1": _Keys(final="final_layernorm"),
    "nemotron_h": _Keys(embed="embeddings", final="norm_f"),
    "gemma2": _Keys(mlp_norm="pre_feedforward_layernorm"),
    "arcee": _Keys(plain=("mlp.up_proj", "mlp.down_proj")),
    "gemma3_text": _Keys(mlp_norm="pre_feedforward_layernorm"),
    "nemotron": _Keys(plain=("mlp.up_proj", "mlp.down_proj")),
    "jais2": _Keys(plain=("mlp.up_proj", "mlp.down_proj")),
    "nanochat": _Keys(plain=("mlp.fc1", "mlp.fc2"), turned=True),
    "persimmon": _Keys(fused_qkv="self_attn.query_key_value", neox_qkv=True, o="self_attn.dense", plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
                       final="final_layernorm", qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm")),
    "bloom": _Keys(fused_qkv="self_attention.query_key_value", neox_qkv=True, o="self_attention.dense",
                   plain=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"), embed="word_embeddings", final="ln_f", layers="h"),
    "vaultgemma": _Keys(mlp_norm="pre_feedforward_layernorm"),
    "hyperclovax": _Keys(attn_post="post_norm1", mlp_post="post_norm2"),  # Peri-LN: a norm before and after each sublayer
    "gptj": _Keys(attn_norm="ln_1", q="attn.{}_proj", o="attn.out_proj", plain=("mlp.fc_in", "mlp.fc_out"), embed="wte", final="ln_f",
                  layers="h"),
    "glm": _Keys(fused_gate_up="mlp.gate_up_proj"),
    "glm4": _Keys(mlp_norm="post_attention_layernorm", fused_gate_up="mlp.gate_up_proj", attn_post="post_self_attn_layernorm",
                  mlp_post="post_mlp_layernorm"),
    "stablelm": _Keys(qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm")),
    "hunyuan_v1_dense": _Keys(qk_norms=("self_attn.query_layernorm", "self_attn.key_layernorm")),
    "hunyuan_v1_moe": _Keys(qk_norms=("self_attn.query_layernorm", "self_attn.key_layernorm")),
    "codegen": _Keys(attn_norm="ln_1", fused_qkv="attn.qkv_proj", mp_qkv=4, o="attn.out_proj", plain=("mlp.fc_in", "mlp.fc_out"),
                     embed="wte", final="ln_f", layers="h"),
    "mpt": _Keys(attn_norm="norm_1", mlp_norm="norm_2", fused_qkv="attn.Wqkv", o="attn.out_proj", plain=("ffn.up_proj", "ffn.down_proj"),
                 embed="wte", final="norm_f", layers="blocks"),
}


@dataclass(frozen=True)
class _GroupedQkv:
    """Falcon's new-decoder fused rows, kv group by group [q_1 .. q_g | k | v], as ours: [all q | all k | all v]."""

    kv_heads: int
    group: int
    head_dim: int

    def __call__(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(self.kv_heads, self.group + 2, self.head_dim, *rest)
        return torch.cat([g[:, : self.group].reshape(-1, *rest), g[:, self.group].reshape(-1, *rest), g[:, self.group + 1].reshape(-1, *rest)])

    def inverse(self, t):
        import torch

        rest = t.shape[1:]
        n = self.kv_heads * self.group * self.head_dim
        q = t[:n].reshape(self.kv_heads, self.group, self.head_dim, *rest)
        k = t[n : n + self.kv_heads * self.head_dim].reshape(self.kv_heads, 1, self.head_dim, *rest)
        v = t[n + self.kv_heads * self.head_dim :].reshape(self.kv_heads, 1, self.head_dim, *rest)
        return [torch.cat([q, k, v], 1).reshape(-1, *rest).contiguous()]


@dataclass(frozen=True)
class _GroupedRows:
    """CodeGen's fused rows: `groups` groups, each [q_g | v_g | k_g] (a group is width / groups rows of each), as ours:
    [all q | all k | all v], each the groups' parts in order."""

    groups: int

    def __call__(self, t):
        import torch

        rest = t.shape[1:]
        g = t.reshape(self.groups, 3, -1, *rest)  # (groups, [q, v, k], local rows, ...)
        return torch.cat([g[:, 0].reshape(-1, *rest), g[:, 2].reshape(-1, *rest), g[:, 1].reshape(-1, *rest)])

    def inverse(self, t):
        import torch

        rest = t.shape[1:]
        q, k, v = (x.reshape(self.groups, 1, -1, *rest) for x in t.chunk(3))
        return [torch.cat([q, v, k], 1).reshape(-1, *rest).contiguous()]


@dataclass(frozen=True)
class _NeoxQkv:
    """GPT-NeoX's fused rows, head by head [q_h | k_h | v_h], as ours: [all q | all k | all v]."""

    heads: int
    head_dim: int

    def __call__(self, t):
        rest = t.shape[1:]
        return t.reshape(self.heads, 3, self.head_dim, *rest).transpose(0, 1).reshape(3 * self.heads * self.head_dim, *rest)

    def inverse(self, t):
        rest = t.shape[1:]
        return [t.reshape(3, self.heads, self.head_dim, *rest).transpose(0, 1).reshape(3 * self.heads * self.head_dim, *rest).contiguous()]


@dataclass(frozen=True)
class _Turned(_Cat):
    """q, k, v fused as _Cat does, each head's second half of q and k rows negated: nanochat's rotary turns each pair
    (x1, x2) by -θ (its rotate_half is (x2, -x1)), which is ours turning (x1, -x2) by θ, then the second half negated;
    q . k, and the norms of q and k (its qk-norms are weightless), are unchanged by negating both second halves."""

    head_dim: int = 0

    def _flip(self, t):
        import torch

        sign = torch.ones(self.head_dim, dtype=t.dtype, device=t.device)
        sign[self.head_dim // 2 :] = -1
        q, k = self.sizes[0], self.sizes[1]
        flip = torch.cat((sign.repeat(q // self.head_dim), sign.repeat(k // self.head_dim), torch.ones(self.sizes[2], dtype=t.dtype, device=t.device)))
        return t * flip.view(-1, *([1] * (t.dim() - 1)))

    def __call__(self, *ts):
        return self._flip(super().__call__(*ts))

    def inverse(self, t):
        return super().inverse(self._flip(t))
