"""Another writer of a managed pod's CPU limit: restore one change, step back from a writer
that keeps writing, and say so.

Since pods/resize is open to anyone granted it, other tools (a right-sizer, a policy engine
mutating existing pods, a node agent, a person with `kubectl patch --subresource resize`)
may write a CPU limit Headroom manages. The API server records who: the pod's
managedFields hold an entry per field manager for the resize subresource, naming the limits
it owns (records.Pod.limit_writers). The rule:

- a limit another manager wrote once is a change like any drift: Headroom writes its target
  back (its own write takes the field over) and tells the pod, once per manager, what will
  happen if it is written again;
- if that manager writes a limit of the pod again within `backoffPeriod` of the restore,
  the pod is left to it: reason LimitOwnedByOther naming the manager (a Warning event once
  per pod and manager), counted as an unmanaged pod (its requests booked, its limit not
  Headroom's), the rest of the node managed as before;
- it comes back when that manager owns none of its limits any more (its managedFields entry
  removed, or another writer took the field over), or when the pod's annotation
  `kube-headroom.dev/reclaim-limit` takes a new value: Headroom restores once again, and
  steps back again if the writer keeps writing.

What is remembered lives in this process: after a restart Headroom restores a contested
limit at most once more before stepping back again. Writers that own only limits Headroom
does not compute (an excluded container's) are not its business.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..core.eligibility import limit_writers
from ..core.params import Settings
from ..core.planner import NodePlan
from ..core.records import Pod

log = logging.getLogger("headroom.reconcile")

Event = Callable[[Pod, str, str, str], None]  # (pod, type, reason, message)


@dataclass(slots=True)
class _Left:
    manager: str
    reclaim: str | None  # the pod's reclaim annotation when it was left


@dataclass
class ForeignWriters:
    """Per pod: when Headroom last restored a limit against each other manager, and the
    pods it leaves to one. Thread-safe (node workers share it). The Warning event of a pod
    left to its writer is the plan's warning for it (the reconciler's, once per pod and
    text); `first(pod key, why)` is that same once-only memory, for the events said here."""

    event: Event
    first: Callable[[str, str], bool]
    clock: Callable[[], float]
    restored: dict[str, dict[str, float]] = field(default_factory=dict)  # pod key -> manager -> when
    left: dict[str, _Left] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def left_among(self, pods: Iterable[Pod]) -> Mapping[str, str]:
        """The node's pods left to another writer: pod key -> manager."""
        if not self.left:
            return {}
        with self._lock:
            return {p.key: self.left[p.key].manager for p in pods if p.key in self.left}

    def review(self, pods: Iterable[Pod], settings: Settings) -> None:
        """Before a node's plan: hand back the pods whose writer has gone or that were reclaimed."""
        if not self.left:
            return
        back = []
        with self._lock:
            for pod in pods:
                was = self.left.get(pod.key)
                if was is None:
                    continue
                if was.manager in limit_writers(pod, settings) and pod.reclaim == was.reclaim:
                    continue
                del self.left[pod.key]
                self.restored.pop(pod.key, None)
                back.append((pod, was))
        for pod, was in back:
            why = "reclaimed by its annotation" if pod.reclaim != was.reclaim else f"{was.manager!r} no longer owns it"
            log.info("cpu limit taken back", extra={"pod": pod.key, "manager": was.manager, "why": why})
            message = f"Headroom manages this pod's CPU limit again: {why}"
            if self.first(pod.key, message):  # also lets a later restore be said again
                self.event(pod, "Normal", "CPULimitTakenBack", message)

    def step_back(self, plan: NodePlan, backoff_seconds: float, in_flight: Mapping[str, str]) -> bool:
        """After a node's plan: leave to its writer every pod whose limit another manager
        changed again (the plan would write it) within `backoff_seconds` of Headroom's
        restore against that manager; not a pod whose resize the watch has not brought back
        yet (`in_flight`). True when one was left (plan the node again: the new plan's
        warning for the pod is its Warning event)."""
        if not self.restored:
            return False
        now = self.clock()
        new: list[tuple[Pod, str]] = []
        with self._lock:
            for pp in plan.pods:
                t, pod = pp.target, pp.pod
                if t is None or not t.apply or not pod.limit_writers or pod.key not in self.restored:
                    continue
                if pod.key in in_flight:
                    continue
                when = self.restored[pod.key]
                for manager in limit_writers(pod, plan.settings):
                    at = when.get(manager)
                    if at is not None and now - at <= backoff_seconds:
                        self.left[pod.key] = _Left(manager, pod.reclaim)
                        new.append((pod, manager))
                        break
        for pod, manager in new:
            log.warning(
                "cpu limit left to another writer",
                extra={"pod": pod.key, "manager": manager, "within_seconds": backoff_seconds},
            )
        return bool(new)

    def restored_by(self, pod: Pod, settings: Settings, backoff_seconds: float) -> None:
        """Headroom's resize of `pod` was accepted: each other manager that owned one of its
        limits has had its change undone once."""
        managers = limit_writers(pod, settings)
        if not managers:
            return
        now = self.clock()
        with self._lock:
            self.restored.setdefault(pod.key, {}).update(dict.fromkeys(managers, now))
        for manager in managers:
            log.info("cpu limit another writer set was restored", extra={"pod": pod.key, "manager": manager})
            message = (
                f"Headroom wrote back the CPU limit field manager {manager!r} had set; if {manager!r} changes it "
                f"again within {backoff_seconds:.0f}s, Headroom leaves the limit to it"
            )
            if self.first(pod.key, message):
                self.event(pod, "Normal", "CPULimitRestored", message)

    def forget(self, pod_key: str) -> None:
        with self._lock:
            self.restored.pop(pod_key, None)
            self.left.pop(pod_key, None)
