"""`cyclec import` and `cyclec export`: transformers checkpoints to specs and back
(imported only when they run)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..diagnostics import CycleError, Diagnostic
from ..ir import Span
from . import UsageProblem, include_path_option, load_spec, os_problem, output_option, refuse_output_over_input, spec_path, weights_file, write_output


def _config_span(path: str | None, text: str | None, field: str) -> Span | None:
    """Where `field` (its last dotted part) is written in config.json, or its first line."""
    if path is None or text is None:
        return None
    key = f'"{field.rsplit(".", 1)[-1]}"'
    for n, line in enumerate(text.splitlines(), 1):
        col = line.find(key)
        if col >= 0:
            return Span(file=path, line=n, column=col + 1, end_line=n, end_column=col + 1 + len(key))
    return Span(file=path, line=1, column=1, end_line=1, end_column=2)


def _fail(code: str, message: str, span: Span | None, help: str | None, sources: dict) -> CycleError:
    return CycleError([Diagnostic(code, "error", message, span, help)], sources)


@click.command("import")
@click.argument("src", type=click.Path(exists=True, path_type=str))
@output_option
def import_(src, output):
    """Write the spec a transformers checkpoint implies (SRC: its folder or config.json).

    The spec is formatted and commented (every value names the config field it comes
    from). A config field the language cannot express is an error naming the field
    (E0401), never an approximation, and so is a size above the language's limits; an
    unknown model_type is refused (E0402). A config.json that is not a regular file (a
    FIFO, a device) or is larger than 16 MiB is refused unread (E0403).
    """
    from ..interop import FAMILIES, InteropError, Unsupported, import_config, read_config_text

    path = Path(src) / "config.json" if Path(src).is_dir() else Path(src)
    refuse_output_over_input(output, [str(path), src])
    try:
        config, _, text = read_config_text(src)
    except InteropError as e:
        raise _fail("E0403", str(e), None, "give a checkpoint folder or its config.json", {}) from None
    sources = {str(path): text} if text is not None else {}
    try:
        spec = import_config(config, name=path.name)
    except Unsupported as e:
        code = "E0402" if e.field == "model_type" else "E0401"
        help = "see docs/families.md for what each family's fields map to" if code == "E0401" else \
            f"supported: {', '.join(FAMILIES)} (docs/families.md)"
        raise _fail(code, str(e), _config_span(str(path), text, e.field), help, sources) from None
    except InteropError as e:
        raise _fail("E0403", str(e), None, "give a checkpoint folder or its config.json", sources) from None
    write_output(output, spec)


@click.command("export")
@spec_path
@click.option("--weights", required=True, type=click.Path(exists=True, path_type=str),
              help="The compiled module's weights: a .safetensors file (`cyclec build --weights`) or a `cyclec train` run folder.")
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False, path_type=str),
              help="The checkpoint folder to write (config.json, model.safetensors): a new or empty folder, or any with --force.")
@click.option("--force", is_flag=True,
              help="Write into a folder that holds other files: config.json and model.safetensors are replaced, and the weight "
                   "files that would contradict them (another checkpoint's index and shards, pickles) are removed (each named).")
@include_path_option
def export(spec, weights, out_dir, force, include_path):
    """Write SPEC and its weights as a transformers checkpoint folder.

    `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads it into the same
    function. A spec that no family computes exactly is refused with the first field
    that differs (E0404); weights that do not fit the spec, with the key (E0405).
    Nothing is written unless everything fits, and then all or nothing: both files
    appear together or the folder is left as it was. A folder that holds anything is
    refused unless --force; an output that is an input (the spec, the weights) always is.
    """
    from ..interop import CHECKPOINT_FILES, InteropError, OutputRefused, Unsupported, export as export_checkpoint, export_config, export_plan

    s = load_spec(spec, include_path)
    if s.engine is None:
        raise _fail("E0404", "the file holds templates only: there is no engine to export", None, None, {})
    try:
        export_config(s)  # refused before anything is read or written
    except Unsupported as e:
        span = s.engine.span
        raise _fail("E0404", f"no transformers family computes this spec: {e}", span, "docs/families.md lists what each family can say",
                    {}) from None
    path = weights_file(weights)
    try:
        stale = export_plan(out_dir, force)
    except OutputRefused as e:
        raise UsageProblem(str(e)) from None
    for name in (*CHECKPOINT_FILES, *stale):
        refuse_output_over_input(os.path.join(out_dir, name), [spec, weights, path], "-o")
    try:
        config = export_checkpoint(s, path, out_dir, force=force)
    except OutputRefused as e:
        raise UsageProblem(str(e)) from None
    except InteropError as e:
        raise _fail("E0405", str(e), None, "export the weights of this spec's module (cyclec build SPEC --weights W)", {}) from None
    except OSError as e:
        if e.errno is None:
            raise
        raise os_problem(e, out_dir) from None  # the folder is as it was
    click.echo(f"wrote {out_dir}/config.json ({config['model_type']}) and {out_dir}/model.safetensors", err=True)
    if stale:
        click.echo(f"removed the stale weight files of the checkpoint that was there: {', '.join(stale)}", err=True)
    others = sorted(set(os.listdir(out_dir)) - set(CHECKPOINT_FILES))
    if others:
        click.echo(f"left as they were: {', '.join(others[:8])}" + (f" and {len(others) - 8} more" if len(others) > 8 else ""), err=True)
