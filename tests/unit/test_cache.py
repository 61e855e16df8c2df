"""The cluster cache: which nodes a change makes stale, urgent changes, relists."""

from __future__ import annotations

from headroom.cluster.cache import ClusterCache
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from helpers.factories import container, namespace, node, pod


def _pod(**kw):
    return pod_from_dict(pod(**kw))


def test_cache_reports_which_nodes_a_change_affects():
    c = ClusterCache()
    assert c.upsert_node(node_from_dict(node("n1", cpu="8"))).nodes == {"n1"}
    assert c.upsert_pod(_pod(name="a", node=None)).nodes == set()  # unbound: no node to recompute
    assert c.upsert_pod(_pod(name="a", node="n1")).nodes == {"n1"}  # bound
    raw = pod(name="a", node="n1")
    raw["metadata"]["resourceVersion"] = "99"
    raw["metadata"]["annotations"] = {"kube-headroom.dev/status": "{}"}
    assert not c.upsert_pod(pod_from_dict(raw))  # only version and our own annotation changed
    assert c.upsert_pod(_pod(name="a", node="n1", containers=[container(cpu="1")])).nodes == {"n1"}
    assert c.delete_pod("team/a").nodes == {"n1"}
    assert c.view("n1").pods == ()


def test_cache_urgent_on_allocatable_drop_and_gone_on_delete():
    c = ClusterCache()
    c.upsert_node(node_from_dict(node("n1", cpu="8")))
    assert c.upsert_node(node_from_dict(node("n1", cpu="16"))).nodes == {"n1"}
    assert c.upsert_node(node_from_dict(node("n1", cpu="4"))).urgent == {"n1"}
    assert c.delete_node("n1").gone == {"n1"}
    assert c.view("n1") is None


def test_cache_relist_drops_what_vanished_and_namespace_labels_touch_their_nodes():
    c = ClusterCache()
    c.replace_nodes([node_from_dict(node("n1")), node_from_dict(node("n2"))])
    c.replace_pods([_pod(name="a", node="n1"), _pod(name="b", node="n2", namespace="other")])
    stale = c.replace_pods([_pod(name="a", node="n1")])
    assert stale.nodes == {"n2"} and c.pod("other/b") is None
    c.replace_namespaces([namespace_from_dict(namespace("team"))])
    assert c.upsert_namespace(namespace_from_dict(namespace("team", managed=False))).nodes == {"n1"}
    assert c.replace_nodes([node_from_dict(node("n1"))]).gone == {"n2"}
