"""Tenants in the split on the real API server: a tier and a cap applied with kubectl as a
platform team applies them, the controller's resizes as the server stores them, and an
invalid tenancy refused by the server. The nodes' kubelets are the tests' simulated one
(only its resize answers matter here)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from headroom.cluster.client import ApiError, pod_path
from helpers.cluster_helpers import create_pod, kubectl, node_events, wait_annotation, wait_limits
from helpers.factories import container
from testbed.sim_kubelet import SimulatedKubelet

LABEL = "tenants.example.com/name"
CONFIG = "/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster"


def _config(path: Path, tenancy: dict) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "HeadroomConfig",
                "metadata": {"name": "cluster"},
                "spec": {"debouncePeriod": "500ms", "tenancy": {"tenantLabel": LABEL, **tenancy}},
            }
        )
    )
    return path


def test_a_tier_and_a_cap_move_the_tenants_limits_and_nothing_where_the_tenant_is_absent(
    api,
    namespace,
    other_namespace,
    make_node,
    crds_installed,
    start_controller,
    control_plane,
    tmp_path,
    request,
):
    kubeconfig = control_plane.kubeconfig()

    def apply(tenancy: dict) -> None:
        out = kubectl(kubeconfig, "apply", "--server-side", "--field-manager=platform-team", "-f",
                      str(_config(tmp_path / "headroom.yaml", tenancy)))  # fmt: skip
        assert out.returncode == 0, out.stderr

    request.addfinalizer(lambda: _delete(api, CONFIG))  # the next test finds no HeadroomConfig, as fixtures leave it
    acme, globex = namespace, other_namespace
    for ns, tenant in ((acme, "acme"), (globex, "globex")):
        assert kubectl(kubeconfig, "label", "namespace", ns, f"{LABEL}={tenant}").returncode == 0
    apply({})
    shared, alone = make_node(cpu="8"), make_node(cpu="8")
    with SimulatedKubelet(api, shared), SimulatedKubelet(api, alone):
        create_pod(api, acme, shared, "a1", containers=[container(cpu="1")])
        create_pod(api, globex, shared, "g1", containers=[container(cpu="1")])
        create_pod(api, globex, alone, "g2", containers=[container(cpu="1")])
        controller = start_controller()
        # No weights, no cap: today's split. Shared: S = 6, M = 2: 1 + 3 each; alone: the node.
        wait_limits(api, acme, "a1", ["4"], timeout=15)
        wait_limits(api, globex, "g1", ["4"], timeout=15)
        wait_limits(api, globex, "g2", ["8"], timeout=15)
        assert "tenant" not in wait_annotation(api, acme, "a1")  # tenancy named, the split unchanged
        untouched = _quiet(api, pod_path(globex, "g2"))  # the kubelet's answers and the annotation are in

        # acme's tier: weight 3. Shared: acme's pot 6 x 3/4 = 4.5 cores, globex's 1.5.
        apply({"weights": [{"tenant": "acme", "weight": 3}]})
        took = wait_limits(api, acme, "a1", ["5500m"], timeout=15)
        wait_limits(api, globex, "g1", ["2500m"], timeout=15)
        status = json.loads(wait_annotation(api, acme, "a1"))
        for _ in range(50):  # the annotation follows the resize
            if status.get("tenant") == "acme":
                break
            time.sleep(0.1)
            status = json.loads(wait_annotation(api, acme, "a1"))
        assert (status["tenant"], status["tenantPot"], status["target"]) == ("acme", "4500m", "5500m"), status
        time.sleep(1.5)  # three debounce periods: anything it would write on the other node is out
        assert api.get(pod_path(globex, "g2"))["metadata"]["resourceVersion"] == untouched  # no acme pod there
        print(f"\ntier committed -> acme's limit raised in {took:.1f}s; globex's pod on another node unwritten")

        # A cap: no tenant holds more than half a node's slack. Shared: acme capped at 3, the
        # 1.5 it loses goes to globex (3 in all); alone: globex capped at 3.5 of 7.
        apply({"weights": [{"tenant": "acme", "weight": 3}], "maxNodeSlackShare": 0.5})
        wait_limits(api, acme, "a1", ["4"], timeout=15)
        wait_limits(api, globex, "g1", ["4"], timeout=15)
        wait_limits(api, globex, "g2", ["4500m"], timeout=15)
        status = json.loads(wait_annotation(api, globex, "g2"))
        for _ in range(50):
            if status.get("target") == "4500m":
                break
            time.sleep(0.1)
            status = json.loads(wait_annotation(api, globex, "g2"))
        assert status.get("decidedBy") == "maxNodeSlackShare", status
        wanted = f"{globex}/g2 8 → 4500m (decided by maxNodeSlackShare)"  # the wave's event on the node
        deadline = time.monotonic() + 10
        while wanted not in (notes := " | ".join(e["note"] for e in node_events(api, alone))):
            assert time.monotonic() < deadline, notes
            time.sleep(0.2)

        # Per node, never per tenant: how many tenants the cap held.
        status_code, text = controller.http("/metrics", controller.metrics_port)
        assert status_code == 200
        for node in (shared, alone):
            assert f'headroom_node_tenants_capped{{node="{node}",pool=""}} 1.0' in text, text

        # Refused by the API server, as kubectl shows it; the stored configuration is unchanged.
        before = api.get(CONFIG)["metadata"]["generation"]
        for bad, field in (
            ({"weights": [{"tenant": "acme", "weight": 0}]}, "spec.tenancy.weights[0].weight"),
            (
                {"weights": [{"tenant": "acme", "weight": 2}, {"tenant": "acme", "weight": 3}]},
                "spec.tenancy.weights",  # server-side apply: "duplicate entries for key [tenant=...]"
            ),
            ({"maxNodeSlackShare": 1.5}, "spec.tenancy.maxNodeSlackShare"),
        ):
            out = kubectl(kubeconfig, "apply", "--server-side", "--field-manager=platform-team", "-f",
                          str(_config(tmp_path / "bad.yaml", bad)))  # fmt: skip
            assert out.returncode != 0 and field in out.stderr, (bad, out.stderr)
            offline = subprocess.run([sys.executable, "-m", "headroom", "validate", str(tmp_path / "bad.yaml")],
                                     capture_output=True, text=True)  # fmt: skip
            assert offline.returncode == 1 and field in offline.stdout + offline.stderr, (bad, offline)
        assert api.get(CONFIG)["metadata"]["generation"] == before


def _quiet(api, path: str, for_seconds: float = 1.5, timeout: float = 20) -> str:
    """The object's resourceVersion once nobody has written it for `for_seconds`."""
    deadline = time.monotonic() + timeout
    version, since = api.get(path)["metadata"]["resourceVersion"], time.monotonic()
    while time.monotonic() - since < for_seconds:
        assert time.monotonic() < deadline, f"{path} kept changing"
        time.sleep(0.1)
        now = api.get(path)["metadata"]["resourceVersion"]
        if now != version:
            version, since = now, time.monotonic()
    return str(version)


def _delete(api, path: str) -> None:
    with contextlib.suppress(ApiError):
        api.delete(path)
