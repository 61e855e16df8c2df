"""Slim records built straight from parsed API JSON, never changed once built (not frozen
dataclasses, for speed: see the note above `Pod`).

The watch cache holds these instead of the client's model objects (about 66 KB per pod);
only what eligibility and policy read is kept. Builders take the dict `json.loads` or
`orjson.loads` returns for one object and raise `RecordError` naming the field on bad input.
Long because a pod is: containers of three kinds, pod-level resources, the kubelet's
applied resources and resize conditions, owners and QoS.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from . import keys
from .quantity import QuantityError, cpu_milli, whole_units

APP, SIDECAR, INIT = "app", "sidecar", "init"
GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"


class RecordError(ValueError):
    """A Kubernetes object whose fields cannot be read; the message names object and field."""


# Pod and Container are built once per watch event; they are never mutated after
# construction, but are not `frozen`: a frozen dataclass's __init__ goes through
# object.__setattr__ per field, measured at ~6 µs per pod event here — a fifth of the
# whole ingest budget (docs/performance.md).
@dataclass(slots=True)
class Container:
    name: str
    kind: str  # APP, SIDECAR (restartable init container) or INIT
    cpu_request: int  # millicores from spec, 0 when unset
    cpu_limit: int | None
    mem_request: int | None  # bytes
    mem_limit: int | None
    booked_cpu: int  # max of spec, allocated and actual request while a resize is in flight
    restart_on_cpu_resize: bool


@dataclass(slots=True, frozen=True)
class PodLevel:
    """`spec.resources` of a pod that sets pod-level resources."""

    cpu_request: int | None
    cpu_limit: int | None
    mem_request: int | None
    mem_limit: int | None


@dataclass(slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    node_name: str | None
    phase: str
    deleting: bool
    mirror: bool
    labels: Mapping[str, str]
    mode: str | None  # kube-headroom.dev/mode from label, else annotation
    max_cpu: str | None  # raw kube-headroom.dev/max-cpu annotation
    owner_kind: str | None  # kind of the controller ownerReference
    containers: tuple[Container, ...]
    overhead_cpu: int
    pod_level: PodLevel | None
    qos: str
    booked_cpu: int
    resize_infeasible: bool
    resource_version: str = ""
    status_annotation: str | None = None  # kube-headroom.dev/status as last written
    memory_pinned: bool = False  # every container's memory request equals its limit
    # PodResizePending or PodResizeInProgress is True, or the kubelet has not yet observed
    # the pod's latest generation (status.observedGeneration, 1.35+): a resize in flight.
    resize_pending: bool = False
    resize_deferred: bool = False  # PodResizePending, reason Deferred: the node cannot fit it now
    windows: bool = False  # spec.os.name is windows
    # The pod generation whose resize the kubelet refused (Infeasible, or InProgress with
    # reason Error); 0 when none is refused. One backoff per refused generation.
    resize_refused_generation: int = 0
    # What the kubelet said of the refused resize ("Infeasible: ..." or "Error: ..."), for
    # explain and the event; not an input of any decision.
    resize_refusal: str | None = None
    owner_name: str | None = None  # name of the controller ownerReference
    # kube-headroom.dev/original-cpu-limits: the limits the pod had before Headroom first
    # wrote one (raw JSON, as recorded; see core/release.py)
    original_limits: str | None = None
    # Headroom's field manager has resized this pod before (metadata.managedFields): its
    # limits are no longer the ones it had, so they are not recorded as the original.
    resized_by_headroom: bool = False
    # (container, CPU limit in millicores the kubelet reports applied, 0 for none) of the
    # running app containers, when one differs from the spec while no resize is in flight:
    # the kubelet observed a resize but never applied it (one that reached the API server
    # while the kubelet was restarting is lost so). None in the usual case. Counted as
    # pending; the reconciler sends such a resize again (docs/controller.md).
    unapplied: tuple[tuple[str, int], ...] | None = None
    # The same (container, applied CPU limit) pairs whenever one differs from the spec,
    # resize in flight or not: what `plan` and the resize-lag metric show. None in the
    # usual case; the same tuple as `unapplied` when that is set.
    applied: tuple[tuple[str, int], ...] | None = None
    # (field manager, container) of every other writer whose managedFields entry for the
    # resize subresource owns a CPU limit of the pod: a container's name, or POD_LIMIT for
    # the pod-level limit. Empty in the usual case. See docs/policy.md, "Another writer".
    limit_writers: tuple[tuple[str, str], ...] = ()
    reclaim: str | None = None  # kube-headroom.dev/reclaim-limit

    def same_inputs(self, other: Pod) -> bool:
        """Equal in everything the node's plan reads, status counts included (whether a
        resize is pending or deferred): a change here requeues the node."""
        return (
            self.same_decision(other)
            and self.resize_pending == other.resize_pending
            and self.resize_deferred == other.resize_deferred
            and self.unapplied == other.unapplied
            and self.applied == other.applied
        )

    def same_decision(self, other: Pod) -> bool:
        """Equal in everything eligibility and policy read: all but the resourceVersion,
        what only the write path reads (our annotations, whether Headroom resized it
        before), what only status counts (a resize pending or deferred: the kubelet's
        answer to the last write), and the phase short of terminal (the kubelet starting a
        pod changes no decision). A resize decided on `other` still stands for this pod.
        (A unit test holds this list to the fields.)"""
        return (
            self.booked_cpu == other.booked_cpu
            and self.containers == other.containers
            and self.node_name == other.node_name
            and self.terminal == other.terminal  # Pending -> Running is not an input
            and self.deleting == other.deleting
            and self.labels == other.labels
            and self.mode == other.mode
            and self.max_cpu == other.max_cpu
            and self.owner_kind == other.owner_kind
            and self.owner_name == other.owner_name
            and self.pod_level == other.pod_level
            and self.qos == other.qos
            and self.resize_infeasible == other.resize_infeasible
            and self.memory_pinned == other.memory_pinned
            and self.windows == other.windows
            and self.resize_refused_generation == other.resize_refused_generation
            and self.overhead_cpu == other.overhead_cpu
            and self.mirror == other.mirror
            and self.uid == other.uid
            and self.namespace == other.namespace
            and self.name == other.name
            and self.limit_writers == other.limit_writers
            and self.reclaim == other.reclaim
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(slots=True, frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    allocatable_cpu: int
    windows: bool
    ready: bool
    declared_features: tuple[str, ...] = ()
    # The node's CPU is being resized (KEP-3953): the CapacityConfigured condition says
    # InProgress, or spec.configuredCapacity asks for less than status.capacity holds.
    # Limits are only cut (or first set) until it is done.
    resizing: bool = False
    capacity_cpu: int = 0
    uid: str = ""  # events name it: `kubectl describe node` shows only events with the node's uid


@dataclass(slots=True, frozen=True)
class Namespace:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _where(obj: Mapping[str, Any]) -> str:
    try:
        meta = obj.get("metadata") or {}
        kind = obj.get("kind") or "object"
        ns = meta.get("namespace")
        return f"{kind}/{str(ns) + '/' if ns else ''}{meta.get('name', '?')}"
    except (AttributeError, TypeError):
        return "object"


# What malformed input raises inside a builder; turned into RecordError at its boundary.
# Checking every field's type instead would cost the watch path on every event; a try
# costs nothing until something is wrong.
_MALFORMED = (TypeError, AttributeError, ValueError, KeyError, IndexError, ArithmeticError, RecursionError)


def namespaced_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of a namespaced object; "default" when it names no namespace."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise RecordError(f"{obj.get('kind') or 'object'}: metadata.name is required")
    return str(meta.get("namespace") or "default"), str(meta["name"])


def record_reader(build: Any) -> Any:
    """`build` (a raw object -> its record) made safe at the boundary: whatever a malformed
    object makes it raise comes out as a RecordError naming the object; each kind's
    `*_from_dict` is one of these."""

    def guarded(obj: Mapping[str, Any]) -> Any:
        try:
            return build(obj)
        except RecordError:
            raise
        except _MALFORMED as exc:
            raise RecordError(f"{_where(obj)}: cannot be read ({type(exc).__name__}: {str(exc)[:200]})") from None

    guarded.__name__ = build.__name__.lstrip("_")
    guarded.__doc__ = build.__doc__
    return guarded


# A cluster spells its quantities a few hundred ways ("500m", "256Mi"); each is parsed
# once per unit. Bounded, so odd values cannot grow the memo without limit.
_SEEN: dict[tuple[str, bool], int] = {}
_SEEN_MAX = 8192


def _quantity(obj: Mapping[str, Any], value: Any, cpu: bool, path: str, leaf: str) -> int:
    # The path is only assembled on error: this runs several times per pod event.
    key = (value, cpu) if value.__class__ is str else None
    if key is not None:
        known = _SEEN.get(key)
        if known is not None:
            return known
    try:
        parsed = cpu_milli(value) if cpu else whole_units(value)
    except QuantityError as exc:
        raise RecordError(f"{_where(obj)}: {path}{leaf}: {exc}") from None
    if key is not None and len(_SEEN) < _SEEN_MAX:
        _SEEN[key] = parsed
    return parsed


def _cpu(obj: Mapping[str, Any], value: Any, path: str, leaf: str = "") -> int:
    """CPU in millicores."""
    return _quantity(obj, value, True, path, leaf)


def _bytes(obj: Mapping[str, Any], value: Any, path: str, leaf: str = "") -> int:
    """Memory in bytes."""
    return _quantity(obj, value, False, path, leaf)


def qos_class(
    resources: Iterable[tuple[int | None, int | None, int | None, int | None]],
) -> str:
    """QoS from (cpu request, cpu limit, memory request, memory limit) per container.

    Mirrors k8s.io/kubernetes/pkg/apis/core/helper/qos: BestEffort when nothing is set,
    Guaranteed when every container limits both CPU and memory and the summed requests
    equal the summed limits, Burstable otherwise. Requests are already defaulted to limits.
    """
    req = [0, 0]
    lim = [0, 0]
    any_set = False
    guaranteed = True
    for cpu_req, cpu_lim, mem_req, mem_lim in resources:
        for i, (r, lm) in enumerate(((cpu_req, cpu_lim), (mem_req, mem_lim))):
            if r:
                req[i] += r
                any_set = True
            if lm:
                lim[i] += lm
                any_set = True
        if not cpu_lim or not mem_lim:
            guaranteed = False
    if not any_set:
        return BEST_EFFORT
    if guaranteed and req == lim:
        return GUARANTEED
    return BURSTABLE


def _resources(
    obj: Mapping[str, Any], path: str, res: Mapping[str, Any] | None
) -> tuple[int | None, int | None, int | None, int | None]:
    if not res:
        return None, None, None, None
    requests = res.get("requests") or _EMPTY
    limits = res.get("limits") or _EMPTY
    v = limits.get("cpu")
    cpu_lim = None if v is None else _cpu(obj, v, path, ".limits.cpu")
    v = limits.get("memory")
    mem_lim = None if v is None else _bytes(obj, v, path, ".limits.memory")
    # The API server defaults a missing request to the limit; do the same for raw input.
    v = requests.get("cpu")
    cpu_req = cpu_lim if v is None else _cpu(obj, v, path, ".requests.cpu")
    v = requests.get("memory")
    mem_req = mem_lim if v is None else _bytes(obj, v, path, ".requests.memory")
    return cpu_req, cpu_lim, mem_req, mem_lim


def _status_cpu(obj: Mapping[str, Any], statuses: Iterable[Mapping[str, Any]], out: dict[str, int]) -> None:
    """Largest CPU request the kubelet reports per container (allocated or actual)."""
    for st in statuses:
        best = 0
        alloc = (st.get("allocatedResources") or _EMPTY).get("cpu")
        if alloc is not None:
            best = _cpu(obj, alloc, "status.containerStatuses[].allocatedResources.cpu")
        actual = ((st.get("resources") or _EMPTY).get("requests") or _EMPTY).get("cpu")
        if actual is not None:
            best = max(best, _cpu(obj, actual, "status.containerStatuses[].resources.requests.cpu"))
        out[str(st.get("name"))] = best


def _unapplied(
    obj: Mapping[str, Any], statuses: Iterable[Mapping[str, Any]], app: list[Container]
) -> tuple[tuple[str, int], ...] | None:
    """The CPU limits the kubelet reports applied to the running app containers (0: none),
    when one differs from the spec's; None when all agree or none is reported."""
    spec = {c.name: c.cpu_limit or 0 for c in app}
    applied = []
    differs = False
    for st in statuses:
        name, res, state = st.get("name"), st.get("resources"), st.get("state")
        # only what a kubelet writes counts (a running container's reported resources)
        if type(name) is not str or name not in spec or not isinstance(res, Mapping):
            continue
        if not isinstance(state, Mapping) or "running" not in state:
            continue
        v = (res.get("limits") or _EMPTY).get("cpu")
        milli = 0 if v is None else _cpu(obj, v, "status.containerStatuses[].resources.limits.cpu")
        applied.append((_intern(str(name)), milli))
        differs = differs or milli != spec[name]
    return tuple(applied) if differs else None


