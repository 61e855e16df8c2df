"""HeadroomConfig and NodePoolProfile (kube-headroom.dev/v1alpha1) as pydantic models.

These classes are the source of truth: `crds/` is generated from them (`headroom crds`)
and `headroom validate` checks GitOps files with them. Every rule the CRD enforces with
CEL has a validator here with the same meaning, so both reject the same objects. Long because the API is: every field with its
description, default and rule.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..core import keys
from ..core.params import Exclusions as CoreExclusions
from ..core.params import Overrides, Profile, Settings
from ..core.quantity import cpu_milli
from ..core.selectors import Selector
from ..core.tenancy import Tenancy as CoreTenancy
from .types import (
    Exclusions,
    GlobalExclusions,
    LabelSelector,
    Model,
    Quantity,
    duration,
    duration_seconds,
)

# One rule for selectors: read the Kubernetes way (an empty selector matches everything),
# and an empty one is refused wherever "everything" would widen what Headroom writes to.
NAMESPACE_SELECTOR_EMPTY = (
    "must not be empty: {} would manage every namespace; to do that on purpose write "
    "matchExpressions: [{key: kubernetes.io/metadata.name, operator: Exists}], otherwise remove the field"
)
STATIC_SELECTOR_EMPTY = (
    "must not be empty; remove the field to use the label kube-headroom.dev/cpu-manager-policy=static, point it "
    "at the label your static-policy nodes carry, or, to turn the check off, select a key no node has "
    "(matchExpressions: [{key: example.com/no-static-cpu-manager, operator: Exists}])"
)
PROFILE_SELECTOR_EMPTY = (
    "must not be empty; to select every node write matchExpressions: [{key: kubernetes.io/os, operator: Exists}] "
    "(or another key every node has)"
)


def non_empty_rule(message: str) -> dict[str, Any]:
    """The CRD's CEL rule for a LabelSelector that must select something explicitly."""
    return {
        "x-kubernetes-validations": [
            {
                "rule": "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
                "(has(self.matchExpressions) && size(self.matchExpressions) > 0)",
                "message": message,
            }
        ]
    }


_MULTIPLIER_RULE: dict[str, Any] = {"rule": "self == 0.0 || self >= 1.0", "message": "must be 0 (no cap) or at least 1"}


_MULTIPLIER_CEL: dict[str, Any] = {"x-kubernetes-validations": [_MULTIPLIER_RULE]}


def _non_empty(message: str) -> Any:
    """The offline twin of `non_empty_rule`: refuse an empty selector with `message`."""

    def check(value: LabelSelector | None) -> LabelSelector | None:
        if value is not None and value.is_empty():
            raise ValueError(message)
        return value

    return check


def _multiplier_ok(value: float | None) -> float | None:
    if value is not None and value != 0 and value < 1:
        raise ValueError(f"{value} is not allowed; use 0 (no cap) or a number >= 1")
    return value


# Written to hold whether or not both fields are present: the API server also checks the
# rule against a bare `default: {}` before nested defaults fill it in.
_DEADBAND_CEL: dict[str, Any] = {
    "x-kubernetes-validations": [
        {
            "rule": "!has(self.shrink) || !has(self.grow) || self.shrink <= self.grow",
            "message": "shrink must be less than or equal to grow",
        }
    ]
}


class Deadband(Model):
    """Relative changes too small to be worth a write."""

    model_config = ConfigDict(json_schema_extra=_DEADBAND_CEL)
    grow: float = Field(
        default=0.10, ge=0, lt=1, description="A raise smaller than this fraction of the current limit is skipped."
    )
    shrink: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="A cut smaller than this fraction of the current limit is skipped; at most grow.",
    )

    @model_validator(mode="after")
    def _order(self) -> Deadband:
        if self.shrink > self.grow:
            raise ValueError(f"shrink ({self.shrink}) must be less than or equal to grow ({self.grow})")
        return self


