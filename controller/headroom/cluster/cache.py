"""What the watches have seen, indexed by node, and which nodes each change affects.

Pure bookkeeping under one lock: watch threads put records in, the reconciler takes
consistent per-node snapshots out. Every mutation returns the nodes it makes stale, so
the caller can queue them; the cache itself knows nothing of queues.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import limitrange, quota
from ..core import neighbours as nb
from ..core.records import Namespace, Node, Pod


@dataclass(slots=True)
class Stale:
    nodes: set[str] = field(default_factory=set)  # recompute after the debounce
    urgent: set[str] = field(default_factory=set)  # recompute now (allocatable dropped)
    gone: set[str] = field(default_factory=set)  # deleted nodes: drop their queue state

    def __bool__(self) -> bool:
        return bool(self.nodes or self.urgent or self.gone)

    def merge(self, other: Stale) -> Stale:
        self.nodes |= other.nodes
        self.urgent |= other.urgent
        self.gone |= other.gone
        return self


@dataclass(slots=True, frozen=True)
class NodeView:
    """A consistent snapshot of one node for a reconcile."""

    node: Node
    pods: tuple[Pod, ...]
    namespaces: Mapping[str, Namespace]
    neighbours: nb.Neighbours = nb.EMPTY


class ClusterCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, Pod] = {}
        self.by_node: dict[str, dict[str, Pod]] = {}
        self.namespaces: dict[str, Namespace] = {}
        self.custom: dict[str, dict[str, dict[str, Any]]] = {}  # kind -> name -> raw object
        self.neighbours = nb.EMPTY  # VPAs, LimitRanges, ResourceQuotas; copy-on-write
        # The pods' limits.cpu summed per namespace, kept up to date only for namespaces with
        # a limits.cpu quota (the quota budget reads it on every raise there).
        self._ns_limits: dict[str, int] = {}

    # --- pods -------------------------------------------------------------------------
    def _put_pod(self, new: Pod) -> set[str]:
        old = self.pods.get(new.key)
        self.pods[new.key] = new
        if self._ns_limits and new.namespace in self._ns_limits:
            self._ns_limits[new.namespace] += quota.pod_limits_cpu(new) - (quota.pod_limits_cpu(old) if old else 0)
        if old is not None and old.node_name and old.node_name != new.node_name:
            self.by_node.get(old.node_name, {}).pop(new.key, None)
        if new.node_name:
            self.by_node.setdefault(new.node_name, {})[new.key] = new
        if old is not None and old.same_inputs(new):
            return set()
        return {n for n in ((old.node_name if old else None), new.node_name) if n}

    def _drop_pod(self, key: str) -> set[str]:
        old = self.pods.pop(key, None)
        if old is not None and old.namespace in self._ns_limits:
            self._ns_limits[old.namespace] -= quota.pod_limits_cpu(old)
        if old is None or not old.node_name:
            return set()
        self.by_node.get(old.node_name, {}).pop(key, None)
        return {old.node_name}

    def upsert_pod(self, pod: Pod) -> Stale:
        with self._lock:
            return Stale(nodes=self._put_pod(pod))

    def delete_pod(self, key: str) -> Stale:
        with self._lock:
            return Stale(nodes=self._drop_pod(key))

    def replace_pods(self, pods: Iterable[Pod]) -> Stale:
        """After a relist: the list is the truth; pods missing from it were deleted."""
        with self._lock:
            stale: set[str] = set()
            seen = set()
            for p in pods:
                seen.add(p.key)
                stale |= self._put_pod(p)
            for key in [k for k in self.pods if k not in seen]:
                stale |= self._drop_pod(key)
            return Stale(nodes=stale)

    # --- nodes ------------------------------------------------------------------------
    def _put_node(self, new: Node) -> Stale:
        old = self.nodes.get(new.name)
        self.nodes[new.name] = new
        if old == new:
            return Stale()
        if old is not None and (
            new.allocatable_cpu < old.allocatable_cpu
            or new.capacity_cpu < old.capacity_cpu
            or (new.resizing and not old.resizing)
        ):
            return Stale(urgent={new.name})  # shrinking: cut limits now
        return Stale(nodes={new.name})

    def upsert_node(self, node: Node) -> Stale:
        with self._lock:
            return self._put_node(node)

    def delete_node(self, name: str) -> Stale:
        with self._lock:
            self.nodes.pop(name, None)
            return Stale(gone={name})

    def replace_nodes(self, nodes: Iterable[Node]) -> Stale:
        with self._lock:
            stale = Stale()
            seen = set()
            for n in nodes:
                seen.add(n.name)
                stale.merge(self._put_node(n))
            for name in [n for n in self.nodes if n not in seen]:
                del self.nodes[name]
                stale.gone.add(name)
            return stale

    # --- namespaces -------------------------------------------------------------------
    def _nodes_of_namespace(self, ns: str) -> set[str]:
        return {p.node_name for p in self.pods.values() if p.namespace == ns and p.node_name}

    # Namespaces are copy-on-write: they change rarely, and every reconcile's view shares
    # the current dict instead of copying it.
    def upsert_namespace(self, ns: Namespace) -> Stale:
        with self._lock:
            old = self.namespaces.get(ns.name)
            if old == ns:
                return Stale()
            self.namespaces = {**self.namespaces, ns.name: ns}
            return Stale(nodes=self._nodes_of_namespace(ns.name))

    def delete_namespace(self, name: str) -> Stale:
        with self._lock:
            self.namespaces = {k: v for k, v in self.namespaces.items() if k != name}
            return Stale(nodes=self._nodes_of_namespace(name))

    def replace_namespaces(self, namespaces: Iterable[Namespace]) -> Stale:
        with self._lock:
            new = {ns.name: ns for ns in namespaces}
            changed = {n for n in new.keys() | self.namespaces.keys() if new.get(n) != self.namespaces.get(n)}
            self.namespaces = new
            stale: set[str] = set()
            for n in changed:
                stale |= self._nodes_of_namespace(n)
            return Stale(nodes=stale)

    # --- VPAs, LimitRanges, ResourceQuotas ----------------------------------------------
    def _track_quotas(self) -> None:
        """Keep the per-namespace limit sums for exactly the namespaces with a limits.cpu quota."""
        wanted = {ns for ns in self.neighbours.quotas if self.neighbours.limits_quotas(ns)}
        for ns in [n for n in self._ns_limits if n not in wanted]:
            del self._ns_limits[ns]
        for ns in wanted - self._ns_limits.keys():
            self._ns_limits[ns] = sum(quota.pod_limits_cpu(p) for p in self.pods.values() if p.namespace == ns)

    def namespace_limits(self, namespace: str) -> int:
        """The namespace's pods' limits.cpu, as a ResourceQuota counts it."""
        with self._lock:
            known = self._ns_limits.get(namespace)
            if known is not None:
                return known
            return sum(quota.pod_limits_cpu(p) for p in self.pods.values() if p.namespace == namespace)

    def _neighbour_stale(self, kind: str, old: nb.Neighbours, namespaces: Iterable[str]) -> Stale:
        """Nodes of the pods in the namespaces whose objects of `kind` changed. A quota
        counts only when it leaves more room (raises that waited for it can go now): every
        admitted write changes its `used`, and that alone must not recompute nodes."""
        if kind == quota.QUOTA_KIND:
            self._track_quotas()
        stale: set[str] = set()
        for ns in namespaces:
            if kind == quota.QUOTA_KIND and not _more_room(old, self.neighbours, ns):
                continue
            stale |= self._nodes_of_namespace(ns)
        return Stale(nodes=stale)

    def put_neighbour(self, kind: str, obj: nb.Vpa | limitrange.LimitRange | quota.Quota) -> Stale:
        with self._lock:
            old = self.neighbours
            self.neighbours = nb.with_object(old, kind, obj, obj.namespace, obj.name)
            return self._neighbour_stale(kind, old, (obj.namespace,))

    def delete_neighbour(self, kind: str, namespace: str, name: str) -> Stale:
        with self._lock:
            old = self.neighbours
            self.neighbours = nb.with_object(old, kind, None, namespace, name)
            return self._neighbour_stale(kind, old, (namespace,))

    def replace_neighbours(self, kind: str, objs: Iterable[nb.Vpa | limitrange.LimitRange | quota.Quota]) -> Stale:
        with self._lock:
            old = self.neighbours
            self.neighbours = nb.with_all(old, kind, objs)
            before, after = getattr(old, nb.TABLES[kind]), getattr(self.neighbours, nb.TABLES[kind])
            changed = {ns for ns in before.keys() | after.keys() if before.get(ns) != after.get(ns)}
            return self._neighbour_stale(kind, old, changed)

    # --- HeadroomConfig / NodePoolProfile ---------------------------------------------
    def put_custom(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.custom.setdefault(kind, {})[obj["metadata"]["name"]] = obj

    def delete_custom(self, kind: str, name: str) -> None:
        with self._lock:
            self.custom.get(kind, {}).pop(name, None)

    def replace_custom(self, kind: str, objs: Iterable[dict[str, Any]]) -> None:
        with self._lock:
            self.custom[kind] = {o["metadata"]["name"]: o for o in objs}

    def custom_objects(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.custom.get(kind, {}).values())

    # --- reads ------------------------------------------------------------------------
    def view(self, node: str) -> NodeView | None:
        with self._lock:
            n = self.nodes.get(node)
            if n is None:
                return None
            return NodeView(n, tuple(self.by_node.get(node, {}).values()), self.namespaces, self.neighbours)

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self.nodes)

    def nodes_snapshot(self) -> dict[str, Node]:
        """Every node as last seen (the webhook's candidate nodes come from it)."""
        with self._lock:
            return dict(self.nodes)

    def node_labels(self) -> dict[str, Mapping[str, str]]:
        with self._lock:
            return {name: n.labels for name, n in self.nodes.items()}

    def namespace(self, name: str) -> Namespace | None:
        with self._lock:
            return self.namespaces.get(name)

    def pod(self, key: str) -> Pod | None:

        with self._lock:
            return self.pods.get(key)


def _more_room(old: nb.Neighbours, new: nb.Neighbours, namespace: str) -> bool:
    def room(n: nb.Neighbours) -> tuple[tuple[str, int | None], ...]:
        return tuple(
            (q.name, None if q.hard is None or q.used is None else q.hard - q.used) for q in n.limits_quotas(namespace)
        )

    before, after = dict(room(old)), dict(room(new))
    if before.keys() != after.keys():
        return True
    return any((after[k] or 0) > (before[k] or 0) or (before[k] is None) != (after[k] is None) for k in after)
