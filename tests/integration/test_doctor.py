"""`headroom doctor` against the real API server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.cluster_helpers import K8S_VERSION, create_pod, headroom_cli

pytestmark = pytest.mark.version_sensitive

ROOT = Path(__file__).resolve().parents[2]


def doctor(kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return headroom_cli(kubeconfig, "doctor", timeout=60)


def test_doctor_reports_quota_limitrange_and_vpa_as_handled_and_finds_missing_rbac(
    control_plane, api, namespace, controller_rbac, vpa_crd, make_node, headroom_config
):
    headroom_config()
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

    api.post(
        f"/apis/autoscaling.k8s.io/v1/namespaces/{namespace}/verticalpodautoscalers",
        {
            "apiVersion": "autoscaling.k8s.io/v1",
            "kind": "VerticalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}},
        },
    )
    labels = {"pod-template-hash": "5d8f"}
    create_pod(
        api, namespace, make_node(cpu="4"), "web-5d8f-a", owner_kind="ReplicaSet", owner_name="web-5d8f", labels=labels
    )

    api.post(
        "/api/v1/namespaces",
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": f"{namespace}-typo", "labels": {"kube-headroom.dev/mode": "manged"}},
        },
    )
    as_admin = doctor(control_plane.kubeconfig())
    out = as_admin.stdout
    assert f"WARN  namespaces: namespace {namespace}-typo has the label kube-headroom.dev/mode=manged" in out, out
    api.delete(f"/api/v1/namespaces/{namespace}-typo")
    assert f"ok    server: {K8S_VERSION}" in out and "ok    pods/resize: served" in out
    # What the controller now handles itself is information, not a warning.
    assert f"info  resourcequota: {namespace}/q limits limits.cpu to 4: raises stay inside" in out, out
    assert f"info  limitrange: {namespace}/lr caps CPU limits (Container max 2)" in out, out
    assert (
        f"info  vpa: 1 pod(s) whose VerticalPodAutoscaler sets CPU limits are left to it ({namespace}/web-5d8f-a)"
        in out
    )
    assert "ok    rbac: checked every permission the controller needs" in out

    # the controller's own identity has exactly what it needs, and sees the same
    as_controller = doctor(control_plane.kubeconfig(controller_rbac)).stdout
    assert "FAIL  rbac" not in as_controller and "ok    rbac: checked every permission" in as_controller
    assert f"info  resourcequota: {namespace}/q" in as_controller

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


def test_doctor_finds_the_chart_install_by_its_labels_and_says_first_when_there_is_no_config(
    control_plane, api, crds_installed
):
    """The documented install: release `headroom` in namespace `kube-headroom`. doctor,
    run with no flags from a workstation, finds its Deployment and its Lease there; and
    before anything else it says that without a HeadroomConfig nothing is written."""
    import contextlib
    import datetime

    from headroom.cluster.client import ApiError

    with contextlib.suppress(ApiError):
        api.delete("/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster")
    # The Lease in a namespace of its own (--lease-namespace): before, doctor then looked for
    # the Deployment there, said "no kube-headroom Deployment in leases" and never FAILed.
    ns, leases = "kube-headroom", "headroom-leases"
    for name in (ns, leases):
        with contextlib.suppress(ApiError):
            api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    labels = {"app.kubernetes.io/name": "kube-headroom", "app.kubernetes.io/instance": "headroom"}
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "headroom", "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "controller",
                            "image": "x",
                            "args": ["run", f"--lease-namespace={leases}", "--lease-name=headroom"],
                        }
                    ]
                },
            },
        },
    }
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "headroom", "namespace": leases},
        "spec": {"holderIdentity": "headroom-abc", "leaseDurationSeconds": 15, "renewTime": now},
    }
    api.post(f"/apis/apps/v1/namespaces/{ns}/deployments", dep)
    api.post(f"/apis/coordination.k8s.io/v1/namespaces/{leases}/leases", lease)
    try:
        out = doctor(control_plane.kubeconfig()).stdout
        first = out.splitlines()[0]
        assert first.startswith("FAIL  config: no HeadroomConfig named 'cluster': nothing is written"), out
        # validate --live against that cluster: the profiles are fine, but it says nothing
        # is written there yet (before: a plain `ok`)
        live = headroom_cli(
            control_plane.kubeconfig(), "validate", "--live", "examples/nodepoolprofiles.yaml", timeout=60
        )
        assert live.returncode == 0 and live.stdout.startswith("ok:"), live.stdout + live.stderr
        assert "the cluster has no HeadroomConfig: the controller writes nothing" in live.stderr, live.stderr
        for flags in ((), ("--lease-namespace", leases)):
            out = headroom_cli(control_plane.kubeconfig(), "doctor", *flags, timeout=60).stdout
            assert f"ok    leader: Lease {leases}/headroom held by headroom-abc" in out, (flags, out)
            assert f"FAIL  controller: Deployment {ns}/headroom has 0 of 2 replicas ready" in out, (flags, out)
            assert "no kube-headroom Deployment" not in out, (flags, out)
    finally:
        with contextlib.suppress(ApiError):
            api.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/headroom")
        with contextlib.suppress(ApiError):
            api.delete(f"/apis/coordination.k8s.io/v1/namespaces/{leases}/leases/headroom")
