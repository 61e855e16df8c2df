"""The webhook's mutation (pure) and its AdmissionReview handling."""

from __future__ import annotations

import base64
import json

import pytest

from headroom.api.models import HeadroomConfig, NodePoolProfile, profile_from, settings_from
from headroom.api.resolve import resolve
from headroom.core.params import Resolver
from headroom.core.records import namespace_from_dict, node_from_dict
from headroom.webhook import mutation
from headroom.webhook.server import Sources, review_response
from helpers.factories import container, namespace, node, pod
from helpers.webhook_client import admission_review


def nodes(*raw: dict) -> dict:
    return {n.name: n for n in (node_from_dict(r) for r in raw)}


# The node cache the webhook decides with: one plain node, one per pool label.
NODES = nodes(node("n1"), node("b1", labels={"pool": "batch"}), node("o1", labels={"pool": "other"}))


def full_patch(pod, ns, res, neighbours=None, node_set=None, pod_level=True):
    """The patch where the controller says pod-level resize works on every node (`pod_level`
    False: where it says it does not)."""
    from headroom.core.neighbours import EMPTY

    nodes_ = NODES if node_set is None else node_set
    return mutation.patch_for(pod, ns, res, neighbours or EMPTY, nodes_, lambda node: pod_level)


def patch_for(*args, **kw) -> list[dict[str, object]]:
    """The limit operations (the record of the original limits is tested on its own)."""
    return [o for o in full_patch(*args, **kw) if not str(o["path"]).startswith("/metadata/annotations")]


def test_an_eligible_pod_is_born_with_the_record_of_its_own_limits():
    import orjson

    ops = full_patch(
        new_pod(containers=[container("a", cpu="500m"), container("b", cpu="1", limit="3")]), MANAGED, resolver()
    )
    record = [o for o in ops if str(o["path"]).startswith("/metadata/annotations")]
    assert len(record) == 1
    value = record[0]["value"]
    assert isinstance(value, dict)
    assert orjson.loads(value["kube-headroom.dev/original-cpu-limits"]) == {"a": None, "b": "3"}
    # not for a pod it would not manage
    assert full_patch(new_pod(labels={"kube-headroom.dev/mode": "unmanaged"}), MANAGED, resolver()) == []


MANAGED = namespace_from_dict(namespace("team"))


def resolver(config_spec=None, profiles=()):
    cfg = HeadroomConfig.model_validate(
        {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "HeadroomConfig",
            "metadata": {"name": "cluster"},
            "spec": config_spec or {},
        }
    )
    profs = [
        profile_from(
            NodePoolProfile.model_validate(
                {
                    "apiVersion": "kube-headroom.dev/v1alpha1",
                    "kind": "NodePoolProfile",
                    "metadata": {"name": n},
                    "spec": s,
                }
            )
        )
        for n, s in profiles
    ]
    return Resolver.build(settings_from(cfg), profs)


def new_pod(**kw):
    raw = pod(node=None, **kw)
    raw.pop("status")
    return raw


def test_request_without_limit_gets_request_times_initial_multiplier():
    ops = patch_for(
        new_pod(containers=[container("a", cpu="333m"), container("b", cpu="1", limit="3")]), MANAGED, resolver()
    )
    assert ops == [{"op": "add", "path": "/spec/containers/0/resources/limits/cpu", "value": "660m"}]


def test_limits_object_is_added_when_absent():
    ops = patch_for(new_pod(containers=[container("a", cpu="500m", mem_limit=None)]), MANAGED, resolver())
    assert ops == [{"op": "add", "path": "/spec/containers/0/resources/limits", "value": {"cpu": "1"}}]


def test_sidecars_too_but_not_ordinary_init_containers_or_excluded_names():
    raw = new_pod(
        containers=[container("app", cpu="1"), container("istio-proxy", cpu="100m")],
        init=[container("side", cpu="200m", sidecar=True), container("migrate", cpu="1")],
    )
    ops = patch_for(raw, MANAGED, resolver({"exclusions": {"containers": ["istio-proxy"]}}))
    assert [o["path"] for o in ops] == [
        "/spec/containers/0/resources/limits/cpu",
        "/spec/initContainers/0/resources/limits/cpu",
    ]


