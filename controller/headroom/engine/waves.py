"""The node event that tells a wave of resizes: one CPULimitAdjusted event per node for the
resizes of one rollout, landing a pass or more apart, not one event per pod (or per pass).
A dry run tells the resizes it would have made the same way, at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..cluster.writer import Writer
from ..core.planner import NodePlan
from ..core.policy import PodTarget
from ..core.quantity import format_milli
from ..core.records import Node, Pod

WAVE_MAX = 30.0  # seconds: a node that never settles still reports its changes this often
REASON = "CPULimitAdjusted"


def change(pod: Pod, t: PodTarget) -> str:
    """A resize as a line says it: the limit before → after."""
    if t.pod_level:
        before = format_milli(t.pod_level_current) if t.pod_level_current is not None else "none"
        return f"{before} → {format_milli(t.target)} (pod-level)"
    current = [c.current for c in t.containers]
    before = "none" if any(c is None for c in current) else format_milli(sum(c or 0 for c in current))
    return f"{before} → {format_milli(sum(c.target for c in t.containers))}"


def _tail(plan: NodePlan) -> str:
    s = plan.summary
    return f"node factor {s.factor:.2f} before caps, slack {format_milli(max(s.slack, 0))}/{format_milli(s.allocatable)} cores"


@dataclass(slots=True)
class _Wave:
    """The resizes written on one node since its last wave event."""

    node: Node
    started: float
    changes: list[str] = field(default_factory=list)
    tail: str = ""


class Waves:
    """Per node, the resizes written and not yet told."""

    def __init__(self, writer: Writer, clock: Callable[[], float] = time.monotonic) -> None:
        self.writer = writer
        self._clock = clock
        self._waves: dict[str, _Wave] = {}

    def add(self, plan: NodePlan, changes: list[str]) -> None:
        """Resizes a pass wrote on the plan's node (lines from `change`)."""
        wave = self._waves.setdefault(plan.node.name, _Wave(plan.node, self._clock()))
        wave.node, wave.tail = plan.node, _tail(plan)
        wave.changes += changes

    def would(self, plan: NodePlan, changes: list[str]) -> None:
        """A dry run's pass: the resizes it would have written, told now."""
        self.writer.node_wave(plan.node, REASON, "dry-run, not applied: would adjust", changes, _tail(plan))

    def settle(self, node: str, settled: bool) -> None:
        """Send the node's event for its wave once nothing more is due on the node
        (`settled`: no resizes waiting, no change since the last plan), or once the wave is
        WAVE_MAX old."""
        wave = self._waves.get(node)
        if wave is None:
            return
        if settled or self._clock() - wave.started >= WAVE_MAX:
            del self._waves[node]
            self.writer.node_wave(wave.node, REASON, "adjusted", wave.changes, wave.tail)

    def forget(self, node: str) -> None:
        self._waves.pop(node, None)

    def clear(self) -> None:
        self._waves.clear()
