"""The proportional policy (docs/policy.md): pure, deterministic, integer millicores.

One node at a time: the node's allocatable CPU, the booking of every pod on it, and the
managed pods with their effective settings go in; a summary of the node and a target per
managed pod (with per-container limits and whether to write them) come out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .limitrange import Cap
from .params import Settings
from .records import GUARANTEED, INIT, Container, Pod, qos_class
from .tenancy import Pot, pots

QUANTUM = 10  # millicores; also the smallest CPU quota the kernel enforces (k8s#128769)

# What decided a pod's target, for `explain` and the plan output.
BOUND_PROPORTIONAL = "proportional"
BOUND_FLOOR = "minBurstFloor"
BOUND_MULTIPLIER = "maxMultiplier"
BOUND_ALLOCATABLE = "allocatable"
BOUND_USER_CAP = "userCap"
BOUND_OVERCOMMITTED = "overcommitted"
BOUND_POD_LEVEL_FLOOR = "podLevelFloor"
BOUND_INITIAL = "initialMultiplier"  # a new pod's limit at admission
BOUND_TENANT_SHARE = "maxNodeSlackShare"  # the pod's tenant holds the most of the node's slack it may
# A namespace's LimitRange or ResourceQuota decides with its own name: "LimitRange ns/name".


# The per-pod types below are built for every managed pod on every reconcile; like the
# records they are not `frozen` (see core/records.py), and never mutated after building.
@dataclass(slots=True)
class Managed:
    """A managed pod as the policy sees it."""

    pod: Pod
    containers: tuple[Container, ...]  # those that receive a computed limit
    user_cap: int | None = None  # kube-headroom.dev/max-cpu in millicores
    cap: Cap | None = None  # the namespace's LimitRanges, applied after the user cap
    tenant: str = ""  # core.tenancy.tenant_name; one tenant for all when tenancy is off
    request: int = field(init=False, default=0)  # r_i: what the pod's share is proportional to

    def __post_init__(self) -> None:
        pl = self.pod.pod_level
        if pl is not None and pl.cpu_request:
            self.request = pl.cpu_request
        else:
            self.request = sum(c.cpu_request for c in self.containers)


@dataclass(slots=True, frozen=True)
class NodeSummary:
    allocatable: int
    booked: int
    slack: int
    managed_requests: int
    managed_pods: int
    # Each tenant's pot of the slack, when tenancy changes the split (weights that differ, or
    # a cap on one tenant's share); None: the slack is shared by request alone.
    pots: dict[str, Pot] | None = None

    @property
    def factor(self) -> float:
        if self.slack > 0 and self.managed_requests > 0:
            return 1 + self.slack / self.managed_requests
        return 1.0

    def burst(self, m: Managed) -> tuple[int, bool]:
        """The pod's proportional burst before the floor and caps: its tenant's pot shared by
        request (the slack shared by request without tenancy), and whether its tenant's pot
        was capped by maxNodeSlackShare."""
        if self.pots is None:
            return self.slack * m.request // self.managed_requests, False
        pot = self.pots[m.tenant]
        return m.request * pot.pot.numerator // (pot.pot.denominator * pot.requests), pot.capped


@dataclass(slots=True)
class ContainerTarget:
    name: str
    request: int
    current: int | None
    target: int
    apply: bool


@dataclass(slots=True)
class PodTarget:
    managed: Managed
    request: int
    target: int  # the pod's total limit after clamps and quantum
    bound: str
    containers: tuple[ContainerTarget, ...]  # empty for pod-level pods
    pod_level_current: int | None
    apply: bool

    @property
    def pod_level(self) -> bool:
        return self.managed.pod.pod_level is not None


def booked(pods: Iterable[Pod]) -> int:
    """CPU the scheduler counts on the node: every pod but the terminal ones."""
    return sum(p.booked_cpu for p in pods if not p.terminal)


def summarize(
    allocatable: int, booked_cpu: int, managed: Sequence[Managed], settings: Settings | None = None
) -> NodeSummary:
    slack, requests = allocatable - booked_cpu, sum(m.request for m in managed)
    tenancy = settings.tenancy if settings is not None else None
    split = None
    if tenancy is not None and not tenancy.neutral and slack > 0 and requests > 0:
        by_tenant: dict[str, int] = {}
        for m in managed:
            by_tenant[m.tenant] = by_tenant.get(m.tenant, 0) + m.request
        split = pots(slack, by_tenant, tenancy)
    return NodeSummary(allocatable, booked_cpu, slack, requests, len(managed), split)


def _writes(current: int | None, target: int, grow: float, shrink: float) -> bool:
    if current is None or current <= 0:
        return True  # seeding: a container without a limit always gets one
    if target > current:
        return (target - current) / current >= grow
    if target < current:
        return (current - target) / current >= shrink
    return False


def outside_deadband(current: int | None, target: int, settings: Settings) -> bool:
    """Whether a change from `current` to `target` is worth a write (the deadband)."""
    return _writes(current, target, settings.deadband_grow, settings.deadband_shrink)


def _container_targets(
    containers: Sequence[Container], new: Sequence[int], grow: float, shrink: float
) -> tuple[tuple[ContainerTarget, ...], bool]:
    """Per-container targets with their write decisions, and whether the pod needs a write."""
    # The reference per-container loop (pod_target); compute_node inlines the same steps.
    targets = []
    apply = False
    for c, target in zip(containers, new, strict=True):
        write = _writes(c.cpu_limit, target, grow, shrink)
        targets.append(ContainerTarget(c.name, c.cpu_request, c.cpu_limit, target, write))
        apply = apply or write
    return tuple(targets), apply


def pod_total(summary: NodeSummary, m: Managed, settings: Settings) -> tuple[int, str]:
    """L_i before the per-container split, and the step that decided it."""
    r = m.request
    s, total, n = summary.slack, summary.managed_requests, summary.managed_pods
    if s <= 0 or total <= 0:
        limit, bound = r, BOUND_OVERCOMMITTED
    else:
        proportional, capped = summary.burst(m)
        floor = min(settings.min_burst_floor, s // n)
        if floor > proportional:
            limit, bound = r + floor, BOUND_FLOOR
        else:
            limit, bound = r + proportional, BOUND_TENANT_SHARE if capped else BOUND_PROPORTIONAL
        limit, bound = clamp(limit, bound, m, summary.allocatable, settings)
    return on_quantum(limit, r), bound


def clamp(limit: int, bound: str, m: Managed, allocatable: int | None, settings: Settings) -> tuple[int, str]:
    """A pod's total within its caps, in order: maxMultiplier, the node's allocatable CPU
    (None: no node known), the pod's max-cpu annotation, its namespace's LimitRanges; never
    below its request. The step that decided it comes back with it."""
    r = m.request
    mult = settings.max_multiplier
    if mult:
        cap = r * mult.numerator // mult.denominator
        if limit > cap:
            limit, bound = cap, BOUND_MULTIPLIER
    if allocatable is not None and limit > allocatable:
        limit, bound = allocatable, BOUND_ALLOCATABLE
    if m.user_cap is not None and limit > m.user_cap:
        limit, bound = m.user_cap, BOUND_USER_CAP
    if m.cap is not None and limit > m.cap.value:
        limit, bound = m.cap.value, m.cap.source
    return max(limit, r), bound


def on_quantum(limit: int, request: int) -> int:
    """A total rounded down to the quantum, never below the request nor below one quantum."""
    return max(request, limit // QUANTUM * QUANTUM, QUANTUM)


def initial_target(m: Managed, allocatable: int | None, settings: Settings) -> PodTarget:
    """A new pod's target before any node's booking is known (what the webhook sets at
    admission): its request times the settings' initialMultiplier, clamped as a node's target is, on the
    quantum, and split over its containers as the controller splits a total, with the QoS
    guard and the pod-level floor. `m.containers` are the ones that get a limit."""
    r = m.request
    mult = settings.initial_multiplier
    limit, bound = clamp(r * mult.numerator // mult.denominator, BOUND_INITIAL, m, allocatable, settings)
    return split(m, on_quantum(limit, r), bound, settings)


def _pod_level_target(m: Managed, limit: int, bound: str, settings: Settings) -> PodTarget:
    pl = m.pod.pod_level
    assert pl is not None
    floor = max([pl.cpu_request or 0] + [c.cpu_limit or 0 for c in m.pod.containers])
    if pl.mem_request is not None and pl.mem_request == pl.mem_limit:
        # Pod-level memory is pinned: a CPU limit equal to the request would make the pod
        # Guaranteed, which a resize may not do.
        floor = max(floor, (pl.cpu_request or 0) + QUANTUM)
    if limit < floor:
        limit, bound = floor, BOUND_POD_LEVEL_FLOOR
    current = pl.cpu_limit
    return PodTarget(m, m.request, limit, bound, (), current, outside_deadband(current, limit, settings))


def pod_target(summary: NodeSummary, m: Managed, settings: Settings) -> PodTarget:
    limit, bound = pod_total(summary, m, settings)
    return split(m, limit, bound, settings)


def split(m: Managed, limit: int, bound: str, settings: Settings) -> PodTarget:
    """The pod's target for a given total: shared out over its containers in proportion to
    their requests (or the pod-level limit), with the QoS guard and the write decisions."""
    pod = m.pod
    if pod.pod_level is not None:
        return _pod_level_target(m, limit, bound, settings)
    r = m.request
    containers = m.containers
    new = [max(c.cpu_request, c.cpu_request * limit // r, QUANTUM) for c in containers]
    if pod.memory_pinned and new:
        # A resize may not change the QoS class: if these limits would pin every
        # container, leave the largest one a quantum above its request.
        by_name = dict(zip((c.name for c in containers), new, strict=True))
        after = [
            (c.cpu_request or None, by_name.get(c.name, c.cpu_limit), c.mem_request, c.mem_limit)
            for c in pod.containers
        ]
        if qos_class(after) == GUARANTEED:
            largest = max(range(len(new)), key=lambda i: (new[i], containers[i].name))
            new[largest] += QUANTUM
    targets, apply = _container_targets(containers, new, settings.deadband_grow, settings.deadband_shrink)
    return PodTarget(m, r, limit, bound, targets, None, apply)


def limit_delta(t: PodTarget) -> int:
    """How much the pod's `limits.cpu` (as a ResourceQuota counts it) grows with this write."""
    if t.pod_level:
        before = t.pod_level_current
        if before is None:
            before = sum(c.cpu_limit or 0 for c in t.managed.pod.containers if c.kind != INIT)
        return t.target - before
    return sum(c.target - (c.current or 0) for c in t.containers)


