"""LimitRange caps as the policy applies them (pure logic; the server's own answers are
checked in tests/integration/test_coexistence.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.core import limitrange
from headroom.core.params import Settings
from headroom.core.policy import Managed, split
from headroom.core.records import pod_from_dict
from helpers.factories import container, pod


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
