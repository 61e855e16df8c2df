"""A work queue of node names: debounced, de-duplicated, never two workers on one node.

Like client-go's delaying workqueue, trimmed to what node-scoped reconciling needs: a
burst of events for one node becomes one recompute `debounce` seconds (jittered) after
the first; a node being reconciled that changes again is queued once more when done;
an allocatable drop can jump the wait.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections.abc import Callable

from ..cluster.writer import LOW, SEED


class NodeQueue:
    def __init__(
        self,
        debounce: float = 2.0,
        jitter: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.debounce = debounce
        self.jitter = jitter
        self._clock = clock
        self._rng = rng
        self._due: dict[str, float] = {}  # queued node -> when it may run
        self._heap: list[tuple[float, str]] = []
        self._processing: set[str] = set()
        self._again: dict[str, float] = {}  # changed while processing -> due when done
        self._not_before: dict[str, float] = {}  # held: no run before this (Retry-After, a conflict)
        self._cond = threading.Condition()
        self._closed = False

    def _delay(self) -> float:
        return self.debounce * (1 + self.jitter * self._rng())

    def add(self, node: str, *, immediate: bool = False, after: float | None = None, hold: bool = False) -> None:
        """Queue `node`: after the debounce, `after` seconds, or at once. An earlier due
        time wins over a later one, except that `hold=True` makes `after` a floor: the node
        does not run before it, whatever else queues it (a server's Retry-After)."""
        with self._cond:
            if self._closed:
                return
            now = self._clock()
            due = now if immediate else now + (after if after is not None else self._delay())
            if hold:
                self._not_before[node] = max(due, self._not_before.get(node, due))
            floor = self._not_before.get(node)
            if floor is not None:
                if floor <= now:
                    del self._not_before[node]
                else:
                    due = max(due, floor)
            if node in self._processing:
                again = self._again.get(node)
                self._again[node] = due if again is None or hold else min(due, again)
                if floor is not None and floor > now:
                    self._again[node] = max(self._again[node], floor)
                return
            if node in self._due and self._due[node] <= due and not (floor is not None and self._due[node] < floor):
                return
            self._due[node] = due
            heapq.heappush(self._heap, (due, node))
            self._cond.notify()

    def get(self, timeout: float | None = None) -> str | None:
        """The next due node (now marked as processing), or None on timeout or shutdown."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while not self._closed:
                while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded by an earlier due time, or forgotten
                now = self._clock()
                if self._heap and self._heap[0][0] <= now:
                    _, node = heapq.heappop(self._heap)
                    del self._due[node]
                    self._processing.add(node)
                    return node
                wait = self._heap[0][0] - now if self._heap else None
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)
            return None

    def done(self, node: str) -> None:
        with self._cond:
            self._processing.discard(node)
            due = self._again.pop(node, None)
            if due is not None and not self._closed:
                floor = self._not_before.get(node)
                if floor is not None:
                    due = max(due, floor)
                self._due[node] = due
                heapq.heappush(self._heap, (due, node))
                self._cond.notify()

    def forget(self, node: str) -> None:
        """Drop a deleted node's pending work."""
        with self._cond:
            self._due.pop(node, None)
            self._again.pop(node, None)
            self._not_before.pop(node, None)

    def depth(self) -> int:
        with self._cond:
            return len(self._due)

    def idle(self) -> bool:
        with self._cond:
            return not self._due and not self._processing and not self._again

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, t: float) -> None:
        if t > self.stamp:
            self.tokens = min(self.burst, self.tokens + (t - self.stamp) * self.rate)
            self.stamp = t

    def wait(self, now: float) -> float:
        """The seconds from `now` until a token is free, taking nothing."""
        self._refill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate + max(self.stamp - now, 0.0)

    def reserve(self, now: float, start: float | None = None) -> float:
        """Take a token for a write at `start` (default now) or later; the seconds from
        `now` to wait before using it."""
        t = max(now if start is None else start, self.stamp)
        self._refill(t)
        self.tokens -= 1
        return (t - now) + (0.0 if self.tokens >= 0 else -self.tokens / self.rate)