def fit_room(t: PodTarget, room: int, source: str, settings: Settings) -> PodTarget | None:
    """The largest write of `t` whose limit growth fits in `room` (a quota's budget): `t`
    itself when it fits, a smaller raise decided by `source`, or None when no write worth
    making fits."""
    delta = limit_delta(t)
    if delta <= room:
        return t
    smaller = split(t.managed, (t.target - (delta - room)) // QUANTUM * QUANTUM, source, settings)
    if not smaller.apply or limit_delta(smaller) > room or smaller.target < smaller.request:
        return None
    return smaller


def writes_now(t: PodTarget, settings: Settings) -> bool:
    """Whether a pass writes this target's resize: one to apply, outside a dry run (which
    counts it as would-apply and writes only the status annotation)."""
    return t.apply and not settings.dry_run


def write_order(t: PodTarget) -> tuple[bool, bool]:
    """Pods without a limit first (an unbounded pod matters most), then cuts, then raises:
    a node that shrank gives CPU back before anyone is promised more, and a quota gets its
    room back before it is spent."""
    if t.pod_level:
        raises = t.pod_level_current is not None and t.target > t.pod_level_current
        seed = t.pod_level_current is None
    else:
        raises = any(c.current is not None and c.target > c.current for c in t.containers)
        seed = any(c.current is None for c in t.containers)
    return (not seed, raises)


def compute_node(
    allocatable: int, pods: Iterable[Pod], managed: Sequence[Managed], settings: Settings
) -> tuple[NodeSummary, list[PodTarget]]:
    """The whole policy for one node. Deterministic; no I/O.

    The loop below is `pod_total` + `pod_target` fused, with the node's constants hoisted
    out of it: this is the inner loop of every reconcile and of the scale benchmarks.
    `pod_target` stays the readable reference; a property test holds the two equal.
    """
    summary = summarize(allocatable, booked(pods), managed, settings)
    s, total, n = summary.slack, summary.managed_requests, summary.managed_pods
    overcommitted = s <= 0 or total <= 0
    # With tenancy, each pod's burst per requested millicore is its tenant's: num / den.
    rates = None
    if summary.pots is not None:
        rates = {t: (p.pot.numerator, p.pot.denominator * p.requests, p.capped) for t, p in summary.pots.items()}
    floor_share = 0 if overcommitted else min(settings.min_burst_floor, s // n)
    mult = settings.max_multiplier
    num, den = mult.numerator, mult.denominator
    grow, shrink = settings.deadband_grow, settings.deadband_shrink
    out: list[PodTarget] = []
    append = out.append
    for m in managed:
        pod = m.pod
        if pod.pod_level is not None or pod.memory_pinned:
            append(pod_target(summary, m, settings))  # rare shapes: the reference path
            continue
        r = m.request
        if overcommitted:
            limit, bound = r, BOUND_OVERCOMMITTED
        else:
            capped = False
            if rates is None:
                proportional = s * r // total
            else:
                t_num, t_den, capped = rates[m.tenant]
                proportional = r * t_num // t_den
            if floor_share > proportional:
                limit, bound = r + floor_share, BOUND_FLOOR
            else:
                limit, bound = r + proportional, BOUND_TENANT_SHARE if capped else BOUND_PROPORTIONAL
            if num:
                cap = r * num // den
                if limit > cap:
                    limit, bound = cap, BOUND_MULTIPLIER
            if limit > allocatable:
                limit, bound = allocatable, BOUND_ALLOCATABLE
            user_cap = m.user_cap
            if user_cap is not None and limit > user_cap:
                limit, bound = user_cap, BOUND_USER_CAP
            ns_cap = m.cap
            if ns_cap is not None and limit > ns_cap.value:
                limit, bound = ns_cap.value, ns_cap.source
            if limit < r:
                limit = r
        limit = limit // QUANTUM * QUANTUM
        if limit < r:
            limit = r
        if limit < QUANTUM:
            limit = QUANTUM
        # The split and the hysteresis of _container_targets/_writes, inlined: a function
        # call per container is most of this loop's cost (tests/bench/bench_controller.py
        # prints this path next to the reference path, pod_target, in the same run).
        targets = []
        apply = False
        for c in m.containers:
            req = c.cpu_request
            target = req * limit // r
            if target < req:
                target = req
            if target < QUANTUM:
                target = QUANTUM
            cur = c.cpu_limit
            if cur is None or cur <= 0:
                write = True
            elif target > cur:
                write = (target - cur) / cur >= grow
            elif target < cur:
                write = (cur - target) / cur >= shrink
            else:
                write = False
            targets.append(ContainerTarget(c.name, req, cur, target, write))
            if write:
                apply = True
        append(PodTarget(m, r, limit, bound, tuple(targets), None, apply))
    return summary, out
