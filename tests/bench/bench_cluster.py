"""`headroom run` on the real test kube-apiserver, N nodes x 30 pods, against a naive operator.

    python tests/bench/bench_cluster.py                    # N = 100, then the churn phase
    python tests/bench/bench_cluster.py --nodes 300 --no-churn
    python tests/bench/bench_cluster.py --nodes 100 --subjects headroom,headroom-no-annotation,naive
    python tests/bench/bench_cluster.py --nodes 100 --no-churn --static-limits   # pods that have limits

Real parts: kube-apiserver and etcd built by tests/testenv/build.sh, with an audit log that
records every write of the subject's identity. The simulated kubelet (testbed.sim_kubelet's
SimulatedFleet: one watch in this process for every node, writing as an admin the audit
policy leaves out, the same answers the integration tests hold to a real kubelet's) starts
pods and actuates resizes into their status.

Each subject gets a fresh control plane with the same cluster: N Ready nodes of 32 CPU, 30
pods each without CPU limits (requests 50m-1 CPU; with `--static-limits`, a limit of twice
the request), in one managed namespace, and the
HeadroomConfig defaults (clientQPS 50, perNodePatchesPerSecond 10, debounce 2 s).

- `headroom`: the real `headroom run` process (its default workers, as the chart runs it).
- `headroom-no-annotation`: the same with `--status-annotation=false`.
- `naive`: what a Python team would write instead: the official `kubernetes` client,
  one watch, pods indexed by node, and for every pod event that pod's target (the same
  policy code, so both aim at the same limits) patched at once; no debounce, no node
  batching, no rate limit.

Printed per subject: time until every pod has its target (from the subject's start; and
from its first write, against pods / clientQPS), writes by kind from the audit log and
per changed pod, peak RSS and CPU seconds of the subject's process. With churn (after
convergence), one phase per `--churn-rates` entry: pods created at that rate on random
nodes, every fifth an earlier one deleted again; then p50/p99 from a pod's creation to
its limit and from each scheduling event until its node's last resize before the next
event on it, pods without a limit 10 s after, and resizes counted until the subject has
written nothing for 5 s (at most `--settle`): per created pod and over the fewest that
reach the final targets, with the pods the subject left off target and by how much (a
subject that stops early writes less, and that shows here). Nothing is asserted; figures
go to stdout.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


from bench.procstat import cpu_seconds, peak_rss_bytes  # noqa: E402
from headroom.cluster.client import MERGE_PATCH, Api, pod_path  # noqa: E402
from headroom.cluster.live import read_cluster  # noqa: E402
from headroom.core.quantity import cpu_milli  # noqa: E402
from helpers.cluster_helpers import apply_config, register_webhook  # noqa: E402
from testbed import controlplane  # noqa: E402
from testbed.sim_kubelet import SimulatedFleet  # noqa: E402

SUBJECT_TOKEN = "headroom-test-controller-token"  # user headroom-controller, bound to cluster-admin here
SUBJECT_USER = "headroom-controller"
NS = "bench"
CPUS = ["50m", "100m", "100m", "250m", "250m", "500m", "1"]

AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [{SUBJECT_USER}]
  verbs: [create, update, patch, delete]
- level: None
"""


# --- the cluster --------------------------------------------------------------------
def start_control_plane(workdir: Path) -> controlplane.ControlPlane:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
    cp = controlplane.ControlPlane(
        controlplane.build(),
        workdir=workdir,
        extra_args=[
            f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
            f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-maxsize=0",
        ],
    )
    return cp.start()


def pod_body(name: str, node: str, cpu: str, limit: str | None = None) -> dict[str, Any]:
    limits = {"memory": "256Mi", **({"cpu": limit} if limit else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name.rsplit("-", 1)[0]}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example.com/app:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "128Mi"}, "limits": limits},
                }
            ],
        },
    }


