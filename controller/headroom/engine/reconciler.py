"""Reconcile one node: cache snapshot → eligibility and policy → writes → outcomes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from ..cluster.cache import ClusterCache
from ..cluster.writer import APPLIED, CONFLICT, GONE, INFEASIBLE, THROTTLED, Outcome, WriteBlocked, Writer, now_rfc3339
from ..core import keys
from ..core.params import Settings
from ..core.planner import NodePlan, PodPlan, plan_node
from ..core.policy import PodTarget, outside_deadband
from ..core.quantity import QuantityError, cpu_milli, format_milli
from ..core.records import Node, Pod
from .backoff import PodBackoff
from .config import ConfigState

log = logging.getLogger("headroom.reconcile")


WOULD_APPLY = "would-apply"  # a dry run applies nothing: it counts what it would have written
CONFLICT_DELAY = 1.0  # a 409: the cache is behind; give the watch a moment to catch up
BLOCKED_DELAY = 1.0  # the view is incomplete: look again shortly


@dataclass(slots=True)
class Result:
    requeue_after: float | None = None  # None: done; else try the node again after this
    hold: bool = False  # requeue_after is a floor no other event may shorten (Retry-After, 409)
    writes: int = 0
    resizes: int = 0  # resizes the server accepted
    failed: bool = False  # a server error: the node is retried with exponential backoff
    blocked: str | None = None  # nothing was written because of this

    def retry_at(self, after: float, hold: bool = False) -> None:
        """Ask for another pass after `after` seconds (the earliest of several asks wins,
        but a hold wins over any shorter plain ask)."""
        if self.requeue_after is None or (hold and not self.hold) or (hold == self.hold and after < self.requeue_after):
            self.requeue_after, self.hold = after, hold


def status_annotation(plan: NodePlan, t: PodTarget) -> str:
    s = plan.summary
    return orjson.dumps(
        {
            "factor": f"{s.factor:.2f}",
            "slack": f"{max(s.slack, 0)}m",
            "managedRequests": f"{s.managed_requests}m",
            "nodePods": sum(1 for p in plan.pods if not p.pod.terminal),
            "target": f"{t.target}m",
            "policy": keys.POLICY_NAME,
            "pool": plan.settings.pool,
            "dryRun": plan.settings.dry_run,
            "computedAt": now_rfc3339(),
        }
    ).decode()


def annotation_due(pod: Pod, t: PodTarget, settings: Settings) -> bool:
    """Write the status annotation when it is missing, its mode or pool changed, or the
    target it shows is out of deadband — not on every factor wiggle."""
    if pod.status_annotation is None:
        return True
    try:
        shown = orjson.loads(pod.status_annotation)
        shown_target = cpu_milli(shown["target"])
    except (orjson.JSONDecodeError, KeyError, TypeError, QuantityError):
        return True
    if shown.get("dryRun") != settings.dry_run or shown.get("pool") != settings.pool:
        return True
    return outside_deadband(shown_target, t.target, settings)


def _change(pod: Pod, t: PodTarget) -> str:
    if t.pod_level:
        before = format_milli(t.pod_level_current) if t.pod_level_current is not None else "none"
        return f"{before} → {format_milli(t.target)} (pod-level)"
    current = [c.current for c in t.containers]
    before = "none" if any(c is None for c in current) else format_milli(sum(c or 0 for c in current))
    return f"{before} → {format_milli(sum(c.target for c in t.containers))}"


class Reconciler:
    def __init__(
        self,
        cache: ClusterCache,
        config: ConfigState,
        writer: Writer,
        backoff: PodBackoff,
        pod_level_resize: Callable[[Node], bool],
        on_outcome: Callable[[str, bool], None] = lambda result, dry_run: None,
        on_plan: Callable[[NodePlan], None] = lambda plan: None,
    ) -> None:
        self.cache = cache
        self.config = config
        self.writer = writer
        self.backoff = backoff
        self.pod_level_resize = pod_level_resize
        self.on_outcome = on_outcome  # (result, dry_run): metrics hook
        self.on_plan = on_plan  # every computed node: metrics hook
        self._refused_seen: dict[str, int] = {}  # pod key -> refused generation already backed off
        self._warned: dict[str, str] = {}  # pod key -> warning already emitted

    def forget(self, pod_key: str) -> None:
        """A deleted pod: drop what was remembered about it."""
        self._refused_seen.pop(pod_key, None)
        self._warned.pop(pod_key, None)

    def reconcile(self, node_name: str) -> Result:
        view = self.cache.view(node_name)
        if view is None:
            return Result()
        why = self.writer.blocked()
        if why is not None:  # a partial view: decide nothing, look again once it is whole
            result = Result(blocked=why)
            result.retry_at(BLOCKED_DELAY, hold=True)
            return result
        settings = self.config.settings_for(view.node.labels)
        self.backoff.period = self.config.base.backoff_seconds
        for pod in view.pods:
            if pod.resize_infeasible and self._refused_seen.get(pod.key) != pod.resize_refused_generation:
                # One backoff per refused generation, not per status update of the pod.
                self._refused_seen[pod.key] = pod.resize_refused_generation
                if self.backoff.add(pod.key) and settings.blocked is None:
                    self.on_outcome(INFEASIBLE, settings.dry_run)
                    self.writer.event(
                        pod,
                        "Warning",
                        "CPULimitAdjustSkipped",
                        f"the kubelet refused the resize (Infeasible or Error); leaving the pod alone for {settings.backoff_seconds:.0f}s",
                    )
        backing_off = self.backoff.active()
        plan = plan_node(
            view.node,
            view.pods,
            view.namespaces,
            settings,
            pod_level_resize=self.pod_level_resize(view.node),
            backing_off=backing_off,
        )
        self.on_plan(plan)
        result = Result(blocked=settings.blocked)
        # A backoff that expires must bring the node back by itself, not wait for an event.
        for pod in view.pods:
            if pod.key in backing_off:
                left = self.backoff.remaining(pod.key)
                if left is not None:
                    result.retry_at(left + 0.05)
        if settings.blocked is not None:
            return result
        try:
            for pp in plan.pods:
                if pp.warning and self._warned.get(pp.pod.key) != pp.warning:
                    self._warned[pp.pod.key] = pp.warning
                    self.writer.event(pp.pod, "Warning", "CPULimitAdjustSkipped", pp.warning, action="Compute")
                if pp.target is None:
                    continue
                if self._apply(plan, pp, pp.target, result):
                    break
        except WriteBlocked as exc:
            result.blocked = str(exc)
            result.retry_at(BLOCKED_DELAY, hold=True)
        return result

    def _apply(self, plan: NodePlan, pp: PodPlan, t: PodTarget, result: Result) -> bool:
        """Write one pod; True when the rest of the node should wait for a retry."""
        pod, settings = pp.pod, plan.settings
        wrote_resize = False
        if t.apply and not settings.dry_run:
            outcome = self.writer.resize(pod, t)
            result.writes += 1
            if outcome.result != GONE:
                self.on_outcome(outcome.result, False)
            if outcome.result == APPLIED:
                wrote_resize = True
                result.resizes += 1

                log.info(
                    "cpu limit adjusted",
                    extra={
                        "pod": pod.key,
                        "node": plan.node.name,
                        "change": _change(pod, t),
                        "factor": round(plan.summary.factor, 2),
                        "reason": t.bound,
                    },
                )
                self.writer.event(
                    pod,
                    "Normal",
                    "CPULimitAdjusted",
                    f"{_change(pod, t)} (decided by {t.bound}; node factor {plan.summary.factor:.2f} before caps, "
                    f"slack {format_milli(max(plan.summary.slack, 0))}/{format_milli(plan.summary.allocatable)} cores)",
                )
            elif self._handle_failure(pod, plan, outcome, result):
                return True
        if wrote_resize or annotation_due(pod, t, settings):
            if settings.dry_run and t.apply:
                self.on_outcome(WOULD_APPLY, True)
                self.writer.event(
                    pod,
                    "Normal",
                    "CPULimitAdjusted",
                    f"dry-run, not applied: {_change(pod, t)} (node factor {plan.summary.factor:.2f})",
                )
            outcome = self.writer.annotate(pod, status_annotation(plan, t))
            result.writes += 1
            if outcome.result == APPLIED:
                log.info(
                    "status annotation written",
                    extra={
                        "pod": pod.key,
                        "node": plan.node.name,
                        "target": format_milli(t.target),
                        "dryRun": settings.dry_run,
                    },
                )
            elif outcome.result == CONFLICT:
                result.retry_at(CONFLICT_DELAY, hold=True)
            elif outcome.result != GONE:
                # Retried like a failed resize, so the annotation never stays wrong until a restart.
                log.warning(
                    "status annotation not written; node will be retried",
                    extra={"pod": pod.key, "result": outcome.result, "error": outcome.message},
                )
                return self._retry(outcome, result)
        return False

    def _retry(self, outcome: Outcome, result: Result) -> bool:
        """A transient failure: stop this pass; True (the rest of the node waits)."""
        if outcome.result == THROTTLED:  # the server is busy, not broken: wait as told
            result.retry_at(outcome.retry_after or 1.0, hold=True)
        else:
            result.failed = True
            if outcome.retry_after:
                result.retry_at(outcome.retry_after, hold=True)
        return True

    def _handle_failure(self, pod: Pod, plan: NodePlan, outcome: Outcome, result: Result) -> bool:
        if outcome.result == GONE:
            return False
        if outcome.backs_off:
            self.backoff.add(pod.key)
            result.retry_at(plan.settings.backoff_seconds + 0.05)  # back by itself when it expires
            log.warning(
                "resize refused; backing off",
                extra={"pod": pod.key, "node": plan.node.name, "result": outcome.result, "error": outcome.message},
            )
            self.writer.event(
                pod,
                "Warning",
                "CPULimitAdjustSkipped",
                f"resize refused ({outcome.result}): {outcome.message}; leaving the pod alone for "
                f"{plan.settings.backoff_seconds:.0f}s",
            )
            return False
        if outcome.result == CONFLICT:  # decided on a stale pod: recompute once the watch caught up
            log.info("resize conflict; node will be recomputed", extra={"pod": pod.key, "error": outcome.message})
            result.retry_at(CONFLICT_DELAY, hold=True)
            return True
        log.warning(
            "resize failed; node will be retried",
            extra={"pod": pod.key, "node": plan.node.name, "result": outcome.result, "error": outcome.message},
        )
        return self._retry(outcome, result)
