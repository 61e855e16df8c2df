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
import json, os, sys, time
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
mine = {
    "watchdog": host._watchdog.pid,
    "workdirs": [str(cp.workdir), str(node.workdir)],
    "bridge": node.bridge,
    "netns": host.netns_on_bridge(node.bridge),
    "cgroup": node.cgroup_root,
    "notes": str(host._path()),
}
print("ready " + json.dumps(mine), flush=True)
if sys.argv[1] == "stop":
    node.stop()
    cp.stop()
    left = {k: v for k, v in host._state.items() if k not in ("owner", "owner_start") and v}
    print("stopped " + json.dumps(left), flush=True)
else:
    time.sleep(3600)
"""


def _shared() -> dict[str, object]:
    """What every run shares on this host: it must read the same after a run as before."""

    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout

    return {
        "sysctls": {k: (Path("/proc/sys") / k).read_text().strip() for k in SYSCTLS},
        "chains": host.kube_chains(),
        "nft": set(run("nft", "list", "tables").splitlines()),
        "run-containerd": (Path("/run/containerd").exists(), Path("/run/containerd/containerd.sock").is_symlink()),
    }


def _left(mine: dict[str, object]) -> dict[str, object]:
    """What of the child run's own is still on the host (this session's cluster, which runs
    and changes beside it, is not looked at)."""
    workdirs = [str(w) for w in mine["workdirs"]]  # type: ignore[attr-defined]
    procs = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(w in cmd for w in workdirs):
                procs.append(cmd.replace("\0", " ")[:160])
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f if any(w in line for w in workdirs)]
    links = subprocess.run(["ip", "-o", "link", "show", str(mine["bridge"])], capture_output=True, text=True).stdout
    netns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    runc = Path("/run/containerd/runc/k8s.io")
    states = []
    for d in runc.iterdir() if runc.is_dir() else []:
        try:
            if any(w in (d / "state.json").read_text() for w in workdirs):
                states.append(d.name)
        except OSError:
            continue
    left = {
        "runc state": states,  # the shims' and runc's own, which a killed run never deletes
        "processes": procs,
        "mounts": mounts,
        "workdirs": [w for w in workdirs if Path(w).exists()],
        "bridge": links.strip(),
        "netns": sorted(set(mine["netns"]) & netns),  # type: ignore[call-overload]
        "cgroup": (Path("/sys/fs/cgroup/cpu") / str(mine["cgroup"]).lstrip("/")).exists(),
        "notes": Path(str(mine["notes"])).exists(),
        "watchdog": Path(f"/proc/{mine['watchdog']}").exists(),
    }
    return {k: v for k, v in left.items() if v}


def _child(mode: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "controller"), str(ROOT / "tests")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready "), f"the child run did not start its node: {line!r}"
    mine = json.loads(line.split(" ", 1)[1])
    assert mine["netns"], "the child's pod has no network namespace on its bridge: the test proves nothing"
    return proc, mine


def _settled(mine: dict[str, object], timeout: float) -> tuple[dict[str, object], float]:
    started = time.monotonic()
    while True:
        left = _left(mine)
        if not left or time.monotonic() - started > timeout:
            return left, time.monotonic() - started
        time.sleep(0.5)


def test_a_run_that_stops_normally_leaves_no_network_namespace_or_link(real_node):
    """Before: each stopped run left its pods' cni-* namespaces and veth pairs behind."""
    before = _shared()
    proc, mine = _child("stop")
    assert proc.stdout is not None
    # every change was undone the ordinary way: no note is left for the watchdog
    assert proc.stdout.readline().strip() == "stopped {}"
    proc.wait(60)
    left, seconds = _settled(mine, 30)
    print(f"\nnormal stop: nothing of the run left {seconds:.1f} s after it ended")
    assert not left, left
    assert _shared() == before


def test_a_killed_run_is_undone_by_its_watchdog_or_else_by_the_next_run(real_node):
    """SIGKILL of the test process: its watchdog undoes everything noted (before: containerd,
    the kubelet and the pods kept running, and the sysctls, chains, bridge, mounts and
    namespaces stayed, with no later run removing them). SIGKILL of both: the documented
    command (what the next run's first note does too) undoes it."""
    before = _shared()
    proc, mine = _child("sleep")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    left, seconds = _settled(mine, 60)
    print(f"\nkilled run: the watchdog put the host back in {seconds:.1f} s")
    assert not left, left
    assert _shared() == before

    proc, mine = _child("sleep")
    os.kill(int(mine["watchdog"]), signal.SIGKILL)  # type: ignore[call-overload]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    left = _left(mine)
    assert {"processes", "workdirs", "bridge", "netns", "notes", "runc state"} <= set(left), left
    print(f"killed with its watchdog: {sorted(left)} left until cleaned")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    out = subprocess.run([sys.executable, "-m", "testbed.host"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "undone: what 1 dead test run(s) left" in out.stdout, out.stdout + out.stderr
    left, _ = _settled(mine, 10)
    assert not left, left
    assert _shared() == before
