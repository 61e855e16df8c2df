"""Every eligibility reason code, and that the first failing check is the one reported."""

import pytest

from headroom.core import eligibility as e
from headroom.core.params import Exclusions, Settings
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from headroom.core.selectors import Selector
from helpers.factories import container, namespace, node, pod

BASE = Settings()


def reason(raw_pod, *, ns=None, nd=None, settings=BASE, pod_level=True, backing_off=False):
    ns_rec = namespace_from_dict(ns if ns is not None else namespace())
    node_rec = node_from_dict(nd if nd is not None else node())
    return e.eligibility(
        pod_from_dict(raw_pod), ns_rec, node_rec, settings, pod_level_resize=pod_level, backing_off=backing_off
    )


def test_an_ordinary_burstable_pod_is_managed():
    assert reason(pod()) == e.MANAGED


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"raw_pod": pod(node=None)}, e.NOT_BOUND),
        ({"raw_pod": pod(phase="Failed")}, e.TERMINAL),
        ({"raw_pod": pod(deleting=True)}, e.TERMINATING),
        ({"raw_pod": pod(annotations={"kubernetes.io/config.mirror": "h"})}, e.MIRROR_POD),
        ({"raw_pod": pod(), "ns": namespace(managed=False)}, e.NAMESPACE_NOT_MANAGED),
        (
            {"raw_pod": pod(), "ns": namespace(managed=False, labels={"kube-headroom.dev/mode": "true"})},
            e.NAMESPACE_NOT_MANAGED,
        ),
        ({"raw_pod": pod(namespace="kube-system"), "ns": namespace("kube-system")}, e.NAMESPACE_EXCLUDED),
        ({"raw_pod": pod(labels={"kube-headroom.dev/mode": "unmanaged"})}, e.POD_OPTED_OUT),
        ({"raw_pod": pod(annotations={"kube-headroom.dev/mode": "unmanaged"})}, e.POD_OPTED_OUT),
        ({"raw_pod": pod(), "nd": node(os="windows")}, e.WINDOWS_NODE),
        (
            {"raw_pod": pod(), "nd": node(labels={"kube-headroom.dev/cpu-manager-policy": "static"})},
            e.STATIC_CPU_MANAGER,
        ),
        ({"raw_pod": {**pod(), "spec": {**pod()["spec"], "os": {"name": "windows"}}}}, e.WINDOWS_NODE),
        ({"raw_pod": pod(containers=[container(cpu="1", limit="1", mem="1Gi", mem_limit="1Gi")])}, e.NOT_BURSTABLE),
        ({"raw_pod": pod(containers=[container(cpu=None, mem=None, mem_limit=None)])}, e.NOT_BURSTABLE),
        ({"raw_pod": pod(containers=[container("a"), container("b", cpu=None)])}, e.ZERO_CPU_REQUEST),
        ({"raw_pod": pod(containers=[container(restart_on_resize=True)])}, e.RESTART_ON_RESIZE),
        (
            {"raw_pod": pod(pod_resources={"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}), "pod_level": False},
            e.POD_LEVEL_UNSUPPORTED,
        ),
        ({"raw_pod": pod(), "backing_off": True}, e.BACKING_OFF),
        ({"raw_pod": pod(), "settings": Settings(paused=True)}, e.POOL_PAUSED),
    ],
)
def test_reason_codes(kwargs, expected):
    assert reason(**kwargs) == expected


def test_exclusions_by_selector_owner_and_node():
    ex = Exclusions(
        pod_selectors=(Selector.from_dict({"matchLabels": {"tier": "gang"}}),),
        owner_kinds=frozenset({"Job"}),
        node_selectors=(Selector.from_dict({"matchLabels": {"cpu-manager": "static"}}),),
    )
    s = Settings(exclusions=ex)
    assert reason(pod(labels={"tier": "gang"}), settings=s) == e.POD_SELECTOR_EXCLUDED
    assert reason(pod(owner_kind="Job"), settings=s) == e.OWNER_KIND_EXCLUDED
    assert reason(pod(), nd=node(labels={"cpu-manager": "static"}), settings=s) == e.NODE_EXCLUDED
    assert reason(pod(owner_kind="ReplicaSet"), settings=s) == e.MANAGED


def test_namespace_selector_adds_namespaces():
    s = Settings(namespace_selector=Selector.from_dict({"matchLabels": {"tenant": "yes"}}))
    assert reason(pod(), ns=namespace(managed=False, labels={"tenant": "yes"}), settings=s) == e.MANAGED


def test_first_failing_check_wins():
    # terminal, in an unmanaged namespace, and Guaranteed: Terminal comes first
    raw = pod(phase="Succeeded", containers=[container(cpu="1", limit="1", mem="1Gi", mem_limit="1Gi")])
    assert reason(raw, ns=namespace(managed=False)) == e.TERMINAL


def test_container_excluded_by_name_needs_no_request_and_gets_no_limit():
    s = Settings(exclusions=Exclusions(containers=frozenset({"istio-proxy"})))
    raw = pod(containers=[container("app"), container("istio-proxy", cpu=None, limit="2")])
    p = pod_from_dict(raw)
    assert reason(raw, settings=s) == e.MANAGED
    assert [c.name for c in e.computed_containers(p, s)] == ["app"]


def test_pod_level_pod_is_managed_without_container_requests():
    raw = pod(
        containers=[container(cpu=None, mem=None, mem_limit=None)],
        pod_resources={"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
    )
    assert reason(raw, pod_level=True) == e.MANAGED


def test_reason_list_is_complete():
    assert len(e.REASONS) == 23 and len(set(e.REASONS)) == 23
