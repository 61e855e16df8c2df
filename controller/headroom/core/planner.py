"""Eligibility and policy over a whole cluster state: what every pod's limit should be.

`headroom plan` and `explain` print this; the reconciler applies `plan_node` to one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter

import orjson

from . import eligibility as elig
from . import keys
from .capabilities import node_allows_pod_level_resize
from .limitrange import limit_range_cap, limit_range_refusal
from .neighbours import ANY, EMPTY, Neighbours
from .params import Resolver, Settings
from .policy import Managed, NodeSummary, PodTarget, compute_node, fit_room, limit_delta, write_order
from .quantity import QuantityError, cpu_milli
from .quota import QuotaBudget, pod_limits_cpu
from .records import Namespace, Node, Pod
from .tenancy import tenant_name


@dataclass(slots=True)
class PodPlan:
    pod: Pod
    reason: str
    target: PodTarget | None = None
    warning: str | None = None  # e.g. an unparseable max-cpu annotation: the pod is left alone
    writer: str | None = None  # LimitOwnedByOther: the field manager its CPU limit is left to
    tenant: str | None = None  # its tenant, where the configuration names tenants (core.tenancy)

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


_NONE_LEFT: Mapping[str, str] = {}


def left_to_message(manager: str) -> str:
    """What explain and the pod's Warning event say of a limit left to another writer."""
    return (
        f"field manager {manager!r} keeps writing this pod's CPU limit, so Headroom leaves it to {manager!r} "
        f"and counts the pod as unmanaged; to hand it back, stop that writer, or set the annotation "
        f"{keys.RECLAIM_KEY} to a new value"
    )


def left_by_annotation(pod: Pod, settings: Settings) -> str | None:
    """The field manager the pod's status annotation says its CPU limit was left to, while
    that manager still owns one of its computed limits and the pod's reclaim annotation is
    the one it was left with: how `plan`, and a controller that restarted, know what the
    controller decided. None otherwise (and for anything unreadable)."""
    try:
        data = orjson.loads(pod.status_annotation or "null")
    except orjson.JSONDecodeError:
        return None
    if (
        not isinstance(data, dict)
        or data.get("managed") is not False
        or data.get("reason") != elig.LIMIT_OWNED_BY_OTHER
    ):
        return None
    writer = data.get("writer")
    if not isinstance(writer, str) or writer not in elig.limit_writers(pod, settings):
        return None
    return writer if data.get("reclaim") == pod.reclaim else None


