"""Start-up of the real `headroom run` process against a recorded large cluster.

    python tests/bench/bench_startup.py                 # 150,000 pods on 5,000 nodes
    python tests/bench/bench_startup.py --pods 20000 --nodes 700
    python tests/bench/bench_startup.py --baseline /tmp/old/controller   # that tree measured too

A loopback HTTP server (`fakeapi.py`, a fake for scale: it serves what the API server
serves for list and watch — paginated `limit`/`continue` lists of the same JSON, WatchList
streams, and watches that stay quiet; no HeadroomConfig, so nothing is written) holds the
cluster; `headroom run` syncs from it as from a real API server. The
whole process is measured from /proc: time until "caches synced", peak RSS (VmHWM) at
sync, RSS after the first pass. Beside it, in the same run, the baseline: a process that
decodes the whole list before building records (what the controller did before it read
lists page by page). Nothing is asserted; figures go to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakeapi import FakeApiServer, node_json
from podgen import make_pod
from procstat import cpu_seconds, memory

PAGE = 500


def make_cluster(
    pods: int,
    nodes: int,
    *,
    cpu: str = "16",
    seed: int = 7,
    make: Callable[[int, int, random.Random], dict[str, Any]] = make_pod,
    **kw: Any,
) -> FakeApiServer:
    """`make` (podgen) pods spread over `nodes` nodes of `cpu` cores, 40 managed namespaces."""
    rng = random.Random(seed)
    return FakeApiServer(
        pods=[orjson.dumps(make(i, nodes, rng)) for i in range(pods)],
        nodes=[node_json(f"node-{n:05d}", cpu) for n in range(nodes)],
        namespaces=[
            orjson.dumps({"metadata": {"name": f"team-{t}", "labels": {"kube-headroom.dev/mode": "managed"}}})
            for t in range(40)
        ],
        **kw,
    )


BASELINE = """
import sys, time
from headroom.cluster.client import Api, connect
from headroom.core.records import pod_from_dict
api = Api(connect(sys.argv[1]))
t = time.perf_counter()
items = []
for page in api.list_pages("/api/v1/pods"):
    items.extend(page.get("items") or ())
records = [pod_from_dict(o) for o in items]
print("synced", time.perf_counter() - t, len(records), flush=True)
time.sleep(2)
"""


def measure(cmd: list[str], marker: bytes, settle: float, tree: str | None = None) -> dict[str, float]:
    """The process's figures at sync and `settle` seconds later; `tree`: the controller
    package to import instead of this checkout's (another checkout's controller/)."""
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    out: dict[str, float] = {}
    reader_lines: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            reader_lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    while proc.poll() is None:
        if "sync_s" not in out and any(marker in line for line in reader_lines):
            out["sync_s"] = time.perf_counter() - started
            st = memory(proc.pid)
            out["peak_at_sync_mb"] = st["VmHWM"] / 2**20
            out["rss_at_sync_mb"] = st["VmRSS"] / 2**20
            deadline = time.perf_counter() + settle
            while time.perf_counter() < deadline and proc.poll() is None:
                time.sleep(0.1)
            if proc.poll() is None:
                st = memory(proc.pid)
                out["peak_mb"] = st["VmHWM"] / 2**20
                out["rss_after_mb"] = st["VmRSS"] / 2**20
                out["cpu_s"] = cpu_seconds(proc.pid)
            break
        time.sleep(0.05)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    if "sync_s" not in out:
        raise SystemExit(f"{cmd[:4]} never synced:\n{b''.join(reader_lines[-20:]).decode(errors='replace')}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=150_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after sync before the last sample")
    ap.add_argument(
        "--baseline",
        help="a controller tree (e.g. an older checkout's controller/) measured first, on the same cluster",
    )
    args = ap.parse_args()
    started = time.perf_counter()
    cluster = make_cluster(args.pods, args.nodes)
    server = cluster.serve()
    print(
        f"cluster: {args.pods} pods on {args.nodes} nodes, {cluster.bytes / 2**20:.0f} MiB of JSON "
        f"(generated in {time.perf_counter() - started:.1f}s), served in pages of {PAGE}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(cluster.kubeconfig(server))
        run = [sys.executable, "-m", "headroom", "run", "--kubeconfig", str(kubeconfig), "--no-leader-elect"]
        run += ["--metrics-port", "0", "--health-port", "0"]
        cluster.watch_list = True
        before = measure(run, b"caches synced", args.settle, args.baseline) if args.baseline else None
        ours = measure(run, b"caches synced", args.settle)
        cluster.watch_list = False  # as a server without WatchList: paginated lists
        pages = measure(run, b"caches synced", args.settle)
        base = measure([sys.executable, "-c", BASELINE, str(kubeconfig)], b"synced", 1.0)
    cluster.shutdown(server)
    print(
        json.dumps(
            {
                "headroom run (WatchList)": ours,
                "headroom run (paginated)": pages,
                "baseline (whole list decoded)": base,
                **({f"headroom run (WatchList) of {args.baseline}": before} if before else {}),
            },
            indent=1,
        )
    )
    runs = [("WatchList stream", ours), ("paginated list", pages)]
    if before:
        runs.insert(0, (f"WatchList stream, {args.baseline}", before))
    for name, r in runs:
        print(
            f"headroom run, {name}: synced in {r['sync_s']:.1f}s, peak RSS {r['peak_mb']:.0f} MB "
            f"({r['peak_mb'] / max(r['rss_after_mb'], 1):.2f}x the RSS after sync, {r['rss_after_mb']:.0f} MB), "
            f"{r['cpu_s']:.1f} CPU s"
        )
    print(
        f"baseline (whole list decoded, orjson): peak {base['peak_at_sync_mb']:.0f} MB in {base['sync_s']:.1f}s "
        f"-> {base['peak_at_sync_mb'] / ours['peak_mb']:.2f}x less peak memory"
    )


if __name__ == "__main__":
    main()
