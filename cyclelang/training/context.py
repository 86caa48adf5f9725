"""Context parallelism (`cyclec train --cp N`): refused, with the reason for each mixer.

Splitting the sequence over ranks needs, per mixer: attention, every rank's keys and values
(ring attention: torch.distributed.tensor.experimental.context_parallel, over CUDA SDPA
kernels) with the rotary positions, masks and padding of the rank's slice; a recurrent
mixer (ssm, linear attention, gated DeltaNet), the state the ranks before it end with; a
convolution or pool, its predecessor's last positions. None of these is wired into the
generated model yet, so --cp above 1 is refused naming each mixer of the spec and why.
"""

from __future__ import annotations

from ..diagnostics import CycleError, Diagnostic


def reason(kind) -> str:
    """Why a mixer of this kind (ir.kinds' record) cannot be split along the sequence yet."""
    if kind.state_kind == "recurrent":
        return (f"{kind.ml} carries a recurrent state along the sequence: a rank's slice starts from the state the ranks "
                "before it end with, and that state passing is not written")
    if kind.state_kind in ("kv", "window") or kind.keyword == "attention":
        return (f"{kind.ml}: torch's context_parallel (ring attention) runs on CUDA SDPA kernels only and is not wired "
                "into the generated attention (its rotary positions, masks and padding per slice); it is untested here")
    return (f"{kind.ml} mixes neighbouring positions: a rank's slice needs the last positions of the rank before it "
            "(a halo exchange), which is not written")


def check(spec, cp: int) -> None:
    """Refuse --cp N above 1 naming every mixer of the spec with its reason."""
    from ..ir.layout import layout

    if cp < 1:
        raise CycleError([Diagnostic("E0507", "error", f"--cp must be at least 1, not {cp}", None, None)])
    if cp == 1:
        return
    kinds = {}
    for p in layout(spec).parts():
        if p.kind.role == "mixer":
            kinds.setdefault(p.kind.ml, (p.path, p.kind))
    lines = [f"{path} ({k.keyword}): {reason(k)}" for path, k in kinds.values()]
    first = lines[0] if lines else f"{spec.engine.name} has no mixer to split"
    raise CycleError([Diagnostic("E0512", "error", f"context parallelism --cp {cp} is not available: {first}",
                                 None, "\n".join(lines[1:]) or "train with --cp 1 (the default)")])
