"""Rendering the Helm chart with the helm binary `make tools` unpacks."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kube-headroom"
TOOLS = ROOT / ".cache" / "tools"
HELM = TOOLS / "bin" / "helm"
PROMTOOL = TOOLS / "usr" / "bin" / "promtool"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM.exists(), "helm is unpacked by `make tools` (part of `make test`)"
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)


def render(*sets: str, namespace: str = "kube-headroom", release: str = "headroom") -> list[dict[str, Any]]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    r = helm(*args)
    assert r.returncode == 0, r.stderr
    return [d for d in YAML(typ="safe").load_all(r.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]
