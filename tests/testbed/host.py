"""What the testbed starts and changes on this host, written down before it does it, so
that a run that dies (SIGKILL, an OOM kill, a crash) leaves nothing behind for long.

Every long-running process (etcd, kube-apiserver, containerd, the kubelet, kube-proxy,
Flux, Prometheus) is started with `spawn`, and every host change (a sysctl, a bridge, a
cgroup root, a work directory, the iptables chains and nft tables the node's components
add, the cAdvisor socket link) is noted with `note` before it is made. The notes of one
test process live in `/run/headroom-testbed/<pid>.json`; each part removes its own notes
as it undoes its change in the ordinary way.

Two ways a dead run is undone:
- a watchdog process, started with the first note, holds a pipe from the test process;
  when that process dies, for whatever reason, the pipe closes and the watchdog undoes
  what the notes still list (`undo`), then removes the file;
- the next run's first note, and `PYTHONPATH=tests python -m testbed.host` (documented in
  docs/development.md), undo the notes of every test process no longer alive.

`undo` kills the processes (by process group, and any process whose command line names a
work directory or that sits in a noted cgroup: containerd's shims and the pods' processes
leave the process group), unmounts what is mounted under the work directories, deletes
the pods' network namespaces (found through the veths on the node's bridge), then puts
back sysctls, chains, tables, links, cgroups and files, and removes the work directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_DIR = Path("/run/headroom-testbed")
CGROUP_V1 = Path("/sys/fs/cgroup")
IPTABLES = ("iptables", "ip6tables")
TABLES = ("mangle", "nat", "filter")

WATCHDOG = "import sys; from testbed import host; host.watch(int(sys.argv[1]))"
_lock = threading.Lock()
_state: dict[str, Any] | None = None
_watchdog: subprocess.Popen[bytes] | None = None


def _empty() -> dict[str, Any]:
    return {
        "owner": os.getpid(),
        "owner_start": _start_time(os.getpid()),
        "procs": [],  # [pid, start time]
        "workdirs": [],
        "sysctls": {},  # key: the value found
        "links": [],  # bridges
        "cgroups": [],  # cgroup roots (under every v1 hierarchy, and the cgroup2 mirror)
        "nft": [],  # [family, table]
        "chains_before": None,  # the KUBE-* chains present before the first node: [[tool, table, chain]]
        "files": [],  # links made (the cAdvisor socket)
        "dirs": [],  # directories made, removed when empty
    }


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, who it is."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _path(owner: int | None = None) -> Path:
    return STATE_DIR / f"{os.getpid() if owner is None else owner}.json"


def _write() -> None:
    assert _state is not None
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    tmp = _path().with_suffix(".tmp")
    tmp.write_text(json.dumps(_state))
    tmp.replace(_path())


def _begin() -> dict[str, Any]:
    """The ledger of this process: on first use, dead runs are undone and the watchdog starts."""
    global _state, _watchdog
    if _state is None:
        undo_dead()
        _state = _empty()
        _write()
        _watchdog = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a kill of the test's process group leaves it to clean up
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},  # tests/
        )
    return _state


def note(kind: str, value: Any) -> None:
    """Write down a change before it is made. `sysctls` takes (key, value found) and keeps
    the first value noted; `chains_before` the chain list; the others one item each."""
    with _lock:
        state = _begin()
        if kind == "sysctls":
            key, found = value
            state["sysctls"].setdefault(key, found)
        elif kind == "chains_before":
            if state["chains_before"] is None:
                state["chains_before"] = [list(c) for c in value]
        elif value not in state[kind]:
            state[kind].append(value)
        _write()


def done(kind: str, value: Any = None) -> None:
    """The change was undone the ordinary way: forget it."""
    with _lock:
        if _state is None:
            return
        if kind == "sysctls":
            _state["sysctls"].pop(value, None)
        elif kind == "chains_before":
            _state["chains_before"] = None
        elif value in _state[kind]:
            _state[kind].remove(value)
        _write()


def spawn(
    argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """A long-running testbed process in a session of its own (stopped as a group by
    `stop_process`), noted so that a dead run's watchdog or the next run stops it."""
    out = open(log, "ab")  # noqa: SIM115 - the child holds it; kept across restarts of the same log
    try:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=cwd)
    finally:
        out.close()
    note("procs", [proc.pid, _start_time(proc.pid)])
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's group, SIGKILL after 10 s; then forget it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    with _lock:
        if _state is not None:
            _state["procs"] = [p for p in _state["procs"] if p[0] != proc.pid]
            _write()


