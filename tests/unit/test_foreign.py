"""Another writer of a CPU limit (pure logic, engine/foreign.py with a fake clock and the
real planner): who counts as a writer, when Headroom steps back, and when it takes the
limit back. The same rule on the real API server: tests/integration/test_foreign_writers.py."""

from __future__ import annotations

from typing import Any

from headroom.core import eligibility as elig
from headroom.core.eligibility import limit_writers
from headroom.core.params import Exclusions, Settings
from headroom.core.planner import NodePlan, plan_node
from headroom.core.records import Namespace, Pod, node_from_dict, pod_from_dict
from headroom.engine.foreign import ForeignWriters
from headroom.metrics import Metrics
from helpers.factories import container, node, pod

TEAM = {"team": Namespace("team", {"kube-headroom.dev/mode": "managed"})}
N1 = node_from_dict(node("n1", cpu="8"))


def owned(manager: str, *names: str, subresource: str = "resize") -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": "Apply",
        "subresource": subresource,
        "fieldsV1": {
            "f:spec": {
                "f:containers": {f'k:{{"name":"{n}"}}': {"f:resources": {"f:limits": {"f:cpu": {}}}} for n in names}
            }
        },
    }


def a_pod(name: str, limit: str = "1", fields: list[dict[str, Any]] | None = None, **kw: Any) -> Pod:
    raw = pod(name, containers=[container(cpu="500m", limit=limit)], **kw)
    if fields:
        raw["metadata"]["managedFields"] = fields
    return pod_from_dict(raw)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracker() -> tuple[ForeignWriters, list[tuple[str, str, str]], Clock]:
    """The tracker, the events it says, its clock; its once-only memory is a set here (the
    reconciler's `_first_warning` in the controller)."""
    events: list[tuple[str, str, str]] = []
    said: set[tuple[str, str]] = set()

    def first(key: str, why: str) -> bool:
        fresh = (key, why) not in said
        said.add((key, why))
        return fresh

    clock = Clock()
    fw = ForeignWriters(lambda p, kind, reason, msg: events.append((p.key, kind, reason)), first, clock)
    return fw, events, clock


DEFAULTS = Settings()


def plan(fw: ForeignWriters, *pods: Pod, settings: Settings = DEFAULTS) -> NodePlan:
    return plan_node(N1, pods, TEAM, settings, pod_level_resize=False, left_to=fw.left_among(pods))


def test_writers_are_other_managers_of_a_limit_headroom_computes():
    s = Settings(exclusions=Exclusions(containers=frozenset({"istio-proxy"})))
    raw = pod(
        "p", containers=[container("app", cpu="500m", limit="1"), container("istio-proxy", cpu="100m", limit="1")]
    )
    raw["metadata"]["managedFields"] = [
        owned("headroom", "app"),
        owned("mesh-agent", "istio-proxy"),
        owned("rightsizer", "app"),
        owned("kubectl-client-side-apply", "app", subresource=""),  # the pod's creator: not a resize
        {
            "manager": "vpa-updater",
            "subresource": "resize",
            "fieldsV1": {
                "f:spec": {"f:containers": {'k:{"name":"app"}': {"f:resources": {"f:requests": {"f:cpu": {}}}}}}
            },
        },  # requests only
        {"manager": "garbage", "subresource": "resize", "fieldsV1": ["not", "an", "object"]},
    ]
    p = pod_from_dict(raw)
    assert p.resized_by_headroom
    assert limit_writers(p, s) == ("rightsizer",)


def test_a_second_change_within_the_backoff_leaves_the_pod_to_its_writer():
    fw, events, clock = tracker()
    s = Settings()
    other = a_pod("other", limit="3")
    contested = a_pod("p", limit="700m", fields=[owned("rightsizer", "app")])
    first = plan(fw, contested, other, settings=s)
    pp = {x.pod.key: x for x in first.pods}["team/p"]
    assert pp.reason == elig.MANAGED and pp.target is not None and pp.target.apply  # one change: restored
    assert not fw.step_back(first, s.backoff_seconds, {})  # nothing restored yet: no step back
    fw.restored_by(contested, s, s.backoff_seconds)
    assert events == [("team/p", "Normal", "CPULimitRestored")]

    clock.now += 20  # the writer sets 700m again (its entry owns the field again)
    again = plan(fw, contested, other, settings=s)
    assert not fw.step_back(again, s.backoff_seconds, {"team/p": "41"})  # our resize not seen yet: wait
    assert fw.step_back(again, s.backoff_seconds, {})
    replanned = {x.pod.key: x for x in plan(fw, contested, other, settings=s).pods}
    assert replanned["team/p"].reason == elig.LIMIT_OWNED_BY_OTHER and replanned["team/p"].target is None
    assert "'rightsizer'" in (replanned["team/p"].warning or "")
    assert replanned["team/other"].reason == elig.MANAGED  # the rest of the node stays managed
    # The Warning event is the plan's warning, said by the reconciler once per pod and text;
    # the metric is counted from the plan, like the status.
    assert events == [("team/p", "Normal", "CPULimitRestored")]
    metrics = Metrics()
    metrics.observe_node(plan(fw, contested, other, settings=s))
    sample = metrics.registry.get_sample_value
    assert sample("headroom_foreign_writers", {"manager": "rightsizer"}) == 1
    metrics.observe_node(plan(fw, other, settings=s))  # the pod is gone from the node
    assert sample("headroom_foreign_writers", {"manager": "rightsizer"}) is None


