"""What the webhook changes on a new pod: pure, the same arithmetic as the controller.

For each container with a CPU request and no CPU limit (app containers and sidecars, not
excluded by name): `limit = request × initialMultiplier`, on the 10m quantum, never below
the request; then the QoS guard. A pod with pod-level resources gets only a pod-level
CPU limit. The multiplier comes from the profile whose nodeSelector the pod's own
`spec.nodeSelector` satisfies, else from the HeadroomConfig — the node is not known yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core import keys, release
from ..core.eligibility import MANAGED, eligibility
from ..core.neighbours import EMPTY, Neighbours, limit_range_refusal
from ..core.params import Resolver, Settings
from ..core.policy import QUANTUM
from ..core.quantity import format_milli
from ..core.records import GUARANTEED, INIT, Namespace, Node, Pod, RecordError, pod_from_dict, qos_class


def _limit(request: int, multiplier_num: int, multiplier_den: int) -> int:
    return max(request, request * multiplier_num // multiplier_den // QUANTUM * QUANTUM, QUANTUM)


UNSCHEDULED = "(not yet scheduled)"


def patch_for(
    pod: Mapping[str, Any], namespace: Namespace | None, resolver: Resolver, neighbours: Neighbours = EMPTY
) -> list[dict[str, Any]]:
    """JSONPatch operations for a pod being created; [] when nothing applies.

    The pod gets a limit only if the controller would manage it: the same eligibility
    function decides, with the node the pod asks for standing in for the one it will get
    (its `nodeSelector` for profiles and node exclusions, `spec.os.name` for Windows), and
    the namespace's VerticalPodAutoscalers. Limits the namespace's LimitRanges would refuse
    are not set (the pod is admitted as written; the controller sets a limit they admit).
    Dry-run, paused and unusable configurations mutate nothing. With the limits goes the
    record of the ones the pod was created with (kube-headroom.dev/original-cpu-limits)."""
    spec = pod.get("spec")
    meta = pod.get("metadata") or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        return []
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping) or not all(isinstance(v, str) for v in selector.values()):
        return []
    settings = resolver.for_labels(selector)
    if settings.dry_run:
        return []
    os_spec = spec.get("os")
    windows = isinstance(os_spec, Mapping) and os_spec.get("name") == "windows"
    node = Node(name=UNSCHEDULED, labels=selector, allocatable_cpu=0, windows=windows, ready=True)
    try:
        record = pod_from_dict({**pod, "metadata": {"name": "new", **meta}, "spec": {**spec, "nodeName": UNSCHEDULED}})
    except RecordError:
        return []  # the API server will report the bad quantity itself
    vpa = neighbours.vpa_controlling(record) is not None
    if eligibility(record, namespace, node, settings, pod_level_resize=True, vpa=vpa) != MANAGED:
        return []
    ops, limits, pod_limit = _limit_ops(record, spec, settings)
    ranges = neighbours.limit_ranges.get(record.namespace)
    if ops and ranges and limit_range_refusal(record, ranges, limits, pod_limit) is not None:
        ops = []
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and keys.ORIGINAL_KEY in annotations:
        return ops
    path = "/metadata/annotations/" + keys.ORIGINAL_KEY.replace("~", "~0").replace("/", "~1")
    value = release.record(record)
    if isinstance(annotations, Mapping):
        return [*ops, {"op": "add", "path": path, "value": value}]
    return [*ops, {"op": "add", "path": "/metadata/annotations", "value": {keys.ORIGINAL_KEY: value}}]


def _limit_ops(
    record: Pod, spec: Mapping[str, Any], settings: Settings
) -> tuple[list[dict[str, Any]], dict[str, int], int | None]:
    """The limit operations, the container limits they set and the pod-level one."""
    ex = settings.exclusions
    mult = settings.initial_multiplier
    num, den = mult.numerator, mult.denominator

    pl = record.pod_level
    if pl is not None:
        if not pl.cpu_request or pl.cpu_limit is not None:
            return [], {}, None
        limit = max([_limit(pl.cpu_request, num, den)] + [c.cpu_limit or 0 for c in record.containers])
        if pl.mem_request is not None and pl.mem_request == pl.mem_limit:
            limit = max(limit, pl.cpu_request + QUANTUM)
        has_limits = bool((spec.get("resources") or {}).get("limits"))
        path, value = (
            ("/spec/resources/limits/cpu", format_milli(limit))
            if has_limits
            else ("/spec/resources/limits", {"cpu": format_milli(limit)})
        )
        return [{"op": "add", "path": path, "value": value}], {}, limit

    new: dict[str, int] = {}
    for c in record.containers:
        if c.kind != INIT and c.cpu_request > 0 and c.cpu_limit is None and c.name not in ex.containers:
            new[c.name] = _limit(c.cpu_request, num, den)
    if not new:
        return [], {}, None
    after = [
        (c.cpu_request or None, new.get(c.name, c.cpu_limit), c.mem_request, c.mem_limit) for c in record.containers
    ]
    if qos_class(after) == GUARANTEED:
        largest = max(new, key=lambda n: (new[n], n))
        new[largest] += QUANTUM
    ops = []
    for group, kind_ok in (("containers", True), ("initContainers", False)):
        for i, c in enumerate(spec.get(group) or ()):
            name = c.get("name")
            if name not in new or (not kind_ok and c.get("restartPolicy") != "Always"):
                continue
            has_limits = bool((c.get("resources") or {}).get("limits"))
            base = f"/spec/{group}/{i}/resources/limits"
            value = format_milli(new[name])
            ops.append(
                {"op": "add", "path": f"{base}/cpu", "value": value}
                if has_limits
                else {"op": "add", "path": base, "value": {"cpu": value}}
            )
    return ops, new, None
