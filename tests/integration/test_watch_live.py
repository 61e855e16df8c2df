"""A watch against the real API server: list, then events as they happen.

The recovery paths (410 Gone, a silent stream, server errors) are driven by a scripted
fake in tests/unit/test_watch.py: the API server's watch cache serves old versions from
memory, so a real 410 would take minutes of churn to provoke.
"""

from __future__ import annotations

import threading
import time

from factories import namespace as namespace_obj
from headroom.cluster.watch import Reflector


def test_reflector_lists_then_streams_events(api, namespace):
    stop = threading.Event()
    listed: list[list[str]] = []
    seen: list[tuple[str, str]] = []
    r = Reflector(
        api,
        "/api/v1/namespaces",
        lambda items: listed.append([i["metadata"]["name"] for i in items]),
        lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        stop,
    ).start()
    try:
        assert r.synced.wait(10)
        assert namespace in listed[0]
        extra = f"{namespace}-w"
        api.post("/api/v1/namespaces", namespace_obj(extra))
        api.delete(f"/api/v1/namespaces/{extra}")
        deadline = time.monotonic() + 10
        while ("ADDED", extra) not in seen or ("MODIFIED", extra) not in seen:
            assert time.monotonic() < deadline, seen
            time.sleep(0.1)
        assert int(r.resource_version) > 0
    finally:
        stop.set()