# --- the iptables chains the kubelet adds and never removes -----------------------------


def kube_chains() -> set[tuple[str, str, str]]:
    """(tool, table, chain) of every KUBE-* chain on the host."""
    found = set()
    for tool in IPTABLES:
        for table in TABLES:
            r = subprocess.run([tool, "-w", "-t", table, "-S"], capture_output=True, text=True)
            found |= {(tool, table, line[3:]) for line in r.stdout.splitlines() if line.startswith("-N KUBE-")}
    return found


def remove_chains(chains: set[tuple[str, str, str]]) -> None:
    """Each chain's jumps from other chains, then its rules, then the chain."""
    for tool, table in {(tool, table) for tool, table, _ in chains}:
        names = {chain for t, tb, chain in chains if (t, tb) == (tool, table)}
        rules = subprocess.run([tool, "-w", "-t", table, "-S"], capture_output=True, text=True).stdout
        for line in rules.splitlines():
            words = shlex.split(line)
            if words[:1] == ["-A"] and words[1] not in names and set(words) & names:
                subprocess.run([tool, "-w", "-t", table, "-D", *words[1:]], capture_output=True)
        for flag in ("-F", "-X"):
            for chain in sorted(names):
                subprocess.run([tool, "-w", "-t", table, flag, chain], capture_output=True)


# --- undoing ----------------------------------------------------------------------------


def netns_on_bridge(bridge: str) -> list[str]:
    """The named network namespaces whose veth peers hang on `bridge`: the node's pods'."""
    ids = set()
    r = subprocess.run(["ip", "-j", "-d", "link", "show", "master", bridge], capture_output=True, text=True)
    with contextlib.suppress(ValueError):
        for link in json.loads(r.stdout or "[]"):
            if "link_netnsid" in link:
                ids.add(link["link_netnsid"])
    if not ids:
        return []
    names = []
    r = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True)
    with contextlib.suppress(ValueError):
        for ns in json.loads(r.stdout or "[]"):
            if ns.get("id") in ids:
                names.append(ns["name"])
    return names


def delete_netns(names: list[str]) -> None:
    """What the CNI DEL of a pod's sandbox leaves to the runtime: its network namespace,
    and with it the pod's end of the veth pair (the host's end goes too)."""
    for name in names:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def remove_empty_tree(root: Path) -> None:
    """`root` and the directories under it, deepest first, as far as they are empty (a
    cgroup is empty once its processes are gone). Directories that vanish meanwhile (the
    runtime removing its own cgroups) are no error."""
    if not root.is_dir() or root.is_symlink():
        return
    for dirpath, _, _ in os.walk(root, topdown=False):  # errors while walking are ignored
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


RUNTIME = Path("/run/containerd")  # where containerd's shims and runc keep state, whatever its root


def sweep_runtime(workdirs: list[str]) -> None:
    """What containerd's shims and runc leave in /run/containerd once they are gone: runc's
    state of the containers of these work directories' nodes, and any shim socket nothing
    listens on any more (a dead socket is no one's)."""
    runc = RUNTIME / "runc" / "k8s.io"
    with contextlib.suppress(OSError):
        for d in list(runc.iterdir()) if runc.is_dir() else []:
            with contextlib.suppress(OSError):
                if any(w in (d / "state.json").read_text() for w in workdirs):
                    shutil.rmtree(d, ignore_errors=True)
    sockets = RUNTIME / "s"
    with contextlib.suppress(OSError):
        listening = {line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()[1:] if line.split()}
        for sock in list(sockets.iterdir()) if sockets.is_dir() else []:
            if sock.is_socket() and str(sock) not in listening:
                with contextlib.suppress(OSError):
                    sock.unlink()


