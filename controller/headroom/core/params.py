"""Effective parameters per node: HeadroomConfig merged with the winning NodePoolProfile.

The api package turns validated custom resources into these plain values; everything
downstream (eligibility, policy, planner, reconciler, webhook) reads only these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

from . import keys
from .selectors import Selector
from .tenancy import Tenancy


@dataclass(slots=True, frozen=True)
class Exclusions:
    namespaces: frozenset[str] = frozenset()
    pod_selectors: tuple[Selector, ...] = ()  # a pod matching any is excluded
    owner_kinds: frozenset[str] = frozenset()
    containers: frozenset[str] = frozenset()
    node_selectors: tuple[Selector, ...] = ()

    def union(self, other: Exclusions) -> Exclusions:
        return Exclusions(
            self.namespaces | other.namespaces,
            self.pod_selectors + other.pod_selectors,
            self.owner_kinds | other.owner_kinds,
            self.containers | other.containers,
            self.node_selectors + other.node_selectors,
        )


@dataclass(slots=True, frozen=True)
class Settings:
    """Everything the policy and eligibility need for one node."""

    pool: str = ""
    dry_run: bool = False
    paused: bool = False
    min_burst_floor: int = 1000  # millicores
    max_multiplier: Fraction = Fraction(10)  # 0 disables the cap
    deadband_grow: float = 0.10
    deadband_shrink: float = 0.05
    initial_multiplier: Fraction = Fraction(2)
    exclusions: Exclusions = field(default_factory=lambda: Exclusions(namespaces=frozenset({"kube-system"})))
    namespace_selector: Selector | None = None
    # Nodes with the static CPU manager policy (None: no such check).
    static_cpu_manager: Selector | None = field(
        default_factory=lambda: Selector.from_dict({"matchLabels": {keys.STATIC_CPU_LABEL: "static"}})
    )
    debounce_seconds: float = 2.0
    backoff_seconds: float = 300.0
    per_node_patches_per_second: float = 10.0
    client_qps: float = 50.0
    release: str = "Keep"  # Keep or Restore: the limit of a pod that leaves management
    # Tenants: the namespace label naming them, their weights, the cap on one tenant's share.
    tenancy: Tenancy = field(default_factory=Tenancy)
    # Why nothing may be written on these nodes (no HeadroomConfig, an invalid one with no
    # valid version known, a profile unusable and without a valid version); None: writable.
    blocked: str | None = None

    @property
    def mode(self) -> str:
        """Blocked (nothing may be written: no usable configuration), DryRun, Paused or
        Active: how `plan`, status and the printer columns name it."""
        return mode_of(self.blocked is not None, self.dry_run, self.paused)


def mode_of(blocked: bool, dry_run: bool, paused: bool) -> str:
    """The mode of a node's settings, a profile or the global configuration: Blocked wins
    over DryRun, DryRun over Paused."""
    if blocked:
        return "Blocked"
    return "DryRun" if dry_run else "Paused" if paused else "Active"


@dataclass(slots=True, frozen=True)
class Overrides:
    """A profile's optional fields; `None` falls back to the global value."""

    dry_run: bool | None = None
    min_burst_floor: int | None = None
    max_multiplier: Fraction | None = None
    deadband_grow: float | None = None
    deadband_shrink: float | None = None
    initial_multiplier: Fraction | None = None
    max_node_slack_share: Fraction | None = None


@dataclass(slots=True, frozen=True)
class Profile:
    name: str
    priority: int
    node_selector: Selector
    overrides: Overrides = Overrides()
    exclusions: Exclusions = Exclusions()
    paused: bool = False
    blocked: str | None = None  # frozen: the profile keeps its nodes, and nothing is written there

    def sort_key(self) -> tuple[int, str]:
        """Highest priority first; a tie goes to the name that sorts first."""
        return (-self.priority, self.name)


class ParamsError(ValueError):
    """A profile that is valid alone but not merged with the global settings."""

    def __init__(self, profile: str, path: str, detail: str) -> None:
        super().__init__(f"NodePoolProfile/{profile}: {path}: {detail}")
        self.path = path
        self.detail = detail


def apply_profile(base: Settings, profile: Profile) -> Settings:
    """The settings of a node the profile wins. One rule for the controller, `plan` and
    `headroom validate`: raises ParamsError when the merge is not usable."""
    if profile.blocked is not None:
        return replace(base, pool=profile.name, paused=profile.paused, blocked=base.blocked or profile.blocked)
    o = profile.overrides
    merged = replace(
        base,
        pool=profile.name,
        # A pool can add dry-run but never switch off a global dry-run.
        dry_run=base.dry_run or bool(o.dry_run),
        paused=profile.paused,
        min_burst_floor=base.min_burst_floor if o.min_burst_floor is None else o.min_burst_floor,
        max_multiplier=base.max_multiplier if o.max_multiplier is None else o.max_multiplier,
        deadband_grow=base.deadband_grow if o.deadband_grow is None else o.deadband_grow,
        deadband_shrink=base.deadband_shrink if o.deadband_shrink is None else o.deadband_shrink,
        initial_multiplier=base.initial_multiplier if o.initial_multiplier is None else o.initial_multiplier,
        exclusions=base.exclusions.union(profile.exclusions),
        tenancy=base.tenancy
        if o.max_node_slack_share is None
        else replace(base.tenancy, max_node_slack_share=o.max_node_slack_share),
    )
    if merged.deadband_shrink > merged.deadband_grow:
        raise ParamsError(
            profile.name,
            "spec.deadband",
            f"merged with HeadroomConfig the shrink deadband {merged.deadband_shrink} exceeds the grow "
            f"deadband {merged.deadband_grow}; set both in the profile or keep shrink <= grow",
        )
    return merged


@dataclass(slots=True)
class Resolver:
    """Picks the winning profile per node and caches the merged settings per profile."""

    base: Settings
    profiles: tuple[Profile, ...]
    errors: dict[str, str] = field(default_factory=dict)
    _merged: dict[str, Settings] = field(default_factory=dict)

    @classmethod
    def build(cls, base: Settings, profiles: Iterable[Profile]) -> Resolver:
        """A profile whose merge fails is frozen, never dropped: dropping it would hand its
        nodes to the global settings (and manage pods it excludes)."""
        r = cls(base, ())
        kept = []
        for p in sorted(profiles, key=Profile.sort_key):
            try:
                r._merged[p.name] = apply_profile(base, p)
            except ParamsError as exc:
                r.errors[p.name] = str(exc)
                p = replace(p, blocked=f"{exc}; nothing is written on its nodes until it is fixed")
                r._merged[p.name] = apply_profile(base, p)
            kept.append(p)
        r.profiles = tuple(kept)
        return r

    def matching(self, labels: Mapping[str, str]) -> list[Profile]:
        """Every profile that selects a node with these labels, winner first."""
        return [p for p in self.profiles if p.node_selector.matches(labels)]

    def pool_settings(self, pool: str) -> Settings | None:
        """The settings of a pool: the global ones for "" (no profile), a usable profile's
        merged ones by its name, None for any other name."""
        return self._merged.get(pool) if pool else self.base

    def every(self) -> list[Settings]:
        """The global settings and each profile's merged ones: every way a node can be run."""
        return [self.base, *self._merged.values()]

    def settings_for(self, labels: Mapping[str, str]) -> Settings:
        """The settings of a node with these labels: the first profile (by priority) whose
        selector matches them, else the global settings. The one lookup the controller,
        the webhook, `plan` and status use."""

        for p in self.profiles:
            if p.node_selector.matches(labels):
                return self._merged[p.name]
        return self.base
