"""The test control plane itself: a real, RBAC-enforcing API server of the pinned release."""

import pytest

from testenv.controlplane import ControlPlane
from testenv.kube import KubeError


def test_server_reports_the_pinned_release(kube):
    info = kube.get("/version")
    assert info["gitVersion"] == "v1.37.2" and (info["major"], info["minor"]) == ("1", "37")


def test_pods_resize_subresource_is_served(kube):
    names = {r["name"] for r in kube.get("/api/v1")["resources"]}
    assert "pods/resize" in names


def test_rbac_is_enforced(control_plane: ControlPlane):
    with pytest.raises(KubeError) as err:
        control_plane.kube("headroom-test-nobody-token").get("/api/v1/nodes")
    assert err.value.status == 403
