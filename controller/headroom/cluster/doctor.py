"""`headroom doctor`: what in this cluster would stop Headroom or surprise its users."""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from ..core import keys
from ..core.eligibility import LIMIT_RANGE_CONFLICT, VPA_CONTROLS_LIMITS, namespace_managed, opt_in_near_miss
from ..core.planner import plan_cluster
from ..core.quantity import format_milli
from .api import Api, ApiError
from .certs import WEBHOOK_NAME
from .discovery import discover
from .live import read_cluster

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"

# What the controller needs: (verb, group, resource, subresource)
NEEDED = [
    *[("list", "", r, "") for r in ("pods", "nodes", "namespaces", "limitranges", "resourcequotas")],
    *[("watch", "", r, "") for r in ("pods", "nodes", "namespaces", "limitranges", "resourcequotas")],
    ("list", "autoscaling.k8s.io", "verticalpodautoscalers", ""),
    ("watch", "autoscaling.k8s.io", "verticalpodautoscalers", ""),
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
        mark = {OK: "ok  ", INFO: "info", WARN: "WARN", FAIL: "FAIL"}[self.level]
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


def webhook_checks(api: Api, name: str, managed: list[str], dry_run: bool) -> Iterator[Finding]:
    """The webhook end to end: its configuration exists, its caBundle trusts the CA of the
    Secret the controller keeps, and a dry-run pod create comes back with a CPU limit —
    the only way to see from outside that the API server reaches it and trusts it
    (`failurePolicy: Ignore` makes every failure silent)."""
    try:
        mwc = api.get(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}")
    except ApiError as exc:
        if exc.status == 404:
            yield Finding(
                WARN, "webhook", f"no MutatingWebhookConfiguration {name!r}: new pods get no limit at creation"
            )
            return
        if exc.status == 403:
            yield _unreadable("webhook", "mutatingwebhookconfigurations")
            return
        raise
    hook = next((h for h in mwc.get("webhooks") or [] if h.get("name") == WEBHOOK_NAME), None)
    if hook is None:
        yield Finding(FAIL, "webhook", f"{name} has no webhook named {WEBHOOK_NAME}")
        return
    bundle = base64.b64decode((hook.get("clientConfig") or {}).get("caBundle") or "")
    service = (hook.get("clientConfig") or {}).get("service") or {}
    if service:
        try:
            secret = api.get(f"/api/v1/namespaces/{service.get('namespace')}/secrets/{service.get('name')}-webhook-tls")
            served_ca = base64.b64decode((secret.get("data") or {}).get("ca.crt") or "")
            missing = (
                [
                    c
                    for c in x509.load_pem_x509_certificates(served_ca)
                    if c not in x509.load_pem_x509_certificates(bundle or served_ca)
                ]
                if served_ca
                else []
            )
            if not bundle or missing:
                yield Finding(
                    FAIL,
                    "webhook",
                    f"{name}'s caBundle does not trust the CA of the certificate the webhook serves: it fails open; restart the controller's leader or check its log",
                )
        except (ApiError, ValueError):
            pass  # the Secret is unreadable to this identity, or cert-manager keeps it
    if not managed:
        yield Finding(WARN, "webhook", "not tried: no managed namespace to create a dry-run pod in")
        return
    if dry_run:
        yield Finding(
            OK, "webhook", "not tried: HeadroomConfig is in dry-run, so the webhook mutates nothing by design"
        )
        return
    out: dict[str, Any] | None = None
    refusal = ""
    try:  # a namespace being deleted refuses new pods
        active = {
            n["metadata"]["name"]
            for n in api.get("/api/v1/namespaces").get("items") or []
            if (n.get("status") or {}).get("phase", "Active") == "Active"
        }
    except ApiError:
        active = set(managed)
    for ns in [n for n in managed if n in active][:5]:
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "headroom-doctor-", "namespace": ns},
            "spec": {"containers": [{"name": "probe", "image": "probe", "resources": {"requests": {"cpu": "100m"}}}]},
        }
        try:
            out = api.post(f"/api/v1/namespaces/{ns}/pods", probe, params={"dryRun": "All"})
            break
        except ApiError as exc:
            refusal = f"{ns}: {exc.message}"
    if out is None:
        yield Finding(WARN, "webhook", f"not tried: dry-run pod creates were refused ({refusal})")
        return
    limits = ((out.get("spec") or {}).get("containers") or [{}])[0].get("resources", {}).get("limits") or {}
    if "cpu" in limits:
        yield Finding(OK, "webhook", f"a dry-run pod in {ns} was given a CPU limit ({limits['cpu']}) by the webhook")
    else:
        yield Finding(
            FAIL,
            "webhook",
            f"a dry-run pod in {ns} came back without a CPU limit: the webhook fails open (not reachable, "
            "not ready, or its caBundle does not match the served certificate)",
        )


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


