"""What else in a namespace sets or polices CPU limits: VerticalPodAutoscalers, LimitRanges
and ResourceQuotas on `limits.cpu`.

Slim records built from the raw objects (like core/records.py, a builder raises
`RecordError` on input it cannot read), one immutable index per cluster state, and the
rules the controller and `plan` share:

- `vpa_controlling(pod)`: the VPA that owns the pod's CPU limits, if any;
- `limit_range_cap(...)` / `limit_range_refusal(...)`: the LimitRanger admission's own
  rules (k8s.io/kubernetes plugin/pkg/admission/limitranger), for cpu and memory — ported,
  as no Python library implements them; the real server's LimitRanger is their test
  reference (tests/integration/test_coexistence.py compares verdicts and messages);
- `QuotaBudget`: what a namespace's `limits.cpu` quotas still admit.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .quantity import QuantityError, cpu_milli, format_milli, whole_units
from .records import APP, INIT, SIDECAR, Container, Pod, RecordError, _guarded

VPA_KIND = "VerticalPodAutoscaler"
LIMIT_RANGE_KIND = "LimitRange"
QUOTA_KIND = "ResourceQuota"
VPA_PATH = "/apis/autoscaling.k8s.io/v1/verticalpodautoscalers"
LIMIT_RANGE_PATH = "/api/v1/limitranges"
QUOTA_PATH = "/api/v1/resourcequotas"
# Each kind's table in `Neighbours`.
TABLES = {VPA_KIND: "vpas", LIMIT_RANGE_KIND: "limit_ranges", QUOTA_KIND: "quotas"}


def _meta(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise RecordError(f"{obj.get('kind') or 'object'}: metadata.name is required")
    return str(meta.get("namespace") or "default"), str(meta["name"])


# --- VerticalPodAutoscaler ------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ContainerPolicy:
    container: str  # a container name, or "*"
    off: bool  # mode: Off
    limits_cpu: bool  # controlledValues RequestsAndLimits (the default) with cpu controlled


@dataclass(slots=True, frozen=True)
class Vpa:
    namespace: str
    name: str
    target_kind: str
    target_name: str
    update_off: bool  # updatePolicy.updateMode: Off (recommendations only)
    policies: tuple[ContainerPolicy, ...]

    def controls_limits(self, containers: Iterable[Container]) -> bool:
        """Whether the VPA would set the CPU limit of any of these containers. Its defaults
        (no resourcePolicy) control requests and limits of cpu and memory."""
        if self.update_off:
            return False
        by_name = {p.container: p for p in self.policies}
        default = by_name.get("*", ContainerPolicy("*", False, True))
        for c in containers:
            if c.kind == INIT:
                continue
            p = by_name.get(c.name, default)
            if not p.off and p.limits_cpu:
                return True
        return False


ANY = "*"  # the target of a VPA that cannot be read: every pod of its namespace


def _vpa_from_dict(obj: Mapping[str, Any]) -> Vpa:
    ns, name = _meta(obj)
    try:
        spec = obj.get("spec") or {}
        ref = spec.get("targetRef") or {}
        update = (spec.get("updatePolicy") or {}).get("updateMode")
        policies = []
        for p in (spec.get("resourcePolicy") or {}).get("containerPolicies") or ():
            resources = p.get("controlledResources")
            cpu = resources is None or "cpu" in resources
            values = p.get("controlledValues") or "RequestsAndLimits"
            policies.append(
                ContainerPolicy(
                    str(p.get("containerName") or "*"), p.get("mode") == "Off", cpu and values != "RequestsOnly"
                )
            )
        return Vpa(ns, name, str(ref.get("kind") or ""), str(ref.get("name") or ""), update == "Off", tuple(policies))
    except (TypeError, AttributeError, ValueError, KeyError):
        # Fail closed: a VPA that cannot be read may be one that owns the limits of any
        # pod in its namespace, so it is taken to own them all.
        return Vpa(ns, name, ANY, ANY, False, ())


vpa_from_dict: Callable[[Mapping[str, Any]], Vpa] = _guarded(_vpa_from_dict)

_JOB_OF_CRONJOB = re.compile(r"^(?P<cronjob>.+)-\d+$")


def owner_chain(pod: Pod) -> tuple[tuple[str, str], ...]:
    """The pod's controller and the controllers above it, as far as the pod itself tells
    without reading them: a Deployment's ReplicaSet is named `<deployment>-<pod-template-hash>`
    (the hash is also a pod label), an Argo Rollout's likewise, and a CronJob's Job
    `<cronjob>-<scheduled time>`. A guess can only add an owner, so a VPA matched by a
    guess makes Headroom leave the pod alone, never write to a pod its VPA owns."""
    if pod.owner_kind is None or pod.owner_name is None:
        return ()
    chain = [(pod.owner_kind, pod.owner_name)]
    if pod.owner_kind == "ReplicaSet":
        for label, kind in (("pod-template-hash", "Deployment"), ("rollouts-pod-template-hash", "Rollout")):
            h = pod.labels.get(label)
            if h and pod.owner_name.endswith("-" + h):
                chain.append((kind, pod.owner_name[: -len(h) - 1]))
    elif pod.owner_kind == "Job":
        m = _JOB_OF_CRONJOB.match(pod.owner_name)
        if m:
            chain.append(("CronJob", m["cronjob"]))
    return tuple(chain)


# --- LimitRange -----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Bounds:
    """One resource's min, max and maxLimitRequestRatio (millicores / bytes; ratio in
    thousandths, as the admission compares it)."""

    min: int | None = None
    max: int | None = None
    ratio_milli: int | None = None


@dataclass(slots=True, frozen=True)
class LimitItem:
    type: str  # Container or Pod
    cpu: Bounds
    memory: Bounds


@dataclass(slots=True, frozen=True)
class LimitRange:
    namespace: str
    name: str
    items: tuple[LimitItem, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _bounds(obj: Mapping[str, Any], item: Mapping[str, Any], resource: str, i: int) -> Bounds:
    values: list[int | None] = []
    for leaf in ("min", "max", "maxLimitRequestRatio"):
        raw = (item.get(leaf) or {}).get(resource)
        if raw is None:
            values.append(None)
            continue
        try:
            if resource == "cpu" or leaf == "maxLimitRequestRatio":
                values.append(cpu_milli(raw))
            else:
                values.append(whole_units(raw))
        except QuantityError as exc:
            raise RecordError(f"LimitRange/{_meta(obj)[1]}: spec.limits[{i}].{leaf}.{resource}: {exc}") from None
    return Bounds(*values)


def _limit_range_from_dict(obj: Mapping[str, Any]) -> LimitRange:
    ns, name = _meta(obj)
    items = []
    for i, item in enumerate((obj.get("spec") or {}).get("limits") or ()):
        kind = item.get("type")
        if kind in ("Container", "Pod"):
            items.append(LimitItem(kind, _bounds(obj, item, "cpu", i), _bounds(obj, item, "memory", i)))
    return LimitRange(ns, name, tuple(items))


limit_range_from_dict: Callable[[Mapping[str, Any]], LimitRange] = _guarded(_limit_range_from_dict)


# --- ResourceQuota --------------------------------------------------------------------------


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
    ns, name = _meta(obj)
    hard_raw = ((obj.get("spec") or {}).get("hard") or {}).get("limits.cpu")
    status = obj.get("status") or {}
    used_raw = (status.get("used") or {}).get("limits.cpu")
    try:
        hard = None if hard_raw is None else cpu_milli(hard_raw)
        used = None if used_raw is None else cpu_milli(used_raw)
    except QuantityError as exc:
        raise RecordError(f"ResourceQuota/{ns}/{name}: limits.cpu: {exc}") from None
    return Quota(ns, name, hard, used)


quota_from_dict: Callable[[Mapping[str, Any]], Quota] = _guarded(_quota_from_dict)


# --- the index ------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Neighbours:
    """Per namespace, what else sets or polices CPU limits. Immutable: the cache swaps in a
    new one on every change, and every reconcile's view shares the current one."""

    vpas: Mapping[str, tuple[Vpa, ...]] = field(default_factory=dict)
    limit_ranges: Mapping[str, tuple[LimitRange, ...]] = field(default_factory=dict)
    quotas: Mapping[str, tuple[Quota, ...]] = field(default_factory=dict)

    def vpa_controlling(self, pod: Pod) -> Vpa | None:
        """The VPA whose target is in the pod's owner chain and that sets its CPU limits."""
        vpas = self.vpas.get(pod.namespace)
        if not vpas:
            return None
        chain = set(owner_chain(pod))
        for v in vpas:
            if v.target_kind == ANY or ((v.target_kind, v.target_name) in chain and v.controls_limits(pod.containers)):
                return v
        return None

    def limits_quotas(self, namespace: str) -> tuple[Quota, ...]:
        return tuple(q for q in self.quotas.get(namespace, ()) if q.hard is not None)


