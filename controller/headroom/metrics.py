"""Prometheus metrics (their names are part of the interface: docs/operations.md lists them) and the /metrics, /healthz, /readyz server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from .core.planner import NodePlan
from .core.records import REFUSAL_CAUSES, applied_limits

# The outcomes headroom_resizes_total counts: what a write ends in (cluster.writer's results)
# and what a dry run counts (engine.reconciler.WOULD_APPLY). Spelled out, not imported: those
# modules bring the Kubernetes client (~26 MB) into whatever imports the metrics; a unit test
# holds the two lists equal.
FOREIGN_MANAGERS = 20  # field managers named in headroom_foreign_writers; the rest are '(other)'
OUTCOMES = (
    *((r, "false") for r in ("applied", "infeasible", "quota-denied", "invalid", "conflict", "throttled", "error")),
    ("would-apply", "true"),
)


@dataclass
class _NodeSeries:
    pool: str
    pods: set[tuple[str, str, str]] = field(default_factory=set)  # (namespace, pod, container)
    managed: int = 0
    pending: int = 0
    deferred: int = 0
    # managed pods whose kubelet reports another CPU limit applied than the spec's -> since when
    lagging: dict[str, float] = field(default_factory=dict)
    running: set[tuple[str, str, str]] = field(default_factory=set)  # (namespace, pod, container) applied series
    left: dict[str, int] = field(default_factory=dict)  # pods left to another writer, by its field manager


class AdmissionMetrics:
    """What both processes export: errors survived, and the admission reviews answered
    (the webhook's families; `headroom webhook` exports only these)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.errors = Counter(
            "headroom_errors",
            "Failures caught and survived, by component (watch, record, reconcile, worker, status, capabilities, "
            "webhook, certificate).",
            ["component"],
            registry=r,
        )
        self.webhook_requests = Counter(
            "headroom_webhook_requests",
            "Admission reviews answered, by result (mutated, unchanged, over-budget, malformed, too-large, slow-body, dropped).",
            ["result"],
            registry=r,
        )
        self.webhook_seconds = Histogram(
            "headroom_webhook_duration_seconds",
            "Time to answer one admission review, from the body read to the answer.",
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2),
        )

    def observe_webhook(self, result: str, seconds: float) -> None:
        self.webhook_requests.labels(result).inc()
        self.webhook_seconds.observe(seconds)


