"""`headroom run`: watches feed the cache, the cache queues nodes, workers reconcile them."""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cluster import decode
from ..cluster.api import Api, ApiError
from ..cluster.cache import ClusterCache, Stale
from ..cluster.certs import CertManager
from ..cluster.discovery import ServerFacts, discover
from ..cluster.lease import LeaderElector
from ..cluster.watch import Reflector
from ..cluster.writer import APPLIED, CONFLICT, THROTTLED, NotLeader, Outcome, Writer
from ..core import keys, limitrange, quota
from ..core import neighbours as nb
from ..core.capabilities import node_allows_pod_level_resize, pod_level_resize
from ..core.planner import NodePlan
from ..core.records import Node, RecordError, namespace_from_dict, node_from_dict, pod_from_dict
from ..metrics import Metrics, serve
from ..webhook import server as webhook
from .backoff import PodBackoff, RetryDelay
from .config import ConfigState
from .queue import NodeQueue, WriteLimiter
from .reconciler import Reconciler
from .status import StatusWriter

log = logging.getLogger("headroom.controller")

CONFIG_PATH = f"/apis/{keys.API_VERSION}/headroomconfigs"
PROFILE_PATH = f"/apis/{keys.API_VERSION}/nodepoolprofiles"


DEFAULT_GC = gc.get_threshold()


def tune_gc() -> None:
    """After the first sync: move everything alive (the cache, the modules) out of the
    collector's sight, and collect the young generation less often. The watch path makes
    no reference cycles worth chasing every 700 allocations; full collections no longer walk
    a cache of a hundred thousand records. (Measured by tests/bench/bench_controller.py.)"""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


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
    metrics_port: int | None = None  # /metrics (and the probes); None: not served
    health_port: int | None = None  # /healthz, /readyz (and /metrics); None: not served
    metrics_host: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_cert_dir: str | None = None  # tls.crt and tls.key; None: no webhook
    webhook_cert_reload: float = 10.0  # seconds between checks of the certificate files
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


class UnsafeCertDir(ValueError):
    """A certificate directory the controller would write its private key into, but that
    someone else owns or may write to."""


