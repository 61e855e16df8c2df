"""The chart's alert rules on a real Prometheus, each caused for real on the real cluster
and read back from Prometheus's own /api/v1/alerts.

Every `for:` is set to 0s so a condition fires at the next evaluation (every 2 s); the
durations themselves are held by promtool's unit tests (tests/alerts/). The expressions are
the chart's, unchanged: so HeadroomResizesFailing, which counts failures over 15 minutes,
is shown firing and its cause removed, not resolved."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

from ruamel.yaml import YAML

from headroom.cluster.client import STRATEGIC_PATCH, Api, ApiError
from headroom.core.quantity import cpu_milli
from helpers.chart import TOOLS
from helpers.cluster_helpers import DRY_RUN, cpu_limits, headroom_cli, wait_refused
from helpers.realnode_helpers import firing, start_prometheus, wait_running
from testbed.controlplane import free_port
from testbed.node import RealNode, busy_pod
from testbed.prometheus import PrometheusServer

ROOT = Path(__file__).resolve().parents[3]
KUBECTL = TOOLS / "bin" / "kubectl"
NPP = "/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles"
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAP_BINDING = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def rules_without_for(tmp: Path) -> Path:
    groups = YAML(typ="safe").load((ROOT / "charts" / "kube-headroom" / "files" / "alerts.yaml").read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    path = tmp / "alerts.yaml"
    path.write_text(json.dumps(groups))
    return path


def until(what: str, check: Callable[[], bool], timeout: float, prom: PrometheusServer) -> float:
    """Seconds until `check()` holds."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, (what, firing(prom), prom.targets())
        time.sleep(1)
    return time.monotonic() - start


def limited(api: Api, ns: str, name: str, timeout: float) -> str:
    """The pod's CPU limit once Headroom has given it one."""
    deadline = time.monotonic() + timeout
    while (limit := cpu_limits(api, ns, name)[0]) is None:
        assert time.monotonic() < deadline, f"{ns}/{name}: no CPU limit within {timeout}s"
        time.sleep(0.2)
    return limit


def settled(api: Api, ns: str, name: str, timeout: float) -> str:
    """The pod's CPU limit once the kubelet reports it applied and it has not moved for 2 s."""
    deadline = time.monotonic() + timeout
    seen: list[str | None] = []
    while True:
        pod = api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        spec = ((pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}).get("cpu")
        statuses = pod["status"].get("containerStatuses") or [{}]
        applied = ((statuses[0].get("resources") or {}).get("limits") or {}).get("cpu")
        seen = [*seen[-3:], spec if spec is not None and spec == applied else None]
        if len(seen) == 4 and seen[0] is not None and len(set(seen)) == 1:
            return str(spec)
        assert time.monotonic() < deadline, f"{ns}/{name}: CPU limit not settled within {timeout}s: {seen}"
        time.sleep(0.5)


def query(prom: PrometheusServer, expr: str) -> dict[str, float]:
    """An instant query's answer, by the `pod` label of each series ("" for none)."""
    answer = prom.get(f"/api/v1/query?{urlencode({'query': expr})}")["data"]["result"]
    return {r["metric"].get("pod", ""): float(r["value"][1]) for r in answer}


