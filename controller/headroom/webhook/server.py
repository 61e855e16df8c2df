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
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from ..core.neighbours import EMPTY, Neighbours
from ..core.params import Resolver
from ..core.records import Namespace, Node
from ..serving import Limits, LoopServer
from .mutation import PlacementTooCostly, no_pod_level, patch_for

log = logging.getLogger("headroom.webhook")


@dataclass(frozen=True, slots=True)
class Sources:
    """What the webhook reads of the controller, each asked at the moment of a decision.
    Every default is the answer that mutates nothing."""

    namespace: Callable[[str], Namespace | None]
    resolver: Callable[[], Resolver]
    blocked: Callable[[], str | None] = lambda: None  # why the controller's view is incomplete
    neighbours: Callable[[], Neighbours] = lambda: EMPTY
    nodes: Callable[[], Mapping[str, Node] | None] = lambda: None  # None: not synced
    pod_level_resize: Callable[[Node], bool] = no_pod_level  # the controller's capability fact


def whose(meta: Mapping[str, Any]) -> tuple[str, str | None]:
    """(the pod's name or its generateName prefix, its first owner as Kind/name): a pod
    made from generateName has no name yet at admission."""
    owner = next(
        (f"{o.get('kind')}/{o.get('name')}" for o in meta.get("ownerReferences") or () if isinstance(o, dict)),
        None,
    )
    return str(meta.get("name") or f"{meta.get('generateName') or ''}*"), owner


class _Once:
    """Remembers the last `size` keys: a log line per owner, not per pod."""

    def __init__(self, size: int = 1024) -> None:
        self.size, self.seen = size, OrderedDict[str, None]()
        self.lock = threading.Lock()

    def first(self, key: str) -> bool:
        with self.lock:
            if key in self.seen:
                self.seen.move_to_end(key)
                return False
            self.seen[key] = None
            if len(self.seen) > self.size:
                self.seen.popitem(last=False)
            return True


_costly_owners = _Once()


