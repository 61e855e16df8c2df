"""The admission webhook as the real API server calls it, over TLS: slow and idle clients,
malformed bodies, and a certificate the controller issues and rotates itself."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from headroom.cluster.client import Api, ApiError
from helpers.cluster_helpers import SecretMount, profile
from helpers.cluster_helpers import register_webhook as register
from helpers.factories import container, pod
from helpers.webhook_client import admission_review, post_review
from testbed.controlplane import free_port

WEBHOOK = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def create(api: Api, ns: str, name: str) -> tuple[bool, float]:
    """(mutated, seconds) for one pod created through the API server."""
    body = pod(name, namespace=ns, node=None, containers=[container(cpu="500m", mem_limit=None)])
    body.pop("status")
    started = time.monotonic()
    out = api.post(f"/api/v1/namespaces/{ns}/pods", body)
    return "limits" in out["spec"]["containers"][0]["resources"], time.monotonic() - started


def https(port: int, body: bytes, ca: bytes) -> int:
    return post_review(port, body, ca)[0]


def test_idle_and_slow_clients_do_not_delay_admissions_and_bad_bodies_get_400(
    control_plane, api, namespace, headroom_config, webhook_controller, make_node
):
    make_node()  # a candidate node for the unplaced pods
    make_node(labels={"pool": "p"})  # and one for the paused pool's pods
    headroom_config()
    c, port = webhook_controller("headroom-idle")
    idle: list[socket.socket] = []
    try:
        c.wait_for_log("webhook serving")
        before = [create(api, namespace, f"before-{i}") for i in range(20)]
        for _ in range(60):  # connect, never handshake
            idle.append(socket.create_connection(("127.0.0.1", port)))
        for _ in range(5):  # start a TLS handshake and stall in the middle of the headers
            ctx = ssl.create_default_context(cafile=str(control_plane.ca_file))
            ctx.check_hostname = False
            s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5))
            s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Len")
            idle.append(s)
        during = [create(api, namespace, f"during-{i}") for i in range(20)]
        p99 = {k: max(t for _, t in v) for k, v in (("before", before), ("during", during))}
        median = {k: statistics.median(t for _, t in v) for k, v in (("before", before), ("during", during))}
        print(
            f"\nadmission latency, 20 pods each: median {median['before'] * 1000:.1f} -> {median['during'] * 1000:.1f} ms, "
            f"max {p99['before'] * 1000:.1f} -> {p99['during'] * 1000:.1f} ms with 65 idle or stalled connections"
        )
        assert all(m for m, _ in before + during), "a pod was created without its limit: the webhook did not answer"
        given = [r for r in c.logs() if r.get("msg") == "new pod given cpu limits"]
        assert {r["pod"] for r in given} >= {f"before-{i}" for i in range(20)}, given[:2]  # named, not "p" prefixes
        # What the stalled connections could cost is a review the API server gives up on (2 s,
        # failurePolicy Ignore): a pod without its limit, which the assertion above rules out.
        # How much slower the reviews were beside them depends on the machine: printed above.
        ca = control_plane.ca_file.read_bytes()
        assert https(port, b"not json", ca) == 400
        assert https(port, b"[1, 2]", ca) == 400
        assert https(port, json.dumps({"request": "nope"}).encode(), ca) == 400
        # JSON nested past the parser, a kind given as a string, an object given as a list
        assert https(port, b'{"request": ' + b"[" * 1000 + b"]" * 1000 + b"}", ca) == 400
        assert https(port, json.dumps({"request": {"kind": "Pod", "operation": "CREATE"}}).encode(), ca) == 400
        assert https(port, json.dumps({"request": {"kind": {"kind": "Pod"}, "object": []}}).encode(), ca) == 400
        assert https(port, b"{" + b" " * (4 * 1024 * 1024) + b"}", ca) == 413
        metrics = c.http("/metrics", c.metrics_port)[1]
        assert 'headroom_webhook_requests_total{result="mutated"} 40.0' in metrics
        assert 'headroom_webhook_requests_total{result="malformed"} 6.0' in metrics
        # A paused pool, then a dry-run cluster: the webhook writes nothing either.
        profile(api, f"paused-{port}", {"pool": "p"}, paused=True)
        try:
            deadline = time.monotonic() + 10
            while True:  # once the controller has seen the profile, pods for that pool are left alone
                body = pod(
                    f"paused-{int(time.monotonic() * 1000)}",
                    namespace=namespace,
                    node=None,
                    containers=[container(cpu="500m", mem_limit=None)],
                )
                body.pop("status")
                body["spec"]["nodeSelector"] = {"pool": "p"}
                out = api.post(f"/api/v1/namespaces/{namespace}/pods", body)
                if "limits" not in out["spec"]["containers"][0]["resources"]:
                    break
                assert time.monotonic() < deadline, "the webhook still mutates pods for a paused pool"
                time.sleep(0.3)
        finally:
            api.delete(f"/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles/paused-{port}")
        headroom_config(dryRun=True)
        deadline = time.monotonic() + 10
        while create(api, namespace, f"dry-{int(time.monotonic() * 1000)}")[0]:
            assert time.monotonic() < deadline, "the webhook still mutates in dry-run"
            time.sleep(0.3)
    finally:
        for s in idle:
            s.close()


def _served_fingerprint(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    return hashlib.sha256(der or b"").hexdigest()


def test_the_controller_issues_and_rotates_its_certificate_without_failing_open(
    control_plane, api, namespace, headroom_config, start_controller, make_node, tmp_path: Path
):
    """As the chart runs it: the leader keeps Secret default/headroom-webhook-tls and the
    caBundle of MutatingWebhookConfiguration `headroom` (the names the rendered RBAC allows)."""
    make_node()  # a node the new pods can land on
    headroom_config()
    certs = tmp_path / "webhook"
    certs.mkdir()
    port = free_port()
    secret = "/api/v1/namespaces/default/secrets/headroom-webhook-tls"
    with contextlib.suppress(ApiError):
        api.delete(secret)
    register(api, "headroom", port, None)  # no caBundle: the controller fills it in
    mount = SecretMount(api, "default", "headroom-webhook-tls", certs).start()
    try:
        c = start_controller(
            "--webhook-port", str(port), "--webhook-cert-dir", str(certs),
            "--webhook-secret", "headroom-webhook-tls", "--webhook-names", "127.0.0.1",
            "--webhook-configuration", "headroom", "--webhook-cert-check", "1", "--webhook-cert-reload", "1",
        )  # fmt: skip
        c.wait_for_log("webhook certificate issued")
        c.wait_for_log("webhook serving", timeout=30)
        deadline = time.monotonic() + 20
        while not create(api, namespace, f"first-{int(time.monotonic() * 1000)}")[0]:
            assert time.monotonic() < deadline, "the API server never trusted the issued certificate"
            time.sleep(0.5)
        first = _served_fingerprint(port)
        # An operator deletes the Secret (or it expires): a new CA and certificate, and through
        # the whole rotation every new pod is still admitted with its limit.
        api.delete(secret)
        results = []
        deadline = time.monotonic() + 30
        while _served_fingerprint(port) == first:
            results.append(create(api, namespace, f"rot-{len(results)}")[0])
            assert time.monotonic() < deadline, "the rotated certificate was never served"
            time.sleep(0.3)
        results += [create(api, namespace, f"after-{i}")[0] for i in range(5)]
        assert all(results), f"{results.count(False)} of {len(results)} pods failed open during the rotation"
        c.wait_for_log("webhook certificate reloaded")
        bundle = api.get(f"{WEBHOOK}/headroom")["webhooks"][0]["clientConfig"]["caBundle"]
        assert base64.b64decode(bundle).count(b"BEGIN CERTIFICATE") == 2  # old CA kept while it may be served
        print(f"\nrotation: {len(results)} pods created during and after it, all mutated")
        # `headroom doctor` sees the webhook work end to end ...
        admin = str(control_plane.kubeconfig())
        doctor = [
            sys.executable,
            "-m",
            "headroom",
            "doctor",
            "--kubeconfig",
            admin,
            "--webhook-configuration",
            "headroom",
        ]
        r = subprocess.run(doctor, capture_output=True, text=True, timeout=60)
        assert "ok    webhook: a dry-run pod in" in r.stdout, r.stdout
        # ... and, with the controller gone and a caBundle that trusts the wrong CA, says it fails open.
        c.stop()
        register(api, "headroom", port, control_plane.ca_file.read_bytes())
        r = subprocess.run(doctor, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "FAIL  webhook: a dry-run pod in" in r.stdout and "fails open" in r.stdout, (
            r.stdout
        )
    finally:
        mount.stop()
        with contextlib.suppress(ApiError):
            api.delete(f"{WEBHOOK}/headroom")
        with contextlib.suppress(ApiError):
            api.delete(secret)


def test_off_cluster_the_controller_writes_its_own_certificate_files(
    api, namespace, headroom_config, start_controller, make_node, tmp_path: Path
):
    """docs/install.md, "Run the controller from your workstation": a webhook configuration
    that calls the controller by URL with no caBundle, a certificate directory that does not
    exist yet, and no kubelet to mount the Secret: the controller issues the certificate,
    writes it into the directory itself and serves it; a new pod gets its limit. In the
    order a first-time user met: the configuration registered after the controller started
    (before, its caBundle stayed empty and restarts did not fill it); then the Secret
    deleted and the controller restarted (before, the Secret was never made again)."""
    make_node()
    headroom_config()
    certs = tmp_path / "headroom-certs"
    port = free_port()
    secret = "/api/v1/namespaces/default/secrets/headroom-webhook-tls"
    with contextlib.suppress(ApiError):
        api.delete(secret)
    with contextlib.suppress(ApiError):
        api.delete(f"{WEBHOOK}/headroom")
    args = (
        "--lease-namespace", "default", "--webhook-port", str(port), "--webhook-cert-dir", str(certs),
        "--webhook-secret", "headroom-webhook-tls", "--webhook-names", "127.0.0.1",
        "--webhook-configuration", "headroom",
    )  # fmt: skip

    def limits_given(what: str) -> float:
        started = time.monotonic()
        while not create(api, namespace, f"p-{time.monotonic_ns()}")[0]:
            assert time.monotonic() - started < 30, f"no pod got its limit from the off-cluster webhook {what}"
            time.sleep(0.5)
        return time.monotonic() - started

    try:
        c = start_controller(*args)
        c.wait_for_log("webhook certificate written to the certificate directory", timeout=30)
        c.wait_for_log("webhook serving", timeout=30)
        register(api, "headroom", port, None)  # only now: the order is the user's
        print(
            f"\nconfiguration registered after the start: first limit {limits_given('after registering'):.1f} s later"
        )
        stored = api.get(secret)["data"]
        assert (certs / "tls.crt").read_bytes() == base64.b64decode(stored["tls.crt"])
        assert (certs / "tls.key").read_bytes() == base64.b64decode(stored["tls.key"])
        assert (certs / "tls.key").stat().st_mode & 0o777 == 0o600
        served = hashlib.sha256(ssl.PEM_cert_to_DER_cert((certs / "tls.crt").read_text())).hexdigest()
        assert _served_fingerprint(port) == served
        c.stop()
        api.delete(secret)  # the directory keeps the old files
        c = start_controller(*args)
        c.wait_for_log("webhook certificate issued", timeout=30)
        print(f"Secret deleted, controller restarted: first limit {limits_given('after the restart'):.1f} s later")
        assert api.get(secret)["data"]["tls.crt"] != stored["tls.crt"]
    finally:
        with contextlib.suppress(ApiError):
            api.delete(f"{WEBHOOK}/headroom")
        with contextlib.suppress(ApiError):
            api.delete(secret)


def test_the_webhook_leaves_alone_a_daemonset_style_pod_whose_node_is_in_a_dry_run_pool(
    api, namespace, headroom_config, webhook_controller, make_node, tmp_path: Path
):
    """A pod pinned by the DaemonSet controller's own affinity (matchFields metadata.name),
    or by spec.nodeName, to a node of a dry-run pool gets no limit at admission: the
    controller would never write there, and a limit once set cannot be removed."""
    headroom_config(dryRun=False)
    pool = f"dry-{tmp_path.name[-8:].lower().replace('_', '-')}"
    plain, batch = make_node(), make_node(labels={"pool": pool})
    c, port = webhook_controller("headroom-candidates")
    prof = f"dry-run-{port}"

    def create(pod_name: str, node: str | None = None, pinned: str | None = None) -> bool:
        body = pod(pod_name, namespace=namespace, node=node, containers=[container(cpu="500m", mem_limit=None)])
        body.pop("status")
        if pinned is not None:  # what the DaemonSet controller writes into each pod
            body["spec"]["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pinned]}]}
                        ]
                    }
                }
            }
        out = api.post(f"/api/v1/namespaces/{namespace}/pods", body)
        return "limits" in out["spec"]["containers"][0]["resources"]

    try:
        c.wait_for_log("webhook serving")
        deadline = time.monotonic() + 15
        while not create(f"warm-{int(time.monotonic() * 1000)}", pinned=batch):  # the controller has synced
            assert time.monotonic() < deadline, "the webhook never mutated a pod before the profile existed"
            time.sleep(0.3)
        profile(api, prof, {"pool": pool}, dryRun=True)
        deadline = time.monotonic() + 15
        while create(f"seen-{int(time.monotonic() * 1000)}", pinned=batch):  # until the controller sees the profile
            assert time.monotonic() < deadline, "the webhook still mutates pods for the dry-run pool's node"
            time.sleep(0.3)
        assert not create("ds-batch", pinned=batch)
        assert not create("named-batch", node=batch)
        assert not create("anywhere")  # the dry-run node is one of its candidates
        assert create("ds-plain", pinned=plain)  # the same pod for the plain node gets its limit
        assert create("named-plain", node=plain)
        got = api.get(f"/api/v1/namespaces/{namespace}/pods/ds-batch")
        assert "kube-headroom.dev/original-cpu-limits" not in (got["metadata"].get("annotations") or {})
    finally:
        with contextlib.suppress(ApiError):
            api.delete(f"/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles/{prof}")


def _stall(port: int, ca: bytes, source: str, stop: threading.Event, answers: list[int], tries: list[int]) -> None:
    """One client that sends full headers, `Content-Length: 1000` and one byte, then waits;
    reconnects as soon as the server lets go (408 at the body deadline, or its place taken
    by a newer connection from its address), until told to stop."""
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False
    while not stop.is_set():
        try:
            tries.append(1)
            raw = _client(source, port)
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(
                    b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n{"
                )
                data = tls.recv(4096)
                if data.startswith(b"HTTP/1.1 "):
                    answers.append(int(data.split(b" ", 2)[1]))
        except OSError:
            pass
        stop.wait(0.2)  # back again soon, at a rate that leaves this machine's ephemeral ports alone


def _client(source: str, port: int) -> socket.socket:
    """A TCP connection from `source` (another loopback address, as another pod would be)
    that picks its port only at connect and leaves no TIME_WAIT behind when it closes."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.bind((source, 0))
    raw.connect(("127.0.0.1", port))
    return raw


