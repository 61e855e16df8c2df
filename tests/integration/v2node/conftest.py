"""A cluster whose one node runs cgroup v2, as production nodes do: kube-apiserver and etcd,
kube-scheduler and kube-controller-manager on this machine, and the kubelet, containerd and
runc in a QEMU guest booting Debian's cloud kernel (`testbed.vmnode.VmNode`). Its own
control plane, apart from the others. Nothing on the host is changed; machines without
QEMU fail here with the reason (`make tools` installs it); nothing is skipped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from headroom.cluster.client import Api
from helpers.cluster_helpers import bind_controller, install_crds
from testbed.controlplane import ControlPlane, build
from testbed.node import build_node
from testbed.vmnode import VmNode


@pytest.fixture(scope="session")
def v2_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[ControlPlane, VmNode]]:
    cp = ControlPlane(build(), components_dir=build_node())
    node = VmNode(cp)
    try:
        cp.start()
        node.start()
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"cgroup v2 cluster: control plane in {cp.startup_seconds:.1f}s, node {node.name} "
                f"(QEMU {node.accel}, kernel {node.kernel_release}) Ready in {node.boot_seconds:.1f}s"
            )
        yield cp, node
    finally:
        node.stop()
        cp.stop()


@pytest.fixture(scope="session")
def control_plane(v2_cluster: tuple[ControlPlane, VmNode]) -> ControlPlane:
    return v2_cluster[0]


@pytest.fixture(scope="session")
def v2_node(v2_cluster: tuple[ControlPlane, VmNode]) -> VmNode:
    return v2_cluster[1]


@pytest.fixture(scope="session")
def api(control_plane: ControlPlane) -> Api:
    return control_plane.api()


@pytest.fixture(scope="session")
def crds_installed(api: Api) -> list[str]:
    return install_crds(api)


@pytest.fixture(scope="session")
def controller_rbac(api: Api, crds_installed: list[str]) -> str:
    return bind_controller(api)
