"""Every write the controller makes: the resize and the status annotation of a pod, and
events; the low-priority lane (`Lane`) that sends annotations and events with the write
budget resizes leave; and the leadership fence and view gate every write passes.

Each pod write returns an Outcome instead of raising, so one bad pod never stops the
node's other pods; the reconciler decides what an outcome means (backoff, requeue, retry).
One module because the lane, the fence and the gate guard the same writes.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core import keys
from ..core.policy import PodTarget
from ..core.quantity import format_milli
from ..core.records import APP, Node, Pod, RecordError, pod_from_dict
from .client import MERGE_PATCH, STRATEGIC_PATCH, Api, ApiError, pod_path

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


def _clip(text: str, limit: int) -> str:
    """At most `limit` bytes of UTF-8 (the API server's limit on an Event's note is in
    bytes, and "→" takes three), cut at a character boundary."""
    raw = text.encode()
    return text if len(raw) <= limit else raw[: limit - 3].decode(errors="ignore") + "..."


def is_seed(target: PodTarget) -> bool:
    """The resize gives a pod its first CPU limit (a container, or the pod level, has none)."""
    if target.pod_level:
        return target.pod_level_current is None
    return any(c.current is None for c in target.containers)


def now_rfc3339(micro: bool = False) -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


class NotLeader(Exception):
    """A write was attempted without a live lease; nothing was sent."""


class WriteBlocked(Exception):
    """A pod write was attempted while the controller's view is incomplete (a watch is
    failing or relisting); nothing was sent. The message says which."""


# Write priorities for the global budget: a pod's first limit (and status writes), a change
# to a limit, then the status annotations and events of the low-priority lane.
SEED, ADJUST, LOW = 0, 1, 2


class Limiter(Protocol):
    def acquire(self, node: str | None = None, priority: int = SEED, stop: threading.Event | None = None) -> float: ...
    def hold(self, seconds: float) -> None: ...


class _Unlimited:
    def acquire(self, node: str | None = None, priority: int = SEED, stop: threading.Event | None = None) -> float:
        return 0.0

    def hold(self, seconds: float) -> None:
        pass


class LaneItem(Protocol):
    def due(self) -> bool:
        """Whether sending it now would write anything (asked before a token is taken)."""
        ...

    def send(self, writer: Writer) -> bool:
        """Write it; False to keep it queued for another try (the server said wait)."""
        ...

    def merge(self, older: LaneItem) -> LaneItem:
        """This item queued under the same key as an unsent `older` one: what to keep."""
        ...


class Lane:
    """The low-priority writes (status annotations, events), sent one at a time by one
    thread with the global write budget resizes leave (priority LOW).

    Keyed: a node's status annotations are one item, decided when sent; a released pod's
    newer annotation replaces its unsent older one; a node's events of one wave merge into
    one. An item with nothing left to write (`due`) takes no token. A write that finds the view incomplete waits in the lane; one
    that finds this replica no longer leading is dropped with all the others (the next
    leader recomputes every node).
    """

    def __init__(self) -> None:
        self._items: dict[Hashable, LaneItem] = {}
        self._cond = threading.Condition()
        self._serial = 0
        self.crashes = 0  # writes dropped because sending them raised

    def put(self, key: Hashable | None, item: LaneItem) -> None:
        """Queue `item`; `key` None: never merged with another."""
        with self._cond:
            if key is None:
                self._serial += 1
                key = ("serial", self._serial)
            older = self._items.get(key)
            self._items[key] = item if older is None else item.merge(older)
            self._cond.notify()

    def depth(self) -> int:
        with self._cond:
            return len(self._items)

    def clear(self) -> None:
        with self._cond:
            self._items.clear()

    def run(self, writer: Writer, stop: threading.Event) -> None:
        """The lane's thread: until `stop`."""
        while not stop.is_set():
            with self._cond:
                if not self._items:
                    self._cond.wait(0.5)
                    continue
                key = next(iter(self._items))
                item = self._items.pop(key)
            try:
                if not item.due():
                    continue  # nothing to write any more: no token spent on it
                if writer.limiter.acquire(priority=LOW, stop=stop) < 0:
                    return
                done = item.send(writer)
            except NotLeader:
                self.clear()
                continue
            except WriteBlocked:
                done = False
                stop.wait(1.0)
            except Exception:  # a bug: drop this write, keep the lane (its thread must not die)
                log.exception("low-priority write crashed; dropped", extra={"key": str(key)})
                self.crashes += 1
                continue
            if not done:
                with self._cond:
                    if key not in self._items:  # unless something newer took its place
                        self._items[key] = item  # at the end: the others go first
                        self._cond.notify()


