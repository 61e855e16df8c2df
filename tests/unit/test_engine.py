"""The work queue, rate limits, backoff and cache: pure logic with a fake clock."""

from __future__ import annotations

import threading
import time

import pytest

from factories import container, namespace, node, pod
from headroom.cluster.api import ApiError
from headroom.cluster.cache import ClusterCache
from headroom.cluster.writer import (
    ADJUST,
    CONFLICT,
    ERROR,
    GONE,
    INVALID,
    LOW,
    QUOTA_DENIED,
    SEED,
    outcome_of,
    resize_body,
)
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from headroom.engine.backoff import PodBackoff, RetryDelay
from headroom.engine.queue import NodeBusy, NodeQueue, TokenBucket, WriteLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_queue_debounces_and_deduplicates():
    clock = Clock()
    q = NodeQueue(debounce=2.0, jitter=0.0, clock=clock)
    for _ in range(10):
        q.add("n1")
    assert q.depth() == 1
    assert q.get(timeout=0) is None  # not due yet
    clock.t += 2.0
    assert q.get(timeout=0) == "n1"
    assert q.get(timeout=0) is None


def test_immediate_add_jumps_the_wait_and_later_adds_never_postpone():
    clock = Clock()
    q = NodeQueue(debounce=2.0, jitter=0.0, clock=clock)
    q.add("n1")
    q.add("n1", immediate=True)
    assert q.get(timeout=0) == "n1"
    q.done("n1")
    q.add("n2", after=1.0)
    q.add("n2", after=5.0)
    clock.t += 1.0
    assert q.get(timeout=0) == "n2"


def test_a_node_changed_while_processing_runs_again_after_done():
    clock = Clock()
    q = NodeQueue(debounce=1.0, jitter=0.0, clock=clock)
    q.add("n1", immediate=True)
    assert q.get(timeout=0) == "n1"
    q.add("n1")  # while a worker holds it
    clock.t += 5
    assert q.get(timeout=0) is None  # never two workers on one node
    q.done("n1")
    assert q.get(timeout=0) == "n1"


def test_forget_drops_pending_work():
    clock = Clock()
    q = NodeQueue(debounce=0.0, jitter=0.0, clock=clock)
    q.add("gone")
    q.forget("gone")
    assert q.get(timeout=0) is None and q.idle()


def test_get_wakes_up_for_new_work():
    q = NodeQueue(debounce=0.0, jitter=0.0)
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=5)))
    t.start()
    q.add("n1")
    t.join(5)
    assert got == ["n1"]


def test_token_bucket_and_write_limiter():
    b = TokenBucket(rate=2.0, burst=2.0, now=0.0)
    assert [b.reserve(0.0), b.reserve(0.0)] == [0.0, 0.0]
    assert b.reserve(0.0) == pytest.approx(0.5)
    clock, slept = Clock(), []
    lim = WriteLimiter(per_node=10.0, global_qps=1.0, clock=clock, sleep=slept.append)
    lim.acquire("a")
    lim.acquire("b")  # the global budget of 1/s binds across nodes
    assert slept == [pytest.approx(1.0)]


def test_a_spent_node_budget_raises_instead_of_waiting_and_takes_nothing():
    clock, slept = Clock(), []
    lim = WriteLimiter(per_node=2.0, global_qps=100.0, clock=clock, sleep=slept.append)
    lim.acquire("a")
    with pytest.raises(NodeBusy) as busy:
        lim.acquire("a")
    assert busy.value.wait == pytest.approx(0.5)
    lim.acquire("b")  # another node waits one global slot, not two: the refused write took nothing
    assert slept == [pytest.approx(0.01)]
    clock.t += 0.5
    lim.acquire("a")
    lim.hold(3.0)  # a Retry-After: a resize is not made to wait for it either
    with pytest.raises(NodeBusy) as busy:
        lim.acquire("c")
    assert busy.value.wait == pytest.approx(3.0)


