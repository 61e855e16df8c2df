"""The controller's two HTTP servers (the webhook, and /metrics with the probes) on one
shape: an aiohttp application on its own asyncio loop in a background thread, behind a
connection guard. asyncio holds an idle connection as a few kilobytes, not a thread;
the guard bounds what any client can hold:

- a request's headers must arrive within `header_timeout` of the connection being made
  (or of the request's first byte on a kept-alive connection), else it is closed;
- one client address holds at most `max_per_client` connections; a new one past that
  takes the place of the oldest of that address that is idle or still sending headers
  (so a flood from a shared address shuts out an honest client from it for at most the
  header deadline), and is refused only when every one of them is in a request;
- the bytes of requests not yet answered, across all connections, stay under
  `max_pending_bytes`: the connection that would pass it is closed, so the process's
  memory holds under any mix of nearly complete bodies.

Idle kept-alive connections are closed by aiohttp after its keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger("headroom.serving")

HEADER_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Limits:
    header_timeout: float = 2.0
    max_per_client: int = 128
    max_pending_bytes: int = 48 * 1024 * 1024
    keepalive_timeout: float = 30.0


class _Guard:
    """Shared bookkeeping of one server's connections (event loop thread only)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.by_client: dict[str, dict[_Guarded, None]] = {}  # insertion order: oldest first
        self.by_transport: dict[int, _Guarded] = {}
        self.pending = 0  # bytes of requests not yet answered, every connection

    def answered(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self.by_transport.get(id(transport)) if transport is not None else None
        if conn is not None:
            conn.answered()


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard's checks around it."""

    HEADERS, REQUEST, IDLE = "headers", "request", "idle"

    def __init__(self, inner: asyncio.Protocol, guard: _Guard) -> None:
        self.inner, self.guard = inner, guard
        self.address: str | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.phase = self.HEADERS
        self.bytes = 0  # of the request in progress
        self.tail = b""
        self.timer: asyncio.TimerHandle | None = None

    # --- the guard's checks -------------------------------------------------------------
    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            abort = getattr(self.transport, "abort", None)
            (abort or self.transport.close)()

    def _deadline(self) -> None:
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.header_timeout, self._close)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _release(self) -> None:
        self.guard.pending -= self.bytes
        self.bytes = 0

    def answered(self) -> None:
        self._release()
        self.phase, self.tail = self.IDLE, b""

    def evictable(self) -> bool:
        return self.phase != self.REQUEST

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        conns = self.guard.by_client.setdefault(address, {})
        if len(conns) >= self.guard.limits.max_per_client:
            oldest = next((c for c in conns if c.evictable()), None)
            if oldest is None:  # every one of them is in a request: refuse this one
                if not conns:
                    del self.guard.by_client[address]
                transport.close()
                return
            oldest._close()
            oldest._forget()
        conns[self] = None
        self.address, self.transport = address, transport
        self.guard.by_transport[id(transport)] = self
        self._deadline()
        self.inner.connection_made(transport)

    def _forget(self) -> None:
        if self.address is None:
            return
        self._cancel_timer()
        self._release()
        conns = self.guard.by_client.get(self.address)
        if conns is not None:
            conns.pop(self, None)
            if not conns:
                del self.guard.by_client[self.address]
        self.guard.by_transport.pop(id(self.transport), None)
        self.address = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return  # refused at connection_made: aiohttp never saw it
        self._forget()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.address is None:
            return
        self.bytes += len(data)
        self.guard.pending += len(data)
        if self.guard.pending > self.guard.limits.max_pending_bytes:
            log.warning("connection closed: unanswered request bytes over the bound", extra={"client": self.address})
            self._close()
            self._forget()
            return
        if self.phase == self.IDLE:
            self.phase = self.HEADERS
            self._deadline()
        if self.phase == self.HEADERS:
            seen = self.tail + data
            if HEADER_END in seen:
                self.phase = self.REQUEST
                self._cancel_timer()
            else:
                self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.address is not None else None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LoopServer:
    """An aiohttp application served on its own loop thread, behind the connection guard.
    `routes` are (method, path, handler); `on_start` runs on the loop once it serves."""

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
    ) -> None:
        self.name, self.host, self.port, self.routes = name, host, port, routes
        self.context, self.limits, self.client_max_size = context, limits, client_max_size
        self.handshake_timeout, self.on_start = handshake_timeout, on_start
        self.guard = _Guard(limits)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @web.middleware
    async def _answered(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            self.guard.answered(request.transport)

    async def _start(self) -> None:
        app = web.Application(client_max_size=self.client_max_size, middlewares=[self._answered])
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, keepalive_timeout=self.limits.keepalive_timeout
        )
        await self._runner.setup()
        assert self._runner.server is not None
        factory, guard = self._runner.server, self.guard
        self._server = await self.loop.create_server(
            lambda: _Guarded(factory(), guard),
            self.host,
            self.port,
            ssl=self.context,
            ssl_handshake_timeout=self.handshake_timeout if self.context is not None else None,
            backlog=256,
            reuse_address=True,
        )
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
        if self.on_start is not None:
            self._tasks.append(self.loop.create_task(self.on_start()))

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
            self._server.close()
            await self._runner.cleanup()
            self.loop.stop()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self.loop)
            self._stopped.wait(5)
