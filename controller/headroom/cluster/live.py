"""Read a live cluster into the same snapshot `headroom plan --snapshot` uses."""

from __future__ import annotations

from typing import Any

from ..core import keys, limitrange, quota
from ..core import neighbours as nb
from .client import Api, ApiError
from .snapshot import Snapshot, snapshot_from_objects

_KINDS = (
    (keys.NODES_PATH, "v1", "Node"),
    (keys.NAMESPACES_PATH, "v1", "Namespace"),
    (keys.PODS_PATH, "v1", "Pod"),
    (keys.CONFIG_PATH, keys.API_VERSION, keys.CONFIG_KIND),
    (keys.PROFILE_PATH, keys.API_VERSION, keys.PROFILE_KIND),
    (keys.LIMIT_RANGE_PATH, "v1", limitrange.LIMIT_RANGE_KIND),
    (keys.QUOTA_PATH, "v1", quota.QUOTA_KIND),
    (keys.VPA_PATH, "autoscaling.k8s.io/v1", nb.VPA_KIND),
)
_OPTIONAL = (keys.API_VERSION, "autoscaling.k8s.io/v1")  # CRDs a cluster may not have


def read_cluster(api: Api) -> Snapshot:
    objs: list[dict[str, Any]] = []
    for path, api_version, kind in _KINDS:
        try:
            pages = list(api.list_pages(path))
        except ApiError as exc:
            if exc.status == 404 and api_version in _OPTIONAL:
                continue  # CRDs not installed: defaults, no profiles, no VPAs
            raise
        for page in pages:
            for item in page.get("items") or ():
                # list items carry no apiVersion/kind; the snapshot loader needs them
                objs.append({"apiVersion": api_version, "kind": kind, **item})
    return snapshot_from_objects(objs, api.client.configuration.host)
