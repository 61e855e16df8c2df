"""Real Flux for the tests: source-controller, kustomize-controller and helm-controller
(built from the Go module proxy by tests/flux/build.sh), run as local processes against a
control plane; the Git repository they read is testbed.git's.

The controllers run as cluster admin with `RUNTIME_NAMESPACE=flux-system`, watching every
namespace, without leader election; source-controller serves its artifacts on loopback,
where kustomize- and helm-controller fetch them. Dependencies are requeued every 5 s
instead of 30 s (`--requeue-dependency`) so a test waits on Flux's work, not its timers.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML

from headroom.cluster.client import ApiError

from . import host
from .controlplane import ControlPlane, ControlPlaneError, build_quietly, free_port

CONTROLLERS = ("source-controller", "kustomize-controller", "helm-controller")
NAMESPACE = "flux-system"


def build_flux() -> Path:
    """Build (or reuse) the Flux controllers; the directory holding them and `crds/`."""
    return build_quietly("flux", "the Flux controllers")


@dataclass
class Flux:
    """The three Flux controllers against `control_plane`, their CRDs installed."""

    control_plane: ControlPlane
    bin_dir: Path
    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _health: dict[str, int] = field(default_factory=dict)

    def start(self, timeout: float = 90) -> Flux:
        api = self.control_plane.api()
        self.workdir.mkdir(parents=True, exist_ok=True)
        served: list[tuple[str, str, str]] = []  # (group, version, kind) the controllers will ask for
        for crd in sorted((self.bin_dir / "crds").glob("*.yaml")):
            for doc in YAML(typ="safe").load_all(crd.read_text()):
                if doc:
                    api.apply(doc, "headroom-tests")
                    spec = doc["spec"]
                    served += [
                        (spec["group"], v["name"], spec["names"]["kind"]) for v in spec["versions"] if v["served"]
                    ]
        # A controller that starts before its kinds are in discovery exits ("no matches for
        # kind"): wait until the API server lists every one.
        deadline = time.monotonic() + timeout
        for group, version, kind in served:
            while True:
                try:
                    listed = {r["kind"] for r in api.get(f"/apis/{group}/{version}")["resources"]}
                except ApiError:
                    listed = set()
                if kind in listed:
                    break
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"{kind} ({group}/{version}) not served within {timeout:.0f}s")
                time.sleep(0.2)
        try:
            api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        storage = free_port()
        kubeconfig = self.control_plane.kubeconfig()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "RUNTIME_NAMESPACE": NAMESPACE}
        for name in CONTROLLERS:
            self._health[name] = free_port()
            argv = [
                str(self.bin_dir / name),
                f"--metrics-addr=127.0.0.1:{free_port()}",
                f"--health-addr=127.0.0.1:{self._health[name]}",
                "--log-level=debug" if name == "kustomize-controller" else "--log-level=info",
                "--log-encoding=json",
                "--requeue-dependency=5s",
            ]
            if name == "source-controller":
                storage_dir = self.workdir / "storage"
                storage_dir.mkdir(exist_ok=True)
                argv += [
                    f"--storage-path={storage_dir}",
                    f"--storage-addr=127.0.0.1:{storage}",
                    f"--storage-adv-addr=127.0.0.1:{storage}",
                ]
            self.procs[name] = host.spawn(argv, self.workdir / f"{name}.log", env=env, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while not all(self._healthy(n) for n in CONTROLLERS):
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"the Flux controllers not healthy within {timeout:.0f}s")
            time.sleep(0.5)
        return self

    def _healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self._health[name]}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for p in self.procs.values():
            host.stop_process(p)
        self.procs.clear()
