"""`cyclec serve`: the playground's endpoint, its guards, and the page in a real browser
(Playwright driving Debian's chromium: type a spec, watch the diagram change, make a typo,
see the diagnostic at its line, fix it, see it clear)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.error
import urllib.request

import pytest

from cyclelang.semantics.options import TABLE
from cyclelang.serve.app import DEFAULT_SPEC, language, make_server, payload
from cyclelang.syntax.parser import KEYWORD_MEANINGS

from .conftest import ROOT, require

HAS_DOT = shutil.which("dot") is not None
TINY = """engine tiny {
  chamber width=64
  throat causal
  feed tokens vocab=256 context=32

  stage block x 2 {
    prechamber mix {
      norm layernorm
      turbine attention heads=4
    }
    prechamber burn {
      norm layernorm
      turbine mlp ratio=4
    }
  }

  norm layernorm
  nozzle head tied
}
"""


@pytest.fixture(scope="module")
def server():
    srv = make_server(0, quiet=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _post(url, body: bytes, host=None, origin=None, ctype="application/json"):
    headers = {"Content-Type": ctype, **({"Host": host} if host else {}), **({"Origin": origin} if origin else {})}
    req = urllib.request.Request(url + "/api/analyze", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_payload_of_a_good_and_a_bad_spec():
    out = payload(TINY)
    assert out["diagnostics"] == [] and out["engine"] == "tiny" and out["stages"] == ["block"]
    assert "class Block(nn.Module)" in out["source"] and "parameters:" in out["report"]
    if HAS_DOT:
        assert out["svg"].lstrip().startswith("<?xml") and "tiny" in out["svg"]
    bad = payload(TINY.replace("heads=4", "haeds=4"))
    (d,) = bad["diagnostics"]
    assert (d["code"], d["line"], d["column"], d["help"]) == ("E0201", 9, 25, "did you mean 'heads'?")
    assert bad["svg"] is None and bad["source"] is None
    assert payload("\x00\xff" * 10)["diagnostics"][0]["severity"] == "error"


def test_language_comes_from_the_tables():
    words = language()
    assert set(words["keywords"]) == set(KEYWORD_MEANINGS)
    assert {o.name for opts in TABLE.values() for o in opts} == set(words["options"])
    assert {"attention", "mlp", "layernorm", "rmsnorm", "cooling", "tokens", "head", "cosine"} <= set(words["kinds"])


def test_endpoints_and_guards(server):
    with urllib.request.urlopen(server + "/", timeout=10) as r:
        page = r.read().decode()
        assert "/static/app.js" in page and "default-src 'self'" in r.headers["Content-Security-Policy"]
        assert "http" not in page.replace("http-equiv", "")  # nothing fetched from elsewhere
    for name in ("app.js", "app.css"):
        with urllib.request.urlopen(f"{server}/static/{name}", timeout=10) as r:
            assert "http://" not in r.read().decode() and "https://" not in r.read().decode()
    with urllib.request.urlopen(server + "/api/initial", timeout=10) as r:
        assert json.loads(r.read())["text"] == DEFAULT_SPEC
    status, out = _post(server, json.dumps({"text": TINY}).encode())
    assert status == 200 and out["engine"] == "tiny"
    assert _post(server, json.dumps({"text": TINY}).encode(), host="evil.example:80")[0] == 403  # DNS rebinding
    assert _post(server, json.dumps({"text": TINY}).encode(), origin="https://evil.example")[0] == 403  # another site's page
    assert _post(server, json.dumps({"text": TINY}).encode(), origin=server)[0] == 200  # our own page
    assert _post(server, json.dumps({"text": TINY}).encode(), ctype="text/plain")[0] == 415  # a form post needs no preflight
    assert _post(server, b"{not json")[0] == 400
    assert _post(server, json.dumps({"text": TINY, "view": "nope"}).encode())[0] == 400
    status, out = _post(server, json.dumps({"text": "let a = 1\n" * 120_000}).encode())
    assert status == 200 and out["diagnostics"][0]["code"] == "E0010"
    status, out = _post(server, b" " * (3 << 20))
    assert status == 413
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server + "/static/../app.py", timeout=10)
    assert e.value.code == 404
    status, out = _post(server, json.dumps({"text": TINY}).encode())
    assert status == 200  # still serving


def test_serve_binds_the_loopback_only():
    srv = make_server(0, quiet=True)
    try:
        assert srv.server_address[0] == "127.0.0.1"
    finally:
        srv.server_close()


# --- in the browser --------------------------------------------------------------------------


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is missing in CI: apt-get install -y chromium")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return exe


@pytest.mark.slow
def test_in_the_browser(server, golden, tmp_path):
    sync_api = require("playwright.sync_api", "pip install playwright (and apt-get install -y chromium)")
    if not HAS_DOT:
        pytest.skip("the diagram needs Graphviz's dot (CI installs it)")
    exe = _chromium()
    shots = ROOT / "docs" / "img" if golden.update else tmp_path
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 820})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server + "/")
        page.wait_for_selector("body[data-state=ok]")
        assert "gpt2" in page.evaluate("playground.svg")

        def until(js: str, timeout: float = 30.0) -> None:
            # polled with evaluate: the page's Content-Security-Policy forbids the eval
            # that wait_for_function would need
            import time

            end = time.monotonic() + timeout
            while not page.evaluate(js):
                assert time.monotonic() < end, f"timed out waiting for {js}"
                time.sleep(0.05)

        def settled(after: int) -> None:
            until(f"Number(document.body.dataset.seq) > {after} && ['ok','error'].includes(document.body.dataset.state) && !playground.timer_pending")

        def seq() -> int:
            return int(page.evaluate("document.body.dataset.seq"))

        # type a spec: its diagram replaces GPT-2's
        n = seq()
        page.fill("#src", TINY)
        settled(n)
        svg1 = page.evaluate("playground.svg")
        assert "tiny" in svg1 and "gpt2" not in svg1
        # type a new stage, key by key: the diagram gains it
        page.click("#src")
        page.evaluate("document.getElementById('src').setSelectionRange(%d, %d)" % ((TINY.index("  norm layernorm\n  nozzle"),) * 2))
        n = seq()
        page.keyboard.type("  stage tap {\n    prechamber probe { turbine mlp ratio=2 }\n  }\n")
        settled(n)
        until("playground.svg.includes('tap')")
        assert page.evaluate("document.body.dataset.state") == "ok"
        page.screenshot(path=str(shots / "playground.png"))
        # a typo: the diagnostic sits at its line, inline and in the list
        text = page.input_value("#src")
        typo_line = text[: text.index("heads=4")].count("\n") + 1
        n = seq()
        page.fill("#src", text.replace("heads=4", "haeds=4"))
        settled(n)
        assert page.evaluate("document.body.dataset.state") == "error"
        li = page.locator("#diagnostics li.error")
        assert li.count() == 1 and li.get_attribute("data-code") == "E0201" and int(li.get_attribute("data-line")) == typo_line
        assert "did you mean 'heads'?" in li.inner_text()
        marked = page.locator("#highlight .line.error")
        assert marked.count() == 1 and int(marked.get_attribute("data-line")) == typo_line and "haeds" in marked.inner_text()
        assert "E0201" in page.locator("#highlight .inline.error").inner_text()
        page.screenshot(path=str(shots / "playground_error.png"))
        # fixed: it clears
        n = seq()
        page.fill("#src", text)
        settled(n)
        assert page.evaluate("document.body.dataset.state") == "ok" and page.locator("#diagnostics li").count() == 0
        assert page.locator("#highlight .line.error").count() == 0
        # labels and views switch, live
        both = page.evaluate("playground.svg")
        n = seq()
        page.select_option("#labels", "ml")
        settled(n)
        ml = page.evaluate("playground.svg")
        assert ml != both
        n = seq()
        page.select_option("#view", "graph")
        settled(n)
        assert page.evaluate("playground.svg") not in (ml, both)
        # the report and the generated source
        page.click("button[data-tab=source]")
        assert "class Tap(nn.Module)" in page.inner_text("#source")
        page.click("button[data-tab=report]")
        assert "parameters:" in page.inner_text("#report")
        # highlighting: keywords, kinds and options from the tables
        assert page.locator("#highlight .kw", has_text="prechamber").count() >= 1
        assert page.locator("#highlight .kind", has_text="attention").count() == 1
        assert page.locator("#highlight .opt", has_text="heads").count() == 1
        # the share link carries the spec: a new page opened on it shows the same text
        page.click("#share")
        url = page.url
        assert "#spec=" in url
        other = browser.new_page()
        other.goto(url)
        other.wait_for_selector("body[data-state=ok]")
        assert other.input_value("#src") == text
        browser.close()
    assert errors == []


@pytest.mark.slow  # starts the server in a subprocess
def test_the_command(tmp_path):
    import re
    import socket
    import subprocess
    import sys

    spec = tmp_path / "mine.cycle"
    spec.write_text(TINY, "utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "cyclelang.cli", "serve", str(spec), "--port", "0", "--quiet"], stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/api/initial", timeout=10) as r:
            assert json.loads(r.read()) == {"text": TINY, "name": str(spec)}
        # includes resolve beside SPEC
        (tmp_path / "blocks.cycle").write_text("stage blk { prechamber p { turbine mlp } }\n", "utf-8")
        with_include = 'include "blocks.cycle"\n' + TINY.replace("  norm layernorm\n  nozzle", "  stage blk\n  norm layernorm\n  nozzle")
        status, out = _post(f"http://127.0.0.1:{m.group(1)}", json.dumps({"text": with_include}).encode())
        assert status == 200 and out["diagnostics"] == [] and out["stages"] == ["block", "blk"]
        # the port is taken now: a second server on it is a usage error, not a traceback
        r = subprocess.run([sys.executable, "-m", "cyclelang.cli", "serve", "--port", m.group(1)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=30)
        assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert spec.read_text("utf-8") == TINY  # read once, never written