def test_stalled_clients_cannot_hold_admissions(
    control_plane, api, namespace, headroom_config, webhook_controller, make_node
):
    """200 direct posters from 16 addresses that send headers and one byte of a 1000-byte
    body, again and again, while the API server sends 20 reviews at once: every honest review
    is answered within the API server's 2 s webhook timeout, with its limit (a review held
    past it is dropped under failurePolicy Ignore: the pod is created without one); a stalled
    one that the direct clients' pool let in gets 408 at the body deadline (or gives its
    place to a newer one), and all of them together never hold more than that pool's bound
    of connections, whatever their addresses. The pod creates' own durations are printed."""
    from headroom.webhook.server import LIMITS

    make_node()
    headroom_config()
    ca = control_plane.ca_file.read_bytes()
    c, port = webhook_controller("headroom-stall")
    stop = threading.Event()
    answers: list[int] = []
    tries: list[int] = []
    stallers = [
        threading.Thread(target=_stall, args=(port, ca, f"127.0.8.{1 + i % 16}", stop, answers, tries))
        for i in range(200)
    ]
    try:
        c.wait_for_log("webhook serving")
        deadline = time.monotonic() + 15
        while not create(api, namespace, f"warm-{int(time.monotonic() * 1000)}")[0]:
            assert time.monotonic() < deadline, "the webhook never mutated a pod"
            time.sleep(0.3)
        for t in stallers:
            t.start()
        # The stallers connected, were let go (408, their place taken, or refused) and came
        # back: the reviews below meet a server in the middle of it.
        deadline = time.monotonic() + 30
        while len(tries) < 400 or not answers:
            assert time.monotonic() < deadline, f"the stallers made {len(tries)} connections, {len(answers)} answered"
            time.sleep(0.1)
        with ThreadPoolExecutor(20) as pool:
            honest = list(pool.map(lambda i: create(api, namespace, f"honest-{i}"), range(20)))
        slowest = max(t for _, t in honest)
        print(
            f"\n20 reviews beside 200 stalled clients: slowest pod create {slowest * 1000:.0f} ms, "
            f"{len(tries)} stalled connections, {len(answers)} answered, {answers.count(408)} with 408"
        )
        assert all(m for m, _ in honest), (
            "a pod was created without its limit: its review was not answered within the 2 s webhook timeout",
            honest,
        )
        # A stalled request is answered 408 at the body deadline, never anything else.
        assert answers and set(answers) == {408}, answers
        # Direct posters together hold at most their pool's bound of open connections,
        # however many addresses they come from: past it a new one takes the place of the oldest.
        ctx = ssl.create_default_context(cadata=ca.decode())
        ctx.check_hostname = False
        held = []
        try:
            for i in range(160):
                with contextlib.suppress(OSError):
                    held.append(ctx.wrap_socket(_client(f"127.0.9.{1 + i % 16}", port)))
            still = 0
            for s in held:
                s.settimeout(0.01)
                try:
                    still += s.recv(1) != b""
                except TimeoutError:
                    still += 1  # open, waiting
                except OSError:
                    pass
        finally:
            for s in held:
                s.close()
        assert still <= LIMITS.max_direct_connections, still
        metrics = c.http("/metrics", c.metrics_port)[1]
        assert 'headroom_webhook_requests_total{result="slow-body"}' in metrics
    finally:
        stop.set()
        for t in stallers:
            if t.is_alive():
                t.join(15)


