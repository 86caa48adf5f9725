"""`cyclec serve`: the playground in the browser (imported only when that command runs)."""

from __future__ import annotations

import click

from . import EXIT_USAGE


@click.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False, exists=True, path_type=str))
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port on 127.0.0.1 (0: any free port).")
@click.option("--quiet", is_flag=True, help="Do not log each request.")
def serve(spec, port, quiet):
    """Serve a playground on http://127.0.0.1:PORT: an editor with highlighting and inline
    diagnostics, the diagram (both views, live), the report and the generated PyTorch source,
    and a share link that carries the spec in the URL. SPEC is read once and never written."""
    text = None
    if spec is not None:
        try:
            with open(spec, "rb") as f:
                text = f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise click.FileError(spec, str(e)) from None
    from ..serve.app import make_server

    try:
        srv = make_server(port, text, spec, quiet)
    except OSError as e:
        click.echo(f"cyclec: cannot listen on 127.0.0.1:{port}: {e.strerror or e}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    click.echo(f"cyclec serve: http://127.0.0.1:{srv.server_address[1]}/  (Ctrl-C stops)", err=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
