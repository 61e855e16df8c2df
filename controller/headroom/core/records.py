"""Slim, immutable records built straight from parsed API JSON.

The watch cache holds these instead of the client's model objects (about 66 KB per pod);
only what eligibility and policy read is kept. Builders take the dict `json.loads` or
`orjson.loads` returns for one object and raise `RecordError` naming the field on bad input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import keys
from .quantity import QuantityError, cpu_milli, whole_units

APP, SIDECAR, INIT = "app", "sidecar", "init"
GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"


class RecordError(ValueError):
    """A Kubernetes object whose fields cannot be read; the message names object and field."""


@dataclass(slots=True, frozen=True)
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


@dataclass(slots=True, frozen=True)
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

    def same_inputs(self, other: Pod) -> bool:
        """Equal in everything eligibility and policy read (not version or our annotation)."""
        return replace(self, resource_version="", status_annotation=None) == replace(
            other, resource_version="", status_annotation=None
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


@dataclass(slots=True, frozen=True)
class Namespace:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _where(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    kind = obj.get("kind") or "object"
    ns = meta.get("namespace")
    return f"{kind}/{ns + '/' if ns else ''}{meta.get('name', '?')}"


def _cpu(obj: Mapping[str, Any], path: str, value: Any) -> int:
    try:
        return cpu_milli(value)
    except QuantityError as exc:
        raise RecordError(f"{_where(obj)}: {path}: {exc}") from None


def _bytes(obj: Mapping[str, Any], path: str, value: Any) -> int:
    try:
        return whole_units(value)
    except QuantityError as exc:
        raise RecordError(f"{_where(obj)}: {path}: {exc}") from None


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
    res = res or {}
    requests = res.get("requests") or {}
    limits = res.get("limits") or {}
    cpu_lim = _cpu(obj, f"{path}.limits.cpu", limits["cpu"]) if "cpu" in limits else None
    mem_lim = _bytes(obj, f"{path}.limits.memory", limits["memory"]) if "memory" in limits else None
    # The API server defaults a missing request to the limit; do the same for raw input.
    cpu_req = _cpu(obj, f"{path}.requests.cpu", requests["cpu"]) if "cpu" in requests else cpu_lim
    mem_req = _bytes(obj, f"{path}.requests.memory", requests["memory"]) if "memory" in requests else mem_lim
    return cpu_req, cpu_lim, mem_req, mem_lim


def _status_cpu(obj: Mapping[str, Any], statuses: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Largest CPU request the kubelet reports per container (allocated or actual)."""
    out: dict[str, int] = {}
    for i, st in enumerate(statuses):
        best = 0
        alloc = (st.get("allocatedResources") or {}).get("cpu")
        if alloc is not None:
            best = _cpu(obj, f"status.containerStatuses[{i}].allocatedResources.cpu", alloc)
        actual = ((st.get("resources") or {}).get("requests") or {}).get("cpu")
        if actual is not None:
            best = max(best, _cpu(obj, f"status.containerStatuses[{i}].resources.requests.cpu", actual))
        out[str(st.get("name"))] = best
    return out


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