def _booked(containers: tuple[Container, ...]) -> int:
    """What the scheduler books for the containers (KEP-753 sidecar rules)."""
    total = sum(c.booked_cpu for c in containers if c.kind in (APP, SIDECAR))
    init_peak = 0
    sidecars = 0
    for c in containers:
        if c.kind == SIDECAR:
            sidecars += c.booked_cpu
        elif c.kind == INIT:
            init_peak = max(init_peak, c.booked_cpu + sidecars)
    return max(total, init_peak)


_EMPTY: Mapping[str, Any] = {}
_intern = sys.intern


def _container(
    obj: Mapping[str, Any], c: Mapping[str, Any], path: str, kind: str, in_status: dict[str, int]
) -> Container:
    cpu_req, cpu_lim, mem_req, mem_lim = _resources(obj, path + ".resources", c.get("resources"))
    restart = False
    for policy in c.get("resizePolicy") or ():
        if policy.get("resourceName") == "cpu" and policy.get("restartPolicy") == "RestartContainer":
            restart = True
    name = _intern(str(c.get("name", path)))
    req = cpu_req or 0
    return Container(name, kind, req, cpu_lim, mem_req, mem_lim, max(req, in_status.get(name, 0)), restart)


def _positive(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


MESSAGE_CHARS = 300  # of a kubelet's refusal kept on the record: its end

# Why a node refused a resize, as the metric and the event name it.
CFS_BURST, INFEASIBLE_CAUSE, ERROR_CAUSE = "cfs-burst", "infeasible", "error"
REFUSAL_CAUSES = (CFS_BURST, INFEASIBLE_CAUSE, ERROR_CAUSE)


def refusal_cause(refusal: str | None) -> str:
    """The cause of a refused resize from what the kubelet said: `cfs-burst` when the kernel
    refused the new CFS quota as invalid (it refuses a quota below the cgroup's burst:
    cpu.max.burst on cgroup v2, cpu.cfs_burst_us on v1, set by a node agent), `infeasible`
    (the node cannot fit it), else `error`."""
    if refusal is None:
        return ERROR_CAUSE
    low = refusal.lower()
    if ("cpu.max" in low or "cpu.cfs_quota_us" in low) and "invalid argument" in low:
        return CFS_BURST
    return INFEASIBLE_CAUSE if refusal.startswith("Infeasible") else ERROR_CAUSE


def refusal_text(refusal: str | None) -> str:
    """What explain and the pod's Warning event say of a resize the node refused."""
    said = f" (the kubelet: {refusal})" if refusal else ""
    if refusal_cause(refusal) == CFS_BURST:
        return (
            "the node refused the resize: the kernel will not set a CPU quota below the CFS burst a node agent "
            "set on the container (cpu.max.burst; Koordinator, Volcano and others set it), and the kubelet keeps "
            f"the higher limit{said}; remove the burst, or exclude the pod from Headroom where an agent manages it"
        )
    return f"the kubelet refused the resize (Infeasible or Error){said}"


def _generation(*candidates: object) -> int:
    """The first usable generation: the condition's, the status', then the pod's own."""
    for value in candidates:
        if _positive(value):
            return value
    return 1


def _pod_from_dict(obj: Mapping[str, Any]) -> Pod:
    try:
        meta = obj["metadata"]
        spec = obj["spec"]
        name = meta["name"]
    except (KeyError, TypeError):
        raise RecordError(f"{_where(obj)}: metadata.name and spec are required") from None
    status = obj.get("status") or _EMPTY
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or _EMPTY

    in_status: dict[str, int] = {}
    if "containerStatuses" in status:
        _status_cpu(obj, status["containerStatuses"], in_status)
    if "initContainerStatuses" in status:
        _status_cpu(obj, status["initContainerStatuses"], in_status)

    # App containers first: the order a resize patch lists them in.
    app = [
        _container(obj, c, f"spec.containers[{i}]", APP, in_status) for i, c in enumerate(spec.get("containers") or ())
    ]
    init = [
        _container(
            obj, c, f"spec.initContainers[{i}]", SIDECAR if c.get("restartPolicy") == "Always" else INIT, in_status
        )
        for i, c in enumerate(spec.get("initContainers") or ())
    ]
    containers = tuple(app + init)

    pod_level = None
    pod_res = spec.get("resources")
    if pod_res and (pod_res.get("requests") or pod_res.get("limits")):
        pod_level = PodLevel(*_resources(obj, "spec.resources", pod_res))

    overhead = (spec.get("overhead") or _EMPTY).get("cpu")
    overhead_cpu = _cpu(obj, overhead, "spec.overhead.cpu") if overhead is not None else 0

    qos = status.get("qosClass")
    if qos not in (GUARANTEED, BURSTABLE, BEST_EFFORT):
        per_container = [(c.cpu_request or None, c.cpu_limit, c.mem_request, c.mem_limit) for c in containers]
        qos = BEST_EFFORT
        if pod_level is not None:
            qos = qos_class([(pod_level.cpu_request, pod_level.cpu_limit, pod_level.mem_request, pod_level.mem_limit)])
        if qos == BEST_EFFORT:
            qos = qos_class(per_container)

    if pod_level is not None and pod_level.cpu_request is not None:
        booked = pod_level.cpu_request
    else:
        booked = _booked(tuple(init) + tuple(app)) if init else sum(c.booked_cpu for c in app)

    owner_kind = owner_name = None
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            owner_kind = _intern(str(ref.get("kind")))
            owner_name = _intern(str(ref.get("name")))  # shared by a ReplicaSet's pods
            break

    infeasible = pending = deferred = False
    refused_generation = 0
    refusal: str | None = None
    observed, generation = status.get("observedGeneration"), meta.get("generation")
    if _positive(observed) and _positive(generation) and observed < generation:
        pending = True  # the kubelet has not seen the latest spec (a resize) yet
    for cond in status.get("conditions") or ():
        kind = cond.get("type")
        if (kind == "PodResizePending" or kind == "PodResizeInProgress") and cond.get("status") == "True":
            pending = True
            reason = cond.get("reason")
            if kind == "PodResizePending" and reason == "Deferred":
                deferred = True
            if (kind == "PodResizePending" and reason == "Infeasible") or (
                kind == "PodResizeInProgress" and reason == "Error"
            ):
                infeasible = True
                refused_generation = _generation(
                    cond.get("observedGeneration"), status.get("observedGeneration"), meta.get("generation")
                )
                said = cond.get("message")
                said = said.strip() if isinstance(said, str) else ""
                if not said:
                    said = "no message"
                elif len(said) > MESSAGE_CHARS:  # the end says what failed (the errno)
                    said = "…" + said[-MESSAGE_CHARS:]
                refusal = f"{reason}: {said}"
    unapplied = applied = None
    if pod_level is None and status.get("phase") == "Running" and "containerStatuses" in status:
        applied = _unapplied(obj, status["containerStatuses"], app)
        if not pending:
            unapplied = applied
            pending = unapplied is not None  # written, not applied
    resized = False
    writers: list[tuple[str, str]] = []
    for entry in meta.get("managedFields") or ():
        if not isinstance(entry, dict) or entry.get("subresource") != "resize":
            continue
        manager = entry.get("manager")
        if manager == keys.FIELD_MANAGER:
            resized = True
        elif isinstance(manager, str):
            writers.extend((_intern(manager[:128]), c) for c in _cpu_limits_owned(entry.get("fieldsV1")))
    node_name = spec.get("nodeName")
    pinned = True
    for c in containers:
        if c.mem_limit is None or c.mem_request != c.mem_limit:
            pinned = False
            break
    return Pod(
        namespace=_intern(str(meta.get("namespace") or "default")),
        name=str(name),
        uid=str(meta.get("uid") or ""),
        node_name=_intern(node_name) if node_name else None,
        phase=_intern(str(status.get("phase") or "Pending")),
        deleting=meta.get("deletionTimestamp") is not None,
        mirror="kubernetes.io/config.mirror" in annotations,
        labels=labels,
        mode=labels.get(keys.MODE_KEY, annotations.get(keys.MODE_KEY)),
        max_cpu=annotations.get(keys.MAX_CPU_KEY),
        owner_kind=owner_kind,
        containers=containers,
        overhead_cpu=overhead_cpu,
        pod_level=pod_level,
        qos=_intern(qos),
        booked_cpu=booked + overhead_cpu,
        resize_infeasible=infeasible,
        resource_version=str(meta.get("resourceVersion") or ""),
        status_annotation=annotations.get(keys.STATUS_KEY),
        memory_pinned=pinned,
        resize_pending=pending,
        resize_deferred=deferred,
        windows=(spec.get("os") or _EMPTY).get("name") == "windows",
        resize_refused_generation=refused_generation,
        resize_refusal=refusal,
        owner_name=owner_name,
        original_limits=annotations.get(keys.ORIGINAL_KEY),
        resized_by_headroom=resized,
        unapplied=unapplied,
        applied=applied,
        limit_writers=tuple(sorted(set(writers))) if writers else (),
        reclaim=_text(annotations.get(keys.RECLAIM_KEY)),
    )


POD_LIMIT = "(pod)"  # the pod-level limit's name among a pod's limit writers (never a container name)


def _cpu_limits_owned(fields: object) -> list[str]:
    """The containers (POD_LIMIT for the pod level) whose CPU limit a managedFields entry's
    `fieldsV1` owns. Anything malformed owns nothing."""
    spec = fields.get("f:spec") if isinstance(fields, dict) else None
    if not isinstance(spec, dict):
        return []
    out = []
    if _owns_cpu_limit(spec):
        out.append(POD_LIMIT)
    for kind in ("f:containers", "f:initContainers"):
        items = spec.get(kind)
        for key, item in items.items() if isinstance(items, dict) else ():
            if isinstance(key, str) and key.startswith('k:{"name":"') and key.endswith('"}') and _owns_cpu_limit(item):
                out.append(key[11:-2])
    return out


def _owns_cpu_limit(fields: object) -> bool:
    resources = fields.get("f:resources") if isinstance(fields, dict) else None
    limits = resources.get("f:limits") if isinstance(resources, dict) else None
    return isinstance(limits, dict) and "f:cpu" in limits


def _text(value: object) -> str | None:
    return value[:256] if isinstance(value, str) else None


def _node_from_dict(obj: Mapping[str, Any]) -> Node:
    try:
        meta = obj["metadata"]
        name = meta["name"]
    except (KeyError, TypeError):
        raise RecordError(f"{_where(obj)}: metadata.name is required") from None
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = (status.get("allocatable") or {}).get("cpu")
    cap = (status.get("capacity") or {}).get("cpu")
    capacity = _cpu(obj, cap, "status.capacity.cpu") if cap is not None else 0
    allocatable = _cpu(obj, alloc, "status.allocatable.cpu") if alloc is not None else capacity
    resizing = False
    configured = ((obj.get("spec") or _EMPTY).get("configuredCapacity") or _EMPTY).get("cpu")
    if configured is not None and capacity:
        # What the kubelet is asked to shrink to counts now, less what it reserves
        # (as the scheduler takes min(configured, capacity)).
        wanted = _cpu(obj, configured, "spec.configuredCapacity.cpu")
        if wanted < capacity:
            allocatable = min(allocatable, max(0, wanted - (capacity - allocatable)))
            resizing = True
    os_name = labels.get("kubernetes.io/os") or (status.get("nodeInfo") or {}).get("operatingSystem")
    ready = False
    for c in status.get("conditions") or ():
        kind = c.get("type")
        if kind == "Ready" and c.get("status") == "True":
            ready = True
        elif kind == "CapacityConfigured" and c.get("reason") == "InProgress":
            resizing = True
    return Node(
        name=str(name),
        labels=labels,
        allocatable_cpu=allocatable,
        windows=os_name == "windows",
        ready=ready,
        declared_features=tuple(status.get("declaredFeatures") or ()),
        resizing=resizing,
        capacity_cpu=capacity,
        uid=str(meta.get("uid") or ""),
    )


def _namespace_from_dict(obj: Mapping[str, Any]) -> Namespace:
    meta = obj.get("metadata") or {}
    if "name" not in meta:
        raise RecordError(f"{_where(obj)}: metadata.name is required")
    return Namespace(str(meta["name"]), meta.get("labels") or {})


pod_from_dict: Callable[[Mapping[str, Any]], Pod] = record_reader(_pod_from_dict)
node_from_dict: Callable[[Mapping[str, Any]], Node] = record_reader(_node_from_dict)
namespace_from_dict: Callable[[Mapping[str, Any]], Namespace] = record_reader(_namespace_from_dict)


def applied_limits(pod: Pod) -> dict[str, int | None]:
    """The CPU limit the kubelet reports applied per running app container, in millicores
    (None: no limit). A pod keeps the kubelet's figures only where they differ from the
    spec's (and then of its running app containers only); every other running app container
    is taken to run with its spec's limit."""
    if pod.phase != "Running" or pod.pod_level is not None:
        return {}
    differs = dict(pod.applied or ())
    return {
        c.name: (differs[c.name] or None) if c.name in differs else c.cpu_limit
        for c in pod.containers
        if c.kind == APP and (not differs or c.name in differs)
    }
