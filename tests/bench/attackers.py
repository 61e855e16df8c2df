"""A hostile tenant's traffic for the admission benchmarks: threads in a process of their
own (so that the attackers' work does not delay the honest client's measurements), each
running `body(attackers, i)` until told to stop, and what they sent counted in shared
memory."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3


@dataclass
class Sent:
    requests: int = 0  # answered
    failed: int = 0
    bytes: int = 0
    connections: int = 0


class Attackers:
    def __init__(self, name: str, threads: int, body: Callable[[Attackers, int], None], addresses: int = 1) -> None:
        self.name, self.threads, self.body, self.addresses = name, threads, body, addresses
        ctx = multiprocessing.get_context("fork")
        self.stop = ctx.Event()
        self.counts = ctx.Array("q", 4)  # requests, failed, bytes, connections
        self.process: Any = None
        self.env: dict[str, Any] = {}  # what the bodies need: ports, the CA, prepared bodies

    def count(self, requests: int = 0, failed: int = 0, sent: int = 0, connections: int = 0) -> None:
        with self.counts.get_lock():
            for i, v in enumerate((requests, failed, sent, connections)):
                self.counts[i] += v

    @property
    def sent(self) -> Sent:
        return Sent(*self.counts[:])

    def start(self, env: dict[str, Any]) -> None:
        self.env = env
        self.stop.clear()
        for i in range(4):
            self.counts[i] = 0
        self.process = multiprocessing.get_context("fork").Process(target=self._run, daemon=True)
        self.process.start()

    def end(self) -> None:
        self.stop.set()
        if self.process is not None:
            self.process.join(20)
            if self.process.is_alive():
                self.process.kill()

    def _run(self) -> None:
        threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(self.threads)]
        for t in threads:
            t.start()
        self.stop.wait()
        for t in threads:
            t.join(10)

    def _loop(self, i: int) -> None:
        while not self.stop.is_set():
            try:
                self.body(self, i)
            except (OSError, IndexError, ValueError, urllib3.exceptions.HTTPError):  # refused, cut, unanswered
                self.count(failed=1)
                self.stop.wait(0.05)
