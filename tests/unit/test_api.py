"""The API: generated CRDs are current and structural; examples are valid; the invalid
corpus is rejected offline with a message naming the field."""

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from headroom.api import crds
from headroom.api.validate import validate_file, validate_object
from helpers.corpus_cases import invalid_cases

ROOT = Path(__file__).resolve().parents[2]
# Argo CD's health tests and their captured objects (some invalid on purpose) are not examples
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "resource_customizations" not in p.parts)


def test_crds_directory_is_current():
    assert crds.stale_files(ROOT / "crds") == [], "run `headroom crds --write`"


def _walk(schema: dict[str, Any], path: str):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", sorted(crds.definitions()))
def test_schema_is_structural_and_described(name):
    crd = crds.definitions()[name]
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(root, "root"):
        text = repr(node)
        assert "$ref" not in text and "$defs" not in text, path
        assert node.get("additionalProperties") is not False, path
        assert "title" not in node, path
        for branch in node.get("anyOf", []):
            assert branch.get("type") != "null", path
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
        else:
            assert "type" in node, f"{path} has no type"
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), path
        # root.metadata may carry nothing but its type (the API server owns its schema)
        if path.count(".") >= 1 and path != "root.metadata" and not path.endswith(("{}", "[]")):
            assert node.get("description"), f"{path} has no description"


def test_crd_names_and_rules():
    defs = crds.definitions()
    hrc = defs["kube-headroom.dev_headroomconfigs.yaml"]["spec"]
    npp = defs["kube-headroom.dev_nodepoolprofiles.yaml"]["spec"]
    assert (hrc["scope"], hrc["names"]["shortNames"], hrc["names"]["categories"]) == ("Cluster", ["hrc"], ["headroom"])
    assert (npp["names"]["shortNames"], npp["names"]["categories"]) == (["npp"], ["headroom"])
    # The columns are held where users see them: the table the API server serves
    # (tests/integration/test_crds.py).
    root = hrc["versions"][0]["schema"]["openAPIV3Schema"]
    assert "self.metadata.name == 'cluster'" in root["x-kubernetes-validations"][0]["rule"]
    spec = root["properties"]["spec"]
    assert spec["default"] == {} and spec["properties"]["deadband"]["default"] == {}
    assert spec["properties"]["exclusions"]["properties"]["namespaces"]["default"] == ["kube-system"]
    assert spec["properties"]["minBurstFloor"]["default"] == "1000m"
    conds = root["properties"]["status"]["properties"]["conditions"]
    assert conds["x-kubernetes-list-type"] == "map" and conds["x-kubernetes-list-map-keys"] == ["type"]


def test_profile_overrides_have_no_defaults_so_they_fall_back():
    spec = crds.definitions()["kube-headroom.dev_nodepoolprofiles.yaml"]["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]["properties"]["spec"]
    for field in ("dryRun", "minBurstFloor", "maxMultiplier", "deadband", "webhook", "exclusions"):
        assert "default" not in repr(spec["properties"][field]), field


@pytest.mark.parametrize("path", sorted((ROOT / "crds").glob("*.yaml")), ids=lambda p: p.name)
def test_crds_pass_kubernetes_validate_strict(path):
    for doc in YAML(typ="safe").load_all(path.read_text()):
        kubernetes_validate.validate(doc, "1.37", strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_are_valid(path):
    _checked, problems = validate_file(path)
    assert problems == []
    for doc in YAML(typ="safe").load_all(path.read_text()):
        if not doc or str(doc.get("apiVersion", "")).startswith("kube-headroom.dev/"):
            continue
        try:
            kubernetes_validate.validate(doc, "1.37", strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            # Argo CD and Flux kinds: kubernetes-validate knows only the core API
            assert "." in str(doc["apiVersion"]).split("/")[0], f"{path}: unknown core kind {doc['kind']}"


def test_examples_show_every_field():
    """The commented examples are the reference a platform engineer copies from."""
    text = (ROOT / "examples" / "headroomconfig.yaml").read_text() + (
        ROOT / "examples" / "nodepoolprofiles.yaml"
    ).read_text()
    for name, crd in crds.definitions().items():
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        for path, _ in _walk(spec, ""):
            leaf = path.rsplit(".", 1)[-1].rstrip("[]{}")
            if leaf and leaf not in ("key", "operator", "values"):
                assert f"{leaf}:" in text, f"{name}: {path} is not shown in examples/"


CASES = invalid_cases()


def test_corpus_is_large_enough():
    assert len(CASES) >= 40


@pytest.mark.parametrize("expect,why,obj", CASES, ids=[f"{e}:{w}" for e, w, _ in CASES])
def test_invalid_corpus_is_rejected_offline_naming_the_field(expect, why, obj):
    problems = validate_object(obj, "corpus.yaml")
    assert problems, f"accepted: {why}"
    assert expect in [p.path for p in problems], [str(p) for p in problems]
    for p in problems:
        assert p.line > 0 and p.column > 0
        assert str(p).startswith(f"corpus.yaml:{p.line}:{p.column}: {obj['kind']}/")
