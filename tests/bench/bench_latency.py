"""A service's tail latency beside its neighbours under tight static CPU limits, no CPU
limits, and Headroom, on a real node of this machine: each row tests a claim the design
makes for a ceiling over `cpu.weight` alone, where the claim could visibly fail.

    python tests/bench/bench_latency.py                    # 5 repeats, 10 s windows
    python tests/bench/bench_latency.py --repeats 1 --seconds 3 --rows reach   # a smoke run

Real parts: kube-apiserver + etcd, kube-scheduler, kube-controller-manager, one real node
(containerd, runc, CNI, the kubelet) on this machine's cgroups, and the real
`headroom run` process with the chart's RBAC. The pods (testbed/latency.py): svc, a Go
HTTP service (request 250m, static limit 500m, a fixed CPU cost per request, calibrated
here), and its neighbours, the same binary spinning threads.

Rows:
- svc + batch, svc + batch + runaway: the first question (static vs no limits vs Headroom)
  at 40 % and 80 % of what svc serves with one whole CPU;
- bursting neighbour (claim a): svc at 20/40/60 % beside 8 threads on for 200 ms of every
  second, and beside 8 threads spinning always; no limits vs Headroom;
- runaway's reach (claim b): 4 threads spinning beside svc at 10 % on an otherwise idle
  node, where nothing but its own limit can hold it;
- tenant contract (claim c): svc requesting what it sustains at 80 % (measured first,
  under no limits), beside batch, without and with the runaway; no limits vs Headroom;
- systemReserved 300m: svc + batch at 80 % on the kubelet restarted with 300m reserved;
- tenants (claim d): svc (tenant B, its own namespace) beside tenant A's three pods of two
  spinning threads each (request 250m each), at 40 % and 60 %: no limits, Headroom, and
  Headroom with `tenancy.maxNodeSlackShare: 0.5` and with svc's tenant at weight 2, each
  with `minBurstFloor: 0` (A's many small pods would otherwise get the per-pod floor above
  their pot); tenant A's pods' cores together are printed too (A held to its pot);
- CFS burst (an experiment, nothing in the product): Headroom's rows where svc is loaded,
  again with `cpu.cfs_burst_us` on svc set to its request × the period.

Each repeat runs every row, the policies in an order that rotates from repeat to repeat.
The load generator runs on the host, open loop, latency from each request's intended send
time; a request slower than 2 s is a timeout, counted apart, and a percentile at the
timeout is printed `≥ 2 s (saturated)`: what it would have been is unknown, and no ratio is
made of it. Printed per row: the median (min–max) over the repeats of p50 / p99 / p99.9,
timeouts and other errors, the generator's largest lag, the host's busy and steal share,
and per pod its limit, cores, throttled share and whether its limit bound it (cores ≥ 90 %
of the CFS quota in force in its cgroup); a p99.9 only over windows of at least 1,000
answered requests. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from headroom.core.quantity import cpu_milli  # noqa: E402
from helpers.cluster_helpers import apply_config, bind_controller, install_crds  # noqa: E402
from testbed.controlplane import ControlPlane, build  # noqa: E402
from testbed.latency import (  # noqa: E402
    BATCH,
    HEADROOM,
    NONE,
    PERIOD_S,
    REACH,
    RUNAWAY,
    STATIC,
    SVC_BATCH,
    TENANT_CAP,
    TENANT_TIER,
    TENANTS,
    TIMEOUT_S,
    Neighbour,
    Run,
    Scenario,
    Scenarios,
    build_latency,
    calibrate,
    config_of,
    import_service_image,
)
from testbed.node import RealNode, build_node  # noqa: E402

SVC_BATCH_RUNAWAY = Scenario("svc + batch + runaway", (BATCH, RUNAWAY))
BURSTING = Neighbour("burst", "250m", "500m", 8, on_ms=200)
SPINNING = Neighbour("burst", "250m", "500m", 8)
RESERVED = "300m"


@dataclass(frozen=True)
class Row:
    scenario: Scenario
    policies: tuple[str, ...]
    loads: tuple[float, ...]
    reserved: str = "0"  # the kubelet's systemReserved CPU
    burst: bool = False  # the CFS burst experiment on svc (Headroom only)

    @property
    def name(self) -> str:
        extra = f", systemReserved {self.reserved}" if self.reserved != "0" else ""
        return self.scenario.name + extra + (", CFS burst" if self.burst else "")


def rows(contract: str) -> list[Row]:
    everything = (STATIC, NONE, HEADROOM)
    loose = (NONE, HEADROOM)
    contract_batch = Scenario(f"tenant contract (svc requests {contract})", (BATCH,), svc_request=contract,
                              svc_static=contract)  # fmt: skip
    contract_runaway = replace(contract_batch, name=contract_batch.name + " + runaway", neighbours=(BATCH, RUNAWAY))
    return [
        Row(SVC_BATCH, everything, (0.4, 0.8)),
        Row(SVC_BATCH_RUNAWAY, everything, (0.4, 0.8)),
        Row(Scenario("bursting neighbour (8 threads, 200 ms/s)", (BURSTING,)), loose, (0.2, 0.4, 0.6)),
        Row(Scenario("spinning neighbour (8 threads)", (SPINNING,)), loose, (0.2, 0.4, 0.6)),
        Row(REACH, everything, (0.1,)),
        Row(contract_batch, loose, (0.8,)),
        Row(contract_runaway, loose, (0.8,)),
        Row(SVC_BATCH, loose, (0.8,), reserved=RESERVED),
        # Tenants in the split (claim d): tenant A's three pods spinning beside tenant B's svc.
        Row(TENANTS, (NONE, HEADROOM, TENANT_CAP, TENANT_TIER), (0.4, 0.6)),
        # CFS burst, in the rows where svc is throttled under Headroom: the runaway at 80 %,
        # and systemReserved (each beside its Headroom row of the same repeat).
        Row(SVC_BATCH_RUNAWAY, (HEADROOM,), (0.8,), burst=True),
        Row(SVC_BATCH, (HEADROOM,), (0.8,), reserved=RESERVED, burst=True),
    ]


def burst_rows() -> list[Row]:
    """`--burst-only`: the experiment alone, each throttled row with and without CFS burst."""
    return [
        Row(SVC_BATCH_RUNAWAY, (HEADROOM,), (0.8,)),
        Row(SVC_BATCH_RUNAWAY, (HEADROOM,), (0.8,), burst=True),
        Row(SVC_BATCH, (HEADROOM,), (0.8,), reserved=RESERVED),
        Row(SVC_BATCH, (HEADROOM,), (0.8,), reserved=RESERVED, burst=True),
    ]


# A p99.9 is one request in a thousand: over fewer answered requests it is the slowest one
# or two, not a percentile, and is not printed.
P999_SAMPLES = 1000


def _latency(rs: list[Run], key: str) -> str:
    """Median (min–max) over the repeats; a saturated one says so instead of a number."""
    if any(r.saturated(key) for r in rs):
        return f"≥ {TIMEOUT_S:g} s (saturated)"
    if key == "p999_ms":
        rs = [r for r in rs if r.answered >= P999_SAMPLES]
        if not rs:
            return f"- (under {P999_SAMPLES} answers a window)"
    values = [float(r.latency[key]) for r in rs]
    return _spread(values) + " ms"


def _spread(values: list[float], fmt: str = "{:.1f}") -> str:
    show = fmt.format
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return show(med)
    return f"{show(med)} ({show(min(values))}–{show(max(values))})"


def report(runs: list[Run], args: argparse.Namespace, rounds: int, capacity: float, contract: str) -> None:
    print(
        f"\nCommand: python tests/bench/bench_latency.py --repeats {args.repeats} --seconds {args.seconds:g} "
        f"--cost-ms {args.cost_ms:g}\nsvc: {rounds} SHA-256 rounds per request (~{args.cost_ms:g} ms here, "
        f"unthrottled); one whole CPU serves ~{capacity:.0f} requests/s. Median (min–max) of {args.repeats} "
        f"repeat(s), {args.seconds:g} s each. svc's demand at 80 %, measured under no limits: {contract}.\n"
    )
    for row in burst_rows() if args.burst_only else rows(contract):
        for load in row.loads:
            for policy in row.policies:
                rs = [
                    r
                    for r in runs
                    if (r.scenario, r.policy, r.load, r.variant) == (row.name, policy, load, _variant(row))
                ]
                if not rs:
                    continue
                timeouts = [float(r.latency["timeouts"]) for r in rs]
                others = [float(r.latency["errors"]) - float(r.latency["timeouts"]) for r in rs]
                lag = max(float(r.latency.get("late_ms", 0)) for r in rs)
                print(
                    f"{row.name} — {policy} — {load:.0%} ({rs[0].rate:.0f}/s): p50 {_latency(rs, 'p50_ms')}, "
                    f"p99 {_latency(rs, 'p99_ms')}, p99.9 {_latency(rs, 'p999_ms')}; timeouts "
                    f"{_spread(timeouts, '{:.0f}')}, other errors {_spread(others, '{:.0f}')}; generator lag ≤ "
                    f"{lag:.0f} ms{' (it fell behind)' if lag > 50 else ''}; host busy "
                    f"{_spread([r.busy * 100 for r in rs], '{:.0f}')} %, steal {_spread([r.steal * 100 for r in rs], '{:.1f}')} %"
                )
                tenant_a = [n for n in rs[0].pods if n in {p.name for p in TENANTS.neighbours}]
                if row.scenario.tenants and tenant_a:
                    together = [sum(r.pods[n].cores for n in tenant_a) for r in rs]
                    print(f"    tenant A's {len(tenant_a)} pods together: cores {_spread(together, '{:.2f}')}")
                for name in rs[0].pods:
                    pods = [r.pods[name] for r in rs]
                    bound = sum(p.bound for p in pods)
                    throttled = _spread([p.throttled * 100 for p in pods], "{:.0f}") + " %"
                    print(
                        f"    {name:<8} limit {_limits([p.limit for p in pods]):<12} cores "
                        f"{_spread([p.cores for p in pods], '{:.2f}'):<18} throttled {throttled:<16} bound {bound}/{len(pods)}"
                        + (f"  GOMAXPROCS {_spread([r.gomaxprocs for r in rs], '{:.0f}')}" if name == "svc" else "")
                    )
    print(
        "\n(bound: the pod used ≥ 90 % of the CFS quota in force in its cgroup over the window; throttled: % of "
        f"CFS periods throttled; p99.9 only over windows of at least {P999_SAMPLES} answered requests)"
    )


def _limits(values: list[str]) -> str:
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else "–".join([distinct[0], distinct[-1]])


def _variant(row: Row) -> str:
    return "burst" if row.burst else ""


def _rotated(policies: tuple[str, ...], rep: int) -> tuple[str, ...]:
    k = rep % len(policies)
    return policies[k:] + policies[:k]


def _runs(scenarios: Scenarios, node: RealNode, row: Row, rep: int, capacity: float, seconds: float) -> Iterator[Run]:
    for policy in _rotated(row.policies, rep):
        config = config_of(policy, row.scenario, scenarios.next_namespace())  # a tier names svc's namespace
        if config:
            apply_config(scenarios.api, config, "bench")
        try:
            ns, ids = scenarios.setup(policy, row.scenario)
        except BaseException:
            if config:
                apply_config(scenarios.api, {}, "bench")
            raise
        try:
            if row.burst:
                request_milli = cpu_milli(row.scenario.svc_request)
                scenarios.set_burst(ids["svc"], int(request_milli / 1000 * PERIOD_S * 1_000_000))
            for load in row.loads:
                yield scenarios.run(ns, ids, policy, row.name, load, load * capacity, seconds, _variant(row))
        finally:
            scenarios.teardown(ns)
            if config:
                apply_config(scenarios.api, {}, "bench")


def demand(scenarios: Scenarios, capacity: float, seconds: float) -> str:
    """What svc sustains at 80 % beside batch under no limits, rounded up to 10m: the
    request of the tenant who honours the contract."""
    ns, ids = scenarios.setup(NONE, SVC_BATCH)
    try:
        run = scenarios.run(ns, ids, NONE, "demand", 0.8, 0.8 * capacity, seconds)
    finally:
        scenarios.teardown(ns)
    return f"{math.ceil(run.pods['svc'].cores * 100) * 10}m"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0, help="the measured window per run")
    ap.add_argument("--cost-ms", type=float, default=2.0, help="svc's CPU cost per request, unthrottled")
    ap.add_argument("--rows", nargs="+", help="run only the rows whose name holds one of these")
    ap.add_argument("--burst-only", action="store_true", help="only the CFS burst experiment, with its baselines")
    args = ap.parse_args()
    lat_bins, bins = build_latency(), build_node()
    rounds = calibrate(lat_bins, args.cost_ms)
    capacity = 1000.0 / args.cost_ms
    cp = ControlPlane(build(), components_dir=bins).start()
    node = RealNode(cp, bins, host_reaches_pods=True).start()
    controller: subprocess.Popen[bytes] | None = None
    runs: list[Run] = []
    began = time.monotonic()
    contract = "?"
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
        contract = "-" if args.burst_only else demand(scenarios, capacity, args.seconds)
        print(f"svc's demand at 80 % beside batch, no limits: {contract}")
        table = burst_rows() if args.burst_only else rows(contract)
        chosen = [r for r in table if not args.rows or any(w in r.name for w in args.rows)]
        for rep in range(args.repeats):
            for row in chosen:
                if row.reserved != node.cpu_reserved:
                    node.restart_kubelet(row.reserved)
                for run in _runs(scenarios, node, row, rep, capacity, args.seconds):
                    runs.append(run)
                    lat = run.latency
                    print(
                        f"  repeat {rep + 1}: {row.name} — {run.policy} at {run.load:.0%}: p99 {_latency([run], 'p99_ms')}, "
                        f"{lat['timeouts']} timeouts, svc limit {run.pods['svc'].limit}",
                        flush=True,
                    )
            if node.cpu_reserved != "0":
                node.restart_kubelet("0")
        log.close()
    finally:
        if controller is not None:
            controller.terminate()
            controller.wait(15)
        node.stop()
        cp.stop()
    report(runs, args, rounds, capacity, contract)
    print(f"\nwhole run: {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
