"""`headroom run` against the real API server, with simulated kubelets (issue 4.5)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from headroom.cluster.client import ApiError, pod_path
from headroom.cluster.live import read_cluster
from headroom.core.planner import plan_cluster
from helpers.cluster_helpers import (
    cond,
    cpu_limits,
    create_pod,
    versions,
    wait_annotation,
    wait_for,
    wait_limits,
    wait_node_event,
)
from helpers.factories import container
from testbed.sim_kubelet import SimulatedKubelet

DEBOUNCE = 0.5

pytestmark = pytest.mark.version_sensitive


@pytest.fixture
def cluster(api, namespace, make_node, headroom_config, start_controller):
    headroom_config()
    return api, namespace, make_node, start_controller


def test_lone_pod_gets_request_times_max_multiplier_and_neighbours_shrink_it(cluster):
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        create_pod(api, ns, node, "solo", containers=[container(cpu="500m")])
        start()
        wait_limits(api, ns, "solo", ["5"], timeout=15)  # 500m x 10, under allocatable 8
        status = wait_annotation(api, ns, "solo")
        assert '"target":"5000m"' in status and '"policy":"proportional-v1"' in status
        # one event on the node per wave: the factor before caps, each pod's change and its clamp
        note = wait_node_event(api, node)["note"]
        assert note.startswith("adjusted the CPU limit of 1 pod (node factor 16.00 before caps"), note
        assert note.endswith(f"{ns}/solo none → 5 (decided by maxMultiplier)"), note

        # neighbours book 6 cores: S = 8 - 6.5 = 1.5, M = 2.5, N = 3;
        # solo = 500m + max(1.5 x 0.5/2.5 = 300m, min(floor 1, S/N = 500m)) = 1
        create_pod(api, ns, node, "big-1", containers=[container(cpu="1")])
        create_pod(api, ns, node, "big-2", containers=[container(cpu="1")])
        create_pod(
            api, ns, node, "system", containers=[container(cpu="4")], labels={"kube-headroom.dev/mode": "unmanaged"}
        )
        took = wait_limits(api, ns, "solo", ["1"], timeout=DEBOUNCE * 1.2 + 2)  # the bound is the wait's own
        print(f"\nneighbours arrived: solo cut to 1 in {took:.1f}s (debounce {DEBOUNCE}s)")

        for name in ("big-1", "big-2", "system"):
            api.delete(pod_path(ns, name))
        wait_limits(api, ns, "solo", ["5"], timeout=DEBOUNCE * 1.2 + 2)


def test_pods_it_must_not_manage_are_never_written(cluster):
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")  # no simulated kubelet: nothing else writes these pods
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"{ns}-off"}})
    try:
        create_pod(api, f"{ns}-off", node, "unmanaged-ns", containers=[container(cpu="500m")])
        create_pod(api, ns, node, "guaranteed", containers=[container(cpu="1", limit="1", mem="1Gi", mem_limit="1Gi")])
        create_pod(
            api,
            ns,
            node,
            "opted-out",
            containers=[container(cpu="500m")],
            labels={"kube-headroom.dev/mode": "unmanaged"},
        )
        create_pod(api, ns, node, "managed", containers=[container(cpu="500m")])
        before = {**versions(api, ns), **{f"off/{k}": v for k, v in versions(api, f"{ns}-off").items()}}
        start()
        wait_limits(api, ns, "managed", [f"{500 * 10 // 1000}"], timeout=15)
        time.sleep(DEBOUNCE * 2)
        after = {**versions(api, ns), **{f"off/{k}": v for k, v in versions(api, f"{ns}-off").items()}}
        for name in ("guaranteed", "opted-out", "off/unmanaged-ns"):
            assert after[name] == before[name], f"{name} was written"
        assert after["managed"] != before["managed"]
    finally:
        api.delete(f"/api/v1/namespaces/{ns}-off")


def test_dry_run_annotates_but_writes_no_resize(cluster, headroom_config):
    api, ns, make_node, start = cluster
    headroom_config(dryRun=True)
    node = make_node(cpu="8")
    create_pod(api, ns, node, "p", containers=[container(cpu="500m", limit="600m")])
    start()
    wait_annotation(api, ns, "p")
    p = api.get(pod_path(ns, "p"))
    assert '"dryRun":true' in p["metadata"]["annotations"]["kube-headroom.dev/status"]
    assert '"target":"5000m"' in p["metadata"]["annotations"]["kube-headroom.dev/status"]
    assert cpu_limits(api, ns, "p") == ["600m"]
    assert not any(m.get("subresource") == "resize" for m in p["metadata"]["managedFields"])
    note = wait_node_event(api, node)["note"]
    assert note.startswith("dry-run, not applied: would adjust the CPU limit of 1 pod"), note
    assert note.endswith(f"{ns}/p 600m → 5"), note


def test_steady_cluster_sees_no_writes_and_a_restart_writes_nothing(cluster):
    api, ns, make_node, start = cluster
    node = make_node(cpu="16")
    with SimulatedKubelet(api, node):
        for i, cpu in enumerate(("500m", "1500m", "6")):
            create_pod(api, ns, node, f"w{i}", containers=[container(cpu=cpu)])
        first = start()
        # the design's worked example: 16 cores, 0.5 / 1.5 / 6 -> 1.5 / 3 / 12
        for name, limit in (("w0", "1500m"), ("w1", "3"), ("w2", "12")):
            wait_limits(api, ns, name, [limit], timeout=15)
        time.sleep(DEBOUNCE * 3)  # let the kubelet's status writes settle
        settled = versions(api, ns)
        time.sleep(10)  # twenty status flushes and ten blocked-writes checks
        assert versions(api, ns) == settled, "a steady cluster was written to"

        first.stop()
        second = start()
        # It counts only once the new controller leads and has recomputed every node.
        second.wait_for_log("became leader", timeout=30)
        done = second.wait_for_log("first pass complete", timeout=30)
        assert done["nodes"] >= 1
        assert versions(api, ns) == settled, "a restart on a converged cluster wrote"
        assert not [r for r in second.logs() if r.get("msg") == "cpu limit adjusted"]


def test_configuration_fails_closed_and_the_last_valid_version_survives_a_restart(
    api, namespace, make_node, start_controller, headroom_config
):
    node = make_node(cpu="8", labels={"pool": "batch"})
    profiles = "/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles"

    def profile(name: str, priority: int, **spec: Any) -> None:
        api.apply(
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "NodePoolProfile",
                "metadata": {"name": name},
                "spec": {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "priority": priority, **spec},
            },
            "headroom-tests",
        )

    def stalled(name: str) -> str:
        return str(cond(api.get(f"{profiles}/{name}"), "Stalled").get("message", ""))

    with SimulatedKubelet(api, node):
        create_pod(api, ns := namespace, node, "p", containers=[container(cpu="500m")])
        c = start_controller()
        # No HeadroomConfig: nothing is written, and the log and the metric say why.
        c.wait_for_log("nothing will be written")
        time.sleep(DEBOUNCE * 4)
        assert cpu_limits(api, ns, "p") == [None]
        assert "kube-headroom.dev/status" not in (api.get(pod_path(ns, "p"))["metadata"].get("annotations") or {})
        assert "headroom_config_valid 0.0" in c.http("/metrics", c.metrics_port)[1]
        headroom_config(maxMultiplier=2)
        wait_limits(api, ns, "p", ["1"], timeout=10)
        try:
            profile("batch", 1, maxMultiplier=3)
            wait_limits(api, ns, "p", ["1500m"], timeout=5)
            # Valid alone, but merged with the global grow 0.10 its deadband is inverted:
            # the last valid version (maxMultiplier 3) keeps running, not the global 2.
            profile("batch", 1, maxMultiplier=4, deadband={"shrink": 0.30})
            wait_for(api, f"{profiles}/batch", lambda o: "last valid version" in stalled("batch"))
            time.sleep(DEBOUNCE * 3)
            assert cpu_limits(api, ns, "p") == ["1500m"]
            # A restarted controller finds the last valid version in status.lastAppliedSpec.
            c.stop()
            c = start_controller()
            c.wait_for_log("first pass complete", timeout=30)
            time.sleep(DEBOUNCE * 2)
            assert cpu_limits(api, ns, "p") == ["1500m"]
            assert api.get(f"{profiles}/batch")["status"]["lastAppliedSpec"]["maxMultiplier"] == 3
            # A new profile that wins the node but has no usable version freezes it: never
            # the global settings, never its own unusable values.
            profile("tight", 5, maxMultiplier=8, deadband={"grow": 0.01})
            wait_for(api, f"{profiles}/tight", lambda o: "nothing is written" in stalled("tight"))
            create_pod(api, ns, node, "q", containers=[container(cpu="500m")])
            time.sleep(DEBOUNCE * 4)
            assert cpu_limits(api, ns, "q") == [None] and cpu_limits(api, ns, "p") == ["1500m"]
        finally:
            for name in ("batch", "tight"):
                with contextlib.suppress(ApiError):
                    api.delete(f"{profiles}/{name}")


def test_a_node_labelled_for_the_static_cpu_manager_is_left_alone(cluster):
    api, ns, make_node, start = cluster
    static = make_node(cpu="8", labels={"kube-headroom.dev/cpu-manager-policy": "static"})
    shared = make_node(cpu="8")
    with SimulatedKubelet(api, static), SimulatedKubelet(api, shared):
        create_pod(api, ns, static, "pinned-node", containers=[container(cpu="500m")])
        create_pod(api, ns, shared, "elsewhere", containers=[container(cpu="500m")])
        c = start()
        wait_limits(api, ns, "elsewhere", ["5"], timeout=15)
        c.wait_for_log("first pass complete")
        assert cpu_limits(api, ns, "pinned-node") == [None]
        snap = read_cluster(api)  # what `headroom plan` reads and decides
        decided = plan_cluster(snap.nodes, snap.pods, snap.namespaces, snap.resolver(), pod_level_resize=True)
        plan = {pp.pod.key: pp.reason for pp in decided.all_pods()}
        assert plan[f"{ns}/pinned-node"] == "StaticCPUManager" and plan[f"{ns}/elsewhere"] == "Managed"


def test_with_the_status_annotation_off_only_the_limit_is_written(cluster):
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        create_pod(api, ns, node, "quiet", containers=[container(cpu="500m")])
        c = start("--status-annotation=false")
        wait_limits(api, ns, "quiet", ["5"], timeout=15)
        wait_node_event(api, node)  # the lane has run: its event is out
        time.sleep(1.0)
        annotations = api.get(pod_path(ns, "quiet"))["metadata"].get("annotations") or {}
        assert "kube-headroom.dev/status" not in annotations
        assert not [r for r in c.logs() if r.get("msg") == "status annotation written"]


def test_a_wave_is_one_event_that_kubectl_describe_node_shows(cluster, control_plane):
    """Four pods land together; the kubelet's answers to each resize requeue the node
    between writes, and still the wave is told once, on the node, where `kubectl describe
    node` (which shows only events carrying the node's uid) finds it."""
    import subprocess

    from helpers.chart import TOOLS
    from helpers.cluster_helpers import node_events

    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        names = [f"w{i}" for i in range(4)]
        for name in names:
            create_pod(api, ns, node, name, containers=[container(cpu="500m")])
        start()
        for name in names:
            wait_limits(api, ns, name, ["2"], timeout=15)  # S = 8 - 2 = 6, M = 2: 500m + 6 x 500m/2 = 2 each
        deadline = time.monotonic() + 10
        while not node_events(api, node):
            assert time.monotonic() < deadline, "no wave event"
            time.sleep(0.2)
        time.sleep(3)  # anything more about this wave would be out by now
        waves = node_events(api, node)
        assert len(waves) == 1, [e["note"] for e in waves]
        assert waves[0]["note"].startswith("adjusted the CPU limit of 4 pods"), waves[0]["note"]
        uid = api.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
        assert waves[0]["regarding"]["uid"] == uid
        out = subprocess.run(
            [str(TOOLS / "bin" / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig()), "describe", "node", node],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        events = out.stdout.split("Events:", 1)[1]
        assert "CPULimitAdjusted" in events and "adjusted the CPU limit of 4 pods" in events, events
