"""A fault-injecting HTTP proxy between `headroom run` and the test kube-apiserver.

Loopback only, seeded, bounded: each rule fires at most `times` times (or with a seeded
probability), so every run ends. It forwards everything else byte for byte (watch streams
line by line), and records every write it saw with its time, so tests can count writes
from outside the controller.

Faults: an HTTP status with a real `metav1.Status` body (and `Retry-After`), added latency,
a connection closed with no answer, a watch stream cut after N events, and a watch that
answers `410 Gone` the way the API server does (an ERROR event whose object is a Status
with code 410).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import re
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

WRITES = ("POST", "PUT", "PATCH", "DELETE")
_REASONS = {
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "InternalError"),
        "code": code,
    }


@dataclass
class Rule:
    method: str  # GET, PATCH, ... or "*"
    path: str  # a regex searched in the path (query string excluded)
    status: int | None = None  # answer with this instead of forwarding
    retry_after: int | None = None
    delay: float = 0.0  # seconds added before forwarding
    cut_after: int | None = None  # watch: close the stream after this many event lines
    gone: bool = False  # watch: answer with the API server's 410 ERROR event
    drop: bool = False  # close the connection without an answer (a timeout, a reset)
    watch: bool | None = None  # only watch requests (True), only non-watch (False), or both
    times: int | None = None  # at most this many firings; None: unlimited
    probability: float = 1.0
    until: float | None = None  # monotonic deadline after which the rule is off
    fired: int = 0

    def matches(self, method: str, path: str, is_watch: bool, rng: random.Random) -> bool:
        if self.method != "*" and self.method != method:
            return False
        if self.watch is not None and self.watch != is_watch:
            return False
        if not re.search(self.path, path):
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        if self.until is not None and time.monotonic() > self.until:
            return False
        if self.probability < 1.0 and rng.random() >= self.probability:
            return False
        self.fired += 1
        return True


@dataclass
class FaultProxy:
    upstream: str  # https://127.0.0.1:PORT
    ca_file: Path
    seed: int = 1
    rules: list[Rule] = field(default_factory=list)
    writes: list[tuple[float, str, str, int]] = field(default_factory=list)  # (time, method, path, status)
    injected: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, what)
    attempts: list[tuple[float, str, str]] = field(default_factory=list)  # every write sent, faulted or not
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _streams: dict[int, tuple[str, Any]] = field(default_factory=dict)  # live watches: id -> (path, socket)

    def cut(self, path: str) -> int:
        """Close every live watch stream whose path matches; how many were cut."""
        with self._lock:
            victims = [(k, sock) for k, (p, sock) in self._streams.items() if re.search(path, p)]
        for _, sock in victims:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return len(victims)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        u = urllib.parse.urlsplit(self.upstream)
        self._host, self._port = u.hostname or "127.0.0.1", u.port or 443
        self._ctx = ssl.create_default_context(cafile=str(self.ca_file))
        self._server: ThreadingHTTPServer | None = None

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _rule(self, method: str, path: str, is_watch: bool) -> Rule | None:
        with self._lock:
            for r in self.rules:
                if r.matches(method, path, is_watch, self.rng):
                    return r
        return None

    def start(self) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 so a watch can be streamed chunked (a client reads a body without length
            # to its end before yielding anything); one request per connection all the same.
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def kubeconfig(self, url: str, token: str, path: Path) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: proxy\n  cluster:\n    server: {url}\n"
            f"users:\n- name: u\n  user:\n    token: {token}\n"
            "contexts:\n- name: proxy\n  context: {cluster: proxy, user: u}\ncurrent-context: proxy\n"
        )
        return path

    # --- one request ------------------------------------------------------------------
    def _send_status(self, h: BaseHTTPRequestHandler, code: int, message: str, retry_after: int | None) -> None:
        body = json.dumps(status_body(code, message)).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        if retry_after is not None:
            h.send_header("Retry-After", str(retry_after))
        h.end_headers()
        h.wfile.write(body)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        method = h.command
        split = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qs(split.query)
        is_watch = query.get("watch", ["false"])[0] in ("true", "1")
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        if method in WRITES:
            with self._lock:
                self.attempts.append((time.monotonic(), method, split.path))
        rule = self._rule(method, split.path, is_watch)
        if rule is not None and rule.delay:
            time.sleep(rule.delay)
        if rule is not None and rule.drop:
            with self._lock:
                self.injected.append((method, split.path, "dropped"))
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
            return
        if rule is not None and rule.status is not None:
            with self._lock:
                self.injected.append((method, split.path, str(rule.status)))
            self._send_status(h, rule.status, f"injected by the test proxy ({rule.status})", rule.retry_after)
            return
        if rule is not None and rule.gone and is_watch:
            with self._lock:
                self.injected.append((method, split.path, "410-event"))
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Transfer-Encoding", "chunked")
            h.send_header("Connection", "close")
            h.end_headers()
            rv = query.get("resourceVersion", ["0"])[0]
            event = {"type": "ERROR", "object": status_body(410, f"too old resource version: {rv} (injected)")}
            _chunk(h, json.dumps(event).encode() + b"\n")
            _chunk(h, b"")
            return
        conn = http.client.HTTPSConnection(self._host, self._port, context=self._ctx, timeout=400)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in ("host", "connection", "accept-encoding")}
        try:
            conn.request(method, h.path, body=body, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:
            self._send_status(h, 503, f"proxy: upstream unreachable: {exc}", None)
            return
        if method in WRITES:
            with self._lock:
                self.writes.append((time.monotonic(), method, split.path, resp.status))
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() in ("content-type", "retry-after", "audit-id"):
                h.send_header(k, v)
        if not is_watch or resp.status != 200:
            data = resp.read()
            h.send_header("Content-Length", str(len(data)))
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.write(data)
            conn.close()
            return
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.flush()
        lines = 0
        with self._lock:
            self._streams[id(h)] = (split.path, h.connection)
        try:
            while True:
                chunk = resp.read1(65536)  # what has arrived, without waiting for more
                if not chunk:
                    break
                _chunk(h, chunk)
                lines += chunk.count(b"\n")
                if rule is not None and rule.cut_after is not None and lines >= rule.cut_after:
                    with self._lock:
                        self.injected.append((method, split.path, f"cut after {lines}"))
                    break
            _chunk(h, b"")  # the end of the stream, as the server ends a watch
        except (OSError, http.client.HTTPException):
            pass  # the stream ended under us: the client sees a closed watch
        finally:
            with self._lock:
                self._streams.pop(id(h), None)
            conn.close()


def _chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    h.wfile.flush()
