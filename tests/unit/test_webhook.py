"""The webhook's mutation (pure) and its AdmissionReview handling."""

from __future__ import annotations

import base64
import json

from factories import container, namespace, pod
from headroom.api.models import HeadroomConfig, NodePoolProfile, profile_from, settings_from
from headroom.api.resolve import resolve
from headroom.core.params import Resolver
from headroom.core.records import namespace_from_dict
from headroom.webhook import mutation
from headroom.webhook.server import review_response


def patch_for(*args: object) -> list[dict[str, object]]:
    """The limit operations (the record of the original limits is tested on its own)."""
    return [o for o in mutation.patch_for(*args) if not str(o["path"]).startswith("/metadata/annotations")]  # type: ignore[arg-type]


def test_an_eligible_pod_is_born_with_the_record_of_its_own_limits():
    import orjson

    ops = mutation.patch_for(
        new_pod(containers=[container("a", cpu="500m"), container("b", cpu="1", limit="3")]), MANAGED, resolver()
    )
    record = [o for o in ops if str(o["path"]).startswith("/metadata/annotations")]
    assert len(record) == 1
    value = record[0]["value"]
    assert isinstance(value, dict)
    assert orjson.loads(value["kube-headroom.dev/original-cpu-limits"]) == {"a": None, "b": "3"}
    # not for a pod it would not manage
    assert mutation.patch_for(new_pod(labels={"kube-headroom.dev/mode": "unmanaged"}), MANAGED, resolver()) == []


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


def test_admission_review_round_trip_and_errors_never_block():
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "operation": "CREATE",
            "kind": {"kind": "Pod"},
            "namespace": "team",
            "object": new_pod(containers=[container(cpu="500m")]),
        },
    }
    out = review_response(review, lambda n: MANAGED if n == "team" else None, resolver)
    assert out["response"]["uid"] == "u1" and out["response"]["allowed"] is True
    assert json.loads(base64.b64decode(out["response"]["patch"]))[0]["value"] == "1"
    broken = {"request": {"uid": "u2", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": {"spec": 7}}}
    assert review_response(broken, lambda n: MANAGED, resolver)["response"] == {"uid": "u2", "allowed": True}


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
    from headroom.core import neighbours as nb

    web = new_pod(owner_kind="ReplicaSet", owner_name="web-5d8f", labels={"pod-template-hash": "5d8f"})
    vpa = nb.vpa_from_dict(
        {"metadata": {"name": "web", "namespace": "team"}, "spec": {"targetRef": {"kind": "Deployment", "name": "web"}}}
    )
    with_vpa = nb.with_object(nb.EMPTY, nb.VPA_KIND, vpa, "team", "web")
    assert mutation.patch_for(web, MANAGED, resolver(), with_vpa) == []  # not even the record: not managed
    assert patch_for(web, MANAGED, resolver())  # without the VPA it is given a limit

    # 500m x initialMultiplier 2 = 1 CPU; a LimitRange with max 800m would refuse the pod
    lr = nb.limit_range_from_dict(
        {
            "metadata": {"name": "lr", "namespace": "team"},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "800m"}}]},
        }
    )
    capped = nb.with_object(nb.EMPTY, nb.LIMIT_RANGE_KIND, lr, "team", "lr")
    ops = mutation.patch_for(new_pod(containers=[container(cpu="500m")]), MANAGED, resolver(), capped)
    assert [o["path"] for o in ops] == ["/metadata/annotations"]  # admitted as written, with its record
    roomy = nb.limit_range_from_dict(
        {
            "metadata": {"name": "lr", "namespace": "team"},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}}]},
        }
    )
    ok = nb.with_object(nb.EMPTY, nb.LIMIT_RANGE_KIND, roomy, "team", "lr")
    assert patch_for(new_pod(containers=[container(cpu="500m")]), MANAGED, resolver(), ok)[0]["value"] == "1"
