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
import contextlib
import json
import logging
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from cryptography import x509

from ..core.neighbours import EMPTY, Neighbours
from ..core.params import Resolver
from ..core.placement import PlacementTooCostly
from ..core.records import Namespace, Node
from ..core.tenancy import tenant_name
from ..serving import Limits, LoopServer
from .fairqueue import DIRECT, FairQueue, Job
from .mutation import no_pod_level, patch_for
from .peers import ApiServerPeers

if TYPE_CHECKING:  # only named: a server on inputs of its own (the tests' stubs) loads no watch code
    from ..cluster.inputs import Inputs

log = logging.getLogger("headroom.webhook")


@dataclass(frozen=True, slots=True)
class Sources:
    """What the webhook reads of its process's inputs, each asked at the moment of a
    decision. Every default is the answer that mutates nothing."""

    namespace: Callable[[str], Namespace | None]
    resolver: Callable[[], Resolver]
    blocked: Callable[[], str | None] = lambda: None  # why the view is incomplete
    neighbours: Callable[[], Neighbours] = lambda: EMPTY
    nodes: Callable[[], Mapping[str, Node] | None] = lambda: None  # None: not synced
    pod_level_resize: Callable[[Node], bool] = no_pod_level  # the reconciler's own capability fact

    @classmethod
    def of(cls, inputs: Inputs) -> Sources:
        """What a process's inputs (cluster/inputs.py) give the webhook."""
        cache = inputs.cache
        return cls(
            namespace=cache.namespace,
            resolver=lambda: inputs.config.resolver,
            blocked=inputs.problem,
            neighbours=lambda: cache.neighbours,
            nodes=cache.nodes_snapshot,
            pod_level_resize=inputs.pod_level_for,
        )


def whose(meta: Mapping[str, Any]) -> tuple[str, str | None]:
    """(the pod's name or its generateName prefix, its first owner as Kind/name): a pod
    made from generateName has no name yet at admission."""
    owner = next(
        (f"{o.get('kind')}/{o.get('name')}" for o in meta.get("ownerReferences") or () if isinstance(o, dict)),
        None,
    )
    return str(meta.get("name") or f"{meta.get('generateName') or ''}*"), owner


def tenant_of(review: dict[str, Any], sources: Sources) -> str:
    """Who pays for a review's decision: its namespace's tenant, the value of the namespace
    label the configuration names (tenancy.tenantLabel), else the namespace itself. Never
    the username or service account, which a tenant can multiply."""
    request = review.get("request")
    if not isinstance(request, dict):
        return ""
    namespace = request.get("namespace")
    if not isinstance(namespace, str):
        return ""
    try:
        label = sources.resolver().base.tenancy.label
        return tenant_name(namespace, sources.namespace(namespace) if label else None, label)
    except Exception:  # an unreadable view: the namespace alone
        return namespace


class _Once:
    """Remembers the last `size` keys: a log line per key (a namespace, a tenant), not per pod."""

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
_shed_tenants = _Once()


def _settle(done: asyncio.Future[Any], value: Any) -> None:
    if not done.done():
        done.set_result(value)


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
                # Once per namespace: pod and owner names are the tenant's to vary.
                if _costly_owners.first(ns_name):
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
                    extra={
                        "namespace": ns_name,
                        "changes": len(ops),
                        "pod": name,
                        "owner": owner,
                        "uid": response["uid"],
                    },
                )
    except Exception:  # never block a pod on our own bug
        log.exception("webhook mutation failed; pod admitted unchanged")
        outcome = "unchanged"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}, outcome


