"""Raw-JSON access to the API server over the `kubernetes` client's connection and auth.

The client's configuration (kubeconfig, in-cluster service account, exec plugins, TLS,
token refresh) is used as it is; responses are parsed with orjson straight into dicts,
never into the client's model objects (about 66 KB and 250 µs per pod).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from ..core import keys

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(Exception):
    """A non-2xx answer (or no answer) from the API server."""

    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None, request: str = ""
    ) -> None:
        super().__init__(f"{request + ': ' if request else ''}{status} {reason}: {message}")
        self.request = request  # "PATCH /api/v1/..." for logs
        self.status = status  # 0 when the server was not reached
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def connect(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """An ApiClient from a kubeconfig, else the in-cluster service account."""
    cfg = k8s.Configuration()
    try:
        if kubeconfig is None:
            try:
                k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except ConfigException:
                k8s_config.load_kube_config(context=context, client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
    except (ConfigException, OSError) as exc:
        raise ApiError(0, "Config", f"cannot load Kubernetes credentials: {exc}") from None
    return k8s.ApiClient(cfg)


AUTH_REFRESH = 10.0  # seconds an Authorization header is reused before the client is asked again


@dataclass(slots=True)
class Api:
    """Credentials are read once and then every AUTH_REFRESH seconds (and at once after a
    401), not per request: the client re-checks token expiry and re-applies its kubeconfig
    on every call, a measurable part of the controller's CPU. Every token the client can
    refresh (projected service-account tokens, exec plugins, OIDC) lives far longer."""

    client: k8s.ApiClient
    timeout: float = 30.0
    _auth: dict[str, str] = field(default_factory=dict)
    _auth_at: float = -1e9

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        timeout: float | tuple[float, float] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        query = [(k, str(v)) for k, v in (params or {}).items()]
        headers = {"Accept": accept, "Content-Type": content_type, **self._authorization()}
        _, url, headers, body, _ = self.client.param_serialize(
            method, path, query_params=query, header_params=headers, body=body, auth_settings=[]
        )
        try:
            resp = self.client.call_api(
                method, url, header_params=headers, body=body, _request_timeout=timeout or self.timeout
            ).response
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "Unreachable", f"{method} {path}: {exc}") from None
        if resp.status == 401:
            self._auth_at = -1e9  # the token changed under us: ask the client again next time
        if resp.status >= 400:
            data = resp.data
            try:
                status = orjson.loads(data)
                message, reason = str(status.get("message", "")), str(status.get("reason", resp.reason))
            except orjson.JSONDecodeError:
                message, reason = data.decode(errors="replace")[:500], str(resp.reason)
            retry = resp.headers.get("Retry-After")
            retry_after = float(retry) if retry and retry.isdigit() else None
            raise ApiError(resp.status, reason, message, retry_after, request=f"{method} {path}")
        return cast(urllib3.BaseHTTPResponse, resp)

    def _authorization(self) -> dict[str, str]:
        now = time.monotonic()
        if now - self._auth_at > AUTH_REFRESH:
            settings = self.client.configuration.auth_settings()  # runs the client's refresh hook
            token = (settings.get("BearerToken") or {}).get("value")
            self._auth = {"authorization": str(token)} if token else {}
            self._auth_at = now
        return self._auth

    def get(
        self,
        path: str,
        params: Mapping[str, str | int] | None = None,
        accept: str = JSON,
        decode: Callable[[bytes], Any] = orjson.loads,
    ) -> Any:
        return decode(self._send("GET", path, params=params, accept=accept).data)

    def request_json(self, method: str, path: str, body: Any = None) -> Any:
        """Any verb with a JSON body, e.g. PUT for an optimistic update."""
        return orjson.loads(self._send(method, path, body=body).data)

    def get_text(self, path: str) -> str:
        """A plain-text endpoint such as /readyz or /metrics."""
        return self._send("GET", path, accept="text/plain").data.decode()

    def delete(self, path: str, params: Mapping[str, str | int] | None = None) -> Any:
        return orjson.loads(self._send("DELETE", path, params=params).data)

    def post(self, path: str, body: Any, params: Mapping[str, str | int] | None = None) -> Any:
        return orjson.loads(self._send("POST", path, params=params, body=body).data)

    def patch(self, path: str, body: Any, content_type: str, params: Mapping[str, str | int] | None = None) -> Any:
        return orjson.loads(self._send("PATCH", path, params=params, body=body, content_type=content_type).data)

    def apply(self, obj: Mapping[str, Any], manager: str, *, subresource: str = "", force: bool = True) -> Any:
        """Server-side apply of `obj` (to `subresource` when given) as field manager `manager`."""
        path = object_path(obj) + (f"/{subresource}" if subresource else "")
        params = {"fieldManager": manager, "force": str(force).lower()}
        return self.patch(path, obj, APPLY_PATCH, params)

    def list_pages(
        self,
        path: str,
        params: Mapping[str, str | int] | None = None,
        limit: int = 500,
        decode: Callable[[bytes], Any] = orjson.loads,
    ) -> Iterator[Any]:
        """Every page of a list, following `continue`; each page is a parsed List."""
        query: dict[str, str | int] = {**(params or {}), "limit": limit}
        while True:
            page = self.get(path, query, decode=decode)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            query["continue"] = token

    def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int,
        read_timeout: float,
        initial_events: bool = False,
    ) -> Iterator[bytes]:
        """Raw event lines of one watch request. A stream silent for `read_timeout`
        seconds raises ApiError(0, "Timeout") so the caller reconnects. `initial_events`:
        a WatchList request — the current objects stream first as ADDED events, ended by a
        bookmark annotated `k8s.io/initial-events-end` (a server without the feature
        refuses the request)."""
        params: dict[str, str | int] = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        if initial_events:
            params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
            if resource_version:
                params["resourceVersion"] = resource_version
        else:
            params["resourceVersion"] = resource_version
        resp = self._send("GET", path, params=params, timeout=(10.0, read_timeout))
        try:
            yield from split_lines(resp.stream(amt=None, decode_content=False))
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
            raise ApiError(0, "Timeout", f"watch {path} silent for {read_timeout:.0f}s") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "Unreachable", f"watch {path}: {exc}") from exc
        finally:
            resp.release_conn()


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Non-empty lines of a chunked stream, as bytes for orjson.

    The client's `kubernetes.watch.watch.iter_resp_lines` decodes every line to str and
    copies its buffer per line; this keeps bytes. A unit test holds both to the same output.
    """
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        start = 0
        while (nl := buffer.find(b"\n", start)) != -1:
            if nl > start:
                yield bytes(buffer[start:nl])
            start = nl + 1
        del buffer[:start]
    if buffer.strip():
        yield bytes(buffer)


_PLURALS = {
    "Pod": "pods",
    "Node": "nodes",
    "Namespace": "namespaces",
    "Event": "events",
    "ResourceQuota": "resourcequotas",
    "LimitRange": "limitranges",
    "Lease": "leases",
    "CustomResourceDefinition": "customresourcedefinitions",
    keys.CONFIG_KIND: keys.CONFIG_PLURAL,
    keys.PROFILE_KIND: keys.PROFILE_PLURAL,
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ServiceAccount": "serviceaccounts",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}
_CLUSTER_SCOPED = {
    "Node",
    "Namespace",
    "CustomResourceDefinition",
    "HeadroomConfig",
    "NodePoolProfile",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def object_path(obj: Mapping[str, Any], *, collection: bool = False) -> str:
    """REST path of an object (or of its collection) from apiVersion, kind and metadata."""
    api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    if kind not in _CLUSTER_SCOPED:
        base += f"/namespaces/{obj['metadata'].get('namespace') or 'default'}"
    base += f"/{_PLURALS[kind]}"
    return base if collection else f"{base}/{obj['metadata']['name']}"


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    q = urllib.parse.quote
    return f"/api/v1/namespaces/{q(namespace)}/pods/{q(name)}" + (f"/{sub}" if sub else "")
