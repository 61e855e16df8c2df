"""The controller's gauges kept as running totals agree with a recount over every node."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from factories import container, node, pod
from headroom.core.params import Settings
from headroom.core.planner import plan_node
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from headroom.metrics import Metrics

NS = {"team": namespace_from_dict({"metadata": {"name": "team", "labels": {"kube-headroom.dev/mode": "managed"}}})}


def _plan(name: str, pool: str, pods: int, pending: int):
    raws = [pod(name=f"{name}-p{i}", node=name, containers=[container(cpu="100m")]) for i in range(pods)]
    for raw in raws[:pending]:  # the kubelet has not applied their last resize yet
        raw["status"]["conditions"] = [{"type": "PodResizeInProgress", "status": "True"}]
    records = [pod_from_dict(r) for r in raws]
    return plan_node(node_from_dict(node(name=name, cpu="8")), records, NS, Settings(pool=pool), pod_level_resize=False)


def _scrape(m: Metrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(m.registry).decode().splitlines():
        if line.startswith(("headroom_pods_managed", "headroom_pending_resizes ")):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


step = st.tuples(
    st.sampled_from(["n1", "n2", "n3"]),
    st.sampled_from(["", "batch"]),
    st.integers(0, 4),
    st.integers(0, 4),
    st.booleans(),  # True: the node is deleted instead
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step, max_size=25))
def test_pods_managed_and_pending_match_a_recount_after_any_sequence(steps):
    m = Metrics()
    nodes: dict[str, tuple[str, int, int]] = {}  # the truth: node -> (pool, managed, pending)
    for name, pool, pods, pending, gone in steps:
        if gone:
            m.forget_node(name)
            nodes.pop(name, None)
        else:
            m.observe_node(_plan(name, pool, pods, min(pending, pods)))
            nodes[name] = (pool, pods, min(pending, pods))
    want = {f'headroom_pods_managed{{pool="{p}"}}': 0.0 for p, _, _ in nodes.values()}
    for p, managed, _ in nodes.values():
        want[f'headroom_pods_managed{{pool="{p}"}}'] += managed
    want["headroom_pending_resizes"] = float(sum(pending for _, _, pending in nodes.values()))
    assert _scrape(m) == want
