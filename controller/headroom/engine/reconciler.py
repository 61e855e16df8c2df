"""Reconcile one node: cache snapshot → eligibility and policy → writes → outcomes.

One pass, with its edges decided here: resizes in write order under the node budget,
in-flight writes, backoffs, dry runs, quota, releases and restores. What the pass hands on
has a module each: the pod status annotation (annotations.py), the resend of resizes the
kubelet never applied (unapplied.py), and the node's event per wave of resizes (waves.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..cluster.cache import ClusterCache, NodeView
from ..cluster.config import ConfigState
from ..cluster.writer import (
    APPLIED,
    CONFLICT,
    GONE,
    INFEASIBLE,
    THROTTLED,
    Outcome,
    WriteBlocked,
    Writer,
)
from ..core import eligibility as elig
from ..core import release
from ..core.neighbours import Neighbours
from ..core.params import Settings
from ..core.planner import NodePlan, PodPlan, fit_quota, limit_range_refusal_of, plan_node
from ..core.policy import PodTarget, write_order, writes_now
from ..core.quantity import format_milli
from ..core.quota import QuotaBudget
from ..core.records import Node, Pod, refusal_cause, refusal_text
from .annotations import Annotations, annotation_due, shown
from .backoff import PodBackoff
from .foreign import ForeignWriters
from .queue import NodeBusy
from .unapplied import UNAPPLIED, Unapplied
from .waves import Waves, change

log = logging.getLogger("headroom.reconcile")


WOULD_APPLY = "would-apply"  # a dry run applies nothing: it counts what it would have written
CONFLICT_DELAY = 1.0  # a 409: the cache is behind; give the watch a moment to catch up
CONFLICT_RETRIES = 2  # a 409 from a status-only change: the same resize again, on the new version
BLOCKED_DELAY = 1.0  # the view is incomplete: look again shortly


@dataclass(slots=True)
class Result:
    requeue_after: float | None = None  # None: done; else try the node again after this
    hold: bool = False  # requeue_after is a floor no other event may shorten (Retry-After, 409)
    writes: int = 0
    resizes: int = 0  # resizes the server accepted
    failed: bool = False  # a server error: the node is retried with exponential backoff
    blocked: str | None = None  # nothing was written because of this
    partial: bool = False  # the node's budget ran out: resizes still wait (requeue_after)

    def retry_at(self, after: float, hold: bool = False) -> None:
        """Ask for another pass after `after` seconds (the earliest of several asks wins,
        but a hold wins over any shorter plain ask)."""
        if self.requeue_after is None or (hold and not self.hold) or (hold == self.hold and after < self.requeue_after):
            self.requeue_after, self.hold = after, hold


class _Failed(Exception):
    """A write before the resize was refused: the resize is not sent."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.result)
        self.outcome = outcome


@dataclass(slots=True)
class _Steps:
    """A node's pass: its plan and the resizes it decided, in write order."""

    plan: NodePlan
    steps: list[PodPlan]
    neighbours: Neighbours


def _no_pod_level(node: Node) -> bool:
    return False


@dataclass(slots=True)
class Hooks:
    """What the reconciler asks of the controller it runs in, and tells it."""

    pod_level_resize: Callable[[Node], bool] = _no_pod_level  # may this node's pods get a pod-level limit?
    on_outcome: Callable[[str, bool], None] = lambda result, dry_run: None  # a write's result: metrics
    on_plan: Callable[[NodePlan], None] = lambda plan: None  # every computed node: metrics, status
    on_annotation_failed: Callable[[str, Outcome], None] = lambda node, outcome: None  # retry the node
    on_refused: Callable[[str], None] = lambda cause: None  # a node refused a resize: its cause (metrics)