def test_lower_priorities_take_only_free_tokens_nobody_higher_waits_for():
    clock = Clock()
    naps: list[float] = []

    def sleep(s: float) -> None:
        naps.append(s)
        clock.t += s

    lim = WriteLimiter(per_node=100.0, global_qps=10.0, clock=clock, sleep=sleep)
    assert lim.acquire(priority=LOW) == 0.0 and naps == []  # a free token, nobody waiting
    assert lim.acquire("a", priority=ADJUST) == pytest.approx(0.1, abs=0.002)  # the next, in short naps
    assert max(naps) <= WriteLimiter.POLL
    clock.t += 1.0
    lim._waiting[SEED] = 1  # a seed resize sleeps until its reserved token
    for priority in (ADJUST, LOW):
        stop, calls = threading.Event(), []

        def stop_after_some(s: float, calls=calls, stop=stop) -> None:
            calls.append(s)
            clock.t += s
            if len(calls) == 5:
                stop.set()

        lim._sleep = stop_after_some
        assert lim.acquire(priority=priority, stop=stop) == -1.0  # never took the free token
    lim._waiting[SEED] = 0
    lim._waiting[ADJUST] = 1  # a change waits: annotations and events yield to it
    stop = threading.Event()
    lim._sleep = lambda s: (clock.__setattr__("t", clock.t + s), stop.set())
    assert lim.acquire(priority=LOW, stop=stop) == -1.0
    lim._waiting[ADJUST] = 0
    assert lim.acquire("b", priority=ADJUST) == 0.0  # and takes the token itself


def test_pod_backoff_expires_and_retry_delay_grows():
    clock = Clock()
    b = PodBackoff(period=300, clock=clock)
    assert b.add("ns/p") is True and b.add("ns/p") is False
    assert b.active() == {"ns/p"}
    clock.t += 301
    assert b.active() == frozenset()
    r = RetryDelay(base=0.5, cap=4)
    delays = [r.next("n") for _ in range(5)]
    for got, base in zip(delays, [0.5, 1.0, 2.0, 4.0, 4.0], strict=True):
        assert base <= got <= base * 1.2  # exponential, capped, with jitter
    r.reset("n")
    assert 0.5 <= r.next("n") <= 0.6


def _pod(**kw):
    return pod_from_dict(pod(**kw))


def test_cache_reports_which_nodes_a_change_affects():
    c = ClusterCache()
    assert c.upsert_node(node_from_dict(node("n1", cpu="8"))).nodes == {"n1"}
    assert c.upsert_pod(_pod(name="a", node=None)).nodes == set()  # unbound: no node to recompute
    assert c.upsert_pod(_pod(name="a", node="n1")).nodes == {"n1"}  # bound
    raw = pod(name="a", node="n1")
    raw["metadata"]["resourceVersion"] = "99"
    raw["metadata"]["annotations"] = {"kube-headroom.dev/status": "{}"}
    assert not c.upsert_pod(pod_from_dict(raw))  # only version and our own annotation changed
    assert c.upsert_pod(_pod(name="a", node="n1", containers=[container(cpu="1")])).nodes == {"n1"}
    assert c.delete_pod("team/a").nodes == {"n1"}
    assert c.view("n1").pods == ()


def test_cache_urgent_on_allocatable_drop_and_gone_on_delete():
    c = ClusterCache()
    c.upsert_node(node_from_dict(node("n1", cpu="8")))
    assert c.upsert_node(node_from_dict(node("n1", cpu="16"))).nodes == {"n1"}
    assert c.upsert_node(node_from_dict(node("n1", cpu="4"))).urgent == {"n1"}
    assert c.delete_node("n1").gone == {"n1"}
    assert c.view("n1") is None


def test_cache_relist_drops_what_vanished_and_namespace_labels_touch_their_nodes():
    c = ClusterCache()
    c.replace_nodes([node_from_dict(node("n1")), node_from_dict(node("n2"))])
    c.replace_pods([_pod(name="a", node="n1"), _pod(name="b", node="n2", namespace="other")])
    stale = c.replace_pods([_pod(name="a", node="n1")])
    assert stale.nodes == {"n2"} and c.pod("other/b") is None
    c.replace_namespaces([namespace_from_dict(namespace("team"))])
    assert c.upsert_namespace(namespace_from_dict(namespace("team", managed=False))).nodes == {"n1"}
    assert c.replace_nodes([node_from_dict(node("n1"))]).gone == {"n2"}


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


