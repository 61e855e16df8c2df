"""A service's tail latency, and a runaway's reach, under tight static CPU limits, no CPU
limits, and Headroom, on a real node of this machine.

    python tests/bench/bench_latency.py                    # 3 repeats, 10 s windows
    python tests/bench/bench_latency.py --repeats 1 --seconds 5

Real parts: kube-apiserver + etcd, kube-scheduler, kube-controller-manager, one real node
(containerd, runc, CNI, the kubelet) on this machine's cgroups, and the real
`headroom run` process with the chart's RBAC. The pods (testbed/latency.py):

- svc: a Go HTTP service, request 250m, static limit 500m, a fixed CPU cost per request
  (--cost-ms, calibrated on this machine);
- batch: request 250m, static limit 500m, two threads spinning;
- runaway (with --runaway scenarios): request 100m, static limit 200m, four threads spinning.

Policies: static (those limits), no limits (none set: the cgroup has no CFS quota), and
Headroom (the static pods opted in; Headroom raises the limits to the node's unbooked CPU
by request). Each at two loads, a share of what svc serves with one whole CPU (1000 /
cost-ms requests per second): 40 % and 80 %. Repeats are interleaved (static, none,
Headroom, static, ...) so drift shows as spread. The load generator runs on the host,
open loop, latency from each request's intended send time; a request slower than 2 s is
a timeout, counted as an error.

Printed: per scenario and load, the median and range over the repeats of p50 / p99 /
p99.9 and errors, each pod's CPU cores and throttled share, the limits in force and the
service's GOMAXPROCS. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from cluster_helpers import apply_config, bind_controller, install_crds  # noqa: E402
from testbed.controlplane import ControlPlane, build  # noqa: E402
from testbed.latency import (  # noqa: E402
    HEADROOM,
    NONE,
    POLICIES,
    STATIC,
    Run,
    Scenarios,
    build_latency,
    calibrate,
    import_service_image,
)
from testbed.node import RealNode, build_node  # noqa: E402


def _spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def report(runs: list[Run], args: argparse.Namespace, rounds: int, capacity: float) -> None:
    print(
        f"\nCommand: python tests/bench/bench_latency.py --repeats {args.repeats} --seconds {args.seconds:g} "
        f"--cost-ms {args.cost_ms:g}\nsvc: {rounds} SHA-256 rounds per request (~{args.cost_ms:g} ms here, "
        f"unthrottled); one whole CPU serves ~{capacity:.0f} requests/s. Median (min–max) of {args.repeats} "
        f"repeat(s), {args.seconds:g} s each.\n"
    )
    header = (
        f"{'scenario':<22} {'load':>9} {'p50 ms':>18} {'p99 ms':>20} {'p99.9 ms':>20} {'errors':>10} "
        f"{'svc limit':>10} {'GOMAXPROCS':>10} {'svc cores':>10} {'svc thr':>8} {'batch cores':>11} "
        f"{'runaway lim':>11} {'runaway cores':>13}"
    )
    print(header)
    for runaway in (False, True):
        for policy in POLICIES:
            for load in args.loads:
                rs = [r for r in runs if r.policy == policy and r.runaway == runaway and r.load == load]
                if not rs:
                    continue
                name = policy + (" + runaway" if runaway else "")
                lat = [r.latency for r in rs]
                rw = [r.pods["runaway"] for r in rs if "runaway" in r.pods]
                print(
                    f"{name:<22} {f'{load:.0%} {rs[0].rate:.0f}/s':>9} "
                    f"{_spread([x['p50_ms'] for x in lat]):>18} {_spread([x['p99_ms'] for x in lat]):>20} "
                    f"{_spread([x['p999_ms'] for x in lat]):>20} "
                    f"{_spread([x['errors'] for x in lat], '{:.0f}'):>10} "
                    f"{rs[0].pods['svc'].limit:>10} {_spread([r.gomaxprocs for r in rs], '{:.0f}'):>10} "
                    f"{_spread([r.pods['svc'].cores for r in rs], '{:.2f}'):>10} "
                    f"{_spread([r.pods['svc'].throttled * 100 for r in rs], '{:.0f}'):>8} "
                    f"{_spread([r.pods['batch'].cores for r in rs], '{:.2f}'):>11} "
                    f"{(rw[0].limit if rw else '-'):>11} {_spread([p.cores for p in rw], '{:.2f}'):>13}"
                )
    print("\n(svc thr: % of CFS periods throttled; cores: CPU used over the window, from the cgroups)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="the measured window per run")
    ap.add_argument("--cost-ms", type=float, default=2.0, help="svc's CPU cost per request, unthrottled")
    ap.add_argument("--loads", type=float, nargs="+", default=[0.4, 0.8])
    ap.add_argument("--no-runaway", dest="runaway", action="store_false", help="skip the runaway scenarios")
    args = ap.parse_args()
    lat_bins, bins = build_latency(), build_node()
    rounds = calibrate(lat_bins, args.cost_ms)
    capacity = 1000.0 / args.cost_ms
    cp = ControlPlane(build(), components_dir=bins).start()
    node = RealNode(cp, bins, host_reaches_pods=True).start()
    controller: subprocess.Popen[bytes] | None = None
    runs: list[Run] = []
    began = time.monotonic()
    try:
        api = cp.api()
        install_crds(api)
        token = bind_controller(api)
        import_service_image(node, lat_bins)
        allocatable = api.get(f"/api/v1/nodes/{node.name}")["status"]["allocatable"]["cpu"]
        print(f"real node {node.name}: {allocatable} CPU allocatable")
        apply_config(api, {}, "bench")
        log = open(Path(tempfile.mkdtemp()) / "controller.log", "wb")  # noqa: SIM115 - closed with the process
        controller = subprocess.Popen(
            [sys.executable, "-m", "headroom", "run", f"--kubeconfig={cp.kubeconfig(token)}", "--no-leader-elect"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        scenarios = Scenarios(api, node, lat_bins, rounds)
        for rep in range(args.repeats):
            for runaway in (False, True) if args.runaway else (False,):
                for policy in (STATIC, NONE, HEADROOM):
                    ns, ids = scenarios.setup(policy, runaway)
                    try:
                        for load in args.loads:
                            run = scenarios.run(ns, ids, policy, runaway, load, load * capacity, args.seconds)
                            runs.append(run)
                            lat = run.latency
                            print(
                                f"  repeat {rep + 1}: {policy}{' + runaway' if runaway else ''} at {load:.0%}: "
                                f"p99 {lat['p99_ms']:.1f} ms, {lat['errors']} errors, svc limit "
                                f"{run.pods['svc'].limit}, GOMAXPROCS {run.gomaxprocs}",
                                flush=True,
                            )
                    finally:
                        scenarios.teardown(ns)
        log.close()
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(15)
        node.stop()
        cp.stop()
    report(runs, args, rounds, capacity)
    print(f"\nwhole run: {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
