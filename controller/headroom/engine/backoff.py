"""Pods left alone for a while after an Infeasible or refused resize (reason BackingOff),
and the exponential retry delay of nodes whose reconcile hit a server error."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable


class PodBackoff:
    def __init__(self, period: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.period = period
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, pod_key: str) -> bool:
        """Back the pod off; False when it already was."""
        with self._lock:
            now = self._clock()
            fresh = self._until.get(pod_key, 0.0) <= now
            self._until[pod_key] = now + self.period
            return fresh

    def active(self) -> frozenset[str]:
        with self._lock:
            now = self._clock()
            for key in [k for k, until in self._until.items() if until <= now]:
                del self._until[key]
            return frozenset(self._until)

    def remaining(self, pod_key: str) -> float | None:
        """Seconds until the pod's backoff expires; None when it is not backing off."""
        with self._lock:
            until = self._until.get(pod_key)
            left = None if until is None else until - self._clock()
            return left if left is not None and left > 0 else None

    def forget(self, pod_key: str) -> None:
        with self._lock:
            self._until.pop(pod_key, None)


class RetryDelay:
    """Per node: 0.5 s, 1 s, 2 s … capped, each with up to 20 % jitter, reset by a success."""

    def __init__(self, base: float = 0.5, cap: float = 60.0) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, node: str) -> float:
        with self._lock:
            n = self._failures.get(node, 0)
            self._failures[node] = n + 1
            return float(min(self.cap, self.base * 2 ** min(n, 32)) * (1 + 0.2 * random.random()))

    def reset(self, node: str) -> None:
        with self._lock:
            self._failures.pop(node, None)
