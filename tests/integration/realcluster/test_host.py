"""The host after the testbed: as it was, whether a run ends normally, is SIGKILLed with
its watchdog left to clean up, or is SIGKILLed together with its watchdog and the next
run (or `PYTHONPATH=tests python -m testbed.host`) cleans up. Each run here is a separate
process with its own control plane and real node and one running pod (its network
namespace and veth pair exist), beside this session's cluster, which is left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed import host
from testbed.node import SYSCTLS

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import os, sys, time
from testbed import host
from testbed.controlplane import ControlPlane, build
from testbed.node import RealNode, build_node, busy_pod, running_containers
cp = ControlPlane(build())
node = RealNode(cp, build_node())
cp.start()
node.start()
api = cp.api()
api.post("/api/v1/namespaces/default/pods", busy_pod("spin", node.name, "100m", "200m"))
running_containers(api, "default", ["spin"])
print(f"ready {host._watchdog.pid}", flush=True)
if sys.argv[1] == "stop":
    node.stop()
    cp.stop()
    import json
    left = {k: v for k, v in host._state.items() if k not in ("owner", "owner_start") and v}
    print("stopped " + json.dumps(left), flush=True)
else:
    time.sleep(3600)
"""


def _host_state() -> dict[str, object]:
    """What a testbed run may change on this host, as sets and values to compare."""

    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout

    mine = str(os.getpid())
    procs = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if ("headroom-node-" in cmd or "headroom-testenv-" in cmd) and p.name != mine:
                procs.add(cmd.replace("\0", " ")[:200])
    with open("/proc/self/mounts") as f:
        mounts = {line.split()[1] for line in f if "headroom-" in line}
    return {
        "links": {line.split(":")[1].strip().split("@")[0] for line in run("ip", "-o", "link", "show").splitlines()},
        "netns": set(run("ip", "netns", "list").split()),
        "sysctls": {k: (Path("/proc/sys") / k).read_text().strip() for k in SYSCTLS},
        "chains": host.kube_chains(),
        "nft": set(run("nft", "list", "tables").splitlines()),
        "mounts": mounts,
        "cgroups": {p.name for p in Path("/sys/fs/cgroup/cpu").iterdir() if p.name.startswith("headroom-")},
        "processes": procs,
        "run-containerd": (Path("/run/containerd").exists(), Path("/run/containerd/containerd.sock").is_symlink()),
        "notes": {p.name for p in host.STATE_DIR.glob("*.json")} - {f"{mine}.json"}
        if host.STATE_DIR.is_dir()
        else set(),
    }


def _child(mode: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "controller"), str(ROOT / "tests")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready "), f"the child run did not start its node: {line!r}"
    return proc, int(line.split()[1])


def _diff(before: dict[str, object], after: dict[str, object]) -> dict[str, object]:
    return {k: (before[k], after[k]) for k in before if before[k] != after[k]}


def _settled(before: dict[str, object], timeout: float) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    while True:
        diff = _diff(before, _host_state())
        if not diff or time.monotonic() - started > timeout:
            return diff, time.monotonic() - started
        time.sleep(0.5)


def test_a_run_that_stops_normally_leaves_no_network_namespace_or_link(real_node):
    """Before: each stopped run left its pods' cni-* namespaces and veth pairs behind."""
    before = _host_state()
    proc, _ = _child("stop")
    assert proc.stdout is not None
    # every change was undone the ordinary way: no note is left for the watchdog
    assert proc.stdout.readline().strip() == "stopped {}"
    proc.wait(60)
    diff, seconds = _settled(before, 30)
    print(f"\nnormal stop: host as before {seconds:.1f} s after the run ended")
    assert not diff, json.dumps({k: [sorted(map(str, v)) for v in vs] for k, vs in diff.items()}, indent=1)[:3000]


def test_a_killed_run_is_undone_by_its_watchdog_or_else_by_the_next_run(real_node):
    """SIGKILL of the test process: its watchdog undoes everything noted (before: containerd,
    the kubelet and the pods kept running, and the sysctls, chains, bridge, mounts and
    namespaces stayed, with no later run removing them). SIGKILL of both: the documented
    command (what the next run's first note does too) undoes it."""
    before = _host_state()
    proc, _ = _child("sleep")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    diff, seconds = _settled(before, 60)
    print(f"\nkilled run: the watchdog put the host back in {seconds:.1f} s")
    assert not diff, json.dumps({k: [sorted(map(str, v)) for v in vs] for k, vs in diff.items()}, indent=1)[:3000]

    proc, watchdog = _child("sleep")
    os.kill(watchdog, signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    left = _diff(before, _host_state())
    assert left, "a run killed with its watchdog changed nothing on the host: the test proves nothing"
    print(f"killed with its watchdog: {sorted(left)} differ until cleaned")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    out = subprocess.run([sys.executable, "-m", "testbed.host"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "undone: what 1 dead test run(s) left" in out.stdout, out.stdout + out.stderr
    diff, _ = _settled(before, 10)
    assert not diff, json.dumps({k: [sorted(map(str, v)) for v in vs] for k, vs in diff.items()}, indent=1)[:3000]
