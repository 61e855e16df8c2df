"""The latency comparison's mechanisms on the real node, held where they cannot flake: the
figures themselves (tests/bench/bench_latency.py, docs/performance.md) are printed, not
bounded, since they depend on what else this machine runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headroom.cluster.api import Api
from headroom.core.quantity import cpu_milli
from testbed.latency import (
    HEADROOM,
    NONE,
    Scenarios,
    build_latency,
    calibrate,
    import_service_image,
    limit_allows,
)
from testbed.node import RealNode

SECONDS = 5.0


def test_under_headroom_the_service_runs_at_its_limit_and_the_runaway_is_bounded_by_its_own(
    api: Api, real_node: RealNode, headroom_config: Callable[..., dict[str, Any]], start_controller: Any
) -> None:
    """With Headroom, the service's container quota is its raised limit, the load generator
    sees no error at 40 % of the service's capacity, and a runaway spinning four threads
    uses no more CPU over the window than its limit allows. With no limits, the same
    runaway's cgroup has no CFS quota at all (what the no-limits position gives up)."""
    bins = build_latency()
    import_service_image(real_node, bins)
    scenarios = Scenarios(api, real_node, bins, calibrate(bins, 2.0))
    headroom_config()
    start_controller()

    ns, ids = scenarios.setup(HEADROOM, runaway=True)
    try:
        run = scenarios.run(ns, ids, HEADROOM, True, 0.4, 200, SECONDS)
    finally:
        scenarios.teardown(ns)
    svc, runaway = run.pods["svc"], run.pods["runaway"]
    print(
        f"\nHeadroom + runaway at 200/s: p50 {run.latency['p50_ms']:.1f} ms, p99 {run.latency['p99_ms']:.1f} ms; "
        f"svc limit {svc.limit} ({svc.cores:.2f} cores, {svc.throttled:.0%} throttled), runaway limit "
        f"{runaway.limit} used {runaway.cpu_s:.2f} CPU s in {runaway.window_s:.1f} s; GOMAXPROCS {run.gomaxprocs}"
    )
    assert cpu_milli(svc.limit) > 500 and svc.quota_us == cpu_milli(svc.limit) * 100  # raised, and in the kernel
    assert run.latency["errors"] == 0 and run.latency["ok"] == run.latency["sent"]
    assert runaway.quota_us == cpu_milli(runaway.limit) * 100
    assert runaway.cpu_s <= limit_allows(runaway), (runaway.cpu_s, limit_allows(runaway))

    ns, ids = scenarios.setup(NONE, runaway=True)
    try:
        loose = scenarios.run(ns, ids, NONE, True, 0.4, 200, SECONDS)
    finally:
        scenarios.teardown(ns)
    print(f"no limits: the runaway used {loose.pods['runaway'].cores:.2f} cores, p99 {loose.latency['p99_ms']:.1f} ms")
    assert loose.pods["runaway"].limit == "none" and loose.pods["runaway"].quota_us == -1