class NodeBusy(Exception):
    """The node's write budget is spent for `wait` seconds; nothing was taken."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"node budget spent for {wait:.3f}s")
        self.wait = wait


class WriteLimiter:
    """Every write the controller makes takes a token from one global bucket (`clientQPS`);
    resizes also take one from their node's bucket.

    Both buckets hold a single token, so the configured rate is a hard bound: no 1-second
    window ever holds more than `rate` writes. A server's Retry-After holds every write.

    A resize whose node bucket is empty does not wait: `acquire` raises NodeBusy and the
    worker takes another node. Only the global budget makes a writer wait, in three
    priorities: SEED (a pod's first limit, and status writes) reserves the next token and
    sleeps until it; ADJUST (a change to a pod that has a limit) and LOW (annotations,
    events) take a token only when one is free now and nobody of a higher priority waits.
    While `resizes_waiting()` says decided resizes wait for their nodes' budgets (a wave),
    LOW runs on a bucket of its own, LOW_SHARE of the global rate, as both cap and floor:
    it needs a token of that bucket (a token free only because the resize writers were
    between round trips does not go to annotations, so at least 1 - LOW_SHARE of a wave's
    writes are resizes), and with one it does not yield to waiting changes (so annotations
    and events still move during a wave that saturates the budget), only to first limits.
    """

    BURST = 1.0
    POLL = 0.05  # longest nap of a lower-priority writer between looks at the budget
    LOW_SHARE = 0.1

    def __init__(
        self,
        per_node: float = 10.0,
        global_qps: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._nodes: dict[str, TokenBucket] = {}
        self._held_until = 0.0
        self._waiting = [0, 0, 0]  # writers waiting for a global token, per priority
        self.per_node = per_node
        self._global = TokenBucket(global_qps, self.BURST, clock())
        self._low = TokenBucket(global_qps * self.LOW_SHARE, self.BURST, clock())
        self.resizes_waiting: Callable[[], bool] = lambda: False

    def configure(self, per_node: float, global_qps: float) -> None:
        """Apply new rates; a no-op when they are unchanged, so configuration events (our own
        status writes among them) never hand out fresh tokens."""
        with self._lock:
            if per_node != self.per_node:
                self.per_node = per_node
                for bucket in self._nodes.values():
                    bucket.rate = per_node
            if global_qps != self._global.rate:
                self._global.rate = global_qps
                self._low.rate = global_qps * self.LOW_SHARE

    def hold(self, seconds: float) -> None:
        """No write for `seconds` (a 429's Retry-After: the server is overloaded)."""
        with self._lock:
            self._held_until = max(self._held_until, self._clock() + seconds)

    def _node_bucket(self, node: str, now: float, start: float) -> TokenBucket:
        bucket = self._nodes.get(node)
        if bucket is None:
            bucket = self._nodes[node] = TokenBucket(self.per_node, self.BURST, now)
        busy = bucket.wait(start) + (start - now)
        if busy > 0:
            raise NodeBusy(busy)
        return bucket

    def acquire(self, node: str | None = None, priority: int = SEED, stop: threading.Event | None = None) -> float:
        """Block until one more write is allowed; the seconds waited (-1.0: `stop` was set
        first). With `node` (a resize of a pod there), raise NodeBusy instead of waiting for
        that node's bucket."""
        if priority != SEED:
            return self._acquire_free(node, priority, stop)
        with self._lock:
            now = self._clock()
            start = max(now, self._held_until)
            bucket = self._node_bucket(node, now, start) if node is not None else None
            wait = self._global.reserve(now, start)
            if bucket is not None:
                wait = max(wait, bucket.reserve(now, start))
            if wait > 0:
                self._waiting[SEED] += 1
        if wait > 0:
            try:
                self._sleep(wait)
            finally:
                with self._lock:
                    self._waiting[SEED] -= 1
        return wait

    def _acquire_free(self, node: str | None, priority: int, stop: threading.Event | None) -> float:
        began = self._clock()
        counted = False
        try:
            while stop is None or not stop.is_set():
                with self._lock:
                    now = self._clock()
                    nap = max(self._held_until - now, 0.0)
                    if nap == 0.0:
                        bucket = self._node_bucket(node, now, now) if node is not None else None
                        nap = self._global.wait(now)
                        share = priority == LOW and self.resizes_waiting()
                        if share:
                            nap = max(nap, self._low.wait(now))
                        ahead = self._waiting[SEED] if share else any(self._waiting[:priority])
                        if nap == 0.0 and not ahead:
                            self._global.reserve(now)
                            if share:
                                self._low.reserve(now)
                            if bucket is not None:
                                bucket.reserve(now)
                            return now - began
                    if not counted:
                        self._waiting[priority] += 1
                        counted = True
                self._sleep(min(max(nap, 0.001), self.POLL))
            return -1.0
        finally:
            if counted:
                with self._lock:
                    self._waiting[priority] -= 1

    def forget(self, node: str) -> None:
        with self._lock:
            self._nodes.pop(node, None)
