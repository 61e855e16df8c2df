"""The webhook under load, two parts in one run.

1. The decision for an ordinary pod at scale: 5,000 nodes and 20 or 100 NodePoolProfiles,
   each node labelled into one pool (simulated inputs, the real decision code). p50/p99 per
   decision and the process's CPU seconds, with each node's settings cached per
   configuration (the product) and, in the same run, looked up anew for every decision (the
   baseline: what every decision did before the cache).
2. Admission under attack: the real webhook server (`WebhookServer`, TLS, the connection
   guard, the fair queue) in a process of its own over the same 5,000 simulated nodes and
   20 profiles, as `headroom webhook` runs it; honest reviews (an ordinary pod, requester
   `honest`) sent open-loop every 50 ms, their latency measured from each intended send
   time, alone (baseline) and beside each attack of a hostile tenant in turn, each on a
   fresh server; the server process's peak RSS (VmHWM) per row.

    .venv/bin/python tests/bench/bench_admission.py [--nodes 5000] [--decisions 200] [--window 6]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2] / "controller")]

from bench.attackers import Attackers  # noqa: E402
from bench.procstat import peak_rss_bytes  # noqa: E402
from headroom.api.models import HeadroomConfig, NodePoolProfile, profile_from, settings_from  # noqa: E402
from headroom.core.params import Resolver, Settings  # noqa: E402
from headroom.core.placement import PLACEMENT_BUDGET  # noqa: E402
from headroom.core.records import Namespace, Node, node_from_dict  # noqa: E402
from headroom.webhook import mutation  # noqa: E402
from headroom.webhook.server import Sources, review_response  # noqa: E402
from helpers.webhook_client import admission_review, post_review  # noqa: E402


def resolver(profiles: int) -> Resolver:
    cfg = HeadroomConfig.model_validate(
        {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    )
    profs = [
        profile_from(
            NodePoolProfile.model_validate(
                {
                    "apiVersion": "kube-headroom.dev/v1alpha1",
                    "kind": "NodePoolProfile",
                    "metadata": {"name": f"pool-{i}"},
                    "spec": {"nodeSelector": {"matchLabels": {"pool": f"pool-{i}"}}, "maxMultiplier": 4},
                }
            )
        )
        for i in range(profiles)
    ]
    return Resolver.build(settings_from(cfg), profs)


ORDINARY = [{"name": "app", "image": "x", "resources": {"requests": {"cpu": "250m"}}}]


def review(i: int, user: str = "honest", containers: list | None = None, affinity: dict | None = None) -> dict:
    pod: dict = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "team"},
        "spec": {"containers": containers or ORDINARY},
    }
    if affinity:
        pod["spec"]["affinity"] = affinity
    return admission_review(pod, f"u{i}", username=user)


def cluster(nodes: int, profiles: int) -> Sources:
    res = resolver(profiles)
    known = {}
    for i in range(nodes):
        raw = {
            "metadata": {
                "name": f"n{i}",
                "labels": {"kubernetes.io/hostname": f"n{i}", "pool": f"pool-{i % profiles}"},
            },
            "status": {"allocatable": {"cpu": "16"}, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        node = node_from_dict(raw)
        known[node.name] = node
    team = Namespace("team", {"kube-headroom.dev/mode": "managed"})
    return Sources(lambda name: team if name == "team" else None, lambda: res, nodes=lambda: known)


def run(nodes: int, profiles: int, decisions: int, cached: bool) -> tuple[float, float, float]:
    sources = cluster(nodes, profiles)
    times = []
    saved = mutation._node_settings
    if not cached:
        mutation._node_settings = _Uncached()  # type: ignore[assignment]
    cpu = time.process_time()
    try:
        for i in range(decisions):
            started = time.perf_counter()
            _, outcome = review_response(review(i), sources)
            times.append(time.perf_counter() - started)
            assert outcome == "mutated", outcome
    finally:
        mutation._node_settings = saved
    cpu = time.process_time() - cpu
    times.sort()
    return times[math.ceil(0.5 * len(times)) - 1], times[math.ceil(0.99 * len(times)) - 1], cpu


class _Uncached:
    """The baseline: every node's settings asked anew for every decision, as before the cache."""

    def of(self, node: Node, res: Resolver) -> tuple[Settings, bool]:
        return mutation.node_settings(node, res)


# --- part 2: the server under attack ----------------------------------------------------


