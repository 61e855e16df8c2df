"""The chart installed as a user installs it, on a cluster of real parts whose pods reach
Services: the controller image built here (`make image`) in the real node's containerd,
`helm install` and `kubectl` as typed, the controller in pods, the webhook called by the
API server through its Service.

Its own cluster, apart from the other real-cluster tests: the API server listens on the
node bridge's gateway too and publishes it as the `kubernetes` Service's endpoint, which
kube-proxy (nftables mode) routes the ClusterIP to; ServiceAccount tokens are mounted;
webhooks are dialled at their Services' endpoints (`--enable-aggregator-routing`, so the
API server on the host reaches the webhook pod's address over the bridge).
"""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chart import CHART, HELM, TOOLS
from headroom.cluster.api import Api, ApiError, pod_path
from headroom.core.quantity import cpu_milli
from headroom.testbed.controller_image import build as build_image
from headroom.testbed.controlplane import ControlPlane, build
from headroom.testbed.node import RealNode, build_node

ROOT = Path(__file__).resolve().parents[3]
KUBECTL = TOOLS / "bin" / "kubectl"
NS = "kube-headroom"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/headroom"


class Cluster:
    def __init__(self, cp: ControlPlane, node: RealNode) -> None:
        self.cp, self.node, self.api = cp, node, cp.api()
        self.kubeconfig = str(cp.kubeconfig())

    def run(self, tool: Path, *args: str, timeout: float = 240) -> str:
        r = subprocess.run(
            [str(tool), "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True, timeout=timeout
        )
        assert r.returncode == 0, f"{tool.name} {' '.join(args)}: {r.stdout}{r.stderr}"
        return r.stdout

    def controller_pods(self) -> list[dict[str, Any]]:
        pods = self.api.get(f"/api/v1/namespaces/{NS}/pods", {"labelSelector": "app.kubernetes.io/name=kube-headroom"})
        return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready(self) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self.controller_pods()
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
        ]

    def secret(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get(f"/api/v1/namespaces/{NS}/secrets/{name}")
        except ApiError:
            return None

    def serving(self) -> bool:
        """Every controller pod serves the webhook (the kubelet has put the Secret in its
        mounted directory)."""
        pods = self.controller_pods()
        return bool(pods) and all('"webhook serving"' in self.node.container_log(p, "controller") for p in pods)

    def leader(self) -> str:
        return str(self.api.get(LEASE)["spec"].get("holderIdentity") or "")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    image = build_image(tmp_path_factory.mktemp("image") / "kube-headroom.tar", ROOT)
    bins = build_node()
    cp = ControlPlane(build(), components_dir=bins)
    node = RealNode(cp, bins, service_network=True)
    cp.pod_gateway = node.gateway
    try:
        cp.start()
        node.start()
        node.import_image(image.path)
        yield Cluster(cp, node)
    finally:
        node.stop()
        cp.stop()


def _wait(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return value


def _limit(api: Api, ns: str, name: str) -> int:
    limits = api.get(pod_path(ns, name))["spec"]["containers"][0]["resources"].get("limits") or {}
    return cpu_milli(limits["cpu"]) if "cpu" in limits else 0


def test_helm_install_runs_the_controller_in_pods_and_the_webhook_behind_its_service(cluster: Cluster) -> None:
    began = time.monotonic()
    cluster.run(
        HELM,
        "install", "headroom", str(CHART), "--namespace", NS, "--create-namespace",
        "--set", "image.repository=headroom.local/kube-headroom", "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    installed = time.monotonic() - began
    # Both replicas Ready (the readiness probe answers once the caches are synced), one leader.
    pods = _wait("two Ready replicas", lambda: len(cluster.ready()) == 2 and cluster.ready())
    leader = _wait("a leader", cluster.leader)
    assert leader in pods
    # The leader issued the webhook certificate: the Secret exists and the caBundle trusts its CA.
    secret = _wait("the webhook Secret", lambda: cluster.secret("headroom-webhook-tls"))
    mwc = cluster.api.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/headroom")
    bundle = base64.b64decode(mwc["webhooks"][0]["clientConfig"].get("caBundle") or "")
    assert base64.b64decode(secret["data"]["ca.crt"]).strip() in bundle
    # The user's policy, as typed: a HeadroomConfig out of dry-run, a namespace opted in.
    config = Path(cluster.cp.workdir) / "headroomconfig.yaml"
    config.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n"
        "spec: {dryRun: false, debouncePeriod: 500ms}\n"
    )
    cluster.run(KUBECTL, "create", "namespace", "team")
    cluster.run(KUBECTL, "label", "namespace", "team", "kube-headroom.dev/mode=managed")
    cluster.run(KUBECTL, "apply", "--server-side", "-f", str(config))
    cluster.run(KUBECTL, "wait", "--for=condition=Ready", "headroomconfig/cluster", "--timeout=60s")
    _wait("both replicas serving the webhook", cluster.serving)
    # A pod the scheduler places: its limit at admission comes from the webhook, called by
    # the API server through the Service; then the controller in its pod gives the fair one.
    created = cluster.run(
        KUBECTL, "run", "app", "-n", "team", "--image=headroom.local/busybox:1", "--image-pull-policy=Never",
        "--overrides",
        '{"spec":{"terminationGracePeriodSeconds":0,"containers":[{"name":"app","image":"headroom.local/busybox:1",'
        '"imagePullPolicy":"Never","command":["sleep","36000"],'
        '"resources":{"requests":{"cpu":"100m","memory":"16Mi"},"limits":{"memory":"64Mi"}}}]}}',
        "-o", "jsonpath={.spec.containers[0].resources.limits.cpu}",
    )  # fmt: skip
    assert cpu_milli(created) == 200  # request × webhook.initialMultiplier (2)
    # The node has 2 CPUs; the two controller pods and this one book 100m each: the pod
    # alone is managed, so its limit is its request times maxMultiplier (10): 1 CPU.
    _wait("the fair limit", lambda: _limit(cluster.api, "team", "app") == 1000, timeout=60)
    pod = _wait(
        "the app running",
        lambda: (
            (p := cluster.api.get(pod_path("team", "app")))["status"].get("containerStatuses")
            and p["status"]["containerStatuses"][0]["state"].get("running")
            and p
        ),
    )
    cgroup = cluster.node.container_cgroup(pod["status"]["containerStatuses"][0]["containerID"])
    assert cgroup is not None
    _wait("the cgroup quota", lambda: int((cgroup / "cpu.cfs_quota_us").read_text()) == 100_000, timeout=15)
    print(f"\nhelm install --wait: {installed:.1f}s; leader {leader}")
