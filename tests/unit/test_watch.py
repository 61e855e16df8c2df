"""The reflector's recovery paths, driven by a scripted fake API (pure logic).

The real-server counterpart (a watch from a compacted version answers 410) is in
tests/integration/test_watch.py.
"""

from __future__ import annotations

import json
import threading

from headroom.cluster.client import ApiError
from headroom.cluster.watch import Reflector


def ev(kind: str, name: str, rv: str) -> bytes:
    return json.dumps({"type": kind, "object": {"metadata": {"name": name, "resourceVersion": rv}}}).encode()


class FakeApi:
    """Answers list and watch calls from a script; records what was asked."""

    def __init__(self, lists, watches, stop):
        self.lists, self.watches, self.stop = list(lists), list(watches), stop
        self.calls: list[tuple[str, str]] = []
        self.watch_lists = 0  # WatchList requests, refused

    def list_pages(self, path, params=None, limit=500, decode=None):
        self.calls.append(("list", ""))
        items, rv = self.lists.pop(0)
        yield {"items": items, "metadata": {"resourceVersion": rv}}

    def watch(self, path, resource_version, *, timeout_seconds, read_timeout, initial_events=False):
        if initial_events:  # a server without WatchList: the reflector lists page by page
            self.watch_lists += 1
            raise ApiError(
                422, "Invalid", "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
            )
        self.calls.append(("watch", resource_version))
        if not self.watches:
            self.stop.set()
            return iter(())
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        return iter(step)


def run(lists, watches, apis=None):
    stop = threading.Event()
    api = FakeApi(lists, watches, stop)
    if apis is not None:
        apis.append(api)
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


def test_a_silent_stream_relists_before_its_data_counts_again():
    """Events may have been lost while the stream was dead: only a relist makes the data whole."""
    calls, seen, _, r = run(
        [([], "10"), ([{"metadata": {"name": "a"}}], "12")],
        [[ev("ADDED", "a", "12")], ApiError(0, "Timeout", "watch silent for 360s"), [ev("ADDED", "b", "13")]],
    )
    assert calls == [("list", ""), ("watch", "10"), ("watch", "12"), ("list", ""), ("watch", "12"), ("watch", "13")]
    assert seen == [("ADDED", "a"), ("ADDED", "b")] and r.relists == 2
    assert r.problem() is None


def test_a_watch_that_ends_normally_resumes_without_relisting():
    calls, _, _, r = run([([], "10")], [[ev("ADDED", "a", "12")], [ev("ADDED", "b", "13")]])
    assert calls == [("list", ""), ("watch", "10"), ("watch", "12"), ("watch", "13")]
    assert r.relists == 1


def test_server_errors_back_off_and_relist():
    calls, *_ = run(
        [([], "10"), ([], "11"), ([], "12")],
        [ApiError(503, "ServiceUnavailable", "etcd"), ApiError(0, "Unreachable", "refused"), []],
    )
    assert calls[:6] == [("list", ""), ("watch", "10"), ("list", ""), ("watch", "11"), ("list", ""), ("watch", "12")]


def test_a_failing_watch_reports_a_problem_until_it_has_relisted():
    stop = threading.Event()
    problems: list[str | None] = []
    errors: list[str] = []

    class Api(FakeApi):
        def list_pages(self, path, params=None, limit=500, decode=None):
            problems.append(r.problem())
            yield from super().list_pages(path, params, limit)

    api = Api([([], "10"), ([], "20")], [ApiError(503, "ServiceUnavailable", "etcd")], stop)
    r = Reflector(
        api, "/api/v1/pods", lambda items: None, lambda k, o: None, stop, max_backoff=0.01, on_error=errors.append
    )
    r.run()
    assert problems[0] == "the first list of /api/v1/pods has not completed"
    assert problems[1] == "the watch of /api/v1/pods failed (503 ServiceUnavailable) and has not relisted since"
    assert r.problem() is None and errors == ["watch"]