def serve(port: int, metrics_port: int, cert_dir: str, nodes: int, profiles: int) -> None:
    """The server process: `headroom webhook`'s server and metrics over simulated caches."""
    from headroom.metrics import AdmissionMetrics, serve_ports
    from headroom.runtime import share_the_gil, tune_gc
    from headroom.webhook.server import WebhookServer

    metrics = AdmissionMetrics()
    sources = cluster(nodes, profiles)
    # As `headroom webhook` runs: the GIL handed over every 1 ms, the collector tuned once
    # the caches are in.
    share_the_gil()
    tune_gc()
    from headroom.webhook.peers import ApiServerPeers

    # 127.0.0.1 is the API server's address; the attackers' pods post from others.
    peers = ApiServerPeers([f"{API_SERVER}/32"])
    server = WebhookServer(port, Path(cert_dir), sources, "127.0.0.1", metrics.observe_webhook, peers=peers).start()
    serve_ports(metrics_port, None, "127.0.0.1", metrics, lambda: (True, "ok"), lambda: (True, "ok"))
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes it
    server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tls(ca: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.decode())
    ctx.check_hostname = False
    return ctx


API_SERVER = "127.0.0.1"  # the honest reviews come from the API server's address
PODS = [f"127.0.2.{i + 1}" for i in range(16)]  # a hostile tenant's pods posting directly


def _pod(i: int) -> str:
    return PODS[i % len(PODS)]


