"""The invalid-object corpus (tests/corpus/invalid.yaml), shared by the offline and the
API-server tests so both judge the same objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "invalid.yaml"


def invalid_cases() -> list[tuple[str, str, Any]]:
    """(expected field path, the mistake, the object as ruamel round-trip data)."""
    docs = YAML(typ="rt").load_all(CORPUS.read_text())
    return [(d["expect"], d["why"], d["object"]) for d in docs]
