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
import datetime
import json
import os
import signal
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


def _kubectl_run(cluster: Cluster, name: str, *args: str) -> str:
    """`kubectl run` of a sleeping pod in `team` requesting 100m CPU and no CPU limit."""
    spec = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": name,
                "image": "headroom.local/busybox:1",
                "imagePullPolicy": "Never",
                "command": ["sleep", "36000"],
                "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
            }
        ],
    }
    return cluster.run(
        KUBECTL, "run", name, "-n", "team", "--image=headroom.local/busybox:1", "--image-pull-policy=Never",
        "--overrides", json.dumps({"spec": spec}), *args,
    )  # fmt: skip


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
    created = _kubectl_run(cluster, "app", "-o", "jsonpath={.spec.containers[0].resources.limits.cpu}")
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


def _renewed(api: Api) -> datetime.datetime:
    renew = api.get(LEASE)["spec"].get("renewTime") or "1970-01-01T00:00:00.000000Z"
    return datetime.datetime.fromisoformat(renew.replace("Z", "+00:00"))


def _generation(api: Api, ns: str, name: str) -> int:
    return int(api.get(pod_path(ns, name))["metadata"]["generation"])  # one more per resize


def test_a_killed_leader_an_upgrade_an_uninstall_and_a_reinstall_write_nothing_they_need_not(
    cluster: Cluster,
) -> None:
    """Continues from the install above: the pod `app` in `team` holds its fair limit."""
    api = cluster.api
    assert _limit(api, "team", "app") == 1000
    written = _generation(api, "team", "app")
    # The leader's container killed (SIGKILL to its processes, as an OOM kill or a crash
    # does: no graceful Lease release). The kubelet restarts it within a second or two; the
    # Lease names the pod, so whichever of the restarted container and the standby renews it
    # first leads, and no one writes in between (the dead process cannot).
    leader = cluster.leader()
    pod = api.get(pod_path(NS, leader))
    cgroup = cluster.node.container_cgroup(pod["status"]["containerStatuses"][0]["containerID"])
    assert cgroup is not None
    killed_at, killed = datetime.datetime.now(datetime.UTC), time.monotonic()
    for pid in (cgroup / "cgroup.procs").read_text().split():
        os.kill(int(pid), signal.SIGKILL)
    _wait("the Lease renewed after the kill", lambda: _renewed(api) > killed_at, timeout=60)
    crash_takeover = time.monotonic() - killed
    assert crash_takeover < 15 + 2 + 5
    _wait("two Ready replicas again", lambda: len(cluster.ready()) == 2)
    # The leader pod deleted (what a node drain or `kubectl delete pod` does): it lets the
    # Lease go on SIGTERM and the standby takes over at once.
    leader = cluster.leader()
    deleted = time.monotonic()
    cluster.run(KUBECTL, "delete", "pod", "-n", NS, leader, "--wait=false")
    new_leader = _wait("a new leader", lambda: (holder := cluster.leader()) != leader and holder, timeout=60)
    takeover = time.monotonic() - deleted
    assert takeover < 15 + 2 + 5 and new_leader in cluster.ready()
    _wait("two Ready replicas again", lambda: len(cluster.ready()) == 2)
    # A new pod during all this still gets its limits; the converged one is not written again.
    _kubectl_run(cluster, "second")
    # Two managed pods of 100m share the slack of 2 CPUs less four requests of 100m (the two
    # controller replicas and themselves): 100m + 800m each.
    _wait(
        "both at their fair share",
        lambda: _limit(api, "team", "app") == _limit(api, "team", "second") == 900,
        timeout=60,
    )
    shared = {name: _generation(api, "team", name) for name in ("app", "second")}
    assert shared["app"] == written + 1  # the one cut the second pod asked for, from one writer
    # helm upgrade to a changed value: a rolling update. The new replicas book CPU on the
    # node before the old ones go (maxSurge), so the neighbours' shares shrink and come back:
    # a resize per booking change the deadband lets through, at most four (two arrivals, two
    # departures), no limit lost, and the same limits once it has settled.
    cluster.run(HELM, "upgrade", "headroom", str(CHART), "-n", NS, "--reuse-values", "--set", "logLevel=debug",
                "--wait", "--timeout", "180s")  # fmt: skip
    _wait("the upgraded replicas Ready", lambda: len(cluster.ready()) == 2)
    _wait("the limits back", lambda: _limit(api, "team", "app") == _limit(api, "team", "second") == 900)
    upgraded = {name: _generation(api, "team", name) for name in ("app", "second")}
    during = {name: upgraded[name] - shared[name] for name in shared}
    assert all(n <= 4 for n in during.values()), during
    # helm uninstall: the pods keep their limits; what stays is what the controller and the
    # user made (CRDs, the HeadroomConfig, the webhook Secret and the Lease in the release
    # namespace), nothing of the release.
    cluster.run(HELM, "uninstall", "headroom", "-n", NS, "--wait", "--timeout", "120s")
    _wait(
        "the controller pods gone",
        lambda: not cluster.api.get(f"/api/v1/namespaces/{NS}/pods")["items"],
        timeout=60,
    )
    assert _limit(api, "team", "app") == _limit(api, "team", "second") == 900
    left = cluster.run(KUBECTL, "get", "all,mutatingwebhookconfigurations,secrets,leases", "-n", NS, "-o", "name")
    assert sorted(left.split()) == ["lease.coordination.k8s.io/headroom", "secret/headroom-webhook-tls"], left
    assert cluster.run(KUBECTL, "get", "headroomconfig", "cluster", "-o", "name").strip()
    # Reinstalled: it finds everything at its target and writes no resize.
    cluster.run(
        HELM, "install", "headroom", str(CHART), "--namespace", NS,
        "--set", "image.repository=headroom.local/kube-headroom", "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    _wait("a leader after the reinstall", lambda: cluster.leader() in cluster.ready())
    time.sleep(3)
    assert {name: _generation(api, "team", name) for name in ("app", "second")} == upgraded
    print(f"\nresizes of each neighbour during the upgrade: {during}")
    print(f"leader's container killed: the Lease renewed {crash_takeover:.1f}s later")
    print(f"leader pod deleted: {new_leader} leads {takeover:.1f}s later")
