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
                meta = pod.get("metadata") or {}
                log.info(
                    "new pod given cpu limits",
                    extra={
                        "namespace": ns_name,
                        "ops": ops,
                        # A pod made from generateName has no name yet at admission: the
                        # prefix and the owner say whose it is, the request uid which one.
                        "pod": meta.get("name") or f"{meta.get('generateName') or ''}*",
                        "owner": next(
                            (
                                f"{o.get('kind')}/{o.get('name')}"
                                for o in meta.get("ownerReferences") or ()
                                if isinstance(o, dict)
                            ),
                            None,
                        ),
                        "uid": response["uid"],
                    },
                )
    except Exception:  # never block a pod on our own bug
        log.exception("webhook mutation failed; pod admitted unchanged")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


MAX_BODY = 3 * 1024 * 1024  # the API server's own limit on an object is 3 MiB
HANDSHAKE_TIMEOUT = 5.0  # a client that opens a socket and says nothing is dropped after this
KEEPALIVE_TIMEOUT = 30.0  # also bounds a connection that never completes its first request
BODY_TIMEOUT = 1.0  # a body not read by then gets 408: well inside the API server's 2 s timeout
MAX_CONCURRENT = 64  # reviews decided at once (taken after the body is read, only around the decision)
# Open connections one client address may hold; more are closed at once. The API server
# opens one connection per admission in flight, far fewer than this per webhook replica.
MAX_PER_CLIENT = 128


def malformed(review: object) -> str | None:
    """Why a decoded body is not an AdmissionReview this webhook can answer; None when it is."""
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        return "the body is not an AdmissionReview"
    request = review["request"]
    kind = request.get("kind")
    if kind is not None and not isinstance(kind, dict):
        return "request.kind is not an object"
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        return "request.object is not an object"
    return None


class _PerClient(asyncio.Protocol):
    """Counts a client address's open connections around aiohttp's protocol and closes
    those past MAX_PER_CLIENT: one address cannot take every connection the process has."""

    def __init__(self, inner: asyncio.Protocol, counts: dict[str, int], limit: int) -> None:
        self.inner, self.counts, self.limit = inner, counts, limit
        self.address: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self.counts.get(address, 0) >= self.limit:
            transport.close()
            return
        self.counts[address] = self.counts.get(address, 0) + 1
        self.address = address
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.address is None:
            return
        left = self.counts[self.address] - 1
        if left:
            self.counts[self.address] = left
        else:
            del self.counts[self.address]
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.address is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.address is not None else None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


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
        self.body_timeout, self.max_per_client = BODY_TIMEOUT, MAX_PER_CLIENT
        self._clients: dict[str, int] = {}  # open connections per client address (event loop only)
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
        # The body is read under a deadline and outside the decision slots: a client that
        # sends headers and then trickles (or never sends) its body holds no slot and is
        # answered 408 well before the API server's own timeout.
        try:
            raw = await asyncio.wait_for(request.read(), self.body_timeout)
        except web.HTTPRequestEntityTooLarge:
            self.observe("too-large", time.perf_counter() - started)
            raise
        except TimeoutError:
            self.observe("slow-body", time.perf_counter() - started)
            return web.json_response(
                {"error": "the body was not sent in time"}, status=408, headers={"Connection": "close"}
            )
        try:
            review = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the parser goes
            review = None
        why = malformed(review)
        if why is not None:
            self.observe("malformed", time.perf_counter() - started)
            return web.json_response({"error": why}, status=400)
        async with self._slots:
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
        server, counts = self._runner.server, self._clients
        self._server = await self._loop.create_server(
            lambda: _PerClient(server(), counts, self.max_per_client),
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
