"""What the webhook changes on a new pod: pure, the controller's own rules.

The webhook writes before the controller can decide, and what it writes cannot be undone
(Kubernetes refuses to remove a CPU limit in place), so it fails closed. It decides with
the pod's *candidate nodes*: `spec.nodeName` when set; else every known node that
satisfies the pod's `nodeSelector` and its required node affinity. It mutates only if the
controller would manage the pod on every candidate (the same eligibility function, each
node's own resolved settings), and nothing when the candidates are unknown, none, or the
pod cannot be read. Taints are not read: the set can only be larger than the scheduler's,
which can only mean fewer mutations.

For each container with a CPU request and no CPU limit (app containers and sidecars, not
excluded by name): `limit = request × initialMultiplier`, the smallest multiplier the
candidates give, capped by their `maxMultiplier`, their allocatable CPU and the pod's
`kube-headroom.dev/max-cpu` (shared out by request, as the controller splits a pod's
total), on the 10m quantum, never below the request; then the QoS guard. A pod with
pod-level resources gets only a pod-level CPU limit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
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
from ..core.planner import user_cap
from ..core.policy import QUANTUM
from ..core.quantity import format_milli
from ..core.records import GUARANTEED, Namespace, Node, Pod, RecordError, pod_from_dict, qos_class

UNSCHEDULED = "(not yet scheduled)"


# Requirement-value checks one decision may make while matching the pod's required node
# affinity against the cached nodes: about 0.1 s of CPU on this project's 2-core test machine
# (tests/integration/test_webhook_live.py::test_one_costly_review_holds_no_other holds the
# costly case). An ordinary pod (a few terms of a few values) on 5,000 nodes costs well
# under a tenth of it.
PLACEMENT_BUDGET = 150_000


class Unreadable(ValueError):
    """A part of the pod's placement the webhook cannot read: it then mutates nothing."""


class PlacementTooCostly(Unreadable):
    """The pod's required node affinity would cost more than PLACEMENT_BUDGET to match:
    no limit at admission (the controller sets one once the pod is bound)."""

    def __init__(self, nodes: int, per_node: int) -> None:
        super().__init__(
            f"matching its required node affinity against {nodes} nodes would take more than "
            f"{PLACEMENT_BUDGET} checks (more than {per_node} a node)"
        )


