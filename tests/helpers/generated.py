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
