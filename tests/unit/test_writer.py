"""The writer: what an API answer means, the resize body, the low-priority lane, and the
leadership fence."""

from __future__ import annotations

import threading
import time

import pytest

from headroom.cluster.client import ApiError
from headroom.cluster.writer import (
    CONFLICT,
    ERROR,
    GONE,
    INVALID,
    QUOTA_DENIED,
    outcome_of,
    resize_body,
)
from headroom.core.records import pod_from_dict
from helpers.factories import container, pod


@pytest.mark.parametrize(
    "status,message,result",
    [
        (403, "exceeded quota: q, requested: limits.cpu=5", QUOTA_DENIED),
        (403, "node didn't have enough allocatable resources", ERROR),
        (422, "Pod QOS Class may not change", INVALID),
        (409, "the object has been modified", CONFLICT),
        (404, "not found", GONE),
        (500, "etcd timeout", ERROR),
    ],
)
def test_outcomes(status, message, result):
    out = outcome_of(ApiError(status, "x", message))
    assert out.result == result
    assert out.backs_off == (status in (403, 422))


def test_429_carries_retry_after():
    assert outcome_of(ApiError(429, "TooManyRequests", "slow down", retry_after=7)).retry_after == 7


def test_resize_body_touches_only_cpu_limits_of_computed_containers():
    from headroom.core.eligibility import computed_containers
    from headroom.core.params import Exclusions, Settings
    from headroom.core.policy import Managed, compute_node

    raw = pod(
        containers=[container("app", cpu="500m"), container("proxy", cpu="100m", limit="200m")],
        init=[container("side", cpu="100m", sidecar=True), container("init", cpu="1")],
    )
    raw["metadata"]["resourceVersion"] = "42"
    p = pod_from_dict(raw)
    s = Settings(exclusions=Exclusions(containers=frozenset({"proxy"})))
    _, (t,) = compute_node(8000, [p], [Managed(p, computed_containers(p, s))], s)
    body = resize_body(p, t)
    assert body["metadata"] == {"resourceVersion": "42"}
    # r = app 500m + side 100m (proxy excluded); capped at 10 x 600m = 6 cores, split 5 : 1
    assert body["spec"] == {
        "containers": [{"name": "app", "resources": {"limits": {"cpu": "5"}}}],
        "initContainers": [{"name": "side", "resources": {"limits": {"cpu": "1"}}}],
    }


def test_the_lane_survives_a_crashing_write_and_drops_everything_on_a_lost_lease():
    from headroom.cluster.writer import Lane, NotLeader, Writer

    sent: list[str] = []
    stop = threading.Event()

    class Item:
        def __init__(self, name: str, fail: type[BaseException] | None = None) -> None:
            self.name, self.fail = name, fail

        def due(self) -> bool:
            return True

        def send(self, writer: Writer) -> bool:
            if self.fail is not None:
                raise self.fail()
            sent.append(self.name)
            if self.name == "last":
                stop.set()
            return True

        def merge(self, older: object) -> Item:
            return self

    writer = Writer(api=None, instance="t")  # type: ignore[arg-type]  # unlimited budget, no I/O here
    lane = Lane()
    lane.put(None, Item("boom", RuntimeError))
    lane.put(None, Item("ok"))
    lane.put(("k",), Item("old"))
    lane.put(("k",), Item("new"))  # replaces the unsent one, in its place
    lane.put(None, Item("last"))
    lane.run(writer, stop)
    assert sent == ["ok", "new", "last"] and lane.crashes == 1

    sent.clear()
    stop.clear()
    lane.put(None, Item("lost", NotLeader))
    lane.put(None, Item("after"))
    t = threading.Thread(target=lane.run, args=(writer, stop))
    t.start()
    deadline = time.monotonic() + 10
    while lane.depth() and time.monotonic() < deadline:  # the lane has taken both items
        time.sleep(0.01)
    stop.set()
    t.join(5)  # whatever it was sending is sent by now
    assert sent == [] and lane.depth() == 0  # the next leader recomputes; nothing stale is sent


def test_a_new_term_starts_before_any_write_can_pass_the_leadership_fence():
    """on_started (the controller drops what it queued as a standby and queues every node)
    runs while is_leader() is still False: a worker's write in between cannot pass the
    fence and then be dropped with the standby's queue. Before, leadership showed first,
    and a takeover's first wave event could be lost (a fresh-clone CI failure)."""
    from headroom.cluster.client import ApiError
    from headroom.cluster.lease import LeaderElector

    class NoLease:
        def get(self, path: str) -> dict:
            raise ApiError(404, "NotFound", "no lease yet")

        def post(self, path: str, body: dict) -> dict:
            return body

    seen: list[bool] = []
    elector = LeaderElector(NoLease(), "ns", "lease", "me", retry_period=0.05)  # type: ignore[arg-type]

    def started() -> None:
        seen.append(elector.is_leader())
        elector._stop.set()

    elector.on_started = started
    elector.run()
    assert seen == [False] and elector.is_leader()