def test_a_crashing_handler_never_kills_the_reflector():
    stop = threading.Event()
    api = FakeApi([([], "10"), ([], "30")], [[ev("ADDED", "boom", "11")], [ev("ADDED", "ok", "31")]], stop)
    seen: list[str] = []

    def on_event(kind, obj):
        if obj["metadata"]["name"] == "boom":
            raise ZeroDivisionError("a bug")
        seen.append(obj["metadata"]["name"])

    r = Reflector(api, "/api/v1/pods", lambda items: None, on_event, stop, max_backoff=0.01)
    r.run()
    assert seen == ["ok"] and r.relists == 2 and r.problem() is None


def bookmark(rv: str, end: bool = False) -> bytes:
    meta = {"resourceVersion": rv, **({"annotations": {"k8s.io/initial-events-end": "true"}} if end else {})}
    return json.dumps({"type": "BOOKMARK", "object": {"metadata": meta}}).encode()


def test_a_watch_list_stream_is_the_list_then_the_watch_and_a_410_in_it_starts_over():
    stop = threading.Event()
    asked: list[tuple[bool, str]] = []
    streams = [
        # the initial objects, a progress bookmark among them, the end bookmark, then events
        [
            ev("ADDED", "a", "5"),
            bookmark("6"),
            ev("ADDED", "b", "7"),
            bookmark("9", end=True),
            ev("MODIFIED", "a", "10"),
        ],
        # a later stream expires in the middle of its initial events: start over
        [ev("ADDED", "a", "12"), json.dumps({"type": "ERROR", "object": {"code": 410}}).encode()],
        [ev("ADDED", "c", "20"), bookmark("21", end=True)],
    ]

    class Api:
        def list_pages(self, *a, **kw):
            raise AssertionError("a server that streams lists is never listed page by page")

        def watch(self, path, resource_version, *, timeout_seconds, read_timeout, initial_events=False):
            asked.append((initial_events, resource_version))
            if not streams:
                stop.set()
                return iter(())
            return iter(streams.pop(0))

    listed: list[list[str]] = []
    seen: list[tuple[str, str]] = []
    r = Reflector(
        Api(),  # type: ignore[arg-type]
        "/api/v1/pods",
        lambda items: listed.append([i["metadata"]["name"] for i in items]),
        lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        stop,
        max_backoff=0.01,
    )
    r.run()
    assert listed[0] == ["a", "b"] and seen[0] == ("MODIFIED", "a")
    # after the first stream ended: a plain watch from the version it reached
    assert asked[:2] == [(True, ""), (False, "10")]
    assert listed[-1] == ["c"] and r.watch_list is True and r.resource_version == "21"
    assert r.relists == 2


def test_a_server_without_watch_list_is_asked_once_then_listed_page_by_page():
    apis: list[FakeApi] = []
    calls, _, listed, r = run(
        [([{"metadata": {"name": "a"}}], "10"), ([], "11")], [[], ApiError(503, "x", "y"), []], apis
    )
    assert r.watch_list is False and listed[0] == ["a"]
    assert calls[:3] == [("list", ""), ("watch", "10"), ("watch", "10")]
    assert apis[0].watch_lists == 1 and calls.count(("list", "")) == 2  # relisted after the 503, not re-asked


def test_a_stream_cut_mid_event_is_a_failed_watch_and_relists(caplog):
    calls, seen, _, r = run(
        [([], "10"), ([], "12")],
        [[ev("ADDED", "a", "11"), b'{"type":"MODIFIED","object":{"metadata":{"na'], []],
    )
    assert seen == [("ADDED", "a")]
    assert calls[:3] == [("list", ""), ("watch", "10"), ("list", "")]  # relisted, not resumed past the cut
    assert not [rec for rec in caplog.records if rec.levelname == "ERROR"], "a cut stream is not a crash"
    warned = [rec for rec in caplog.records if rec.getMessage() == "watch failed, retrying"]
    assert warned and "Truncated" in warned[0].error and r.relists == 2
