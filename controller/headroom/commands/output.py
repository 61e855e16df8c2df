"""How `headroom plan` and `headroom explain` print a plan: the JSON (and YAML) of
`-o json`, the table, `-o wide`, the HTML page, and explain's text. Long because each
format is part of the command's interface; they share the filters and the columns."""

from __future__ import annotations

import datetime
import io
import json
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..core.eligibility import POOL_PAUSED
from ..core.params import Settings
from ..core.planner import ClusterPlan, NodePlan, PodPlan, what_if
from ..core.policy import NodeSummary
from ..core.quantity import format_milli
from ..core.records import INIT, applied_limits, refusal_text
from ..core.release import current_limit

if TYPE_CHECKING:
    from ..cluster.prometheus import Throttling


# Characters a terminal acts on instead of showing: C0 and C1 controls but newline and tab
# (escape sequences clear screens, retitle windows, hide text), and the bidirectional
# overrides that reorder what is shown.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every character a terminal would act on shown as an escape (`\\x1b`)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


class Printable(io.TextIOBase):
    """A text stream that writes through `printable`: what the CLI prints came in part
    from the cluster or a server (names, labels, messages, Prometheus's labels), and none
    of it may act on the reader's terminal."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return bool(self.inner.isatty())


def node_json(n: NodePlan) -> dict[str, Any]:
    s = n.summary
    return {
        "name": n.node.name,
        "pool": n.settings.pool,
        "allocatableMilli": s.allocatable,
        "bookedMilli": s.booked,
        "slackMilli": s.slack,
        "managedRequestsMilli": s.managed_requests,
        "managedPods": s.managed_pods,
        "factor": round(s.factor, 2),
        "dryRun": n.settings.dry_run,
    }


def pod_json(p: PodPlan, summary: NodeSummary | None = None) -> dict[str, Any]:
    """A pod's line of `plan -o json`; with tenants named, its tenant, and (given its node's
    summary, when tenancy changes the split) its tenant's pot."""
    out = _pod_json(p)
    if p.tenant is not None:
        out["tenant"] = p.tenant
        pot = summary.pots.get(p.tenant) if summary is not None and summary.pots is not None else None
        if pot is not None:
            out["tenantWeight"] = float(pot.weight)
            out["tenantPotMilli"] = int(pot.pot)
            out["tenantCapped"] = pot.capped
    return out


def _pod_json(p: PodPlan) -> dict[str, Any]:
    t = p.target
    pod = p.pod
    if t is None:
        return {
            "namespace": pod.namespace,
            "name": pod.name,
            "node": pod.node_name,
            "managed": False,
            "reason": p.reason,
            "requestMilli": pod.booked_cpu,
            "targetLimitMilli": None,
            "apply": False,
            "containers": [
                {
                    "name": c.name,
                    "requestMilli": c.cpu_request,
                    "currentLimitMilli": c.cpu_limit,
                    "targetLimitMilli": None,
                    "apply": False,
                }
                for c in pod.containers
            ],
        }
    computed = {c.name: c for c in t.containers}
    return {
        "namespace": pod.namespace,
        "name": pod.name,
        "node": pod.node_name,
        "managed": True,
        "reason": p.reason,
        "requestMilli": t.request,
        "targetLimitMilli": t.target,
        "apply": t.apply,
        "containers": [
            {
                "name": c.name,
                "requestMilli": c.cpu_request,
                "currentLimitMilli": c.cpu_limit,
                "targetLimitMilli": computed[c.name].target if c.name in computed else None,
                "apply": computed[c.name].apply if c.name in computed else False,
            }
            for c in pod.containers
        ],
    }


def filter_plan(
    plan: ClusterPlan,
    *,
    node: str | None = None,
    pool: str | None = None,
    namespace: str | None = None,
    reason: str | None = None,
    only_changes: bool = False,
) -> ClusterPlan:
    """The part of a plan a question is about; node totals stay those of the whole node."""

    def keep(p: PodPlan) -> bool:
        return (
            (namespace is None or p.pod.namespace == namespace)
            and (reason is None or p.reason == reason)
            and (not only_changes or (p.target is not None and p.target.apply))
        )

    nodes = [
        replace(n, pods=tuple(p for p in n.pods if keep(p)))
        for n in plan.nodes
        if (node is None or n.node.name == node) and (pool is None or (n.settings.pool or "(default)") == pool)
    ]
    unbound = [p for p in plan.unbound if node is None and pool is None and keep(p)]
    return ClusterPlan(nodes, unbound)


