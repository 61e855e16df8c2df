"""`headroom plan -o html` opened in a real headless browser (Debian's chromium, installed
by `make tools`): the page renders, with the plan's numbers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers.browser import rendered

ROOT = Path(__file__).resolve().parents[2]


def test_the_html_report_renders_the_plans_numbers_in_a_browser(tmp_path):
    page = tmp_path / "plan.html"
    r = subprocess.run(
        [sys.executable, "-m", "headroom", "plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "html"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    page.write_text(r.stdout)
    dom = rendered(page)
    # batch-1: 16 cores, 8 booked by the managed pods, 8 slack; the worked example's targets
    section = dom[dom.index('data-node="batch-1"') :]
    section = section[: section.index("</section>")]
    assert re.search(r'class="managed" data-milli="8000"', section) and re.search(
        r'class="slack" data-milli="8000"', section
    )
    assert "factor 2.00" in section
    rows = dict(re.findall(r'data-pod="([^"]+)"><td>[^<]*</td>(.*?)</tr>', dom))
    cells = lambda pod: re.findall(r"<td[^>]*>([^<]*)</td>", rows[pod])  # noqa: E731
    assert cells("ci/build-a") == ["Managed", "0.50", "-", "1.50", "yes"]
    assert cells("ci/build-c") == ["Managed", "6.00", "8.00", "12.00", "yes"]
    assert cells("shop/db-0") == ["NotBurstable", "2.00", "2.00", "-", "-"]
