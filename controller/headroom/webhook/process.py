"""`headroom webhook`: the admission webhook as a process of its own, as the chart runs it
(a Deployment of equal replicas behind the webhook's Service).

It keeps its own caches of what a decision reads (nodes, namespaces, the configuration,
LimitRanges, VerticalPodAutoscalers: not pods, nor ResourceQuotas), serves the webhook from
the certificate directory the chart mounts, and writes nothing to the cluster: the
controller's leader keeps the certificate. So a flood of admission reviews can neither
slow a resize nor take the controller's memory, and a controller restart does not stop
admission. /readyz answers only once the caches are synced and the certificate is served,
so the Service sends reviews only to replicas that can decide them."""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from ..api.resolve import Resolution, resolve
from ..cluster.cache import ClusterCache
from ..cluster.client import Api
from ..cluster.discovery import ServerFacts, discover
from ..cluster.handlers import Watches, WatchHandlers
from ..core import keys
from ..core.capabilities import node_allows_pod_level_resize, pod_level_resize
from ..core.records import Node
from ..metrics import AdmissionMetrics, serve_ports
from ..runtime import share_the_gil, tune_gc
from .host import Replica, WebhookHost
from .peers import ApiServerPeers
from .server import Sources

log = logging.getLogger("headroom.webhook")


@dataclass
class WebhookOptions:
    cert_dir: str
    port: int = 9443
    cert_reload: float = 10.0  # seconds between checks of the certificate files
    metrics_port: int | None = None
    health_port: int | None = None
    host: str = "0.0.0.0"
    watch_timeout: int = 300
    sync_timeout: float = 120.0
    capability_refresh: float = 300.0
    api_server_cidrs: tuple[str, ...] = ()  # besides the EndpointSlice default/kubernetes


class WebhookProcess:
    def __init__(self, api: Api, options: WebhookOptions) -> None:
        self.api, self.options = api, options
        self.identity = os.environ.get("HOSTNAME") or socket.gethostname()
        self.stop = threading.Event()
        self.cache = ClusterCache()
        self.metrics = AdmissionMetrics()
        self.facts = ServerFacts(None, False)
        self._pod_level_cluster = False
        self._remembered: dict[str, dict[str, Any]] = {}
        self.resolution: Resolution = resolve((), ())
        self._config_lock = threading.RLock()
        handlers = WatchHandlers(
            self.cache,
            lambda stale: None,  # nothing to queue: each review reads the cache when it comes
            forget_pod=lambda key: None,
            on_error=self._error,
            on_nodes_listed=self._refresh_pod_level,
            on_config=self._reconfigure,
            config_lock=self._config_lock,
            config_kinds=(keys.CONFIG_KIND, keys.PROFILE_KIND),
        )
        self.watches = Watches(
            api,
            handlers,
            self.stop,
            pods=False,
            quotas=False,
            timeout_seconds=options.watch_timeout,
            on_error=self._error,
        )
        self.synced = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._servers: list[Any] = []
        sources = Sources(
            namespace=self.cache.namespace,
            resolver=lambda: self.resolution.resolver,
            blocked=self.watches.problem,
            neighbours=lambda: self.cache.neighbours,
            nodes=self.cache.nodes_snapshot,
            pod_level_resize=self._pod_level_for,
        )
        self.host = WebhookHost(
            api,
            Replica(self.stop, leading=lambda: False, fence=lambda: None, on_error=self._error),
            sources,
            cert_dir=options.cert_dir,
            port=options.port,
            host=options.host,
            observe=self.metrics.observe_webhook,
            reload_every=options.cert_reload,
            certificate=None,  # the controller's leader keeps it: this process writes nothing
            peers=ApiServerPeers(options.api_server_cidrs, on_error=self._error),
        )

    def _error(self, component: str) -> None:
        self.metrics.errors.labels(component).inc()

    def _reconfigure(self) -> None:
        """The last valid version of each object stays in force while a newer one is
        invalid, as in the controller (which reports the problems; this process does not
        say them twice)."""
        self.resolution = resolve(
            self.cache.custom_objects(keys.CONFIG_KIND), self.cache.custom_objects(keys.PROFILE_KIND), self._remembered
        )
        self._remembered = dict(self.resolution.applied)

    def _pod_level_for(self, node: Node) -> bool:
        return node_allows_pod_level_resize(node, self._pod_level_cluster)

    def _refresh_pod_level(self) -> None:
        nodes = self.cache.nodes_snapshot()
        self._pod_level_cluster = pod_level_resize(list(nodes.values()), self.facts.version)

    def healthy(self) -> tuple[bool, str]:
        if self.stop.is_set():
            return False, "stopping"
        for name, t in self._threads.items():
            if not t.is_alive():
                return False, f"thread {name} has died"
        if not self.host.alive():
            return False, "the webhook server has stopped"
        return self.watches.alive()

    def ready(self) -> tuple[bool, str]:
        """Only a replica that can decide takes reviews: its caches synced and its
        certificate served (a replica without them would make the API server fail open)."""
        if not self.synced.is_set():
            return False, "caches not synced"
        if self.host.server is None:
            return False, "waiting for the webhook certificate files"
        if self.host.server.expired():
            return False, "the webhook certificate served has expired (the controller's leader renews it)"
        return True, "ok"

    def start(self) -> None:
        o = self.options
        share_the_gil()
        self._servers += serve_ports(o.metrics_port, o.health_port, o.host, self.metrics, self.healthy, self.ready)
        self.host.start()  # an unsafe certificate directory stops here, said once
        self._servers.append(self.host)
        self.facts = discover(self.api)
        self.watches.start()
        self.watches.follow_vpas(self.facts.vpa)
        threading.Thread(target=self._await_sync, name="sync", daemon=True).start()
        self._spawn(
            "capabilities",
            lambda: self.watches.follow_capabilities(
                self.options.capability_refresh, self._config_lock, self._took_facts
            ),
        )

    def _spawn(self, name: str, target: Any) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads[name] = t
        t.start()

    def _await_sync(self) -> None:
        if not self.watches.wait_synced(self.options.sync_timeout):
            return
        self._refresh_pod_level()
        tune_gc()
        log.info(
            "caches synced",
            extra={"nodes": len(self.cache.nodes), "initialState": self.watches.initial_state()},
        )
        self.synced.set()

    def _took_facts(self, facts: ServerFacts) -> None:
        self.facts = facts
        self._refresh_pod_level()

    def shutdown(self) -> None:
        self.stop.set()
        for server in self._servers:
            server.shutdown()
        log.info("stopped", extra={"identity": self.identity})

    def run(self) -> None:
        self.start()
        try:
            while not self.stop.wait(1.0):
                pass
        finally:
            self.shutdown()