EMPTY = Neighbours()


def with_object(n: Neighbours, kind: str, obj: Vpa | LimitRange | Quota | None, ns: str, name: str) -> Neighbours:
    """A copy of `n` with one object put (obj) or removed (None)."""
    attr = TABLES[kind]
    table: Mapping[str, tuple[Any, ...]] = getattr(n, attr)
    kept = tuple(o for o in table.get(ns, ()) if o.name != name)
    if obj is not None:
        kept = tuple(sorted((*kept, obj), key=lambda o: o.name))
    new = {k: v for k, v in table.items() if k != ns}
    if kept:
        new[ns] = kept
    return _replace(n, attr, new)


def with_all(n: Neighbours, kind: str, objs: Iterable[Vpa | LimitRange | Quota]) -> Neighbours:
    attr = TABLES[kind]
    table: dict[str, list[Any]] = {}
    for o in objs:
        table.setdefault(o.namespace, []).append(o)
    return _replace(n, attr, {ns: tuple(sorted(v, key=lambda o: o.name)) for ns, v in table.items()})


def _replace(n: Neighbours, attr: str, table: Mapping[str, tuple[Any, ...]]) -> Neighbours:
    parts = {"vpas": n.vpas, "limit_ranges": n.limit_ranges, "quotas": n.quotas, attr: table}
    return Neighbours(**parts)