MAX_BODY = 3 * 1024 * 1024  # the API server's own limit on an object is 3 MiB
HANDSHAKE_TIMEOUT = 5.0  # a client that opens a socket and says nothing is dropped after this
BODY_TIMEOUT = 1.0  # a body not read by then gets 408: well inside the API server's 2 s timeout
# Worker threads deciding reviews (webhook/fairqueue.py), off the event loop that reads and
# answers them: one for a tenant that floods the queue, one kept for the others. Under the
# interpreter lock more threads add no throughput and take time from the event loop:
# through the real API server, beside 64 service accounts sending the costliest reviews, 4
# workers left the honest tenant 130 of 240 pods given their limit, 2 gave all 240
# (tests/bench/bench_admission_api.py, docs/performance.md).
WORKERS = 2
# Parsed reviews waiting for a decision (counted as PARSED_FACTOR x their bodies): what one
# tenant may hold (a full-size review and hundreds of ordinary ones: a 256-pod burst holds
# about 12 MiB), what all together may, and what every direct poster together may.
FLOW_BYTES = 32 * 1024 * 1024
TOTAL_BYTES = 128 * 1024 * 1024
DIRECT_BYTES = 16 * 1024 * 1024
LARGE_REVIEW = 256 * 1024  # a body past this is decided on the large reviews' worker
API_TIMEOUT = 10.0  # the API server's default webhook timeout, when it sends none
LIMITS = Limits(
    header_timeout=2.0,  # a client that never finishes its headers holds its place this long at most
    # Open connections of the API server's (per address). It opens one per admission in
    # flight, which API Priority and Fairness bounds to a few hundred; past this, its idle
    # ones give way, and one is refused only when every one is carrying a request.
    max_per_client=512,
    max_connections=1024,
    # Request bytes being read, every connection together: 4 full-size bodies (a review is
    # a few KiB; thousands fit). The process holds a few times the bytes being read while it
    # decrypts, buffers and joins them. The API server's requests past it wait unread for
    # room (never closed); each body's bytes are released once it is parsed, when its review
    # is counted against its tenant's bound.
    max_pending_bytes=4 * MAX_BODY,
    # What only small requests may use: room for hundreds of ordinary reviews while large
    # bodies fill the rest.
    small_reserve=MAX_BODY,
    # Answers not yet read by their client: a few of the largest patches. The API server
    # reads its answer at once; a client that has not read it in 2 s is cut.
    max_response_bytes=4 * MAX_BODY,
    write_timeout=2.0,
    keepalive_timeout=30.0,
    # Every client that is not the API server, together: 64 connections (about 300 KiB of
    # TLS state each), one full-size body and then some, 20 new handshakes a second...
    max_direct_connections=64,
    max_direct_bytes=MAX_BODY + MAX_BODY // 2,
    direct_handshakes_per_second=20.0,
    # ...and are read at one full-size body a second, together: what the event loop decrypts
    # and parses for them stays small beside the API server's reviews.
    direct_read_bytes_per_second=MAX_BODY,
)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def api_timeout(value: str | None) -> float:
    """The `timeout` the API server sends with a review (a Go duration such as `2s` or
    `1m0s`): how long it waits for the answer. API_TIMEOUT when absent or unreadable;
    at most 30 s, the longest a webhook configuration allows."""
    if not value or len(value) > 32:
        return API_TIMEOUT
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return API_TIMEOUT
    return min(sum(float(n) * _UNIT[u] for n, u in parts), 30.0)


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


def parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """A body to (the review, ""), or (None, why) for a body that is not a review."""
    try:
        review = orjson.loads(raw)  # about 5x the standard library's speed on a 3 MiB body
    except ValueError:  # orjson.JSONDecodeError, also for JSON nested past its depth limit
        review = None
    why = malformed(review)
    return (None, why) if why is not None else (review, "")


async def _body(request: web.Request) -> bytes:
    """The request's body, at most MAX_BODY bytes. Read from the stream rather than with
    request.read(), which keeps a copy on the request until its answer is written: this
    one is freed once it is parsed."""
    declared = request.content_length
    if declared is not None and declared > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=declared)
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > MAX_BODY:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=size)
        chunks.append(chunk)
    return b"".join(chunks)


RELOAD_EVERY = 10.0  # seconds between checks of the mounted certificate files


