"""The webhook end to end, as the API server meets it: its configuration, the Service's
ready endpoints, whether the caBundle trusts the certificate the webhook serves, and a
dry-run pod create that must come back with a CPU limit."""

from __future__ import annotations

import base64
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ...cluster.client import Api, ApiError
from ...core import keys
from ...webhook.certs import WEBHOOK_NAME
from .findings import FAIL, INFO, OK, WARN, Finding, unreadable


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
            yield unreadable("webhook", f"services and endpointslices in {namespace}")
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


def url_trust_checks(name: str, url: str, bundle: bytes, timeout: float = 5.0) -> Iterator[Finding]:
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
            yield unreadable("webhook", "mutatingwebhookconfigurations")
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
        yield from url_trust_checks(name, str(url), bundle)
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