# --- LimitRanger's rules --------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Cap:
    value: int
    source: str  # "LimitRange ns/name" or "ResourceQuota ns/name"


def limit_range_cap(
    pod: Pod, computed: Iterable[Container], request: int, ranges: Iterable[LimitRange], pinned: bool
) -> Cap | None:
    """The largest pod total (before the proportional split) that keeps every computed
    container, and the pod, inside the namespace's LimitRanges' cpu max and
    maxLimitRequestRatio. `pinned`: the policy may add one quantum to the largest container
    (to keep the QoS class), so a container max leaves room for it."""
    computed = tuple(computed)
    names = {c.name for c in computed}
    best: Cap | None = None

    def take(value: int, lr: LimitRange) -> None:
        nonlocal best
        if best is None or value < best.value:
            best = Cap(value, f"LimitRange {lr.key}")

    for lr in ranges:
        for item in lr.items:
            b = item.cpu
            if item.type == "Container" and pod.pod_level is None:
                for c in computed:
                    if b.max is not None and c.cpu_request > 0:
                        room = b.max - (10 if pinned else 0)
                        take(room * request // c.cpu_request, lr)
                if b.ratio_milli is not None:
                    take(request * b.ratio_milli // 1000, lr)
            elif item.type == "Pod":
                others = _pod_limit_without(pod, names)
                if b.max is not None:
                    take(b.max - others, lr)
                if b.ratio_milli is not None:
                    take((_pod_sum(pod, "cpu_request") or 0) * b.ratio_milli // 1000 - others, lr)
    return best


def _pod_limit_without(pod: Pod, names: set[str]) -> int:
    """The pod's CPU limit total from the containers the policy does not set."""
    if pod.pod_level is not None:
        return 0
    return sum(c.cpu_limit or 0 for c in pod.containers if c.kind in (APP, SIDECAR) and c.name not in names)


def _pod_sum(pod: Pod, attr: str, limits: Mapping[str, int] | None = None) -> int | None:
    """The admission's podRequests / podLimits: app containers and sidecars add up; an init
    container counts with the sidecars before it, and the total is the larger; a pod-level
    value overrides. None when no container sets it."""
    pl = pod.pod_level
    level = None if pl is None else getattr(pl, attr)
    if level is not None:
        return int(level)
    total: int | None = None
    sidecars = 0
    init_peak: int | None = None
    for c in sorted(pod.containers, key=lambda c: c.kind == APP):  # init containers in order, then apps
        v = getattr(c, attr)
        if limits is not None and attr == "cpu_limit" and c.name in limits:
            v = limits[c.name]
        if attr == "cpu_request" and not v:
            v = None
        if c.kind == INIT:
            if v is not None or sidecars:
                init_peak = max(init_peak or 0, (v or 0) + sidecars)
            continue
        if v is not None:
            total = (total or 0) + v
            if c.kind == SIDECAR:
                sidecars += v
    if init_peak is not None:
        total = max(total or 0, init_peak)
    return total


def _check(kind: str, res: str, b: Bounds, req: int | None, lim: int | None, show: Callable[[int], str]) -> str | None:
    """minConstraint, maxConstraint and limitRequestRatioConstraint of the admission."""
    if b.min is not None:
        if req is None:
            return f"minimum {res} usage per {kind} is {show(b.min)}.  No request is specified"
        if req < b.min:
            return f"minimum {res} usage per {kind} is {show(b.min)}, but request is {show(req)}"
        if lim is not None and lim < b.min:
            return f"minimum {res} usage per {kind} is {show(b.min)}, but limit is {show(lim)}"
    if b.max is not None:
        if lim is None:
            return f"maximum {res} usage per {kind} is {show(b.max)}.  No limit is specified"
        if lim > b.max:
            return f"maximum {res} usage per {kind} is {show(b.max)}, but limit is {show(lim)}"
        if req is not None and req > b.max:
            return f"maximum {res} usage per {kind} is {show(b.max)}, but request is {show(req)}"
    if b.ratio_milli is not None:
        if not req:
            return f"{res} max limit to request ratio per {kind} is {format_milli(b.ratio_milli)}, but no request is specified or request is 0"
        if not lim:
            return f"{res} max limit to request ratio per {kind} is {format_milli(b.ratio_milli)}, but no limit is specified or limit is 0"
        if lim * 1000 > b.ratio_milli * req:
            return f"{res} max limit to request ratio per {kind} is {format_milli(b.ratio_milli)}, but provided ratio is {lim / req:f}"
    return None


def _bytes(v: int) -> str:
    """Bytes as the API server prints a binary quantity ("512Mi")."""
    for suffix, size in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if v and v % size == 0:
            return f"{v // size}{suffix}"
    return str(v)


def limit_range_refusal(
    pod: Pod, ranges: Iterable[LimitRange], limits: Mapping[str, int] | None = None, pod_limit: int | None = None
) -> str | None:
    """What the LimitRanger admission would answer a resize of `pod` to these CPU limits
    (per container name, or the pod-level limit): None when it admits it, else its message
    (the first of them) naming the LimitRange."""
    limits = limits or {}
    for lr in ranges:
        for item in lr.items:
            if item.type == "Container":
                for c in pod.containers:
                    lim = limits.get(c.name, c.cpu_limit)
                    why = _check("Container", "cpu", item.cpu, c.cpu_request or None, lim, format_milli) or _check(
                        "Container", "memory", item.memory, c.mem_request, c.mem_limit, _bytes
                    )
                    if why:
                        return f"LimitRange {lr.key}: {why}"
            else:
                lim = _pod_sum(pod, "cpu_limit", limits)
                if pod_limit is not None:
                    lim = pod_limit
                why = _check("Pod", "cpu", item.cpu, _pod_sum(pod, "cpu_request"), lim, format_milli)
                if why is None:
                    mreq, mlim = _pod_sum(pod, "mem_request"), _pod_sum(pod, "mem_limit")
                    why = _check("Pod", "memory", item.memory, mreq, mlim, _bytes)
                if why:
                    return f"LimitRange {lr.key}: {why}"
    return None


# --- ResourceQuota budget -------------------------------------------------------------------


def pod_limits_cpu(pod: Pod) -> int:
    """The pod's `limits.cpu` as a ResourceQuota counts it (0 for a pod that has ended)."""
    if pod.terminal:
        return 0
    return _pod_sum(pod, "cpu_limit") or 0


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
