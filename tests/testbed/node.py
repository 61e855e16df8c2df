"""A real Kubernetes node on this machine: containerd + runc + CNI + the kubelet, beside a
`ControlPlane`, for the tests and `make demo`.

Everything it needs from the host is changed only for as long as it runs, and put back
as it was found when it stops (also from `atexit`; and, should the process die, by the
watchdog or the next run, from the notes `testbed/host.py` keeps of every change):

- the sysctls the kubelet insists on (`vm.overcommit_memory=1`, `kernel.panic=10`,
  `kernel.panic_on_oops=1`) are read when the first node starts and written back when
  the last one stops;
- the pods' network namespaces (and so their veth pairs) are deleted once their
  sandboxes are stopped, as the runtime does after a CNI DEL;
- the kubelet's own cgroup root, in every cgroup v1 hierarchy, is created and removed
  (with the copy the kubelet makes in the cgroup2 hierarchy);
- the CNI bridge (its own name) is deleted; IPAM state, containerd's root and state, the
  kubelet's root and the pod logs live in the node's work directory;
- the kubelet's links in `/var/log/containers` are removed, and the directory, which the
  kubelet always creates, too if it was not there;
- the iptables chains the kubelet adds in both address families and never removes
  (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`, and `KUBE-FIREWALL` with its jumps from
  INPUT and OUTPUT, which drops non-loopback packets to 127.0.0.0/8) are removed when the
  last node of the process stops, those that were on the host before left alone.

No registry is needed: images are OCI archives written locally (`testbed/images.py`) and
imported with `ctr`; pods use `imagePullPolicy: Never`. Linux and root only, with a cgroup
v1 `cpu` controller (`RealNode.unavailable` says why not elsewhere).

Facts this relies on, measured on this kind of machine: the kubelet needs
`failCgroupV1: false` and `cgroupDriver: cgroupfs` on a v1 host; root here lacks
CAP_SYS_RESOURCE, so containerd's CRI must set `restrict_oom_score_adj` or every sandbox
fails (runc cannot lower `oom_score_adj`).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headroom.cluster.client import ApiError
from headroom.core.quantity import cpu_milli

from . import host
from .controlplane import ControlPlane, ControlPlaneError, build_quietly, free_port
from .images import Entry, busybox_entries, write_image

CGROUP_V1 = Path("/sys/fs/cgroup")
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
PAUSE_IMAGE = "headroom.local/pause:1"
BUSYBOX_IMAGE = "headroom.local/busybox:1"
RUNC = Path("/usr/sbin/runc")
CNI_BIN = Path("/usr/lib/cni")
BUSYBOX = Path("/bin/busybox")
DEBIAN_PACKAGES = "runc containernetworking-plugins busybox-static"
_host_lock = threading.Lock()
_nodes_running = 0
_chains_before: set[tuple[str, str, str]] = set()
_sysctls: dict[str, str] = {}


def _node_started() -> None:
    """The first node of this process: the KUBE-* chains and the sysctls as found."""
    global _nodes_running, _chains_before
    with _host_lock:
        if _nodes_running == 0:
            _chains_before = host.kube_chains()
            host.note("chains_before", sorted(_chains_before))
            for key in SYSCTLS:
                _sysctls[key] = (Path("/proc/sys") / key).read_text().strip()
                host.note("sysctls", (key, _sysctls[key]))
        _nodes_running += 1


def _node_stopped() -> None:
    """The last node of this process: the chains its kubelets added go, the sysctls come back."""
    global _nodes_running
    with _host_lock:
        _nodes_running -= 1
        if _nodes_running == 0:
            host.remove_chains(host.kube_chains() - _chains_before)
            host.done("chains_before")
            for key, value in _sysctls.items():
                with contextlib.suppress(OSError):
                    (Path("/proc/sys") / key).write_text(value)
                host.done("sysctls", key)
            _sysctls.clear()


CADVISOR_CONTAINERD = Path("/run/containerd/containerd.sock")

# Each node of this machine gets its own pod subnet (10.244.N.0/24) on its own bridge; the
# bridges have no address and no route, so pods stay on this machine.
_SUBNETS = itertools.count(77)


def _routed() -> set[str]:
    """The IPv4 destinations the host routes now (/proc/net/route: hex, little-endian)."""
    out = set()
    for line in Path("/proc/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 1:
            out.add(socket.inet_ntoa(int(fields[1], 16).to_bytes(4, "little")))
    return out


def _free_subnet() -> str:
    """The next 10.244.N.0/24 no bridge of this machine routes yet: another process's nodes
    (the demo's, a benchmark's) count from the same start, and a second bridge with the
    same subnet sends the host's packets for one node's pods to the other's."""
    taken = _routed()
    while True:
        subnet = f"10.244.{next(_SUBNETS)}.0"
        if subnet not in taken:
            return subnet + "/24"