class DeadbandOverride(Model):
    """Per-pool deadbands; a field left out keeps the HeadroomConfig value."""

    model_config = ConfigDict(json_schema_extra=_DEADBAND_CEL)
    grow: float | None = Field(default=None, ge=0, lt=1, description="Overrides HeadroomConfig spec.deadband.grow.")
    shrink: float | None = Field(default=None, ge=0, lt=1, description="Overrides HeadroomConfig spec.deadband.shrink.")

    @model_validator(mode="after")
    def _order(self) -> DeadbandOverride:
        if self.grow is not None and self.shrink is not None and self.shrink > self.grow:
            raise ValueError(f"shrink ({self.shrink}) must be less than or equal to grow ({self.grow})")
        return self


def _rate_cel(low: float, high: float) -> dict[str, Any]:
    # The schema's `minimum: 0.1` alone lets an integer 0 through: the API server compares
    # an integer value against the minimum truncated to an integer (seen on v1.37.2, see
    # docs/platform-notes.md). The CEL rule compares as numbers.
    return {
        "x-kubernetes-validations": [
            {"rule": f"self >= {low} && self <= {high}", "message": f"must be between {low} and {high}"}
        ]
    }


class RateLimits(Model):
    """Bounds on how fast the controller writes."""

    per_node_patches_per_second: float = Field(
        default=10,
        ge=0.1,
        le=1000,
        description="Writes per second to the pods of one node (0.1 to 1000).",
        json_schema_extra=_rate_cel(0.1, 1000),
    )
    client_qps: float = Field(
        default=50,
        ge=0.1,
        le=10000,
        alias="clientQPS",
        description="Every write the controller makes (resizes, annotations, events, status), per second (0.1 to 10000).",
        json_schema_extra=_rate_cel(0.1, 10000),
    )


class Webhook(Model):
    """The admission webhook's limit for new pods."""

    initial_multiplier: float = Field(
        default=2, ge=1, le=1000, description="A new pod's CPU limit is its request times this (1 to 1000)."
    )


LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class TenantWeight(Model):
    """One tenant's weight in the split of a node's slack."""

    tenant: str = Field(
        min_length=1,
        max_length=253,
        description="The tenant: the value of the tenancy.tenantLabel label of its namespaces; with no tenantLabel "
        "set, a namespace's name; with one set, a namespace without the label is the tenant namespace/<name>.",
    )
    weight: float = Field(
        gt=0,
        le=100,
        description="Its slack per requested core, relative to other tenants (above 0, at most 100): a tenant of "
        "weight 2 gets twice the burst per requested core of a tenant of weight 1 on the same node.",
    )


_WEIGHTS_LIST: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["tenant"]}


class Tenancy(Model):
    """Which namespaces belong to one tenant, and how a node's slack is shared between tenants."""

    tenant_label: str | None = Field(
        default=None,
        min_length=1,
        max_length=317,
        pattern=LABEL_KEY_PATTERN,
        description="A namespace label whose value names the namespace's tenant (for example the tenant label "
        "of a multi-tenancy operator); a namespace without it is a tenant of its own, named namespace/<name>. "
        "Unset: every namespace is its own tenant, named after it. The admission webhook shares its decision time by tenant, so that more namespaces, "
        "service accounts or users do not give one tenant a larger share.",
    )
    weights: list[TenantWeight] = Field(
        default_factory=list,
        max_length=1000,
        description="Tenants whose slack per requested core differs from defaultWeight (tiers), at most one entry "
        "per tenant. A node's slack is shared between tenants by weight times the requests of their managed pods "
        "there, then inside a tenant by request.",
        json_schema_extra=_WEIGHTS_LIST,
    )
    default_weight: float = Field(
        default=1,
        gt=0,
        le=100,
        description="The weight of a tenant the weights list does not name (above 0, at most 100).",
    )
    max_node_slack_share: float = Field(
        default=1,
        gt=0,
        le=1,
        description="The most of a node's slack one tenant's managed pods receive together as burst (above 0, at "
        "most 1); what the cap takes off goes to the other tenants on the node, and where every tenant is capped "
        "the rest stays unused. 1: no cap.",
    )

    @field_validator("weights")
    @classmethod
    def _one_per_tenant(cls, value: list[TenantWeight]) -> list[TenantWeight]:
        seen: set[str] = set()
        for w in value:
            if w.tenant in seen:
                raise ValueError(f"tenant {w.tenant!r} is listed twice; keep one entry per tenant")
            seen.add(w.tenant)
        return value


