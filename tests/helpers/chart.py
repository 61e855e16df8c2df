"""Rendering the Helm chart with the helm binary `make tools` unpacks."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
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


def dashboard_queries() -> list[str]:
    (cm,) = find(render(), "ConfigMap")
    dash = json.loads(cm["data"]["kube-headroom.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in (dash.get("templating") or {}).get("list", []):
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if isinstance(q, str) and q.startswith("label_values("):  # Grafana's, not PromQL: its selector is
            exprs.append(q[len("label_values(") :].rsplit(",", 1)[0])
    return exprs


def dashboard_metric_names() -> set[str]:
    """The headroom_* series the dashboard reads (the rest are the kubelet's cAdvisor series)."""
    return set(re.findall(r"\bheadroom_[a-z_]+", " ".join(dashboard_queries())))