def test_the_pools_multiplier_follows_the_pods_own_node_selector():
    r = resolver(
        profiles=[("batch", {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "webhook": {"initialMultiplier": 4}})]
    )
    raw = new_pod(containers=[container("a", cpu="500m")])
    raw["spec"]["nodeSelector"] = {"pool": "batch"}
    assert patch_for(raw, MANAGED, r)[0]["value"] == "2"
    raw["spec"]["nodeSelector"] = {"pool": "other"}
    assert patch_for(raw, MANAGED, r)[0]["value"] == "1"


def test_qos_guard_keeps_a_memory_pinned_pod_burstable():
    raw = new_pod(containers=[container("a", cpu="500m", mem="1Gi", mem_limit="1Gi")])
    ops = patch_for(raw, MANAGED, resolver({"webhook": {"initialMultiplier": 1}}))
    assert ops[0]["value"] == "510m"


def test_nothing_for_pods_it_must_not_touch():
    r = resolver({"exclusions": {"ownerKinds": ["Job"]}})
    assert patch_for(new_pod(), namespace_from_dict(namespace("team", managed=False)), r) == []
    assert patch_for(new_pod(labels={"kube-headroom.dev/mode": "unmanaged"}), MANAGED, r) == []
    assert patch_for(new_pod(owner_kind="Job"), MANAGED, r) == []
    assert patch_for(new_pod(containers=[container(cpu="1", limit="1")]), MANAGED, r) == []


