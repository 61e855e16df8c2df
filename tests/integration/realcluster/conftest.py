"""A cluster of real parts for the tests in this directory: kube-apiserver and etcd,
kube-scheduler and kube-controller-manager, and one real node (containerd, runc, CNI, the
kubelet on this machine's cgroups). Its own control plane, apart from the one the other
integration tests share: the controller-manager would collect their hand-made owner
references and evict the pods of their simulated nodes.

Machines that cannot run a real node (not Linux, not root, no cgroup cpu controller) fail
here with the reason; nothing is skipped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster_helpers import bind_controller, install_crds, install_vpa_crd
from headroom.cluster.api import Api
from headroom.testbed.controlplane import ControlPlane, build
from headroom.testbed.node import RealNode, build_node


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[ControlPlane, RealNode]]:
    bins = build_node()
    cp = ControlPlane(build(), components_dir=bins)
    node = RealNode(cp, bins)
    try:
        cp.start()
        node.start()
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"real cluster: control plane, scheduler and controller-manager in {cp.startup_seconds:.1f}s, "
                f"node {node.name} Ready in {node.startup_seconds:.1f}s"
            )
        yield cp, node
    finally:
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
