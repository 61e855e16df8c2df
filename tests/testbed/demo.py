"""`make demo`: the example cluster on a real local control plane, before and after,
then the same policy on a real node of this machine.

First: etcd and kube-apiserver (built from Go modules by tests/testenv/build.sh), the
snapshot loaded into them, the controller with a simulated kubelet per node (the example
has seven nodes; this machine is one) until the cluster settles: each node's factor and
each pod's CPU limits before and after.

Then, where this machine can run a real node (Linux, root, a cgroup v1 cpu controller):
the pods of the example's worked node, their requests scaled to this machine, as busy
pods with tight limits on a real kubelet (tests/realnode/build.sh), and Headroom: each
pod's limit, its container's CFS quota and its throttling before and after, from the
kernel's counters. Elsewhere one line says why it was not run.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headroom import logs
from headroom.api import crds
from headroom.cluster.client import MERGE_PATCH, Api, ApiError, object_path
from headroom.cluster.live import read_cluster
from headroom.cluster.snapshot import read_objects
from headroom.commands.output import table
from headroom.core import keys
from headroom.core.planner import ClusterPlan
from headroom.core.quantity import cpu_milli, format_milli
from headroom.engine.controller import Controller, Options

from .controlplane import ControlPlane, ControlPlaneError, build
from .latency import POLICIES, SVC_BATCH, Run, Scenarios, build_latency, calibrate, import_service_image
from .node import RealNode, build_node, busy_pod, running_containers, unavailable
from .sim_kubelet import SimulatedKubelet

ORDER = ("CustomResourceDefinition", "Namespace", "Node", "HeadroomConfig", "NodePoolProfile", "Pod")


def _wait_established(api: Api, names: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            if any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            ):
                break
            if time.monotonic() > deadline:
                raise ApiError(0, "Timeout", f"CRD {name} not Established")
            time.sleep(0.1)


def load(api: Api, items: list[dict[str, Any]]) -> None:
    """Create the snapshot's objects as a real cluster would hold them."""
    for kind in ORDER:
        for obj in (o for o in items if o.get("kind") == kind):
            body = copy.deepcopy(obj)
            status = body.pop("status", None)
            for field in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
                body.get("metadata", {}).pop(field, None)
            created = api.apply(body, "headroom-demo")
            if kind == "Node" and status:
                api.patch(object_path(body) + "/status", {"status": status}, MERGE_PATCH)
            elif kind == "Pod" and status and status.get("phase") in ("Succeeded", "Failed"):
                api.patch(object_path(created) + "/status", {"status": {"phase": status["phase"]}}, MERGE_PATCH)


def _plan(api: Api, version: tuple[int, int] | None) -> ClusterPlan:
    return read_cluster(api).plan(version)


def _limits(api: Api) -> dict[str, str]:
    out = {}
    for p in api.get("/api/v1/pods")["items"]:
        meta, spec = p["metadata"], p["spec"]
        pod_level = ((spec.get("resources") or {}).get("limits") or {}).get("cpu")
        # Every container that can carry a limit: app containers and sidecars (restartable
        # init containers), so the sum matches the pod's target in `headroom plan`.
        sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
        parts = [
            f"{c['name']}={(c.get('resources') or {}).get('limits', {}).get('cpu', '-')}"
            for c in [*spec["containers"], *sidecars]
        ]
        out[f"{meta['namespace']}/{meta['name']}"] = (f"pod={pod_level} " if pod_level else "") + " ".join(parts)
    return out


def run_demo(snapshot: Path, seconds: float, say: Callable[[str], None] = print, real_node: bool = True) -> int:
    logs.setup("text", "warning")
    items = [o for o in read_objects(snapshot) if isinstance(o, dict)]
    say("building kube-apiserver and etcd (cached after the first run) ...")
    cp = ControlPlane(build(progress=True))
    controller: Controller | None = None
    kubelets: list[SimulatedKubelet] = []
    try:
        cp.start()
        say(f"control plane ready at {cp.url} in {cp.startup_seconds:.1f}s; loading {snapshot}")
        api = cp.api()
        for obj in crds.definitions().values():
            api.apply(obj, "headroom-demo")
        _wait_established(api, [o["metadata"]["name"] for o in crds.definitions().values()])
        load(api, items)
        version = (1, int(api.get("/version")["minor"]))
        before_plan, before = _plan(api, version), _limits(api)

        kubelets = [SimulatedKubelet(api, n.node.name).start() for n in before_plan.nodes]
        controller = Controller(api, Options(workers=2, identity="demo", leader_elect=False))
        controller.start()
        deadline = time.monotonic() + seconds
        quiet_since = None
        while time.monotonic() < deadline:
            time.sleep(0.5)
            idle = controller.synced.is_set() and controller.queue.idle()
            quiet_since = (quiet_since or time.monotonic()) if idle else None
            if quiet_since and time.monotonic() - quiet_since > 3:
                break
        after_plan, after = _plan(api, version), _limits(api)
    finally:
        if controller is not None:
            controller.shutdown()
        for k in kubelets:
            k.stop()
        cp.stop()

    before_factor = {n.node.name: n.summary.factor for n in before_plan.nodes}
    rows = [["NODE", "POOL", "ALLOCATABLE", "SLACK", "FACTOR"]]
    for n in after_plan.nodes:
        rows.append(
            [
                n.node.name,
                n.settings.pool or "-",
                format_milli(n.summary.allocatable),
                format_milli(max(n.summary.slack, 0)),
                f"{before_factor[n.node.name]:.2f}",
            ]
        )
    say("\n" + table(rows))
    reasons = {p.pod.key: p.reason for p in after_plan.all_pods()}
    rows = [["POD", "REASON", "CPU LIMITS BEFORE", "CPU LIMITS AFTER"]]
    for key in sorted(after):
        rows.append(
            [
                key,
                reasons.get(key, "-"),
                before.get(key, "-"),
                after[key] + ("" if after[key] == before.get(key) else "  *"),
            ]
        )
    say("\n" + table(rows))
    changed = sum(1 for k in after if after[k] != before.get(k))
    say(
        f"\n{changed} pod(s) changed (*); requests and memory untouched. The controller's writes are "
        f"CPU limits through pods/resize, field manager 'headroom'."
    )
    if real_node:
        real_node_demo(items, say)
    return 0


