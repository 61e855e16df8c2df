"""The benchmarks that need a control plane or a real node keep running as the code changes:
each at its smallest size, as its own process, the way it is run by hand. The figures are
printed, not bounded (they depend on what else the machine runs); what is asserted is that
every phase ran and printed what a reader of the benchmark looks for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _run(script: str, *args: str, timeout: float = 600) -> str:
    r = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=timeout)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_the_cluster_benchmark_converges_a_small_cluster_through_the_real_api_server(tmp_path):
    out = _run(
        "bench_cluster.py",
        *("--nodes", "3", "--pods-per-node", "4", "--subjects", "headroom"),
        *("--churn-rates", "4", "--churn-pods", "12", "--settle", "20", "--timeout", "120"),
        *("--workdir", str(tmp_path)),
    )
    # The real `headroom run` converged the cluster, then followed the churn.
    assert "--- headroom: 3 nodes x 4 pods" in out
    summary = out.split("=== summary (same run, same machine) ===", 1)[1]
    assert "headroom: 12 pods converged in " in summary and "not converged" not in summary, summary
    assert "churn 4/s: 12 created" in summary and "peak RSS" in summary, summary


def test_the_realnode_benchmark_measures_its_three_phases_in_the_kernel():
    out = _run("bench_realnode.py", "--pods", "1", "--window", "2")
    for phase in ("1. static limits, no Headroom", "2. Headroom, idle node", "3. Headroom, the node filled"):
        assert phase in out, out
    assert "the busy pods' cgroups cut" in out, out


def test_the_latency_benchmark_runs_a_row_on_the_real_node():
    out = _run("bench_latency.py", "--repeats", "1", "--seconds", "2", "--rows", "reach")
    assert "svc's demand at 80 % beside batch, no limits:" in out, out
    ran = [line for line in out.splitlines() if line.strip().startswith("repeat 1: ")]
    assert ran and all("p99" in line for line in ran), out
    assert "whole run:" in out
