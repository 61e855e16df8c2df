"""The latency comparison on a real node: a service's tail latency, and its neighbours'
reach, under tight static CPU limits, no CPU limits, and Headroom.

The service (`tests/latency/cmd/svc`, a static Go binary in an OCI image made here) spends
a fixed CPU cost per request; the same binary with `-spin` is every neighbour (threads
spinning always, or all together for 200 ms of every second: a bursting neighbour). The
load generator (`tests/latency/cmd/loadgen`) runs on the host, outside the pods' cgroups,
sends at a constant rate and measures each latency from the request's intended send time
(open loop). Each pod's CPU use and throttling come from its container's cgroup, the
limits in force from the pod and the cgroup, the host's busy and steal time from
/proc/stat over the same window.

Used by tests/bench/bench_latency.py (the table) and the real-cluster test that holds what
cannot flake.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headroom.api.models import settings_from
from headroom.cluster.client import Api, ApiError
from headroom.core import keys
from headroom.core.policy import outside_deadband
from headroom.core.quantity import cpu_milli

from .controlplane import build_quietly
from .images import Entry, write_image
from .node import CpuCounters, RealNode, busy_pod, running_containers

SVC_IMAGE = "headroom.local/latency-svc:1"
STATIC, NONE, HEADROOM = "static", "no limits", "Headroom"
POLICIES = (STATIC, NONE, HEADROOM)
# Headroom under a tenancy setting (HeadroomConfig spec.tenancy), applied for the run.
TENANT_CAP = "Headroom, maxNodeSlackShare 0.5"
TENANT_TIER = "Headroom, svc's tenant at weight 2"
PERIOD_S = 0.1  # the kubelet's CFS period
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # pod IPs: never through a proxy

SERVICE = ("svc", "250m", "500m")  # (name, request, static limit)
DEFAULTS = settings_from(None)  # the deadbands of the HeadroomConfig the scenarios run under (defaults)
TIMEOUT_S = 2.0  # a request slower than this is a timeout, not a latency


@dataclass(frozen=True)
class Neighbour:
    """A pod beside the service: `threads` spinning, always (on_ms 0) or together for
    `on_ms` of every `every_ms`."""

    name: str
    request: str
    static: str  # its CPU limit under the static policy
    threads: int
    on_ms: int = 0
    every_ms: int = 1000


BATCH = Neighbour("batch", "250m", "500m", 2)
RUNAWAY = Neighbour("runaway", "100m", "200m", 4)


@dataclass(frozen=True)
class Scenario:
    """The pods of one row of the table: the service (its request may differ: the tenant
    contract) and its neighbours."""

    name: str
    neighbours: tuple[Neighbour, ...] = (BATCH,)
    svc_request: str = SERVICE[1]
    svc_static: str = SERVICE[2]
    tenants: bool = False  # the neighbours in a namespace of their own: another tenant than svc's

    @property
    def runaway(self) -> bool:
        return any(n.name == RUNAWAY.name for n in self.neighbours)


SVC_BATCH = Scenario("svc + batch")
# Tenant A's three pods spinning beside tenant B's service (its own namespace).
TENANT_A = tuple(Neighbour(f"a{i}", "250m", "500m", 2) for i in (1, 2, 3))
TENANTS = Scenario("tenants: svc (tenant B) beside tenant A's 3 spinning pods", TENANT_A, tenants=True)


def headroom(policy: str) -> bool:
    """Whether Headroom manages the run's pods (with or without a tenancy setting)."""
    return policy.startswith(HEADROOM)


def config_of(policy: str, scenario: Scenario, svc_namespace: str) -> dict[str, Any]:
    """The HeadroomConfig spec a run goes under ({}: the defaults). The tenant scenario runs
    without the burst floor, under every policy: min(minBurstFloor, S/N) is a per-pod
    promise, so a tenant of many small pods would be lifted above its pot by it
    (docs/policy.md, "Tenants")."""
    if not scenario.tenants:
        return {}
    spec: dict[str, Any] = {"minBurstFloor": "0"}
    if policy == TENANT_CAP:
        spec["tenancy"] = {"maxNodeSlackShare": 0.5}
    elif policy == TENANT_TIER:
        spec["tenancy"] = {"weights": [{"tenant": svc_namespace, "weight": 2}]}
    return spec


# The runaway alone beside a lightly loaded service on an otherwise idle node: nothing but
# its own limit can hold it (claim b).
REACH = Scenario("runaway's reach", (RUNAWAY,))


def _limit_of(pod: dict[str, Any]) -> str:
    """The pod's (one container's) CPU limit as written, or "none"."""
    return str(((pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}).get("cpu", "none"))


def build_latency() -> Path:
    """Build (or reuse) svc and loadgen; the directory holding them."""
    return build_quietly("latency", "the latency service and load generator")


def import_service_image(node: RealNode, bins: Path) -> None:
    archive = node.workdir / "latency-svc.tar"
    write_image(archive, SVC_IMAGE, [Entry("svc", source=bins / "svc")], ["/svc"])
    node.import_image(archive)


