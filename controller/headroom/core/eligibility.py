"""Whether a pod is managed, and if not, the first reason why (in the order docs/policy.md lists them)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from . import keys
from .params import Settings
from .records import APP, BURSTABLE, INIT, POD_LIMIT, Container, Namespace, Node, Pod

MANAGED = "Managed"
NOT_BOUND = "NotBound"
TERMINAL = "Terminal"
TERMINATING = "Terminating"
MIRROR_POD = "MirrorPod"
CONFIG_UNUSABLE = "ConfigUnusable"
NAMESPACE_NOT_MANAGED = "NamespaceNotManaged"
NAMESPACE_EXCLUDED = "NamespaceExcluded"
POD_OPTED_OUT = "PodOptedOut"
POD_SELECTOR_EXCLUDED = "PodSelectorExcluded"
OWNER_KIND_EXCLUDED = "OwnerKindExcluded"
NODE_EXCLUDED = "NodeExcluded"
WINDOWS_NODE = "WindowsNode"
STATIC_CPU_MANAGER = "StaticCPUManager"
NOT_BURSTABLE = "NotBurstable"
ZERO_CPU_REQUEST = "ZeroCPURequest"
RESTART_ON_RESIZE = "RestartOnResize"
POD_LEVEL_UNSUPPORTED = "PodLevelResourcesUnsupported"
BACKING_OFF = "BackingOff"
POOL_PAUSED = "PoolPaused"
INVALID_ANNOTATION = "InvalidAnnotation"
VPA_CONTROLS_LIMITS = "VPAControlsLimits"
LIMIT_RANGE_CONFLICT = "LimitRangeConflict"
LIMIT_OWNED_BY_OTHER = "LimitOwnedByOther"

REASONS = (
    NOT_BOUND,
    TERMINAL,
    TERMINATING,
    MIRROR_POD,
    CONFIG_UNUSABLE,
    NAMESPACE_NOT_MANAGED,
    NAMESPACE_EXCLUDED,
    POD_OPTED_OUT,
    POD_SELECTOR_EXCLUDED,
    OWNER_KIND_EXCLUDED,
    VPA_CONTROLS_LIMITS,
    STATIC_CPU_MANAGER,
    NODE_EXCLUDED,
    WINDOWS_NODE,
    NOT_BURSTABLE,
    ZERO_CPU_REQUEST,
    RESTART_ON_RESIZE,
    POD_LEVEL_UNSUPPORTED,
    BACKING_OFF,
    POOL_PAUSED,
    LIMIT_OWNED_BY_OTHER,
    INVALID_ANNOTATION,  # decided by the planner, after every check above
    LIMIT_RANGE_CONFLICT,  # decided by the planner, after the policy
)


def namespace_managed(ns: Namespace | None, settings: Settings) -> bool:
    if ns is None:
        return False
    if ns.labels.get(keys.MODE_KEY) == keys.MODE_MANAGED:
        return True
    sel = settings.namespace_selector
    return sel is not None and sel.matches(ns.labels)


def opt_in_near_miss(ns: Namespace) -> str | None:
    """A namespace label that looks like the opt-in but is not it — any value of
    `kube-headroom.dev/mode` but the two words, or a key within a typo of it: what it says
    and what to write instead; None when there is none. Only the exact
    `kube-headroom.dev/mode=managed` opts a namespace in, so a near miss silently leaves it
    unmanaged."""
    want = f"{keys.MODE_KEY}={keys.MODE_MANAGED}"
    for key, value in ns.labels.items():
        if key == keys.MODE_KEY:
            if value in (keys.MODE_MANAGED, keys.MODE_UNMANAGED):
                return None
            fix = f"kubectl label namespace {ns.name} --overwrite {want}"
            break
        if isinstance(key, str) and _close(key.lower(), keys.MODE_KEY) and keys.MODE_KEY not in ns.labels:
            fix = f"kubectl label namespace {ns.name} {key}- {want}"
            break
    else:
        return None
    return (
        f"namespace {ns.name} has the label {key}={value}, which is not the opt-in, so it is not managed; "
        f"if it should be, label it {want} ({fix})"
    )


def _close(text: str, target: str) -> bool:
    """`target` in other letter case, or within a typo or two of it."""
    if abs(len(text) - len(target)) > 2:
        return False
    return text == target or difflib.SequenceMatcher(None, text, target).ratio() >= 0.9


def node_excluded(labels: Mapping[str, str], settings: Settings) -> bool:
    return (
        any(s.matches(labels) for s in settings.exclusions.node_selectors)
        if settings.exclusions.node_selectors
        else False
    )


def computed_containers(pod: Pod, settings: Settings) -> tuple[Container, ...]:
    """Containers that receive a computed limit: app containers and sidecars with a CPU
    request, not excluded by name. Ordinary init containers never do."""
    skip = settings.exclusions.containers
    return tuple([c for c in pod.containers if c.kind != INIT and c.cpu_request > 0 and c.name not in skip])


def limit_writers(pod: Pod, settings: Settings) -> tuple[str, ...]:
    """The other field managers that own a CPU limit Headroom computes for this pod (their
    managedFields entries for the resize subresource), sorted."""
    if not pod.limit_writers:
        return ()
    if pod.pod_level is not None:
        ours = {POD_LIMIT, *(c.name for c in pod.containers)}
    else:
        ours = {c.name for c in computed_containers(pod, settings)}
    return tuple(sorted({m for m, c in pod.limit_writers if c in ours}))


def eligibility(
    pod: Pod,
    namespace: Namespace | None,
    node: Node | None,
    settings: Settings,
    *,
    pod_level_resize: bool,
    backing_off: bool = False,
    vpa: bool = False,
    left_to_other: bool = False,
) -> str:
    """`MANAGED` or the reason code of the first check the pod fails."""
    if not pod.node_name or node is None:
        return NOT_BOUND
    if pod.terminal:
        return TERMINAL
    if pod.deleting:
        return TERMINATING
    if pod.mirror:
        return MIRROR_POD
    if settings.blocked is not None:  # every check below depends on a usable configuration
        return CONFIG_UNUSABLE
    if not namespace_managed(namespace, settings):
        return NAMESPACE_NOT_MANAGED
    ex = settings.exclusions
    if pod.namespace in ex.namespaces:
        return NAMESPACE_EXCLUDED
    if pod.mode == keys.MODE_UNMANAGED:
        return POD_OPTED_OUT
    if ex.pod_selectors and any(s.matches(pod.labels) for s in ex.pod_selectors):
        return POD_SELECTOR_EXCLUDED
    if pod.owner_kind is not None and pod.owner_kind in ex.owner_kinds:
        return OWNER_KIND_EXCLUDED
    if vpa:  # a VerticalPodAutoscaler sets this pod's CPU limits (the caller matched it)
        return VPA_CONTROLS_LIMITS
    if settings.static_cpu_manager is not None and settings.static_cpu_manager.matches(node.labels):
        return STATIC_CPU_MANAGER
    if node_excluded(node.labels, settings):
        return NODE_EXCLUDED
    if node.windows or pod.windows:  # a Windows node, or a pod that says it runs Windows
        return WINDOWS_NODE
    if pod.qos != BURSTABLE:
        return NOT_BURSTABLE
    pl = pod.pod_level
    if pl is None or not pl.cpu_request:  # else the pod-level request is what counts
        for c in pod.containers:
            if c.kind == APP and c.cpu_request <= 0 and c.name not in ex.containers:
                return ZERO_CPU_REQUEST
    # On a pod-level pod every running container follows the pod cgroup, so all count.
    if pl is not None:
        resized = tuple(c for c in pod.containers if c.kind != INIT)
    else:
        resized = computed_containers(pod, settings)
    if not resized:
        return ZERO_CPU_REQUEST
    for c in resized:
        if c.restart_on_cpu_resize:
            return RESTART_ON_RESIZE
    if pl is not None and not pod_level_resize:
        return POD_LEVEL_UNSUPPORTED
    if backing_off:
        return BACKING_OFF
    if settings.paused:
        return POOL_PAUSED
    if left_to_other:  # another field manager keeps writing its CPU limit (the caller decided)
        return LIMIT_OWNED_BY_OTHER
    return MANAGED
