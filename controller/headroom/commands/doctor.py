"""`headroom doctor`: what in this cluster would stop Headroom or surprise its users.

Long because a preflight is a list of independent checks (API, RBAC, the controller and
its Lease, the webhook end to end, configuration, neighbours), each a short function."""

from __future__ import annotations

import base64
import datetime
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ..cluster.api import Api, ApiError
from ..cluster.certs import WEBHOOK_NAME
from ..cluster.discovery import discover
from ..cluster.live import read_cluster
from ..core import keys
from ..core.eligibility import LIMIT_RANGE_CONFLICT, VPA_CONTROLS_LIMITS, namespace_managed, opt_in_near_miss
from ..core.quantity import format_milli

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"

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


def _endpoint_checks(api: Api, name: str, namespace: str, svc: str) -> Iterator[Finding]:
    """The Service the API server calls has somewhere to send the call."""
    try:
        api.get(f"/api/v1/namespaces/{namespace}/services/{svc}")
        slices = api.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            {"labelSelector": f"kubernetes.io/service-name={svc}"},
        ).get("items")
    except ApiError as exc:
        if exc.status == 404:
            yield Finding(
                FAIL,
                "webhook",
                f"{name} calls Service {namespace}/{svc}, which does not exist: new pods get no limit at creation",
            )
            return
        if exc.status in (401, 403):
            yield _unreadable("webhook", f"services and endpointslices in {namespace}")
            return
        raise
    ready = {
        address
        for s in slices or []
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready") is not False  # unset means ready
        for address in e.get("addresses") or []
    }
    if ready:
        yield Finding(OK, "webhook", f"Service {namespace}/{svc} has {len(ready)} ready endpoint(s)")
    else:
        yield Finding(
            FAIL,
            "webhook",
            f"Service {namespace}/{svc} has no ready endpoints: the API server cannot call the webhook, so new "
            "pods get no limit at creation (it fails open); check that the Service's selector matches the "
            f"webhook's pods and that they are Ready (kubectl get endpointslices,pods -n {namespace})",
        )


def _trust_checks(api: Api, name: str, bundle: bytes, namespace: str, secret: str) -> Iterator[Finding]:
    """The caBundle holds the CA that signed the certificate the webhook serves (the one
    in the Secret its pods mount)."""
    try:
        served = base64.b64decode(
            (api.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}").get("data") or {}).get("tls.crt") or ""
        )
        cert = x509.load_pem_x509_certificate(served) if served else None
        cas = x509.load_pem_x509_certificates(bundle) if bundle else []
    except ApiError as exc:
        if exc.status in (401, 403, 404):
            return  # unreadable to this identity, or not issued yet (the dry-run create below tells)
        raise
    except ValueError:
        cert, cas = None, []
    if cert is None:
        return
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        yield Finding(
            OK, "webhook", f"{name}'s caBundle trusts the certificate the webhook serves (Secret {namespace}/{secret})"
        )
        return
    yield Finding(
        FAIL,
        "webhook",
        f"{name}'s caBundle does not trust the certificate the webhook serves (Secret {namespace}/{secret}): the "
        "API server's calls fail TLS, so new pods get no limit at creation (it fails open); the controller's "
        "leader puts its CA back at its next certificate check, or at once when restarted",
    )


def _url_trust_checks(name: str, url: str, bundle: bytes, timeout: float = 5.0) -> Iterator[Finding]:
    """A webhook called by URL (a controller run off-cluster): what the API server does
    with it, done from here — a TLS handshake with the URL's host that must verify with
    the caBundle alone."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port or 443
    except ValueError as exc:  # a port out of range, say: stored as given, but no address
        yield Finding(FAIL, "webhook", f"{name} calls {url!r}, which has no usable port ({exc}): new pods get no limit")
        return
    if not bundle:
        yield Finding(
            FAIL,
            "webhook",
            f"{name} calls {url} with an empty caBundle: the API server cannot trust it, so new pods get no limit "
            "at creation (it fails open); the controller's leader fills it in when run with --webhook-secret, "
            "--webhook-names and --webhook-configuration",
        )
        return
    try:
        context = ssl.create_default_context(cadata=bundle.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        yield Finding(FAIL, "webhook", f"{name}'s caBundle holds no usable certificate ({exc}): new pods get no limit")
        return
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            pass
    except ssl.SSLCertVerificationError as exc:
        yield Finding(
            FAIL,
            "webhook",
            f"{name}'s caBundle does not trust the certificate served at {url} ({exc.verify_message}): the API "
            "server's calls fail TLS, so new pods get no limit at creation (it fails open); the controller's "
            "leader puts its CA back at its next certificate check",
        )
        return
    except (OSError, ssl.SSLError, ValueError) as exc:  # ValueError: a host name no resolver takes (a 70-letter label)
        yield Finding(WARN, "webhook", f"{url} could not be reached from here ({exc}); the API server may reach it")
        return
    yield Finding(OK, "webhook", f"{name}'s caBundle trusts the certificate served at {url}")


def webhook_checks(
    api: Api, name: str, managed: list[str], dry_run: bool, secret: str | None = None, configured: bool = True
) -> Iterator[Finding]:
    """The webhook end to end: its configuration exists, its Service has ready endpoints,
    its caBundle trusts the certificate the webhook serves (the Secret the controller keeps,
    `secret`, else `<service>-webhook-tls`), and a dry-run pod create comes back with a CPU limit —
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
        namespace, svc = str(service.get("namespace")), str(service.get("name"))
        yield from _endpoint_checks(api, name, namespace, svc)
        yield from _trust_checks(api, name, bundle, namespace, secret or f"{svc}-webhook-tls")
    elif url := (hook.get("clientConfig") or {}).get("url"):
        yield from _url_trust_checks(name, str(url), bundle)
    if not managed:
        yield Finding(WARN, "webhook", "not tried: no managed namespace to create a dry-run pod in")
        return
    if not configured:
        yield Finding(INFO, "webhook", "not tried: with no HeadroomConfig the webhook gives no pod a limit, by design")
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
            for n in api.get(keys.NAMESPACES_PATH).get("items") or []
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
            yield _unreadable("config", f"HeadroomConfig {keys.SINGLETON_NAME}")
        else:
            yield Finding(FAIL, "config", f"cannot read HeadroomConfig {keys.SINGLETON_NAME}: {exc.message}")
        return
    yield Finding(OK, "config", f"HeadroomConfig {keys.SINGLETON_NAME} exists")


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
        yield _unreadable("controller", f"deployments in {namespace}")
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
                yield _unreadable("leader", f"leases in {lease_namespace}")
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
    # The Deployment where the release runs; the Lease where its controller's flag puts it.
    deployment_namespace = install.namespace if install is not None else lease_namespace
    yield from controller_checks(api, deployment_namespace, lease_namespace, lease_name, install)

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
    plan = snap.plan(pod_level_resize=True)
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
        yield from webhook_checks(
            api,
            webhook,
            sorted(managed),
            settings.dry_run,
            install.webhook_secret if install else None,
            configured=all(f.level != FAIL for f in config),
        )
    windows = [n.name for n in snap.nodes if n.windows]
    if windows:
        yield Finding(
            INFO, "nodes", f"{len(windows)} Windows node(s) ({', '.join(windows[:3])}): pods there stay unmanaged"
        )
