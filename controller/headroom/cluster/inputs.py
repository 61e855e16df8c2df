"""What a process of Headroom reads the cluster through: the kit `headroom run` and
`headroom webhook` both build one of.

The cache and the watches that fill it (with their handlers), the configuration with the
last valid version of each object, the API server's capabilities and whether a pod-level
limit can be resized on a node, and the first sync. Each process says what it watches
(the webhook reads neither pods nor ResourceQuotas) and what it does with a change: the
controller queues the nodes a change makes stale; the webhook reads the cache when a
review comes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..core import keys
from ..core.capabilities import node_allows_pod_level_resize, pod_level_resize
from ..core.params import Resolver
from ..core.records import Node
from ..runtime import tune_gc
from .cache import ClusterCache, Stale
from .client import Api
from .config import ConfigState
from .discovery import ServerFacts, discover
from .handlers import Watches, WatchHandlers

log = logging.getLogger("headroom.inputs")


def _nothing(*_: object) -> None:
    return None


@dataclass
class Reactions:
    """What the process does with what the inputs hear; by default, nothing."""

    stale: Callable[[Stale], None] = _nothing  # nodes whose decision a change may have changed
    pod_gone: Callable[[str], None] = _nothing  # a pod's key, once it is deleted
    config: Callable[[Resolver], None] = _nothing  # the configuration changed (the resolver before it)
    capabilities: Callable[[], None] = _nothing  # the server's facts or the pod-level rule refreshed
    error: Callable[[str], None] = _nothing  # counts an error of a component


@dataclass
class InputOptions:
    pods: bool = True  # the webhook decides without them
    quotas: bool = True
    watch_timeout: int = 300
    sync_timeout: float = 120.0
    capability_refresh: float = 300.0
    say_config: bool = True  # log the configuration's problems (one process says them)


class Inputs:
    def __init__(self, api: Api, stop: threading.Event, options: InputOptions, react: Reactions) -> None:
        self.api, self.stop, self.options, self.react = api, stop, options, react
        self.cache = ClusterCache()
        self.config = ConfigState(say=options.say_config)
        self.facts = ServerFacts(None, False)
        self.pod_level_cluster = False
        self.synced = threading.Event()
        self.threads: dict[str, threading.Thread] = {}  # long-running threads /healthz watches
        # Handlers of different reflector threads share the configuration: one at a time.
        self.config_lock = threading.RLock()
        self.handlers = WatchHandlers(
            self.cache,
            react.stale,
            forget_pod=react.pod_gone,
            on_error=react.error,
            on_nodes_listed=self.refresh_pod_level,
            on_config=self._reconfigure,
            config_lock=self.config_lock,
            config_kinds=(keys.CONFIG_KIND, keys.PROFILE_KIND),
        )
        self.watches = Watches(
            api,
            self.handlers,
            stop,
            pods=options.pods,
            quotas=options.quotas,
            timeout_seconds=options.watch_timeout,
            on_error=react.error,
        )

    # --- what decisions read ----------------------------------------------------------
    def problem(self) -> str | None:
        """Why the view is incomplete now (a watch failing, relisting or not yet listed);
        None when every input is whole. Pods, nodes, namespaces and both custom resources
        feed every decision, so any one of them blocks every write."""
        return self.watches.problem()

    def pod_level_for(self, node: Node) -> bool:
        """Whether a pod-level CPU limit can be resized on this node."""
        return node_allows_pod_level_resize(node, self.pod_level_cluster)

    def refresh_pod_level(self) -> None:
        self.pod_level_cluster = pod_level_resize(list(self.cache.nodes_snapshot().values()), self.facts.version)
        self.react.capabilities()

    def _reconfigure(self) -> None:
        """Take the configuration as it stands in the cache (called by the handlers, under
        the configuration lock, once both kinds are listed)."""
        before = self.config.resolver
        self.config.update(self.cache.custom_objects(keys.CONFIG_KIND), self.cache.custom_objects(keys.PROFILE_KIND))
        self.react.config(before)

    def _took_facts(self, facts: ServerFacts) -> None:
        self.facts = facts
        self.refresh_pod_level()

    # --- running ----------------------------------------------------------------------
    def start(self, then: Callable[[], None] = _nothing) -> None:
        """Ask the server what it serves, start the watches, and, from a thread of its own,
        wait for the first sync: then `then()` runs, and the capabilities are followed."""
        self.facts = discover(self.api)
        log.info(
            "cluster capabilities",
            extra={"serverVersion": self.facts.server_version, "podsResize": self.facts.pods_resize},
        )
        self.watches.start()
        self.watches.follow_vpas(self.facts.vpa)
        threading.Thread(target=self._await_sync, args=(then,), name="sync", daemon=True).start()

    def _await_sync(self, then: Callable[[], None]) -> None:
        """Nothing is decided before every list is in: a decision on a partial view (missing
        pods, or a dryRun not yet seen) would be wrong."""
        if not self.watches.wait_synced(self.options.sync_timeout):
            return
        self.refresh_pod_level()
        log.info(
            "caches synced",
            extra={
                "nodes": len(self.cache.nodes),
                "pods": len(self.cache.pods),
                "podLevelResize": self.pod_level_cluster,
                "initialState": self.watches.initial_state(),
            },
        )
        tune_gc()
        self.synced.set()
        then()
        self.spawn(
            "capabilities",
            lambda: self.watches.follow_capabilities(
                self.options.capability_refresh, self.config_lock, self._took_facts
            ),
        )

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """A long-running thread of the process, watched by /healthz."""
        t = threading.Thread(target=target, name=name, daemon=True)
        self.threads[name] = t
        t.start()
        return t

    def healthy(self) -> tuple[bool, str]:
        """Every long-running thread is alive and every watch hears from the server."""
        if self.stop.is_set():
            return False, "stopping"
        for name, t in self.threads.items():
            if not t.is_alive():
                return False, f"thread {name} has died"
        return self.watches.alive()
