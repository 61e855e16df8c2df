"""`headroom run` on the real test kube-apiserver, N nodes x 30 pods, against a naive operator.

    python tests/bench/bench_cluster.py                    # N = 100, then the churn phase
    python tests/bench/bench_cluster.py --nodes 300 --no-churn
    python tests/bench/bench_cluster.py --nodes 100 --subjects headroom,headroom-no-annotation,naive
    python tests/bench/bench_cluster.py --nodes 100 --no-churn --static-limits   # pods that have limits

Real parts: kube-apiserver and etcd built by tests/testenv/build.sh, with an audit log that
records every write of the subject's identity. A simulated fleet kubelet (one watch in
this process, writing as an admin the audit policy leaves out) starts pods and actuates
resizes into their status, as a kubelet's status manager does.

Each subject gets a fresh control plane with the same cluster: N Ready nodes of 32 CPU, 30
pods each without CPU limits (requests 50m-1 CPU; with `--static-limits`, a limit of twice
the request), in one managed namespace, and the
HeadroomConfig defaults (clientQPS 50, perNodePatchesPerSecond 10, debounce 2 s).

- `headroom`: the real `headroom run` process (its default workers, as the chart runs it).
- `headroom-no-annotation`: the same with `--status-annotation=false`.
- `naive`: what a Python team would write instead: the official `kubernetes` client,
  one watch, and for every pod event that pod's target (the same policy code, so both
  aim at the same limits) patched at once; no debounce, no node batching, no rate limit.

Printed per subject: time until every pod has its target (from the subject's start; and
from its first write, against pods / clientQPS), writes by kind from the audit log and
per changed pod, peak RSS and CPU seconds of the subject's process. With churn (after
convergence): pods created at `--churn-rate`/s on random nodes, every fifth deleted
again, then p50/p99 from a pod's creation to its limit, pods without a limit 10 s after
the churn, and resizes per created pod, counted until the subject has written nothing for
5 s (at most `--settle`). Nothing is asserted; figures go to stdout.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


from cluster_helpers import apply_config, register_webhook  # noqa: E402
from headroom.cluster.api import MERGE_PATCH, Api, ApiError, pod_path  # noqa: E402
from headroom.cluster.live import read_cluster  # noqa: E402
from headroom.core.quantity import cpu_milli  # noqa: E402
from testbed import controlplane  # noqa: E402

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


class FleetKubelet:
    """Every node's kubelet in one watch: starts pods, actuates resizes into status, and
    notes when each pod first shows a CPU limit."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.stop = threading.Event()
        self.limited_at: dict[str, float] = {}  # pod name -> first time it had a CPU limit
        self.born_limited: set[str] = set()  # pods whose first event already had one (the webhook)
        self.seen: set[str] = set()
        self.created_at: dict[str, float] = {}
        self._q: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.threads = [threading.Thread(target=self._watch, daemon=True)] + [
            threading.Thread(target=self._work, daemon=True) for _ in range(4)
        ]

    def start(self) -> FleetKubelet:
        for t in self.threads:
            t.start()
        return self

    def _watch(self) -> None:
        rv = None
        path = f"/api/v1/namespaces/{NS}/pods"
        while not self.stop.is_set():
            try:
                if rv is None:
                    listed = self.api.get(path)
                    rv = listed["metadata"]["resourceVersion"]
                    for p in listed["items"]:
                        self._seen(p)
                for line in self.api.watch(path, rv, timeout_seconds=60, read_timeout=90):
                    event = orjson.loads(line)
                    kind, obj = event["type"], event["object"]
                    if kind == "BOOKMARK":
                        rv = obj["metadata"]["resourceVersion"]
                        continue
                    if kind == "ERROR":
                        rv = None
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if kind != "DELETED":
                        self._seen(obj)
                    if self.stop.is_set():
                        return
            except ApiError:
                rv = None
                time.sleep(0.5)

    def _seen(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        ctr = pod["spec"]["containers"][0]
        limited = "cpu" in ((ctr.get("resources") or {}).get("limits") or {})
        if name not in self.seen:
            self.seen.add(name)
            if limited:
                self.born_limited.add(name)  # its first event has a limit: set at admission
        if limited and name not in self.limited_at:
            self.limited_at[name] = time.monotonic()
        st = (pod.get("status") or {}).get("containerStatuses") or []
        running = st[0].get("resources") if st else None
        if not st or running != ctr.get("resources"):
            with self._cond:
                self._q.append(pod)
                self._cond.notify()

    def _work(self) -> None:
        while not self.stop.is_set():
            with self._cond:
                while not self._q and not self.stop.is_set():
                    self._cond.wait(0.5)
                if not self._q:
                    continue
                pod = self._q.pop(0)
            meta, ctr = pod["metadata"], pod["spec"]["containers"][0]
            status = {
                "phase": "Running",
                "qosClass": "Burstable",
                "containerStatuses": [
                    {
                        "name": "app",
                        "image": ctr["image"],
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": "2026-11-29T00:00:00Z"}},
                        "allocatedResources": (ctr.get("resources") or {}).get("requests", {}),
                        "resources": ctr.get("resources"),
                    }
                ],
            }
            with contextlib.suppress(ApiError):  # changed (409) or deleted: the watch brings the newer pod
                self.api.patch(
                    pod_path(NS, meta["name"], "status"),
                    {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status},
                    MERGE_PATCH,
                )


def all_running(api: Api, total: int) -> bool:
    pods = [p for page in api.list_pages(f"/api/v1/namespaces/{NS}/pods") for p in page["items"]]
    return len(pods) >= total and all((p.get("status") or {}).get("phase") == "Running" for p in pods)


def unconverged(api: Api) -> int:
    """The pods the policy would still write (off target, outside the deadband)."""
    plan = read_cluster(api).plan(pod_level_resize=False)
    return sum(1 for pp in plan.all_pods() if pp.target is not None and pp.target.apply)


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
    hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return hwm / 1e6, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    pods: dict[str, Any] = {}
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
                pods.pop(key, None)
                continue
            rec = pod_from_dict(plain(obj))
            pods[key] = rec
            node = nodes.get(rec.node_name or "")
            if node is None:
                continue
            on_node = [p for p in pods.values() if p.node_name == node.name]
            plan = plan_node(node, on_node, namespaces, settings, pod_level_resize=False, backing_off=frozenset())
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
        fleet = FleetKubelet(api).start()
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
            out["churn"] = churn(api, fleet, args, workdir, len(writes))
            out["churn"]["webhook"] = webhook
            out["rss_mb"], out["cpu_s"] = proc_figures(proc.pid)
        proc.terminate()
        proc.wait(10)
        log.close()
        fleet.stop.set()
        return out
    finally:
        cp.stop()


def churn(api: Api, fleet: FleetKubelet, args: argparse.Namespace, workdir: Path, writes_before: int) -> dict[str, Any]:
    rng = random.Random(5)
    created: list[str] = []
    deleted = 0
    period = 1.0 / args.churn_rate
    # Every pod's CPU limits before the churn (a new pod's: as admitted), to count the
    # fewest resizes that reach the final targets from them.
    before = {
        p["metadata"]["name"]: _cpu_limits(p)
        for page in api.list_pages(f"/api/v1/namespaces/{NS}/pods")
        for p in page["items"]
    }
    start = time.monotonic()
    for i in range(args.churn_pods):
        name = f"churn-{i:05d}"
        node = f"node-{rng.randrange(args.nodes):04d}"
        fleet.created_at[name] = time.monotonic()
        before[name] = _cpu_limits(api.post(f"/api/v1/namespaces/{NS}/pods", pod_body(name, node, rng.choice(CPUS))))
        created.append(name)
        if i % 5 == 4:  # every fifth: one of the earlier ones goes again
            gone = created.pop(rng.randrange(len(created)))
            api.delete(pod_path(NS, gone), {"gracePeriodSeconds": 0})
            deleted += 1
        time.sleep(max(0.0, start + (i + 1) * period - time.monotonic()))
    churn_end = time.monotonic()
    time.sleep(10.0)
    live = set(created)
    without = sum(1 for n in live if n not in fleet.limited_at)
    lat = sorted(fleet.limited_at[n] - fleet.created_at[n] for n in live if n in fleet.limited_at)
    # every write the churn caused: until the subject has been quiet for 5 s (at most --settle)
    drained = settle(workdir, args.settle) - churn_end
    writes = audit(workdir, names=True)[writes_before:]
    resizes = sum(1 for _, k in writes if k.startswith("resize"))
    own = sum(1 for _, k in writes if k.startswith("resize churn-"))
    seeded = sum(1 for n in live if n in fleet.born_limited)
    at_least = fewest_resizes(api, before)
    # A subject that stops early writes less: what it left off target counts against it.
    left = unconverged(api)
    refused: dict[str, int] = {}
    for _, k in writes:
        if k.startswith("refused"):
            refused[k] = refused.get(k, 0) + 1
    return {
        "rate": args.churn_rate,
        "created": args.churn_pods,
        "deleted": deleted,
        "without_limit_10s_after": without,
        "p50_s": statistics.median(lat) if lat else None,
        "p99_s": lat[int(0.99 * (len(lat) - 1))] if lat else None,
        "resizes_per_created": resizes / args.churn_pods,
        "fewest_per_created": at_least / args.churn_pods,
        "over_floor": resizes / at_least if at_least else None,
        "left_off_target": left,
        "drained_s": drained,
        "own_resizes": own,
        "neighbour_resizes": resizes - own,
        "seeded_at_admission": seeded,
        "refused": refused,
    }


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
        c = r.get("churn")
        if c:
            p50 = f"{c['p50_s']:.2f}" if c["p50_s"] is not None else "-"
            p99 = f"{c['p99_s']:.2f}" if c["p99_s"] is not None else "-"
            print(
                f"  churn {c['rate']}/s: {c['created']} created, {c['deleted']} deleted; creation -> limit "
                f"p50 {p50} s, p99 {p99} s; {c['without_limit_10s_after']} without a limit 10 s after; "
                f"{c['resizes_per_created']:.2f} resizes per created pod ({c['own_resizes']} of the new pods, "
                f"{c['neighbour_resizes']} of neighbours; the fewest any controller needs to reach the final "
                f"targets: {c['fewest_per_created']:.2f}; resizes / that floor: "
                f"{'-' if c['over_floor'] is None else format(c['over_floor'], '.2f')}; "
                f"{c['left_off_target']} pods left off target), the last "
                f"{c['drained_s']:.1f} s after the churn; "
                f"refused: {c['refused'] or 'none'}; "
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
    ap.add_argument("--churn-rate", type=float, default=20.0)
    ap.add_argument("--churn-pods", type=int, default=400)
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
