"""A page opened in a real headless browser (Debian's chromium, installed by `make tools`):
the DOM after its scripts ran."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def rendered(page: Path) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is installed by `make tools` (Debian's chromium package)"
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000", "--dump-dom"]
    dom = subprocess.run([chromium, *args, page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-rendered="yes"' in dom  # the script ran in the browser and drew the page
    return dom
