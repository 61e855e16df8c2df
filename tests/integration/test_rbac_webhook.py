"""The chart's RBAC on an enforcing API server, and the webhook called by the real server."""

from __future__ import annotations

import contextlib

import pytest

from cluster_helpers import register_webhook
from factories import container, pod
from headroom.cluster.api import MERGE_PATCH, STRATEGIC_PATCH, ApiError, pod_path
from headroom.sim.controlplane import free_port

WEBHOOK = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def test_the_controller_identity_cannot_update_pods_patch_nodes_or_read_secrets(
    control_plane, api, namespace, make_node, controller_rbac
):
    node = make_node()
    body = pod("p", namespace=namespace, node=node, containers=[container(cpu="500m")])
    body.pop("status")
    created = api.post(f"/api/v1/namespaces/{namespace}/pods", body)
    ctl = control_plane.api(controller_rbac)
    denied = {
        "update a pod": lambda: ctl.request_json("PUT", pod_path(namespace, "p"), created),
        "patch a node": lambda: ctl.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"x": "y"}}}, MERGE_PATCH),
        "read a secret": lambda: ctl.get(f"/api/v1/namespaces/{namespace}/secrets"),
        "delete a pod": lambda: ctl.delete(pod_path(namespace, "p")),
    }
    for what, call in denied.items():
        with pytest.raises(ApiError) as err:
            call()
        assert err.value.status == 403, what
    # and what it needs is allowed
    ctl.patch(
        pod_path(namespace, "p", "resize"),
        {"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "1"}}}]}},
        STRATEGIC_PATCH,
        {"fieldManager": "headroom"},
    )
    ctl.patch(pod_path(namespace, "p"), {"metadata": {"annotations": {"kube-headroom.dev/status": "{}"}}}, MERGE_PATCH)


def test_webhook_gives_new_pods_a_limit_and_never_blocks_them(
    control_plane, api, namespace, headroom_config, start_controller, make_node, tmp_path
):
    make_node()  # the webhook decides with the nodes a pod can land on: there must be one
    headroom_config(webhook={"initialMultiplier": 3})
    certs = tmp_path / "webhook"
    certs.mkdir()
    control_plane.ca.issue(certs, "tls", ["127.0.0.1"])  # tls.crt, tls.key
    port = free_port()
    c = start_controller("--webhook-port", str(port), "--webhook-cert-dir", str(certs))
    name = f"headroom-test-{port}"
    register_webhook(api, name, port, control_plane.ca_file.read_bytes())
    other = f"{namespace}-plain"
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    try:

        def create(ns: str, pod_name: str) -> dict:
            body = pod(pod_name, namespace=ns, node=None, containers=[container(cpu="500m", mem_limit=None)])
            body.pop("status")
            return api.post(f"/api/v1/namespaces/{ns}/pods", body)

        born = create(namespace, "born")
        assert born["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1500m"}  # 500m x 3
        assert born["status"].get("qosClass", "Burstable") == "Burstable"
        plain = create(other, "plain")
        assert "limits" not in plain["spec"]["containers"][0]["resources"]

        c.stop()  # the webhook is gone: failurePolicy Ignore, the pod is created as asked
        unboosted = create(namespace, "unboosted")
        assert "limits" not in unboosted["spec"]["containers"][0]["resources"]
    finally:
        with contextlib.suppress(ApiError):
            api.delete(f"{WEBHOOK}/{name}")
        with contextlib.suppress(ApiError):
            api.delete(f"/api/v1/namespaces/{other}")
