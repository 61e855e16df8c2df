"""The pod status annotation: what it says, when it is rewritten, what it shows."""

import json

from headroom.core.params import Settings
from headroom.core.planner import plan_node
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from headroom.engine.annotations import annotation_due, shown, status_annotation
from helpers.factories import container, node, pod

S = Settings(pool="batch")
NS = {"team": namespace_from_dict({"metadata": {"name": "team", "labels": {"kube-headroom.dev/mode": "managed"}}})}


def _plan(annotation=None):
    raw = pod(
        containers=[container(cpu="500m")], annotations={"kube-headroom.dev/status": annotation} if annotation else None
    )
    p = pod_from_dict(raw)
    plan = plan_node(node_from_dict(node(cpu="16")), [p], NS, S, pod_level_resize=False)
    return plan, plan.pods[0].target


def _due(annotation, settings=S):
    plan, t = _plan(annotation)
    return annotation_due(plan.pods[0].pod, t, settings)


def test_annotation_has_the_spec_shape():
    plan, t = _plan()
    value = json.loads(status_annotation(plan, t))
    assert list(value) == [
        "factor",
        "slack",
        "managedRequests",
        "nodePods",
        "target",
        "policy",
        "pool",
        "dryRun",
        "computedAt",
    ]
    assert value["factor"] == "32.00" and value["slack"] == "15500m" and value["managedRequests"] == "500m"
    assert (value["target"], value["policy"], value["pool"], value["dryRun"]) == (
        "5000m",
        "proportional-v1",
        "batch",
        False,
    )


def test_annotation_is_rewritten_only_when_it_says_something_new():
    assert _due(None)
    assert not _due('{"target":"5000m","pool":"batch","dryRun":false}')
    assert not _due('{"target":"4800m","pool":"batch","dryRun":false}')  # +4 %: inside the 10 % deadband
    assert _due('{"target":"3000m","pool":"batch","dryRun":false}')
    assert _due('{"target":"5000m","pool":"other","dryRun":false}')
    assert _due('{"target":"5000m","pool":"batch","dryRun":true}')
    assert _due("not json")


def test_what_an_annotation_shows_managed_released_or_unreadable():
    def show(annotation):
        return shown(pod_from_dict(pod(annotations={"kube-headroom.dev/status": annotation} if annotation else None)))

    assert show(None) == (False, None)
    assert show('{"target":"5000m"}') == (True, None)
    assert show('{"managed":false,"reason":"excluded"}') == (False, "excluded")
    assert show("not json") == (True, None)  # ours, unreadable: shown managed, so it is rewritten
    assert show("[1]") == (True, None)
