"""Real Argo CD for the tests: the application controller and the repo-server of Argo CD
v3.6 (built from the Go module proxy by tests/argocd/build.sh) and a Redis, run as local
processes against a control plane; the Git repository they sync from is testbed.git's.

What argocd-server would otherwise set up is done here: the Application and AppProject
CRDs and the base `argocd-*` ConfigMaps and Secret from Argo CD's own manifests, a
`server.secretkey`, and the `default` AppProject. With `ARGOCD_FAKE_IN_CLUSTER=true` the
controller takes `https://kubernetes.default.svc` (the in-cluster destination the examples
name) to be the kubeconfig's API server, as in Argo CD's own local development setup; it
runs as cluster admin. Redis and the repo-server listen on loopback; the controller's
metrics and health port binds every address (Argo CD has no flag to narrow it), on a free
port. Per-resource health is written into the Application's status
(`--persist-resource-health`), where a test reads it as `kubectl get application` shows it.

No UI, API server, dex, ApplicationSets or notifications: a test changes an Application
with kubectl (a refresh is the `argocd.argoproj.io/refresh` annotation `argocd app get
--refresh` sets), not with the argocd CLI.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from headroom.cluster.client import ApiError

from . import host
from .controlplane import ControlPlane, ControlPlaneError, build_quietly, free_port

NAMESPACE = "argocd"
GROUP = "/apis/argoproj.io/v1alpha1/namespaces/argocd"
APPS = f"{GROUP}/applications"
APPLY = "application/apply-patch+yaml"
MANAGER = "headroom-tests"


def build_argocd() -> Path:
    """Build (or reuse) Argo CD; the directory holding the binary, its role links,
    `manifests/` and `hack/`."""
    return build_quietly("argocd", "Argo CD")


def _apply(api: Any, path: str, obj: dict[str, Any]) -> None:
    api.patch(path, obj, APPLY, {"fieldManager": MANAGER, "force": "true"})


@dataclass
class ArgoCD:
    """Redis, the repo-server and the application controller against `control_plane`,
    with Argo CD's CRDs and base configuration installed. `tools` is put on the
    processes' PATH first (helm, for charts)."""

    control_plane: ControlPlane
    bin_dir: Path
    workdir: Path
    tools: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return (self.bin_dir / "version").read_text().strip()

    def start(self, timeout: float = 120) -> ArgoCD:
        if shutil.which("redis-server") is None:
            raise ControlPlaneError("Argo CD needs redis-server: `make tools` installs Debian's redis-server")
        api = self.control_plane.api()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._install(api)
        for name in ("redis", "repo-server", "repo-server-metrics", "controller-metrics"):
            self.ports[name] = free_port()
        redis = f"127.0.0.1:{self.ports['redis']}"
        self._spawn(
            "redis",
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.ports["redis"]), "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
        )  # fmt: skip
        # The repo-server first: an Application compared before it answers gets a
        # ComparisonError until its next resync.
        self._spawn(
            "repo-server",
            [str(self.bin_dir / "argocd-repo-server"), "--address=127.0.0.1", f"--port={self.ports['repo-server']}",
             "--metrics-address=127.0.0.1", f"--metrics-port={self.ports['repo-server-metrics']}",
             "--disable-tls", "--client-ca-path=", f"--redis={redis}", "--logformat=json", "--loglevel=info"],
        )  # fmt: skip
        self._wait_healthy("repo-server", self.ports["repo-server-metrics"], timeout)
        self._spawn(
            "application-controller",
            [str(self.bin_dir / "argocd-application-controller"), f"--namespace={NAMESPACE}",
             f"--repo-server=127.0.0.1:{self.ports['repo-server']}", "--repo-server-plaintext", f"--redis={redis}",
             f"--metrics-port={self.ports['controller-metrics']}", "--persist-resource-health",
             "--logformat=json", "--loglevel=info"],
        )  # fmt: skip
        self._wait_healthy("application-controller", self.ports["controller-metrics"], timeout)
        return self

    def _install(self, api: Any) -> None:
        """What argocd-server and Argo CD's install manifests would have put there."""
        load = YAML(typ="safe")
        crds = [
            load.load((self.bin_dir / "manifests" / f).read_text())
            for f in ("application-crd.yaml", "appproject-crd.yaml")
        ]
        for crd in crds:
            _apply(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}", crd)
        try:
            api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        for manifest in sorted((self.bin_dir / "manifests").glob("argocd-*.yaml")):
            obj = load.load(manifest.read_text())
            obj["metadata"]["namespace"] = NAMESPACE
            if obj["kind"] == "Secret":
                # argocd-server generates this on its first start; the controller needs it.
                obj["data"] = {"server.secretkey": base64.b64encode(secrets.token_bytes(32)).decode()}
            plural = "secrets" if obj["kind"] == "Secret" else "configmaps"
            _apply(api, f"/api/v1/namespaces/{NAMESPACE}/{plural}/{obj['metadata']['name']}", obj)
        deadline = time.monotonic() + 60
        for crd in crds:
            crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            while not any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (api.get(crd_path).get("status") or {}).get("conditions") or []
            ):
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"{crd['metadata']['name']} not Established within 60s")
                time.sleep(0.2)
        project = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AppProject",
            "metadata": {"name": "default", "namespace": NAMESPACE},
            "spec": {
                "sourceRepos": ["*"],
                "destinations": [{"namespace": "*", "server": "*"}],
                "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
            },
        }
        _apply(api, f"{GROUP}/appprojects/default", project)

    def _spawn(self, name: str, argv: list[str]) -> None:
        data = self.workdir / "data"
        dirs = {k: data / k for k in ("tls", "ssh", "gnupg", "gpg", "home", "tmp")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        dirs["gnupg"].chmod(0o700)
        env = {
            **os.environ,
            "KUBECONFIG": str(self.control_plane.kubeconfig()),
            "ARGOCD_FAKE_IN_CLUSTER": "true",
            "ARGOCD_TLS_DATA_PATH": str(dirs["tls"]),
            "ARGOCD_SSH_DATA_PATH": str(dirs["ssh"]),
            "ARGOCD_GNUPGHOME": str(dirs["gnupg"]),
            "ARGOCD_GPG_DATA_PATH": str(dirs["gpg"]),
            "ARGOCD_GPG_ENABLED": "false",
            "HOME": str(dirs["home"]),
            "TMPDIR": str(dirs["tmp"]),
            # the repo-server runs hack/git-verify-wrapper.sh for every checkout, helm for charts
            "PATH": os.pathsep.join([str(self.bin_dir / "hack"), str(self.tools), str(self.bin_dir), os.environ.get("PATH", "/usr/bin:/bin")]),
        }  # fmt: skip
        self.procs[name] = host.spawn(argv, self.workdir / f"{name}.log", env=env, cwd=self.workdir)

    def _wait_healthy(self, name: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for n, p in self.procs.items():
                if p.poll() is not None:
                    raise ControlPlaneError(f"{n} exited with {p.returncode}:\n{self.log_tail(n)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"Argo CD's {name} not healthy within {timeout:.0f}s:\n{self.log_tail(name)}")
            time.sleep(0.5)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for name in ("application-controller", "repo-server", "redis"):
            if name in self.procs:
                host.stop_process(self.procs.pop(name))
