"""`cyclec lsp`: the language server over stdio (imported only when that command runs)."""

from __future__ import annotations

import click

from . import EXIT_USAGE


@click.command()
@click.option("--stdio", is_flag=True, help="Talk LSP over stdin/stdout (the default and only transport).")
def lsp(stdio):
    """Run the language server on stdin/stdout: diagnostics as you type, hover, completion,
    go to definition, document symbols, formatting and quick fixes (needs `pip install pygls`)."""
    try:
        from ..lsp.server import main
    except ImportError as e:
        click.echo(f"cyclec: the language server needs pygls: pip install 'cyclelang[lsp]' ({e})", err=True)
        raise SystemExit(EXIT_USAGE) from None
    main()