def test_pod_level_pods_get_only_a_pod_level_limit():
    res = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    raw = new_pod(containers=[container(cpu=None, limit="1500m", mem=None, mem_limit=None)], pod_resources=res)
    raw["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m"}
    assert patch_for(raw, MANAGED, resolver()) == [
        {"op": "add", "path": "/spec/resources/limits", "value": {"cpu": "1500m"}}
    ]
    pinned = new_pod(
        containers=[container(cpu=None, mem=None, mem_limit=None)],
        pod_resources={"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
    )
    ops = patch_for(pinned, MANAGED, resolver({"webhook": {"initialMultiplier": 1}}))
    assert ops == [{"op": "add", "path": "/spec/resources/limits/cpu", "value": "510m"}]
    # Where the controller cannot resize a pod-level limit (a 1.35 server, a node without the
    # feature), the webhook sets none: one it could never shed (PodLevelResourcesUnsupported).
    assert full_patch(raw, MANAGED, resolver(), pod_level=False) == []
    assert mutation.patch_for(raw, MANAGED, resolver(), nodes=NODES) == []  # the default: not known, none


def test_admission_review_round_trip_and_errors_never_block():
    review = admission_review(new_pod(containers=[container(cpu="500m")]))
    out, outcome = review_response(
        review, Sources(lambda n: MANAGED if n == "team" else None, resolver, nodes=lambda: NODES)
    )
    assert outcome == "mutated"
    assert out["response"]["uid"] == "u1" and out["response"]["allowed"] is True
    assert json.loads(base64.b64decode(out["response"]["patch"]))[0]["value"] == "1"
    broken = {"request": {"uid": "u2", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": {"spec": 7}}}
    assert review_response(broken, Sources(lambda n: MANAGED, resolver, nodes=lambda: NODES))[0]["response"] == {
        "uid": "u2",
        "allowed": True,
    }
    # an unsynced node cache: no mutation
    assert review_response(review, Sources(lambda n: MANAGED, resolver)) == (
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u1", "allowed": True}},
        "unchanged",
    )


def test_no_mutation_where_the_controller_would_write_nothing():
    pool = [("batch", {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "dryRun": True})]
    paused = [("batch", {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "paused": True})]
    one = [container("a", cpu="500m", mem_limit=None)]
    assert patch_for(new_pod(containers=one), MANAGED, resolver({"dryRun": True})) == []
    batch_pod = new_pod(containers=one)
    batch_pod["spec"]["nodeSelector"] = {"pool": "batch"}
    assert patch_for(batch_pod, MANAGED, resolver(profiles=pool)) == []  # a dry-run pool
    assert patch_for(batch_pod, MANAGED, resolver(profiles=paused)) == []  # a paused pool
    assert patch_for(new_pod(containers=one), MANAGED, resolve([], []).resolver) == []  # no HeadroomConfig
    windows = new_pod(containers=one)
    windows["spec"]["os"] = {"name": "windows"}
    assert patch_for(windows, MANAGED, resolver()) == []
    # An app container without a CPU request: the controller would not manage the pod.
    unmanaged = new_pod(containers=[*one, container("b", cpu=None, mem_limit=None)])
    assert patch_for(unmanaged, MANAGED, resolver()) == []
    # A node exclusion the pod's nodeSelector asks for.
    assert (
        patch_for(batch_pod, MANAGED, resolver({"exclusions": {"nodeSelector": {"matchLabels": {"pool": "batch"}}}}))
        == []
    )


def test_namespaces_managed_through_the_config_selector_are_mutated_too():
    ns = namespace_from_dict({"metadata": {"name": "team", "labels": {"tier": "apps"}}})
    ops = patch_for(
        new_pod(containers=[container("a", cpu="500m", mem_limit=None)]),
        ns,
        resolver({"namespaceSelector": {"matchLabels": {"tier": "apps"}}}),
    )
    assert ops and ops[0]["value"] == {"cpu": "1"}


def test_no_limit_for_a_pod_whose_vpa_sets_limits_nor_one_a_limit_range_refuses():
    from headroom.core import limitrange
    from headroom.core import neighbours as nb

    web = new_pod(owner_kind="ReplicaSet", owner_name="web-5d8f", labels={"pod-template-hash": "5d8f"})
    vpa = nb.vpa_from_dict(
        {"metadata": {"name": "web", "namespace": "team"}, "spec": {"targetRef": {"kind": "Deployment", "name": "web"}}}
    )
    with_vpa = nb.with_object(nb.EMPTY, nb.VPA_KIND, vpa, "team", "web")
    assert full_patch(web, MANAGED, resolver(), with_vpa) == []  # not even the record: not managed
    assert patch_for(web, MANAGED, resolver())  # without the VPA it is given a limit

    # 500m x initialMultiplier 2 = 1 CPU; a LimitRange with max 800m would refuse the pod
    lr = limitrange.limit_range_from_dict(
        {
            "metadata": {"name": "lr", "namespace": "team"},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "800m"}}]},
        }
    )
    capped = nb.with_object(nb.EMPTY, limitrange.LIMIT_RANGE_KIND, lr, "team", "lr")
    ops = full_patch(new_pod(containers=[container(cpu="500m")]), MANAGED, resolver(), capped)
    assert [o["path"] for o in ops] == ["/metadata/annotations"]  # admitted as written, with its record
    roomy = limitrange.limit_range_from_dict(
        {
            "metadata": {"name": "lr", "namespace": "team"},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}}]},
        }
    )
    ok = nb.with_object(nb.EMPTY, limitrange.LIMIT_RANGE_KIND, roomy, "team", "lr")
    assert patch_for(new_pod(containers=[container(cpu="500m")]), MANAGED, resolver(), ok)[0]["value"] == "1"


# --- candidate nodes: the webhook mutates only where the controller would manage the pod on
# every node the pod can land on -------------------------------------------------------------

BATCH = {"nodeSelector": {"matchLabels": {"pool": "batch"}}}


def on_node(name: str) -> dict:
    raw = new_pod(containers=[container("a", cpu="500m", mem_limit=None)])
    raw["spec"]["nodeName"] = name
    return raw


