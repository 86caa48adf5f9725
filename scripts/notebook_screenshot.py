"""Run examples/notebook.ipynb, export it to HTML with nbconvert and photograph the page in
Debian's chromium: docs/img/notebook.png, the README's picture of a Spec in a notebook.

    pip install nbconvert ipykernel playwright && python scripts/notebook_screenshot.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--execute", "--to", "html", "--output-dir", tmp,
                        str(ROOT / "examples" / "notebook.ipynb")], check=True, cwd=ROOT / "examples")
        page = Path(tmp) / "notebook.html"
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox", "--disable-gpu"])
            tab = browser.new_page(viewport={"width": 1100, "height": 900})
            tab.goto(page.as_uri())
            tab.wait_for_timeout(500)
            tab.screenshot(path=str(ROOT / "docs" / "img" / "notebook.png"), full_page=True)
            browser.close()
    print("wrote docs/img/notebook.png")


if __name__ == "__main__":
    main()
