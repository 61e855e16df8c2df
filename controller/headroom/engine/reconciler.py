"""Reconcile one node: cache snapshot → eligibility and policy → writes → outcomes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from ..cluster.cache import ClusterCache
from ..cluster.writer import APPLIED, CONFLICT, GONE, INFEASIBLE, Outcome, Writer, now_rfc3339
from ..core import keys
from ..core.params import Settings
from ..core.planner import NodePlan, PodPlan, plan_node
from ..core.policy import PodTarget, outside_deadband
from ..core.quantity import QuantityError, cpu_milli, format_milli
from ..core.records import Node, Pod
from .backoff import PodBackoff
from .config import ConfigState
from .queue import WriteLimiter

log = logging.getLogger("headroom.reconcile")


@dataclass(slots=True)
class Result:
    requeue_after: float | None = None  # None: done; else try the node again after this
    writes: int = 0
    resizes: int = 0  # resizes the server accepted

    failed: bool = False


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
        limiter: WriteLimiter,
        backoff: PodBackoff,
        pod_level_resize: Callable[[Node], bool],
        on_outcome: Callable[[str, bool], None] = lambda result, dry_run: None,
        on_plan: Callable[[NodePlan], None] = lambda plan: None,
    ) -> None:
        self.cache = cache
        self.config = config
        self.writer = writer
        self.limiter = limiter
        self.backoff = backoff
        self.pod_level_resize = pod_level_resize
        self.on_outcome = on_outcome  # (result, dry_run): metrics hook
        self.on_plan = on_plan  # every computed node: metrics hook
        self._infeasible_seen: dict[str, str] = {}  # pod key -> resourceVersion already backed off
        self._warned: dict[str, str] = {}  # pod key -> warning already emitted

    def forget(self, pod_key: str) -> None:
        """A deleted pod: drop what was remembered about it."""
        self._infeasible_seen.pop(pod_key, None)
        self._warned.pop(pod_key, None)

    def reconcile(self, node_name: str) -> Result:

        view = self.cache.view(node_name)
        if view is None:
            return Result()
        settings = self.config.settings_for(view.node.labels)
        self.backoff.period = self.config.base.backoff_seconds
        for pod in view.pods:
            if pod.resize_infeasible and self._infeasible_seen.get(pod.key) != pod.resource_version:
                self._infeasible_seen[pod.key] = pod.resource_version
                if self.backoff.add(pod.key):
                    self.on_outcome(INFEASIBLE, settings.dry_run)
                    self.writer.event(
                        pod,
                        "Warning",
                        "CPULimitAdjustSkipped",
                        f"the kubelet reports the resize as Infeasible; leaving the pod alone for {settings.backoff_seconds:.0f}s",
                    )
        plan = plan_node(
            view.node,
            view.pods,
            view.namespaces,
            settings,
            pod_level_resize=self.pod_level_resize(view.node),
            backing_off=self.backoff.active(),
        )
        self.on_plan(plan)
        result = Result()
        for pp in plan.pods:
            if pp.warning and self._warned.get(pp.pod.key) != pp.warning:
                self._warned[pp.pod.key] = pp.warning
                self.writer.event(pp.pod, "Warning", "CPULimitAdjustSkipped", pp.warning, action="Compute")
            if pp.target is None:
                continue
            stop = self._apply(plan, pp, pp.target, result)
            if stop:
                break
        return result

    def _apply(self, plan: NodePlan, pp: PodPlan, t: PodTarget, result: Result) -> bool:
        """Write one pod; True when the rest of the node should wait for a retry."""
        pod, settings = pp.pod, plan.settings
        wrote_resize = False
        if t.apply and not settings.dry_run:
            self.limiter.acquire(plan.node.name)
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
                    f"{_change(pod, t)} (node factor {plan.summary.factor:.2f}, slack "
                    f"{format_milli(max(plan.summary.slack, 0))}/{format_milli(plan.summary.allocatable)} cores)",
                )
            elif self._handle_failure(pod, plan, outcome, result):
                return True
        if wrote_resize or annotation_due(pod, t, settings):
            if settings.dry_run and t.apply:
                self.on_outcome(APPLIED, True)
                self.writer.event(
                    pod,
                    "Normal",
                    "CPULimitAdjusted",
                    f"dry-run, not applied: {_change(pod, t)} (node factor {plan.summary.factor:.2f})",
                )
            self.limiter.acquire(plan.node.name)
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
            elif outcome.result not in (GONE, CONFLICT):
                log.warning("status annotation not written", extra={"pod": pod.key, "error": outcome.message})
        return False

    def _handle_failure(self, pod: Pod, plan: NodePlan, outcome: Outcome, result: Result) -> bool:
        if outcome.result == GONE:
            return False
        if outcome.backs_off:
            self.backoff.add(pod.key)
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
        if outcome.result == CONFLICT:
            result.requeue_after = 0.0
            return True
        log.warning(
            "resize failed; node will be retried",
            extra={"pod": pod.key, "node": plan.node.name, "error": outcome.message},
        )
        result.failed = True
        result.requeue_after = outcome.retry_after
        return True
