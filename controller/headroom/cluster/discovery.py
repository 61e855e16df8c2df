"""What the cluster supports, asked of the API server at start and on a timer."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.capabilities import parse_version
from .client import Api, ApiError


@dataclass(frozen=True, slots=True)
class ServerFacts:
    server_version: str | None
    pods_resize: bool
    vpa: bool = False  # autoscaling.k8s.io/v1 verticalpodautoscalers is served

    @property
    def version(self) -> tuple[int, int] | None:
        return parse_version(self.server_version)


def discover(api: Api) -> ServerFacts:
    """Server version and whether `pods/resize` is served. Raises ApiError when the
    server cannot be reached at all."""
    version = api.get("/version").get("gitVersion")
    try:
        resources = {r.get("name") for r in api.get("/api/v1").get("resources", [])}
    except ApiError:
        resources = set()
    try:
        vpa = any(
            r.get("name") == "verticalpodautoscalers"
            for r in api.get("/apis/autoscaling.k8s.io/v1").get("resources", [])
        )
    except ApiError as exc:
        if exc.status != 404:
            raise  # unknown: the caller keeps what it knew
        vpa = False
    return ServerFacts(server_version=version, pods_resize="pods/resize" in resources, vpa=vpa)
