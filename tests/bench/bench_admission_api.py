"""Admission under a hostile tenant, through the real API server: attacks as labelled.

The tests' real kube-apiserver and etcd (API Priority and Fairness on, its defaults) with
kube-controller-manager (so a ReplicaSet makes its pods), 5,000 Node objects in 100 pools
with a NodePoolProfile each, and the webhook registered as the chart registers it
(`timeoutSeconds: 2`, `failurePolicy: Ignore`), served by one `headroom webhook` process,
a fresh one per row (its peak RSS, with any process it starts, is the row's). The test API server publishes no
EndpointSlice for itself, so its address is named with `--api-server-cidr 127.0.0.1/32`
(where the tree knows that flag).

Every row runs an honest tenant creating ordinary pods open-loop at 20 a second through the
API server as a service account of its own (so API Priority and Fairness treats it as it
treats the attackers), each pod counted as given its CPU limit at admission or not, and its
create's latency from its intended send time, a failure counted as a failure (not dropped)
and as the slowest in the percentiles (nearest rank). Beside it, the row's attack:

- tenants creating pods with `dryRun=All` (the webhook is called; nothing is stored), each
  the costliest review the placement budget still decides at this node count (every node
  checked against every term of its required node affinity, every node a candidate), from
  1, 16 and 64 service accounts in 1 and 8 namespaces of one tenant
  (`tenancy.tenantLabel`; a tree that does not know it sees 8 namespaces);
- an honest tenant's ReplicaSet created with 64 and with 256 replicas (the
  controller-manager's slow-start batches): how many of its pods got their limit;
- direct posters (pods posting to the webhook themselves) from 16 addresses: 1,500 silent
  connections, 3 MB bodies trickled until the server closes them, reviews of 17,000
  containers whose answers are never read;
- all of them at once.

For each attack, what it really sent: requests answered, bytes, connections, addresses.
And where the honest creates slower than 500 ms spent their time, as the API server itself
says: it writes a breakdown (`apiserver.latency.k8s.io/*` audit annotations) for every
request over 500 ms, and the audit log here records the honest tenant's creates only
(Metadata level): the wait in API Priority and Fairness's queue and the call to the
webhook, mean and max. And how the host's cores were shared while the honest pods were made
(from /proc): here the webhook, the API server, etcd, the attackers and the honest client
share them, which a cluster runs apart; a row whose cores were all busy measured the host.

    .venv/bin/python tests/bench/bench_admission_api.py [--baseline TREE] [--seconds 12] [--row NAME]...

`--baseline TREE` runs the same rows, in the same run, against the `headroom webhook` of
another checkout (its `controller/` directory is put first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import urllib3

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "controller")]

from bench.attackers import Attackers  # noqa: E402
from bench.procstat import Sample, cpu_split, descendants, host_cpu, peak_rss_bytes  # noqa: E402
from headroom.core.placement import PLACEMENT_BUDGET  # noqa: E402
from headroom.webhook.certs import issue  # noqa: E402
from helpers.cluster_helpers import apply_config, install_crds, register_webhook  # noqa: E402
from helpers.webhook_client import admission_review  # noqa: E402
from testbed.controlplane import ADMIN_TOKEN, ControlPlane, build, free_port  # noqa: E402
from testbed.node import build_node  # noqa: E402

TENANT_LABEL = "tenants.example.com/name"
HONEST_USER = "system:serviceaccount:honest:deployer"
# The honest tenant's pod creates, and nothing else, in the API server's audit log.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  namespaces: ["honest"]
  verbs: ["create"]
  resources: [{group: "", resources: ["pods"]}]
- level: None
"""
HONEST_RATE = 20.0  # pods a second
DIRECT = [f"127.0.1.{i + 1}" for i in range(16)]


# --- the API server, as a tenant's service account ------------------------------------------
class Client:
    """Requests to the API server as `user` (the admin token, impersonating it), over
    connections kept alive as any client of the API server keeps them."""

    def __init__(self, cp: ControlPlane, user: str, connections: int = 4) -> None:
        self.url = cp.url
        self.pool = urllib3.PoolManager(
            num_pools=2, maxsize=connections, ca_certs=str(cp.ca_file), cert_reqs="CERT_REQUIRED", retries=False
        )
        self.headers = {
            "Authorization": f"Bearer {ADMIN_TOKEN}",
            "Impersonate-User": user,
            "Content-Type": "application/json",
        }

    def post(self, path: str, body: bytes, timeout: float = 30) -> tuple[int, bytes]:
        r = self.pool.request("POST", self.url + path, body=body, headers=self.headers, timeout=timeout)
        return r.status, r.data


