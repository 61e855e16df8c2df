"""What else in a namespace sets or polices CPU limits, in one immutable index per cluster
state: VerticalPodAutoscalers (their records and `Neighbours.vpa_controlling(pod)`, the VPA
that owns a pod's CPU limits), LimitRanges (core/limitrange.py) and ResourceQuotas on
`limits.cpu` (core/quota.py). A builder raises `RecordError` on input it cannot read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .limitrange import LIMIT_RANGE_KIND, LimitRange
from .quota import QUOTA_KIND, Quota
from .records import INIT, Container, Pod, namespaced_name, record_reader

VPA_KIND = "VerticalPodAutoscaler"
# Each kind's table in `Neighbours`.
TABLES = {VPA_KIND: "vpas", LIMIT_RANGE_KIND: "limit_ranges", QUOTA_KIND: "quotas"}


# --- VerticalPodAutoscaler ------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ContainerPolicy:
    container: str  # a container name, or "*"
    off: bool  # mode: Off
    limits_cpu: bool  # controlledValues RequestsAndLimits (the default) with cpu controlled


@dataclass(slots=True, frozen=True)
class Vpa:
    namespace: str
    name: str
    target_kind: str
    target_name: str
    update_off: bool  # updatePolicy.updateMode: Off (recommendations only)
    policies: tuple[ContainerPolicy, ...]

    def controls_limits(self, containers: Iterable[Container]) -> bool:
        """Whether the VPA would set the CPU limit of any of these containers. Its defaults
        (no resourcePolicy) control requests and limits of cpu and memory."""
        if self.update_off:
            return False
        by_name = {p.container: p for p in self.policies}
        default = by_name.get("*", ContainerPolicy("*", False, True))
        for c in containers:
            if c.kind == INIT:
                continue
            p = by_name.get(c.name, default)
            if not p.off and p.limits_cpu:
                return True
        return False


ANY = "*"  # the target of a VPA that cannot be read: every pod of its namespace


def _vpa_from_dict(obj: Mapping[str, Any]) -> Vpa:
    ns, name = namespaced_name(obj)
    try:
        spec = obj.get("spec") or {}
        ref = spec.get("targetRef") or {}
        update = (spec.get("updatePolicy") or {}).get("updateMode")
        policies = []
        for p in (spec.get("resourcePolicy") or {}).get("containerPolicies") or ():
            resources = p.get("controlledResources")
            cpu = resources is None or "cpu" in resources
            values = p.get("controlledValues") or "RequestsAndLimits"
            policies.append(
                ContainerPolicy(
                    str(p.get("containerName") or "*"), p.get("mode") == "Off", cpu and values != "RequestsOnly"
                )
            )
        return Vpa(ns, name, str(ref.get("kind") or ""), str(ref.get("name") or ""), update == "Off", tuple(policies))
    except (TypeError, AttributeError, ValueError, KeyError):
        # Fail closed: a VPA that cannot be read may be one that owns the limits of any
        # pod in its namespace, so it is taken to own them all.
        return Vpa(ns, name, ANY, ANY, False, ())


vpa_from_dict: Callable[[Mapping[str, Any]], Vpa] = record_reader(_vpa_from_dict)

_JOB_OF_CRONJOB = re.compile(r"^(?P<cronjob>.+)-\d+$")


def owner_chain(pod: Pod) -> tuple[tuple[str, str], ...]:
    """The pod's controller and the controllers above it, as far as the pod itself tells
    without reading them: a Deployment's ReplicaSet is named `<deployment>-<pod-template-hash>`
    (the hash is also a pod label), an Argo Rollout's likewise, and a CronJob's Job
    `<cronjob>-<scheduled time>`. A guess can only add an owner, so a VPA matched by a
    guess makes Headroom leave the pod alone, never write to a pod its VPA owns."""
    if pod.owner_kind is None or pod.owner_name is None:
        return ()
    chain = [(pod.owner_kind, pod.owner_name)]
    if pod.owner_kind == "ReplicaSet":
        for label, kind in (("pod-template-hash", "Deployment"), ("rollouts-pod-template-hash", "Rollout")):
            h = pod.labels.get(label)
            if h and pod.owner_name.endswith("-" + h):
                chain.append((kind, pod.owner_name[: -len(h) - 1]))
    elif pod.owner_kind == "Job":
        m = _JOB_OF_CRONJOB.match(pod.owner_name)
        if m:
            chain.append(("CronJob", m["cronjob"]))
    return tuple(chain)


# --- the index ------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Neighbours:
    """Per namespace, what else sets or polices CPU limits. Immutable: the cache swaps in a
    new one on every change, and every reconcile's view shares the current one."""

    vpas: Mapping[str, tuple[Vpa, ...]] = field(default_factory=dict)
    limit_ranges: Mapping[str, tuple[LimitRange, ...]] = field(default_factory=dict)
    quotas: Mapping[str, tuple[Quota, ...]] = field(default_factory=dict)

    def vpa_controlling(self, pod: Pod) -> Vpa | None:
        """The VPA whose target is in the pod's owner chain and that sets its CPU limits."""
        vpas = self.vpas.get(pod.namespace)
        if not vpas:
            return None
        chain = set(owner_chain(pod))
        for v in vpas:
            if v.target_kind == ANY or ((v.target_kind, v.target_name) in chain and v.controls_limits(pod.containers)):
                return v
        return None

    def limits_quotas(self, namespace: str) -> tuple[Quota, ...]:
        return tuple(q for q in self.quotas.get(namespace, ()) if q.hard is not None)


EMPTY = Neighbours()


def with_object(n: Neighbours, kind: str, obj: Vpa | LimitRange | Quota | None, ns: str, name: str) -> Neighbours:
    """A copy of `n` with one object put (obj) or removed (None)."""
    attr = TABLES[kind]
    table: Mapping[str, tuple[Any, ...]] = getattr(n, attr)
    kept = tuple(o for o in table.get(ns, ()) if o.name != name)
    if obj is not None:
        kept = tuple(sorted((*kept, obj), key=lambda o: o.name))
    new = {k: v for k, v in table.items() if k != ns}
    if kept:
        new[ns] = kept
    return _replace(n, attr, new)


def with_all(n: Neighbours, kind: str, objs: Iterable[Vpa | LimitRange | Quota]) -> Neighbours:
    attr = TABLES[kind]
    table: dict[str, list[Any]] = {}
    for o in objs:
        table.setdefault(o.namespace, []).append(o)
    return _replace(n, attr, {ns: tuple(sorted(v, key=lambda o: o.name)) for ns, v in table.items()})


def _replace(n: Neighbours, attr: str, table: Mapping[str, tuple[Any, ...]]) -> Neighbours:
    parts = {"vpas": n.vpas, "limit_ranges": n.limit_ranges, "quotas": n.quotas, attr: table}
    return Neighbours(**parts)
