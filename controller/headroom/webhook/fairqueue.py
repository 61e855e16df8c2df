"""The webhook's decision queue: decision time shared fairly between tenants, bounded in
bytes, and shedding only what could not be decided in time.

Every review through the API server comes from the API server's address, and a tenant can
multiply usernames, service accounts and namespaces; so reviews queue per *tenant* (the
namespace's tenant, see server.tenant_of; every client that is not the API server shares
one flow, DIRECT), and tenants share the workers by the *decision time they use*, not by
turns. Each flow keeps a virtual clock: the CPU seconds its decisions have taken (charged
with an estimate when one starts, corrected with the measured time when it ends). A worker
takes the next review of the waiting flow whose clock is lowest (start-time fair queuing),
and a flow that starts waiting again joins at the clock of the decision begun last, so an
idle tenant banks no credit. A tenant sending the costliest reviews the budget still decides gets the same
CPU as one sending cheap ones; its own reviews wait longer. Decisions are not preempted,
so the last free worker is kept for a flow with no decision running: a tenant flooding the
queue holds at most all workers but one, and another tenant's review starts at once.
DIRECT (every client that is not the API server, together) runs at most one decision at
a time and uses at most `direct_share` of a worker: after a decision of c CPU seconds it
starts none for c x (1 / direct_share - 1) seconds.

A review is shed ("allowed, no patch": the pod is admitted unchanged, and the controller
sets its limit once it is bound) only when it cannot be answered in time:
- at submit, when its predicted wait plus its own decision passes the API server's
  deadline for it (the `timeout` it sends). The wait is predicted from the measured decision
  times of what fair queuing serves before it: its own flow's waiting reviews, and from
  every other waiting flow as much as that (or all that flow has, if less), over the
  workers' measured throughput. An honest burst on an idle queue is decided whole;
- when the bytes waiting pass a bound: a flow's own next review past `flow_bytes` (its
  parsed reviews waiting), or, past `total_bytes` in all, the oldest review of the flow
  holding the most bytes (a flood sheds its own, not others');
- at dequeue, when the client has gone (dropped undecided) or its deadline can no longer
  be met.

Bytes are those of each review's parsed form (estimated from its body's size), counted from
submit until its job is decided or dropped.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("headroom.webhook")

SHED, EXPIRED, ABANDONED = "shed", "expired", "abandoned"
DIRECT = "\x00direct"  # the flow of every client that is not the API server (no namespace has this name)
PARSED_FACTOR = 8  # a parsed review holds up to ~7x its JSON body in Python objects (measured, see docs)
FIRST_ESTIMATE = 0.005  # seconds a decision is assumed to take before any has been measured
ANSWER_MARGIN = 0.05  # seconds kept for writing the answer and its trip back to the API server


@dataclass(slots=True)
class Job:
    """One review waiting for a decision. `finish` is called exactly once, from whichever
    thread ends the job, with (answer or None, outcome)."""

    tenant: str
    review: dict[str, Any]
    deadline: float  # time.monotonic() past which the API server no longer waits
    gone: Callable[[], bool]  # the client closed its connection
    finish: Callable[[dict[str, Any] | None, str], None]
    size: int = 0  # bytes of the body it was parsed from
    address: str = ""  # the client's, for logs
    charged: float = 0.0  # the estimate its flow was charged when its decision started
    beside: int = 0  # decisions running when it started, itself included

    @property
    def held(self) -> int:
        return self.size * PARSED_FACTOR


def allowed(review: dict[str, Any]) -> dict[str, Any]:
    """The answer that changes nothing: the pod is admitted as written."""
    request = review.get("request")
    uid = request.get("uid", "") if isinstance(request, dict) else ""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": str(uid), "allowed": True},
    }


@dataclass(slots=True)
class _Flow:
    name: str
    clock: float = 0.0  # weighted CPU seconds charged
    cost: float = FIRST_ESTIMATE  # moving average of one decision's CPU seconds
    jobs: deque[Job] = field(default_factory=deque)
    held: int = 0  # bytes of its waiting reviews
    running: int = 0
    version: int = 0  # of its entry in the ready heap: an older entry is stale

    def idle(self) -> bool:
        return not self.jobs and not self.running


class FairQueue:
    """Jobs in, decisions out on `workers` threads (see the module's docstring).
    `decide(review)` returns (answer, outcome); `said_once(key)` is True the first time a
    key is seen; `clock` is time.monotonic, and the CPU time of a decision is read with
    `cpu` on the worker's thread (time.thread_time)."""

    def __init__(
        self,
        decide: Callable[[dict[str, Any]], tuple[dict[str, Any], str]],
        *,
        workers: int = 4,
        flow_bytes: int = 32 * 1024 * 1024,
        total_bytes: int = 128 * 1024 * 1024,
        direct_bytes: int = 16 * 1024 * 1024,
        direct_share: float = 0.1,
        said_once: Callable[[str], bool] = lambda key: True,
        name: str = "webhook-decide",
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.decide, self.said_once, self.clock, self.cpu = decide, said_once, clock, cpu
        self.flow_bytes, self.total_bytes, self.direct_bytes = flow_bytes, total_bytes, direct_bytes
        self.direct_share = direct_share
        self.direct_after = 0.0  # clock() before which no direct decision starts
        self.workers = workers
        self.flows: dict[str, _Flow] = {}
        self._ready: list[tuple[float, int, int, str]] = []  # (clock, seq, version, flow): lowest clock first
        self._seq = itertools.count()
        # Where a flow that starts waiting joins: the start of the decision begun last (its
        # flow's clock then), never going back; an idle tenant banks no credit, nor sheds its debt.
        self.vtime = 0.0
        self.cost = FIRST_ESTIMATE  # moving average of any decision's CPU seconds: a new flow's estimate
        self.waiting = 0
        self.held = 0
        # Wall seconds the pool takes per CPU second of decisions: decisions share the
        # interpreter (and the event loop its CPU), so the pool's throughput is measured,
        # not assumed from `workers`.
        self.wall_per_cpu = 1.0
        self.running = 0
        self.cond = threading.Condition()
        self.stopped = False
        self.threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()

    # --- in -----------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue the job, or end it (or the oldest of the largest holder) as shed."""
        shed: list[tuple[Job, str]] = []
        with self.cond:
            flow = self.flows.get(job.tenant)
            if flow is None:
                flow = self.flows[job.tenant] = _Flow(job.tenant, clock=self.vtime, cost=self.cost)
            bound = self.direct_bytes if job.tenant == DIRECT else self.flow_bytes
            if flow.held + job.held > bound and flow.jobs:
                shed.append((job, "its tenant's reviews waiting hold too many bytes"))
            elif self.clock() + self._wait(flow) + flow.cost * self.wall_per_cpu + ANSWER_MARGIN > job.deadline:
                shed.append((job, "it could not be decided before the API server's deadline"))
            else:
                while self.held + job.held > self.total_bytes and self.waiting:
                    largest = max((f for f in self.flows.values() if f.jobs), key=lambda f: f.held)
                    if largest is flow and flow.held + job.held >= largest.held:
                        break
                    shed.append((self._pop(largest), "the reviews waiting hold too many bytes"))
                if self.held + job.held > self.total_bytes and self.waiting:
                    shed.append((job, "the reviews waiting hold too many bytes"))
                else:
                    if flow.idle():
                        flow.clock = max(flow.clock, self.vtime)
                    if not flow.jobs:
                        self._mark_ready(flow)
                    flow.jobs.append(job)
                    flow.held += job.held
                    self.held += job.held
                    self.waiting += 1
                    self.cond.notify()
            self._prune()
        for victim, why in shed:
            tenant = "direct clients" if victim.tenant == DIRECT else victim.tenant
            if self.said_once(f"shed {victim.tenant} {why}"):
                log.warning(
                    "admission review shed: the pod is admitted unchanged (the controller sets its limit once it is "
                    "bound): " + why,
                    extra={"tenant": tenant, "client": victim.address},
                )
            victim.finish(allowed(victim.review), SHED)

    def _prune(self) -> None:
        """Forget idle flows that owe nothing (lock held): a flow whose clock is past the
        virtual time keeps its debt until the others catch up."""
        if len(self.flows) > 64:
            for name in [n for n, f in self.flows.items() if f.idle() and f.clock <= self.vtime]:
                del self.flows[name]

    def _mark_ready(self, flow: _Flow) -> None:
        flow.version += 1
        heapq.heappush(self._ready, (flow.clock, next(self._seq), flow.version, flow.name))

    def _wait(self, flow: _Flow) -> float:
        """Predicted seconds before a new review of `flow` starts (lock held): its own flow's
        waiting work, and of every other waiting flow as much as that (fair queuing serves
        them side by side), over the pool."""
        own = len(flow.jobs) * flow.cost
        ahead = own
        for other in self.flows.values():
            if other is not flow and other.jobs:
                ahead += min(len(other.jobs) * other.cost, own + flow.cost)
        return ahead * self.wall_per_cpu

    def _pop(self, flow: _Flow) -> Job:
        """The oldest job of this flow (lock held)."""
        job = flow.jobs.popleft()
        flow.held -= job.held
        self.held -= job.held
        self.waiting -= 1
        return job

    def _next(self) -> Job | None:
        """The next job by fair queuing (lock held): the first review of the waiting flow
        whose clock is lowest, charged its flow's estimate now."""
        deferred = []
        job = None
        while self._ready:
            entry = heapq.heappop(self._ready)
            name = entry[3]
            flow = self.flows.get(name)
            if flow is None or not flow.jobs or entry[2] != flow.version:
                continue  # stale: the flow emptied, or was pushed again with its new clock
            if (name == DIRECT and (flow.running or self.clock() < self.direct_after)) or (
                flow.running and self.running >= self.workers - 1 > 0
            ):
                # Direct clients: one decision at a time, within their share. And the last
                # free worker is kept for a tenant with none running, so a new tenant's
                # review never waits for a costly one to end (decisions are not preempted).
                deferred.append(entry)
                continue
            job = self._pop(flow)
            self.vtime = max(self.vtime, flow.clock)
            job.charged = flow.cost
            flow.clock += job.charged
            flow.running += 1
            self.running += 1
            job.beside = self.running
            if flow.jobs:
                self._mark_ready(flow)
            break
        for entry in deferred:
            heapq.heappush(self._ready, entry)
        return job

    # --- out ----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            with self.cond:
                job = None
                while not self.stopped:
                    job = self._next() if self.waiting else None
                    if job is not None:
                        break
                    direct = self.flows.get(DIRECT)
                    later = self.direct_after - self.clock() if direct is not None and direct.jobs else 0.0
                    self.cond.wait(later if later > 0 else None)  # a direct review's turn comes by time
                if self.stopped:
                    return
            assert job is not None
            self._run(job)

    def _run(self, job: Job) -> None:
        cpu_used = wall = 0.0
        try:
            flow_cost = self.flows[job.tenant].cost
            if job.gone():
                job.finish(None, ABANDONED)
            elif self.clock() + flow_cost * self.wall_per_cpu + ANSWER_MARGIN >= job.deadline:
                job.finish(allowed(job.review), EXPIRED)
            else:
                started, cpu_started = self.clock(), self.cpu()
                answer, outcome = self.decide(job.review)
                cpu_used, wall = self.cpu() - cpu_started, self.clock() - started
                job.finish(answer, outcome)
        except Exception:  # never lose a worker to one review
            log.exception("webhook decision failed; pod admitted unchanged")
            job.finish(allowed(job.review), "unchanged")
        finally:
            self._done(job, cpu_used, wall)

    def _done(self, job: Job, cpu_used: float, wall: float) -> None:
        with self.cond:
            flow = self.flows[job.tenant]
            flow.running -= 1
            beside = (job.beside + self.running) / 2  # decisions that ran side by side with it
            self.running -= 1
            if cpu_used > 0:
                flow.clock += cpu_used - job.charged
                if job.tenant == DIRECT:
                    self.direct_after = self.clock() + cpu_used * (1 / self.direct_share - 1)
                flow.cost = 0.7 * flow.cost + 0.3 * cpu_used
                self.cost = 0.9 * self.cost + 0.1 * cpu_used
                # A decision that took `wall` seconds for `cpu_used` of CPU while `beside`
                # decisions ran: the pool did `beside` x `cpu_used` of work in `wall`.
                ratio = wall / cpu_used / max(beside, 1.0)
                self.wall_per_cpu = 0.8 * self.wall_per_cpu + 0.2 * min(max(ratio, 1.0 / self.workers), 8.0)
                if flow.jobs:
                    self._mark_ready(flow)  # its clock moved: its heap entry is stale
            self._prune()
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
