"""YAML read as kubectl reads it (sigs.k8s.io/yaml: go-yaml v2 scalars, then JSON), each
rule on its own, and the CRD's CEL rules evaluated offline (pure logic)."""

from __future__ import annotations

import math

import pytest
from ruamel.yaml.error import YAMLError

from headroom.api import crds
from headroom.api.schema import _program, check
from headroom.api.yamlread import DepthError, load_all, resolve_plain


@pytest.mark.parametrize(
    "token,value",
    [
        ("yes", True), ("Yes", True), ("YES", True), ("y", True), ("Y", True), ("on", True), ("ON", True),
        ("true", True), ("no", False), ("N", False), ("off", False), ("False", False),
        ("~", None), ("null", None), ("", None),
        ("0750", 488), ("0o17", 15), ("0x1F", 31), ("0b101", 5), ("+5", 5), ("-0", 0), ("1_000", 1000),
        ("08", 8), ("1e3", 1000), ("1.0", 1), ("1.5", 1.5), (".5", 0.5),
        ("2026-01-01", "2026-01-01"), ("1:30", "1:30"), ("500m", "500m"), ("Yess", "Yess"),
    ],
)  # fmt: skip
def test_each_plain_scalar_reads_as_go_yaml_v2_then_json(token, value):
    got = resolve_plain(token)
    assert got == value and type(got) is type(value)


def test_infinity_and_nan_have_no_json_form():
    assert math.isinf(resolve_plain(".inf")) and math.isnan(resolve_plain(".nan"))
    with pytest.raises(DepthError, match="no JSON form"):
        load_all("a: .inf\n")


def test_quoted_scalars_stay_strings_and_keys_become_strings():
    (doc,) = load_all("a: 'yes'\nb: \"0750\"\nc: |\n  no\nyes: 1\n1: 2\n")
    assert doc == {"a": "yes", "b": "0750", "c": "no\n", "true": 1, "1": 2}


def test_merge_keys_and_anchors_work_and_duplicates_are_refused():
    (doc,) = load_all("base: &b {a: 1, b: 2}\nobj:\n  <<: *b\n  b: 3\n")
    assert dict(doc["obj"]) == {"a": 1, "b": 3}
    (doc,) = load_all("y: 1\n")  # go-yaml v2 reads the key `y` as the boolean true, too
    assert doc == {"true": 1}
    with pytest.raises(YAMLError, match="duplicate key"):
        load_all("a: 1\na: 2\n")


def test_a_merged_key_that_yaml_1_1_resolves_is_read_not_a_crash():
    """`<<` merging a map whose keys YAML 1.1 resolves (`on` is true, `0x1` is 1), by alias
    or inline: read as kubectl reads it. Before: a KeyError out of `headroom validate`."""
    aliased = "base: &b\n  on: 1\n  dryRun: on\nspec:\n  <<: *b\n  x: 2\n"
    assert load_all(aliased) == [{"base": {"true": 1, "dryRun": True}, "spec": {"x": 2, "true": 1, "dryRun": True}}]
    assert load_all("spec:\n  <<: {on: 1, 0x1: 2}\n  z: 3\n") == [{"spec": {"z": 3, "true": 1, "1": 2}}]


def test_deep_nesting_is_refused_not_a_crash():
    with pytest.raises(DepthError, match="nested more than"):
        load_all("a: " + "[" * 3000 + "]" * 3000 + "\n")


def _rules(node, path=""):
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations") or []:
            yield path, rule["rule"]
        for k, v in node.items():
            yield from _rules(v, f"{path}.{k}")
    elif isinstance(node, list):
        for v in node:
            yield from _rules(v, path)


def test_every_cel_rule_of_the_crds_compiles_offline():
    rules = [r for crd in crds.definitions().values() for r in _rules(crd)]
    assert len(rules) >= 10
    for _, rule in rules:
        _program(rule)  # raises on anything cel-python cannot parse


def test_the_rules_decide_like_the_server_on_both_sides_of_each_bound():
    def spec_problems(**spec):
        obj = {
            "apiVersion": "kube-headroom.dev/v1alpha1",
            "kind": "HeadroomConfig",
            "metadata": {"name": "cluster"},
            "spec": spec,
        }
        return [".".join(map(str, loc)) for loc, _ in check(obj)[0]]

    assert spec_problems() == []
    assert spec_problems(debouncePeriod="600s") == [] and spec_problems(debouncePeriod="601s") == [
        "spec.debouncePeriod"
    ]
    assert spec_problems(rateLimits={"clientQPS": 0}) == [
        "spec.rateLimits.clientQPS"
    ]  # the server compares 0 with the minimum 0.1 truncated to 0: the CEL rule alone refuses it
    assert spec_problems(minBurstFloor="9223372036854775807") == []
    assert spec_problems(minBurstFloor="9223372036854775808") == ["spec.minBurstFloor"]
    assert spec_problems(minBurstFloor="500m\n") == ["spec.minBurstFloor"]  # Go's `$` is the very end
    assert spec_problems(deadband={"shrink": 0.2}) == ["spec.deadband"]  # merged with its default grow 0.10
    assert spec_problems(maxMultiplier=0) == [] and spec_problems(maxMultiplier=0.5) == ["spec.maxMultiplier"]


@pytest.mark.parametrize(("first", "second"), [("on", "true"), ("yes", "Y"), ("1", "0x1"), ("off", "false")])
def test_keys_equal_after_yaml_1_1_resolution_are_refused_as_duplicates(first, second):
    """Before: `on:` and `true:` in one map merged silently, keeping the first value (kubectl
    keeps the last): a duplicate key under another spelling."""
    from headroom.api.yamlread import DuplicateKey

    with pytest.raises(DuplicateKey, match=f"written '{first}' \\(line 2\\) and '{second}' \\(line 3\\)"):
        load_all(f"m:\n  {first}: a\n  {second}: b\n")
