"""Can Headroom work here at all: a HeadroomConfig exists, the server serves in-place
resize, and this identity holds every permission the controller needs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...cluster.client import Api, ApiError
from ...cluster.discovery import ServerFacts
from ...core import keys
from .findings import FAIL, OK, Finding, unreadable

# What the controller needs: (verb, group, resource, subresource)
NEEDED = [
    *[("list", "", r, "") for r in ("pods", "nodes", "namespaces", "limitranges", "resourcequotas")],
    *[("watch", "", r, "") for r in ("pods", "nodes", "namespaces", "limitranges", "resourcequotas")],
    ("list", "autoscaling.k8s.io", "verticalpodautoscalers", ""),
    ("watch", "autoscaling.k8s.io", "verticalpodautoscalers", ""),
    ("list", keys.GROUP, keys.CONFIG_PLURAL, ""),
    ("list", keys.GROUP, keys.PROFILE_PLURAL, ""),
    ("patch", "", "pods", "resize"),
    ("patch", "", "pods", ""),
    ("patch", keys.GROUP, keys.CONFIG_PLURAL, "status"),
    ("patch", keys.GROUP, keys.PROFILE_PLURAL, "status"),
    ("create", "events.k8s.io", "events", ""),
]


def config_check(api: Api) -> Iterator[Finding]:
    """The first thing to know: without a HeadroomConfig nothing is written at all."""
    try:
        api.get(f"{keys.CONFIG_PATH}/{keys.SINGLETON_NAME}")
    except ApiError as exc:
        if exc.status == 404:
            yield Finding(
                FAIL,
                "config",
                f"no HeadroomConfig named '{keys.SINGLETON_NAME}': nothing is written anywhere; apply one "
                "(examples/headroomconfig.yaml; start with spec.dryRun: true)",
            )
        elif exc.status in (401, 403):
            yield unreadable("config", f"HeadroomConfig {keys.SINGLETON_NAME}")
        else:
            yield Finding(FAIL, "config", f"cannot read HeadroomConfig {keys.SINGLETON_NAME}: {exc.message}")
        return
    yield Finding(OK, "config", f"HeadroomConfig {keys.SINGLETON_NAME} exists")


def server_checks(facts: ServerFacts) -> Iterator[Finding]:
    """The release and the resize subresource."""
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


def rbac_checks(api: Api, lease_namespace: str) -> Iterator[Finding]:
    """Every permission the controller needs, asked of the server for this identity (and
    the Lease's update in `lease_namespace`)."""
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
    yield Finding(OK if ok_rbac else FAIL, "rbac", "checked every permission the controller needs")
