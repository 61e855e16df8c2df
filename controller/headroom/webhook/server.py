"""The webhook's HTTPS endpoint: AdmissionReview v1 in, a JSONPatch out.

It never blocks a pod: any error answers `allowed: true` without a patch (and the
MutatingWebhookConfiguration says `failurePolicy: Ignore` for when it is down).

Served by aiohttp rather than the standard library's `http.server`: wrapping the
listening socket in TLS there runs each handshake in the accept loop, so one idle TCP
connection stalled every admission. aiohttp (asyncio) handshakes per connection, with a
timeout, and bounds bodies; docs/install.md has the measured comparison.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from ..core.neighbours import EMPTY, Neighbours
from ..core.params import Resolver
from ..core.records import Namespace, Node
from .mutation import patch_for

log = logging.getLogger("headroom.webhook")


def review_response(
    review: dict[str, Any],
    namespace: Callable[[str], Namespace | None],
    resolver: Callable[[], Resolver],
    blocked: Callable[[], str | None] = lambda: None,
    neighbours: Callable[[], Neighbours] = lambda: EMPTY,
    nodes: Callable[[], Mapping[str, Node] | None] = lambda: None,
) -> dict[str, Any]:
    """The AdmissionReview answer. `nodes` gives the controller's node cache (None while
    it is not synced: no mutation)."""
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
            ops = patch_for(pod, namespace(ns_name), resolver(), neighbours(), nodes())
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


MAX_BODY = 3 * 1024 * 1024  # the API server's own limit on an object is 3 MiB
HANDSHAKE_TIMEOUT = 5.0  # a client that opens a socket and says nothing is dropped after this
KEEPALIVE_TIMEOUT = 30.0
MAX_CONCURRENT = 64  # reviews decided at once; the rest wait their turn (the API server gives up after 2 s)
RELOAD_EVERY = 10.0  # seconds between checks of the mounted certificate files


class WebhookServer:
    """HTTPS for AdmissionReviews on aiohttp (a maintained asyncio server): every TLS
    handshake runs per connection in the event loop, so an idle or slow client delays no
    one; handshakes time out; bodies are bounded; a malformed review gets 400; the
    certificate files are reloaded when they change on disk (a rotated Secret)."""

    def __init__(
        self,
        port: int,
        cert_dir: Path,
        namespace: Callable[[str], Namespace | None],
        resolver: Callable[[], Resolver],
        host: str = "0.0.0.0",
        blocked: Callable[[], str | None] = lambda: None,
        observe: Callable[[str, float], None] = lambda result, seconds: None,
        reload_every: float = RELOAD_EVERY,
        neighbours: Callable[[], Neighbours] = lambda: EMPTY,
        nodes: Callable[[], Mapping[str, Node] | None] = lambda: None,
    ) -> None:
        self.neighbours, self.nodes = neighbours, nodes
        self.port, self.cert_dir, self.host, self.reload_every = port, cert_dir, host, reload_every
        self.namespace, self.resolver, self.blocked, self.observe = namespace, resolver, blocked, observe
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._load()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)

    # --- certificates -------------------------------------------------------------------
    def _files(self) -> tuple[Path, Path]:
        return self.cert_dir / "tls.crt", self.cert_dir / "tls.key"

    def _load(self) -> tuple[float, float]:
        crt, key = self._files()
        stamp = (crt.stat().st_mtime, key.stat().st_mtime)
        # Loading into the same context: new handshakes use the new pair, open connections keep theirs.
        self.context.load_cert_chain(crt, key)
        return stamp

    def reload_if_changed(self) -> bool:
        try:
            crt, key = self._files()
            stamp = (crt.stat().st_mtime, key.stat().st_mtime)
            if stamp == self._stamp:
                return False
            self._stamp = self._load()
        except (OSError, ssl.SSLError) as exc:  # half-written during a rotation: the next check retries
            log.warning("webhook certificate not reloaded", extra={"error": str(exc)})
            return False
        log.info("webhook certificate reloaded", extra={"dir": str(self.cert_dir)})
        return True

    # --- serving ------------------------------------------------------------------------
    async def _mutate(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        async with self._slots:
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                self.observe("too-large", time.perf_counter() - started)
                raise
            try:
                review = json.loads(raw)
            except ValueError:
                review = None
            if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
                self.observe("malformed", time.perf_counter() - started)
                return web.json_response({"error": "the body is not an AdmissionReview"}, status=400)
            out = review_response(review, self.namespace, self.resolver, self.blocked, self.neighbours, self.nodes)
            self.observe("mutated" if "patch" in out["response"] else "unchanged", time.perf_counter() - started)
            return web.json_response(out)

    async def _reloader(self) -> None:
        while True:
            await asyncio.sleep(self.reload_every)
            self.reload_if_changed()

    async def _start(self) -> None:
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/mutate", self._mutate)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=KEEPALIVE_TIMEOUT)
        await self._runner.setup()
        assert self._runner.server is not None
        self._server = await self._loop.create_server(
            self._runner.server,
            self.host,
            self.port,
            ssl=self.context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            backlog=256,
            reuse_address=True,
        )
        self._reload_task = self._loop.create_task(self._reloader())

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._stopped.set()

    def start(self) -> WebhookServer:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self) -> None:
        async def stop() -> None:
            self._reload_task.cancel()
            self._server.close()
            await self._runner.cleanup()
            self._loop.stop()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop)
            self._stopped.wait(5)