def daemonset_style(name: str) -> dict:
    """How the DaemonSet controller pins a pod: required affinity, matchFields metadata.name."""
    raw = new_pod(containers=[container("a", cpu="500m", mem_limit=None)])
    raw["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}]
            }
        }
    }
    return raw


def by_expression(value: str) -> dict:
    raw = new_pod(containers=[container("a", cpu="500m", mem_limit=None)])
    raw["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": [value]}]}]
            }
        }
    }
    return raw


def unplaced() -> dict:
    return new_pod(containers=[container("a", cpu="500m", mem_limit=None)])


def frozen_batch():
    """The batch profile frozen (an invalid newer version, kept at its last settings)."""
    from dataclasses import replace

    live = resolver(profiles=[("batch", BATCH)])
    return Resolver.build(live.base, [replace(p, blocked="frozen for the test") for p in live.profiles])


# (what makes the batch node b1 one the controller would not write to, resolver, node cache)
UNMANAGED_ON_B1 = {
    "dry-run pool": lambda: (resolver(profiles=[("batch", {**BATCH, "dryRun": True})]), NODES),
    "paused pool": lambda: (resolver(profiles=[("batch", {**BATCH, "paused": True})]), NODES),
    "pool excludes the namespace": lambda: (
        resolver(profiles=[("batch", {**BATCH, "exclusions": {"namespaces": ["team"]}})]),
        NODES,
    ),
    "global node exclusion": lambda: (
        resolver({"exclusions": {"nodeSelector": {"matchLabels": {"pool": "batch"}}}}),
        NODES,
    ),
    "frozen profile": lambda: (frozen_batch(), NODES),
    "static CPU manager node": lambda: (
        resolver(),
        nodes(node("n1"), node("b1", labels={"pool": "batch", "kube-headroom.dev/cpu-manager-policy": "static"})),
    ),
    "windows node": lambda: (resolver(), nodes(node("n1"), node("b1", labels={"pool": "batch"}, os="windows"))),
}
PLACEMENTS = {
    "spec.nodeName": lambda: on_node("b1"),
    "DaemonSet matchFields": lambda: daemonset_style("b1"),
    "matchExpressions": lambda: by_expression("batch"),
    "no placement at all (every node a candidate)": unplaced,
}


@pytest.mark.parametrize("why", UNMANAGED_ON_B1)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_no_mutation_when_any_candidate_node_is_one_the_controller_would_not_write(why, placement):
    res, node_set = UNMANAGED_ON_B1[why]()
    assert full_patch(PLACEMENTS[placement](), MANAGED, res, node_set=node_set) == []
    # the same pod pinned to the plain node is given its limit (and its record)
    assert patch_for(on_node("n1"), MANAGED, res, node_set=node_set)[0]["value"] == {"cpu": "1"}
    assert patch_for(daemonset_style("n1"), MANAGED, res, node_set=node_set)[0]["value"] == {"cpu": "1"}


def test_a_windows_node_selector_without_spec_os_is_not_mutated():
    node_set = nodes(node("n1"), node("w1", os="windows"))
    raw = unplaced()
    raw["spec"]["nodeSelector"] = {"kubernetes.io/os": "windows"}
    assert full_patch(raw, MANAGED, resolver(), node_set=node_set) == []


def test_no_candidates_unknown_nodes_or_unreadable_placement_mean_no_mutation():
    assert full_patch(on_node("gone"), MANAGED, resolver()) == []  # a node the cache has not seen
    assert full_patch(unplaced(), MANAGED, resolver(), node_set={}) == []  # no node at all
    assert mutation.patch_for(unplaced(), MANAGED, resolver(), nodes=None) == []  # cache not synced
    nowhere = unplaced()
    nowhere["spec"]["nodeSelector"] = {"pool": "nowhere"}
    assert full_patch(nowhere, MANAGED, resolver()) == []
    for bad in (
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}},
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Near", "values": ["a"]}]}]
                }
            }
        },
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["a"]}]}]
                }
            }
        },
        {"nodeAffinity": []},
        "affinity",
    ):
        raw = unplaced()
        raw["spec"]["affinity"] = bad
        assert full_patch(raw, MANAGED, resolver()) == [], bad
    raw = unplaced()
    raw["spec"]["nodeSelector"] = {"pool": 7}
    assert full_patch(raw, MANAGED, resolver()) == []


