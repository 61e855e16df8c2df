"""The Argo CD health checks against objects captured from the real control plane
(examples/gitops/argocd/…/testdata, written by tests/integration/test_gitops.py)."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from argocd_health import CUSTOMIZATIONS, KINDS, health

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
