"""The status Headroom writes back onto HeadroomConfig and every NodePoolProfile.

kstatus reads it as: `observedGeneration` behind → InProgress; `Reconciling=True` →
InProgress; `Stalled=True` → Failed; otherwise Current. Argo CD reads the same conditions
through `health.lua`. A spec change opens a *wave*: the nodes whose settings it changes;
the object is Reconciling until every one of them has been recomputed since.

Long because both kinds' conditions (Ready, Reconciling, Stalled, Conflict, Degraded),
their waves and the pool counts are one concern: what `kubectl get` and a GitOps tool read.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api.resolve import FROZEN, LAST_VALID, Resolution
from ..cluster.client import ApiError
from ..cluster.writer import NotLeader, Writer
from ..core import keys
from ..core.eligibility import LIMIT_OWNED_BY_OTHER, POOL_PAUSED
from ..core.params import mode_of
from ..core.planner import NodePlan

log = logging.getLogger("headroom.status")

GENERATED = ("lastReconcileTime", "lastAppliedTime", "lastHeartbeatTime")  # times: not a reason to rewrite
HEARTBEAT = 60.0  # seconds: the leader rewrites an unchanged status this often, so a stale one means trouble


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class NodeStat:
    pool: str
    managed: int = 0
    unmanaged: int = 0
    at_target: int = 0
    pending: int = 0
    factor: float = 1.0
    dry_run: bool = False
    ok: bool = True
    targets: int = 0  # Σ target limits of managed pods, millicores
    requests: int = 0  # Σ their requests
    deferred: int = 0  # managed pods whose resize the kubelet deferred
    left_to_others: int = 0  # pods whose CPU limit is left to another writer (LimitOwnedByOther)


@dataclass
class Facts:
    """What the controller knows that the status reports (capabilities, counters)."""

    server_version: str | None = None
    pods_resize: bool = False
    pod_level: bool = False
    applied: int = 0
    failed: int = 0


DEFAULT_POOL = "(default)"  # the nodes no NodePoolProfile selects


def _effective(stats: list[NodeStat]) -> float:
    requests = sum(s.requests for s in stats)
    return sum(s.targets for s in stats) / requests if requests else 1.0


def _cond(kind: str, status: str, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "observedGeneration": generation}


def _comparable(status: Mapping[str, Any] | None) -> dict[str, Any]:
    out = copy.deepcopy(dict(status or {}))
    for key in GENERATED:
        out.pop(key, None)
    for c in out.get("conditions") or []:
        c.pop("lastTransitionTime", None)
    return out


@dataclass
class StatusWriter:
    writer: Writer
    objects: Callable[[str], list[dict[str, Any]]]  # kind -> raw objects from the cache
    resolution: Callable[[], Resolution]  # which configuration runs, and what is wrong with it
    node_labels: Callable[[], Mapping[str, Mapping[str, str]]]
    inputs: Callable[[], str | None] = lambda: None  # why the controller's view is incomplete now
    facts: Facts = field(default_factory=Facts)
    min_interval: float = 3.0
    heartbeat: float = HEARTBEAT
    on_heartbeat: Callable[[], None] = lambda: None  # a heartbeat reached the HeadroomConfig (a metric)
    clock: Callable[[], float] = time.monotonic
    nodes: dict[str, NodeStat] = field(default_factory=dict)
    waves: dict[str, tuple[int, set[str]]] = field(default_factory=dict)  # "Kind/name" -> (generation, nodes)
    last_reconcile: str | None = None
    last_applied: dict[str, str] = field(default_factory=dict)  # pool -> time of the last resize
    _written: dict[str, dict[str, Any]] = field(default_factory=dict)
    _written_at: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- inputs -----------------------------------------------------------------------
    def observe(self, plan: NodePlan) -> None:
        managed = at_target = pending = unmanaged = targets = requests = deferred = left = 0
        for pp in plan.pods:
            if pp.reason == POOL_PAUSED:  # managed, with their limits held while the pool is paused
                managed += 1
                at_target += 1
                continue
            if pp.target is None:
                unmanaged += 0 if pp.pod.terminal else 1
                left += pp.reason == LIMIT_OWNED_BY_OTHER
                continue
            managed += 1
            pending += pp.pod.resize_pending
            deferred += pp.pod.resize_deferred
            at_target += not pp.target.apply
            targets += pp.target.target
            requests += pp.target.request
        with self._lock:
            self.nodes[plan.node.name] = NodeStat(
                plan.settings.pool,
                managed,
                unmanaged,
                at_target,
                pending,
                plan.summary.factor,
                plan.settings.dry_run,
                targets=targets,
                requests=requests,
                deferred=deferred,
                left_to_others=left,
            )

    def node_done(self, node: str, ok: bool, wrote: bool) -> None:
        with self._lock:
            stat = self.nodes.get(node)
            if stat is not None:
                stat.ok = ok
                if wrote:
                    self.last_applied[stat.pool] = _now()
            self.last_reconcile = _now()
            for _, pending in self.waves.values():
                pending.discard(node)

    def node_gone(self, node: str) -> None:
        with self._lock:
            self.nodes.pop(node, None)
            for _, pending in self.waves.values():
                pending.discard(node)

    def spec_seen(self, key: str, generation: int, affected: set[str], force: bool = False) -> None:
        """A new generation of an object: its wave is the nodes it affects."""
        with self._lock:
            old = self.waves.get(key)
            if force or old is None or old[0] != generation:
                self.waves[key] = (generation, set(affected))

    # --- computing --------------------------------------------------------------------
    def _conditions(
        self, key: str, obj: Mapping[str, Any], scope: set[str], dry_run: bool, blocked: str | None
    ) -> list[dict[str, Any]]:
        """Stalled, Reconciling, Ready and DryRun of one object whose nodes are `scope`."""
        generation = int((obj.get("metadata") or {}).get("generation") or 0)
        res = self.resolution()
        problem = res.problems.get(key)
        wave = self.waves.get(key)
        waiting = len(wave[1]) if wave is not None and wave[0] == generation else len(scope)
        failed = sorted(n for n in scope if n in self.nodes and not self.nodes[n].ok)
        inputs = self.inputs()
        conds = []
        if problem is not None:
            running = res.running.get(key)
            if running == LAST_VALID:
                consequence = "running on the last valid version (status.lastAppliedSpec)"
            elif running == FROZEN:
                consequence = "no valid version is known, so nothing is written in its scope"
            else:
                consequence = "ignored"
            conds.append(_cond("Stalled", "True", "InvalidSpec", f"{problem}; {consequence}", generation))
            conds.append(_cond("Reconciling", "False", "InvalidSpec", "the spec cannot be acted on", generation))
            conds.append(_cond("Ready", "False", "InvalidSpec", f"{problem}; {consequence}", generation))
        elif blocked is not None:
            conds.append(_cond("Stalled", "True", "ConfigUnusable", blocked, generation))
            conds.append(_cond("Reconciling", "False", "ConfigUnusable", "nothing is written", generation))
            conds.append(_cond("Ready", "False", "ConfigUnusable", blocked, generation))
        elif inputs is not None:
            conds.append(_cond("Stalled", "False", "SpecValid", "the spec is valid", generation))
            conds.append(_cond("Reconciling", "True", "WatchUnsynced", inputs, generation))
            conds.append(_cond("Ready", "Unknown", "WatchUnsynced", inputs, generation))
        else:
            conds.append(_cond("Stalled", "False", "SpecValid", "the spec is valid", generation))
            if waiting:
                conds.append(
                    _cond(
                        "Reconciling",
                        "True",
                        "Progressing",
                        f"{waiting} node(s) still to recompute for generation {generation}",
                        generation,
                    )
                )
                conds.append(_cond("Ready", "Unknown", "Progressing", "recomputing the affected nodes", generation))
            elif failed:
                conds.append(_cond("Reconciling", "False", "ReconcileFailed", "retrying", generation))
                conds.append(
                    _cond(
                        "Ready",
                        "False",
                        "ReconcileFailed",
                        f"the last reconcile failed on {len(failed)} node(s), e.g. {failed[0]}; retrying",
                        generation,
                    )
                )
            else:
                conds.append(_cond("Reconciling", "False", "Reconciled", "every node is computed", generation))
                conds.append(_cond("Ready", "True", "Reconciled", f"{len(scope)} node(s) computed", generation))
        conds.append(
            _cond(
                "DryRun",
                "True" if dry_run else "False",
                "DryRunEnabled" if dry_run else "Active",
                "no resize is written; annotations and metrics only" if dry_run else "resizes are written",
                generation,
            )
        )
        return conds

    def config_status(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        res = self.resolution()
        resolver = res.resolver
        scope = set(self.nodes)
        dry_run = resolver.base.dry_run
        key = f"{keys.CONFIG_KIND}/{obj['metadata']['name']}"
        conds = self._conditions(key, obj, scope, dry_run, resolver.base.blocked)
        pools: dict[str, list[int]] = {p.name: [0, 0] for p in resolver.profiles}
        pools.setdefault("", [0, 0])
        for stat in self.nodes.values():
            entry = pools.setdefault(stat.pool, [0, 0])
            entry[0] += 1
            entry[1] += stat.managed
        pool_settings = {name: resolver.pool_settings(name) for name in pools}
        modes = {name: s.mode if s is not None else "Active" for name, s in pool_settings.items()}
        used = {modes[name] for name, (nodes, _) in pools.items() if nodes}
        status: dict[str, Any] = {
            "observedGeneration": int(obj["metadata"].get("generation") or 0),
            "conditions": conds,
            # Mixed when pools differ (a dry-run or paused pool in an active cluster).
            "mode": _cluster_mode(mode_of(resolver.base.blocked is not None, dry_run, False), used),
            "nodes": len(self.nodes),
            "managedPods": sum(s.managed for s in self.nodes.values()),
            "unmanagedPods": sum(s.unmanaged for s in self.nodes.values()),
            "limitsLeftToOthers": sum(s.left_to_others for s in self.nodes.values()),
            "podsAtTarget": sum(s.at_target for s in self.nodes.values()),
            "pendingResizes": sum(s.pending for s in self.nodes.values()),
            "deferredResizes": sum(s.deferred for s in self.nodes.values()),
            "resizesApplied": self.facts.applied,
            "resizesFailed": self.facts.failed,
            "capabilities": {
                "serverVersion": self.facts.server_version or "",
                "podsResize": self.facts.pods_resize,
                "inPlacePodLevelResources": self.facts.pod_level,
            },
            "pools": [
                {"name": n or DEFAULT_POOL, "mode": modes[n], "nodes": v[0], "managedPods": v[1]}
                for n, v in sorted(pools.items())
            ],
        }
        if self.last_reconcile:
            status["lastReconcileTime"] = self.last_reconcile
        if key in res.applied:
            status["lastAppliedSpec"] = res.applied[key]
        return status

    def profile_status(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        res = self.resolution()
        resolver = res.resolver
        key = f"{keys.PROFILE_KIND}/{name}"
        labels = self.node_labels()
        mine = {n for n, s in self.nodes.items() if s.pool == name}
        profile = next((p for p in resolver.profiles if p.name == name), None)
        settings = resolver.pool_settings(name)

        dry_run = settings.dry_run if settings else resolver.base.dry_run
        blocked = settings.blocked if settings else resolver.base.blocked
        conds = self._conditions(key, obj, mine, dry_run, blocked)
        generation = int(obj["metadata"].get("generation") or 0)
        lost: dict[str, int] = {}
        tied: dict[str, int] = {}  # profiles of the same priority this one wins nodes from by name alone
        if profile is not None:
            for _node, lab in labels.items():
                matching = resolver.matching(lab)
                if profile in matching and matching[0] is not profile:
                    lost[matching[0].name] = lost.get(matching[0].name, 0) + 1
                elif matching and matching[0] is profile:
                    for other in matching[1:]:
                        if other.priority == profile.priority:
                            tied[other.name] = tied.get(other.name, 0) + 1
        by_name = {p.name: p for p in resolver.profiles}
        if lost:
            winners = ", ".join(
                f"'{w}' on {n} node(s)"
                + (
                    " (the same priority: it wins only because its name sorts first)"
                    if profile is not None and by_name[w].priority == profile.priority
                    else " (higher priority)"
                )
                for w, n in sorted(lost.items())
            )
            conds.append(
                _cond(
                    "Conflict",
                    "True",
                    "Overlap",
                    f"selects {sum(lost.values())} node(s) another profile wins: {winners}",
                    generation,
                )
            )
        elif tied:
            others = ", ".join(f"'{o}' on {n} node(s)" for o, n in sorted(tied.items()))
            conds.append(
                _cond(
                    "Conflict",
                    "False",
                    "WinsTie",
                    f"wins nodes that profiles of the same priority also select only because its name sorts "
                    f"first: {others}; set spec.priority to say which should win",
                    generation,
                )
            )
        else:
            conds.append(_cond("Conflict", "False", "NoOverlap", "no other profile wins any of its nodes", generation))
        stats = [self.nodes[n] for n in mine]
        factor = sum(s.factor for s in stats) / len(stats) if stats else 1.0
        paused = bool((obj.get("spec") or {}).get("paused"))
        status: dict[str, Any] = {
            "observedGeneration": generation,
            "conditions": conds,
            "mode": mode_of(blocked is not None, dry_run, paused),
            "matchedNodes": len(mine),
            "managedPods": sum(s.managed for s in stats),
            "pendingResizes": sum(s.pending for s in stats),
            "deferredResizes": sum(s.deferred for s in stats),
            "averageFactor": f"{factor:.2f}",
            # What pods get after the caps: Σ targets / Σ requests of the pool's managed pods.
            "effectiveFactor": f"{_effective(stats):.2f}",
        }
        if name in self.last_applied:
            status["lastAppliedTime"] = self.last_applied[name]
        if key in res.applied:
            status["lastAppliedSpec"] = res.applied[key]
        return status

    # --- writing ----------------------------------------------------------------------
    def flush(self) -> int:
        """Write every status that changed (and whose last write is old enough); the count."""
        written = 0
        for kind, compute in ((keys.CONFIG_KIND, self.config_status), (keys.PROFILE_KIND, self.profile_status)):
            for obj in self.objects(kind):
                if obj.get("metadata", {}).get("deletionTimestamp"):
                    continue
                with self._lock:
                    status = compute(obj)
                key = f"{kind}/{obj['metadata']['name']}"
                if self._write_if_changed(kind, key, obj, status):
                    written += 1
        return written

    def _write_if_changed(self, kind: str, key: str, obj: Mapping[str, Any], status: dict[str, Any]) -> bool:
        new = _comparable(status)
        current = self._written.get(key, _comparable(obj.get("status")))
        now = self.clock()
        if new == current and now - self._written_at.get(key, -1e9) < self.heartbeat:
            return False
        first = key not in self._written_at and not obj.get("status")
        if not first and now - self._written_at.get(key, -1e9) < self.min_interval:
            return False
        old_conds = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}
        stamp = _now()
        for c in status["conditions"]:
            old = old_conds.get(c["type"])
            c["lastTransitionTime"] = (
                old["lastTransitionTime"]
                if old and old.get("status") == c["status"] and old.get("lastTransitionTime")
                else stamp
            )
            if (
                c["status"] == "True"
                and c["type"] in ("Stalled", "Conflict")
                and (not old or old.get("status") != "True")
            ):
                self._event(kind, obj, c)
        status["lastHeartbeatTime"] = stamp
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": kind,
            "metadata": {"name": obj["metadata"]["name"]},
            "status": status,
        }
        try:
            self.writer.apply_status(body)
        except NotLeader:
            return False
        except ApiError as exc:
            if exc.status != 404:
                log.warning("status not written; will retry", extra={"object": key, "error": str(exc)})
            # Try again after the minimum interval, or the server's Retry-After when longer.
            self._written_at[key] = now + max(0.0, (exc.retry_after or 0.0) - self.min_interval)
            return False
        self._written[key] = new
        self._written_at[key] = now
        if kind == keys.CONFIG_KIND:
            self.on_heartbeat()
        return True

    def _event(self, kind: str, obj: Mapping[str, Any], cond: Mapping[str, Any]) -> None:
        reason = "ConfigInvalid" if cond["type"] == "Stalled" else "ProfileConflict"
        meta = obj["metadata"]
        ref = {"apiVersion": keys.API_VERSION, "kind": kind, "name": meta["name"], "uid": meta.get("uid", "")}
        with contextlib.suppress(NotLeader):
            self.writer.object_event(ref, "Warning", reason, str(cond["message"]), "Validate")


def _cluster_mode(base: str, pools: set[str]) -> str:
    """The HeadroomConfig's mode: its own when Blocked or DryRun (every node is then), else
    the one mode of the pools that have nodes, or Mixed when they differ (a dry-run or
    paused pool in an active cluster)."""
    if base != "Active" or not pools:
        return base
    return next(iter(pools)) if len(pools) == 1 else "Mixed"
