"""In-place resize on the real API server (issue 3e) and the simulated kubelet (3.4).

The server's exact refusals are recorded in docs/platform-notes.md; the controller's
error handling relies on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from headroom.cluster.client import STRATEGIC_PATCH, Api, ApiError, pod_path
from headroom.core.records import pod_from_dict
from helpers.cluster_helpers import K8S_MINOR, create_pod
from helpers.factories import container
from testbed.sim_kubelet import INFEASIBLE, SimulatedKubelet

pytestmark = pytest.mark.version_sensitive


def _resize(api: Api, ns: str, name: str, limits: dict[str, str], container_name: str = "app") -> dict[str, Any]:
    return resize_patch(
        api,
        ns,
        name,
        {"spec": {"containers": [{"name": container_name, "resources": {"limits": limits}}]}},
        manager="headroom",
    )


def resize_patch(api: Api, ns: str, name: str, body: dict[str, Any], manager: str = "headroom-tests") -> dict[str, Any]:
    return api.patch(pod_path(ns, name, "resize"), body, STRATEGIC_PATCH, {"fieldManager": manager})


def _cpu_limit(p: dict[str, Any]) -> str:
    return p["spec"]["containers"][0]["resources"]["limits"]["cpu"]


def test_raise_and_cut_a_cpu_limit_in_place(api, namespace, make_node):
    node = make_node()
    created = create_pod(
        api, namespace, node, "p", containers=[container(cpu="500m", limit="1", mem="128Mi", mem_limit="128Mi")]
    )
    assert created["status"]["qosClass"] == "Burstable"
    raised = _resize(api, namespace, "p", {"cpu": "3"})
    assert _cpu_limit(raised) == "3"
    assert raised["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "128Mi"}
    managers = {(m["manager"], m.get("subresource")) for m in raised["metadata"]["managedFields"]}
    assert ("headroom", "resize") in managers
    cut = _resize(api, namespace, "p", {"cpu": "600m"})
    assert _cpu_limit(cut) == "600m" and int(cut["metadata"]["resourceVersion"]) > int(
        raised["metadata"]["resourceVersion"]
    )


def test_a_resize_that_would_make_the_pod_guaranteed_is_refused(api, namespace, make_node):
    node = make_node()
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m", limit="1", mem="128Mi", mem_limit="128Mi")])
    with pytest.raises(ApiError) as err:
        _resize(api, namespace, "p", {"cpu": "500m"})
    assert err.value.status == 422
    assert (
        err.value.message
        == 'Pod "p" is invalid: spec: Invalid value: "Burstable": Pod QOS Class may not change as a result of resizing'
    )


def test_a_limit_below_the_request_is_refused(api, namespace, make_node):
    node = make_node()
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m", limit="1")])
    with pytest.raises(ApiError) as err:
        _resize(api, namespace, "p", {"cpu": "400m"})
    assert err.value.status == 422
    assert err.value.message == (
        'Pod "p" is invalid: spec.containers[0].resources.requests: Invalid value: "500m": '
        "must be less than or equal to cpu limit of 400m"
    )


def test_resize_ignores_everything_but_resources(api, namespace, make_node):
    """The subresource drops other changes silently (no error): a resize patch cannot harm a pod."""
    node = make_node()
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m", limit="1")])
    got = resize_patch(
        api,
        namespace,
        "p",
        {
            "metadata": {"labels": {"x": "y"}},
            "spec": {"containers": [{"name": "app", "image": "other:2", "resources": {"limits": {"cpu": "2"}}}]},
        },
    )
    assert _cpu_limit(got) == "2"
    assert got["spec"]["containers"][0]["image"] == "registry.example/app:1"
    assert "x" not in (got["metadata"].get("labels") or {})


POD_LEVEL = ["InPlacePodLevelResourcesVerticalScaling"]
# Before 1.36 the API server's gate is off: every pod-level resize meets this, whatever the node.
GATE_OFF = (
    'Pod "p" is invalid: []: Forbidden: resize of pods with pod-level resources is forbidden when '
    "InPlacePodLevelResourcesVerticalScalingEnabled feature gate is disabled"
)


def refused(send: Callable[[], Any], status: int, message: str) -> None:
    """`send` is refused with `status` and `message` on this release; on a release whose
    API server has the pod-level resize gate off, with that refusal instead."""
    if K8S_MINOR < 36:
        status, message = 422, GATE_OFF
    with pytest.raises(ApiError) as err:
        send()
    assert (err.value.status, err.value.message) == (status, message)


def test_pod_level_resize_is_refused_on_a_node_that_does_not_declare_the_feature(api, namespace, make_node):
    node = make_node()  # no status.declaredFeatures, like a kubelet that predates them
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    create_pod(api, namespace, node, "p", containers=[container(cpu=None, mem=None, mem_limit=None)], pod_resources=res)
    refused(
        lambda: resize_patch(api, namespace, "p", {"spec": {"resources": {"limits": {"cpu": "3"}}}}),
        403,
        'pods "p" is forbidden: pod update requires features InPlacePodLevelResourcesVerticalScaling '
        f'which are not available on node "{node}"',
    )


def test_pod_level_cpu_limit_resizes_in_place_on_this_release(api, namespace, make_node):
    node = make_node(features=POD_LEVEL)
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    create_pod(api, namespace, node, "p", containers=[container(cpu=None, mem=None, mem_limit=None)], pod_resources=res)
    raise_it = lambda: resize_patch(api, namespace, "p", {"spec": {"resources": {"limits": {"cpu": "3"}}}})  # noqa: E731
    if K8S_MINOR < 36:
        refused(raise_it, 0, "")
        return
    assert raise_it()["spec"]["resources"]["limits"]["cpu"] == "3"
    refused(
        lambda: resize_patch(api, namespace, "p", {"spec": {"resources": {"limits": {"cpu": "400m"}}}}),
        422,
        'Pod "p" is invalid: spec.resources.requests: Invalid value: "500m": must be less than or equal to cpu limit of 400m',
    )


def test_pod_level_memory_pinned_keeps_cpu_above_request(api, namespace, make_node):
    node = make_node(features=POD_LEVEL)
    res = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}
    create_pod(api, namespace, node, "p", containers=[container(cpu=None, mem=None, mem_limit=None)], pod_resources=res)
    refused(
        lambda: resize_patch(api, namespace, "p", {"spec": {"resources": {"limits": {"cpu": "100m"}}}}),
        422,
        'Pod "p" is invalid: spec: Invalid value: "Burstable": Pod QOS Class may not change as a result of resizing',
    )
    if K8S_MINOR >= 36:
        got = resize_patch(api, namespace, "p", {"spec": {"resources": {"limits": {"cpu": "110m"}}}})
        assert got["spec"]["resources"]["limits"]["cpu"] == "110m"


def test_pod_level_limit_cannot_go_under_a_container_limit(api, namespace, make_node):
    node = make_node(features=POD_LEVEL)
    res = {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    create_pod(
        api,
        namespace,
        node,
        "p",
        containers=[container(cpu="100m", limit="400m", mem=None, mem_limit=None)],
        pod_resources=res,
    )
    refused(
        lambda: resize_patch(api, namespace, "p", {"spec": {"resources": {"limits": {"cpu": "300m"}}}}),
        422,
        'Pod "p" is invalid: spec.resources.containers[0][cpu].limits: Invalid value: "400m": '
        "must be less than or equal to pod limits of 300m",
    )


def test_resize_admission_checks_node_allocatable_from_1_36(api, namespace, make_node):
    """A 403 that is not a quota: the node cannot hold the pod's requests. A 1.35 server does
    not check (its PodResizeValidator predates the allocatable check) and admits the resize."""
    node = make_node(cpu="1")
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m", limit="1")])
    body = {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}]}}
    if K8S_MINOR < 36:
        assert resize_patch(api, namespace, "p", body)["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
        return
    with pytest.raises(ApiError) as err:
        resize_patch(api, namespace, "p", body)
    assert err.value.status == 403
    assert err.value.message == (
        'pods "p" is forbidden: node didn\'t have enough allocatable resources: cpu, requested: 2000, allocatable: 1000'
    )


def _pod_when(api: Api, path: str, predicate, timeout: float = 10.0) -> dict[str, Any]:
    """The pod, as soon as `predicate(pod)` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = api.get(path)
        if predicate(p):
            return p
        time.sleep(0.1)
    raise AssertionError(f"{path}: condition not reached in {timeout}s; status: {p.get('status')}")


