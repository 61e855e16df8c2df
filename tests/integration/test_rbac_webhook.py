"""The chart's RBAC on an enforcing API server, and the webhook called by the real server."""

from __future__ import annotations

import contextlib
import time

import pytest

from headroom.cluster.client import MERGE_PATCH, STRATEGIC_PATCH, Api, ApiError, pod_path
from helpers.factories import container, pod


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
    api, namespace, headroom_config, webhook_controller, make_node
):
    make_node()  # the webhook decides with the nodes a pod can land on: there must be one
    headroom_config(webhook={"initialMultiplier": 3})
    c, _ = webhook_controller("headroom-test")
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
            api.delete(f"/api/v1/namespaces/{other}")


def test_the_admission_policy_lets_the_controller_write_only_its_annotations(
    control_plane, api, namespace, make_node, headroom_config, start_controller, tmp_path
):
    """The chart's ValidatingAdmissionPolicy, on the real API server, for the chart's own
    ServiceAccount: an image, a label or a foreign annotation changed with its token is
    refused; the controller, running as that identity, still resizes and annotates."""
    import uuid

    from headroom.cluster.client import connect, object_path
    from helpers.chart import find, render
    from helpers.cluster_helpers import create_pod, wait_annotation, wait_limits
    from testbed.sim_kubelet import SimulatedKubelet

    ns = release = f"vap-{uuid.uuid4().hex[:6]}"
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    docs = render(namespace=ns, release=release)
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    kinds += ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    applied = [d for d in docs if d["kind"] in kinds]
    for doc in applied:
        api.apply(doc, "headroom-tests")
    try:
        (sa,) = (a for a in find(docs, "ServiceAccount") if a["metadata"]["name"] == release)  # the controller's
        token = api.post(
            f"/api/v1/namespaces/{ns}/serviceaccounts/{sa['metadata']['name']}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )["status"]["token"]
        kubeconfig = control_plane.kubeconfig(token, tmp_path / "sa-kubeconfig")
        as_sa = Api(connect(str(kubeconfig)))
        headroom_config()
        node = make_node(cpu="8")
        with SimulatedKubelet(api, node):
            create_pod(api, namespace, node, "web", containers=[container(cpu="500m")])
            path = pod_path(namespace, "web")

            def refused(body: dict) -> str | None:
                try:
                    as_sa.patch(path, body, STRATEGIC_PATCH)  # containers merge by name
                except ApiError as exc:
                    return exc.message
                return None

            image = {"spec": {"containers": [{"name": "app", "image": "attacker.example/miner:1"}]}}
            deadline = time.monotonic() + 20
            while (why := refused(image)) is None or "ValidatingAdmissionPolicy" not in why:
                assert time.monotonic() < deadline, f"the image change is still let through: {why}"
                api.patch(
                    path,
                    {"spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}},
                    STRATEGIC_PATCH,
                )
                time.sleep(0.5)
            assert "may not change a pod's spec" in why, why
            assert "may change only kube-headroom.dev/ annotations" in (
                refused({"metadata": {"annotations": {"example.com/owner": "me"}}}) or ""
            )
            assert "may not change" in (refused({"metadata": {"labels": {"app": "other"}}}) or "")
            assert refused({"metadata": {"annotations": {"kube-headroom.dev/probe": "x"}}}) is None  # its own prefix
            # Through pods/resize its token may change CPU limits only: requests, memory, a
            # CPU limit removed are refused; and never in kube-system or its own namespace.
            for where in ("kube-system", ns):
                create_pod(
                    api, where, node, f"sys-{ns}", containers=[container(cpu="100m", limit="200m", mem_limit="128Mi")]
                )
            create_pod(
                api,
                namespace,
                node,
                f"sys-{ns}",
                containers=[container(cpu="100m", limit="200m", mem="64Mi", mem_limit="128Mi")],
            )
            sys_path = pod_path(namespace, f"sys-{ns}") + "/resize"

            def resize(resources: dict, dry: str = "") -> str | None:
                body = {"spec": {"containers": [{"name": "app", "resources": resources}]}}
                try:
                    as_sa.patch(sys_path + dry, body, STRATEGIC_PATCH)
                except ApiError as exc:
                    return exc.message
                return None

            try:
                deadline = time.monotonic() + 20  # until the API server enforces the new policy
                while resize({"requests": {"cpu": "200m"}}, "?dryRun=All") is None:
                    assert time.monotonic() < deadline, "a request change through pods/resize is still let through"
                    time.sleep(0.5)
                shapes = {
                    "cpu request": {"requests": {"cpu": "200m"}, "limits": {"cpu": "400m"}},
                    "memory request": {"requests": {"memory": "96Mi"}},
                    "memory limit": {"limits": {"memory": "256Mi"}},
                    "cpu and memory requests and the memory limit": {
                        "requests": {"cpu": "150m", "memory": "100Mi"},
                        "limits": {"memory": "200Mi"},
                    },
                }
                for what, resources in shapes.items():
                    why = resize(resources)
                    assert why is not None and "may change only containers' CPU limits" in why, (what, why)
                assert resize({"limits": {"cpu": "300m"}}) is None  # a CPU limit: allowed
                for where in ("kube-system", ns):  # not there
                    try:
                        as_sa.patch(
                            pod_path(where, f"sys-{ns}") + "/resize",
                            {"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "300m"}}}]}},
                            STRATEGIC_PATCH,
                        )
                        refused_there = ""
                    except ApiError as exc:
                        refused_there = exc.message
                    assert f"never resizes pods in {ns} (its own) or kube-system" in refused_there, (
                        where,
                        refused_there,
                    )
                got = api.get(pod_path(namespace, f"sys-{ns}"))["spec"]["containers"][0]["resources"]
                assert got == {
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "300m", "memory": "128Mi"},
                }
                # A pod-level pod made with requests only (as before pod-level limits were
                # common): the controller's first pod-level CPU limit is not taken for a
                # memory change by the policy, whatever this release's defaulting adds.
                pod_node = make_node(features=["InPlacePodLevelResourcesVerticalScaling"])
                create_pod(
                    api,
                    namespace,
                    pod_node,
                    f"pl-{ns}",
                    containers=[container(cpu=None, mem=None, mem_limit=None)],
                    pod_resources={"requests": {"cpu": "500m", "memory": "1Gi"}},
                )
                try:
                    as_sa.patch(
                        pod_path(namespace, f"pl-{ns}") + "/resize",
                        {"spec": {"resources": {"limits": {"cpu": "2"}}}},
                        STRATEGIC_PATCH,
                    )
                    pod_level = ""
                except ApiError as exc:
                    pod_level = exc.message
                assert "Headroom controller" not in pod_level, pod_level  # the server's own gates may refuse
                print(f"\nthe controller's first pod-level CPU limit on this release: {pod_level or 'accepted'}")
            finally:
                made = [pod_path(where, f"sys-{ns}") for where in ("kube-system", ns, namespace)]
                for path in [*made, pod_path(namespace, f"pl-{ns}")]:
                    with contextlib.suppress(ApiError):
                        api.delete(path)
            # Secrets: RBAC lets its token create any name; the policy lets it write only its
            # webhook certificate, never a service-account token it could then read.
            secret_name = f"{release}-webhook-tls"

            def create_secret(name: str, kind: str, annotations: dict | None = None, dry: str = "") -> str | None:
                body = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "annotations": annotations or {}},
                    "type": kind,
                    "data": {"tls.crt": "", "tls.key": ""} if kind == "kubernetes.io/tls" else {},
                }
                try:
                    as_sa.post(f"/api/v1/namespaces/{ns}/secrets{dry}", body)
                except ApiError as exc:
                    return exc.message
                return None

            stolen = {"kubernetes.io/service-account.name": "default"}
            deadline = time.monotonic() + 20  # until the API server enforces the new policy
            while create_secret("probe", "Opaque", dry="?dryRun=All") is None:
                assert time.monotonic() < deadline, "the controller's token still creates any Secret"
                time.sleep(0.5)
            for name, kind, annotations in (
                (secret_name, "kubernetes.io/service-account-token", stolen),
                (secret_name, "Opaque", None),
                ("another", "kubernetes.io/tls", None),
            ):
                why = create_secret(name, kind, annotations)
                assert why is not None and "may write only its webhook certificate Secret" in why, (name, kind, why)
            assert create_secret(secret_name, "kubernetes.io/tls") is None  # what the controller writes
            api.delete(f"/api/v1/namespaces/{ns}/secrets/{secret_name}")
            # the controller, as this identity, writes its limit and its status annotation
            start_controller("--lease-namespace", ns, kubeconfig=kubeconfig)
            wait_limits(api, namespace, "web", ["5"], timeout=20)
            assert '"target":"5000m"' in wait_annotation(api, namespace, "web", timeout=20)
            got = api.get(path)
            assert got["spec"]["containers"][0]["image"] == "registry.example/app:1"
    finally:
        for doc in applied:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding") or doc["kind"].startswith("Validating"):
                with contextlib.suppress(ApiError):
                    api.delete(object_path(doc))
        with contextlib.suppress(ApiError):
            api.delete(f"/api/v1/namespaces/{ns}")