def find_install(api: Api) -> tuple[str, str | None] | None:
    """Where the chart runs the controller: (namespace, Lease name) from its Deployment's
    own `--lease-namespace`/`--lease-name`, found by the chart's label in any namespace.
    None when there is none, or the identity may not list Deployments cluster-wide."""
    try:
        deps = api.get("/apis/apps/v1/deployments", {"labelSelector": CHART_LABEL}).get("items") or []
    except ApiError as exc:
        if exc.status in (401, 403):
            return None
        raise
    for d in sorted(deps, key=lambda d: (d["metadata"].get("namespace", ""), d["metadata"]["name"])):
        namespace = d["metadata"].get("namespace") or "default"
        for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            args = [*(c.get("command") or []), *(c.get("args") or [])]
            if "run" in args:
                return _flag(args, "lease-namespace") or namespace, _flag(args, "lease-name")
        return namespace, None
    return None


def config_check(api: Api) -> Iterator[Finding]:
    """The first thing to know: without a HeadroomConfig nothing is written at all."""
    try:
        api.get(f"/apis/{keys.API_VERSION}/headroomconfigs/{keys.SINGLETON_NAME}")
    except ApiError as exc:
        if exc.status == 404:
            yield Finding(
                FAIL,
                "config",
                f"no HeadroomConfig named '{keys.SINGLETON_NAME}': nothing is written anywhere; apply one "
                "(examples/headroomconfig.yaml; start with spec.dryRun: true)",
            )
        elif exc.status in (401, 403):
            yield _unreadable("config", f"HeadroomConfig {keys.SINGLETON_NAME}")
        else:
            yield Finding(FAIL, "config", f"cannot read HeadroomConfig {keys.SINGLETON_NAME}: {exc.message}")
        return
    yield Finding(OK, "config", f"HeadroomConfig {keys.SINGLETON_NAME} exists")


def controller_checks(api: Api, namespace: str, lease_name: str | None) -> Iterator[Finding]:
    """Is a controller running and leading? The Deployment's ready replicas and the Lease's
    last renewal — a stopped controller leaves its objects' conditions as they were."""
    instances: list[str] = []
    try:
        deps = (
            api.get(
                f"/apis/apps/v1/namespaces/{namespace}/deployments",
                {"labelSelector": "app.kubernetes.io/name=kube-headroom"},
            ).get("items")
            or []
        )
    except ApiError as exc:
        if exc.status != 403:
            raise
        yield _unreadable("controller", f"deployments in {namespace}")
        deps = []
    else:
        if not deps:
            yield Finding(
                WARN, "controller", f"no kube-headroom Deployment in {namespace} (not installed with the chart there?)"
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
        else:
            yield Finding(OK, "controller", f"Deployment {namespace}/{name}: {ready} of {want} replicas ready")
    names = [lease_name] if lease_name else [*instances, "kube-headroom"]
    for name in dict.fromkeys(names):
        try:
            lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
        except ApiError as exc:
            if exc.status == 404:
                continue
            if exc.status == 403:
                yield _unreadable("leader", f"leases in {namespace}")
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
                f"Lease {namespace}/{name} last renewed {when}: no controller is leading, so nothing is written",
            )
        else:
            yield Finding(OK, "leader", f"Lease {namespace}/{name} held by {holder}, renewed {age:.0f}s ago")
        return
    yield Finding(
        FAIL,
        "leader",
        f"no Lease {' or '.join(dict.fromkeys(names))} in {namespace}: no controller has led here (wrong --lease-namespace?)",
    )


