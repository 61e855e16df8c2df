"""`headroom doctor`: what in this cluster would stop Headroom or surprise its users.

A preflight is a list of independent checks, one module per thing checked: access (the
configuration, the server, RBAC), install (the release, its controller and Lease), the
cluster's own objects (workloads), and the webhook end to end (webhook). `checks` runs them
in order, most important first."""

from __future__ import annotations

from collections.abc import Iterator

from ...cluster.client import Api, ApiError
from ...cluster.discovery import discover
from ...cluster.live import read_cluster
from .access import config_check, rbac_checks, server_checks
from .findings import FAIL, INFO, OK, WARN, Finding
from .install import controller_checks, find_install
from .webhook import webhook_checks
from .workloads import managed_namespaces, namespace_checks, neighbour_checks, node_checks

__all__ = ["FAIL", "INFO", "OK", "WARN", "Finding", "checks"]


def checks(
    api: Api,
    lease_namespace: str | None = "default",
    webhook: str | None = None,
    lease_name: str | None = None,
    fallback_namespace: str = "default",
) -> Iterator[Finding]:
    """Every finding, most important first. The chart's release is found by its labels:
    with `lease_namespace` None, the controller's namespace and Lease come from its
    Deployment (else `fallback_namespace`); with `webhook` None, the webhook configuration
    is the release's ('' skips the webhook)."""
    config = list(config_check(api))
    yield from config
    install = find_install(api)
    if install is not None:
        also = f" (also found: {', '.join(install.others)}; pick one with --lease-namespace)" if install.others else ""
        yield Finding(
            WARN if install.others else OK,
            "install",
            f"release {install.instance}: Deployment {install.namespace}/{install.deployment}, "
            f"webhook configuration {install.webhook_configuration or 'none'}{also}",
        )
    if lease_namespace is None:
        if install is not None:
            lease_namespace, lease_name = install.lease_namespace, lease_name or install.lease_name
        else:
            lease_namespace = fallback_namespace
    if webhook is None:
        webhook = (install.webhook_configuration or install.instance) if install is not None else "headroom"
    yield from server_checks(discover(api))
    yield from rbac_checks(api, lease_namespace)
    # The Deployment where the release runs; the Lease where its controller's flag puts it.
    deployment_namespace = install.namespace if install is not None else lease_namespace
    yield from controller_checks(api, deployment_namespace, lease_namespace, lease_name, install)

    try:
        snap = read_cluster(api)
    except ApiError as exc:
        yield Finding(FAIL, "read", f"cannot read the cluster as this identity: {exc.message}")
        return
    settings = snap.resolver().base
    managed = managed_namespaces(snap, settings)
    yield from namespace_checks(snap, settings, managed)
    yield from neighbour_checks(snap, managed)
    if webhook:
        yield from webhook_checks(
            api,
            webhook,
            managed,
            settings.dry_run,
            install.webhook_secret if install else None,
            configured=all(f.level != FAIL for f in config),
        )
    yield from node_checks(snap)
