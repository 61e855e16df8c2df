"""List, then watch, one resource into the cache; survive every way a watch can end.

- resumes from the last seen `resourceVersion` (bookmarks keep it fresh on quiet streams);
- relists on `410 Gone` (the version fell out of etcd's window);
- reconnects with jittered exponential backoff on errors;
- treats a stream silent for longer than the server-side timeout plus a margin as dead —
  a known failure of Python operators, where a half-open connection blocks forever.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from .api import Api, ApiError

log = logging.getLogger("headroom.watch")

OnList = Callable[[list[dict[str, Any]]], None]
OnEvent = Callable[[str, dict[str, Any]], None]


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
    synced: threading.Event = field(default_factory=threading.Event)
    resource_version: str = ""
    relists: int = 0
    _thread: threading.Thread | None = None

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
                    self._list()
                    need_list = False
                self._watch()
                delay = min(0.5, self.max_backoff)
            except Gone:
                log.info("watch expired, relisting", extra={"path": self.path})
                need_list = True
            except ApiError as exc:
                if self.stop.is_set():
                    return  # shutting down: the connection was cut under us
                if exc.status == 410:
                    need_list = True
                    continue
                log.warning(
                    "watch failed, retrying", extra={"path": self.path, "error": str(exc), "retry_in": round(delay, 2)}
                )
                if exc.status not in (0, 429) and exc.status < 500:
                    need_list = True  # 403/404: the resource or our access changed; start over
                self.stop.wait(delay * (1 + random.random() * 0.2))
                delay = min(self.max_backoff, delay * 2)

    def _list(self) -> None:
        items: list[dict[str, Any]] = []
        version = ""
        for page in self.api.list_pages(self.path):
            items.extend(page.get("items") or ())
            version = (page.get("metadata") or {}).get("resourceVersion", version)
        self.on_list(items)
        self.resource_version = version
        self.relists += 1
        self.synced.set()

    def _watch(self) -> None:
        lines = self.api.watch(
            self.path,
            self.resource_version,
            timeout_seconds=int(self.timeout_seconds * (1 + random.random() * 0.1)),
            read_timeout=self.timeout_seconds * 1.1 + self.silence_margin,
        )
        self.handle(lines)

    def handle(self, lines: Iterable[bytes]) -> None:
        """Apply raw watch event lines; public so a benchmark can replay a recorded stream."""
        for line in lines:
            if self.stop.is_set():
                return
            event = orjson.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone()
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", "")))
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if kind != "BOOKMARK":
                self.on_event(kind, obj)
            if version:
                self.resource_version = version
