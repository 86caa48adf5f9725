"""Propellant for the stand: token sources generated in code, or bytes from a file.

The synthetic source is a first-order Markov chain over a small alphabet with a
seeded random transition matrix (each row drawn from a Dirichlet, so most
transitions are unlikely and a few dominate). Its entropy rate is known exactly,
H = -sum_i pi_i sum_j P_ij log P_ij with pi the stationary distribution: the
floor under every loss curve, in nats per token. A model that ignores context
can do no better than the entropy of pi (the unigram line); learning shows as
the loss falling from log(vocab) past that line towards the floor.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..diagnostics import CycleError, Diagnostic

ALPHABET = 32
CONCENTRATION = 0.1  # Dirichlet concentration of each transition row: lower is more predictable


class Markov:
    def __init__(self, alphabet: int = ALPHABET, seed: int = 0, concentration: float = CONCENTRATION):
        self.alphabet, self.seed = alphabet, seed
        with torch.random.fork_rng(devices=[]):  # the caller's RNG stream is left alone
            torch.manual_seed(10_000 + seed)
            g = torch._standard_gamma(torch.full((alphabet, alphabet), concentration, dtype=torch.float64))
        g = g + 1e-12
        self.P = g / g.sum(dim=1, keepdim=True)  # (K, K) rows: next-symbol distributions
        pi = torch.full((alphabet,), 1.0 / alphabet, dtype=torch.float64)
        for _ in range(10_000):
            nxt = pi @ self.P
            if float((nxt - pi).abs().max()) < 1e-15:
                break
            pi = nxt
        self.pi = pi / pi.sum()
        logp = torch.where(self.P > 0, self.P.log(), torch.zeros_like(self.P))
        self.entropy_rate = float(-(self.pi * (self.P * logp).sum(dim=1)).sum())
        self.unigram = float(-(self.pi * self.pi.log()).sum())
        self._cum = self.P.cumsum(dim=1)
        self._cum[:, -1] = 1.0

    @property
    def name(self) -> str:
        return f"markov(alphabet={self.alphabet}, seed={self.seed})"

    def posterior(self, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """(B, T, K): p(x_t = k | every unmasked token of the row), exactly, by the forward-backward
        recursion over the chain (masked positions are unobserved). What the Bayes-optimal
        masked-token predictor says."""
        B, T = tokens.shape
        K = self.alphabet
        seen = torch.nn.functional.one_hot(tokens.clamp(0, K - 1), K).double()  # (B, T, K)
        emit = torch.where(masked.unsqueeze(-1), torch.ones_like(seen), seen)
        alpha = torch.empty(B, T, K, dtype=torch.float64)
        a = self.pi.expand(B, K) * emit[:, 0]
        alpha[:, 0] = a / a.sum(-1, keepdim=True)
        for t in range(1, T):
            a = (alpha[:, t - 1] @ self.P) * emit[:, t]
            alpha[:, t] = a / a.sum(-1, keepdim=True)
        beta = torch.empty(B, T, K, dtype=torch.float64)
        beta[:, -1] = 1.0
        for t in range(T - 2, -1, -1):
            b = (beta[:, t + 1] * emit[:, t + 1]) @ self.P.T
            beta[:, t] = b / b.sum(-1, keepdim=True)
        post = alpha * beta
        return post / post.sum(-1, keepdim=True)

    def masked_floor(self, T: int, mask, seed: int, rows: int = 512) -> float:
        """The floor of the masked-token objective at sequence length T: the Bayes-optimal
        predictor's mean loss over the masked positions, estimated on `rows` seeded sequences
        with masks drawn by `mask(shape, gen)` (the sampler training uses). Its standard error
        at 512 rows of 64 tokens is about 0.01 nats."""
        gen = torch.Generator().manual_seed(50_000 + seed)
        tokens = self.batch(rows, T, gen)[:, :-1]
        masked = mask(tokens.shape, gen)
        post = self.posterior(tokens, masked)
        p = post.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return float(-p[masked].clamp_min(1e-300).log().mean())

    def batch(self, B: int, T: int, gen: torch.Generator) -> torch.Tensor:
        """(B, T + 1) tokens: each row starts from the stationary distribution."""
        out = torch.empty(B, T + 1, dtype=torch.long)
        u = torch.rand(B, T + 1, generator=gen, dtype=torch.float64)
        cur = torch.searchsorted(self.pi.cumsum(0).contiguous(), u[:, :1].contiguous()).clamp_(max=self.alphabet - 1).squeeze(1)
        out[:, 0] = cur
        for t in range(1, T + 1):
            cur = torch.searchsorted(self._cum[cur], u[:, t : t + 1].contiguous()).clamp_(max=self.alphabet - 1).squeeze(1)
            out[:, t] = cur
        return out


MAX_DATA_BYTES = 1 << 30  # --data is read into memory: a corpus sample, not a corpus


class ByteFile:
    """A file's bytes as tokens 0..255; batches are windows at seeded offsets."""

    def __init__(self, path: str, vocab: int):
        if vocab < 256:
            raise CycleError([Diagnostic("E0116", "error", f"--data feeds bytes (256 tokens), but the engine's vocab is {vocab}", None,
                                         "fire an engine with vocab >= 256")])
        from ..io import InputRefused, read_input

        try:
            data = read_input(path, MAX_DATA_BYTES)
        except InputRefused as e:
            raise CycleError([Diagnostic("E0112", "error", f"cannot read --data {path}: {e}", None,
                                         "give a regular file of at most 1 GiB")]) from None
        except OSError as e:
            raise CycleError([Diagnostic("E0105", "error", f"cannot read --data {path}: {e.strerror or e}", None)]) from None
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8).long() if data else torch.zeros(0, dtype=torch.long)
        self.label = f"file:{Path(path).name}"

    @property
    def name(self) -> str:
        return self.label

    def batch(self, B: int, T: int, gen: torch.Generator) -> torch.Tensor:
        n = self.data.numel()
        if n < T + 1:
            raise CycleError([Diagnostic("E0116", "error", f"--data holds {n} bytes, fewer than one window of {T + 1}", None,
                                         "use a larger file or a smaller --seq")])
        starts = torch.randint(0, n - T, (B,), generator=gen)
        return torch.stack([self.data[s : s + T + 1] for s in starts.tolist()])


class RandomTokens:
    """Uniform random tokens: what the static fire measures on without --data."""

    name = "random tokens"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def batch(self, B: int, T: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.vocab, (B, T + 1), generator=gen)