def calibrate(bins: Path, cost_ms: float) -> int:
    """The SHA-256 rounds that take `cost_ms` on this machine, unthrottled (the median of three)."""
    runs = sorted(
        int(
            subprocess.run(
                [str(bins / "svc"), "-calibrate", f"{cost_ms}ms"], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(3)
    )
    return runs[1]


def _spinner(n: Neighbour, node: str, limit: str | None) -> dict[str, Any]:
    pod = busy_pod(n.name, node, n.request, limit, image=SVC_IMAGE)
    pod["spec"]["containers"][0]["command"] = [
        "/svc", "-spin", str(n.threads), "-on", f"{n.on_ms}ms", "-every", f"{n.every_ms}ms",
    ]  # fmt: skip
    return pod


def _service(node: str, request: str, limit: str | None, rounds: int) -> dict[str, Any]:
    pod = busy_pod(SERVICE[0], node, request, limit, image=SVC_IMAGE)
    c = pod["spec"]["containers"][0]
    c["command"] = ["/svc", "-addr", ":8080", "-hashes", str(rounds)]
    return pod


@dataclass
class PodFigures:
    limit: str  # the CPU limit in the pod's spec ("none")
    quota_us: int  # the container's cpu.cfs_quota_us (-1: none)
    cores: float  # CPU used over the window
    throttled: float  # share of CFS periods throttled
    cpu_s: float  # CPU seconds used in the window
    window_s: float  # the window, between the two cgroup readings

    @property
    def bound(self) -> bool:
        """Its limit held it: it used at least 90 % of the CFS quota in force in its cgroup
        (quota / period) over the window. The quota, not the spec's limit: during a resize
        the two differ, and the kernel enforces the quota."""
        return self.quota_us > 0 and self.cores >= 0.9 * self.quota_us / (PERIOD_S * 1_000_000)


@dataclass
class Run:
    policy: str
    scenario: str
    load: float  # share of what the service serves with one whole CPU
    rate: float  # requests per second
    latency: dict[str, Any]  # loadgen's JSON
    pods: dict[str, PodFigures] = field(default_factory=dict)
    gomaxprocs: int = 0
    busy: float = 0.0  # the host's CPUs busy over the window (share of all)
    steal: float = 0.0  # of that, stolen by the hypervisor
    variant: str = ""  # e.g. "burst": CFS burst set on the service

    def saturated(self, key: str) -> bool:
        """The percentile sits at the timeout: what it would be is unknown."""
        return float(self.latency[key]) >= TIMEOUT_S * 1000 * 0.99

    @property
    def answered(self) -> int:
        """Requests the window answered: what its percentiles are taken over."""
        return int(self.latency.get("ok", 0))


def host_cpu() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of all the host's CPUs so far (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])
    return total - idle, steal, total


class Scenarios:
    """The pods of one scenario on one real node, and the runs against them. The controller
    (for Headroom) is the caller's: `headroom` says when it has written every limit."""

    def __init__(self, api: Api, node: RealNode, bins: Path, rounds: int, say: Callable[[str], None] = print) -> None:
        self.api, self.node, self.bins, self.rounds, self.say = api, node, bins, rounds, say
        self._serial = 0
        self.namespace_of: dict[str, str] = {}  # the current scenario's pods: name -> namespace

    def setup(self, policy: str, scenario: Scenario) -> tuple[str, dict[str, str]]:
        """A fresh namespace with the scenario's pods running (for Headroom: opted in, and
        every limit Headroom wrote in force in the cgroups); (namespace, name → container ID)."""
        ns = self.next_namespace()
        self._serial += 1
        others = f"{ns}-a" if scenario.tenants else ns
        labels = {keys.MODE_KEY: "managed"} if headroom(policy) else {}
        for name in {ns, others}:
            self.api.apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}, "latency"
            )
        static = policy != NONE
        pods = [
            (ns, _service(self.node.name, scenario.svc_request, scenario.svc_static if static else None, self.rounds))
        ]
        for n in scenario.neighbours:
            pods.append((others, _spinner(n, self.node.name, n.static if static else None)))
        self.namespace_of = {pod["metadata"]["name"]: where for where, pod in pods}
        for where, pod in pods:
            self.api.post(f"/api/v1/namespaces/{where}/pods", pod)
        ids: dict[str, str] = {}
        for where in {ns, others}:
            ids |= running_containers(self.api, where, [n for n, w in self.namespace_of.items() if w == where])
        self._wait_ready(ns)
        if headroom(policy):
            self._wait_headroom(ns, ids)
        return ns, ids

    def next_namespace(self) -> str:
        """The namespace the next setup() makes for svc."""
        return f"lat-{self._serial + 1}"

    def teardown(self, ns: str) -> None:
        spaces = {ns, *self.namespace_of.values()}
        for where in spaces:
            self.api.delete(f"/api/v1/namespaces/{where}")
        deadline = time.monotonic() + 120
        while spaces and time.monotonic() < deadline:
            for where in list(spaces):
                try:
                    self.api.get(f"/api/v1/namespaces/{where}")
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    spaces.discard(where)
            time.sleep(0.5)

    def _wait_ready(self, ns: str, timeout: float = 60) -> None:
        """Until the service answers its health check from the host, where the load comes from."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with _DIRECT.open(self._url(ns, "/healthz"), timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, KeyError) as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{ns}/svc does not answer from the host: {exc}") from None
            time.sleep(0.2)

    def _wait_headroom(self, ns: str, ids: dict[str, str], timeout: float = 60) -> None:
        """Until Headroom has decided on every pod (its status annotation names a target),
        each pod's limit is that target or within the deadband of it (a change inside it is
        not written: the controller's own rule, with the default HeadroomConfig the
        scenarios run under), and each cgroup holds the pod's limit."""
        deadline = time.monotonic() + timeout
        while True:
            done = True
            for name, cid in ids.items():
                pod = self.api.get(f"/api/v1/namespaces/{self.namespace_of.get(name, ns)}/pods/{name}")
                limit = _limit_of(pod)
                shown = (pod["metadata"].get("annotations") or {}).get(keys.STATUS_KEY)
                counters = self.node.counters(cid)
                if shown is None or limit == "none" or counters is None or counters.quota_us != cpu_milli(limit) * 100:
                    done = False
                    continue
                target = cpu_milli(json.loads(shown)["target"])
                done = done and not outside_deadband(cpu_milli(limit), target, DEFAULTS)
            if done:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ns}: Headroom did not settle every limit: {[self.limit(ns, n) for n in ids]}")
            time.sleep(0.2)

    def limit(self, ns: str, name: str) -> str:
        return _limit_of(self.api.get(f"/api/v1/namespaces/{self.namespace_of.get(name, ns)}/pods/{name}"))

    def _url(self, ns: str, path: str = "/") -> str:
        ip = self.api.get(f"/api/v1/namespaces/{ns}/pods/{SERVICE[0]}")["status"].get("podIP")
        if not ip:
            raise KeyError(f"{ns}/{SERVICE[0]} has no pod IP yet")
        return f"http://{ip}:8080{path}"

    def gomaxprocs(self, ns: str) -> int:
        with _DIRECT.open(self._url(ns, "/gomaxprocs"), timeout=5) as r:
            return int(r.read().decode().strip())

    def set_burst(self, cid: str, burst_us: int) -> None:
        """CFS burst (cgroup v1 `cpu.cfs_burst_us`) on a container and on its pod's cgroup
        above it (whose quota is the sum of its containers'): quota left unused may be spent
        later, up to `burst_us` a period. Kubernetes never sets it; the experiment does."""
        cgroup = self.node.container_cgroup(cid)
        if cgroup is None:
            raise RuntimeError(f"container {cid} has no cgroup")
        for d in (cgroup.parent, cgroup):
            (d / "cpu.cfs_burst_us").write_text(str(burst_us))

    def load(self, ns: str, rate: float, seconds: float, timeout: str = f"{TIMEOUT_S:g}s") -> dict[str, Any]:
        r = subprocess.run(
            [
                str(self.bins / "loadgen"),
                "-url",
                self._url(ns),
                "-rate",
                str(rate),
                "-duration",
                f"{seconds}s",
                "-timeout",
                timeout,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 60,
        )
        return dict(json.loads(r.stdout))

    def run(
        self,
        ns: str,
        ids: dict[str, str],
        policy: str,
        scenario: str,
        load: float,
        rate: float,
        seconds: float,
        variant: str = "",
    ) -> Run:
        """A short warm-up at the rate, then the measured window: latency from the load
        generator, CPU and throttling from each container's cgroup, the host's busy and
        steal share from /proc/stat, all over the same window."""
        procs = self.gomaxprocs(ns)  # before any load: under overload it would queue
        self.load(ns, rate, 1.0)
        before: dict[str, CpuCounters | None] = {n: self.node.counters(c) for n, c in ids.items()}
        host_before = host_cpu()
        latency = self.load(ns, rate, seconds)
        busy, steal, total = (a - b for a, b in zip(host_cpu(), host_before, strict=True))
        run = Run(policy, scenario, load, rate, latency, gomaxprocs=procs, variant=variant)
        run.busy, run.steal = (busy / total, steal / total) if total else (0.0, 0.0)
        for name, cid in ids.items():
            end, begin = self.node.counters(cid), before[name]
            if end is None or begin is None:
                raise RuntimeError(f"{ns}/{name}: its container went away during the run")
            share, _, cores = end.since(begin)
            window = end.at - begin.at
            run.pods[name] = PodFigures(self.limit(ns, name), end.quota_us, cores, share, cores * window, window)
        return run


def limit_allows(p: PodFigures) -> float:
    """The most CPU seconds a container's CFS quota lets it use over its window: the limit
    times the window, plus one period at each end (the readings fall inside periods)."""
    return cpu_milli(p.limit) / 1000 * (p.window_s + 2 * PERIOD_S)
