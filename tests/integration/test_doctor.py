"""`headroom doctor` against the real API server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster_helpers import K8S_VERSION

pytestmark = pytest.mark.version_sensitive

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
    assert f"ok    server: {K8S_VERSION}" in out and "ok    pods/resize: served" in out
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


def test_doctor_says_whether_a_controller_is_leading(control_plane, api, headroom_config, start_controller):
    headroom_config()
    admin = control_plane.kubeconfig()
    c = start_controller("--identity", "doctor-leader")
    c.wait_for_log("became leader")
    out = doctor(admin).stdout
    assert "ok    leader: Lease default/kube-headroom held by doctor-leader" in out, out
    assert "WARN  controller: no kube-headroom Deployment in default" in out
    c.stop()  # SIGTERM hands the Lease back: nobody leads now
    # A Deployment of the chart with no ready replica (no controller-manager runs here: its
    # status stays empty, as for pods that never become ready).
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "kube-headroom",
            "namespace": "default",
            "labels": {"app.kubernetes.io/name": "kube-headroom", "app.kubernetes.io/instance": "kube-headroom"},
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "x"}},
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        },
    }
    api.post("/apis/apps/v1/namespaces/default/deployments", dep)
    try:
        r = doctor(admin)
        assert r.returncode == 1
        assert "FAIL  controller: Deployment default/kube-headroom has 0 of 2 replicas ready" in r.stdout, r.stdout
        assert (
            "FAIL  leader: Lease default/kube-headroom last renewed" in r.stdout
            and "no controller is leading" in r.stdout
        )
    finally:
        api.delete("/apis/apps/v1/namespaces/default/deployments/kube-headroom")