class TenancyOverride(Model):
    """Per-pool tenancy settings; a field left out keeps the HeadroomConfig value."""

    max_node_slack_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Overrides HeadroomConfig spec.tenancy.maxNodeSlackShare (above 0, at most 1).",
    )


class WebhookOverride(Model):
    """Per-pool webhook settings; a field left out keeps the HeadroomConfig value."""

    initial_multiplier: float | None = Field(
        default=None, ge=1, le=1000, description="Overrides HeadroomConfig spec.webhook.initialMultiplier."
    )


class ObjectMeta(Model):
    """The metadata offline validation reads; other metadata fields pass through."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, description="Object name.")


class ConfigMeta(ObjectMeta):
    """HeadroomConfig metadata: the object is a singleton."""

    @field_validator("name")
    @classmethod
    def _singleton(cls, name: str) -> str:
        if name != keys.SINGLETON_NAME:
            raise ValueError(f"must be '{keys.SINGLETON_NAME}' (HeadroomConfig is a singleton), not {name!r}")
        return name


class Condition(Model):
    """A metav1.Condition."""

    type: str = Field(description="Condition type: Ready, Reconciling, Stalled, Conflict or DryRun.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the condition was set from."
    )
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"}, description="When the status last changed."
    )
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="What happened, for a person.")


_CONDITIONS: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


class Capabilities(Model):
    """What the controller discovered about the cluster."""

    server_version: str | None = Field(default=None, description="The API server's gitVersion.")
    pods_resize: bool | None = Field(default=None, description="Whether the pods/resize subresource is served.")
    in_place_pod_level_resources: bool | None = Field(
        default=None, description="Whether pod-level spec.resources can be resized in place."
    )


class PoolStatus(Model):
    """Counts for one node pool."""

    name: str = Field(description="NodePoolProfile name; (default) for the nodes no profile selects.")
    mode: Literal["Blocked", "DryRun", "Paused", "Active"] | None = Field(default=None, description="The pool's mode.")
    nodes: int = Field(default=0, ge=0, description="Nodes in the pool.")
    managed_pods: int = Field(default=0, ge=0, description="Managed pods on those nodes.")


_LAST_APPLIED: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


class _ControllerStatus(Model):
    """What both kinds' status carries for every controller."""

    last_heartbeat_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="Renewed at least every minute by the controller's leader; an older one means no "
        "controller is working on this object.",
    )


class HeadroomConfigStatus(_ControllerStatus):
    """What the controller does and sees, written by the controller."""

    last_applied_spec: dict[str, Any] | None = Field(
        default=None,
        description="The last spec the controller found valid and ran; it keeps running while the spec is "
        "invalid, also after a restart.",
        json_schema_extra=_LAST_APPLIED,
    )
    observed_generation: int | None = Field(default=None, description="The .metadata.generation this status describes.")
    conditions: list[Condition] | None = Field(
        default=None, description="Ready, Reconciling, Stalled and DryRun.", json_schema_extra=_CONDITIONS
    )
    mode: Literal["Blocked", "DryRun", "Active", "Paused", "Mixed"] | None = Field(
        default=None,
        description="Blocked when nothing may be written (no usable HeadroomConfig: the Ready condition says "
        "why), DryRun when no resize is written, Active when every pool writes, Paused when every node's "
        "pool is paused, Mixed when pools differ (see pools[].mode).",
    )
    nodes: int | None = Field(default=None, description="Nodes seen.")
    managed_pods: int | None = Field(
        default=None, description="Pods whose CPU limit Headroom manages (pods in paused pools included)."
    )
    unmanaged_pods: int | None = Field(default=None, description="Bound pods Headroom leaves alone.")
    limits_left_to_others: int | None = Field(
        default=None,
        description="Pods whose CPU limit another field manager keeps writing, which Headroom leaves to it "
        "(reason LimitOwnedByOther; counted among unmanagedPods).",
    )
    pods_at_target: int | None = Field(
        default=None, description="Managed pods whose limits are within the deadband of their target."
    )
    pending_resizes: int | None = Field(default=None, description="Resizes written but not yet applied by the kubelet.")
    deferred_resizes: int | None = Field(
        default=None,
        description="Managed pods whose resize the kubelet deferred (PodResizePending, reason Deferred): "
        "the node cannot fit it now.",
    )
    resizes_applied: int | None = Field(default=None, description="Resizes accepted since the controller started.")
    resizes_failed: int | None = Field(default=None, description="Resizes refused since the controller started.")
    last_reconcile_time: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, description="When a node was last reconciled."
    )
    capabilities: Capabilities | None = Field(default=None, description="What the cluster supports.")
    pools: list[PoolStatus] | None = Field(
        default=None, description="Counts and mode per NodePoolProfile, plus one named (default) for unmatched nodes."
    )


