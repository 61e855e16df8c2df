"""LimitRanges: the slim record of one (a builder raises `RecordError` on input it cannot
read), and the LimitRanger admission's own rules for cpu and memory
(k8s.io/kubernetes plugin/pkg/admission/limitranger), ported, as no Python library
implements them:

- `limit_range_cap(...)`: the largest CPU limit a pod's LimitRanges admit, for the policy;
- `limit_range_refusal(...)`: what the admission would answer a resize, with its message.

The real server's LimitRanger is their test reference (tests/integration/test_coexistence.py
compares verdicts and messages). This module is long because the admission's rules are:
minimum, maximum and ratio, per container and per pod, cpu and memory, init containers and
sidecars counted the way the server counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .quantity import QuantityError, cpu_milli, format_milli, whole_units
from .records import APP, INIT, SIDECAR, Container, Pod, RecordError, namespaced_name, record_reader

LIMIT_RANGE_KIND = "LimitRange"

# --- the record -----------------------------------------------------------------------------


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
            raise RecordError(
                f"LimitRange/{namespaced_name(obj)[1]}: spec.limits[{i}].{leaf}.{resource}: {exc}"
            ) from None
    return Bounds(*values)


def _limit_range_from_dict(obj: Mapping[str, Any]) -> LimitRange:
    ns, name = namespaced_name(obj)
    items = []
    for i, item in enumerate((obj.get("spec") or {}).get("limits") or ()):
        kind = item.get("type")
        if kind in ("Container", "Pod"):
            items.append(LimitItem(kind, _bounds(obj, item, "cpu", i), _bounds(obj, item, "memory", i)))
    return LimitRange(ns, name, tuple(items))


limit_range_from_dict: Callable[[Mapping[str, Any]], LimitRange] = record_reader(_limit_range_from_dict)


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
                    take((pod_sum(pod, "cpu_request") or 0) * b.ratio_milli // 1000 - others, lr)
    return best


def _pod_limit_without(pod: Pod, names: set[str]) -> int:
    """The pod's CPU limit total from the containers the policy does not set."""
    if pod.pod_level is not None:
        return 0
    return sum(c.cpu_limit or 0 for c in pod.containers if c.kind in (APP, SIDECAR) and c.name not in names)


def pod_sum(pod: Pod, attr: str, limits: Mapping[str, int] | None = None) -> int | None:
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
                lim = pod_sum(pod, "cpu_limit", limits)
                if pod_limit is not None:
                    lim = pod_limit
                why = _check("Pod", "cpu", item.cpu, pod_sum(pod, "cpu_request"), lim, format_milli)
                if why is None:
                    mreq, mlim = pod_sum(pod, "mem_request"), pod_sum(pod, "mem_limit")
                    why = _check("Pod", "memory", item.memory, mreq, mlim, _bytes)
                if why:
                    return f"LimitRange {lr.key}: {why}"
    return None