def _review(uid: str, namespace: str, obj: dict) -> bytes:
    obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "namespace": namespace}}
    return json.dumps(admission_review(obj, uid)).encode()


def _answer(port: int, body: bytes, ca: bytes) -> tuple[dict, float]:
    """(the AdmissionReview answer, seconds from the first byte sent to the last read)."""
    _, answer, seconds = post_review(port, body, ca)
    return json.loads(answer), seconds


def _costly_pod(name: str, terms: int) -> dict:
    """A pod whose required node affinity has `terms` terms that match no node (about 95
    bytes each: 30,000 of them are 2.8 MiB, under the API server's limit)."""
    body = pod(name, namespace="x", node=None, containers=[container(cpu="500m", mem_limit=None)])
    body.pop("status")
    body["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [f"none-{i}"]}]}
                    for i in range(terms)
                ]
            }
        }
    }
    return body


def _decided_costly_pod(name: str, terms: int = 73) -> dict:
    """A pod whose required node affinity has `terms` terms of one requirement each that
    match no node, then one that matches every (Linux) node: each node is checked against every
    term, and every node is a candidate. At 500 nodes that is about the most the placement
    budget still decides (about 30 ms here)."""
    body = _costly_pod(name, 0)
    body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = [
        *(
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": [f"none-{i}"]}]}
            for i in range(terms)
        ),
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]},
    ]
    return body


