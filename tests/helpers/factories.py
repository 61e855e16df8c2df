"""Raw Kubernetes JSON for tests, shaped like what the API server returns."""

from __future__ import annotations

from typing import Any


def container(
    name: str = "app",
    cpu: str | None = "500m",
    limit: str | None = None,
    mem: str | None = "128Mi",
    mem_limit: str | None = "256Mi",
    restart_on_resize: bool = False,
    sidecar: bool = False,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    limits = {k: v for k, v in (("cpu", limit), ("memory", mem_limit)) if v is not None}
    c: dict[str, Any] = {"name": name, "image": "registry.example/app:1", "resources": {}}
    if requests:
        c["resources"]["requests"] = requests
    if limits:
        c["resources"]["limits"] = limits
    if restart_on_resize:
        c["resizePolicy"] = [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def pod(
    name: str = "p",
    namespace: str = "team",
    node: str | None = "n1",
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner_kind: str | None = None,
    owner_name: str = "o",
    pod_resources: dict[str, Any] | None = None,
    overhead: str | None = None,
    status: dict[str, Any] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    if owner_kind:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": owner_kind, "name": owner_name, "uid": "u", "controller": True}
        ]
    if deleting:
        meta["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    spec: dict[str, Any] = {"containers": containers if containers is not None else [container()]}
    if node:
        spec["nodeName"] = node
    if init:
        spec["initContainers"] = init
    if pod_resources:
        spec["resources"] = pod_resources
    if overhead:
        spec["overhead"] = {"cpu": overhead}
    st = {"phase": phase, **(status or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": st}


def node(
    name: str = "n1",
    cpu: str = "16",
    labels: dict[str, str] | None = None,
    ready: bool = True,
    features: list[str] | None = None,
    os: str = "linux",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "allocatable": {"cpu": cpu, "memory": "64Gi"},
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "nodeInfo": {"operatingSystem": os},
    }
    if features is not None:
        status["declaredFeatures"] = features
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": os, **(labels or {})}},
        "status": status,
    }


def namespace(name: str = "team", managed: bool = True, labels: dict[str, str] | None = None) -> dict[str, Any]:
    lab = dict(labels or {})
    if managed:
        lab["kube-headroom.dev/mode"] = "managed"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": lab}}


class Clock:
    """A clock that stands still until a test moves it (`clock.t += 5`)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t
