"""Another writer of a managed pod's CPU limit, on the real API server (the pods/resize
subresource, its field managers and managedFields as the server keeps them): Headroom
restores one change, steps back from a second writer that keeps writing, says so, and
keeps the rest of the node managed."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from headroom.cluster.client import APPLY_PATCH, Api, pod_path
from helpers.cluster_helpers import cpu_limits, create_pod, events, headroom_cli, kubectl, live_plan, wait_limits
from helpers.factories import container
from testbed.sim_kubelet import SimulatedKubelet

FIGHT_SECONDS = 30.0  # six writes of the other writer: it is left the pod at its second
EVERY = 5.0


@pytest.fixture
def cluster(api, namespace, make_node, headroom_config, start_controller):
    headroom_config()
    return api, namespace, make_node, start_controller


def _pods(api: Api, ns: str, node: str, count: int = 3) -> list[str]:
    names = [f"app-{i}" for i in range(count)]
    for name in names:
        create_pod(api, ns, node, name, containers=[container(cpu="500m", limit="1")])
    return names


def _apply_limit(api: Api, ns: str, name: str, cpu: str, manager: str) -> None:
    """What a right-sizer or Kyverno does: server-side apply of the limit alone on
    pods/resize, with its own field manager, taking the field over."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": cpu}}}]},
    }
    api.patch(pod_path(ns, name, "resize"), body, APPLY_PATCH, {"fieldManager": manager, "force": "true"})


def _wait_managed(api: Api, ns: str, name: str, timeout: float = 20.0) -> None:
    """Until the pod's limit is the target the live plan decides for it (and not the 1 CPU it was created with)."""
    key = f"{ns}/{name}"
    deadline = time.monotonic() + timeout
    while True:
        pp = {pp.pod.key: pp for pp in live_plan(api).all_pods()}[key]
        if pp.target is not None and not pp.target.apply and cpu_limits(api, ns, name) != ["1"]:
            return
        assert time.monotonic() < deadline, f"{key}: {pp.reason}, limits {cpu_limits(api, ns, name)}"
        time.sleep(0.2)


def _events_about(api: Api, ns: str, name: str, reason: str, timeout: float = 15.0) -> list[dict[str, Any]]:
    """The pod's events of `reason`, waiting for the first (the low-priority lane sends them)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in events(api, ns, reason) if e["regarding"]["name"] == name]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _writes(c: Any, key: str) -> list[dict[str, Any]]:
    """Headroom's writes to one pod, as its log tells them: resizes and status annotations."""
    return [
        r
        for r in c.logs()
        if r.get("pod") == key and r.get("msg") in ("cpu limit adjusted", "status annotation written")
    ]


