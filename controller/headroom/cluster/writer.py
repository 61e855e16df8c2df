"""Every write the controller makes to a pod: the resize, the status annotation, events.

Each call returns an Outcome instead of raising, so one bad pod never stops the node's
other pods; the reconciler decides what an outcome means (backoff, requeue, retry).
"""

from __future__ import annotations

import datetime
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core import keys
from ..core.policy import PodTarget
from ..core.quantity import format_milli
from ..core.records import APP, Pod
from .api import MERGE_PATCH, STRATEGIC_PATCH, Api, ApiError, pod_path

log = logging.getLogger("headroom.writer")

APPLIED, INFEASIBLE, QUOTA_DENIED, INVALID, CONFLICT, ERROR, GONE, THROTTLED = (
    "applied",
    "infeasible",
    "quota-denied",
    "invalid",
    "conflict",
    "error",
    "gone",
    "throttled",
)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: str
    message: str = ""
    retry_after: float | None = None

    @property
    def backs_off(self) -> bool:
        """Refusals that will not change on retry: leave the pod alone for backoffPeriod."""
        return self.result in (QUOTA_DENIED, INVALID, INFEASIBLE) or self.message.startswith("forbidden:")


def outcome_of(exc: ApiError) -> Outcome:
    if exc.status == 403:
        if "exceeded quota" in exc.message:
            return Outcome(QUOTA_DENIED, exc.message)
        return Outcome(ERROR, f"forbidden: {exc.message}")  # node capacity, node features, RBAC
    if exc.status == 422:
        return Outcome(INVALID, exc.message)
    if exc.status == 409:
        return Outcome(CONFLICT, exc.message)
    if exc.status == 404:
        return Outcome(GONE, exc.message)
    if exc.status == 429:
        return Outcome(THROTTLED, exc.message, exc.retry_after or 1.0)
    return Outcome(ERROR, exc.message or exc.reason, exc.retry_after)


def resize_body(pod: Pod, target: PodTarget) -> dict[str, Any]:
    """Only the CPU limits of computed containers (or the pod-level CPU limit), with the
    resourceVersion the decision was made on, so a stale decision fails with 409."""
    meta = {"resourceVersion": pod.resource_version} if pod.resource_version else {}
    if target.pod_level:
        return {"metadata": meta, "spec": {"resources": {"limits": {"cpu": format_milli(target.target)}}}}
    kinds = {c.name: c.kind for c in pod.containers}
    spec: dict[str, list[dict[str, Any]]] = {}
    for c in target.containers:
        group = "containers" if kinds[c.name] == APP else "initContainers"
        spec.setdefault(group, []).append({"name": c.name, "resources": {"limits": {"cpu": format_milli(c.target)}}})
    return {"metadata": meta, "spec": spec}


def now_rfc3339(micro: bool = False) -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


class NotLeader(Exception):
    """A write was attempted without a live lease; nothing was sent."""


class WriteBlocked(Exception):
    """A pod write was attempted while the controller's view is incomplete (a watch is
    failing or relisting); nothing was sent. The message says which."""


class Limiter(Protocol):
    def acquire(self, node: str | None = None) -> float: ...
    def hold(self, seconds: float) -> None: ...


class _Unlimited:
    def acquire(self, node: str | None = None) -> float:
        return 0.0

    def hold(self, seconds: float) -> None:
        pass


class Writer:
    """Every write goes through here: the leadership fence, the write budget (`limiter`),
    and, for writes to pods, the view gate (`blocked` names why the view is incomplete)."""

    def __init__(
        self,
        api: Api,
        instance: str,
        may_write: Callable[[], bool] = lambda: True,
        limiter: Limiter | None = None,
        blocked: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.api = api
        self.instance = instance
        self.may_write = may_write  # leadership fence, checked before every write
        self.limiter: Limiter = limiter or _Unlimited()
        self.blocked = blocked
        self.params = {"fieldManager": keys.FIELD_MANAGER}

    def fence(self) -> None:
        if not self.may_write():
            raise NotLeader()

    def _pod_write(self, pod: Pod, send: Callable[[], object]) -> Outcome:
        self.fence()
        self.limiter.acquire(pod.node_name)
        # Checked after the wait for a token, right before sending: a watch may have failed meanwhile.
        why = self.blocked()
        if why is not None:
            raise WriteBlocked(why)
        self.fence()
        try:
            send()
        except ApiError as exc:
            outcome = outcome_of(exc)
            if outcome.result == THROTTLED and outcome.retry_after:
                self.limiter.hold(outcome.retry_after)
            return outcome
        return Outcome(APPLIED)

    def resize(self, pod: Pod, target: PodTarget) -> Outcome:
        path, body = pod_path(pod.namespace, pod.name, "resize"), resize_body(pod, target)
        return self._pod_write(pod, lambda: self.api.patch(path, body, STRATEGIC_PATCH, self.params))

    def annotate(self, pod: Pod, value: str) -> Outcome:
        """Write kube-headroom.dev/status; metadata only (RBAC: patch pods)."""
        body = {"metadata": {"annotations": {keys.STATUS_KEY: value}}}
        path = pod_path(pod.namespace, pod.name)
        return self._pod_write(pod, lambda: self.api.patch(path, body, MERGE_PATCH, self.params))

    def apply_status(self, body: dict[str, Any]) -> None:
        """Server-side apply of a custom resource's status; raises ApiError."""
        self.fence()
        self.limiter.acquire()
        self.fence()
        try:
            self.api.apply(body, keys.FIELD_MANAGER, subresource="status")
        except ApiError as exc:
            if exc.status == 429:
                self.limiter.hold(exc.retry_after or 1.0)
            raise

    def event(self, pod: Pod, kind: str, reason: str, note: str, action: str = "Resize") -> None:
        """An events.k8s.io/v1 Event on the pod."""
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
        self.object_event(ref, kind, reason, note, action)

    def object_event(self, regarding: dict[str, str], kind: str, reason: str, note: str, action: str) -> None:
        """An Event about any object (cluster-scoped ones are recorded in `default`).
        Best effort: a lost event is only logged."""
        self.fence()
        namespace = regarding.get("namespace") or "default"
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": f"{regarding['name']}.{secrets.token_hex(8)}", "namespace": namespace},
            "eventTime": now_rfc3339(micro=True),
            "reportingController": f"{keys.GROUP}/controller",
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "note": note[:1024],
            "type": kind,
            "regarding": regarding,
        }
        self.limiter.acquire()
        self.fence()
        try:
            self.api.post(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body)
        except ApiError as exc:
            if exc.status == 429:
                self.limiter.hold(exc.retry_after or 1.0)
            log.warning(
                "event not recorded",
                extra={"object": f"{regarding['kind']}/{regarding['name']}", "reason": reason, "error": str(exc)},
            )
