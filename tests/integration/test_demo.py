"""The README's main job, and the live `plan` agreeing with the offline one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ruamel.yaml import YAML

from cluster_helpers import K8S_MINOR, K8S_VERSION
from headroom.api import crds
from headroom.sim.demo import _wait_established, load
from headroom.testbed.controlplane import ControlPlane, build

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "examples" / "cluster-snapshot.yaml"


SIDECAR_POD = "shop/api-55d-x"  # its log-shipper is a restartable init container


def test_demo_runs_the_controller_on_the_example_cluster():
    r = subprocess.run(
        [sys.executable, "-m", "headroom", "demo", "--seconds", "40"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    # the design's worked example on batch-1: 0.5 / 1.5 / 6 -> 1.5 / 3 / 12
    assert (
        "build=1500m  *" in rows["ci/build-a"]
        and "build=3  *" in rows["ci/build-b"]
        and "build=12  *" in rows["ci/build-c"]
    )
    assert rows["shop/db-0"].split()[-1] == "postgres=2"  # Guaranteed: untouched
    assert "istio-proxy=200m" in rows["shop/web-7f9c-a"].split("  ")[-2]  # excluded container keeps its limit
    if K8S_MINOR >= 36:
        assert "pod=910m" in rows["analytics/etl-pod-level"]  # pod-level limit, node declares the feature
        assert "10 pod(s) changed" in r.stdout
    else:  # a 1.35 server refuses pod-level resizes: the pod is left alone
        assert "PodLevelResourcesUnsupported" in rows["analytics/etl-pod-level"]
        assert "7 pod(s) changed" in r.stdout  # its neighbours share the node differently too
    assert "log-shipper=" in rows[SIDECAR_POD].split("  ")[-2]  # sidecars are shown with the app containers
    assert "Traceback" not in r.stderr and "WARNING" not in r.stderr


def test_live_plan_equals_the_offline_plan_of_the_same_cluster(tmp_path):
    cp = ControlPlane(build())
    try:
        cp.start()
        api = cp.api()
        for obj in crds.definitions().values():
            api.apply(obj, "headroom-tests")
        _wait_established(api, [o["metadata"]["name"] for o in crds.definitions().values()])
        load(api, [d for d in YAML(typ="safe").load_all(SNAPSHOT.read_text()) if d])

        def plan(*args: str) -> dict:
            r = subprocess.run(
                [sys.executable, "-m", "headroom", "plan", "-o", "json", *args],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        live = plan("--kubeconfig", str(cp.kubeconfig()))
        offline = plan("--snapshot", str(SNAPSHOT), "--kubernetes-version", K8S_VERSION)  # the same release
        assert live["nodes"] == offline["nodes"]
        key = lambda p: (p["namespace"], p["name"])  # noqa: E731
        assert sorted(live["pods"], key=key) == sorted(offline["pods"], key=key)
    finally:
        cp.stop()