def populate(
    api: Api, nodes: int, per_node: int, rng: random.Random, spec: dict[str, Any], static_limits: bool = False
) -> list[str]:
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        api.apply(YAML(typ="safe").load(crd.read_text()), "bench")
    api.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-subject"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "User", "name": SUBJECT_USER, "apiGroup": "rbac.authorization.k8s.io"}],
        },
        "bench",
    )
    api.post(
        "/api/v1/namespaces",
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NS, "labels": {"kube-headroom.dev/mode": "managed"}},
        },
    )
    names = [f"node-{i:04d}" for i in range(nodes)]

    def make_node(name: str) -> None:
        api.post(
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}}},
        )
        api.patch(
            f"/api/v1/nodes/{name}/status",
            {
                "status": {
                    "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}],
                    "nodeInfo": {"kubeletVersion": "v1.37.2"},
                }
            },
            MERGE_PATCH,
        )

    pods = [(f"p{n:04d}-{i:02d}", node, rng.choice(CPUS)) for n, node in enumerate(names) for i in range(per_node)]
    if static_limits:  # a cluster that has limits to fix: each pod at twice its request
        pods = [(name, node, cpu, f"{2 * cpu_milli(cpu)}m") for name, node, cpu in pods]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(make_node, names))
        list(ex.map(lambda p: api.post(f"/api/v1/namespaces/{NS}/pods", pod_body(*p)), pods))
    apply_config(api, spec, "bench")  # the config is the last thing the subject needs
    return names


