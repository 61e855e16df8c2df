"""VPAs, LimitRanges and ResourceQuotas as the policy sees them (pure logic; the server's
own answers are checked in tests/integration/test_coexistence.py)."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from factories import container, pod
from headroom.core import limitrange, quota, release
from headroom.core import neighbours as nb
from headroom.core.params import Settings
from headroom.core.policy import Managed, fit_room, limit_delta, split
from headroom.core.records import pod_from_dict


def _deployment_pod(**kw):
    return pod_from_dict(
        pod(
            "web-5d8f-x",
            owner_kind="ReplicaSet",
            owner_name="web-5d8f",
            labels={"pod-template-hash": "5d8f"},
            **kw,
        )
    )


def _vpa(**spec):
    return nb.vpa_from_dict(
        {
            "metadata": {"name": "v", "namespace": "team"},
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, **spec},
        }
    )


def test_the_owner_chain_reaches_the_deployment_cronjob_and_rollout():
    assert nb.owner_chain(_deployment_pod()) == (("ReplicaSet", "web-5d8f"), ("Deployment", "web"))
    job = pod_from_dict(pod(owner_kind="Job", owner_name="nightly-29000000"))
    assert nb.owner_chain(job) == (("Job", "nightly-29000000"), ("CronJob", "nightly"))
    rollout = pod_from_dict(
        pod(owner_kind="ReplicaSet", owner_name="canary-7c9", labels={"rollouts-pod-template-hash": "7c9"})
    )
    assert ("Rollout", "canary") in nb.owner_chain(rollout)
    # a ReplicaSet whose name does not end in the pod's hash is not guessed further
    lone = pod_from_dict(pod(owner_kind="ReplicaSet", owner_name="web", labels={"pod-template-hash": "5d8f"}))
    assert nb.owner_chain(lone) == (("ReplicaSet", "web"),)


def test_which_vpas_own_the_cpu_limits():
    p = _deployment_pod()
    n = lambda v: nb.with_object(nb.EMPTY, nb.VPA_KIND, v, "team", "v")  # noqa: E731
    assert n(_vpa()).vpa_controlling(p) is not None  # the default controls requests and limits
    assert n(_vpa(updatePolicy={"updateMode": "Off"})).vpa_controlling(p) is None
    only_requests = {"containerPolicies": [{"containerName": "*", "controlledValues": "RequestsOnly"}]}
    assert n(_vpa(resourcePolicy=only_requests)).vpa_controlling(p) is None
    memory_only = {"containerPolicies": [{"containerName": "app", "controlledResources": ["memory"]}]}
    assert n(_vpa(resourcePolicy=memory_only)).vpa_controlling(p) is None
    app_off = {"containerPolicies": [{"containerName": "app", "mode": "Off"}]}
    assert n(_vpa(resourcePolicy=app_off)).vpa_controlling(p) is None
    other = nb.vpa_from_dict(
        {"metadata": {"name": "v", "namespace": "team"}, "spec": {"targetRef": {"kind": "Deployment", "name": "api"}}}
    )
    assert n(other).vpa_controlling(p) is None
    elsewhere = nb.vpa_from_dict(
        {"metadata": {"name": "v", "namespace": "other"}, "spec": {"targetRef": {"kind": "Deployment", "name": "web"}}}
    )
    assert nb.with_object(nb.EMPTY, nb.VPA_KIND, elsewhere, "other", "v").vpa_controlling(p) is None


def _lr(*items):
    return limitrange.limit_range_from_dict(
        {"metadata": {"name": "lr", "namespace": "team"}, "spec": {"limits": list(items)}}
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(10, 4000), min_size=1, max_size=3),
    st.integers(100, 8000),
    st.integers(1000, 5000),
    st.booleans(),
)
def test_the_cap_keeps_every_split_inside_the_limit_range(requests, cmax, ratio, pinned):
    """Whatever the total the policy picks up to the cap, the LimitRanger admits the split."""
    cs = [
        container(f"c{i}", cpu=f"{r}m", limit=f"{r}m" if pinned else None, mem_limit="128Mi" if pinned else "256Mi")
        for i, r in enumerate(requests)
    ]
    p = pod_from_dict(pod(containers=cs))
    ranges = (
        _lr(
            {
                "type": "Container",
                "max": {"cpu": f"{max(cmax, max(requests) + 10)}m"},
                "maxLimitRequestRatio": {"cpu": f"{ratio}m"},
            },
            {"type": "Pod", "max": {"cpu": f"{sum(requests) * 3}m"}},
        ),
    )
    m = Managed(p, p.containers)
    cap = limitrange.limit_range_cap(p, p.containers, m.request, ranges, p.memory_pinned)
    assert cap is not None
    limit = max(cap.value, m.request)
    t = split(m, limit // 10 * 10, cap.source, Settings())
    new = {c.name: c.target for c in t.containers}
    why = limitrange.limit_range_refusal(p, ranges, new)
    # Only the QoS guard's extra quantum (a pod whose memory is pinned) may step over a
    # ratio of exactly the request; the planner then says LimitRangeConflict, and writes nothing.
    assert why is None or (pinned and "ratio" in why), why


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


def test_restore_gives_back_the_recorded_limit_or_says_why_not():
    had = pod_from_dict(
        pod(
            containers=[container(cpu="500m", limit="4")],
            annotations={"kube-headroom.dev/original-cpu-limits": '{"app":"700m"}'},
        )
    )
    t, why = release.restore_target(had)
    assert t is not None and why == "" and [c.target for c in t.containers] == [700]
    none = pod_from_dict(
        pod(
            containers=[container(cpu="500m", limit="4")],
            annotations={"kube-headroom.dev/original-cpu-limits": '{"app":null}'},
        )
    )
    assert "cannot remove" in release.restore_target(none)[1]
    below = pod_from_dict(
        pod(
            containers=[container(cpu="900m", limit="4")],
            annotations={"kube-headroom.dev/original-cpu-limits": '{"app":"700m"}'},
        )
    )
    assert "below its request" in release.restore_target(below)[1]
    missing = pod_from_dict(pod(containers=[container(cpu="500m", limit="4")]))
    assert "no record" in release.restore_target(missing)[1]
    assert orjson.loads(release.record(had)) == {"app": "4"}


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.text(max_size=40), st.sampled_from(['{"app":"1e999"}', '{"app":[1]}', "[]", '{"app":"-5"}', "null"]))
)
def test_a_tampered_record_is_never_trusted_and_never_raises(value):
    p = pod_from_dict(
        pod(containers=[container(cpu="500m", limit="4")], annotations={"kube-headroom.dev/original-cpu-limits": value})
    )
    t, _ = release.restore_target(p)
    assert t is None or all(c.target >= c.request for c in t.containers)


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


def test_a_pod_level_restore_never_makes_the_pod_guaranteed():
    """Pod-level memory pinned and a recorded pod-level CPU limit equal to the request:
    giving it back would turn the pod Guaranteed, which a resize may not do."""
    pinned = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    p = pod_from_dict(
        pod(
            containers=[container(cpu=None, mem=None, mem_limit=None)],
            pod_resources=pinned,
            annotations={"kube-headroom.dev/original-cpu-limits": '{"(pod)":"500m"}'},
        )
    )
    t, why = release.restore_target(p)
    assert t is None and "QoS" in why
    # with memory not pinned the same record is restored
    loose = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2"}}
    q = pod_from_dict(
        pod(
            containers=[container(cpu=None, mem=None, mem_limit=None)],
            pod_resources=loose,
            annotations={"kube-headroom.dev/original-cpu-limits": '{"(pod)":"500m"}'},
        )
    )
    t, _ = release.restore_target(q)
    assert t is not None and t.target == 500