def plan_json(plan: ClusterPlan) -> dict[str, Any]:
    pods = [pod_json(p, n.summary) for n in plan.nodes for p in n.pods] + [pod_json(p) for p in plan.unbound]
    return {"nodes": [node_json(n) for n in plan.nodes], "pods": pods}


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart, like kubectl."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _current(p: PodPlan) -> str:
    """The pod's CPU limit in its spec; and what the kubelet applied, when that differs."""
    if p.pod.applied is None:
        return _spec_limit(p)
    differs = dict(p.pod.applied)
    limits = [differs.get(c.name, c.cpu_limit) for c in p.pod.containers if c.kind != INIT]
    total = None if any(not v for v in limits) else sum(v or 0 for v in limits)
    return f"{_spec_limit(p)} (kubelet: {'none' if total is None else format_milli(total)})"


def _spec_limit(p: PodPlan) -> str:
    t = p.target
    if t is None:  # what the pod runs with now, whoever set it
        now = current_limit(p.pod)
        return "none" if now is None else format_milli(now)
    if t.pod_level:
        return format_milli(t.pod_level_current) if t.pod_level_current is not None else "none"
    if any(c.current is None for c in t.containers):
        return "none"
    return format_milli(sum(c.current or 0 for c in t.containers))


def plan_table(plan: ClusterPlan) -> str:
    nodes = [["NODE", "POOL", "ALLOCATABLE", "BOOKED", "SLACK", "MANAGED", "FACTOR", "MODE"]]
    for n in plan.nodes:
        s = n.summary
        nodes.append(
            [
                n.node.name,
                n.settings.pool or "-",
                format_milli(s.allocatable),
                format_milli(s.booked),
                format_milli(s.slack) if s.slack >= 0 else f"-{format_milli(-s.slack)}",
                # as the HeadroomConfig and NodePoolProfile status count them: a paused pool's
                # pods are managed, their limits held
                str(s.managed_pods + sum(1 for pp in n.pods if pp.reason == POOL_PAUSED)),
                f"{s.factor:.2f}",
                n.settings.mode,
            ]
        )
    tenants = any(p.tenant is not None for p in plan.all_pods())  # a TENANT column where tenants are named
    pods = [
        ["NAMESPACE", "POD", "NODE", "REASON", "REQUEST", "LIMIT", "TARGET", "WRITE", *(["TENANT"] if tenants else [])]
    ]
    dry_run = {pp.pod.key: n.settings.dry_run for n in plan.nodes for pp in n.pods}
    for p in plan.all_pods():
        t = p.target
        write = "-" if t is None else "no" if not t.apply else "dry-run" if dry_run.get(p.pod.key) else "yes"
        pods.append(
            [
                p.pod.namespace,
                p.pod.name,
                p.pod.node_name or "-",
                p.reason,
                format_milli(t.request if t else p.pod.booked_cpu),
                _current(p),
                format_milli(t.target) if t else "-",
                write,
                *([p.tenant or "-"] if tenants else []),
            ]
        )
    warnings = [f"warning: {p.pod.key}: {p.warning}" for p in plan.all_pods() if p.warning]
    return "\n\n".join([table(nodes), table(pods), *(["\n".join(warnings)] if warnings else [])])


