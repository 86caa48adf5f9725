"""Hand-written reference models, the yardstick for the compiled specs.

Written from the papers and nanoGPT, not from cyclec's output: a GPT-2 (nanoGPT's
model.py, trimmed), a Llama (GQA, rotary, RMSNorm, SwiGLU, no bias) and a
Mixtral-style MoE block (softmax, top-k renormalised, GShard capacity with
first-choices-first dropping, the Switch balance loss). Each is what a careful
engineer would write by hand: fused projections, scaled_dot_product_attention,
rotary tables built once, expert dispatch with one loop over experts (never
tokens).

Parameters are registered in the same order and shapes as the compiled module's
state dict, so `copy_weights` can load one from the other by position; the
benchmark uses it to prove both sides compute the same function before timing
them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v for all heads in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # scaled init of the residual projections (GPT-2 paper)
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        B, T = idx.size()
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # weight tying
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)


# --- Llama --------------------------------------------------------------------------------


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    max_seq_len: int = 2048
    dim: int = 512
    n_layers: int = 8
    n_heads: int = 8
    n_kv_heads: int = 2
    hidden: int = 1408
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    # MoE (Mixtral) when n_experts > 0
    n_experts: int = 0
    top_k: int = 2
    capacity: float = 0.0
    balance: float = 0.0


def rope_tables(length, dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(length).float(), inv_freq)  # (T, dim/2)
    freqs = torch.cat((freqs, freqs), dim=-1)
    return freqs.cos(), freqs.sin()


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv, self.hd = c.n_heads, c.n_kv_heads, c.dim // c.n_heads
        self.wqkv = nn.Linear(c.dim, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.wo = nn.Linear(self.nh * self.hd, c.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.size()
        q, k, v = self.wqkv(x).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = rotate(q.view(B, T, self.nh, self.hd).transpose(1, 2), cos, sin)  # (B, nh, T, hd)
        k = rotate(k.view(B, T, self.nkv, self.hd).transpose(1, 2), cos, sin)  # (B, nkv, T, hd)
        v = v.view(B, T, self.nkv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.nh != self.nkv)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)  # gate and up in one matmul
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.k, self.capacity, self.balance = c.top_k, c.capacity, c.balance
        self.gate = nn.Linear(c.dim, c.n_experts, bias=False)
        self.experts = nn.ModuleList([SwiGLU(c.dim, c.hidden) for _ in range(c.n_experts)])

    def forward(self, x):
        B, T, C = x.shape
        x = x.reshape(-1, C)
        N, E = x.size(0), len(self.experts)
        probs = self.gate(x).softmax(dim=-1)  # (N, E)
        w, sel = probs.topk(self.k, dim=-1)  # (N, k)
        w = w / w.sum(dim=-1, keepdim=True)
        mask = F.one_hot(sel, E)  # (N, k, E)
        if self.training and self.capacity:
            # GShard: queue positions per expert, all first choices before any second choice
            order = mask.transpose(0, 1).reshape(self.k * N, E)
            pos = (order.cumsum(0) * order).sum(-1).view(self.k, N).t()  # (N, k), 1-based
            sel = sel.masked_fill(pos > math.ceil(self.capacity * N * self.k / E), E)  # E: dropped
        aux = self.balance * E * (mask.float().mean(dim=(0, 1)) * probs.mean(0)).sum()
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = (sel == e).nonzero(as_tuple=True)
            out.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None])
        return out.view(B, T, C), aux


class LlamaBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.attention = LlamaAttention(c)
        self.ffn_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.ffn = MoE(c) if c.n_experts else SwiGLU(c.dim, c.hidden)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn(self.ffn_norm(x))
        if isinstance(h, tuple):
            return x + h[0], h[1]
        return x + h, None


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList([LlamaBlock(c) for _ in range(c.n_layers)])
        self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        cos, sin = rope_tables(c.max_seq_len, c.dim // c.n_heads, c.rope_theta)  # once, not per step
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        aux = 0.0
        for layer in self.layers:
            x, a = layer(x, cos, sin)
            if a is not None:
                aux = aux + a
        logits = self.output(self.norm(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1) + aux


def copy_weights(dst: nn.Module, src: nn.Module) -> None:
    """Load src's parameters into dst by position (same architecture, same order)."""
    d, s = list(dst.parameters()), list(src.parameters())
    if len(d) != len(s):
        raise ValueError(f"{len(d)} parameters vs {len(s)}")
    with torch.no_grad():
        for i, (a, b) in enumerate(zip(d, s)):
            if a.shape != b.shape:
                raise ValueError(f"parameter {i}: {tuple(a.shape)} vs {tuple(b.shape)}")
            a.copy_(b)