def test_a_change_after_the_backoff_is_restored_again_not_left():
    fw, _, clock = tracker()
    s = Settings()
    contested = a_pod("p", limit="700m", fields=[owned("kubectl-patch", "app")])
    fw.restored_by(contested, s, s.backoff_seconds)
    clock.now += s.backoff_seconds + 1
    assert not fw.step_back(plan(fw, contested, settings=s), s.backoff_seconds, {})
    assert fw.left_among([contested]) == {}


def test_the_limit_comes_back_when_the_writer_no_longer_owns_it_or_the_pod_is_reclaimed():
    fw, events, _ = tracker()
    s = Settings()
    contested = a_pod("p", limit="700m", fields=[owned("rightsizer", "app")])
    fw.restored_by(contested, s, s.backoff_seconds)
    assert fw.step_back(plan(fw, contested, settings=s), s.backoff_seconds, {})
    fw.review([contested], s)
    assert fw.left_among([contested]) == {"team/p": "rightsizer"}  # still its writer's

    gone = a_pod("p", limit="700m")  # the writer's managedFields entry was removed
    fw.review([gone], s)
    assert fw.left_among([gone]) == {}
    assert events[-1] == ("team/p", "Normal", "CPULimitTakenBack")

    fw.restored_by(contested, s, s.backoff_seconds)
    assert fw.step_back(plan(fw, contested, settings=s), s.backoff_seconds, {})
    reclaimed = a_pod(
        "p", limit="700m", fields=[owned("rightsizer", "app")], annotations={"kube-headroom.dev/reclaim-limit": "1"}
    )
    fw.review([reclaimed], s)
    pp = plan(fw, reclaimed, settings=s).pods[0]
    assert pp.reason == elig.MANAGED and pp.target is not None and pp.target.apply  # restored once more
    fw.restored_by(reclaimed, s, s.backoff_seconds)
    assert fw.step_back(plan(fw, reclaimed, settings=s), s.backoff_seconds, {})  # and left again if it writes


def test_a_pod_that_is_deleted_is_forgotten():
    fw, _, _ = tracker()
    s = Settings()
    contested = a_pod("p", limit="700m", fields=[owned("rightsizer", "app")])
    fw.restored_by(contested, s, s.backoff_seconds)
    fw.step_back(plan(fw, contested, settings=s), s.backoff_seconds, {})
    fw.forget("team/p")
    assert fw.left_among([contested]) == {} and not fw.restored


def test_a_pod_left_to_its_writer_stays_left_after_a_restart_and_in_plan():
    """What the controller decided is on the pod: its status annotation names the writer
    (and the reclaim value it was left with). A fresh controller, or `headroom plan`, with
    no memory reads it back while that writer still owns the limit; not once it is gone or
    the pod is reclaimed, nor from an annotation anyone could have garbled."""
    from headroom.engine.annotations import released_annotation

    s = Settings()
    fields = [owned("rightsizer", "app")]
    contested = a_pod("p", limit="700m", fields=fields)
    said = released_annotation(contested, elig.LIMIT_OWNED_BY_OTHER, s, "", writer="rightsizer")
    fresh, _, _ = tracker()
    on_pod = a_pod("p", limit="700m", fields=fields, annotations={"kube-headroom.dev/status": said})
    pp = plan(fresh, on_pod).pods[0]
    assert (pp.reason, pp.writer, pp.target) == (elig.LIMIT_OWNED_BY_OTHER, "rightsizer", None)
    gone = a_pod("p", limit="700m", annotations={"kube-headroom.dev/status": said})
    assert plan(fresh, gone).pods[0].reason == elig.MANAGED
    reclaimed = a_pod(
        "p",
        limit="700m",
        fields=fields,
        annotations={"kube-headroom.dev/status": said, "kube-headroom.dev/reclaim-limit": "x"},
    )
    assert plan(fresh, reclaimed).pods[0].reason == elig.MANAGED
    for garbled in (
        "{",
        "[]",
        '{"managed":false,"reason":"LimitOwnedByOther","writer":7}',
        said.replace("rightsizer", "other"),
    ):
        odd = a_pod("p", limit="700m", fields=fields, annotations={"kube-headroom.dev/status": garbled})
        assert plan(fresh, odd).pods[0].reason == elig.MANAGED, garbled
