"""What the cluster's own objects mean for Headroom, decided by the controller's code:
which namespaces it manages (and near misses of the opt-in), the quotas and LimitRanges it
works inside, the pods it leaves to a VPA or cannot write, and Windows nodes."""

from __future__ import annotations

from collections.abc import Iterator

from ...cluster.snapshot import Snapshot
from ...core.eligibility import (
    LIMIT_OWNED_BY_OTHER,
    LIMIT_RANGE_CONFLICT,
    MANAGED,
    VPA_CONTROLS_LIMITS,
    limit_writers,
    namespace_managed,
    opt_in_near_miss,
)
from ...core.params import Settings
from ...core.planner import ClusterPlan
from ...core.quantity import format_milli
from .findings import INFO, OK, WARN, Finding


def managed_namespaces(snap: Snapshot, settings: Settings) -> list[str]:
    return sorted(
        n
        for n, ns in snap.namespaces.items()
        if namespace_managed(ns, settings) and n not in settings.exclusions.namespaces
    )


def namespace_checks(snap: Snapshot, settings: Settings, managed: list[str]) -> Iterator[Finding]:
    yield Finding(
        OK if managed else WARN,
        "namespaces",
        f"{len(managed)} managed" if managed else "none managed: label one kube-headroom.dev/mode=managed",
    )
    for name in sorted(snap.namespaces):
        namespace = snap.namespaces[name]
        miss = None if namespace_managed(namespace, settings) else opt_in_near_miss(namespace)
        if miss is not None:
            yield Finding(WARN, "namespaces", miss)


def neighbour_checks(snap: Snapshot, managed: list[str]) -> Iterator[Finding]:
    """What the controller does about its neighbours in the managed namespaces: information,
    but for pods that break their LimitRange already."""
    n = snap.neighbours
    for ns in managed:
        for q in n.limits_quotas(ns):
            yield Finding(
                INFO,
                "resourcequota",
                f"{q.key} limits limits.cpu to {format_milli(q.hard or 0)}: raises stay inside what it has left "
                f"(`explain` shows 'decided by: ResourceQuota {q.key}'); quota requests.cpu instead to let limits "
                "follow the node",
            )
        for lr in n.limit_ranges.get(ns, ()):
            caps = [
                f"{item.type} {what} {value}"
                for item in lr.items
                for what, value in (
                    ("max", None if item.cpu.max is None else format_milli(item.cpu.max)),
                    (
                        "maxLimitRequestRatio",
                        None if item.cpu.ratio_milli is None else format_milli(item.cpu.ratio_milli),
                    ),
                )
                if value is not None
            ]
            if caps:
                yield Finding(
                    INFO,
                    "limitrange",
                    f"{lr.key} caps CPU limits ({', '.join(caps)}): targets are clamped to it "
                    f"('decided by: LimitRange {lr.key}')",
                )
    plan = snap.plan(pod_level_resize=True)
    left: dict[str, list[str]] = {}
    for pp in plan.all_pods():
        if pp.reason in (VPA_CONTROLS_LIMITS, LIMIT_RANGE_CONFLICT):
            left.setdefault(pp.reason, []).append(pp.pod.key)
    if left.get(VPA_CONTROLS_LIMITS):
        pods = left[VPA_CONTROLS_LIMITS]
        yield Finding(
            INFO,
            "vpa",
            f"{len(pods)} pod(s) whose VerticalPodAutoscaler sets CPU limits are left to it ({', '.join(pods[:3])}); "
            "with controlledValues: RequestsOnly Headroom would manage their limits",
        )
    yield from writer_checks(plan)
    if left.get(LIMIT_RANGE_CONFLICT):
        pods = left[LIMIT_RANGE_CONFLICT]
        yield Finding(
            WARN,
            "limitrange",
            f"{len(pods)} pod(s) break their namespace's LimitRange already, so no limit can be written to them "
            f"({', '.join(pods[:3])}); `headroom explain` says which rule",
        )


def writer_checks(plan: ClusterPlan) -> Iterator[Finding]:
    """Other field managers that own a CPU limit Headroom computes for a pod (their resize
    entries in managedFields), with the pods they hold: a second writer that keeps writing
    is left the pod's limit (LimitOwnedByOther); what the controller has decided so far
    lives in its process, so this lists who writes, from the cluster alone."""
    held: dict[str, list[str]] = {}
    for node in plan.nodes:
        for pp in node.pods:
            if pp.pod.limit_writers and pp.reason in (MANAGED, LIMIT_OWNED_BY_OTHER):
                for manager in limit_writers(pp.pod, node.settings):
                    held.setdefault(manager, []).append(pp.pod.key)
    for manager in sorted(held):
        pods = held[manager]
        yield Finding(
            WARN,
            "writers",
            f"field manager {manager!r} owns the CPU limit of {len(pods)} pod(s) Headroom manages "
            f"({', '.join(pods[:5])}{', ...' if len(pods) > 5 else ''}): if it keeps writing, Headroom leaves those "
            "limits to it (reason LimitOwnedByOther); exclude the pods, or stop that writer",
        )


def node_checks(snap: Snapshot) -> Iterator[Finding]:
    windows = [n.name for n in snap.nodes if n.windows]
    if windows:
        yield Finding(
            INFO, "nodes", f"{len(windows)} Windows node(s) ({', '.join(windows[:3])}): pods there stay unmanaged"
        )
