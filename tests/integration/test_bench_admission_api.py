"""tests/bench/bench_admission_api.py at a small size, through the real API server and the
controller-manager: each row it is asked for prints, the honest tenant's pods all get their
limit at admission when no one attacks, and a ReplicaSet's 64 pods, made in the
controller-manager's slow-start batches, are all decided with theirs. (The figures
themselves are printed, and a full run is in docs/performance.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_admission_api.py"


def test_the_admission_benchmark_through_the_api_server_runs_at_small_size():
    rows = ["baseline", "16 SAs in 8 ns", "0 -> 64", "silent"]
    args = ["--nodes", "200", "--profiles", "4", "--seconds", "3"]
    for row in rows:
        args += ["--row", row]
    r = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=900)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    printed = [
        line for line in lines if any(line.startswith(name) for name in ("baseline", "dry-run", "Replica", "direct"))
    ]
    assert [line.split()[0] for line in printed] == ["baseline", "dry-run", "ReplicaSet", "direct:"], r.stdout
    given, total = printed[0].split()[3].split("/")
    assert given == total and int(total) == 60, printed[0]  # 3 s at 20 pods a second, every one given its limit
    assert "ReplicaSet: 64/64 pods given their limit" in r.stdout, r.stdout
