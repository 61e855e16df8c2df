"""Headroom on a real node: the kubelet, containerd, runc and the kernel's CFS quota.

The node runs on this machine (`headroom.testbed.node.RealNode`): the kubelet built from
the pinned Kubernetes release, containerd from its Go module, Debian's runc and CNI
plugins. What is asserted is what the kernel does: the container's `cpu.cfs_quota_us`
after the resize, and the throttling counters in its `cpu.stat`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cluster_helpers import wait_limits
from headroom.cluster.api import Api, pod_path
from headroom.testbed.node import BUSYBOX_IMAGE

PERIOD_US = 100_000  # the kubelet's CFS period


def busy_pod(name: str, node: str, request: str = "100m", limit: str = "200m") -> dict[str, Any]:
    """One thread that spins forever, as a CPU-hungry tenant does."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "busy",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "while :; do :; done"],
                    "resources": {
                        "requests": {"cpu": request, "memory": "16Mi"},
                        "limits": {"cpu": limit, "memory": "64Mi"},
                    },
                }
            ],
        },
    }


def wait_running(api: Api, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pod = api.get(pod_path(ns, name))
        statuses = pod["status"].get("containerStatuses") or []
        if statuses and statuses[0].get("state", {}).get("running"):
            return pod
        assert time.monotonic() < deadline, f"{ns}/{name} not running: {pod['status']}"
        time.sleep(0.3)


def cpu_stat(cgroup: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())}


def usage_ns(cgroup: Path) -> int:
    """CPU time the cgroup used, from the cpuacct hierarchy (separate from cpu on this host)."""
    acct = Path("/sys/fs/cgroup/cpuacct") / cgroup.relative_to("/sys/fs/cgroup/cpu")
    return int((acct / "cpuacct.usage").read_text())


def throttling(cgroup: Path, seconds: float) -> tuple[float, float]:
    """(share of CFS periods throttled, CPU cores used) over a window, from the cgroup."""
    stat0, used0, t0 = cpu_stat(cgroup), usage_ns(cgroup), time.monotonic()
    time.sleep(seconds)
    stat1, used1, t1 = cpu_stat(cgroup), usage_ns(cgroup), time.monotonic()
    periods = stat1["nr_periods"] - stat0["nr_periods"]
    throttled = stat1["nr_throttled"] - stat0["nr_throttled"]
    return (throttled / periods if periods else 0.0), (used1 - used0) / 1e9 / (t1 - t0)


def test_a_raised_limit_reaches_the_containers_cfs_quota_and_the_throttling_stops(
    api, namespace, real_node, headroom_config, start_controller
):
    pod = api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("busy", real_node.name))
    running = wait_running(api, namespace, "busy")
    cid = running["status"]["containerStatuses"][0]["containerID"]
    cgroup = real_node.container_cgroup(cid)
    assert cgroup is not None, f"no cgroup for {cid} under {real_node.cgroup_root}"
    assert int((cgroup / "cpu.cfs_quota_us").read_text()) == 20_000  # 200m, before Headroom
    assert int((cgroup / "cpu.cfs_period_us").read_text()) == PERIOD_US
    before, used_before = throttling(cgroup, 3.0)

    headroom_config()
    start_controller()
    # One pod on a node of 2 cores: 100m + everything unbooked, capped at 10 x the request.
    wait_limits(api, namespace, "busy", ["1"], timeout=30)
    deadline = time.monotonic() + 10
    while int((cgroup / "cpu.cfs_quota_us").read_text()) != 100_000:
        assert time.monotonic() < deadline, f"quota still {(cgroup / 'cpu.cfs_quota_us').read_text().strip()}"
        time.sleep(0.05)
    after, used_after = throttling(cgroup, 3.0)
    got = api.get(pod_path(namespace, "busy"))
    status = got["status"]["containerStatuses"][0]
    print(
        f"\nreal node {real_node.name}: throttled periods {before:.0%} at 200m ({used_before:.2f} cores) -> "
        f"{after:.0%} at 1 ({used_after:.2f} cores)"
    )
    assert status["restartCount"] == 0 and status["containerID"] == cid  # resized in place
    assert status["resources"]["limits"]["cpu"] == "1"  # what the kubelet reports applied
    assert (
        got["spec"]["containers"][0]["resources"]["requests"] == pod["spec"]["containers"][0]["resources"]["requests"]
    )
    assert got["spec"]["containers"][0]["resources"]["limits"]["memory"] == "64Mi"
    assert got["status"]["qosClass"] == "Burstable"
    # At 200m the kernel holds the busy thread to a fifth of a core and throttles it in many
    # periods (how many depends on how often it gets a CPU at all on a loaded machine);
    # at one core it is never throttled and gets far more.
    assert used_before < 0.22 and before > 0.25, (used_before, before)
    assert after < 0.05 and used_after > 0.4, (used_after, after)


def test_a_deployments_pods_are_placed_seeded_at_admission_and_raised_in_their_cgroups(
    api, namespace, real_node, headroom_config, webhook_controller
):
    """The ReplicaSet controller creates the pods (owner chain as Kubernetes writes it),
    the webhook gives each its birth limit on that admission, the scheduler places them on
    the real node, and the controller raises them: the container cgroups follow."""
    headroom_config()
    c, _ = webhook_controller("headroom-real")
    labels = {"app": "sleepy"}
    api.post(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "sleepy"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "app",
                                "image": BUSYBOX_IMAGE,
                                "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"],
                                "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}},
                            }
                        ],
                    },
                },
            },
        },
    )
    deadline = time.monotonic() + 60
    while True:
        pods = api.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "app=sleepy"})["items"]
        if len(pods) == 3 and all(p["status"].get("containerStatuses") for p in pods):
            break
        assert time.monotonic() < deadline, [p["status"] for p in pods]
        time.sleep(0.5)
    for p in pods:
        owner = p["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ReplicaSet" and owner["name"].startswith("sleepy-"), owner  # the real chain
        assert p["spec"]["nodeName"] == real_node.name  # placed by the scheduler
    # Three pods of 100m on 2 cores: S = 1.7, each 100m + 1.7/3 = 666m -> 660m (10m quantum).
    for p in pods:
        wait_limits(api, namespace, p["metadata"]["name"], ["660m"], timeout=30)
    deadline = time.monotonic() + 15
    for p in pods:
        cid = wait_running(api, namespace, p["metadata"]["name"])["status"]["containerStatuses"][0]["containerID"]
        cgroup = real_node.container_cgroup(cid)
        assert cgroup is not None
        while int((cgroup / "cpu.cfs_quota_us").read_text()) != 66_000:
            assert time.monotonic() < deadline, (cgroup / "cpu.cfs_quota_us").read_text()
            time.sleep(0.1)
    born = [r for r in c.logs() if r.get("msg") == "new pod given cpu limits"]
    assert len(born) == 3, born  # each pod was given its limit on the ReplicaSet controller's create
    got = api.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "app=sleepy"})["items"]
    assert all(s["restartCount"] == 0 for p in got for s in p["status"]["containerStatuses"])
    conflicts = [r for r in c.logs() if r.get("result") == "conflict"]
    print(
        f"\n3 pods of a Deployment on {real_node.name}: 660m each in their cgroups; {len(conflicts)} resize(s) met 409"
    )
