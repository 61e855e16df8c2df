"""The reflector's recovery paths, driven by a scripted fake API (pure logic).

The real-server counterpart (a watch from a compacted version answers 410) is in
tests/integration/test_watch.py.
"""

from __future__ import annotations

import json
import threading

from headroom.cluster.api import ApiError
from headroom.cluster.watch import Reflector


def ev(kind: str, name: str, rv: str) -> bytes:
    return json.dumps({"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}}).encode()


class FakeApi:
    """Answers list and watch calls from a script; records what was asked."""

    def __init__(self, lists, watches, stop):
        self.lists, self.watches, self.stop = list(lists), list(watches), stop
        self.calls: list[tuple[str, str]] = []

    def list_pages(self, path, params=None, limit=500):
        self.calls.append(("list", ""))
        items, rv = self.lists.pop(0)
        yield {"items": items, "metadata": {"resourceVersion": rv}}

    def watch(self, path, resource_version, *, timeout_seconds, read_timeout):
        self.calls.append(("watch", resource_version))
        if not self.watches:
            self.stop.set()
            return iter(())
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        return iter(step)


def run(lists, watches):
    stop = threading.Event()
    api = FakeApi(lists, watches, stop)
    seen: list[tuple[str, str]] = []
    listed: list[list[str]] = []
    r = Reflector(
        api,
        "/api/v1/pods",
        lambda items: listed.append([i["metadata"]["name"] for i in items]),
        lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        stop,
        max_backoff=0.01,
    )
    r.run()
    return api.calls, seen, listed, r


def test_resumes_from_the_last_version_and_bookmarks_advance_it():
    calls, seen, listed, r = run(
        [([{"metadata": {"name": "a"}}], "10")],
        [[ev("ADDED", "b", "11"), ev("BOOKMARK", "", "15")], [ev("MODIFIED", "b", "16")]],
    )
    assert listed == [["a"]]
    assert seen == [("ADDED", "b"), ("MODIFIED", "b")]
    assert calls == [("list", ""), ("watch", "10"), ("watch", "15"), ("watch", "16")]
    assert r.synced.is_set()


def test_410_gone_relists():
    calls, _, listed, r = run(
        [([], "10"), ([{"metadata": {"name": "x"}}], "50")],
        [[json.dumps({"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}).encode()], []],
    )
    assert calls[:4] == [("list", ""), ("watch", "10"), ("list", ""), ("watch", "50")]
    assert listed == [[], ["x"]] and r.relists == 2


def test_http_410_on_the_watch_request_relists_too():
    calls, *_ = run([([], "10"), ([], "60")], [ApiError(410, "Gone", "too old"), []])
    assert calls[:4] == [("list", ""), ("watch", "10"), ("list", ""), ("watch", "60")]


def test_a_silent_stream_reconnects_from_where_it_was_without_relisting():
    calls, seen, _, r = run(
        [([], "10")],
        [[ev("ADDED", "a", "12")], ApiError(0, "Timeout", "watch silent for 360s"), [ev("ADDED", "b", "13")]],
    )
    assert calls == [("list", ""), ("watch", "10"), ("watch", "12"), ("watch", "12"), ("watch", "13")]
    assert seen == [("ADDED", "a"), ("ADDED", "b")] and r.relists == 1


def test_server_errors_back_off_and_retry():
    calls, *_ = run(
        [([], "10")], [ApiError(503, "ServiceUnavailable", "etcd"), ApiError(0, "Unreachable", "refused"), []]
    )
    assert calls == [("list", ""), ("watch", "10"), ("watch", "10"), ("watch", "10"), ("watch", "10")]
