"""The webhook's decision queue: fair between requesters, bounded, and deadline-aware.

A review is decided on one of a few worker threads. Waiting reviews queue per *requester*
(who asked: the review's `userInfo.username` and namespace) inside a queue per *client
address* (the connection's peer: the API server's reviews share one, a pod that posts to
the webhook directly has its own). Workers serve the addresses in turn and, within one,
its requesters in turn, so a tenant flooding the webhook with costly reviews through the
API server delays another tenant's review by at most one of its own per turn, and a pod
posting directly cannot crowd out the API server's address.

Bounds, each answered at once with "allowed, no patch" (the pod is born without a limit;
the controller sets one once it is bound), counted and logged once per requester:
- a requester with `per_requester` reviews waiting gets its next one shed;
- with `total` waiting in all, the requester holding the most (within the address
  holding the most) loses its oldest: a flood sheds its own reviews, not others'.

Before a decision starts, the worker checks that its client still waits (the connection
is open) and that the API server's own deadline for it (the `timeout` it sends) has not
passed; otherwise the review is dropped undecided.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("headroom.webhook")

SHED, EXPIRED, ABANDONED = "shed", "expired", "abandoned"


@dataclass(slots=True)
class Job:
    """One review waiting for a decision. `finish` is called exactly once, from whichever
    thread ends the job, with (answer or None, outcome)."""

    address: str
    requester: str
    review: dict[str, Any]
    deadline: float  # time.monotonic() past which the API server no longer waits
    gone: Callable[[], bool]  # the client closed its connection
    finish: Callable[[dict[str, Any] | None, str], None]


def allowed(review: dict[str, Any]) -> dict[str, Any]:
    """The answer that changes nothing: the pod is admitted as written."""
    request = review.get("request")
    uid = request.get("uid", "") if isinstance(request, dict) else ""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": str(uid), "allowed": True},
    }


def requester_of(review: dict[str, Any]) -> str:
    """`username namespace` of the review's request: who asked, and for where."""
    request = review.get("request")
    if not isinstance(request, dict):
        return ""
    user = request.get("userInfo")
    name = user.get("username") if isinstance(user, dict) else None
    return f"{name if isinstance(name, str) else ''} {request.get('namespace') or ''}"


class _Address:
    __slots__ = ("count", "requesters")

    def __init__(self) -> None:
        self.requesters: OrderedDict[str, deque[Job]] = OrderedDict()  # served in turn
        self.count = 0


class FairQueue:
    """Jobs in, decisions out on `workers` threads (see the module's docstring).
    `decide(review)` returns (answer, outcome); `on_drop(outcome)` counts a review ended
    without a decision; `said_once(key)` is True the first time a key is seen."""

    def __init__(
        self,
        decide: Callable[[dict[str, Any]], tuple[dict[str, Any], str]],
        *,
        workers: int = 4,
        per_requester: int = 16,
        total: int = 256,
        said_once: Callable[[str], bool] = lambda key: True,
        name: str = "webhook-decide",
    ) -> None:
        self.decide, self.per_requester, self.total, self.said_once = decide, per_requester, total, said_once
        self.addresses: OrderedDict[str, _Address] = OrderedDict()  # served in turn
        self.waiting = 0
        self.cond = threading.Condition()
        self.stopped = False
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()

    # --- in -----------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue the job, or end it (or the oldest of the largest holder) as shed."""
        shed: Job | None = None
        with self.cond:
            addr = self.addresses.get(job.address)
            jobs = addr.requesters.get(job.requester) if addr is not None else None
            if jobs is not None and len(jobs) >= self.per_requester:
                shed = job
            elif self.waiting >= self.total:
                victim = self._largest()
                if victim is None or (victim[0] == job.address and victim[1] == job.requester):
                    shed = job
                else:
                    shed = self._pop(*victim)
            if shed is not job:
                if addr is None:
                    addr = self.addresses[job.address] = _Address()
                addr.requesters.setdefault(job.requester, deque()).append(job)
                addr.count += 1
                self.waiting += 1
                self.cond.notify()
        if shed is not None:
            if self.said_once(f"shed {shed.requester}"):
                log.warning(
                    "admission review shed: too many of this requester's reviews wait; the pod is admitted "
                    "unchanged (the controller sets its limit once it is bound)",
                    extra={"requester": shed.requester, "client": shed.address},
                )
            shed.finish(allowed(shed.review), SHED)

    def _largest(self) -> tuple[str, str] | None:
        if not self.addresses:
            return None
        address, addr = max(self.addresses.items(), key=lambda kv: kv[1].count)
        requester = max(addr.requesters.items(), key=lambda kv: len(kv[1]))[0]
        return address, requester

    def _pop(self, address: str, requester: str) -> Job:
        """The oldest job of this requester (lock held); the requester and its address
        leave the rotation when it empties."""
        addr = self.addresses[address]
        jobs = addr.requesters[requester]
        job = jobs.popleft()
        addr.count -= 1
        self.waiting -= 1
        if not jobs:
            del addr.requesters[requester]
            if not addr.requesters:
                del self.addresses[address]
        return job

    def _next(self) -> Job:
        """The next job in turn (lock held, something waits): the first address's first
        requester; both move to the back of their rotation."""
        address = next(iter(self.addresses))
        addr = self.addresses[address]
        requester = next(iter(addr.requesters))
        job = self._pop(address, requester)
        if requester in addr.requesters:
            addr.requesters.move_to_end(requester)
        if address in self.addresses:
            self.addresses.move_to_end(address)
        return job

    # --- out ----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.stopped:
                    self.cond.wait()
                if self.stopped:
                    return
                job = self._next()
            self._run(job)

    def _run(self, job: Job) -> None:
        try:
            if job.gone():
                job.finish(None, ABANDONED)
            elif time.monotonic() >= job.deadline:
                job.finish(allowed(job.review), EXPIRED)
            else:
                answer, outcome = self.decide(job.review)
                job.finish(answer, outcome)
        except Exception:  # never lose a worker to one review
            log.exception("webhook decision failed; pod admitted unchanged")
            job.finish(allowed(job.review), "unchanged")

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
