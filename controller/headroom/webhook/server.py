"""The webhook's HTTPS endpoint: AdmissionReview v1 in, a JSONPatch out.

It never blocks a pod: any error answers `allowed: true` without a patch (and the
MutatingWebhookConfiguration says `failurePolicy: Ignore` for when it is down).
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ..core.params import Resolver
from ..core.records import Namespace
from .mutation import patch_for

log = logging.getLogger("headroom.webhook")


def review_response(
    review: dict[str, Any],
    namespace: Callable[[str], Namespace | None],
    resolver: Callable[[], Resolver],
    blocked: Callable[[], str | None] = lambda: None,
) -> dict[str, Any]:
    request = review.get("request") or {}
    if not isinstance(request, dict):
        request = {}
    response: dict[str, Any] = {"uid": str(request.get("uid", "")), "allowed": True}
    try:
        # An incomplete view (a watch failing): admit unchanged; the controller seeds the
        # limit once its view is whole again.
        if (
            request.get("operation") == "CREATE"
            and (request.get("kind") or {}).get("kind") == "Pod"
            and blocked() is None
        ):
            pod = request.get("object") or {}
            ns_name = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default"
            ops = patch_for(pod, namespace(ns_name), resolver())
            if ops:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
                log.info(
                    "new pod given cpu limits",
                    extra={
                        "namespace": ns_name,
                        "ops": ops,
                        "pod": (pod.get("metadata") or {}).get("generateName")
                        or (pod.get("metadata") or {}).get("name"),
                    },
                )
    except Exception:  # never block a pod on our own bug
        log.exception("webhook mutation failed; pod admitted unchanged")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def serve(
    port: int,
    cert_dir: Path,
    namespace: Callable[[str], Namespace | None],
    resolver: Callable[[], Resolver],
    host: str = "0.0.0.0",
    blocked: Callable[[], str | None] = lambda: None,
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/mutate":
                self.send_error(404)
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                review = json.loads(self.rfile.read(length))
            except ValueError:
                review = None
            if not isinstance(review, dict):
                self.send_error(400, "not an AdmissionReview")
                return
            body = json.dumps(review_response(review, namespace, resolver, blocked)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="webhook", daemon=True).start()
    return server
