"""What the webhook changes on a new pod: pure, the controller's own rules.

The webhook writes before the controller can decide, and what it writes cannot be undone
(Kubernetes refuses to remove a CPU limit in place), so it fails closed. It decides with
the pod's *candidate nodes*: `spec.nodeName` when set; else every known node that
satisfies the pod's `nodeSelector` and its required node affinity. It mutates only if the
controller would manage the pod on every candidate (the same eligibility function, each
node's own resolved settings), and nothing when the candidates are unknown, none, or the
pod cannot be read. Taints are not read: the set can only be larger than the scheduler's,
which can only mean fewer mutations.

Where the pod can land is core/placement.py; the limit is the policy's initial target
(core/policy.py `initial_target`): for the containers with a CPU request and no CPU limit
(app containers and sidecars, not excluded by name), their requests times the smallest
`initialMultiplier` the candidates give, capped by their `maxMultiplier`, their smallest
allocatable CPU and the pod's `kube-headroom.dev/max-cpu`, on the 10m quantum, split over
those containers by request as the controller splits a total, with the QoS guard. A
container that already has a CPU limit keeps it. A pod with pod-level resources gets only
a pod-level CPU limit, never below the pod-level floor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..core import keys, release
from ..core.eligibility import (
    MANAGED,
    NODE_EXCLUDED,
    STATIC_CPU_MANAGER,
    WINDOWS_NODE,
    computed_containers,
    eligibility,
    node_excluded,
)
from ..core.limitrange import limit_range_refusal
from ..core.neighbours import EMPTY, Neighbours
from ..core.params import Resolver, Settings
from ..core.placement import PlacementTooCostly, Unreadable, candidate_nodes
from ..core.planner import user_cap
from ..core.policy import Managed, initial_target
from ..core.quantity import format_milli
from ..core.records import Namespace, Node, Pod, RecordError, pod_from_dict

UNSCHEDULED = "(not yet scheduled)"


# What the cheap checks decide with, before any node is looked at: a node with no labels
# that is not Windows (what a selector says of it is left to placement, `_NODE_REASONS`).
_ANY_NODE = Node(name=UNSCHEDULED, labels={}, allocatable_cpu=0, windows=False, ready=True)


# What a real node decides, not the pod: left to placement, with each candidate's labels.
_NODE_REASONS = frozenset({STATIC_CPU_MANAGER, NODE_EXCLUDED, WINDOWS_NODE})


def _could_manage(record: Pod, namespace: Namespace | None, resolver: Resolver, vpa: bool) -> bool:
    """Whether any of the configuration's settings (the global ones, each pool's) could
    manage this pod on some node: the checks that read only the pod, its namespace and the
    settings. False means no candidate node can change the answer."""
    for settings in resolver.every():
        if settings.dry_run or settings.blocked is not None:
            continue
        reason = eligibility(record, namespace, _ANY_NODE, settings, pod_level_resize=True, vpa=vpa)
        if reason == MANAGED or reason in _NODE_REASONS:
            return True
    return False


def node_settings(node: Node, resolver: Resolver) -> tuple[Settings, bool]:
    """A node's settings, and whether its labels exclude it (a node exclusion, or the
    static CPU manager)."""
    settings = resolver.settings_for(node.labels)
    static = settings.static_cpu_manager is not None and settings.static_cpu_manager.matches(node.labels)
    return settings, static or node_excluded(node.labels, settings)


class _NodeSettings:
    """Each node's settings and whether its labels exclude it (a node exclusion or the
    static CPU manager), kept per resolver and per node record: profiles' selectors are
    matched once per node and configuration, not once per decision (at 5,000 nodes and
    100 profiles that was 0.4 s a decision). A node's entry is invalid once its record is
    replaced (its labels changed); the whole cache once the configuration is."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.resolver: Resolver | None = None
        self.nodes: dict[str, tuple[Node, Settings, bool]] = {}

    def of(self, node: Node, resolver: Resolver) -> tuple[Settings, bool]:
        if resolver is not self.resolver:
            with self.lock:
                if resolver is not self.resolver:
                    self.resolver, self.nodes = resolver, {}
        nodes = self.nodes
        hit = nodes.get(node.name)
        if hit is not None and hit[0] is node:
            return hit[1], hit[2]
        settings, excluded = node_settings(node, resolver)
        nodes[node.name] = (node, settings, excluded)
        return settings, excluded


_node_settings = _NodeSettings()


def _node_kinds(
    candidates: Iterable[Node], resolver: Resolver, pod_level_resize: Callable[[Node], bool]
) -> dict[tuple[int, bool, bool, bool], tuple[Node, Settings]]:
    """One representative candidate per distinct (settings, what eligibility reads of a
    node): eligibility is decided once per kind of node, not once per node."""
    kinds: dict[tuple[int, bool, bool, bool], tuple[Node, Settings]] = {}
    for node in candidates:
        settings, excluded = _node_settings.of(node, resolver)
        key = (id(settings), excluded, node.windows, pod_level_resize(node))
        if key not in kinds:
            kinds[key] = (node, settings)
    return kinds