def test_each_alert_of_the_chart_fires_for_its_cause_on_the_real_cluster_and_resolves_when_it_is_gone(
    api: Api, control_plane, namespace: str, real_node: RealNode, headroom_config, start_controller, tmp_path
):
    headroom_config(backoffPeriod="3s")
    port = free_port()
    args = ("--metrics-port", str(port), "--pod-metrics", "--resize-lag-seconds", "5")
    controller = start_controller(*args)
    prom = start_prometheus(api, real_node, port, tmp_path, [rules_without_for(tmp_path)])
    admin = control_plane.kubeconfig()
    figures: list[str] = []
    try:
        until(
            "the controller's metrics scraped, nothing firing on a healthy cluster",
            lambda: bool(query(prom, "headroom_heartbeat_timestamp_seconds")) and not firing(prom),
            90,
            prom,
        )

        # The controller stops: HeadroomControllerStale; back on the same address: resolved.
        controller.stop()
        fired = until("stale fires", lambda: "HeadroomControllerStale" in firing(prom), 60, prom)
        start_controller(*args)
        resolved = until("stale resolves", lambda: "HeadroomControllerStale" not in firing(prom), 90, prom)
        figures.append(
            f"HeadroomControllerStale: fired {fired:.1f}s after the stop, resolved {resolved:.1f}s after the restart"
        )

        # A NodePoolProfile the API server accepts and the controller cannot act on (its grow
        # deadband below the global shrink one): HeadroomConfigInvalid; deleted: resolved.
        api.post(
            NPP,
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "NodePoolProfile",
                "metadata": {"name": "t-alerts-tight"},
                "spec": {"nodeSelector": {"matchLabels": {"pool": "nowhere"}}, "deadband": {"grow": 0.02}},
            },
        )
        try:
            fired = until("config invalid fires", lambda: "HeadroomConfigInvalid" in firing(prom), 60, prom)
        finally:
            api.delete(f"{NPP}/t-alerts-tight")
        resolved = until("config invalid resolves", lambda: "HeadroomConfigInvalid" not in firing(prom), 60, prom)
        figures.append(
            f"HeadroomConfigInvalid: fired {fired:.1f}s after the apply, resolved {resolved:.1f}s after the delete"
        )

        # Another writer raises a managed pod's request beyond what the node can fit now
        # (kubectl, as a user types it): the kubelet defers the resize, and the pod runs with
        # another CPU limit than its spec's. HeadroomResizesDeferred, HeadroomResizesPendingTooLong
        # and HeadroomResizeLagging fire; the booker gone, the kubelet applies it and all resolve.
        api.post(f"/api/v1/namespaces/{namespace}/pods", busy_pod("grow", real_node.name, "100m", None, busy=False))
        hog = busy_pod("hog", real_node.name, "1200m", None, busy=False)
        hog["metadata"]["labels"] = {"kube-headroom.dev/mode": "unmanaged"}
        api.post(f"/api/v1/namespaces/{namespace}/pods", hog)
        wait_running(api, namespace, "grow")
        wait_running(api, namespace, "hog")
        before = settled(api, namespace, "grow", 30)
        raise_ = {
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}}]}
        }
        r = subprocess.run(
            [str(KUBECTL), "patch", "pod", "grow", "-n", namespace, "--subresource", "resize", "--type", "strategic",
             "-p", json.dumps(raise_)],
            capture_output=True, text=True, timeout=30, env={**os.environ, "KUBECONFIG": str(admin)},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        patched = time.monotonic()
        lagging = {"HeadroomResizesDeferred", "HeadroomResizesPendingTooLong", "HeadroomResizeLagging"}
        until("deferred, pending and lagging fire", lambda: lagging <= firing(prom), 60, prom)
        fired = time.monotonic() - patched
        status = api.get(f"/api/v1/namespaces/{namespace}/pods/grow")["status"]
        deferred = [c for c in status["conditions"] if c["type"] == "PodResizePending"]
        assert deferred and deferred[0]["reason"] == "Deferred", status["conditions"]
        applied = query(prom, f'headroom_pod_applied_limit_cores{{namespace="{namespace}"}}')["grow"]
        assert applied * 1000 == cpu_milli(before), (applied, before)
        plan = headroom_cli(admin, "plan", "-n", namespace, timeout=60)
        assert plan.returncode == 0, plan.stderr
        row = next(line for line in plan.stdout.splitlines() if line.startswith(f"{namespace}  grow "))
        assert f" 1 (kubelet: {before}) " in row, plan.stdout
        figures.append(f"$ headroom plan -n {namespace}   # while the kubelet defers the resize\n{plan.stdout}")
        api.delete(f"/api/v1/namespaces/{namespace}/pods/hog")
        resolved = until("deferred, pending and lagging resolve", lambda: not lagging & firing(prom), 90, prom)
        figures.append(
            f"HeadroomResizesDeferred, HeadroomResizesPendingTooLong, HeadroomResizeLagging: all firing "
            f"{fired:.1f}s after the resize (lag bound 5s), resolved {resolved:.1f}s after the booker left"
        )

        # A policy of the cluster's own forbids resizes in the namespace (a change freeze):
        # every limit Headroom tries to give its new pods is refused. HeadroomResizesFailing.
        freeze = "t-alerts-freeze"
        api.post(
            VAP,
            {
                "metadata": {"name": freeze},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["UPDATE"],
                                "resources": ["pods/resize"],
                            }
                        ]
                    },
                    "validations": [
                        {"expression": "false", "message": "resizes are frozen here", "reason": "Forbidden"}
                    ],
                },
            },
        )
        api.post(
            VAP_BINDING,
            {
                "metadata": {"name": freeze},
                "spec": {
                    "policyName": freeze,
                    "validationActions": ["Deny"],
                    "matchResources": {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                    },
                },
            },
        )
        try:
            grow = api.get(f"/api/v1/namespaces/{namespace}/pods/grow")["spec"]["containers"]
            same = {"spec": {"containers": [{"name": c["name"], "resources": c["resources"]} for c in grow]}}
            resize = f"/api/v1/namespaces/{namespace}/pods/grow/resize"
            took = wait_refused("the freeze", lambda: api.patch(resize, same, STRATEGIC_PATCH, DRY_RUN), 30)
            figures.append(f"the freeze refused a dry-run resize {took:.1f}s after its binding was created")
            for name in ("frozen-a", "frozen-b"):
                api.post(
                    f"/api/v1/namespaces/{namespace}/pods", busy_pod(name, real_node.name, "10m", None, busy=False)
                )
            created = time.monotonic()
            until("failing fires", lambda: "HeadroomResizesFailing" in firing(prom), 120, prom)
            fired = time.monotonic() - created
            errors = query(prom, 'sum(headroom_resizes_total{dry_run="false",result="error"})')[""]
            figures.append(
                f"HeadroomResizesFailing: fired {fired:.1f}s after two pods were created under the freeze ({errors:.0f} refusals)"
            )
        finally:
            for path in (f"{VAP_BINDING}/{freeze}", f"{VAP}/{freeze}"):
                with contextlib.suppress(ApiError):
                    api.delete(path)
        # The freeze lifted, the limits land (the alert's 15-minute window keeps it firing).
        for name in ("frozen-a", "frozen-b"):
            limited(api, namespace, name, 60)
        print("\n" + "\n".join(figures))
    finally:
        prom.stop()
