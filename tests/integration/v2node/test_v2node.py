"""Headroom on a cgroup v2 node: the kubelet, containerd, runc and the kernel of a Debian
cloud guest (`testbed.vmnode`). What is asserted is what the guest's kernel holds: the
container's and the pod's `cpu.max` (quota and period) after each resize.
"""

from __future__ import annotations

import json
import re
import time

from headroom.cluster.client import Api, pod_path
from headroom.core.quantity import cpu_milli
from helpers.cluster_helpers import headroom_cli, wait_annotation, wait_for, wait_limits
from helpers.realnode_helpers import PERIOD_US, wait_node_empty, wait_running
from testbed.node import busy_pod
from testbed.vmnode import VmNode


def _cpu_max(node: VmNode, path: str) -> str:
    return node.read(f"{path}/cpu.max").strip()


def _wait_cpu_max(node: VmNode, api: Api, ns: str, name: str, timeout: float = 60) -> tuple[str, str, float]:
    """Seconds until the pod's container and pod cgroups both hold the quota its spec's CPU
    limit says (period 100 ms), and the two `cpu.max` values."""
    start = time.monotonic()
    while True:
        pod = api.get(pod_path(ns, name))
        limit = cpu_milli(pod["spec"]["containers"][0]["resources"]["limits"]["cpu"])
        want = f"{limit * PERIOD_US // 1000} {PERIOD_US}"
        container = _cpu_max(node, node.container_cgroup(pod, "app"))
        whole = _cpu_max(node, node.pod_cgroup(pod))
        if container == want and whole == want:
            return container, whole, time.monotonic() - start
        assert time.monotonic() - start < timeout, (
            f"{ns}/{name}: limit {limit}m, container cpu.max {container!r}, pod cpu.max {whole!r}, want {want!r}; "
            f"the kubelet says {pod['status'].get('conditions')}"
        )
        time.sleep(0.2)


def test_a_managed_limit_is_followed_by_cpu_max_up_and_down(api, namespace, v2_node, headroom_config, start_controller):
    api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("app", v2_node.name, "100m", "200m", busy=False))
    pod = wait_running(api, namespace, "app", timeout=180)
    container, whole = v2_node.container_cgroup(pod, "app"), v2_node.pod_cgroup(pod)
    assert _cpu_max(v2_node, container) == _cpu_max(v2_node, whole) == f"20000 {PERIOD_US}"  # 200m, before Headroom
    weight = v2_node.read(f"{container}/cpu.weight").strip()

    headroom_config()
    start_controller()
    # One pod on 2 cores less 100m reserved: 100m + the unbooked 1800m, capped at 10 x the request.
    wait_limits(api, namespace, "app", ["1"], timeout=90)
    up = _wait_cpu_max(v2_node, api, namespace, "app")
    assert up[:2] == (f"100000 {PERIOD_US}", f"100000 {PERIOD_US}")

    # A second pod books 1500m: the node's slack shrinks, and the first pod's limit and
    # both its cgroups come down with it.
    api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("big", v2_node.name, "1500m", None, busy=False))
    wait_running(api, namespace, "big", timeout=180)
    wait_for(
        api,
        pod_path(namespace, "app"),
        lambda p: cpu_milli(p["spec"]["containers"][0]["resources"]["limits"]["cpu"]) < 1000,
        90,
    )
    down = _wait_cpu_max(v2_node, api, namespace, "app")
    big = _wait_cpu_max(v2_node, api, namespace, "big")
    after = api.get(pod_path(namespace, "app"))["status"]["containerStatuses"][0]
    big_pod = api.get(pod_path(namespace, "big"))
    big_weight = v2_node.read(f"{v2_node.container_cgroup(big_pod, 'app')}/cpu.weight").strip()
    print(
        f"\ncgroup v2 node {v2_node.name} (kernel {v2_node.kernel_release}, QEMU {v2_node.accel}): cpu.max "
        f"20000 -> {up[0]} in {up[2]:.1f}s -> {down[0]} in {down[2]:.1f}s; the second pod {big[0]}; "
        f"cpu.weight of a 100m request {weight}, of a 1500m request {big_weight} "
        f"(ratio {int(big_weight) / int(weight):.2f}; the requests' 15.00)"
    )
    assert after["restartCount"] == 0 and after["containerID"] == pod["status"]["containerStatuses"][0]["containerID"]