def strictest(every: Sequence[Settings]) -> Settings:
    """The settings a new pod gets on whichever candidate it lands: the smallest initial
    multiplier and maxMultiplier the candidates give, and every container name any of them
    excludes (a container one pool excludes gets a limit from none of them)."""
    first = every[0]
    caps = [s.max_multiplier for s in every if s.max_multiplier]
    return replace(
        first,
        initial_multiplier=min(s.initial_multiplier for s in every),
        max_multiplier=min(caps) if caps else first.max_multiplier,
        exclusions=replace(first.exclusions, containers=frozenset().union(*(s.exclusions.containers for s in every))),
    )


def no_pod_level(node: Node) -> bool:
    return False


def patch_for(
    pod: Mapping[str, Any],
    namespace: Namespace | None,
    resolver: Resolver,
    neighbours: Neighbours = EMPTY,
    nodes: Mapping[str, Node] | None = None,
    pod_level_resize: Callable[[Node], bool] = no_pod_level,
) -> list[dict[str, Any]]:
    """JSONPatch operations for a pod being created; [] when nothing applies.

    `nodes` is the process's node cache (None: not synced, so no mutation);
    `pod_level_resize` its inputs' answer, per node, to whether a pod-level limit can be
    resized there (the reconciler's own; by default no: a pod-level pod then gets nothing
    it could never shed). Raises PlacementTooCostly (the caller counts and logs it) when
    the pod's affinity is too costly to match. The pod gets a limit only if the controller would manage it on every candidate node: the same
    eligibility function decides per node with that node's settings (dry-run, paused and
    blocked configurations mutate nothing), and the namespace's VerticalPodAutoscalers.
    Limits the namespace's LimitRanges would refuse are not set (the pod is admitted as
    written; the controller sets a limit they admit). With the limits goes the record of
    the ones the pod was created with (kube-headroom.dev/original-cpu-limits)."""
    if nodes is None:
        return []
    spec = pod.get("spec")
    meta = pod.get("metadata") or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        return []
    try:
        record = pod_from_dict({**pod, "metadata": {"name": "new", **meta}, "spec": {**spec, "nodeName": UNSCHEDULED}})
    except RecordError:
        return []  # the API server will report the bad quantity itself
    vpa = neighbours.vpa_controlling(record) is not None
    if not _could_manage(record, namespace, resolver, vpa):
        return []
    try:
        candidates = candidate_nodes(spec, nodes)
    except PlacementTooCostly:
        raise
    except Unreadable:
        return []
    if not candidates:
        return []
    kinds = _node_kinds(candidates, resolver, pod_level_resize)
    for node, settings in kinds.values():
        if settings.dry_run or settings.blocked is not None:
            return []
        if eligibility(record, namespace, node, settings, pod_level_resize=pod_level_resize(node), vpa=vpa) != MANAGED:
            return []
    cap, problem = user_cap(record)
    if problem is not None:
        return []  # the controller leaves such a pod alone (InvalidAnnotation); so does the webhook
    every = [s for _, s in kinds.values()]
    allocatable = min(n.allocatable_cpu for n in candidates)
    settings = strictest(every)
    ops, limits, pod_limit = _limit_ops(record, spec, settings, cap, allocatable if allocatable > 0 else None)
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
    record: Pod, spec: Mapping[str, Any], settings: Settings, cap: int | None, allocatable: int | None
) -> tuple[list[dict[str, Any]], dict[str, int], int | None]:
    """The limit operations, the container limits they set and the pod-level one: the
    policy's initial target (core/policy.py) for the containers that have no CPU limit yet
    (or the pod-level limit), within the max-cpu annotation's `cap`, written where the
    pod's spec has them."""
    pl = record.pod_level
    if pl is not None:
        if not pl.cpu_request or pl.cpu_limit is not None:
            return [], {}, None
        limit = initial_target(Managed(record, (), cap), allocatable, settings).target
        has_limits = bool((spec.get("resources") or {}).get("limits"))
        path, value = (
            ("/spec/resources/limits/cpu", format_milli(limit))
            if has_limits
            else ("/spec/resources/limits", {"cpu": format_milli(limit)})
        )
        return [{"op": "add", "path": path, "value": value}], {}, limit

    unlimited = tuple(c for c in computed_containers(record, settings) if c.cpu_limit is None)
    if not unlimited:
        return [], {}, None
    target = initial_target(Managed(record, unlimited, cap), allocatable, settings)
    new = {c.name: c.target for c in target.containers}
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
