"""The Argo CD health checks against objects captured from the real control plane
(examples/gitops/argocd/…/testdata, written by tests/integration/test_gitops.py)."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from helpers.argocd_health import APPLICATION, CUSTOMIZATIONS, KINDS, health

CASES = [
    (kind, case)
    for kind in KINDS
    for case in YAML(typ="safe").load((CUSTOMIZATIONS / kind / "health_test.yaml").read_text())["tests"]
]


def test_both_kinds_ship_the_same_script():  # NodePoolProfile's is a link
    scripts = {(CUSTOMIZATIONS / kind / "health.lua").read_text() for kind in KINDS}
    assert len(scripts) == 1


@pytest.mark.parametrize("kind,case", CASES, ids=[f"{k}:{c['inputPath']}" for k, c in CASES])
def test_health_of_captured_objects(kind, case):
    obj = YAML(typ="safe").load((CUSTOMIZATIONS / kind / case["inputPath"]).read_text())
    assert obj["kind"] == kind
    assert health(obj) == case["healthStatus"]


def test_every_state_is_covered():
    statuses = {case["healthStatus"]["status"] for _, case in CASES}
    assert statuses == {"Progressing", "Healthy", "Degraded", "Suspended"}


def test_an_object_without_status_is_progressing():
    obj = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "HeadroomConfig",
        "metadata": {"name": "cluster", "generation": 1},
    }
    assert health(obj) == {"status": "Progressing", "message": "Waiting for the Headroom controller to report status"}


def test_the_argocd_cm_example_embeds_the_shipped_script():
    cm = YAML(typ="safe").load((CUSTOMIZATIONS.parents[1] / "argocd-cm.yaml").read_text())
    script = (CUSTOMIZATIONS / "HeadroomConfig" / "health.lua").read_text()
    for kind in KINDS:
        assert cm["data"][f"resource.customizations.health.kube-headroom.dev_{kind}"] == script
    assert cm["data"]["resource.customizations.health.argoproj.io_Application"] == APPLICATION.read_text()


def _app(
    health_status: str | None, sync: str | None = "Synced", phase: str | None = "Succeeded", operation: bool = False
):
    status: dict = {}
    if health_status is not None:
        status["health"] = {"status": health_status, "message": f"{health_status.lower()} resources"}
    if sync is not None:
        status["sync"] = {"status": sync}
    if phase is not None:
        status["operationState"] = {"phase": phase}
    obj: dict = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "a"}}
    if status:
        obj["status"] = status
    if operation:
        obj["operation"] = {"sync": {"revision": "abc"}}
    return obj


@pytest.mark.parametrize(
    "obj,expected",
    [
        (_app(None, None, None), "Progressing"),  # just created: no status yet
        # As Argo CD v3.6 wrote it after a new Application's first comparison (the real run of
        # tests/integration/install/test_argocd.py): Healthy while OutOfSync, nothing created yet.
        (_app("Healthy", "OutOfSync", None), "Progressing"),
        (_app("Healthy", "Synced", "Running"), "Progressing"),  # its sync still running
        (_app("Healthy", "Synced", "Succeeded", operation=True), "Progressing"),  # a sync asked for
        (_app("Progressing"), "Progressing"),
        (_app("Degraded", "OutOfSync", "Failed"), "Degraded"),
        (_app("Healthy"), "Healthy"),
        (_app("Suspended"), "Suspended"),
    ],
)
def test_an_application_is_healthy_to_its_parent_only_once_synced(obj, expected):
    assert health(obj)["status"] == expected
