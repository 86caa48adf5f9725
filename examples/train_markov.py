"""Compile a small spec and train it on a second-order Markov chain generated here.

The chain's next token depends on the previous two, so a model that looks at one
token alone cannot go below the chain's one-token entropy; getting under it needs
the injector (attention) to bring the token before in. The script prints the loss
as it falls, next to two floors: the entropy rate of the chain (the best any model
can do) and the best one-token predictor.

    python examples/train_markov.py              # 300 steps, about 20 s on 2 cores
    python examples/train_markov.py --steps 60   # a quick look (the tests run this)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import torch

import cyclelang

VOCAB = 12
CONTEXT = 64

# A GPT in miniature: the staged-combustion cycle of specs/gpt2.cycle at width 64.
# The startup block is the training recipe; the generated model turns it into an
# optimizer and a learning-rate schedule (`configure_optimizer`).
SPEC = f"""
engine markov_gpt {{
  chamber width=64
  throat causal
  feed tokens vocab={VOCAB} context={CONTEXT}

  stage block x 2 {{
    prechamber mix {{
      norm layernorm
      turbine attention heads=4
      merge cooling
    }}
    prechamber burn {{
      norm layernorm
      turbine mlp ratio=4
      merge cooling
    }}
  }}

  norm layernorm
  nozzle head tied

  startup {{
    warmup 30
    schedule cosine lr=3e-3 min=3e-4 steps=300
    clip 1.0
    betas 0.9 0.95
    decay 0.01
  }}
}}
"""


def make_chain(seed: int = 0) -> torch.Tensor:
    """P[a, b, c] = p(next = c | the two before are a, b): three likely successors per pair."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.full((VOCAB, VOCAB, VOCAB), -8.0)
    for a in range(VOCAB):
        for b in range(VOCAB):
            succ = torch.randperm(VOCAB, generator=g)[:3]
            logits[a, b, succ] = torch.randn(3, generator=g) * 1.5
    return torch.softmax(logits, dim=-1)


def sample(P: torch.Tensor, batch: int, length: int, g: torch.Generator) -> torch.Tensor:
    x = torch.empty(batch, length, dtype=torch.long)
    x[:, :2] = torch.randint(0, VOCAB, (batch, 2), generator=g)
    for t in range(2, length):
        x[:, t] = torch.multinomial(P[x[:, t - 2], x[:, t - 1]], 1, generator=g).squeeze(1)
    return x


def floors(P: torch.Tensor, g: torch.Generator) -> tuple[float, float]:
    """(entropy rate of the chain, entropy of the best one-token predictor), in nats, from a long sample."""
    seq = sample(P, 64, 512, g)[:, 64:]  # past the start, near the stationary distribution
    a, b, c = seq[:, :-2].reshape(-1), seq[:, 1:-1].reshape(-1), seq[:, 2:].reshape(-1)
    rate = -(P[a, b, c].log()).mean().item()
    pair = torch.zeros(VOCAB, VOCAB)
    pair.index_put_((b, c), torch.ones_like(b, dtype=torch.float), accumulate=True)
    cond = pair / pair.sum(1, keepdim=True)  # p(next | previous token only)
    one = -(cond[b, c].log()).mean().item()
    return rate, one


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=int(os.environ.get("CYCLELANG_EXAMPLE_STEPS", 300)))
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # a model this small gains nothing from more threads, and loses on a busy machine
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    P = make_chain()
    rate, one = floors(P, g)
    model = cyclelang.build(SPEC, seed=0)
    optimizer, scheduler = model.configure_optimizer()
    n = sum(p.numel() for p in model.parameters())
    print(f"{n:,} parameters; chain over {VOCAB} tokens, each next token set by the two before it")
    print(f"floors: uniform {math.log(VOCAB):.3f} nats, one-token predictor {one:.3f}, chain entropy rate {rate:.3f}")

    start = time.perf_counter()
    first = last = None
    every = max(1, args.steps // 10)
    for step in range(args.steps):
        x = sample(P, args.batch, CONTEXT + 1, g)
        _, loss = model(x[:, :-1], targets=x[:, 1:].contiguous())  # targets: the next token at each position
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        model.clip_gradients()
        optimizer.step()
        scheduler.step()
        first = loss.item() if first is None else first
        last = loss.item()
        if step % every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {last:.3f}  lr {scheduler.get_last_lr()[0]:.2e}")

    with torch.no_grad():
        model.eval()
        x = sample(P, 64, CONTEXT + 1, g)
        _, held_out = model(x[:, :-1], targets=x[:, 1:].contiguous())
    beats = "below" if held_out.item() < one else "not yet below"
    print(f"held-out loss {held_out.item():.3f} after {args.steps} steps ({time.perf_counter() - start:.1f} s): "
          f"{beats} the one-token floor {one:.3f}, chain entropy rate {rate:.3f}")
    print(f"RESULT first={first:.4f} last={last:.4f} held_out={held_out.item():.4f} one_token={one:.4f} rate={rate:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
