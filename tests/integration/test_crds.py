"""What only a real API server can say about the generated CRDs (issue 3, a–d)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from headroom.api.models import HeadroomConfig, settings_from
from headroom.api.validate import validate_object
from headroom.cluster.client import MERGE_PATCH, Api, ApiError, object_path
from headroom.core.params import Settings
from helpers.corpus_cases import invalid_cases

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/kube-headroom.dev/v1alpha1"


def _plain(obj):
    """ruamel round-trip data → plain JSON-able Python."""
    import json

    return json.loads(json.dumps(obj))


def test_crds_are_established_and_structural(api: Api, crds_installed):
    for name in crds_installed:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True" and conds.get("NamesAccepted") == "True"
        assert "NonStructuralSchema" not in conds, crd["status"]["conditions"]


def _example_objects():
    out = []
    for path in ("examples/headroomconfig.yaml", "examples/nodepoolprofiles.yaml"):
        out += [d for d in YAML(typ="safe").load_all((ROOT / path).read_text()) if d]
    return out


@pytest.mark.parametrize("obj", _example_objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_examples_apply_server_side(api: Api, crds_installed, obj):
    got = api.apply(obj, "headroom-tests")
    assert got["metadata"]["managedFields"][0]["manager"] == "headroom-tests"
    assert got["spec"] == {**got["spec"], **obj["spec"]}  # nothing the example set was pruned or changed
    api.delete(object_path(obj))


def test_defaults_are_filled_in_by_the_schema(api: Api, crds_installed):
    minimal = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    got = api.apply(minimal, "headroom-tests")
    try:
        assert got["spec"] == {
            "policy": "Proportional",
            "dryRun": False,
            "minBurstFloor": "1000m",
            "maxMultiplier": 10,
            "deadband": {"grow": 0.1, "shrink": 0.05},
            "debouncePeriod": "2s",
            "rateLimits": {"perNodePatchesPerSecond": 10, "clientQPS": 50},
            "backoffPeriod": "5m",
            "exclusions": {"namespaces": ["kube-system"]},
            "release": "Keep",
            "webhook": {"initialMultiplier": 2},
            "tenancy": {"defaultWeight": 1, "maxNodeSlackShare": 1},
        }
        # unset means the default label; {} is refused (it would select every node), whether
        # created or applied server-side, with the way to turn the check off in the message
        for empty in ({}, {"matchLabels": {}}):
            body = {**minimal, "spec": {"staticCPUManagerNodeSelector": empty}}
            with pytest.raises(ApiError) as refused:
                api.apply(body, "headroom-tests")
            assert "must not be empty" in refused.value.message and "select a key no node has" in refused.value.message
        assert settings_from(HeadroomConfig.model_validate(got)).static_cpu_manager == Settings().static_cpu_manager
        # exclusion selectors: {} is kept as written and excludes everything, as in Kubernetes
        every = api.apply({**minimal, "spec": {"exclusions": {"podSelector": {}}}}, "headroom-tests")
        assert every["spec"]["exclusions"]["podSelector"] == {}
        excl = settings_from(HeadroomConfig.model_validate(every)).exclusions
        assert excl.pod_selectors and excl.pod_selectors[0].matches({"app": "anything"})
        # setting another exclusion keeps the kube-system default
        patched = api.apply({**minimal, "spec": {"exclusions": {"ownerKinds": ["Job"]}}}, "headroom-tests")
        assert patched["spec"]["exclusions"] == {"namespaces": ["kube-system"], "ownerKinds": ["Job"]}
    finally:
        api.delete(object_path(minimal))


def test_profile_overrides_get_no_defaults(api: Api, crds_installed):
    obj = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "NodePoolProfile",
        "metadata": {"name": "only-grow"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "x"}}, "deadband": {"grow": 0.3}},
    }
    got = api.apply(obj, "headroom-tests")
    try:
        assert got["spec"] == {
            "nodeSelector": {"matchLabels": {"pool": "x"}},
            "deadband": {"grow": 0.3},
            "priority": 0,
            "paused": False,
        }
    finally:
        api.delete(object_path(obj))


CASES = invalid_cases()


@pytest.mark.parametrize("expect,why,obj", CASES, ids=[f"{e}:{w}" for e, w, _ in CASES])
def test_server_and_validate_reject_the_same_objects(api: Api, crds_installed, expect, why, obj):
    offline = [str(p) for p in validate_object(obj, "corpus.yaml")]
    body = _plain(obj)
    try:
        api.post(
            object_path(body, collection=True),
            body,
            params={"dryRun": "All", "fieldValidation": "Strict", "fieldManager": "headroom-tests"},
        )
        server = None
    except ApiError as err:
        assert err.status in (400, 422), err
        server = err.message
    assert server is not None and offline, (
        f"{why}: server {'rejected' if server else 'ACCEPTED'} ({server}); "
        f"headroom validate {'rejected' if offline else 'ACCEPTED'} ({offline})"
    )
    # Both name the same field, by the same path.
    assert expect in server, f"{why}: the server's message does not name {expect!r}: {server}"


def _table(api: Api, plural: str):
    return api.get(f"{GROUP_PATH}/{plural}", accept="application/json;as=Table;v=v1;g=meta.k8s.io")


def test_printer_columns(api: Api, crds_installed):
    cfg = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    prof = {
        "apiVersion": "kube-headroom.dev/v1alpha1",
        "kind": "NodePoolProfile",
        "metadata": {"name": "tbl"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "t"}}, "priority": 7},
    }
    api.apply(cfg, "headroom-tests")
    api.apply(prof, "headroom-tests")
    try:
        status = {
            "status": {
                "observedGeneration": 1,
                "mode": "DryRun",
                "nodes": 3,
                "managedPods": 12,
                "podsAtTarget": 11,
                "pendingResizes": 1,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Reconciled",
                        "message": "3 node(s) computed",
                        "lastTransitionTime": "2026-11-29T00:00:00Z",
                    }
                ],
            }
        }
        api.patch(object_path(cfg) + "/status", status, MERGE_PATCH)
        t = _table(api, "headroomconfigs")
        cols = [c["name"] for c in t["columnDefinitions"]]
        assert cols == [
            "Name",
            "Ready",
            "Heartbeat",
            "Mode",
            "Nodes",
            "Managed",
            "At Target",
            "Age",
            "Pending",
            "Reason",
            "Message",
        ]
        wide = [c["name"] for c in t["columnDefinitions"] if c["priority"] == 1]
        assert wide == ["Pending", "Reason", "Message"]
        row = t["rows"][0]["cells"]
        assert (
            row[:2] == ["cluster", "True"]
            and row[3:7] == ["DryRun", 3, 12, 11]
            and row[8:11]
            == [
                1,
                "Reconciled",
                "3 node(s) computed",
            ]
        )

        conflict = {
            "type": "Conflict",
            "status": "True",
            "reason": "Overlap",
            "message": "selects 2 node(s) another profile wins: 'gpu' on 2 node(s)",
            "lastTransitionTime": "2026-11-29T00:00:00Z",
        }
        api.patch(object_path(prof) + "/status", {"status": {"matchedNodes": 0, "conditions": [conflict]}}, MERGE_PATCH)
        t = _table(api, "nodepoolprofiles")
        assert [c["name"] for c in t["columnDefinitions"]] == [
            "Name",
            "Ready",
            "Heartbeat",
            "Priority",
            "Nodes",
            "Managed",
            "Factor",
            "Effective",
            "Mode",
            "Conflict",
            "Age",
            "Pending",
            "Message",
            "Ready Message",
        ]
        cells = t["rows"][0]["cells"]
        assert cells[:2] == ["tbl", None] and cells[3:5] == [7, 0] and cells[9] == "True"  # a conflict reads as one
        assert cells[12] == conflict["message"]
    finally:
        api.delete(object_path(cfg))
        api.delete(object_path(prof))


def test_every_field_has_kubectl_explain_text_in_the_served_openapi(api: Api, crds_installed):
    deadline = time.monotonic() + 30
    while True:  # the server publishes a new CRD's OpenAPI a little after it is Established
        try:
            doc = api.get("/openapi/v3/apis/kube-headroom.dev/v1alpha1")
            break
        except ApiError:
            assert time.monotonic() < deadline, "the CRDs' OpenAPI v3 document was never served"
            time.sleep(0.5)

    schemas = doc["components"]["schemas"]
    missing: list[str] = []
    visited: list[str] = []

    def walk(node: dict, path: str) -> None:
        if "$ref" in node or "allOf" in node:  # metadata: the server's own ObjectMeta
            return
        for name, sub in (node.get("properties") or {}).items():
            visited.append(f"{path}{name}")
            if not sub.get("description"):
                missing.append(f"{path}{name}")
            walk(sub, f"{path}{name}.")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[].")

    for kind in ("HeadroomConfig", "NodePoolProfile"):
        root = schemas[f"dev.kube-headroom.v1alpha1.{kind}"]
        assert root.get("description")
        walk(root, f"{kind}.")
    assert missing == [], f"fields without a description: {missing}"
    assert "NodePoolProfile.spec.exclusions.podSelector.matchExpressions.[].operator" in visited and len(visited) > 100


@pytest.mark.parametrize(
    "spec,count,checked",
    [
        ({"maxMultiplier": -1, "deadband": {"grow": 0.05, "shrink": 0.2}}, 3, True),  # a minimum: rules still run
        ({"dryRun": "yes", "deadband": {"grow": 0.05, "shrink": 0.2}}, 2, False),  # a wrong type: rules skipped
        ({"rateLimits": {"clientQPS": 0}}, 1, True),  # 0 passes minimum 0.1 there (truncated): the rule alone
        ({"rateLimits": {"clientQPS": 0.05}}, 2, True),  # a fraction is compared as it is
    ],
)
def test_validate_runs_the_cel_rules_exactly_when_the_server_does(api: Api, crds_installed, spec, count, checked):
    """The server evaluates the CRD's CEL rules beside schema errors unless one of them is
    blocking (a wrong type, an enum, a required field, a length or count): then it adds a
    line saying the rules were not checked. validate lists what the server lists (before:
    it skipped the rules after any schema error, 1 problem against the server's 3)."""
    obj = {"apiVersion": "kube-headroom.dev/v1alpha1", "kind": "HeadroomConfig", "metadata": {"name": "cluster"}}
    obj["spec"] = spec
    offline = [p.message for p in validate_object(obj, "x.yaml")]
    with pytest.raises(ApiError) as err:
        api.post(object_path(obj, collection=True), obj, params={"dryRun": "All", "fieldValidation": "Strict"})
    server = err.value.message
    print(f"\nserver: {server}\nvalidate: {offline}")
    not_checked = "some validation rules were not checked"
    assert server.count("Invalid value:") == count == len(offline), (server, offline)
    assert (not_checked in server) == (not checked) == any(not_checked in m for m in offline), (server, offline)
