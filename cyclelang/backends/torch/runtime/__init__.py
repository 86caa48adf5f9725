"""What a generated file runs besides its classes, as real Python modules.

    loss        next_token_loss_op (the loss's custom op): F.cross_entropy through the softmax, a one-pass backward
    embedding   table_lookup: the Feed's embedding lookups, a custom op under torch.compile
    positions   sinusoids, rotary_tables, scaled_rotary_tables, query_temperature, alibi_slopes, apply_rotary, apply_rotary_partial, apply_rotary_interleaved, apply_rotary_spread
    masks       causal_mask, sliding_mask, padded_mask
    cache       Cache: the decoding state of a causal engine (KV, windows, recurrent states);
                STATES: which of its methods each kind of state needs (`cache_class`)
    scan        ssd_scan, gated_rms_norm, linear_scan, selective_scan, gated_delta_scan: the recurrent mixers' scans
    experts     {act}_grad for every activation, expert_mlps, expert_choice and routed_experts (the MoE custom ops)
    norms       OffsetRMSNorm, OffsetLayerNorm: RMSNorm (Gemma) and LayerNorm (Nemotron) with an (offset + w) gain; ScalarGain (Gemma 4);
                HeadNorm: a qk-norm with each head's own gain (StableLM, Cohere)
    hyper       HyperConnection, ManifoldConnection: a branch's junction with a chamber of several streams
    parallel    parallelize: FSDP2, tensor parallelism by the file's TP_PLAN, activation
                checkpointing, per-stage compile

Each module imports torch and can be imported and tested on its own
(`tests/test_torch_runtime.py`). Codegen never imports them: it reads their text
(`definition(name)`, taken from the file with `ast`) and copies each top-level
definition a spec needs into the generated file, which therefore imports only torch
and the standard library. So these modules are written in the generated file's own
vocabulary: `torch`, `F` (torch.nn.functional), `math`, nothing else.

This package's `__init__` stays free of torch, so reading the text costs no import.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

HERE = Path(__file__).parent

# Where each definition the generated file may inline lives.
MODULES = ("loss", "embedding", "positions", "masks", "cache", "experts", "norms", "parallel", "scan", "hyper")


@functools.lru_cache(maxsize=None)
def _definitions() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (its source text, the global names it reads) for every top-level def and class."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for module in MODULES:
        text = (HERE / f"{module}.py").read_text("utf-8")
        lines = text.splitlines()
        for node in ast.parse(text).body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            if node.decorator_list or node.col_offset:
                raise ValueError(f"runtime/{module}.py: {node.name} must be a plain top-level definition to be inlined")
            reads = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
            # whole lines, not ast.get_source_segment: that stops at the last statement and
            # would drop a comment closing the definition
            out[node.name] = ("\n".join(lines[node.lineno - 1 : node.end_lineno]), reads)
    return out


def names() -> frozenset[str]:
    """Every name the runtime may define in a generated file: no class of the spec's may take one."""
    return frozenset(_definitions())


def definition(name: str) -> str:
    """The source of one runtime definition, exactly as its module holds it."""
    try:
        return _definitions()[name][0]
    except KeyError:
        raise KeyError(f"no runtime definition {name!r} in cyclelang/backends/torch/runtime/") from None


def reads(name: str, global_name: str) -> bool:
    """Whether a runtime definition uses `global_name` (e.g. `math`), so the file must import it."""
    return global_name in _definitions()[name][1]


def digest(*texts: str) -> str:
    """The name suffix of a custom op defined by these runtime definitions: two builds share
    an op (and torch.compile's caches, which know an op by its name) only when its code is
    the same. Each definition is framed by newlines, as the generated file holds them."""
    return hashlib.sha256("".join(f"\n{t}\n" for t in texts).encode()).hexdigest()[:8]


@functools.lru_cache(maxsize=None)
def _cache_states() -> dict[str, tuple[str, ...]]:
    """cache.py's STATES (state kind -> the Cache methods that keep it), read from its text."""
    for node in ast.parse((HERE / "cache.py").read_text("utf-8")).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["STATES"]:
            return ast.literal_eval(node.value)
    raise ValueError("runtime/cache.py defines no STATES")


def cache_class(states) -> str:
    """The Cache class with only the methods of these state kinds (`cache.STATES`) and those
    every cache has; a kind STATES lacks is an internal error naming it."""
    return _cache_class(frozenset(states))


@functools.lru_cache(maxsize=None)  # every build of a causal spec asks for one of a few
def _cache_class(states: frozenset[str]) -> str:
    table = _cache_states()
    unknown = sorted(set(states) - set(table))
    if unknown:
        raise KeyError(f"no Cache methods for state kind(s) {', '.join(unknown)}: add them to runtime/cache.py's STATES")
    drop = {m for kind, methods in table.items() if kind not in states for m in methods}
    text = definition("Cache")
    lines = text.split("\n")
    cls = ast.parse(text).body[0]
    cut: set[int] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in drop:
            cut.update(range(node.lineno - 2, node.end_lineno))  # the blank line before it, then the method
    return "\n".join(ln for k, ln in enumerate(lines) if k not in cut)