class Reconciler:
    """One pass over a node: decide every pod's target, write the resizes now (the node's
    budget permitting: otherwise the pass stops and the node's next turn decides again),
    and queue the node in the low-priority lane, whose status annotations are decided when
    they are sent.

    What is kept between passes is per node or per write in flight, never per pod of the
    cluster: a pass cut short keeps no plan (the next turn recomputes the node, ~0.2 ms for
    30 pods), and the lane holds one item per node, not one annotation per pod. A resize
    the API server accepted whose change the watch has not brought yet is remembered by
    the resourceVersion it was sent on (`_in_flight`) until the watch moves past it, so a
    recompute in between does not send it twice.
    """

    def __init__(
        self,
        cache: ClusterCache,
        config: ConfigState,
        writer: Writer,
        backoff: PodBackoff,
        hooks: Hooks | None = None,
        annotate: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.config = config
        self.writer = writer
        self.backoff = backoff
        self.hooks = hooks or Hooks()
        self._clock = clock
        self._refused_seen: dict[str, int] = {}  # pod key -> refused generation already backed off
        self._warned: dict[str, str] = {}  # pod key -> warning already emitted
        self._unfinished: set[str] = set()  # nodes whose last pass ran out of node budget
        self._in_flight: dict[str, str] = {}  # pod key -> resourceVersion a written resize was sent on
        self.waves = Waves(writer, clock)  # resizes not yet told in a node event
        self._changed_at: dict[str, float] = {}  # node -> first input change since its last plan
        self.unapplied = Unapplied(writer, self._first_warning, clock)
        self.foreign = ForeignWriters(
            lambda pod, kind, reason, message: self.writer.event(pod, kind, reason, message, action="Compute"),
            self._first_warning,
            clock,
        )
        self.annotations = Annotations(
            cache,
            config,
            writer,
            lambda view, settings: self._plan_view(view, settings, self.backoff.active()),
            self._in_flight,
            lambda node, outcome: self.hooks.on_annotation_failed(node, outcome),
            enabled=annotate,  # False: no kube-headroom.dev/status at all (very large clusters)
        )
        # What the namespaces' limits.cpu quotas still admit.
        self.quota = QuotaBudget(cache.namespace_limits, cache.pod)

    def forget(self, pod_key: str) -> None:
        """A deleted pod: drop what was remembered about it."""
        self._refused_seen.pop(pod_key, None)
        self._warned.pop(pod_key, None)
        self.unapplied.forget(pod_key)
        self._in_flight.pop(pod_key, None)
        self.foreign.forget(pod_key)

    def _first_warning(self, pod_key: str, why: str) -> bool:
        """Whether `why` is new for this pod (then it is remembered): each warning once."""
        if self._warned.get(pod_key) == why:
            return False
        self._warned[pod_key] = why
        return True

    def resizes_waiting(self) -> bool:
        """Some node's decided resizes wait for its write budget (a wave is on)."""
        return bool(self._unfinished)

    def changed(self, node: str) -> None:
        """An input of `node` changed (called from the watch threads)."""
        self._changed_at.setdefault(node, self._clock())

    def node_gone(self, node: str) -> None:
        self._unfinished.discard(node)
        self._changed_at.pop(node, None)
        self.waves.forget(node)

    def reset(self) -> None:
        """A new term as leader: nothing kept from an earlier one is written."""
        self._unfinished.clear()
        self._in_flight.clear()
        self.waves.clear()

    def _settle(self, node: str) -> None:
        """The node's wave event goes out once nothing more is due on it: no resizes
        waiting, no change since the last plan."""
        self.waves.settle(node, node not in self._unfinished and node not in self._changed_at)

    def reconcile(self, node_name: str) -> Result:
        view = self.cache.view(node_name)
        if view is None:
            self.node_gone(node_name)
            return Result()
        why = self.writer.blocked()
        if why is not None:  # a partial view: decide nothing, look again once it is whole
            result = Result(blocked=why)
            result.retry_at(BLOCKED_DELAY, hold=True)
            return result
        settings = self.config.resolver.settings_for(view.node.labels)
        self.backoff.period = self.config.base.backoff_seconds
        result = Result(blocked=settings.blocked)
        self._unfinished.discard(node_name)
        self._changed_at.pop(node_name, None)  # this plan sees every change so far
        todo = self._plan(view, settings, result)
        if todo is None:
            self._settle(node_name)
            return result
        try:
            self._resize(node_name, todo, result)
        except WriteBlocked as exc:
            result.blocked = str(exc)
            result.retry_at(BLOCKED_DELAY, hold=True)
        changed = self._changed_at.get(node_name)
        if changed is not None:  # a change arrived while this plan was being written
            result.retry_at(max(0.0, changed + self.config.base.debounce_seconds - self._clock()))
        self._settle(node_name)
        return result

    def _plan_view(self, view: NodeView, settings: Settings, backing_off: frozenset[str]) -> NodePlan:
        """Eligibility and policy for the node as the cache has it: the one planning call of
        a pass and of the lane's annotations."""
        return plan_node(
            view.node,
            view.pods,
            view.namespaces,
            settings,
            pod_level_resize=self.hooks.pod_level_resize(view.node),
            backing_off=backing_off,
            neighbours=view.neighbours,
            left_to=self.foreign.left_among(view.pods),
        )

    def _plan(self, view: NodeView, settings: Settings, result: Result) -> _Steps | None:
        """Decide the node; queue its warnings, and the node in the lane when a pod that
        needs no resize needs its annotation; the resizes to write (None: none)."""
        node, pods, neighbours = view.node, view.pods, view.neighbours
        in_flight = self._in_flight
        refused: list[Pod] = []  # refused by their node in this pass: their annotations say why
        for pod in pods:
            if pod.unapplied is None:
                self.unapplied.agreed(pod.key)
            if in_flight:
                sent_on = in_flight.get(key := pod.key)
                if sent_on is not None and sent_on != pod.resource_version:
                    del in_flight[key]  # the watch brought our resize (or a later change)
            if pod.resize_infeasible and self._refused_seen.get(pod.key) != pod.resize_refused_generation:
                # One backoff per refused generation, not per status update of the pod.
                self._refused_seen[pod.key] = pod.resize_refused_generation
                if self.backoff.add(pod.key) and settings.blocked is None:
                    refused.append(pod)
                    self.hooks.on_outcome(INFEASIBLE, settings.dry_run)
                    self.hooks.on_refused(refusal_cause(pod.resize_refusal))
                    self.writer.event(
                        pod,
                        "Warning",
                        "CPULimitAdjustSkipped",
                        f"{refusal_text(pod.resize_refusal)}; leaving the pod alone for {settings.backoff_seconds:.0f}s",
                    )
        backing_off = self._come_back_together(pods, self.backoff.active())
        self.foreign.review(pods, settings)
        plan = self._plan_view(view, settings, backing_off)
        if settings.blocked is None and self.foreign.step_back(plan, settings.backoff_seconds, in_flight):
            plan = self._plan_view(view, settings, backing_off)  # without the pods just left to their writer
        self.hooks.on_plan(plan)
        for pod in refused:
            pp = next((pp for pp in plan.pods if pp.pod.key == pod.key), None)
            if pp is not None and pp.reason == elig.BACKING_OFF:
                why = (
                    f"{refusal_text(pod.resize_refusal)}; Headroom decides it again in {settings.backoff_seconds:.0f}s"
                )
                self.annotations.queue_released(plan, pp.pod, elig.BACKING_OFF, why)
        # A backoff that expires must bring the node back by itself, not wait for an event.
        for pod in pods:
            if pod.key in backing_off:
                left = self.backoff.remaining(pod.key)
                if left is not None:
                    result.retry_at(left + 0.05)
        if settings.blocked is not None:
            return None
        steps: list[PodPlan] = []
        would: list[str] = []
        annotate = False
        for pp in plan.pods:
            if pp.warning and self._first_warning(pp.pod.key, pp.warning):
                reason = "CPULimitOwnedByOther" if pp.reason == elig.LIMIT_OWNED_BY_OTHER else "CPULimitAdjustSkipped"
                self.writer.event(pp.pod, "Warning", reason, pp.warning, action="Compute")
            if in_flight and pp.pod.key in in_flight:
                continue  # written; decided again once the watch brings it
            t = pp.target
            if t is None:
                if pp.reason in release.LEFT:
                    restore = self._release(plan, pp, neighbours)
                    if restore is not None:
                        steps.append(restore)
                continue
            if writes_now(t, settings):
                steps.append(pp)  # its annotation follows its resize
                continue
            if pp.pod.unapplied is not None and pp.reason == elig.MANAGED and not settings.dry_run:
                resend = self.unapplied.resend(pp, result.retry_at)
                if resend is not None:
                    steps.append(resend)
                    continue
            if t.apply:
                self.hooks.on_outcome(WOULD_APPLY, True)
                would.append(f"{pp.pod.key} {change(pp.pod, t)}")
            annotate = annotate or annotation_due(pp.pod, t, settings)
        if annotate:
            self.annotations.queue_node(node.name)
        if would:
            self.waves.would(plan, would)
        steps.sort(key=lambda pp: write_order(pp.target))  # type: ignore[arg-type]
        return _Steps(plan, steps, neighbours) if steps else None

    def _come_back_together(self, pods: Iterable[Pod], backing_off: frozenset[str]) -> frozenset[str]:
        """End the node's backoffs that would end within two debounce periods of this pass.

        Pods refused in one wave are seen a pass or two apart, so their backoffs end that far
        apart; planned in between, the first one back would get a share sized as if its
        neighbour were not there (it is booked but not managed while it backs off), a resize
        cut again a moment later. Ending a backoff a few seconds early brings them back in
        one plan. A backoff shorter than twice the window is left whole, so that a pass right
        after a refusal never ends the backoff it just began."""
        if not backing_off:
            return backing_off
        window = 2 * self.config.base.debounce_seconds
        if self.backoff.period <= 2 * window:
            return backing_off
        ended = []
        for pod in pods:
            if pod.key in backing_off:
                left = self.backoff.remaining(pod.key)
                if left is not None and left <= window:
                    self.backoff.forget(pod.key)
                    ended.append(pod.key)
        return backing_off.difference(ended) if ended else backing_off

    def _release(self, plan: NodePlan, pp: PodPlan, neighbours: Neighbours) -> PodPlan | None:
        """A pod Headroom no longer manages: the resize that restores its recorded limit
        (spec.release: Restore), else queue the status annotation that says it is released."""
        pod, settings = pp.pod, plan.settings
        if settings.paused:
            return None  # nothing is written on a paused pool, not even this annotation
        note = ""
        if settings.release == release.RESTORE and pp.reason in release.RESTORABLE:
            if settings.dry_run:
                note = "not restored: the pool is in dry-run"
            else:
                t, note = release.restore_target(pod)
                if t is not None:
                    why = limit_range_refusal_of(t, neighbours)
                    if why is None and plan.node.resizing and write_order(t)[1]:
                        why = "the node is being resized, and a raise waits until it is done"
                    if why is None:
                        return PodPlan(pod, pp.reason, t, pp.warning)
                    note = f"not restored: {why}"
                elif note:
                    note = f"not restored: {note}"
        managed, reason = shown(pod)
        if pod.status_annotation is not None and (managed or reason != pp.reason):
            self.annotations.queue_released(plan, pod, pp.reason, note, writer=pp.writer)
        return None

    def _resize(self, node_name: str, todo: _Steps, result: Result) -> None:
        """Write the pass's resizes in order until done, a failure that stops the node, or
        the node's budget runs out (the node's next turn decides the rest again)."""
        plan = todo.plan
        changes: list[str] = []
        backing_off = self.backoff.active()
        try:
            while todo.steps:
                pp = todo.steps[0]
                pod = self.cache.pod(pp.pod.key)
                if pod is None or pod.uid != pp.pod.uid or pod.key in backing_off or not pod.same_decision(pp.pod):
                    # Deleted, or changed since the decision: nothing to write now (a change
                    # requeued the node; a recompute decides again).
                    todo.steps.pop(0)
                    continue
                if pod.original_limits is None and pp.pod.original_limits is not None:
                    pod = pp.pod  # our record is written; the watch has not brought it yet
                assert pp.target is not None
                target = pp.target
                try:
                    pod = self._record_first(pod, pp, plan.settings)
                    fitted = fit_quota(
                        target, todo.neighbours, self.quota, plan.settings, pp.reason == elig.MANAGED, pod
                    )
                    if fitted is None:
                        # No raise worth making fits the quota now: a quota with more room
                        # requeues the namespace's nodes. Said once per pod, not per pass.
                        self._held(pod, target, todo.neighbours)
                        todo.steps.pop(0)
                        continue
                    target = fitted
                    try:
                        outcome = self.writer.resize(pod, target)
                        for _ in range(CONFLICT_RETRIES):
                            # A 409 on a pod whose inputs did not change is the kubelet writing
                            # status between our read and our write: the decision stands, so it
                            # is sent again on the new version instead of recomputing the node.
                            fresh = self._fresh(pod, pp.pod) if outcome.result == CONFLICT else None
                            if fresh is None:
                                break
                            log.info("resize conflict on a status write; sent again", extra={"pod": pod.key})
                            self.hooks.on_outcome(CONFLICT, False)
                            pod = fresh
                            outcome = self.writer.resize(pod, target)
                    except BaseException:
                        self.quota.give_back(pod)  # not sent
                        raise
                except NodeBusy as busy:
                    self._unfinished.add(node_name)
                    result.partial = True
                    result.retry_at(busy.wait)
                    return
                except _Failed as failed:
                    outcome = failed.outcome
                if outcome.result != APPLIED:
                    self.quota.give_back(pod)
                todo.steps.pop(0)
                result.writes += 1
                if outcome.result != GONE:
                    self.hooks.on_outcome(outcome.result, False)
                if outcome.result == APPLIED:
                    result.resizes += 1
                    self._in_flight[pod.key] = pod.resource_version
                    if pod.limit_writers and pp.reason == elig.MANAGED:
                        self.foreign.restored_by(pod, plan.settings, plan.settings.backoff_seconds)
                    line = change(pod, target)
                    changes.append(f"{pod.key} {line} (decided by {target.bound})")
                    log.info(
                        "cpu limit adjusted",
                        extra={
                            "pod": pod.key,
                            "node": node_name,
                            "change": line,
                            "factor": round(plan.summary.factor, 2),
                            "reason": target.bound,
                        },
                    )
                    if pp.reason == elig.MANAGED:
                        if target.bound != UNAPPLIED:  # after a resend, the target comes next
                            self.annotations.queue_node(node_name)
                    else:
                        self.annotations.queue_released(
                            plan, pod, pp.reason, "restored the limit it had before Headroom", target
                        )
                elif self._handle_failure(pod, plan, outcome, result):
                    return
        finally:
            if changes:
                self.waves.add(plan, changes)

    def _held(self, pod: Pod, target: PodTarget, neighbours: Neighbours) -> None:
        quotas = neighbours.limits_quotas(pod.namespace)
        room = self.quota.room(pod.namespace, quotas)
        source = room.source if room is not None else "the quota"
        why = f"{source} has no room for this pod's raise to {format_milli(target.target)}; it waits for room"
        if self._first_warning(pod.key, why):
            log.info(
                "raise held by quota", extra={"pod": pod.key, "quota": source, "target": format_milli(target.target)}
            )
            self.writer.event(pod, "Normal", "CPULimitRaiseHeld", why, action="Compute")

    def _record_first(self, pod: Pod, pp: PodPlan, settings: Settings) -> Pod:
        """Under spec.release: Restore, before a managed pod's first resize, the record of the
        limits it had (so they can be given back); the pod as written. No such resize
        without it: a refusal raises _Failed. Under Keep nothing would ever read a record,
        so none is taken and the resize is the pod's only write."""
        if settings.release != release.RESTORE or pp.reason != elig.MANAGED or not release.worth_recording(pod):
            return pod
        value = release.record(pod)
        outcome, version = self.writer.record_original(pod, value)
        if outcome.result != APPLIED:
            raise _Failed(outcome)
        pp.pod = replace(pod, resource_version=version, original_limits=value)
        return pp.pod

    def _retry(self, outcome: Outcome, result: Result) -> bool:
        """A transient failure: stop this pass; True (the rest of the node waits)."""
        if outcome.result == THROTTLED:  # the server is busy, not broken: wait as told
            result.retry_at(outcome.retry_after or 1.0, hold=True)
        else:
            result.failed = True
            if outcome.retry_after:
                result.retry_at(outcome.retry_after, hold=True)
        return True

    def _fresh(self, sent: Pod, decided: Pod) -> Pod | None:
        """The pod's version after the one a resize was sent on, if its inputs are those the
        decision was made on (from the watch, else read once); None otherwise."""
        cached = self.cache.pod(sent.key)
        if cached is not None and cached.resource_version != sent.resource_version:
            fresh: Pod | None = cached
        else:
            fresh = self.writer.read_pod(sent)
        if (
            fresh is None
            or fresh.uid != sent.uid
            or fresh.resource_version == sent.resource_version
            or not fresh.same_decision(decided)
        ):
            return None
        return fresh

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