def plan_node(
    node: Node,
    pods: Iterable[Pod],
    namespaces: Mapping[str, Namespace],
    settings: Settings,
    *,
    pod_level_resize: bool,
    backing_off: frozenset[str] = frozenset(),
    neighbours: Neighbours = EMPTY,
    left_to: Mapping[str, str] = _NONE_LEFT,
) -> NodePlan:
    """Every pod's reason and target on one node. `left_to`: pods whose CPU limit Headroom
    leaves to another field manager (pod key -> manager; decided by the controller)."""
    pods = sorted(pods, key=_BY_KEY)
    reasons: list[tuple[Pod, str, str | None, str | None, str | None]] = []
    managed: list[Managed] = []
    any_vpa, any_range = bool(neighbours.vpas), bool(neighbours.limit_ranges)  # most clusters: neither
    tenancy = settings.tenancy
    tenants = tenancy.label is not None or not tenancy.neutral  # most clusters: no tenants to name
    for p in pods:
        vpa = neighbours.vpa_controlling(p) if any_vpa else None
        writer = (left_to.get(p.key) if left_to else None) or (
            left_by_annotation(p, settings) if p.limit_writers else None
        )
        reason = elig.eligibility(
            p,
            namespaces.get(p.namespace),
            node,
            settings,
            pod_level_resize=pod_level_resize,
            backing_off=p.key in backing_off,
            vpa=vpa is not None,
            left_to_other=writer is not None,
        )
        warning = None
        tenant = tenant_name(p.namespace, namespaces.get(p.namespace), tenancy.label) if tenants else None
        if reason == elig.LIMIT_OWNED_BY_OTHER:
            warning = left_to_message(writer or "")
        if vpa is not None:
            warning = (
                f"VerticalPodAutoscaler {vpa.namespace}/{vpa.name} cannot be read, so it may own any pod of its "
                "namespace: Headroom leaves their limits alone until it is fixed"
                if vpa.target_kind == ANY
                else f"VerticalPodAutoscaler {vpa.namespace}/{vpa.name} sets this pod's CPU limits; Headroom leaves them to it"
            )
        if reason == elig.MANAGED:
            cap, warning = user_cap(p)
            if warning is None:
                computed = elig.computed_containers(p, settings)
                m = Managed(p, computed, cap, tenant=tenant or "")
                ranges = neighbours.limit_ranges.get(p.namespace) if any_range else None
                if ranges:
                    m.cap = limit_range_cap(p, computed, m.request, ranges, p.memory_pinned)
                managed.append(m)
            else:
                reason = elig.INVALID_ANNOTATION
        reasons.append((p, reason, warning, writer if reason == elig.LIMIT_OWNED_BY_OTHER else None, tenant))
    summary, targets = compute_node(node.allocatable_cpu, pods, managed, settings)
    if node.resizing:  # a node being resized only cuts (or first sets) limits until it is done
        targets = [_no_raise(t) for t in targets]
    by_key = {t.managed.pod.key: t for t in targets}
    plans = []
    for p, r, w, writer, tenant in reasons:
        t = by_key.get(p.key)
        if any_range and t is not None and t.apply:
            why = limit_range_refusal_of(t, neighbours)
            if why is not None:
                # The LimitRanger admission would refuse any write: leave the pod alone.
                r, w, t = elig.LIMIT_RANGE_CONFLICT, f"no CPU limit can be written: {why}", None
        plans.append(PodPlan(p, r, t, w, writer, tenant))
    return NodePlan(node, settings, summary, tuple(plans))


def _no_raise(t: PodTarget) -> PodTarget:
    not_seed, raises = write_order(t)
    if t.apply and not_seed and raises:  # not a first limit, and it raises one
        return replace(t, apply=False, bound=NODE_RESIZING)
    return t


NODE_RESIZING = "nodeResizing"


def limit_range_refusal_of(t: PodTarget, neighbours: Neighbours) -> str | None:
    """What the LimitRanger admission would answer this write (None: it admits it)."""
    pod = t.managed.pod
    ranges = neighbours.limit_ranges.get(pod.namespace)
    if not ranges:
        return None
    if t.pod_level:
        return limit_range_refusal(pod, ranges, pod_limit=t.target)
    return limit_range_refusal(pod, ranges, {c.name: c.target for c in t.containers})


def fit_quota(
    t: PodTarget,
    neighbours: Neighbours,
    budget: QuotaBudget,
    settings: Settings,
    cut: bool = True,
    pod: Pod | None = None,
) -> PodTarget | None:
    """The write of `t` the namespace's `limits.cpu` quotas admit, its growth reserved in
    `budget` for `pod` as it will be sent (None: no write worth making fits; `t` itself when
    there is no such quota). `cut` False: `t` or nothing (a restore is the recorded limit,
    not a share)."""
    pod = pod or t.managed.pod
    quotas = neighbours.limits_quotas(pod.namespace)
    if not quotas:
        return t
    room = budget.room(pod.namespace, quotas)
    fitted: PodTarget | None = t
    if room is not None and limit_delta(t) > room.value:
        fitted = fit_room(t, room.value, room.source, settings) if cut else None
    if fitted is None or budget.take(pod, quotas, limit_delta(fitted)) is not None:
        return None
    return fitted


def _fit_quotas(plan: NodePlan, neighbours: Neighbours, budget: QuotaBudget) -> None:
    """`plan`'s writes as the quotas admit them, in the order the controller sends them."""
    writes = [pp for pp in plan.pods if pp.target is not None and pp.target.apply]
    for pp in sorted(writes, key=lambda pp: write_order(pp.target)):  # type: ignore[arg-type]
        assert pp.target is not None
        fitted = fit_quota(pp.target, neighbours, budget, plan.settings)
        if fitted is None:
            pp.target = replace(pp.target, apply=False, bound=_short(pp.target, neighbours, budget))
        else:
            pp.target = fitted