def review_response(review: dict[str, Any], sources: Sources) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answer and its outcome (mutated, unchanged, over-budget)."""
    request = review.get("request") or {}
    if not isinstance(request, dict):
        request = {}
    response: dict[str, Any] = {"uid": str(request.get("uid", "")), "allowed": True}
    outcome = "unchanged"
    try:
        # An incomplete view (a watch failing): admit unchanged; the controller seeds the
        # limit once its view is whole again.
        if (
            request.get("operation") == "CREATE"
            and (request.get("kind") or {}).get("kind") == "Pod"
            and sources.blocked() is None
        ):
            pod = request.get("object") or {}
            meta = pod.get("metadata") or {}
            ns_name = request.get("namespace") or meta.get("namespace") or "default"
            try:
                ops = patch_for(
                    pod,
                    sources.namespace(ns_name),
                    sources.resolver(),
                    sources.neighbours(),
                    sources.nodes(),
                    sources.pod_level_resize,
                )
            except PlacementTooCostly as exc:
                ops, outcome = [], "over-budget"
                name, owner = whose(meta)
                if _costly_owners.first(f"{ns_name}/{owner or name}"):
                    log.warning(
                        "new pod admitted without a limit: its node affinity is too costly to match "
                        "(the controller sets its limit once it is bound)",
                        extra={"namespace": ns_name, "pod": name, "owner": owner, "error": str(exc)},
                    )
            if ops:
                outcome = "mutated"
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
                name, owner = whose(meta)
                log.info(
                    "new pod given cpu limits",
                    extra={"namespace": ns_name, "ops": ops, "pod": name, "owner": owner, "uid": response["uid"]},
                )
    except Exception:  # never block a pod on our own bug
        log.exception("webhook mutation failed; pod admitted unchanged")
        outcome = "unchanged"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}, outcome


MAX_BODY = 3 * 1024 * 1024  # the API server's own limit on an object is 3 MiB
HANDSHAKE_TIMEOUT = 5.0  # a client that opens a socket and says nothing is dropped after this
BODY_TIMEOUT = 1.0  # a body not read by then gets 408: well inside the API server's 2 s timeout
# Reviews decided at once, each on a thread of its own: a costly decision shares the CPU
# with the others instead of holding the event loop (reading, TLS, answers) for its length.
MAX_CONCURRENT = 16
LIMITS = Limits(
    header_timeout=2.0,  # a client that never finishes its headers holds its place this long at most
    # Open connections one client address may hold. The API server opens one connection per
    # admission in flight, far fewer than this per webhook replica.
    max_per_client=128,
    # Unanswered request bytes held across every connection: 4 full-size bodies (a review
    # is a few KiB; thousands fit). The process holds about four times the bytes held while
    # it decrypts, buffers and joins them (tests/unit/test_serving.py: +50 MiB at the bound,
    # +176 MiB for 64 nearly complete bodies without it), well inside the chart's 512 MiB.
    max_pending_bytes=4 * MAX_BODY,
    keepalive_timeout=30.0,
)


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


def decide(raw: bytes, sources: Sources) -> tuple[dict[str, Any] | None, str]:
    """A body to (the answer, its outcome); (None, why) for a body that is not a review."""
    try:
        review = orjson.loads(raw)  # about 5x the standard library's speed on a 3 MiB body
    except ValueError:  # orjson.JSONDecodeError, also for JSON nested past its depth limit
        review = None
    why = malformed(review)
    if why is not None:
        return None, why
    return review_response(review, sources)


RELOAD_EVERY = 10.0  # seconds between checks of the mounted certificate files


class WebhookServer:
    """HTTPS for AdmissionReviews on aiohttp (a maintained asyncio server, behind
    serving.LoopServer's connection guard): every TLS handshake runs per connection in the
    event loop, so an idle or slow client delays no one; handshakes and headers time out;
    bodies are bounded one by one and together; each decision runs on a worker thread; a
    malformed review gets 400; the certificate files are reloaded when they change on disk
    (a rotated Secret)."""

    def __init__(
        self,
        port: int,
        cert_dir: Path,
        sources: Sources,
        host: str = "0.0.0.0",
        observe: Callable[[str, float], None] = lambda result, seconds: None,
        reload_every: float = RELOAD_EVERY,
        limits: Limits = LIMITS,
    ) -> None:
        self.sources, self.observe = sources, observe
        self.body_timeout = BODY_TIMEOUT
        self.cert_dir, self.reload_every = cert_dir, reload_every
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._load()
        self._pool = ThreadPoolExecutor(MAX_CONCURRENT, thread_name_prefix="webhook-decide")
        self.server = LoopServer(
            "webhook",
            host,
            port,
            [("POST", "/mutate", self._mutate)],
            context=self.context,
            limits=limits,
            client_max_size=MAX_BODY,
            handshake_timeout=HANDSHAKE_TIMEOUT,
            on_start=self._reloader,
        )

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
        # The body is read under a deadline: a client that sends headers and then trickles
        # (or never sends) its body holds no worker and is answered 408 well before the API
        # server's own timeout.
        try:
            raw = await asyncio.wait_for(request.read(), self.body_timeout)
        except web.HTTPRequestEntityTooLarge:
            self.observe("too-large", time.perf_counter() - started)
            raise
        except ConnectionError:  # closed under us (the connection guard's memory bound): no one to answer
            self.observe("dropped", time.perf_counter() - started)
            return web.Response(status=400)
        except TimeoutError:
            self.observe("slow-body", time.perf_counter() - started)
            return web.json_response(
                {"error": "the body was not sent in time"}, status=408, headers={"Connection": "close"}
            )
        out, outcome = await asyncio.get_running_loop().run_in_executor(self._pool, decide, raw, self.sources)
        if out is None:
            self.observe("malformed", time.perf_counter() - started)
            return web.json_response({"error": outcome}, status=400)
        self.observe(outcome, time.perf_counter() - started)
        return web.json_response(out)

    async def _reloader(self) -> None:
        while True:
            await asyncio.sleep(self.reload_every)
            self.reload_if_changed()

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> WebhookServer:
        self.server.start()
        return self

    def alive(self) -> bool:
        return self.server.alive()

    def shutdown(self) -> None:
        self.server.shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
