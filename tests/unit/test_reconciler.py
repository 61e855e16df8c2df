"""What the reconciler keeps between passes (per node, or per write in flight), how it
queues status annotations, how backoffs end, and the resend of resizes the kubelet never
applied."""

from dataclasses import replace

from headroom.cluster.cache import ClusterCache
from headroom.cluster.config import ConfigState
from headroom.cluster.writer import APPLIED, Outcome, Writer
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from headroom.engine import unapplied
from headroom.engine.backoff import PodBackoff
from headroom.engine.queue import NodeBusy
from headroom.engine.reconciler import Reconciler
from helpers.factories import container, node, pod

CONFIG = {
    "apiVersion": "kube-headroom.dev/v1alpha1",
    "kind": "HeadroomConfig",
    "metadata": {"name": "cluster", "generation": 1},
    "spec": {},
}


class RecordingWriter(Writer):
    """Writes go to lists, not to an API server; `budget` resizes per pass, then NodeBusy."""

    def __init__(self, budget: int = 1000) -> None:
        super().__init__(api=None, instance="t")  # type: ignore[arg-type]
        self.resizes: list[str] = []
        self.written: dict[str, str] = {}  # pod -> the CPU limit its last resize wrote
        self.annotations: list[str] = []
        self.budget = budget

    def resize(self, pod, target):  # type: ignore[no-untyped-def,override]
        if self.budget <= 0:
            raise NodeBusy(0.1)
        self.budget -= 1
        self.resizes.append(pod.name)
        self.written[pod.name] = f"{target.containers[0].target}m"
        return Outcome(APPLIED)

    def event(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        pass

    def node_wave(self, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        pass

    def drain_lane(self, cache: ClusterCache) -> None:
        """Send what the lane holds, one annotation per turn as its thread does; each one
        written comes back through the watch (the cache)."""
        while self.lane.depth():
            key = next(iter(self.lane._items))
            item = self.lane._items.pop(key)
            first, more = item.decide()  # type: ignore[attr-defined]
            if first is not None:
                pod, value, _ = first
                self.annotations.append(pod.name)
                cache.upsert_pod(replace(pod, status_annotation=value, resource_version=pod.resource_version + "a"))
                if more:
                    self.lane.put(key, item)


def _cluster(pods: int, limit: str = "2"):
    cache = ClusterCache()
    cache.replace_namespaces(
        [namespace_from_dict({"metadata": {"name": "team", "labels": {"kube-headroom.dev/mode": "managed"}}})]
    )
    cache.replace_nodes([node_from_dict(node(cpu="16"))])
    raws = [pod(name=f"p{i}", containers=[container(cpu="500m", limit=limit)]) for i in range(pods)]
    for i, raw in enumerate(raws):
        raw["metadata"]["resourceVersion"] = str(i + 1)
    cache.replace_pods([pod_from_dict(r) for r in raws])
    config = ConfigState()
    config.update([CONFIG], [])
    return cache, config, raws


def _echo(cache: ClusterCache, raws: list, writer: RecordingWriter, rv: int) -> None:
    """The watch brings the resized pods back with the limits written and a new version."""
    for raw in raws:
        limit = writer.written.get(raw["metadata"]["name"])
        if limit is not None:
            raw["spec"]["containers"][0]["resources"]["limits"]["cpu"] = limit
            raw["metadata"]["resourceVersion"] = str(rv)
            cache.upsert_pod(pod_from_dict(raw))


def test_a_pass_cut_short_keeps_no_plan_and_never_resends_a_resize_the_watch_has_not_brought():
    cache, config, raws = _cluster(4)
    writer = RecordingWriter(budget=1)
    rec = Reconciler(cache, config, writer, PodBackoff())
    first = rec.reconcile("n1")
    assert first.partial and writer.resizes == ["p0"] and rec.resizes_waiting()
    # The next turns decide again from the cache, which has not seen p0's resize yet:
    # p0 is in flight and is not written twice; the others follow one per turn.
    for _ in range(3):
        writer.budget = 1
        rec.reconcile("n1")
    assert writer.resizes == ["p0", "p1", "p2", "p3"]
    writer.budget = 1
    last = rec.reconcile("n1")
    assert not last.partial and writer.resizes == ["p0", "p1", "p2", "p3"] and not rec.resizes_waiting()
    # What is kept is per write in flight: gone once the watch brings each pod's new version.
    assert len(rec._in_flight) == 4
    _echo(cache, raws, writer, rv=100)
    rec.reconcile("n1")
    assert rec._in_flight == {} and writer.resizes == ["p0", "p1", "p2", "p3"]


def test_status_annotations_are_one_lane_item_per_node_decided_when_sent():
    cache, config, raws = _cluster(30)
    writer = RecordingWriter()
    rec = Reconciler(cache, config, writer, PodBackoff())
    rec.reconcile("n1")
    assert len(writer.resizes) == 30
    assert writer.lane.depth() == 1  # one item for the node, not one per pod
    writer.drain_lane(cache)
    assert writer.annotations == []  # every pod's resize is in flight: its annotation waits for it
    _echo(cache, raws, writer, rv=200)
    rec.reconcile("n1")  # the watch brought the resizes: the node is decided again
    assert writer.lane.depth() == 1
    writer.drain_lane(cache)
    assert sorted(writer.annotations) == sorted(f"p{i}" for i in range(30))


def test_backoffs_of_one_node_ending_a_pass_apart_end_together():
    """Two pods refused a pass apart come back in one plan: the first one back is not sized
    as if its still-backing-off neighbour were not there (a resize cut again moments later)."""
    cache, _, raws = _cluster(2)
    config = ConfigState()
    config.update([{**CONFIG, "spec": {"maxMultiplier": 0}}], [])  # uncapped: the share shows
    now = [1000.0]
    backoff = PodBackoff(clock=lambda: now[0])
    writer = RecordingWriter()
    rec = Reconciler(cache, config, writer, backoff, clock=lambda: now[0])
    rec.reconcile("n1")
    assert writer.written == {"p0": "8000m", "p1": "8000m"}  # 500m + half of 15 CPU each
    _echo(cache, raws, writer, rv=100)
    writer.resizes.clear()
    backoff.add("team/p0")
    now[0] += 0.6  # the neighbour's refusal is seen on the next pass
    backoff.add("team/p1")
    now[0] += 300 - 0.6 + 0.05  # p0's 300 s are over; p1's end in 0.55 s
    rec.reconcile("n1")
    # Alone, p0 would have been raised to 15500m and cut back to 8000m 0.55 s later.
    assert backoff.active() == frozenset() and writer.resizes == []
    # A backoff ending more than two debounce periods (2 s each) after a pass is kept whole.
    backoff.add("team/p1")
    now[0] += 300 - 4.5
    rec.reconcile("n1")
    assert backoff.active() == frozenset({"team/p1"})
    assert writer.resizes == ["p0"] and writer.written["p0"] == "15500m"  # p1 is booked, not managed


def test_a_resize_the_kubelet_never_applied_is_sent_again_after_the_grace_then_warned_once():
    """The spec holds the written limit, the kubelet reports another applied and no resize in
    progress: after the grace the pass writes back what the kubelet applied (the unapplied
    bound), at most RESENDS times; then one Warning, not one per pass."""
    cache, config, raws = _cluster(1)
    now = [1000.0]
    writer = RecordingWriter()
    events: list[tuple[str, str]] = []
    writer.event = lambda pod, kind, reason, note, action="": events.append((reason, note))  # type: ignore[method-assign]
    rec = Reconciler(cache, config, writer, PodBackoff(), clock=lambda: now[0])
    rec.reconcile("n1")
    _echo(cache, raws, writer, rv=100)
    assert writer.resizes == ["p0"]

    rv = [100]

    def lost() -> None:  # the kubelet reports 500m applied, not the spec's limit (a new status)
        rv[0] += 1
        cache.upsert_pod(replace(cache.pod("team/p0"), unapplied=(("app", 500),), resource_version=str(rv[0])))

    def watch_brings_it() -> None:
        rv[0] += 1
        _echo(cache, raws, writer, rv=rv[0])

    for _ in range(unapplied.RESENDS):
        lost()
        seen = rec.reconcile("n1")  # the grace begins: nothing is sent, the node comes back at its end
        assert seen.writes == 0 and seen.requeue_after is not None and 10 <= seen.requeue_after <= 10.1
        now[0] += unapplied.GRACE
        rec.reconcile("n1")
        assert writer.written["p0"] == "500m"  # what the kubelet applied, written back
        watch_brings_it()
        rec.reconcile("n1")  # then the target again, a new resize the kubelet sees
        assert writer.written["p0"] == "5000m"
        watch_brings_it()
    sent = len(writer.resizes)
    assert sent == 1 + 2 * unapplied.RESENDS
    lost()
    for _ in range(3):
        rec.reconcile("n1")
        now[0] += unapplied.GRACE
    assert len(writer.resizes) == sent  # the resends are spent
    assert [reason for reason, _ in events] == ["CPULimitNotApplied"], events
    assert "look at the node's kubelet" in events[0][1]
    rec.forget("team/p0")
    assert rec.unapplied._resent == {} and rec.unapplied._since == {}