def test_healthz_fails_when_a_thread_died_or_a_watch_went_silent():
    from headroom.cluster.watch import Reflector
    from headroom.engine.controller import Controller, Options

    c = Controller(api=None, options=Options(leader_elect=False))  # type: ignore[arg-type]
    assert c.healthy() == (True, "ok")
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    c._threads["worker-0"] = dead
    assert c.healthy() == (False, "thread worker-0 has died")
    del c._threads["worker-0"]
    r = Reflector(None, "/api/v1/pods", lambda items: None, lambda k, o: None, c.stop, timeout_seconds=10)  # type: ignore[arg-type]
    c.watches.reflectors.append(r)
    r.last_contact -= 1000
    ok, why = c.healthy()
    assert not ok and why.startswith("nothing heard from the watch of /api/v1/pods")
    assert c.inputs_problem() == "the first list of /api/v1/pods has not completed"


def test_config_mode_is_mixed_when_pools_differ():
    from headroom.api.resolve import resolve
    from headroom.engine.status import NodeStat, StatusWriter

    res = resolve(
        [{"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}],
        [
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "NodePoolProfile",
                "metadata": {"name": "batch"},
                "spec": {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "dryRun": True},
            }
        ],
    )
    sw = StatusWriter(None, None, lambda kind: [], lambda: res, lambda: {})  # type: ignore[arg-type]
    sw.nodes = {"a": NodeStat(pool="batch", managed=2), "b": NodeStat(pool="", managed=1)}
    status = sw.config_status({"metadata": {"name": "cluster", "generation": 1}})
    assert status["mode"] == "Mixed"
    assert {p["name"]: p["mode"] for p in status["pools"]} == {"(default)": "Active", "batch": "DryRun"}
    # without a HeadroomConfig nothing is written anywhere: the profile says Blocked, not Active
    profiles = [
        {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "NodePoolProfile",
            "metadata": {"name": "batch", "generation": 1},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "batch"}}},
        }
    ]
    blocked = resolve([], profiles)
    sw = StatusWriter(None, None, lambda kind: [], lambda: blocked, lambda: {})  # type: ignore[arg-type]
    sw.nodes = {"a": NodeStat(pool="batch", managed=0)}
    assert sw.profile_status(profiles[0])["mode"] == "Blocked"


