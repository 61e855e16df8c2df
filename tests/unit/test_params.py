"""HeadroomConfig merged with the winning NodePoolProfile."""

from fractions import Fraction

import pytest

from headroom.api.models import HeadroomConfig, NodePoolProfile, profile_from, settings_from
from headroom.core.params import Resolver


def cfg(**spec):
    return HeadroomConfig.model_validate(
        {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "HeadroomConfig",
            "metadata": {"name": "cluster"},
            "spec": spec,
        }
    )


def prof(name, labels, **spec):
    return profile_from(
        NodePoolProfile.model_validate(
            {
                "apiVersion": "kube-headroom.dev/v1alpha1",
                "kind": "NodePoolProfile",
                "metadata": {"name": name},
                "spec": {"nodeSelector": {"matchLabels": labels}, **spec},
            }
        )
    )


def test_no_config_means_defaults():
    s = settings_from(None)
    assert (s.min_burst_floor, s.max_multiplier, s.deadband_grow, s.deadband_shrink) == (1000, 10, 0.10, 0.05)
    assert s.exclusions.namespaces == {"kube-system"}
    assert (s.debounce_seconds, s.backoff_seconds) == (2.0, 300.0)


def test_setting_other_exclusions_keeps_kube_system_out_and_empty_list_manages_it():
    assert settings_from(cfg(exclusions={"ownerKinds": ["Job"]})).exclusions.namespaces == {"kube-system"}
    assert settings_from(cfg(exclusions={"namespaces": []})).exclusions.namespaces == frozenset()


def test_profile_overrides_field_by_field():
    r = Resolver.build(
        settings_from(cfg(deadband={"grow": 0.3, "shrink": 0.2})),
        [prof("batch", {"pool": "batch"}, deadband={"grow": 0.4}, maxMultiplier=0)],
    )
    s = r.settings_for({"pool": "batch"})
    assert (s.pool, s.deadband_grow, s.deadband_shrink, s.max_multiplier) == ("batch", 0.4, 0.2, Fraction(0))
    assert r.settings_for({"pool": "other"}).pool == ""


def test_highest_priority_wins_and_ties_go_to_the_first_name():
    r = Resolver.build(
        settings_from(None),
        [
            prof("zeta", {"a": "1"}, priority=5),
            prof("alpha", {"a": "1"}, priority=5),
            prof("low", {"a": "1"}, priority=1),
        ],
    )
    assert r.settings_for({"a": "1"}).pool == "alpha"
    assert [p.name for p in r.matching({"a": "1"})] == ["alpha", "zeta", "low"]


def test_pool_dry_run_cannot_switch_off_global_dry_run():
    r = Resolver.build(settings_from(cfg(dryRun=True)), [prof("p", {"a": "1"}, dryRun=False)])
    assert r.settings_for({"a": "1"}).dry_run is True
    r = Resolver.build(settings_from(None), [prof("p", {"a": "1"}, dryRun=True)])
    assert r.settings_for({"a": "1"}).dry_run is True


def test_profile_exclusions_are_added():
    r = Resolver.build(
        settings_from(cfg(exclusions={"containers": ["istio-proxy"]})),
        [prof("p", {"a": "1"}, exclusions={"containers": ["envoy"], "namespaces": ["obs"]})],
    )
    ex = r.settings_for({"a": "1"}).exclusions
    assert ex.containers == {"istio-proxy", "envoy"} and ex.namespaces == {"kube-system", "obs"}


def test_profile_whose_merged_deadband_is_inverted_freezes_its_nodes_never_hands_them_over():
    r = Resolver.build(settings_from(None), [prof("tight", {"a": "1"}, deadband={"grow": 0.02})])
    assert "NodePoolProfile/tight: spec.deadband" in r.errors["tight"]
    s = r.settings_for({"a": "1"})
    assert s.pool == "tight" and s.blocked is not None and "nothing is written" in s.blocked
    assert r.settings_for({"a": "2"}).blocked is None


@pytest.mark.parametrize("value,expected", [("250m", 250), (2, 2000), ("1.5", 1500)])
def test_floor_quantities(value, expected):
    assert settings_from(cfg(minBurstFloor=value)).min_burst_floor == expected
