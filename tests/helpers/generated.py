"""Property tests whose cases may stop early (an input refused, a draw that does not
apply): run them counting the cases that went the whole way, so a strategy that stops
feeding the code under test fails instead of passing on nothing."""

from __future__ import annotations

from typing import Any


def run_counting(case: Any) -> int:
    """Runs the hypothesis test `case(reached, ...)`, which appends to `reached` once it
    is past its early returns; prints and returns how many cases did."""
    reached: list[Any] = []
    case(reached=reached)
    print(f"\n{case.__name__}: {len(reached)} generated cases went the whole way")
    return len(reached)


def split_pod(victim: Any, k: int) -> list[Any] | None:
    """`victim`'s CPU requests as `k` one-container pods of the same total (the same memory
    shape, Burstable), or None when a part would be empty."""
    from headroom.core.records import pod_from_dict
    from helpers.factories import container, pod

    total = sum(c.cpu_request for c in victim.containers)
    share = total // k
    parts = [share] * (k - 1) + [total - share * (k - 1)]
    if min(parts) <= 0:
        return None
    return [
        pod_from_dict(pod(f"split{i}", containers=[container(cpu=f"{r}m", mem="1Gi", mem_limit="2Gi")]))
        for i, r in enumerate(parts)
    ]