class HeadroomConfigSpec(Model):
    """Cluster-wide settings. Every field is optional and defaulted."""

    policy: Literal["Proportional"] = Field(
        default="Proportional", description="How slack is shared; Proportional is the only policy today."
    )
    dry_run: bool = Field(default=False, description="Compute, annotate, emit metrics and status, but write no resize.")
    min_burst_floor: Quantity = Field(
        default="1000m",
        description="Least burst a pod gets while the node has slack for it (capped at slack / managed pods).",
    )
    max_multiplier: float = Field(
        default=10,
        ge=0,
        le=1000,
        description="Cap limit <= request * maxMultiplier; 0 disables the cap.",
        json_schema_extra=_MULTIPLIER_CEL,
    )
    deadband: Deadband = Field(
        default_factory=Deadband, description="Relative changes too small to write.", json_schema_extra={"default": {}}
    )
    debounce_period: duration(600, 0.0) = Field(  # type: ignore[valid-type]
        default="2s", description="At most one recompute of a node per period, e.g. 2s or 500ms."
    )
    rate_limits: RateLimits = Field(
        default_factory=RateLimits, description="Write rate limits.", json_schema_extra={"default": {}}
    )
    backoff_period: duration(86400, 1.0) = Field(  # type: ignore[valid-type]
        default="5m", description="How long a pod is left alone after an infeasible or quota-denied resize."
    )
    namespace_selector: LabelSelector | None = Field(
        default=None,
        description="Namespaces managed in addition to those labelled kube-headroom.dev/mode=managed. Must not "
        "be empty ({} would manage every namespace); to manage every namespace say so with matchExpressions "
        "[{key: kubernetes.io/metadata.name, operator: Exists}].",
        json_schema_extra=non_empty_rule(NAMESPACE_SELECTOR_EMPTY),
    )
    exclusions: GlobalExclusions = Field(
        default_factory=GlobalExclusions, description="What is never managed.", json_schema_extra={"default": {}}
    )
    static_cpu_manager_node_selector: LabelSelector | None = Field(
        default=None,
        alias="staticCPUManagerNodeSelector",
        description="Nodes whose kubelet runs the static CPU manager policy (exclusive cores for Guaranteed "
        "pods): nothing there is managed, reason StaticCPUManager. Unset: nodes labelled "
        f"{keys.STATIC_CPU_LABEL}=static (set it with the kubelet's --node-labels); point it at the label your "
        "platform sets instead (OpenShift: cpumanager=true). Must not be empty; to turn the check off, select a "
        "label key no node has.",
        json_schema_extra=non_empty_rule(STATIC_SELECTOR_EMPTY),
    )
    release: Literal["Keep", "Restore"] = Field(
        default="Keep",
        description="What happens to the CPU limit of a pod that leaves management (excluded, opted out, its "
        "namespace no longer managed): Keep leaves the limit Headroom last wrote; Restore writes back the limit "
        "the pod had before Headroom first wrote one (recorded in the annotation "
        f"{keys.ORIGINAL_KEY}). A pod that had no limit keeps its limit: Kubernetes cannot remove one in place.",
    )
    webhook: Webhook = Field(
        default_factory=Webhook, description="Admission webhook settings.", json_schema_extra={"default": {}}
    )
    tenancy: Tenancy = Field(
        default_factory=Tenancy,
        description="How namespaces group into tenants, and how a node's slack is shared between them.",
        json_schema_extra={"default": {}},
    )

    _multiplier = field_validator("max_multiplier")(_multiplier_ok)
    _namespaces = field_validator("namespace_selector")(_non_empty(NAMESPACE_SELECTOR_EMPTY))
    _static = field_validator("static_cpu_manager_node_selector")(_non_empty(STATIC_SELECTOR_EMPTY))


