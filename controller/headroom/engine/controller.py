"""`headroom run`: the inputs (cluster/inputs.py: watches, cache, configuration,
capabilities) queue the nodes a change makes stale, workers reconcile them
(engine/reconciler.py), and the leader writes status (engine/status.py). What else the
process serves (in development, the webhook) the entry point hands it as services and
tasks.

This module assembles those parts and runs their threads: the options, the wiring between
the parts, what starts once the inputs are synced, the loops, and shutdown."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cluster.cache import Stale
from ..cluster.client import Api
from ..cluster.inputs import InputOptions, Inputs, Reactions
from ..cluster.lease import LeaderElector
from ..cluster.loop import every
from ..cluster.writer import APPLIED, CONFLICT, THROTTLED, NotLeader, Outcome, Writer
from ..core import keys
from ..core.params import Resolver
from ..core.planner import NodePlan
from ..metrics import Metrics, serve_ports
from .backoff import PodBackoff, RetryDelay
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
        o = self.options
        self.inputs = Inputs(
            api,
            self.stop,
            InputOptions(
                watch_timeout=o.watch_timeout, sync_timeout=o.sync_timeout, capability_refresh=o.capability_refresh
            ),
            Reactions(
                stale=self._queue,
                pod_gone=self._forget_pod,
                config=self._reconfigure,
                capabilities=self._took_capabilities,
                error=self.count_error,
            ),
        )
        self.cache, self.config, self.watches = self.inputs.cache, self.inputs.config, self.inputs.watches
        self.queue = NodeQueue()
        self.limiter = WriteLimiter()
        self.backoff = PodBackoff()
        self.retry = RetryDelay()
        self.metrics = Metrics(pod_series=self.options.pod_metrics, lag_seconds=self.options.resize_lag_seconds)
        self.metrics.queue_depth.set_function(self.queue.depth)
        self.elector: LeaderElector | None = None
        if o.leader_elect:
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
            Hooks(
                self.inputs.pod_level_for,
                self._count,
                self._observe,
                self._annotation_failed,
                lambda cause: self.metrics.node_refusals.labels(cause).inc(),
            ),
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
        self._blocked_logged: str | None = None
        self._first_pass: set[str] | None = None  # nodes a new leader has still to recompute
        self._servers: list[Any] = []  # what the process serves: /healthz watches them, shutdown stops them
        self._services: list[Any] = []  # what the entry point hands it to serve too
        self._tasks: list[tuple[str, Callable[[], None]]] = []  # threads the entry point hands it
        self.workers: list[threading.Thread] = []
        self.synced = self.inputs.synced

    def add_service(self, server: Any) -> None:
        """Something else this process serves (the development webhook): its `start()` is
        called first thing when the controller starts (what it raises stops the start), its
        `alive()` is watched by /healthz, its `shutdown()` called at shutdown."""
        self._services.append(server)

    def add_task(self, name: str, target: Callable[[], None]) -> None:
        """A long-running thread started with the controller and watched by /healthz (the
        webhook certificate keeper, which acts while `leading()`)."""
        self._tasks.append((name, target))

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

    def count_error(self, component: str) -> None:
        self.metrics.errors.labels(component).inc()

    def inputs_problem(self) -> str | None:
        return self.inputs.problem()

    def healthy(self) -> tuple[bool, str]:
        """/healthz: every long-running thread is alive and every watch hears from the server."""
        ok, why = self.inputs.healthy()
        if not ok:
            return ok, why
        if self.elector is not None and not self.elector.alive():
            return False, "the leader-election thread has died"
        for server in self._servers:
            alive = getattr(server, "alive", None)
            if alive is not None and not alive():
                return False, "the webhook server has stopped"
        return True, "ok"

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

    def _reconfigure(self, previous: Resolver) -> None:
        """The configuration changed (the inputs took it): queue the nodes whose settings it
        changed."""
        labels = self.cache.node_labels()
        before = {n: previous.settings_for(lab) for n, lab in labels.items()}
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

    def _took_capabilities(self) -> None:
        facts = self.inputs.facts
        self.status.facts.server_version = facts.server_version
        self.status.facts.pods_resize = facts.pods_resize
        self.status.facts.pod_level = self.inputs.pod_level_cluster

    # --- running ----------------------------------------------------------------------
    def start(self) -> None:
        o = self.options
        self._servers += serve_ports(
            o.metrics_port, o.health_port, o.metrics_host, self.metrics, self.healthy, self.ready
        )
        for server in self._services:
            server.start()
            self._servers.append(server)
        self.inputs.start(then=self._synced)
        if not self.inputs.facts.pods_resize:
            log.error("the API server does not serve pods/resize (Kubernetes >= 1.35 needed); nothing will be written")
        spawn = self.inputs.spawn
        spawn(
            "blocked-log",
            lambda: every(1.0, self.stop, self._log_blocked, "blocked-writes check", "health", self.count_error),
        )
        for name, target in self._tasks:
            spawn(name, target)

    def _synced(self) -> None:
        """Every list is in: the first pass (every object's first wave), the leader
        election, the status, the write lane and the workers."""
        nodes = set(self.cache.node_names())
        for kind in (keys.CONFIG_KIND, keys.PROFILE_KIND):
            for obj in self.cache.custom_objects(kind):
                meta = obj.get("metadata") or {}
                self.status.spec_seen(f"{kind}/{meta.get('name')}", int(meta.get("generation") or 0), nodes, force=True)
        if self.elector is not None:
            self.elector.start()
        else:
            self._first_pass = set(nodes)
        for name in nodes:
            self.queue.add(name)
        spawn = self.inputs.spawn
        spawn("status", lambda: every(0.5, self.stop, self._flush_status, "status update", "status", self.count_error))
        spawn("low-priority-writes", lambda: self.writer.lane.run(self.writer, self.stop))
        for i in range(self.options.workers):
            self.workers.append(spawn(f"worker-{i}", self._work))

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

    def _work(self) -> None:
        while not self.stop.is_set():
            try:
                self._work_once()
            except Exception:  # a bug outside reconcile itself: log, count, keep the worker
                log.exception("worker crashed; continuing")
                self.count_error("worker")
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
            self.count_error("reconcile")
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