EXAMPLE_NODE = "batch-1"  # the design's worked example: its pods, scaled to this machine
DEMO_NS = "demo"


def real_node_demo(items: list[dict[str, Any]], say: Callable[[str], None] = print, window: float = 5.0) -> bool:
    """The example node's pods as busy pods on a real node of this machine, with tight
    static limits (limit = request), then Headroom: each pod's limit, its container's CFS
    quota and its throttling, before and after, from the cgroups. False (and one line
    saying why) where this machine cannot run a real node."""
    why = unavailable()
    if why is None:
        try:
            bins = build_node()
        except ControlPlaneError as exc:
            why = str(exc).splitlines()[0]
    if why is not None:
        say(f"\nreal node: not run on this machine ({why}); the limits above are what a simulated kubelet applied")
        return False
    node_obj = next((o for o in items if o.get("kind") == "Node" and o["metadata"]["name"] == EXAMPLE_NODE), None)
    pods = [o for o in items if o.get("kind") == "Pod" and (o.get("spec") or {}).get("nodeName") == EXAMPLE_NODE]
    if node_obj is None or not pods:
        say(f"\nreal node: the snapshot has no node {EXAMPLE_NODE} with pods to replay")
        return False
    say(f"\nreal node: {EXAMPLE_NODE}'s pods as busy pods on a real kubelet here (containerd, runc, cgroups) ...")
    cp = ControlPlane(build(), components_dir=bins)
    node = RealNode(cp, bins, host_reaches_pods=True)  # the latency part's load comes from the host
    controller: Controller | None = None
    latency: list[Run] = []
    try:
        cp.start()
        node.start()
        api = cp.api()
        for obj in crds.definitions().values():
            api.apply(obj, "headroom-demo")
        _wait_established(api, [o["metadata"]["name"] for o in crds.definitions().values()])
        managed = {"kube-headroom.dev/mode": "managed"}
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NS, "labels": managed}}, "demo")
        example = cpu_milli(node_obj["status"]["allocatable"]["cpu"])
        here = cpu_milli(api.get(f"/api/v1/nodes/{node.name}")["status"]["allocatable"]["cpu"])
        requests: dict[str, str] = {}
        for p in pods:
            request = sum(
                cpu_milli((c.get("resources") or {}).get("requests", {}).get("cpu", "0"))
                for c in p["spec"]["containers"]
            )
            name = p["metadata"]["name"]
            requests[name] = format_milli(max(10, request * here // example // 10 * 10))
            api.post(f"/api/v1/namespaces/{DEMO_NS}/pods", busy_pod(name, node.name, requests[name], requests[name]))
        names = list(requests)
        ids = running_containers(api, DEMO_NS, names)
        before = _measure(api, node, ids, window)
        api.apply({"apiVersion": keys.API_VERSION, "kind": keys.CONFIG_KIND, "metadata": {"name": "cluster"}}, "demo")
        controller = Controller(api, Options(workers=2, identity="demo-real", leader_elect=False))
        controller.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _raised(api, node, ids, before):
            time.sleep(0.2)
        after = _measure(api, node, ids, window)
        latency = _latency(api, node)
    finally:
        if controller is not None:
            controller.shutdown()
        node.stop()
        cp.stop()
    rows = [["POD", "REQUEST", "LIMIT", "CFS QUOTA", "THROTTLED", "CORES USED"]]
    for n in names:
        (l0, q0, t0, c0), (l1, q1, t1, c1) = before[n], after[n]
        rows.append(
            [
                n,
                requests[n],
                f"{l0} → {l1}",
                f"{q0} → {q1}",
                f"{t0:.0%} → {t1:.0%}",
                f"{c0:.2f} → {c1:.2f}",
            ]
        )
    say(f"\n{table(rows)}")
    say(
        f"\nreal node {node.name}: {format_milli(here)} CPU; requests scaled from {EXAMPLE_NODE}'s "
        f"{format_milli(example)}; each pod spins one thread. Measured from the containers' cgroups over "
        f"{window:.0f} s before and after Headroom (quota in µs per 100 ms period)."
    )
    if latency:
        rows = [["POLICY", "SVC LIMIT", "P50 MS", "P99 MS", "ERRORS", "SVC THROTTLED", "BATCH CORES"]]
        for r in latency:
            svc = r.pods["svc"]
            lat = r.latency
            rows.append(
                [
                    r.policy,
                    svc.limit,
                    f"{lat['p50_ms']:.1f}",
                    f"{lat['p99_ms']:.1f}",
                    f"{lat['errors']}/{lat['sent']}",
                    f"{svc.throttled:.0%}",
                    f"{r.pods['batch'].cores:.2f}",
                ]
            )
        say(
            f"\nA Go service (request 250m, static limit 500m, 2 ms of CPU per request) beside a batch pod "
            f"spinning two threads (250m / 500m), {LATENCY_SECONDS:.0f} s at {LATENCY_RATE:.0f} requests/s "
            f"(80 % of one CPU), open loop from the host:\n\n{table(rows)}\n\nThe full comparison, "
            f"repeated, with a runaway pod: python tests/bench/bench_latency.py (docs/performance.md)."
        )
    return True


LATENCY_RATE, LATENCY_SECONDS = 400.0, 3.0


def _latency(api: Api, node: RealNode) -> list[Run]:
    """A short latency comparison on the same node: static limits, no limits, Headroom (the
    controller is running). The example's pods go first, so only these pods share the node."""
    api.delete(f"/api/v1/namespaces/{DEMO_NS}")
    while any(p["metadata"]["namespace"] == DEMO_NS for p in api.get("/api/v1/pods")["items"]):
        time.sleep(0.3)
    bins = build_latency()
    import_service_image(node, bins)
    scenarios = Scenarios(api, node, bins, calibrate(bins, 2.0))
    runs = []
    for policy in POLICIES:
        ns, ids = scenarios.setup(policy, SVC_BATCH)
        try:
            runs.append(scenarios.run(ns, ids, policy, SVC_BATCH.name, 0.8, LATENCY_RATE, LATENCY_SECONDS))
        finally:
            scenarios.teardown(ns)
    return runs


def _limit(api: Api, name: str) -> str:
    return str(
        api.get(f"/api/v1/namespaces/{DEMO_NS}/pods/{name}")["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    )


def _raised(api: Api, node: Any, ids: dict[str, str], before: dict[str, tuple[str, int, float, float]]) -> bool:
    """Every pod has a new limit, and its container's CFS quota is that limit."""
    for n, cid in ids.items():
        limit, counters = _limit(api, n), node.counters(cid)
        if limit == before[n][0] or counters is None or counters.quota_us != cpu_milli(limit) * 100:
            return False
    return True


def _measure(api: Api, node: Any, ids: dict[str, str], seconds: float) -> dict[str, tuple[str, int, float, float]]:
    """name -> (limit, quota, throttled share, cores) over a window."""
    start = {n: node.counters(c) for n, c in ids.items()}
    time.sleep(seconds)
    out = {}
    for n, c in ids.items():
        end, begin = node.counters(c), start[n]
        if end is None or begin is None:
            raise ApiError(0, "Gone", f"demo pod {n} lost its container")
        share, _, cores = end.since(begin)
        out[n] = (_limit(api, n), end.quota_us, share, cores)
    return out


def main(argv: list[str] | None = None) -> int:
    """`make demo`: the offline plan of the example at once (what `headroom plan --snapshot`
    says), then the live part, which on a fresh machine first builds kube-apiserver and etcd."""
    import argparse

    from headroom.commands import cli

    ap = argparse.ArgumentParser(prog="make demo", description=__doc__)
    ap.add_argument("--snapshot", default="examples/cluster-snapshot.yaml", metavar="FILE")
    ap.add_argument("--seconds", type=float, default=30.0, help="longest time to let the controller run")
    ap.add_argument("--no-real-node", dest="real_node", action="store_false", help="only the simulated cluster")
    args = ap.parse_args(argv)
    print(f"What Headroom would do on {args.snapshot}, offline (headroom plan --snapshot {args.snapshot}):\n")
    code = cli.main(["plan", "--snapshot", args.snapshot])
    if code:
        return code
    print("\nNow live, on a real kube-apiserver and etcd of this machine:", flush=True)
    try:
        return run_demo(Path(args.snapshot), args.seconds, real_node=args.real_node)
    except (ControlPlaneError, ApiError) as exc:
        print(f"error: demo failed: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