class WebhookServer:
    """HTTPS for AdmissionReviews on aiohttp (a maintained asyncio server, behind
    serving.LoopServer's connection guard): every TLS handshake runs per connection in the
    event loop, so an idle or slow client delays no one; handshakes, headers and answers
    have deadlines; request and answer bytes are bounded one by one and together; each
    decision waits in the fair, bounded decision queue (webhook/fairqueue.py) for a worker
    thread; a malformed review gets 400; the certificate files are reloaded when they
    change on disk (a rotated Secret)."""

    def __init__(
        self,
        port: int,
        cert_dir: Path,
        sources: Sources,
        host: str = "0.0.0.0",
        observe: Callable[[str, float], None] = lambda result, seconds: None,
        reload_every: float = RELOAD_EVERY,
        limits: Limits = LIMITS,
        peers: Callable[[str], bool] | None = None,
    ) -> None:
        self.sources, self.observe = sources, observe
        self.body_timeout = BODY_TIMEOUT
        self.cert_dir, self.reload_every = cert_dir, reload_every
        self.not_after = 0.0  # when the certificate served expires (seconds since the epoch)
        self.context = self._context()
        self._stamp = self._load()

        def decide_one(review: dict[str, Any]) -> tuple[dict[str, Any], str]:
            return review_response(review, sources)

        def queue(workers: int, name: str) -> FairQueue:
            return FairQueue(
                decide_one,
                workers=workers,
                flow_bytes=FLOW_BYTES,
                total_bytes=TOTAL_BYTES,
                direct_bytes=DIRECT_BYTES,
                said_once=_shed_tenants.first,
                name=name,
            )

        self.queue = queue(WORKERS, "webhook-decide")
        # Large reviews (a pod of thousands of containers) are decided one at a time on a
        # worker of their own: such a decision holds tens of MiB while it runs, and keeps
        # the others' workers free for ordinary pods.
        self.large = queue(1, "webhook-decide-large")
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
            trusted=peers if peers is not None else ApiServerPeers(),  # none known: all the API server
        )

    # --- certificates -------------------------------------------------------------------
    def _files(self) -> tuple[Path, Path]:
        return self.cert_dir / "tls.crt", self.cert_dir / "tls.key"

    @staticmethod
    def _context() -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def _load(self) -> tuple[float, float]:
        """Load the pair into a fresh context and serve it only once it loaded whole: a
        mismatched pair refused half-way would leave the new certificate with the old key
        in the live context, and every handshake would fail. New handshakes use the new
        pair, open connections keep theirs."""
        crt, key = self._files()
        stamp = (crt.stat().st_mtime, key.stat().st_mtime)
        context = self._context()
        context.load_cert_chain(crt, key)
        try:
            not_after = x509.load_pem_x509_certificate(crt.read_bytes()).not_valid_after_utc.timestamp()
        except ValueError as exc:
            raise ssl.SSLError(f"tls.crt: {exc}") from None
        self.context, self.not_after = context, not_after
        if hasattr(self, "server"):
            self.server.context = context
        return stamp

    def expired(self) -> bool:
        """The certificate served is past its notAfter: the API server refuses every handshake."""
        return time.time() >= self.not_after

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
    async def _mutate(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        # The body is read under a deadline: a client that sends headers and then trickles
        # (or never sends) its body holds no worker and is answered 408 well before the API
        # server's own timeout.
        try:
            raw = await asyncio.wait_for(_body(request), self.body_timeout)
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
        review, why = parse(raw)
        size = len(raw)
        queue = self.large if size > LARGE_REVIEW else self.queue
        del raw
        # Its bytes leave the connection's count: the parsed review is counted against its
        # tenant's bound in the queue, so one tenant's waiting reviews hold up no one's reads.
        conn = self.server.guard.body_read(request.transport)
        api_server = conn is not None and conn.trusted
        if review is None:
            self.observe("malformed", time.perf_counter() - started)
            return web.json_response({"error": why}, status=400)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[dict[str, Any] | None, str]] = loop.create_future()

        def finish(answer: dict[str, Any] | None, outcome: str) -> None:  # any thread
            with contextlib.suppress(RuntimeError):  # the loop has stopped: no one waits
                loop.call_soon_threadsafe(_settle, done, (answer, outcome))

        def gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        queue.submit(
            Job(
                tenant=tenant_of(review, self.sources) if api_server else DIRECT,
                review=review,
                deadline=time.monotonic() + api_timeout(request.query.get("timeout")),
                gone=gone,
                finish=finish,
                size=size,
                address=request.remote or "",
            )
        )
        del review
        answer, outcome = await done
        self.observe(outcome, time.perf_counter() - started)
        if answer is None:  # its client has gone
            return web.Response(status=499)
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

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
        self.queue.stop()
        self.large.stop()
