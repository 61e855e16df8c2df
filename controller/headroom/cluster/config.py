"""The configuration both processes run on (see api/resolve.py for the rules).

It fails closed: no HeadroomConfig, an invalid one with no valid version known, or a
profile with no usable version blocks writes in their scope; the last valid version of
an object keeps running while a newer one is invalid, and it is remembered here and in
the object's `status.lastAppliedSpec`, so a restarted controller finds it again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ..api.resolve import Resolution, resolve
from ..core import keys
from ..core.params import Resolver, Settings

log = logging.getLogger("headroom.config")


class ConfigState:
    """The resolved configuration and the last valid version of each object. `say`: log
    its problems and whether writes are blocked (the controller does; the webhook process,
    which reports nothing, does not say them twice)."""

    def __init__(self, say: bool = True) -> None:
        self.say = say
        self._lock = threading.Lock()
        self._remembered: dict[str, dict[str, Any]] = {}
        self.resolution: Resolution = resolve((), ())
        self._said_blocked: str | None = None

    @property
    def resolver(self) -> Resolver:
        return self.resolution.resolver

    @property
    def base(self) -> Settings:
        return self.resolution.resolver.base

    @property
    def errors(self) -> dict[str, str]:
        return self.resolution.problems

    @property
    def valid(self) -> bool:
        """Every object is valid and the global configuration is usable."""
        return not self.resolution.problems and self.resolution.usable

    def update(self, configs: Iterable[Mapping[str, Any]], profiles: Iterable[Mapping[str, Any]]) -> Resolution:
        """Re-read the custom resources as they stand in the cache."""
        configs, profiles = list(configs), list(profiles)
        with self._lock:
            new = resolve(configs, profiles, self._remembered)
            old = self.resolution
            # Remember only objects that still exist: a deleted object's spec must not come back.
            self._remembered = dict(new.applied)
            self.resolution = new
        if self.say:
            self._say(old, new, configs, profiles)
        return new

    def _say(
        self,
        old: Resolution,
        new: Resolution,
        configs: list[Mapping[str, Any]],
        profiles: list[Mapping[str, Any]],
    ) -> None:
        for key, message in new.problems.items():
            if old.problems.get(key) != message:
                log.error(
                    "invalid configuration",
                    extra={"object": key, "error": message, "running": new.running.get(key, "ignored")},
                )
        names = {
            f"{kind}/{(o.get('metadata') or {}).get('name')}"
            for kind, objs in ((keys.CONFIG_KIND, configs), (keys.PROFILE_KIND, profiles))
            for o in objs
        }
        for key in old.problems.keys() - new.problems.keys():
            log.info(
                "configuration problem gone",
                extra={"object": key, "why": "fixed" if key in names else "the object was deleted"},
            )
        blocked = new.resolver.base.blocked
        if blocked != self._said_blocked:
            if blocked is not None:
                log.error("nothing will be written", extra={"reason": blocked})
            elif self._said_blocked is not None:
                if new.resolver.base.dry_run:
                    log.info("configuration usable, in dry-run: no pod is written, only what would be is reported")
                else:
                    log.info("configuration usable: writes resume")
            self._said_blocked = blocked
