"""The latency comparison's mechanisms on the real node, held where they can fail: the
figures themselves (tests/bench/bench_latency.py, docs/performance.md) are printed, not
bounded, since they depend on what else this machine runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headroom.cluster.client import Api
from headroom.core.quantity import cpu_milli
from testbed.latency import (
    HEADROOM,
    NONE,
    REACH,
    Run,
    Scenarios,
    build_latency,
    calibrate,
    import_service_image,
    limit_allows,
)
from testbed.node import RealNode

SECONDS = 5.0
COST_MS = 2.0
LIGHT = 0.1  # of what the service serves with one whole CPU: the node otherwise idle


def _reach(scenarios: Scenarios, policy: str) -> Run:
    ns, ids = scenarios.setup(policy, REACH)
    try:
        return scenarios.run(ns, ids, policy, REACH.name, LIGHT, LIGHT * 1000 / COST_MS, SECONDS)
    finally:
        scenarios.teardown(ns)


def test_a_runaway_is_held_at_its_headroom_limit_and_takes_more_without_one(
    api: Api, real_node: RealNode, headroom_config: Callable[..., dict[str, Any]], start_controller: Any
) -> None:
    """A runaway spinning four threads beside a lightly loaded service, where nothing but its
    own limit can hold it. Under Headroom its limit binds: the limit is the quota in the
    kernel, the kernel throttles it (in its container's cgroup or its pod's), and it never
    uses more than that quota allows. With no limits nothing holds it: no quota, never
    throttled. How much CPU each gets depends on what else the machine runs (a loaded CI
    host gave the limited one 0.79 of its 0.92 cores and the free one 0.70): printed, not
    bounded."""
    bins = build_latency()
    import_service_image(real_node, bins)
    scenarios = Scenarios(api, real_node, bins, calibrate(bins, COST_MS))
    headroom_config()
    start_controller()

    held = _reach(scenarios, HEADROOM)
    runaway = held.pods["runaway"]
    loose = _reach(scenarios, NONE)
    free = loose.pods["runaway"]
    print(
        f"\nrunaway's reach, svc at {LIGHT:.0%}: Headroom limit {runaway.limit}, used {runaway.cores:.2f} cores, "
        f"{runaway.throttled:.0%} of periods throttled (svc p99 {held.latency['p99_ms']:.1f} ms); no limits: "
        f"{free.cores:.2f} cores (svc p99 {loose.latency['p99_ms']:.1f} ms); host busy {held.busy:.0%} / {loose.busy:.0%}"
    )
    assert runaway.quota_us == cpu_milli(runaway.limit) * 100  # the limit is in the kernel
    assert runaway.throttled > 0, runaway  # and binds: the kernel held it at the quota
    assert runaway.cpu_s <= limit_allows(runaway), runaway  # never past it
    assert free.limit == "none" and free.quota_us == -1
    assert free.throttled == 0, free  # without a limit nothing holds it
