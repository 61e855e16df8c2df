"""`headroom doctor`: what in this cluster would stop Headroom or surprise its users."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..core import keys
from ..core.eligibility import namespace_managed
from ..core.quantity import QuantityError, cpu_milli
from .api import Api, ApiError
from .discovery import discover
from .live import read_cluster

OK, WARN, FAIL = "ok", "warn", "fail"

# SPEC §11: (verb, group, resource, subresource, namespaced-in-own-namespace)
NEEDED = [
    *[("list", "", r, "") for r in ("pods", "nodes", "namespaces", "limitranges")],
    *[("watch", "", r, "") for r in ("pods", "nodes", "namespaces")],
    ("list", keys.GROUP, "headroomconfigs", ""),
    ("list", keys.GROUP, "nodepoolprofiles", ""),
    ("patch", "", "pods", "resize"),
    ("patch", "", "pods", ""),
    ("patch", keys.GROUP, "headroomconfigs", "status"),
    ("patch", keys.GROUP, "nodepoolprofiles", "status"),
    ("create", "events.k8s.io", "events", ""),
]


@dataclass(frozen=True, slots=True)
class Finding:
    level: str
    check: str
    message: str

    def __str__(self) -> str:
        mark = {OK: "ok  ", WARN: "WARN", FAIL: "FAIL"}[self.level]
        return f"{mark}  {self.check}: {self.message}"


def _items(api: Api, path: str) -> list[dict[str, Any]] | None:
    """Every item, [] when the kind is not installed, None when this identity may not list it."""
    try:
        return [i for page in api.list_pages(path) for i in page.get("items") or ()]
    except ApiError as exc:
        if exc.status == 404:
            return []
        if exc.status == 403:
            return None
        raise


def _unreadable(check: str, what: str) -> Finding:
    return Finding(WARN, check, f"not checked: this identity may not list {what}; run doctor as a cluster admin")


def checks(api: Api, lease_namespace: str = "default") -> Iterator[Finding]:
    facts = discover(api)
    version = facts.version
    if version is None or version < (1, 35):
        yield Finding(FAIL, "server", f"{facts.server_version}: in-place resize needs Kubernetes 1.35 or later")
    else:
        yield Finding(OK, "server", f"{facts.server_version}")
    yield (
        Finding(OK, "pods/resize", "served")
        if facts.pods_resize
        else Finding(FAIL, "pods/resize", "not served: the controller cannot change limits in place")
    )

    ok_rbac = True
    for verb, group, resource, sub in [*NEEDED, ("update", "coordination.k8s.io", "leases", "")]:
        attrs: dict[str, Any] = {"verb": verb, "group": group, "resource": resource}
        if sub:
            attrs["subresource"] = sub
        if resource == "leases":
            attrs["namespace"] = lease_namespace
        review = api.post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs},
            },
        )
        what = f"{verb} {resource}{'/' + sub if sub else ''}{' in ' + lease_namespace if resource == 'leases' else ''}"
        if not (review.get("status") or {}).get("allowed"):
            ok_rbac = False
            yield Finding(FAIL, "rbac", f"this identity may not {what}; bind it to the chart's ClusterRole and Role")
    yield Finding(OK if ok_rbac else FAIL, "rbac", "checked every permission of SPEC §11")

    try:
        snap = read_cluster(api)
    except ApiError as exc:
        yield Finding(FAIL, "read", f"cannot read the cluster as this identity: {exc.message}")
        return
    settings = snap.resolver().base
    managed = {
        n
        for n, ns in snap.namespaces.items()
        if namespace_managed(ns, settings) and n not in settings.exclusions.namespaces
    }
    yield Finding(
        OK if managed else WARN,
        "namespaces",
        f"{len(managed)} managed" if managed else "none managed: label one kube-headroom.dev/mode=managed",
    )

    quotas = _items(api, "/api/v1/resourcequotas")
    if quotas is None:
        yield _unreadable("resourcequota", "resourcequotas")
    for q in quotas or ():
        ns = q["metadata"]["namespace"]
        hard = (q.get("spec") or {}).get("hard") or {}
        if ns in managed and "limits.cpu" in hard:
            yield Finding(
                FAIL,
                "resourcequota",
                f"{ns}/{q['metadata']['name']} limits limits.cpu to {hard['limits.cpu']}: "
                "raised limits spend it and are refused (403); quota requests.cpu instead",
            )
    for lr in _items(api, "/api/v1/limitranges") or ():
        ns = lr["metadata"]["namespace"]
        for item in (lr.get("spec") or {}).get("limits") or ():
            cap = (item.get("max") or {}).get("cpu")
            if ns in managed and cap is not None and item.get("type") == "Container":
                try:
                    milli = cpu_milli(cap)
                except QuantityError:
                    continue
                yield Finding(
                    WARN,
                    "limitrange",
                    f"{ns}/{lr['metadata']['name']} caps container CPU limits at "
                    f"{milli}m: targets above it are refused; raise max.cpu or exclude the namespace",
                )
    vpas = _items(api, "/apis/autoscaling.k8s.io/v1/verticalpodautoscalers")
    if vpas is None:
        yield _unreadable("vpa", "verticalpodautoscalers")
    for vpa in vpas or ():
        ns = vpa["metadata"]["namespace"]
        policies = ((vpa.get("spec") or {}).get("resourcePolicy") or {}).get("containerPolicies") or [{}]
        if ns in managed and any(
            p.get("controlledValues", "RequestsAndLimits") == "RequestsAndLimits" for p in policies
        ):
            yield Finding(
                WARN,
                "vpa",
                f"{ns}/{vpa['metadata']['name']} scales limits too (RequestsAndLimits): it and "
                "Headroom would fight; set controlledValues: RequestsOnly",
            )
    windows = [n.name for n in snap.nodes if n.windows]
    if windows:
        yield Finding(
            WARN, "nodes", f"{len(windows)} Windows node(s) ({', '.join(windows[:3])}): pods there stay unmanaged"
        )
