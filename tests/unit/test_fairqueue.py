"""The webhook's decision queue (pure logic; its decisions are stand-ins that block until
released, so the order in which workers take reviews is seen exactly): fair between
requesters and between client addresses, bounded with an answer at once past the bound,
and nothing decided for a client that has gone or a review past its deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

from headroom.webhook.fairqueue import ABANDONED, EXPIRED, SHED, FairQueue, Job, requester_of
from headroom.webhook.server import api_timeout


class Gate:
    """A decision that records each review it starts and waits until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, review: dict[str, Any]) -> tuple[dict[str, Any], str]:
        with self.lock:
            self.started.append(review["request"]["uid"])
        self.release.wait(30)
        return {"response": {"uid": review["request"]["uid"], "allowed": True, "patch": "x"}}, "mutated"


class Results:
    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.done = threading.Condition()

    def job(self, uid: str, user: str = "alice", ns: str = "team", address: str = "10.0.0.1", **kw: Any) -> Job:
        review = {"request": {"uid": uid, "namespace": ns, "userInfo": {"username": user}}}

        def finish(answer: dict[str, Any] | None, outcome: str) -> None:
            with self.done:
                self.outcomes[uid] = outcome
                self.done.notify_all()

        return Job(
            address=address,
            requester=requester_of(review),
            review=review,
            deadline=kw.get("deadline", time.monotonic() + 30),
            gone=kw.get("gone", lambda: False),
            finish=finish,
        )

    def wait(self, count: int) -> None:
        with self.done:
            assert self.done.wait_for(lambda: len(self.outcomes) >= count, 30), self.outcomes


def wait_started(gate: Gate, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(gate.started) < count:
        assert time.monotonic() < deadline, gate.started
        time.sleep(0.005)


def test_requesters_are_served_in_turn_not_in_arrival_order():
    """One worker busy; 10 reviews of a flooding tenant queued before one of another tenant:
    the other tenant's review is the next one decided, not the eleventh."""
    gate, res = Gate(), Results()
    q = FairQueue(gate, workers=1)
    try:
        q.submit(res.job("busy", user="mallory"))
        wait_started(gate, 1)
        for i in range(10):
            q.submit(res.job(f"flood-{i}", user="mallory"))
        q.submit(res.job("honest", user="bob"))
        gate.release.set()
        res.wait(12)
        assert gate.started[:3] == ["busy", "flood-0", "honest"], gate.started
    finally:
        q.stop()


def test_a_pod_posting_directly_does_not_crowd_out_the_api_servers_address():
    """Reviews that claim many different users from one pod's address share that address's
    turn: the API server's address is served every other decision."""
    gate, res = Gate(), Results()
    q = FairQueue(gate, workers=1)
    try:
        q.submit(res.job("busy", address="10.9.9.9"))
        wait_started(gate, 1)
        for i in range(8):
            q.submit(res.job(f"forged-{i}", user=f"user-{i}", address="10.9.9.9"))
        q.submit(res.job("api-1", user="bob", address="10.0.0.1"))
        q.submit(res.job("api-2", user="carol", address="10.0.0.1"))
        gate.release.set()
        res.wait(11)
        order = gate.started
        assert order.index("api-1") <= 2 and order.index("api-2") <= 4, order
    finally:
        q.stop()


def test_past_the_bounds_the_answer_comes_at_once_and_a_flood_sheds_its_own():
    """A requester with `per_requester` waiting gets its next review answered at once
    (shed, allowed without a patch); with `total` waiting, the largest holder loses its
    oldest, and the newcomer from another requester is queued."""
    gate, res = Gate(), Results()
    q = FairQueue(gate, workers=1, per_requester=3, total=4)
    try:
        q.submit(res.job("busy", user="mallory"))
        wait_started(gate, 1)
        for i in range(3):
            q.submit(res.job(f"m-{i}", user="mallory"))
        q.submit(res.job("m-3", user="mallory"))  # a fourth waiting for mallory: shed
        assert res.outcomes == {"m-3": SHED}
        q.submit(res.job("b-0", user="bob"))  # total 4 reached: mallory's oldest goes
        assert res.outcomes == {"m-3": SHED}
        q.submit(res.job("b-1", user="bob"))  # 5th waiting: mallory (the largest) loses m-0
        assert res.outcomes == {"m-3": SHED, "m-0": SHED}
        gate.release.set()
        res.wait(7)
        assert {k for k, v in res.outcomes.items() if v == "mutated"} == {"busy", "m-1", "m-2", "b-0", "b-1"}
    finally:
        q.stop()


def test_nothing_is_decided_for_a_client_that_has_gone_or_past_the_api_servers_deadline():
    gate, res = Gate(), Results()
    q = FairQueue(gate, workers=1)
    try:
        q.submit(res.job("busy"))
        wait_started(gate, 1)
        q.submit(res.job("gone", user="a", gone=lambda: True))
        q.submit(res.job("late", user="b", deadline=time.monotonic() - 1))
        q.submit(res.job("fine", user="c"))
        gate.release.set()
        res.wait(4)
        assert res.outcomes == {"busy": "mutated", "gone": ABANDONED, "late": EXPIRED, "fine": "mutated"}
        assert gate.started == ["busy", "fine"]
    finally:
        q.stop()


def test_a_decision_that_raises_admits_the_pod_and_keeps_the_worker():
    res = Results()

    def broken(review: dict[str, Any]) -> tuple[dict[str, Any], str]:
        raise RuntimeError("a bug")

    q = FairQueue(broken, workers=1)
    try:
        q.submit(res.job("a"))
        q.submit(res.job("b", user="other"))
        res.wait(2)
        assert res.outcomes == {"a": "unchanged", "b": "unchanged"}
    finally:
        q.stop()


def test_the_api_servers_timeout_parameter():
    assert api_timeout("2s") == 2.0
    assert api_timeout("1m0s") == 30.0  # at most what a webhook configuration allows
    assert api_timeout("1.5s") == 1.5
    assert api_timeout("500ms") == 0.5
    for bad in (None, "", "10", "s", "2x", "-1s", "2s; drop", "9" * 40 + "s"):
        assert api_timeout(bad) == 10.0, bad
