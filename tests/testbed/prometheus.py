"""A real Prometheus server for the tests (Debian's `prometheus` package, unpacked by
`make tools` beside promtool), on loopback, scraping what the test gives it every 2 s."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import host
from .controlplane import ControlPlaneError, free_port


@dataclass
class PrometheusServer:
    binary: Path
    workdir: Path
    scrape_configs: list[dict[str, Any]]
    rule_files: list[Path] = field(default_factory=list)
    interval: str = "2s"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": self.scrape_configs,
        }
        (self.workdir / "prometheus.yml").write_text(json.dumps(config, indent=1))  # JSON is YAML
        self.proc = host.spawn(
            [
                str(self.binary),
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            self.workdir / "prometheus.log",
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise ControlPlaneError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"prometheus not ready within {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.3)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as r:
            return json.loads(r.read())

    def targets(self) -> dict[str, str]:
        """{job: health} of every active target ("up", "down", "unknown")."""
        active = self.get("/api/v1/targets")["data"]["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in active}

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            host.stop_process(self.proc)
            self.proc = None
