"""When the status annotation is rewritten, and what it says (pure parts of the reconciler)."""

import json

from factories import container, node, pod
from headroom.core.params import Settings
from headroom.core.planner import plan_node
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from headroom.engine.reconciler import annotation_due, status_annotation

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


# --- what the reconciler keeps between passes: per node, or per write in flight -----------

from dataclasses import replace  # noqa: E402

from headroom.cluster.cache import ClusterCache  # noqa: E402
from headroom.cluster.writer import APPLIED, Outcome, Writer  # noqa: E402
from headroom.engine.backoff import PodBackoff  # noqa: E402
from headroom.engine.config import ConfigState  # noqa: E402
from headroom.engine.queue import NodeBusy  # noqa: E402
from headroom.engine.reconciler import Reconciler  # noqa: E402

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
