"""A watch against the real API server: list, then events as they happen.

The recovery paths (410 Gone, a silent stream, server errors) are driven by a scripted
fake in tests/unit/test_watch.py: the API server's watch cache serves old versions from
memory, so a real 410 would take minutes of churn to provoke.
"""

from __future__ import annotations

import threading
import time

from headroom.cluster.watch import Reflector
from helpers.factories import namespace as namespace_obj


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


def test_the_server_streams_the_list_and_a_paginated_list_reads_the_same(api, namespace):
    """This API server serves WatchList: the reflector reads its initial state from one
    stream; forced to list page by page (as on a server without it) it reads the same."""
    for i in range(7):
        api.post("/api/v1/namespaces", namespace_obj(f"{namespace}-l{i}"))
    try:
        got = {}
        for mode in (None, False):
            stop = threading.Event()
            listed: list[list[str]] = []
            r = Reflector(
                api,
                "/api/v1/namespaces",
                lambda items, listed=listed: listed.append([i["metadata"]["name"] for i in items]),
                lambda kind, obj: None,
                stop,
            )
            r.watch_list = mode
            r.start()
            try:
                assert r.synced.wait(10)
                got[mode] = (sorted(listed[0]), r.watch_list, int(r.resource_version))
            finally:
                stop.set()
        streamed, paged = got[None], got[False]
        assert streamed[1] is True and paged[1] is False
        assert streamed[0] == paged[0] and {f"{namespace}-l{i}" for i in range(7)} <= set(streamed[0])
        assert streamed[2] > 0 and paged[2] > 0
    finally:
        for i in range(7):
            api.delete(f"/api/v1/namespaces/{namespace}-l{i}")
