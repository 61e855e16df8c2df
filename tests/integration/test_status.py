"""Status on HeadroomConfig and NodePoolProfile as the controller writes it (issue 6.1–6.2)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from headroom.cluster.client import ApiError
from helpers.cluster_helpers import GROUP, K8S_MINOR, K8S_VERSION, cond, create_pod, profile, wait_for, wait_limits
from helpers.factories import container
from testbed.sim_kubelet import SimulatedKubelet


def ready(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return (
        cond(obj, "Ready").get("status") == "True" and status.get("observedGeneration") == obj["metadata"]["generation"]
    )


def test_config_status_reports_counts_capabilities_pools_and_generations(
    api, namespace, make_node, headroom_config, start_controller
):
    node = make_node(cpu="8", labels={"pool": "st"})
    headroom_config()
    with SimulatedKubelet(api, node):
        create_pod(api, namespace, node, "p", containers=[container(cpu="500m")])
        create_pod(api, namespace, node, "g", containers=[container(cpu="1", limit="1", mem="1Gi", mem_limit="1Gi")])
        try:
            profile(api, "st", {"pool": "st"})
            start_controller()
            wait_limits(api, namespace, "p", ["5"], timeout=10)
            cfg = wait_for(
                api,
                f"{GROUP}/headroomconfigs/cluster",
                lambda o: ready(o) and (o["status"].get("podsAtTarget") or 0) >= 1,
            )
            s = cfg["status"]
            assert s["mode"] == "Active" and s["nodes"] >= 1 and s["managedPods"] >= 1 and s["unmanagedPods"] >= 1
            assert s["resizesApplied"] >= 1 and s["resizesFailed"] == 0 and s["lastReconcileTime"]
            # no node lists declaredFeatures: the cluster-wide rule falls back to the version (>= 1.36)
            assert s["capabilities"] == {
                "serverVersion": K8S_VERSION,
                "podsResize": True,
                "inPlacePodLevelResources": K8S_MINOR >= 36,
            }
            assert {"name": "st", "mode": "Active", "nodes": 1, "managedPods": 1} in s["pools"]
            assert "(default)" in {p["name"] for p in s["pools"]}  # the nodes no profile selects
            assert {c["type"] for c in s["conditions"]} == {"Ready", "Reconciling", "Stalled", "DryRun"}
            assert cond(cfg, "Reconciling")["status"] == "False" and cond(cfg, "Stalled")["status"] == "False"
            assert cfg["metadata"]["managedFields"][-1]["manager"] == "headroom"
            prof = wait_for(api, f"{GROUP}/nodepoolprofiles/st", ready)
            assert prof["status"]["matchedNodes"] == 1 and prof["status"]["managedPods"] == 1
            assert prof["status"]["averageFactor"] == "14.00" and prof["status"]["mode"] == "Active"
            # the factor before caps is 14, but maxMultiplier 10 caps what the pod gets
            assert prof["status"]["effectiveFactor"] == "10.00"

            # a spec change: a new generation, observed and reconciled
            gen = headroom_config(dryRun=True)["metadata"]["generation"]
            cfg = wait_for(
                api, f"{GROUP}/headroomconfigs/cluster", lambda o: ready(o) and o["metadata"]["generation"] == gen
            )
            assert cfg["status"]["mode"] == "DryRun" and cond(cfg, "DryRun")["status"] == "True"
            assert cond(cfg, "Ready")["observedGeneration"] == gen
            # an active cluster whose only node is in a paused pool reads Paused, not Active (with
            # an active pool beside it, Mixed); the paused pool still counts its pods
            headroom_config()
            profile(api, "st", {"pool": "st"}, paused=True)
            cfg = wait_for(api, f"{GROUP}/headroomconfigs/cluster", lambda o: o["status"].get("mode") == "Paused")
            (st,) = [p for p in cfg["status"]["pools"] if p["name"] == "st"]
            assert st["mode"] == "Paused" and st["managedPods"] == 1

            # converged: nothing more is written
            settled = api.get(f"{GROUP}/headroomconfigs/cluster")["metadata"]["resourceVersion"]
            time.sleep(5)
            assert api.get(f"{GROUP}/headroomconfigs/cluster")["metadata"]["resourceVersion"] == settled
        finally:
            with contextlib.suppress(ApiError):
                api.delete(f"{GROUP}/nodepoolprofiles/st")


def test_overlapping_profiles_and_an_unusable_profile(api, namespace, make_node, headroom_config, start_controller):
    headroom_config()
    make_node(cpu="8", labels={"pool": "ov"})
    make_node(cpu="8", labels={"pool": "ov"})
    try:
        profile(api, "ov-high", {"pool": "ov"}, priority=10)
        profile(api, "ov-low", {"pool": "ov"}, priority=1)
        profile(api, "ov-bad", {"pool": "none"}, deadband={"grow": 0.01})  # shrink 0.05 inherited > grow
        start_controller()
        low = wait_for(api, f"{GROUP}/nodepoolprofiles/ov-low", lambda o: cond(o, "Conflict").get("status") == "True")
        assert "selects 2 node(s) another profile wins: 'ov-high' on 2 node(s)" in cond(low, "Conflict")["message"]
        assert cond(low, "Ready")["status"] == "True"  # a loser is still Ready
        high = wait_for(api, f"{GROUP}/nodepoolprofiles/ov-high", ready)
        assert cond(high, "Conflict")["status"] == "False" and high["status"]["matchedNodes"] == 2
        bad = wait_for(api, f"{GROUP}/nodepoolprofiles/ov-bad", lambda o: cond(o, "Stalled").get("status") == "True")
        assert cond(bad, "Stalled")["reason"] == "InvalidSpec" and "spec.deadband" in cond(bad, "Stalled")["message"]
        assert cond(bad, "Ready")["status"] == "False"
        # events follow the status, in the low-priority lane
        deadline = time.monotonic() + 10
        while True:
            events = api.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
            reasons = {(e["regarding"]["name"], e["reason"]) for e in events}
            if ("ov-low", "ProfileConflict") in reasons and ("ov-bad", "ConfigInvalid") in reasons:
                break
            assert time.monotonic() < deadline, reasons
            time.sleep(0.2)
    finally:
        for name in ("ov-high", "ov-low", "ov-bad"):
            with contextlib.suppress(ApiError):
                api.delete(f"{GROUP}/nodepoolprofiles/{name}")
