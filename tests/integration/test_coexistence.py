"""Headroom next to what else sets or polices CPU limits, on the real API server: the
published VPA CRD, LimitRanges and ResourceQuotas with the server's own admission, and
pods that leave management."""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
import pytest

from headroom.cluster.client import MERGE_PATCH, STRATEGIC_PATCH, Api, pod_path
from headroom.commands.output import explain
from helpers.cluster_helpers import (
    cpu_limits,
    create_pod,
    events,
    live_plan,
    vpa,
    wait_annotation,
    wait_limit_range_enforced,
    wait_limits,
)
from helpers.factories import container
from helpers.faultproxy import Rule
from testbed.sim_kubelet import SimulatedKubelet

# The admission plugins' answers to a resize (LimitRanger, ResourceQuota) are the server's:
# these run on every pinned release.
pytestmark = pytest.mark.version_sensitive

RESIZE = r"/pods/[^/]+/resize$"


@pytest.fixture
def cluster(api, namespace, make_node, headroom_config, start_controller):
    headroom_config()
    return api, namespace, make_node, start_controller


def reasons(api: Api) -> dict[str, str]:
    return {pp.pod.key: pp.reason for pp in live_plan(api).all_pods()}


def admission_rejections(api: Api, plugin: str) -> int:
    """How many requests the API server's `plugin` admission has refused (its own metric)."""
    text = api.get("/metrics", accept="text/plain", decode=bytes.decode)
    total = 0
    for line in text.splitlines():
        if line.startswith("apiserver_admission_plugin_admission_duration_seconds_count{") and (
            f'name="{plugin}"' in line and 'rejected="true"' in line
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def deployment_pod(api: Api, ns: str, node: str, deployment: str, **kw: Any) -> str:
    """A pod as a Deployment's ReplicaSet makes it: owner `<deployment>-<hash>`, label pod-template-hash."""
    h = "5d8f7c9b4"
    name = f"{deployment}-{h}-x1"
    create_pod(
        api,
        ns,
        node,
        name,
        owner_kind="ReplicaSet",
        owner_name=f"{deployment}-{h}",
        labels={"pod-template-hash": h},
        **kw,
    )
    return name


def test_vpa_that_sets_limits_keeps_its_pods_and_a_requests_only_vpa_coexists_without_a_write_fight(cluster, vpa_crd):
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    vpa(api, ns, "web-vpa", "web")  # the VPA default: requests and limits
    vpa(api, ns, "api-vpa", "api", controlledValues="RequestsOnly")
    with SimulatedKubelet(api, node):
        web = deployment_pod(api, ns, node, "web", containers=[container(cpu="500m", limit="1")])
        app = deployment_pod(api, ns, node, "api", containers=[container(cpu="500m", limit="1")])
        c = start()
        wait_limits(api, ns, app, ["5"], timeout=15)
        assert cpu_limits(api, ns, web) == ["1"]
        found = reasons(api)
        assert found[f"{ns}/{web}"] == "VPAControlsLimits" and found[f"{ns}/{app}"] == "Managed"
        assert f"VerticalPodAutoscaler {ns}/web-vpa" in str(explain(live_plan(api), f"{ns}/{web}"))

        # 24 s of VPA-style request changes (eight) on the RequestsOnly pod, through the resize
        # subresource with the VPA's own field manager.
        sent, refused = 0, []
        deadline = time.monotonic() + 24
        requests = ["700m", "600m", "800m", "500m"]
        while time.monotonic() < deadline:
            cpu = requests[sent % len(requests)]
            body = {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": cpu}}}]}}
            try:
                api.patch(pod_path(ns, app, "resize"), body, STRATEGIC_PATCH, {"fieldManager": "vpa-updater"})
            except Exception as exc:
                refused.append(str(exc))
            sent += 1
            time.sleep(3)
        assert not refused, refused
        pod = api.get(pod_path(ns, app))
        request = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
        assert request == requests[(sent - 1) % len(requests)]

        # Headroom followed the new requests: the limit becomes the plan's target for them
        # (within the debounce and the write after the last change)...
        def at_target() -> bool:
            target = {pp.pod.key: pp for pp in live_plan(api).all_pods()}[f"{ns}/{app}"].target
            return target is not None and not target.apply

        deadline = time.monotonic() + 20
        while not at_target():
            assert time.monotonic() < deadline, "the limit does not follow the last request"
            time.sleep(0.2)
        pod = api.get(pod_path(ns, app))
        # ...each writer owns its own field, and neither fought the other.
        owners = {
            m["manager"]: orjson.dumps(m.get("fieldsV1")).decode()
            for m in pod["metadata"]["managedFields"]
            if m.get("subresource") == "resize"
        }
        assert '"f:limits"' in owners["headroom"] and '"f:requests"' in owners["vpa-updater"]
        conflicts = [r for r in c.logs() if r.get("msg") == "resize conflict; node will be recomputed"]
        adjusted = [r for r in c.logs() if r.get("msg") == "cpu limit adjusted" and r.get("pod") == f"{ns}/{app}"]
        assert len(conflicts) <= 2, conflicts
        assert len(adjusted) <= sent + 1, f"{len(adjusted)} limit writes for {sent} request changes"
        assert cpu_limits(api, ns, web) == ["1"], "a pod whose VPA sets limits was written"


def test_limit_ranges_cap_the_target_and_no_write_is_refused(cluster):
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        create_pod(api, ns, node, "old", containers=[container(cpu="50m", limit="100m")])
        lr = {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "caps"},
            "spec": {
                "limits": [
                    {
                        "type": "Container",
                        "max": {"cpu": "1"},
                        "min": {"cpu": "100m"},
                        "maxLimitRequestRatio": {"cpu": "3"},
                    },
                    {"type": "Pod", "max": {"cpu": "1500m"}},
                ]
            },
        }
        api.post(f"/api/v1/namespaces/{ns}/limitranges", lr)
        wait_limit_range_enforced(api, ns, node)
        create_pod(api, ns, node, "one", containers=[container(cpu="200m", limit="300m")])
        create_pod(
            api,
            ns,
            node,
            "two",
            containers=[container("a", cpu="400m", limit="500m"), container("b", cpu="400m", limit="500m")],
        )
        refused_before = admission_rejections(api, "LimitRanger")
        c = start()
        wait_limits(api, ns, "one", ["600m"], timeout=15)  # 3 x the request (the ratio)
        wait_limits(api, ns, "two", ["750m", "750m"], timeout=15)  # the pod's max, shared
        time.sleep(2)
        assert cpu_limits(api, ns, "old") == ["100m"]  # its request is below the min: no write can pass
        found = reasons(api)
        assert found[f"{ns}/old"] == "LimitRangeConflict" and found[f"{ns}/one"] == "Managed"
        text = str(explain(live_plan(api), f"{ns}/two"))
        assert f"decided by: LimitRange {ns}/caps" in text, text
        assert admission_rejections(api, "LimitRanger") == refused_before
        assert not [r for r in c.logs() if r.get("msg") == "resize refused; backing off"]


def _quota(api: Api, ns: str, hard: str, used: str | None = None) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "q"},
        "spec": {"hard": {"limits.cpu": hard}},
    }
    api.post(f"/api/v1/namespaces/{ns}/resourcequotas", body)
    if used is not None:
        _quota_status(api, ns, hard, used)


