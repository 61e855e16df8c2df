"""The configuration the controller runs on: the last valid HeadroomConfig and profiles.

An object that fails validation (created before a CRD upgrade, say) is reported and
ignored; the previous valid version of it keeps running. With no HeadroomConfig at all,
the defaults apply.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..api.models import HeadroomConfig, NodePoolProfile, profile_from, settings_from
from ..core import keys
from ..core.params import Resolver, Settings

log = logging.getLogger("headroom.config")


def _first_error(kind: str, name: str, exc: ValidationError) -> str:
    err = exc.errors()[0]
    path = ".".join(str(p) for p in err["loc"])
    return f"{kind}/{name}: {path}: {str(err['msg']).removeprefix('Value error, ')}"


@dataclass
class ConfigState:
    config: HeadroomConfig | None = None
    profiles: dict[str, NodePoolProfile] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # "Kind/name" -> message
    resolver: Resolver = field(default_factory=lambda: Resolver.build(settings_from(None), ()))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base(self) -> Settings:
        return self.resolver.base

    def update(self, configs: Iterable[Mapping[str, Any]], profiles: Iterable[Mapping[str, Any]]) -> None:
        """Re-read the custom resources; keep the last valid version of any invalid one."""
        errors: dict[str, str] = {}
        config = None
        for raw in configs:
            name = str(raw.get("metadata", {}).get("name"))
            if name != keys.SINGLETON_NAME:
                errors[f"{keys.CONFIG_KIND}/{name}"] = (
                    f"{keys.CONFIG_KIND}/{name}: metadata.name: ignored; the singleton must be named 'cluster'"
                )
                continue
            try:
                config = HeadroomConfig.model_validate(raw)
            except ValidationError as exc:
                errors[f"{keys.CONFIG_KIND}/{name}"] = _first_error(keys.CONFIG_KIND, name, exc)
                config = self.config
        valid: dict[str, NodePoolProfile] = {}
        for raw in profiles:
            name = str(raw.get("metadata", {}).get("name"))
            try:
                valid[name] = NodePoolProfile.model_validate(raw)
            except ValidationError as exc:
                errors[f"{keys.PROFILE_KIND}/{name}"] = _first_error(keys.PROFILE_KIND, name, exc)
                if name in self.profiles:
                    valid[name] = self.profiles[name]
        resolver = Resolver.build(settings_from(config), (profile_from(p) for p in valid.values()))
        for name, message in resolver.errors.items():
            errors[f"{keys.PROFILE_KIND}/{name}"] = message
        with self._lock:
            for key, message in errors.items():
                if self.errors.get(key) != message:
                    log.error(
                        "invalid configuration ignored; running on the last valid one",
                        extra={"object": key, "error": message},
                    )
            self.config, self.profiles, self.errors, self.resolver = config, valid, errors, resolver

    def settings_for(self, labels: Mapping[str, str]) -> Settings:
        with self._lock:
            return self.resolver.for_labels(labels)
