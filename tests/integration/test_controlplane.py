"""The test control plane itself: a real, RBAC-enforcing API server of the pinned release."""

import pytest

from headroom.cluster.client import ApiError
from helpers.cluster_helpers import K8S_MINOR, K8S_VERSION
from testbed.controlplane import ControlPlane

pytestmark = pytest.mark.version_sensitive


def test_server_reports_the_pinned_release(api):
    info = api.get("/version")
    assert info["gitVersion"] == K8S_VERSION and (info["major"], info["minor"]) == ("1", str(K8S_MINOR))


def test_pods_resize_subresource_is_served(api):
    names = {r["name"] for r in api.get("/api/v1")["resources"]}
    assert "pods/resize" in names


def test_rbac_is_enforced(control_plane: ControlPlane):
    with pytest.raises(ApiError) as err:
        control_plane.api("headroom-test-nobody-token").get("/api/v1/nodes")
    assert err.value.status == 403
