"""Headroom's HTTP servers (the webhook, /metrics, the probes) on one shape: an aiohttp
application on its own asyncio loop in a background thread, behind a connection guard.
asyncio holds an idle connection as a few kilobytes, not a thread; the guard bounds what
any client can hold, from the moment its TCP connection is accepted:

- connections: at most `max_connections` in all (past it a new one is closed at once),
  and `max_per_client` per client address: a new one past that takes the place of the
  oldest of that address that is not yet being answered (handshaking, sending headers or
  its body, or idle), and is refused only when every one of them is being answered;
- time: the TLS handshake, the headers (`header_timeout` from the connection or from the
  request's first byte) and the answer (`write_timeout`: a client that does not read its
  answer is cut) each have a deadline;
- request bytes held until the server has taken the body (`body_read`) or the answer is
  written: at most `max_pending_bytes` in all,
  `max_pending_per_client` per address. Requests larger than SMALL_REQUEST may fill only
  up to `max_pending_bytes - small_reserve`: the large request that crosses a bound is
  closed, and a small one past the whole bound closes the largest large ones being
  received, so large or trickled bodies never crowd out ordinary small ones;
- answer bytes not yet written: at most `max_response_bytes`; past it the connection that
  has waited longest for its client to read is closed.

A server given `trusted` (the webhook: is this address the API server's?) treats the two
kinds of client apart. The API server carries every tenant's reviews over its connections,
so none of them is closed for bytes: a request whose declared body does not fit the bound
now waits, unread, until earlier ones are answered (backpressure, first come first
served; small requests keep their reserve), and its connections are counted per address
against `max_per_client`. Every other client is a direct poster: all of them together
hold at most `max_direct_connections` connections (a new one past it takes the place of
the pool's oldest that is not being answered) and `max_direct_bytes` of request bytes,
start at most `direct_handshakes_per_second` TLS handshakes, and are read at
`direct_read_bytes_per_second` (past it their reading pauses), whatever the number of
their addresses.

The guard decides on a connection when it is accepted, from its address alone, before
asyncio makes a transport or aiohttp a handler for it: a flood of connections to be
refused costs an accept and a close each.

The soft open-file limit is raised to the hard one when the first server starts, and
accept failures (out of file descriptors) are logged once a minute, not once per try.
Idle kept-alive connections are closed by aiohttp after its keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import resource
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger("headroom.serving")

HEADER_END = b"\r\n\r\n"
MAX_HEAD = 8 * 1024  # header bytes kept to find Content-Length; aiohttp refuses longer lines
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]{1,12})[ \t]*(?:\r\n|$)", re.IGNORECASE)


def _content_length(head: bytes) -> int | None:
    """The Content-Length a request's header block declares; None without one."""
    m = _CONTENT_LENGTH.search(head)
    return int(m.group(1)) if m else None


ACCEPT_BATCH = 256  # connections accepted in one turn of the loop (the listening backlog)
SMALL_REQUEST = 64 * 1024  # a request this size or less may use the small-request reserve


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout: float = 2.0
    max_per_client: int = 128
    max_connections: int = 4096
    max_pending_bytes: int = 48 * 1024 * 1024
    max_pending_per_client: int = 16 * 1024 * 1024
    small_reserve: int = 0
    max_response_bytes: int = 64 * 1024 * 1024
    write_timeout: float = 10.0
    keepalive_timeout: float = 30.0
    # With `trusted`: every client it does not trust shares these (see the module's docstring).
    max_direct_connections: int = 64
    max_direct_bytes: int = 4 * 1024 * 1024
    direct_handshakes_per_second: float = 20.0
    direct_read_bytes_per_second: float = 4 * 1024 * 1024


DIRECT_POOL = "\x00direct"  # the pool of every client a server given `trusted` does not trust


class _Every:
    """Says yes at most once per `seconds` for each key: a log line per interval."""

    def __init__(self, seconds: float = 60.0) -> None:
        self.seconds, self.last = seconds, dict[str, float]()
        self.suppressed = dict[str, int]()

    def due(self, key: str) -> int | None:
        """None when the key was said within the interval; else how many times it was not."""
        now = time.monotonic()
        if now - self.last.get(key, -self.seconds) < self.seconds:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
            return None
        self.last[key] = now
        return self.suppressed.pop(key, 0)


