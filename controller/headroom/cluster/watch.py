"""List, then watch, one resource into the cache; survive every way a watch can end.

- resumes from the last seen `resourceVersion` (bookmarks keep it fresh on quiet streams);
- relists on `410 Gone` (the version fell out of etcd's window);
- reconnects with jittered exponential backoff on errors;
- treats a stream silent for longer than the server-side timeout plus a margin as dead —
  a known failure of Python operators, where a half-open connection blocks forever;
- survives every exception (a bug in a handler included): it is logged, counted, and the
  reflector starts over with a relist after a backoff.

After any failure the reflector is *unsynced* until a relist has completed: events may
have been missed, so nothing may be decided from its data (`problem()` says why). A
watch that ends normally (the server's timeout) resumes without a relist and stays synced.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from .client import Api, ApiError

log = logging.getLogger("headroom.watch")

OnList = Callable[[Iterable[dict[str, Any]]], None]  # consumed once, page by page
OnEvent = Callable[[str, dict[str, Any]], None]


INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


@dataclass
class Reflector:
    api: Api
    path: str  # e.g. /api/v1/pods
    on_list: OnList  # the complete current set, after every (re)list
    on_event: OnEvent  # ADDED / MODIFIED / DELETED with the raw object
    stop: threading.Event
    timeout_seconds: int = 300  # server closes the watch after this; we reconnect
    silence_margin: float = 30.0
    max_backoff: float = 30.0
    on_error: Callable[[str], None] = lambda component: None  # counts failures (a metric)
    # Raw bytes -> parsed JSON; pods use the typed decoders of cluster/decode.py.
    decode_event: Callable[[bytes], Any] = orjson.loads
    decode_page: Callable[[bytes], Any] = orjson.loads
    synced: threading.Event = field(default_factory=threading.Event)  # the first list is in
    resource_version: str = ""
    relists: int = 0
    failing: str | None = None  # the last failure, until a relist completes after it
    last_contact: float = field(default_factory=time.monotonic)  # last sign of life from the server
    # How the initial state is read: None until known — a WatchList stream where the server
    # serves one (True), else a paginated list (False, kept once the server refused).
    watch_list: bool | None = None
    _thread: threading.Thread | None = None

    def problem(self) -> str | None:
        """Why this reflector's data may not be decided on now; None when it may."""
        if not self.synced.is_set():
            return f"the first list of {self.path} has not completed"
        if self.failing is not None:
            return f"the watch of {self.path} failed ({self.failing}) and has not relisted since"
        return None

    def alive(self) -> tuple[bool, str]:
        """For /healthz: the thread runs and the server was heard from recently enough."""
        if self._thread is not None and not self._thread.is_alive() and not self.stop.is_set():
            return False, f"the watch thread of {self.path} has died"
        silent = time.monotonic() - self.last_contact
        limit = self.timeout_seconds * 1.1 + self.silence_margin + self.max_backoff
        if silent > limit:
            return False, f"nothing heard from the watch of {self.path} for {silent:.0f}s"
        return True, "ok"

    def start(self) -> Reflector:
        self._thread = threading.Thread(target=self.run, name=f"watch{self.path}", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        delay = min(0.5, self.max_backoff)
        need_list = True
        while not self.stop.is_set():
            try:
                if need_list:
                    need_list = False
                    if self.watch_list is not False and self._stream_list():
                        continue  # the WatchList stream went on as the watch, and has ended
                    self._list()
                self._watch()
                delay = min(0.5, self.max_backoff)
                continue
            except Gone:
                log.info("watch expired, relisting", extra={"path": self.path})
                self.failing = self.failing or "410 Gone"
                need_list = True
                continue
            except ApiError as exc:
                if self.stop.is_set():
                    return  # shutting down: the connection was cut under us
                if exc.status == 410:
                    self.failing = self.failing or "410 Gone"
                    need_list = True
                    continue
                log.warning(
                    "watch failed, retrying", extra={"path": self.path, "error": str(exc), "retry_in": round(delay, 2)}
                )
                self.failing = f"{exc.status} {exc.reason}".strip()
            except Exception as exc:  # a bug, in a handler or here: never let the thread die
                if self.stop.is_set():
                    return
                log.exception("watch handler crashed; relisting", extra={"path": self.path})
                self.failing = f"{type(exc).__name__}: {exc}"[:200]
            self.on_error("watch")
            # Events may have been lost: only a relist makes the data whole again.
            need_list = True
            self.stop.wait(delay * (1 + random.random() * 0.2))
            delay = min(self.max_backoff, delay * 2)

    def _decode(self, line: bytes) -> Any:
        """One event line; a line that is not JSON (a stream cut mid-event) fails the watch
        like a dropped connection: relist, never skip."""
        try:
            return self.decode_event(line)
        except ValueError as exc:  # orjson.JSONDecodeError, and msgspec's errors fall back to it
            raise ApiError(0, "Truncated", f"watch {self.path}: an event cannot be read ({exc})") from None

    def _stream_list(self) -> bool:
        """Read the initial state as a WatchList stream and go on watching on it; False when
        the server refuses WatchList (then the caller lists page by page, from now on).
        Like the paginated list, the objects reach `on_list` one at a time as they arrive."""
        try:
            lines = iter(self._open("", initial_events=True))
            first = next(lines, None)
        except ApiError as exc:
            if exc.status not in (400, 403, 422):
                raise
            log.info("the server does not stream lists (WatchList); listing page by page", extra={"path": self.path})
            self.watch_list = False
            return False
        version: dict[str, str] = {}

        def items() -> Iterator[dict[str, Any]]:
            for kind, obj in self._events(itertools.chain([first] if first is not None else [], lines)):
                if kind == "BOOKMARK":
                    meta = obj.get("metadata") or {}
                    if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        version["rv"] = str(meta.get("resourceVersion") or "")
                        return
                    continue
                yield obj
            raise ApiError(0, "Incomplete", f"the initial events of {self.path} ended before their end bookmark")

        objects = items()
        self.on_list(objects)
        for _ in objects:  # a handler that stopped early: the list still completes
            pass
        self._listed(version["rv"])
        self.watch_list = True
        self.handle(lines)
        return True

    def _listed(self, resource_version: str) -> None:
        self.resource_version = resource_version
        self.relists += 1
        if self.failing is not None:
            log.info("watch recovered: relisted", extra={"path": self.path, "after": self.failing})
        self.failing = None
        self.synced.set()

    def _list(self) -> None:
        """A paginated list, handed to `on_list` page by page: the handler builds its records
        as the pages arrive, so the whole decoded list is never held (one page at a time)."""
        version = {"rv": ""}

        def items() -> Iterator[dict[str, Any]]:
            for page in self.api.list_pages(self.path, decode=self.decode_page):
                version["rv"] = (page.get("metadata") or {}).get("resourceVersion", version["rv"])
                self.last_contact = time.monotonic()
                batch = page.get("items") or ()
                del page  # only this page's items stay alive while they are read
                yield from batch
                del batch

        pages = items()
        self.on_list(pages)
        for _ in pages:  # a handler that stopped early: the list still completes
            pass
        self._listed(version["rv"])

    def _open(self, resource_version: str, initial_events: bool = False) -> Iterator[bytes]:
        return self.api.watch(
            self.path,
            resource_version,
            timeout_seconds=int(self.timeout_seconds * (1 + random.random() * 0.1)),
            read_timeout=self.timeout_seconds * 1.1 + self.silence_margin,
            initial_events=initial_events,
        )

    def _watch(self) -> None:
        self.handle(self._open(self.resource_version))

    def _events(self, lines: Iterable[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, object) of each event line, noting the server's sign of life; an ERROR
        event raises (Gone for 410), a line that cannot be read fails the watch."""
        for line in lines:
            self.last_contact = time.monotonic()
            event = self._decode(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone()
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", "")))
            yield kind, obj

    def handle(self, lines: Iterable[bytes]) -> None:
        """Apply raw watch event lines; public so a benchmark can replay a recorded stream."""
        self.last_contact = time.monotonic()
        for kind, obj in self._events(lines):
            if self.stop.is_set():
                return
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if kind != "BOOKMARK":
                self.on_event(kind, obj)
            if version:
                self.resource_version = version