def test_ored_terms_and_integer_operators_select_candidates_the_scheduler_way():
    res = resolver(profiles=[("batch", {**BATCH, "dryRun": True})])
    node_set = nodes(
        node("n1", labels={"gen": "3"}),
        node("n2", labels={"gen": "5"}),
        node("b1", labels={"pool": "batch", "gen": "9"}),
    )

    def terms(*exprs):
        raw = unplaced()
        raw["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [e]} for e in exprs]
                }
            }
        }
        return raw

    assert patch_for(terms({"key": "gen", "operator": "Lt", "values": ["6"]}), MANAGED, res, node_set=node_set)
    assert full_patch(terms({"key": "gen", "operator": "Gt", "values": ["4"]}), MANAGED, res, node_set=node_set) == []
    # ORed: one term reaches the dry-run node
    either = terms({"key": "gen", "operator": "In", "values": ["3"]}, {"key": "pool", "operator": "Exists"})
    assert full_patch(either, MANAGED, res, node_set=node_set) == []
    plain = terms({"key": "gen", "operator": "In", "values": ["3"]}, {"key": "pool", "operator": "DoesNotExist"})
    assert patch_for(plain, MANAGED, res, node_set=node_set)


def test_the_initial_limit_is_the_smallest_the_candidates_give_within_their_caps():
    res = resolver(profiles=[("batch", {**BATCH, "webhook": {"initialMultiplier": 4}})])
    # all candidates in the pool: the pool's multiplier, whatever the pod's placement says
    assert patch_for(on_node("b1"), MANAGED, res)[0]["value"] == {"cpu": "2"}
    assert patch_for(daemonset_style("b1"), MANAGED, res)[0]["value"] == {"cpu": "2"}
    # candidates across the pool and the rest: the smaller multiplier
    assert patch_for(unplaced(), MANAGED, res)[0]["value"] == {"cpu": "1"}
    # the candidates' maxMultiplier caps it
    capped = resolver({"maxMultiplier": 1.5})
    assert patch_for(on_node("n1"), MANAGED, capped)[0]["value"] == {"cpu": "750m"}
    # a candidate's allocatable CPU caps it
    small = nodes(node("n1", cpu="800m"))
    assert patch_for(on_node("n1"), MANAGED, resolver(), node_set=small)[0]["value"] == {"cpu": "800m"}


def test_the_max_cpu_annotation_caps_the_initial_limit_and_an_unusable_one_means_no_mutation():
    def annotated(value: str) -> dict:
        raw = on_node("n1")
        raw["metadata"]["annotations"] = {"kube-headroom.dev/max-cpu": value}
        return raw

    assert patch_for(annotated("600m"), MANAGED, resolver())[0]["value"] == {"cpu": "600m"}
    assert patch_for(annotated("4"), MANAGED, resolver())[0]["value"] == {"cpu": "1"}
    for unusable in ("lots", "0", "-1", "", "1e999"):
        assert full_patch(annotated(unusable), MANAGED, resolver()) == [], unusable
    # two containers share the cap by request, as the controller splits a pod's total
    raw = new_pod(containers=[container("a", cpu="300m", mem_limit=None), container("b", cpu="100m", mem_limit=None)])
    raw["spec"]["nodeName"] = "n1"
    raw["metadata"]["annotations"] = {"kube-headroom.dev/max-cpu": "600m"}
    assert [o["value"] for o in patch_for(raw, MANAGED, resolver())] == [{"cpu": "450m"}, {"cpu": "150m"}]


