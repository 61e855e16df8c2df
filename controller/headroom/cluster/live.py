"""Read a live cluster into the same snapshot `headroom plan --snapshot` uses."""

from __future__ import annotations

from typing import Any

from ..core import keys
from ..sim.snapshot import Snapshot, snapshot_from_objects
from .api import Api, ApiError

_KINDS = (
    ("/api/v1/nodes", "v1", "Node"),
    ("/api/v1/namespaces", "v1", "Namespace"),
    ("/api/v1/pods", "v1", "Pod"),
    (f"/apis/{keys.API_VERSION}/headroomconfigs", keys.API_VERSION, keys.CONFIG_KIND),
    (f"/apis/{keys.API_VERSION}/nodepoolprofiles", keys.API_VERSION, keys.PROFILE_KIND),
)


def read_cluster(api: Api) -> Snapshot:
    objs: list[dict[str, Any]] = []
    for path, api_version, kind in _KINDS:
        try:
            pages = list(api.list_pages(path))
        except ApiError as exc:
            if exc.status == 404 and api_version == keys.API_VERSION:
                continue  # CRDs not installed: defaults, no profiles
            raise
        for page in pages:
            for item in page.get("items") or ():
                # list items carry no apiVersion/kind; the snapshot loader needs them
                objs.append({"apiVersion": api_version, "kind": kind, **item})
    return snapshot_from_objects(objs, api.client.configuration.host)