def pod_from_dict(obj: Mapping[str, Any]) -> Pod:
    try:
        meta = obj["metadata"]
        spec = obj["spec"]
        name = meta["name"]
    except (KeyError, TypeError):
        raise RecordError(f"{_where(obj)}: metadata.name and spec are required") from None
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    in_status = _status_cpu(obj, status.get("containerStatuses") or ())
    in_status.update(_status_cpu(obj, status.get("initContainerStatuses") or ()))

    containers: list[Container] = []
    for group, items in (("initContainers", spec.get("initContainers")), ("containers", spec.get("containers"))):
        for i, c in enumerate(items or ()):
            path = f"spec.{group}[{i}]"
            kind = APP if group == "containers" else SIDECAR if c.get("restartPolicy") == "Always" else INIT
            cpu_req, cpu_lim, mem_req, mem_lim = _resources(obj, f"{path}.resources", c.get("resources"))
            restart = any(
                p.get("resourceName") == "cpu" and p.get("restartPolicy") == "RestartContainer"
                for p in c.get("resizePolicy") or ()
            )
            cname = str(c.get("name", f"#{i}"))
            req = cpu_req or 0
            containers.append(
                Container(cname, kind, req, cpu_lim, mem_req, mem_lim, max(req, in_status.get(cname, 0)), restart)
            )
    # App containers first keeps the order a resize patch lists them in.
    ordered = tuple(c for c in containers if c.kind == APP) + tuple(c for c in containers if c.kind != APP)

    pod_level = None
    pod_res = spec.get("resources")
    if pod_res and (pod_res.get("requests") or pod_res.get("limits")):
        pod_level = PodLevel(*_resources(obj, "spec.resources", pod_res))

    overhead = (spec.get("overhead") or {}).get("cpu")
    overhead_cpu = _cpu(obj, "spec.overhead.cpu", overhead) if overhead is not None else 0

    qos = status.get("qosClass")
    if qos not in (GUARANTEED, BURSTABLE, BEST_EFFORT):
        if pod_level is not None:
            qos = qos_class([(pod_level.cpu_request, pod_level.cpu_limit, pod_level.mem_request, pod_level.mem_limit)])
            if qos == BEST_EFFORT:
                qos = qos_class((c.cpu_request or None, c.cpu_limit, c.mem_request, c.mem_limit) for c in ordered)
        else:
            qos = qos_class((c.cpu_request or None, c.cpu_limit, c.mem_request, c.mem_limit) for c in ordered)

    if pod_level is not None and pod_level.cpu_request is not None:
        booked = pod_level.cpu_request
    else:
        booked = _booked(tuple(containers))

    owner_kind = None
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            owner_kind = ref.get("kind")
            break

    mode = labels.get(keys.MODE_KEY, annotations.get(keys.MODE_KEY))
    infeasible = any(
        c.get("type") == "PodResizePending" and c.get("status") == "True" and c.get("reason") == "Infeasible"
        for c in status.get("conditions") or ()
    )
    return Pod(
        namespace=str(meta.get("namespace") or "default"),
        name=str(name),
        uid=str(meta.get("uid") or ""),
        node_name=spec.get("nodeName") or None,
        phase=str(status.get("phase") or "Pending"),
        deleting=meta.get("deletionTimestamp") is not None,
        mirror="kubernetes.io/config.mirror" in annotations,
        labels=labels,
        mode=mode,
        max_cpu=annotations.get(keys.MAX_CPU_KEY),
        owner_kind=owner_kind,
        containers=ordered,
        overhead_cpu=overhead_cpu,
        pod_level=pod_level,
        qos=qos,
        booked_cpu=booked + overhead_cpu,
        resize_infeasible=infeasible,
        resource_version=str(meta.get("resourceVersion") or ""),
        status_annotation=annotations.get(keys.STATUS_KEY),
    )


def node_from_dict(obj: Mapping[str, Any]) -> Node:
    try:
        meta = obj["metadata"]
        name = meta["name"]
    except (KeyError, TypeError):
        raise RecordError(f"{_where(obj)}: metadata.name is required") from None
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    alloc = (status.get("allocatable") or {}).get("cpu")
    if alloc is None:
        alloc = (status.get("capacity") or {}).get("cpu", 0)
    os_name = labels.get("kubernetes.io/os") or (status.get("nodeInfo") or {}).get("operatingSystem")
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    return Node(
        name=str(name),
        labels=labels,
        allocatable_cpu=_cpu(obj, "status.allocatable.cpu", alloc),
        windows=os_name == "windows",
        ready=ready,
        declared_features=tuple(status.get("declaredFeatures") or ()),
    )


def namespace_from_dict(obj: Mapping[str, Any]) -> Namespace:
    meta = obj.get("metadata") or {}
    if "name" not in meta:
        raise RecordError(f"{_where(obj)}: metadata.name is required")
    return Namespace(str(meta["name"]), meta.get("labels") or {})