def _int(value: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise Unreadable(f"not an integer: {value!r}") from exc


def _requirement(expr: Any, field: bool) -> tuple[str, str, tuple[str, ...]]:
    """One NodeSelectorRequirement, checked the way the API server validates it."""
    if not isinstance(expr, Mapping):
        raise Unreadable("a node selector requirement is not an object")
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
    if not isinstance(key, str) or not key or not isinstance(values, list | tuple):
        raise Unreadable("a node selector requirement has no usable key or values")
    if not all(isinstance(v, str) for v in values):
        raise Unreadable("node selector values must be strings")
    if field:  # matchFields: only metadata.name, In or NotIn with one value
        if key != "metadata.name" or op not in ("In", "NotIn") or len(values) != 1:
            raise Unreadable(f"matchFields {key} {op} is not one the scheduler supports")
    elif op in ("In", "NotIn"):
        if not values:
            raise Unreadable(f"{op} needs values")
    elif op in ("Exists", "DoesNotExist"):
        if values:
            raise Unreadable(f"{op} takes no values")
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            raise Unreadable(f"{op} takes one value")
        _int(values[0])
    else:
        raise Unreadable(f"unknown operator {op!r}")
    return key, op, tuple(values)


def _matches(req: tuple[str, str, tuple[str, ...]], labels: Mapping[str, str]) -> bool:
    key, op, values = req
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    have = labels.get(key)
    if have is None:
        return False
    try:
        n = int(have)
    except ValueError:
        return False
    return n > int(values[0]) if op == "Gt" else n < int(values[0])


def _terms(spec: Mapping[str, Any], nodes: int, budget: int) -> list[tuple[list[Any], list[Any]]] | None:
    """The required node affinity's terms as (expressions, fields); None when there are none.
    Raises PlacementTooCostly as soon as matching what has been read against `nodes` nodes
    would pass `budget` checks (a term, each requirement, each value an In/NotIn scans):
    the reading stops there too."""
    affinity = spec.get("affinity")
    if affinity is None:
        return None
    if not isinstance(affinity, Mapping):
        raise Unreadable("spec.affinity is not an object")
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return None
    if not isinstance(node_affinity, Mapping):
        raise Unreadable("spec.affinity.nodeAffinity is not an object")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    if not isinstance(required, Mapping) or not isinstance(required.get("nodeSelectorTerms"), list):
        raise Unreadable("requiredDuringSchedulingIgnoredDuringExecution has no nodeSelectorTerms list")
    out = []
    per_node, cost = budget // max(nodes, 1), 0
    for term in required["nodeSelectorTerms"]:
        if not isinstance(term, Mapping):
            raise Unreadable("a nodeSelectorTerm is not an object")
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not isinstance(exprs, list) or not isinstance(fields, list):
            raise Unreadable("matchExpressions and matchFields must be lists")
        # matchFields cost what expressions cost: each is a requirement matched on every node.
        cost += 1 + 2 * (len(exprs) + len(fields))
        if cost <= per_node:  # the values, where they are lists: read before they are checked
            cost += sum(
                len(v) for e in (*exprs, *fields) if isinstance(e, Mapping) and isinstance(v := e.get("values"), list)
            )
        if cost > per_node:
            raise PlacementTooCostly(nodes, per_node)
        out.append(([_requirement(e, False) for e in exprs], [_requirement(f, True) for f in fields]))
    return out


def candidate_nodes(spec: Mapping[str, Any], nodes: Mapping[str, Node], budget: int = PLACEMENT_BUDGET) -> list[Node]:
    """The known nodes the pod can be placed on, by name, nodeSelector and required node
    affinity (terms ORed; a term with no requirement matches nothing, as in Kubernetes).
    Raises Unreadable for a placement the scheduler could not read either, and
    PlacementTooCostly when matching the affinity would exceed `budget` checks."""
    name = spec.get("nodeName")
    if name:
        if not isinstance(name, str):
            raise Unreadable("spec.nodeName is not a string")
        node = nodes.get(name)
        return [] if node is None else [node]
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise Unreadable("spec.nodeSelector is not a map of strings")
    # The nodeSelector first: a node is rejected at its first mismatching label, so this
    # costs at most the node's own labels. The affinity is then read against a known count.
    selected = [n for n in nodes.values() if not any(n.labels.get(k) != v for k, v in selector.items())]
    terms = _terms(spec, len(selected), budget)
    if terms is None:
        return selected
    out = []
    for node in selected:
        labels = node.labels
        if not any(
            (exprs or fields)
            and all(_matches(r, labels) for r in exprs)
            and all(_matches(r, {"metadata.name": node.name}) for r in fields)
            for exprs, fields in terms
        ):
            continue
        out.append(node)
    return out


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


def _multiplier(settings: Sequence[Settings]) -> Fraction:
    """The smallest initial multiplier the candidates give, within their maxMultiplier."""
    mult = min(s.initial_multiplier for s in settings)
    caps = [s.max_multiplier for s in settings if s.max_multiplier]
    return min([mult, *caps])


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

    `nodes` is the controller's node cache (None: not synced, so no mutation);
    `pod_level_resize` the controller's own answer, per node, to whether a pod-level limit
    can be resized there (by default no: a pod-level pod then gets nothing it could never
    shed). Raises PlacementTooCostly (the caller counts and logs it) when the pod's
    affinity is too costly to match. The pod
    gets a limit only if the controller would manage it on every candidate node: the same
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
    if allocatable > 0:
        cap = allocatable if cap is None else min(cap, allocatable)
    # A container a candidate's pool excludes by name gets no limit from any of them.
    skip = frozenset().union(*(s.exclusions.containers for s in every))
    settings = replace(every[0], exclusions=replace(every[0].exclusions, containers=skip))
    ops, limits, pod_limit = _limit_ops(record, spec, settings, _multiplier(every), cap)
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


def _limit(request: int, mult: Fraction, share: int | None) -> int:
    """One limit: request × mult, or the request's share of a capped total when smaller."""
    limit = request * mult.numerator // mult.denominator
    if share is not None:
        limit = min(limit, share)
    return max(request, limit // QUANTUM * QUANTUM, QUANTUM)


def _limit_ops(
    record: Pod, spec: Mapping[str, Any], settings: Settings, mult: Fraction, cap: int | None
) -> tuple[list[dict[str, Any]], dict[str, int], int | None]:
    """The limit operations, the container limits they set and the pod-level one. `cap`
    bounds the pod's total (the smallest allocatable, the max-cpu annotation)."""

    pl = record.pod_level
    if pl is not None:
        if not pl.cpu_request or pl.cpu_limit is not None:
            return [], {}, None
        limit = max([_limit(pl.cpu_request, mult, cap)] + [c.cpu_limit or 0 for c in record.containers])
        if pl.mem_request is not None and pl.mem_request == pl.mem_limit:
            limit = max(limit, pl.cpu_request + QUANTUM)
        has_limits = bool((spec.get("resources") or {}).get("limits"))
        path, value = (
            ("/spec/resources/limits/cpu", format_milli(limit))
            if has_limits
            else ("/spec/resources/limits", {"cpu": format_milli(limit)})
        )
        return [{"op": "add", "path": path, "value": value}], {}, limit

    computed = computed_containers(record, settings)
    total = sum(c.cpu_request for c in computed)
    new: dict[str, int] = {}
    for c in computed:
        if c.cpu_limit is None:
            new[c.name] = _limit(c.cpu_request, mult, None if cap is None else c.cpu_request * cap // total)
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
