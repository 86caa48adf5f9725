"""The output gate's function (`gate_act=`, turbine attention): softplus (Laguna) beside the sigmoid (Qwen3-Next, AFMoE),
held to a float64 reference of the whole attention written here from the equations (GQA, causal softmax, the gate from
the branch's input, per channel or per head), weights perturbed; the option refused without a gate; the IR of a
sigmoid gate unchanged; the diagram's words."""

from __future__ import annotations

import math

import pytest

import cyclelang
from cyclelang.diagnostics import CycleError

from .conftest import need

torch = need("torch")
F = torch.nn.functional

SPEC = """
engine e {{
  chamber width=24
  throat causal
  feed tokens vocab=40 context=64 position=none
  stage block x 2 {{
    prechamber mix {{ norm rmsnorm  turbine attention heads=4 kv_heads=2 gate={gate}{act} bias={bias} }}
    prechamber burn {{ norm rmsnorm  turbine mlp ratio=2 }}
  }}
  norm rmsnorm
  nozzle head
}}
"""


def _model(text):
    torch.manual_seed(0)
    model = cyclelang.build(cyclelang.parse(text)).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _reference(layer, x, gate: str, act: str):
    """softmax(q k^T / sqrt(d) + causal) v per head (each KV head read by heads / kv_heads query heads), then
    y * act(W_g x + b_g) per channel of every head or per head, then the output projection: float64, from the equations."""
    B, T, _ = x.shape
    H, K, D = 4, 2, 6
    qkv = x @ layer.qkv.weight.T + (layer.qkv.bias if layer.qkv.bias is not None else 0)
    q, k, v = qkv.split((H * D, K * D, K * D), dim=-1)
    q = q.view(B, T, H, D).transpose(1, 2)
    k = k.view(B, T, K, D).transpose(1, 2).repeat_interleave(H // K, dim=1)
    v = v.view(B, T, K, D).transpose(1, 2).repeat_interleave(H // K, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
    z = x @ layer.gate.weight.T + (layer.gate.bias if layer.gate.bias is not None else 0)
    g = torch.log1p(torch.exp(z)) if act == "softplus" else 1 / (1 + torch.exp(-z))
    y = y * (g if gate == "channel" else g.repeat_interleave(D, dim=-1))
    return y @ layer.proj.weight.T + (layer.proj.bias if layer.proj.bias is not None else 0)


@pytest.mark.parametrize("gate", ["channel", "head"])
@pytest.mark.parametrize("act", ["softplus", "sigmoid"])
def test_the_gate_equals_a_float64_reference(gate, act):
    model = _model(SPEC.format(gate=gate, act=f" gate_act={act}", bias="true"))
    layer = model.stages[0].mix.attn
    seen = {}
    layer.register_forward_hook(lambda m, i, o: seen.update(x=i[0], y=o))
    idx = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        model(idx)
        want = _reference(layer, seen["x"], gate, act)
    assert (seen["y"] - want).abs().max().item() < 1e-12


def test_softplus_is_not_sigmoid():
    """The same weights under the other function compute something else (the option reaches the module)."""
    soft = _model(SPEC.format(gate="head", act=" gate_act=softplus", bias="false"))
    sig = _model(SPEC.format(gate="head", act="", bias="false"))
    sig.load_state_dict(soft.state_dict())
    idx = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (soft(idx) - sig(idx)).abs().max().item() > 1e-3


def test_gate_act_without_a_gate_is_an_error():
    with pytest.raises(CycleError) as e:
        cyclelang.parse(SPEC.format(gate="none", act=" gate_act=softplus", bias="false"))
    assert any(d.code == "E0211" and "gate_act" in d.message for d in e.value.diagnostics)


def test_a_sigmoid_gate_dumps_as_before_and_softplus_is_said():
    sig = cyclelang.parse(SPEC.format(gate="channel", act="", bias="false"))
    assert "gate_act" not in sig.model_dump_json()  # older IR dumps stay as they were
    soft = cyclelang.parse(SPEC.format(gate="channel", act=" gate_act=softplus", bias="false"))
    assert '"gate_act":"softplus"' in soft.model_dump_json().replace(" ", "")
    assert "output gate per channel (softplus)" in cyclelang.draw(soft).source
    assert "output gate per channel (softplus)" not in cyclelang.draw(sig).source


def test_the_generated_file_writes_the_softplus_gate():
    """The built module runs the generated source (`cyclec build`'s standalone file), which writes F.softplus."""
    import inspect
    import sys

    from cyclelang.backends.torch.codegen import codegen

    spec = cyclelang.parse(SPEC.format(gate="head", act=" gate_act=softplus", bias="true"))
    source = codegen(spec)
    assert "F.softplus(self.gate(x).to(torch.promote_types(y.dtype, torch.float32))).to(y.dtype)" in source and "torch.sigmoid(self.gate(x))" not in source
    model = cyclelang.build(spec)
    assert inspect.getsource(sys.modules[type(model).__module__]) == source
