"""VPAs as the policy sees them: owner chains, and which VPAs control CPU limits (pure
logic; the server's own answers are checked in tests/integration/test_coexistence.py)."""

from __future__ import annotations

from headroom.core import neighbours as nb
from headroom.core.records import pod_from_dict
from helpers.factories import pod


def _deployment_pod(**kw):
    return pod_from_dict(
        pod(
            "web-5d8f-x",
            owner_kind="ReplicaSet",
            owner_name="web-5d8f",
            labels={"pod-template-hash": "5d8f"},
            **kw,
        )
    )


def _vpa(**spec):
    return nb.vpa_from_dict(
        {
            "metadata": {"name": "v", "namespace": "team"},
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, **spec},
        }
    )


def test_the_owner_chain_reaches_the_deployment_cronjob_and_rollout():
    assert nb.owner_chain(_deployment_pod()) == (("ReplicaSet", "web-5d8f"), ("Deployment", "web"))
    job = pod_from_dict(pod(owner_kind="Job", owner_name="nightly-29000000"))
    assert nb.owner_chain(job) == (("Job", "nightly-29000000"), ("CronJob", "nightly"))
    rollout = pod_from_dict(
        pod(owner_kind="ReplicaSet", owner_name="canary-7c9", labels={"rollouts-pod-template-hash": "7c9"})
    )
    assert ("Rollout", "canary") in nb.owner_chain(rollout)
    # a ReplicaSet whose name does not end in the pod's hash is not guessed further
    lone = pod_from_dict(pod(owner_kind="ReplicaSet", owner_name="web", labels={"pod-template-hash": "5d8f"}))
    assert nb.owner_chain(lone) == (("ReplicaSet", "web"),)


def test_which_vpas_own_the_cpu_limits():
    p = _deployment_pod()
    n = lambda v: nb.with_object(nb.EMPTY, nb.VPA_KIND, v, "team", "v")  # noqa: E731
    assert n(_vpa()).vpa_controlling(p) is not None  # the default controls requests and limits
    assert n(_vpa(updatePolicy={"updateMode": "Off"})).vpa_controlling(p) is None
    only_requests = {"containerPolicies": [{"containerName": "*", "controlledValues": "RequestsOnly"}]}
    assert n(_vpa(resourcePolicy=only_requests)).vpa_controlling(p) is None
    memory_only = {"containerPolicies": [{"containerName": "app", "controlledResources": ["memory"]}]}
    assert n(_vpa(resourcePolicy=memory_only)).vpa_controlling(p) is None
    app_off = {"containerPolicies": [{"containerName": "app", "mode": "Off"}]}
    assert n(_vpa(resourcePolicy=app_off)).vpa_controlling(p) is None
    other = nb.vpa_from_dict(
        {"metadata": {"name": "v", "namespace": "team"}, "spec": {"targetRef": {"kind": "Deployment", "name": "api"}}}
    )
    assert n(other).vpa_controlling(p) is None
    elsewhere = nb.vpa_from_dict(
        {"metadata": {"name": "v", "namespace": "other"}, "spec": {"targetRef": {"kind": "Deployment", "name": "web"}}}
    )
    assert nb.with_object(nb.EMPTY, nb.VPA_KIND, elsewhere, "other", "v").vpa_controlling(p) is None
