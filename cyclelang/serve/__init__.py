"""`cyclec serve`: the playground, a local web page that recompiles a spec on every change.

`app.py` holds the HTTP server (the standard library's, bound to 127.0.0.1) and the one
function it answers with, `payload(text)`: the language server's diagnostics, the diagram
(both views, any labels), the parameter/FLOP report and the generated PyTorch source. The
page and its script are in `static/`, shipped in the package: nothing is fetched from
anywhere but the loopback.
"""
