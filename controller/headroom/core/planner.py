"""Eligibility and policy over a whole cluster state: what every pod's limit should be.

`headroom plan` and `explain` print this; the reconciler applies `plan_node` to one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from . import eligibility as elig
from . import keys
from .capabilities import node_allows_pod_level_resize
from .params import Resolver, Settings
from .policy import Managed, NodeSummary, PodTarget, compute_node
from .quantity import QuantityError, cpu_milli
from .records import Namespace, Node, Pod


@dataclass(slots=True)
class PodPlan:
    pod: Pod
    reason: str
    target: PodTarget | None = None
    warning: str | None = None  # e.g. an unparseable max-cpu annotation: the pod is left alone

    @property
    def managed(self) -> bool:
        return self.target is not None


@dataclass(slots=True, frozen=True)
class NodePlan:
    node: Node
    settings: Settings
    summary: NodeSummary
    pods: tuple[PodPlan, ...]


@dataclass(slots=True)
class ClusterPlan:
    nodes: list[NodePlan] = field(default_factory=list)
    unbound: list[PodPlan] = field(default_factory=list)  # no node, or a node we do not know

    def all_pods(self) -> Iterable[PodPlan]:
        for n in self.nodes:
            yield from n.pods
        yield from self.unbound


_BY_KEY = attrgetter("namespace", "name")


def user_cap(pod: Pod) -> tuple[int | None, str | None]:
    """The pod's max-cpu annotation in millicores, or why it cannot be used. A tenant's
    annotation is untrusted input: whatever it holds, this returns instead of raising."""
    if pod.max_cpu is None:
        return None, None
    fix = "set a CPU quantity above 0 such as '2' or '1500m', or remove it"
    try:
        cap = cpu_milli(pod.max_cpu)
    except QuantityError as exc:
        return None, f"annotation {keys.MAX_CPU_KEY} is unusable, so the pod is left alone: {exc}; {fix}"
    if cap <= 0:
        return (
            None,
            f"annotation {keys.MAX_CPU_KEY} is unusable, so the pod is left alone: {str(pod.max_cpu)[:64]!r} is not above 0; {fix}",
        )
    return cap, None


def plan_node(
    node: Node,
    pods: Iterable[Pod],
    namespaces: Mapping[str, Namespace],
    settings: Settings,
    *,
    pod_level_resize: bool,
    backing_off: frozenset[str] = frozenset(),
) -> NodePlan:
    pods = sorted(pods, key=_BY_KEY)
    reasons: list[tuple[Pod, str, str | None]] = []
    managed: list[Managed] = []
    for p in pods:
        reason = elig.eligibility(
            p,
            namespaces.get(p.namespace),
            node,
            settings,
            pod_level_resize=pod_level_resize,
            backing_off=p.key in backing_off,
        )
        warning = None
        if reason == elig.MANAGED:
            cap, warning = user_cap(p)
            if warning is None:
                managed.append(Managed(p, elig.computed_containers(p, settings), cap))
            else:
                reason = elig.INVALID_ANNOTATION
        reasons.append((p, reason, warning))
    summary, targets = compute_node(node.allocatable_cpu, pods, managed, settings)
    by_key = {t.managed.pod.key: t for t in targets}
    plans = tuple(PodPlan(p, r, by_key.get(p.key), w) for p, r, w in reasons)
    return NodePlan(node, settings, summary, plans)


def plan_cluster(
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    namespaces: Mapping[str, Namespace],
    resolver: Resolver,
    *,
    pod_level_resize: bool,
    backing_off: frozenset[str] = frozenset(),
) -> ClusterPlan:
    """Every node's plan. `pod_level_resize` is the cluster-wide capability; each node
    also has to declare the feature itself (`node_allows_pod_level_resize`), as in `run`."""
    by_node: dict[str, list[Pod]] = {}
    node_map = {n.name: n for n in nodes}
    out = ClusterPlan()
    for p in pods:
        if p.node_name and p.node_name in node_map:
            by_node.setdefault(p.node_name, []).append(p)
        else:
            out.unbound.append(PodPlan(p, elig.NOT_BOUND))
    for name in sorted(node_map):
        node = node_map[name]
        out.nodes.append(
            plan_node(
                node,
                by_node.get(name, ()),
                namespaces,
                resolver.for_labels(node.labels),
                # The controller's own per-node rule, so `plan` and `run` agree pod by pod.
                pod_level_resize=node_allows_pod_level_resize(node, pod_level_resize),
                backing_off=backing_off,
            )
        )
    return out