def test_match_fields_count_against_the_placement_budget_like_expressions():
    """A term of 299 matchFields against 500 nodes: each field is matched on every node, so
    it costs what an expression costs and passes the budget (before, a field counted as one
    check: 300 a node, exactly the budget, and the review took 0.04 s of a worker)."""
    from headroom.core.placement import PLACEMENT_BUDGET, PlacementTooCostly, candidate_nodes

    known = {f"n{i}": node_from_dict({"metadata": {"name": f"n{i}"}, "status": {}}) for i in range(500)}
    fields = [{"key": "metadata.name", "operator": "NotIn", "values": [f"x{i}"]} for i in range(299)]
    spec = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": fields}]}
            }
        }
    }
    assert PLACEMENT_BUDGET // len(known) == 300
    with pytest.raises(PlacementTooCostly):
        candidate_nodes(spec, known)
    assert (
        len(
            candidate_nodes(
                {
                    **spec,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchFields": fields[:50]}]
                            }
                        }
                    },
                },
                known,
            )
        )
        == 500
    )


def test_each_nodes_settings_are_cached_until_its_labels_or_the_configuration_change():
    """The webhook keeps each node's settings per configuration and node record: a node
    relabelled into a dry-run pool, or a configuration that makes its pool dry-run, is
    seen at the next decision."""
    dry = [("batch", {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "dryRun": True})]
    res = resolver(profiles=dry)
    web = node_from_dict(node("n1", labels={"pool": "web"}))
    ns = MANAGED
    p = new_pod(containers=[container("a", cpu="500m")])
    assert patch_for(p, ns, res, node_set={"n1": web})
    assert patch_for(p, ns, res, node_set={"n1": web})  # from the cache
    batch = node_from_dict(node("n1", labels={"pool": "batch"}))
    assert patch_for(p, ns, res, node_set={"n1": batch}) == []  # relabelled: a new record
    all_dry = resolver(profiles=[("web", {"nodeSelector": {"matchLabels": {"pool": "web"}}, "dryRun": True})])
    assert patch_for(p, ns, all_dry, node_set={"n1": web}) == []  # a new configuration


def test_a_reviews_tenant_is_its_namespaces_tenant_label_else_the_namespace():
    """Decision time is shared by tenant: the value of the namespace label the
    configuration names, else the namespace itself; never the username or service account,
    which a tenant can multiply."""
    from headroom.webhook.server import tenant_of

    config = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "HeadroomConfig",
        "metadata": {"name": "cluster"},
        "spec": {"tenancy": {"tenantLabel": "tenants.example.com/name"}},
    }
    resolver = resolve([config], []).resolver
    namespaces = {
        "a-dev": namespace_from_dict({"metadata": {"name": "a-dev", "labels": {"tenants.example.com/name": "acme"}}}),
        "a-prod": namespace_from_dict({"metadata": {"name": "a-prod", "labels": {"tenants.example.com/name": "acme"}}}),
        "loner": namespace_from_dict({"metadata": {"name": "loner"}}),
    }
    sources = Sources(namespaces.get, lambda: resolver)

    def review(ns: str, user: str) -> dict:
        return {"request": {"namespace": ns, "userInfo": {"username": user}}}

    acme = {
        tenant_of(review(ns, f"system:serviceaccount:{ns}:sa-{i}"), sources)
        for ns in ("a-dev", "a-prod")
        for i in range(16)
    }
    assert acme == {"acme"}  # the tenant the split and `explain` name, one rule (core.tenancy.tenant_name)
    assert tenant_of(review("loner", "bob"), sources) == "namespace/loner"
    assert tenant_of(review("unknown", "bob"), sources) == "namespace/unknown"
    without = Sources(namespaces.get, lambda: resolve([{**config, "spec": {}}], []).resolver)
    assert tenant_of(review("a-dev", "bob"), without) == "a-dev"  # no label named: each namespace is a tenant
