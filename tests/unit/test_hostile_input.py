"""Generated garbage and boundary values through every parser and loader: nothing raises
past its boundary (pure logic, hypothesis). A record builder may refuse an object with
RecordError, a quantity parser with QuantityError; nothing else may escape."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headroom.api.resolve import resolve
from headroom.cluster import decode
from headroom.core import limitrange, quota
from headroom.core import neighbours as nb
from headroom.core.planner import plan_cluster, plan_node
from headroom.core.quantity import QuantityError, cpu_milli, whole_units
from headroom.core.records import RecordError, namespace_from_dict, node_from_dict, pod_from_dict
from headroom.webhook.server import Sources, review_response
from helpers.factories import container, node, pod
from helpers.generated import run_counting

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from podgen import make_pod

BOUNDARY = st.sampled_from(
    ["", " ", "0", "-1", "1e999999", "1e-999999", "9" * 80, "1e1.5", "²", "NaN", "inf", "1Ei", "9Ei", "0.0000000001n"]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=30),
    BOUNDARY,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)

# Where garbage is put into an otherwise valid pod.
POD_PATHS = [
    ("metadata", "annotations", "kube-headroom.dev/max-cpu"),
    ("metadata", "annotations", "kube-headroom.dev/status"),
    ("metadata", "annotations", "kube-headroom.dev/original-cpu-limits"),
    ("metadata", "labels", "kube-headroom.dev/mode"),
    ("metadata", "annotations", "kube-headroom.dev/reclaim-limit"),
    ("metadata", "ownerReferences"),
    ("metadata", "generation"),
    ("metadata", "managedFields"),
    ("metadata", "managedFields", 0, "manager"),
    ("metadata", "managedFields", 0, "fieldsV1"),
    ("metadata", "managedFields", 0, "fieldsV1", "f:spec"),
    ("metadata", "managedFields", 0, "fieldsV1", "f:spec", "f:containers"),
    ("metadata", "managedFields", 0, "fieldsV1", "f:spec", "f:resources", "f:limits"),
    ("spec", "containers", 0, "resources", "requests", "cpu"),
    ("spec", "containers", 0, "resources", "limits", "cpu"),
    ("spec", "containers", 0, "resources", "limits", "memory"),
    ("spec", "containers", 0, "resizePolicy"),
    ("spec", "resources"),
    ("spec", "overhead"),
    ("spec", "os"),
    ("spec", "nodeSelector"),
    ("status", "conditions"),
    ("status", "containerStatuses"),
    ("status", "qosClass"),
]


def _put(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        if isinstance(obj, dict):
            obj = obj.setdefault(part, {} if not isinstance(path[path.index(part) + 1], int) else [{}])
        elif isinstance(obj, list) and isinstance(part, int) and part < len(obj):
            obj = obj[part]
        else:
            return
    if isinstance(obj, dict):
        obj[path[-1]] = value


def test_garbage_in_a_pod_is_refused_or_planned_never_raised():
    planned = run_counting(_garbage_pod)
    # A test whose every case is refused before the planner would hold nothing: enough of
    # the garbage must be read and planned (about half of it is, with these strategies).
    assert planned >= 50, planned


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(POD_PATHS), JSON), min_size=1, max_size=4))
def _garbage_pod(reached, edits):
    raw = pod("p", namespace="ns", containers=[container(cpu="500m")])
    for path, value in edits:
        _put(raw, path, value)
    try:
        rec = pod_from_dict(raw)
    except RecordError:
        return
    reached.append(1)
    ns = namespace_from_dict({"metadata": {"name": "ns", "labels": {"kube-headroom.dev/mode": "managed"}}})
    good = pod_from_dict(pod("q", namespace="ns", containers=[container(cpu="250m")]))
    res = resolve(
        [{"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}], []
    )
    plan = plan_node(node_from_dict(node("n1")), [rec, good], {"ns": ns}, res.resolver.base, pod_level_resize=True)
    # The unrelated pod on the node is still planned, whatever its neighbour holds.
    assert next(pp for pp in plan.pods if pp.pod.name == "q").target is not None


NEIGHBOUR_PATHS = [
    ("spec", "targetRef"),
    ("spec", "targetRef", "name"),
    ("spec", "updatePolicy", "updateMode"),
    ("spec", "resourcePolicy", "containerPolicies"),
    ("spec", "limits"),
    ("spec", "hard", "limits.cpu"),
    ("status", "used", "limits.cpu"),
]


def test_garbage_in_a_vpa_limit_range_or_quota_is_refused_or_planned_never_raised():
    """A tenant writes these objects: whatever they hold, the namespace's pods are planned."""
    planned = run_counting(_garbage_neighbour)
    assert planned >= 50, planned


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["VerticalPodAutoscaler", "LimitRange", "ResourceQuota"]),
    st.tuples(st.sampled_from(NEIGHBOUR_PATHS), JSON),
)
def _garbage_neighbour(reached, kind, edit):
    base = {
        "VerticalPodAutoscaler": {"spec": {"targetRef": {"kind": "Deployment", "name": "web"}}},
        "LimitRange": {"spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]}},
        "ResourceQuota": {"spec": {"hard": {"limits.cpu": "2"}}, "status": {"used": {"limits.cpu": "1"}}},
    }[kind]
    raw = {"kind": kind, "metadata": {"name": "x", "namespace": "ns"}, **base}
    _put(raw, edit[0], edit[1])
    build = {"VerticalPodAutoscaler": nb.vpa_from_dict, "LimitRange": limitrange.limit_range_from_dict}.get(
        kind, quota.quota_from_dict
    )
    try:
        record = build(raw)
    except RecordError:
        return
    reached.append(kind)
    neighbours = nb.with_object(nb.EMPTY, kind, record, "ns", "x")
    ns = namespace_from_dict({"metadata": {"name": "ns", "labels": {"kube-headroom.dev/mode": "managed"}}})
    good = pod_from_dict(
        pod(
            "web-5d8f-x",
            namespace="ns",
            containers=[container(cpu="250m")],
            owner_kind="ReplicaSet",
            owner_name="web-5d8f",
            labels={"pod-template-hash": "5d8f"},
        )
    )
    settings_ = resolve(
        [{"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}], []
    ).resolver
    plan = plan_cluster(
        [node_from_dict(node("n1"))], [good], {"ns": ns}, settings_, pod_level_resize=True, neighbours=neighbours
    )
    (only,) = plan.all_pods()
    assert only.reason in ("Managed", "VPAControlsLimits", "LimitRangeConflict")


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_garbage_objects_are_refused_with_record_error(value):
    for build in (
        pod_from_dict,
        node_from_dict,
        namespace_from_dict,
        nb.vpa_from_dict,
        limitrange.limit_range_from_dict,
        quota.quota_from_dict,
    ):
        with contextlib.suppress(RecordError):  # refused with a message, or read: never anything else
            build(value if isinstance(value, dict) else {"metadata": value, "spec": value, "status": value})


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, BOUNDARY))
def test_quantities_parse_or_say_why(value):
    for parse in (cpu_milli, whole_units):
        with contextlib.suppress(QuantityError):
            assert isinstance(parse(value), int)


V = "kube-headroom.dev/v1alpha1"


@settings(max_examples=300, deadline=None)
@given(JSON, JSON, st.dictionaries(st.sampled_from(["HeadroomConfig/cluster", "NodePoolProfile/p"]), JSON, max_size=2))
def test_garbage_configuration_resolves_to_something_never_raises(spec, profile_spec, remembered):
    configs = [
        {
            "apiVersion": V,
            "kind": "HeadroomConfig",
            "metadata": {"name": "cluster"},
            "spec": spec,
            "status": {"lastAppliedSpec": profile_spec},
        }
    ]
    profiles = [{"apiVersion": V, "kind": "NodePoolProfile", "metadata": {"name": "p"}, "spec": profile_spec}]
    res = resolve(configs, profiles, remembered)  # type: ignore[arg-type]
    s = res.resolver.settings_for({"pool": "p"})
    # Either usable settings or a reason why nothing is written; never a half-read config.
    assert s.blocked is None or isinstance(s.blocked, str)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_the_webhook_admits_whatever_it_is_sent(review):
    res = resolve([{"apiVersion": V, "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}], [])
    managed = namespace_from_dict({"metadata": {"name": "team", "labels": {"kube-headroom.dev/mode": "managed"}}})
    nodes = {"n1": node_from_dict(node("n1"))}
    body = review if isinstance(review, dict) else {"request": review}
    for obj in (body, {"request": {"operation": "CREATE", "kind": {"kind": "Pod"}, "object": review, "uid": "u"}}):
        out, _ = review_response(
            copy.deepcopy(obj), Sources(lambda name: managed, lambda: res.resolver, nodes=lambda: nodes)
        )
        assert out["response"]["allowed"] is True


PLACEMENT_PATHS = [
    ("spec", "nodeName"),
    ("spec", "nodeSelector"),
    ("spec", "affinity"),
    ("spec", "affinity", "nodeAffinity"),
    ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"),
    ("spec", "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"),
    ("spec", "os"),
    ("metadata", "annotations", "kube-headroom.dev/max-cpu"),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PLACEMENT_PATHS), JSON), min_size=1, max_size=3))
def test_garbage_placement_is_never_mutated_past_its_candidates(edits):
    """Whatever a new pod says about where it may run, the webhook answers, and any limit it
    sets is one the controller's rules allow on the node the pod names."""
    from headroom.webhook.mutation import patch_for

    res = resolve([{"apiVersion": V, "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}], [])
    managed = namespace_from_dict({"metadata": {"name": "team", "labels": {"kube-headroom.dev/mode": "managed"}}})
    nodes = {n: node_from_dict(node(n)) for n in ("n1", "n2")}
    raw = pod(node=None)
    raw.pop("status")
    for path, value in edits:
        target: Any = raw
        for part in path[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[path[-1]] = copy.deepcopy(value)
    ops = patch_for(raw, managed, res.resolver, nb.EMPTY, nodes)
    assert isinstance(ops, list)
    for op in ops:
        assert op["op"] == "add"


HOSTILE_FILES = [
    b"kind: HeadroomConfig\nmetadata:\n  name: \xff\xfe\n",  # not UTF-8
    b"a: " + b"[" * 3000 + b"]" * 3000 + b"\n",  # nested past any parser's recursion
    b"[" * 5000 + b"]" * 5000,  # the same, as JSON
    b"apiVersion: kube-headroom.dev/v1alpha1\nkind: [HeadroomConfig]\nmetadata: {name: cluster}\n",
    b"apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: [cluster]\n",
    b"apiVersion: v1\nkind: Namespace\nmetadata: {name: a, labels: [x]}\n",
    b"apiVersion: v1\nkind: Node\nmetadata: {name: n, labels: [y]}\nstatus: {allocatable: {cpu: '4'}}\n",
    b"apiVersion: v1\nkind: Pod\nmetadata: 7\n",
    b"kind: List\nitems: 7\n",
    # integers past Python's integer-string limit (4,300 digits), as YAML and as JSON
    b"apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\nspec:\n  minBurstFloor: "
    + b"9" * 5000
    + b"\n",
    b'{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": '
    + b"9" * 5000
    + b"}}}",
    # an alias bomb: 9 levels of 9 aliases, 470-odd bytes that expand to 387 million values
    b"a0: &a0 [x,x,x,x,x,x,x,x,x]\n"
    + b"".join(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n".encode() for i in range(1, 9)),
]


def _run_cli(tmp_path: Path, data: bytes, capsys: Any) -> list[tuple[int, str]]:
    from headroom.commands import cli

    f = tmp_path / "in.yaml"
    f.write_bytes(data)
    out = []
    for argv in (["validate", str(f)], ["plan", "--snapshot", str(f)]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        out.append((code, err))
        assert code in (0, 1, 2), (argv, code)
        assert "Traceback" not in err
    return out


def test_hostile_files_get_an_error_naming_the_file_never_a_traceback(tmp_path, capsys):
    import time

    for data in HOSTILE_FILES:
        started = time.monotonic()
        for code, err in _run_cli(tmp_path, data, capsys):
            if code:
                assert str(tmp_path / "in.yaml") in err or code == 1, (data[:60], err)
        # the alias bomb took many minutes before; a loaded 2-core CI machine took 33 s for
        # the largest file here, so the bound only tells a hang from a slow machine
        assert time.monotonic() - started < 120, data[:60]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=300),
        JSON.map(lambda v: json.dumps(v).encode()),
    )
)
def test_generated_garbage_files_never_raise_from_validate_or_plan(tmp_path, capsys, data):
    _run_cli(tmp_path, data, capsys)


def _outcome(build: Any, obj: Any) -> Any:
    try:
        return build(obj)
    except RecordError as exc:
        return f"RecordError: {exc}"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(POD_PATHS), JSON), max_size=4), st.sampled_from(["ADDED", "MODIFIED"]))
def test_the_typed_pod_decoder_builds_the_same_record_as_a_full_decode(edits, kind):
    """cluster/decode.py trims pods to the fields records read; whatever the pod holds, the
    record (or the refusal, word for word) is the one a full decode gives. The pod starts
    with another manager's resize entry owning its CPU limit (decoded, unlike the others)."""
    raw = pod("p", namespace="ns", containers=[container(cpu="500m")])
    raw["metadata"]["managedFields"] = [
        {
            "manager": "rightsizer",
            "subresource": "resize",
            "fieldsV1": {
                "f:spec": {"f:containers": {'k:{"name":"app"}': {"f:resources": {"f:limits": {"f:cpu": {}}}}}}
            },
        }
    ]
    for path, value in edits:
        _put(raw, path, value)
    try:
        line = orjson.dumps({"type": kind, "object": raw})
        page = orjson.dumps({"metadata": {"resourceVersion": "7", "continue": "abc"}, "items": [raw, raw]})
    except TypeError:  # an integer beyond 64 bits: the server never sends one
        return
    full = orjson.loads(line)
    typed = decode.pod_event(line)
    assert typed["type"] == kind
    assert _outcome(pod_from_dict, typed["object"]) == _outcome(pod_from_dict, full["object"])
    listed = decode.pod_list(page)
    assert listed["metadata"] == {"resourceVersion": "7", "continue": "abc"}
    expected = [_outcome(pod_from_dict, p) for p in orjson.loads(page)["items"]]
    assert [_outcome(pod_from_dict, p) for p in listed["items"]] == expected


def test_the_typed_decoder_matches_on_realistic_pods_and_passes_errors_through():
    rng = random.Random(3)
    for i in range(300):
        raw = make_pod(i, 20, rng)
        line = orjson.dumps({"type": "MODIFIED", "object": raw})
        assert pod_from_dict(decode.pod_event(line)["object"]) == pod_from_dict(raw)
        # managedFields (but each entry's manager and subresource), env, probes and volumes are skipped
        assert len(orjson.dumps(decode.pod_event(line)["object"])) < len(line) / 3
    gone = b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Expired","code":410}}'
    assert decode.pod_event(gone)["object"]["code"] == 410
    assert decode.pod_event(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}')["object"] == {
        "metadata": {"resourceVersion": "9"}
    }
    assert decode.pod_list(b'{"kind":"PodList","metadata":{"resourceVersion":"5"},"items":[]}') == {
        "metadata": {"resourceVersion": "5"},
        "items": [],
    }


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_json, max_size=4))
def test_garbage_in_a_prometheus_answer_is_skipped_never_raised(result):
    """What `explain --prometheus` reads from a Prometheus answer: any JSON at all in the
    result list, and only well-formed finite samples come out."""
    from headroom.cluster.prometheus import matrix_of, vector_of

    for value in vector_of(result, ("namespace", "pod")).values():
        assert math.isfinite(value)
    for points in matrix_of(result).values():
        assert all(math.isfinite(t) and math.isfinite(v) for t, v in points)
    good = {"metric": {"container": "app"}, "value": [1.0, "0.5"], "values": [[1.0, "0.25"], [2.0, "NaN"]]}
    assert vector_of([*result, good], ("container",))["app"] == 0.5
    assert matrix_of([*result, good])["app"] == [(1.0, 0.25)]


