"""The install cluster: the chart installed as a user installs it, on a cluster of real
parts whose pods reach Services (tests/integration/install/). Each test module starts its
own with `installed_cluster`.

The API server listens on the node bridge's gateway too and publishes it as the
`kubernetes` Service's endpoint, which kube-proxy (nftables mode) routes the ClusterIP to;
ServiceAccount tokens are mounted; webhooks are dialled at their Services' endpoints
(`--enable-aggregator-routing`, so the API server on the host reaches the webhook pod's
address over the bridge). The controller image built here (`make image`) is imported into
the real node's containerd. An audit log records the controller's writes.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from headroom.cluster.client import Api, ApiError, pod_path
from headroom.core.quantity import cpu_milli
from helpers.chart import TOOLS
from helpers.cluster_helpers import headroom_cli
from testbed.controller_image import build as build_image
from testbed.controlplane import ControlPlane, build
from testbed.node import RealNode, build_node

ROOT = Path(__file__).resolve().parents[2]
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

    def webhook_pods(self) -> list[dict[str, Any]]:
        pods = self.api.get(
            f"/api/v1/namespaces/{NS}/pods", {"labelSelector": "app.kubernetes.io/name=kube-headroom-webhook"}
        )
        return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]

    def serving(self) -> bool:
        """Every webhook pod serves the webhook (the kubelet has put the Secret in its
        mounted directory)."""
        pods = self.webhook_pods()
        return bool(pods) and all('"webhook serving"' in self.node.container_log(p, "webhook") for p in pods)

    def leader(self, release: str = "headroom") -> str:
        """The pod holding the controller's Lease (named after the Helm release)."""
        lease = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{release}"
        return str(self.api.get(lease)["spec"].get("holderIdentity") or "")


# Every write of the controller's ServiceAccount to a Lease (with the body: who it names)
# and to a pod: the audit log says which pod each came from (the bound token's pod name).
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  userGroups: ["system:serviceaccounts:{NS}"]
  verbs: [create, update]
  resources: [{{group: coordination.k8s.io, resources: [leases]}}]
- level: Metadata
  userGroups: ["system:serviceaccounts:{NS}"]
  verbs: [create, update, patch]
  resources: [{{group: "", resources: [pods, pods/resize]}}]
- level: None
"""


@contextlib.contextmanager
def installed_cluster(tmp: Path) -> Iterator[Cluster]:
    """A control plane and a real node that routes pods to Services, the controller image
    imported; stopped on exit."""
    (tmp / "image").mkdir(parents=True, exist_ok=True)
    image = build_image(tmp / "image" / "kube-headroom.tar", ROOT)
    bins = build_node()
    workdir = tmp / "controlplane"
    workdir.mkdir(parents=True)
    (workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit = [
        f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
        f"--audit-log-path={workdir / 'audit.log'}",
        "--audit-log-maxsize=0",
    ]
    cp = ControlPlane(build(), workdir=workdir, components_dir=bins, extra_args=audit)
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


def wait(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return value


def kubectl_run(cluster: Cluster, name: str, *args: str) -> str:
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


def pod_limit(pod: dict[str, Any]) -> int:
    """The CPU limit of the pod's first container in millicores (0: none)."""
    limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    return cpu_milli(limits["cpu"]) if "cpu" in limits else 0


def limit(api: Api, ns: str, name: str) -> int:
    return pod_limit(api.get(pod_path(ns, name)))


def headroom(cluster: Cluster, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The `headroom` CLI as an admin types it on their workstation, with their kubeconfig."""
    return headroom_cli(cluster.kubeconfig, command, *args)