def pod(name: str, namespace: str, affinity: dict | None = None, cpu: str = "250m") -> dict:
    spec: dict = {"containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def costliest_affinity(nodes: int) -> dict:
    """Terms of one requirement each that match no node, then one that matches every node:
    each node is checked against every term, and every node is a candidate; as many terms
    as the placement budget allows at this node count (each costs 4 checks a node)."""
    per_node = PLACEMENT_BUDGET // max(nodes, 1)
    misses = max(0, per_node // 4 - 1)
    terms = [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": [f"none-{i}"]}]}
        for i in range(misses)
    ]
    terms.append({"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]})
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


# --- attacks ------------------------------------------------------------------------------------
def dry_run_tenant(accounts: int, namespaces: int) -> Callable[[Attackers, int], None]:
    """Dry-run creates of the costliest decided pod, thread i as service account i % accounts
    of namespace (i % accounts) % namespaces, one kept-alive connection each."""

    def body(a: Attackers, i: int) -> None:
        k = i % accounts
        ns = f"evil-{k % namespaces}"
        client = Client(a.env["cp"], f"system:serviceaccount:{ns}:sa-{k}", 1)
        raw = json.dumps(pod("costly", ns, a.env["affinity"])).encode()
        a.count(connections=1)
        while not a.stop.is_set():
            status, _ = client.post(f"/api/v1/namespaces/{ns}/pods?dryRun=All", raw)
            a.count(requests=1, failed=int(status >= 300), sent=len(raw))

    return body


def _from(source: str, port: int, timeout: float) -> socket.socket:
    raw = socket.socket()
    raw.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    raw.bind((source, 0))
    raw.settimeout(timeout)
    raw.connect(("127.0.0.1", port))
    return raw


def _tls(ca: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False
    return ctx


def _head(length: int) -> bytes:
    return (
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
    )


def silent(a: Attackers, i: int) -> None:
    """TCP connections that never start their handshake, from address i % 16: 1,500 in all
    across the threads, each renewed as the server closes it."""
    held: list[socket.socket] = []
    want = 1500 // a.threads
    try:
        while not a.stop.is_set():
            held = [s for s in held if not _closed(s)]
            while len(held) < want and not a.stop.is_set():
                try:
                    held.append(_from(DIRECT[i % 16], a.env["port"], 5))
                    a.count(connections=1)
                except OSError:
                    a.count(failed=1)
                    break
            a.stop.wait(0.2)
    finally:
        for s in held:
            s.close()


def _closed(s: socket.socket) -> bool:
    s.settimeout(0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def trickled(a: Attackers, i: int) -> None:
    """Headers for a 3 MB body, then 64 KiB every 10 ms until the server closes it (the
    bounds), from address i % 16."""
    with _from(DIRECT[i % 16], a.env["port"], 5) as raw, _tls(a.env["ca"]).wrap_socket(raw) as tls:
        a.count(connections=1)
        tls.sendall(_head(3_000_000))
        chunk = b" " * 65536
        for _ in range(3_000_000 // 65536 - 1):
            if a.stop.wait(0.01):
                return
            tls.sendall(chunk)
            a.count(sent=len(chunk))
    a.count(requests=1)


def unread(a: Attackers, i: int) -> None:
    """A review of a pod of 17,000 containers (2.9 MiB; its answer a 2.4 MiB patch), its
    answer never read, from address i % 16; a new one when the server cuts it."""
    raw = _from(DIRECT[i % 16], a.env["port"], 30)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with raw, _tls(a.env["ca"]).wrap_socket(raw) as tls:
        a.count(connections=1)
        body = a.env["huge"]
        tls.sendall(_head(len(body)) + body)
        a.count(requests=1, sent=len(body))
        deadline = time.monotonic() + 10
        while not a.stop.is_set() and time.monotonic() < deadline and not _closed(tls):
            a.stop.wait(0.2)


def huge_review() -> bytes:
    containers = [{"name": f"c{k}", "image": "x", "resources": {"requests": {"cpu": "10m"}}} for k in range(17_000)]
    obj = pod("huge", "evil-0")
    obj["spec"]["containers"] = containers
    return json.dumps(admission_review(obj, "huge")).encode()


TENANT_ROWS = {
    "dry-run costliest, 1 SA in 1 ns (16 conns)": (16, dry_run_tenant(1, 1)),
    "dry-run costliest, 16 SAs in 1 ns": (16, dry_run_tenant(16, 1)),
    "dry-run costliest, 16 SAs in 8 ns": (16, dry_run_tenant(16, 8)),
    "dry-run costliest, 64 SAs in 8 ns": (64, dry_run_tenant(64, 8)),
}


def attacks_of(row: str) -> list[Attackers]:
    if row in TENANT_ROWS:
        threads, body = TENANT_ROWS[row]
        return [Attackers(row, threads, body, 1)]
    direct = {
        "direct: 1,500 silent conns, 16 addresses": Attackers("silent", 16, silent, 16),
        "direct: trickled 3 MB bodies, 16 addresses": Attackers("trickled", 16, trickled, 16),
        "direct: unread 2.9 MiB answers, 16 addresses": Attackers("unread", 16, unread, 16),
    }
    if row in direct:
        return [direct[row]]
    if row == "all at once":
        threads, body = TENANT_ROWS["dry-run costliest, 64 SAs in 8 ns"]
        return [Attackers("tenant", threads, body, 1), *(attacks_of(name)[0] for name in direct)]
    return []


ROWS = [
    "baseline (no attack)",
    *TENANT_ROWS,
    "ReplicaSet 0 -> 64",
    "ReplicaSet 0 -> 256",
    "direct: 1,500 silent conns, 16 addresses",
    "direct: trickled 3 MB bodies, 16 addresses",
    "direct: unread 2.9 MiB answers, 16 addresses",
    "all at once",
]


def host_split(before: dict[int, Sample], seconds: float, hook: Webhook, attacks: list[Attackers]) -> str:
    """How the host's cores were shared while the honest pods were made: on this machine
    the webhook, the attackers, the honest client and the API server share them, which in
    a cluster run apart."""
    assert hook.proc is not None
    webhook = set(descendants(hook.proc.pid))
    attackers = {pid for a in attacks if a.process is not None for pid in descendants(a.process.pid)}

    def part(pid: int, name: str) -> str:
        if pid in webhook:
            return "webhook"
        if pid in attackers:
            return "attackers"
        if pid == os.getpid():
            return "honest client"
        return name if name.startswith(("kube-", "etcd")) else "other"

    split = cpu_split(before, host_cpu(), seconds, part)
    cores = os.cpu_count() or 1
    parts = ", ".join(f"{name} {used:.2f}" for name, used in split.most_common() if used >= 0.005)
    return f"the host's cores while the honest pods were made: {parts}; {sum(split.values()):.2f} of {cores} busy"


# --- the webhook process ------------------------------------------------------------------------
@dataclass
class Webhook:
    tree: Path
    cp: ControlPlane
    cert_dir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    health: int = 0
    metrics: int = 0
    log: Path = field(default_factory=lambda: Path(tempfile.mktemp(prefix="bench-webhook-", suffix=".log")))

    @functools.cached_property
    def flags(self) -> list[str]:
        """`--api-server-cidr` for the test API server's address, where the tree knows it."""
        help_text = subprocess.run(
            [sys.executable, "-m", "headroom", "webhook", "--help"],
            env=self.env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return ["--api-server-cidr", "127.0.0.1/32"] if "--api-server-cidr" in help_text else []

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.tree / "controller")}

    def start(self) -> None:
        self.health, self.metrics = free_port(), free_port()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "headroom",
                    "webhook",
                    "--kubeconfig",
                    str(self.cp.kubeconfig()),
                    "--cert-dir",
                    str(self.cert_dir),
                    "--port",
                    str(self.port),
                    "--metrics-port",
                    str(self.metrics),
                    "--health-port",
                    str(self.health),
                    "--log-level",
                    "warning",
                    *self.flags,
                ],
                env=self.env(),
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the webhook never became ready"
            time.sleep(0.5)

    def results(self) -> str:
        """Its reviews by result (headroom_webhook_requests_total), as `result=count`."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        out, total, count = [], 0.0, 0.0
        for line in text.splitlines():
            if line.startswith('headroom_webhook_requests_total{result="'):
                result = line.split('"')[1]
                out.append(f"{result}={float(line.rsplit(' ', 1)[1]):.0f}")
            elif line.startswith("headroom_webhook_duration_seconds_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("headroom_webhook_duration_seconds_count"):
                count = float(line.rsplit(" ", 1)[1])
        mean = f", {total / count * 1000:.0f} ms each on average in the webhook" if count else ""
        return " ".join(out) + mean

    def peak_rss(self) -> float:
        """MiB: the peak RSS of the process and of any it started, summed (as one
        container's memory limit counts them; a sum of peaks is at least the peak of the sum)."""
        assert self.proc is not None
        return sum(map(peak_rss_bytes, descendants(self.proc.pid))) / 2**20

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


# --- the cluster ------------------------------------------------------------------------------
def setup(nodes: int, profiles: int, audit: Path) -> ControlPlane:
    (audit.parent / "audit-policy.yaml").write_text(AUDIT_POLICY)
    cp = ControlPlane(
        build(),
        components_dir=build_node(),
        components=("kube-controller-manager",),
        extra_args=[
            f"--audit-policy-file={audit.parent / 'audit-policy.yaml'}",
            f"--audit-log-path={audit}",
            "--audit-log-maxsize=0",
        ],
    )
    cp.start()
    api = cp.api()
    install_crds(api)
    started = time.monotonic()

    def node(i: int) -> None:
        name = f"n{i:05d}"
        labels = {"kubernetes.io/os": "linux", "kubernetes.io/hostname": name, "pool": f"pool-{i % profiles}"}
        api.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
        status = {
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}],
        }
        api.patch(f"/api/v1/nodes/{name}/status", {"status": status}, "application/merge-patch+json")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(node, range(nodes)))
    for i in range(profiles):
        api.apply(
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "NodePoolProfile",
                "metadata": {"name": f"pool-{i}"},
                "spec": {"nodeSelector": {"matchLabels": {"pool": f"pool-{i}"}}, "maxMultiplier": 4},
            },
            "bench",
        )
    # The tenants' service accounts may create pods (the bench impersonates them).
    api.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "bench-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]}],
        },
        "bench",
    )
    api.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench-pods"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:serviceaccounts"}],
        },
        "bench",
    )
    for ns, tenant in [("honest", "honest"), *((f"evil-{k}", "evil") for k in range(8))]:
        labels = {"kube-headroom.dev/mode": "managed", TENANT_LABEL: tenant}
        api.post(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
        )
    print(f"{nodes} nodes in {profiles} pools, 9 namespaces: {time.monotonic() - started:.0f} s", flush=True)
    return cp


