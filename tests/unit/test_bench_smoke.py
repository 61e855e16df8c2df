"""The benchmarks keep running as the code changes (figures are not asserted here)."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_controller.py"


def test_benchmark_runs_at_small_size():
    r = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for heading in ("memory per cached pod", "watch stream ingest", "policy"):
        assert heading in r.stdout
    assert "decisions/s" in r.stdout and "events of" in r.stdout


def test_startup_benchmark_runs_the_real_process_at_small_size():
    bench = BENCH.parent / "bench_startup.py"
    args = ["--pods", "2000", "--nodes", "50", "--settle", "1"]
    r = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (
        "headroom run, WatchList stream: synced in" in r.stdout
        and "paginated list: synced in" in r.stdout
        and "less peak memory" in r.stdout
    )
