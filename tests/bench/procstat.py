"""What the kernel says a process used (/proc): its CPU seconds, its peak RSS, and how the
host's cores were shared between processes over a stretch of a benchmark."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

TICK = os.sysconf("SC_CLK_TCK")


class Sample(NamedTuple):
    name: str
    cpu: float  # CPU seconds of all its threads, user and system
    started: int  # clock ticks after boot: with the pid, which process this is


def _stat(pid: int) -> Sample:
    text = Path(f"/proc/{pid}/stat").read_text()
    name, _, rest = text.partition(" (")[2].rpartition(") ")
    fields = rest.split()
    return Sample(name, (int(fields[11]) + int(fields[12])) / TICK, int(fields[19]))


def cpu_seconds(pid: int) -> float:
    return _stat(pid).cpu


def memory(pid: int) -> dict[str, int]:
    """The process's resident set now (VmRSS) and at its peak (VmHWM), in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def peak_rss_bytes(pid: int) -> int:
    return memory(pid).get("VmHWM", 0)


def descendants(pid: int) -> list[int]:
    """The process and every process under it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # ended meanwhile
            continue
    return out


def host_cpu() -> dict[int, Sample]:
    """Every process's name, CPU seconds and start now."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = _stat(int(entry))
            except (OSError, ValueError, IndexError):  # ended meanwhile
                continue
    return out


def cpu_split(
    before: dict[int, Sample],
    after: dict[int, Sample],
    seconds: float,
    part: Callable[[int, str], str] = lambda pid, name: name,
) -> Counter[str]:
    """Cores each part of the host used between two host_cpu() snapshots `seconds` apart
    (`part(pid, name)` names a process's part; a process that ended meanwhile is not
    counted, one that started is counted whole). A process is known by its pid and start,
    not its name: a kernel worker renames itself after the work it does."""
    split: Counter[str] = Counter()
    for pid, now in after.items():
        then = before.get(pid)
        used = now.cpu - then.cpu if then is not None and then.started == now.started else now.cpu
        if used > 0:
            split[part(pid, now.name)] += used / seconds
    return split
