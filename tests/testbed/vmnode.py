"""A real Kubernetes node on cgroup v2, in a virtual machine on this machine: what production
nodes run, beside a `ControlPlane`, for the tests.

This machine's kernel mounts cgroup v1 (the real node of `testbed/node.py` runs there). The
node here is a QEMU guest booting Debian's cloud kernel (`linux-image-cloud-amd64`, its
cgroup v2 with the `cpu` controller, `cpu.max`, `cpu.max.burst`, pressure files) from one
initramfs that is its whole root file system:

- a Debian root made by `mmdebstrap` (runc, the CNI plugins, iptables, kmod, busybox),
  the kernel's modules, and the containerd and kubelet `tests/realnode/build.sh` builds,
  cached under `.cache/vmnode/` (built once; rebuilt when what it is built from changes);
- and, for each start, a small archive of the node's own: its kubelet client certificate,
  the kubelet's and containerd's configuration, the pause and busybox images.

QEMU's software emulation (TCG) runs it: a nested KVM guest hangs at kernel start here
(`probe_kvm` says whether it works, and it is used when it does). Networking is QEMU's
user mode: the guest reaches the host's loopback at 10.0.2.2 (the API server, named by
`tls-server-name` so its certificate for 127.0.0.1 verifies), and the host reaches the
guest only through the ports forwarded to 127.0.0.1: the kubelet's, and a read-only
window on the guest's files (busybox httpd with a CGI that prints a file or lists a
directory) the tests read cgroup files through. Nothing on the host is changed: no
bridge, no sysctl, no cgroup, no mount; stopping the node is stopping QEMU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headroom.cluster.client import ApiError

from . import host
from .controlplane import ControlPlane, ControlPlaneError, free_port
from .images import Entry, busybox_entries, write_image
from .node import BUSYBOX, BUSYBOX_IMAGE, PAUSE_IMAGE, build_node, kubelet_config

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "vmnode"
SUITE = "bookworm"
KERNEL_PACKAGE = "linux-image-cloud-amd64"
PACKAGES = "runc,iptables,kmod,iproute2,containernetworking-plugins,busybox-static,ca-certificates,procps"
# Loaded in this order at boot (the cloud kernel builds them as modules), before anything
# else runs: the network, the bridge CNI's, and the netfilter ones the kubelet's iptables
# (nft backend) would otherwise have the kernel load on demand while the kubelet and
# containerd keep both emulated CPUs busy. One such load beside them hung the guest in a
# fresh-clone CI run (both CPUs in soft lockup, kubelet and modprobe, for 500 s).
MODULES = (
    "virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net "
    "llc stp bridge veth overlay br_netfilter "
    "nfnetlink nf_tables x_tables nft_compat xt_comment crc32c_intel libcrc32c nf_defrag_ipv4 nf_defrag_ipv6 "
    "nf_conntrack xt_conntrack"
)
# What a guest kernel prints when its CPUs stop making progress: under software emulation
# a rare hang, which a boot meets before its node is Ready; that boot is tried once more.
HUNG = ("BUG: soft lockup",)
GUEST_IP, HOST_IP = "10.0.2.15", "10.0.2.2"
KUBELET_PORT, FILES_PORT = 10250, 8000

INIT = f"""#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /run /tmp /sys/fs/cgroup
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
for m in {MODULES}; do modprobe $m; done
ip link set lo up
ip link set eth0 up
ip addr add {GUEST_IP}/24 dev eth0
ip route add default via {HOST_IP}
echo "vmnode: cgroup $(stat -fc %T /sys/fs/cgroup), controllers $(cat /sys/fs/cgroup/cgroup.controllers)"
busybox httpd -p {FILES_PORT} -h /opt/files
exec /opt/node/start
"""

# GET /cgi-bin/read?PATH: the file's bytes, or a directory's entries one a line.
# GET /cgi-bin/write?PATH=VALUE (files under /sys/fs/cgroup only): what a node agent writes
# there, answered with the kernel's verdict (the errno text when it refuses).
READ_CGI = """#!/bin/sh
p=$(busybox httpd -d "$QUERY_STRING")
if [ -d "$p" ]; then printf 'Content-Type: text/plain\\r\\n\\r\\n'; ls -1 "$p"
elif [ -r "$p" ]; then printf 'Content-Type: text/plain\\r\\n\\r\\n'; cat "$p"
else printf 'Status: 404 Not Found\\r\\nContent-Type: text/plain\\r\\n\\r\\nno such file: %s\\n' "$p"; fi
"""

WRITE_CGI = """#!/bin/sh
q=$(busybox httpd -d "$QUERY_STRING")
p=${q%%=*}; v=${q#*=}
printf 'Content-Type: text/plain\\r\\n\\r\\n'
case "$p" in /sys/fs/cgroup/*) ;; *) echo "refused: only files under /sys/fs/cgroup"; exit 0;; esac
# dd, not the shell's printf: it says the kernel's errno ("Invalid argument"), not "I/O error".
if err=$(printf '%s' "$v" | dd of="$p" status=none 2>&1); then echo ok; else echo "$err"; fi
"""

# The kubelet reads its file systems' sizes (cAdvisor) and knows none of the initramfs's
# rootfs: its state, the runtime's and the logs are on a tmpfs of their own.
START = f"""#!/bin/sh
mkdir -p /var/lib/containerd /var/lib/kubelet /var/log/pods /etc/cni/net.d
for d in /var/lib/containerd /var/lib/kubelet /var/log/pods; do mount -t tmpfs -o size=1g tmpfs $d; done
cp /opt/node/10-headroom.conflist /etc/cni/net.d/
containerd --config /opt/node/containerd.toml > /var/log/containerd.log 2>&1 &
while [ ! -S /run/containerd/containerd.sock ]; do sleep 0.2; done
for i in /opt/node/images/*.tar; do ctr -n k8s.io images import --local "$i" > /dev/null; done
echo "vmnode: containerd up, images imported"
kubelet --config=/opt/node/kubelet.yaml --kubeconfig=/opt/node/kubelet.kubeconfig \\
  --hostname-override="$(cat /opt/node/name)" --node-ip={GUEST_IP} $(cat /opt/node/kubelet-args) --v=1 \\
  > /var/log/kubelet.log 2>&1
echo "vmnode: the kubelet exited ($?):"; tail -20 /var/log/kubelet.log
exec sleep infinity
"""


def probe_kvm() -> bool:
    """Whether QEMU may use KVM here. A guest hangs at kernel start on this machine under
    KVM (measured), so KVM is used only when asked for with HEADROOM_VMNODE_KVM=1 and
    /dev/kvm opens."""
    if os.environ.get("HEADROOM_VMNODE_KVM") != "1":
        return False
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    return True


def unavailable() -> str | None:
    """Why a v2 node cannot run here, or None."""
    if os.geteuid() != 0:
        return "the VM node's root file system is built as root (mmdebstrap --mode=root)"
    for tool, package in (("qemu-system-x86_64", "qemu-system-x86"), ("cpio", "cpio"), ("mmdebstrap", "mmdebstrap")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; `make tools` installs it)"
    return None


def _run(argv: list[str], what: str, **kw: Any) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{what} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return str(proc.stdout)


def _cpio(root: Path, out: Path) -> None:
    """`root` as an uncompressed newc archive (the kernel unpacks it as the root file system)."""
    with out.open("wb") as f:
        files = subprocess.run(["find", "."], cwd=root, capture_output=True, check=True).stdout
        subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=files, stdout=f, check=True)


@dataclass(frozen=True)
class Base:
    kernel: Path
    initrd: Path
    kernel_release: str
    bin_dir: Path  # tests/realnode/build.sh's: the kubelet, containerd, pause


def build_base() -> Base:
    """The kernel and the base initramfs, built once into .cache/vmnode/<stamp>/."""
    bin_dir = build_node()
    stamp_src = json.dumps([SUITE, KERNEL_PACKAGE, PACKAGES, MODULES, INIT, READ_CGI, WRITE_CGI, START]).encode()
    for name in ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr"):
        stamp_src += (bin_dir / "stamp").read_bytes() + name.encode()
    stamp = hashlib.sha256(stamp_src).hexdigest()[:16]
    out = CACHE / stamp
    done = out / "done"
    if done.exists():
        meta = json.loads(done.read_text())
        return Base(out / "vmlinuz", out / "base.cpio", meta["release"], bin_dir)
    why = unavailable()
    if why is not None:
        raise ControlPlaneError(why)
    started = time.monotonic()
    if CACHE.is_dir():  # earlier builds: nothing reads them once their inputs have changed
        for old in CACHE.iterdir():
            shutil.rmtree(old, ignore_errors=True)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="vmnode-", dir=out))
    try:
        # The kernel: Debian's cloud flavour, downloaded and unpacked, never installed here.
        deps = _run(["apt-cache", "depends", KERNEL_PACKAGE], "apt-cache depends")
        image = next(
            line.split(":", 1)[1].strip()
            for line in deps.splitlines()
            if line.strip().startswith("Depends: linux-image-")
        )
        _run(["apt-get", "download", image], "apt-get download " + image, cwd=work)
        deb = next(work.glob(f"{image}_*.deb"))
        kernel_tree = work / "kernel"
        _run(["dpkg-deb", "-x", str(deb), str(kernel_tree)], "dpkg-deb -x")
        release = image.removeprefix("linux-image-")
        shutil.copy(kernel_tree / "boot" / f"vmlinuz-{release}", out / "vmlinuz")
        root = work / "root"
        _run(
            ["mmdebstrap", "--quiet", "--variant=minbase", "--mode=root", f"--include={PACKAGES}", SUITE, str(root)],
            "mmdebstrap",
        )
        shutil.copytree(kernel_tree / "lib" / "modules", root / "lib" / "modules", dirs_exist_ok=True)
        _run(["chroot", str(root), "depmod", release], "depmod")
        for name in ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr"):
            shutil.copy(bin_dir / name, root / "usr" / "local" / "bin" / name)
        # Left out: what a node never reads (docs, manuals, locales, apt's lists).
        for junk in ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/lib/apt/lists", "var/cache/apt"):
            shutil.rmtree(root / junk, ignore_errors=True)
        (root / "init").write_text(INIT)
        (root / "opt" / "files" / "cgi-bin").mkdir(parents=True)
        (root / "opt" / "files" / "cgi-bin" / "read").write_text(READ_CGI)
        (root / "opt" / "files" / "cgi-bin" / "write").write_text(WRITE_CGI)
        (root / "opt" / "node").mkdir(parents=True)
        (root / "opt" / "node" / "start").write_text(START)
        cgi = root / "opt" / "files" / "cgi-bin"
        for p in (root / "init", cgi / "read", cgi / "write", root / "opt" / "node" / "start"):
            p.chmod(0o755)
        _cpio(root, out / "base.cpio")
        done.write_text(json.dumps({"release": release, "seconds": round(time.monotonic() - started, 1)}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Base(out / "vmlinuz", out / "base.cpio", release, bin_dir)


class GuestHung(ControlPlaneError):
    """The guest kernel said its CPUs stopped making progress (the line it printed)."""


@dataclass
class VmNode:
    """One cgroup v2 node in a QEMU guest, joined to `control_plane` as `name`."""

    control_plane: ControlPlane
    name: str = "v2node"
    cpus: int = 2
    memory_mb: int = 3072
    cpu_reserved: str = "100m"
    labels: dict[str, str] = field(default_factory=dict)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="headroom-vmnode-")))
    accel: str = "tcg"
    boot_seconds: float = 0.0  # from QEMU's start to the node Ready
    kernel_release: str = ""
    proc: subprocess.Popen[bytes] | None = None
    kubelet_port: int = 0
    files_port: int = 0

    # --- the node's own archive --------------------------------------------------------
    def _node_files(self, root: Path, bin_dir: Path) -> None:
        cp = self.control_plane
        node = root / "opt" / "node"
        (node / "images").mkdir(parents=True)
        crt, key = cp.ca.issue(
            self.workdir, "kubelet-client", [], common_name=f"system:node:{self.name}", organization="system:nodes"
        )
        for src, dst in ((cp.ca_file, "ca.crt"), (crt, "kubelet.crt"), (key, "kubelet.key")):
            shutil.copy(src, node / dst)
        port = cp.url.rsplit(":", 1)[1]
        (node / "kubelet.kubeconfig").write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: c\n  cluster:\n    server: https://{HOST_IP}:{port}\n"
            "    tls-server-name: 127.0.0.1\n    certificate-authority: /opt/node/ca.crt\n"
            "users:\n- name: u\n  user:\n    client-certificate: /opt/node/kubelet.crt\n"
            "    client-key: /opt/node/kubelet.key\n"
            "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
        )
        (node / "name").write_text(self.name)
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        (node / "kubelet-args").write_text(f"--node-labels={labels}" if labels else "")
        cfg = kubelet_config("/opt/node/ca.crt", "/run/containerd/containerd.sock", KUBELET_PORT, self.cpu_reserved)
        (node / "kubelet.yaml").write_text(json.dumps(cfg))
        (node / "10-headroom.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "headroom",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]]},
                        },
                        {"type": "loopback"},
                    ],
                }
            )
        )
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        (node / "containerd.toml").write_text(
            f"""version = 3
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "/usr/sbin/runc"
  SystemdCgroup = false
  # The guest's root is its initramfs, which pivot_root cannot leave (EINVAL): runc
  # moves the container's root over / and chroots instead.
  NoPivotRoot = true
[{runtime}.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "/etc/cni/net.d"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""
        )
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
        write_image(node / "images" / "pause.tar", PAUSE_IMAGE, [Entry("pause", source=bin_dir / "pause")], ["/pause"])
        write_image(node / "images" / "busybox.tar", BUSYBOX_IMAGE, busybox_entries(BUSYBOX, applets))

    # --- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 600) -> VmNode:
        why = unavailable()
        if why is not None:
            raise ControlPlaneError(why)
        base = build_base()
        self.kernel_release = base.kernel_release
        own = self.workdir / "own"
        self._node_files(own, base.bin_dir)
        initrd = self.workdir / "initrd.cpio"
        _cpio(own, self.workdir / "own.cpio")
        with initrd.open("wb") as out:  # the kernel unpacks concatenated archives in turn
            for part in (base.initrd, self.workdir / "own.cpio"):
                with part.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        self.kubelet_port, self.files_port = free_port(), free_port()
        self.accel = "kvm" if probe_kvm() else "tcg"
        net = (
            f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.kubelet_port}-:{KUBELET_PORT},"
            f"hostfwd=tcp:127.0.0.1:{self.files_port}-:{FILES_PORT}"
        )
        argv = [
            "qemu-system-x86_64",
            "-accel",
            self.accel,
            "-cpu",
            "host" if self.accel == "kvm" else "max",
            "-smp",
            str(self.cpus),
            "-m",
            str(self.memory_mb),
            "-kernel",
            str(base.kernel),
            "-initrd",
            str(initrd),
            "-append",
            "console=ttyS0 rdinit=/init quiet",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            f"file:{self.workdir / 'console.log'}",
            "-no-reboot",
            "-netdev",
            net,
            "-device",
            "virtio-net-pci,netdev=n0",
        ]
        began = time.monotonic()
        for boot in (1, 2):
            # In a session of its own, noted: a dead run's watchdog or the next run stops it.
            self.proc = host.spawn(argv, self.workdir / "qemu.log")
            try:
                self._wait_ready(began + timeout)
                break
            except GuestHung as hung:
                if boot == 2:
                    self.stop()
                    raise
                host.stop_process(self.proc)
                (self.workdir / "console.log").rename(self.workdir / f"console-hung-{boot}.log")
                print(f"{self.name}: the guest hung before its node was Ready, booted again: {hung}", flush=True)
            except BaseException:
                self.stop()
                raise
        self.boot_seconds = time.monotonic() - began
        return self

    def _wait_ready(self, deadline: float) -> None:
        api = self.control_plane.api()
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                qemu = (self.workdir / "qemu.log").read_text(errors="replace")[-2000:]
                raise ControlPlaneError(f"QEMU exited ({self.proc.returncode}): {qemu}\n{self.console_tail()}")
            console = self.console_tail()
            hung = next((line.strip() for line in console.splitlines() if any(h in line for h in HUNG)), None)
            if hung is not None:
                raise GuestHung(hung)
            with contextlib.suppress(ApiError):
                node = api.get(f"/api/v1/nodes/{self.name}")
                conds = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
                if conds.get("Ready") == "True":
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"node {self.name} never became Ready: {self.console_tail()}\nkubelet: {self.log_tail()}"
                )
            time.sleep(1.0)

    def console_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / "console.log").read_bytes()[-chars:].decode(errors="replace")
        return ""

    def read(self, path: str, timeout: float = 30) -> str:
        """A file of the guest (a directory: its entries, one a line), through its window."""
        url = f"http://127.0.0.1:{self.files_port}/cgi-bin/read?{urllib.parse.quote(path)}"
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return str(r.read().decode())

    def write(self, path: str, value: str, timeout: float = 30) -> str:
        """Write a cgroup file of the guest as a node agent would: "ok", or the kernel's
        refusal (e.g. "Invalid argument")."""
        query = urllib.parse.quote(f"{path}={value}", safe="/=")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.files_port}/cgi-bin/write?{query}", timeout=timeout) as r:
            return str(r.read().decode()).strip()

    def pod_cgroup(self, pod: dict[str, Any]) -> str:
        """The pod's cgroup in the guest (the kubelet's cgroupfs layout on v2)."""
        qos = pod["status"]["qosClass"].lower()
        uid = pod["metadata"]["uid"]
        return f"/sys/fs/cgroup/kubepods/pod{uid}" if qos == "guaranteed" else f"/sys/fs/cgroup/kubepods/{qos}/pod{uid}"

    def container_cgroup(self, pod: dict[str, Any], container: str) -> str:
        """A running container's cgroup in the guest: its pod's, then the container's ID."""
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
        return f"{self.pod_cgroup(pod)}/{status['containerID'].split('://', 1)[1]}"

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.read("/var/log/kubelet.log", timeout=5).splitlines()[-lines:])
        return "(the guest's files are out of reach)"

    def stop(self) -> None:
        """Stop QEMU (the guest and all it ran go with it) and remove the work directory."""
        if self.proc is not None:
            host.stop_process(self.proc)
        self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)


if __name__ == "__main__":  # a node to look at: python -m testbed.vmnode (from tests/)
    from .controlplane import build

    cp = ControlPlane(build()).start()
    vm = VmNode(cp)
    try:
        vm.start()
        print(
            f"{vm.name} Ready in {vm.boot_seconds:.1f} s ({vm.accel}); cgroup:",
            vm.read("/sys/fs/cgroup/cgroup.controllers"),
        )
    finally:
        vm.stop()
        cp.stop()