def _has_condition(kind: str):
    return lambda p: any(c["type"] == kind for c in p["status"].get("conditions", []))


def _running(p: dict[str, Any]) -> bool:
    return p["status"].get("phase") == "Running"


def _actual_cpu_limit(p: dict[str, Any]) -> str:
    return p["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"]


def test_simulated_kubelet_starts_pods_and_applies_resizes(api, namespace, make_node):
    node = make_node()
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m", limit="1")])
    path = f"/api/v1/namespaces/{namespace}/pods/p"
    with SimulatedKubelet(api, node, delay=1.0) as kubelet:
        started = _pod_when(api, path, _running)
        assert _actual_cpu_limit(started) == "1"
        _resize(api, namespace, "p", {"cpu": "2"})
        in_flight = _pod_when(api, path, _has_condition("PodResizeInProgress"))
        assert _actual_cpu_limit(in_flight) == "1"
        done = _pod_when(api, path, lambda p: _actual_cpu_limit(p) == "2")
        assert not any(c["type"].startswith("PodResize") for c in done["status"]["conditions"])
    # Counted once its thread has stopped: the status write is seen before the count moves.
    assert kubelet.applied == 1


def test_simulated_kubelet_books_the_larger_request_while_a_resize_is_in_flight(api, namespace, make_node):
    """What the controller's booking reads: allocatedResources moves before resources do."""
    node = make_node()
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m", limit="1")])
    path = f"/api/v1/namespaces/{namespace}/pods/p"
    with SimulatedKubelet(api, node, delay=1.5):
        _pod_when(api, path, _running)
        resize_patch(
            api, namespace, "p", {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": "800m"}}}]}}
        )
        p = _pod_when(api, path, lambda p: p["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] == "800m")
        assert _actual_cpu_limit(p) == "1"  # the kubelet has not actuated it yet
        assert pod_from_dict(p).booked_cpu == 800


def test_simulated_kubelet_reports_infeasible(api, namespace, make_node):
    node = make_node()
    create_pod(api, namespace, node, "p", containers=[container(cpu="500m", limit="1")])
    path = f"/api/v1/namespaces/{namespace}/pods/p"
    with SimulatedKubelet(api, node, outcome=INFEASIBLE) as kubelet:
        _pod_when(api, path, _running)
        _resize(api, namespace, "p", {"cpu": "64"})
        p = _pod_when(api, path, _has_condition("PodResizePending"))
        assert pod_from_dict(p).resize_infeasible
        assert kubelet.applied == 0
