"""What Headroom changes in the kernel: CFS throttling of busy pods on a real node.

    python tests/bench/bench_realnode.py                 # 2 busy pods, 10 s windows
    python tests/bench/bench_realnode.py --pods 3 --window 5

Real parts: kube-apiserver + etcd, kube-scheduler, kube-controller-manager, and one real
node (containerd, runc, CNI, the kubelet) on this machine's cgroups (testbed);
the real `headroom run` process. Each busy pod runs one thread that never sleeps, with
a CPU request of 100m and a tight static limit of 200m, as a cluster that sets limits by
habit has them. Three phases, each measured over the same window from the containers'
own cgroups (cpu.stat, cpuacct.usage):

1. static limits, no Headroom: the baseline;
2. Headroom on the idle node: the limits raised to the node's unbooked CPU;
3. the node filled: a pod that requests most of the node arrives; Headroom cuts the busy
   pods back towards their requests.

Printed per phase: each pod's limit, its CFS quota, the share of periods throttled,
throttled seconds per second and the CPU cores it got; then the time from the filler's
arrival to the cut in the cgroups, and the controller's resizes per scheduling event.
Nothing is asserted; figures go to stdout.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from headroom.cluster.client import Api, pod_path  # noqa: E402
from headroom.core.quantity import cpu_milli, format_milli  # noqa: E402
from helpers.cluster_helpers import bind_controller, install_crds  # noqa: E402
from testbed.controlplane import ControlPlane, build  # noqa: E402
from testbed.node import RealNode, build_node, busy_pod, running_containers  # noqa: E402

NS = "bench"


def _measure(node: RealNode, api: Api, ids: dict[str, str], seconds: float) -> list[dict[str, Any]]:
    before = {n: node.counters(c) for n, c in ids.items()}
    time.sleep(seconds)
    rows = []
    for n, c in ids.items():
        after, b = node.counters(c), before[n]
        assert after is not None and b is not None
        share, throttled, cores = after.since(b)
        limit = api.get(pod_path(NS, n))["spec"]["containers"][0]["resources"]["limits"].get("cpu")
        rows.append(
            {"pod": n, "limit": limit, "quota": after.quota_us, "share": share, "tps": throttled, "cores": cores}
        )
    return rows


def _print(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"  {'pod':<8} {'limit':>6} {'quota_us':>9} {'throttled':>10} {'thr s/s':>8} {'cores':>6}")
    for r in rows:
        print(f"  {r['pod']:<8} {r['limit']:>6} {r['quota']:>9} {r['share']:>9.0%} {r['tps']:>8.3f} {r['cores']:>6.2f}")
    print(
        f"  {'mean':<8} {'':>6} {'':>9} {statistics.mean(r['share'] for r in rows):>9.0%} "
        f"{statistics.mean(r['tps'] for r in rows):>8.3f} {statistics.mean(r['cores'] for r in rows):>6.2f}"
    )


def _wait_quotas(node: RealNode, api: Api, ids: dict[str, str], changed: Any, timeout: float = 60) -> float:
    """Seconds until every pod's cgroup quota satisfies `changed(quota_us)` and equals its spec limit."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        done = True
        for n, c in ids.items():
            counters = node.counters(c)
            limit = api.get(pod_path(NS, n))["spec"]["containers"][0]["resources"]["limits"].get("cpu")
            if counters is None or not changed(counters.quota_us) or counters.quota_us != cpu_milli(limit) * 100:
                done = False
        if done:
            return time.monotonic() - start
        time.sleep(0.05)
    raise SystemExit("the cgroup quotas never followed the limits")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=2, help="busy pods (one thread each)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds per measurement")
    args = ap.parse_args()
    bins = build_node()
    cp = ControlPlane(build(), components_dir=bins).start()
    node = RealNode(cp, bins).start()
    controller: subprocess.Popen[bytes] | None = None
    try:
        api = cp.api()
        install_crds(api)
        token = bind_controller(api)
        api.post(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": NS, "labels": {"kube-headroom.dev/mode": "managed"}},
            },
        )
        names = [f"busy-{i}" for i in range(args.pods)]
        for n in names:
            api.post(f"/api/v1/namespaces/{NS}/pods", busy_pod(n, None, "100m", "200m"))  # placed by the scheduler
        ids = running_containers(api, NS, names)
        allocatable = api.get(f"/api/v1/nodes/{node.name}")["status"]["allocatable"]["cpu"]
        print(f"real node {node.name}: {allocatable} CPU allocatable; {args.pods} busy pods, request 100m, limit 200m")
        _print(f"1. static limits, no Headroom ({args.window:.0f} s)", _measure(node, api, ids, args.window))

        api.apply(
            {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}},
            "bench",
        )
        log = open(Path(tempfile.mkdtemp()) / "controller.log", "wb")  # noqa: SIM115 - closed with the process
        controller = subprocess.Popen(
            [sys.executable, "-m", "headroom", "run", f"--kubeconfig={cp.kubeconfig(token)}", "--no-leader-elect"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started = time.monotonic()
        took = _wait_quotas(node, api, ids, lambda q: q > 20_000)
        print(
            f"\nHeadroom started: every busy pod's cgroup raised {time.monotonic() - started:.2f} s later ({took:.2f} s of waiting)"
        )
        _print(f"2. Headroom, idle node ({args.window:.0f} s)", _measure(node, api, ids, args.window))

        raised = {n: api.get(pod_path(NS, n))["spec"]["containers"][0]["resources"]["limits"]["cpu"] for n in names}
        adopted = Path(log.name).read_text(errors="replace").count('"cpu limit adjusted"')
        filler = format_milli(max(100, cpu_milli(allocatable) - 100 * args.pods - 200))
        api.post(f"/api/v1/namespaces/{NS}/pods", busy_pod("filler", None, filler, None, busy=False))
        cut = _wait_quotas(node, api, ids, lambda q: q < cpu_milli(min(raised.values(), key=cpu_milli)) * 100)
        print(f"\nfiller requesting {filler} arrived: the busy pods' cgroups cut {cut:.2f} s after its creation")
        _print(f"3. Headroom, the node filled ({args.window:.0f} s)", _measure(node, api, ids, args.window))
        controller.terminate()
        controller.wait(15)
        log.close()
        text = Path(log.name).read_text(errors="replace")
        resizes = text.count('"cpu limit adjusted"')
        conflicts = text.count("resize conflict")
        print(
            f"\ncontroller: {adopted} resizes to adopt {args.pods} running pods; {resizes - adopted} for the one "
            f"scheduling event after (the filler); {conflicts} resizes met 409"
        )
    finally:
        if controller is not None and controller.poll() is None:
            controller.kill()
        node.stop()
        cp.stop()


if __name__ == "__main__":
    main()