def test_one_costly_review_holds_no_other(
    control_plane, api, namespace, other_namespace, headroom_config, webhook_controller, make_node
):
    """Beside 500 cached nodes: a pod whose required node affinity has 30,000 terms is over
    the webhook's placement budget, so it gets no limit (the controller decides once it is
    bound), counted and logged once per namespace. A tenant sending 32 of the costliest
    reviews the budget still decides, 8 at a time: an honest review of another tenant sent
    while they are being decided is answered with its limit before the costly tenant's last
    one (decision time is shared by tenant, not served in arrival order). Then the
    over-budget pod through the API server, with dryRun=All (which reaches the webhook and
    leaves nothing behind)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: make_node(cpu="4"), range(500)))
    headroom_config()
    ca = control_plane.ca_file.read_bytes()
    c, port = webhook_controller("headroom-costly")
    c.wait_for_log("webhook serving")
    deadline = time.monotonic() + 60
    while len(api.get("/api/v1/nodes")["items"]) < 500 or not create(api, namespace, f"warm-{time.monotonic_ns()}")[0]:
        assert time.monotonic() < deadline, "the webhook never mutated a pod"
        time.sleep(0.5)
    other = other_namespace
    costly = [_review(f"costly-{i}", namespace, _decided_costly_pod(f"costly-{i}")) for i in range(32)]
    honest = pod("honest", namespace=other, node=None, containers=[container(cpu="500m", mem_limit=None)])
    honest.pop("status")
    done: list[float] = []

    def heavy(body: bytes) -> dict:
        out, _ = _answer(port, body, ca)
        done.append(time.monotonic())
        return out

    with ThreadPoolExecutor(9) as pool:
        flood = [pool.submit(heavy, body) for body in costly]
        time.sleep(0.3)
        light_at = time.monotonic()
        light_out, light_s = _answer(port, _review("honest", other, honest), ca)
        light_done = light_at + light_s
        heavy_outs = [f.result() for f in flood]
    answered_after = sum(1 for t in done if t > light_done)
    print(
        f"\n32 costly reviews of one tenant: the last answered {max(done) - light_at:+.3f} s from the honest one's "
        f"sending; honest one of another tenant answered in {light_s:.3f} s, {answered_after} costly ones after it"
    )
    assert "patch" in light_out["response"], light_out
    undecided = [out["response"]["uid"] for out in heavy_outs if "patch" not in out["response"]]
    results = [line for line in c.http("/metrics", c.metrics_port)[1].splitlines() if "requests_total{" in line]
    assert not undecided, f"costly reviews within the budget and the deadline not decided: {undecided}, {results}"
    # The costly tenant's work was still going on when the honest review was sent, and
    # the honest one did not wait for the rest of it.
    assert max(done) > light_at and answered_after > 0, (sorted(done), light_at, light_done)
    over = _review("over", namespace, _costly_pod("over", 30_000))
    over_out, over_s = _answer(port, over, ca)
    print(f"{len(over) / 2**20:.1f} MiB over-budget review: answered in {over_s:.3f} s")
    assert "patch" not in over_out["response"] and over_out["response"]["allowed"] is True, over_out
    # Through the API server: the costly pod with dryRun=All.
    body = _costly_pod("costly-dry", 30_000)
    body["metadata"]["namespace"] = namespace
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "costly-rs",
            "uid": "00000000-0000-0000-0000-000000000001",
        }
    ]
    dry_out = api.post(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", body)
    assert "limits" not in dry_out["spec"]["containers"][0]["resources"]
    metrics = c.http("/metrics", c.metrics_port)[1]
    assert 'headroom_webhook_requests_total{result="over-budget"} 2.0' in metrics, metrics
    # Said once per namespace (pod and owner names are the tenant's to vary): the second
    # costly pod there, of another owner, and a third are counted, not logged again.
    pool_body = dict(body, metadata={**body["metadata"], "name": "costly-dry-2"})
    api.post(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pool_body)
    said = [r for r in c.logs() if "too costly" in str(r.get("msg"))]
    assert [(r.get("namespace"), r.get("owner")) for r in said] == [(namespace, None)], said


def test_doctor_checks_the_ca_bundle_of_a_url_webhook(
    control_plane, api, namespace, headroom_config, webhook_controller, make_node
):
    """An off-cluster webhook is called by URL: doctor makes the API server's TLS handshake
    itself and says whether the caBundle trusts what is served, in dry-run too. Before, a
    URL webhook's caBundle was never checked: `ok webhook: not tried` in dry-run while
    every call failed TLS."""
    from cryptography.hazmat.primitives import serialization

    from helpers.cluster_helpers import headroom_cli
    from testbed.pki import CA

    make_node()
    headroom_config(dryRun=True)
    c, port = webhook_controller("headroom-doctor")
    c.wait_for_log("webhook serving")
    name = f"headroom-doctor-{port}"
    url = f"https://127.0.0.1:{port}/mutate"
    out = headroom_cli(control_plane.kubeconfig(), "doctor", "--webhook-configuration", name, timeout=60).stdout
    assert f"ok    webhook: {name}'s caBundle trusts the certificate served at {url}" in out, out
    other = CA("someone-else").cert.public_bytes(serialization.Encoding.PEM)
    register(api, name, port, other)  # a caBundle of another CA
    out = headroom_cli(control_plane.kubeconfig(), "doctor", "--webhook-configuration", name, timeout=60).stdout
    assert f"FAIL  webhook: {name}'s caBundle does not trust the certificate served at {url}" in out, out
    assert "not tried: HeadroomConfig is in dry-run" in out  # and the reason it made no dry-run pod