@dataclass(slots=True)
class _Annotation:
    pod: Pod
    value: str
    still_wanted: Callable[[], bool]
    on_outcome: Callable[[Outcome], None]

    def due(self) -> bool:
        return self.still_wanted()  # not when the pod was deleted meanwhile

    def send(self, writer: Writer) -> bool:
        if not self.still_wanted():
            return True
        outcome = _write_status_annotation(writer, self.pod, self.value)
        if outcome.result == THROTTLED:
            return False
        self.on_outcome(outcome)
        return True

    def merge(self, older: LaneItem) -> LaneItem:
        return self


def _write_status_annotation(writer: Writer, pod: Pod, value: str) -> Outcome:
    body = {"metadata": {"annotations": {keys.STATUS_KEY: value}}}
    path = pod_path(pod.namespace, pod.name)
    return writer._pod_write(pod, lambda: writer.api.patch(path, body, MERGE_PATCH, writer.params), priority=None)


@dataclass(slots=True)
class _NodeAnnotations:
    """The status annotations of one node's pods, decided when sent: `decide` gives the
    next one due now, (pod, value, what it shows), and whether more are due after it. One
    write per turn; the item goes back to the end of the lane while more are due, so nodes
    take turns. Whatever the number of pods waiting for an annotation, the lane holds one
    of these per node."""

    decide: Callable[[], tuple[tuple[Pod, str, str] | None, bool]]
    on_outcome: Callable[[Pod, str, Outcome], None]

    def due(self) -> bool:
        return self.decide()[0] is not None

    def send(self, writer: Writer) -> bool:
        first, more = self.decide()
        if first is None:
            return True
        pod, value, shows = first
        outcome = _write_status_annotation(writer, pod, value)
        if outcome.result == THROTTLED:
            return False  # the same again later
        self.on_outcome(pod, shows, outcome)
        # More due: back to the end of the lane. A failure drops the item: `on_outcome`
        # retries the node, whose next pass queues its annotations again.
        return outcome.result not in (APPLIED, GONE) or not more

    def merge(self, older: LaneItem) -> LaneItem:
        return self


@dataclass(slots=True)
class _Event:
    regarding: dict[str, str]
    kind: str
    reason: str
    note: str
    action: str

    def due(self) -> bool:
        return True

    def send(self, writer: Writer) -> bool:
        return writer._post_event(self.regarding, self.kind, self.reason, self.note, self.action)

    def merge(self, older: LaneItem) -> LaneItem:
        return self


@dataclass(slots=True)
class _NodeWave:
    """One event for a node's wave of resizes (or, in a dry run, of resizes not made)."""

    node: str
    uid: str
    reason: str
    lead: str  # "adjusted" / "dry-run, not applied: would adjust"
    changes: list[str]
    tail: str  # the node's figures after the latest pass

    def due(self) -> bool:
        return True

    def send(self, writer: Writer) -> bool:
        n = len(self.changes)
        shown = ", ".join(self.changes[:20]) + (f" and {n - 20} more" if n > 20 else "")
        note = f"{self.lead} the CPU limit of {n} pod{'s' if n != 1 else ''} ({self.tail}): {shown}"
        regarding = {"apiVersion": "v1", "kind": "Node", "name": self.node}
        if self.uid:
            regarding["uid"] = self.uid
        return writer._post_event(regarding, "Normal", self.reason, note, "Resize")

    def merge(self, older: LaneItem) -> LaneItem:
        if isinstance(older, _NodeWave):
            self.changes = older.changes + self.changes
        return self


