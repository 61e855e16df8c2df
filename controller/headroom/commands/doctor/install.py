"""Where the chart's release runs and whether its controller runs and leads: the
Deployment found by the chart's labels, its flags, its webhook configuration, the
Deployment's ready replicas and the Lease's last renewal."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...cluster.client import Api, ApiError
from .findings import FAIL, OK, WARN, Finding, unreadable


def _age(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()


CHART_LABEL = "app.kubernetes.io/name=kube-headroom"


def _flag(args: list[Any], name: str) -> str | None:
    """The value of `--name=value` (or `--name value`) in a container's args."""
    for i, a in enumerate(args):
        if not isinstance(a, str):
            continue
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and i + 1 < len(args) and isinstance(args[i + 1], str):
            return str(args[i + 1])
    return None


@dataclass(frozen=True, slots=True)
class Install:
    """A release of the chart, found by its labels: where its controller runs and leads,
    and the webhook configuration and Secret that belong to it."""

    namespace: str  # the Deployment's
    deployment: str
    instance: str
    lease_namespace: str
    lease_name: str | None
    webhook_configuration: str | None
    webhook_secret: str | None
    others: tuple[str, ...] = ()  # more releases found (namespace/deployment)
    # every chart Deployment the cluster-wide list returned, so the controller check
    # need not list them again
    listed: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)


def find_install(api: Api) -> Install | None:
    """The chart's Deployment in any namespace, by the chart's label, and what its
    controller's own flags (`--lease-namespace`, `--lease-name`, `--webhook-secret`) and
    the release's label on the MutatingWebhookConfiguration say. None when there is none,
    or this identity may not list Deployments cluster-wide."""
    try:
        deps = api.get("/apis/apps/v1/deployments", {"labelSelector": CHART_LABEL}).get("items") or []
    except ApiError as exc:
        if exc.status in (401, 403):
            return None
        raise
    if not deps:
        return None
    deps = sorted(deps, key=lambda d: (d["metadata"].get("namespace", ""), d["metadata"]["name"]))
    d = deps[0]
    namespace = d["metadata"].get("namespace") or "default"
    instance = (d["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") or d["metadata"]["name"]
    args: list[Any] = []
    for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
        if "run" in (found := [*(c.get("command") or []), *(c.get("args") or [])]):
            args = found
            break
    webhook = None
    try:
        mwcs = api.get(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            {"labelSelector": f"{CHART_LABEL},app.kubernetes.io/instance={instance}"},
        ).get("items")
        webhook = sorted(m["metadata"]["name"] for m in mwcs or [])[0] if mwcs else None
    except ApiError as exc:
        if exc.status not in (401, 403):
            raise
    return Install(
        namespace=namespace,
        deployment=d["metadata"]["name"],
        instance=instance,
        lease_namespace=_flag(args, "lease-namespace") or namespace,
        lease_name=_flag(args, "lease-name"),
        webhook_configuration=webhook,
        webhook_secret=_flag(args, "webhook-secret"),
        others=tuple(f"{o['metadata'].get('namespace')}/{o['metadata']['name']}" for o in deps[1:]),
        listed=tuple(deps),
    )


def controller_checks(
    api: Api, namespace: str, lease_namespace: str, lease_name: str | None, install: Install | None = None
) -> Iterator[Finding]:
    """Is a controller running and leading? The Deployment's ready replicas (in
    `namespace`) and the Lease's last renewal (in `lease_namespace`, which may differ) — a
    stopped controller leaves its objects' conditions as they were. The Deployments come
    from `install`'s cluster-wide list when there is one."""
    instances: list[str] = []
    try:
        if install is not None:
            deps = [d for d in install.listed if (d["metadata"].get("namespace") or "default") == namespace]
        else:
            deps = api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments", {"labelSelector": CHART_LABEL})
            deps = deps.get("items") or []
    except ApiError as exc:
        if exc.status != 403:
            raise
        yield unreadable("controller", f"deployments in {namespace}")
        deps = []
    else:
        if not deps:
            yield Finding(
                WARN,
                "controller",
                f"no kube-headroom Deployment in {namespace} (not installed with the chart there? a controller run "
                "off-cluster has none: the leader line says whether one leads)",
            )
    for d in deps:
        name = d["metadata"]["name"]
        instances.append((d["metadata"].get("labels") or {}).get("app.kubernetes.io/instance", name))
        want = (d.get("spec") or {}).get("replicas", 1)
        ready = (d.get("status") or {}).get("readyReplicas") or 0
        if ready == 0:
            yield Finding(
                FAIL,
                "controller",
                f"Deployment {namespace}/{name} has 0 of {want} replicas ready: nothing is reconciled",
            )
        elif ready < want:
            yield Finding(
                WARN,
                "controller",
                f"Deployment {namespace}/{name} has {ready} of {want} replicas ready: a standby is missing "
                f"(kubectl describe pods -n {namespace} -l app.kubernetes.io/name=kube-headroom)",
            )
        else:
            yield Finding(OK, "controller", f"Deployment {namespace}/{name}: {ready} of {want} replicas ready")
    names = [lease_name] if lease_name else [*instances, "kube-headroom"]
    for name in dict.fromkeys(names):
        try:
            lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{lease_namespace}/leases/{name}")
        except ApiError as exc:
            if exc.status == 404:
                continue
            if exc.status == 403:
                yield unreadable("leader", f"leases in {lease_namespace}")
                return
            raise
        spec = lease.get("spec") or {}
        holder, duration = spec.get("holderIdentity"), float(spec.get("leaseDurationSeconds") or 15)
        age = _age(spec.get("renewTime"))
        if not holder or age is None or age > 3 * duration:
            when = "never" if age is None else f"{age:.0f}s ago"
            yield Finding(
                FAIL,
                "leader",
                f"Lease {lease_namespace}/{name} last renewed {when}: no controller is leading, so nothing is written",
            )
        else:
            yield Finding(OK, "leader", f"Lease {lease_namespace}/{name} held by {holder}, renewed {age:.0f}s ago")
        return
    yield Finding(
        FAIL,
        "leader",
        f"no Lease {' or '.join(dict.fromkeys(names))} in {lease_namespace}: no controller has led here "
        "(wrong --lease-namespace?)",
    )
