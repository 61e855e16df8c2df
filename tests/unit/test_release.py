"""Giving a pod back the limit it had before Headroom (spec.release: Restore): the record,
the restore, and a record that cannot be trusted."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from headroom.core import release
from headroom.core.records import Pod, pod_from_dict
from helpers.factories import container, pod


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


def test_a_pod_level_restore_never_makes_the_pod_guaranteed():
    """Pod-level memory pinned and a recorded pod-level CPU limit equal to the request:
    giving it back would turn the pod Guaranteed, which a resize may not do."""

    def recorded_at_request(resources: dict) -> Pod:
        return pod_from_dict(
            pod(
                containers=[container(cpu=None, mem=None, mem_limit=None)],
                pod_resources=resources,
                annotations={"kube-headroom.dev/original-cpu-limits": '{"(pod)":"500m"}'},
            )
        )

    pinned = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    t, why = release.restore_target(recorded_at_request(pinned))
    assert t is None and "QoS" in why
    # with memory not pinned the same record is restored
    loose = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2"}}
    t, _ = release.restore_target(recorded_at_request(loose))
    assert t is not None and t.target == 500
