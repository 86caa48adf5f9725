"""`cyclec import` and `cyclec export`: transformers checkpoints to specs and back
(imported only when they run)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..diagnostics import CycleError, Diagnostic
from ..ir import Span
from . import include_path_option, load_spec, output_option, spec_path, weights_file, write_output


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
    (E0401), never an approximation; an unknown model_type is refused (E0402).
    """
    from ..interop import FAMILIES, InteropError, Unsupported, import_config

    path = Path(src) / "config.json" if Path(src).is_dir() else Path(src)
    text = None
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    sources = {str(path): text} if text is not None else {}
    try:
        spec = import_config(src)
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
              help="The checkpoint folder to write (config.json, model.safetensors).")
@include_path_option
def export(spec, weights, out_dir, include_path):
    """Write SPEC and its weights as a transformers checkpoint folder.

    `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads it into the same
    function. A spec that no family computes exactly is refused with the first field
    that differs (E0404); weights that do not fit the spec, with the key (E0405).
    Nothing is written unless everything fits.
    """
    from ..interop import InteropError, Unsupported, export as export_checkpoint, export_config

    s = load_spec(spec, include_path)
    if s.engine is None:
        raise _fail("E0404", "the file holds templates only: there is no engine to export", None, None, {})
    try:
        export_config(s)  # refused before anything is read or written
    except Unsupported as e:
        span = s.engine.span
        raise _fail("E0404", f"no transformers family computes this spec: {e}", span, "docs/families.md lists what each family can say",
                    {}) from None
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise click.FileError(out_dir, "exists and is not a directory")
    try:
        config = export_checkpoint(s, weights_file(weights), out_dir)
    except InteropError as e:
        raise _fail("E0405", str(e), None, "export the weights of this spec's module (cyclec build SPEC --weights W)", {}) from None
    click.echo(f"wrote {out_dir}/config.json ({config['model_type']}) and {out_dir}/model.safetensors", err=True)