def _short(t: PodTarget, neighbours: Neighbours, budget: QuotaBudget) -> str:
    ns = t.managed.pod.namespace
    room = budget.room(ns, neighbours.limits_quotas(ns))
    return room.source if room is not None else t.bound


def plan_cluster(
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    namespaces: Mapping[str, Namespace],
    resolver: Resolver,
    *,
    pod_level_resize: bool,
    backing_off: frozenset[str] = frozenset(),
    neighbours: Neighbours = EMPTY,
) -> ClusterPlan:
    """Every node's plan. `pod_level_resize` is the cluster-wide capability; each node
    also has to declare the feature itself (`node_allows_pod_level_resize`), as in `run`."""
    by_node: dict[str, list[Pod]] = {}
    node_map = {n.name: n for n in nodes}
    out = ClusterPlan()
    pods_seen = list(pods)
    for p in pods_seen:
        if p.node_name and p.node_name in node_map:
            by_node.setdefault(p.node_name, []).append(p)
        else:
            out.unbound.append(PodPlan(p, elig.NOT_BOUND))
    limits: dict[str, int] = {}
    for p in pods_seen:
        limits[p.namespace] = limits.get(p.namespace, 0) + pod_limits_cpu(p)
    # Shared out node by node, in name order; what the plan decides is never "seen".
    by_key = {p.key: p for p in pods_seen}
    budget = QuotaBudget(lambda ns: limits.get(ns, 0), by_key.get)
    for name in sorted(node_map):
        node = node_map[name]
        plan = plan_node(
            node,
            by_node.get(name, ()),
            namespaces,
            resolver.settings_for(node.labels),
            # The controller's own per-node rule, so `plan` and `run` agree pod by pod.
            pod_level_resize=node_allows_pod_level_resize(node, pod_level_resize),
            backing_off=backing_off,
            neighbours=neighbours,
        )
        if not plan.settings.dry_run and plan.settings.blocked is None:
            _fit_quotas(plan, neighbours, budget)
        out.nodes.append(plan)
    return out


def what_if(n: NodePlan, key: str, request: int | None = None) -> int | None:
    """The limit the same policy would give pod `key` on this node if it were managed with a
    CPU request of `request` millicores (its own when None), every other pod as it is: the
    booking moves by the change of request, and so do the managed requests. None when the
    pod is not on the node, has no CPU request to scale, or sets pod-level resources."""
    pods: list[Pod] = []
    managed: list[Managed] = []
    found = False
    for pp in n.pods:
        pod, m = pp.pod, pp.target.managed if pp.target is not None else None
        if pod.key == key:
            if pod.pod_level is not None:
                return None
            computed = m.containers if m is not None else elig.computed_containers(pod, n.settings)
            own = sum(c.cpu_request for c in computed)
            if own <= 0:
                return None
            want = own if request is None else max(request, 1)
            scaled = {}
            for c in computed:  # each container's request (and what it books) scaled alike
                r = c.cpu_request * want // own
                scaled[c.name] = replace(c, cpu_request=r, booked_cpu=max(c.booked_cpu + r - c.cpu_request, r))
            containers = tuple(scaled.get(c.name, c) for c in pod.containers)
            moved = sum(c.cpu_request for c in scaled.values()) - own
            pod = replace(pod, containers=containers, booked_cpu=pod.booked_cpu + moved)
            cap = m.user_cap if m is not None else user_cap(pod)[0]
            m = Managed(pod, tuple(scaled.values()), cap, m.cap if m is not None else None, pp.tenant or "")
            found = True
        pods.append(pod)
        if m is not None:
            managed.append(m)
    if not found:
        return None
    _, targets = compute_node(n.node.allocatable_cpu, pods, managed, n.settings)
    return next(t.target for t in targets if t.managed.pod.key == key)