class Arrivals:
    """When each pod was created and first showed a CPU limit, from the simulated
    kubelet's watch (its `observe`)."""

    def __init__(self) -> None:
        self.limited_at: dict[str, float] = {}  # pod name -> first time it had a CPU limit
        self.born_limited: set[str] = set()  # pods whose first event already had one (the webhook)
        self.seen: set[str] = set()
        self.created_at: dict[str, float] = {}

    def __call__(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        limited = "cpu" in ((pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {})
        if name not in self.seen:
            self.seen.add(name)
            if limited:
                self.born_limited.add(name)  # its first event has a limit: set at admission
        if limited and name not in self.limited_at:
            self.limited_at[name] = time.monotonic()


def all_running(api: Api, total: int) -> bool:
    pods = [p for page in api.list_pages(f"/api/v1/namespaces/{NS}/pods") for p in page["items"]]
    return len(pods) >= total and all((p.get("status") or {}).get("phase") == "Running" for p in pods)


def unconverged(api: Api) -> int:
    """The pods the policy would still write (off target, outside the deadband)."""
    return off_target(api)[0]


def off_target(api: Api) -> tuple[int, int]:
    """(pods the policy would still write, the CPU millicores their limits are off by)."""
    plan = read_cluster(api).plan(pod_level_resize=False)
    off = [pp.target for pp in plan.all_pods() if pp.target is not None and pp.target.apply]
    milli = sum(abs(c.target - (c.current or 0)) for t in off for c in t.containers)
    return len(off), milli


def audit(workdir: Path, names: bool = False) -> list[tuple[float, str]]:
    """(time, kind) of every write of the subject's (refused ones as "refused CODE ...");
    with `names`, a resize's kind also names its pod ("resize NAME")."""
    out = []
    with open(workdir / "audit.log") as f:
        for line in f:
            e = json.loads(line)
            ref = e.get("objectRef") or {}
            code = (e.get("responseStatus") or {}).get("code", 0)
            if code >= 300:
                kind = f"refused {code} {ref.get('resource')}/{ref.get('subresource') or ''}".rstrip("/")
            elif ref.get("resource") == "pods" and ref.get("subresource") == "resize":
                kind = f"resize {ref.get('name')}" if names else "resize"
            elif ref.get("resource") == "pods" and not ref.get("subresource"):
                kind = "annotation"
            elif ref.get("resource") == "events":
                kind = "event"
            else:
                kind = f"{ref.get('resource')}/{ref.get('subresource') or ''}".rstrip("/")
            ts = e["stageTimestamp"]
            t = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
            out.append((t, kind))
    return out


def settle(workdir: Path, most: float) -> float:
    """Wait until the subject has written nothing for 5 s (at most `most` s); when its last
    write was (time.monotonic())."""
    deadline = time.monotonic() + most
    last_size, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        size = (workdir / "audit.log").stat().st_size
        if size != last_size:
            last_size, last_change = size, time.monotonic()
        elif time.monotonic() - last_change >= 5.0:
            break
        time.sleep(0.5)
    return last_change


def proc_figures(pid: int) -> tuple[float, float]:
    """(peak RSS in MB, CPU seconds) of a live process."""
    return peak_rss_bytes(pid) / 1e6, cpu_seconds(pid)


# --- the naive operator ---------------------------------------------------------------
def naive_operator(kubeconfig: str) -> None:
    """One watch; every event's pod reconciled at once, alone (run as a subprocess)."""
    import kubernetes

    from headroom.core.params import Settings
    from headroom.core.planner import plan_node
    from headroom.core.quantity import format_milli
    from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict

    kubernetes.config.load_kube_config(kubeconfig)
    v1 = kubernetes.client.CoreV1Api()
    client = kubernetes.client.ApiClient()
    plain = client.sanitize_for_serialization
    nodes = {n.metadata.name: node_from_dict(plain(n)) for n in v1.list_node().items}
    namespaces = {n.metadata.name: namespace_from_dict(plain(n)) for n in v1.list_namespace().items}
    by_node: dict[str, dict[str, Any]] = {}  # node -> pod key -> record: an event costs its node only
    node_of: dict[str, str] = {}
    settings = Settings()
    rv = None
    while True:
        stream = kubernetes.watch.Watch().stream(
            v1.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=300
        )
        for ev in stream:
            obj = ev["object"]
            rv = obj.metadata.resource_version
            key = f"{obj.metadata.namespace}/{obj.metadata.name}"
            if ev["type"] == "DELETED":
                by_node.get(node_of.pop(key, ""), {}).pop(key, None)
                continue
            rec = pod_from_dict(plain(obj))
            node = nodes.get(rec.node_name or "")
            if node is None:
                continue
            node_of[key] = node.name
            on_node = by_node.setdefault(node.name, {})
            on_node[key] = rec
            plan = plan_node(
                node, list(on_node.values()), namespaces, settings, pod_level_resize=False, backing_off=frozenset()
            )
            mine = next(pp for pp in plan.pods if pp.pod.key == key)
            t = mine.target
            if t is None or not t.apply:
                continue
            body = {
                "spec": {
                    "containers": [
                        {"name": c.name, "resources": {"limits": {"cpu": format_milli(c.target)}}} for c in t.containers
                    ]
                }
            }
            with contextlib.suppress(kubernetes.client.ApiException):
                v1.patch_namespaced_pod_resize(obj.metadata.name, obj.metadata.namespace, body)


# --- a run ------------------------------------------------------------------------------
def run_subject(subject: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cp = start_control_plane(workdir)
    api = cp.api()
    rng = random.Random(11)
    try:
        populate(api, args.nodes, args.pods_per_node, rng, json.loads(args.spec), args.static_limits)
        arrivals = Arrivals()
        fleet = SimulatedFleet(api, NS, observe=arrivals).start()
        total = args.nodes * args.pods_per_node
        while not all_running(api, total):  # the subject starts on a settled cluster
            time.sleep(0.5)
        kubeconfig = cp.kubeconfig(SUBJECT_TOKEN)
        log = open(workdir / f"{subject}.log", "wb")  # noqa: SIM115 - closed below
        if subject == "naive":
            argv = [sys.executable, __file__, "--naive-operator", str(kubeconfig)]
        else:
            argv = [sys.executable, "-m", "headroom", "run", f"--kubeconfig={kubeconfig}", "--no-leader-elect"]
            argv += ["--metrics-port=0", "--health-port=0"]
            if subject == "headroom-no-annotation":
                argv.append("--status-annotation=false")
        webhook = subject != "naive" and args.webhook
        if webhook:  # served from the start; registered only for the churn, after convergence
            certs = workdir / "webhook"
            certs.mkdir()
            cp.ca.issue(certs, "tls", ["127.0.0.1"])
            port = controlplane.free_port()
            argv += [f"--webhook-port={port}", f"--webhook-cert-dir={certs}"]
        began = time.monotonic()
        wall_began = time.time()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        left = total
        while left and time.monotonic() - began < args.timeout:
            time.sleep(1.0)
            left = unconverged(api)
        converged_s = time.monotonic() - began
        drained_s = settle(workdir, args.settle) - began  # the annotations and events after the last resize
        writes = audit(workdir)
        resized = {k for _, k in audit(workdir, names=True) if k.startswith("resize ")}
        rss, cpu = proc_figures(proc.pid)
        first = min((t for t, k in writes if k == "resize"), default=wall_began) - wall_began
        by_kind: dict[str, int] = {}
        for _, k in writes:
            by_kind[k] = by_kind.get(k, 0) + 1
        out: dict[str, Any] = {
            "subject": subject,
            "pods": total,
            "converged_s": converged_s if not left else None,
            "left": left,
            "first_write_s": first,
            "drained_s": drained_s,
            "writes": by_kind,
            "pods_resized": len(resized),
            "rss_mb": rss,
            "cpu_s": cpu,
        }
        if args.churn:
            if webhook:
                register_webhook(api, "headroom-bench", port, cp.ca_file.read_bytes())
                time.sleep(2.0)  # the API server picks the configuration up
            node_of = {
                f"p{n:04d}-{i:02d}": f"node-{n:04d}" for n in range(args.nodes) for i in range(args.pods_per_node)
            }
            out["churn"] = []
            for rate in (float(r) for r in args.churn_rates.split(",")):
                phase = churn(api, arrivals, rate, args, workdir, len(audit(workdir)), node_of)
                out["churn"].append({**phase, "webhook": webhook})
            out["rss_mb"], out["cpu_s"] = proc_figures(proc.pid)
        proc.terminate()
        proc.wait(10)
        log.close()
        fleet.stop()
        return out
    finally:
        cp.stop()


def churn(
    api: Api,
    arrivals: Arrivals,
    rate: float,
    args: argparse.Namespace,
    workdir: Path,
    writes_before: int,
    node_of: dict[str, str],
) -> dict[str, Any]:
    """Pods created at `rate`/s on random nodes, every fifth an earlier one deleted again;
    then what it cost and how long the nodes took to settle."""
    rng = random.Random(5)
    created: list[str] = []
    deleted = 0
    period = 1.0 / rate
    events: dict[str, list[float]] = {}  # node -> the wall-clock times of its scheduling events
    # Every pod's CPU limits before the churn (a new pod's: as admitted), to count the
    # fewest resizes that reach the final targets from them.
    before = {
        p["metadata"]["name"]: _cpu_limits(p)
        for page in api.list_pages(f"/api/v1/namespaces/{NS}/pods")
        for p in page["items"]
    }
    start = time.monotonic()
    for i in range(args.churn_pods):
        name = f"churn{rate:g}-{i:05d}"
        node = f"node-{rng.randrange(args.nodes):04d}"
        arrivals.created_at[name] = time.monotonic()
        events.setdefault(node, []).append(time.time())
        node_of[name] = node
        before[name] = _cpu_limits(api.post(f"/api/v1/namespaces/{NS}/pods", pod_body(name, node, rng.choice(CPUS))))
        created.append(name)
        if i % 5 == 4:  # every fifth: one of the earlier ones goes again
            gone = created.pop(rng.randrange(len(created)))
            events.setdefault(node_of[gone], []).append(time.time())
            api.delete(pod_path(NS, gone), {"gracePeriodSeconds": 0})
            deleted += 1
        time.sleep(max(0.0, start + (i + 1) * period - time.monotonic()))
    churn_end = time.monotonic()
    time.sleep(10.0)
    live = set(created)
    without = sum(1 for n in live if n not in arrivals.limited_at)
    lat = sorted(arrivals.limited_at[n] - arrivals.created_at[n] for n in live if n in arrivals.limited_at)
    # every write the churn caused: until the subject has been quiet for 5 s (at most --settle)
    drained = settle(workdir, args.settle) - churn_end
    writes = audit(workdir, names=True)[writes_before:]
    resizes = [(t, k) for t, k in writes if k.startswith("resize")]
    own = sum(1 for _, k in resizes if k.startswith("resize churn"))
    seeded = sum(1 for n in live if n in arrivals.born_limited)
    at_least = fewest_resizes(api, before)
    # A subject that stops early writes less: what it left off target counts against it.
    left, left_milli = off_target(api)
    refused: dict[str, int] = {}
    for _, k in writes:
        if k.startswith("refused"):
            refused[k] = refused.get(k, 0) + 1
    settles = node_settle_times(events, resizes, node_of)
    return {
        "rate": rate,
        "created": args.churn_pods,
        "deleted": deleted,
        "without_limit_10s_after": without,
        "p50_s": statistics.median(lat) if lat else None,
        "p99_s": lat[int(0.99 * (len(lat) - 1))] if lat else None,
        "settle_p50_s": statistics.median(settles) if settles else None,
        "settle_p99_s": settles[int(0.99 * (len(settles) - 1))] if settles else None,
        "resizes_per_created": len(resizes) / args.churn_pods,
        "fewest_per_created": at_least / args.churn_pods,
        "over_floor": len(resizes) / at_least if at_least else None,
        "left_off_target": left,
        "left_off_by_milli": left_milli,
        "drained_s": drained,
        "own_resizes": own,
        "neighbour_resizes": len(resizes) - own,
        "seeded_at_admission": seeded,
        "refused": refused,
    }


def node_settle_times(
    events: dict[str, list[float]], resizes: list[tuple[float, str]], node_of: dict[str, str]
) -> list[float]:
    """For every scheduling event (a pod created on or deleted from a node), the time to
    the node's last resize before its next event: how long until every pod the event
    affected had its new limit (0 where it needed none). Sorted."""
    by_node: dict[str, list[float]] = {}
    for t, kind in resizes:
        node = node_of.get(kind.split(" ", 1)[1]) if " " in kind else None
        if node is not None:
            by_node.setdefault(node, []).append(t)
    out = []
    for node, times in events.items():
        times = sorted(times)
        written = sorted(by_node.get(node, []))
        for i, t in enumerate(times):
            nxt = times[i + 1] if i + 1 < len(times) else float("inf")
            last = max((w for w in written if t <= w < nxt), default=t)
            out.append(last - t)
    return sorted(out)


def _cpu_limits(pod: dict[str, Any]) -> dict[str, str | None]:
    return {c["name"]: ((c.get("resources") or {}).get("limits") or {}).get("cpu") for c in pod["spec"]["containers"]}


def fewest_resizes(api: Api, before: dict[str, dict[str, str | None]]) -> int:
    """The fewest resizes any controller needs to bring every pod now on the cluster from
    its CPU limits before the churn (a new pod's: as admitted) to the policy's targets on
    the cluster as it is now: the pods whose earlier limits the policy would change (the
    same deadband), one resize each."""
    snap = read_cluster(api)
    pods = []
    for pod in snap.pods:
        was = before.get(pod.name)
        if was is not None:
            limits = tuple(
                replace(c, cpu_limit=cpu_milli(was[c.name]) if was.get(c.name) else None) for c in pod.containers
            )
            pod = replace(pod, containers=limits)
        pods.append(pod)
    snap.pods = pods
    plan = snap.plan(pod_level_resize=False)
    return sum(1 for pp in plan.all_pods() if pp.target is not None and pp.target.apply)


def report(results: list[dict[str, Any]], qps: float) -> None:
    print()
    for r in results:
        w = r["writes"]
        total = sum(w.values())
        changed = r["pods_resized"] or 1
        conv = f"{r['converged_s']:.1f} s" if r["converged_s"] is not None else f"not converged ({r['left']} left)"
        print(
            f"{r['subject']}: {r['pods']} pods converged in {conv}; first resize {r['first_write_s']:.1f} s after start"
        )
        if r["converged_s"] is not None:
            ideal = r["pods"] / qps
            print(
                f"  from first resize: {r['converged_s'] - r['first_write_s']:.1f} s = "
                f"{(r['converged_s'] - r['first_write_s']) / ideal:.2f} x pods/clientQPS ({ideal:.0f} s)"
            )
        print(
            f"  writes: {total} ({', '.join(f'{k} {v}' for k, v in sorted(w.items()))}); {total / changed:.2f} per resized pod"
        )
        print(f"  the last write {r['drained_s']:.1f} s after start (annotations and events follow the resizes)")
        print(f"  process: peak RSS {r['rss_mb']:.0f} MB, {r['cpu_s']:.1f} CPU s")
        for c in r.get("churn") or []:

            def f(v: float | None, fmt: str = ".2f") -> str:
                return "-" if v is None else format(v, fmt)

            print(
                f"  churn {c['rate']:g}/s: {c['created']} created, {c['deleted']} deleted; creation -> limit "
                f"p50 {f(c['p50_s'])} s, p99 {f(c['p99_s'])} s; scheduling event -> its node's last resize "
                f"p50 {f(c['settle_p50_s'])} s, p99 {f(c['settle_p99_s'])} s; "
                f"{c['without_limit_10s_after']} without a limit 10 s after; "
                f"{c['resizes_per_created']:.2f} resizes per created pod ({c['own_resizes']} of the new pods, "
                f"{c['neighbour_resizes']} of neighbours); the fewest any controller needs to reach the final "
                f"targets: {c['fewest_per_created']:.2f}; resizes / that floor: {f(c['over_floor'])}; "
                f"{c['left_off_target']} pods left off target (by {c['left_off_by_milli']}m in all); the last write "
                f"{c['drained_s']:.1f} s after the churn; refused: {c['refused'] or 'none'}; "
                f"webhook {'on' if c['webhook'] else 'off'}: {c['seeded_at_admission']} created with a limit"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods-per-node", type=int, default=30)
    ap.add_argument("--subjects", default="headroom,headroom-no-annotation,naive")
    ap.add_argument("--timeout", type=float, default=600.0, help="give up converging after this (s)")
    ap.add_argument(
        "--settle", type=float, default=180.0, help="at most this long for the writes after convergence to stop (s)"
    )
    ap.add_argument(
        "--webhook",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="headroom serves its admission webhook; registered for the churn phase",
    )
    ap.add_argument(
        "--spec",
        default="{}",
        help='HeadroomConfig spec as JSON, e.g. \'{"deadband": {"grow": 0.25, "shrink": 0.15}}\' (the naive '
        "operator keeps the defaults)",
    )
    ap.add_argument(
        "--static-limits",
        action="store_true",
        help="every pod starts with a static CPU limit of twice its request (a cluster with limits to fix)",
    )
    ap.add_argument("--churn", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument(
        "--churn-rates",
        default="4,20",
        help="pods created per second, one churn phase each, in order (at 30 nodes, 4/s asked for about 38 "
        "resizes/s, under clientQPS 50, and 20/s for about 124/s, over it)",
    )
    ap.add_argument("--churn-pods", type=int, default=300, help="pods created per churn phase")
    ap.add_argument("--workdir", default="/tmp/headroom-bench-cluster")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--naive-operator", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.naive_operator:
        naive_operator(args.naive_operator)
        return
    results = []
    for subject in args.subjects.split(","):
        wd = Path(args.workdir) / f"{subject}-{args.nodes}"
        if wd.exists():
            shutil.rmtree(wd)
        print(f"--- {subject}: {args.nodes} nodes x {args.pods_per_node} pods", flush=True)
        results.append(run_subject(subject, args, wd))
        report(results[-1:], 50.0)
    print("\n=== summary (same run, same machine) ===")
    report(results, 50.0)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
