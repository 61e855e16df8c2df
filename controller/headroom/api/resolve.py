"""Which configuration runs: the HeadroomConfig and profiles as they stand, their last
valid versions, or nothing at all (fail closed).

One function for the controller, `headroom plan` and `headroom validate`:

- no `HeadroomConfig/cluster` ⇒ every node is blocked (nothing is written);
- an invalid HeadroomConfig ⇒ its last valid version runs; with none known, every node
  is blocked;
- a NodePoolProfile that is invalid, or valid alone but not once merged with the global
  settings ⇒ its last valid (and mergeable) version runs; with none, the profile is
  *frozen*: it keeps the nodes it selects and nothing is written there. Its nodes are
  never handed to the global settings, which would manage pods the profile excludes.

The last valid version of each object is what the controller remembered, else what it
wrote into the object's `status.lastAppliedSpec`, so it survives a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from ..core import keys
from ..core.params import ParamsError, Profile, Resolver, Settings, apply_profile
from ..core.selectors import Selector
from .models import HeadroomConfig, NodePoolProfile, profile_from, settings_from
from .types import LabelSelector

CURRENT, LAST_VALID, FROZEN = "current", "last-valid", "frozen"

NO_CONFIG = (
    f"no {keys.CONFIG_KIND} named '{keys.SINGLETON_NAME}' exists, so nothing is written; "
    f"apply one (start with spec.dryRun: true)"
)


@dataclass(slots=True)
class Resolution:
    resolver: Resolver
    problems: dict[str, str] = field(default_factory=dict)  # "Kind/name" -> what is wrong with it now
    running: dict[str, str] = field(default_factory=dict)  # "Kind/name" -> CURRENT | LAST_VALID | FROZEN
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)  # "Kind/name" -> the spec that runs
    merge_problems: dict[str, ParamsError] = field(default_factory=dict)  # profile name -> merge failure

    @property
    def usable(self) -> bool:
        """True when the global configuration lets anything be written."""
        return self.resolver.base.blocked is None


def _name(raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata")
    return str(meta.get("name")) if isinstance(meta, Mapping) else "?"


def _first_error(kind: str, name: str, exc: ValidationError) -> str:
    err = exc.errors()[0]
    path = ".".join(str(p) for p in err["loc"])
    return f"{kind}/{name}: {path}: {str(err['msg']).removeprefix('Value error, ')}"


def _candidates(
    raw: Mapping[str, Any], key: str, remembered: Mapping[str, Mapping[str, Any]]
) -> Iterable[tuple[str, Any]]:
    """The object as it stands, then its last valid spec (memory, then status)."""
    yield CURRENT, raw
    seen: list[Any] = []
    status = raw.get("status")
    persisted = status.get("lastAppliedSpec") if isinstance(status, Mapping) else None
    for spec in (remembered.get(key), persisted):
        if isinstance(spec, Mapping) and spec not in seen:
            seen.append(spec)
            yield (
                LAST_VALID,
                {
                    "apiVersion": raw.get("apiVersion"),
                    "kind": raw.get("kind"),
                    "metadata": {"name": _name(raw)},
                    "spec": spec,
                },
            )


def _frozen_profile(raw: Mapping[str, Any], why: str) -> Profile | None:
    """The profile reduced to what decides its nodes; None when even that cannot be read."""
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        return None
    try:
        sel = LabelSelector.model_validate(spec.get("nodeSelector"))
    except ValidationError:
        return None
    if sel.is_empty():
        return None
    priority = spec.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 1000:
        priority = 0
    return Profile(
        name=_name(raw),
        priority=priority,
        node_selector=Selector.from_dict(sel.model_dump(by_alias=True, exclude_none=True)),
        blocked=why,
    )


def resolve(
    configs: Iterable[Mapping[str, Any]],
    profiles: Iterable[Mapping[str, Any]],
    remembered: Mapping[str, Mapping[str, Any]] | None = None,
) -> Resolution:
    remembered = remembered or {}
    out = Resolution(Resolver(Settings(), ()))
    base: Settings | None = None
    for raw in configs:
        name = _name(raw)
        key = f"{keys.CONFIG_KIND}/{name}"
        if name != keys.SINGLETON_NAME:
            out.problems[key] = f"{key}: metadata.name: ignored; the singleton must be named '{keys.SINGLETON_NAME}'"
            continue
        for state, candidate in _candidates(raw, key, remembered):
            try:
                model = HeadroomConfig.model_validate(candidate)
            except ValidationError as exc:
                if state == CURRENT:
                    out.problems[key] = _first_error(keys.CONFIG_KIND, name, exc)
                continue
            base = settings_from(model)
            out.running[key] = state
            out.applied[key] = dict(candidate["spec"]) if isinstance(candidate.get("spec"), Mapping) else {}
            break
        else:
            out.running[key] = FROZEN
            base = replace(
                settings_from(None),
                blocked=f"{out.problems[key]}; no valid version is known, so nothing is written until it is fixed",
            )
    if base is None:
        base = replace(settings_from(None), blocked=NO_CONFIG)

    chosen: list[Profile] = []
    for raw in profiles:
        name = _name(raw)
        key = f"{keys.PROFILE_KIND}/{name}"
        for state, candidate in _candidates(raw, key, remembered):
            try:
                profile = profile_from(NodePoolProfile.model_validate(candidate))
            except ValidationError as exc:
                if state == CURRENT:
                    out.problems[key] = _first_error(keys.PROFILE_KIND, name, exc)
                continue
            try:
                if base.blocked is None:
                    apply_profile(base, profile)
            except ParamsError as exc:
                if state == CURRENT:
                    out.problems[key] = str(exc)
                    out.merge_problems[name] = exc
                continue
            chosen.append(profile)
            out.running[key] = state
            out.applied[key] = dict(candidate["spec"])
            break
        else:
            why = (
                f"{out.problems[key]}; no usable version is known, so nothing is written on its nodes until it is fixed"
            )
            frozen = _frozen_profile(raw, why)
            out.running[key] = FROZEN
            if frozen is None:  # its nodes are unknown: no node is safe to write
                base = replace(
                    base,
                    blocked=base.blocked
                    or f"{out.problems[key]}; its node selector cannot be read either, so nothing is written anywhere "
                    "until it is fixed or deleted",
                )
            else:
                chosen.append(frozen)
    out.resolver = Resolver.build(base, chosen)
    return out
