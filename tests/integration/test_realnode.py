"""Headroom on a real node: the kubelet, containerd, runc and the kernel's CFS quota.

The node runs on this machine (`headroom.testbed.node.RealNode`): the kubelet built from
the pinned Kubernetes release, containerd from its Go module, Debian's runc and CNI
plugins. What is asserted is what the kernel does: the container's `cpu.cfs_quota_us`
after the resize, and the throttling counters in its `cpu.stat`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster_helpers import wait_limits
from headroom.cluster.api import Api, ApiError, pod_path
from headroom.testbed.node import BUSYBOX_IMAGE, RealNode, build_node

PERIOD_US = 100_000  # the kubelet's CFS period


@pytest.fixture(scope="module")
def real_node(control_plane) -> Iterator[RealNode]:
    """One real node for this module; its Node object is deleted afterwards, so the other
    modules see only the nodes they make."""
    node = RealNode(control_plane, build_node())
    try:
        node.start()
        yield node
    finally:
        node.stop()
        with contextlib.suppress(ApiError):
            control_plane.api().delete(f"/api/v1/nodes/{node.name}")


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
    assert before > 0.5, f"a busy thread at 200m should be throttled in most periods, was {before:.0%}"
    assert after < 0.05, f"still throttled in {after:.0%} of periods at a limit of one core"