def test_a_second_writer_keeps_the_limit_and_headroom_steps_back(cluster, control_plane):
    """One node, three managed pods; once Headroom has set their limits, a second writer
    sets one pod's limit to 700m every 5 s for 30 s. Headroom writes to that pod at most
    3 times, the writer's value stays, the pod says why (reason, Warning Event naming the
    manager), and the node's other pods still follow the node's slack."""
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        pods = _pods(api, ns, node)
        c = start()
        for name in pods:
            _wait_managed(api, ns, name)
        contested, key = pods[0], f"{ns}/{pods[0]}"
        before = len(_writes(c, key))

        stop = threading.Event()
        sent: list[float] = []

        def writer() -> None:
            while not stop.is_set():
                _apply_limit(api, ns, contested, "700m", "rightsizer")
                sent.append(time.monotonic())
                stop.wait(EVERY)

        t = threading.Thread(target=writer, daemon=True)
        started = time.monotonic()
        t.start()
        # Meanwhile a fourth pod lands: the others' targets move, so the node is recomputed.
        time.sleep(FIGHT_SECONDS / 2)
        create_pod(api, ns, node, "late", containers=[container(cpu="500m", limit="1")])
        time.sleep(FIGHT_SECONDS / 2)
        stop.set()
        t.join()
        took = time.monotonic() - started
        writes = _writes(c, key)[before:]
        print(f"\n{len(sent)} writes of the other writer in {took:.0f} s; Headroom's writes to the pod: {len(writes)}")
        for w in writes:
            print("  ", w.get("msg"), w.get("change") or w.get("target"))
        assert len(writes) <= 3, writes
        assert cpu_limits(api, ns, contested) == ["700m"]
        plan = {pp.pod.key: pp for pp in live_plan(api).all_pods()}
        # `plan` offline knows nothing of the controller's memory: it sees the writer's limit as drift.
        left = [r for r in c.logs() if r.get("msg") == "cpu limit left to another writer"]
        assert [(r["pod"], r["manager"]) for r in left] == [(key, "rightsizer")], left
        warned = _events_about(api, ns, contested, "CPULimitOwnedByOther")
        assert len(warned) == 1 and "'rightsizer'" in warned[0]["note"], warned
        # ...and not said again under another reason (the plan's warning is that event).
        assert not [e for e in events(api, ns, "CPULimitAdjustSkipped") if e["regarding"]["name"] == contested]
        status = api.get(pod_path(ns, contested))["metadata"]["annotations"]["kube-headroom.dev/status"]
        assert '"LimitOwnedByOther"' in status and '"managed":false' in status.replace(" ", ""), status
        assert plan[key].pod.limit_writers == (("rightsizer", "app"),)
        config = api.get("/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster")
        assert config["status"]["limitsLeftToOthers"] == 1, config["status"]
        metrics = c.http("/metrics", c.metrics_port)[1]
        assert 'headroom_foreign_writers{manager="rightsizer"} 1.0' in metrics
        doctor = headroom_cli(control_plane.kubeconfig(), "doctor", timeout=60).stdout
        assert f"field manager 'rightsizer' owns the CPU limit of 1 pod(s) Headroom manages ({key})" in doctor, doctor
        explained = headroom_cli(control_plane.kubeconfig(), "explain", key).stdout
        assert "LimitOwnedByOther" in explained and "'rightsizer'" in explained, explained
        # The node's other pods are still managed: the late pod shares the slack with them.
        for name in [*pods[1:], "late"]:
            _wait_managed(api, ns, name)

        # The writer has stopped; a person hands the pod back as docs/policy.md says, with kubectl.
        out = kubectl(
            control_plane.kubeconfig(),
            "annotate",
            "pod",
            contested,
            "-n",
            ns,
            "--overwrite",
            "kube-headroom.dev/reclaim-limit=1",
        )
        assert out.returncode == 0, out.stderr
        _wait_managed(api, ns, contested)  # restored once more: Headroom's target, not 700m
        assert cpu_limits(api, ns, contested) != ["700m"]
        assert _events_about(api, ns, contested, "CPULimitTakenBack")


def test_one_change_by_hand_is_restored_and_said(cluster, control_plane):
    """`kubectl patch --subresource resize` once, as a person would: Headroom writes its
    target back, says so on the pod naming kubectl's field manager, and the pod stays managed."""
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        (name,) = _pods(api, ns, node, 1)
        c = start()
        _wait_managed(api, ns, name)
        target = cpu_limits(api, ns, name)
        patch = '{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"700m"}}}]}}'
        out = kubectl(
            control_plane.kubeconfig(), "patch", "pod", name, "-n", ns, "--subresource", "resize", "-p", patch
        )
        assert out.returncode == 0, out.stderr
        wait_limits(api, ns, name, target, timeout=20)
        said = _events_about(api, ns, name, "CPULimitRestored")  # events follow the resizes
        assert len(said) == 1 and "'kubectl-patch'" in said[0]["note"], said
        pod = api.get(pod_path(ns, name))
        owners = {m["manager"] for m in pod["metadata"]["managedFields"] if m.get("subresource") == "resize"}
        print(f"\nresize field managers once Headroom restored the limit: {sorted(owners)}")
        pp = {pp.pod.key: pp for pp in live_plan(api).all_pods()}[f"{ns}/{name}"]
        assert pp.reason == "Managed" and not pp.pod.limit_writers  # Headroom's write took the field back
        assert not [r for r in c.logs() if r.get("msg") == "cpu limit left to another writer"]