def checks(
    api: Api,
    lease_namespace: str | None = "default",
    webhook: str | None = "headroom",
    lease_name: str | None = None,
    fallback_namespace: str = "default",
) -> Iterator[Finding]:
    """Every finding, most important first. With `lease_namespace` None, the controller's
    namespace and Lease are found from the chart's Deployment (else `fallback_namespace`)."""
    yield from config_check(api)
    if lease_namespace is None:
        found = find_install(api)
        if found is not None:
            lease_namespace, lease_name = found[0], lease_name or found[1]
        else:
            lease_namespace = fallback_namespace
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
    yield Finding(OK if ok_rbac else FAIL, "rbac", "checked every permission the controller needs")
    yield from controller_checks(api, lease_namespace, lease_name)

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
    for name in sorted(snap.namespaces):
        namespace = snap.namespaces[name]
        miss = None if namespace_managed(namespace, settings) else opt_in_near_miss(namespace)
        if miss is not None:
            yield Finding(WARN, "namespaces", miss)

    # What the controller does about its neighbours, decided by the same code: information.
    n = snap.neighbours
    for ns in sorted(managed):
        for q in n.limits_quotas(ns):
            yield Finding(
                INFO,
                "resourcequota",
                f"{q.key} limits limits.cpu to {format_milli(q.hard or 0)}: raises stay inside what it has left "
                f"(`explain` shows 'decided by: ResourceQuota {q.key}'); quota requests.cpu instead to let limits "
                "follow the node",
            )
        for lr in n.limit_ranges.get(ns, ()):
            caps = [
                f"{item.type} {what} {value}"
                for item in lr.items
                for what, value in (
                    ("max", None if item.cpu.max is None else format_milli(item.cpu.max)),
                    (
                        "maxLimitRequestRatio",
                        None if item.cpu.ratio_milli is None else format_milli(item.cpu.ratio_milli),
                    ),
                )
                if value is not None
            ]
            if caps:
                yield Finding(
                    INFO,
                    "limitrange",
                    f"{lr.key} caps CPU limits ({', '.join(caps)}): targets are clamped to it "
                    f"('decided by: LimitRange {lr.key}')",
                )
    plan = plan_cluster(snap.nodes, snap.pods, snap.namespaces, snap.resolver(), pod_level_resize=True, neighbours=n)
    left: dict[str, list[str]] = {}
    for pp in plan.all_pods():
        if pp.reason in (VPA_CONTROLS_LIMITS, LIMIT_RANGE_CONFLICT):
            left.setdefault(pp.reason, []).append(pp.pod.key)
    if left.get(VPA_CONTROLS_LIMITS):
        pods = left[VPA_CONTROLS_LIMITS]
        yield Finding(
            INFO,
            "vpa",
            f"{len(pods)} pod(s) whose VerticalPodAutoscaler sets CPU limits are left to it ({', '.join(pods[:3])}); "
            "with controlledValues: RequestsOnly Headroom would manage their limits",
        )
    if left.get(LIMIT_RANGE_CONFLICT):
        pods = left[LIMIT_RANGE_CONFLICT]
        yield Finding(
            WARN,
            "limitrange",
            f"{len(pods)} pod(s) break their namespace's LimitRange already, so no limit can be written to them "
            f"({', '.join(pods[:3])}); `headroom explain` says which rule",
        )
    if webhook:
        yield from webhook_checks(api, webhook, sorted(managed), settings.dry_run)
    windows = [n.name for n in snap.nodes if n.windows]
    if windows:
        yield Finding(
            INFO, "nodes", f"{len(windows)} Windows node(s) ({', '.join(windows[:3])}): pods there stay unmanaged"
        )