def _from(source: str, port: int, timeout: float) -> socket.socket:
    raw = socket.socket()
    raw.setsockopt(socket.IPPROTO_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT
    raw.bind((source, 0))
    raw.settimeout(timeout)
    raw.connect(("127.0.0.1", port))
    return raw


def _post_head(length: int) -> bytes:
    return (
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
    )


def counted(body: Callable[[Attackers, int], None]) -> Callable[[Attackers, int], None]:
    """`body`, each call that returns counted as one attack request completed."""

    def run(a: Attackers, i: int) -> None:
        body(a, i)
        a.count(requests=1)

    return run


def costly(a: Attackers, i: int) -> None:
    """The costliest review still decided: a required node affinity whose every term each
    node is checked against, every node a candidate, as many terms as the placement budget
    allows at this node count. Posted as the API server would (from its address)."""
    post_review(a.env["port"], COSTLY, a.env["ca"], timeout=10)


def abandoned(a: Attackers, i: int) -> None:
    """A review sent and its connection closed at once (as the API server does past its
    timeout): nothing should be decided for it."""
    with (
        socket.create_connection(("127.0.0.1", a.env["port"]), timeout=5) as raw,
        _tls(a.env["ca"]).wrap_socket(raw) as tls,
    ):
        tls.sendall(_post_head(len(COSTLY)) + COSTLY)


def trickled(a: Attackers, i: int) -> None:
    """A 3 MB body sent 64 KiB every 10 ms from one of 16 tenant pods, until the server
    closes it (the bounds) or all of it is sent."""
    raw = _from(_pod(i), a.env["port"], 5)
    with raw, _tls(a.env["ca"]).wrap_socket(raw) as tls:
        tls.sendall(_post_head(3_000_000))
        for _ in range(3_000_000 // 65536 - 1):
            if a.stop.is_set():
                return
            tls.sendall(b" " * 65536)
            time.sleep(0.01)


def unread(a: Attackers, i: int) -> None:
    """A review of a pod of 17,000 containers (2.9 MiB, answered with a 2.4 MiB patch), its
    answer never read, sent straight from one of 16 tenant pods."""
    raw = _from(_pod(i), a.env["port"], 30)
    tls = _tls(a.env["ca"]).wrap_socket(raw)
    tls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    tls.sendall(_post_head(len(HUGE)) + HUGE)
    a.stop.wait(3)  # holds the connection, reading nothing
    tls.close()


def scrape(a: Attackers, i: int) -> None:
    with _from(_pod(i), a.env["metrics_port"], 5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass


def silent(a: Attackers, i: int) -> None:
    """TCP connections from 16 tenant pods that never start their handshake: 100 per
    thread, renewed as closed."""
    held = []
    with contextlib.ExitStack() as stack:
        for _ in range(100):
            held.append(stack.enter_context(_from(_pod(i), a.env["port"], 5)))
        a.stop.wait(2)


def burst(a: Attackers, i: int) -> None:
    """Ordinary pods of another requester, from 64 clients at once, nonstop (each on a new
    TLS connection, as no API server does: it keeps its connections)."""
    post_review(a.env["port"], ORDINARY_BODY, a.env["ca"], timeout=10)


COSTLY = b""
HUGE = b""
ORDINARY_BODY = b""

ATTACKS = [
    Attackers("small costly flood (32 clients)", 32, counted(costly)),
    Attackers("abandoned reviews (32 clients)", 32, counted(abandoned)),
    Attackers("trickled 3 MB bodies (16 pods)", 16, counted(trickled), 16),
    Attackers("unread 2.9 MiB answers (16 pods)", 16, counted(unread), 16),
    Attackers("scrape flood (16 pods)", 16, counted(scrape), 16),
    Attackers("handshake flood (1,500 conns, 16 pods)", 15, counted(silent), 16),
    Attackers("ordinary pods, 64 clients nonstop", 64, counted(burst)),
]


def attack_row(attack: Attackers | None, nodes: int, profiles: int, window: float, ca: bytes, cert_dir: str) -> str:
    port, metrics_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), str(metrics_port), cert_dir, str(nodes), str(profiles)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        honest = json.dumps(review(0)).encode()
        post_review(port, honest, ca)  # warm: the first decision builds the settings cache
        if attack is not None:
            attack.start({"port": port, "metrics_port": metrics_port, "ca": ca})
            time.sleep(1.0)  # the attack under way
        sends = int(window / 0.05)
        start = time.monotonic() + 0.05
        latencies: list[float] = []
        timeouts = 0

        def one(k: int) -> None:
            nonlocal timeouts
            intended = start + k * 0.05
            time.sleep(max(0.0, intended - time.monotonic()))
            try:
                status, _, _ = post_review(port, honest, ca, timeout=2)
                if status != 200:
                    timeouts += 1
                    return
            except (OSError, IndexError, ValueError):  # refused, cut, or closed with no answer
                timeouts += 1
                return
            latencies.append(time.monotonic() - intended)

        with ThreadPoolExecutor(32) as pool:
            list(pool.map(one, range(sends)))
        rss = peak_rss_bytes(proc.pid) / 2**20
        if attack is not None:
            attack.end()
        # Nearest rank, a failure counted as the slowest (never dropped).
        ranked = sorted(latencies) + [float("inf")] * timeouts
        p50 = ranked[max(0, math.ceil(0.5 * len(ranked)) - 1)] * 1000
        p99 = ranked[max(0, math.ceil(0.99 * len(ranked)) - 1)] * 1000
        name = attack.name if attack is not None else "baseline (no attack)"
        sent = f"{attack.sent.requests:>7}" if attack is not None else f"{'-':>7}"
        return f"{name:<38} {p50:>8.1f} {p99:>8.1f} {timeouts:>5}/{sends:<4} {rss:>8.0f} {sent}"
    finally:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def attacks(nodes: int, window: float, only: list[str] | None) -> None:
    from headroom.webhook.certs import issue

    global COSTLY, HUGE, ORDINARY_BODY
    # As many values as keep the review inside the placement budget at this node count (299
    # at 500 nodes): each costs a check per node, the costliest review still decided.
    misses = max(0, PLACEMENT_BUDGET // nodes // 4 - 1)  # each term costs 4 checks a node
    terms = [{"matchExpressions": [{"key": "pool", "operator": "In", "values": [f"none-{k}"]}]} for k in range(misses)]
    terms.append({"matchExpressions": [{"key": "pool", "operator": "Exists"}]})
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    COSTLY = json.dumps(review(1, "tenant", affinity=affinity)).encode()
    many = [{"name": f"c{k}", "image": "x", "resources": {"requests": {"cpu": "10m"}}} for k in range(17_000)]
    HUGE = json.dumps(review(2, "tenant", containers=many)).encode()
    ORDINARY_BODY = json.dumps(review(3, "tenant")).encode()
    ca, crt, key = issue(["127.0.0.1"], 1)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "tls.crt").write_bytes(crt)
        (Path(d) / "tls.key").write_bytes(key)
        os.chmod(Path(d) / "tls.key", 0o600)
        print()
        print(
            f"honest reviews every 50 ms for {window:g} s beside each attack: the real server in its own process, "
            f"{nodes} simulated nodes, 20 profiles"
        )
        print(f"{'attack':<38} {'p50 ms':>8} {'p99 ms':>8} {'failed':>10} {'RSS MiB':>8} {'attacks':>7}")
        for attack in [None, *ATTACKS]:
            if attack is not None and only and not any(o in attack.name for o in only):
                continue
            print(attack_row(attack, nodes, 20, window, ca, d), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        port, metrics_port, cert_dir, nodes, profiles = sys.argv[2:7]
        serve(int(port), int(metrics_port), cert_dir, int(nodes), int(profiles))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--decisions", type=int, default=200)
    ap.add_argument("--window", type=float, default=6.0, help="seconds of honest reviews beside each attack")
    ap.add_argument("--attack", action="append", help="run only the attacks whose name holds this (repeatable)")
    args = ap.parse_args()
    print(f"an ordinary pod's decision at {args.nodes} nodes (simulated inputs, the real decision code)")
    print(f"{'profiles':>8} {'lookup':>10} {'p50 ms':>8} {'p99 ms':>8} {'CPU s':>6}")
    for profiles in (20, 100):
        for cached, name in ((False, "baseline"), (True, "cached")):
            p50, p99, cpu = run(args.nodes, profiles, args.decisions, cached)
            print(f"{profiles:>8} {name:>10} {p50 * 1000:>8.1f} {p99 * 1000:>8.1f} {cpu:>6.1f}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    attacks(args.nodes, args.window, args.attack)


if __name__ == "__main__":
    main()
