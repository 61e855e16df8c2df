"""Pods that leave management: what their status annotation says, and the limits
`spec.release: Restore` gives back.

Before Headroom first writes a pod's CPU limit it records the limits the pod had, in the
annotation kube-headroom.dev/original-cpu-limits (the webhook records it at admission):
`{"<container>": "500m" | null, ...}`, or `{"(pod)": ...}` for the pod-level limit.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from . import eligibility as elig
from .policy import ContainerTarget, Managed, PodTarget
from .quantity import QuantityError, cpu_milli, format_milli
from .records import BURSTABLE, INIT, POD_LIMIT, Pod, qos_class

RESTORE = "Restore"  # spec.release; the other value, Keep, writes nothing
BOUND_RELEASED = "released"

# After these reasons the old limit may be written back: a person took the pod out of
# Headroom's hands. Not after a VPA or another writer took the limits over (they own them now), a resize that
# restarts the container, or a pod whose resize cannot succeed anyway.
RESTORABLE = frozenset(
    {
        elig.NAMESPACE_NOT_MANAGED,
        elig.NAMESPACE_EXCLUDED,
        elig.POD_OPTED_OUT,
        elig.POD_SELECTOR_EXCLUDED,
        elig.OWNER_KIND_EXCLUDED,
        elig.STATIC_CPU_MANAGER,
        elig.NODE_EXCLUDED,
        elig.ZERO_CPU_REQUEST,
    }
)
# Every reason that means the pod left management. Not among them: reasons that say nothing
# about the pod (no node, ending, a mirror pod), an unusable configuration or a paused pool
# (nothing is written there) and a backoff (it ends by itself).
LEFT = RESTORABLE | {
    elig.WINDOWS_NODE,
    elig.NOT_BURSTABLE,
    elig.RESTART_ON_RESIZE,
    elig.POD_LEVEL_UNSUPPORTED,
    elig.VPA_CONTROLS_LIMITS,
    elig.LIMIT_OWNED_BY_OTHER,
    elig.LIMIT_RANGE_CONFLICT,
    elig.INVALID_ANNOTATION,
}


def worth_recording(pod: Pod) -> bool:
    """Whether the pod has a CPU limit of its own a later Restore could give back. Not when
    Headroom has resized it before (the limit is Headroom's, not the original), and not when
    it has none: Kubernetes cannot remove a limit in place, so a pod without one needs no
    record and costs no write."""
    if pod.original_limits is not None or pod.resized_by_headroom:
        return False
    if pod.pod_level is not None and pod.pod_level.cpu_limit is not None:
        return True
    return any(c.cpu_limit is not None for c in pod.containers if c.kind != INIT)


def record(pod: Pod) -> str:
    """The annotation value recording the pod's CPU limits now (before a first write)."""
    out: dict[str, str | None] = {}
    if pod.pod_level is not None:
        out[POD_LIMIT] = None if pod.pod_level.cpu_limit is None else format_milli(pod.pod_level.cpu_limit)
    for c in pod.containers:
        if c.kind != INIT:
            out[c.name] = None if c.cpu_limit is None else format_milli(c.cpu_limit)
    return orjson.dumps(out).decode()


def recorded(pod: Pod) -> dict[str, int | None] | None:
    """The recorded limits in millicores; None when there is no usable record. The
    annotation is on the pod, so anyone who can edit the pod can edit it: whatever it
    holds, this returns."""
    raw = pod.original_limits
    if not isinstance(raw, str) or len(raw) > 16_384:
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    out: dict[str, int | None] = {}
    for name, value in data.items():
        if not isinstance(name, str):
            return None
        if value is None:
            out[name] = None
            continue
        try:
            out[name] = cpu_milli(value)
        except QuantityError:
            return None
    return out


def restore_target(pod: Pod) -> tuple[PodTarget | None, str]:
    """The resize that gives the pod its recorded limits back, or None and why not (an
    empty reason: nothing to do, the pod already has them)."""
    rec = recorded(pod)
    if rec is None:
        return None, (
            "no record of a limit it had before Headroom (kube-headroom.dev/original-cpu-limits): it had none, "
            "which Kubernetes cannot restore (it cannot remove a limit in place), or Headroom first resized it "
            "while spec.release was Keep (records are taken only under Restore) or before records were kept"
        )
    if pod.pod_level is not None and POD_LIMIT in rec:
        before = rec[POD_LIMIT]
        if before is None:
            return None, "it had no pod-level CPU limit before Headroom, and Kubernetes cannot remove one in place"
        if before < (pod.pod_level.cpu_request or 0):
            return None, f"its old limit {format_milli(before)} is below its request now"
        if pod.pod_level.cpu_limit == before:
            return None, ""
        pl = pod.pod_level
        if before == pl.cpu_request and pl.mem_request is not None and pl.mem_request == pl.mem_limit:
            # cpu and memory pinned at the pod level would make the pod Guaranteed
            return None, "the old pod-level limit would change the pod's QoS class"
        m = Managed(pod, ())
        return PodTarget(m, m.request, before, BOUND_RELEASED, (), pod.pod_level.cpu_limit, True), ""
    return container_limits_target(
        pod,
        rec,
        "old limit",
        "it had no CPU limit before Headroom, and Kubernetes cannot remove one in place",
        BOUND_RELEASED,
    )


def container_limits_target(
    pod: Pod, limits: Mapping[str, int | None], what: str, none: str, bound: str
) -> tuple[PodTarget | None, str]:
    """The resize that gives the named containers these CPU limits (None: no limit), or
    None and why not (empty: they have them already): Kubernetes cannot remove a limit in
    place (`none` says so), a limit never goes below a request, and the pod stays
    Burstable. `what` names the limits in the reasons (e.g. "old limit"). Restore and the
    write-back of what a kubelet applied both build their resize here."""
    targets = []
    new: dict[str, int | None] = {}
    for c in pod.containers:
        if c.kind == INIT or c.name not in limits:
            new[c.name] = c.cpu_limit
            continue
        before = limits[c.name]
        if before is None:
            if c.cpu_limit is not None:
                return None, none
            continue
        if before < c.cpu_request:
            return None, f"the {what} of container {c.name} ({format_milli(before)}) is below its request now"
        new[c.name] = before
        if c.cpu_limit != before:
            targets.append(ContainerTarget(c.name, c.cpu_request, c.cpu_limit, before, True))
    if not targets:
        return None, ""
    after = [(c.cpu_request or None, new.get(c.name), c.mem_request, c.mem_limit) for c in pod.containers]
    if qos_class(after) != BURSTABLE:
        return None, f"the {what}s would change the pod's QoS class"
    m = Managed(pod, tuple(c for c in pod.containers if c.kind != INIT and c.name in new))
    total = sum(t.target for t in targets)
    return PodTarget(m, m.request, total, bound, tuple(targets), None, True), ""


def current_limit(pod: Pod, written: PodTarget | None = None) -> int | None:
    """The pod's CPU limit now (after `written`, when given): the pod-level one, else the
    sum of its containers' (None when an app container or sidecar has none)."""
    if written is not None and written.pod_level:
        return written.target
    if pod.pod_level is not None and pod.pod_level.cpu_limit is not None:
        return pod.pod_level.cpu_limit
    new: Mapping[str, int] = {c.name: c.target for c in written.containers} if written is not None else {}
    limits = [new.get(c.name, c.cpu_limit) for c in pod.containers if c.kind != INIT]
    if not limits or any(v is None for v in limits):
        return None
    return sum(v or 0 for v in limits)
