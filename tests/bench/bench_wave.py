"""The first wave at cluster scale: the real `headroom run` adopting a large cluster whose
pods already have CPU limits, measured as a whole process over the wave.

    python tests/bench/bench_wave.py                            # 150,000 pods, 5,000 nodes, 10 min
    python tests/bench/bench_wave.py --baseline /tmp/old/controller   # the same run first with that tree
    python tests/bench/bench_wave.py --qps 200 --run-args "--workers 8" --until-converged --minutes 30
    python tests/bench/bench_wave.py --dry-run --minutes 5       # prints when the first pass is complete

The cluster is served by `fakeapi.FakeApiServer` (a simulation, for scale: 150,000 pods do
not fit a real API server on this machine) with writes on and the per-node kubelet echo:
podgen pods of two containers on nodes of 32 CPU, every container with a static CPU limit
of twice its request, HeadroomConfig defaults (`--qps` sets `clientQPS`). `/metrics` is
scraped every 30 s as a ServiceMonitor would. Every 30 s a line: the process's RSS and
peak RSS (VmHWM) and CPU seconds from /proc, the writes the server counted by kind, and
the scrape's series, bytes and seconds. At the end: peak RSS over the wave against the RSS
at sync, the share of the write budget that went to resizes until every pod had its first
limit, pod writes per pod resized, and (with --until-converged) the time until writes
stop and how many pods the policy would still change then. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import make_cluster
from fakeapi import PODS, FakeApiServer
from podgen import make_pod
from procstat import cpu_seconds, memory

NODE_CPU = "32"


def pod_with_limits(i: int, nodes: int, rng: random.Random) -> dict[str, Any]:
    """A podgen pod whose every container has a static CPU limit of twice its request."""
    pod = make_pod(i, nodes, rng)
    for c in pod["spec"]["containers"]:
        req = c["resources"]["requests"]["cpu"]
        milli = int(req[:-1]) if req.endswith("m") else int(req) * 1000
        c["resources"]["limits"] = {"cpu": f"{2 * milli}m", "memory": "512Mi"}
    pod["metadata"]["generation"] = 1
    pod["status"]["observedGeneration"] = 1
    return pod


def build(pods: int, nodes: int, qps: float, dry_run: bool) -> FakeApiServer:
    config = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "HeadroomConfig",
        "metadata": {"name": "cluster", "uid": "uid-config", "generation": 1, "resourceVersion": "1"},
        "spec": {"dryRun": dry_run, "rateLimits": {"clientQPS": qps}},
    }
    return make_cluster(pods, nodes, cpu=NODE_CPU, seed=11, make=pod_with_limits, config=config, writes=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
            text = r.read()
    except OSError:
        return {}
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return {"series": series, "mb": len(text) / 2**20, "s": time.perf_counter() - started}


def off_target(fake: FakeApiServer) -> int:
    """Pods the policy would still resize on the server's final state (the product's own
    planner as the judge of convergence: 0 means every pod is at its target)."""
    from headroom.core.params import Settings
    from headroom.core.planner import plan_node
    from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict

    ns = {r.name: r for r in (namespace_from_dict(orjson.loads(b)) for b in fake.objects["/api/v1/namespaces"])}
    by_node: dict[str, list[Any]] = {}
    for raw in fake.objects[PODS]:
        p = pod_from_dict(orjson.loads(raw))
        by_node.setdefault(p.node_name, []).append(p)  # type: ignore[arg-type]
    left = 0
    for node in (node_from_dict(orjson.loads(b)) for b in fake.objects["/api/v1/nodes"]):
        plan = plan_node(node, by_node.get(node.name, []), ns, Settings(), pod_level_resize=True)
        left += sum(1 for pp in plan.pods if pp.target is not None and pp.target.apply)
    return left


def run_wave(args: argparse.Namespace, controller_tree: str | None, label: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    fake = build(args.pods, args.nodes, args.qps, args.dry_run)
    server = fake.serve()
    print(
        f"[{label}] cluster: {args.pods:,} pods on {args.nodes:,} nodes, {fake.bytes / 2**20:.0f} MiB of JSON, built in {time.perf_counter() - t0:.0f}s",
        flush=True,
    )
    port = _free_port()
    env = dict(os.environ)
    if controller_tree:
        env["PYTHONPATH"] = controller_tree
    out: dict[str, Any] = {"label": label, "samples": []}
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(fake.kubeconfig(server))
        cmd = [sys.executable, "-m", "headroom", "run", "--kubeconfig", str(kubeconfig), "--no-leader-elect"]
        cmd += ["--metrics-port", str(port), "--health-port", "0"]
        if not args.status_annotation:
            cmd.append("--status-annotation=false")
        cmd += args.run_args.split()
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        lines: collections.deque[bytes] = collections.deque(maxlen=30)
        first_pass: list[float] = []

        def read() -> None:
            for line in proc.stdout or ():
                lines.append(line)
                if not first_pass and b"first pass complete" in line:
                    first_pass.append(time.monotonic())

        threading.Thread(target=read, daemon=True).start()
        try:
            synced = None
            while synced is None:
                if proc.poll() is not None:
                    raise SystemExit(f"headroom run exited:\n{b''.join(lines).decode(errors='replace')}")
                if fake.counts["resize"] or fake.counts["status"] or fake.counts["pod-patch"]:
                    synced = time.monotonic()  # the first write: the caches are synced
                time.sleep(0.05)
            st = memory(proc.pid)
            out["sync_s"] = synced - started
            out["rss_at_sync_mb"] = st["VmRSS"] / 2**20
            print(f"[{label}] synced in {out['sync_s']:.1f}s, RSS {out['rss_at_sync_mb']:.0f} MB", flush=True)
            print(
                f"[{label}]   t(s)  RSS MB  peak MB  CPU s   resizes  pod-patches  events  status  conflicts  /metrics series  MB    s",
                flush=True,
            )
            end = synced + args.minutes * 60
            next_scrape = synced
            last_count, quiet_since = -1, time.monotonic()
            while True:
                now = time.monotonic()
                if now >= next_scrape:
                    scrape = _scrape(port)
                    st, cpu = memory(proc.pid), cpu_seconds(proc.pid)
                    c = dict(fake.counts)
                    sample = {
                        "t": now - synced,
                        "rss_mb": st["VmRSS"] / 2**20,
                        "peak_mb": st["VmHWM"] / 2**20,
                        "cpu_s": cpu,
                        **c,
                        "scrape": scrape,
                    }
                    out["samples"].append(sample)
                    print(
                        f"[{label}] {sample['t']:6.0f}  {sample['rss_mb']:6.0f}  {sample['peak_mb']:7.0f}  {cpu:5.0f}  "
                        f"{c.get('resize', 0):8}  {c.get('pod-patch', 0):11}  {c.get('event', 0):6}  {c.get('status', 0):6}  "
                        f"{c.get('conflict', 0):9}  {scrape.get('series', 0):15,}  {scrape.get('mb', 0):4.1f}  {scrape.get('s', 0):4.2f}",
                        flush=True,
                    )
                    next_scrape += args.scrape
                total = sum(fake.counts[k] for k in ("resize", "pod-patch", "event", "status"))
                if total != last_count:
                    last_count, quiet_since = total, now
                if args.until_converged and now - quiet_since >= args.quiet:
                    out["converged_s"] = fake.last_write - synced
                    break
                if now >= end:
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"headroom run exited:\n{b''.join(lines).decode(errors='replace')}")
                time.sleep(0.2)
            st = memory(proc.pid)
            out["peak_mb"] = st["VmHWM"] / 2**20
            out["rss_end_mb"] = st["VmRSS"] / 2**20
            out["cpu_s"] = cpu_seconds(proc.pid)
            out["first_pass_s"] = first_pass[0] - synced if first_pass else None
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    c = fake.counts
    out["counts"] = dict(c)
    out["pods_resized"] = len(fake.first_resized)
    out["first_limits_done_s"] = fake.first_resize_done - synced if fake.first_resized else None
    fake.shutdown(server)
    if args.until_converged:
        out["off_target"] = off_target(fake)
    # The write budget until the last pod had its first resize.
    s = fake.counts_at_first_done
    spent = s.get("resize", 0) + s.get("pod-patch", 0) + s.get("event", 0) + s.get("status", 0)
    out["resize_share"] = s.get("resize", 0) / spent if spent else None
    out["writes_per_resized_pod"] = (
        (c["resize"] + c["pod-patch"]) / len(fake.first_resized) if fake.first_resized else None
    )
    out["pods_written"] = len(fake.written)
    return out


def summary(r: dict[str, Any]) -> str:
    share = r["resize_share"]
    wp = r["writes_per_resized_pod"]
    lines = [
        f"== {r['label']} ==",
        f"synced in {r['sync_s']:.1f}s at {r['rss_at_sync_mb']:.0f} MB; peak RSS over the wave {r['peak_mb']:.0f} MB "
        f"= {r['peak_mb'] / r['rss_at_sync_mb']:.2f}x the RSS at sync (goal <= 1.25x and <= 400 MB); {r['cpu_s']:.0f} CPU s",
        f"pods resized {r['pods_resized']:,}; resizes {r['counts'].get('resize', 0):,}, pod patches {r['counts'].get('pod-patch', 0):,}, "
        f"events {r['counts'].get('event', 0):,}, status {r['counts'].get('status', 0):,}, 409s {r['counts'].get('conflict', 0):,}",
        "share of writes that were resizes until the last pod had its first: "
        + (f"{share:.1%} (goal >= 90%)" if share is not None else "-"),
        "pod writes per pod resized: "
        + (f"{wp:.3f} (goal <= 2.05, <= 1.05 without the status annotation)" if wp else "-")
        + f"; {r['pods_written']:,} pods written (those at their target already get only the annotation)",
    ]
    if r.get("first_pass_s") is not None:
        lines.append(f"first pass over every node complete {r['first_pass_s']:.0f}s after sync")
    if r.get("first_limits_done_s") is not None:
        lines.append(f"last first resize {r['first_limits_done_s']:.0f}s after sync")
    if "converged_s" in r:
        lines.append(
            f"writes stopped {r['converged_s']:.0f}s after sync; pods the policy would still change: {r['off_target']:,}"
        )
    elif "off_target" in r:
        lines.append(f"still writing when the run ended; pods the policy would still change: {r['off_target']:,}")
    last = r["samples"][-1]["scrape"] if r["samples"] else {}
    if last:
        lines.append(
            f"/metrics: {last['series']:,} series, {last['mb']:.2f} MB, {last['s']:.2f}s (goal <= 2 MB, <= 0.5 s)"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=150_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument(
        "--minutes",
        type=float,
        default=10.0,
        help="how long to watch the wave after sync (the most, with --until-converged)",
    )
    ap.add_argument("--qps", type=float, default=50.0, help="the HeadroomConfig's clientQPS")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--status-annotation", type=lambda v: v == "true", default=True, metavar="true|false")
    ap.add_argument("--until-converged", action="store_true", help="run until writes stop (see --quiet), not --minutes")
    ap.add_argument("--quiet", type=float, default=30.0, help="seconds without a write that end --until-converged")
    ap.add_argument("--scrape", type=float, default=30.0, help="seconds between /metrics scrapes and samples")
    ap.add_argument("--run-args", default="", help="more arguments for headroom run, e.g. '--workers 4'")
    ap.add_argument(
        "--baseline", help="a controller tree (e.g. a worktree's controller/) to run first, as the baseline"
    )
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    results = []
    if args.baseline:
        results.append(run_wave(args, args.baseline, f"baseline {args.baseline}"))
    results.append(run_wave(args, None, "this tree"))
    for r in results:
        print(summary(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
