"""The three-way rule for in-place resize of pod-level resources."""

import pytest

from headroom.api.resolve import resolve
from headroom.core.capabilities import node_allows_pod_level_resize, parse_version, pod_level_resize
from headroom.core.planner import plan_cluster
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from helpers.factories import container, namespace, node, pod

GATE = "InPlacePodLevelResourcesVerticalScaling"


def nodes(*feature_lists, ready=True):
    return [node_from_dict(node(f"n{i}", features=f, ready=ready)) for i, f in enumerate(feature_lists)]


@pytest.mark.parametrize(
    "node_list,version,expected",
    [
        (nodes([GATE, "Other"]), None, True),  # name present => on
        (nodes(["Other"]), (1, 37), False),  # non-empty list without it => off, whatever the version
        (nodes([], None), (1, 36), True),  # empty lists => version fallback
        (nodes([], None), (1, 35), False),
        (None, (1, 36), True),  # nodes unreadable => version fallback
        (None, None, False),  # offline without a version => off
        (nodes(["Other"]) + nodes([GATE]), None, True),  # any node listing it => on
        (nodes([GATE], ready=False), (1, 35), False),  # only Ready nodes count
        (nodes([GATE]), (1, 35), False),  # a 1.35 server refuses pod-level resizes whatever nodes declare
    ],
)
def test_three_way_rule(node_list, version, expected):
    assert pod_level_resize(node_list, version) is expected


@pytest.mark.parametrize(
    "text,expected", [("v1.36.4", (1, 36)), ("1.37", (1, 37)), ("v1.35.8-gke.1", (1, 35)), ("x", None), (None, None)]
)
def test_parse_version(text, expected):
    assert parse_version(text) == expected


def test_plan_applies_the_controllers_per_node_rule():
    """`plan` and `run` decide pod-level pods alike: the cluster rule, and the node itself
    declaring the feature (a v1.36+ server refuses the resize on a node that does not)."""
    declaring, silent = nodes([GATE], ["Other"])
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    pods = [
        pod_from_dict(
            pod(
                f"p-{n.name}",
                node=n.name,
                containers=[container(cpu=None, mem=None, mem_limit=None)],
                pod_resources=res,
            )
        )
        for n in (declaring, silent)
    ]
    ns = {"team": namespace_from_dict(namespace("team", managed=True))}
    base = resolve(
        [{"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}], []
    )
    plan = plan_cluster([declaring, silent], pods, ns, base.resolver, pod_level_resize=True)
    reasons = {pp.pod.node_name: pp.reason for pp in plan.all_pods()}
    assert reasons == {"n0": "Managed", "n1": "PodLevelResourcesUnsupported"}
    assert [node_allows_pod_level_resize(n, True) for n in (declaring, silent)] == [True, False]
