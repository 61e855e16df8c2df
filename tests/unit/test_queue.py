"""The work queue (debounce, holds), the write budget's token buckets and priorities, and
backoff: pure logic with a fake clock."""

from __future__ import annotations

import threading

import pytest

from headroom.cluster.writer import (
    ADJUST,
    LOW,
    SEED,
)
from headroom.engine.backoff import PodBackoff, RetryDelay
from headroom.engine.queue import NodeBusy, NodeQueue, TokenBucket, WriteLimiter
from helpers.factories import Clock


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


def test_a_configuration_event_hands_out_no_fresh_tokens():
    """Our own status writes come back as configuration events: configure() with the same
    rates must not refill the buckets, and new rates keep the tokens already spent."""
    clock, slept = Clock(), []
    lim = WriteLimiter(per_node=10.0, global_qps=1.0, clock=clock, sleep=slept.append)
    lim.acquire("a")  # the one token the global bucket starts with
    lim.configure(per_node=10.0, global_qps=1.0)  # unchanged: a no-op
    lim.acquire("b")
    assert slept == [pytest.approx(1.0)]  # waited: no fresh token came with the event
    lim.configure(per_node=10.0, global_qps=2.0)  # a new rate: the spent bucket is not refilled
    lim.acquire("c")
    assert len(slept) == 2 and slept[1] > 0
