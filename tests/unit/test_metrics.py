"""The controller's gauges kept as running totals agree with a recount over every node."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from headroom.core.params import Settings
from headroom.core.planner import plan_node
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from headroom.metrics import Metrics
from helpers.factories import container, node, pod

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


def _lagging_pod(name: str, applied: str | None):
    """A managed running pod whose spec limit is 1 and whose kubelet reports `applied`
    (None: the kubelet reports the spec's limit)."""
    raw = pod(name=name, containers=[container("app", cpu="100m", limit="1")])
    limits = {"cpu": applied or "1"}
    raw["status"]["containerStatuses"] = [
        {"name": "app", "state": {"running": {}}, "resources": {"requests": {"cpu": "100m"}, "limits": limits}}
    ]
    if applied is not None:  # a resize the node cannot fit now
        raw["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": "Deferred"}]
    return pod_from_dict(raw)


def _node_plan(*pods):
    return plan_node(node_from_dict(node(name="n1", cpu="8")), list(pods), NS, Settings(), pod_level_resize=False)


def _series(m: Metrics, name: str) -> dict[str, float]:
    out = {}
    for line in generate_latest(m.registry).decode().splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_resize_lag_counts_pods_whose_applied_limit_differs_for_longer_than_the_bound():
    now = [1000.0]
    m = Metrics(pod_series=True, lag_seconds=60, clock=lambda: now[0])
    m.observe_node(_node_plan(_lagging_pod("a", "200m"), _lagging_pod("b", None)))
    assert _series(m, "headroom_resize_lag_pods") == {"headroom_resize_lag_pods": 0.0}  # not yet for long
    now[0] += 59
    m.observe_node(_node_plan(_lagging_pod("a", "200m"), _lagging_pod("b", None)))  # another pass keeps the start
    assert _series(m, "headroom_resize_lag_pods")["headroom_resize_lag_pods"] == 0.0
    now[0] += 1  # time alone moves the count: it is read at the scrape
    assert _series(m, "headroom_resize_lag_pods")["headroom_resize_lag_pods"] == 1.0
    assert _series(m, "headroom_pod_applied_limit_cores") == {
        'headroom_pod_applied_limit_cores{container="app",namespace="team",pod="a"}': 0.2,
        'headroom_pod_applied_limit_cores{container="app",namespace="team",pod="b"}': 1.0,
    }
    assert len(_series(m, "headroom_pod_limit_cores{")) == 2  # the targets of a and b
    m.observe_node(_node_plan(_lagging_pod("a", None)))  # applied at last; b gone
    assert _series(m, "headroom_resize_lag_pods")["headroom_resize_lag_pods"] == 0.0
    assert _series(m, "headroom_pod_applied_limit_cores") == {
        'headroom_pod_applied_limit_cores{container="app",namespace="team",pod="a"}': 1.0
    }
    m.observe_node(_node_plan(_lagging_pod("a", "300m")))  # a new disagreement starts a new clock
    now[0] += 30
    assert _series(m, "headroom_resize_lag_pods")["headroom_resize_lag_pods"] == 0.0
    m.forget_node("n1")
    now[0] += 60
    assert _series(m, "headroom_resize_lag_pods")["headroom_resize_lag_pods"] == 0.0
    assert _series(m, "headroom_pod_applied_limit_cores") == {}


def test_every_resize_outcome_is_exported_at_zero_before_the_first():
    """An increase() over the first failure of a kind sees it only if the series was there."""
    series = _series(Metrics(), "headroom_resizes_total")
    assert len(series) == 8 and set(series.values()) == {0.0}
    assert 'headroom_resizes_total{dry_run="false",result="quota-denied"}' in series


def test_the_outcomes_exported_at_zero_are_the_writers_and_the_dry_runs():
    from headroom.cluster import writer
    from headroom.engine.reconciler import WOULD_APPLY
    from headroom.metrics import OUTCOMES

    written = (writer.APPLIED, writer.INFEASIBLE, writer.QUOTA_DENIED, writer.INVALID, writer.CONFLICT)
    assert set(OUTCOMES) == {*((r, "false") for r in (*written, writer.THROTTLED, writer.ERROR)), (WOULD_APPLY, "true")}


def _get(port: int, path: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_probe_port_serves_probes_only_and_scrapes_share_one_render():
    """The health port answers /healthz, /livez and /readyz and nothing else (so closing
    the metrics port with the NetworkPolicy closes /metrics); the metrics port answers
    /metrics only. Scrapes within a second share one rendering of the exposition (a
    collector counts how often it is asked). Before: /metrics was on both ports and every
    scrape rendered the whole exposition (16 scrapers pushed /healthz to 0.87 s)."""
    import threading

    from headroom.metrics import RENDER_EVERY, Metrics, serve

    class Counting:
        def __init__(self) -> None:
            self.calls = 0

        def collect(self):
            self.calls += 1
            return []

    m = Metrics()
    counting = Counting()
    m.registry.register(counting)  # type: ignore[arg-type]
    probes = serve(0, "127.0.0.1", healthy=lambda: (True, "ok"), ready=lambda: (False, "caches not synced"))
    scrapes = serve(0, "127.0.0.1", metrics=m)
    try:
        assert _get(probes.port, "/healthz")[0] == 200
        assert _get(probes.port, "/livez")[0] == 200
        assert _get(probes.port, "/readyz") == (503, b"not ready: caches not synced\n")
        assert _get(probes.port, "/metrics")[0] == 404
        assert _get(scrapes.port, "/healthz")[0] == 404
        before = counting.calls
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(_get(scrapes.port, "/metrics")[0])) for _ in range(16)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [200] * 16
        renders = counting.calls - before
        print(f"\n16 concurrent scrapes: {renders} render(s) (at most one per {RENDER_EVERY} s)")
        assert renders <= 2  # 16 scrapes in well under two seconds: one render, two at a boundary
    finally:
        probes.shutdown()
        scrapes.shutdown()
