"""The three-way rule for in-place resize of pod-level resources (SPEC §8)."""

import pytest

from factories import node
from headroom.core.capabilities import parse_version, pod_level_resize
from headroom.core.records import node_from_dict

GATE = "InPlacePodLevelResourcesVerticalScaling"


def nodes(*feature_lists, ready=True):
    return [node_from_dict(node(f"n{i}", features=f, ready=ready)) for i, f in enumerate(feature_lists)]


@pytest.mark.parametrize(
    "node_list,version,expected",
    [
        (nodes([GATE, "Other"]), None, True),  # name present => on
        (nodes(["Other"]), (1, 37), False),  # non-empty list without it => off, whatever the version
        (nodes([], None), (1, 36), True),  # empty lists => version fallback
        (nodes([], None), (1, 35), False),
        (None, (1, 36), True),  # nodes unreadable => version fallback
        (None, None, False),  # offline without a version => off
        (nodes(["Other"]) + nodes([GATE]), None, True),  # any node listing it => on
        (nodes([GATE], ready=False), (1, 35), False),  # only Ready nodes count
    ],
)
def test_three_way_rule(node_list, version, expected):
    assert pod_level_resize(node_list, version) is expected


@pytest.mark.parametrize(
    "text,expected", [("v1.36.4", (1, 36)), ("1.37", (1, 37)), ("v1.35.8-gke.1", (1, 35)), ("x", None), (None, None)]
)
def test_parse_version(text, expected):
    assert parse_version(text) == expected
