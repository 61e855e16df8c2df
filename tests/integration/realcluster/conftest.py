"""A cluster of real parts for the tests in this directory: kube-apiserver and etcd,
kube-scheduler and kube-controller-manager, and one real node (containerd, runc, CNI, the
kubelet on this machine's cgroups). Its own control plane, apart from the one the other
integration tests share: the controller-manager would collect their hand-made owner
references and evict the pods of their simulated nodes.

Machines that cannot run a real node (not Linux, not root, no cgroup cpu controller) fail
here with the reason; nothing is skipped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from headroom.cluster.client import Api
from headroom.core.quantity import cpu_milli, whole_units
from helpers.cluster_helpers import bind_controller, install_crds, install_vpa_crd
from testbed.controlplane import ControlPlane, build
from testbed.node import CGROUP_V1, RealNode, build_node

NODES: dict[str, RealNode] = {}  # the real nodes running now, by name


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[ControlPlane, RealNode]]:
    bins = build_node()
    cp = ControlPlane(build(), components_dir=bins)
    node = RealNode(cp, bins, host_reaches_pods=True)  # the latency test's load comes from the host
    try:
        cp.start()
        node.start()
        NODES[node.name] = node
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"real cluster: control plane, scheduler and controller-manager in {cp.startup_seconds:.1f}s, "
                f"node {node.name} Ready in {node.startup_seconds:.1f}s"
            )
        yield cp, node
    finally:
        NODES.pop(node.name, None)
        node.stop()
        cp.stop()


@pytest.fixture(scope="session")
def control_plane(real_cluster: tuple[ControlPlane, RealNode]) -> ControlPlane:
    return real_cluster[0]


@pytest.fixture(scope="session")
def real_node(real_cluster: tuple[ControlPlane, RealNode]) -> RealNode:
    return real_cluster[1]


@pytest.fixture(scope="session")
def api(control_plane: ControlPlane) -> Api:
    return control_plane.api()


@pytest.fixture(scope="session")
def crds_installed(api: Api) -> list[str]:
    return install_crds(api)


@pytest.fixture(scope="session")
def controller_rbac(api: Api, crds_installed: list[str]) -> str:
    return bind_controller(api)


@pytest.fixture(scope="session")
def vpa_crd(api: Api) -> str:
    return install_vpa_crd(api)


@pytest.fixture(scope="module")
def second_node(real_cluster: tuple[ControlPlane, RealNode]) -> Iterator[RealNode]:
    """A second real node on this machine, in pool `batch`: its own containerd, kubelet,
    cgroup root and pod subnet; 1 CPU reserved for the system, so 1 allocatable. For the
    tests of one module, then stopped (and its Node object deleted)."""
    cp, first = real_cluster
    node = RealNode(cp, first.bin_dir, cpu_reserved="1", labels={"pool": "batch"})
    try:
        node.start()
        NODES[node.name] = node
        yield node
    finally:
        NODES.pop(node.name, None)
        node.stop()


def _amounts(resources: dict[str, Any]) -> dict[str, dict[str, int]]:
    """requests and limits as numbers (millicores, bytes), whatever form they are written in."""
    return {
        kind: {r: cpu_milli(v) if r == "cpu" else whole_units(v) for r, v in (resources.get(kind) or {}).items()}
        for kind in ("requests", "limits")
    }


def _kernel_disagreements(api: Api, namespace: str) -> list[str]:
    """Where a running container of the namespace's pods on a real node is not what its
    spec says, as the kernel and the kubelet see it: the CFS quota is the CPU limit
    (period 100 ms; -1 without one), cpu.shares the CPU request, the memory cgroup the
    memory limit, the kubelet reports the spec's resources applied, and no container
    restarted."""
    wrong = []
    for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        node = NODES.get(pod["spec"].get("nodeName", ""))
        name = pod["metadata"]["name"]
        if node is None or pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running":
            continue
        statuses = {s["name"]: s for s in pod["status"].get("containerStatuses") or []}
        for c in pod["spec"]["containers"]:
            st = statuses.get(c["name"]) or {}
            if not st.get("state", {}).get("running"):
                continue
            res = c.get("resources") or {}
            limit = (res.get("limits") or {}).get("cpu")
            request = (res.get("requests") or {}).get("cpu", "0")
            memory = (res.get("limits") or {}).get("memory")
            applied = st.get("resources") or {}
            cgroup = node.container_cgroup(st["containerID"])
            if cgroup is None:
                wrong.append(f"{name}/{c['name']}: no cgroup")
                continue
            rel = cgroup.relative_to(CGROUP_V1 / "cpu")
            seen = {
                "cfs_quota_us": int((cgroup / "cpu.cfs_quota_us").read_text()),
                "cfs_period_us": int((cgroup / "cpu.cfs_period_us").read_text()),
                "shares": int((cgroup / "cpu.shares").read_text()),
                "memory": int((CGROUP_V1 / "memory" / rel / "memory.limit_in_bytes").read_text()),
                "applied": _amounts(applied),
                "restarts": st.get("restartCount"),
            }
            want = {
                "cfs_quota_us": cpu_milli(limit) * 100 if limit else -1,
                "cfs_period_us": 100_000,
                "shares": max(2, cpu_milli(request) * 1024 // 1000),
                "memory": whole_units(memory) if memory else seen["memory"],
                "applied": _amounts(res),
                "restarts": 0,
            }
            wrong += [f"{name}/{c['name']}: {k} {seen[k]!r}, spec says {want[k]!r}" for k in want if seen[k] != want[k]]
    return wrong


@pytest.fixture(autouse=True)
def the_kernel_agrees_with_every_spec(api: Api, namespace: str) -> Iterator[None]:
    """After every test on the real cluster: every running container's cgroup holds what its
    pod's spec says (CPU limit, CPU request, memory limit), the kubelet reports it applied,
    and nothing restarted. Resizes in flight get 15 s to land."""
    yield
    deadline = time.monotonic() + 15
    while wrong := _kernel_disagreements(api, namespace):
        assert time.monotonic() < deadline, "\n".join(wrong)
        time.sleep(0.5)