def _quota_status(api: Api, ns: str, hard: str, used: str) -> None:
    """What the quota controller (not running here) would count."""
    status = {"status": {"hard": {"limits.cpu": hard}, "used": {"limits.cpu": used}}}
    api.patch(f"/api/v1/namespaces/{ns}/resourcequotas/q/status", status, MERGE_PATCH)


def _limits_total(api: Api, ns: str) -> int:
    from headroom.core.quantity import cpu_milli

    return sum(
        cpu_milli(c["resources"]["limits"]["cpu"])
        for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        for c in p["spec"]["containers"]
    )


def test_a_limits_cpu_quota_is_a_budget_raises_stay_inside_it_with_no_denial(cluster):
    api, ns, make_node, start = cluster
    node = make_node(cpu="8")
    _quota(api, ns, "3", "0")
    with SimulatedKubelet(api, node):
        for name in ("a", "b", "c"):
            create_pod(api, ns, node, name, containers=[container(cpu="200m", limit="400m")])
        _quota_status(api, ns, "3", "1200m")
        refused_before = admission_rejections(api, "ResourceQuota")
        c = start()
        # a gets its whole raise, b what is left, c nothing: the quota is full, not exceeded
        wait_limits(api, ns, "a", ["2"], timeout=15)
        wait_limits(api, ns, "b", ["600m"], timeout=15)
        time.sleep(3)
        assert cpu_limits(api, ns, "c") == ["400m"]
        assert _limits_total(api, ns) == 3000
        assert admission_rejections(api, "ResourceQuota") == refused_before
        assert not [r for r in c.logs() if r.get("result") == "quota-denied"]
        held = events(api, ns, "CPULimitRaiseHeld")
        # once per pod whose raise waits: c, and b for the rest of its raise
        assert sorted(e["regarding"]["name"] for e in held) == ["b", "c"], [e["note"] for e in held]
        assert f"ResourceQuota {ns}/q has no room" in held[0]["note"]
        text = str(explain(live_plan(api), f"{ns}/c"))
        assert f"ResourceQuota {ns}/q has no room left" in text, text

        # More room (the admin raises the quota): the waiting raises go out, within it.
        api.patch(f"/api/v1/namespaces/{ns}/resourcequotas/q", {"spec": {"hard": {"limits.cpu": "5"}}}, MERGE_PATCH)
        _quota_status(api, ns, "5", "3000m")
        wait_limits(api, ns, "b", ["2"], timeout=15)
        time.sleep(3)
        assert _limits_total(api, ns) <= 5000
        assert admission_rejections(api, "ResourceQuota") == refused_before