def test_an_unchanged_status_is_rewritten_once_a_minute_as_a_heartbeat():
    from headroom.api.resolve import resolve
    from headroom.engine.status import StatusWriter

    class FakeWriter:
        def __init__(self):
            self.bodies = []

        def fence(self):
            pass

        def apply_status(self, body):
            self.bodies.append(body)

        def object_event(self, *a, **kw):
            pass

    clock = Clock()
    res = resolve(
        [{"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}], []
    )
    obj = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "HeadroomConfig",
        "metadata": {"name": "cluster", "generation": 1},
    }
    w = FakeWriter()
    beats = []
    sw = StatusWriter(
        None,
        w,
        lambda kind: [obj] if kind == "HeadroomConfig" else [],
        lambda: res,
        lambda: {},
        clock=clock,
        on_heartbeat=lambda: beats.append(clock.t),
    )  # type: ignore[arg-type]
    assert sw.flush() == 1 and "lastHeartbeatTime" in w.bodies[-1]["status"]
    clock.t += 30
    assert sw.flush() == 0  # nothing changed, and the heartbeat is fresh
    clock.t += 31
    assert sw.flush() == 1 and len(beats) == 2  # a minute on: rewritten, heartbeat renewed


def test_a_pass_writes_first_limits_then_cuts_then_raises():
    from headroom.core.planner import PodPlan
    from headroom.core.policy import ContainerTarget, Managed, PodTarget, write_order

    def plan(name: str, current: int | None, target: int) -> PodPlan:
        pod = _pod(name=name)
        c = ContainerTarget("app", 100, current, target, True)
        t = PodTarget(Managed(pod, pod.containers), 100, target, "proportional", (c,), None, True)
        return PodPlan(pod, "Managed", t)

    steps = [plan("raise", 500, 900), plan("cut", 900, 500), plan("seed", None, 700), plan("raise2", 100, 200)]
    steps.sort(key=lambda pp: write_order(pp.target))
    assert [s.pod.name for s in steps] == ["seed", "cut", "raise", "raise2"]


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


def test_profiles_that_tie_on_a_node_both_say_so():
    """Same priority, same nodes: the name that sorts first wins; the loser's Conflict says
    it lost only by name, the winner's says whom it beat that way; validate warns before."""
    from headroom.api.resolve import resolve
    from headroom.api.validate import tie_warnings
    from headroom.engine.status import StatusWriter

    def prof(name):
        return {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "NodePoolProfile",
            "metadata": {"name": name, "generation": 1},
            "spec": {"nodeSelector": {"matchLabels": {"pool": "batch"}}},
        }

    config = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    res = resolve([config], [prof("alpha"), prof("zeta")])
    labels = {"n1": {"pool": "batch"}, "n2": {"pool": "batch"}}
    sw = StatusWriter(None, None, lambda kind: [], lambda: res, lambda: labels)  # type: ignore[arg-type]

    def conflict(name):
        return next(c for c in sw.profile_status(prof(name))["conditions"] if c["type"] == "Conflict")

    loser, winner = conflict("zeta"), conflict("alpha")
    assert loser["status"] == "True" and "'alpha' on 2 node(s) (the same priority" in loser["message"], loser
    assert winner["status"] == "False" and winner["reason"] == "WinsTie" and "'zeta' on 2 node(s)" in winner["message"]
    (warning,) = tie_warnings([("f.yaml", prof("zeta")), ("f.yaml", prof("alpha"))])
    assert "NodePoolProfile/alpha and NodePoolProfile/zeta have the same nodeSelector at priority 0" in warning
    assert tie_warnings([("f", prof("zeta")), ("f", prof("alpha"))], [{"pool": "batch"}, {"pool": "other"}])[0].count(
        "1 node(s)"
    )


def test_while_resizes_wait_annotations_get_at_most_their_share_of_the_budget():
    clock = Clock()

    def sleep(s: float) -> None:
        clock.t += s

    lim = WriteLimiter(per_node=100.0, global_qps=50.0, clock=clock, sleep=sleep)
    waiting = [True]
    lim.resizes_waiting = lambda: waiting[0]
    start = clock.t
    low = 0
    while clock.t - start < 10.0:  # only the lane asks: every token is free for it
        lim.acquire(priority=LOW)
        low += 1
    # LOW_SHARE of 50/s for 10 s (and the one token each bucket starts with)
    assert low <= 50.0 * WriteLimiter.LOW_SHARE * 10 + 2
    # ... and that share is theirs even while changes wait for every other token
    lim._waiting[ADJUST] = 1
    start, low = clock.t, 0
    while clock.t - start < 10.0:
        lim.acquire(priority=LOW)
        low += 1
    assert 50.0 * WriteLimiter.LOW_SHARE * 10 - 2 <= low <= 50.0 * WriteLimiter.LOW_SHARE * 10 + 2
    lim._waiting[ADJUST] = 0
    waiting[0] = False  # the wave is over: free tokens go to the lane at the full rate
    start, low = clock.t, 0
    while clock.t - start < 10.0:
        lim.acquire(priority=LOW)
        low += 1
    assert low >= 0.9 * 50 * 10  # the full rate (less the pollers' 1-ms naps)


def test_a_new_term_starts_before_any_write_can_pass_the_leadership_fence():
    """on_started (the controller drops what it queued as a standby and queues every node)
    runs while is_leader() is still False: a worker's write in between cannot pass the
    fence and then be dropped with the standby's queue. Before, leadership showed first,
    and a takeover's first wave event could be lost (a fresh-clone CI failure)."""
    from headroom.cluster.api import ApiError
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
