"""The tests' one way to send an AdmissionReview to a webhook over TLS, as the API server does."""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any


def post_review(
    port: int, body: bytes, ca: bytes, source: str | None = None, timeout: float = 30, host: str = "127.0.0.1"
) -> tuple[int, bytes, float]:
    """(HTTP status, response body, seconds from the first byte sent to the last read) for one
    POST /mutate to the webhook on `host` (loopback by default) and `port`, from the address
    `source` when given."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.settimeout(timeout)
    if source is not None:
        raw.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT: the port is picked at connect
        raw.bind((source, 0))
    started = time.monotonic()
    raw.connect((host, port))
    with raw, ctx.wrap_socket(raw) as tls:
        tls.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, answer = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), answer, time.monotonic() - started


def admission_review(pod: dict[str, Any], uid: str = "u1", username: str | None = None) -> dict[str, Any]:
    """The tests' one AdmissionReview: the creation of `pod` in its namespace, as the API
    server sends it (admission.k8s.io/v1), from `username` when given."""
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": (pod.get("metadata") or {}).get("namespace"),
        "operation": "CREATE",
        "object": pod,
    }
    if username is not None:
        request["userInfo"] = {"username": username}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def pod_to_create(containers: int = 1, cpu: str = "500m", namespace: str = "team", name: str = "") -> dict[str, Any]:
    """A pod as a review carries it: `containers` containers (c0, c1, ...) each asking for
    `cpu` with no limit; named `name`, else with a generated name still to come."""
    meta = {"name": name} if name else {"generateName": "web-"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**meta, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": f"c{i}", "image": "x", "resources": {"requests": {"cpu": cpu}}} for i in range(containers)
            ]
        },
    }