def build_node() -> Path:
    """Build (or reuse) the node's binaries; the directory holding them."""
    return build_quietly("realnode", "the real node")


def unavailable() -> str | None:
    """Why this machine cannot run a real node; None when it can."""
    if os.uname().sysname != "Linux":
        return "a real node needs Linux"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc and the kubelet manage cgroups and mounts)"
    if not (CGROUP_V1 / "cpu" / "cpu.cfs_quota_us").exists():
        return "a real node here needs the cgroup v1 cpu controller at /sys/fs/cgroup/cpu"
    missing = [str(p) for p in (RUNC, CNI_BIN / "bridge", BUSYBOX) if not p.exists()]
    if missing:
        return f"missing {', '.join(missing)}: apt-get install {DEBIAN_PACKAGES}"
    return None


def _hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies the kubelet uses (each must hold its cgroup root)."""
    names = ("cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices", "freezer", "hugetlb", "systemd")
    return [CGROUP_V1 / n for n in names if (CGROUP_V1 / n).is_dir() and not (CGROUP_V1 / n).is_symlink()]


@dataclass(frozen=True, slots=True)
class CpuCounters:
    """A container's CPU counters at one moment, from its cgroup and its pod's. The kubelet
    gives the pod's cgroup the sum of its containers' quotas, so for a pod of one container
    both hold the same quota, and the kernel counts the throttling on whichever of the two
    runs out first: the pod's alone in some runs (0 % in the container's at exactly its
    quota). Throttling here is the larger of the two."""

    at: float  # monotonic seconds
    periods: int  # CFS periods with the container runnable (cpu.stat nr_periods)
    throttled: int  # of those, periods it was throttled in (nr_throttled)
    throttled_ns: int  # time it was throttled (throttled_time)
    usage_ns: int  # CPU time it used (cpuacct.usage)
    quota_us: int  # cpu.cfs_quota_us now (-1: no limit)
    pod_periods: int = 0  # the same three of the pod's cgroup
    pod_throttled: int = 0
    pod_throttled_ns: int = 0

    def since(self, before: CpuCounters) -> tuple[float, float, float]:
        """(share of CFS periods throttled, throttled seconds per second, cores used)
        between `before` and this reading; throttling the larger of the container's and
        its pod's."""
        seconds = self.at - before.at

        def share(periods: int, throttled: int) -> float:
            return throttled / periods if periods else 0.0

        return (
            max(
                share(self.periods - before.periods, self.throttled - before.throttled),
                share(self.pod_periods - before.pod_periods, self.pod_throttled - before.pod_throttled),
            ),
            max(self.throttled_ns - before.throttled_ns, self.pod_throttled_ns - before.pod_throttled_ns)
            / 1e9
            / seconds,
            (self.usage_ns - before.usage_ns) / 1e9 / seconds,
        )


def kubelet_config(ca_file: str, runtime_socket: str, port: int, cpu_reserved: str, **more: Any) -> dict[str, Any]:
    """The KubeletConfiguration every test node runs (the cgroupfs driver, webhook authn and
    authz against the tests' CA, `cpu_reserved` for the system, fast status), with `more`."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failSwapOn": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": ca_file},
        },
        "authorization": {"mode": "Webhook"},
        "readOnlyPort": 0,
        "port": port,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "systemReserved": {"cpu": cpu_reserved},
        "enforceNodeAllocatable": ["pods"],
        "resolvConf": "",
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
        "shutdownGracePeriod": "0s",
        **more,
    }


def busy_pod(
    name: str, node: str | None, request: str, limit: str | None, busy: bool = True, image: str = BUSYBOX_IMAGE
) -> dict[str, Any]:
    """A pod of one container that spins one thread forever (a CPU-hungry tenant), or
    sleeps; with the CPU request and limit given (no limit: None)."""
    resources: dict[str, Any] = {"requests": {"cpu": request, "memory": "16Mi"}, "limits": {"memory": "64Mi"}}
    if limit is not None:
        resources["limits"]["cpu"] = limit
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "app",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "while :; do :; done"] if busy else ["sleep", "36000"],
                "resources": resources,
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def running_containers(api: Any, namespace: str, names: list[str], timeout: float = 90) -> dict[str, str]:
    """name -> containerID once every named pod's first container runs."""
    deadline = time.monotonic() + timeout
    while True:
        ids = {}
        for n in names:
            statuses = api.get(f"/api/v1/namespaces/{namespace}/pods/{n}")["status"].get("containerStatuses") or []
            if statuses and statuses[0].get("state", {}).get("running"):
                ids[n] = statuses[0]["containerID"]
        if len(ids) == len(names):
            return ids
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"pods not running after {timeout:.0f}s: {sorted(set(names) - set(ids))}")
        time.sleep(0.3)


