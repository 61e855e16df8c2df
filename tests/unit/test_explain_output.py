"""What `plan` and `explain` print of the limit the kubelet and the kernel applied: the
spec's limit beside the kubelet's when they differ, and the kernel's limit history from
Prometheus (pure functions; the real-node tests run them against a real kubelet)."""

from __future__ import annotations

import datetime

from headroom.cluster.prometheus import Throttling, changes
from headroom.commands import output
from headroom.core.params import Settings
from headroom.core.planner import ClusterPlan, plan_node
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from helpers.factories import container, node, pod

NS = {"team": namespace_from_dict({"metadata": {"name": "team", "labels": {"kube-headroom.dev/mode": "managed"}}})}


def _plan(applied: str | None) -> ClusterPlan:
    """One managed pod with a spec CPU limit of 1; its kubelet reports `applied` (None: the
    spec's) while a resize is deferred."""
    raw = pod(name="web", containers=[container("app", cpu="500m", limit="1")])
    raw["status"]["containerStatuses"] = [
        {"name": "app", "state": {"running": {}}, "resources": {"limits": {"cpu": applied or "1"}}}
    ]
    if applied is not None:
        raw["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]
    n = node_from_dict(node(name="n1", cpu="1"))
    return ClusterPlan([plan_node(n, [pod_from_dict(raw)], NS, Settings(), pod_level_resize=False)], [])


def _row(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if f" {name} " in line)
    return [cell for cell in line.split("  ") if cell.strip()]


def test_plan_shows_the_kubelets_limit_beside_the_spec_only_when_they_differ():
    lagging = output.plan_table(_plan("200m"))
    assert [c.strip() for c in _row(lagging, "web")][4:6] == ["500m", "1 (kubelet: 200m)"], lagging
    assert "kubelet" not in output.plan_table(_plan(None))
    wide = output.plan_wide(_plan("200m")).split("\n\n")[-1]
    assert [c.strip() for c in _row(wide, "web")][3:6] == ["500m", "1", "200m"], wide
    explained = output.explain(_plan("200m"), "team/web")
    assert explained is not None and "(the kubelet reports 200m applied)" in explained, explained


def test_the_kernels_limit_history_is_the_points_where_it_changed():
    assert changes([(0, 0.2), (5, 0.2), (10, 1.0), (15, 1.0), (20, 0.0)]) == [(0, 0.2), (10, 1.0), (20, 0.0)]
    assert changes([]) == []
    t0 = datetime.datetime(2026, 12, 2, 16, 0, tzinfo=datetime.UTC).timestamp()
    row = Throttling("app", 600, 300, 12.5, 0.2, 0.2, limits=[(t0, 0.2), (t0 + 7, 1.0), (t0 + 60, 0.0)])
    plan = _plan(None)
    n = plan.nodes[0]
    text = output.measured(n, n.pods[0], [row], 600, "http://prometheus")
    assert (
        "CPU limit the kernel enforced (cAdvisor's CFS quota), where it changed: "
        "16:00:00 200m → 16:00:07 1 → 16:01:00 none" in text
    ), text


def test_pressure_says_whether_the_limit_or_the_node_holds_a_container_back():
    def row(throttled: float, waiting: float | None) -> Throttling:
        return Throttling("app", 600, 600 * throttled, 1.0, 0.5, 0.6, waiting=waiting)

    assert "its own limit holds it back" in output.pressure_verdict(row(0.4, 0.3))
    assert "the node is contended, not its limit" in output.pressure_verdict(row(0.0, 0.3))
    assert "neither its limit nor the node" in output.pressure_verdict(row(0.01, 0.01))
    n = _plan(None).nodes[0]
    text = output.measured(n, n.pods[0], [row(0.0, 0.3)], 300, "Prometheus")
    assert "CPU pressure (PSI): some task waited for a CPU 30% of the time" in text, text
    assert "PSI" not in output.measured(n, n.pods[0], [row(0.0, None)], 300, "Prometheus")  # cgroup v1: none
