"""Helpers the integration tests share: create pods, wait for what the controller writes."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headroom.cluster.client import Api, ApiError, pod_path
from headroom.cluster.live import read_cluster
from headroom.core.planner import ClusterPlan, plan_cluster
from helpers.factories import container, pod

GROUP = "/apis/kube-headroom.dev/v1alpha1"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/default/leases/kube-headroom"  # the controller's, by default


def _newest() -> str:
    mod = (Path(__file__).resolve().parents[1] / "testenv" / "go.mod").read_text()
    return next(line.split()[1] for line in mod.splitlines() if line.strip().startswith("k8s.io/kubernetes v"))


# The API server the tests run against: HEADROOM_K8S_VERSION (pinned in tests/testenv), else
# the newest pinned release.
NEWEST_K8S = _newest()
K8S_VERSION = os.environ.get("HEADROOM_K8S_VERSION") or NEWEST_K8S
K8S_MINOR = int(K8S_VERSION.split(".")[1])


DRY_RUN = {"dryRun": "All"}  # a server-side dry run: admission judges, nothing is stored


def headroom_cli(
    kubeconfig: Path | str, command: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The `headroom` CLI as an admin types it on their workstation, with their kubeconfig."""
    return subprocess.run(
        [sys.executable, "-m", "headroom", command, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
    )


def kubectl(kubeconfig: Path | str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """kubectl (the tools' 1.36) as a user types it, with their kubeconfig."""
    from helpers.chart import TOOLS

    return subprocess.run(
        [str(TOOLS / "bin" / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def create_pod(api: Api, ns: str, node: str, name: str, **kw: Any) -> dict[str, Any]:
    body = pod(name, namespace=ns, node=node, **kw)
    body["status"] = {}
    return api.post(f"/api/v1/namespaces/{ns}/pods", body)


def wait_limit_range_enforced(api: Api, ns: str, node: str, timeout: float = 15.0) -> float:
    """Seconds until the LimitRanger admission enforces a LimitRange just created in `ns`
    (it reads LimitRanges from a cache): a server-side dry run of a pod with a CPU limit of
    100 cores, above any max here, is refused."""
    body = pod("limitrange-probe", namespace=ns, node=node, containers=[container(cpu="200m", limit="100")])
    body["status"] = {}
    return wait_refused(
        f"a LimitRange of {ns}", lambda: api.post(f"/api/v1/namespaces/{ns}/pods", body, DRY_RUN), timeout
    )


def wait_refused(what: str, send: Callable[[], Any], timeout: float) -> float:
    """Seconds until `send()` (a server-side dry run) is refused with 403: an admission rule
    just created (a LimitRange, a ValidatingAdmissionPolicy) is read from a cache."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            send()
        except ApiError as exc:
            if exc.status == 403:
                return time.monotonic() - start
            raise
        time.sleep(0.1)
    raise AssertionError(f"{what}: not enforced within {timeout}s")


def live_plan(api: Api) -> ClusterPlan:
    """What `headroom plan` decides on the live cluster."""
    snap = read_cluster(api)
    return plan_cluster(
        snap.nodes, snap.pods, snap.namespaces, snap.resolver(), pod_level_resize=True, neighbours=snap.neighbours
    )


def cpu_limits(api: Api, ns: str, name: str) -> list[str | None]:
    p = api.get(pod_path(ns, name))
    return [(c.get("resources") or {}).get("limits", {}).get("cpu") for c in p["spec"]["containers"]]


def wait_limits(api: Api, ns: str, name: str, expected: list[str], timeout: float) -> float:
    """Seconds until the pod's container CPU limits are `expected`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cpu_limits(api, ns, name) == expected:
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"{ns}/{name}: limits {cpu_limits(api, ns, name)}, expected {expected} within {timeout}s")


def wait_annotation(api: Api, ns: str, name: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = (api.get(pod_path(ns, name))["metadata"].get("annotations") or {}).get("kube-headroom.dev/status")
        if value:
            return str(value)
        time.sleep(0.1)
    raise AssertionError(f"{ns}/{name}: no kube-headroom.dev/status annotation in {timeout}s")


def versions(api: Api, ns: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["metadata"]["resourceVersion"]
        for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    }


def events(api: Api, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"] if e["reason"] == reason]


def node_events(api: Api, node: str, reason: str = "CPULimitAdjusted") -> list[dict[str, Any]]:
    """Events about a node (recorded in `default`), oldest first."""
    found = [e for e in events(api, "default", reason) if e["regarding"].get("kind") == "Node"]
    return sorted((e for e in found if e["regarding"]["name"] == node), key=lambda e: e["eventTime"])


def wait_node_event(api: Api, node: str, reason: str = "CPULimitAdjusted", timeout: float = 10.0) -> dict[str, Any]:
    """The node's first such event, waiting for it (events go out after the resizes)."""
    deadline = time.monotonic() + timeout
    while not (found := node_events(api, node, reason)):
        assert time.monotonic() < deadline, f"no {reason} event on node {node} within {timeout}s"
        time.sleep(0.2)
    return found[0]


def cond(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def wait_for(api: Api, path: str, check: Callable[[dict[str, Any]], bool], timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        obj = api.get(path)
        if check(obj):
            return obj
        assert time.monotonic() < deadline, f"{path}: status never matched: {obj.get('status')}"
        time.sleep(0.2)


def profile(api: Api, name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return api.apply(
        {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "NodePoolProfile",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": labels}, **spec},
        },
        "headroom-tests",
    )


class SecretMount:
    """What the kubelet does for a Secret volume: write its keys as files, and again when it changes."""

    def __init__(self, api: Api, namespace: str, name: str, target: Path) -> None:
        self.api, self.path, self.target = api, f"/api/v1/namespaces/{namespace}/secrets/{name}", target
        self._stop = threading.Event()
        self._version = ""

    def sync(self) -> None:
        try:
            secret = self.api.get(self.path)
        except ApiError:
            return  # optional: not there yet
        if secret["metadata"]["resourceVersion"] == self._version:
            return
        for key, value in (secret.get("data") or {}).items():
            tmp = self.target / f".{key}.tmp"
            tmp.write_bytes(base64.b64decode(value))
            tmp.replace(self.target / key)
        self._version = secret["metadata"]["resourceVersion"]

    def start(self) -> SecretMount:
        def loop() -> None:
            while not self._stop.wait(0.5):
                self.sync()

        threading.Thread(target=loop, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()


def register_webhook(api: Api, name: str, port: int, ca: bytes | None) -> None:
    """A MutatingWebhookConfiguration like the chart's, calling the webhook on loopback by URL
    (the test server has no Service network); without `ca`, the controller fills the caBundle."""
    client: dict[str, Any] = {"url": f"https://127.0.0.1:{port}/mutate"}
    if ca is not None:
        client["caBundle"] = base64.b64encode(ca).decode()
    api.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "pods.kube-headroom.dev",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 2,
                    "namespaceSelector": {"matchLabels": {"kube-headroom.dev/mode": "managed"}},
                    "rules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ],
                    "clientConfig": client,
                }
            ],
        },
        "headroom-tests",
    )


CONTROLLER_TOKEN = "headroom-test-controller-token"


def install_crds(api: Api, root: Path | None = None) -> list[str]:
    """Install crds/ (of this checkout, or of the checkout at `root`) and wait until the
    server serves both kinds; their names."""
    from ruamel.yaml import YAML

    names = []
    for path in sorted((root or Path(__file__).resolve().parents[2]).joinpath("crds").glob("*.yaml")):
        crd = YAML(typ="safe").load(path.read_text())
        api.apply(crd, "headroom-tests")
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + 30
    for name in names:
        while True:
            crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c for c in (crd.get("status") or {}).get("conditions") or []}
            if conds.get("Established", {}).get("status") == "True":
                break
            assert time.monotonic() < deadline, f"{name} not Established: {conds}"
            time.sleep(0.2)
    return names


def apply_config(api: Api, spec: dict[str, Any], manager: str = "headroom-tests", within: float = 30.0) -> None:
    """Apply the HeadroomConfig `cluster` with this spec, again while the server refuses
    it: a CRD just created or changed is served (and validates with its new schema) a
    moment after it is written."""
    deadline = time.monotonic() + within
    body = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    while True:
        try:
            api.apply({**body, "spec": spec}, manager)
            return
        except ApiError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def bind_controller(api: Api) -> str:
    """Bind the test identity `headroom-controller` to the chart's rendered ClusterRole and
    lease Role, and nothing else; its token. So the e2e tests prove the chart's RBAC is
    enough (and RBAC is enforced)."""
    from helpers.chart import render

    user = [{"kind": "User", "name": "headroom-controller", "apiGroup": "rbac.authorization.k8s.io"}]
    for doc in render(namespace="default"):
        if doc["kind"] in ("ClusterRole", "Role"):
            api.apply(doc, "headroom-tests")
        elif doc["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            api.apply({**doc, "subjects": user}, "headroom-tests")
    return CONTROLLER_TOKEN


def install_published_crd(api: Api, module: str, manifest: str, name: str) -> str:
    """A CRD another project publishes (its module pinned in tests/crds-published/go.mod),
    read from `manifest` in the module, installed and served; its name."""
    import json
    import subprocess

    from ruamel.yaml import YAML

    found = subprocess.run(
        ["go", "mod", "download", "-json", module],
        cwd=Path(__file__).resolve().parents[1] / "crds-published",
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    for doc in YAML(typ="safe").load_all((Path(json.loads(found.stdout)["Dir"]) / manifest).read_text()):
        if doc and doc.get("kind") == "CustomResourceDefinition" and doc["metadata"]["name"] == name:
            api.apply(doc, "headroom-tests")
    deadline = time.monotonic() + 30
    while True:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established", {}).get("status") == "True":
            return name
        assert time.monotonic() < deadline, f"{name} not Established: {conds}"
        time.sleep(0.2)


def install_vpa_crd(api: Api) -> str:
    """The published VerticalPodAutoscaler CRD, installed and served."""
    return install_published_crd(
        api,
        "k8s.io/autoscaler/vertical-pod-autoscaler",
        "deploy/vpa-v1-crd-gen.yaml",
        "verticalpodautoscalers.autoscaling.k8s.io",
    )


def install_prometheus_operator_crds(api: Api) -> list[str]:
    """The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, as it publishes them."""
    return [
        install_published_crd(
            api,
            "github.com/prometheus-operator/prometheus-operator",
            f"example/prometheus-operator-crd/monitoring.coreos.com_{plural}.yaml",
            f"{plural}.monitoring.coreos.com",
        )
        for plural in ("servicemonitors", "prometheusrules")
    ]


def vpa(api: Api, ns: str, name: str, target: str, kind: str = "Deployment", **policy: Any) -> None:
    """A VerticalPodAutoscaler for the workload `kind`/`target`; `policy` goes into a
    container policy for every container (e.g. controlledValues="RequestsOnly")."""
    spec: dict[str, Any] = {
        "targetRef": {
            "apiVersion": "batch/v1" if kind in ("Job", "CronJob") else "apps/v1",
            "kind": kind,
            "name": target,
        },
        "updatePolicy": {"updateMode": "InPlaceOrRecreate"},
    }
    if policy:
        spec["resourcePolicy"] = {"containerPolicies": [{"containerName": "*", **policy}]}
    body = {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"name": name},
        "spec": spec,
    }
    api.post(f"/apis/autoscaling.k8s.io/v1/namespaces/{ns}/verticalpodautoscalers", body)
