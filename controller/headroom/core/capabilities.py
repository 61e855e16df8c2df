"""What the cluster supports, decided from API data. Pure: callers fetch."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .keys import POD_LEVEL_RESIZE_FEATURE
from .records import Node

_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def parse_version(text: str | None) -> tuple[int, int] | None:
    """`v1.36.3`, `1.36`, `v1.37.0-gke.1` → (major, minor); anything else → None."""
    m = _VERSION.match(text or "")
    return (int(m[1]), int(m[2])) if m else None


def pod_level_resize(nodes: Iterable[Node] | None, server_version: tuple[int, int] | None) -> bool:
    """Whether in-place resize of pod-level `spec.resources` is on.

    A server known to be older than 1.36 ⇒ off: there the API server's gate is alpha and
    off, and it refuses every pod-level resize (422 "forbidden when
    InPlacePodLevelResourcesVerticalScalingEnabled feature gate is disabled", measured on
    v1.35.4) whatever the nodes declare. Otherwise a three-way rule on Ready nodes'
    `status.declaredFeatures`: any lists the gate ⇒ on; any non-empty list without it ⇒
    off; every list empty, or nodes unknown (`None`) ⇒ fall back to the server version (≥
    1.36, where the gate is beta and on by default). Empty is not "off": kind, k3s and older
    kubelets do not report declared features at all. When the feature goes GA kubelets stop
    listing it; revisit the "non-empty without it" case then.
    """
    if server_version is not None and server_version < (1, 36):
        return False
    if nodes is not None:
        lists = [n.declared_features for n in nodes if n.ready]
        if any(POD_LEVEL_RESIZE_FEATURE in fl for fl in lists):
            return True
        if any(fl for fl in lists):
            return False
    return server_version is not None and server_version >= (1, 36)


def node_allows_pod_level_resize(node: Node, cluster_on: bool) -> bool:
    """Per node: the cluster rule above, and the node itself declaring the feature.

    Measured on v1.37 (docs/platform-notes.md): the API server's NodeDeclaredFeatureValidator
    refuses a pod-level resize (403) on any node whose `declaredFeatures` lacks the gate,
    even where the cluster-wide rule says on. A pod-level pod on such a node stays
    unmanaged (`PodLevelResourcesUnsupported`) rather than collect refusals.
    """
    return cluster_on and POD_LEVEL_RESIZE_FEATURE in node.declared_features
