"""The round trip every claimed transformers family passes (tests/test_families*.py).

A tiny random transformers model from a config, its weights spread away from their init, saved
with save_pretrained (what users load): `cyclec import` -> build -> load from the folder -> logits
within 1e-5 relative in float32, loss equal, greedy decoding with our cache equal to transformers'
forward step by step, parameter count equal, every gradient within 1e-5 relative; then `cyclec
export` of perturbed weights -> `from_pretrained` -> the same logits. Nothing is downloaded.
"""

from __future__ import annotations

from click.testing import CliRunner

import cyclelang

from .conftest import need

torch = need("torch")
transformers = need("transformers")
from cyclelang.backends.torch.build import build  # noqa: E402
from cyclelang.cli import main  # noqa: E402
from cyclelang.interop import convert_state_dict, load_transformers  # noqa: E402

V, B, T = 96, 2, 12


def hf(config, seed=1):
    """The transformers model, its weights perturbed away from their init (norm gains 1, biases 0)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def with_bias(config, seed=1):
    """hf, and a spread correction bias in every DeepSeek-V3-style router (a buffer: hf leaves it zero). The
    `spread_bias` fixture (conftest) makes round_trip build its reference with this."""
    model = _HF(config, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))
    return model


_HF = hf


def moes(model):
    return [m for m in model.modules() if type(m).__name__ == "Moe"]


def imported(tmp_path, model):
    """`cyclec import` of the model's save_pretrained folder, built and loaded from that folder."""
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    out = tmp_path / "imported.cycle"
    res = CliRunner().invoke(main, ["import", str(ckpt), "-o", str(out)])
    assert res.exit_code == 0, res.output
    ours = build(cyclelang.load(out), seed=0).eval()
    return load_transformers(ours, ckpt), ckpt, out


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def ids(seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# A class whose own model_type AutoModelForCausalLM cannot load back exports as the family that computes it
EXPORTED_AS = {"Emu3ForCausalLM": "LlamaForCausalLM"}  # transformers maps no causal LM to Emu3TextConfig


def round_trip(tmp_path, config):
    """The whole check for one family's checkpoint: import -> build -> load, then logits, loss,
    greedy decoding, parameter count and every gradient against transformers, then export ->
    from_pretrained -> the same logits. Returns (ours, ref, spec_file) for a family's own checks."""
    ref = hf(config)
    ours, ckpt, spec_file = imported(tmp_path, ref)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters() if p.requires_grad)  # a frozen one (ERNIE 4.5 MoE's bias) is our buffer
    idx = ids()

    # logits and loss, float32
    with torch.no_grad():
        out = ref(idx, labels=idx)
        logits, loss = ours(idx, torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1))
    assert rel(logits, out.logits) < 1e-5
    ce = loss - sum(ours.aux_losses.values(), torch.zeros(()))  # an MoE balance loss is ours alone
    assert abs(ce.item() - out.loss.item()) < 1e-5 * out.loss.item()

    # greedy decoding, ours with its KV cache, the reference step by step without one
    want = idx[:1, :4]
    for _ in range(8):
        with torch.no_grad():
            want = torch.cat((want, ref(want).logits[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(ours.generate(idx[:1, :4], 8, temperature=0), want)

    # gradients: transformers' mapped onto our names by the same plan as the weights
    ref.train(), ours.train()
    ref.zero_grad(), ours.zero_grad()
    ref(idx, labels=idx).loss.backward()
    _, loss = ours(idx, torch.cat((idx[:, 1:], torch.full((B, 1), -1)), dim=1))
    (loss - sum(ours.aux_losses.values(), torch.zeros(()))).backward()
    grads = {k: p.grad for k, p in ref.named_parameters() if p.requires_grad}  # ERNIE 4.5 MoE keeps its correction bias a frozen parameter
    mapped = convert_state_dict(grads, dict(ours.named_parameters()), ref.config.to_dict(), spec=ours.spec)
    scale = max(g.abs().max().item() for g in grads.values())
    for k, p in ours.named_parameters():
        # relative to the tensor's largest gradient; a top-1 router's is zero (p / p = 1), only rounding
        err = (p.grad - mapped[k]).abs().max().item()
        assert err <= 1e-5 * max(mapped[k].abs().max().item(), 1e-3 * scale), k

    # export: the checkpoint transformers reads back is the same function
    ours.eval()
    res = CliRunner().invoke(main, ["build", str(spec_file), "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "m.py")])
    assert res.exit_code == 0, res.output
    trained = {k: v + 0.01 for k, v in ours.state_dict().items()}  # "a trained variant": not the weights imported
    ours.load_state_dict(trained)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in trained.items()}, str(tmp_path / "w.safetensors"))
    res = CliRunner().invoke(main, ["export", str(spec_file), "--weights", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    eager = {"attn_implementation": "eager"} if ref.config._attn_implementation == "eager" else {}  # Gemma 2's soft-cap is eager's alone
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", **eager).eval()
    assert type(back).__name__ == EXPORTED_AS.get(type(ref).__name__, type(ref).__name__)
    with torch.no_grad():
        assert rel(back(idx).logits, ours(idx)) < 1e-5
    return ours, ref, spec_file
