"""`headroom run`: watches feed the cache (cluster/handlers.py), the cache queues nodes,
workers reconcile them (engine/reconciler.py), the leader writes status (engine/status.py),
and, in development (`--webhook-cert-dir`), the process serves the webhook too
(webhook/host.py; the chart runs it apart, as `headroom webhook`).

This module assembles those parts and runs their threads: the options, the wiring between
the parts, start-up (capabilities, watches, the first sync), the loops, and shutdown. It is
long because that is one concern: what runs, in which order, and what /healthz watches."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cluster.cache import ClusterCache, Stale
from ..cluster.client import Api
from ..cluster.discovery import ServerFacts, discover
from ..cluster.handlers import Watches, WatchHandlers
from ..cluster.lease import LeaderElector
from ..cluster.loop import every
from ..cluster.writer import APPLIED, CONFLICT, THROTTLED, NotLeader, Outcome, Writer
from ..core import keys
from ..core.capabilities import node_allows_pod_level_resize, pod_level_resize
from ..core.planner import NodePlan
from ..core.records import Node
from ..metrics import Metrics, serve_ports
from ..runtime import tune_gc
from ..webhook.host import Certificate, Replica, WebhookHost
from ..webhook.peers import ApiServerPeers
from ..webhook.server import Sources
from .backoff import PodBackoff, RetryDelay
from .config import ConfigState
from .queue import NodeQueue, WriteLimiter
from .reconciler import Hooks, Reconciler
from .status import StatusWriter

log = logging.getLogger("headroom.controller")


@dataclass
class Options:
    workers: int = 4
    identity: str = ""
    sync_timeout: float = 120.0
    capability_refresh: float = 300.0
    watch_timeout: int = 300
    leader_elect: bool = True
    lease_namespace: str = "default"
    lease_name: str = "kube-headroom"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_port: int | None = None  # /metrics; None: not served
    health_port: int | None = None  # /healthz, /livez, /readyz only; None: not served
    metrics_host: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_cert_dir: str | None = None  # tls.crt and tls.key; None: no webhook
    webhook_cert_reload: float = 10.0  # seconds between checks of the certificate files
    webhook_api_server_cidrs: tuple[str, ...] = ()  # besides the EndpointSlice default/kubernetes
    # The controller keeps the webhook's certificate: this Secret (in lease_namespace),
    # valid for these names, with its CA in this MutatingWebhookConfiguration's caBundle.
    webhook_secret: str | None = None
    webhook_names: tuple[str, ...] = ()
    webhook_configuration: str | None = None
    webhook_cert_check: float = 10.0
    status_annotation: bool = True  # write kube-headroom.dev/status on managed pods
    pod_metrics: bool = False  # export headroom_pod_limit_cores (a series per managed container)
    # how long a managed pod's applied and spec CPU limits may differ before headroom_resize_lag_pods counts it
    resize_lag_seconds: float = 60.0


class Controller:
    def __init__(self, api: Api, options: Options | None = None) -> None:
        self.api = api
        self.options = options or Options()
        # The chart sets HOSTNAME to the pod's name (the Downward API); that is the identity.
        self.identity = self.options.identity or os.environ.get("HOSTNAME") or socket.gethostname()
        self.stop = threading.Event()
        self.cache = ClusterCache()
        self.config = ConfigState()
        self.queue = NodeQueue()
        self.limiter = WriteLimiter()
        self.backoff = PodBackoff()
        self.retry = RetryDelay()
        self.facts = ServerFacts(None, False)
        self._pod_level_cluster = False
        self.metrics = Metrics(pod_series=self.options.pod_metrics, lag_seconds=self.options.resize_lag_seconds)
        self.metrics.queue_depth.set_function(self.queue.depth)
        self.elector: LeaderElector | None = None
        if self.options.leader_elect:
            o = self.options
            self.elector = LeaderElector(
                api,
                o.lease_namespace,
                o.lease_name,
                self.identity,
                o.lease_duration,
                o.renew_deadline,
                o.retry_period,
                on_started=self._started_leading,
            )
        self.writer = Writer(api, self.identity, self.leading, self.limiter, self.inputs_problem)
        self.metrics.lane_depth.set_function(self.writer.lane.depth)
        self.reconciler = Reconciler(
            self.cache,
            self.config,
            self.writer,
            self.backoff,
            Hooks(self._pod_level_for, self._count, self._observe, self._annotation_failed),
            annotate=self.options.status_annotation,
        )
        self.limiter.resizes_waiting = self.reconciler.resizes_waiting
        self.status = StatusWriter(
            self.writer,
            self.cache.custom_objects,
            lambda: self.config.resolution,
            self.cache.node_labels,
            inputs=self.inputs_problem,
            on_heartbeat=self.metrics.heartbeat.set_to_current_time,
        )
        # Handlers of different reflector threads share the configuration: one at a time.
        self._config_lock = threading.RLock()
        self._threads: dict[str, threading.Thread] = {}  # long-running threads /healthz watches
        self._blocked_logged: str | None = None
        self._first_pass: set[str] | None = None  # nodes a new leader has still to recompute
        self.handlers = WatchHandlers(
            self.cache,
            self._queue,
            forget_pod=self._forget_pod,
            on_error=self._error,
            on_nodes_listed=self._refresh_pod_level,
            on_config=self._reconfigure,
            config_lock=self._config_lock,
            config_kinds=(keys.CONFIG_KIND, keys.PROFILE_KIND),
        )
        self.watches = Watches(
            api, self.handlers, self.stop, pods=True, timeout_seconds=self.options.watch_timeout, on_error=self._error
        )

        self._servers: list[Any] = []
        self.workers: list[threading.Thread] = []
        self.synced = threading.Event()

    # --- wiring -----------------------------------------------------------------------
    def _count(self, result: str, dry_run: bool) -> None:
        self.metrics.resizes.labels(result, str(dry_run).lower()).inc()
        if not dry_run:
            if result == APPLIED:
                self.status.facts.applied += 1
            elif result not in (CONFLICT, THROTTLED):
                self.status.facts.failed += 1

    def _annotation_failed(self, node: str, outcome: Outcome) -> None:
        """A status annotation the server refused: recompute the node after the retry delay
        (it queues the annotation again)."""
        self.queue.add(node, after=max(self.retry.next(node), outcome.retry_after or 0.0), hold=True)

    def _error(self, component: str) -> None:
        self.metrics.errors.labels(component).inc()

    def inputs_problem(self) -> str | None:
        """Why the view is incomplete now (a watch failing, relisting or not yet listed);
        None when every input is whole. Pods, nodes, namespaces and both custom resources
        feed every node's decision, so any one of them blocks every pod write."""
        return self.watches.problem()

    def healthy(self) -> tuple[bool, str]:
        """/healthz: every long-running thread is alive and every watch hears from the server."""
        if self.stop.is_set():
            return False, "stopping"
        for name, t in self._threads.items():
            if not t.is_alive():
                return False, f"thread {name} has died"
        if self.elector is not None and not self.elector.alive():
            return False, "the leader-election thread has died"
        for server in self._servers:
            alive = getattr(server, "alive", None)
            if alive is not None and not alive():
                return False, "the webhook server has stopped"
        return self.watches.alive()

    def _spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads[name] = t
        t.start()
        return t

    def _observe(self, plan: NodePlan) -> None:
        self.metrics.observe_node(plan)
        self.status.observe(plan)

    def leading(self) -> bool:

        return self.elector is None or self.elector.is_leader()

    def _started_leading(self) -> None:
        # A new leader recomputes every node at once: the previous one may have died mid-way.
        self.reconciler.reset()
        self.writer.lane.clear()
        names = self.cache.node_names()
        self._first_pass = set(names)
        for name in names:
            self.queue.add(name, immediate=True)

    def _pass_progress(self, node: str) -> None:
        if self._first_pass is None:
            return
        self._first_pass.discard(node)
        if not self._first_pass:
            self._first_pass = None
            log.info("first pass complete", extra={"nodes": len(self.cache.node_names())})

    def ready(self) -> tuple[bool, str]:
        if not self.synced.is_set():
            return False, "caches not synced"
        # A failed or throttled write is the API server's state, not this replica's: it shows in
        # status, metrics and logs. Flipping readiness on it would only stall a rolling update
        # while the server is having trouble.
        return True, "ok"

    def _pod_level_for(self, node: Node) -> bool:
        return node_allows_pod_level_resize(node, self._pod_level_cluster)

    def _queue(self, stale: Stale) -> None:
        for name in stale.gone:
            self.queue.forget(name)
            self.limiter.forget(name)
            self.reconciler.node_gone(name)
            self.metrics.forget_node(name)
            self.status.node_gone(name)

        for name in stale.urgent:
            self.reconciler.changed(name)
            self.queue.add(name, immediate=True)
        for name in stale.nodes - stale.urgent:
            self.reconciler.changed(name)
            self.queue.add(name)

    def _forget_pod(self, key: str) -> None:
        self.backoff.forget(key)
        self.reconciler.forget(key)

    def _reconfigure(self) -> None:
        """The configuration changed (called by the handlers once both kinds are listed):
        take it, and queue the nodes whose settings it changed."""
        labels = self.cache.node_labels()
        before = {n: self.config.resolver.settings_for(lab) for n, lab in labels.items()}
        self.config.update(self.cache.custom_objects(keys.CONFIG_KIND), self.cache.custom_objects(keys.PROFILE_KIND))
        base = self.config.base
        self.metrics.config_valid.set(1 if self.config.valid else 0)
        self.queue.debounce = base.debounce_seconds
        self.limiter.configure(base.per_node_patches_per_second, base.client_qps)
        changed = {n for n, lab in labels.items() if self.config.resolver.settings_for(lab) != before[n]}
        self._queue(Stale(nodes=changed))
        # A new generation of any object is Reconciling until the nodes it changed are
        # recomputed. (Before the first sync this is provisional: the sync makes every
        # object's first wave all nodes.)
        for kind in (keys.CONFIG_KIND, keys.PROFILE_KIND):
            for obj in self.cache.custom_objects(kind):
                meta = obj.get("metadata") or {}
                self.status.spec_seen(f"{kind}/{meta.get('name')}", int(meta.get("generation") or 0), changed)

    def _refresh_pod_level(self) -> None:
        nodes = [self.cache.view(n) for n in self.cache.node_names()]
        self._pod_level_cluster = pod_level_resize([v.node for v in nodes if v], self.facts.version)
        self.status.facts.server_version = self.facts.server_version
        self.status.facts.pods_resize = self.facts.pods_resize
        self.status.facts.pod_level = self._pod_level_cluster

    # --- running ----------------------------------------------------------------------
    def start(self) -> None:
        o = self.options
        self._servers += serve_ports(
            o.metrics_port, o.health_port, o.metrics_host, self.metrics, self.healthy, self.ready
        )
        webhook = self._webhook_host()
        if webhook is not None:
            webhook.start()  # an unsafe certificate directory stops here, said once
            self._servers.append(webhook)
        self.facts = discover(self.api)
        log.info(
            "cluster capabilities",
            extra={"serverVersion": self.facts.server_version, "podsResize": self.facts.pods_resize},
        )
        if not self.facts.pods_resize:
            log.error("the API server does not serve pods/resize (Kubernetes >= 1.35 needed); nothing will be written")
        self.watches.start()
        self.watches.follow_vpas(self.facts.vpa)
        threading.Thread(target=self._await_sync, name="sync", daemon=True).start()
        self._spawn(
            "blocked-log",
            lambda: every(1.0, self.stop, self._log_blocked, "blocked-writes check", "health", self._error),
        )
        if webhook is not None and webhook.certificate is not None:
            self._spawn("webhook-certificate", webhook.keep_certificate)

    def _webhook_host(self) -> WebhookHost | None:
        """The webhook every replica serves (with a certificate directory) and the
        certificate the leader keeps (with a Secret to keep it in); None with neither."""
        o = self.options
        if not o.webhook_cert_dir and not o.webhook_secret:
            return None
        certificate = None
        if o.webhook_secret:
            certificate = Certificate(
                o.lease_namespace,
                o.webhook_secret,
                tuple(o.webhook_names),
                str(o.webhook_configuration),
                o.webhook_cert_check,
            )
        sources = Sources(
            namespace=self.cache.namespace,
            resolver=lambda: self.config.resolver,
            blocked=self.inputs_problem,
            neighbours=lambda: self.cache.neighbours,
            nodes=self.cache.nodes_snapshot,
            pod_level_resize=self._pod_level_for,  # the reconciler's own capability fact
        )
        return WebhookHost(
            self.api,
            Replica(self.stop, self.leading, self.writer.fence, self._error),
            sources,
            cert_dir=o.webhook_cert_dir,
            port=o.webhook_port,
            host=o.metrics_host,
            observe=self.metrics.observe_webhook,
            reload_every=o.webhook_cert_reload,
            certificate=certificate,
            peers=ApiServerPeers(o.webhook_api_server_cidrs, on_error=self._error),
        )

    def _await_sync(self) -> None:
        """Workers start only once every list is in: acting on a partial view (missing
        pods, or a dryRun not yet seen) would write wrong limits."""
        if not self.watches.wait_synced(self.options.sync_timeout):
            return
        self._refresh_pod_level()
        log.info(
            "caches synced",
            extra={
                "nodes": len(self.cache.nodes),
                "pods": len(self.cache.pods),
                "podLevelResize": self._pod_level_cluster,
                "initialState": self.watches.initial_state(),
            },
        )
        nodes = set(self.cache.node_names())
        for kind in (keys.CONFIG_KIND, keys.PROFILE_KIND):  # the first pass is every object's first wave
            for obj in self.cache.custom_objects(kind):
                meta = obj.get("metadata") or {}
                self.status.spec_seen(f"{kind}/{meta.get('name')}", int(meta.get("generation") or 0), nodes, force=True)
        tune_gc()
        self.synced.set()
        if self.elector is not None:
            self.elector.start()
        if self.elector is None:
            self._first_pass = set(nodes)
        for name in nodes:
            self.queue.add(name)
        self._spawn("status", lambda: every(0.5, self.stop, self._flush_status, "status update", "status", self._error))
        self._spawn("low-priority-writes", lambda: self.writer.lane.run(self.writer, self.stop))
        for i in range(self.options.workers):
            self.workers.append(self._spawn(f"worker-{i}", self._work))
        self._spawn(
            "capabilities",
            lambda: self.watches.follow_capabilities(
                self.options.capability_refresh, self._config_lock, self._took_facts
            ),
        )

    def _log_blocked(self) -> None:
        """Say once, when it starts and when it ends, that writes are held back and why."""
        why = self.inputs_problem() if self.synced.is_set() else None
        if why != self._blocked_logged:
            if why is None:
                log.info("view complete again: writes resume")
            else:
                log.warning("view incomplete: no pod is written", extra={"reason": why})
            self._blocked_logged = why
        self.metrics.writes_blocked.set(0 if why is None else 1)

    def _flush_status(self) -> None:
        if self.leading():
            self.status.flush()

    def _took_facts(self, facts: ServerFacts) -> None:
        self.facts = facts
        self._refresh_pod_level()

    def _work(self) -> None:
        while not self.stop.is_set():
            try:
                self._work_once()
            except Exception:  # a bug outside reconcile itself: log, count, keep the worker
                log.exception("worker crashed; continuing")
                self._error("worker")
                self.stop.wait(0.5)

    def _work_once(self) -> None:
        if not self.leading():
            self.stop.wait(0.2)  # standby: keep the cache warm, write nothing
            return
        node = self.queue.get(timeout=0.5)
        if node is None:
            return
        started = time.perf_counter()
        try:
            result = self.reconciler.reconcile(node)
        except NotLeader:
            self.queue.done(node)
            self.queue.add(node, after=0.0)  # the next leader (maybe us again) redoes it
            return
        except Exception:
            log.exception("reconcile crashed; node will be retried", extra={"node": node})
            self._error("reconcile")
            self.queue.done(node)
            self.queue.add(node, after=self.retry.next(node), hold=True)
            return
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        if result.blocked is None and not result.partial:
            self.status.node_done(node, ok=not result.failed, wrote=result.resizes > 0)
            if not result.failed:
                self._pass_progress(node)
        self.queue.done(node)
        if result.failed:
            # Exponential backoff with jitter; a Retry-After from the server is a floor.
            delay = self.retry.next(node)
            self.queue.add(node, after=max(delay, result.requeue_after or 0.0), hold=True)
        else:
            self.retry.reset(node)
            if result.requeue_after is not None:
                self.queue.add(node, after=result.requeue_after, hold=result.hold)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop taking work, let in-flight writes finish (up to `timeout`), hand the lease back."""
        self.stop.set()
        self.queue.shutdown()
        deadline = time.monotonic() + timeout
        for t in self.workers:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.elector is not None:
            self.elector.stop(release=True)
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