def test_a_cut_below_a_cfs_burst_is_refused_by_the_node_and_never_retried(
    api, namespace, v2_node, headroom_config, start_controller, control_plane
):
    """A node agent's CFS burst (as Koordinator or Volcano sets `cpu.max.burst`) above the
    quota Headroom's cut asks for: the kernel refuses the quota, the kubelet reports the
    resize in error and keeps the higher limit; Headroom writes the pod once, says so in a
    Warning event and in its status annotation naming the CFS burst, counts it by cause,
    `explain` says why, and it sends nothing more (the pod's generation stays where its cut left it)."""
    wait_node_empty(api, v2_node.name, timeout=120)
    api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("app", v2_node.name, "100m", "200m", busy=False))
    wait_running(api, namespace, "app", timeout=180)
    headroom_config()
    controller = start_controller()
    wait_limits(api, namespace, "app", ["1"], timeout=90)
    _wait_cpu_max(v2_node, api, namespace, "app")
    container = v2_node.container_cgroup(api.get(pod_path(namespace, "app")), "app")
    assert v2_node.write(f"{container}/cpu.max.burst", "100000") == "ok"
    # What the node will do with a quota below it: the kernel's own answer.
    assert "Invalid argument" in v2_node.write(f"{container}/cpu.max", f"25000 {PERIOD_US}")

    api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("big", v2_node.name, "1500m", None, busy=False))
    cut = wait_for(
        api,
        pod_path(namespace, "app"),
        lambda p: any(
            c["type"] == "PodResizeInProgress" and c.get("reason") == "Error"
            for c in p["status"].get("conditions") or []
        ),
        120,
    )
    limit = cut["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    message = next(c["message"] for c in cut["status"]["conditions"] if c["type"] == "PodResizeInProgress")
    generation = cut["metadata"]["generation"]
    time.sleep(12)  # the kubelet retries about once a second meanwhile; the controller passes over the node
    after = api.get(pod_path(namespace, "app"))
    events = [e["reason"] for e in api.get(f"/api/v1/namespaces/{namespace}/events")["items"]]
    print(
        f"\ncut to {limit} refused by the node: {message[-160:]}; generation {generation} -> {after['metadata']['generation']}"
    )
    assert cpu_milli(limit) < 1000 and "cpu.max: invalid argument" in message
    assert after["metadata"]["generation"] == generation  # no write after the refusal
    assert after["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"] == "1"  # the node kept the old one
    assert _cpu_max(v2_node, container) == f"100000 {PERIOD_US}"
    assert "CPULimitAdjustSkipped" in events and "ResizeError" in events
    said = [e["message"] for e in api.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            if e["reason"] == "CPULimitAdjustSkipped"]  # fmt: skip
    assert any("CFS burst" in m and "cpu.max.burst" in m for m in said), said
    shown = json.loads(after["metadata"]["annotations"]["kube-headroom.dev/status"])  # where kubectl shows it
    assert (shown["managed"], shown["reason"]) == (False, "BackingOff") and "CFS burst" in shown["note"], shown
    _, metrics = controller.http("/metrics", controller.metrics_port)
    assert 'headroom_resizes_refused_by_node_total{cause="cfs-burst"} 1.0' in metrics
    explained = headroom_cli(control_plane.kubeconfig(), "explain", f"{namespace}/app")
    assert (
        "its last resize was refused: the node refused the resize: the kernel will not set a CPU quota below the CFS burst"
        in explained.stdout
    ), explained
    print(explained.stdout)


def test_a_pod_born_with_the_webhooks_limit_runs_under_it_from_its_start(
    api, namespace, v2_node, headroom_config, webhook_controller
):
    """The webhook's birth limit on a v2 node: the pod is created with request x
    initialMultiplier, and its container starts under that quota (no resize: with
    maxMultiplier equal to the initial multiplier the controller's target is the same)."""
    wait_node_empty(api, v2_node.name, timeout=120)
    headroom_config(maxMultiplier=2, webhook={"initialMultiplier": 2})
    webhook_controller("headroom-v2")
    made = api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("born", v2_node.name, "150m", None, busy=False))
    assert made["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "300m"
    pod = wait_running(api, namespace, "born", timeout=180)
    container = v2_node.container_cgroup(pod, "app")
    assert _cpu_max(v2_node, container) == _cpu_max(v2_node, v2_node.pod_cgroup(pod)) == f"30000 {PERIOD_US}"
    # The controller has passed over the node: its status annotation on the pod, same target.
    assert json.loads(wait_annotation(api, namespace, "born", timeout=60))["target"] == "300m"
    events = [e["reason"] for e in api.get(f"/api/v1/namespaces/{namespace}/events")["items"]]
    after = api.get(pod_path(namespace, "born"))
    assert "ResizeStarted" not in events and after["metadata"]["generation"] == 1
    assert _cpu_max(v2_node, container) == f"30000 {PERIOD_US}"


def test_explain_reads_the_v2_kubelets_counters_and_says_whether_the_limit_or_the_node_holds_a_pod_back(
    api, namespace, v2_node, headroom_config, start_controller, control_plane, tmp_path
):
    """`headroom explain --prometheus` on the v2 node: a real Prometheus scrapes the guest
    kubelet's /metrics/cadvisor (its counters come from cpu.stat there, and pressure from
    cpu.pressure where the kernel keeps it); a busy pod held to 200m is shown throttled by
    its own limit."""
    from headroom.cluster.client import MERGE_PATCH
    from helpers.realnode_helpers import start_prometheus

    wait_node_empty(api, v2_node.name, timeout=120)
    headroom_config()
    controller = start_controller()
    prom = start_prometheus(api, v2_node, controller.metrics_port, tmp_path)  # type: ignore[arg-type]
    try:
        api.patch(
            f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"kube-headroom.dev/mode": None}}}, MERGE_PATCH
        )
        api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("busy", v2_node.name, "100m", "200m"))
        wait_running(api, namespace, "busy", timeout=180)
        psi = v2_node.read("/proc/pressure/cpu").strip()  # the kernel's own: "" where PSI is off
        began = time.monotonic()
        while True:
            out = headroom_cli(
                control_plane.kubeconfig(), "explain", f"{namespace}/busy", "--prometheus", prom.url, "--window", "1m"
            ).stdout
            found = re.search(r"throttled in (\d+)% of its CFS periods", out)
            if found and int(found.group(1)) >= 10 and (not psi or "CPU pressure (PSI)" in out):
                break
            assert time.monotonic() - began < 240, (out, prom.targets(), psi)
            time.sleep(5)
        print(
            f"\n/proc/pressure/cpu in the guest: {psi!r}\n$ headroom explain {namespace}/busy --prometheus ...\n{out}"
        )
        assert "whose limit: not Headroom's; the pod is not managed (NamespaceNotManaged)" in out
        if psi:
            assert "its own limit holds it back" in out, out
        else:
            assert "PSI" not in out, out
    finally:
        prom.stop()
