"""Start-up of the real `headroom run` process against a recorded large cluster.

    python tests/bench/bench_startup.py                 # 150,000 pods on 5,000 nodes
    python tests/bench/bench_startup.py --pods 20000 --nodes 700

A loopback HTTP server (a fake, for scale: it serves what the API server serves for list
and watch — paginated `limit`/`continue` lists of the same JSON, and watches that stay
quiet) holds the cluster; `headroom run` syncs from it as from a real API server. The
whole process is measured from /proc: time until "caches synced", peak RSS (VmHWM) at
sync, RSS after the first pass. Beside it, in the same run, the baseline: a process that
decodes the whole list before building records (what the controller did before it read
lists page by page). Nothing is asserted; figures go to stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from podgen import make_pod

PAGE = 500


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks of 1/100 s


class Cluster:
    def __init__(self, pods: int, nodes: int, seed: int = 7) -> None:
        rng = random.Random(seed)
        started = time.perf_counter()
        self.objects: dict[str, list[bytes]] = {
            "/api/v1/pods": [orjson.dumps(make_pod(i, nodes, rng)) for i in range(pods)],
            "/api/v1/nodes": [
                orjson.dumps(
                    {
                        "metadata": {
                            "name": f"node-{n:05d}",
                            "labels": {"kubernetes.io/os": "linux"},
                            "resourceVersion": "1",
                        },
                        "status": {
                            "allocatable": {"cpu": "16", "memory": "64Gi"},
                            "conditions": [{"type": "Ready", "status": "True"}],
                        },
                    }
                )
                for n in range(nodes)
            ],
            "/api/v1/namespaces": [
                orjson.dumps({"metadata": {"name": f"team-{t}", "labels": {"kube-headroom.dev/mode": "managed"}}})
                for t in range(40)
            ],
            "/apis/kube-headroom.dev/v1alpha1/headroomconfigs": [],
            "/apis/kube-headroom.dev/v1alpha1/nodepoolprofiles": [],
            "/api/v1/limitranges": [],
            "/api/v1/resourcequotas": [],
        }
        self.bytes = sum(len(b) for v in self.objects.values() for b in v)
        self.generated_in = time.perf_counter() - started
        self.stop = threading.Event()
        self.watch_list = True  # serve WatchList streams (False: refuse them, as older servers do)

    def serve(self) -> ThreadingHTTPServer:
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _json(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(url.query)
                if url.path == "/version":
                    return self._json(b'{"gitVersion":"v1.37.2","major":"1","minor":"37"}')
                if url.path == "/api/v1":
                    return self._json(b'{"resources":[{"name":"pods"},{"name":"pods/resize"},{"name":"nodes"}]}')
                items = cluster.objects.get(url.path)
                if items is None:
                    self.send_error(404)
                    return
                if q.get("watch", ["false"])[0] == "true":
                    initial = q.get("sendInitialEvents", ["false"])[0] == "true"
                    if initial and not cluster.watch_list:  # as a server without the WatchList feature
                        body = b'{"kind":"Status","status":"Failure","reason":"Invalid","code":422}'
                        self.send_response(422)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                    # A WatchList stream (every object as ADDED, then the end bookmark), or a
                    # plain watch; then quiet.
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    if initial:
                        chunk: list[bytes] = []
                        for obj in items:
                            chunk.append(b'{"type":"ADDED","object":' + obj + b"}\n")
                            if len(chunk) == 200:
                                self._chunk(b"".join(chunk))
                                chunk = []
                        end = b'{"kind":"Pod","metadata":{"resourceVersion":"1000","annotations":{"k8s.io/initial-events-end":"true"}}}'
                        chunk.append(b'{"type":"BOOKMARK","object":' + end + b"}\n")
                        self._chunk(b"".join(chunk))
                    self.wfile.flush()
                    cluster.stop.wait(600)
                    return
                start = int(q.get("continue", ["0"])[0])
                limit = int(q.get("limit", [str(len(items) or 1)])[0])
                page = items[start : start + limit]
                nxt = start + limit
                meta = {"resourceVersion": "1000"}
                if nxt < len(items):
                    meta["continue"] = str(nxt)
                body = b'{"kind":"List","apiVersion":"v1","metadata":' + orjson.dumps(meta) + b',"items":['
                self._json(body + b",".join(page) + b"]}")

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


BASELINE = """
import sys, time
from headroom.cluster.api import Api, connect
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


def measure(cmd: list[str], marker: bytes, settle: float) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
            st = _status(proc.pid)
            out["peak_at_sync_mb"] = st["VmHWM"] / 2**20
            out["rss_at_sync_mb"] = st["VmRSS"] / 2**20
            deadline = time.perf_counter() + settle
            while time.perf_counter() < deadline and proc.poll() is None:
                time.sleep(0.1)
            if proc.poll() is None:
                st = _status(proc.pid)
                out["peak_mb"] = st["VmHWM"] / 2**20
                out["rss_after_mb"] = st["VmRSS"] / 2**20
                out["cpu_s"] = _cpu(proc.pid)
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
    args = ap.parse_args()
    cluster = Cluster(args.pods, args.nodes)
    server = cluster.serve()
    print(
        f"cluster: {args.pods} pods on {args.nodes} nodes, {cluster.bytes / 2**20:.0f} MiB of JSON "
        f"(generated in {cluster.generated_in:.1f}s), served in pages of {PAGE}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{server.server_address[1]}\n"
            "users:\n- name: u\n  user:\n    token: bench\n"
            "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
        )
        run = [sys.executable, "-m", "headroom", "run", "--kubeconfig", str(kubeconfig), "--no-leader-elect"]
        run += ["--metrics-port", "0", "--health-port", "0"]
        cluster.watch_list = True
        ours = measure(run, b"caches synced", args.settle)
        cluster.watch_list = False  # as a server without WatchList: paginated lists
        pages = measure(run, b"caches synced", args.settle)
        base = measure([sys.executable, "-c", BASELINE, str(kubeconfig)], b"synced", 1.0)
    cluster.stop.set()
    server.shutdown()
    print(
        json.dumps(
            {
                "headroom run (WatchList)": ours,
                "headroom run (paginated)": pages,
                "baseline (whole list decoded)": base,
            },
            indent=1,
        )
    )
    for name, r in (("WatchList stream", ours), ("paginated list", pages)):
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