@dataclass
class Result:
    given: int = 0
    total: int = 0
    latencies: list[float] = field(default_factory=list)

    def rank(self, q: float) -> float:
        """Nearest rank: the smallest latency that at least q of the pods had; a failure
        counts as the slowest."""
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def honest(cp: ControlPlane, seconds: float, row: str) -> Result:
    """Ordinary pods at HONEST_RATE a second, open-loop, as the honest tenant's deployer."""
    client = Client(cp, "system:serviceaccount:honest:deployer", 32)
    res = Result()
    lock = threading.Lock()
    sends = int(seconds * HONEST_RATE)
    start = time.monotonic() + 0.05

    def one(k: int) -> None:
        intended = start + k / HONEST_RATE
        time.sleep(max(0.0, intended - time.monotonic()))
        body = json.dumps(pod(f"r{row}-{k}", "honest")).encode()
        given, took = False, float("inf")
        try:
            status, data = client.post("/api/v1/namespaces/honest/pods", body)
            if status == 201:
                given = "limits" in json.loads(data)["spec"]["containers"][0]["resources"]
                took = time.monotonic() - intended
        except (OSError, urllib3.exceptions.HTTPError):
            pass
        with lock:
            res.total += 1
            res.given += given
            res.latencies.append(took)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(sends)))
    return res


