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

from ..cluster.client import Api
from ..cluster.inputs import InputOptions, Inputs, Reactions
from ..metrics import AdmissionMetrics, serve_ports
from ..runtime import share_the_gil
from .host import Serving, WebhookHost

log = logging.getLogger("headroom.webhook")


@dataclass
class WebhookOptions:
    serving: Serving
    metrics_port: int | None = None
    health_port: int | None = None
    watch_timeout: int = 300
    sync_timeout: float = 120.0
    capability_refresh: float = 300.0


class WebhookProcess:
    def __init__(self, api: Api, options: WebhookOptions) -> None:
        self.api, self.options = api, options
        self.identity = os.environ.get("HOSTNAME") or socket.gethostname()
        self.stop = threading.Event()
        self.metrics = AdmissionMetrics()
        # Neither pods nor quotas: a decision reads neither. The controller reports the
        # configuration's problems; this process does not say them twice.
        self.inputs = Inputs(
            api,
            self.stop,
            InputOptions(
                pods=False,
                quotas=False,
                say_config=False,
                watch_timeout=options.watch_timeout,
                sync_timeout=options.sync_timeout,
                capability_refresh=options.capability_refresh,
            ),
            Reactions(error=self.count_error),  # nothing to queue: each review reads the cache when it comes
        )
        self._servers: list[Any] = []
        self.host = WebhookHost(
            api, self.stop, self.count_error, self.inputs, self.metrics.observe_webhook, options.serving
        )

    def count_error(self, component: str) -> None:
        self.metrics.errors.labels(component).inc()

    def healthy(self) -> tuple[bool, str]:
        ok, why = self.inputs.healthy()
        if ok and not self.host.alive():
            return False, "the webhook server has stopped"
        return ok, why

    def ready(self) -> tuple[bool, str]:
        """Only a replica that can decide takes reviews: its caches synced and its
        certificate served (a replica without them would make the API server fail open)."""
        if not self.inputs.synced.is_set():
            return False, "caches not synced"
        if self.host.server is None:
            return False, "waiting for the webhook certificate files"
        if self.host.server.expired():
            return False, "the webhook certificate served has expired (the controller's leader renews it)"
        return True, "ok"

    def start(self) -> None:
        o = self.options
        share_the_gil()
        self._servers += serve_ports(
            o.metrics_port, o.health_port, o.serving.host, self.metrics, self.healthy, self.ready
        )
        self.host.start()  # an unsafe certificate directory stops here, said once
        self._servers.append(self.host)
        self.inputs.start()

    def shutdown(self) -> None:
        self.stop.set()
        for server in self._servers:
            server.shutdown()
        log.info("stopped", extra={"identity": self.identity})