class Metrics(AdmissionMetrics):
    """The controller's: `headroom run`."""

    def __init__(
        self, pod_series: bool = False, lag_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        r = self.registry
        self.node_factor = Gauge(
            "headroom_node_factor",
            "Limit as a multiple of request on the node before caps: 1 + slack / managed requests.",
            ["node", "pool"],
            registry=r,
        )
        self.node_slack = Gauge(
            "headroom_node_slack_cores",
            "Allocatable CPU no pod has requested, in cores (negative when overcommitted).",
            ["node", "pool"],
            registry=r,
        )
        # Per node, never per tenant: a tenant is a label value tenants choose, so a tenant
        # label would let them grow the series without bound (docs/policy.md, "Tenants").
        self.node_tenants_capped = Gauge(
            "headroom_node_tenants_capped",
            "Tenants whose share of the node's slack tenancy.maxNodeSlackShare capped at the last reconcile; "
            "only for nodes where tenancy changes the split (weights that differ, or a cap).",
            ["node", "pool"],
            registry=r,
        )
        # Per-pod series only when asked for (headroom run --pod-metrics): a series per managed
        # container grows with the cluster; every other series grows with the node count.
        self.pod_limit = (
            Gauge(
                "headroom_pod_limit_cores",
                "Target CPU limit of each computed container of a managed pod, in cores.",
                ["namespace", "pod", "container"],
                registry=r,
            )
            if pod_series
            else None
        )
        self.pod_applied = (
            Gauge(
                "headroom_pod_applied_limit_cores",
                "CPU limit the kubelet reports applied (status.containerStatuses[].resources) to each running "
                "computed container of a managed pod, in cores; 0: none.",
                ["namespace", "pod", "container"],
                registry=r,
            )
            if pod_series
            else None
        )
        self.resizes = Counter(
            "headroom_resizes",
            "Resize attempts by outcome; dry_run=true counts what would have been written.",
            ["result", "dry_run"],
            registry=r,
        )
        # Every outcome exported from the start at 0: a rate or increase() over the first
        # failure of a kind would otherwise miss it (the series appears already at 1).
        for result, dry_run in OUTCOMES:
            self.resizes.labels(result, dry_run)
        self.node_refusals = Counter(
            "headroom_resizes_refused_by_node",
            "Resizes the kubelet refused (PodResizePending Infeasible, PodResizeInProgress Error), by cause: "
            "cfs-burst (the kernel refused a CPU quota below the container's CFS burst), infeasible, error.",
            ["cause"],
            registry=r,
        )
        for cause in REFUSAL_CAUSES:
            self.node_refusals.labels(cause)
        self.reconcile_seconds = Histogram(
            "headroom_reconcile_duration_seconds",
            "Time to reconcile one node, writes included.",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.pods_managed = Gauge(
            "headroom_pods_managed",
            "Managed pods per node pool (empty pool: nodes no profile selects).",
            ["pool"],
            registry=r,
        )
        self.pending = Gauge(
            "headroom_pending_resizes", "Managed pods whose resize the kubelet has not finished.", registry=r
        )
        self.deferred = Gauge(
            "headroom_deferred_resizes",
            "Managed pods whose resize the kubelet deferred (PodResizePending, reason Deferred): the node "
            "cannot fit it now.",
            registry=r,
        )
        self.lag_seconds = lag_seconds
        self._clock = clock
        self.resize_lag = Gauge(
            "headroom_resize_lag_pods",
            f"Managed pods whose kubelet has reported another CPU limit applied than the spec's for more than "
            f"{lag_seconds:g}s (headroom run --resize-lag-seconds).",
            registry=r,
        )
        self.resize_lag.set_function(self.lagging)
        self.queue_depth = Gauge("headroom_workqueue_depth", "Nodes waiting to be reconciled.", registry=r)
        self.lane_depth = Gauge(
            "headroom_low_priority_writes_pending",
            "Status annotations and events waiting for the write budget resizes leave.",
            registry=r,
        )
        self.config_valid = Gauge(
            "headroom_config_valid",
            "1 when a HeadroomConfig exists and it and every NodePoolProfile are valid and usable, else 0.",
            registry=r,
        )
        self.heartbeat = Gauge(
            "headroom_heartbeat_timestamp_seconds",
            "When this replica, as leader, last wrote the HeadroomConfig status (at least every minute).",
            registry=r,
        )
        self.writes_blocked = Gauge(
            "headroom_writes_blocked",
            "1 while a watch is failing or relisting, so no pod is written; else 0.",
            registry=r,
        )
        self.foreign_writers = Gauge(
            "headroom_foreign_writers",
            "Pods whose CPU limit another field manager keeps writing, so that Headroom leaves it to that "
            f"manager (reason LimitOwnedByOther). Past {FOREIGN_MANAGERS} managers the rest count as '(other)'.",
            ["manager"],
            registry=r,
        )
        self._left: dict[str, int] = {}  # pods left to other writers, every node, by field manager
        self._left_shown: set[str] = set()  # the labels headroom_foreign_writers has
        self._nodes: dict[str, _NodeSeries] = {}
        # Running totals over _nodes, kept as nodes come and go: a plan costs O(its pods),
        # not O(nodes) (a wave observes a plan per resize).
        self._pool_nodes: dict[str, int] = {}
        self._pool_managed: dict[str, int] = {}
        self._pending = self._deferred = 0

        self._lock = threading.Lock()

    def observe_node(self, plan: NodePlan) -> None:
        name, pool = plan.node.name, plan.settings.pool
        pods: set[tuple[str, str, str]] = set()
        running: set[tuple[str, str, str]] = set()
        managed = pending = deferred = 0
        lagging: dict[str, float] = {}
        left: dict[str, int] = {}
        was = self._nodes.get(name)
        since = was.lagging if was is not None else {}
        gauge, applied_gauge = self.pod_limit, self.pod_applied
        for pp in plan.pods:
            t = pp.target
            if t is None:
                if pp.writer is not None:
                    left[pp.writer] = left.get(pp.writer, 0) + 1
                continue
            managed += 1
            pod = pp.pod
            pending += pod.resize_pending
            deferred += pod.resize_deferred
            if pod.applied is not None:
                lagging[pod.key] = since.get(pod.key) or self._clock()
            if gauge is None or applied_gauge is None:
                continue
            if t.pod_level:
                key = (pod.namespace, pod.name, "")
                pods.add(key)
                gauge.labels(*key).set(t.target / 1000)
            applied = applied_limits(pod)  # {} for a pod-level pod or one not running
            for c in t.containers:
                key = (pod.namespace, pod.name, c.name)
                pods.add(key)
                gauge.labels(*key).set(c.target / 1000)
                if c.name in applied:  # a running app container: what the kubelet reports applied
                    running.add(key)
                    applied_gauge.labels(*key).set((applied[c.name] or 0) / 1000)
        with self._lock:
            old = self._nodes.get(name)
            if old is not None:
                if gauge is not None and applied_gauge is not None:
                    for key in old.pods - pods:
                        gauge.remove(*key)
                    for key in old.running - running:
                        applied_gauge.remove(*key)
                if old.pool != pool:
                    self._drop_node_series(name, old.pool)
            self._nodes[name] = new = _NodeSeries(pool, pods, managed, pending, deferred, lagging, running, left)
            self.node_factor.labels(name, pool).set(plan.summary.factor)
            self.node_slack.labels(name, pool).set(plan.summary.slack / 1000)
            pots = plan.summary.pots
            if pots is not None:
                self.node_tenants_capped.labels(name, pool).set(sum(1 for p in pots.values() if p.capped))
            else:  # only where tenancy changes the split: a cluster without it exports no such series
                with contextlib.suppress(KeyError):
                    self.node_tenants_capped.remove(name, pool)
            self._count(new, 1)  # before the old part goes: the pool's series never blinks
            if old is not None:
                self._count(old, -1)

    def _drop_node_series(self, node: str, pool: str) -> None:
        for gauge in (self.node_factor, self.node_slack, self.node_tenants_capped):
            with contextlib.suppress(KeyError):
                gauge.remove(node, pool)

    def forget_node(self, node: str) -> None:
        with self._lock:
            old = self._nodes.pop(node, None)
            if old is None:
                return
            if self.pod_limit is not None and self.pod_applied is not None:
                for key in old.pods:
                    self.pod_limit.remove(*key)
                for key in old.running:
                    self.pod_applied.remove(*key)
            self._drop_node_series(node, old.pool)
            self._count(old, -1)

    def lagging(self) -> int:
        """Managed pods whose kubelet has reported another CPU limit applied than the spec's
        for longer than `lag_seconds` (read at each scrape, so time passing counts)."""
        cutoff = self._clock() - self.lag_seconds
        with self._lock:
            return sum(1 for n in self._nodes.values() for t in n.lagging.values() if t <= cutoff)

    def _count(self, series: _NodeSeries, sign: int) -> None:
        """Add (`sign` 1) or take away (-1) one node's part of the totals."""
        pool = series.pool
        nodes = self._pool_nodes[pool] = self._pool_nodes.get(pool, 0) + sign
        managed = self._pool_managed[pool] = self._pool_managed.get(pool, 0) + sign * series.managed
        if nodes:
            self.pods_managed.labels(pool).set(managed)
        else:  # the pool's last node: its series goes
            del self._pool_nodes[pool], self._pool_managed[pool]
            with contextlib.suppress(KeyError):
                self.pods_managed.remove(pool)
        self._pending += sign * series.pending
        self._deferred += sign * series.deferred
        self.pending.set(self._pending)
        self.deferred.set(self._deferred)
        if series.left:
            for manager, n in series.left.items():
                total = self._left.get(manager, 0) + sign * n
                if total:
                    self._left[manager] = total
                else:
                    self._left.pop(manager, None)
            self._show_left()

    def _show_left(self) -> None:
        """headroom_foreign_writers from the totals: the FOREIGN_MANAGERS managers holding the
        most pods by name, the rest as '(other)' (a manager's name is the writer's choice)."""
        shown: dict[str, int] = {}
        for manager, n in sorted(self._left.items(), key=lambda kv: (-kv[1], kv[0])):
            label = manager if len(shown) < FOREIGN_MANAGERS else "(other)"
            shown[label] = shown.get(label, 0) + n
        for gone in self._left_shown - shown.keys():  # only labels no longer held go: none blinks
            self.foreign_writers.remove(gone)
        for label, n in shown.items():
            self.foreign_writers.labels(label).set(n)
        self._left_shown = set(shown)


RENDER_EVERY = 1.0  # seconds an exposition is shared between scrapes


def serve(
    port: int,
    host: str = "0.0.0.0",
    *,
    metrics: AdmissionMetrics | None = None,
    healthy: Callable[[], tuple[bool, str]] | None = None,
    ready: Callable[[], tuple[bool, str]] | None = None,
) -> Any:
    """/metrics (with `metrics`) and the probes /healthz, /livez, /readyz (with `healthy`
    and `ready`) on one port, on a loop thread of its own behind the connection guard of
    `serving` (an idle client holds no thread; headers and answers have deadlines). The
    controller serves the two on separate ports, so that the probe port can stay open to
    all while the metrics port is closed by the NetworkPolicy, and no scrape delays a
    probe. The exposition is rendered on a worker thread, one render at a time, at most
    once per RENDER_EVERY seconds and shared by the scrapes meanwhile. Returns the started
    server (`shutdown()` stops it)."""
    from aiohttp import web  # here, not at the top: importing the metrics stays light

    from .serving import LoopServer

    routes: list[tuple[str, str, Any]] = []
    if metrics is not None:
        registry = metrics.registry
        rendered: dict[str, tuple[float, bytes]] = {}  # content type -> (when, exposition)
        rendering = asyncio.Lock()

        async def scrape(request: web.Request) -> web.Response:
            encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
            async with rendering:  # one render at a time; the others take its result
                when, data = rendered.get(content_type, (0.0, b""))
                if time.monotonic() - when >= RENDER_EVERY:
                    data = await asyncio.get_running_loop().run_in_executor(None, encoder, registry)
                    rendered[content_type] = (time.monotonic(), data)
            return web.Response(body=data, headers={"Content-Type": content_type})

        routes.append(("GET", "/metrics", scrape))

    def probe(check: Callable[[], tuple[bool, str]], what: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(request: web.Request) -> web.Response:
            ok, why = check()
            return web.Response(text=(why if ok else f"not {what}: {why}") + "\n", status=200 if ok else 503)

        return answer

    if healthy is not None and ready is not None:
        routes += [
            ("GET", "/healthz", probe(healthy, "healthy")),
            ("GET", "/livez", probe(healthy, "healthy")),
            ("GET", "/readyz", probe(ready, "ready")),
        ]
    return LoopServer("metrics" if metrics is not None else "probes", host, port, routes).start()


def serve_ports(
    metrics_port: int | None,
    health_port: int | None,
    host: str,
    metrics: AdmissionMetrics,
    healthy: Callable[[], tuple[bool, str]],
    ready: Callable[[], tuple[bool, str]],
) -> list[Any]:
    """A process's /metrics and probe servers: on two ports, or on one when both are the
    same port; a port of None is not served."""
    if metrics_port is not None and metrics_port == health_port:
        return [serve(metrics_port, host, metrics=metrics, healthy=healthy, ready=ready)]
    servers = []
    if metrics_port is not None:
        servers.append(serve(metrics_port, host, metrics=metrics))
    if health_port is not None:
        servers.append(serve(health_port, host, healthy=healthy, ready=ready))
    return servers
