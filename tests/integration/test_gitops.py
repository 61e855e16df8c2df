"""What Flux (kstatus) and Argo CD (health.lua) see in every state, on the real control plane.

Set HEADROOM_UPDATE_TESTDATA=1 to rewrite the Argo CD testdata from these live objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from typing import Any

from ruamel.yaml import YAML

from headroom.cluster.client import MERGE_PATCH, Api, ApiError
from helpers.argocd_health import CUSTOMIZATIONS, health
from helpers.cluster_helpers import GROUP, apply_config, cond, create_pod, profile, wait_for
from helpers.factories import container
from testbed.controlplane import build
from testbed.sim_kubelet import SimulatedKubelet

UPDATE = os.environ.get("HEADROOM_UPDATE_TESTDATA") == "1"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/headroomconfigs.kube-headroom.dev"


def kstatus(obj: dict[str, Any]) -> dict[str, str]:
    r = subprocess.run([str(build() / "kstatus")], input=json.dumps(obj), capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def seen(obj: dict[str, Any], name: str, flux: str, argo: str) -> dict[str, str]:
    """Assert what both tools say about `obj`; keep it as Argo CD testdata when asked."""
    assert kstatus(obj)["status"] == flux, (name, kstatus(obj), obj.get("status"))
    verdict = health(obj)
    assert verdict["status"] == argo, (name, verdict, obj.get("status"))
    if UPDATE:
        obj = {k: v for k, v in obj.items()}
        obj["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
        path = CUSTOMIZATIONS / obj["kind"] / "testdata" / f"{name}.yaml"
        yaml = YAML()
        yaml.default_flow_style = False
        with path.open("w") as f:
            yaml.dump(obj, f)
    return verdict


def _profile(api: Api, name: str) -> dict[str, Any]:
    return api.get(f"{GROUP}/nodepoolprofiles/{name}")


def test_flux_and_argo_cd_see_each_state(api, namespace, make_node, headroom_config, start_controller, crds_installed):
    headroom_config(debouncePeriod="6s")
    # Never seen by a controller, so no status: kstatus (Flux's default health check) calls
    # it Current; the Argo CD check waits, as the Flux example's healthCheckExprs do.
    seen(api.get(f"{GROUP}/headroomconfigs/cluster"), "no-status", "Current", "Progressing")
    node = make_node(cpu="8", labels={"pool": "g"})
    make_node(cpu="4", labels={"pool": "p"})
    names = ("g", "g-low", "g-bad", "p")
    try:
        with SimulatedKubelet(api, node):
            create_pod(api, namespace, node, "w", containers=[container(cpu="500m")])
            c = start_controller()
            wait_for(api, f"{GROUP}/headroomconfigs/cluster", lambda o: cond(o, "Ready").get("status") == "True")

            # a new profile: its status is written at once, Reconciling while its node waits out the debounce
            profile(api, "g", {"pool": "g"}, priority=10, maxMultiplier=4)
            fresh = wait_for(api, f"{GROUP}/nodepoolprofiles/g", lambda o: bool(o.get("status")), timeout=5)
            assert cond(fresh, "Reconciling")["status"] == "True", fresh["status"]
            seen(fresh, "progressing", "InProgress", "Progressing")
            done = wait_for(api, f"{GROUP}/nodepoolprofiles/g", lambda o: cond(o, "Ready").get("status") == "True")
            seen(done, "healthy", "Current", "Healthy")
            seen(api.get(f"{GROUP}/headroomconfigs/cluster"), "healthy", "Current", "Healthy")

            profile(api, "g-low", {"pool": "g"}, priority=1)
            low = wait_for(
                api, f"{GROUP}/nodepoolprofiles/g-low", lambda o: cond(o, "Conflict").get("status") == "True"
            )
            verdict = seen(low, "conflict", "Current", "Healthy")
            assert "another profile wins: 'g'" in verdict["message"]

            profile(api, "g-bad", {"pool": "none"}, deadband={"grow": 0.01})
            bad = wait_for(api, f"{GROUP}/nodepoolprofiles/g-bad", lambda o: cond(o, "Stalled").get("status") == "True")
            seen(bad, "degraded", "Failed", "Degraded")

            profile(api, "p", {"pool": "p"}, paused=True)
            paused = wait_for(api, f"{GROUP}/nodepoolprofiles/p", lambda o: cond(o, "Ready").get("status") == "True")
            seen(paused, "suspended", "Current", "Suspended")

            api.patch(
                f"{GROUP}/nodepoolprofiles/g-low",
                {"metadata": {"finalizers": ["tests.kube-headroom.dev/hold"]}},
                MERGE_PATCH,
            )
            api.delete(f"{GROUP}/nodepoolprofiles/g-low")
            seen(_profile(api, "g-low"), "deleting", "Terminating", "Progressing")
            api.patch(f"{GROUP}/nodepoolprofiles/g-low", {"metadata": {"finalizers": None}}, MERGE_PATCH)

            # the spec moves on while no controller runs: the status is a generation behind
            c.stop()
            headroom_config(debouncePeriod="6s", minBurstFloor="500m")
            behind = api.get(f"{GROUP}/headroomconfigs/cluster")
            assert behind["status"]["observedGeneration"] < behind["metadata"]["generation"]
            seen(behind, "generation-behind", "InProgress", "Progressing")

            # an object stored before a CRD upgrade tightened the schema: Stalled, the last valid config runs
            _store_past_the_schema(api, {"grow": 0.05, "shrink": 0.1})
            start_controller()
            stalled = wait_for(
                api, f"{GROUP}/headroomconfigs/cluster", lambda o: cond(o, "Stalled").get("status") == "True"
            )
            assert "spec.deadband" in cond(stalled, "Stalled")["message"]
            seen(stalled, "degraded", "Failed", "Degraded")
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                api.delete(f"{GROUP}/nodepoolprofiles/{name}")


def _store_past_the_schema(api: Api, deadband: dict[str, float]) -> None:
    """Drop the deadband rule from the CRD, store the object, put the rule back."""
    crd = api.get(CRD)
    original = json.loads(json.dumps(crd["spec"]["versions"]))
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    props["deadband"].pop("x-kubernetes-validations")
    api.request_json("PUT", CRD, crd)
    try:
        apply_config(api, {"debouncePeriod": "6s", "deadband": deadband}, within=10)
    finally:
        crd = api.get(CRD)
        crd["spec"]["versions"] = original
        api.request_json("PUT", CRD, crd)


def test_kubectl_get_wide_shows_healthy_dry_run_paused_conflicting_and_stale(
    control_plane, api, namespace, make_node, headroom_config, start_controller, crds_installed
):
    """What an on-call engineer sees with `kubectl get hrc,npp -o wide` in each state
    (docs/gitops.md shows one capture of this test, printed with -s)."""
    from helpers.chart import TOOLS

    headroom_config()
    names = {"healthy": "wide-a", "dryrun": "wide-b", "paused": "wide-c", "loser": "wide-d"}
    for pool in ("a", "b", "c"):
        make_node(cpu="8", labels={"wide": pool})
    profile(api, names["healthy"], {"wide": "a"}, priority=10)
    profile(api, names["dryrun"], {"wide": "b"}, dryRun=True)
    profile(api, names["paused"], {"wide": "c"}, paused=True)
    profile(api, names["loser"], {"wide": "a"}, priority=1)  # loses node a to wide-a
    kubeconfig = control_plane.kubeconfig()

    def get(*wide: str) -> dict[str, dict[str, str]]:
        """name -> column -> cell, read by the header's column positions (cells may hold spaces)."""
        r = subprocess.run(
            [
                str(TOOLS / "bin" / "kubectl"),
                "--kubeconfig",
                str(kubeconfig),
                "get",
                "hrc,npp",
                *(wide or ("-o", "wide")),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        get.text = r.stdout  # type: ignore[attr-defined]
        out: dict[str, dict[str, str]] = {}
        for block in r.stdout.strip().split("\n\n"):
            header, *lines = block.splitlines()
            # kubectl pads columns with three spaces or more; a header may hold one ("AT TARGET")
            starts = [m.start() for m in re.finditer(r"(?:^|(?<=   ))\S", header)]
            cols = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
            for line in lines:
                cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
                out[cells[0].rsplit("/", 1)[-1]] = dict(zip(cols, cells, strict=True))
        return out

    try:
        c = start_controller()
        deadline = time.monotonic() + 30
        while True:
            rows = get()
            a, b, cc, d = (rows.get(names[k], {}) for k in ("healthy", "dryrun", "paused", "loser"))
            if (
                a.get("READY") == "True"
                and b.get("MODE") == "DryRun"
                and cc.get("MODE") == "Paused"
                and d.get("CONFLICT") == "True"
            ):
                break
            assert time.monotonic() < deadline, get.text  # type: ignore[attr-defined]
            time.sleep(1)
        print("\n$ kubectl get hrc,npp -o wide   # running\n" + get.text)  # type: ignore[attr-defined]
        assert a["MODE"] == "Active" and a["CONFLICT"] == "False"
        assert d["CONFLICT"] == "True" and "wide-a" in d["MESSAGE"]  # the conflict reads as one, naming the winner
        c.stop()
        time.sleep(3)
        rows = get()
        print("$ kubectl get hrc,npp -o wide   # the controller stopped: only the heartbeat ages\n" + get.text)  # type: ignore[attr-defined]
        hrc = rows["cluster"]
        assert hrc["READY"] == "True"  # conditions alone still look fine ...
        assert re.fullmatch(r"\d+s", hrc["HEARTBEAT"]) and int(hrc["HEARTBEAT"][:-1]) >= 3  # ... the heartbeat ages
        # and it shows without -o wide, right beside READY
        plain = get("--no-headers=false")
        print("$ kubectl get hrc,npp   # the controller stopped\n" + get.text)  # type: ignore[attr-defined]
        assert list(plain["cluster"])[:3] == ["NAME", "READY", "HEARTBEAT"]
        assert list(plain["wide-a"])[:3] == ["NAME", "READY", "HEARTBEAT"]
    finally:
        for n in names.values():
            with contextlib.suppress(ApiError):
                api.delete(f"{GROUP}/nodepoolprofiles/{n}")
