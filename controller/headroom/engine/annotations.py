"""The pod status annotation (kube-headroom.dev/status): what it says, when it is due, and
its writes, queued in the writer's low-priority lane and told back when they land.

A managed pod's annotation shows the node's figures and the pod's target; a released pod's
says why Headroom let it go and what limit it was left with. Annotations never hold a
resize back: they are decided when the lane sends them, from the plan the reconciler makes
of the node at that moment (`plan`, a callback, so this module needs nothing of the pass).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container

import orjson

from ..cluster.cache import ClusterCache, NodeView
from ..cluster.config import ConfigState
from ..cluster.writer import APPLIED, GONE, Outcome, Writer, now_rfc3339
from ..core import keys, release
from ..core.params import Settings
from ..core.planner import NodePlan
from ..core.policy import BOUND_TENANT_SHARE, PodTarget, outside_deadband, writes_now
from ..core.quantity import QuantityError, cpu_milli, format_milli
from ..core.records import Pod

log = logging.getLogger("headroom.reconcile")


def status_annotation(plan: NodePlan, t: PodTarget) -> str:
    """What a managed pod's annotation says: the node's figures and the pod's target."""
    s = plan.summary
    body: dict[str, object] = {
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
    pot = s.pots.get(t.managed.tenant) if s.pots is not None else None
    if pot is not None:  # tenancy changed the split: whose pot the pod's burst came from
        body["tenant"] = pot.tenant
        body["tenantPot"] = f"{int(pot.pot)}m"
        if t.bound == BOUND_TENANT_SHARE:
            body["decidedBy"] = BOUND_TENANT_SHARE
    return orjson.dumps(body).decode()


def released_annotation(
    pod: Pod, reason: str, settings: Settings, note: str, written: PodTarget | None = None, writer: str | None = None
) -> str:
    """What the annotation says of a pod Headroom no longer manages (after `written`). For
    a limit left to another writer, its field manager and the pod's reclaim annotation then
    (core/planner.left_by_annotation reads them back)."""
    limit = release.current_limit(pod, written)
    body = {
        "managed": False,
        "reason": reason,
        "release": settings.release,
        "limit": "none" if limit is None else format_milli(limit),
        "policy": keys.POLICY_NAME,
        "computedAt": now_rfc3339(),
    }
    if note:
        body["note"] = note
    if writer is not None:
        body["writer"] = writer
        if pod.reclaim is not None:
            body["reclaim"] = pod.reclaim
    return orjson.dumps(body).decode()


def shown(pod: Pod) -> tuple[bool, str | None]:
    """What the pod's annotation shows: whether it is managed by Headroom, and the reason it
    gives when it is not. No annotation: not managed; an unreadable one is ours, so it
    shows managed (and is rewritten)."""
    if pod.status_annotation is None:
        return False, None
    try:
        data = orjson.loads(str(pod.status_annotation))
    except orjson.JSONDecodeError:
        return True, None
    if not isinstance(data, dict):
        return True, None
    return data.get("managed") is not False, data.get("reason")


def annotation_due(pod: Pod, t: PodTarget, settings: Settings) -> bool:
    """Write the annotation when it is missing, its mode or pool changed, or the target it
    shows is out of deadband — not on every factor wiggle."""
    if pod.status_annotation is None:
        return True
    try:
        data = orjson.loads(pod.status_annotation)
        shown_target = cpu_milli(data["target"])
    except (orjson.JSONDecodeError, KeyError, TypeError, QuantityError):
        return True
    if data.get("dryRun") != settings.dry_run or data.get("pool") != settings.pool:
        return True
    return outside_deadband(shown_target, t.target, settings)


class Annotations:
    """Queues the annotations of one controller's passes and hears how they went.

    `plan(view, settings)` is the reconciler's planning call for the node as the cache has
    it; `in_flight` holds the pods whose resize was written and not yet seen back (their
    annotation follows the resize); `on_failed(node, outcome)` retries the node. With
    `enabled` False nothing is ever queued (very large clusters run without annotations).
    """

    def __init__(
        self,
        cache: ClusterCache,
        config: ConfigState,
        writer: Writer,
        plan: Callable[[NodeView, Settings], NodePlan],
        in_flight: Container[str],
        on_failed: Callable[[str, Outcome], None],
        enabled: bool = True,
    ) -> None:
        self.cache = cache
        self.config = config
        self.writer = writer
        self.enabled = enabled
        self._plan = plan
        self._in_flight = in_flight
        self._on_failed = on_failed

    def queue_node(self, node: str) -> None:
        """Queue the node's managed pods' annotations: decided when the lane sends them."""
        if self.enabled:
            self.writer.annotate_node(
                node,
                lambda: self.due(node),
                lambda pod, shows, outcome: self._outcome(node, pod.key, shows, outcome),
            )

    def queue_released(
        self,
        plan: NodePlan,
        pod: Pod,
        reason: str,
        note: str,
        written: PodTarget | None = None,
        writer: str | None = None,
    ) -> None:
        """Queue the annotation that says the pod is released. One lane item per pod, decided
        now (its note says why a limit was or was not restored): pods leave management a
        namespace or an exclusion at a time, not as a cluster's first wave."""
        if not self.enabled:
            return
        value = released_annotation(pod, reason, plan.settings, note, written, writer)
        node, key, uid, settings = plan.node.name, pod.key, pod.uid, plan.settings

        def still_wanted() -> bool:
            """Right before sending: the pod is still there, and its node still runs on the
            settings the annotation was decided under (a configuration that became dry-run,
            paused or unusable meanwhile gets nothing from an earlier decision)."""
            now, on = self.cache.pod(key), self.cache.nodes.get(node)
            return (
                now is not None
                and now.uid == uid
                and on is not None
                and self.config.resolver.settings_for(on.labels) == settings
            )

        def on_outcome(outcome: Outcome) -> None:
            self._outcome(node, key, f"released ({reason})", outcome)

        self.writer.annotate(pod, value, still_wanted, on_outcome)

    def due(self, node_name: str) -> tuple[tuple[Pod, str, str] | None, bool]:
        """The next annotation the node's pods need, decided afresh (the lane calls this
        right before it writes one): (pod, value, the target it shows) of the first managed
        pod that has its target (no resize waiting or in flight) and whose annotation is
        missing or out of date, and whether another one is due after it. (None, False) when
        the node is gone or its settings write nothing (invalid, paused)."""
        view = self.cache.view(node_name)
        if view is None or not self.enabled or self.writer.blocked() is not None:
            return None, False
        settings = self.config.resolver.settings_for(view.node.labels)
        if settings.blocked is not None or settings.paused:
            return None, False
        plan = self._plan(view, settings)
        first = None
        for pp in plan.pods:
            t = pp.target
            if t is None or writes_now(t, settings) or pp.pod.key in self._in_flight:
                continue
            if annotation_due(pp.pod, t, settings):
                if first is not None:
                    return first, True
                first = (pp.pod, status_annotation(plan, t), format_milli(t.target))
        return first, False

    def _outcome(self, node: str, key: str, shows: str, outcome: Outcome) -> None:
        if outcome.result == APPLIED:
            log.info("status annotation written", extra={"pod": key, "node": node, "target": shows})
        elif outcome.result != GONE:
            # Retried like a failed resize, so the annotation never stays wrong until a restart.
            log.warning(
                "status annotation not written; node will be retried",
                extra={"pod": key, "result": outcome.result, "error": outcome.message},
            )
            self._on_failed(node, outcome)
