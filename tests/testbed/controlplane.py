"""A real etcd and kube-apiserver on loopback, for the tests and `make demo`.

The binaries come from `tests/testenv/build.sh` (built from pinned Go modules). By default
no scheduler or controller-manager runs: callers create Node objects, bind pods by setting
`spec.nodeName`, and use `sim.kubelet.SimulatedKubelet` to write pod status. With
`components_dir`, kube-scheduler and kube-controller-manager run beside the API server
(for a real node: `testbed.node.RealNode`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from headroom.cluster.client import Api, ApiError, connect

from . import host
from .pki import CA, signing_key

ADMIN_TOKEN = "headroom-test-admin-token"
# Identities the tests can act as; groups decide what RBAC grants them.
USERS = {
    ADMIN_TOKEN: ("admin", "system:masters"),
    "headroom-test-controller-token": ("headroom-controller", "headroom:controllers"),
    "headroom-test-nobody-token": ("nobody", "headroom:nobody"),
}


class ControlPlaneError(RuntimeError):
    """The control plane could not be built or started; the message says why."""


TESTS = Path(__file__).resolve().parents[1]  # this checkout's tests/


def source_script(name: str = "testenv") -> Path:
    """tests/<name>/build.sh of this checkout."""
    return TESTS / name / "build.sh"


def build_script() -> Path:
    return source_script("testenv")


def build_quietly(name: str, what: str) -> Path:
    """Run tests/<name>/build.sh (it builds once, then reuses); the directory it prints."""
    r = subprocess.run([str(source_script(name))], capture_output=True, text=True)
    if r.returncode != 0:
        raise ControlPlaneError(f"building {what} failed: {r.stderr.strip()[-2000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


OFFLINE = "without Go, `headroom plan --snapshot examples/cluster-snapshot.yaml` shows the same targets offline"


def build(progress: bool = False) -> Path:
    """Build (or reuse) the binaries; the directory holding them. With `progress`, the
    build's own output is shown as it goes (the first build takes minutes)."""
    if progress and not _built():
        print("building kube-apiserver and etcd from Go modules (once, several minutes) ...", file=sys.stderr)
    proc = subprocess.Popen([str(build_script())], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None and proc.stdout is not None
    err: list[str] = []
    for line in proc.stderr:
        err.append(line)
        if progress:
            print(f"  {line.rstrip()}", file=sys.stderr)
    out = proc.stdout.read()
    if proc.wait() != 0:
        last = err[-1].strip() if err else "build.sh failed"
        raise ControlPlaneError(f"{last}; {OFFLINE}")
    return Path(out.strip().splitlines()[-1])


def _built() -> bool:
    """Whether build.sh would only reuse binaries (a cheap look at its output directory)."""
    override = os.environ.get("HEADROOM_TESTENV_DIR")
    version = os.environ.get("HEADROOM_K8S_VERSION") or "v*"
    dirs = [Path(override)] if override else list((build_script().parents[2] / ".cache" / "testenv").glob(version))
    return any((d / "kube-apiserver").exists() and (d / "etcd").exists() for d in dirs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of --service-cluster-ip-range
KUBERNETES_NAMES = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


@dataclass
class ControlPlane:
    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="headroom-testenv-")))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    port: int = 0
    startup_seconds: float = 0.0
    extra_args: list[str] = field(default_factory=list)  # more kube-apiserver flags (an audit log)
    # With the directory of tests/realnode/build.sh: kube-scheduler and kube-controller-manager
    # run too (pods are placed, Deployments make ReplicaSets make pods, quotas are counted).
    components_dir: Path | None = None
    # Which of the two run (a benchmark with thousands of node objects and no kubelet runs
    # the controller-manager alone: a scheduler would only retry pods that fit nowhere).
    components: tuple[str, ...] = ("kube-scheduler", "kube-controller-manager")
    # The address pods reach the API server at (a real node's bridge gateway): the API
    # server listens on every address, publishes it as the `kubernetes` Service's endpoint
    # (kube-proxy routes the ClusterIP there), calls webhooks at their Services' endpoints,
    # and mounts ServiceAccount tokens into pods. None: loopback only, no in-cluster clients.
    pod_gateway: str | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "ca.crt"

    def start(self, timeout: float = 120) -> ControlPlane:
        begin = time.monotonic()
        atexit.register(self.stop)
        host.note("workdirs", str(self.workdir))
        w = self.workdir
        self.ca = CA()
        self.ca.write(self.ca_file)
        names = ["127.0.0.1", "localhost"]
        if self.pod_gateway:
            names += [self.pod_gateway, KUBERNETES_SERVICE_IP, *KUBERNETES_NAMES]
        serving_cert, serving_key = self.ca.issue(w, "apiserver", names)
        sa_private, sa_public = signing_key(w)
        self.sa_private = sa_private
        # The API server's own identity towards kubelets (logs, exec), for a real node.
        kubelet_client = self.ca.issue(w, "apiserver-kubelet-client", [], "kube-apiserver", "system:masters")
        (w / "tokens.csv").write_text(
            "".join(f'{tok},{user},{user},"{group}"\n' for tok, (user, group) in USERS.items())
        )
        client, peer = free_port(), free_port()
        self.port = free_port()
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=testenv",
                f"--data-dir={w / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=testenv=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{client}",
                *(
                    [
                        "--bind-address=127.0.0.1",
                        "--advertise-address=127.0.0.1",
                        # The "kubernetes" Service endpoints would need a non-loopback
                        # address; no in-cluster client exists here, so skip them.
                        "--endpoint-reconciler-type=none",
                    ]
                    if self.pod_gateway is None
                    else [
                        "--bind-address=0.0.0.0",
                        f"--advertise-address={self.pod_gateway}",
                        "--endpoint-reconciler-type=lease",
                        "--enable-aggregator-routing=true",
                    ]
                ),
                f"--secure-port={self.port}",
                f"--tls-cert-file={serving_cert}",
                f"--tls-private-key-file={serving_key}",
                f"--token-auth-file={w / 'tokens.csv'}",
                # x509 identities (a real node's kubelet, the scheduler, the controller-manager),
                # authorized as a cluster authorizes them: Node for kubelets, then RBAC.
                f"--client-ca-file={self.ca_file}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={kubelet_client[0]}",
                f"--kubelet-client-key={kubelet_client[1]}",
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa_public}",
                f"--service-account-signing-key-file={sa_private}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                # No controller-manager creates the default ServiceAccount in test namespaces.
                *(["--disable-admission-plugins=ServiceAccount"] if self.pod_gateway is None else []),
                "--v=1",
                *self.extra_args,
            ],
        )
        self._wait_ready(timeout)
        if self.components_dir is not None:
            self._start_components()
        self.startup_seconds = time.monotonic() - begin
        return self

    def component_kubeconfig(self, user: str, group: str | None = None) -> Path:
        """A kubeconfig with a client certificate for `user` (the identities the bootstrap
        RBAC roles name: system:kube-scheduler, system:kube-controller-manager, system:node:X)."""
        name = user.replace(":", "-")
        crt, key = self.ca.issue(self.workdir, f"client-{name}", [], user, group)
        path = self.workdir / f"kubeconfig-{name}"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: c\n  cluster:\n    server: {self.url}\n    certificate-authority: {self.ca_file}\n"
            f"users:\n- name: u\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n"
            "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
        )
        return path

    def _start_components(self) -> None:
        assert self.components_dir is not None
        if "kube-scheduler" in self.components:
            self._component("kube-scheduler", "system:kube-scheduler")
        if "kube-controller-manager" not in self.components:
            return
        self._component(
            "kube-controller-manager",
            "system:kube-controller-manager",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa_private}",
            f"--root-ca-file={self.ca_file}",
            f"--flex-volume-plugin-dir={self.workdir / 'flexvolume'}",
            "--controllers=*,-bootstrapsigner,-tokencleaner",
        )

    def _component(self, name: str, user: str, *args: str) -> None:
        """kube-scheduler or kube-controller-manager as `user`, serving on loopback only."""
        assert self.components_dir is not None
        kubeconfig = self.component_kubeconfig(user)
        self._spawn(
            name,
            [
                str(self.components_dir / name),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
                *args,
            ],
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        self.procs.append(host.spawn(argv, self.workdir / f"{name}.log"))

    def _wait_ready(self, timeout: float) -> None:
        api = Api(connect(str(self.kubeconfig())), timeout=5)
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise ControlPlaneError(f"{p.args!r} exited with {p.returncode}:\n{self.log_tail()}")
            try:
                if api.get_text("/readyz") == "ok":
                    return
            except ApiError as exc:
                last = str(exc)
            time.sleep(0.25)
        raise ControlPlaneError(f"kube-apiserver not ready after {timeout}s: {last}\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
            path = self.workdir / f"{name}.log"
            if path.exists():
                out.append(f"--- {name}.log ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def api(self, token: str = ADMIN_TOKEN) -> Api:
        return Api(connect(str(self.kubeconfig(token))))

    def kubeconfig(self, token: str = ADMIN_TOKEN, path: Path | None = None) -> Path:
        path = path or self.workdir / f"kubeconfig-{USERS[token][0]}"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: testenv\n  cluster:\n    server: {self.url}\n    certificate-authority: {self.ca_file}\n"
            f"users:\n- name: u\n  user:\n    token: {token}\n"
            "contexts:\n- name: testenv\n  context: {cluster: testenv, user: u}\ncurrent-context: testenv\n"
        )
        return path

    def stop(self) -> None:
        for p in reversed(self.procs):
            host.stop_process(p)
        self.procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
        host.done("workdirs", str(self.workdir))