def _seconds(go: str) -> float:
    """A Go duration as the API server prints it (`1.2s`, `523.1ms`, `1m2.5s`, `12µs`)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(h|ms|µs|us|ns|m|s)", go))


class Breakdown:
    """The API server's own account of the honest creates over 500 ms, read from its audit
    log as a row's creates are written there (from where the last row's reading ended)."""

    def __init__(self, log: Path) -> None:
        self.log, self.offset = log, 0

    def row(self, expected: int = 0, wait: float = 10.0) -> str:
        """Reads until the log holds `expected` honest creates (the API server writes an
        event once its answer is sent), for at most `wait` seconds."""
        slow: list[dict[str, float]] = []
        creates = 0
        deadline = time.monotonic() + wait
        while True:
            data = b""
            if self.log.exists():
                with self.log.open("rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            whole = data.rfind(b"\n") + 1  # a line being written is read next time
            self.offset += whole
            for line in data[:whole].splitlines():
                event = json.loads(line)
                who = event.get("impersonatedUser", event["user"]).get("username")
                if who != HONEST_USER or "dryRun" in event.get("requestURI", ""):
                    continue
                creates += 1
                notes = event.get("annotations") or {}
                took = {k.rsplit("/", 1)[1]: _seconds(v) for k, v in notes.items() if "latency.k8s.io/" in k}
                if took:
                    slow.append(took)
            if creates >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not slow:
            return f"the API server: none of {creates} honest creates over 500 ms"

        def ms(key: str) -> str:
            values = [t.get(key, 0.0) for t in slow]
            return f"{sum(values) / len(values) * 1000:.0f} / {max(values) * 1000:.0f} ms"

        return (
            f"the API server on its {len(slow)} of {creates} honest creates over 500 ms (mean / max): "
            f"queued by API Priority and Fairness {ms('apf-queue-wait')}, the webhook call "
            f"{ms('mutating-webhook')}, in all {ms('total')}"
        )


def replica_set(cp: ControlPlane, name: str, replicas: int) -> tuple[int, int, float]:
    """A ReplicaSet with `replicas` ordinary pods in the honest tenant's namespace: (pods
    given their limit, pods made, seconds until all were made)."""
    api = cp.api()
    labels = {"app": name}
    api.post(
        "/apis/apps/v1/namespaces/honest/replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "honest"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod("x", "honest")["spec"]},
            },
        },
    )
    started = time.monotonic()
    pods: list = []
    while time.monotonic() - started < 120:
        pods = api.get("/api/v1/namespaces/honest/pods", {"labelSelector": f"app={name}"})["items"]
        if len(pods) >= replicas:
            break
        time.sleep(0.5)
    took = time.monotonic() - started
    given = sum("limits" in p["spec"]["containers"][0]["resources"] for p in pods)
    with contextlib.suppress(Exception):
        api.delete(f"/apis/apps/v1/namespaces/honest/replicasets/{name}")
    return given, len(pods), took


def run_tree(
    tree: Path, cp: ControlPlane, rows: list[str], seconds: float, nodes: int, run: int, breakdown: Breakdown
) -> None:
    api = cp.api()
    knows_tenancy = "tenancy" in (tree / "controller" / "headroom" / "api" / "models.py").read_text()
    # The tree's own CRDs and a HeadroomConfig made anew under them: a field one tree's schema
    # defaults (spec.tenancy) is one another tree's model refuses.
    install_crds(api, tree)
    with contextlib.suppress(Exception):
        api.delete("/apis/kube-headroom.dev/v1alpha1/headroomconfigs/cluster")
    spec: dict = {"dryRun": False}
    if knows_tenancy:
        spec["tenancy"] = {"tenantLabel": TENANT_LABEL}
    apply_config(api, spec, "bench")
    ca, crt, key = issue(["127.0.0.1"], 1)
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        cert_dir = Path(d)
        (cert_dir / "tls.crt").write_bytes(crt)
        (cert_dir / "tls.key").write_bytes(key)
        os.chmod(cert_dir / "tls.key", 0o600)
        name = f"bench-{port}"
        register_webhook(api, name, port, ca)
        env = {"cp": cp, "ca": ca, "port": port, "affinity": costliest_affinity(nodes), "huge": huge_review()}
        hook = Webhook(tree, cp, cert_dir, port)
        print(f"\n{tree}: {'tenancy.tenantLabel set' if knows_tenancy else 'no tenancy (8 namespaces, 8 tenants)'}")
        print(
            f"{'row':<46} {'given':>9} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8}  what the attack sent "
            "(answered/failed requests, MiB, connections, addresses)"
        )
        try:
            for i, row in enumerate(rows):
                hook.start()
                try:
                    # Warm: the webhook answers (its caches in, its first decision made).
                    warm = Client(cp, "system:serviceaccount:honest:deployer")
                    for k in range(30):
                        status, data = warm.post(
                            "/api/v1/namespaces/honest/pods?dryRun=All",
                            json.dumps(pod(f"warm-{run}-{i}-{k}", "honest")).encode(),
                        )
                        if status == 201 and "limits" in json.loads(data)["spec"]["containers"][0]["resources"]:
                            break
                        time.sleep(0.5)
                    attacks = attacks_of(row)
                    for a in attacks:
                        a.start(env)
                    if attacks:
                        time.sleep(2.0)  # the attack under way
                    extra = ""
                    cpu_before, cpu_from = host_cpu(), time.monotonic()
                    if row.startswith("ReplicaSet"):
                        replicas = int(row.rsplit(" ", 1)[1])
                        with ThreadPoolExecutor(1) as side:
                            made_rs = side.submit(replica_set, cp, f"rs-{run}-{i}", replicas)
                            res = honest(cp, seconds, f"{run}-{i}")
                        given, made, took = made_rs.result()
                        extra = f"ReplicaSet: {given}/{made} pods given their limit, all made in {took:.1f} s"
                    else:
                        res = honest(cp, seconds, f"{run}-{i}")
                    rss = hook.peak_rss()
                    host = host_split(cpu_before, time.monotonic() - cpu_from, hook, attacks)
                    for a in attacks:
                        a.end()
                    with contextlib.suppress(OSError):
                        extra = (extra + "; " if extra else "") + f"webhook answers: {hook.results()}"
                    extra = (extra + "\n" + f"{'':<46} " if extra else "") + breakdown.row(res.total)
                    extra += f"\n{'':<46} {host}"
                    sent = "; ".join(
                        f"{a.name if len(attacks) > 1 else ''}{' ' if len(attacks) > 1 else ''}"
                        f"{a.sent.requests}/{a.sent.failed}, {a.sent.bytes / 2**20:.1f} MiB, "
                        f"{a.sent.connections} conns, {a.addresses} addr"
                        for a in attacks
                    )
                    print(
                        f"{row:<46} {res.given:>4}/{res.total:<4} {res.rank(0.5) * 1000:>8.0f} "
                        f"{res.rank(0.99) * 1000:>8.0f} {rss:>8.0f}  {sent or '-'}"
                        + (f"\n{'':<46} {extra}" if extra else ""),
                        flush=True,
                    )
                finally:
                    hook.stop()
                    with contextlib.suppress(Exception):
                        api.delete("/api/v1/namespaces/honest/pods")
        finally:
            with contextlib.suppress(Exception):
                api.delete(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}")
            hook.log.unlink(missing_ok=True)  # read only when a start fails, in its assertion


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", type=Path, help="another checkout, measured in the same run")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--profiles", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=12.0, help="seconds of honest pods per row (20 a second)")
    ap.add_argument("--row", action="append", help="run only the rows whose name holds this (repeatable)")
    args = ap.parse_args()
    rows = [r for r in ROWS if not args.row or any(o in r for o in args.row)]
    with tempfile.TemporaryDirectory(prefix="bench-admission-audit-") as d:
        audit = Path(d) / "audit.log"
        cp = setup(args.nodes, args.profiles, audit)
        try:
            breakdown = Breakdown(audit)
            breakdown.row()  # from here on: the warm-up creates are not a row's
            for run, tree in enumerate([ROOT, *([args.baseline] if args.baseline else [])]):
                run_tree(tree.resolve(), cp, rows, args.seconds, args.nodes, run, breakdown)
        finally:
            cp.stop()


if __name__ == "__main__":
    main()
