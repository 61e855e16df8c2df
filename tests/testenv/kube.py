"""A thin HTTP client for tests that assert what the API server itself answers.

Tests need the server's raw status codes and messages (a rejected resize, a Table
response, a dry-run create), which the generated client wraps in model objects and
exceptions; `requests` shows them as they are. The controller itself uses `kubernetes`.
"""

from __future__ import annotations

import json
from typing import Any

import requests

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class KubeError(Exception):
    def __init__(self, response: requests.Response) -> None:
        self.status = response.status_code
        try:
            self.body: dict[str, Any] = response.json()
        except ValueError:
            self.body = {"message": response.text}
        self.message = str(self.body.get("message", response.text))
        super().__init__(f"{self.status}: {self.message}")


class Kube:
    def __init__(self, url: str, token: str, ca_file: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        # Passed per request: a session-level `verify` loses to REQUESTS_CA_BUNDLE in the environment.
        self.ca_file = ca_file

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        accept: str = "application/json",
    ) -> Any:
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        r = self.session.request(
            method,
            self.url + path,
            data=data,
            params=params,
            timeout=30,
            verify=self.ca_file,
            headers={"Content-Type": content_type, "Accept": accept},
        )
        if r.status_code >= 400:
            raise KubeError(r)
        return r.json() if r.content else None

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def create(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", path, body, **kw)

    def patch(self, path: str, body: Any, content_type: str = STRATEGIC, **kw: Any) -> Any:
        return self.request("PATCH", path, body, content_type=content_type, **kw)

    def apply(self, path: str, body: Any, manager: str = "headroom-tests", **kw: Any) -> Any:
        params = {"fieldManager": manager, "force": "true", **kw.pop("params", {})}
        return self.request("PATCH", path, body, content_type=APPLY, params=params, **kw)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


_PLURALS = {
    "Pod": "pods",
    "Node": "nodes",
    "Namespace": "namespaces",
    "ResourceQuota": "resourcequotas",
    "LimitRange": "limitranges",
    "CustomResourceDefinition": "customresourcedefinitions",
    "HeadroomConfig": "headroomconfigs",
    "NodePoolProfile": "nodepoolprofiles",
}
_CLUSTER_SCOPED = {"Node", "Namespace", "CustomResourceDefinition", "HeadroomConfig", "NodePoolProfile"}


def path_for(obj: dict[str, Any], *, collection: bool = False) -> str:
    """REST path of an object (or of its collection), from apiVersion, kind and metadata."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind not in _CLUSTER_SCOPED:
        base += f"/namespaces/{obj['metadata'].get('namespace', 'default')}"
    base += f"/{_PLURALS[kind]}"
    return base if collection else f"{base}/{obj['metadata']['name']}"