class NodePoolProfileStatus(_ControllerStatus):
    """What the controller sees on this pool's nodes."""

    last_applied_spec: dict[str, Any] | None = Field(
        default=None,
        description="The last spec the controller found valid (also once merged with HeadroomConfig) and ran; "
        "it keeps running while the spec is invalid or unusable, also after a restart.",
        json_schema_extra=_LAST_APPLIED,
    )
    observed_generation: int | None = Field(default=None, description="The .metadata.generation this status describes.")
    conditions: list[Condition] | None = Field(
        default=None, description="Ready, Reconciling, Stalled, Conflict and DryRun.", json_schema_extra=_CONDITIONS
    )
    mode: Literal["Blocked", "DryRun", "Paused", "Active"] | None = Field(
        default=None, description="Blocked (nothing is written: see the Ready condition), DryRun, Paused or Active."
    )
    matched_nodes: int | None = Field(default=None, description="Nodes this profile wins.")
    managed_pods: int | None = Field(default=None, description="Managed pods on those nodes.")
    pending_resizes: int | None = Field(default=None, description="Resizes written but not yet applied.")
    deferred_resizes: int | None = Field(
        default=None, description="Managed pods whose resize the kubelet deferred: the node cannot fit it now."
    )
    average_factor: str | None = Field(
        default=None, description="Mean node factor over the pool before caps (1 + slack / managed requests)."
    )
    effective_factor: str | None = Field(
        default=None,
        description="What the pool's managed pods get after every cap: the sum of their target limits over the "
        "sum of their requests, two decimals.",
    )
    last_applied_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When a resize was last written in this pool.",
    )


class NodePoolProfileSpec(Model):
    """Settings for the nodes a selector picks; unset fields fall back to HeadroomConfig."""

    node_selector: LabelSelector = Field(
        description="Nodes this profile applies to. Must not be empty; to select every node, "
        "say so with a matchExpressions Exists on a key every node has.",
        json_schema_extra=non_empty_rule(PROFILE_SELECTOR_EMPTY),
    )
    priority: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="When profiles overlap on a node the highest wins; ties go to the name sorting first.",
    )
    dry_run: bool | None = Field(default=None, description="Dry-run for this pool; cannot switch off a global dryRun.")
    min_burst_floor: Quantity | None = Field(default=None, description="Overrides HeadroomConfig spec.minBurstFloor.")
    max_multiplier: float | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Overrides HeadroomConfig spec.maxMultiplier (0 disables the cap).",
        json_schema_extra=_MULTIPLIER_CEL,
    )
    deadband: DeadbandOverride | None = Field(
        default=None, description="Overrides HeadroomConfig spec.deadband field by field."
    )
    webhook: WebhookOverride | None = Field(
        default=None, description="Overrides HeadroomConfig spec.webhook field by field."
    )
    tenancy: TenancyOverride | None = Field(
        default=None, description="Overrides HeadroomConfig spec.tenancy.maxNodeSlackShare for this pool's nodes."
    )
    exclusions: Exclusions | None = Field(
        default=None, description="Added to the global exclusions for this pool's nodes."
    )
    paused: bool = Field(
        default=False, description="Keep this pool's limits as they are and write nothing; status still counts."
    )

    _multiplier = field_validator("max_multiplier")(_multiplier_ok)

    _node_selector = field_validator("node_selector")(_non_empty(PROFILE_SELECTOR_EMPTY))


class HeadroomConfig(Model):
    """The cluster-wide configuration singleton; its name must be `cluster`."""

    api_version: Literal["kube-headroom.dev/v1alpha1"] = Field(description="kube-headroom.dev/v1alpha1")
    kind: Literal["HeadroomConfig"] = Field(description="HeadroomConfig")
    metadata: ConfigMeta
    spec: HeadroomConfigSpec = Field(default_factory=HeadroomConfigSpec)
    status: HeadroomConfigStatus | None = None