def test_quota_denied_stays_the_fallback_when_the_quota_shrinks_under_a_write(cluster, proxy):
    api, ns, make_node, start = cluster
    fault, kubeconfig = proxy
    node = make_node(cpu="8")
    _quota(api, ns, "2", "0")
    create_pod(api, ns, node, "q", containers=[container(cpu="500m", limit="600m")])
    _quota_status(api, ns, "2", "600m")
    # The resize is held 2 s on its way; meanwhile the admin lowers the quota.
    fault.add(Rule("PATCH", RESIZE, delay=2.0, times=1))
    c = start(kubeconfig=kubeconfig)
    deadline = time.monotonic() + 10
    while not [w for w in fault.attempts if re.search(RESIZE, w[2])]:
        assert time.monotonic() < deadline, "no resize was sent"
        time.sleep(0.05)
    api.patch(f"/api/v1/namespaces/{ns}/resourcequotas/q", {"spec": {"hard": {"limits.cpu": "700m"}}}, MERGE_PATCH)
    _quota_status(api, ns, "700m", "600m")
    deadline = time.monotonic() + 10
    while not events(api, ns, "CPULimitAdjustSkipped"):
        assert time.monotonic() < deadline, f"no event; logs: {c.logs()[-5:]}"
        time.sleep(0.2)
    skipped = events(api, ns, "CPULimitAdjustSkipped")
    assert len(skipped) == 1 and "quota-denied" in skipped[0]["note"] and "exceeded quota" in skipped[0]["note"]
    refused = [r for r in c.logs() if r.get("msg") == "resize refused; backing off"]
    assert len(refused) == 1 and refused[0]["result"] == "quota-denied"
    assert cpu_limits(api, ns, "q") == ["600m"]


def _exclude(api: Api, ns: str, name: str) -> None:
    api.patch(pod_path(ns, name), {"metadata": {"labels": {"kube-headroom.dev/mode": "unmanaged"}}}, MERGE_PATCH)


def test_a_pod_that_leaves_management_says_so_and_keeps_or_gets_back_its_limit(cluster, headroom_config):
    api, ns, make_node, start = cluster
    headroom_config(release="Restore")
    node = make_node(cpu="8")
    with SimulatedKubelet(api, node):
        create_pod(api, ns, node, "had-limit", containers=[container(cpu="500m", limit="700m")])
        create_pod(api, ns, node, "had-none", containers=[container(cpu="500m")])
        c = start()
        wait_limits(api, ns, "had-limit", ["4"], timeout=15)
        wait_limits(api, ns, "had-none", ["4"], timeout=15)
        original = api.get(pod_path(ns, "had-limit"))["metadata"]["annotations"][
            "kube-headroom.dev/original-cpu-limits"
        ]
        assert orjson.loads(original) == {"app": "700m"}
        # A pod without a limit needs no record, nor does it get one later from a limit Headroom wrote.
        create_pod(api, ns, node, "neighbour", containers=[container(cpu="500m")])
        wait_limits(api, ns, "had-none", ["2660m"], timeout=15)  # S = 6.5: 500m + 6.5/3, quantized
        annotations = api.get(pod_path(ns, "had-none"))["metadata"].get("annotations") or {}
        assert "kube-headroom.dev/original-cpu-limits" not in annotations

        _exclude(api, ns, "had-limit")
        _exclude(api, ns, "had-none")
        wait_limits(api, ns, "had-limit", ["700m"], timeout=15)  # Restore: the limit it had
        _exclude(api, ns, "neighbour")
        deadline = time.monotonic() + 10
        while True:
            shown = {n: orjson.loads(wait_annotation(api, ns, n)) for n in ("had-limit", "had-none")}
            if all(s.get("managed") is False for s in shown.values()):
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.2)
        assert shown["had-limit"]["reason"] == "PodOptedOut" and shown["had-limit"]["limit"] == "700m"
        # It had no limit: Kubernetes cannot remove one in place, so it keeps Headroom's, and says so.
        assert cpu_limits(api, ns, "had-none") == ["2660m"]
        assert "cannot remove" in shown["had-none"]["note"]
        # `plan` shows the real limit of a released pod.
        plan = {pp.pod.key: pp for pp in live_plan(api).all_pods()}
        assert plan[f"{ns}/had-none"].target is None
        from headroom.commands.output import plan_table

        row = next(line for line in plan_table(live_plan(api)).splitlines() if " had-none " in line)
        assert row.split()[5] == "2660m", row
        assert not [r for r in c.logs() if r.get("level") == "error"]


