"""How the long-running processes tune the interpreter: the collector after the first sync,
and, in the webhook, how often threads hand each other the GIL."""

from __future__ import annotations

import gc
import sys

DEFAULT_GC = gc.get_threshold()

# The webhook's event loop (TLS, reading bodies, writing answers) and its decision threads
# share one GIL. The loop makes a system call for every accept, read, write and close, and
# gives the GIL up for each: it then waits up to a switch interval to get it back from a
# thread deciding a costly pod. At Python's default 5 ms an ordinary review beside a flood of
# 17,000-container pods waited 0.38-0.8 s (tests/bench/bench_admission.py, "unread answers");
# at 1 ms, 0.25-0.28 s. With every attack at once through the real API server (a costly
# tenant on one decision worker, 20,000+ connections refused and 250 MiB of direct posters'
# bodies: tests/bench/bench_admission_api.py), the honest tenant's creates took p50 4.7 s at
# 1 ms, 0.71 s at 0.2 ms and 0.55 s at 0.05 ms (one run each). An ordinary decision costs
# about the same either way.
SWITCH_INTERVAL = 0.00005  # 50 µs


def tune_gc() -> None:
    """After the first sync: move everything alive (the cache, the modules) out of the
    collector's sight, and collect the young generation less often. The watch path makes
    no reference cycles worth chasing every 700 allocations; full collections no longer walk
    a cache of a hundred thousand records. (Measured by tests/bench/bench_controller.py and,
    for the webhook, tests/bench/bench_admission.py.)"""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def share_the_gil() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL)