def _cgroup_dirs(root: str) -> Iterator[Path]:
    for h in [*CGROUP_V1.iterdir(), CGROUP_V1 / "unified"] if CGROUP_V1.is_dir() else []:
        d = h / root.lstrip("/")
        if d.is_dir() and not d.is_symlink():
            yield d


def _kill_everything(state: dict[str, Any]) -> None:
    victims: set[int] = set()
    for pid, started in state["procs"]:
        if started is not None and _start_time(pid) == started:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            victims.add(pid)
    workdirs = [w for w in state["workdirs"] if w]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            if any(w in cmdline for w in workdirs):
                victims.add(int(proc.name))
    for root in state["cgroups"]:
        for d in _cgroup_dirs(root):
            for dirpath, _, files in os.walk(d):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError, ValueError):
                        victims |= {int(p) for p in Path(dirpath, "cgroup.procs").read_text().split()}
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in victims):
        time.sleep(0.1)


def undo(state: dict[str, Any]) -> None:
    """Put back what the notes list (see the module's docstring for the order)."""
    _kill_everything(state)
    sweep_runtime(state["workdirs"])
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for w in state["workdirs"]:
        for p in sorted((p for p in points if p.startswith(w)), key=len, reverse=True):
            subprocess.run(["umount", "-l", p], capture_output=True)
    for bridge in state["links"]:
        delete_netns(netns_on_bridge(bridge))
    for family, table in state["nft"]:
        subprocess.run(["nft", "delete", "table", family, table], capture_output=True)
    if state["chains_before"] is not None:
        remove_chains(kube_chains() - {(c[0], c[1], c[2]) for c in state["chains_before"]})
    for key, value in state["sysctls"].items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / key).write_text(value)
    for bridge in state["links"]:
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
    for root in state["cgroups"]:
        for d in _cgroup_dirs(root):
            remove_empty_tree(d)
    log_dir = Path("/var/log/containers")
    if log_dir.is_dir():
        for link in log_dir.iterdir():
            if link.is_symlink() and any(os.readlink(link).startswith(w) for w in state["workdirs"]):
                link.unlink()
    for f in state["files"]:
        if Path(f).is_symlink():
            Path(f).unlink()
    for d in sorted(state["dirs"], key=len, reverse=True):
        remove_empty_tree(Path(d))
    for w in state["workdirs"]:
        shutil.rmtree(w, ignore_errors=True)


def _alive(state: dict[str, Any]) -> bool:
    owner = state.get("owner")
    return isinstance(owner, int) and _start_time(owner) is not None and _start_time(owner) == state.get("owner_start")


def undo_dead() -> list[int]:
    """Undo the notes of every test process that is gone; the owners undone."""
    undone = []
    for path in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            state = {**_empty(), **json.loads(path.read_text())}
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if _alive(state):
            continue
        undo(state)
        path.unlink(missing_ok=True)
        undone.append(int(state.get("owner") or 0))
    return undone


def watch(owner: int) -> None:
    """The watchdog: wait for the owner's end (its pipe closes), then undo what is left."""
    with contextlib.suppress(OSError):
        sys.stdin.buffer.read()
    path = _path(owner)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _start_time(owner) is not None:
        time.sleep(0.1)  # the pipe closes a moment before the process is gone
    try:
        state = {**_empty(), **json.loads(path.read_text())}
    except (OSError, ValueError):
        return
    undo(state)
    path.unlink(missing_ok=True)


def main() -> int:
    """`python -m testbed.host`: undo what dead test runs left on this host."""
    owners = undo_dead()
    print(f"undone: what {len(owners)} dead test run(s) left ({', '.join(map(str, owners)) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