class _Bucket:
    """A token bucket: `rate` a second, up to `burst` at once."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def spend(self, amount: float) -> float:
        """Take `amount`, into debt if need be: the seconds until the debt is paid (0 when none)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate) - amount
        self.at = now
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class _Guard:
    """Shared bookkeeping of one server's connections (event loop thread only)."""

    def __init__(self, limits: Limits, name: str, trusted: Callable[[str], bool] | None = None) -> None:
        self.limits, self.name, self.trusted = limits, name, trusted
        self.handshakes = _Bucket(limits.direct_handshakes_per_second, 2 * limits.direct_handshakes_per_second)
        self.direct_reads = _Bucket(limits.direct_read_bytes_per_second, limits.direct_read_bytes_per_second)
        self.waiting: dict[_Guarded, None] = {}  # trusted requests held unread for room, oldest first
        self.owed = 0  # bytes trusted requests have declared and not yet sent
        self.by_client: dict[str, dict[_Guarded, None]] = {}  # per pool, insertion order: oldest first
        self.by_transport: dict[int, _Guarded] = {}  # the transport the application sees
        self.open = 0  # TCP connections, from accept
        self.pending = 0  # request bytes held until their answer is written, every connection
        self.pending_by_client: dict[str, int] = {}
        self.responses = 0  # answer bytes not yet written
        self.said = _Every()

    def admit(self, address: str) -> tuple[str, bool] | None:
        """Whether a connection just accepted from `address` may stay: (its pool, whether
        it is the API server's), or None when it is to be closed at once. Decided before
        any transport, protocol or TLS state is made for it: a flood of connections to be
        refused costs an accept and a close each. Makes room by closing the pool's oldest
        connection not being answered, when there is one."""
        if self.open >= self.limits.max_connections:
            self.refuse(address, "too many connections")
            return None
        trusted = self.trusted is not None and self.trusted(address)
        pool = DIRECT_POOL if self.trusted is not None and not trusted else address
        if pool == DIRECT_POOL and not self.handshakes.take():
            self.refuse(address, "clients that are not the API server open connections too fast")
            return None
        cap, why = (
            (self.limits.max_direct_connections, "too many connections from clients that are not the API server")
            if pool == DIRECT_POOL
            else (self.limits.max_per_client, "too many connections from one address")
        )
        conns = self.by_client.get(pool)
        if conns is not None and len(conns) >= cap:
            oldest = next((c for c in conns if c.evictable()), None)  # insertion order: oldest first
            if oldest is None:  # every one of them is being answered: refuse this one
                self.refuse(address, why)
                return None
            self.shed(oldest, why)
        return pool, trusted

    def register(self, conn: _Guarded, address: str, pool: str, trusted: bool) -> None:
        conn.address, conn.pool, conn.trusted = address, pool, trusted
        self.by_client.setdefault(pool, {})[conn] = None
        self.open += 1

    def refuse(self, address: str, why: str) -> None:
        """Log a connection closed for `why`, once a minute per reason."""
        quiet = self.said.due(why)
        if quiet is not None:
            log.warning(
                "connection closed: " + why,
                extra={"server": self.name, "client": address, "also_closed_since_last_said": quiet},
            )

    def conn(self, transport: asyncio.BaseTransport | None) -> _Guarded | None:
        return self.by_transport.get(id(transport)) if transport is not None else None

    def shed(self, conn: _Guarded, why: str) -> None:
        """Close `conn` for `why`, counted and logged once a minute per reason."""
        self.refuse(conn.address or "", why)
        conn.close()

    # --- called by the server around a request --------------------------------------------
    def body_read(self, transport: asyncio.BaseTransport | None) -> _Guarded | None:
        """The request's body has been read and parsed: its bytes are no longer held by
        the connection (the caller counts what it keeps). Returns the connection."""
        conn = self.conn(transport)
        if conn is not None and conn.phase in (_Guarded.HEADERS, _Guarded.BODY):
            conn.phase = _Guarded.ANSWERING
            conn.release()
        return conn

    def responding(self, transport: asyncio.BaseTransport | None, size: int) -> None:
        """An answer of `size` bytes is being written: held until `answered`. Past the
        bound, the connections that have waited longest for their client to read go."""
        conn = self.conn(transport)
        if conn is None:
            return
        conn.phase, conn.response, conn.since = _Guarded.WRITING, size, time.monotonic()
        self.responses += size
        while self.responses > self.limits.max_response_bytes:
            writing = [c for c in self.by_transport.values() if c.phase == _Guarded.WRITING and c is not conn]
            if not writing:
                break
            self.shed(min(writing, key=lambda c: c.since), "answers not read by their clients over the bound")

    def answered(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self.conn(transport)
        if conn is not None:
            conn.release()
            conn.phase, conn.head = _Guarded.IDLE, b""

    # --- request bytes ----------------------------------------------------------------
    def fits(self, conn: _Guarded, coming: int) -> bool:
        """Whether `coming` more bytes of a trusted request fit under the bounds, counting
        what requests already let in still owe."""
        limits = self.limits
        room = limits.max_pending_bytes - (0 if conn.bytes + coming <= SMALL_REQUEST else limits.small_reserve)
        return self.pending + self.owed + coming <= room

    def wake(self) -> None:
        """Let the held requests in, oldest first, while they fit: a large one that does not
        fit keeps the large ones behind it waiting (first come, first served), not the small
        ones, which may use the reserve."""
        blocked = False
        for conn in list(self.waiting):
            small = conn.bytes + conn.owed <= SMALL_REQUEST
            if conn.address is None:
                self.waiting.pop(conn, None)
            elif (small or not blocked) and self.fits(conn, conn.owed):
                self.waiting.pop(conn, None)
                conn.let_in()
            elif not small:
                blocked = True

    def largest_receiving(self) -> _Guarded | None:
        """The connection holding the most bytes of a large request still being received."""
        best: _Guarded | None = None
        for c in self.by_transport.values():
            receiving = not c.trusted and c.phase in (_Guarded.HEADERS, _Guarded.BODY) and c.bytes > SMALL_REQUEST
            if receiving and (best is None or c.bytes > best.bytes):
                best = c
        return best


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's checks around it. Made at
    TCP accept; with TLS it runs the handshake itself (loop.start_tls), so the guard
    counts a connection before its handshake as well as after."""

    HANDSHAKE, HEADERS, BODY, ANSWERING, WRITING, IDLE = "handshake", "headers", "body", "answering", "writing", "idle"

    def __init__(
        self, inner: asyncio.Protocol, guard: _Guard, context: ssl.SSLContext | None, handshake: float
    ) -> None:
        self.inner, self.guard, self.context, self.handshake = inner, guard, context, handshake
        self.address: str | None = None
        self.raw: asyncio.BaseTransport | None = None  # the TCP connection
        self.transport: asyncio.BaseTransport | None = None  # what aiohttp sees (TLS or TCP)
        self.made = False  # aiohttp has been given the connection
        self.phase = self.HANDSHAKE
        self.bytes = 0  # of the request in progress, until its answer is written
        self.response = 0  # bytes of the answer being written
        self.since = time.monotonic()
        self.head = b""  # the request's header bytes, until their end is seen
        self.early: list[bytes] = []
        self.timer: asyncio.TimerHandle | None = None
        self.pool = ""  # whose bounds it counts against: its address, or DIRECT_POOL
        self.trusted = True  # the API server's (backpressure, never closed for bytes)
        self.owed = 0  # bytes its request declared and has not sent yet (trusted only)
        self.held: list[bytes] | None = None  # data kept from aiohttp while its request waits for room
        self.slowed: list[bytes] | None = (
            None  # a direct poster's reading paused (the pool's byte rate): data kept back
        )

    # --- the guard's checks -------------------------------------------------------------
    def close(self) -> None:
        for t in (self.transport, self.raw):
            if t is not None and not t.is_closing():
                abort = getattr(t, "abort", None)
                (abort or t.close)()
        self._forget()

    def _deadline(self, seconds: float | None = None) -> None:
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.header_timeout if seconds is None else seconds, self.close)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def release(self) -> None:
        g = self.guard
        if self.bytes and self.address is not None:
            g.pending -= self.bytes
            left = g.pending_by_client.get(self.pool, 0) - self.bytes
            if left > 0:
                g.pending_by_client[self.pool] = left
            else:
                g.pending_by_client.pop(self.pool, None)
        g.responses -= self.response
        g.owed -= self.owed
        freed = self.bytes or self.owed
        self.bytes = self.response = self.owed = 0
        if freed and g.waiting:
            g.wake()

    def hold(self) -> None:
        """Read no more of this request until it fits (backpressure: the client waits),
        said once a minute."""
        self.held = []
        g = self.guard
        g.waiting[self] = None
        quiet = g.said.due("hold")
        if quiet is not None:
            log.warning(
                "a request of the API server's waits, unread, for earlier ones to be answered: the request bytes "
                "being read are at their bound",
                extra={"server": g.name, "waiting": len(g.waiting), "also_held_since_last_said": quiet},
            )
        if self.transport is not None:
            self.transport.pause_reading()  # type: ignore[attr-defined]

    def let_in(self) -> None:
        held, self.held = self.held or [], None
        self.guard.owed += self.owed
        for data in held:
            if self.address is None:
                return
            self.inner.data_received(data)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()  # type: ignore[attr-defined]

    def unsent(self) -> int:
        """Bytes written to this connection that the kernel has not taken yet."""
        return sum(
            t.get_write_buffer_size()
            for t in (self.transport, self.raw)
            if isinstance(t, asyncio.WriteTransport) and not t.is_closing()
        )

    def evictable(self) -> bool:
        """Not while its answer is being decided or written; the API server's, only before
        its request's headers have all come (it sends them and its body in one go): never
        while its body is read or waits for room."""
        if self.trusted:
            return self.phase in (self.HANDSHAKE, self.HEADERS, self.IDLE)
        return self.phase not in (self.ANSWERING, self.WRITING)

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        if self.address is None:  # evicted between its accept and its transport
            transport.abort()  # type: ignore[attr-defined]
            return
        # The handshake's deadline (asyncio's own is the same); the header deadline starts after it.
        self._deadline(None if self.context is None else self.handshake)
        if self.context is None:
            self._made(transport)
        else:
            asyncio.get_running_loop().create_task(self._tls(transport))

    async def _tls(self, raw: asyncio.BaseTransport) -> None:
        if raw.is_closing() or self.address is None:
            # Shed or evicted before its handshake began: a TLS state now (256 KiB of buffer)
            # would never hear that its connection is gone, and live until the handshake
            # deadline; a flood of such connections held hundreds of MiB that way.
            return
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                raw,  # type: ignore[arg-type]
                self,
                self.context,  # type: ignore[arg-type]
                server_side=True,
                ssl_handshake_timeout=self.handshake,
            )
        except Exception:  # a failed or timed-out handshake, or the guard closed it meanwhile
            self.close()
            return
        if tls is None or self.address is None:  # closed meanwhile
            if tls is not None:
                tls.abort()
            return
        self._made(tls)

    def _made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guard.by_transport[id(transport)] = self
        self.phase = self.HEADERS
        self._deadline()
        self.made = True
        self.inner.connection_made(transport)
        early, self.early = self.early, []
        for data in early:
            if self.address is None:
                return
            self.inner.data_received(data)

    def _forget(self) -> None:
        if self.address is None:
            return
        g = self.guard
        self._cancel_timer()
        g.waiting.pop(self, None)
        if self.held is not None:  # what it owes was never counted in g.owed
            self.owed, self.held = 0, None
        self.release()
        conns = g.by_client.get(self.pool)
        if conns is not None:
            conns.pop(self, None)
            if not conns:
                del g.by_client[self.pool]
        if self.transport is not None:
            g.by_transport.pop(id(self.transport), None)
        g.open -= 1
        self.address = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        if self.made:
            self.made = False
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.address is None:
            return
        g, limits = self.guard, self.guard.limits
        self.bytes += len(data)
        g.pending += len(data)
        g.pending_by_client[self.pool] = g.pending_by_client.get(self.pool, 0) + len(data)
        if self.owed:
            paid = min(self.owed, len(data))
            self.owed -= paid
            if self.held is None:
                g.owed -= paid
        if self.held is not None:  # waiting for room: aiohttp resumed reading, the guard has not
            self.held.append(data)
            if self.transport is not None:
                self.transport.pause_reading()  # type: ignore[attr-defined]
            return
        if self.phase == self.IDLE:
            self.phase = self.HEADERS
            self._deadline()
        if self.phase == self.HEADERS:
            seen = self.head + data
            end = seen.find(HEADER_END)
            if end >= 0:
                self.phase, self.head = self.BODY, b""
                self._cancel_timer()
                declared = _content_length(seen[:end])
                if declared is not None:
                    total = self.bytes - len(seen) + end + len(HEADER_END) + declared
                    if self.trusted:
                        # The API server's request is never closed for bytes: one that does
                        # not fit waits, unread, for earlier ones to be answered.
                        self.owed = max(0, total - self.bytes)
                        if total > limits.max_pending_bytes - limits.small_reserve:
                            g.shed(self, "a request larger than any admission review")
                            return
                        if (g.waiting and total > SMALL_REQUEST) or not g.fits(self, self.owed):
                            self.hold()
                            self.held = [data]
                            return
                        g.owed += self.owed
                    # A body that could never fit is refused before its bytes are read: a client
                    # that resends one in a loop then costs a handshake, not megabytes of reads.
                    elif self._over(total - self.bytes):
                        return
            else:
                self.head = seen[-MAX_HEAD:]
        if not self.trusted and self._over(0):
            return
        while not self.trusted and g.pending > limits.max_pending_bytes:
            victim = g.largest_receiving() or self
            g.shed(victim, "unanswered request bytes over the bound")
            if victim is self:
                return
        if self.address is None:
            return
        if self.pool == DIRECT_POOL and self._throttle(data):
            return
        if not self.made:  # decrypted along with the handshake's end, before start_tls returned
            self.early.append(data)
            return
        self.inner.data_received(data)

    def _throttle(self, data: bytes) -> bool:
        """Direct posters together are read at `direct_read_bytes_per_second`: past it, this
        connection's reading pauses until the pool's debt is paid, and its next bytes wait
        undecrypted in the kernel. The event loop that reads the API server's reviews then
        spends a bounded share of itself on theirs, however many connections they cycle.
        True when `data` is kept back (aiohttp resumed reading meanwhile)."""
        t = self.transport
        if self.slowed is not None:
            self.slowed.append(data)
            if t is not None:
                t.pause_reading()  # type: ignore[attr-defined]
            return True
        wait = self.guard.direct_reads.spend(len(data))
        if wait > 0 and t is not None:
            self.slowed = []
            t.pause_reading()  # type: ignore[attr-defined]
            asyncio.get_running_loop().call_later(wait, self._unthrottle)
        return False

    def _unthrottle(self) -> None:
        kept, self.slowed = self.slowed or [], None
        for data in kept:
            if self.address is None:
                return
            self.inner.data_received(data)
        wait = self.guard.direct_reads.spend(sum(map(len, kept)))
        t = self.transport
        if wait > 0 and t is not None:
            self.slowed = []
            asyncio.get_running_loop().call_later(wait, self._unthrottle)
        elif self.address is not None and self.held is None and t is not None and not t.is_closing():
            t.resume_reading()  # type: ignore[attr-defined]

    def _over(self, coming: int) -> bool:
        """Over a bound with `coming` more bytes of this request: closed (True). A large
        request that crosses one is closed itself (its client sent the most, and bytes not
        read stay out of this process); a small one past the whole bound makes room, in
        data_received, by closing the largest large requests being received."""
        g, limits = self.guard, self.guard.limits
        bound = limits.max_pending_per_client if self.pool != DIRECT_POOL else limits.max_direct_bytes
        if g.pending_by_client.get(self.pool, 0) + coming > bound:
            g.shed(
                self,
                "request bytes from clients that are not the API server over the bound"
                if self.pool == DIRECT_POOL
                else "request bytes from one address over the bound",
            )
            return True
        if self.bytes + coming > SMALL_REQUEST and g.pending + coming > limits.max_pending_bytes - limits.small_reserve:
            g.shed(self, "unanswered request bytes over the bound")
            return True
        return False

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.made else None

    def pause_writing(self) -> None:
        if self.made:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.made:
            self.inner.resume_writing()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_fd_limit_lock = threading.Lock()
_fd_limit_raised = False


def raise_open_file_limit() -> tuple[int, int]:
    """The soft open-file limit up to the hard one (no privilege needed): connections and
    the controller's own API connections share one process's descriptors. Returns the
    (soft, hard) limits in force."""
    global _fd_limit_raised
    with _fd_limit_lock:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if not _fd_limit_raised and soft != hard:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
        _fd_limit_raised = True
        return soft, hard


class LoopServer:
    """An aiohttp application served on its own loop thread, behind the connection guard.
    `routes` are (method, path, handler); `on_start` runs on the loop once it serves;
    `trusted(address)` says whether a client is the API server (see the module's docstring)."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        routes: Sequence[tuple[str, str, Handler]],
        *,
        context: ssl.SSLContext | None = None,
        limits: Limits = Limits(),
        client_max_size: int = 1024**2,
        handshake_timeout: float = 5.0,
        on_start: Callable[[], Coroutine[Any, Any, Any]] | None = None,
        trusted: Callable[[str], bool] | None = None,
    ) -> None:
        self.name, self.host, self.port, self.routes = name, host, port, routes
        self.context, self.limits, self.client_max_size = context, limits, client_max_size
        self.handshake_timeout, self.on_start = handshake_timeout, on_start
        self.guard = _Guard(limits, name, trusted)
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._tasks_connect: set[asyncio.Task[Any]] = set()  # kept referenced until they finish
        self._listener: socket.socket
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio reports a failed accept (no file descriptors left) once per try, every
        second: said once a minute here, with how often it happened meanwhile."""
        message = str(context.get("message", ""))
        key = "accept" if "accept" in message else message[:80]
        quiet = self.guard.said.due("loop: " + key)
        if quiet is not None:
            log.warning(
                f"{self.name} server: {message}",
                extra={"error": str(context.get("exception") or ""), "also_since_last_said": quiet},
            )

    @web.middleware
    async def _answered(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The answer is written here, under the write deadline, and the request's bytes
        stay held until it is."""
        transport = request.transport
        try:
            resp = await handler(request)
            if isinstance(resp, web.Response) and transport is not None:
                body = resp.body
                self.guard.responding(transport, len(body) if isinstance(body, bytes | bytearray) else 0)
                try:
                    await asyncio.wait_for(self._write(request, resp), self.limits.write_timeout)
                except TimeoutError:
                    conn = self.guard.conn(transport)
                    if conn is not None:
                        self.guard.shed(conn, "the client did not read its answer in time")
                except ConnectionError:
                    pass
            return resp
        finally:
            self.guard.answered(transport)

    async def _write(self, request: web.Request, resp: web.Response) -> None:
        """Until the answer has left the process: a TLS transport takes a large write
        whole and stops only its next one, so the TCP buffer under it is watched too."""
        await resp.prepare(request)
        await resp.write_eof()
        conn = self.guard.conn(request.transport)
        while conn is not None and conn.address is not None and conn.unsent():
            await asyncio.sleep(0.02)

    async def _start(self) -> None:
        raise_open_file_limit()
        app = web.Application(client_max_size=self.client_max_size, middlewares=[self._answered])
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, keepalive_timeout=self.limits.keepalive_timeout
        )
        await self._runner.setup()
        assert self._runner.server is not None
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._listener = socket.create_server((self.host, self.port), family=family, backlog=256)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self.loop.add_reader(self._listener.fileno(), self._accept)
        if self.on_start is not None:
            self._tasks.append(self.loop.create_task(self.on_start()))

    def _accept(self) -> None:
        """Accept what the listening socket holds (at most its backlog a turn, as asyncio
        does). The guard decides on each from its address alone; only a connection it keeps
        gets a transport, an aiohttp handler and later its TLS state."""
        guard, factory = self.guard, self._runner.server
        assert factory is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of file descriptors or buffers: stop accepting for a second
                self._loop_error(self.loop, {"message": "accept failed", "exception": exc})
                self.loop.remove_reader(self._listener.fileno())
                self.loop.call_later(1.0, self.loop.add_reader, self._listener.fileno(), self._accept)
                return
            address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            admitted = guard.admit(address)
            if admitted is None:
                sock.close()
                continue
            # The context read at each accept: a reloaded certificate replaces it whole.
            conn = _Guarded(factory(), guard, self.context, self.handshake_timeout)
            guard.register(conn, address, *admitted)
            task = self.loop.create_task(self._connect(sock, conn))
            self._tasks_connect.add(task)
            task.add_done_callback(self._tasks_connect.discard)

    async def _connect(self, sock: socket.socket, conn: _Guarded) -> None:
        try:
            await self.loop.connect_accepted_socket(lambda: conn, sock)
        except OSError:
            sock.close()
            conn.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self._stopped.set()

    def start(self) -> LoopServer:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self) -> None:
        async def stop() -> None:
            for task in self._tasks:
                task.cancel()
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
            await self._runner.cleanup()
            self.loop.stop()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self.loop)
            self._stopped.wait(5)
