"""The real control plane for integration tests: one per test session."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from headroom.cluster.client import MERGE_PATCH, Api, ApiError
from helpers.cluster_helpers import CONTROLLER_TOKEN, bind_controller, install_crds, install_vpa_crd
from helpers.faultproxy import FaultProxy
from testbed.controlplane import ControlPlane, build, free_port

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    cp = ControlPlane(build())
    try:
        cp.start()
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"testenv: etcd + kube-apiserver {cp.url} ready in {cp.startup_seconds:.1f}s")
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def api(control_plane: ControlPlane) -> Api:
    return control_plane.api()


@pytest.fixture(scope="session")
def crds_installed(api: Api) -> list[str]:
    """Install crds/ and wait until the server serves both kinds."""
    return install_crds(api)


@pytest.fixture
def namespace(api: Api) -> Iterator[str]:
    """A fresh namespace labelled managed; deleted afterwards."""
    yield from _managed_namespace(api)


@pytest.fixture
def other_namespace(api: Api) -> Iterator[str]:
    """Another one, for a second tenant."""
    yield from _managed_namespace(api)


def _managed_namespace(api: Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    api.post(
        "/api/v1/namespaces",
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kube-headroom.dev/mode": "managed"}},
        },
    )
    yield name
    with contextlib.suppress(ApiError):
        api.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def make_node(api: Api) -> Iterator[Callable[..., str]]:
    """Create a Ready Node with the given allocatable CPU; deleted afterwards."""
    created: list[str] = []

    def make(cpu: str = "8", labels: dict[str, str] | None = None, features: list[str] | None = None) -> str:
        name = f"node-{uuid.uuid4().hex[:8]}"
        api.post(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", **(labels or {})}},
            },
        )
        created.append(name)
        status: dict[str, Any] = {
            "allocatable": {"cpu": cpu, "memory": "32Gi", "pods": "110"},
            "capacity": {"cpu": cpu, "memory": "32Gi", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "simulated",
                    "lastHeartbeatTime": "2026-11-29T00:00:00Z",
                    "lastTransitionTime": "2026-11-29T00:00:00Z",
                }
            ],
        }
        if features is not None:
            status["declaredFeatures"] = features
        api.patch(f"/api/v1/nodes/{name}/status", {"status": status}, MERGE_PATCH)
        return name

    yield make
    for name in created:
        with contextlib.suppress(ApiError):
            api.delete(f"/api/v1/nodes/{name}")


class RunningController:
    """`headroom run` as a user starts it: a separate process with a kubeconfig."""

    def __init__(self, kubeconfig: Path, log_path: Path, args: list[str]) -> None:
        self.log_path = log_path
        self.metrics_port, self.health_port = free_port(), free_port()
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        ports = ["--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "headroom", "run", "--kubeconfig", str(kubeconfig), *ports, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def http(self, path: str, port: int | None = None) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port or self.health_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def queued(self) -> float:
        """headroom_workqueue_depth: nodes waiting to be reconciled."""
        text = self.http("/metrics", self.metrics_port)[1]
        return float(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("headroom_workqueue_depth ")))

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line, "level": "raw"})
        return out

    def wait_for_log(self, msg: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.logs():
                if rec.get("msg") == msg:
                    return rec
            assert self.proc.poll() is None, f"controller exited: {self.log_path.read_text()[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"no log {msg!r} in {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def controller_rbac(api: Api, crds_installed: list[str]) -> str:
    """The test identity `headroom-controller`, bound to the chart's RBAC and nothing else;
    its token. Every controller the tests start runs as it."""
    return bind_controller(api)


@pytest.fixture
def start_controller(
    control_plane: ControlPlane, controller_rbac: str, tmp_path: Path
) -> Iterator[Callable[..., RunningController]]:
    started: list[RunningController] = []

    def start(*args: str, synced: bool = True, kubeconfig: Path | None = None) -> RunningController:
        kubeconfig = kubeconfig or control_plane.kubeconfig(controller_rbac)
        c = RunningController(kubeconfig, tmp_path / f"controller-{len(started)}.log", list(args))

        started.append(c)
        if synced:
            c.wait_for_log("caches synced")
        return c

    yield start
    for c in started:
        c.stop()
    # Across every test: the API server never refused one of the controller's resizes as invalid.
    for c in started:
        invalid = [r for r in c.logs() if r.get("result") == "invalid" and "injected" not in str(r.get("error"))]
        assert not invalid, f"the server refused a resize as invalid: {invalid}"
        # Any error that carries a traceback is a crash the controller survived: a bug.
        crashed = [
            r
            for r in c.logs()
            if r.get("level") == "critical"
            or r.get("exc")
            or "Traceback" in str(r.get("msg"))
            or r.get("level") == "raw"
        ]
        assert not crashed, crashed


@pytest.fixture
def webhook_controller(
    control_plane: ControlPlane, api: Api, start_controller: Callable[..., RunningController], tmp_path: Path
) -> Iterator[Callable[..., tuple[RunningController, int]]]:
    """Start a controller that serves its webhook with a certificate from the test CA, and
    register it with the API server as MutatingWebhookConfiguration `<prefix>-<port>`
    (removed afterwards): (controller, port)."""
    from helpers.cluster_helpers import register_webhook

    registered: list[str] = []

    def serve(prefix: str, *args: str) -> tuple[RunningController, int]:
        certs = tmp_path / f"webhook-{len(registered)}"
        certs.mkdir()
        control_plane.ca.issue(certs, "tls", ["127.0.0.1"])
        port = free_port()
        # The tests' API server calls from 127.0.0.1 (as its EndpointSlice default/kubernetes
        # says; the controller's identity may not read it): every other loopback address is
        # a direct poster.
        c = start_controller(
            "--webhook-port",
            str(port),
            "--webhook-cert-dir",
            str(certs),
            "--webhook-api-server-cidr",
            "127.0.0.1/32",
            *args,
        )
        registered.append(f"{prefix}-{port}")
        register_webhook(api, registered[-1], port, control_plane.ca_file.read_bytes())
        return c, port

    yield serve
    for name in registered:
        with contextlib.suppress(ApiError):
            api.delete(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}")


@pytest.fixture
def headroom_config(api: Api, crds_installed: list[str]) -> Iterator[Callable[..., dict[str, Any]]]:
    """Apply the HeadroomConfig singleton (fast debounce for tests); removed afterwards."""

    def apply(**spec: Any) -> dict[str, Any]:
        obj = {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "HeadroomConfig",
            "metadata": {"name": "cluster"},
            "spec": {"debouncePeriod": "500ms", **spec},
        }
        return api.apply(obj, "headroom-tests")

    yield apply
    with contextlib.suppress(ApiError):
        api.delete("/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster")


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[tuple[FaultProxy, Path]]:
    """A fault-injecting proxy to the API server and a kubeconfig for the controller through it."""
    p = FaultProxy(control_plane.url, control_plane.ca_file, seed=20261129)
    url = p.start()
    kubeconfig = p.kubeconfig(url, CONTROLLER_TOKEN, control_plane.workdir / f"kubeconfig-proxy-{uuid.uuid4().hex[:6]}")
    yield p, kubeconfig
    p.stop()


@pytest.fixture(scope="session")
def vpa_crd(api: Api) -> str:
    """The published VerticalPodAutoscaler CRD (pinned in tests/crds-published/go.mod), installed and served."""
    return install_vpa_crd(api)
