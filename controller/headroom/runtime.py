"""How the long-running processes tune the interpreter: the collector after the first sync,
and, in the webhook, how often threads hand each other the GIL."""

from __future__ import annotations

import gc
import sys

DEFAULT_GC = gc.get_threshold()

# The webhook's event loop (TLS, reading bodies, writing answers) and its decision threads
# share one GIL. At Python's default 5 ms, a thread deciding a pod of thousands of
# containers kept the loop waiting long enough that an ordinary review beside a flood of
# such pods waited 0.38-0.8 s (tests/bench/bench_admission.py, "unread answers"); at 1 ms,
# 0.25-0.28 s. An ordinary decision costs the same either way.
SWITCH_INTERVAL = 0.001


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
