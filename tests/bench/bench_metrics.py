"""The controller's /metrics at cluster scale: what one scrape costs, with the default
series and with the per-pod series `--pod-metrics` adds (the baseline, in the same run).

    python tests/bench/bench_metrics.py                      # 150,000 pods on 5,000 nodes
    python tests/bench/bench_metrics.py --pods 20000 --nodes 700

Each mode runs in its own process (so its peak RSS is its own): the cluster's node plans
(podgen pods, two containers each, through eligibility and policy) are observed as the
controller observes them after a pass, then the scrape is rendered three times as
prometheus-client renders it for /metrics. Printed: series, bytes and the best render
time, and the process's peak RSS (VmHWM) and CPU seconds. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure(pods: int, nodes: int, pod_series: bool) -> dict[str, float]:
    from podgen import make_pod
    from prometheus_client import generate_latest

    from headroom.core.params import Settings
    from headroom.core.planner import plan_node
    from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
    from headroom.metrics import Metrics

    rng = random.Random(3)
    ns = {
        f"team-{i}": namespace_from_dict(
            {"metadata": {"name": f"team-{i}", "labels": {"kube-headroom.dev/mode": "managed"}}}
        )
        for i in range(40)
    }
    by_node: dict[str, list] = {f"node-{i:05d}": [] for i in range(nodes)}
    for i in range(pods):
        p = pod_from_dict(make_pod(i, nodes, rng))
        by_node[p.node_name].append(p)  # type: ignore[index]
    metrics = Metrics(pod_series=pod_series)
    settings = Settings()
    for name, node_pods in by_node.items():
        node = node_from_dict({"metadata": {"name": name}, "status": {"allocatable": {"cpu": "32"}}})
        metrics.observe_node(plan_node(node, node_pods, ns, settings, pod_level_resize=True))
    by_node.clear()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        text = generate_latest(metrics.registry)
        best = min(best, time.perf_counter() - start)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    hwm = next(
        int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM")
    )
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return {
        "series": series,
        "bytes": len(text),
        "render_s": best,
        "peak_rss_mb": hwm / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=150_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--mode", choices=("default", "pod-series"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(measure(args.pods, args.nodes, args.mode == "pod-series")))
        return
    print(f"== /metrics after a pass over {args.pods:,} pods on {args.nodes:,} nodes ==")
    print(f"{'mode':<28}{'series':>10}{'MB':>9}{'render':>10}{'peak RSS':>11}{'CPU s':>8}")
    here = Path(__file__).resolve().parent
    for mode, label in (("pod-series", "--pod-metrics (baseline)"), ("default", "default")):
        out = subprocess.run(
            [sys.executable, __file__, "--pods", str(args.pods), "--nodes", str(args.nodes), "--mode", mode],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": f"{here}:{here.parent}", "PATH": "/usr/bin:/bin"},
        )
        r = json.loads(out.stdout)
        print(
            f"{label:<28}{r['series']:>10,}{r['bytes'] / 1e6:>9.2f}{r['render_s']:>9.2f}s"
            f"{r['peak_rss_mb']:>9.0f}MB{r['cpu_s']:>8.1f}"
        )


if __name__ == "__main__":
    main()
