"""Issue 5 on the real API server: leader election, metrics and probes, logs, pod-level
resources, allocatable changes, shutdown."""

from __future__ import annotations

import datetime
import json
import subprocess
import time
from pathlib import Path

import pytest

from headroom.cluster.client import STRATEGIC_PATCH, pod_path
from headroom.cluster.live import read_cluster
from headroom.core.planner import plan_cluster
from helpers.chart import PROMTOOL, dashboard_metric_names
from helpers.cluster_helpers import (
    CONTROLLER_TOKEN,
    K8S_MINOR,
    LEASE,
    cpu_limits,
    create_pod,
    wait_limits,
)
from helpers.factories import container
from testbed.controlplane import ADMIN_TOKEN
from testbed.sim_kubelet import SimulatedKubelet

ROOT = Path(__file__).resolve().parents[2]


def _ts(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_metrics_probes_and_promtool(api, namespace, make_node, headroom_config, start_controller):
    headroom_config()
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        create_pod(api, namespace, node, "p", containers=[container(cpu="500m")])
        c = start_controller("--pod-metrics")
        wait_limits(api, namespace, "p", ["5"], timeout=10)
        assert c.http("/healthz") == (200, "ok\n")
        deadline = time.monotonic() + 10
        while c.http("/readyz")[0] != 200:
            assert time.monotonic() < deadline, c.http("/readyz")
            time.sleep(0.2)
        status, text = c.http("/metrics", c.metrics_port)
        assert status == 200
        for name in (
            "headroom_node_factor",
            "headroom_node_slack_cores",
            "headroom_pod_limit_cores",
            "headroom_resizes_total",
            "headroom_reconcile_duration_seconds_bucket",
            "headroom_pods_managed",
            "headroom_pending_resizes",
            "headroom_workqueue_depth",
            "headroom_low_priority_writes_pending",
            "headroom_deferred_resizes",
            "headroom_config_valid",
        ):
            assert name in text, name
        assert f'headroom_pod_limit_cores{{container="app",namespace="{namespace}",pod="p"}} 5.0' in text
        assert 'headroom_resizes_total{dry_run="false",result="applied"}' in text
        assert "headroom_config_valid 1.0" in text
        # every series the shipped Grafana dashboard reads is one this scrape exports
        wanted = dashboard_metric_names()
        assert wanted and not [m for m in wanted if m not in text], wanted
        assert PROMTOOL.exists(), "promtool is installed by `make test` (Debian's prometheus package, unpacked)"
        lint = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr


def test_logs_are_json_lines_with_every_write_and_no_token(
    api, namespace, make_node, headroom_config, start_controller
):
    headroom_config()
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        create_pod(api, namespace, node, "p", containers=[container(cpu="500m")])
        c = start_controller()
        wait_limits(api, namespace, "p", ["5"], timeout=10)
        c.wait_for_log("status annotation written")
        # no per-pod series unless asked for (--pod-metrics): the scrape grows with nodes only
        assert "headroom_pod_limit_cores" not in c.http("/metrics", c.metrics_port)[1]
    raw = c.log_path.read_text()
    assert CONTROLLER_TOKEN not in raw and ADMIN_TOKEN not in raw  # its own token, and the admin's
    records = [json.loads(line) for line in raw.splitlines()]
    (resize,) = [r for r in records if r["msg"] == "cpu limit adjusted"]
    assert resize["pod"] == f"{namespace}/p" and resize["node"] == node and resize["change"] == "none → 5"
    assert resize["reason"] == "maxMultiplier" and resize["level"] == "info"


@pytest.mark.version_sensitive
def test_pod_level_pods_get_only_a_pod_level_limit_where_the_node_declares_the_feature(
    api, namespace, make_node, headroom_config, start_controller
):
    """From 1.36 on; a 1.35 server refuses every pod-level resize, so nothing is written there."""
    headroom_config()
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    on = make_node(cpu="8", features=["InPlacePodLevelResourcesVerticalScaling"])
    off = make_node(cpu="8")
    with SimulatedKubelet(api, on), SimulatedKubelet(api, off):
        create_pod(
            api,
            namespace,
            on,
            "plr",
            containers=[container(cpu="100m", limit="800m", mem=None, mem_limit=None)],
            pod_resources=res,
        )
        create_pod(
            api,
            namespace,
            off,
            "plr-off",
            containers=[container(cpu=None, mem=None, mem_limit=None)],
            pod_resources=res,
        )
        c = start_controller()
        if K8S_MINOR < 36:
            c.wait_for_log("first pass complete")  # both nodes decided: whatever was to be written was
            for name in ("plr", "plr-off"):
                assert api.get(pod_path(namespace, name))["spec"]["resources"]["limits"]["cpu"] == "1"
            return
        deadline = time.monotonic() + 10
        while (api.get(pod_path(namespace, "plr"))["spec"]["resources"]["limits"]["cpu"]) == "1":
            assert time.monotonic() < deadline, c.logs()[-5:]
            time.sleep(0.1)
        p = api.get(pod_path(namespace, "plr"))
        assert p["spec"]["resources"]["limits"]["cpu"] == "5"  # 500m x 10
        assert p["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "800m"  # container limit untouched
        c.wait_for_log("first pass complete")  # the node without the feature was decided too
        assert api.get(pod_path(namespace, "plr-off"))["spec"]["resources"]["limits"]["cpu"] == "1"


def test_sigterm_exits_zero_quickly_and_releases_the_lease(
    api, namespace, make_node, headroom_config, start_controller
):
    headroom_config()
    node = make_node(cpu="8")
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m")])
    c = start_controller("--identity", "replica-term")
    c.wait_for_log("became leader")
    started = time.monotonic()
    assert c.stop() == 0
    assert time.monotonic() - started < 10
    assert api.get(LEASE)["spec"]["holderIdentity"] in ("", None)
    assert any(r.get("msg") == "lease released" for r in c.logs())


def test_while_the_kubelet_resizes_a_node_limits_are_cut_never_raised(
    api, namespace, make_node, headroom_config, start_controller
):
    """KEP-3953: while the node's CapacityConfigured condition says InProgress, freed CPU
    raises no limit; when the resize is done, the raises go out."""
    headroom_config()
    node = make_node(cpu="16")
    with SimulatedKubelet(api, node):
        for name, cpu in (("a", "1"), ("b", "1"), ("c", "6")):
            create_pod(api, namespace, node, name, containers=[container(cpu=cpu)])
        c = start_controller()
        wait_limits(api, namespace, "a", ["2"], timeout=20)  # S = 8, M = 8: factor 2
        wait_limits(api, namespace, "c", ["12"], timeout=20)
        resizing = {"type": "CapacityConfigured", "status": "True", "reason": "InProgress", "message": "16 -> 12"}
        status = {"status": {"conditions": [resizing], "allocatable": {"cpu": "12"}, "capacity": {"cpu": "12"}}}
        api.patch(f"/api/v1/nodes/{node}/status", status, STRATEGIC_PATCH)
        wait_limits(api, namespace, "c", ["9"], timeout=5)  # cut at once: S = 4, 6 + 4 x 6/8 (a, b: the 1-core floor)
        api.delete(pod_path(namespace, "c"))  # 6 cores freed: a and b would rise
        time.sleep(3)
        assert cpu_limits(api, namespace, "a") == ["2"] and cpu_limits(api, namespace, "b") == ["2"]
        snap = read_cluster(api)
        plan = plan_cluster(snap.nodes, snap.pods, snap.namespaces, snap.resolver(), pod_level_resize=True)
        held = {pp.pod.name: pp.target.bound for pp in plan.all_pods() if pp.target is not None}
        assert held == {"a": "nodeResizing", "b": "nodeResizing"}, held
        done = {**resizing, "status": "False", "reason": "Accepted"}
        api.patch(f"/api/v1/nodes/{node}/status", {"status": {"conditions": [done]}}, STRATEGIC_PATCH)
        wait_limits(api, namespace, "a", ["6"], timeout=10)  # 1 + 10 x 1/2, the raise once done
        assert not [r for r in c.logs() if r.get("level") == "error"]
