"""Which configuration runs (api/resolve.py): pure logic, every fail-closed rule."""

from __future__ import annotations

from typing import Any

from headroom.api.resolve import CURRENT, FROZEN, LAST_VALID, NO_CONFIG, resolve
from headroom.core.eligibility import CONFIG_UNUSABLE, MANAGED, eligibility
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from helpers.factories import namespace, node, pod

V = "kube-headroom.dev/v1alpha1"


def config(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": V, "kind": "HeadroomConfig", "metadata": {"name": "cluster"}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def profile(name: str, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": V,
        "kind": "NodePoolProfile",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"pool": name}}, **spec},
    }
    if status is not None:
        obj["status"] = status
    return obj


def managed(settings) -> str:
    ns = namespace_from_dict({"metadata": {"name": "ns", "labels": {"kube-headroom.dev/mode": "managed"}}})
    return eligibility(
        pod_from_dict(pod("p", namespace="ns")), ns, node_from_dict(node("n1")), settings, pod_level_resize=False
    )


def test_no_headroom_config_blocks_every_write():
    res = resolve([], [profile("batch")])
    assert res.resolver.base.blocked == NO_CONFIG and not res.usable
    assert res.resolver.settings_for({"pool": "batch"}).blocked == NO_CONFIG
    assert managed(res.resolver.base) == CONFIG_UNUSABLE


def test_a_valid_config_runs_and_is_remembered():
    res = resolve([config(dryRun=True)], [])
    assert res.usable and res.running == {"HeadroomConfig/cluster": CURRENT}
    assert res.applied["HeadroomConfig/cluster"] == {"dryRun": True}
    assert managed(res.resolver.base) == MANAGED


def test_an_invalid_config_keeps_the_last_valid_one_from_memory_or_from_status():
    good = resolve([config(dryRun=True)], [])
    bad = config(maxMultiplier=0.5)
    res = resolve([bad], [], good.applied)
    assert res.running["HeadroomConfig/cluster"] == LAST_VALID and res.resolver.base.dry_run is True
    assert "maxMultiplier" in res.problems["HeadroomConfig/cluster"]
    # A restarted controller has no memory: the spec it persisted in status is used.
    restarted = resolve([config(status={"lastAppliedSpec": {"dryRun": True}}, maxMultiplier=0.5)], [])
    assert restarted.running["HeadroomConfig/cluster"] == LAST_VALID and restarted.resolver.base.dry_run is True


def test_an_invalid_config_with_no_valid_version_blocks_everything():
    res = resolve([config(maxMultiplier=0.5)], [])
    assert res.running["HeadroomConfig/cluster"] == FROZEN
    assert res.resolver.base.blocked is not None and "maxMultiplier" in res.resolver.base.blocked


def test_a_profile_valid_alone_but_not_merged_keeps_its_last_valid_version():
    good = resolve([config()], [profile("batch", deadband={"shrink": 0.05, "grow": 0.3}, paused=True)])
    assert good.running["NodePoolProfile/batch"] == CURRENT
    # Only shrink set: merged with the global grow 0.10 it is inverted.
    res = resolve([config()], [profile("batch", deadband={"shrink": 0.30})], good.applied)
    assert res.running["NodePoolProfile/batch"] == LAST_VALID
    assert "merged with HeadroomConfig" in res.problems["NodePoolProfile/batch"]
    s = res.resolver.settings_for({"pool": "batch"})
    assert s.pool == "batch" and s.paused and s.blocked is None


def test_a_profile_with_no_usable_version_freezes_its_nodes():
    res = resolve([config()], [profile("batch", deadband={"shrink": 0.30}, exclusions={"namespaces": ["ns"]})])
    assert res.running["NodePoolProfile/batch"] == FROZEN
    s = res.resolver.settings_for({"pool": "batch"})
    assert s.pool == "batch" and s.blocked is not None  # never the global settings
    assert managed(s) == CONFIG_UNUSABLE
    assert res.resolver.settings_for({"pool": "other"}).blocked is None  # other nodes keep working


def test_a_profile_whose_selector_cannot_be_read_blocks_every_node():
    broken = profile("batch")
    broken["spec"]["nodeSelector"] = {"matchLabels": "not a map"}
    res = resolve([config()], [broken])
    assert res.resolver.base.blocked is not None and "node selector cannot be read" in res.resolver.base.blocked


def test_a_deleted_object_is_not_remembered():
    good = resolve([config(dryRun=True)], [profile("batch")])
    gone = resolve([], [], good.applied)
    assert gone.applied == {} and gone.resolver.base.blocked == NO_CONFIG


def test_selectors_read_the_kubernetes_way_never_in_the_direction_that_writes_more():
    """An empty exclusion selector excludes everything; an empty selector that would widen
    management (namespaces, the static CPU manager check) is refused, saying what to write."""
    import pytest as _pytest
    from pydantic import ValidationError

    from headroom.api.models import HeadroomConfig, settings_from
    from headroom.core.eligibility import NODE_EXCLUDED, POD_SELECTOR_EXCLUDED

    def config(spec):
        return HeadroomConfig.model_validate(
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "HeadroomConfig",
                "metadata": {"name": "cluster"},
                "spec": spec,
            }
        )

    ns = namespace_from_dict(namespace("team"))
    p = pod_from_dict(pod(labels={"app": "web"}))
    n = node_from_dict(node("n1"))
    for spec, reason in (
        ({"exclusions": {"podSelector": {}}}, POD_SELECTOR_EXCLUDED),
        ({"exclusions": {"podSelector": {"matchLabels": {}}}}, POD_SELECTOR_EXCLUDED),
        ({"exclusions": {"nodeSelector": {}}}, NODE_EXCLUDED),
        ({"exclusions": {"nodeSelector": {"matchLabels": {}}}}, NODE_EXCLUDED),
    ):
        assert eligibility(p, ns, n, settings_from(config(spec)), pod_level_resize=True) == reason, spec
    for spec, field in (
        ({"namespaceSelector": {}}, "namespaceSelector"),
        ({"namespaceSelector": {"matchLabels": {}}}, "namespaceSelector"),
        ({"staticCPUManagerNodeSelector": {}}, "staticCPUManagerNodeSelector"),
    ):
        with _pytest.raises(ValidationError) as exc:
            config(spec)
        assert field in str(exc.value) and "must not be empty" in str(exc.value)


def test_the_controllers_configuration_log_says_what_happened(caplog):
    """The words an operator reads: a first usable configuration in dry-run does not say
    writes resume; a problem that goes away (fixed, or its object deleted) is said to."""
    import logging

    from headroom.cluster.config import ConfigState

    state = ConfigState()
    config = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    bad = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "NodePoolProfile",
        "metadata": {"name": "batch"},
        "spec": {"priority": "high"},
    }
    with caplog.at_level(logging.INFO, logger="headroom.config"):
        state.update([], [])
        state.update([{**config, "spec": {"dryRun": True}}], [bad])
        state.update([{**config, "spec": {"dryRun": True}}], [])
    said = [(r.getMessage(), getattr(r, "object", None), getattr(r, "why", None)) for r in caplog.records]
    assert said[0][0] == "nothing will be written"
    assert ("invalid configuration", "NodePoolProfile/batch", None) in said
    assert ("configuration problem gone", "NodePoolProfile/batch", "the object was deleted") in said
    assert any(m.startswith("configuration usable, in dry-run: no pod is written") for m, _, _ in said), said
    assert not any("writes resume" in m for m, _, _ in said), said