class NodePoolProfile(Model):
    """Per-node-pool overrides."""

    api_version: Literal["kube-headroom.dev/v1alpha1"] = Field(description="kube-headroom.dev/v1alpha1")
    kind: Literal["NodePoolProfile"] = Field(description="NodePoolProfile")
    metadata: ObjectMeta
    spec: NodePoolProfileSpec
    status: NodePoolProfileStatus | None = None


# --- conversion into the core's plain values -------------------------------------------


def _fraction(value: float) -> Fraction:
    return Fraction(str(value))


def _selector(sel: LabelSelector | None) -> Selector | None:
    return None if sel is None else Selector.from_dict(sel.model_dump(by_alias=True, exclude_none=True))


def _static_cpu_manager(sel: LabelSelector | None) -> Selector | None:
    """Unset: the documented label (no CRD default, so a later server-side apply that sets
    the field replaces it whole). `{}` is refused by the model and the CRD."""
    if sel is None:
        return Settings().static_cpu_manager
    return _selector(sel)


def _exclusions(ex: Exclusions | None) -> CoreExclusions:
    if ex is None:
        return CoreExclusions()
    # An empty exclusion selector matches everything, as in Kubernetes: {} excludes every pod
    # (or node). Reading it as "no exclusion" would manage what the author meant to keep out.
    pod_sel = _selector(ex.pod_selector)
    node_sel = _selector(ex.node_selector)
    return CoreExclusions(
        namespaces=frozenset(ex.namespaces or ()),
        pod_selectors=() if pod_sel is None else (pod_sel,),
        owner_kinds=frozenset(ex.owner_kinds or ()),
        containers=frozenset(ex.containers or ()),
        node_selectors=() if node_sel is None else (node_sel,),
    )


def settings_from(config: HeadroomConfig | None) -> Settings:
    """Global settings; with no HeadroomConfig at all, the defaults."""
    spec = config.spec if config is not None else HeadroomConfigSpec()
    return Settings(
        dry_run=spec.dry_run,
        min_burst_floor=cpu_milli(spec.min_burst_floor),
        max_multiplier=_fraction(spec.max_multiplier),
        deadband_grow=spec.deadband.grow,
        deadband_shrink=spec.deadband.shrink,
        initial_multiplier=_fraction(spec.webhook.initial_multiplier),
        exclusions=_exclusions(spec.exclusions),
        namespace_selector=_selector(spec.namespace_selector),
        static_cpu_manager=_static_cpu_manager(spec.static_cpu_manager_node_selector),
        debounce_seconds=duration_seconds(spec.debounce_period),
        backoff_seconds=duration_seconds(spec.backoff_period),
        per_node_patches_per_second=spec.rate_limits.per_node_patches_per_second,
        client_qps=spec.rate_limits.client_qps,
        release=spec.release,
        tenancy=CoreTenancy(
            label=spec.tenancy.tenant_label,
            weights=tuple((w.tenant, _fraction(w.weight)) for w in spec.tenancy.weights),
            default_weight=_fraction(spec.tenancy.default_weight),
            max_node_slack_share=_fraction(spec.tenancy.max_node_slack_share),
        ),
    )


def profile_from(obj: NodePoolProfile) -> Profile:
    s = obj.spec
    db = s.deadband or DeadbandOverride()
    return Profile(
        name=obj.metadata.name,
        priority=s.priority,
        node_selector=Selector.from_dict(s.node_selector.model_dump(by_alias=True, exclude_none=True)),
        overrides=Overrides(
            dry_run=s.dry_run,
            min_burst_floor=None if s.min_burst_floor is None else cpu_milli(s.min_burst_floor),
            max_multiplier=None if s.max_multiplier is None else _fraction(s.max_multiplier),
            deadband_grow=db.grow,
            deadband_shrink=db.shrink,
            initial_multiplier=None
            if s.webhook is None or s.webhook.initial_multiplier is None
            else _fraction(s.webhook.initial_multiplier),
            max_node_slack_share=None
            if s.tenancy is None or s.tenancy.max_node_slack_share is None
            else _fraction(s.tenancy.max_node_slack_share),
        ),
        exclusions=_exclusions(s.exclusions),
        paused=s.paused,
    )