def test_a_number_too_long_to_read_is_a_file_line_error(tmp_path, capsys):
    """Before: a ValueError traceback (Python's 4,300-digit integer-string limit)."""
    from headroom.commands import cli

    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n"
        f"spec:\n  minBurstFloor: {'9' * 5000}\n"
    )
    assert cli.main(["validate", str(config)]) == 1
    err = capsys.readouterr().out + capsys.readouterr().err
    assert f"{config}:5" in err and "minBurstFloor" in err, err[:400]
    snapshot = tmp_path / "nodes.json"
    snapshot.write_text('{"apiVersion": "v1", "kind": "List", "items": [{"kind": "Node", "x": ' + "9" * 5000 + "}]}")
    assert cli.main(["plan", "--snapshot", str(snapshot)]) == 2
    assert f"{snapshot}:1:" in capsys.readouterr().err


def test_text_from_the_cluster_never_acts_on_the_terminal(tmp_path, capsys):
    """A label holding escape codes (clear the screen, retitle the terminal) or a bidi
    override is printed escaped by every command; before, it was printed raw."""
    from headroom.commands import cli
    from headroom.commands.output import printable

    assert printable("a\x1b[2J\x1b]0;pwned\x07b\u202e\n\t") == "a\\x1b[2J\\x1b]0;pwned\\x07b\\u202e\n\t"
    hostile = "\x1b]0;pwned\x07\x1b[2J"
    snapshot = tmp_path / "snap.json"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "labels": {"pool": hostile}},
        "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team", "labels": {"kube-headroom.dev/mode": hostile}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "team"},
        "spec": {"nodeName": "n1", "containers": [{"name": "app" + hostile, "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"},
    }
    snapshot.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [node, ns, pod]}))
    for argv in (
        ["plan", "--snapshot", str(snapshot), "-o", "wide"],
        ["explain", "team/web", "--snapshot", str(snapshot)],
    ):
        cli.main(argv)
        both = "".join(capsys.readouterr())
        assert "\x1b" not in both and "\x07" not in both, (argv, both[:300])
    cli.main(["plan", "--snapshot", str(snapshot), "-o", "wide"])
    assert "\\x1b" in "".join(capsys.readouterr())  # shown, escaped: the namespace's near-miss warning


