"""What each pinned Kubernetes release answers to every resize the controller can send,
held against the table in docs/platform-notes.md (so the doc cannot drift), and the
controller's capability decision on the same server.

Run on every release: `make test` runs this file on each pinned release.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headroom.cluster.client import STRATEGIC_PATCH, Api, ApiError, pod_path
from helpers.cluster_helpers import K8S_MINOR, K8S_VERSION, create_pod, wait_for, wait_limits
from helpers.factories import container
from testbed.sim_kubelet import SimulatedKubelet

pytestmark = pytest.mark.version_sensitive

ROOT = Path(__file__).resolve().parents[2]
POD_LEVEL = ["InPlacePodLevelResourcesVerticalScaling"]
TABLE_HEADING = "## Resize answers by release"


def _answer(send: Callable[[], Any]) -> str:
    try:
        send()
    except ApiError as exc:
        return str(exc.status)
    return "200"


def _resize(api: Api, ns: str, name: str, spec: dict[str, Any]) -> Callable[[], Any]:
    return lambda: api.patch(pod_path(ns, name, "resize"), {"spec": spec}, STRATEGIC_PATCH, {"fieldManager": "t"})


def _pod(api: Api, ns: str, node: str, **kw: Any) -> str:
    name = f"p-{uuid.uuid4().hex[:6]}"
    create_pod(api, ns, node, name, **kw)
    return name


def observe(api: Api, ns: str, make_node: Callable[..., str]) -> dict[str, str]:
    """Every case's answer on this server: "200" or the refusal's HTTP status."""
    plain, declaring = make_node(), make_node(features=POD_LEVEL)
    out: dict[str, str] = {}

    def app(limit: str = "1") -> list[dict[str, Any]]:
        return [container(cpu="500m", limit=limit, mem="128Mi", mem_limit="256Mi")]

    def limits(cpu: str) -> dict[str, Any]:
        return {"containers": [{"name": "app", "resources": {"limits": {"cpu": cpu}}}]}

    p = _pod(api, ns, plain, containers=app())
    out["container CPU limit raised"] = _answer(_resize(api, ns, p, limits("3")))
    out["container CPU limit cut, still above the request"] = _answer(_resize(api, ns, p, limits("600m")))
    out["container CPU limit below its request"] = _answer(_resize(api, ns, p, limits("400m")))
    small = make_node(cpu="1")
    big = _pod(api, ns, small, containers=[container(cpu="500m", limit="1")])
    requests = {"containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}]}
    out["requests raised beyond the node's allocatable (never sent by Headroom)"] = _answer(
        _resize(api, ns, big, requests)
    )
    pinned = _pod(api, ns, plain, containers=[container(cpu="500m", limit="1", mem="128Mi", mem_limit="128Mi")])
    out["container CPU limit equal to the request, memory pinned (QoS would change)"] = _answer(
        _resize(api, ns, pinned, limits("500m"))
    )

    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    bare = [container(cpu=None, mem=None, mem_limit=None)]
    pod_level = {"resources": {"limits": {"cpu": "3"}}}
    try:
        on_declaring = _pod(api, ns, declaring, containers=bare, pod_resources=res)
        on_plain = _pod(api, ns, plain, containers=bare, pod_resources=res)
    except ApiError as exc:  # a release without pod-level resources at all
        for case in PODLEVEL_CASES:
            out[case] = f"create {exc.status}"
        return out
    out["pod-level CPU limit raised, node declares the feature"] = _answer(_resize(api, ns, on_declaring, pod_level))
    out["pod-level CPU limit raised, node declares nothing"] = _answer(_resize(api, ns, on_plain, pod_level))
    out["pod-level CPU limit below the pod-level request"] = _answer(
        _resize(api, ns, on_declaring, {"resources": {"limits": {"cpu": "400m"}}})
    )
    capped = _pod(
        api,
        ns,
        declaring,
        containers=[container(cpu="100m", limit="400m", mem=None, mem_limit=None)],
        pod_resources={"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
    )
    out["pod-level CPU limit under a container's CPU limit"] = _answer(
        _resize(api, ns, capped, {"resources": {"limits": {"cpu": "300m"}}})
    )
    return out


PODLEVEL_CASES = [
    "pod-level CPU limit raised, node declares the feature",
    "pod-level CPU limit raised, node declares nothing",
    "pod-level CPU limit below the pod-level request",
    "pod-level CPU limit under a container's CPU limit",
]


def documented() -> dict[str, dict[str, str]]:
    """version -> case -> answer, from the table in docs/platform-notes.md."""
    text = (ROOT / "docs" / "platform-notes.md").read_text()
    assert TABLE_HEADING in text, f"docs/platform-notes.md has no '{TABLE_HEADING}' table"
    after = text.split(TABLE_HEADING, 1)[1].splitlines()
    start = next(i for i, ln in enumerate(after) if ln.startswith("|"))
    lines = list(itertools.takewhile(lambda ln: ln.startswith("|"), after[start:]))
    header = [c.strip().strip("`") for c in lines[0].strip("|").split("|")]
    table: dict[str, dict[str, str]] = {v: {} for v in header[1:]}
    for row in lines[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for version, cell in zip(header[1:], cells[1:], strict=True):
            table[version][cells[0]] = re.sub(r"\*", "", cell)
    return table


def test_every_resize_answer_is_the_one_documented_for_this_release(api, namespace, make_node):
    seen = observe(api, namespace, make_node)
    column = "\n".join(f"| {case} | {answer} |" for case, answer in seen.items())
    table = documented()
    assert K8S_VERSION in table, f"docs/platform-notes.md has no column for {K8S_VERSION}; observed:\n{column}"
    assert table[K8S_VERSION] == seen, f"{K8S_VERSION} answered differently from the doc; observed:\n{column}"


def test_plan_and_the_controller_agree_pod_by_pod_on_this_release(
    api, namespace, make_node, headroom_config, start_controller, control_plane
):
    """Container pods are managed everywhere; a pod-level pod only from 1.36 on and only on
    a node that declares the feature. `headroom plan` on the live server says so before
    the controller runs, and the controller then writes exactly what it said."""
    headroom_config()
    declaring, plain = make_node(cpu="8", features=POD_LEVEL), make_node(cpu="8")
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    bare = [container(cpu=None, mem=None, mem_limit=None)]
    with SimulatedKubelet(api, declaring), SimulatedKubelet(api, plain):
        for node, tag in ((declaring, "d"), (plain, "p")):
            create_pod(api, namespace, node, f"app-{tag}", containers=[container(cpu="500m")])
            create_pod(api, namespace, node, f"podlevel-{tag}", containers=bare, pod_resources=res)
        for tag in ("d", "p"):  # the kubelets have started the pods
            for name in (f"app-{tag}", f"podlevel-{tag}"):
                wait_for(api, pod_path(namespace, name), lambda p: (p.get("status") or {}).get("phase") == "Running")
        planned = {
            p["name"]: p
            for p in json.loads(headroom("plan", "-o", "json", "--kubeconfig", str(control_plane.kubeconfig())))["pods"]
            if p["namespace"] == namespace
        }
        on = K8S_MINOR >= 36
        expected = {
            "app-d": "Managed",
            "app-p": "Managed",
            "podlevel-d": "Managed" if on else "PodLevelResourcesUnsupported",
            "podlevel-p": "PodLevelResourcesUnsupported",
        }
        assert {n: p["reason"] for n, p in planned.items()} == expected
        c = start_controller()
        for name in ("app-d", "app-p"):
            wait_limits(api, namespace, name, [f"{planned[name]['targetLimitMilli'] / 1000:g}"], timeout=20)
        if on:
            target = planned["podlevel-d"]["targetLimitMilli"]
            deadline = time.monotonic() + 20
            while pod_level_cpu(api, namespace, "podlevel-d") != f"{target / 1000:g}":
                assert time.monotonic() < deadline, (pod_level_cpu(api, namespace, "podlevel-d"), target)
                time.sleep(0.2)
        time.sleep(3)  # a debounce and more: nothing else is written
        for name in [n for n, r in expected.items() if r != "Managed"]:
            assert pod_level_cpu(api, namespace, name) == "1", f"{name} was written on {K8S_VERSION}"
        assert not [r for r in c.logs() if r.get("result") in ("invalid", "error")], "a resize was refused"


def pod_level_cpu(api: Api, ns: str, name: str) -> str:
    return api.get(pod_path(ns, name))["spec"]["resources"]["limits"]["cpu"]


def headroom(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "headroom", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_webhook_gives_a_pod_level_limit_only_where_the_controller_could_resize_it(
    api, namespace, headroom_config, webhook_controller, make_node
):
    """The webhook asks the controller's own capability fact: on a 1.35 server (whose API
    server refuses every pod-level resize) and on a node that does not declare the feature,
    a pod with pod-level resources gets no pod-level limit at admission — one it could
    never shed (PodLevelResourcesUnsupported). Before, it got one on every release."""
    from helpers.factories import pod

    declaring, plain = make_node(features=POD_LEVEL), make_node()
    headroom_config()
    c, _ = webhook_controller("headroom-podlevel")
    c.wait_for_log("webhook serving")

    def created(node: str, pod_level: bool) -> dict[str, Any]:
        name = f"p-{uuid.uuid4().hex[:6]}"
        if pod_level:
            containers = [container(cpu=None, mem=None, mem_limit=None)]
            body = pod(name, namespace=namespace, node=node, containers=containers, pod_resources=POD_RESOURCES)
        else:
            body = pod(name, namespace=namespace, node=node, containers=[container(cpu="500m", mem_limit=None)])
        body.pop("status")
        return api.post(f"/api/v1/namespaces/{namespace}/pods", body)["spec"]

    deadline = time.monotonic() + 20
    while "limits" not in created(declaring, pod_level=False)["containers"][0]["resources"]:
        assert time.monotonic() < deadline, "the webhook never mutated an ordinary pod"
        time.sleep(0.3)
    # An ordinary pod mutated: the node cache is synced, and the capability fact was decided at
    # that sync, with both nodes (made before the controller started) in it.
    on_declaring = created(declaring, pod_level=True)["resources"]
    on_plain = created(plain, pod_level=True)["resources"]
    print(f"\n{K8S_VERSION}: pod-level limit on the declaring node {on_declaring.get('limits')}")
    assert on_plain == POD_RESOURCES, on_plain  # a node without the feature: nothing, on every release
    if K8S_MINOR >= 36:
        assert "cpu" in on_declaring.get("limits", {}), on_declaring
    else:  # a 1.35 server refuses every pod-level resize: nothing on any node
        assert on_declaring == POD_RESOURCES, on_declaring


POD_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}}
