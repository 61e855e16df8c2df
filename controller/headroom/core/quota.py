"""ResourceQuotas on `limits.cpu`: the slim record of one, what a pod counts against them,
and `QuotaBudget`, what a namespace's quotas still admit while resizes are in flight."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .limitrange import Cap, pod_sum
from .quantity import QuantityError, cpu_milli
from .records import Pod, RecordError, namespaced_name, record_reader

QUOTA_KIND = "ResourceQuota"

# --- the record --------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Quota:
    namespace: str
    name: str
    hard: int | None  # limits.cpu in millicores; None: the quota does not limit it
    used: int | None  # None: the quota controller has not counted yet

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _quota_from_dict(obj: Mapping[str, Any]) -> Quota:
    ns, name = namespaced_name(obj)
    hard_raw = ((obj.get("spec") or {}).get("hard") or {}).get("limits.cpu")
    status = obj.get("status") or {}
    used_raw = (status.get("used") or {}).get("limits.cpu")
    try:
        hard = None if hard_raw is None else cpu_milli(hard_raw)
        used = None if used_raw is None else cpu_milli(used_raw)
    except QuantityError as exc:
        raise RecordError(f"ResourceQuota/{ns}/{name}: limits.cpu: {exc}") from None
    return Quota(ns, name, hard, used)


quota_from_dict: Callable[[Mapping[str, Any]], Quota] = record_reader(_quota_from_dict)


# --- the budget -------------------------------------------------------------------


def pod_limits_cpu(pod: Pod) -> int:
    """The pod's `limits.cpu` as a ResourceQuota counts it (0 for a pod that has ended)."""
    if pod.terminal:
        return 0
    return pod_sum(pod, "cpu_limit") or 0


class QuotaBudget:
    """What each namespace's `limits.cpu` quotas still admit:
    `hard − max(used, the namespace's pods' limits as watched) − raises not yet seen`.

    A raise is reserved before it is sent and counted until the pod watch shows the pod in
    a newer version (then the pods' limits hold it); the quota's own `used` may be behind or
    ahead of the pods, so the larger of the two counts. Shared by every node's reconcile
    (one lock); `plan` uses a fresh one, where nothing it decides is ever seen."""

    def __init__(self, limits: Callable[[str], int], pod: Callable[[str], Pod | None]) -> None:
        """`limits(namespace)`: the sum of `pod_limits_cpu` over its pods as watched."""
        self._limits, self._pod = limits, pod
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, str, int]] = {}  # pod key -> (namespace, version, delta)

    def _unseen(self, namespace: str) -> int:
        total = 0
        for key, (ns, version, delta) in list(self._pending.items()):
            if ns != namespace:
                continue
            now = self._pod(key)
            if now is None or now.resource_version != version:
                del self._pending[key]  # the watch has the pod as written (or gone)
            else:
                total += delta
        return total

    def _room(self, namespace: str, quotas: tuple[Quota, ...]) -> Cap | None:
        limited = [q for q in quotas if q.hard is not None]
        if not limited:
            return None
        counted = self._limits(namespace) + self._unseen(namespace)
        best: Cap | None = None
        for q in limited:
            assert q.hard is not None
            # Not yet counted by the quota controller: its admission refuses every change.
            left = 0 if q.used is None else q.hard - max(q.used, counted)
            if best is None or left < best.value:
                best = Cap(max(left, 0), f"ResourceQuota {q.key}")
        return best

    def room(self, namespace: str, quotas: Iterable[Quota]) -> Cap | None:
        """The tightest room left, and the quota that sets it; None when nothing limits it."""
        with self._lock:
            return self._room(namespace, tuple(quotas))

    def take(self, pod: Pod, quotas: Iterable[Quota], delta: int) -> Cap | None:
        """Reserve a raise of `pod` (as its cached version) if every quota has room: None
        when reserved, else the quota that is short. A cut is always admitted."""
        with self._lock:
            if delta > 0:
                cap = self._room(pod.namespace, tuple(quotas))
                if cap is not None and cap.value < delta:
                    return cap
                self._pending[pod.key] = (pod.namespace, pod.resource_version, delta)
            return None

    def give_back(self, pod: Pod) -> None:
        """A reserved raise that was not admitted."""
        with self._lock:
            self._pending.pop(pod.key, None)