def own_cert_dir(cert_dir: Path) -> Path | None:
    """`cert_dir` when the controller keeps its files itself: a writable directory that is
    not a Secret volume (the kubelet's volumes hold `..data`; the chart mounts them
    read-only). Created (mode 0700) when missing and its parent is writable. None otherwise.

    Raises UnsafeCertDir for a writable directory that is not the running user's own, or
    that its group or others may write: someone else could plant files or links there and
    read or redirect the private key."""
    try:
        cert_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if (cert_dir / "..data").exists() or not os.access(cert_dir, os.W_OK):
        return None
    st = cert_dir.stat()
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeCertDir(
            f"--webhook-cert-dir {cert_dir}: owned by uid {st.st_uid}, not by this user (uid {uid}); "
            f"the private key is written there: use a directory of your own (chown {uid} {cert_dir}, "
            f"or point --webhook-cert-dir at a new path)"
        )
    if st.st_mode & 0o022:
        raise UnsafeCertDir(
            f"--webhook-cert-dir {cert_dir}: mode {st.st_mode & 0o777:04o} lets its group or others write "
            f"there, next to the private key: chmod go-w {cert_dir} (0700 is best)"
        )
    return cert_dir


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
        self._cert_files: Path | None = None  # the certificate directory the controller keeps itself
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
            self._pod_level_for,
            self._count,
            self._observe,
            self._annotation_failed,
            annotate=self.options.status_annotation,
        )
        self.limiter.resizes_waiting = self.reconciler.resizes_waiting
        self.status = StatusWriter(
            api,
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
        self._vpa_stop: threading.Event | None = None  # set: the VPA watch is running
        self._custom_listed: set[str] = set()  # HeadroomConfig / NodePoolProfile lists seen

        self._servers: list[Any] = []
        self.reflectors: list[Reflector] = []
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
        for r in self.reflectors:
            why = r.problem()
            if why is not None:
                return why
        if not self.reflectors:
            return "the watches have not started"
        return None

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
        for r in self.reflectors:
            ok, why = r.alive()
            if not ok:
                return False, why
        return True, "ok"

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
        # status, metrics and logs. Flipping readiness on it would also pull the webhook out of
        # its Service while the server is having trouble.
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

    def _record(self, build: Callable[[dict[str, Any]], Any], obj: dict[str, Any]) -> Any:
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
        self._error("record")
        return None

    def _records(self, build: Callable[[dict[str, Any]], Any], items: Iterable[dict[str, Any]]) -> list[Any]:
        return [r for r in (self._record(build, obj) for obj in items) if r is not None]

    def _pods_list(self, items: Iterable[dict[str, Any]]) -> None:
        self._queue(self.cache.replace_pods(self._records(pod_from_dict, items)))

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            self.backoff.forget(key)
            self.reconciler.forget(key)
            self._queue(self.cache.delete_pod(key))
            return

        pod = self._record(pod_from_dict, obj)
        if pod is not None:
            self._queue(self.cache.upsert_pod(pod))

    def _nodes_list(self, items: Iterable[dict[str, Any]]) -> None:
        self._queue(self.cache.replace_nodes(self._records(node_from_dict, items)))
        self._refresh_pod_level()

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._queue(self.cache.delete_node(str((obj.get("metadata") or {}).get("name"))))
            return
        node = self._record(node_from_dict, obj)
        if node is not None:
            self._queue(self.cache.upsert_node(node))

    def _namespaces_list(self, items: Iterable[dict[str, Any]]) -> None:
        self._queue(self.cache.replace_namespaces(self._records(namespace_from_dict, items)))

    def _namespace_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._queue(self.cache.delete_namespace(str((obj.get("metadata") or {}).get("name"))))
            return
        ns = self._record(namespace_from_dict, obj)
        if ns is not None:
            self._queue(self.cache.upsert_namespace(ns))

    def _neighbour_list(self, kind: str, build: Callable[[dict[str, Any]], Any]) -> Callable[[Iterable[Any]], None]:
        def on_list(items: Iterable[dict[str, Any]]) -> None:
            self._queue(self.cache.replace_neighbours(kind, self._records(build, items)))

        return on_list

    def _neighbour_event(
        self, kind: str, build: Callable[[dict[str, Any]], Any]
    ) -> Callable[[str, dict[str, Any]], None]:
        def on_event(event: str, obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            if event == "DELETED":
                ns, name = str(meta.get("namespace")), str(meta.get("name"))
                self._queue(self.cache.delete_neighbour(kind, ns, name))
                return
            record = self._record(build, obj)
            if record is not None:
                self._queue(self.cache.put_neighbour(kind, record))
            else:
                # Unreadable: the previous version would be trusted wrongly. Forget it and
                # say so; a VPA that cannot be read could be one that owns the limits.
                self._queue(self.cache.delete_neighbour(kind, str(meta.get("namespace")), str(meta.get("name"))))

        return on_event

    def _reflector(self, path: str, on_list: Any, on_event: Any, stop: threading.Event | None = None) -> Reflector:
        typed = {"decode_event": decode.pod_event, "decode_page": decode.pod_list} if path == "/api/v1/pods" else {}
        return Reflector(
            self.api,
            path,
            on_list,
            on_event,
            stop or self.stop,
            timeout_seconds=self.options.watch_timeout,
            on_error=self._error,
            **typed,  # type: ignore[arg-type]
        ).start()

    def _watch_vpas(self) -> None:
        """Watch VerticalPodAutoscalers while the server serves them (the CRD may come and
        go). Until a new watch has listed, `inputs_problem` holds every write back."""
        with self._config_lock:
            if self.facts.vpa and self._vpa_stop is None:
                self._vpa_stop = threading.Event()
                self.reflectors.append(
                    self._reflector(
                        nb.VPA_PATH,
                        self._neighbour_list(nb.VPA_KIND, nb.vpa_from_dict),
                        self._neighbour_event(nb.VPA_KIND, nb.vpa_from_dict),
                        self._vpa_stop,
                    )
                )
                log.info("watching VerticalPodAutoscalers")
            elif not self.facts.vpa and self._vpa_stop is not None:
                self._vpa_stop.set()
                self._vpa_stop = None
                self.reflectors = [r for r in self.reflectors if r.path != nb.VPA_PATH]
                self._queue(self.cache.replace_neighbours(nb.VPA_KIND, ()))
                log.info("VerticalPodAutoscalers are no longer served; stopped watching them")

    def _custom_list(self, kind: str) -> Callable[[Iterable[dict[str, Any]]], None]:
        def on_list(items: Iterable[dict[str, Any]]) -> None:
            objs = list(items)  # fetched before any lock is taken
            with self._config_lock:
                self.cache.replace_custom(kind, objs)
                self._custom_listed.add(kind)
                self._reconfigure()

        return on_list

    def _custom_event(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        def on_event(event: str, obj: dict[str, Any]) -> None:
            with self._config_lock:
                if event == "DELETED":
                    self.cache.delete_custom(kind, str((obj.get("metadata") or {}).get("name")))
                else:
                    self.cache.put_custom(kind, obj)
                self._reconfigure()

        return on_event

    def _reconfigure(self) -> None:
        if len(self._custom_listed) < 2:
            # Half the configuration is not a configuration: deciding (and logging "nothing
            # will be written") before both kinds are listed would be about a state that
            # never existed.
            return
        labels = self.cache.node_labels()
        before = {n: self.config.settings_for(lab) for n, lab in labels.items()}
        self.config.update(self.cache.custom_objects(keys.CONFIG_KIND), self.cache.custom_objects(keys.PROFILE_KIND))
        base = self.config.base
        self.metrics.config_valid.set(1 if self.config.valid else 0)
        self.queue.debounce = base.debounce_seconds
        self.limiter.configure(base.per_node_patches_per_second, base.client_qps)
        changed = {n for n, lab in labels.items() if self.config.settings_for(lab) != before[n]}
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
        ports = {p for p in (self.options.metrics_port, self.options.health_port) if p is not None}
        for port in sorted(ports):
            self._servers.append(serve(self.metrics, port, self.healthy, self.ready, self.options.metrics_host))
        if self.options.webhook_cert_dir:  # every replica serves it, leader or not
            # An unsafe directory stops here, said once; the certificate loop writes into this one.
            self._cert_files = own_cert_dir(Path(self.options.webhook_cert_dir))
            # Not a watched thread: it ends once the server runs (which /healthz then watches).
            threading.Thread(target=self._start_webhook, name="webhook-start", daemon=True).start()
        self.facts = discover(self.api)
        log.info(
            "cluster capabilities",
            extra={"serverVersion": self.facts.server_version, "podsResize": self.facts.pods_resize},
        )
        if not self.facts.pods_resize:
            log.error("the API server does not serve pods/resize (Kubernetes >= 1.35 needed); nothing will be written")
        watches = [
            ("/api/v1/pods", self._pods_list, self._pod_event),
            ("/api/v1/nodes", self._nodes_list, self._node_event),
            ("/api/v1/namespaces", self._namespaces_list, self._namespace_event),
            (CONFIG_PATH, self._custom_list(keys.CONFIG_KIND), self._custom_event(keys.CONFIG_KIND)),
            (PROFILE_PATH, self._custom_list(keys.PROFILE_KIND), self._custom_event(keys.PROFILE_KIND)),
        ]
        for path, kind, build in (
            (limitrange.LIMIT_RANGE_PATH, limitrange.LIMIT_RANGE_KIND, limitrange.limit_range_from_dict),
            (quota.QUOTA_PATH, quota.QUOTA_KIND, quota.quota_from_dict),
        ):
            watches.append((path, self._neighbour_list(kind, build), self._neighbour_event(kind, build)))
        for path, on_list, on_event in watches:
            self.reflectors.append(self._reflector(path, on_list, on_event))
        self._watch_vpas()
        threading.Thread(target=self._await_sync, name="sync", daemon=True).start()
        self._spawn("blocked-log", self._log_blocked)
        if self.options.webhook_secret:
            self._spawn("webhook-certificate", self._cert_loop)

    def _await_sync(self) -> None:
        """Workers start only once every list is in: acting on a partial view (missing
        pods, or a dryRun not yet seen) would write wrong limits."""
        deadline = time.monotonic() + self.options.sync_timeout
        for r in self.reflectors:
            while not r.synced.wait(1.0):
                if self.stop.is_set():
                    return
                if time.monotonic() > deadline:
                    log.error(
                        "still waiting for the first list; are the CRDs installed and RBAC granted?",
                        extra={"path": r.path},
                    )
                    deadline = time.monotonic() + self.options.sync_timeout
        self._refresh_pod_level()
        log.info(
            "caches synced",
            extra={
                "nodes": len(self.cache.nodes),
                "pods": len(self.cache.pods),
                "podLevelResize": self._pod_level_cluster,
                "initialState": "WatchList stream" if all(r.watch_list for r in self.reflectors) else "paginated list",
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
        self._spawn("status", self._status_loop)
        self._spawn("low-priority-writes", lambda: self.writer.lane.run(self.writer, self.stop))
        for i in range(self.options.workers):
            self.workers.append(self._spawn(f"worker-{i}", self._work))
        self._spawn("capabilities", self._refresh_loop)

    def _start_webhook(self) -> None:
        """Serve once the certificate files exist (a managed Secret appears in the mounted
        directory only after the leader created it and the kubelet synced it)."""
        cert_dir = Path(str(self.options.webhook_cert_dir))
        said = False
        while not self.stop.is_set():
            if (cert_dir / "tls.crt").is_file() and (cert_dir / "tls.key").is_file():
                try:
                    sources = webhook.Sources(
                        namespace=self.cache.namespace,
                        resolver=lambda: self.config.resolver,
                        blocked=self.inputs_problem,
                        neighbours=lambda: self.cache.neighbours,
                        nodes=self.cache.nodes_snapshot,
                        pod_level_resize=self._pod_level_for,  # the reconciler's own capability fact
                    )
                    self._servers.append(
                        webhook.WebhookServer(
                            self.options.webhook_port,
                            cert_dir,
                            sources,
                            self.options.metrics_host,
                            self.metrics.observe_webhook,
                            self.options.webhook_cert_reload,
                        ).start()
                    )
                    log.info("webhook serving", extra={"port": self.options.webhook_port})
                    return
                except Exception:
                    log.exception("webhook server failed to start; retrying")
                    self._error("webhook")
            elif not said:
                log.info("waiting for the webhook certificate files", extra={"dir": str(cert_dir)})
                said = True
            self.stop.wait(1.0)

    def _cert_loop(self) -> None:
        """The leader keeps the webhook certificate and the caBundle right (cluster/certs.py)."""
        o = self.options
        manager = CertManager(
            self.api,
            o.lease_namespace,
            str(o.webhook_secret),
            list(o.webhook_names),
            str(o.webhook_configuration),
        )
        files = self._cert_files
        # A check reads the Secret and the webhook configuration (two GETs) and fixes what
        # differs, whatever the order the user made them in: every `webhook_cert_check`
        # seconds, at once when this replica starts or stops leading, and every second while
        # its own directory has no certificate yet.
        due, was_leading = 0.0, None
        while not self.stop.wait(1.0 if was_leading is not None else 0.0):
            leading = self.leading()
            if leading == was_leading and time.monotonic() < due:
                continue
            was_leading, due = leading, time.monotonic() + o.webhook_cert_check
            try:
                if leading:
                    self.writer.fence()
                    manager.ensure()
                if files is not None:
                    # A directory of the controller's own (off-cluster): no kubelet puts the
                    # Secret there.
                    manager.write_files(files)
                    if not (files / "tls.crt").is_file():
                        due = time.monotonic() + 1.0
            except NotLeader:
                due = 0.0
            except ApiError as exc:
                log.warning("webhook certificate check failed; retrying", extra={"error": str(exc)})
                self._error("certificate")
            except Exception:
                log.exception("webhook certificate check crashed; retrying")
                self._error("certificate")

    def _log_blocked(self) -> None:
        """Say once, when it starts and when it ends, that writes are held back and why."""
        while not self.stop.wait(1.0):
            try:
                why = self.inputs_problem() if self.synced.is_set() else None
                if why != self._blocked_logged:
                    if why is None:
                        log.info("view complete again: writes resume")
                    else:
                        log.warning("view incomplete: no pod is written", extra={"reason": why})
                    self._blocked_logged = why
                self.metrics.writes_blocked.set(0 if why is None else 1)
            except Exception:
                log.exception("blocked-writes check crashed")
                self._error("health")

    def _status_loop(self) -> None:
        while not self.stop.wait(0.5):
            if self.leading():
                try:
                    self.status.flush()
                except Exception:
                    log.exception("status update failed")
                    self._error("status")

    def _refresh_loop(self) -> None:
        while not self.stop.wait(self.options.capability_refresh):
            try:
                self.facts = discover(self.api)
                self._refresh_pod_level()
                self._watch_vpas()
            except ApiError as exc:
                log.warning("capability refresh failed", extra={"error": str(exc)})
                self._error("capabilities")
            except Exception:
                log.exception("capability refresh crashed")
                self._error("capabilities")

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
