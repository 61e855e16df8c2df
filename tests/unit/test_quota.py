"""ResourceQuota room as the controller keeps it (pure logic; the server's own answers are
checked in tests/integration/test_coexistence.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.core import quota
from headroom.core.params import Settings
from headroom.core.policy import Managed, fit_room, limit_delta, split
from headroom.core.records import pod_from_dict
from helpers.factories import container, pod


def test_a_quota_budget_reserves_raises_until_the_watch_shows_them():
    q = quota.quota_from_dict(
        {
            "metadata": {"name": "q", "namespace": "team", "resourceVersion": "1"},
            "spec": {"hard": {"limits.cpu": "3"}},
            "status": {"used": {"limits.cpu": "1200m"}},
        }
    )
    pods = {f"team/{n}": pod_from_dict(pod(n, containers=[container(cpu="200m", limit="400m")])) for n in "abc"}
    budget = quota.QuotaBudget(lambda ns: sum(quota.pod_limits_cpu(p) for p in pods.values()), pods.get)
    assert budget.room("team", (q,)).value == 1800
    a = pods["team/a"]
    assert budget.take(a, (q,), 1600) is None
    assert budget.room("team", (q,)).value == 200  # reserved, not yet seen
    short = budget.take(pods["team/b"], (q,), 1600)
    assert short is not None and short.source == "ResourceQuota team/q"
    # the watch brings a at its new limit: counted once, from the pods
    pods["team/a"] = pod_from_dict(
        {
            **pod("a", containers=[container(cpu="200m", limit="2")]),
            "metadata": {"name": "a", "namespace": "team", "resourceVersion": "9"},
        }
    )
    assert budget.room("team", (q,)).value == 200
    budget.give_back(pods["team/b"])  # nothing reserved: harmless
    not_counted = quota.quota_from_dict(
        {"metadata": {"name": "q", "namespace": "team"}, "spec": {"hard": {"limits.cpu": "3"}}}
    )
    assert budget.room("team", (not_counted,)).value == 0  # the quota controller has not counted: no raise


def test_a_raise_is_cut_to_what_the_quota_admits_or_not_sent():
    p = pod_from_dict(pod(containers=[container(cpu="200m", limit="400m")]))
    m = Managed(p, p.containers)
    t = split(m, 2000, "proportional", Settings())
    assert limit_delta(t) == 1600
    assert fit_room(t, 2000, "ResourceQuota team/q", Settings()) is t
    smaller = fit_room(t, 200, "ResourceQuota team/q", Settings())
    assert smaller is not None and smaller.target == 600 and smaller.bound == "ResourceQuota team/q"
    assert fit_room(t, 20, "ResourceQuota team/q", Settings()) is None  # inside the deadband: not worth a write


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "drop", "quota", "unquota"]),
            st.sampled_from(["a", "b"]),
            st.sampled_from(["p1", "p2", "p3"]),
            st.sampled_from([None, "200m", "1", "3"]),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_the_cache_keeps_namespace_limit_sums_equal_to_a_scan(events):
    """The quota budget reads the namespace's limits on every raise: kept incrementally for
    namespaces with a limits.cpu quota, always equal to summing the pods."""
    from headroom.cluster.cache import ClusterCache

    cache = ClusterCache()
    for op, ns, name, limit, done in events:
        if op == "put":
            raw = pod(
                name,
                namespace=ns,
                containers=[container(cpu="100m", limit=limit)],
                phase="Succeeded" if done else "Running",
            )
            cache.upsert_pod(pod_from_dict(raw))
        elif op == "drop":
            cache.delete_pod(f"{ns}/{name}")
        elif op == "quota":
            q = quota.quota_from_dict(
                {"metadata": {"name": "q", "namespace": ns}, "spec": {"hard": {"limits.cpu": "10"}}}
            )
            cache.put_neighbour(quota.QUOTA_KIND, q)
        else:
            cache.delete_neighbour(quota.QUOTA_KIND, ns, "q")
        for n in ("a", "b"):
            scan = sum(quota.pod_limits_cpu(p) for p in cache.pods.values() if p.namespace == n)
            assert cache.namespace_limits(n) == scan
