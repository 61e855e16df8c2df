"""The benchmarks keep running as the code changes (figures are not asserted here)."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_controller.py"


def test_benchmark_runs_at_small_size():
    r = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for heading in ("memory per cached pod", "watch stream ingest", "policy"):
        assert heading in r.stdout
    assert "decisions/s" in r.stdout and "events of" in r.stdout and "with tenants" in r.stdout


def test_startup_benchmark_runs_the_real_process_at_small_size():
    bench = BENCH.parent / "bench_startup.py"
    tree = str(BENCH.parents[2] / "controller")  # as another checkout's tree is given
    args = ["--pods", "2000", "--nodes", "50", "--settle", "1", "--baseline", tree]
    r = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (
        "headroom run, WatchList stream: synced in" in r.stdout
        and f"headroom run, WatchList stream, {tree}: synced in" in r.stdout
        and "paginated list: synced in" in r.stdout
        and "less peak memory" in r.stdout
    )


def test_metrics_benchmark_runs_at_small_size_and_the_default_scrape_has_no_per_pod_series():
    bench = BENCH.parent / "bench_metrics.py"
    r = subprocess.run(
        [sys.executable, str(bench), "--pods", "600", "--nodes", "20"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = {
        line.split()[0]: line.split() for line in r.stdout.splitlines() if line.startswith(("--pod-metrics", "default"))
    }
    # 20 nodes: 2 node series each (none per tenant without tenancy), plus the global ones
    # (under 70: counters by outcome and by cause, histograms' buckets); per-pod series only
    # with --pod-metrics
    assert int(rows["default"][1].replace(",", "")) < 2 * 20 + 70, r.stdout
    assert int(rows["--pod-metrics"][2].replace(",", "")) >= 1200, r.stdout  # 600 pods x 2 containers


def test_wave_benchmark_converges_a_small_cluster_whose_pods_have_limits():
    """The real `headroom run` against the fake API server with writes and the kubelet
    echo: every pod reaches the policy's target and the figures are printed."""
    bench = BENCH.parent / "bench_wave.py"
    args = ["--pods", "600", "--nodes", "20", "--until-converged", "--quiet", "5", "--scrape", "5"]
    r = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "pods the policy would still change: 0" in r.stdout, r.stdout[-2000:]
    assert "pod writes per pod resized:" in r.stdout and "peak RSS over the wave" in r.stdout


def test_admission_benchmark_runs_at_small_size():
    bench = BENCH.parent / "bench_admission.py"
    args = ["--nodes", "200", "--decisions", "20", "--window", "1", "--attack", "costly", "--attack", "unread"]
    r = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["20"], ["100"])]
    assert [(row[0], row[1]) for row in rows] == [
        ("20", "baseline"),
        ("20", "cached"),
        ("100", "baseline"),
        ("100", "cached"),
    ]
    assert "peak RSS" in r.stdout
    # Part 2: the real server beside the attacks asked for, after its baseline row.
    attacked = [
        line.split()[0] for line in r.stdout.splitlines() if line.split()[1:2] in (["(no"], ["costly"], ["2.9"])
    ]
    assert attacked == ["baseline", "small", "unread"], r.stdout


def test_request_benchmark_runs_at_small_size():
    r = subprocess.run(
        [sys.executable, str(BENCH.parent / "bench_requests.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "headroom Api request:" in r.stdout and "(baseline):" in r.stdout


def test_the_admission_benchmarks_breakdown_reads_the_api_servers_audit_annotations(tmp_path):
    """The shape of an honest create over 500 ms as the 1.37 API server wrote it into the
    bench's audit log (its keys and Go durations), beside a fast one and another user's."""
    sys.path.insert(0, str(BENCH.parent))
    from bench_admission_api import HONEST_USER, Breakdown

    def event(user: str, notes: dict[str, str], uri: str = "/api/v1/namespaces/honest/pods") -> str:
        return json.dumps(
            {
                "verb": "create",
                "requestURI": uri,
                "user": {"username": "admin"},
                "impersonatedUser": {"username": user},
                "annotations": {**notes, "authorization.k8s.io/decision": "allow"},
            }
        )

    slow = {
        "apiserver.latency.k8s.io/apf-queue-wait": "505.2ms",
        "apiserver.latency.k8s.io/mutating-webhook": "1.361s",
        "apiserver.latency.k8s.io/total": "1.869s",
        "apiserver.latency.k8s.io/authorization": "12µs",
    }
    log = tmp_path / "audit.log"
    lines = [
        event(HONEST_USER, slow),
        event(HONEST_USER, {}),
        event(HONEST_USER, slow, uri="/api/v1/namespaces/honest/pods?dryRun=All"),
        event("system:serviceaccount:kube-system:replicaset-controller", slow),
    ]
    log.write_text("\n".join(lines) + "\n" + lines[0][:40])  # the last line still being written
    b = Breakdown(log)
    assert b.row() == (
        "the API server on its 1 of 2 honest creates over 500 ms (mean / max): queued by API Priority and "
        "Fairness 505 / 505 ms, the webhook call 1361 / 1361 ms, in all 1869 / 1869 ms"
    )

    def finish_the_line() -> None:
        time.sleep(0.3)
        with log.open("a") as f:
            f.write(lines[0][40:] + "\n")

    writer = threading.Thread(target=finish_the_line)
    writer.start()
    # A row waits for the creates it made: the rest of that line, read once it is written.
    assert b.row(expected=1).startswith("the API server on its 1 of 1 honest creates")
    writer.join()
    assert b.row() == "the API server: none of 0 honest creates over 500 ms"
    assert b.row(expected=1, wait=0.2) == "the API server: none of 0 honest creates over 500 ms"  # gives up


def test_the_hosts_split_counts_a_renamed_process_by_what_it_used_meanwhile():
    """A kernel worker renames itself after the work it does: counted whole, its lifetime's
    CPU put 0.37 cores too many on a 2-core host in a 10 s window. A process is known by its
    pid and start; a pid taken by a new process is counted whole, an ended one not at all."""
    sys.path.insert(0, str(BENCH.parent))
    from procstat import Sample, cpu_split

    before = {
        1: Sample("kworker/u8:1-events", 5000.0, 10),
        2: Sample("python", 100.0, 20),
        3: Sample("etcd", 50.0, 30),
        4: Sample("gone", 9.0, 40),
    }
    after = {
        1: Sample("kworker/u8:1-kvfree_rcu_reclaim", 5000.5, 10),  # renamed: 0.5 s meanwhile
        2: Sample("python", 101.0, 20),
        3: Sample("sh", 2.0, 35),  # pid 3 ended, and a new process took its number
        5: Sample("new", 1.5, 50),
    }
    split = cpu_split(before, after, 10.0)
    assert split == {"kworker/u8:1-kvfree_rcu_reclaim": 0.05, "python": 0.1, "sh": 0.2, "new": 0.15}
