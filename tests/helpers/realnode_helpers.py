"""Helpers for the tests on real nodes (tests/integration/realcluster/): pods as the real
controllers create them, and what the kernel gives their containers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from headroom.cluster.client import Api, ApiError, pod_path
from helpers.chart import TOOLS, render
from testbed.node import RealNode, busy_pod
from testbed.prometheus import PrometheusServer

PERIOD_US = 100_000  # the kubelet's CFS period
PROMETHEUS = TOOLS / "usr" / "bin" / "prometheus"


def wait_running(api: Api, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    """The pod once its first container runs."""
    deadline = time.monotonic() + timeout
    while True:
        pod = api.get(pod_path(ns, name))
        statuses = pod["status"].get("containerStatuses") or []
        if statuses and statuses[0].get("state", {}).get("running"):
            return pod
        assert time.monotonic() < deadline, f"{ns}/{name} not running: {pod['status']}"
        time.sleep(0.3)


def node_pods(api: Api, node: str) -> list[dict[str, Any]]:
    return api.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})["items"]


def wait_node_empty(api: Api, *nodes: str, timeout: float = 60) -> None:
    """Until what earlier tests left on these nodes is gone (their namespaces are deleted)."""
    deadline = time.monotonic() + timeout
    while left := [p["metadata"]["name"] for n in nodes for p in node_pods(api, n)]:
        assert time.monotonic() < deadline, left
        time.sleep(0.5)


def wait_quota(node: RealNode, api: Api, ns: str, name: str, quota_us: int, timeout: float = 15) -> float:
    """Seconds until the pod's first container's cgroup holds `cpu.cfs_quota_us` = quota_us."""
    start = time.monotonic()
    cid = wait_running(api, ns, name)["status"]["containerStatuses"][0]["containerID"]
    cgroup = node.container_cgroup(cid)
    assert cgroup is not None, f"{ns}/{name}: no cgroup for {cid} under {node.cgroup_root}"
    while (q := int((cgroup / "cpu.cfs_quota_us").read_text())) != quota_us:
        if time.monotonic() - start > timeout:
            status = api.get(pod_path(ns, name))["status"]
            raise AssertionError(
                f"{ns}/{name}: cfs_quota_us {q}, expected {quota_us}; the kubelet says "
                f"conditions {status.get('conditions')}, containers {status.get('containerStatuses')}"
            )
        time.sleep(0.05)
    return time.monotonic() - start


def deploy(
    api: Api,
    ns: str,
    name: str,
    replicas: int,
    limited: bool = False,
    request: str = "100m",
    spread: bool = False,
) -> list[dict[str, Any]]:
    """A Deployment of sleeping pods requesting `request` and no CPU limit, as the ReplicaSet
    controller creates them (with `spread`, one more on a node than on another at most, as
    a topology spread constraint asks the scheduler); its pods once each has a container
    status (and, with `limited`, a CPU limit)."""
    labels = {"app": name}
    template = busy_pod(name, None, request, None, busy=False)
    if spread:
        template["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": labels},
            }
        ]
    api.post(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
            },
        },
    )
    deadline = time.monotonic() + 60
    while True:
        pods = api.get(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"app={name}"})["items"]
        ready = [p for p in pods if p["status"].get("containerStatuses")]
        if limited:
            ready = [p for p in ready if p["spec"]["containers"][0]["resources"].get("limits", {}).get("cpu")]
        if len(pods) == replicas and len(ready) == replicas:
            return pods
        assert time.monotonic() < deadline, [p["status"] for p in pods]
        time.sleep(0.5)


def metrics_reader(api: Api) -> str:
    """A token of ServiceAccount monitoring/prometheus, bound by the chart's own opt-in
    ClusterRole (`metrics.kubeletScrape`) that may get nodes/metrics and nothing else: what
    a Prometheus in the cluster needs for cAdvisor."""
    rbac = [
        d
        for d in render(
            "metrics.kubeletScrape.serviceAccount.name=prometheus",
            "metrics.kubeletScrape.serviceAccount.namespace=monitoring",
        )
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding")
        and d["metadata"]["name"].endswith("-kubelet-metrics-reader")
    ]
    assert len(rbac) == 2, rbac
    for path, body in (
        ("/api/v1/namespaces", {"metadata": {"name": "monitoring"}}),
        ("/api/v1/namespaces/monitoring/serviceaccounts", {"metadata": {"name": "prometheus"}}),
        *((f"/apis/rbac.authorization.k8s.io/v1/{d['kind'].lower()}s", d) for d in rbac),
    ):
        try:
            api.post(path, body)
        except ApiError as exc:  # already there from an earlier test of the session
            if exc.status != 409:
                raise
    review = api.post(
        "/api/v1/namespaces/monitoring/serviceaccounts/prometheus/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    return str(review["status"]["token"])


def start_prometheus(
    api: Api, node: RealNode, metrics_port: int, tmp: Path, rules: list[Path] | None = None
) -> PrometheusServer:
    """Prometheus scraping the node's kubelet (/metrics/cadvisor, as monitoring/prometheus)
    and the controller's /metrics on `metrics_port`, every 2 s."""
    return PrometheusServer(
        PROMETHEUS,
        tmp / "prometheus",
        [
            {
                "job_name": "kubelet-cadvisor",
                "scheme": "https",
                "metrics_path": "/metrics/cadvisor",
                "tls_config": {"insecure_skip_verify": True},  # the kubelet's self-signed serving certificate
                "authorization": {"credentials": metrics_reader(api)},
                "static_configs": [{"targets": [f"127.0.0.1:{node.kubelet_port}"]}],
            },
            {"job_name": "headroom", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
        ],
        rule_files=rules or [],
    ).start()


def firing(prom: PrometheusServer) -> set[str]:
    """The names of the alerts Prometheus says are firing now."""
    return {a["labels"]["alertname"] for a in prom.get("/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"}
