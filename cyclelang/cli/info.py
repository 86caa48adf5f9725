"""`cyclec explain`, `cyclec ir` and `cyclec schema`: what a code means, a spec's IR, the IR's schema."""

from __future__ import annotations

import json

import click

from . import include_path_option, load_spec, output_option, refuse_output_over_input, spec_path, write_output


@click.command()
@click.argument("code", required=False)
@click.option("--list", "list_all", is_flag=True, help="List every code with its title.")
@click.option("--markdown", is_flag=True, help="Print every code's page as Markdown (docs/diagnostics.md).")
def explain(code, list_all, markdown):
    """Print what diagnostic CODE means, why it matters and how to fix it (--list: every code)."""
    from ..codes import CODES, explanation, markdown as pages
    from ..diagnostics import did_you_mean

    if markdown:
        if code is not None or list_all:
            raise click.UsageError("--markdown prints every code: give no CODE and no --list")
        click.echo(pages(), nl=False)
        return
    if list_all:
        if code is not None:
            raise click.UsageError("give a CODE or --list, not both")
        click.echo("".join(f"{c.code}  {c.title}\n" for c in sorted(CODES.values(), key=lambda c: (c.code[0] != "E", c.code[0], c.code))), nl=False)
        return
    if code is None:
        raise click.UsageError("give a CODE (such as E0101), or --list for every code")
    c = CODES.get(code.upper())
    if c is None:
        # letters typed for digits (W1O1) first, then the closest spelling
        norm = code[:1].upper() + code[1:].upper().replace("O", "0").replace("I", "1").replace("L", "1")
        hint = f"did you mean '{norm}'?" if norm in CODES else did_you_mean(code.upper(), CODES)
        raise click.UsageError(f"no diagnostic code '{code}'" + (f"; {hint}" if hint else "; codes look like E0101, W102, N101"))
    text = explanation(c)
    if c.code in ("E0401", "E0402"):  # what the importer reads today, from its own tables
        from ..interop.families import explain_tables

        text += explain_tables(c.code)
    click.echo(text, nl=False)


@click.command()
@spec_path
@output_option
@include_path_option
def ir(spec, output, include_path):
    """Print the resolved IR of SPEC as JSON."""
    refuse_output_over_input(output, [spec])
    s = load_spec(spec, include_path)
    write_output(output, json.dumps(s.model_dump(mode="json"), indent=2) + "\n")


@click.command()
@output_option
def schema(output):
    """Print the JSON Schema of the IR."""
    from ..ir import json_schema

    write_output(output, json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")
