"""The cgroup v2 node's boot (tests/testbed/vmnode.py) with QEMU stood in for by a shell:
a guest whose kernel says it hung is booted once more, and a second hang fails the start
with the kernel's line. (The real guest boots in tests/integration/v2node.)"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed import host, vmnode
from testbed.vmnode import Base, GuestHung, VmNode

LOCKUP = "[   81.4] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [modprobe:181]"


class FakeApi:
    def __init__(self, boots: list[str]) -> None:
        self.boots = boots

    def get(self, path: str) -> dict[str, Any]:
        ready = "True" if self.boots and self.boots[-1] == "fine" else "False"
        return {"status": {"conditions": [{"type": "Ready", "status": ready}]}}


class FakeControlPlane:
    def __init__(self, boots: list[str]) -> None:
        self._api = FakeApi(boots)

    def api(self) -> FakeApi:
        return self._api


def boot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, guests: list[str]) -> tuple[VmNode, list[str]]:
    """A VmNode whose QEMU is a shell: each boot takes the next of `guests` ("hangs" writes
    a soft lockup to the console, "fine" makes the node Ready)."""
    started: list[str] = []
    real_spawn = host.spawn

    def spawn(argv: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
        guest = guests[len(started)]
        started.append(guest)
        console = tmp_path / "vm" / "console.log"
        script = f"echo '{LOCKUP}' > {console}; sleep 60" if guest == "hangs" else f"echo booted > {console}; sleep 60"
        return real_spawn(["sh", "-c", script], log)

    base = Base(tmp_path / "vmlinuz", tmp_path / "base.cpio", "6.1.0-test", tmp_path)
    base.initrd.write_bytes(b"")
    monkeypatch.setattr(vmnode, "unavailable", lambda: None)
    monkeypatch.setattr(vmnode, "build_base", lambda: base)
    monkeypatch.setattr(vmnode, "probe_kvm", lambda: False)
    monkeypatch.setattr(vmnode, "_cpio", lambda root, out: out.write_bytes(b""))
    monkeypatch.setattr(VmNode, "_node_files", lambda self, root, bin_dir: None)
    monkeypatch.setattr(vmnode.host, "spawn", spawn)
    (tmp_path / "vm").mkdir()
    return VmNode(FakeControlPlane(started), workdir=tmp_path / "vm"), started  # type: ignore[arg-type]


def test_a_guest_that_hangs_at_boot_is_booted_once_more(monkeypatch, tmp_path, capsys):
    node, started = boot(monkeypatch, tmp_path, ["hangs", "fine"])
    node.start(timeout=60)
    try:
        assert started == ["hangs", "fine"]
        assert LOCKUP in (tmp_path / "vm" / "console-hung-1.log").read_text()
        assert "booted again: " + LOCKUP in capsys.readouterr().out
        assert node.proc is not None and node.proc.poll() is None  # the second guest runs
    finally:
        node.stop()


def test_a_guest_that_hangs_twice_fails_the_start_with_the_kernels_line(monkeypatch, tmp_path):
    node, started = boot(monkeypatch, tmp_path, ["hangs", "hangs", "fine"])
    with pytest.raises(GuestHung, match="soft lockup - CPU#1 stuck"):
        node.start(timeout=60)
    assert started == ["hangs", "hangs"]
    assert node.proc is None and not (tmp_path / "vm").exists()  # stopped and cleaned up
