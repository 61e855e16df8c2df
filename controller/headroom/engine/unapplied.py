"""Resizes the kubelet accepted but never applied, sent again.

A pod's spec can hold the limit Headroom wrote while its kubelet reports other CPU limits
applied and no resize in progress (`Pod.unapplied`): the kubelet took the resize and then
lost it (a restart mid-resize, a runtime error it did not report). Nothing would change
until the next resize, so after a grace period the reconciler writes back what the kubelet
applied (the kernel does not change) and then its target again, as a new resize the
kubelet sees. A real kubelet applies a CPU limit and reports it within a second
(docs/platform-notes.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..cluster.writer import Writer
from ..core import release
from ..core.planner import PodPlan
from ..core.quantity import format_milli

log = logging.getLogger("headroom.reconcile")

GRACE = 10.0  # seconds spec and kubelet may disagree, with no resize in flight, before a resend
RESENDS = 3  # resends per pod before a Warning says to look at the kubelet
UNAPPLIED = "unapplied"  # the PodTarget.bound of a resize that writes back what the kubelet applied


class Unapplied:
    """Per pod: since when its spec and its kubelet disagree, and how often its resize was
    sent again. `first_warning(key, why)` is the reconciler's say-it-once memory of
    warnings (True: not said yet for this pod)."""

    def __init__(
        self,
        writer: Writer,
        first_warning: Callable[[str, str], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writer = writer
        self._first_warning = first_warning
        self._clock = clock
        self._since: dict[str, float] = {}  # pod key -> when its spec and kubelet first disagreed
        self._resent: dict[str, int] = {}  # pod key -> resizes sent again

    def forget(self, pod_key: str) -> None:
        """A deleted pod."""
        self._since.pop(pod_key, None)
        self._resent.pop(pod_key, None)

    def agreed(self, pod_key: str) -> None:
        """The kubelet reports the spec's limits applied (or a resize in progress)."""
        self._since.pop(pod_key, None)

    def resend(self, pp: PodPlan, retry_at: Callable[[float], None]) -> PodPlan | None:
        """A managed pod at its target whose kubelet reports other CPU limits applied, with
        no resize in flight: once that has lasted GRACE, the resize that writes back what
        the kubelet applied. None while waiting (`retry_at` asks for the pass that ends the
        wait), when the applied limits cannot be written back safely
        (release.container_limits_target: none, below a request, or a QoS change), or once
        RESENDS are spent (then a Warning says so, once)."""
        pod = pp.pod
        assert pod.unapplied is not None
        now = self._clock()
        since = self._since.setdefault(pod.key, now)
        if now - since < GRACE:
            retry_at(since + GRACE - now + 0.05)
            return None
        applied = {name: milli or None for name, milli in pod.unapplied}
        back, refused = release.container_limits_target(
            pod, applied, "applied limit", "the kubelet applied no CPU limit, and none can be written", UNAPPLIED
        )
        shown = ", ".join(f"{name} {format_milli(m) if m else 'none'}" for name, m in applied.items())
        if back is None or self._resent.get(pod.key, 0) >= RESENDS:
            why = (
                f"the kubelet reports CPU limits {shown} applied, not the spec's, and has no resize in "
                f"progress; they cannot be written back to make it try again: {refused}"
                if back is None
                else f"the kubelet still reports CPU limits {shown} applied, not the spec's, after "
                f"{RESENDS} resizes sent again; look at the node's kubelet"
            )
            if self._first_warning(pod.key, why):
                log.warning("resize not applied by the kubelet", extra={"pod": pod.key, "applied": shown})
                self.writer.event(pod, "Warning", "CPULimitNotApplied", why, action="Compute")
            return None
        self._resent[pod.key] = self._resent.get(pod.key, 0) + 1
        self._since.pop(pod.key, None)
        log.info(
            "resize not applied by the kubelet; sending it again",
            extra={"pod": pod.key, "applied": shown, "for_seconds": round(now - since, 1)},
        )
        return PodPlan(pod, pp.reason, back)