class Writer:
    """Every write goes through here: the leadership fence, the write budget (`limiter`),
    and, for writes to pods, the view gate (`blocked` names why the view is incomplete).

    Resizes are sent at once by the worker that decided them; status annotations and
    events go to the low-priority lane (`lane`, run by a thread of the controller's)."""

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
        self.lane = Lane()

    def fence(self) -> None:
        if not self.may_write():
            raise NotLeader()

    def _pod_write(self, pod: Pod, send: Callable[[], object], priority: int | None = SEED) -> Outcome:
        """`priority` None: the caller (the lane) already holds a token."""
        self.fence()
        if priority is not None:
            self.limiter.acquire(pod.node_name, priority)  # NodeBusy: nothing taken, nothing sent
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
        """The resize, sent now (a pod's first limit before any change to one: SEED, else
        ADJUST); raises NodeBusy when the node's budget is spent."""
        path, body = pod_path(pod.namespace, pod.name, "resize"), resize_body(pod, target)
        priority = SEED if is_seed(target) else ADJUST
        return self._pod_write(pod, lambda: self.api.patch(path, body, STRATEGIC_PATCH, self.params), priority)

    def read_pod(self, pod: Pod) -> Pod | None:
        """The pod as the API server has it now (a read: no write budget); None when it
        cannot be read."""
        try:
            return pod_from_dict(self.api.get(pod_path(pod.namespace, pod.name)))
        except (ApiError, RecordError):
            return None

    def record_original(self, pod: Pod, value: str) -> tuple[Outcome, str]:
        """Write kube-headroom.dev/original-cpu-limits now, at the priority of the resize it
        comes before; the outcome and the pod's new resourceVersion. NodeBusy as `resize`."""
        path = pod_path(pod.namespace, pod.name)
        meta: dict[str, Any] = {"annotations": {keys.ORIGINAL_KEY: value}}
        if pod.resource_version:
            meta["resourceVersion"] = pod.resource_version
        body = {"metadata": meta}
        sent: dict[str, Any] = {}

        def send() -> None:
            sent.update(self.api.patch(path, body, MERGE_PATCH, self.params) or {})

        outcome = self._pod_write(pod, send, SEED if any(c.cpu_limit is None for c in pod.containers) else ADJUST)
        return outcome, str((sent.get("metadata") or {}).get("resourceVersion") or "")

    def annotate(
        self,
        pod: Pod,
        value: str,
        still_wanted: Callable[[], bool] = lambda: True,
        on_outcome: Callable[[Outcome], None] = lambda outcome: None,
    ) -> None:
        """Queue kube-headroom.dev/status for the lane; metadata only (RBAC: patch pods).
        `on_outcome` hears how it went (not on 429, which is retried)."""
        self.lane.put(("annotation", pod.key), _Annotation(pod, value, still_wanted, on_outcome))

    def annotate_node(
        self,
        node: str,
        decide: Callable[[], tuple[tuple[Pod, str, str] | None, bool]],
        on_outcome: Callable[[Pod, str, Outcome], None],
    ) -> None:
        """Queue `node`'s status annotations for the lane, decided by `decide` when sent."""
        self.lane.put(("annotations", node), _NodeAnnotations(decide, on_outcome))

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
        """Queue an events.k8s.io/v1 Event on the pod."""
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
        self.object_event(ref, kind, reason, note, action)

    def object_event(self, regarding: dict[str, str], kind: str, reason: str, note: str, action: str) -> None:
        """Queue an Event about any object (cluster-scoped ones are recorded in `default`)."""
        self.lane.put(None, _Event(regarding, kind, reason, note, action))

    def node_wave(self, node: Node, reason: str, lead: str, changes: list[str], tail: str) -> None:
        """Queue the node's one event for a wave of changes; merged with its unsent one."""
        self.lane.put(("wave", node.name, reason), _NodeWave(node.name, node.uid, reason, lead, list(changes), tail))

    def _post_event(self, regarding: dict[str, str], kind: str, reason: str, note: str, action: str) -> bool:
        """Send one Event (the lane holds a token). Best effort: a lost event is only
        logged; False (kept for another try) only when the server said to wait."""
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
            "note": _clip(note, 1024),
            "type": kind,
            "regarding": regarding,
        }
        try:
            self.api.post(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body)
        except ApiError as exc:
            if exc.status == 429:
                self.limiter.hold(exc.retry_after or 1.0)
                return False
            log.warning(
                "event not recorded",
                extra={"object": f"{regarding['kind']}/{regarding['name']}", "reason": reason, "error": str(exc)},
            )
        return True