def plan_wide(plan: ClusterPlan) -> str:
    """The table, then one row per container: what each gets and whether it is written."""
    rows = [["NAMESPACE", "POD", "CONTAINER", "REQUEST", "LIMIT", "APPLIED", "TARGET", "WRITE"]]
    dry_run = {pp.pod.key: n.settings.dry_run for n in plan.nodes for pp in n.pods}
    for p in plan.all_pods():
        applied = applied_limits(p.pod)
        for c in pod_json(p)["containers"]:
            target = c["targetLimitMilli"]
            write = (
                "-" if target is None else "no" if not c["apply"] else "dry-run" if dry_run.get(p.pod.key) else "yes"
            )
            rows.append(
                [
                    p.pod.namespace,
                    p.pod.name,
                    c["name"],
                    format_milli(c["requestMilli"]),
                    "none" if c["currentLimitMilli"] is None else format_milli(c["currentLimitMilli"]),
                    _applied_cell(c["name"], applied),
                    "-" if target is None else format_milli(target),
                    write,
                ]
            )
    return plan_table(plan) + "\n\n" + table(rows)


def _applied_cell(container: str, applied: dict[str, int | None]) -> str:
    """The wide table's APPLIED: the kubelet's limit; "-" for a container not running."""
    if container not in applied:
        return "-"
    v = applied[container]
    return "none" if v is None else format_milli(v)


def explain(plan: ClusterPlan, key: str) -> str | None:
    """The arithmetic behind one pod's limit, or None when the pod is not in the plan."""
    for n in plan.nodes:
        for p in n.pods:
            if p.pod.key == key:
                return _explain(n, p)
    for p in plan.unbound:
        if p.pod.key == key:
            return f"{key}: not managed ({p.reason}): it is not bound to a node in the input."
    return None


def tenant_lines(s: NodeSummary, st: Settings, tenant: str) -> list[str]:
    """How a node's slack is shared between tenants, the pod's tenant first (explain)."""
    assert s.pots is not None
    pot = s.pots[tenant]
    share = st.tenancy.max_node_slack_share
    cap = f"maxNodeSlackShare {float(share):g} of S = {format_milli(int(share * s.slack))}"
    lines = [
        f"  tenant {pot.tenant!r}: weight {float(pot.weight):g}, its managed requests here M_t = "
        f"{format_milli(pot.requests)}, its pot P = {format_milli(int(pot.pot))}"
        + (f" (capped: {cap})" if pot.capped else f" (S * w*M_t / sum of w*M over tenants; cap: {cap})")
    ]
    others = sorted((p for p in s.pots.values() if p.tenant != tenant), key=lambda p: (-p.pot, p.tenant))
    if others:
        shown = ", ".join(
            f"{p.tenant!r} w {float(p.weight):g} M_t {format_milli(p.requests)} P {format_milli(int(p.pot))}"
            + (" capped" if p.capped else "")
            for p in others[:5]
        )
        more = f" and {len(others) - 5} more" if len(others) > 5 else ""
        lines.append(f"  other tenants on the node: {shown}{more}")
    return lines