@dataclass
class RealNode:
    control_plane: ControlPlane
    bin_dir: Path
    name: str = field(default_factory=lambda: f"real-{uuid.uuid4().hex[:6]}")
    cpu_reserved: str = "0"  # systemReserved cpu: allocatable is the machine's CPUs less this
    labels: dict[str, str] = field(default_factory=dict)  # the kubelet's --node-labels
    subnet: str = field(default_factory=_free_subnet)
    # Pods reach Services: the bridge is their gateway and kube-proxy (nftables mode) runs.
    # The control plane's `pod_gateway` must be this node's `gateway`.
    service_network: bool = False
    # The host reaches the pods' IPs (the bridge gets the gateway address, and so a route to
    # the subnet), without Services: the latency benchmark's load comes from the host.
    host_reaches_pods: bool = False
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="headroom-node-")))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # by name, in start order
    _counted: bool = False  # counted in _nodes_running
    _made_log_dir: bool = False
    _cadvisor_link: bool = False  # this node's containerd is the one the kubelet's cAdvisor reads
    _cadvisor_dir: bool = False  # this node made /run/containerd for that link
    _ports: tuple[int, int] = (0, 0)  # the kubelet's API and healthz ports, kept across restarts
    startup_seconds: float = 0.0

    @property
    def cgroup_root(self) -> str:
        return f"/headroom-{self.name}"

    @property
    def bridge(self) -> str:
        return f"hr{self.name[-6:]}"

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    # --- host changes, each undone by stop() ---------------------------------------------
    def _prepare_host(self) -> None:
        host.note("workdirs", str(self.workdir))
        host.note("cgroups", self.cgroup_root)
        host.note("links", self.bridge)  # made by the CNI bridge plugin at the first pod, or below
        for h in _hierarchies():
            d = h / self.cgroup_root.lstrip("/")
            d.mkdir(exist_ok=True)
            if h.name == "cpuset":  # a new cpuset has no CPUs or memory nodes until given its parent's
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((h / f).read_text())
        log_dir = Path("/var/log/containers")
        self._made_log_dir = not log_dir.exists()
        if self._made_log_dir:
            host.note("dirs", str(log_dir))
        if self.service_network:
            for family in ("ip", "ip6"):
                host.note("nft", [family, "kube-proxy"])
        if self.service_network or self.host_reaches_pods:
            # The bridge and its gateway address exist before the kubelet starts, so the
            # gateway can be its --node-ip: a loopback node IP fails the kubelet's check,
            # leaving the Node without addresses and kube-proxy waiting 30 s for one. The
            # CNI bridge plugin takes the bridge as it finds it (deleted in _restore_host).
            for args in (
                ["link", "add", self.bridge, "type", "bridge"],
                ["addr", "add", f"{self.gateway}/{self.subnet.rsplit('/', 1)[1]}", "dev", self.bridge],
                ["link", "set", self.bridge, "up"],
            ):
                subprocess.run(["ip", *args], check=True, capture_output=True)

    def _restore_host(self) -> None:
        for h in [*_hierarchies(), CGROUP_V1 / "unified"]:  # the kubelet mirrors its tree in cgroup2 too
            host.remove_empty_tree(h / self.cgroup_root.lstrip("/"))
        # The pods' network namespaces (the runtime's part of a sandbox's CNI DEL), then the bridge.
        host.delete_netns(host.netns_on_bridge(self.bridge))
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        host.done("links", self.bridge)
        host.done("cgroups", self.cgroup_root)
        log_dir = Path("/var/log/containers")
        if log_dir.is_dir():  # the kubelet's links to this node's container logs
            for link in log_dir.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(str(self.workdir)):
                    link.unlink()
        if self._made_log_dir and log_dir.is_dir() and not any(log_dir.iterdir()):
            with contextlib.suppress(OSError):
                log_dir.rmdir()
            host.done("dirs", str(log_dir))

    # --- configuration ------------------------------------------------------------------
    def _containerd_config(self) -> Path:
        w = self.workdir / "containerd"
        (self.workdir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (self.workdir / "cni" / "net.d" / "10-headroom.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "headroom",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": self.bridge,
                            # With a Service network: the host side of the bridge is the
                            # pods' gateway (the API server's address for them, via kube-proxy).
                            "isGateway": self.service_network,
                            "isDefaultGateway": self.service_network,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": self.subnet}]],
                                "dataDir": str(self.workdir / "cni" / "ipam"),
                            },
                        },
                        {"type": "loopback"},
                    ],
                }
            )
        )
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        images = "plugins.'io.containerd.cri.v1.images'"
        text = f"""version = 3
root = "{w / "root"}"
state = "{w / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{w / "ttrpc.sock"}"
[{runtime}]
  restrict_oom_score_adj = true
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  SystemdCgroup = false
[{runtime}.cni]
  bin_dirs = ["{CNI_BIN}"]
  conf_dir = "{self.workdir / "cni" / "net.d"}"
[{images}.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""
        path = w / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _kubelet_config(self, port: int, healthz: int) -> Path:
        w = self.workdir / "kubelet"
        w.mkdir(parents=True, exist_ok=True)
        cfg = kubelet_config(
            str(self.control_plane.ca_file),
            str(self.socket),
            port,
            self.cpu_reserved,
            failCgroupV1=False,  # this machine mounts cgroup v1: a setting of the tests' v1 node only
            cgroupRoot=self.cgroup_root,
            healthzPort=healthz,
            healthzBindAddress="127.0.0.1",
            address="127.0.0.1",
            volumePluginDir=str(w / "volume-plugins"),
            podLogsDir=str(self.workdir / "pod-logs"),
            serializeImagePulls=False,
        )
        path = w / "config.yaml"
        path.write_text(json.dumps(cfg))
        return path

    def _kubeconfig(self) -> Path:
        """The kubelet's identity: a client certificate for system:node:<name>."""
        cp = self.control_plane
        crt, key = cp.ca.issue(
            self.workdir, "kubelet-client", [], common_name=f"system:node:{self.name}", organization="system:nodes"
        )
        path = self.workdir / "kubelet.kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: c\n  cluster:\n    server: {cp.url}\n    certificate-authority: {cp.ca_file}\n"
            f"users:\n- name: u\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n"
            "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
        )
        return path

    # --- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 120) -> RealNode:
        why = unavailable()
        if why is not None:
            raise ControlPlaneError(why)
        begin = time.monotonic()
        atexit.register(self.stop)
        _node_started()
        self._counted = True
        self._prepare_host()
        env = {**os.environ, "PATH": f"{self.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}
        self._spawn("containerd", [str(self.bin_dir / "containerd"), "--config", str(self._containerd_config())], env)
        self._wait(lambda: self.socket.exists(), timeout, "containerd did not open its socket")
        self._import_images()
        self._kubeconfig()
        self._ports = (free_port(), free_port())
        self._claim_cadvisor_socket()
        self._start_kubelet(env, timeout)
        if self.service_network:
            self._start_kube_proxy(env)
        self.startup_seconds = time.monotonic() - begin
        return self

    def _claim_cadvisor_socket(self) -> None:
        """The kubelet's cAdvisor names a container's series (namespace, pod, container)
        only by asking containerd at /run/containerd/containerd.sock; no kubelet flag moves
        that path. The first node of this machine links it to its own containerd, if nothing
        is there (a link left by a killed run is replaced), making /run/containerd on a
        fresh boot; other nodes' series stay unnamed."""
        with _host_lock:
            if CADVISOR_CONTAINERD.is_symlink() and not CADVISOR_CONTAINERD.exists():
                CADVISOR_CONTAINERD.unlink()
            if CADVISOR_CONTAINERD.exists():
                return
            if not CADVISOR_CONTAINERD.parent.is_dir():  # a fresh boot: no containerd has run here yet
                host.note("dirs", str(CADVISOR_CONTAINERD.parent))
                CADVISOR_CONTAINERD.parent.mkdir(mode=0o711)
                self._cadvisor_dir = True
            host.note("files", str(CADVISOR_CONTAINERD))
            CADVISOR_CONTAINERD.symlink_to(self.socket)
            self._cadvisor_link = True

    def _release_cadvisor_socket(self) -> None:
        with _host_lock:
            mine = CADVISOR_CONTAINERD.is_symlink() and Path(os.readlink(CADVISOR_CONTAINERD)) == self.socket
            if self._cadvisor_link and mine:
                CADVISOR_CONTAINERD.unlink()
                host.done("files", str(CADVISOR_CONTAINERD))
            self._cadvisor_link = False
            if self._cadvisor_dir:
                # Made by this node: containerd's shims left their (now empty) socket and runc
                # state directories in it; empty directories only are removed, deepest first.
                run = CADVISOR_CONTAINERD.parent
                host.remove_empty_tree(run)
                host.done("dirs", str(run))
                self._cadvisor_dir = False

    @property
    def kubelet_port(self) -> int:
        """The kubelet's HTTPS API port on loopback (its /metrics/cadvisor, /pods, ...)."""
        return self._ports[0]

    @property
    def gateway(self) -> str:
        """The host's address on the node's bridge (with `service_network`)."""
        return self.subnet.rsplit(".", 1)[0] + ".1"

    def _start_kube_proxy(self, env: dict[str, str]) -> None:
        """kube-proxy in nftables mode (its own `kube-proxy` tables, deleted at stop), told
        to leave the host's conntrack sysctls alone."""
        kubeconfig = self.control_plane.component_kubeconfig("system:kube-proxy")
        self._spawn(
            "kube-proxy",
            [
                str(self.bin_dir / "kube-proxy"),
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}",
                "--proxy-mode=nftables",
                "--cluster-cidr=10.244.0.0/16",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--healthz-bind-address=127.0.0.1:{free_port()}",
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0s",
                "--conntrack-tcp-timeout-close-wait=0s",
                "--v=2",
            ],
            env,
        )

    def _start_kubelet(self, env: dict[str, str], timeout: float) -> None:
        argv = [
            str(self.bin_dir / "kubelet"),
            f"--config={self._kubelet_config(*self._ports)}",
            f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.workdir / 'kubelet' / 'root'}",
            f"--cert-dir={self.workdir / 'kubelet' / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.gateway if self.service_network or self.host_reaches_pods else '127.0.0.1'}",
            "--v=2",
        ]
        if self.labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        self._spawn("kubelet", argv, env)
        api = self.control_plane.api()

        def ready() -> bool:
            try:
                node = api.get(f"/api/v1/nodes/{self.name}")
            except ApiError:
                return False
            conds = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
            return conds.get("Ready") == "True" and self._allocatable_matches(node)

        self._wait(ready, timeout, f"node {self.name} never became Ready")

    def _allocatable_matches(self, node: dict[str, Any]) -> bool:
        """The node reports the allocatable CPU this kubelet's reservation gives."""
        status = node.get("status") or {}
        capacity = cpu_milli((status.get("capacity") or {}).get("cpu", "0"))
        allocatable = cpu_milli((status.get("allocatable") or {}).get("cpu", "0"))
        return capacity - cpu_milli(self.cpu_reserved) == allocatable

    def restart_kubelet(self, cpu_reserved: str, timeout: float = 60) -> float:
        """Restart the kubelet with another systemReserved CPU, as an operator changing the
        node's reservation does: the containers keep running, the node's allocatable
        changes. Seconds until the node reported the new allocatable and was Ready again."""
        begin = time.monotonic()
        host.stop_process(self.procs.pop("kubelet"))
        self.cpu_reserved = cpu_reserved
        env = {**os.environ, "PATH": f"{self.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"}
        self._start_kubelet(env, timeout)
        return time.monotonic() - begin

    def _import_images(self) -> None:
        images = self.workdir / "images"
        images.mkdir(exist_ok=True)
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
        write_image(images / "pause.tar", PAUSE_IMAGE, [Entry("pause", source=self.bin_dir / "pause")], ["/pause"])
        write_image(images / "busybox.tar", BUSYBOX_IMAGE, busybox_entries(BUSYBOX, applets))
        for tar in ("pause.tar", "busybox.tar"):
            self.import_image(images / tar)

    def container_log(self, pod: dict[str, Any], container: str) -> str:
        """What the container wrote (stdout and stderr, in order), from the log file the
        kubelet keeps in CRI format (`<time> <stream> <F|P> <text>`; P: a partial line).
        This node's kubelet serves no log API: its node address is loopback, which the API
        server does not dial."""
        meta = pod["metadata"]
        path = self.workdir / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container / "0.log"
        out = []
        for line in path.read_text().splitlines():
            _, _, tag, text = [*line.split(" ", 3), ""][:4]
            out.append(text if tag == "P" else text + "\n")
        return "".join(out)

    def import_image(self, archive: Path) -> None:
        """Import an OCI image archive into the node's containerd (pods use it with
        `imagePullPolicy: Never`)."""
        ctr = [str(self.bin_dir / "ctr"), "--address", str(self.socket), "-n", "k8s.io"]
        r = subprocess.run([*ctr, "images", "import", str(archive)], capture_output=True, text=True)
        if r.returncode != 0:
            raise ControlPlaneError(f"ctr images import {archive.name}: {r.stderr.strip()}")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.procs[name] = host.spawn(argv, self.workdir / f"{name}.log", env=env)

    def _wait(self, check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with {p.returncode}:\n{self.log_tail()}")
            if check():
                return
            time.sleep(0.25)
        raise ControlPlaneError(f"{what} within {timeout:.0f}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for name in ("containerd", "kubelet"):
            path = self.workdir / f"{name}.log"
            if path.exists():
                out.append(f"--- {name}.log ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def container_cgroup(self, container_id: str) -> Path | None:
        """The container's cgroup in the cpu hierarchy (under the kubelet's cgroup root)."""
        root = CGROUP_V1 / "cpu" / self.cgroup_root.lstrip("/")
        cid = container_id.split("://", 1)[-1]
        for d in root.rglob(cid):
            if d.is_dir():
                return d
        return None

    def counters(self, container_id: str) -> CpuCounters | None:
        """The container's CPU counters now; None while it has no cgroup (not started)."""
        cgroup = self.container_cgroup(container_id)
        if cgroup is None:
            return None
        acct = CGROUP_V1 / "cpuacct" / cgroup.relative_to(CGROUP_V1 / "cpu")
        try:
            stat = dict(line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())
            pod = dict(line.split() for line in (cgroup.parent / "cpu.stat").read_text().splitlines())
            return CpuCounters(
                time.monotonic(),
                int(stat["nr_periods"]),
                int(stat["nr_throttled"]),
                int(stat["throttled_time"]),
                int((acct / "cpuacct.usage").read_text()),
                int((cgroup / "cpu.cfs_quota_us").read_text()),
                int(pod["nr_periods"]),
                int(pod["nr_throttled"]),
                int(pod["throttled_time"]),
            )
        except (OSError, KeyError, ValueError):  # the container went away between two reads
            return None

    def stop(self) -> None:
        """Stop the kubelet, every pod's containers, then containerd; put the host back."""
        if not self.procs and not self._counted:
            return
        if "kubelet" in self.procs:
            host.stop_process(self.procs["kubelet"])
        self._remove_pods()
        for p in reversed(list(self.procs.values())):
            host.stop_process(p)
        self.procs.clear()
        host.sweep_runtime([str(self.workdir)])
        self._unmount()
        if self.service_network:
            for family in ("ip", "ip6"):
                subprocess.run(["nft", "delete", "table", family, "kube-proxy"], capture_output=True)
                host.done("nft", [family, "kube-proxy"])
        self._restore_host()
        self._release_cadvisor_socket()
        if self._counted:
            self._counted = False
            _node_stopped()
        shutil.rmtree(self.workdir, ignore_errors=True)
        host.done("workdirs", str(self.workdir))
        # The Node object goes too: nothing will renew its lease, and a node that stays behind
        # turns NotReady and draws the controller-manager's evictions and the scheduler's eye.
        with contextlib.suppress(Exception):
            self.control_plane.api().delete(f"/api/v1/nodes/{self.name}")

    def _remove_pods(self) -> None:
        """Every sandbox containerd runs for this node, stopped and removed (their shims and
        network namespaces with them)."""
        ctr = [str(self.bin_dir / "ctr"), "--address", str(self.socket), "-n", "k8s.io"]
        r = subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True)
        for task in r.stdout.split():
            subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], capture_output=True)
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline
            and subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True).stdout.split()
        ):
            time.sleep(0.2)
        for task in subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True).stdout.split():
            subprocess.run([*ctr, "tasks", "delete", "-f", task], capture_output=True)
        for c in subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True).stdout.split():
            subprocess.run([*ctr, "containers", "delete", c], capture_output=True)

    def _unmount(self) -> None:
        """Anything still mounted under the work directory (rootfs, shm, network namespaces)."""
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f]
        mine = [p for p in points if p.startswith(str(self.workdir))]
        for p in sorted(mine, key=len, reverse=True):
            subprocess.run(["umount", "-l", p], capture_output=True)
