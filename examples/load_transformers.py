"""Load transformers weights into compiled specs and compare the outputs.

By default nothing is downloaded: the script makes a small GPT-2 and a small Llama
in transformers with random weights, compiles the matching cyclelang specs (the
staged-combustion cycle of specs/gpt2.cycle and the Llama block of
specs/llama.cycle at width 128), copies the weights across with
`cyclelang.interop.load_transformers`, and compares logits, loss and greedy
generations.

Given a local checkpoint folder (config.json + model.safetensors, e.g. a
snapshot of `openai-community/gpt2`), it compiles a spec of the same architecture
(specs/gpt2.cycle unless --spec says otherwise) and compares it with the real model:

    python examples/load_transformers.py                          # about 10 s on 2 cores
    python examples/load_transformers.py path/to/gpt2             # the real GPT-2 small
    python examples/load_transformers.py path/to/ckpt --spec my.cycle
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

import torch
import transformers

import cyclelang
from cyclelang.interop import load_transformers

# GPT-2 at width 128: Pre-LN valves, cooled merges, learned positions, a tied head.
GPT2_SPEC = """
engine gpt2_tiny {
  chamber width=128
  throat causal
  feed tokens vocab=1000 context=128 position=learned

  stage block x 3 {
    prechamber mix {
      norm layernorm
      turbine attention heads=4
      merge cooling
    }
    prechamber burn {
      norm layernorm
      turbine mlp ratio=4 act=gelu_tanh
      merge cooling
    }
  }

  norm layernorm
  nozzle head tied
}
"""

# A Llama at width 128: RMSNorm valves, rotary, 4 query heads over 2 KV heads, SwiGLU.
LLAMA_SPEC = """
stage llama_block(heads, kv, hidden) {
  prechamber mix {
    norm rmsnorm
    turbine attention heads=heads kv_heads=kv rotary bias=false
  }
  prechamber burn {
    norm rmsnorm
    turbine mlp hidden=hidden act=swiglu bias=false
  }
}

engine llama_tiny {
  chamber width=128
  throat causal
  feed tokens vocab=1000 context=128 position=none

  stage llama_block(heads=4, kv=2, hidden=344) x 3

  norm rmsnorm
  nozzle head
}
"""


def reference(kind: str):
    """The same architectures in transformers, random weights, nothing downloaded."""
    torch.manual_seed(1)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=1000, n_positions=128, n_embd=128, n_layer=3, n_head=4,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=344, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()


def compare(name: str, ours, ref, vocab: int) -> float:
    """Print and return the largest logit difference; also compare loss and greedy decoding."""
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (2, 24), generator=g)
    with torch.no_grad():
        out = ref(idx, labels=idx)
        targets = torch.cat((idx[:, 1:], torch.full((2, 1), -1)), dim=1)  # transformers shifts the labels itself
        logits, loss = ours(idx, targets)
    diff = (logits - out.logits).abs().max().item()
    ours_gen = ours.generate(idx[:, :8], 16, temperature=0)  # greedy, with the KV cache
    ref_gen = ref.generate(idx[:, :8], max_new_tokens=16, do_sample=False, pad_token_id=0)
    same = torch.equal(ours_gen, ref_gen)
    n = sum(p.numel() for p in ours.parameters())
    print(f"{name}: {n:,} parameters; max |logit difference| {diff:.2e}; "
          f"loss {loss.item():.5f} vs {out.loss.item():.5f}; greedy generations {'identical' if same else 'DIFFER'}")
    if not same:
        raise SystemExit(f"{name}: the generations differ")
    return diff


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", type=Path, help="a local transformers checkpoint folder (safetensors)")
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "gpt2.cycle", help="the spec to compile for it")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small models: more threads only contend on a busy machine
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.checkpoint is not None:
        ours = cyclelang.build(args.spec).eval()
        load_transformers(ours, args.checkpoint)  # reads model.safetensors and config.json; pickles are refused
        ref = transformers.AutoModelForCausalLM.from_pretrained(args.checkpoint, local_files_only=True).eval()
        worst = compare(f"{args.checkpoint.name} ({args.spec.name})", ours, ref, ref.config.vocab_size)
    else:
        worst = 0.0
        for name, spec in (("gpt2", GPT2_SPEC), ("llama", LLAMA_SPEC)):
            ref = reference(name)
            ours = load_transformers(cyclelang.build(spec, seed=0).eval(), ref)
            worst = max(worst, compare(name, ours, ref, 1000))
    tolerance = 1e-4
    print(f"RESULT max_logit_diff={worst:.3e} {'OK' if worst < tolerance else 'TOO LARGE'}")
    return 0 if worst < tolerance else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
