"""`headroom demo`: the example cluster on a real local control plane, before and after.

Starts etcd and kube-apiserver (built from Go modules by tests/testenv/build.sh), loads a
snapshot into them, runs the controller with a simulated kubelet per node until the
cluster settles, and prints each node's factor and each pod's CPU limits before and after.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import logs
from ..api import crds
from ..cluster.api import MERGE_PATCH, Api, ApiError, object_path
from ..cluster.live import read_cluster
from ..cluster.snapshot import read_objects
from ..core.capabilities import pod_level_resize
from ..core.planner import ClusterPlan, plan_cluster
from ..core.quantity import format_milli
from ..engine.controller import Controller, Options
from ..output import table
from ..testbed.controlplane import ControlPlane, build
from .kubelet import SimulatedKubelet

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
    snap = read_cluster(api)
    return plan_cluster(
        snap.nodes,
        snap.pods,
        snap.namespaces,
        snap.resolver(),
        pod_level_resize=pod_level_resize(snap.nodes, version),
        neighbours=snap.neighbours,
    )


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


def run_demo(snapshot: Path, seconds: float, say: Callable[[str], None] = print) -> int:
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
    return 0
