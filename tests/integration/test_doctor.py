"""`headroom doctor` against the real API server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def doctor(kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headroom", "doctor", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_doctor_finds_quota_limitrange_and_missing_rbac(control_plane, api, namespace, controller_rbac):
    api.post(
        f"/api/v1/namespaces/{namespace}/resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "q", "namespace": namespace},
            "spec": {"hard": {"limits.cpu": "4"}},
        },
    )
    api.post(
        f"/api/v1/namespaces/{namespace}/limitranges",
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "lr", "namespace": namespace},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}}]},
        },
    )

    as_admin = doctor(control_plane.kubeconfig())
    out = as_admin.stdout
    assert as_admin.returncode == 1, out + as_admin.stderr  # the quota is a failure
    assert "ok    server: v1.37.2" in out and "ok    pods/resize: served" in out
    assert f"FAIL  resourcequota: {namespace}/q limits limits.cpu to 4" in out
    assert f"WARN  limitrange: {namespace}/lr caps container CPU limits at 2000m" in out
    assert "ok    rbac: checked every permission the controller needs" in out

    # the controller's own identity has exactly what it needs, and cannot list quotas
    as_controller = doctor(control_plane.kubeconfig(controller_rbac)).stdout
    assert "FAIL  rbac" not in as_controller and "ok    rbac: checked every permission" in as_controller
    assert "WARN  resourcequota: not checked: this identity may not list resourcequotas" in as_controller

    as_nobody = doctor(control_plane.kubeconfig("headroom-test-nobody-token"))
    assert as_nobody.returncode == 1
    assert "FAIL  rbac: this identity may not list pods" in as_nobody.stdout
    assert "FAIL  read: cannot read the cluster" in as_nobody.stdout
