"""The façade: paths and spec text in, IR and artifacts out.

`to_spec` turns whatever a user holds (a path, spec text, an IR) into the IR, and
the functions below hand that IR to a back-end. This is the only module that
imports back-ends on the user's behalf, and it imports them inside the functions,
so `import cyclelang` pulls in neither torch nor graphviz. Nothing below it (the
IR, review, the back-ends, the stand) imports this module: they take an `ir.Spec`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .ir import Spec
from .semantics.resolve import load, parse

__all__ = ["parse", "load", "to_spec", "draw", "codegen", "lower", "build", "fire", "train"]


def to_spec(spec) -> Spec:
    """Accept a path, spec text or a resolved IR; return the IR."""
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, Path):
        return load(spec)
    if isinstance(spec, str):
        if "\n" not in spec and spec.strip().endswith(".cycle") and "{" not in spec:
            return load(spec.strip())  # a path, also one that does not exist: E0105 says so (not "unknown statement")
        return parse(spec)
    raise TypeError(f"expected a path, spec text or a cyclelang.Spec, got {type(spec).__name__}")


def draw(spec, **kwargs):
    """Draw a spec as a `graphviz.Digraph`: see `cyclelang.backends.graphviz.draw`."""
    from .backends.graphviz import draw as _draw

    return _draw(to_spec(spec), **kwargs)


def codegen(spec, fast=False, comments="ml", parallel=False) -> str:
    """Standalone PyTorch source for a spec: see `cyclelang.backends.torch.codegen`."""
    from .backends.torch.codegen import codegen as _codegen

    return _codegen(to_spec(spec), fast=fast, comments=comments, parallel=parallel)


def lower(spec, fast=False, comments="ml", parallel=False):
    """The generated source with its source map and name map: see `cyclelang.backends.torch.codegen.lower`."""
    from .backends.torch.codegen import lower as _lower

    return _lower(to_spec(spec), fast=fast, comments=comments, parallel=parallel)


def build(spec, seed=None, allow_large=False, weights=None, fast=False, parallel=False):
    """The spec as a torch.nn.Module: see `cyclelang.backends.torch.build` (imports torch).

    `weights`: a .safetensors file to load, checked name by name and shape by shape, or a
    `cyclec train` run folder (its newest checkpoint's weights). `fast` and `parallel` as
    `cyclec build --fast` and `--parallel`: the runtime's custom ops, `parallelize`."""
    from .backends.torch.build import build as _build, load_weights

    model = _build(to_spec(spec), seed=seed, allow_large=allow_large, fast=fast, parallel=parallel)
    if weights is not None and os.path.isdir(weights):  # a run folder of `cyclec train`: its newest checkpoint
        from .training.checkpoint import weights as run_weights

        weights = run_weights(weights) or os.path.join(weights, "checkpoints", "(none)", "model.safetensors")
    return load_weights(model, weights) if weights is not None else model


def fire(specs, **kwargs):
    """Fire one spec or several (paths, texts or IR) on the test stand and return its report:
    see `cyclelang.stand.run.fire` for the settings (imports torch)."""
    from .stand.run import file_label, fire as _fire

    if isinstance(specs, (str, os.PathLike, Spec)):
        specs = [specs]
    resolved = [to_spec(s) for s in specs]
    kwargs.setdefault("files", [file_label(given, s) for given, s in zip(specs, resolved)])
    return _fire(resolved, **kwargs)


# --- notebooks: a Spec shows as its diagram and its report -------------------------------------


def notebook_display(spec: Spec, kind: str):
    """What Jupyter shows for a Spec: "svg", the power-cycle diagram (None without Graphviz's
    dot or an engine); "html", the diagram above the parameter/FLOP table per stage."""
    import html as _html

    from .backends.graphviz import GraphvizMissing, render, to_dot
    from .review import analyze

    if spec.engine is None:
        return None if kind == "svg" else "<p>a file of stage templates: no engine to show</p>"
    try:
        svg = render(to_dot(spec), "svg").decode("utf-8")
        svg = svg[svg.index("<svg"):]  # inline: no XML declaration or doctype
    except GraphvizMissing:
        svg = None
    if kind == "svg":
        return svg
    rep = analyze(spec)
    p, f = rep["params"], rep["flops_per_token"]
    esc = _html.escape
    rows = "".join(f"<tr><td>{esc(s['name'])}</td><td><code>{esc(s['path'])}</code></td><td>{s['repeat']}</td>"
                   f"<td style='text-align:right'>{s['per_instance']:,}</td><td style='text-align:right'>{s['params']:,}</td></tr>" for s in p["by_stage"])
    table = ("<table><thead><tr><th>stage</th><th>path</th><th>repeat</th><th>params each</th><th>params</th></tr></thead>"
             f"<tbody>{rows}</tbody><tfoot><tr><th colspan='4' style='text-align:left'>total</th><th style='text-align:right'>{p['total']:,}</th></tr></tfoot></table>"
             f"<p>forward {f['forward']:,} FLOPs per token at context {f['context']:,}; "
             f"KV cache {rep['scaling']['kv_bytes_per_token']:,} bytes per token</p>")
    pic = svg if svg is not None else "<p><i>the diagram needs Graphviz's dot program</i></p>"
    return f"<div class='cyclelang'><h4>engine {esc(spec.engine.name)}</h4>{pic}{table}</div>"


from .ir import nodes as _nodes  # noqa: E402

_nodes.NOTEBOOK_DISPLAY[:] = [notebook_display]


def train(spec, data, out, *, resume: bool = False, **settings):
    """Train a spec (path, text or IR) on `data` (paths) into the run folder `out` and return the
    run's `Result`: see `cyclelang.training.loop` for the settings (imports torch). With
    `resume=True`, `out` is an earlier run folder and its saved settings are used."""
    from .training.loop import Settings, load_settings, run

    if isinstance(data, (str, os.PathLike)):
        data = [data]
    s = load_settings(out) if resume else Settings(data=[os.fspath(d) for d in data], **settings)
    if resume:
        for key, value in settings.items():
            setattr(s, key, value)
    ir_spec = to_spec(spec)
    if isinstance(spec, Spec):
        text = ""  # an IR has no text: the run folder's spec.cycle stays empty (model.py and engine.json describe it)
    elif isinstance(spec, Path) or (spec.endswith(".cycle") and "\n" not in spec):
        text = Path(spec).read_text("utf-8")
    else:
        text = spec
    return run(ir_spec, s, out, spec_text=text, resume=resume)

