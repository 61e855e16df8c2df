"""The watches that feed a cache, and what each does with what it hears: turn the objects into slim records (one that
cannot be read is logged, counted and skipped: it never stops a watch), put them in the
cache, and queue the nodes the change makes stale."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..core import keys, limitrange, quota
from ..core import neighbours as nb
from ..core.records import RecordError, namespace_from_dict, node_from_dict, pod_from_dict
from . import decode, loop
from .cache import ClusterCache, Stale
from .client import Api
from .discovery import ServerFacts, discover
from .watch import Reflector

log = logging.getLogger("headroom.inputs")

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


class Watches:
    """The reflectors that feed one cache through `handlers`: every input of a decision
    (pods too when `pods`), plus VerticalPodAutoscalers while the server serves them.
    Shared by the controller and the webhook, which read the same objects the same way
    (the webhook does not watch pods)."""

    def __init__(
        self,
        api: Api,
        handlers: WatchHandlers,
        stop: threading.Event,
        *,
        pods: bool,
        timeout_seconds: int,
        on_error: Callable[[str], None],
        quotas: bool = True,
    ) -> None:
        self.api, self.handlers, self.stop, self.pods, self.quotas = api, handlers, stop, pods, quotas
        self.timeout_seconds, self.on_error = timeout_seconds, on_error
        self.reflectors: list[Reflector] = []
        self._vpa_stop: threading.Event | None = None  # set: the VPA watch is running
        self._lock = threading.Lock()

    def _reflector(self, path: str, on_list: OnList, on_event: OnEvent, stop: threading.Event) -> Reflector:
        typed = {"decode_event": decode.pod_event, "decode_page": decode.pod_list} if path == keys.PODS_PATH else {}
        return Reflector(
            self.api,
            path,
            on_list,
            on_event,
            stop,
            timeout_seconds=self.timeout_seconds,
            on_error=self.on_error,
            **typed,  # type: ignore[arg-type]
        ).start()

    def start(self) -> None:
        h = self.handlers
        watches: list[tuple[str, OnList, OnEvent]] = [(keys.PODS_PATH, h.pods_list, h.pod_event)] if self.pods else []
        watches += [
            (keys.NODES_PATH, h.nodes_list, h.node_event),
            (keys.NAMESPACES_PATH, h.namespaces_list, h.namespace_event),
            (keys.CONFIG_PATH, h.custom_list(keys.CONFIG_KIND), h.custom_event(keys.CONFIG_KIND)),
            (keys.PROFILE_PATH, h.custom_list(keys.PROFILE_KIND), h.custom_event(keys.PROFILE_KIND)),
        ]
        neighbours: list[tuple[str, str, Callable[[Mapping[str, Any]], Any]]] = [
            (keys.LIMIT_RANGE_PATH, limitrange.LIMIT_RANGE_KIND, limitrange.limit_range_from_dict)
        ]
        if self.quotas:  # what a resize must fit; no admission decision reads them
            neighbours.append((keys.QUOTA_PATH, quota.QUOTA_KIND, quota.quota_from_dict))
        for path, kind, build in neighbours:
            watches.append((path, h.neighbour_list(kind, build), h.neighbour_event(kind, build)))
        with self._lock:
            for path, on_list, on_event in watches:
                self.reflectors.append(self._reflector(path, on_list, on_event, self.stop))

    def follow_vpas(self, served: bool) -> None:
        """Watch VerticalPodAutoscalers while the server serves them (the CRD may come and
        go). Until a new watch has listed, `problem` holds every decision back."""
        h = self.handlers
        with self._lock:
            if served and self._vpa_stop is None:
                self._vpa_stop = threading.Event()
                vpa = nb.VPA_KIND, nb.vpa_from_dict
                self.reflectors.append(
                    self._reflector(keys.VPA_PATH, h.neighbour_list(*vpa), h.neighbour_event(*vpa), self._vpa_stop)
                )
                log.info("watching VerticalPodAutoscalers")
            elif not served and self._vpa_stop is not None:
                self._vpa_stop.set()
                self._vpa_stop = None
                self.reflectors = [r for r in self.reflectors if r.path != keys.VPA_PATH]
                h.enqueue(h.cache.replace_neighbours(nb.VPA_KIND, ()))
                log.info("VerticalPodAutoscalers are no longer served; stopped watching them")

    def follow_capabilities(self, every: float, lock: threading.RLock, took: Callable[[ServerFacts], None]) -> None:
        """Every `every` seconds until stopped: ask the server what it serves, hand the facts
        to `took`, and watch VPAs while they are served (under `lock`). A failure is logged
        and counted, and the facts known before stay in force."""

        def refresh() -> None:
            facts = discover(self.api)
            took(facts)
            with lock:
                self.follow_vpas(facts.vpa)

        loop.every(every, self.stop, refresh, "capability refresh", "capabilities", self.on_error)

    def problem(self) -> str | None:
        """Why the view is incomplete now (a watch failing, relisting or not yet listed);
        None when every input is whole."""
        for r in self.reflectors:
            why = r.problem()
            if why is not None:
                return why
        if not self.reflectors:
            return "the watches have not started"
        return None

    def alive(self) -> tuple[bool, str]:
        for r in self.reflectors:
            ok, why = r.alive()
            if not ok:
                return False, why
        return True, "ok"

    def wait_synced(self, timeout: float) -> bool:
        """Until every first list is in (False when stopped first), saying every `timeout`
        seconds which one is still missing."""
        deadline = time.monotonic() + timeout
        for r in list(self.reflectors):
            while not r.synced.wait(1.0):
                if self.stop.is_set():
                    return False
                if time.monotonic() > deadline:
                    log.error(
                        "still waiting for the first list; are the CRDs installed and RBAC granted?",
                        extra={"path": r.path},
                    )
                    deadline = time.monotonic() + timeout
        return True

    def initial_state(self) -> str:
        return "WatchList stream" if all(r.watch_list for r in self.reflectors) else "paginated list"
