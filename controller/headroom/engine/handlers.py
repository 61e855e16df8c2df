"""What each watch does with what it hears: turn the objects into slim records (one that
cannot be read is logged, counted and skipped: it never stops a watch), put them in the
cache, and queue the nodes the change makes stale."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..cluster.cache import ClusterCache, Stale
from ..core.records import RecordError, namespace_from_dict, node_from_dict, pod_from_dict

log = logging.getLogger("headroom.controller")

OnList = Callable[[Iterable[dict[str, Any]]], None]
OnEvent = Callable[[str, dict[str, Any]], None]


class WatchHandlers:
    """The list and event handlers of every watch, over one cache.

    `enqueue` queues the stale nodes; `forget_pod` drops what is kept per pod when one is
    deleted; `on_error` counts an unreadable object; `on_nodes_listed` runs after each node
    list; `on_config` runs, under `config_lock`, after a HeadroomConfig or NodePoolProfile
    change once both kinds have been listed."""

    def __init__(
        self,
        cache: ClusterCache,
        enqueue: Callable[[Stale], None],
        *,
        forget_pod: Callable[[str], None],
        on_error: Callable[[str], None],
        on_nodes_listed: Callable[[], None],
        on_config: Callable[[], None],
        config_lock: threading.RLock,
        config_kinds: tuple[str, str],
    ) -> None:
        self.cache, self.enqueue = cache, enqueue
        self.forget_pod, self.on_error = forget_pod, on_error
        self.on_nodes_listed, self.on_config = on_nodes_listed, on_config
        self.config_lock = config_lock
        self.config_kinds = config_kinds
        self._custom_listed: set[str] = set()  # configuration kinds whose list has been seen

    def record(self, build: Callable[[dict[str, Any]], Any], obj: dict[str, Any]) -> Any:
        """The slim record of one object; None (logged, counted) when it cannot be read.
        Whatever the object holds, this returns: one bad object never stops a watch."""
        try:
            return build(obj)
        except RecordError as exc:
            log.error("object skipped: cannot read it", extra={"error": str(exc)})
        except Exception:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            name = f"{meta.get('namespace', '')}/{meta.get('name')}" if isinstance(meta, dict) else "?"
            log.exception("object skipped: reading it crashed", extra={"object": name})
        self.on_error("record")
        return None

    def _records(self, build: Callable[[dict[str, Any]], Any], items: Iterable[dict[str, Any]]) -> list[Any]:
        return [r for r in (self.record(build, obj) for obj in items) if r is not None]

    # --- pods, nodes, namespaces -----------------------------------------------------------
    def pods_list(self, items: Iterable[dict[str, Any]]) -> None:
        self.enqueue(self.cache.replace_pods(self._records(pod_from_dict, items)))

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            self.forget_pod(key)
            self.enqueue(self.cache.delete_pod(key))
            return
        pod = self.record(pod_from_dict, obj)
        if pod is not None:
            self.enqueue(self.cache.upsert_pod(pod))

    def nodes_list(self, items: Iterable[dict[str, Any]]) -> None:
        self.enqueue(self.cache.replace_nodes(self._records(node_from_dict, items)))
        self.on_nodes_listed()

    def node_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.enqueue(self.cache.delete_node(str((obj.get("metadata") or {}).get("name"))))
            return
        node = self.record(node_from_dict, obj)
        if node is not None:
            self.enqueue(self.cache.upsert_node(node))

    def namespaces_list(self, items: Iterable[dict[str, Any]]) -> None:
        self.enqueue(self.cache.replace_namespaces(self._records(namespace_from_dict, items)))

    def namespace_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.enqueue(self.cache.delete_namespace(str((obj.get("metadata") or {}).get("name"))))
            return
        ns = self.record(namespace_from_dict, obj)
        if ns is not None:
            self.enqueue(self.cache.upsert_namespace(ns))

    # --- VPAs, LimitRanges, ResourceQuotas ------------------------------------------------
    def neighbour_list(self, kind: str, build: Callable[[dict[str, Any]], Any]) -> OnList:
        def on_list(items: Iterable[dict[str, Any]]) -> None:
            self.enqueue(self.cache.replace_neighbours(kind, self._records(build, items)))

        return on_list

    def neighbour_event(self, kind: str, build: Callable[[dict[str, Any]], Any]) -> OnEvent:
        def on_event(event: str, obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            if event == "DELETED":
                ns, name = str(meta.get("namespace")), str(meta.get("name"))
                self.enqueue(self.cache.delete_neighbour(kind, ns, name))
                return
            record = self.record(build, obj)
            if record is not None:
                self.enqueue(self.cache.put_neighbour(kind, record))
            else:
                # Unreadable: the previous version would be trusted wrongly. Forget it and
                # say so; a VPA that cannot be read could be one that owns the limits.
                self.enqueue(self.cache.delete_neighbour(kind, str(meta.get("namespace")), str(meta.get("name"))))

        return on_event

    # --- HeadroomConfig, NodePoolProfile --------------------------------------------------
    def config_listed(self) -> bool:
        """Whether both configuration kinds have been listed. Half the configuration is not
        a configuration: deciding (and logging "nothing will be written") before both are
        listed would be about a state that never existed."""
        return len(self._custom_listed) == len(self.config_kinds)

    def custom_list(self, kind: str) -> OnList:
        def on_list(items: Iterable[dict[str, Any]]) -> None:
            objs = list(items)  # fetched before any lock is taken
            with self.config_lock:
                self.cache.replace_custom(kind, objs)
                self._custom_listed.add(kind)
                if self.config_listed():
                    self.on_config()

        return on_list

    def custom_event(self, kind: str) -> OnEvent:
        def on_event(event: str, obj: dict[str, Any]) -> None:
            with self.config_lock:
                if event == "DELETED":
                    self.cache.delete_custom(kind, str((obj.get("metadata") or {}).get("name")))
                else:
                    self.cache.put_custom(kind, obj)
                if self.config_listed():
                    self.on_config()

        return on_event
