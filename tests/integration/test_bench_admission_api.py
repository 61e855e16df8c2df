"""tests/bench/bench_admission_api.py at a small size, through the real API server and the
controller-manager: each row it is asked for prints (with where the slow creates waited and
how the host's cores were shared), the honest tenant's pods all get their
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
    # Each attack really ran: the tenant's dry-runs were answered through the API server and
    # reached the webhook, and the silent connections were made from 16 addresses.
    tenant, silent = printed[1], printed[3]
    answered = int(tenant.split("  ")[-1].split("/")[0].split()[-1])
    assert answered > 0, tenant
    webhook = lines[lines.index(tenant) + 1]
    answers = sum(int(kv.split("=")[1]) for kv in webhook.split(":", 1)[1].split(",")[0].split())
    assert answers > 60 + answered // 2, webhook  # the honest pods' reviews and most of the tenant's reached it
    assert "conns, 16 addr" in silent and int(silent.rsplit(" conns", 1)[0].split()[-1]) > 1000, silent
    # Each row says, from the API server's audit log, where its slow honest creates waited.
    said = [line for line in lines if "honest creates over 500 ms" in line]
    assert len(said) == len(rows), r.stdout
    assert all(" of 60 honest creates" in line for line in said), said
    # And how the host's cores were shared meanwhile, read from /proc: the parts that in a
    # cluster run apart (the webhook, the API server) and the bench's own clients.
    shared = [line for line in lines if "the host's cores while the honest pods were made" in line]
    assert len(shared) == len(rows), r.stdout
    for line in shared:
        assert all(f"{part} " in line for part in ("webhook", "kube-apiserver", "honest client")), line
    assert "attackers " in shared[1] and "attackers " not in shared[0], shared