def _serve_once(handler: Any) -> tuple[str, Any]:
    """A loopback HTTP server that answers each connection with `handler(socket)`."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", server


def test_a_prometheus_that_trickles_or_never_ends_its_answer_is_one_line():
    """Before: a body sent a byte every 2 s was still being read after 35 s (the timeout
    bounded each read), and an endless body ended in a MemoryError traceback."""
    import time

    from headroom.cluster.prometheus import Prometheus, PrometheusError

    def trickle(conn: Any) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            try:
                for _ in range(100):
                    conn.sendall(b" ")
                    time.sleep(0.5)
            except OSError:
                pass

    def trickled_headers(conn: Any) -> None:  # the deadline used to start after the headers
        with conn:
            conn.recv(65536)
            try:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 10:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.5)
            except OSError:
                pass

    def endless(conn: Any) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b" " * 65536
            try:
                while True:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                pass

    for handler, timeout, expected in (
        (trickle, 2.0, "did not answer within 2 s"),
        (trickled_headers, 2.0, "did not answer within 2 s"),
        (endless, 30.0, "larger than 4 MiB"),
    ):
        url, server = _serve_once(handler)
        try:
            started = time.monotonic()
            with pytest.raises(PrometheusError, match=expected):
                Prometheus(url, timeout=timeout, max_bytes=4 * 2**20).vector("up")
            print(f"\n{handler.__name__}: {time.monotonic() - started:.1f} s to the one-line error")
        finally:
            server.close()


def test_sample_times_outside_any_clock_are_skipped():
    """Before: a sample time of 1e300 ended `explain --prometheus` in an OverflowError."""
    from headroom.cluster.prometheus import matrix_of

    result = [{"metric": {"container": "app"}, "values": [[1e300, "1"], [-5, "1"], [1700000000, "0.5"]]}]
    assert matrix_of(result) == {"app": [(1700000000.0, 0.5)]}


def test_samples_no_query_can_answer_and_labels_no_name_can_hold_are_skipped():
    """Before: a sample of 1e306 ended `explain --prometheus` in an OverflowError (its
    rounding), and a label holding a newline printed a line of its own."""
    from headroom.cluster.prometheus import matrix_of, vector_of

    huge = [{"metric": {"container": "app"}, "values": [[1700000000, "1e306"], [1700000001, "0.5"]]}]
    assert matrix_of(huge) == {"app": [(1700000001.0, 0.5)]}
    forged = {"metric": {"namespace": "team", "pod": "web\nok: nothing throttled"}, "value": [1.0, "0.9"]}
    honest = {"metric": {"namespace": "team", "pod": "web"}, "value": [1.0, "0.5"]}
    assert vector_of([forged, honest], ("namespace", "pod")) == {"team/web": 0.5}


@pytest.mark.parametrize("url", ["https://127.0.0.1:99999/mutate", f"https://{'a' * 70}.example/mutate"])
def test_doctor_says_what_is_wrong_with_a_webhook_url_the_api_server_stores(url):
    """Before: a port out of range ended doctor in ValueError, a 70-letter host label in
    UnicodeError (both URLs the API server accepts and stores)."""
    from headroom.commands.doctor.webhook import url_trust_checks
    from headroom.webhook.certs import issue

    (finding,) = url_trust_checks("headroom", url, issue(["127.0.0.1"], 1)[0], timeout=1)
    assert finding.level in ("fail", "warn") and url.split("/")[2] in finding.message, finding


def test_text_logs_quote_names_that_could_fake_a_line_or_move_the_cursor():
    """Before: the text format wrote field values raw, so a pod named with a newline or an
    escape code printed a line of its own or acted on the terminal."""
    import logging

    from headroom.logs import TextFormatter

    record = logging.makeLogRecord(
        {"msg": "new pod given cpu limits", "levelname": "INFO", "pod": "web\nok: all good\x1b[2J", "changes": 1}
    )
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line
    assert 'pod="web\\nok: all good\\u001b[2J"' in line and "changes=1" in line
    # C1 controls (CSI), DEL, the bidirectional override that shows text reversed, and the
    # line separator: escaped too. Before, written raw.
    sly = "ab\x9b2J\x7f\u202egnp.exe\u2028x"
    line = TextFormatter().format(logging.makeLogRecord({"msg": "m", "levelname": "INFO", "pod": sly}))
    assert not any(ch in line for ch in "\x9b\x7f\u202e\u2028"), repr(line)
    assert 'pod="ab\\u009b2J\\u007f\\u202egnp.exe\\u2028x"' in line, line
