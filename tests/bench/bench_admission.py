"""The webhook's decision for an ordinary pod at scale: 5,000 nodes and 20 or 100
NodePoolProfiles, each node labelled into one pool (simulated inputs, the real decision
code). Prints p50/p99 per decision and the process's peak RSS and CPU seconds, with each
node's settings cached per configuration (the product) and, in the same run, looked up
anew for every decision (the baseline: what every decision did before the cache).

    .venv/bin/python tests/bench/bench_admission.py [--nodes 5000] [--decisions 200]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2] / "controller")]

from headroom.api.models import HeadroomConfig, NodePoolProfile, profile_from, settings_from  # noqa: E402
from headroom.core.params import Resolver, Settings  # noqa: E402
from headroom.core.records import Namespace, Node, node_from_dict  # noqa: E402
from headroom.webhook import mutation  # noqa: E402
from headroom.webhook.server import Sources, review_response  # noqa: E402


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


def review(i: int) -> dict:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "team"},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": "250m"}}}]},
    }
    request = {"uid": f"u{i}", "kind": {"kind": "Pod"}, "namespace": "team", "operation": "CREATE", "object": pod}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def run(nodes: int, profiles: int, decisions: int, cached: bool) -> tuple[float, float, float]:
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
    sources = Sources(lambda name: team if name == "team" else None, lambda: res, nodes=lambda: known)
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
    return statistics.median(times), times[int(len(times) * 0.99) - 1], cpu


class _Uncached:
    """The baseline: every node's settings asked anew for every decision, as before the cache."""

    def of(self, node: Node, res: Resolver) -> tuple[Settings, bool]:
        return mutation.node_settings(node, res)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--decisions", type=int, default=200)
    args = ap.parse_args()
    print(f"an ordinary pod's decision at {args.nodes} nodes (simulated inputs, the real decision code)")
    print(f"{'profiles':>8} {'lookup':>10} {'p50 ms':>8} {'p99 ms':>8} {'CPU s':>6}")
    for profiles in (20, 100):
        for cached, name in ((False, "baseline"), (True, "cached")):
            p50, p99, cpu = run(args.nodes, profiles, args.decisions, cached)
            print(f"{profiles:>8} {name:>10} {p50 * 1000:>8.1f} {p99 * 1000:>8.1f} {cpu:>6.1f}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