def test_the_limit_range_rule_answers_what_the_servers_limitranger_answers(api, namespace, make_node):
    """One rule, checked against the server's own LimitRanger: every verdict (and its
    message) for each pod and candidate limits, through a dry-run resize."""
    from headroom.cluster.client import ApiError
    from headroom.core.limitrange import limit_range_from_dict, limit_range_refusal
    from headroom.core.quantity import cpu_milli
    from headroom.core.records import pod_from_dict

    ns = namespace
    node = make_node(cpu="16")
    pods = {
        "one": [container(cpu="200m", limit="300m")],
        "two": [container("a", cpu="400m", limit="500m"), container("b", cpu="400m", limit="500m")],
        "small": [container(cpu="50m", limit="100m")],
        "big-memory": [container(cpu="200m", limit="300m", mem_limit="600Mi")],
    }
    for name, containers in pods.items():
        create_pod(api, ns, node, name, containers=containers)
    sidecar_pod = {"app": "300m", "side": "200m"}
    create_pod(
        api,
        ns,
        node,
        "sidecar",
        containers=[container(cpu="300m", limit="400m")],
        init=[container("side", cpu="200m", limit="250m", sidecar=True)],
    )
    lr = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "rules", "namespace": ns},
        "spec": {
            "limits": [
                {
                    "type": "Container",
                    "max": {"cpu": "1", "memory": "512Mi"},
                    "min": {"cpu": "100m"},
                    "maxLimitRequestRatio": {"cpu": "3"},
                },
                {"type": "Pod", "max": {"cpu": "1500m"}, "maxLimitRequestRatio": {"cpu": "2500m"}},
            ]
        },
    }
    ranges = (limit_range_from_dict(api.post(f"/api/v1/namespaces/{ns}/limitranges", lr)),)
    wait_limit_range_enforced(api, ns, node)
    candidates = {
        "one": [{"app": "500m"}, {"app": "600m"}, {"app": "700m"}, {"app": "1100m"}],
        "two": [{"a": "750m", "b": "750m"}, {"a": "800m", "b": "800m"}, {"a": "1", "b": "900m"}],
        "small": [{"app": "150m"}],
        "big-memory": [{"app": "400m"}],
        "sidecar": [{"app": "600m", "side": "400m"}, {"app": "900m", "side": "600m"}, sidecar_pod],
    }
    checked = 0
    for name, options in candidates.items():
        raw = api.get(pod_path(ns, name))
        record = pod_from_dict(raw)
        for limits in options:
            body: dict[str, Any] = {"spec": {}}
            kinds = {c["name"]: "containers" for c in raw["spec"]["containers"]}
            kinds.update({c["name"]: "initContainers" for c in raw["spec"].get("initContainers") or ()})
            for cname, value in limits.items():
                body["spec"].setdefault(kinds[cname], []).append(
                    {"name": cname, "resources": {"limits": {"cpu": value}}}
                )
            try:
                api.patch(pod_path(ns, name, "resize"), body, STRATEGIC_PATCH, {"dryRun": "All"})
                server = None
            except ApiError as exc:
                assert exc.status == 403, exc
                server = exc.message
            ours = limit_range_refusal(record, ranges, {k: cpu_milli(v) for k, v in limits.items()})
            assert (ours is None) == (server is None), (name, limits, ours, server)
            if ours is not None:
                assert ours.split(": ", 1)[1] in str(server), (ours, server)
            checked += 1
    assert checked == 12