def _explain(n: NodePlan, p: PodPlan) -> str:
    s, st = n.summary, n.settings
    lines = [
        f"pod {p.pod.key} on node {n.node.name} (pool {st.pool or '(none)'}{', dry-run' if st.dry_run else ''})",
        f"  node: allocatable {format_milli(s.allocatable)}, booked by all pods {format_milli(s.booked)}, "
        f"slack S = {format_milli(s.slack)}",
        f"  managed pods N = {s.managed_pods}, their requests M = {format_milli(s.managed_requests)}, "
        f"factor F = 1 + S/M = {s.factor:.2f}",
    ]
    t = p.target
    if p.pod.resize_infeasible:
        lines.append(f"  its last resize was refused: {refusal_text(p.pod.resize_refusal)}")
    if p.tenant is not None:
        lines.append(f"  tenant: {p.tenant!r} (weight {float(st.tenancy.weight_of(p.tenant)):g})")
    if t is None:
        now = current_limit(p.pod)
        lines.append(
            f"  not managed: {p.reason}; its limit ({'none' if now is None else format_milli(now)}) is left as it is, "
            "its requests count in the booking"
        )
        if p.warning:
            lines.append(f"  why: {p.warning}")
        return "\n".join(lines)
    r = t.request
    if s.slack > 0:
        prop, _ = s.burst(t.managed)
        floor = min(st.min_burst_floor, s.slack // s.managed_pods)
        share = "S*r/M"
        if s.pots is not None:
            lines.extend(tenant_lines(s, st, t.managed.tenant))
            share = "P*r/M_t"
        lines.append(
            f"  burst = max({share} = {format_milli(prop)}, min(minBurstFloor {format_milli(st.min_burst_floor)}, "
            f"S/N = {format_milli(s.slack // s.managed_pods)}) = {format_milli(floor)}) = {format_milli(max(prop, floor))}"
        )
        lines.append(f"  limit = request {format_milli(r)} + burst = {format_milli(r + max(prop, floor))}")
    else:
        lines.append("  the node has no slack: the limit is the request")
    mult = "none" if not st.max_multiplier else f"{float(st.max_multiplier):g}x"
    lines.append(
        f"  caps: maxMultiplier {mult}, allocatable {format_milli(s.allocatable)}, "
        f"max-cpu annotation {format_milli(t.managed.user_cap) if t.managed.user_cap else 'none'}"
        + (f", {t.managed.cap.source} {format_milli(t.managed.cap.value)}" if t.managed.cap else "")
    )
    lines.append(f"  target {format_milli(t.target)} (decided by: {t.bound}; quantized to 10m)")
    if t.pod_level:
        cur = format_milli(t.pod_level_current) if t.pod_level_current is not None else "none"
        lines.append(
            f"  pod-level limit: {cur} -> {format_milli(t.target)}{'' if t.apply else ' (within deadband, not written)'}"
        )
    applied = applied_limits(p.pod) if p.pod.applied is not None else {}
    for c in t.containers:
        cur = format_milli(c.current) if c.current is not None else "none"
        note = "" if c.apply else " (within deadband)"
        if c.name in applied:
            v = applied[c.name]
            note += f" (the kubelet reports {'none' if v is None else format_milli(v)} applied)"
        lines.append(
            f"  container {c.name}: request {format_milli(c.request)}, limit {cur} -> {format_milli(c.target)}{note}"
        )
    if t.apply:
        write = "dry-run only" if st.dry_run else "yes"
    elif t.bound.startswith("ResourceQuota "):
        write = f"no, {t.bound} has no room left for the raise"
    elif all(c.current == c.target for c in t.containers) and (not t.pod_level or t.pod_level_current == t.target):
        write = "no, already at target"
    else:
        write = "no, within the deadband of the target (a change this small is not worth a resize)"
    lines.append("  write: " + write)
    if p.warning:
        lines.append(f"  warning: {p.warning}")
    return "\n".join(lines)


def find(plan: ClusterPlan, key: str) -> tuple[NodePlan, PodPlan] | None:
    for n in plan.nodes:
        for p in n.pods:
            if p.pod.key == key:
                return n, p
    return None


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _hms(t: float) -> str:
    return f"{datetime.datetime.fromtimestamp(t, datetime.UTC):%H:%M:%S}"


# Below these shares of the window, neither the limit nor the node holds a container back.
THROTTLED_SHARE, WAITING_SHARE = 0.05, 0.05


def pressure_verdict(r: Throttling) -> str:
    """Whether a container waits for CPU because its own limit throttles it or because the
    node is contended, from the kernel's CFS counters and its pressure (PSI) counters."""
    assert r.waiting is not None
    said = f"CPU pressure (PSI): some task waited for a CPU {_pct(r.waiting)} of the time"
    if r.share >= THROTTLED_SHARE:
        return said + f"; throttled in {_pct(r.share)} of its periods: its own limit holds it back"
    if r.waiting >= WAITING_SHARE:
        return said + f", throttled in {_pct(r.share)} of its periods: the node is contended, not its limit"
    return said + ": neither its limit nor the node holds it back"


def measured(n: NodePlan, p: PodPlan, rows: list[Throttling], window: float, source: str) -> str:
    """What `explain --prometheus` adds below the arithmetic: the pod's measured throttling
    per container and over time, whose limit it was, who books the node, and the what-if."""
    minutes = f"{window / 60:g}m" if window < 3600 else f"{window / 3600:g}h"
    lines = [f"  measured over the last {minutes} ({source}, the kubelet's cAdvisor counters):"]
    if not rows:
        lines.append(
            "    no CFS counters for this pod: the kernel counts throttling only for a container with a CPU limit, "
            "and Prometheus must scrape the kubelets' /metrics/cadvisor"
        )
    limits = {c.name: c.cpu_limit for c in p.pod.containers}
    for r in rows:
        used = "" if r.cpu_avg is None else f"; CPU used {format_milli(round(r.cpu_avg * 1000))} on average"
        if r.cpu_p95 is not None:
            used += f", p95 {format_milli(round(r.cpu_p95 * 1000))}"
        lim = limits.get(r.container)
        used += f", limit now {format_milli(lim)}" if lim is not None else ", no limit now"
        lines.append(
            f"    container {r.container}: throttled in {_pct(r.share)} of its CFS periods, "
            f"{r.throttled_seconds:.1f}s in all{used}"
        )
        if r.waiting is not None:
            lines.append(f"      {pressure_verdict(r)}")
        if r.limits:
            history = " → ".join(f"{_hms(t)} {format_milli(round(v * 1000)) if v > 0 else 'none'}" for t, v in r.limits)
            lines.append(f"      CPU limit the kernel enforced (cAdvisor's CFS quota), where it changed: {history}")
        if r.timeline:
            points = " · ".join(f"{_hms(t)} {_pct(v)} {secs:.2f}s/s" for t, v, secs in r.timeline)
            lines.append(
                f"      throttled over the minute before (UTC; share of periods, seconds per second): {points}"
            )
    t = p.target
    if t is None:
        lines.append(f"  whose limit: not Headroom's; the pod is not managed ({p.reason})")
    elif n.settings.dry_run:
        lines.append(f"  whose limit: not Headroom's; dry-run computes {format_milli(t.target)} and writes nothing")
    else:
        lines.append(f"  whose limit: Headroom's, {format_milli(t.target)}, decided by: {t.bound}")
    s = n.summary
    top = sorted(n.pods, key=lambda q: -q.pod.booked_cpu)[:5]
    who = ", ".join(f"{q.pod.key} {format_milli(q.pod.booked_cpu)}{'' if q.managed else ' (not managed)'}" for q in top)
    lines.append(
        f"  booked by: {format_milli(s.booked)} of {format_milli(s.allocatable)} on {n.node.name}; the largest: {who}"
    )
    own = sum(c.cpu_request for c in p.pod.containers if c.kind != INIT)
    ifs = []
    at = what_if(n, p.pod.key)
    if at is not None:
        ifs.append(f"{'managed ' if t is None else ''}at its request {format_milli(own)}: limit {format_milli(at)}")
    p95 = sum(r.cpu_p95 or 0.0 for r in rows)
    if p95 > 0:
        want = max(round(p95 * 1000 / 10) * 10, 10)
        at = what_if(n, p.pod.key, want)
        if at is not None:
            ifs.append(f"at a request of its p95 use, {format_milli(want)}: limit {format_milli(at)}")
    if ifs:
        lines.append("  what-if on this node: " + "; ".join(ifs))
    return "\n".join(lines)


PROMETHEUS_HINT = (
    "  measured throttling: add --prometheus URL (a Prometheus that scrapes the kubelets' /metrics/cadvisor) "
    "to see it, who books the node and what other requests would give"
)


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kube-headroom plan</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px} h2{font-size:16px;margin:20px 0 6px}
.bar{display:flex;height:18px;width:640px;border:1px solid #999;background:#fff}
.bar div{height:100%} .other{background:#9aa5b1} .managed{background:#3b82f6} .slack{background:#d1fae5}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
table{border-collapse:collapse;margin-top:6px} td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} .write{font-weight:600}
</style></head><body>
<h1>kube-headroom plan</h1>
<p class="legend"><span class="other"></span>booked by other pods<span class="managed"></span>managed requests<span class="slack"></span>slack</p>
<div id="nodes"></div>
<script id="plan" type="application/json">__PLAN__</script>
<script>
const plan = JSON.parse(document.getElementById("plan").textContent);
const cores = m => m === null || m === undefined ? "-" : (m / 1000).toFixed(2);
const root = document.getElementById("nodes");
for (const n of plan.nodes) {
  const section = document.createElement("section");
  section.className = "node"; section.dataset.node = n.name;
  const h = document.createElement("h2");
  h.textContent = `${n.name} (${n.pool || "(default)"}) factor ${n.factor.toFixed(2)}${n.dryRun ? " dry-run" : ""}`;
  section.appendChild(h);
  const bar = document.createElement("div"); bar.className = "bar";
  const alloc = Math.max(n.allocatableMilli, n.bookedMilli, 1);
  const parts = [["other", n.bookedMilli - n.managedRequestsMilli], ["managed", n.managedRequestsMilli], ["slack", Math.max(n.slackMilli, 0)]];
  for (const [cls, m] of parts) {
    const d = document.createElement("div"); d.className = cls; d.dataset.milli = m;
    d.style.width = (100 * Math.max(m, 0) / alloc) + "%"; d.title = `${cls}: ${cores(m)} cores`;
    bar.appendChild(d);
  }
  section.appendChild(bar);
  const throttled = plan.throttled || null;
  const pct = v => v === undefined ? "-" : `${Math.round(100 * v)}%`;
  if (throttled) {
    const hot = plan.pods.filter(p => p.node === n.name && (throttled[`${p.namespace}/${p.name}`] || 0) >= 0.05);
    const note = document.createElement("p"); note.className = "throttled";
    note.textContent = hot.length ? "throttled: " + hot.map(p => `${p.namespace}/${p.name} ${pct(throttled[`${p.namespace}/${p.name}`])}`).join(", ") : "no pod throttled in 5% or more of its CPU periods";
    section.appendChild(note);
  }
  const table = document.createElement("table");
  const head = table.insertRow();
  const tenants = plan.pods.some(p => p.tenant !== undefined);
  const pot = p => p.tenant === undefined ? "-" : p.tenantPotMilli === undefined ? p.tenant
    : `${p.tenant} (weight ${p.tenantWeight}, pot ${cores(p.tenantPotMilli)}${p.tenantCapped ? ", capped" : ""})`;
  for (const t of ["pod", "reason", "request", "current limit", "target", "write", ...(throttled ? ["throttled"] : []), ...(tenants ? ["tenant"] : [])]) {
    const th = document.createElement("th"); th.textContent = t; head.appendChild(th);
  }
  for (const p of plan.pods.filter(p => p.node === n.name)) {
    const current = p.containers.every(c => c.currentLimitMilli === null) ? null
      : p.containers.reduce((s, c) => s + (c.currentLimitMilli || 0), 0);
    const row = table.insertRow(); row.className = "pod"; row.dataset.pod = `${p.namespace}/${p.name}`;
    const write = !p.managed ? "-" : !p.apply ? "no" : n.dryRun ? "dry-run" : "yes";
    const cells = [`${p.namespace}/${p.name}`, p.reason, cores(p.requestMilli), cores(current), cores(p.targetLimitMilli), write];
    if (throttled) cells.push(pct(throttled[`${p.namespace}/${p.name}`]));
    if (tenants) cells.push(pot(p));
    for (const v of cells) {
      row.insertCell().textContent = v;
    }
    row.cells[5].className = "write";
  }
  section.appendChild(table);
  root.appendChild(section);
}
document.body.dataset.rendered = "yes";
</script></body></html>
"""


def plan_html(plan: ClusterPlan, throttled: dict[str, float] | None = None) -> str:
    """One self-contained page: per node a bar of booked / managed / slack CPU, per pod
    request → current → target, and with `throttled` (namespace/pod → share of CFS periods
    throttled, from Prometheus) a throttled column and the node's throttled pods under its
    bar. The data is embedded as JSON (with `<` escaped, so no pod or namespace name can
    close the script) and drawn with textContent only."""
    data = plan_json(plan)
    if throttled is not None:
        data["throttled"] = {k: round(v, 4) for k, v in throttled.items()}
    return _HTML.replace("__PLAN__", json.dumps(data).replace("<", "\\u003c"))
